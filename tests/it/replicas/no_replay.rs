//! No replay once a request reached a replica: a POST reset after reading is a 502.

use std::time::Duration;

use testkit::{Gateway, HitLog};

use super::{gateway, get_ok, send, three_replicas, urls};

/// POSTs distinct requests until `a_hits_wanted` of them reached A (which resets each after
/// reading it): each of those must be a 502 and appear in no other replica's log; every other
/// POST is a 200 from the one replica that logged it.
async fn posts_reset_by_a_are_not_replayed(gw: &Gateway, key: &str, log: &HitLog, tag: &str) {
    let mut a_hits = 0;
    for k in 0..15 {
        let id = format!("{tag}{k}");
        let body = format!("{{\"prompt\":\"generate {id}\",\"max_tokens\":500}}");
        let path = format!("/v1/infer/generate?id={id}&");
        let (status, answer) = send(gw, key, "POST", &path, Some(&body))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let who = log.replicas_for(&format!("id={id}&"));
        if who.iter().any(|w| w == "A") {
            assert_eq!(
                who,
                ["A"],
                "POST {id} was reset by A after reaching it, then replayed elsewhere"
            );
            assert_eq!(status, 502, "POST {id}: {answer}");
            assert_eq!(answer["error"], "bad_gateway");
            a_hits += 1;
            if a_hits == 2 {
                break;
            }
        } else {
            assert_eq!(who.len(), 1, "POST {id} reached {who:?}");
            assert_eq!(
                (status, answer["replica"].as_str()),
                (200, Some(who[0].as_str()))
            );
            assert_eq!(log.matching(&format!("id={id}&"))[0].body, body.as_bytes());
        }
    }
    assert!(
        a_hits >= 1,
        "no POST reached A in 15 tries: nothing was tested"
    );
    // Nothing arrives late either.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for h in log.matching(&format!("id={tag}")) {
        let id = h.target.split("id=").nth(1).unwrap_or_default();
        assert_eq!(
            log.replicas_for(&format!("id={id}")).len(),
            1,
            "{} reached more than one replica",
            h.target
        );
    }
}

#[tokio::test]
async fn a_post_reset_by_a_replica_after_reading_it_is_not_replayed_and_the_client_gets_502() {
    let log = HitLog::new();
    let [a, b, c] = three_replicas(&log);
    a.set_reset_before_answer(true);
    let gw = gateway(&urls(&[&a, &b, &c]), "balance = \"round_robin\"", "");
    let (key, _) = gw.create_key("infer", &[]);
    posts_reset_by_a_are_not_replayed(&gw, &key, &log, "fresh").await;
}

#[tokio::test]
async fn a_post_reset_on_a_reused_upstream_connection_is_not_replayed_either() {
    let log = HitLog::new();
    let [a, b, c] = three_replicas(&log);
    let gw = gateway(&urls(&[&a, &b, &c]), "balance = \"round_robin\"", "");
    let (key, _) = gw.create_key("infer", &[]);
    // Warm a kept-alive connection to each replica, then A starts resetting: the next request
    // to A goes out on a pooled connection (where Pingora would retry an idempotent request).
    for i in 0..6 {
        get_ok(&gw, &key, &format!("/v1/infer/warm?i={i}")).await;
    }
    assert!(log.count("A") >= 1);
    a.set_reset_before_answer(true);
    posts_reset_by_a_are_not_replayed(&gw, &key, &log, "reused").await;
}
