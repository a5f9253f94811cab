//! Budgets managed end to end: the real binary's CLI (`keys create` with limits, `keys
//! budget`, `owners budget`, `keys list`'s BUDGET and LEFT) and key API (`budget` on `POST` and
//! `PATCH /v1/keys`, `GET`/`PUT /v1/owners/{sub}/budget`, listings' `budget` and `used`), with
//! tokens signed by a test identity provider, usage charged by real calls to the fake upstream
//! (11 + 5 tokens a chat answer) through the ledger, on SQLite and on a real Postgres.
//!
//! `command_line`: the CLI's commands and their output; `key_api`: the key API's calls, on both
//! stores. The fixture and the readers of the CLI's tables are here.

mod command_line;
mod key_api;

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
