//! Budgets end to end: real gateway processes in front of the fake upstream (a streamed chat
//! answer reports 21 + 9 tokens, a JSON one 11 + 5), budgets set through the real CLI and key
//! API, a real Postgres and a real Redis shared by the fleet, JWTs from a test issuer.
//!
//! `fleet`: exactness under concurrency across four gateways (per key and per owner), budget
//! changes reaching every gateway within a second, Redis killed and flushed. `single`: one
//! gateway's headers and errors, a restart that keeps spent budget, the bound of `after` and
//! of requests without `max_tokens`, rate limits counted per owner.

mod fleet;
mod single;
mod worst_case;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::idp::{Idp, TestKey};
use testkit::{cli, raw, Gateway, Service, Upstream};

pub(crate) use crate::ledger::admin_port;
use crate::ledger::wait_for_admin;

pub const CHAT: &str = "/v1/chat/v1/chat/completions";

/// What one streamed chat really uses, as the fake upstream reports it (21 + 9).
pub const STREAM_TOKENS: u64 = 30;

pub struct Fixture {
    pub up: Upstream,
    pub idp: Arc<Idp>,
    signer: TestKey,
}

/// How a fixture's gateways are configured.
#[derive(Default)]
pub struct Setup<'a> {
    pub database: Option<&'a str>,
    pub redis: Option<&'a str>,
    pub admin_port: Option<u16>,
    /// TOML of `[budgets]`, after the header.
    pub budgets: &'a str,
    pub rate_limit_per_minute: Option<u64>,
    /// `max_request_body_bytes`, when not the test kit's.
    pub max_body: Option<u64>,
    /// Lines added to the `chat` service's table.
    pub chat_lines: &'a str,
    /// Lines added to `[metering]`.
    pub metering: &'a str,
    /// TOML of `[pricing]`, after the header; none when empty.
    pub pricing: &'a str,
    /// Whole TOML sections added at the end.
    pub extra: &'a str,
}

impl Fixture {
    pub async fn start() -> Fixture {
        let signer = TestKey::rsa("budget-test");
        let idp = Idp::start(&[&signer]).await;
        Fixture {
            up: Upstream::start(),
            idp,
            signer,
        }
    }

    pub fn gateway(&self, setup: &Setup<'_>) -> Gateway {
        let mut extra = format!(
            "[auth.jwt]\nissuer = \"{}\"\naudience = \"portcullis\"\n\
             [metering]\nflush_seconds = 1\n{}\n[budgets]\n{}\n",
            self.idp.issuer, setup.metering, setup.budgets
        );
        if !setup.pricing.is_empty() {
            extra.push_str(&format!("[pricing]\n{}\n", setup.pricing));
        }
        extra.push_str(setup.extra);
        if let Some(url) = setup.redis {
            extra.push_str(&format!("[rate_limits]\nredis = \"{url}\"\n"));
        }
        if let Some(port) = setup.admin_port {
            extra.push_str(&format!(
                "[admin]\nlisten = \"127.0.0.1:{port}\"\nrequests_per_minute = 10000\n"
            ));
        }
        let mut chat = Service::new("chat", self.up.url("/oa/chat"))
            .openai()
            .lines(setup.chat_lines);
        let mut plain = Service::new("plain", self.up.url("/plain"));
        if let Some(n) = setup.rate_limit_per_minute {
            chat = chat.rate_limit_per_minute(n);
            plain = plain.rate_limit_per_minute(n);
        }
        let mut builder = Gateway::builder()
            .service(chat)
            .service(plain)
            .cache_ttl(60)
            .extra(&extra);
        if let Some(bytes) = setup.max_body {
            builder = builder.max_body(bytes);
        }
        if let Some(database) = setup.database {
            builder = builder.key_store(database);
        }
        let gw = tokio::task::block_in_place(|| builder.start());
        if let Some(port) = setup.admin_port {
            wait_for_admin(port);
        }
        gw
    }

