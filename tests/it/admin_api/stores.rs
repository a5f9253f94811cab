//! The key API on the stores: a SQLite file from before key ownership, and Postgres under
//! concurrent creates and with the revocation push.

use serde_json::{json, Value};
use testkit::idp::{Idp, TestKey};
use testkit::{cli, free_port, raw, Gateway, Service, Upstream};

use super::{wait_for_admin, Admin};

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
