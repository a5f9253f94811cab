//! The limiters, and the GCRA script against a real redis-server (`testkit::redis`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, Opts};

use super::redis::{caller_key, escape_id, Shared};
use super::redis::{RETRY_INTERVAL, TIMEOUT};
use super::{Limit, SharedRedis};
use crate::auth::{Principal, PrincipalKind};
use crate::config::RedisServer as RedisUrl;

use testkit::redis::RedisServer;

fn caller(id: &str) -> Principal {
    Principal {
        kind: PrincipalKind::ApiKey,
        id: id.into(),
        scopes: Box::new([]),
        owner: None,
        budget: Default::default(),
    }
}

/// A fresh name per test, so that runs against a long-lived external Redis never meet.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

fn counters() -> IntCounterVec {
    IntCounterVec::new(Opts::new("errors", "test"), &["reason"]).unwrap()
}

fn backend(url: &str) -> (Arc<SharedRedis>, IntCounterVec) {
    let errors = counters();
    let server = RedisUrl {
        client: redis::Client::open(url).unwrap(),
        shown: "test".into(),
    };
    (Arc::new(SharedRedis::new(&server, &errors)), errors)
}

fn count(errors: &IntCounterVec, reason: &str) -> u64 {
    errors.with_label_values(&[reason]).get()
}

#[tokio::test]
async fn without_redis_the_limit_is_per_process() {
    let limit = Limit::new("infer", Some(2), None);
    let (a, b) = (caller("a"), caller("b"));
    assert_eq!(limit.check(&a).await, Ok(()));
    assert_eq!(limit.check(&a).await, Ok(()));
    let retry = limit.check(&a).await.unwrap_err();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        limit.check(&b).await,
        Ok(()),
        "another caller has its own count"
    );
    let none = Limit::new("infer", None, None);
    for _ in 0..100 {
        assert_eq!(none.check(&a).await, Ok(()));
    }
}

#[test]
fn keys_escape_ids_so_callers_never_share_one() {
    let key = |id: &str| caller_key("infer", "jwt", id);
    assert_eq!(
        key("0123abcd-x.y_z~"),
        "portcullis:ratelimit:infer:jwt:0123abcd-x.y_z~"
    );
    assert_eq!(key("a:b"), "portcullis:ratelimit:infer:jwt:a%3Ab");
    let tricky = [
        "a:b",
        "a%3Ab",
        "a%253Ab",
        "{tag}",
        "x y",
        "x\ny",
        "é",
        "",
        "jwt:a",
        "infer:jwt:a",
    ];
    let keys: std::collections::HashSet<String> = tricky.iter().map(|id| key(id)).collect();
    assert_eq!(keys.len(), tricky.len(), "{keys:?}");
    for k in &keys {
        // Exactly the four separators of the layout, nothing a client chose.
        assert_eq!(k.matches(':').count(), 4, "{k}");
        assert!(!k.contains(['{', '}', ' ', '\n']), "{k}");
    }
    let mut out = String::new();
    escape_id("%", &mut out);
    assert_eq!(out, "%25");
    assert_ne!(
        caller_key("infer", "api_key", "a"),
        caller_key("infer", "jwt", "a")
    );
    assert_ne!(
        caller_key("infer", "jwt", "a"),
        caller_key("embed", "jwt", "a")
    );
}

#[tokio::test]
async fn gcra_allows_the_limit_at_once_then_refuses_until_the_next_interval() {
    let redis = RedisServer::start();
    let (backend, errors) = backend(redis.url());
    let key = unique("burst");
    // 10 a minute: a fresh caller gets 10 at once, then one every 6 s.
    for i in 0..10 {
        assert_eq!(backend.decide(&key, 10).await, Some(Ok(())), "request {i}");
    }
    let Some(Err(retry)) = backend.decide(&key, 10).await else {
        panic!("the 11th request was allowed");
    };
    assert!((5..=6).contains(&retry), "Retry-After {retry}");
    // A refusal is not counted: the wait does not grow with every refused request.
    for _ in 0..20 {
        assert!(matches!(backend.decide(&key, 10).await, Some(Err(5..=6))));
    }
    // The key expires when its TAT passes: at most a minute from now.
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((54_000..=60_000).contains(&ttl), "PTTL {ttl}");
    assert_eq!(count(&errors, "error") + count(&errors, "timeout"), 0);
}

