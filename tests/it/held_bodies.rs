//! Bodies the gateway must read whole (chat and embeddings on `api = "openai"` services),
//! against the real binary: each bounded by `max_buffered_body_bytes`, all of them at once by
//! `buffered_bodies_max_bytes` (503 overloaded beyond it, memory included), and each given
//! `buffered_body_timeout_seconds` to arrive.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::{header, read_response, Gateway, RawResponse, Service, Upstream};

const CHAT: &str = "/v1/chat/v1/chat/completions";
const PLAIN: &str = "/v1/plain/v1/chat/completions";
/// `max_buffered_body_bytes` and `buffered_bodies_max_bytes` of these tests.
const MAX_HELD: usize = 1 << 20;
const BUDGET: usize = 2 << 20;

/// `chat` reads bodies (with a default model, so a body may grow); `plain`, on the same
/// upstream, is the control that never does.
fn gateway(up: &Upstream, extra_server: &[(&str, u64)]) -> (Gateway, String) {
    let mut builder = Gateway::builder()
        .service(
            Service::new("chat", up.url("/oa/chat"))
                .openai()
                .models("m-default", &[("short", "a-much-longer-model-name")]),
        )
        .service(Service::new("plain", up.url("/oa/plain")))
        .max_body(8 << 20)
        .server("max_buffered_body_bytes", MAX_HELD)
        .server("buffered_bodies_max_bytes", BUDGET);
    for (key, value) in extra_server {
        builder = builder.server(key, value);
    }
    let gw = builder.start();
    let (key, _) = gw.create_key("chat,plain", &[]);
    (gw, key)
}

/// A valid chat body of exactly `size` bytes (the padding is the message's content).
fn chat_body(size: usize) -> Vec<u8> {
    let (open, close) = (r#"{"messages":[{"role":"user","content":""#, r#""}]}"#);
    let mut body = open.as_bytes().to_vec();
    body.resize(size - close.len(), b'x');
    body.extend_from_slice(close.as_bytes());
    body
}

fn head(key: &str, path: &str, framing: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\n{framing}\r\n\r\n"
    )
}

/// Starts a chunked upload on `path`: the head, then `body` in 16 KiB chunks, without the
/// last chunk unless `finish`. Write errors are ignored: a refused upload's connection closes.
fn upload(gw: &Gateway, key: &str, path: &str, body: &[u8], finish: bool) -> TcpStream {
    let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let _ = conn.write_all(head(key, path, "Transfer-Encoding: chunked").as_bytes());
    for chunk in body.chunks(16 * 1024) {
        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
        framed.extend_from_slice(chunk);
        framed.extend_from_slice(b"\r\n");
        if conn.write_all(&framed).is_err() {
            break;
        }
    }
    if finish {
        let _ = conn.write_all(b"0\r\n\r\n");
    }
    conn
}

/// The response on `conn` if one comes within `wait`; None while the upload is held.
fn response_within(conn: &mut TcpStream, wait: Duration) -> Option<RawResponse> {
    conn.set_read_timeout(Some(wait)).unwrap();
    match read_response(conn) {
        Ok(response) => response,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock) => None,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut) => None,
        Err(e) => panic!("reading the response: {e}"),
    }
}

fn error_of(body: &[u8]) -> (String, String) {
    let v: Value = serde_json::from_slice(body).unwrap();
    let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    (field("error"), field("message"))
}