    /// A login token for `sub` with `scope` (space-separated).
    pub fn token(&self, sub: &str, scope: &str) -> String {
        self.signer.access_token(
            &self.idp,
            json!({"sub": sub, "scope": scope, "scp": null, "permissions": null}),
        )
    }

    /// Requests the upstream received for chat completions.
    pub fn chats_upstream(&self) -> usize {
        (self.up.requests().iter())
            .filter(|h| h.path().contains("/chat/completions"))
            .count()
    }
}

/// A key made through the real CLI with `flags` (budget flags, `--owner`): (key, key id).
pub fn key(gw: &Gateway, flags: &[&str]) -> (String, String) {
    tokio::task::block_in_place(|| gw.create_key("chat,plain", flags))
}

/// Runs `portcullis ARGS --config …`; its stdout, asserting success.
pub fn portcullis(gw: &Gateway, args: &[&str]) -> String {
    let out = tokio::task::block_in_place(|| cli(&gw.config, args));
    assert!(
        out.status.success(),
        "portcullis {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A streamed chat stating `max_tokens` (none when `None`), read to its end: (status,
/// headers, body). Its body is over 84 bytes, so the prompt estimate (one token per 4
/// bytes) covers the 21 prompt tokens the fake upstream reports.
pub fn stream_chat(
    port: u16,
    token: &str,
    max_tokens: Option<u64>,
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut body = json!({"model": "m", "stream": true,
        "messages": [{"role": "user", "content": "hello there, how are you today?"}]});
    if let Some(n) = max_tokens {
        body["max_tokens"] = json!(n);
    }
    post(
        port,
        token,
        &format!("{CHAT}?n=3&gap_ms=2"),
        &body.to_string(),
    )
}

pub fn post(
    port: u16,
    token: &str,
    path: &str,
    body: &str,
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::task::block_in_place(|| raw(port, req.as_bytes()))
}

/// `method path` on an admin listener with a JSON body: (status, body).
pub fn admin(
    port: u16,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, _, body) = tokio::task::block_in_place(|| raw(port, req.as_bytes()));
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// The ledger's tokens (prompt + completion) and requests for `key_id`, through
/// `portcullis usage`, once they stop changing (every gateway has flushed).
pub fn ledger_of(gw: &Gateway, key_id: &str) -> (u64, u64) {
    let read = || {
        let rows = crate::ledger::usage_cli(&gw.config, &["--group-by", "key"]);
        let mine: Vec<Value> = rows.into_iter().filter(|r| r["key"] == key_id).collect();
        (
            crate::ledger::total(&mine, "prompt_tokens")
                + crate::ledger::total(&mine, "completion_tokens"),
            crate::ledger::total(&mine, "requests"),
        )
    };
    settled(read)
}

/// The ledger's totals for `owner` (all its keys and JWT calls).
pub fn ledger_of_owner(gw: &Gateway, owner: &str) -> (u64, u64) {
    let read = || {
        let rows = crate::ledger::usage_cli(&gw.config, &["--group-by", "key"]);
        let mine: Vec<Value> = rows.into_iter().filter(|r| r["owner"] == owner).collect();
        (
            crate::ledger::total(&mine, "prompt_tokens")
                + crate::ledger::total(&mine, "completion_tokens"),
            crate::ledger::total(&mine, "requests"),
        )
    };
    settled(read)
}

/// Reads until two reads three seconds apart agree (every flush_seconds = 1 ledger is in).
fn settled(read: impl Fn() -> (u64, u64)) -> (u64, u64) {
    let mut last = read();
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = read();
        if now == last {
            return now;
        }
        last = now;
    }
}

/// A counter of the gateway's `/metrics`, summed over the lines starting with `prefix`.
pub fn metric(gw: &Gateway, prefix: &str) -> f64 {
    let text = tokio::task::block_in_place(|| gw.metrics());
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    testkit::header(headers, name)
}
