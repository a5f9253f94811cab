//! The soak's clients: a few threads sending a paced mix of requests (API keys and JWTs, chat
//! JSON and SSE, embeddings, plain GETs and streams on the replicas, bad bodies and bad
//! tokens), each recorded with its own `X-Request-Id`, what it expected and what it got.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::idp::{claims, edit, TestKey};
use testkit::{header, read_response, try_raw, RawResponse};

/// Between two requests of one thread: about 20 requests a second in all.
const PACE: Duration = Duration::from_millis(150);
/// The fresh-connection threads; one more thread keeps its connection alive.
const FRESH_THREADS: usize = 3;
/// A client keeps its JWT this long (or until the IdP signs with another key), as a real
/// client holds its token for a session.
const TOKEN_LIFE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// GET on the replicas service: 200 JSON.
    Work,
    /// An SSE stream from the replicas: 200, complete.
    Sse,
    /// Chat completion (JSON) on the openai service: 200 with usage.
    Chat,
    /// Streamed chat completion: 200, complete to `[DONE]`.
    ChatStream,
    Embeddings,
    /// A chat body the model policy refuses: 400.
    BadBody,
    /// A well-formed API key with a wrong secret: 401.
    WrongKey,
    /// A JWT naming the IdP's current kid, signed by another key: 401.
    RogueJwt,
    /// A key revoked earlier in the run (or, before any, no token at all): 401.
    Revoked,
    /// GET on a connection kept alive across requests (and upgrades): 200.
    KeptAlive,
    /// A fault's own probe: any status, judged by the fault.
    Probe,
}

impl Kind {
    fn expected(self) -> u16 {
        match self {
            Kind::BadBody => 400,
            Kind::WrongKey | Kind::RogueJwt | Kind::Revoked => 401,
            _ => 200,
        }
    }

    /// Whether an answer comes from a replica (so a replica's death may cut it).
    pub fn proxied(self) -> bool {
        self.expected() == 200 && self != Kind::Probe
    }
}

/// One request as the client saw it. Times are since the start of the run.
pub struct Outcome {
    pub id: u64,
    pub kind: Kind,
    /// Sent with an API key (which a key-store outage may refuse).
    pub api_key: bool,
    pub start: Duration,
    pub end: Duration,
    /// 0 when no response arrived.
    pub status: u16,
    /// What was wrong with the answer; `None` when it was what the kind expects.
    pub problem: Option<String>,
}

pub fn request_id(id: u64) -> String {
    format!("soak-{id}")
}

pub struct Clients {
    pub port: u16,
    pub t0: Instant,
    stop: AtomicBool,
    next_id: AtomicU64,
    pub outcomes: Mutex<Vec<Outcome>>,
    /// Requests resent because a kept-alive connection closed before a byte of the answer.
    pub keepalive_retries: AtomicU64,
    key: String,
    wrong_key: String,
    issuer: String,
    /// The key the IdP signs with now; a JWKS rotation swaps it.
    pub signer: RwLock<Arc<TestKey>>,
    rogue: TestKey,
    pub revoked: Mutex<Vec<String>>,
}

impl Clients {
    pub fn new(port: u16, key: String, issuer: String, signer: Arc<TestKey>) -> Clients {
        // Same id, another secret: the key store finds the key and the check fails.
        // The secret's first character, which carries 6 whole bits of it.
        let dot = key.find('.').expect("ak_<id>.<secret>");
        let other = if key[dot + 1..].starts_with('A') {
            "B"
        } else {
            "A"
        };
        let wrong_key = format!("{}{other}{}", &key[..=dot], &key[dot + 2..]);
        Clients {
            port,
            t0: Instant::now(),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            outcomes: Mutex::new(Vec::new()),
            keepalive_retries: AtomicU64::new(0),
            key,
            wrong_key,
            issuer,
            signer: RwLock::new(signer),
            rogue: TestKey::ec("rogue"),
            revoked: Mutex::new(Vec::new()),
        }
    }

    pub fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    pub fn sent(&self) -> usize {
        self.outcomes.lock().unwrap().len()
    }

    /// A token from the IdP's current key, as the IdP would issue it.
    pub fn mint(&self, key: &TestKey) -> String {
        let claims = edit(&claims(&self.issuer), json!({"scope": "infer oa"}));
        key.token(&key.header(), &claims)
    }

