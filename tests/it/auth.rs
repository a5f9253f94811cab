//! Authentication and authorisation end to end: keys made and revoked through the real CLI,
//! JWTs signed by a test identity provider, all checked by the real gateway binary.

use std::time::{Duration, Instant};

use serde_json::json;
use testkit::idp::{Idp, TestKey};
use testkit::Upstream;
use testkit::{cli, header, Gateway, Service};

fn get(gw: &Gateway, path: &str, token: &str) -> testkit::RawResponse {
    gw.raw(format!("GET {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n").as_bytes())
}

fn status(gw: &Gateway, path: &str, token: &str) -> u16 {
    get(gw, path, token).0
}

fn two_services(up: &Upstream) -> testkit::GatewayBuilder<'static> {
    Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .service(Service::new("embed", up.url("")))
}

#[test]
fn a_cli_created_key_works_and_listing_never_shows_a_secret() {
    let up = Upstream::start();
    let gw = two_services(&up).start();
    let (key, id) = gw.create_key("infer,embed", &["--expires-in", "90d"]);
    assert_eq!(status(&gw, "/v1/infer/v1/models", &key), 200);
    assert_eq!(status(&gw, "/v1/embed/v1/models", &key), 200);
    let out = cli(&gw.config, &["keys", "list"]);
    assert!(out.status.success());
    let listing = String::from_utf8(out.stdout).unwrap();
    assert!(
        listing.contains(&id) && listing.contains("infer,embed"),
        "{listing}"
    );
    let secret = key.split('.').nth(1).unwrap();
    assert!(!listing.contains(secret), "keys list printed the secret");
    // The store holds no secret either.
    let db = std::fs::read(gw.dir.path().join("keys.db")).unwrap_or_default();
    let wal = std::fs::read(gw.dir.path().join("keys.db-wal")).unwrap_or_default();
    for bytes in [db, wal] {
        assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
    }
}

#[test]
fn a_key_without_the_service_scope_gets_403() {
    let up = Upstream::start();
    let gw = two_services(&up).start();
    let (key, _) = gw.create_key("infer", &[]);
    let (code, headers, body) = get(&gw, "/v1/embed/v1/models", &key);
    assert_eq!(code, 403);
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"],
        "forbidden"
    );
    assert!(up.requests().is_empty());
}

