//! Budgets through the key API (`budget` on `POST` and `PATCH /v1/keys`, `GET`/`PUT
//! /v1/owners/{sub}/budget`, listings' `budget` and `used`), on SQLite and on Postgres.

use serde_json::{json, Value};

use super::{table, wait_for, window, Fixture, TOKENS};

/// The key API's budget calls on one store; the Postgres test runs it too.
async fn api_budgets(f: &Fixture) {
    let alice = f.token("alice", "chat");
    let bob = f.token("bob", "chat");
    let admin = f.token("root", "portcullis:admin");
    let owner = "/v1/owners/alice/budget";

    // No budget yet: null, with every window's use and reset.
    let (status, got) = f.get(owner, &alice);
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["budget"], Value::Null);
    for name in [
        "tokens_per_hour",
        "tokens_per_day",
        "tokens_per_month",
        "requests_per_day",
    ] {
        assert_eq!(got["used"][name], 0, "{got}");
        let resets = got["resets"][name].as_str().unwrap();
        assert!(resets.ends_with(":00:00Z") && resets.len() == 20, "{got}");
    }

    // Only an administrator sets an owner's budget; only it and the owner read it.
    let day = json!({"budget": {"tokens_per_day": 1000}});
    assert_eq!(f.json("PUT", owner, &alice, day.clone()).0, 403);
    let (status, got) = f.json("PUT", owner, &admin, day);
    assert_eq!(
        (status, &got["budget"]),
        (200, &json!({"tokens_per_day": 1000})),
        "{got}"
    );
    let (status, got) = f.get(owner, &bob);
    assert_eq!(
        (status, got["error"].as_str()),
        (403, Some("forbidden")),
        "{got}"
    );
    assert_eq!(
        f.get(owner, &admin).1["budget"],
        json!({"tokens_per_day": 1000})
    );
    assert_eq!(
        f.get(owner, &alice).1["budget"],
        json!({"tokens_per_day": 1000})
    );
    assert_eq!(
        f.get("/v1/owners/bob/budget", &bob).1["budget"],
        Value::Null
    );

    // Keys made within the owner's budget; above it, 403 naming the window.
    let (status, made) = f.json(
        "POST",
        "/v1/keys",
        &alice,
        json!({"name": "k", "scopes": ["chat"], "budget": {"tokens_per_day": 500, "tokens_per_hour": 99999}}),
    );
    assert_eq!(status, 201, "{made}");
    assert_eq!(
        made["budget"],
        json!({"tokens_per_hour": 99999, "tokens_per_day": 500})
    );
    let key = made["key"].as_str().unwrap().to_string();
    let id = made["id"].as_str().unwrap().to_string();
    let (status, err) = f.json(
        "POST",
        "/v1/keys",
        &alice,
        json!({"name": "k", "scopes": ["chat"], "budget": {"tokens_per_day": 1001}}),
    );
    assert_eq!(
        (status, err["error"].as_str()),
        (403, Some("forbidden")),
        "{err}"
    );
    assert!(
        err["message"].as_str().unwrap().contains("tokens_per_day"),
        "{err}"
    );
    let (status, plain) = f.json(
        "POST",
        "/v1/keys",
        &alice,
        json!({"name": "p", "scopes": ["chat"]}),
    );
    assert_eq!((status, &plain["budget"]), (201, &Value::Null));

    // Usage shows in the listing's `used`, for the windows the budget sets.
    assert_eq!(f.chat(&key), 200);
    let list = wait_for(
        || f.get("/v1/keys", &alice).1,
        |l| {
            l["keys"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["used"]["tokens_per_day"] == TOKENS)
        },
    );
    let keys = list["keys"].as_array().unwrap();
    let listed = keys.iter().find(|k| k["id"] == id.as_str()).unwrap();
    assert_eq!(
        listed["budget"],
        json!({"tokens_per_hour": 99999, "tokens_per_day": 500})
    );
    assert_eq!(listed["used"]["tokens_per_day"], TOKENS, "{listed}");
    assert!(listed["used"]["tokens_per_hour"].as_u64().unwrap() <= TOKENS);
    assert_eq!(listed["used"].as_object().unwrap().len(), 2, "{listed}");
    let other = keys.iter().find(|k| k["id"] == plain["id"]).unwrap();
    assert_eq!(
        (&other["budget"], &other["used"]),
        (&Value::Null, &Value::Null)
    );

    // PATCH by the owner: within its budget 200 (the key as listed), above it 403.
    let path = format!("/v1/keys/{id}");
    let (status, got) = f.json(
        "PATCH",
        &path,
        &alice,
        json!({"budget": {"tokens_per_day": 1000, "requests_per_day": 3}}),
    );
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["id"], id.as_str());
    assert_eq!(
        got["budget"],
        json!({"tokens_per_day": 1000, "requests_per_day": 3})
    );
    assert_eq!(
        got["used"],
        json!({"tokens_per_day": TOKENS, "requests_per_day": 1})
    );
    assert!(got.get("key").is_none() && got["scopes"] == json!(["chat"]));
    let (status, err) = f.json(
        "PATCH",
        &path,
        &alice,
        json!({"budget": {"tokens_per_day": 1001}}),
    );
    assert_eq!(status, 403, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("tokens_per_day"),
        "{err}"
    );
    // Another owner's key, and an unknown one, are not found.
    assert_eq!(f.json("PATCH", &path, &bob, json!({"budget": null})).0, 404);
    let (status, err) = f.json(
        "PATCH",
        "/v1/keys/ffffffffffffffff",
        &alice,
        json!({"budget": null}),
    );
    assert_eq!((status, err), (404, json!({"error": "not_found"})));
    // The administrator may go above the owner's budget; null and {} clear.
    let (status, got) = f.json(
        "PATCH",
        &path,
        &admin,
        json!({"budget": {"tokens_per_day": 5000}}),
    );
    assert_eq!(
        (status, &got["budget"]),
        (200, &json!({"tokens_per_day": 5000})),
        "{got}"
    );
    for clear in [json!({"budget": null}), json!({"budget": {}})] {
        let (status, got) = f.json("PATCH", &path, &alice, clear);
        assert_eq!(
            (status, &got["budget"], &got["used"]),
            (200, &Value::Null, &Value::Null)
        );
    }

    // A revoked key's budget no longer changes: 404, as after any DELETE.
    let plain_path = format!("/v1/keys/{}", plain["id"].as_str().unwrap());
    assert_eq!(f.call("DELETE", &plain_path, &alice, None).0, 204);
    let (status, err) = f.json("PATCH", &plain_path, &alice, json!({"budget": null}));
    assert_eq!(
        (status, err["error"].as_str()),
        (404, Some("not_found")),
        "{err}"
    );

    // Bad bodies: 400 naming the member.
    for (method, target, body, message) in [
        (
            "PATCH",
            path.as_str(),
            r#"{"budget":{"tokens_per_week":1}}"#,
            "\"tokens_per_week\"",
        ),
        (
            "PATCH",
            &path,
            r#"{"budget":{"tokens_per_day":1,"tokens_per_day":2}}"#,
            "budget.tokens_per_day is given twice",
        ),
        (
            "PATCH",
            &path,
            r#"{"budget":{"tokens_per_day":"1"}}"#,
            "budget.tokens_per_day must be a whole number",
        ),
        (
            "PATCH",
            &path,
            r#"{"budget":{"requests_per_day":-1}}"#,
            "budget.requests_per_day must be",
        ),
        (
            "PATCH",
            &path,
            r#"{"budget":{"tokens_per_month":2.5}}"#,
            "budget.tokens_per_month must be",
        ),
        (
            "PATCH",
            &path,
            r#"{"budget":{"tokens_per_hour":9223372036854775808}}"#,
            "budget.tokens_per_hour must be",
        ),
        (
            "PATCH",
            &path,
            r#"{"budget":[]}"#,
            "budget must be an object",
        ),
        ("PATCH", &path, r#"{}"#, "budget"),
        (
            "PATCH",
            &path,
            r#"{"budget":null,"name":"x"}"#,
            "unknown field \"name\"",
        ),
        ("PATCH", &path, "not json", "JSON object"),
        (
            "PUT",
            owner,
            r#"{"budget":{"tokens_per_day":true}}"#,
            "budget.tokens_per_day must be",
        ),
        ("PUT", owner, r#"{"budget":{"x":1}}"#, "\"x\""),
        (
            "POST",
            "/v1/keys",
            r#"{"name":"k","scopes":["chat"],"budget":{"tokens_per_day":null}}"#,
            "budget.tokens_per_day must be",
        ),
        (
            "POST",
            "/v1/keys",
            r#"{"name":"k","scopes":["chat"],"budget":{},"budget":{}}"#,
            "budget is given twice",
        ),
    ] {
        let token = if method == "PUT" { &admin } else { &alice };
        let (status, _, err) = f.call(method, target, token, Some(body));
        assert_eq!(status, 400, "{method} {body}: {err}");
        assert_eq!(err["error"], "bad_request");
        let got = err["message"].as_str().unwrap();
        assert!(got.contains(message), "{method} {body}: {got}");
    }

    // An owner named with percent-encoding; a clear through PUT.
    let (status, got) = f.json(
        "PUT",
        "/v1/owners/auth0%7Cx%2Fy/budget",
        &admin,
        json!({"budget": {"requests_per_day": 7}}),
    );
    assert_eq!(
        (status, &got["budget"]),
        (200, &json!({"requests_per_day": 7})),
        "{got}"
    );
    let (status, got) = f.json("PUT", owner, &admin, json!({"budget": null}));
    assert_eq!((status, &got["budget"]), (200, &Value::Null));
    assert_eq!(got["used"]["tokens_per_day"], TOKENS, "{got}");

    // Methods and CORS: the routes say what they answer.
    let (status, headers, _) = f.call("POST", owner, &admin, None);
    let allow = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("allow"));
    assert_eq!(
        (status, allow.map(|(_, v)| v.as_str())),
        (405, Some("GET, PUT, OPTIONS"))
    );
    let (status, headers, _) = f.call("PUT", &path, &admin, None);
    let allow = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("allow"));
    assert_eq!(
        (status, allow.map(|(_, v)| v.as_str())),
        (405, Some("DELETE, PATCH, OPTIONS"))
    );
    assert_eq!(f.get("/v1/owners/alice/budget/x", &admin).0, 404);

    // On record: who changed which key or owner, and what is set now. The access log is
    // written by a thread of its own: wait for the seven lines.
    let budget_events = || -> Vec<Value> {
        (f.events().into_iter())
            .filter(|e| e["key_event"] == "budget")
            .collect()
    };
    let events = wait_for(budget_events, |e| e.len() >= 7);
    let seen: Vec<(Value, Value, Value, Value)> = events
        .iter()
        .map(|e| {
            (
                e["principal_id"].clone(),
                e["key_id"].clone(),
                e["budget_owner"].clone(),
                e["budget"].clone(),
            )
        })
        .collect();
    let k = json!(id);
    assert_eq!(
        seen,
        [
            (
                json!("root"),
                Value::Null,
                json!("alice"),
                json!({"tokens_per_day": 1000})
            ),
            (
                json!("alice"),
                k.clone(),
                Value::Null,
                json!({"tokens_per_day": 1000, "requests_per_day": 3})
            ),
            (
                json!("root"),
                k.clone(),
                Value::Null,
                json!({"tokens_per_day": 5000})
            ),
            (json!("alice"), k.clone(), Value::Null, Value::Null),
            (json!("alice"), k.clone(), Value::Null, Value::Null),
            (
                json!("root"),
                Value::Null,
                json!("auth0|x/y"),
                json!({"requests_per_day": 7})
            ),
            (json!("root"), Value::Null, json!("alice"), Value::Null),
        ]
    );
    assert!(events
        .iter()
        .all(|e| e["service"] == "_admin" && e["status"] == 200));
    let metrics = tokio::task::block_in_place(|| f.gw.metrics());
    assert!(
        metrics.contains("portcullis_key_events_total{event=\"budget\"} 7"),
        "{metrics}"
    );
    assert!(!f
        .events()
        .iter()
        .any(|e| e.to_string().contains(key.split('.').nth(1).unwrap())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_api_sets_budgets_within_the_owners_own() {
    let f = Fixture::start(None).await;
    api_budgets(&f).await;
    // The CLI reads what the API wrote.
    let (ok, out, _) = f.cli(&["keys", "list"]);
    assert!(ok && out.contains("BUDGET"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_on_a_postgres_store() {
    let pg = tokio::task::spawn_blocking(testkit::postgres::Postgres::start)
        .await
        .unwrap();
    let f = Fixture::start(Some(&pg.url)).await;
    api_budgets(&f).await;
    // The CLI on the same database: a key's budget set there shows in the API's listing.
    let admin = f.token("root", "portcullis:admin");
    let active = |list: &Value| -> Value {
        let keys = list["keys"].as_array().unwrap();
        keys.iter()
            .find(|k| k["revoked"].is_null())
            .unwrap()
            .clone()
    };
    let (_, list) = f.get("/v1/keys?owner=alice", &admin);
    let id = active(&list)["id"].as_str().unwrap().to_string();
    let (ok, out, err) = f.cli(&["keys", "budget", &id, "--tokens-per-hour", "123"]);
    assert!(ok, "{err}");
    assert_eq!(window(&table(&out), "tokens_per_hour").0, "123");
    let (_, list) = f.get("/v1/keys?owner=alice", &admin);
    assert_eq!(active(&list)["budget"], json!({"tokens_per_hour": 123}));
    let (ok, out, _) = f.cli(&["owners", "budget", "alice", "--requests-per-day", "9"]);
    assert!(ok, "{out}");
    assert_eq!(
        f.get("/v1/owners/alice/budget", &admin).1["budget"],
        json!({"requests_per_day": 9})
    );
    let changes = pg.sql("SELECT count(*) FROM owner_budgets");
    assert_eq!(changes, "2", "alice and auth0|x/y");
    drop(f);
    tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
}
