//! The usage ledger end to end: real gateway processes in front of the fake upstream (which
//! reports 11 + 5 tokens on a chat answer, 21 + 9 on a chat stream, 7 on embeddings), keys
//! made through the CLI, JWTs signed by a test identity provider, SQLite and a real Postgres.
//!
//! `counts`: the ledger equals what the upstream reported, per key, owner, service and model,
//! and `GET /v1/usage` and `portcullis usage` show it; `durability`: a restart, an upgrade,
//! `kill -9`, a Postgres restart and three gateways on one Postgres lose and double nothing.

mod counts;
mod durability;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::idp::{Idp, TestKey};
use testkit::{cli, free_port, raw, Gateway, Service, Upstream};

/// The services every ledger gateway has: `chat` and `embed` read usage (`api = "openai"`),
/// `plain` does not.
const CHAT: &str = "/v1/chat/v1/chat/completions";
const EMBED: &str = "/v1/embed/v1/embeddings";

struct Fixture {
    up: Upstream,
    idp: Arc<Idp>,
    signer: TestKey,
}

impl Fixture {
    async fn start() -> Fixture {
        let signer = TestKey::rsa("ledger-test");
        let idp = Idp::start(&[&signer]).await;
        Fixture {
            up: Upstream::start(),
            idp,
            signer,
        }
    }

    /// A gateway flushing every second, with JWTs from the fixture's issuer, an `[admin]`
    /// listener on `admin_port` when given, and its key store at `database` (default: its own
    /// SQLite file).
    fn gateway(&self, database: Option<&str>, admin_port: Option<u16>, grace: u64) -> Gateway {
        self.gateway_flushing(database, admin_port, grace, 1)
    }

    /// `gateway` with `[metering] flush_seconds` set: an hour leaves only the last flush of a
    /// stop to write anything.
    fn gateway_flushing(
        &self,
        database: Option<&str>,
        admin_port: Option<u16>,
        grace: u64,
        flush_seconds: u64,
    ) -> Gateway {
        let mut extra = format!(
            "[auth.jwt]\nissuer = \"{}\"\naudience = \"portcullis\"\n\
             [metering]\nflush_seconds = {flush_seconds}\n",
            self.idp.issuer
        );
        if let Some(port) = admin_port {
            extra.push_str(&format!(
                "[admin]\nlisten = \"127.0.0.1:{port}\"\nrequests_per_minute = 1000\n"
            ));
        }
        let mut builder = Gateway::builder()
            .service(Service::new("chat", self.up.url("/oa/chat")).openai())
            .service(Service::new("embed", self.up.url("/oa/embed")).openai())
            .service(Service::new("plain", self.up.url("/plain")))
            .grace_period(grace)
            .cache_ttl(60)
            .extra(&extra);
        if let Some(database) = database {
            builder = builder.key_store(database);
        }
        let gw = tokio::task::block_in_place(|| builder.start());
        if let Some(port) = admin_port {
            wait_for_admin(port);
        }
        gw
    }

    /// A login token for `sub` with `scope` (space-separated).
    fn token(&self, sub: &str, scope: &str) -> String {
        self.signer.access_token(
            &self.idp,
            json!({"sub": sub, "scope": scope, "scp": null, "permissions": null}),
        )
    }
}

/// A key made through the real CLI: (full key, key id).
fn key(gw: &Gateway, owner: Option<&str>) -> (String, String) {
    let extra: Vec<&str> = owner.map_or(Vec::new(), |o| vec!["--owner", o]);
    tokio::task::block_in_place(|| gw.create_key("chat,embed,plain", &extra))
}

/// POSTs a chat completion for `model` (streamed when `stream`); the status, once the whole
/// answer has arrived.
fn chat(port: u16, token: &str, model: &str, stream: bool) -> u16 {
    let body = json!({"model": model, "stream": stream,
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let path = if stream {
        format!("{CHAT}?n=3&gap_ms=5&split_ms=5")
    } else {
        CHAT.to_string()
    };
    post(port, token, &path, &body)
}

fn embed(port: u16, token: &str, model: &str) -> u16 {
    let body = json!({"model": model, "input": "hello"}).to_string();
    post(port, token, EMBED, &body)
}

fn post(port: u16, token: &str, path: &str, body: &str) -> u16 {
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::task::block_in_place(|| raw(port, req.as_bytes())).0
}

fn get(port: u16, token: &str, path: &str) -> u16 {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    tokio::task::block_in_place(|| raw(port, req.as_bytes())).0
}

/// `GET /v1/usage{query}` on an admin listener: (status, body).
fn usage_api(admin_port: u16, token: &str, query: &str) -> (u16, Value) {
    let req = format!(
        "GET /v1/usage{query} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\n\r\n"
    );
    let (status, _, body) = tokio::task::block_in_place(|| raw(admin_port, req.as_bytes()));
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// `portcullis usage --config CONFIG ARGS…` as rows shaped like the API's: the header line
/// names the columns, `-` is null. The counts are numbers.
pub(crate) fn usage_cli(config: &std::path::Path, args: &[&str]) -> Vec<Value> {
    let out = tokio::task::block_in_place(|| cli(config, &[&["usage"], args].concat()));
    assert!(
        out.status.success(),
        "portcullis usage failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .expect("a header line")
        .replace("KEY ID", "KEY")
        .split_whitespace()
        .map(|c| c.to_lowercase())
        .collect();
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cells.len(), header.len(), "{line}");
            let mut row = serde_json::Map::new();
            for (name, cell) in header.iter().zip(cells) {
                let value = match (name.as_str(), cell) {
                    (_, "-") => Value::Null,
                    ("day" | "key" | "owner" | "service" | "model" | "team", v) => json!(v),
                    ("cost", v) => serde_json::from_str(v).unwrap(),
                    (_, v) => json!(v.parse::<u64>().unwrap()),
                };
                let name = match name.as_str() {
                    "prompt" | "completion" | "reasoning" | "cached" => format!("{name}_tokens"),
                    "unpriced" => "unpriced_requests".to_string(),
                    other => other.to_string(),
                };
                row.insert(name, value);
            }
            Value::Object(row)
        })
        .collect()
}

/// The sum of one count over rows.
pub(crate) fn total(rows: &[Value], field: &str) -> u64 {
    rows.iter().map(|r| r[field].as_u64().unwrap()).sum()
}

/// Polls `rows` until `done` holds of them, for at most `within`; the last rows seen.
pub(crate) fn wait_for(
    within: Duration,
    mut rows: impl FnMut() -> Vec<Value>,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + within;
    loop {
        let seen = rows();
        if done(&seen) || Instant::now() >= deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A counter of the gateway's `/metrics`, 0 when absent.
fn metric(gw: &Gateway, line_start: &str) -> u64 {
    let text = tokio::task::block_in_place(|| gw.metrics());
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .map_or(0, |v| v.trim().parse().unwrap())
}

pub(crate) fn wait_for_admin(port: u16) {
    let request = b"GET /openapi.json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    for _ in 0..200 {
        if tokio::task::block_in_place(|| testkit::try_raw(port, request)).is_ok_and(|r| r.0 == 200)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("the admin listener on port {port} never answered");
}

/// A fresh port for an admin listener.
pub(crate) fn admin_port() -> u16 {
    free_port()
}
