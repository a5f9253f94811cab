//! Budgets managed end to end: the real binary's CLI (`keys create` with limits, `keys
//! budget`, `owners budget`, `keys list`'s BUDGET and LEFT) and key API (`budget` on `POST` and
//! `PATCH /v1/keys`, `GET`/`PUT /v1/owners/{sub}/budget`, listings' `budget` and `used`), with
//! tokens signed by a test identity provider, usage charged by real calls to the fake upstream
//! (11 + 5 tokens a chat answer) through the ledger, on SQLite and on a real Postgres.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::idp::{Idp, TestKey};
use testkit::{cli, free_port, raw, try_raw, Gateway, Service, Upstream};

const CHAT: &str = "/v1/chat/v1/chat/completions";
/// Tokens of one chat answer of the fake upstream: 11 prompt + 5 completion.
const TOKENS: u64 = 16;

struct Fixture {
    gw: Gateway,
    admin: u16,
    idp: Arc<Idp>,
    signer: TestKey,
    _up: Upstream,
}

impl Fixture {
    /// A gateway with a metered `chat` service, JWTs from a test issuer, the key API and an
    /// access-log file; its key store at `database` (default: a SQLite file of its own).
    async fn start(database: Option<&str>) -> Fixture {
        let signer = TestKey::rsa("budget-test");
        let idp = Idp::start(&[&signer]).await;
        let up = Upstream::start();
        let admin = free_port();
        let extra = format!(
            "[auth.jwt]\nissuer = \"{}\"\naudience = \"portcullis\"\n\
             [metering]\nflush_seconds = 1\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\nrequests_per_minute = 1000\n\
             allowed_origins = [\"https://console.example.com\"]\n\
             [access_log]\ndestination = \"{{dir}}/access.log\"\n",
            idp.issuer
        );
        let mut builder = Gateway::builder()
            .service(Service::new("chat", up.url("/oa/chat")).openai())
            .cache_ttl(60)
            .extra(&extra);
        if let Some(database) = database {
            builder = builder.key_store(database);
        }
        let gw = tokio::task::block_in_place(|| builder.start());
        let request = b"GET /openapi.json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tokio::task::block_in_place(|| try_raw(admin, request)).is_ok_and(|r| r.0 == 200) {
            assert!(
                Instant::now() < deadline,
                "the admin listener never answered"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        Fixture {
            gw,
            admin,
            idp,
            signer,
            _up: up,
        }
    }

    fn token(&self, sub: &str, scope: &str) -> String {
        self.signer.access_token(
            &self.idp,
            json!({"sub": sub, "scope": scope, "scp": null, "permissions": null}),
        )
    }

    /// A key-API call: (status, headers, JSON body or null).
    fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&str>,
    ) -> (u16, Vec<(String, String)>, Value) {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\
             Authorization: Bearer {token}\r\n"
        );
        match body {
            Some(b) => req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            )),
            None => req.push_str("\r\n"),
        }
        let (status, headers, body) =
            tokio::task::block_in_place(|| raw(self.admin, req.as_bytes()));
        (
            status,
            headers,
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        )
    }

    fn json(&self, method: &str, path: &str, token: &str, body: Value) -> (u16, Value) {
        let (status, _, out) = self.call(method, path, token, Some(&body.to_string()));
        (status, out)
    }

    fn get(&self, path: &str, token: &str) -> (u16, Value) {
        let (status, _, out) = self.call("GET", path, token, None);
        (status, out)
    }

    /// One chat completion on the data plane with `token`: its status, once answered.
    fn chat(&self, token: &str) -> u16 {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let body = body.to_string();
        let req = format!(
            "POST {CHAT} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tokio::task::block_in_place(|| self.gw.raw(req.as_bytes())).0
    }

    /// `portcullis ARGS… --config CONFIG`: (succeeded, stdout, stderr).
    fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = tokio::task::block_in_place(|| cli(&self.gw.config, args));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The access log's key and budget events, in order.
    fn events(&self) -> Vec<Value> {
        let path = self.gw.config.parent().unwrap().join("access.log");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["key_event"].is_string())
            .collect()
    }
}

/// Polls `read` until `done` holds of it, for at most 10 s (a ledger flush is 1 s); the last
/// value read.
fn wait_for<T>(mut read: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = read();
        if done(&seen) || Instant::now() >= deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The rows of a `keys budget`/`owners budget` window table: name → (limit, used, left).
fn table(stdout: &str) -> Vec<(String, String, String, String)> {
    let mut rows = stdout
        .lines()
        .skip_while(|l| !l.starts_with("WINDOW"))
        .skip(1)
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(cells.len(), 5, "{l}");
            assert!(cells[4].ends_with('Z'), "RESETS: {l}");
            let s = |i: usize| cells[i].to_string();
            (s(0), s(1), s(2), s(3))
        })
        .collect::<Vec<_>>();
    rows.sort();
    rows
}

