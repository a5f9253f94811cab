//! The key-management API (`[admin]`) end to end: the real binary, tokens signed by a test
//! identity provider, keys used on the real data plane against a real upstream.

use serde_json::{json, Value};
use testkit::idp::{Idp, TestKey};
use testkit::Upstream;
use testkit::{cli, free_port, header, raw, Gateway, RawResponse, Service};

const ORIGIN: &str = "https://console.example.com";

struct Admin {
    gw: Gateway,
    port: u16,
    idp: std::sync::Arc<Idp>,
    signer: TestKey,
    up: Upstream,
}

impl Admin {
    async fn start(extra_admin: &str) -> Admin {
        Admin::start_on(extra_admin, None).await
    }

    /// With the key store at `database` (default: a fresh SQLite file).
    async fn start_on(extra_admin: &str, database: Option<&str>) -> Admin {
        let signer = TestKey::rsa("admin-test");
        let idp = Idp::start(&[&signer]).await;
        let up = Upstream::start();
        let port = free_port();
        let extra = format!(
            "[auth.jwt]\nissuer = \"{}\"\naudience = \"portcullis\"\n\
             [admin]\nlisten = \"127.0.0.1:{port}\"\nallowed_origins = [\"{ORIGIN}\"]\n{extra_admin}\n\
             [access_log]\ndestination = \"{{dir}}/access.log\"\n",
            idp.issuer
        );
        let mut builder = Gateway::builder()
            .service(Service::new("infer", up.url("")))
            .service(Service::new("chatx", up.url("")))
            .cache_ttl(60)
            .extra(&extra);
        if let Some(database) = database {
            builder = builder.key_store(database);
        }
        let gw = tokio::task::block_in_place(|| builder.start());
        wait_for_admin(port);
        Admin {
            gw,
            port,
            idp,
            signer,
            up,
        }
    }

    /// A login token for `sub` with `scope` (space-separated), as the console would hold.
    fn token(&self, sub: &str, scope: &str) -> String {
        self.signer.access_token(
            &self.idp,
            json!({"sub": sub, "scope": scope, "scp": null, "permissions": null}),
        )
    }

    fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> RawResponse {
        self.call_with(method, path, token, body, "")
    }

    fn call_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
        headers: &str,
    ) -> RawResponse {
        let mut req =
            format!("{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n{headers}");
        if let Some(t) = token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            ));
        } else {
            req.push_str("\r\n");
        }
        tokio::task::block_in_place(|| raw(self.port, req.as_bytes()))
    }

    fn create(&self, token: &str, body: Value) -> (u16, Value) {
        let (status, _, out) = self.call("POST", "/v1/keys", Some(token), Some(&body.to_string()));
        (status, serde_json::from_slice(&out).unwrap_or(Value::Null))
    }

    fn list(&self, token: &str, query: &str) -> (u16, Value) {
        let (status, _, out) = self.call("GET", &format!("/v1/keys{query}"), Some(token), None);
        (status, serde_json::from_slice(&out).unwrap_or(Value::Null))
    }

    fn revoke(&self, token: &str, id: &str) -> u16 {
        self.call("DELETE", &format!("/v1/keys/{id}"), Some(token), None)
            .0
    }

    /// The data plane's answer to the key on the infer service.
    fn use_key(&self, key: &str) -> u16 {
        let req = format!(
            "GET /v1/infer/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
        );
        tokio::task::block_in_place(|| self.gw.raw(req.as_bytes())).0
    }

    fn access_log(&self) -> String {
        let path = self.gw.config.parent().unwrap().join("access.log");
        std::fs::read_to_string(path).unwrap_or_default()
    }
}

/// The admin listener starts beside the data plane, not necessarily before it answers.
fn wait_for_admin(port: u16) {
    let request = b"GET /openapi.json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    for _ in 0..200 {
        if tokio::task::block_in_place(|| testkit::try_raw(port, request)).is_ok_and(|r| r.0 == 200)
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("the admin listener on port {port} never answered");
}

