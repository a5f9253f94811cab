//! Connection admission on every listener, against the real binary over loopback TCP: a
//! request head must arrive whole within `header_timeout_seconds`; over
//! `max_connections_per_client` or `max_connections` a connection is closed at once and
//! counted, other clients (127.0.0.2, 127.0.0.3) are still served, and a closed connection
//! gives its place back; after a graceful upgrade the new process counts its own.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use testkit::{
    connect_from, free_port, header, pid_alive, read_response, try_raw, Gateway, Service, Upstream,
};

const ONE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const TWO: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const THREE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n";

fn connect(from: Ipv4Addr, port: u16) -> TcpStream {
    let s = connect_from(from, SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A kept-alive `/healthz` on `s`: its status, or `None` when the gateway closed the
/// connection without an answer.
fn healthz(s: &mut TcpStream) -> Option<u16> {
    s.write_all(HEALTHZ).ok()?;
    read_response(s).ok().flatten().map(|r| r.0)
}

/// A connection from `from` that the gateway has answered once and keeps alive.
fn held(from: Ipv4Addr, port: u16) -> TcpStream {
    let mut s = connect(from, port);
    assert_eq!(healthz(&mut s), Some(200), "a connection from {from}");
    s
}

/// How long after being connected the gateway closed `s` without sending a byte; `None` if
/// it kept it open for 3 s or answered.
fn closed_after(s: &mut TcpStream, since: Instant) -> Option<Duration> {
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => Some(since.elapsed()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(since.elapsed()),
        _ => None,
    }
}

/// Asserts that a new connection from `from` is closed at once, before it sends anything.
fn refused_at_once(from: Ipv4Addr, port: u16) {
    let start = Instant::now();
    let mut s = connect(from, port);
    let closed = closed_after(&mut s, start);
    assert!(
        closed.is_some_and(|t| t < Duration::from_millis(500)),
        "a connection from {from} over the limit was not closed at once: {closed:?}"
    );
}

/// Sends `head` a byte every `gap`. `Ok`: how long after the first byte the gateway closed the
/// connection; `Err`: the status it answered with instead.
fn trickle(port: u16, head: &[u8], gap: Duration) -> Result<Duration, u16> {
    let mut s = connect(ONE, port);
    trickle_on(&mut s, head, gap)
}

fn trickle_on(s: &mut TcpStream, head: &[u8], gap: Duration) -> Result<Duration, u16> {
    let start = Instant::now();
    for byte in head {
        if s.write_all(&[*byte]).is_err() {
            return Ok(start.elapsed());
        }
        s.set_read_timeout(Some(gap)).unwrap();
        let mut first = [0u8; 1];
        match s.read(&mut first) {
            Ok(0) => return Ok(start.elapsed()),
            Ok(_) => return Err(answer(s, first[0])),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(start.elapsed()),
            Err(_) => {} // nothing yet: send the next byte
        }
    }
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut first = [0u8; 1];
    match s.read(&mut first) {
        Ok(1) => Err(answer(s, first[0])),
        _ => Ok(start.elapsed()),
    }
}

/// The status of a response whose first byte was `first`.
fn answer(s: &mut TcpStream, first: u8) -> u16 {
    let mut rest = [0u8; 11];
    s.read_exact(&mut rest).unwrap();
    let line = [&[first][..], &rest].concat();
    String::from_utf8_lossy(&line[9..12]).parse().unwrap()
}

/// `/metrics` scraped from `from`; `None` when the connection was refused.
fn scrape(gw: &Gateway, from: Ipv4Addr) -> Option<String> {
    let mut s = connect(from, gw.metrics_port);
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        .ok()?;
    let (status, _, body) = read_response(&mut s).ok()??;
    assert_eq!(status, 200);
    // Read on to the close: the scrape's own place is free again when this returns.
    let _ = s.read_to_end(&mut Vec::new());
    Some(String::from_utf8(body).unwrap())
}

/// `portcullis_connections_refused_total{listener, reason}`, scraped from `from`.
fn refused(gw: &Gateway, from: Ipv4Addr, listener: &str, reason: &str) -> u64 {
    let line = format!(
        "portcullis_connections_refused_total{{listener=\"{listener}\",reason=\"{reason}\"}} "
    );
    value(
        &scrape(gw, from).expect("the metrics listener refused the scrape"),
        &line,
    )
}

/// A metric's value in a scrape (0 when absent).
fn value(metrics: &str, line_start: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Waits until the gateway counts `n` open connections besides the scrape's own: connections
/// a test (or the test kit's readiness probe) closed may take a moment to give places back.
fn settle(gw: &Gateway, from: Ipv4Addr, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let open = scrape(gw, from).map(|m| value(&m, "portcullis_connections_open "));
        if open == Some(n + 1) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "open connections: {open:?}, not {n}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_request_head_trickled_past_header_timeout_is_cut_off_on_the_data_plane_key_api_and_metrics() {
    let up = Upstream::start();
    let admin = free_port();
    // The key API needs an issuer; an unreachable one does not stop it, nor the head timer.
    let extra = format!(
        "[auth.jwt]\nissuer = \"http://127.0.0.1:{}\"\naudience = \"portcullis\"\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n",
        free_port()
    );
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .server("header_timeout_seconds", 1)
        .extra(&extra)
        .start();
    let deadline = Instant::now() + Duration::from_secs(10);
    while try_raw(
        admin,
        b"GET /openapi.json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .map(|r| r.0)
    .ok()
        != Some(200)
    {
        assert!(Instant::now() < deadline, "no key API:\n{}", gw.log());
        thread::sleep(Duration::from_millis(50));
    }

    // A byte every 250 ms: whole, these heads would take 9 s.
    let gap = Duration::from_millis(250);
    for (port, head) in [
        (gw.port, HEALTHZ),
        (admin, &b"GET /openapi.json HTTP/1.1\r\nHost: a\r\n\r\n"[..]),
        (
            gw.metrics_port,
            &b"GET /metrics HTTP/1.1\r\nHost: m\r\n\r\n"[..],
        ),
    ] {
        let cut = trickle(port, head, gap);
        assert!(
            cut.is_ok_and(|t| t >= Duration::from_millis(900) && t < Duration::from_millis(2500)),
            "port {port}: {cut:?}"
        );
    }
    // A connection that sends nothing at all.
    let start = Instant::now();
    let silent = closed_after(&mut connect(ONE, gw.port), start);
    assert!(
        silent.is_some_and(|t| t < Duration::from_millis(2500)),
        "{silent:?}"
    );

    // On a kept-alive connection: idling between requests is not a slow head, and a body
    // slower than the head timeout is not cut; a later head is timed from its first byte.
    let (key, _) = gw.create_key("infer", &[]);
    let mut s = held(ONE, gw.port);
    thread::sleep(Duration::from_millis(1500));
    let body = b"0123456789".repeat(3);
    let post = format!(
        "POST /v1/infer/echo HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(post.as_bytes()).unwrap();
    for piece in body.chunks(5) {
        thread::sleep(Duration::from_millis(400));
        s.write_all(piece).unwrap();
    }
    let (status, _, _) = read_response(&mut s).unwrap().expect("an answer");
    assert_eq!(status, 200, "a body sent over 2.4 s");
    thread::sleep(Duration::from_millis(1500));
    let cut = trickle_on(&mut s, HEALTHZ, gap);
    assert!(
        cut.is_ok_and(|t| t >= Duration::from_millis(900) && t < Duration::from_millis(2500)),
        "a kept-alive connection's second head: {cut:?}"
    );

    assert_eq!(refused(&gw, ONE, "data", "header_timeout"), 3);
    assert_eq!(refused(&gw, ONE, "admin", "header_timeout"), 1);
    assert_eq!(refused(&gw, ONE, "metrics", "header_timeout"), 1);
    // Nothing else was refused, and the gateway still serves.
    assert_eq!(refused(&gw, ONE, "data", "per_client"), 0);
    assert_eq!(healthz(&mut connect(ONE, gw.port)), Some(200));
}

#[test]
fn over_max_connections_per_client_a_connection_is_closed_at_once_while_other_clients_are_served() {
    let gw = Gateway::builder()
        .service(Service::new(
            "infer",
            format!("http://127.0.0.1:{}", free_port()),
        ))
        .server("max_connections_per_client", 3)
        .start();
    settle(&gw, TWO, 0);
    let mut mine: Vec<TcpStream> = (0..3).map(|_| held(ONE, gw.port)).collect();
    refused_at_once(ONE, gw.port);
    // Counted over every listener: the metrics listener refuses this client too.
    refused_at_once(ONE, gw.metrics_port);
    // Another client is served, on both listeners.
    let _theirs = held(TWO, gw.port);
    settle(&gw, TWO, 4);
    assert_eq!(refused(&gw, TWO, "data", "per_client"), 1);
    assert_eq!(refused(&gw, TWO, "metrics", "per_client"), 1);
    assert_eq!(refused(&gw, TWO, "data", "total"), 0);
    // The client's connections still work, and one that closes gives its place back.
    assert_eq!(healthz(&mut mine[0]), Some(200));
    mine.pop();
    settle(&gw, TWO, 3);
    mine.push(held(ONE, gw.port));
    refused_at_once(ONE, gw.port);
    assert_eq!(refused(&gw, TWO, "data", "per_client"), 2);
}

#[test]
fn over_max_connections_a_connection_from_any_client_is_closed_at_once_until_one_ends() {
    let gw = Gateway::builder()
        .service(Service::new(
            "infer",
            format!("http://127.0.0.1:{}", free_port()),
        ))
        .server("max_connections", 4)
        .start();
    settle(&gw, THREE, 0);
    let mut open = vec![
        held(ONE, gw.port),
        held(ONE, gw.port),
        held(TWO, gw.port),
        held(TWO, gw.port),
    ];
    refused_at_once(THREE, gw.port);
    refused_at_once(THREE, gw.metrics_port);
    drop(open.pop());
    // The scrape itself takes the free place, then gives it back (scrapes made before the
    // place came back were refused, and counted, too).
    settle(&gw, THREE, 3);
    assert_eq!(refused(&gw, THREE, "data", "total"), 1);
    assert!(refused(&gw, THREE, "metrics", "total") >= 1);
    assert_eq!(refused(&gw, THREE, "data", "per_client"), 0);
    open.push(held(THREE, gw.port));
    refused_at_once(ONE, gw.port);
}

/// A TLS client (Python's ssl) sending a head a byte every 250 ms: `closed S` or `answered …`.
const TLS_TRICKLE: &str = r#"
import socket, ssl, sys, time
ctx = ssl.create_default_context(cafile=sys.argv[2])
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1]))), server_hostname="127.0.0.1")
s.settimeout(0.25)
start = time.time()
for b in b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n":
    try:
        s.send(bytes([b]))
        got = s.recv(64)
        print("answered %r" % got[:12] if got else "closed %.2f" % (time.time() - start))
        sys.exit(0)
    except socket.timeout:
        continue
    except OSError:
        print("closed %.2f" % (time.time() - start))
        sys.exit(0)