    fn current_kid(&self) -> String {
        self.signer.read().unwrap().kid.clone()
    }

    /// Sends one request of `kind` on a fresh connection and records it.
    fn send(&self, kind: Kind, bearer: &str) {
        let (method, path, body) = match kind {
            Kind::Work => ("GET", "/v1/infer/work?ms=5", ""),
            Kind::Sse => ("GET", "/v1/infer/sse?n=8&gap_ms=30", ""),
            Kind::Chat | Kind::BadBody => ("POST", "/v1/oa/v1/chat/completions", ""),
            Kind::ChatStream => ("POST", "/v1/oa/v1/chat/completions?n=4&gap_ms=20", ""),
            Kind::Embeddings => ("POST", "/v1/oa/v1/embeddings", ""),
            _ => ("GET", "/v1/infer/work", ""),
        };
        let body = match kind {
            Kind::Chat => r#"{"model":"m-small","messages":[{"role":"user","content":"hello"}]}"#,
            Kind::ChatStream => {
                r#"{"model":"m-small","stream":true,"messages":[{"role":"user","content":"hi"}]}"#
            }
            Kind::Embeddings => r#"{"model":"emb","input":"soak"}"#,
            Kind::BadBody => r#"{"messages":"not an array"}"#,
            _ => body,
        };
        self.record(kind, !bearer.starts_with("ey"), |id| {
            try_raw(self.port, &request(method, path, bearer, id, body, true))
        });
    }

    /// A fault's probe: `path` with `bearer` on a fresh connection; its status (0: none).
    pub fn probe(&self, path: &str, bearer: &str) -> u16 {
        self.record(Kind::Probe, bearer.starts_with("ak_"), |id| {
            try_raw(self.port, &request("GET", path, bearer, id, "", true))
        })
    }