#[test]
fn a_revoked_key_is_refused_within_the_cache_ttl() {
    let up = Upstream::start();
    let ttl = 2;
    let gw = two_services(&up).cache_ttl(ttl).start();
    let (key, id) = gw.create_key("infer", &[]);
    assert_eq!(
        status(&gw, "/v1/infer/x", &key),
        200,
        "a key must work before revocation"
    );
    gw.revoke(&id);
    let revoked = Instant::now();
    let refused_at = loop {
        if status(&gw, "/v1/infer/x", &key) == 401 {
            break revoked.elapsed();
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(ttl + 1),
            "revoked key still accepted"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("revoked key refused {refused_at:?} after revocation (cache_ttl {ttl}s)");
    for _ in 0..3 {
        assert_eq!(status(&gw, "/v1/infer/x", &key), 401);
    }
    let listing = String::from_utf8(cli(&gw.config, &["keys", "list"]).stdout).unwrap();
    let row = listing.lines().find(|l| l.starts_with(&id)).unwrap();
    // KEY ID, NAME, SCOPES, OWNER, CREATED, EXPIRES, REVOKED, then BUDGET and LEFT.
    let revoked = row.split_whitespace().nth(6).unwrap_or_default();
    assert!(revoked.ends_with('Z'), "revocation time missing: {row}");
}

#[test]
fn an_expired_key_is_refused() {
    let up = Upstream::start();
    let gw = two_services(&up).start();
    let (key, _) = gw.create_key("infer", &["--expires-in", "2s"]);
    assert_eq!(status(&gw, "/v1/infer/x", &key), 200);
    std::thread::sleep(Duration::from_millis(2600));
    assert_eq!(status(&gw, "/v1/infer/x", &key), 401);
}

/// Removing the files leaves the gateway's open connections on the unlinked database, so the
/// store answers "unknown" rather than failing; a store that really fails is tested in
/// `src/auth/api_keys/tests.rs` (a_down_store_answers_at_once_and_is_asked_at_most_once_a_second).
#[test]
fn cached_keys_are_still_served_when_the_store_file_is_removed() {
    let up = Upstream::start();
    let gw = two_services(&up).start();
    let (key, _) = gw.create_key("infer", &[]);
    assert_eq!(status(&gw, "/v1/infer/x", &key), 200);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(gw.dir.path().join(format!("keys.db{suffix}")));
    }
    assert_eq!(status(&gw, "/v1/infer/x", &key), 200);
    // And nothing about it is a 5xx: an unknown key is still a plain 401.
    let unknown = format!("ak_00000000000000aa.{}", "z".repeat(43));
    assert_eq!(status(&gw, "/v1/infer/x", &unknown), 401);
}

#[test]
fn the_key_cli_refuses_bad_input_with_one_line_reasons() {
    let up = Upstream::start();
    let gw = two_services(&up).start();
    let create = |extra: &[&'static str]| -> Vec<&'static str> {
        [&["keys", "create", "--name", "x"][..], extra].concat()
    };
    for (args, reason) in [
        (create(&["--scopes", "in fer"]), "--scopes"),
        (create(&["--scopes", "infer\u{1}"]), "--scopes"),
        (
            create(&["--scopes", "infer", "--expires-in", "10w"]),
            "--expires-in",
        ),
        // A multi-byte last character once panicked in a byte split.
        (
            create(&["--scopes", "infer", "--expires-in", "5é"]),
            "--expires-in",
        ),
        // Once wrapped around into a key that had already expired.
        (
            create(&["--scopes", "infer", "--expires-in", "10000000000000000000s"]),
            "9999",
        ),
        (
            create(&["--scopes", "infer", "--expires-in", "3000000d"]),
            "9999",
        ),
        (vec!["keys", "revoke", "0000000000000000"], "no key"),
        (vec!["keys", "revoke", "not-an-id"], "not a key id"),
    ] {
        let out = cli(&gw.config, &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line:\n{err}");
        assert!(
            err.starts_with("portcullis: ") && err.contains(reason),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // Nothing was created by any of them.
    let listing = String::from_utf8(cli(&gw.config, &["keys", "list"]).stdout).unwrap();
    assert_eq!(listing.lines().count(), 1, "{listing}");
}

#[test]
fn a_bad_config_gives_the_key_cli_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    for text in [
        // A TOML syntax error: toml's own message draws the source over several lines.
        "[auth.api_keys]\ndatabase = \"sqlite://x.db\"\ncache_ttl_seconds = = 3\n",
        "[auth.api_keys]\ndatabase = \"mysql://x\"\ncache_ttl_seconds = 0\n",
        "[services.a]\nupstream = 3\n",
    ] {
        std::fs::write(&config, text).unwrap();
        let out = cli(&config, &["keys", "list"]);
        assert_eq!(out.status.code(), Some(1), "{text}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{text}: not one line:\n{err}");
        assert!(err.contains("bad.toml"), "{err}");
    }
}

#[test]
fn the_key_database_is_private_to_the_gateway_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keys.toml");
    let db = dir.path().join("store/keys.db");
    std::fs::write(
        &config,
        format!(
            "[auth.api_keys]\ndatabase = \"sqlite://{}\"\n",
            db.display()
        ),
    )
    .unwrap();
    let out = cli(
        &config,
        &["keys", "create", "--name", "x", "--scopes", "infer"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for suffix in ["", "-wal", "-shm"] {
        let path = db.with_file_name(format!("keys.db{suffix}"));
        match std::fs::metadata(&path) {
            Ok(meta) => {
                let mode = meta.permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "keys.db{suffix} has mode {mode:o}");
            }
            Err(_) => assert!(!suffix.is_empty(), "no key database"),
        }
    }
    // An existing database that others can read is reported, by the CLI and by `serve`.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = cli(&config, &["keys", "list"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chmod 600"), "no warning: {err}");
}

async fn jwt_gateway(up: &Upstream, idp: &Idp) -> Gateway {
    let extra = format!(
        "[auth.jwt]\nissuer = \"{}\"\naudience = \"portcullis\"\n",
        idp.issuer
    );
    let builder = two_services(up).extra(&extra);
    // start() blocks while polling /healthz; the IdP answers discovery on another worker.
    tokio::task::block_in_place(|| builder.start())
}

fn token(key: &TestKey, idp: &Idp, claims: serde_json::Value) -> String {
    key.access_token(idp, claims)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwts_of_each_algorithm_are_accepted_and_scoped() {
    let (rsa, ec, ed) = (TestKey::rsa("r1"), TestKey::ec("e1"), TestKey::ed("d1"));
    let idp = Idp::start(&[&rsa, &ec, &ed]).await;
    let up = Upstream::start();
    let gw = jwt_gateway(&up, &idp).await;
    tokio::task::block_in_place(|| {
        for key in [&rsa, &ec, &ed] {
            let t = token(
                key,
                &idp,
                json!({"scope": "infer", "scp": null, "permissions": null}),
            );
            assert_eq!(status(&gw, "/v1/infer/x", &t), 200, "{} refused", key.alg);
            assert_eq!(
                status(&gw, "/v1/embed/x", &t),
                403,
                "{} over-scoped",
                key.alg
            );
            // Twice: the second answer comes from the verified-token cache.
            assert_eq!(status(&gw, "/v1/infer/x", &t), 200);
            let forwarded = format!("{:?}", up.last().headers);
            assert!(
                !forwarded.contains(&t[..40]),
                "the JWT reached the upstream"
            );
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_jwts_all_get_the_one_401() {
    let rsa = TestKey::rsa("r1");
    let other = TestKey::rsa("r1");
    let idp = Idp::start(&[&rsa]).await;
    let up = Upstream::start();
    let gw = jwt_gateway(&up, &idp).await;
    let now = testkit::idp::unix_now();
    let mut id_token_header = rsa.header();
    id_token_header.as_object_mut().unwrap().remove("typ");
    let mut none_header = rsa.header();
    none_header["alg"] = json!("none");
    let good_claims = testkit::idp::claims(&idp.issuer);
    let bad = [
        ("expired", token(&rsa, &idp, json!({"exp": now - 120}))),
        (
            "not yet valid",
            token(&rsa, &idp, json!({"nbf": now + 600})),
        ),
        (
            "wrong issuer",
            token(&rsa, &idp, json!({"iss": "http://evil.example"})),
        ),
        (
            "wrong audience",
            token(&rsa, &idp, json!({"aud": "someone-else"})),
        ),
        ("no sub", token(&rsa, &idp, json!({"sub": null}))),
        ("signed by another key", token(&other, &idp, json!({}))),
        (
            "unknown kid",
            TestKey::rsa("r9").access_token(&idp, json!({})),
        ),
        (
            "id token (no typ)",
            rsa.token(&id_token_header, &good_claims),
        ),
        (
            "alg none",
            format!(
                "{}.c2ln",
                testkit::idp::unsigned(&none_header, &good_claims)
            ),
        ),
    ];
    tokio::task::block_in_place(|| {
        let reference = {
            let (s, mut h, b) = get(&gw, "/v1/infer/x", "not-a-token");
            h.retain(|(k, _)| k != "date" && k != "x-request-id");
            (s, h, b)
        };
        assert_eq!(reference.0, 401);
        for (why, t) in &bad {
            let (s, mut h, b) = get(&gw, "/v1/infer/x", t);
            h.retain(|(k, _)| k != "date" && k != "x-request-id");
            assert_eq!(
                (s, &h, &b),
                (reference.0, &reference.1, &reference.2),
                "{why}"
            );
        }
    });
    assert!(up.requests().is_empty());
    // Counted in the logging phase, just after each response: poll briefly.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let metrics = tokio::task::block_in_place(|| gw.metrics());
        if metrics.contains("portcullis_auth_failures_total{kind=\"jwt\"} 9") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_signing_key_is_accepted_without_restart() {
    let old = TestKey::ec("2026-01");
    let idp = Idp::start(&[&old]).await;
    let up = Upstream::start();
    let gw = jwt_gateway(&up, &idp).await;
    let new = TestKey::ed("2026-02");
    idp.set_keys(&[&old, &new]);
    let t = token(&new, &idp, json!({}));
    tokio::task::block_in_place(|| {
        assert_eq!(status(&gw, "/v1/infer/x", &t), 200);
        assert_eq!(
            status(&gw, "/v1/infer/x", &token(&old, &idp, json!({}))),
            200
        );
        // The start-up fetch, then exactly one refetch for the new kid, visible to operators.
        let m = gw.metrics();
        assert!(
            m.contains(r#"portcullis_jwks_fetches_total{result="ok"} 2"#),
            "{m}"
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_provider_down_at_start_up_stops_only_jwts_until_it_is_back() {
    let rsa = TestKey::rsa("r1");
    let idp = Idp::start(&[&rsa]).await;
    idp.jwks_status
        .store(503, std::sync::atomic::Ordering::SeqCst);
    let up = Upstream::start();
    let gw = jwt_gateway(&up, &idp).await;
    let (key, _) = gw.create_key("infer", &[]);
    let jwt = token(&rsa, &idp, json!({"scope": "infer"}));
    tokio::task::block_in_place(|| {
        assert_eq!(status(&gw, "/v1/infer/x", &key), 200, "API keys must work");
        assert_eq!(status(&gw, "/v1/infer/x", &jwt), 401);
    });
    assert!(gw.log().contains("starting anyway"), "{}", gw.log());
    idp.jwks_status
        .store(0, std::sync::atomic::Ordering::SeqCst);
    // Retried with backoff (1 s, 2 s, 4 s, ...): well within 10 s of the issuer coming back.
    let back = Instant::now();
    tokio::task::block_in_place(|| {
        while status(&gw, "/v1/infer/x", &jwt) != 200 {
            assert!(back.elapsed() < Duration::from_secs(10), "{}", gw.log());
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let failed = gw
        .metrics()
        .lines()
        .find(|l| l.starts_with(r#"portcullis_jwks_fetches_total{result="error"}"#))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap());
    assert!(
        failed.is_some_and(|n| n >= 2.0),
        "failures not counted: {failed:?}"
    );
}
