//! What the ledger holds, and how `GET /v1/usage` and `portcullis usage` show it.

use std::time::Duration;

use serde_json::{json, Value};

use super::{admin_port, chat, embed, get, key, total, usage_api, usage_cli, wait_for, Fixture};

const ADMIN: &str = "portcullis:admin";

/// Rows as (key, owner, service, model, requests, prompt, completion), sorted.
fn shape(rows: &[Value]) -> Vec<(Value, Value, Value, Value, u64, u64, u64)> {
    let mut out: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r["key"].clone(),
                r["owner"].clone(),
                r["service"].clone(),
                r["model"].clone(),
                r["requests"].as_u64().unwrap(),
                r["prompt_tokens"].as_u64().unwrap(),
                r["completion_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    out.sort_by_key(|r| format!("{r:?}"));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_equals_the_upstreams_counts_per_key_owner_service_and_model() {
    let fx = Fixture::start().await;
    let admin = admin_port();
    let gw = fx.gateway(None, Some(admin), 5);
    let (alice_key, alice_id) = key(&gw, Some("alice"));
    let (bob_key, bob_id) = key(&gw, Some("bob"));
    let (nobody_key, nobody_id) = key(&gw, None);
    let carol = fx.token("carol", "chat");
    let p = gw.port;
    for _ in 0..3 {
        assert_eq!(chat(p, &alice_key, "m1", false), 200);
    }
    for _ in 0..2 {
        assert_eq!(chat(p, &alice_key, "m1", true), 200);
    }
    assert_eq!(chat(p, &alice_key, "m2", false), 200);
    for _ in 0..2 {
        assert_eq!(embed(p, &bob_key, "e1"), 200);
    }
    assert_eq!(get(p, &nobody_key, "/v1/plain/anything"), 200);
    for _ in 0..2 {
        assert_eq!(chat(p, &carol, "m1", false), 200);
    }
    // Never sent upstream, so never charged: a bad key, an unknown service, a missing scope.
    assert_eq!(chat(p, "ak_0011223344556677.nope", "m1", false), 401);
    assert_eq!(get(p, &alice_key, "/v1/nowhere/x"), 404);
    assert_eq!(embed(p, &carol, "e1"), 403);

    let root = fx.token("root", ADMIN);
    let rows = wait_for(
        Duration::from_secs(5),
        || {
            usage_api(admin, &root, "?group_by=key,service,model").1["usage"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        },
        |rows| total(rows, "requests") >= 11,
    );
    let want = vec![
        (
            json!(alice_id),
            json!("alice"),
            json!("chat"),
            json!("m1"),
            5,
            3 * 11 + 2 * 21,
            3 * 5 + 2 * 9,
        ),
        (
            json!(alice_id),
            json!("alice"),
            json!("chat"),
            json!("m2"),
            1,
            11,
            5,
        ),
        (
            json!(bob_id),
            json!("bob"),
            json!("embed"),
            json!("e1"),
            2,
            14,
            0,
        ),
        (
            json!(nobody_id),
            Value::Null,
            json!("plain"),
            Value::Null,
            1,
            0,
            0,
        ),
        // JWT callers are metered under their `sub`, with no key.
        (
            Value::Null,
            json!("carol"),
            json!("chat"),
            json!("m1"),
            2,
            22,
            10,
        ),
    ];
    let mut want = want;
    want.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(shape(&rows), want, "{rows:#?}");
    assert!(
        rows.iter().all(|r| r.get("day").is_none()),
        "not grouped by day"
    );

    // The CLI prints the same rows as the API, grouped by all four parts by default.
    let api = usage_api(admin, &root, "").1["usage"]
        .as_array()
        .cloned()
        .unwrap();
    let printed = usage_cli(&gw.config, &[]);
    let strip = |rows: &[Value]| {
        rows.iter()
            .map(|r| {
                let mut r = r.clone();
                r.as_object_mut().unwrap().remove("estimated");
                r
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&printed), strip(&api));
    assert_eq!(api.len(), 5);
    let today = &api[0]["day"];
    assert!(today.as_str().is_some_and(|d| d.len() == 10), "{today}");
    let by_key = usage_cli(&gw.config, &["--group-by", "key"]);
    assert_eq!(total(&by_key, "requests"), 11);
    assert_eq!(
        total(&by_key, "prompt_tokens"),
        3 * 11 + 2 * 21 + 11 + 14 + 22
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_api_shows_owners_their_own_and_administrators_everyones() {
    let fx = Fixture::start().await;
    let admin = admin_port();
    let gw = fx.gateway(None, Some(admin), 5);
    let (alice_key, alice_id) = key(&gw, Some("alice"));
    let (bob_key, _) = key(&gw, Some("bob"));
    let alice = fx.token("alice", "chat");
    for token in [&alice_key, &alice, &bob_key] {
        assert_eq!(chat(gw.port, token, "m1", false), 200);
    }
    let root = fx.token("root", ADMIN);
    wait_for(
        Duration::from_secs(5),
        || {
            usage_api(admin, &root, "").1["usage"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        },
        |rows| total(rows, "requests") >= 3,
    );

    // An owner: its key and its own JWT calls, nobody else's; by key, each is a row.
    let (status, body) = usage_api(admin, &alice, "?group_by=key");
    assert_eq!(status, 200, "{body}");
    let rows = body["usage"].as_array().unwrap();
    let keys: Vec<&Value> = rows.iter().map(|r| &r["key"]).collect();
    assert_eq!(keys, [&Value::Null, &json!(alice_id)], "{body}");
    assert!(rows.iter().all(|r| r["owner"] == "alice"));
    assert_eq!(
        rows[0].as_object().unwrap().keys().collect::<Vec<_>>(),
        [
            "cached_tokens",
            "completion_tokens",
            "cost",
            "key",
            "owner",
            "prompt_tokens",
            "reasoning_tokens",
            "requests",
            "unpriced_requests"
        ],
        "parts not grouped by are left out"
    );
    // Asking for oneself is fine; for another owner, forbidden.
    assert_eq!(
        usage_api(admin, &alice, "?owner=alice&group_by=").1["usage"][0]["requests"],
        2
    );
    assert_eq!(usage_api(admin, &alice, "?owner=bob").0, 403);

    // An administrator: everyone (one row per owner when grouped by nothing), or one owner.
    let (_, all) = usage_api(admin, &root, "?group_by=");
    let owners: Vec<(&Value, &Value)> = all["usage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (&r["owner"], &r["requests"]))
        .collect();
    assert_eq!(
        owners,
        [(&json!("alice"), &json!(2)), (&json!("bob"), &json!(1))]
    );
    let (_, bob) = usage_api(admin, &root, "?owner=bob&group_by=service");
    assert_eq!(
        bob["usage"],
        json!([{"owner": "bob", "service": "chat", "requests": 1,
        "prompt_tokens": 11, "completion_tokens": 5, "reasoning_tokens": 2, "cached_tokens": 3,
        "cost": null, "unpriced_requests": 0}])
    );

    // Days: inclusive; a range that ends before today holds nothing of today.
    let today = all_days(admin, &root);
    let (_, only_today) = usage_api(
        admin,
        &root,
        &format!("?from={today}&to={today}&group_by=day"),
    );
    assert_eq!(
        total(only_today["usage"].as_array().unwrap(), "requests"),
        3
    );
    let (_, long_ago) = usage_api(admin, &root, "?from=2020-01-01&to=2020-12-31");
    assert_eq!(long_ago, json!({"usage": [], "next": null}));

    // Bad parameters: 400 naming the parameter; never a 5xx.
    for (query, named) in [
        ("?from=2026-02-30", "from"),
        ("?to=tomorrow", "to"),
        (
            "?from=2026-03-02&to=2026-03-01",
            "from must not be after to",
        ),
        ("?from=2020-01-01&to=2026-01-01", "366"),
        ("?group_by=day,user", "group_by"),
        ("?owner=", "owner"),
    ] {
        let (status, body) = usage_api(admin, &root, query);
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"], "bad_request");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(named), "{query}: {message}");
    }
    // Only JWTs, only GET.
    assert_eq!(usage_api(admin, &alice_key, "").0, 403);
    assert_eq!(usage_api(admin, "", "").0, 401);
    let post = format!(
        "POST /v1/usage HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {root}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let (status, headers, _) = tokio::task::block_in_place(|| testkit::raw(admin, post.as_bytes()));
    assert_eq!(status, 405);
    assert_eq!(testkit::header(&headers, "allow"), Some("GET, OPTIONS"));
}

/// Today's UTC day as the API names it.
fn all_days(admin: u16, token: &str) -> String {
    let (_, body) = usage_api(admin, token, "?group_by=day");
    body["usage"][0]["day"].as_str().unwrap().to_string()
}