#[tokio::test]
async fn gcra_lets_one_more_through_each_interval() {
    let redis = RedisServer::start();
    let (backend, _) = backend(redis.url());
    let key = unique("refill");
    // 120 a minute: one every 500 ms once the burst is spent.
    let start = Instant::now();
    let mut allowed = 0;
    while backend.decide(&key, 120).await == Some(Ok(())) {
        allowed += 1;
        assert!(allowed <= 200, "no refusal");
    }
    let refills = (start.elapsed().as_millis() / 500) as u32;
    assert!(
        (120..=120 + refills).contains(&allowed),
        "{allowed} allowed"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(backend.decide(&key, 120).await, Some(Ok(())));
    assert!(matches!(backend.decide(&key, 120).await, Some(Err(1))));
}

#[tokio::test]
async fn callers_and_services_are_counted_apart() {
    let redis = RedisServer::start();
    let (backend, _) = backend(redis.url());
    let (infer, embed) = (unique("infer"), unique("embed"));
    let one = Shared::new(backend.clone(), &infer, 1);
    let other_service = Shared::new(backend.clone(), &embed, 1);
    let (a, b, colon) = (caller("a:b"), caller("b"), caller("a%3Ab"));
    assert_eq!(one.check(&a).await, Ok(()));
    assert!(one.check(&a).await.is_err());
    assert_eq!(one.check(&b).await, Ok(()));
    assert_eq!(one.check(&colon).await, Ok(()), "an escaped look-alike");
    assert_eq!(other_service.check(&a).await, Ok(()));
    let jwt = Principal {
        kind: PrincipalKind::Jwt,
        ..caller("a:b")
    };
    assert_eq!(one.check(&jwt).await, Ok(()), "a JWT sub equal to a key id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_connections_share_one_count_atomically() {
    let redis = RedisServer::start();
    // Three backends: three gateways' connections, all deciding at once.
    let backends: Vec<_> = (0..3).map(|_| backend(redis.url()).0).collect();
    let key = unique("fleet");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..90 {
        let backend = backends[i % 3].clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            // Let the connection come up: a first call may find it still connecting.
            for _ in 0..100 {
                if let Some(decision) = backend.decide(&key, 30).await {
                    return decision.is_ok();
                }
                tokio::time::sleep(RETRY_INTERVAL / 10).await;
            }
            panic!("Redis never answered");
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        allowed += t.await.unwrap() as u32;
    }
    // One more per 2 s elapsed (30 a minute), none lost or doubled by the concurrency.
    let refills = (start.elapsed().as_secs_f64() / 2.0).ceil() as u32;
    assert!((30..=30 + refills).contains(&allowed), "{allowed} allowed");
}

#[tokio::test]
async fn a_dead_redis_falls_back_to_the_per_process_count_at_once() {
    // Nothing listens there: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (backend, errors) = backend(&format!("redis://127.0.0.1:{port}"));
    let limit = Shared::new(backend, "infer", 3);
    let a = caller("a");
    let mut worst = Duration::ZERO;
    let mut decisions = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        decisions.push(limit.check(&a).await.is_ok());
        worst = worst.max(t.elapsed());
    }
    // Never unlimited: the process's own count of 3 applies.
    assert_eq!(decisions, [true, true, true, false, false]);
    assert!(worst <= TIMEOUT + Duration::from_millis(30), "{worst:?}");
    let failed = count(&errors, "error") + count(&errors, "timeout");
    assert!(failed >= 1, "no failure counted");
    assert_eq!(
        failed + count(&errors, "unavailable"),
        5,
        "every request decided alone is counted"
    );
}

#[tokio::test]
async fn a_silent_redis_costs_one_timeout_then_nothing() {
    // Accepts connections (the kernel's backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let (backend, errors) = backend(&url);
    let limit = Shared::new(backend, "infer", 3);
    let a = caller("a");
    let t = Instant::now();
    assert_eq!(limit.check(&a).await, Ok(()));
    let first = t.elapsed();
    assert!(
        first >= TIMEOUT && first <= TIMEOUT + Duration::from_millis(30),
        "{first:?}"
    );
    assert_eq!(count(&errors, "timeout"), 1);
    let t = Instant::now();
    for _ in 0..10 {
        let _ = limit.check(&a).await;
    }
    assert!(t.elapsed() < Duration::from_millis(10), "{:?}", t.elapsed());
    assert_eq!(count(&errors, "unavailable"), 10);
}

#[tokio::test]
async fn shared_limits_come_back_when_redis_does() {
    let Some(mut redis) = RedisServer::start_own_or_skip() else {
        return;
    };
    let (backend, errors) = backend(redis.url());
    let key = unique("outage");
    assert_eq!(backend.decide(&key, 5).await, Some(Ok(())));
    redis.stop();
    let t = Instant::now();
    assert_eq!(backend.decide(&key, 5).await, None);
    assert!(t.elapsed() <= TIMEOUT + Duration::from_millis(30));
    redis.start_again();
    // The restarted server has no script and no counts: EVALSHA finds no script, loads it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let back = loop {
        if let Some(decision) = backend.decide(&key, 5).await {
            break decision;
        }
        assert!(Instant::now() < deadline, "Redis never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(back, Ok(()));
    for _ in 0..4 {
        assert_eq!(backend.decide(&key, 5).await, Some(Ok(())));
    }
    assert!(matches!(backend.decide(&key, 5).await, Some(Err(_))));
    assert!(count(&errors, "error") + count(&errors, "timeout") >= 1);
}