/// The process's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn held_bodies_share_a_memory_budget_and_the_excess_gets_503_at_once() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up, &[]);
    const UPLOAD: usize = 400 * 1024;
    const ATTEMPTS: usize = 24;
    // Complete uploads first, so that the baseline includes what serving them costs anyway.
    for _ in 0..4 {
        let mut conn = upload(&gw, &key, CHAT, &chat_body(UPLOAD), true);
        let (status, _, _) = response_within(&mut conn, Duration::from_secs(10)).unwrap();
        assert_eq!(status, 200);
    }
    let baseline = rss_kib(gw.pid());
    let mut held = Vec::new();
    let mut refused = 0;
    let body = chat_body(UPLOAD + 10);
    for _ in 0..ATTEMPTS {
        let start = Instant::now();
        let mut conn = upload(&gw, &key, CHAT, &body[..UPLOAD], false);
        match response_within(&mut conn, Duration::from_millis(700)) {
            None => held.push(conn),
            Some((status, headers, resp)) => {
                let waited = start.elapsed();
                assert_eq!(status, 503, "{}", String::from_utf8_lossy(&resp));
                assert_eq!(error_of(&resp).0, "overloaded");
                assert!(!error_of(&resp).1.is_empty());
                assert_eq!(header(&headers, "retry-after"), Some("1"));
                assert_eq!(header(&headers, "content-type"), Some("application/json"));
                assert!(waited < Duration::from_secs(2), "refused after {waited:?}");
                refused += 1;
            }
        }
    }
    let during = rss_kib(gw.pid());
    eprintln!(
        "RSS: baseline {baseline} KiB, with {} uploads of {} KiB held and {refused} refused: \
         {during} KiB (+{} KiB; budget {} KiB)",
        held.len(),
        UPLOAD / 1024,
        during.saturating_sub(baseline),
        BUDGET / 1024
    );
    assert!(
        held.len() >= 2 && held.len() * UPLOAD <= BUDGET,
        "{} uploads held",
        held.len()
    );
    assert_eq!(held.len() + refused, ATTEMPTS);
    // The budget, plus what the connections themselves cost (buffers, tasks) and the noise.
    let margin_kib = 3 * 1024;
    assert!(
        during <= baseline + (BUDGET / 1024) as u64 + margin_kib,
        "RSS grew from {baseline} to {during} KiB"
    );
    // The held uploads go away: their memory is given back and uploads pass again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = upload(&gw, &key, CHAT, &chat_body(UPLOAD), true);
        let (status, _, _) = response_within(&mut conn, Duration::from_secs(10)).unwrap();
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every budget byte is back: as many uploads as fitted before fit again.
    let again: Vec<TcpStream> = (0..2)
        .map(|_| upload(&gw, &key, CHAT, &body[..UPLOAD], false))
        .collect();
    for mut conn in again {
        assert!(response_within(&mut conn, Duration::from_millis(500)).is_none());
    }
}

#[test]
fn a_body_over_max_buffered_body_bytes_gets_413_where_it_is_read() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up, &[]);
    let big = chat_body(MAX_HELD + 1);
    // Declared: refused before a byte of it is read.
    let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let framing = format!("Content-Length: {}", big.len());
    conn.write_all(head(&key, CHAT, &framing).as_bytes())
        .unwrap();
    let (status, _, resp) = response_within(&mut conn, Duration::from_secs(5)).unwrap();
    assert_eq!(status, 413);
    assert_eq!(error_of(&resp).0, "payload_too_large");
    // Chunked: refused once the count passes it.
    let mut conn = upload(&gw, &key, CHAT, &big, true);
    let (status, _, resp) = response_within(&mut conn, Duration::from_secs(5)).unwrap();
    assert_eq!(status, 413);
    assert_eq!(error_of(&resp).0, "payload_too_large");
    // Exactly the limit passes; a service that does not read bodies takes the big one.
    let mut conn = upload(&gw, &key, CHAT, &chat_body(MAX_HELD), true);
    assert_eq!(
        response_within(&mut conn, Duration::from_secs(10))
            .unwrap()
            .0,
        200
    );
    let mut conn = upload(&gw, &key, PLAIN, &big, true);
    assert_eq!(
        response_within(&mut conn, Duration::from_secs(10))
            .unwrap()
            .0,
        200
    );
    assert_eq!(up.last().body.len(), big.len());
}

