//! The key-management API (`[admin]`) end to end: the real binary, tokens signed by a test
//! identity provider, keys used on the real data plane against a real upstream.
//!
//! One module per concern: `lifecycle` (owners, administrators), `refusals` (401/403 parity,
//! bad requests, CORS), `stores` (an old SQLite file, Postgres), `paging`, `limits` (the rate
//! limit per `sub`, the retention of revoked keys) and `tls` (the listener over HTTPS).

mod lifecycle;
mod limits;
mod paging;
mod refusals;
mod stores;
mod tls;

use serde_json::{json, Value};
use testkit::idp::{Idp, TestKey};
use testkit::Upstream;
use testkit::{free_port, raw, Gateway, RawResponse, Service};

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
