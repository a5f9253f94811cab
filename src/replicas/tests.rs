use std::path::Path;
use std::sync::Arc;

use pingora::upstreams::peer::Peer;

use super::Replicas;
use crate::config::Config;
use crate::observe::metrics::Metrics;

fn replicas(extra: &str, n: usize) -> Arc<Replicas> {
    let list: Vec<String> = (1..=n)
        .map(|i| format!("\"http://127.0.0.{i}:8000\""))
        .collect();
    let text = format!(
        "[services.infer]\nupstream = [{}]\nscope = \"infer\"\n{extra}\n",
        list.join(", ")
    );
    let config = Config::parse(Path::new("t.toml"), &text, |_| None).unwrap();
    let service = &config.services[0];
    Arc::new(Replicas::new(service, &Metrics::new(), &|up, a| {
        crate::proxy::peer_for(service, up, a)
    }))
}

#[test]
fn least_requests_avoids_busy_replicas_and_rotates_ties() {
    let r = replicas("", 3);
    let (busy_a, _) = r.choose(0).unwrap();
    let (busy_b, _) = r.choose(0).unwrap();
    assert_ne!(busy_a.index, busy_b.index);
    // The third replica is the only idle one: every new request goes there while the others
    // are busy, and releases it before the next.
    let idle = 3 - busy_a.index - busy_b.index;
    for _ in 0..5 {
        let (c, peer) = r.choose(0).unwrap();
        assert_eq!(c.index, idle);
        assert_eq!(
            peer.address().to_string(),
            format!("127.0.0.{}:8000", idle + 1)
        );
    }
    drop((busy_a, busy_b));
    let mut seen = [0; 3];
    for _ in 0..30 {
        seen[r.choose(0).unwrap().0.index] += 1;
    }
    assert_eq!(seen, [10, 10, 10], "ties rotate");
}

#[test]
fn round_robin_rotates_and_each_replica_is_tried_once() {
    let r = replicas("balance = \"round_robin\"", 3);
    let held: Vec<_> = (0..6).map(|_| r.choose(0).unwrap().0.index).collect();
    assert_eq!(held, [0, 1, 2, 0, 1, 2]);
    let (first, _) = r.choose(0).unwrap();
    let tried = 1 << first.index;
    let (second, _) = r.choose(tried).unwrap();
    assert_ne!(second.index, first.index);
    let (third, _) = r.choose(tried | 1 << second.index).unwrap();
    assert!(r
        .choose(tried | 1 << second.index | 1 << third.index)
        .is_none());
}

#[test]
fn connect_failures_eject_a_replica_until_it_connects_or_passes_a_check() {
    let r = replicas("eject_after_connect_failures = 2\neject_seconds = 60", 2);
    r.connect_failed(0);
    assert!(
        (0..4).any(|_| r.choose(0).unwrap().0.index == 0),
        "one failure is not enough"
    );
    r.connect_failed(0);
    assert!(
        (0..10).all(|_| r.choose(0).unwrap().0.index == 1),
        "ejected"
    );
    assert_eq!(r.members()[0].healthy_gauge.get(), 0);
    // With every other replica tried, the ejected one is tried anyway.
    assert_eq!(r.choose(1 << 1).unwrap().0.index, 0);
    r.connected(0);
    assert!(
        (0..4).any(|_| r.choose(0).unwrap().0.index == 0),
        "back after a connect"
    );
    assert_eq!(r.members()[0].healthy_gauge.get(), 1);

    r.checked(1, false, "503");
    assert!(
        (0..10).all(|_| r.choose(0).unwrap().0.index == 0),
        "failed its check"
    );
    r.checked(1, true, "");
    assert!(
        (0..4).any(|_| r.choose(0).unwrap().0.index == 1),
        "passed again"
    );
}

#[test]
fn one_replica_counts_nothing_and_is_tried_once() {
    let r = replicas("", 1);
    let (a, _) = r.choose(0).unwrap();
    assert_eq!(a.index, 0);
    assert!(a.counted.is_none(), "nothing to balance, nothing to count");
    assert!(r.choose(1).is_none());
}

#[test]
fn in_flight_counts_end_with_the_request() {
    let r = replicas("", 2);
    let (a, _) = r.choose(0).unwrap();
    let i = a.index;
    assert_eq!(
        r.members()[i]
            .in_flight
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    drop(a);
    assert_eq!(
        r.members()[i]
            .in_flight
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[test]
fn prefix_affinity_keeps_a_key_on_its_replica_until_the_bound_then_spills_along_the_ring() {
    use super::Affinity::{Hit, NoKey, Spill};
    let r = replicas("balance = \"prefix_affinity\"", 3);
    let key = 0x1234_5678_9abc_def0;
    let (first, _) = r.choose_for(0, Some(key)).unwrap();
    let owner = first.index;
    assert_eq!(first.affinity, Some(Hit));
    drop(first);
    for _ in 0..10 {
        let (c, _) = r.choose_for(0, Some(key)).unwrap();
        assert_eq!(
            (c.index, c.affinity),
            (owner, Some(Hit)),
            "idle: never spills"
        );
    }
    // Held in flight on its replica: 1 (bound ⌈1.25 × 2 / 3⌉ = 1 for the second) → spills
    // to the next replica on the ring, and always the same one.
    let (held, _) = r.choose_for(0, Some(key)).unwrap();
    let (spilled, _) = r.choose_for(0, Some(key)).unwrap();
    assert_eq!(spilled.affinity, Some(Spill));
    assert_ne!(spilled.index, owner);
    let next = spilled.index;
    drop((held, spilled));
    // Out of rotation: its keys go to the next on the ring, and only there.
    r.checked(owner, false, "503");
    for _ in 0..5 {
        let (c, _) = r.choose_for(0, Some(key)).unwrap();
        assert_eq!((c.index, c.affinity), (next, Some(Spill)));
    }
    r.checked(owner, true, "");
    assert_eq!(r.choose_for(0, Some(key)).unwrap().0.index, owner);
    // A connect failover: the tried owner is skipped.
    assert_eq!(r.choose_for(1 << owner, Some(key)).unwrap().0.index, next);
    // No key: least_requests, counted as none.
    assert_eq!(r.choose_for(0, None).unwrap().0.affinity, Some(NoKey));
    assert_eq!(replicas("", 3).choose(0).unwrap().0.affinity, None);
}