#[test]
fn a_held_body_must_arrive_within_the_body_timeout_even_trickled() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up, &[("buffered_body_timeout_seconds", 2)]);
    // Trickled, one byte every 200 ms: each read is quick, the whole is too slow.
    let start = Instant::now();
    let mut conn = upload(&gw, &key, CHAT, b"{\"messages\":", false);
    let answer = loop {
        assert!(start.elapsed() < Duration::from_secs(10), "never answered");
        let _ = conn.write_all(b"1\r\n \r\n");
        if let Some(answer) = response_within(&mut conn, Duration::from_millis(200)) {
            break answer;
        }
    };
    let waited = start.elapsed();
    assert_eq!(answer.0, 408, "{}", String::from_utf8_lossy(&answer.2));
    assert_eq!(error_of(&answer.2).0, "request_timeout");
    assert!(
        (Duration::from_millis(1800)..Duration::from_secs(5)).contains(&waited),
        "answered after {waited:?}"
    );
    // A small body read ahead (under 64 KiB, declared) is held to the same time.
    let start = Instant::now();
    let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    conn.write_all(head(&key, CHAT, "Content-Length: 100").as_bytes())
        .unwrap();
    conn.write_all(b"{\"messages\":").unwrap();
    let answer = response_within(&mut conn, Duration::from_secs(10)).unwrap();
    assert_eq!(answer.0, 408);
    assert!(start.elapsed() < Duration::from_secs(5));
    // The control service still waits on the per-read timeout of the proxy, not this one.
    let mut conn = upload(&gw, &key, PLAIN, b"{}", false);
    assert!(response_within(&mut conn, Duration::from_secs(3)).is_none());
}

#[test]
fn a_budget_below_one_body_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stderr) = testkit::check_config(
        dir.path(),
        "[server]\nmax_buffered_body_bytes = 4194304\nbuffered_bodies_max_bytes = 1048576\n\
         buffered_body_timeout_seconds = 0\n\
         [access_log]\ndestination = \"off\"\n\
         [services.a]\nupstream = \"http://127.0.0.1:1\"\nscope = \"a\"\n",
    );
    assert!(!ok);
    for key in [
        "server.buffered_bodies_max_bytes",
        "server.buffered_body_timeout_seconds",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("c.toml") && l.contains(key)),
            "{key} not reported:\n{stderr}"
        );
    }
}

/// One caller opening upload after upload (heads that declare large bodies, then silence)
/// holds at most `buffered_bytes_per_caller`, and only what arrived: another caller's
/// requests still succeed.
#[test]
fn one_callers_held_uploads_cannot_take_another_callers_room() {
    let up = Upstream::start();
    const MIB: usize = 1 << 20;
    let gw = Gateway::builder()
        .service(Service::new("chat", up.url("/oa/chat")).openai())
        .max_body(8 * MIB as u64)
        .server("max_buffered_body_bytes", 2 * MIB)
        .server("buffered_bodies_max_bytes", 16 * MIB)
        .server("buffered_bytes_per_caller", 2 * MIB)
        .start();
    let (flooder, _) = gw.create_key("chat", &[]);
    let (other, _) = gw.create_key("chat", &[]);
    // Twenty heads declaring 2 MiB each and one byte: 40 MiB declared, 20 × 64 KiB held.
    let declared = format!("Content-Length: {}", 2 * MIB - 1024);
    let flood: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
            conn.write_all(head(&flooder, CHAT, &declared).as_bytes())
                .unwrap();
            conn.write_all(b"{").unwrap();
            conn
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // The other caller's large body fits: the flood declared 40 MiB but holds 1.25 MiB.
    let mut conn = upload(&gw, &other, CHAT, &chat_body(MIB + MIB / 2), true);
    let answer = response_within(&mut conn, Duration::from_secs(10)).expect("an answer");
    assert_eq!(answer.0, 200, "{}", String::from_utf8_lossy(&answer.2));
    // The flooder's own large body does not: its share is taken by its own uploads.
    let mut conn = upload(&gw, &flooder, CHAT, &chat_body(MIB + MIB / 2), true);
    let answer = response_within(&mut conn, Duration::from_secs(10)).expect("an answer");
    assert_eq!(answer.0, 503, "{}", String::from_utf8_lossy(&answer.2));
    let body: Value = serde_json::from_slice(&answer.2).unwrap();
    assert_eq!(body["error"], "overloaded");
    assert!(header(&answer.1, "retry-after").is_some());
    drop(flood);
}
