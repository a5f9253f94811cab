//! Balancing: least_requests (the default) and round_robin.

use std::collections::HashMap;
use std::time::Duration;

use testkit::{HitLog, Upstream};

use super::{
    gateway, get_ok, only, settle, sse_path, three_replicas, urls, wait_healthy, HEALTH_1S,
};

#[tokio::test]
async fn least_requests_by_default_sends_short_requests_to_the_replica_without_an_open_stream() {
    let log = HitLog::new();
    let [a, b, c] = three_replicas(&log);
    // No `balance`: least_requests is the default.
    let gw = gateway(&urls(&[&a, &b, &c]), "", "");
    let (key, _) = gw.create_key("infer", &[]);

    let _s1 = gw.open_sse(&key, &sse_path("s1", 300, 100)).await;
    let first = only(&log, "id=s1&");
    let _s2 = gw.open_sse(&key, &sse_path("s2", 300, 100)).await;
    let second = only(&log, "id=s2&");
    assert_ne!(
        first, second,
        "the second stream went to the replica already holding one while others had none"
    );
    let free: String = ["A", "B", "C"]
        .into_iter()
        .find(|r| *r != first && *r != second)
        .unwrap()
        .into();
    for i in 0..9 {
        settle().await;
        let who = get_ok(&gw, &key, &format!("/v1/infer/short?i={i}")).await;
        assert_eq!(
            who, free,
            "request {i}: {first} and {second} each hold a stream, {free} holds nothing"
        );
    }
}

#[tokio::test]
async fn least_requests_keeps_new_requests_off_a_replica_holding_two_streams_and_rotates_ties() {
    let log = HitLog::new();
    let a = Upstream::local("A", &log);
    let b = Upstream::stopped_local("B", &log);
    let c = Upstream::stopped_local("C", &log);
    let service = format!("balance = \"least_requests\"\n{HEALTH_1S}");
    let gw = gateway(&urls(&[&a, &b, &c]), &service, "");
    let (key, _) = gw.create_key("infer", &[]);
    // Only A is up: both streams land there.
    wait_healthy(
        &gw,
        &[(&b.host_port(), 0.0), (&c.host_port(), 0.0)],
        Duration::from_secs(15),
    )
    .await;
    let _s1 = gw.open_sse(&key, &sse_path("s1", 300, 100)).await;
    let _s2 = gw.open_sse(&key, &sse_path("s2", 300, 100)).await;
    assert_eq!(only(&log, "id=s1&"), "A");
    assert_eq!(only(&log, "id=s2&"), "A");
    // B and C come up and pass their health checks.
    b.restart();
    c.restart();
    wait_healthy(
        &gw,
        &[(&b.host_port(), 1.0), (&c.host_port(), 1.0)],
        Duration::from_secs(15),
    )
    .await;
    let mut count: HashMap<String, usize> = HashMap::new();
    for i in 0..12 {
        settle().await;
        let who = get_ok(&gw, &key, &format!("/v1/infer/short?i={i}")).await;
        *count.entry(who).or_default() += 1;
    }
    assert_eq!(
        count.get("A"),
        None,
        "A holds two streams, B and C none: {count:?}"
    );
    assert!(
        count.get("B").copied().unwrap_or(0) >= 3 && count.get("C").copied().unwrap_or(0) >= 3,
        "B and C tie at zero in flight: ties should rotate between them, got {count:?}"
    );
}

#[tokio::test]
async fn round_robin_spreads_thirty_requests_ten_to_each_of_three_replicas() {
    let log = HitLog::new();
    let [a, b, c] = three_replicas(&log);
    let gw = gateway(&urls(&[&a, &b, &c]), "balance = \"round_robin\"", "");
    let (key, _) = gw.create_key("infer", &[]);
    let mut count: HashMap<String, usize> = HashMap::new();
    for i in 0..30 {
        let who = get_ok(&gw, &key, &format!("/v1/infer/rr?i={i}")).await;
        *count.entry(who).or_default() += 1;
    }
    for r in ["A", "B", "C"] {
        let n = count.get(r).copied().unwrap_or(0);
        assert!((9..=11).contains(&n), "{r} got {n} of 30: {count:?}");
        assert_eq!(log.count(r), n, "the replica's own log agrees");
    }
}