    fn record(
        &self,
        kind: Kind,
        api_key: bool,
        send: impl FnOnce(&str) -> std::io::Result<RawResponse>,
    ) -> u16 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let start = self.now();
        let response = send(&request_id(id));
        self.push(id, kind, api_key, start, response)
    }

    fn push(
        &self,
        id: u64,
        kind: Kind,
        api_key: bool,
        start: Duration,
        response: std::io::Result<RawResponse>,
    ) -> u16 {
        let end = self.now();
        let (status, problem) = judge(kind, &request_id(id), response);
        self.outcomes.lock().unwrap().push(Outcome {
            id,
            kind,
            api_key,
            start,
            end,
            status,
            problem,
        });
        status
    }

    fn fresh_loop(&self, thread: usize) {
        // Each thread walks the mix from its own offset, so every kind is always in the air.
        const MIX: [(Kind, bool); 12] = [
            (Kind::Work, false),
            (Kind::Chat, false),
            (Kind::ChatStream, true),
            (Kind::Embeddings, true),
            (Kind::Sse, false),
            (Kind::BadBody, false),
            (Kind::Work, true),
            (Kind::WrongKey, false),
            (Kind::Chat, true),
            (Kind::RogueJwt, false),
            (Kind::Sse, true),
            (Kind::Revoked, false),
        ];
        let mut token: Option<(String, String, Instant)> = None;
        let mut n = thread * 4;
        while !self.stop.load(Ordering::Relaxed) {
            let (kind, jwt) = MIX[n % MIX.len()];
            n += 1;
            let kid = self.current_kid();
            if token
                .as_ref()
                .is_none_or(|(k, _, at)| *k != kid || at.elapsed() > TOKEN_LIFE)
            {
                let signer = self.signer.read().unwrap().clone();
                token = Some((signer.kid.clone(), self.mint(&signer), Instant::now()));
            }
            let bearer = match kind {
                Kind::WrongKey => self.wrong_key.clone(),
                Kind::RogueJwt => {
                    let header = json!({"alg": "ES256", "typ": "at+jwt", "kid": kid});
                    let claims = edit(&claims(&self.issuer), json!({"scope": "infer oa"}));
                    self.rogue.token(&header, &claims)
                }
                Kind::Revoked => {
                    let revoked = self.revoked.lock().unwrap();
                    revoked
                        .get(n % revoked.len().max(1))
                        .cloned()
                        .unwrap_or_default()
                }
                _ if jwt => token.as_ref().unwrap().1.clone(),
                _ => self.key.clone(),
            };
            self.send(kind, &bearer);
            thread::sleep(PACE);
        }
    }

    /// GETs on one connection kept alive for as long as the gateway keeps it.
    fn kept_alive_loop(&self) {
        let mut conn: Option<TcpStream> = None;
        while !self.stop.load(Ordering::Relaxed) {
            let reused = conn.is_some();
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let start = self.now();
            let answer = exchange(self.port, &mut conn, &self.key, &request_id(id));
            let response = match answer {
                Ok(Some(response)) => Ok(response),
                // The server closed the idle connection as the request left (an upgrade's old
                // process draining): RFC 9112 §9.3.1 lets a client resend an idempotent request
                // then, and every HTTP client library does. The resend is the request.
                Ok(None) if reused => {
                    self.keepalive_retries.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(e) if reused && e.kind() == std::io::ErrorKind::BrokenPipe => {
                    self.keepalive_retries.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Ok(None) => Err(std::io::Error::other("closed without an answer")),
                Err(e) => Err(e),
            };
            self.push(id, Kind::KeptAlive, true, start, response);
            thread::sleep(PACE);
        }
    }
}

/// One GET on `conn` (connecting first when there is none), leaving the connection there
/// unless the server said it closes it. `Ok(None)`: closed before a byte of the answer.
fn exchange(
    port: u16,
    conn: &mut Option<TcpStream>,
    key: &str,
    id: &str,
) -> std::io::Result<Option<RawResponse>> {
    let mut s = match conn.take() {
        Some(s) => s,
        None => TcpStream::connect(("127.0.0.1", port))?,
    };
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    s.write_all(&request("GET", "/v1/infer/work?ms=2", key, id, "", false))?;
    let response = read_response(&mut s)?;
    if let Some((_, headers, _)) = &response {
        if header(headers, "connection").is_none_or(|v| !v.eq_ignore_ascii_case("close")) {
            *conn = Some(s);
        }
    }
    Ok(response)
}

/// The threads sending traffic until `finish`.
pub struct Traffic {
    clients: Arc<Clients>,
    threads: Vec<JoinHandle<()>>,
}

impl Traffic {
    pub fn start(clients: &Arc<Clients>) -> Traffic {
        let mut threads = Vec::new();
        for t in 0..FRESH_THREADS {
            let c = clients.clone();
            threads.push(thread::spawn(move || c.fresh_loop(t)));
        }
        let c = clients.clone();
        threads.push(thread::spawn(move || c.kept_alive_loop()));
        Traffic {
            clients: clients.clone(),
            threads,
        }
    }

    /// Stops sending and waits for the requests in flight (each bounded by its read timeout).
    pub fn finish(self) {
        self.clients.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("a traffic thread panicked");
        }
    }
}

fn request(method: &str, path: &str, bearer: &str, id: &str, body: &str, close: bool) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: soak\r\nX-Request-Id: {id}\r\n");
    if !bearer.is_empty() {
        head.push_str(&format!("Authorization: Bearer {bearer}\r\n"));
    }
    if method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    head.push_str(body);
    head.into_bytes()
}

/// The status, and what (if anything) is wrong with the answer for a request of `kind`.
fn judge(kind: Kind, id: &str, response: std::io::Result<RawResponse>) -> (u16, Option<String>) {
    let (status, headers, body) = match response {
        Ok(r) => r,
        Err(e) => return (0, (kind != Kind::Probe).then(|| format!("no answer: {e}"))),
    };
    if kind == Kind::Probe {
        return (status, None);
    }
    let text = String::from_utf8_lossy(&body);
    let snippet: String = text.chars().take(160).collect();
    if header(&headers, "x-request-id") != Some(id) {
        return (status, Some(format!("{status} without its X-Request-Id")));
    }
    if status != kind.expected() {
        return (status, Some(format!("{status} {snippet}")));
    }
    let complete = match kind {
        Kind::Work | Kind::KeptAlive => text.contains("\"ok\":true"),
        Kind::Sse | Kind::ChatStream => {
            text.contains("data: [DONE]") && text.ends_with("0\r\n\r\n")
        }
        Kind::Chat => text.contains("\"usage\""),
        Kind::Embeddings => text.contains("\"embedding\""),
        _ => true,
    };
    let problem = (!complete).then(|| format!("{status} but cut short: {snippet}"));
    (status, problem)
}
