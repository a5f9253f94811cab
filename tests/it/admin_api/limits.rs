//! Abuse limits of the key API: `requests_per_minute` per `sub`, and revoked keys deleted
//! after `revoked_retention_days` (on SQLite and on Postgres).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::header;

use super::{ids, Admin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_over_requests_per_minute_gets_429_with_retry_after_and_other_subs_are_unaffected() {
    let a = Admin::start("requests_per_minute = 5").await;
    let alice = a.token("alice", "infer");
    let bob = a.token("bob", "infer");
    // Counted per fixed minute: should one end inside this loop the count starts again, so a
    // 429 comes within two minutes' worth at most, and never before the sixth request.
    let mut allowed = 0;
    let mut limited = None;
    for _ in 0..11 {
        let response = a.call("GET", "/v1/keys", Some(&alice), None);
        if response.0 != 200 {
            limited = Some(response);
            break;
        }
        allowed += 1;
    }
    let (status, headers, body) = limited.expect("no 429 in 11 requests at 5 a minute");
    assert!(allowed >= 5, "refused after {allowed} requests");
    assert_eq!(status, 429);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "rate_limited", "{body}");
    assert!(body["message"].is_string(), "{body}");
    let retry_after: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    assert!(
        (1..=60).contains(&retry_after),
        "Retry-After: {retry_after}"
    );
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert!(header(&headers, "x-request-id").is_some());

    // Bob has a budget of his own; a caller without a token still gets the plain 401.
    assert_eq!(a.list(&bob, "").0, 200);
    assert_eq!(
        a.create(&bob, json!({"name": "b", "scopes": ["infer"]})).0,
        201
    );
    assert_eq!(a.call("GET", "/v1/keys", None, None).0, 401);
    let refused = (a.access_log().lines())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["status"] == 429)
        .collect::<Vec<_>>();
    assert!(!refused.is_empty(), "{}", a.access_log());
    assert!(refused.iter().all(|l| l["principal_id"] == "alice"));
}

/// Three keys in the store before the gateway starts: one revoked three days ago, one an hour
/// ago, one active. With `revoked_retention_days = 1` only the first is deleted.
async fn old_revocations_are_deleted(database: &str) {
    let store = portcullis::open_store(database, false).await.unwrap();
    let mut made = Vec::new();
    for name in ["old", "recent", "active"] {
        let key = portcullis::create_key(&*store, name, vec!["infer".into()], None)
            .await
            .unwrap();
        made.push((key.record.key_id, key.token));
    }
    let now = testkit::idp::unix_now();
    assert!(store.revoke(&made[0].0, now - 3 * 86_400).await.unwrap());
    assert!(store.revoke(&made[1].0, now - 3_600).await.unwrap());

    let a = Admin::start_on("revoked_retention_days = 1", Some(database)).await;
    let root = a.token("root", "portcullis:admin");
    let listed = || ids(&a.list(&root, "").1);
    let started = Instant::now();
    while listed().contains(&made[0].0) {
        assert!(started.elapsed() < Duration::from_secs(10), "never deleted");
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = listed();
    assert!(
        left.contains(&made[1].0) && left.contains(&made[2].0),
        "{left:?}"
    );
    assert!(store.find(&made[0].0).await.unwrap().is_none());
    assert_eq!(a.use_key(&made[0].1), 401);
    assert_eq!(a.use_key(&made[2].1), 200);
    assert!(
        a.gw.log().contains("deleted 1 key(s) revoked"),
        "{}",
        a.gw.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_revoked_longer_ago_than_the_retention_are_deleted_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    old_revocations_are_deleted(&format!("sqlite://{}/keys.db", dir.path().display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_revoked_longer_ago_than_the_retention_are_deleted_on_postgres() {
    let pg = testkit::postgres::Postgres::start();
    old_revocations_are_deleted(&pg.url).await;
}