print("answered nothing")
"#;

#[test]
fn a_request_head_trickled_past_header_timeout_is_cut_off_on_a_tls_listener() {
    let certs = tempfile::tempdir().unwrap();
    crate::tls::make_certs(certs.path(), "IP:127.0.0.1");
    let tls_port = free_port();
    let tls = format!(
        "[server.tls]\nlisten = [\"127.0.0.1:{tls_port}\"]\n\
         cert_file = \"{0}/leaf.pem\"\nkey_file = \"{0}/leaf.key\"\n",
        certs.path().display()
    );
    let gw = Gateway::builder()
        .service(Service::new(
            "infer",
            format!("http://127.0.0.1:{}", free_port()),
        ))
        .server("header_timeout_seconds", 1)
        .extra(&tls)
        .start();
    let out = std::process::Command::new("python3")
        .args(["-c", TLS_TRICKLE, &tls_port.to_string()])
        .arg(certs.path().join("ca.pem"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let closed: Option<f64> = said
        .trim()
        .strip_prefix("closed ")
        .and_then(|t| t.parse().ok());
    assert!(
        closed.is_some_and(|t| (0.9..2.5).contains(&t)),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(refused(&gw, ONE, "data", "header_timeout"), 1);
}

/// An SSE stream from `from` that runs for `n` × 100 ms, read to its end on a thread.
fn stream_from(from: Ipv4Addr, port: u16, key: &str, n: u32) -> thread::JoinHandle<()> {
    let mut s = connect(from, port);
    let request = format!(
        "GET /v1/infer/v1/chat/sse?n={n}&gap_ms=100 HTTP/1.1\r\nHost: gw\r\n\
         Authorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut first = [0u8; 12];
    s.read_exact(&mut first).unwrap();
    assert_eq!(&first[9..12], b"200");
    thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    })
}

#[test]
fn after_a_graceful_upgrade_the_new_process_counts_its_own_connections() {
    let up = Upstream::start();
    let mut gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .server("max_connections_per_client", 2)
        .grace_period(60)
        .start();
    let (key, _) = gw.create_key("infer", &[]);
    // Two streams the old process must finish (13 s) hold this client's two places there.
    let streams = [
        stream_from(ONE, gw.port, &key, 130),
        stream_from(ONE, gw.port, &key, 130),
    ];
    refused_at_once(ONE, gw.port);
    let new = gw.spawn_upgrade(&gw.config);
    gw.signal("QUIT");
    // Pingora's old process accepts for 5 s more; after that every connection is the new one's.
    thread::sleep(Duration::from_secs(6));
    assert!(
        pid_alive(gw.pid()),
        "the old process still drains its streams"
    );
    let _mine = [held(ONE, gw.port), held(ONE, gw.port)];
    refused_at_once(ONE, gw.port);
    for s in streams {
        s.join().unwrap();
    }
    assert!(
        gw.wait_exit(Duration::from_secs(20)).is_some(),
        "the old process drained"
    );
    assert!(new.log().contains("Bootstrap done"), "{}", new.log());
}

#[test]
fn bad_limits_are_refused_at_start_up_naming_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, err) = testkit::check_config(
        dir.path(),
        "[server]\nheader_timeout_seconds = 0\nmax_connections = 8\nmax_connections_per_client = 9\n\
         [services.infer]\nupstream = \"http://127.0.0.1:1\"\nscope = \"infer\"\n",
    );
    assert!(!ok);
    let file = dir.path().join("c.toml").display().to_string();
    for problem in [
        "server.header_timeout_seconds: must be from 1 to 3600",
        "server.max_connections_per_client: 9 is more than server.max_connections (8)",
    ] {
        assert!(err.contains(&format!("{file}: {problem}")), "{err}");
    }
}

