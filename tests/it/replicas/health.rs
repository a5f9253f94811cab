//! Connect failures, health checks and ejection.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use testkit::{Blackhole, HitLog, Upstream};

use super::{gateway, get_ok, send, urls, wait_healthy, HEALTH_1S};

#[tokio::test]
async fn a_refused_replica_is_skipped_so_every_request_succeeds_on_the_others() {
    let log = HitLog::new();
    let a = Upstream::local("A", &log);
    let dead = Upstream::stopped_local("DEAD", &log);
    let c = Upstream::local("C", &log);
    // No health check: only connect failover (then passive ejection) keeps DEAD out.
    let gw = gateway(&urls(&[&a, &dead, &c]), "balance = \"round_robin\"", "");
    let (key, _) = gw.create_key("infer", &[]);
    let mut count: HashMap<String, usize> = HashMap::new();
    for i in 0..12 {
        let t = Instant::now();
        let who = get_ok(&gw, &key, &format!("/v1/infer/x?i={i}")).await;
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "refused connects are instant"
        );
        *count.entry(who).or_default() += 1;
    }
    assert!(
        count.get("A").is_some_and(|n| *n >= 3) && count.get("C").is_some_and(|n| *n >= 3),
        "{count:?}"
    );
}

#[tokio::test]
async fn a_connect_timeout_fails_over_and_three_timeouts_eject_the_replica_until_its_cool_down_ends(
) {
    let log = HitLog::new();
    let hole = Blackhole::start();
    let good = Upstream::local("G", &log);
    let service = "balance = \"round_robin\"\nconnect_timeout_seconds = 1\n\
                   eject_after_connect_failures = 3\neject_seconds = 4";
    let gw = gateway(&[hole.url(), good.url("")], service, "");
    let (key, _) = gw.create_key("infer", &[]);

    let mut slow = Vec::new();
    for i in 0..10 {
        let t = Instant::now();
        let who = get_ok(&gw, &key, &format!("/v1/infer/t?i={i}")).await;
        assert_eq!(
            who, "G",
            "a connect timeout moves the request on, it is not a 504"
        );
        slow.push(t.elapsed() >= Duration::from_millis(900));
    }
    let n_slow = slow.iter().filter(|s| **s).count();
    assert!(
        (1..=3).contains(&n_slow),
        "round robin over [blackhole, good]: the blackhole costs a connect timeout at most 3 \
         times before it is ejected, got {n_slow} slow requests: {slow:?}"
    );
    assert!(
        slow[6..].iter().all(|s| !s),
        "after 3 consecutive connect timeouts the blackhole should be out: {slow:?}"
    );

    // After eject_seconds it is tried again (and fails over again).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut again = Vec::new();
    for i in 0..4 {
        let t = Instant::now();
        let who = get_ok(&gw, &key, &format!("/v1/infer/again?i={i}")).await;
        assert_eq!(who, "G");
        again.push(t.elapsed() >= Duration::from_millis(900));
    }
    assert!(
        again.iter().any(|s| *s),
        "the ejection should end after eject_seconds = 4: {again:?}"
    );
}

#[tokio::test]
async fn every_replica_down_answers_502_promptly_while_healthz_stays_200_and_all_report_unhealthy()
{
    let log = HitLog::new();
    let reps = [
        Upstream::stopped_local("A", &log),
        Upstream::stopped_local("B", &log),
        Upstream::stopped_local("C", &log),
    ];
    let service = format!("connect_timeout_seconds = 1\n{HEALTH_1S}");
    let gw = gateway(&urls(&[&reps[0], &reps[1], &reps[2]]), &service, "");
    let (key, _) = gw.create_key("infer", &[]);

    let check_502 = |round: &'static str| {
        let gw = &gw;
        let key = &key;
        async move {
            for i in 0..4 {
                let t = Instant::now();
                let (status, body) = send(gw, key, "GET", &format!("/v1/infer/x?i={i}"), None)
                    .await
                    .unwrap_or_else(|e| panic!("{round}: {e}"));
                assert_eq!(
                    (status, &body["error"]),
                    (502, &serde_json::json!("bad_gateway"))
                );
                assert!(
                    t.elapsed() < Duration::from_secs(2),
                    "{round}: 502 after {:?}",
                    t.elapsed()
                );
                let (status, _, body) =
                    gw.raw(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
                assert_eq!(
                    status,
                    200,
                    "{round}: /healthz {}",
                    String::from_utf8_lossy(&body)
                );
            }
        }
    };
    check_502("before any health check").await;
    let down: Vec<(String, f64)> = reps.iter().map(|r| (r.host_port(), 0.0)).collect();
    let down: Vec<(&str, f64)> = down.iter().map(|(r, v)| (r.as_str(), *v)).collect();
    wait_healthy(&gw, &down, Duration::from_secs(10)).await;
    // Every replica out: tried anyway, refused, still a prompt 502.
    check_502("all ejected").await;

    // One comes back: it passes its check, reports 1, and serves.
    reps[1].restart();
    wait_healthy(&gw, &[(&reps[1].host_port(), 1.0)], Duration::from_secs(5)).await;
    assert_eq!(get_ok(&gw, &key, "/v1/infer/back").await, "B");
    assert!(log.health_checks("B") >= 1);
}

#[tokio::test]
async fn a_replica_failing_its_health_check_gets_no_requests_until_it_passes_again() {
    let log = HitLog::new();
    let (a, b, c) = (
        Upstream::local("A", &log),
        Upstream::stopped_local("B", &log),
        Upstream::local("C", &log),
    );
    // A answers requests fine but its health check says 503; B refuses everything.
    a.set_healthy(false);
    let service = format!("balance = \"round_robin\"\n{HEALTH_1S}");
    let gw = gateway(&urls(&[&a, &b, &c]), &service, "");
    let (key, _) = gw.create_key("infer", &[]);
    wait_healthy(
        &gw,
        &[
            (&a.host_port(), 0.0),
            (&b.host_port(), 0.0),
            (&c.host_port(), 1.0),
        ],
        Duration::from_secs(10),
    )
    .await;
    for i in 0..6 {
        assert_eq!(get_ok(&gw, &key, &format!("/v1/infer/x?i={i}")).await, "C");
    }
    assert!(log.health_checks("A") >= 1, "A was never health-checked");
    assert!(
        log.requests().iter().all(|h| h.replica != "A"),
        "an unhealthy replica got traffic"
    );

    a.set_healthy(true);
    wait_healthy(&gw, &[(&a.host_port(), 1.0)], Duration::from_secs(5)).await;
    let mut count: HashMap<String, usize> = HashMap::new();
    for i in 0..6 {
        let who = get_ok(&gw, &key, &format!("/v1/infer/y?i={i}")).await;
        *count.entry(who).or_default() += 1;
    }
    assert!(
        count.get("A").is_some_and(|n| *n >= 2),
        "A passes again and should be back in the rotation: {count:?}"
    );
    assert_eq!(count.get("B"), None);
}
