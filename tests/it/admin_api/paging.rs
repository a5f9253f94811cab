//! `GET /v1/keys` in pages: every key exactly once, newest first, on SQLite and on Postgres;
//! `limit` defaulted and clamped; a malformed `limit` or `cursor` refused with 400.

use std::collections::HashSet;

use serde_json::{json, Value};

use super::{ids, Admin};

/// Walks `GET /v1/keys?{query}&limit={limit}` page by page, following `next`: the ids in the
/// order given, and the number of pages. Every page holds at most `limit` keys, and only the
/// last one has `next: null`.
fn walk(a: &Admin, token: &str, query: &str, limit: u32) -> (Vec<String>, usize) {
    let (mut all, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let after = cursor.map(|c| format!("&cursor={c}")).unwrap_or_default();
        let (status, page) = a.list(token, &format!("?{query}&limit={limit}{after}"));
        assert_eq!(status, 200, "{page}");
        pages += 1;
        let keys = ids(&page);
        assert!(
            keys.len() <= limit as usize,
            "{} keys in a page of {limit}",
            keys.len()
        );
        let created: Vec<&str> = (page["keys"].as_array().unwrap().iter())
            .map(|k| k["created"].as_str().unwrap())
            .collect();
        assert!(
            created.windows(2).all(|w| w[0] >= w[1]),
            "newest first: {created:?}"
        );
        all.extend(keys);
        match &page["next"] {
            Value::Null => return (all, pages),
            Value::String(next) => cursor = Some(next.clone()),
            other => panic!("next is {other}"),
        }
        assert!(pages < 100, "no end to the pages");
    }
}

fn assert_same_keys(got: &[String], want: &[String], what: &str) {
    let unique: HashSet<_> = got.iter().collect();
    assert_eq!(
        unique.len(),
        got.len(),
        "{what}: a key listed twice: {got:?}"
    );
    assert_eq!(unique, want.iter().collect(), "{what}");
}

/// Keys of three owners (one revoked: listed too), walked by each view of the list; then
/// more keys than the largest page, made through the store as the CLI makes them.
async fn pages_walk_every_key_once(a: &Admin, database: &str) {
    let mut made = Vec::new();
    for (owner, n) in [("alice", 7), ("bob", 6), ("carol", 1)] {
        let token = a.token(owner, "infer");
        for i in 0..n {
            let (status, key) = a.create(
                &token,
                json!({"name": format!("{owner} {i}"), "scopes": ["infer"]}),
            );
            assert_eq!(status, 201, "{key}");
            made.push((owner, key["id"].as_str().unwrap().to_string()));
        }
    }
    let alice = a.token("alice", "infer");
    assert_eq!(a.revoke(&alice, &made[0].1), 204);
    let of = |who: &str| -> Vec<String> {
        (made.iter().filter(|(o, _)| *o == who || who == "*"))
            .map(|(_, id)| id.clone())
            .collect()
    };
    let root = a.token("root", "portcullis:admin");

    let (got, pages) = walk(a, &root, "", 5);
    assert_same_keys(&got, &of("*"), "an administrator's pages");
    assert_eq!(pages, 3);
    let (got, pages) = walk(a, &alice, "", 3);
    assert_same_keys(&got, &of("alice"), "alice's pages");
    assert_eq!(pages, 3);
    let (got, pages) = walk(a, &root, "owner=bob", 1);
    assert_same_keys(&got, &of("bob"), "bob's keys one by one");
    assert_eq!(pages, 6);
    let (got, _) = walk(a, &a.token("carol", "infer"), "owner=carol", 1000);
    assert_same_keys(&got, &of("carol"), "carol's single page");

    // Past the largest page: the default page is 100, a larger limit is clamped to 1000.
    let store = portcullis::open_store(database, false).await.unwrap();
    let mut all = of("*");
    for _ in 0..1001 {
        let key = portcullis::create_key(&*store, "bulk", vec!["infer".into()], None)
            .await
            .unwrap();
        all.push(key.record.key_id);
    }
    let (status, page) = a.list(&root, "");
    assert_eq!((status, ids(&page).len()), (200, 100));
    assert!(page["next"].is_string());
    let (status, page) = a.list(&root, "?limit=99999999999999999999999");
    assert_eq!((status, ids(&page).len()), (200, 1000), "clamped to 1000");
    let (status, rest) = a.list(
        &root,
        &format!("?limit=5000&cursor={}", page["next"].as_str().unwrap()),
    );
    assert_eq!((status, &rest["next"]), (200, &Value::Null));
    let mut got = ids(&page);
    got.extend(ids(&rest));
    assert_same_keys(&got, &all, "two clamped pages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_walk_every_key_exactly_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}/keys.db", dir.path().display());
    let a = Admin::start_on("", Some(&database)).await;
    pages_walk_every_key_once(&a, &database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_walk_every_key_exactly_once_on_postgres() {
    let pg = testkit::postgres::Postgres::start();
    let a = Admin::start_on("", Some(&pg.url)).await;
    pages_walk_every_key_once(&a, &pg.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_limit_or_cursor_gets_400_and_a_cursor_past_the_end_an_empty_page() {
    let a = Admin::start("").await;
    let alice = a.token("alice", "infer");
    assert_eq!(
        a.create(&alice, json!({"name": "k", "scopes": ["infer"]}))
            .0,
        201
    );
    for (query, field) in [
        ("?cursor=abc", "cursor"),
        ("?cursor=", "cursor"),
        ("?cursor=0123456789ABCDEF0123456789ABCDEF", "cursor"),
        ("?cursor=null", "cursor"),
        ("?limit=0", "limit"),
        ("?limit=-1", "limit"),
        ("?limit=ten", "limit"),
        ("?limit=1.5", "limit"),
    ] {
        let (status, err) = a.list(&alice, query);
        assert_eq!(status, 400, "{query}: {err}");
        assert_eq!(err["error"], "bad_request", "{query}");
        assert!(
            err["message"].as_str().unwrap().starts_with(field),
            "{query}: {err}"
        );
    }
    // Any cursor of the right form names a position: past the oldest key, nothing is left.
    let (status, page) = a.list(&alice, &format!("?cursor={}", "0".repeat(32)));
    assert_eq!((status, page), (200, json!({"keys": [], "next": null})));
}