/// One window's row.
fn window<'a>(
    rows: &'a [(String, String, String, String)],
    name: &str,
) -> (&'a str, &'a str, &'a str) {
    let row = rows.iter().find(|r| r.0 == name).expect(name);
    (&row.1, &row.2, &row.3)
}

/// `keys list`'s line of one key: its BUDGET and LEFT cells.
fn listed(f: &Fixture, id: &str) -> (String, String) {
    let (ok, out, err) = f.cli(&["keys", "list"]);
    assert!(ok, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(&header[header.len() - 2..], ["BUDGET", "LEFT"], "{out}");
    let row = out.lines().find(|l| l.starts_with(id)).expect(id);
    let cells: Vec<&str> = row.split_whitespace().collect();
    let n = cells.len();
    (cells[n - 2].to_string(), cells[n - 1].to_string())
}

fn refused(f: &Fixture, args: &[&str], message: &str) {
    let (ok, out, err) = f.cli(args);
    assert!(!ok, "{args:?} succeeded: {out}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    assert!(
        lines[0].starts_with("portcullis: ") && lines[0].contains(message),
        "{args:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_shows_and_clears_key_and_owner_budgets() {
    let f = Fixture::start(None).await;
    let (ok, out, err) = f.cli(&[
        "keys",
        "create",
        "--name",
        "capped",
        "--scopes",
        "chat",
        "--owner",
        "alice",
        "--tokens-per-day",
        "1000",
        "--requests-per-day",
        "5",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("budget:  tokens_per_day=1000,requests_per_day=5\n"),
        "{out}"
    );
    let key = out.lines().last().unwrap().to_string();
    let id = key[3..19].to_string();
    assert!(key.starts_with("ak_"), "the key is the last line: {out}");
    let secret = key.split('.').nth(1).unwrap().to_string();
    let (plain, plain_id) = tokio::task::block_in_place(|| f.gw.create_key("chat", &[]));

    // Used on the data plane: the ledger's use shows in LEFT within a flush.
    assert_eq!(f.chat(&key), 200);
    assert_eq!(f.chat(&plain), 200);
    let (budget, left) = wait_for(
        || listed(&f, &id),
        |(_, left)| left != "tokens_per_day=1000,requests_per_day=5",
    );
    assert_eq!(budget, "tokens_per_day=1000,requests_per_day=5");
    assert_eq!(left, "tokens_per_day=984,requests_per_day=4");
    assert_eq!(listed(&f, &plain_id), ("-".into(), "-".into()));

    // Flags set their windows and keep the others; `none` removes one.
    let (ok, out, err) = f.cli(&["keys", "budget", &id, "--tokens-per-hour", "10"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("key id:  {id}\nowner:   alice\n")),
        "{out}"
    );
    let rows = table(&out);
    let (limit, used, left) = window(&rows, "tokens_per_hour");
    assert_eq!(limit, "10");
    let used: u64 = used.parse().unwrap();
    assert_eq!(left, 10u64.saturating_sub(used).to_string());
    assert_eq!(window(&rows, "tokens_per_day"), ("1000", "16", "984"));
    assert_eq!(window(&rows, "requests_per_day"), ("5", "1", "4"));
    assert_eq!(window(&rows, "tokens_per_month"), ("-", "16", "-"));
    let (ok, out, _) = f.cli(&["keys", "budget", &id, "--requests-per-day", "none"]);
    assert!(ok);
    assert_eq!(window(&table(&out), "requests_per_day"), ("-", "1", "-"));
    assert_eq!(listed(&f, &id).0, "tokens_per_hour=10,tokens_per_day=1000");

    // Refusals: one line on stderr, non-zero, nothing changed.
    refused(&f, &["keys", "budget", &id], "or --clear");
    refused(
        &f,
        &["keys", "budget", &id, "--clear", "--tokens-per-day", "5"],
        "--clear removes the whole budget",
    );
    refused(
        &f,
        &["keys", "budget", "ffffffffffffffff", "--clear"],
        "no key with id ffffffffffffffff",
    );
    refused(
        &f,
        &["keys", "budget", "nope", "--clear"],
        "is not a key id",
    );
    tokio::task::block_in_place(|| f.gw.revoke(&plain_id));
    refused(
        &f,
        &["keys", "budget", &plain_id, "--tokens-per-day", "5"],
        "is revoked",
    );
    refused(
        &f,
        &["keys", "budget", &id, "--tokens-per-day", "1.5"],
        "--tokens-per-day: \"1.5\" is not a whole number from 0 to 9223372036854775807",
    );
    refused(
        &f,
        &["keys", "budget", &id, "--tokens-per-day=-1"],
        "is not a whole number",
    );
    refused(
        &f,
        &[
            "keys",
            "budget",
            &id,
            "--tokens-per-day",
            "9223372036854775808",
        ],
        "is not a whole number",
    );
    refused(
        &f,
        &[
            "keys",
            "create",
            "--name",
            "x",
            "--scopes",
            "chat",
            "--tokens-per-month",
            "x",
        ],
        "--tokens-per-month",
    );
    refused(&f, &["owners", "budget", "alice"], "or --clear");
    refused(
        &f,
        &["owners", "budget", "", "--clear"],
        "owner must be non-empty",
    );
    let max = i64::MAX.to_string();
    let (ok, _, err) = f.cli(&["keys", "budget", &id, "--tokens-per-month", &max]);
    assert!(ok, "{err}");

    // Cleared: every limit goes.
    let (ok, out, _) = f.cli(&["keys", "budget", &id, "--clear"]);
    assert!(ok);
    assert!(
        table(&out).iter().all(|r| r.1 == "-" && r.3 == "-"),
        "{out}"
    );
    assert_eq!(listed(&f, &id), ("-".into(), "-".into()));

    // An owner's budget covers its keys' use: alice's is the capped key's 16 tokens.
    let (ok, out, err) = f.cli(&["owners", "budget", "alice", "--tokens-per-month", "100"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("owner:   alice\n"), "{out}");
    let rows = table(&out);
    assert_eq!(window(&rows, "tokens_per_month"), ("100", "16", "84"));
    assert_eq!(window(&rows, "tokens_per_day"), ("-", "16", "-"));
    let (ok, out, _) = f.cli(&["owners", "budget", "alice", "--tokens-per-day", "50"]);
    assert!(ok);
    let rows = table(&out);
    assert_eq!(window(&rows, "tokens_per_month"), ("100", "16", "84"));
    assert_eq!(window(&rows, "tokens_per_day"), ("50", "16", "34"));
    let (ok, out, _) = f.cli(&["owners", "budget", "alice", "--clear"]);
    assert!(ok);
    assert!(table(&out).iter().all(|r| r.1 == "-"), "{out}");

    // Every change is on record: the key or the owner, the budget, never a secret.
    let events = f.events();
    let budgets: Vec<(Value, Value, Value)> = events
        .iter()
        .filter(|e| e["key_event"] == "budget")
        .map(|e| {
            (
                e["key_id"].clone(),
                e["budget_owner"].clone(),
                e["budget"].clone(),
            )
        })
        .collect();
    let key = json!(id);
    assert_eq!(
        budgets,
        [
            (
                key.clone(),
                Value::Null,
                json!({"tokens_per_hour": 10, "tokens_per_day": 1000, "requests_per_day": 5})
            ),
            (
                key.clone(),
                Value::Null,
                json!({"tokens_per_hour": 10, "tokens_per_day": 1000})
            ),
            (
                key.clone(),
                Value::Null,
                json!({"tokens_per_hour": 10, "tokens_per_day": 1000, "tokens_per_month": i64::MAX})
            ),
            (key.clone(), Value::Null, Value::Null),
            (
                Value::Null,
                json!("alice"),
                json!({"tokens_per_month": 100})
            ),
            (
                Value::Null,
                json!("alice"),
                json!({"tokens_per_month": 100, "tokens_per_day": 50})
            ),
            (Value::Null, json!("alice"), Value::Null),
        ]
    );
    assert!(events
        .iter()
        .filter(|e| e["key_event"] == "budget")
        .all(|e| e["service"] == "_cli"
            && e.get("budget_owner").is_none() != e.get("key_id").is_none()));
    let created = events.iter().find(|e| e["key_event"] == "created").unwrap();
    assert_eq!(
        created["budget"],
        json!({"tokens_per_day": 1000, "requests_per_day": 5})
    );
    let log = std::fs::read_to_string(f.gw.config.parent().unwrap().join("access.log")).unwrap();
    assert!(!log.contains(&secret), "the access log shows a secret");
}

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
