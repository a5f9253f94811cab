//! `[admin.tls]`: the key API and the console over HTTPS only (no plain listener), with a
//! throwaway CA as the data plane's TLS tests use; bad TLS material refused at start-up.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::idp::{Idp, TestKey};
use testkit::{free_port, Gateway, Service, Upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_admin_tls_the_key_api_and_console_are_served_over_https_only() {
    let certs = tempfile::tempdir().unwrap();
    crate::tls::make_certs(certs.path(), "IP:127.0.0.1");
    let signer = TestKey::rsa("admin-tls");
    let idp = Idp::start(&[&signer]).await;
    let up = Upstream::start();
    let port = free_port();
    let extra = format!(
        "[auth.jwt]\nissuer = \"{}\"\naudience = \"portcullis\"\n\
         [admin]\nconsole = true\n\
         [admin.tls]\nlisten = [\"127.0.0.1:{port}\"]\ncert_file = \"{1}/leaf.pem\"\nkey_file = \"{1}/leaf.key\"\n",
        idp.issuer,
        certs.path().display()
    );
    let builder = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .extra(&extra);
    let gw = tokio::task::block_in_place(|| builder.start());
    let client = crate::tls::client_trusting(certs.path());
    let base = format!("https://127.0.0.1:{port}");
    let started = Instant::now();
    while !client
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(started.elapsed() < Duration::from_secs(10), "{}", gw.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let token = signer.access_token(&idp, json!({"sub": "alice", "scope": "infer"}));
    let made = client
        .post(format!("{base}/v1/keys"))
        .bearer_auth(&token)
        .json(&json!({"name": "over tls", "scopes": ["infer"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 201);
    let made: Value = made.json().await.unwrap();
    let key = made["key"].as_str().unwrap();
    let use_key = format!(
        "GET /v1/infer/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(
        tokio::task::block_in_place(|| gw.raw(use_key.as_bytes())).0,
        200
    );
    let listed: Value = (client.get(format!("{base}/v1/keys")).bearer_auth(&token))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["keys"][0]["id"], made["id"]);
    let console = client.get(format!("{base}/console/")).send().await.unwrap();
    assert_eq!(console.status(), 200);

    // Plain HTTP gets no answer from the TLS listener, and a client that does not trust the
    // CA cannot talk to it.
    let plain = b"GET /openapi.json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    assert!(tokio::task::block_in_place(|| testkit::try_raw(port, plain)).is_err());
    let strict = reqwest::Client::new();
    assert!(strict
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .is_err());
}

#[test]
fn unreadable_admin_tls_material_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cert.pem"), "nope").unwrap();
    let (ok, err) = testkit::check_config(
        dir.path(),
        &format!(
            "[auth.api_keys]\ndatabase = \"sqlite://{0}/keys.db\"\n\
             [auth.jwt]\nissuer = \"https://idp.example\"\naudience = \"portcullis\"\n\
             [admin]\n[admin.tls]\nlisten = [\"127.0.0.1:1\"]\n\
             cert_file = \"{0}/cert.pem\"\nkey_file = \"{0}/missing.key\"\n\
             [services.x]\nupstream = \"http://127.0.0.1:1\"\nscope = \"x\"\n",
            dir.path().display()
        ),
    );
    assert!(!ok);
    for key in ["admin.tls.cert_file", "admin.tls.key_file"] {
        assert!(err.contains(&format!("c.toml: {key}: ")), "{key}: {err}");
    }
    assert!(
        !err.contains("admin.listen"),
        "TLS listeners count as listeners: {err}"
    );
}
