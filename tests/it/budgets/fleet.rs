//! Four gateways, one Postgres, one Redis: budgets hold exactly however the requests spread.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::postgres::Postgres;
use testkit::redis::RedisServer;
use testkit::{raw, Gateway};

use super::{
    admin, admin_port, header, key, ledger_of, ledger_of_owner, metric, portcullis, stream_chat,
    Fixture, Setup, STREAM_TOKENS,
};

const BUDGET: u64 = 3000;

fn fleet(fx: &Fixture, pg: &Postgres, redis: &RedisServer, admin: Option<u16>) -> Vec<Gateway> {
    (0..4)
        .map(|i| {
            fx.gateway(&Setup {
                database: Some(&pg.url),
                redis: Some(redis.url()),
                admin_port: admin.filter(|_| i == 0),
                ..Setup::default()
            })
        })
        .collect()
}

/// Sends one streamed chat per token in `tokens`, all at once, spread over `fleet`:
/// (admitted, refused). Every answer is a 200 or a `429 budget_exceeded`.
fn storm(fleet: &[Gateway], tokens: &[String]) -> (usize, usize) {
    let ports: Vec<u16> = fleet.iter().map(|g| g.port).collect();
    let threads: Vec<_> = (tokens.iter().enumerate())
        .map(|(i, token)| {
            let (port, token) = (ports[i % ports.len()], token.clone());
            thread::spawn(move || stream_chat(port, &token, Some(9)))
        })
        .collect();
    let (mut admitted, mut refused) = (0, 0);
    for t in threads {
        let (status, headers, body) = t.join().unwrap();
        match status {
            200 => admitted += 1,
            429 => {
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(body["error"], "budget_exceeded", "{body}");
                assert!(body["message"].as_str().unwrap().contains("tokens_per_day"));
                assert!(header(&headers, "retry-after").is_some());
                refused += 1;
            }
            other => panic!("status {other}: {}", String::from_utf8_lossy(&body)),
        }
    }
    (admitted, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_streams_on_four_gateways_never_pass_a_key_budget() {
    let pg = tokio::task::block_in_place(Postgres::start);
    let redis = RedisServer::start();
    let fx = Fixture::start().await;
    let fleet = fleet(&fx, &pg, &redis, None);
    let budget = BUDGET.to_string();
    let (k, id) = key(&fleet[0], &["--tokens-per-day", &budget]);
    // Every gateway knows the key's budget before the storm.
    thread::sleep(Duration::from_secs(1));
    let tokens = vec![k; 200];
    let (admitted, refused) = tokio::task::block_in_place(|| storm(&fleet, &tokens));
    let (used, requests) = tokio::task::block_in_place(|| ledger_of(&fleet[0], &id));
    eprintln!("admitted {admitted}, refused {refused}, ledger {used} tokens");
    for gw in &fleet {
        let warnings: Vec<String> = (gw.log().lines())
            .filter(|l| l.contains("WARN"))
            .map(str::to_string)
            .collect();
        eprintln!(
            "redis errors {}: {warnings:?}",
            metric(gw, "portcullis_rate_limit_backend_errors_total")
        );
    }
    assert!(
        used <= BUDGET,
        "{used} tokens admitted past a budget of {BUDGET}"
    );
    assert!(refused > 0 && admitted > 0);
    assert_eq!(requests as usize, admitted);
    assert_eq!(used, admitted as u64 * STREAM_TOKENS);
    // Refused requests were never forwarded.
    assert_eq!(fx.chats_upstream(), admitted);
    let rejections: f64 = fleet
        .iter()
        .map(|g| {
            metric(
                g,
                "portcullis_budget_rejections_total{service=\"chat\",window=\"tokens_per_day\"}",
            )
        })
        .sum();
    assert_eq!(rejections as usize, refused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_budget_holds_across_five_keys_and_jwt_calls_on_four_gateways() {
    let pg = tokio::task::block_in_place(Postgres::start);
    let redis = RedisServer::start();
    let fx = Fixture::start().await;
    let fleet = fleet(&fx, &pg, &redis, None);
    let budget = BUDGET.to_string();
    let owner = format!("alice-{:08x}", rand::random::<u32>());
    portcullis(
        &fleet[0],
        &["owners", "budget", &owner, "--tokens-per-day", &budget],
    );
    let mut principals: Vec<String> = (0..5)
        .map(|_| key(&fleet[0], &["--owner", &owner]).0)
        .collect();
    principals.push(fx.token(&owner, "chat plain"));
    thread::sleep(Duration::from_secs(1));
    let tokens: Vec<String> = (0..200).map(|i| principals[i % 6].clone()).collect();
    let (admitted, refused) = tokio::task::block_in_place(|| storm(&fleet, &tokens));
    let (used, requests) = tokio::task::block_in_place(|| ledger_of_owner(&fleet[0], &owner));
    eprintln!("admitted {admitted}, refused {refused}, ledger {used} tokens");
    assert!(
        used <= BUDGET,
        "{used} tokens admitted past an owner budget of {BUDGET}"
    );
    assert!(refused > 0 && admitted > 0);
    assert_eq!(requests as usize, admitted);
    assert_eq!(fx.chats_upstream(), admitted);
}

/// Seconds until every gateway gives `want` to a `GET` on the plain service.
fn until_all(fleet: &[Gateway], token: &str, want: u16) -> Duration {
    let start = Instant::now();
    let mut done = vec![false; fleet.len()];
    while !done.iter().all(|d| *d) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never reached {want}"
        );
        for (gw, done) in fleet.iter().zip(&mut done) {
            if !*done {
                let req = format!(
                    "GET /v1/plain/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n\
                     Connection: close\r\n\r\n"
                );
                *done = raw(gw.port, req.as_bytes()).0 == want;
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_changed_through_the_api_reaches_all_four_gateways_within_a_second() {
    let pg = tokio::task::block_in_place(Postgres::start);
    let redis = RedisServer::start();
    let fx = Fixture::start().await;
    let port = admin_port();
    let fleet = fleet(&fx, &pg, &redis, Some(port));
    let root = fx.token("root", "portcullis:admin chat plain");
    let (k, id) = key(&fleet[0], &["--requests-per-day", "100000"]);
    tokio::task::block_in_place(|| until_all(&fleet, &k, 200));
    let path = format!("/v1/keys/{id}");
    for (budget, want) in [(0, 429), (100_000, 200), (0, 429)] {
        let body = json!({"budget": {"requests_per_day": budget}});
        let (status, reply) = admin(port, &root, "PATCH", &path, Some(body));
        assert_eq!(status, 200, "{reply}");
        let took = tokio::task::block_in_place(|| until_all(&fleet, &k, want));
        eprintln!("requests_per_day = {budget}: every gateway answers {want} after {took:?}");
        assert!(took <= Duration::from_secs(1), "{took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_falls_back_per_process_and_a_flush_reseeds_from_the_ledger() {
    let Some(mut redis) = tokio::task::block_in_place(RedisServer::start_own_or_skip) else {
        return;
    };
    let pg = tokio::task::block_in_place(Postgres::start);
    let fx = Fixture::start().await;
    // Two gateways serve the traffic; a third only answers the last question.
    let fleet: Vec<Gateway> = fleet(&fx, &pg, &redis, None).into_iter().take(3).collect();
    let (k, _) = key(&fleet[0], &["--requests-per-day", "30"]);
    thread::sleep(Duration::from_secs(1));
    let send = |n: usize| {
        let mut statuses = Vec::new();
        for i in 0..n {
            let (status, _, _) = stream_chat(fleet[i % 2].port, &k, Some(9));
            statuses.push(status);
        }
        statuses
    };
    let before = tokio::task::block_in_place(|| send(10));
    assert!(before.iter().all(|s| *s == 200), "{before:?}");
    // Redis goes away mid-traffic: no 5xx, and still a limit (each gateway counts alone).
    tokio::task::block_in_place(|| redis.stop());
    let during = tokio::task::block_in_place(|| send(60));
    assert!(during.iter().all(|s| [200, 429].contains(s)), "{during:?}");
    let passed = during.iter().filter(|s| **s == 200).count();
    assert!(passed < 60, "never unlimited: {during:?}");
    for gw in &fleet[..2] {
        let log = gw.log();
        assert_eq!(log.matches("unavailable (").count(), 1, "{log}");
    }
    // Back, and then flushed: the shared count is rebuilt from the ledger, which holds more
    // than 30 requests: refused at once, on a gateway that served none of them.
    tokio::task::block_in_place(|| redis.start_again());
    thread::sleep(Duration::from_secs(3));
    tokio::task::block_in_place(|| redis.flush_all());
    let other = &fleet[2];
    let (status, _, body) = tokio::task::block_in_place(|| stream_chat(other.port, &k, Some(9)));
    assert_eq!(
        status,
        429,
        "{}\n{}",
        String::from_utf8_lossy(&body),
        other.log()
    );
}