fn ids(list: &Value) -> Vec<String> {
    list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_creates_lists_uses_and_revokes_a_key() {
    let a = Admin::start("").await;
    let alice = a.token("alice", "infer chatx");

    let (status, made) = a.create(
        &alice,
        json!({"name": "ci-bot", "scopes": ["infer"], "expires_in": "90d"}),
    );
    assert_eq!(status, 201, "{made}");
    let key = made["key"].as_str().unwrap().to_string();
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(key.split('.').next().unwrap(), format!("ak_{id}"));
    assert_eq!(made["owner"], "alice");
    assert_eq!(made["name"], "ci-bot");
    assert_eq!(made["scopes"], json!(["infer"]));
    let created = made["created"].as_str().unwrap();
    assert!(created.ends_with('Z') && created.len() == 20, "{created}");
    assert!(made["expires"].as_str().unwrap() > created);

    // The key works on the data plane at once, with its scopes only.
    assert_eq!(a.use_key(&key), 200);

    let (status, list) = a.list(&alice, "");
    assert_eq!(status, 200);
    assert_eq!(ids(&list), std::slice::from_ref(&id));
    let listed = &list["keys"][0];
    assert_eq!(listed["revoked"], Value::Null);
    assert_eq!(listed["owner"], "alice");
    let secret = key.split('.').nth(1).unwrap();
    assert!(
        !list.to_string().contains(secret),
        "a listing shows the secret"
    );
    assert!(listed.get("key").is_none());

    // Revoked through the API: this gateway drops it from its cache at once.
    assert_eq!(a.revoke(&alice, &id), 204);
    assert_eq!(a.use_key(&key), 401);
    assert_eq!(a.revoke(&alice, &id), 204, "revoking twice is not an error");
    let (_, list) = a.list(&alice, "");
    assert!(list["keys"][0]["revoked"].as_str().is_some());

    // The CLI sees the owner; the metrics count one of each event; the log names the key.
    let out = cli(&a.gw.config, &["keys", "list"]);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains("OWNER") && listing.contains("alice"),
        "{listing}"
    );
    let metrics = a.gw.metrics();
    assert!(
        metrics.contains("portcullis_key_events_total{event=\"created\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("portcullis_key_events_total{event=\"revoked\"} 1"),
        "{metrics}"
    );
    let log = a.access_log();
    let events: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["key_event"].is_string())
        .collect();
    assert_eq!(events.len(), 2, "{log}");
    assert_eq!(events[0]["key_event"], "created");
    assert_eq!(events[1]["key_event"], "revoked");
    for e in &events {
        assert_eq!(e["key_id"], id.as_str());
        assert_eq!(e["principal_id"], "alice");
        assert_eq!(e["service"], "_admin");
    }
    assert!(!log.contains(secret), "the access log shows a secret");
    // The CLI's create and revoke go to the same file.
    let (cli_key, cli_id) = a.gw.create_key("infer", &["--owner", "alice"]);
    a.gw.revoke(&cli_id);
    let log = a.access_log();
    let cli_events: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["service"] == "_cli")
        .collect();
    assert_eq!(cli_events.len(), 2, "{log}");
    assert_eq!(cli_events[0]["key_event"], "created");
    assert_eq!(cli_events[1]["key_event"], "revoked");
    assert_eq!(cli_events[1]["key_id"], cli_id.as_str());
    assert!(!log.contains(cli_key.split('.').nth(1).unwrap()));
    assert!(
        !a.gw.log().contains(secret),
        "the gateway log shows a secret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_see_only_their_keys_and_cannot_escalate_while_an_admin_manages_all() {
    let a = Admin::start("").await;
    let alice = a.token("alice", "infer");
    let bob = a.token("bob", "infer chatx");
    let admin = a.token("root", "portcullis:admin");

    let (status, err) = a.create(&alice, json!({"name": "x", "scopes": ["chatx"]}));
    assert_eq!(status, 403, "{err}");
    assert_eq!(err["error"], "forbidden");
    assert!(err["message"].as_str().unwrap().contains("chatx"));

    let (_, alices) = a.create(&alice, json!({"name": "a", "scopes": ["infer"]}));
    let (_, bobs) = a.create(&bob, json!({"name": "b", "scopes": ["infer", "chatx"]}));
    let alice_id = alices["id"].as_str().unwrap();
    let bob_id = bobs["id"].as_str().unwrap();

    assert_eq!(ids(&a.list(&bob, "").1), [bob_id]);
    assert_eq!(a.list(&bob, "?owner=alice").0, 403);
    assert_eq!(ids(&a.list(&bob, "?owner=bob").1), [bob_id]);
    // Another owner's key is not found, and stays usable.
    assert_eq!(a.revoke(&bob, alice_id), 404);
    assert_eq!(a.use_key(alices["key"].as_str().unwrap()), 200);
    assert_eq!(a.revoke(&bob, "0123456789abcdef"), 404);
    assert_eq!(a.revoke(&bob, "not-a-key-id"), 404);

    // The admin scope sees everything, filters by owner, revokes anyone's key, and may grant
    // scopes it does not hold itself.
    let (status, all) = a.list(&admin, "");
    assert_eq!(status, 200);
    let mut all = ids(&all);
    all.sort();
    let mut both = vec![alice_id.to_string(), bob_id.to_string()];
    both.sort();
    assert_eq!(all, both);
    assert_eq!(ids(&a.list(&admin, "?owner=alice").1), [alice_id]);
    assert_eq!(
        ids(&a.list(&admin, "?owner=nobody").1),
        Vec::<String>::new()
    );
    assert_eq!(a.revoke(&admin, alice_id), 204);
    assert_eq!(a.use_key(alices["key"].as_str().unwrap()), 401);
    let (status, made) = a.create(&admin, json!({"name": "ops", "scopes": ["chatx"]}));
    assert_eq!(status, 201);
    assert_eq!(made["owner"], "root");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_get_403_and_every_failed_token_the_data_planes_401() {
    let a = Admin::start("").await;
    let (key, _) = a.gw.create_key("infer", &[]);
    let (status, _, body) = a.call("GET", "/v1/keys", Some(&key), None);
    assert_eq!(status, 403);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"],
        "forbidden"
    );
    let (status, _, _) = a.call(
        "POST",
        "/v1/keys",
        Some(&key),
        Some(r#"{"name":"x","scopes":["infer"]}"#),
    );
    assert_eq!(status, 403, "a leaked key must not mint keys");

    // The same bytes as the data plane's 401 (but for the request id), and the connection
    // closed after it like there: nothing tells the two apart, or one failure from another.
    let data_plane = raw_bytes(a.gw.port, "GET /v1/infer/x", None);
    assert!(data_plane.starts_with("HTTP/1.1 401"), "{data_plane}");
    let expired = a
        .signer
        .access_token(&a.idp, json!({"sub": "alice", "exp": 1000}));
    let wrong_aud = a
        .signer
        .access_token(&a.idp, json!({"sub": "alice", "aud": "other"}));
    for token in [
        None,
        Some("garbage"),
        Some(expired.as_str()),
        Some(wrong_aud.as_str()),
    ] {
        let got = raw_bytes(a.port, "GET /v1/keys", token);
        assert_eq!(got, data_plane, "token {token:?}");
    }
}

/// The whole response to a request sent without `Connection: close`, read until the server
/// closes (a 401 must), with the request id masked.
fn raw_bytes(port: u16, request_line: &str, token: Option<&str>) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(s, "{request_line} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .expect("the connection is closed after a 401");
    let text = String::from_utf8(out).unwrap();
    text.lines()
        .map(|l| match l.split_once(": ") {
            Some((name, _)) if name.eq_ignore_ascii_case("x-request-id") => format!("{name}: *"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_the_key_limit_holds() {
    let a = Admin::start("max_keys_per_owner = 2").await;
    let alice = a.token("alice", "infer");
    for (body, message) in [
        ("{", "the body must be a JSON object"),
        (r#"{"scopes":["infer"]}"#, "name must be a string"),
        (r#"{"name":"x","scopes":[]}"#, "scopes must hold"),
        (
            r#"{"name":"x","scopes":["infer"],"expires_in":"soon"}"#,
            "expires_in must be",
        ),
        (
            r#"{"name":"x","scopes":["infer"],"admin":true}"#,
            "unknown field",
        ),
    ] {
        let (status, _, out) = a.call("POST", "/v1/keys", Some(&alice), Some(body));
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(status, 400, "{body}: {out}");
        assert_eq!(out["error"], "bad_request");
        assert!(
            out["message"].as_str().unwrap().starts_with(message),
            "{body}: {out}"
        );
    }
    let big = format!(
        r#"{{"name":"{}","scopes":["infer"]}}"#,
        "n".repeat(17 * 1024)
    );
    let (status, headers, _) = a.call("POST", "/v1/keys", Some(&alice), Some(&big));
    assert_eq!(status, 413);
    assert_eq!(header(&headers, "connection"), Some("close"));

    let (status, headers, _) = a.call("PUT", "/v1/keys", Some(&alice), Some("{}"));
    assert_eq!(status, 405);
    assert_eq!(header(&headers, "allow"), Some("GET, POST, OPTIONS"));
    assert_eq!(a.call("GET", "/v1/other", Some(&alice), None).0, 404);
    assert_eq!(
        a.call("GET", "/console/", None, None).0,
        404,
        "console off by default"
    );
    let (status, headers, doc) = a.call("GET", "/openapi.json", None, None);
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    let doc: Value = serde_json::from_slice(&doc).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));

    // Two active keys at most: a third is refused until one is revoked.
    let body = json!({"name": "k", "scopes": ["infer"]});
    let (_, first) = a.create(&alice, body.clone());
    assert_eq!(a.create(&alice, body.clone()).0, 201);
    let (status, err) = a.create(&alice, body.clone());
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["error"], "conflict");
    assert_eq!(
        a.create(&a.token("bob", "infer"), body.clone()).0,
        201,
        "the limit is per owner"
    );
    assert_eq!(a.revoke(&alice, first["id"].as_str().unwrap()), 204);
    assert_eq!(a.create(&alice, body).0, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_only_the_allowed_origin() {
    let a = Admin::start("").await;
    let alice = a.token("alice", "infer");
    let preflight = |origin: &str| {
        a.call_with(
            "OPTIONS",
            "/v1/keys",
            None,
            None,
            &format!(
                "Origin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: authorization, content-type\r\n"
            ),
        )
    };
    let (status, headers, _) = preflight(ORIGIN);
    assert_eq!(status, 204);
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some(ORIGIN)
    );
    assert!(header(&headers, "access-control-allow-methods")
        .unwrap()
        .contains("POST"));
    let allowed_headers = header(&headers, "access-control-allow-headers").unwrap();
    assert!(allowed_headers.contains("authorization") && allowed_headers.contains("content-type"));
    assert!(header(&headers, "access-control-allow-credentials").is_none());

    let body = r#"{"name":"web","scopes":["infer"]}"#;
    let (status, headers, _) = a.call_with(
        "POST",
        "/v1/keys",
        Some(&alice),
        Some(body),
        &format!("Origin: {ORIGIN}\r\n"),
    );
    assert_eq!(status, 201);
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some(ORIGIN)
    );

    for other in [
        "https://evil.example",
        "https://console.example.com.evil.example",
        "null",
    ] {
        let (_, headers, _) = preflight(other);
        assert!(
            header(&headers, "access-control-allow-origin").is_none(),
            "{other}"
        );
        assert!(
            header(&headers, "access-control-allow-methods").is_none(),
            "{other}"
        );
        let (_, headers, _) = a.call_with(
            "GET",
            "/v1/keys",
            Some(&alice),
            None,
            &format!("Origin: {other}\r\n"),
        );
        assert!(
            header(&headers, "access-control-allow-origin").is_none(),
            "{other}"
        );
    }
    for (_, headers, _) in [
        preflight(ORIGIN),
        a.call("GET", "/v1/keys", Some(&alice), None),
    ] {
        assert!(header(&headers, "set-cookie").is_none());
    }
}

/// A database written by the release before key ownership (its exact table, a row as its
/// `keys create` wrote it) keeps its keys, and gains the owner column on first open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_sqlite_key_database_migrates_and_keeps_its_keys() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("old.db");
    let url = format!("sqlite://{}?mode=rwc", db.display());
    let secret = "0ldSecretFromTheLastRelease-0ldSecret_From1"; // 43 base64url characters
    let verifier: [u8; 32] = sha2::Sha256::digest(secret.as_bytes()).into();
    {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS api_keys (
                key_id      TEXT PRIMARY KEY,
                name        TEXT NOT NULL,
                verifier    BLOB NOT NULL,
                scopes      TEXT NOT NULL,
                created_at  BIGINT NOT NULL,
                expires_at  BIGINT,
                revoked_at  BIGINT
            )",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        sqlx::query("INSERT INTO api_keys VALUES ('00112233aabbccdd', 'old', ?1, 'infer', 1700000000, NULL, NULL)")
            .bind(&verifier[..])
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
    }
    let signer = TestKey::rsa("m");
    let idp = Idp::start(&[&signer]).await;
    let up = Upstream::start();
    let port = free_port();
    let extra = format!(
        "[auth.jwt]\nissuer = \"{}\"\naudience = \"portcullis\"\n[admin]\nlisten = \"127.0.0.1:{port}\"\n",
        idp.issuer
    );
    let builder = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .key_store(&format!("sqlite://{}", db.display()))
        .extra(&extra);
    let gw = tokio::task::block_in_place(|| builder.start());
    wait_for_admin(port);
    let old_key = format!("ak_00112233aabbccdd.{secret}");
    let req = format!("GET /v1/infer/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {old_key}\r\nConnection: close\r\n\r\n");
    assert_eq!(
        tokio::task::block_in_place(|| gw.raw(req.as_bytes())).0,
        200
    );

    let admin = signer.access_token(&idp, json!({"sub": "root", "scope": "portcullis:admin"}));
    let req = format!("GET /v1/keys HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {admin}\r\nConnection: close\r\n\r\n");
    let (status, _, body) = tokio::task::block_in_place(|| raw(port, req.as_bytes()));
    assert_eq!(status, 200);
    let list: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(list["keys"][0]["id"], "00112233aabbccdd");
    assert_eq!(list["keys"][0]["owner"], Value::Null);
    assert_eq!(list["keys"][0]["created"], "2023-11-14T22:13:20Z");

    // New keys get owners in the migrated file; a second open changes nothing.
    let (_, id) = gw.create_key("infer", &["--owner", "carol"]);
    let out = cli(&gw.config, &["keys", "list"]);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("carol")),
        "{listing}"
    );
    assert!(
        listing.lines().any(|l| l.starts_with("00112233aabbccdd")),
        "{listing}"
    );
    assert!(out.status.success());
}

/// On Postgres: concurrent creates cannot pass the per-owner limit, and a revoke through the
/// API reaches another gateway (cache 60 s) within a second through the revocation push.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_the_key_limit_holds_under_concurrent_creates_and_api_revokes_reach_the_fleet()
{
    let pg = testkit::postgres::Postgres::start();
    let a = Admin::start_on("max_keys_per_owner = 3", Some(&pg.url)).await;
    let other = tokio::task::block_in_place(|| {
        Gateway::builder()
            .service(Service::new("infer", a.up.url("")))
            .key_store(&pg.url)
            .cache_ttl(60)
            .start()
    });
    let alice = a.token("alice", "infer");
    let a = std::sync::Arc::new(a);
    let creates: Vec<_> = (0..8)
        .map(|i| {
            let (a, alice) = (a.clone(), alice.clone());
            tokio::spawn(async move {
                a.create(
                    &alice,
                    json!({"name": format!("k{i}"), "scopes": ["infer"]}),
                )
            })
        })
        .collect();
    let mut made = Vec::new();
    let mut refused = 0;
    for c in creates {
        match c.await.unwrap() {
            (201, key) => made.push(key),
            (409, _) => refused += 1,
            (status, body) => panic!("{status} {body}"),
        }
    }
    assert_eq!((made.len(), refused), (3, 5), "the limit of 3 was not held");

    let key = made[0]["key"].as_str().unwrap().to_string();
    let req = format!(
        "GET /v1/infer/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    let on_other = || tokio::task::block_in_place(|| other.raw(req.as_bytes())).0;
    assert_eq!(on_other(), 200, "cached on the other gateway");
    assert_eq!(a.revoke(&alice, made[0]["id"].as_str().unwrap()), 204);
    let revoked = std::time::Instant::now();
    while on_other() != 401 {
        assert!(
            revoked.elapsed() < std::time::Duration::from_secs(1),
            "not refused within 1 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    println!(
        "an API revoke reached the other gateway after {:?}",
        revoked.elapsed()
    );
}