/// Sends `request` on `s` and then a `/healthz` on the same connection, as a client that
/// reuses its connections does; whatever the first answer, the second must be consistent with
/// it: `Connection: close` and then the connection closed, or kept alive and answered.
fn answer_then_reuse(port: u16, request: &[u8]) -> u16 {
    let mut s = connect(ONE, port);
    s.write_all(request).unwrap();
    let (status, headers, _) = read_response(&mut s).unwrap().expect("an answer");
    let connection = header(&headers, "connection")
        .unwrap_or("")
        .to_ascii_lowercase();
    let next = healthz(&mut s);
    if connection == "close" {
        assert_eq!(
            next, None,
            "{status} said close but answered the next request"
        );
    } else {
        assert_eq!(
            next,
            Some(200),
            "{status} said {connection:?}: the next request on the connection was not answered"
        );
    }
    status
}

#[test]
fn a_reused_connection_is_never_reset_after_an_answer_the_gateway_wrote() {
    let up = Upstream::start();
    let dead = free_port();
    let gw = Gateway::builder()
        .service(Service::new("dead", format!("http://127.0.0.1:{dead}")))
        .service(Service::new("chat", up.url("/oa")).openai())
        .max_body(1 << 20)
        .server("max_buffered_body_bytes", 64 * 1024)
        .server("buffered_bodies_max_bytes", 64 * 1024)
        .start();
    let (key, _) = gw.create_key("dead,chat", &[]);
    let get = |path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\r\n")
    };
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    // 502: every replica refuses, with and without a request body.
    assert_eq!(
        answer_then_reuse(gw.port, get("/v1/dead/x").as_bytes()),
        502
    );
    assert_eq!(
        answer_then_reuse(gw.port, post("/v1/dead/x", chat).as_bytes()),
        502
    );
    // 4xx the gateway writes: unknown service, malformed body, method, path shape.
    assert_eq!(
        answer_then_reuse(gw.port, get("/v1/nope/x").as_bytes()),
        404
    );
    let bad = post("/v1/chat/v1/chat/completions", r#"{"messages": 7}"#);
    assert_eq!(answer_then_reuse(gw.port, bad.as_bytes()), 400);
    let trace =
        format!("TRACE /v1/chat/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\r\n");
    assert_eq!(answer_then_reuse(gw.port, trace.as_bytes()), 405);
    assert_eq!(
        answer_then_reuse(gw.port, get("/v1/chat/a//b").as_bytes()),
        400
    );
    // A proxied answer keeps the connection, as before.
    assert_eq!(
        answer_then_reuse(
            gw.port,
            post("/v1/chat/v1/chat/completions", chat).as_bytes()
        ),
        200
    );
    // 503: an unfinished chunked upload holds (nearly) all of buffered_bodies_max_bytes.
    let mut holder = connect(ONE, gw.port);
    let held = format!(
        "POST /v1/chat/v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
        60 * 1024
    );
    holder.write_all(held.as_bytes()).unwrap();
    holder.write_all(&[b' '; 60 * 1024]).unwrap();
    holder.write_all(b"\r\n").unwrap();
    thread::sleep(Duration::from_millis(300));
    let status = answer_then_reuse(
        gw.port,
        post("/v1/chat/v1/chat/completions", &format!("{chat:<8000}")).as_bytes(),
    );
    assert_eq!(status, 503);
    drop(holder);
}
