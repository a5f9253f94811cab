//! Authentication and authorisation end to end: keys made and revoked through the real CLI,
//! JWTs signed by a test identity provider, all checked by the real gateway binary.

mod common;

use std::time::{Duration, Instant};

use common::idp::{Idp, TestKey};
use common::upstream::Upstream;
use common::{cli, header, Gateway, Service};
use serde_json::json;

fn get(gw: &Gateway, path: &str, token: &str) -> common::RawResponse {
    gw.raw(format!("GET {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n").as_bytes())
}

fn status(gw: &Gateway, path: &str, token: &str) -> u16 {
    get(gw, path, token).0
}

fn two_services(up: &Upstream) -> common::GatewayBuilder<'static> {
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
    assert!(
        row.trim_end().ends_with('Z'),
        "revocation time missing: {row}"
    );
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
    for args in [
        &["keys", "create", "--name", "x", "--scopes", "in fer"][..],
        &[
            "keys",
            "create",
            "--name",
            "x",
            "--scopes",
            "infer",
            "--expires-in",
            "10w",
        ],
        &["keys", "revoke", "0000000000000000"],
        &["keys", "revoke", "not-an-id"],
    ] {
        let out = cli(&gw.config, args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(!err.trim().is_empty(), "{args:?}: no reason given");
    }
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
    let now = common::idp::unix_now();
    let mut id_token_header = rsa.header();
    id_token_header.as_object_mut().unwrap().remove("typ");
    let mut none_header = rsa.header();
    none_header["alg"] = json!("none");
    let good_claims = common::idp::claims(&idp.issuer);
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
            format!("{}.c2ln", common::idp::unsigned(&none_header, &good_claims)),
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
        // The new kid cost exactly one refetch, visible to operators.
        let m = gw.metrics();
        assert!(
            m.contains(r#"portcullis_jwks_fetches_total{result="ok"} 1"#),
            "{m}"
        );
    });
}
