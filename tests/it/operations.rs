//! Operations at the edge, against the real binary: graceful upgrade (`-u` + SIGQUIT),
//! SIGTERM drain, SIGINT, daemon mode and `-t`. The access log is in `access_log.rs`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use testkit::Upstream;
use testkit::{header, pid_alive, signal_pid, Gateway, Service};

fn get(path: &str, key: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Requests sent until `finish`: one thread on a fresh connection per request, one on a single
/// kept-alive connection.
struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Stats>>,
}

#[derive(Default, Debug)]
struct Stats {
    ok: usize,
    failed: Vec<String>,
    /// A kept-alive connection closed before a byte of the response: RFC 9112 §9.3.1 lets a
    /// client resend an idempotent request then, and every HTTP client library does.
    stale_keepalive_retries: usize,
}

impl Traffic {
    fn start(port: u16, key: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let fresh = {
            let (stop, request) = (stop.clone(), get("/v1/infer/v1/models", key));
            thread::spawn(move || {
                let mut stats = Stats::default();
                while !stop.load(Ordering::Relaxed) {
                    match testkit::try_raw(port, &request) {
                        Ok((200, _, _)) => stats.ok += 1,
                        Ok((status, _, body)) => stats.failed.push(format!(
                            "fresh: {status} {}",
                            String::from_utf8_lossy(&body)
                        )),
                        Err(e) => stats.failed.push(format!("fresh: {e}")),
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                stats
            })
        };
        let kept = {
            let stop = stop.clone();
            let request = format!("GET /v1/infer/v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\r\n").into_bytes();
            thread::spawn(move || {
                let mut stats = Stats::default();
                let mut conn: Option<TcpStream> = None;
                while !stop.load(Ordering::Relaxed) {
                    let reused = conn.is_some();
                    let mut s = match conn.take() {
                        Some(s) => s,
                        None => match TcpStream::connect(("127.0.0.1", port)) {
                            Ok(s) => s,
                            Err(e) => {
                                stats.failed.push(format!("keep-alive connect: {e}"));
                                continue;
                            }
                        },
                    };
                    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
                    let response = s
                        .write_all(&request)
                        .and_then(|_| testkit::read_response(&mut s));
                    match response {
                        Ok(Some((200, headers, _))) => {
                            stats.ok += 1;
                            if header(&headers, "connection")
                                .is_none_or(|v| !v.eq_ignore_ascii_case("close"))
                            {
                                conn = Some(s);
                            }
                        }
                        Ok(Some((status, _, body))) => stats.failed.push(format!(
                            "keep-alive: {status} {}",
                            String::from_utf8_lossy(&body)
                        )),
                        Ok(None) if reused => stats.stale_keepalive_retries += 1,
                        Ok(None) => stats.failed.push(
                            "keep-alive: closed without a response on a new connection".into(),
                        ),
                        Err(e) if reused && e.kind() == std::io::ErrorKind::BrokenPipe => {
                            stats.stale_keepalive_retries += 1
                        }
                        Err(e) => stats.failed.push(format!("keep-alive: {e}")),
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                stats
            })
        };
        Traffic {
            stop,
            threads: vec![fresh, kept],
        }
    }

    fn finish(self) -> Stats {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Stats::default();
        for t in self.threads {
            let s = t.join().unwrap();
            all.ok += s.ok;
            all.failed.extend(s.failed);
            all.stale_keepalive_retries += s.stale_keepalive_retries;
        }
        all
    }
}

/// Opens an SSE stream of `n` events `gap_ms` apart on a raw connection. Returns once the first
/// event has arrived; the handle yields everything received until the connection closed.
fn open_stream(port: u16, key: &str, n: u32, gap_ms: u32) -> JoinHandle<String> {
    let request = get(&format!("/v1/infer/v1/chat/sse?n={n}&gap_ms={gap_ms}"), key);
    let (started_tx, started_rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(&request).unwrap();
        let mut received = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut started = Some(started_tx);
        while let Ok(n) = s.read(&mut chunk) {
            if n == 0 {
                break;
            }
            received.extend_from_slice(&chunk[..n]);
            if started.is_some() && received.windows(6).any(|w| w == b"data: ") {
                let _ = started.take().unwrap().send(());
            }
        }
        String::from_utf8_lossy(&received).into_owned()
    });
    started_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the stream did not start");
    handle
}

fn complete(stream: &str, n: u32) -> bool {
    stream.contains(&format!("tok{} ", n - 1))
        && stream.contains("data: [DONE]")
        && stream.ends_with("0\r\n\r\n")
}

/// One `infer` service in front of `up`, with a grace period far longer than any test waits:
/// an exit before it proves the drain ended on its own.
fn draining_gateway(up: &Upstream) -> Gateway {
    Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .grace_period(60)
        .start()
}

#[test]
fn an_upgrade_hands_over_the_sockets_without_failing_a_request_and_the_old_process_drains() {
    let up = Upstream::start();
    let mut gw = draining_gateway(&up);
    let (key, _) = gw.create_key("infer", &[]);
    let traffic = Traffic::start(gw.port, &key);
    // ~10 s: it outlives Pingora's fixed 5 s hand-over window, so the old process must drain it.
    let stream = open_stream(gw.port, &key, 100, 100);
    let mut new = gw.spawn_upgrade(&gw.config);
    let quit = Instant::now();
    gw.signal("QUIT");

    let status = gw
        .wait_exit(Duration::from_secs(40))
        .unwrap_or_else(|| panic!("the old process is still running:\n{}", gw.log()));
    let old_exit = quit.elapsed();
    assert!(status.success(), "old process: {status}");
    let received = stream.join().unwrap();
    assert!(complete(&received, 100), "the stream was cut: {received:?}");
    // Exited when its stream ended, not at the end of the 60 s grace period.
    assert!(
        old_exit < Duration::from_secs(30),
        "old process took {old_exit:?}"
    );

    // The new process serves on the same address; keep the traffic going a little on it.
    thread::sleep(Duration::from_millis(500));
    assert_eq!(gw.raw(&get("/v1/infer/v1/models", &key)).0, 200);
    let stats = traffic.finish();
    eprintln!("old process exited {old_exit:?} after SIGQUIT; traffic: {stats:?}");
    assert!(
        stats.failed.is_empty(),
        "failed requests: {:?}",
        stats.failed
    );
    assert!(
        stats.ok > 100,
        "too little traffic to mean anything: {stats:?}"
    );
    assert!(
        new.wait_exit(Duration::ZERO).is_none(),
        "the new process died:\n{}",
        new.log()
    );
    assert!(new.log().contains("Bootstrap done"), "{}", new.log());
}

#[test]
fn an_upgrade_applies_a_changed_config() {
    let up = Upstream::start();
    let mut gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .start();
    let (key, _) = gw.create_key("infer,embed", &[]);
    assert_eq!(gw.raw(&get("/v1/embed/v1/models", &key)).0, 404);

    let changed = gw.dir.path().join("changed.toml");
    let text = std::fs::read_to_string(&gw.config).unwrap()
        + &format!(
            "[services.embed]\nupstream = \"{}\"\nscope = \"embed\"\n",
            up.url("/emb")
        );
    std::fs::write(&changed, text).unwrap();
    let mut new = gw.spawn_upgrade(&changed);
    gw.signal("QUIT");
    assert!(
        gw.wait_exit(Duration::from_secs(30)).is_some(),
        "the old process is still running"
    );

    let (status, _, _) = gw.raw(&get("/v1/embed/v1/models", &key));
    assert_eq!(status, 200, "new log:\n{}", new.log());
    assert_eq!(up.last().target, "/emb/v1/models");
    assert!(new.wait_exit(Duration::ZERO).is_none());
}

#[test]
fn sigterm_stops_accepting_lets_a_stream_finish_then_exits() {
    let up = Upstream::start();
    let mut gw = draining_gateway(&up);
    let (key, _) = gw.create_key("infer", &[]);
    let stream = open_stream(gw.port, &key, 30, 100);
    let term = Instant::now();
    gw.signal("TERM");

    // New connections are refused once the listener closes (well before the stream ends).
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", gw.port)).is_ok() {
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        thread::sleep(Duration::from_millis(50));
    }
    let received = stream.join().unwrap();
    assert!(complete(&received, 30), "the stream was cut: {received:?}");
    let status = gw
        .wait_exit(Duration::from_secs(30))
        .expect("still running after the stream ended");
    eprintln!(
        "exited {:?} after SIGTERM with a 3 s stream in flight",
        term.elapsed()
    );
    assert!(status.success());
}

#[test]
fn sigterm_with_nothing_in_flight_exits_promptly_and_flushes_the_access_log() {
    let up = Upstream::start();
    let mut gw = draining_gateway(&up);
    let (status, headers, _) =
        gw.raw(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 200);
    let id = header(&headers, "x-request-id").unwrap().to_string();
    let term = Instant::now();
    gw.signal("TERM");
    let status = gw
        .wait_exit(Duration::from_secs(10))
        .expect("an idle gateway slept out its grace period");
    eprintln!("idle gateway exited {:?} after SIGTERM", term.elapsed());
    assert!(status.success());
    // The default destination is stdout, which the harness sends to gateway.log.
    let line = gw
        .log()
        .lines()
        .find(|l| l.contains(&id))
        .map(str::to_string);
    let line: serde_json::Value = serde_json::from_str(&line.expect("no access-log line")).unwrap();
    assert_eq!(line["service"], "_local");
}

#[test]
fn sigint_stops_at_once_even_mid_stream() {
    let up = Upstream::start();
    let mut gw = draining_gateway(&up);
    let (key, _) = gw.create_key("infer", &[]);
    let stream = open_stream(gw.port, &key, 100, 100);
    let int = Instant::now();
    gw.signal("INT");
    assert!(
        gw.wait_exit(Duration::from_secs(5)).is_some(),
        "still running 5 s after SIGINT"
    );
    eprintln!("exited {:?} after SIGINT", int.elapsed());
    let received = stream.join().unwrap();
    assert!(!received.contains("data: [DONE]"), "the stream was not cut");
}

#[test]
fn daemon_mode_runs_in_the_background_and_writes_the_pid_file() {
    let up = Upstream::start();
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .arg("-d")
        .start();
    let pid_file = gw.dir.path().join("portcullis.pid");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    struct Kill(u32);
    impl Drop for Kill {
        fn drop(&mut self) {
            if pid_alive(self.0) {
                signal_pid(self.0, "KILL");
            }
        }
    }
    let _kill = Kill(pid);
    assert_ne!(pid, gw.pid(), "the pid file names the foreground process");
    assert!(pid_alive(pid));
    let (key, _) = gw.create_key("infer", &[]);
    assert_eq!(gw.raw(&get("/v1/infer/x", &key)).0, 200);

    signal_pid(pid, "TERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the daemon did not exit on SIGTERM"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn config_test_flag_accepts_a_good_file_and_lists_every_problem_in_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[access_log]\ndestination = \"off\"\n[services.a]\nupstream = \"http://127.0.0.1:1\"\nscope = \"a\"\n",
    )
    .unwrap();
    let out = testkit::cli(&good, &["serve", "-t"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration ok"));

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[server]\nthreads = 0\n\
         [access_log]\ndestination = \"stdout\"\nmax_bytes = 1000\n\
         [metrics]\nlisten = \"nope\"\n\
         [services.a]\nupstream = \"ftp://127.0.0.1\"\nscope = \"a\"\n\
         [services.b]\nupstream = \"http://127.0.0.1:1\"\n",
    )
    .unwrap();
    let out = testkit::cli(&bad, &["serve", "-t"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for key in [
        "server.threads",
        "access_log.max_bytes",
        "metrics.listen",
        "services.a.upstream",
        "services.b.scope",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("bad.toml") && l.contains(key)),
            "{key} not reported:\n{stderr}"
        );
    }
    // The full list, then one summary line last: what a script shows as the reason.
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("portcullis: ") && last.contains("and 4 more problem(s)"),
        "last line is not a summary: {last:?}"
    );
    // A TOML syntax error is one line in all.
    std::fs::write(&bad, "[server]\nthreads = = 2\n").unwrap();
    let out = testkit::cli(&bad, &["serve", "-t"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("bad.toml: line 2, column"), "{stderr}");
}

#[test]
fn a_health_check_faster_than_two_seconds_needs_no_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let service = "[access_log]\ndestination = \"off\"\n\
                   [services.a]\nupstream = \"http://127.0.0.1:1\"\nscope = \"a\"\n";
    // The timeout defaults to the smaller of 2 s and the interval.
    let (ok, stderr) = testkit::check_config(
        dir.path(),
        &format!("{service}health_check = {{ path = \"/health\", interval_seconds = 1 }}\n"),
    );
    assert!(ok, "{stderr}");
    // One written longer than the interval is still refused, naming the key written.
    let (ok, stderr) = testkit::check_config(
        dir.path(),
        &format!(
            "{service}health_check = {{ path = \"/health\", interval_seconds = 1, timeout_seconds = 2 }}\n"
        ),
    );
    assert!(!ok);
    assert!(
        stderr.contains("c.toml: services.a.health_check.timeout_seconds"),
        "{stderr}"
    );
}

/// The most times one log message (timestamp aside) was written.
fn most_repeated_line(log: &str) -> (usize, String) {
    let mut counts = std::collections::HashMap::<&str, usize>::new();
    for line in log.lines() {
        let message = line.split_once("] ").map_or(line, |(_, m)| m);
        *counts.entry(message).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(m, n)| (n, m.to_string()))
        .unwrap_or_default()
}

/// Signals in the middle of traffic with the upstream dying at the same moment, SIGINT and
/// SIGTERM in turn, many times: every time the process exits within its bound (a fast stop
/// within 2 s; a graceful one within grace_period + graceful_shutdown_timeout), and no line
/// is logged more than a few times a second.
#[test]
fn shutdown_under_load_with_a_dying_upstream_always_ends_in_time_without_a_log_flood() {
    const GRACE: u64 = 2;
    const GRACEFUL_TIMEOUT: u64 = 1; // the harness's graceful_shutdown_timeout_seconds
    for round in 0..12 {
        // The demo model streams its answers a fragment every 20 ms, so streams are open when
        // the upstream dies.
        let upstream = Upstream::model(
            "upstream",
            testkit::net::local_addr(),
            Duration::from_millis(20),
        );
        let mut gw = Gateway::builder()
            .service(Service::new("infer", upstream.url("")))
            .grace_period(GRACE)
            .start();
        let started = Instant::now();
        let (key, _) = gw.create_key("infer", &[]);
        let traffic = Traffic::start(gw.port, &key);
        let streams: Vec<_> = (0..4)
            .map(|_| {
                let (port, key) = (gw.port, key.clone());
                thread::spawn(move || {
                    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}"#;
                    let req = format!(
                        "POST /v1/infer/v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = testkit::try_raw(port, req.as_bytes());
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(150 + 50 * (round % 4)));
        let (signal, bound) = if round % 2 == 0 {
            ("INT", Duration::from_secs(2))
        } else {
            ("TERM", Duration::from_secs(GRACE + GRACEFUL_TIMEOUT))
        };
        // Listener closed and every connection reset at once, mid-stream included: a SIGKILL.
        upstream.kill();
        let signalled = Instant::now();
        gw.signal(signal);
        let exited = gw.wait_exit(bound + Duration::from_secs(2));
        let took = signalled.elapsed();
        let _ = traffic.finish();
        for s in streams {
            let _ = s.join();
        }
        let log = gw.log();
        assert!(
            exited.is_some(),
            "round {round}: still running {took:?} after SIG{signal}:\n{}",
            &log[log.len().saturating_sub(3000)..]
        );
        let lifetime = started.elapsed().as_secs() as usize + 1;
        let (n, line) = most_repeated_line(&log);
        assert!(
            n <= 6 * lifetime,
            "round {round}: `{line}` logged {n} times in {lifetime} s"
        );
        eprintln!(
            "round {round}: SIG{signal}, exited after {took:?}; most repeated line x{n}: {line}"
        );
    }
}
