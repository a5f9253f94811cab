//! The access log, against the real binary: one JSON line per request with no secret in it,
//! reopened on SIGHUP, rotated by size.

use std::collections::HashMap;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use testkit::Upstream;
use testkit::{Gateway, Service};

/// Access-log lines from `path`, waiting until `want` request ids are all there.
fn access_lines(path: &Path, want: &[&str]) -> HashMap<String, serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: HashMap<String, serde_json::Value> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
            })
            .map(|v| (v["request_id"].as_str().unwrap().to_string(), v))
            .collect();
        if want.iter().all(|id| lines.contains_key(*id)) {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "missing lines in {}:\n{text}",
            path.display()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_access_log_has_a_line_per_request_and_no_secret() {
    let up = Upstream::start();
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .service(
            Service::new("chatx", up.url(""))
                .upstream_header("authorization", "Bearer ${TEST_UPSTREAM_SECRET}"),
        )
        .env("TEST_UPSTREAM_SECRET", "upstream-secret-77")
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n")
        .start();
    let (key, key_id) = gw.create_key("infer,chatx", &[]);
    let body = "BODYMARKER-".repeat(20);
    let send = |req: String| gw.raw(req.as_bytes()).0;
    let post = format!(
        "POST /v1/infer/v1/chat/completions?api_key=querysecret HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\
         X-Request-Id: log-1\r\ncontent-length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, _, answer) = gw.raw(post.as_bytes());
    assert_eq!(status, 200);
    let wrong = format!("ak_{key_id}.{}", "A".repeat(43));
    let req = |path: &str, id: &str, auth: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: gw\r\n{auth}X-Request-Id: {id}\r\nConnection: close\r\n\r\n")
    };
    assert_eq!(
        send(req(
            "/v1/infer/x",
            "log-2",
            &format!("Authorization: Bearer {wrong}\r\n")
        )),
        401
    );
    assert_eq!(send(req("/healthz", "log-3", "")), 200);
    assert_eq!(send(req("/nowhere?x=1", "log-4", "")), 404);
    assert_eq!(
        send(req(
            "/v1/chatx/y",
            "log-5",
            &format!("Authorization: Bearer {key}\r\n")
        )),
        200
    );
    assert_eq!(send(req("/v1/infer/x", "log-6", "")), 401);

    let path = gw.dir.path().join("access.log");
    let lines = access_lines(
        &path,
        &["log-1", "log-2", "log-3", "log-4", "log-5", "log-6"],
    );
    let fields = |id: &str| &lines[id];

    let ok = fields("log-1");
    let mut keys: Vec<&str> = ok.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "affinity",
            "auth_failure",
            "bytes_in",
            "bytes_out",
            "cached_tokens",
            "client",
            "completion_tokens",
            "duration_ms",
            "method",
            "model",
            "owner",
            "path",
            "principal_id",
            "principal_kind",
            "prompt_tokens",
            "reasoning_tokens",
            "replica",
            "request_id",
            "service",
            "status",
            "time",
            "upstream_ttfb_ms",
            "usage_estimated"
        ]
    );
    assert_eq!(ok["method"], "POST");
    assert_eq!(ok["service"], "infer");
    assert_eq!(ok["path"], "/v1/infer/v1/chat/completions");
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["bytes_in"], body.len());
    assert_eq!(ok["bytes_out"], answer.len());
    assert_eq!(ok["principal_kind"], "api_key");
    assert_eq!(ok["principal_id"], key_id.as_str());
    assert_eq!(ok["client"], "127.0.0.1");
    assert_eq!(ok["replica"], format!("127.0.0.1:{}", up.port));
    assert!(ok["auth_failure"].is_null());
    assert_eq!(ok["usage_estimated"], false);
    assert!(ok["upstream_ttfb_ms"].as_f64().unwrap() <= ok["duration_ms"].as_f64().unwrap());
    let time = ok["time"].as_str().unwrap();
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[19] == b'.',
        "{time}"
    );

    let unauthorized = fields("log-2");
    assert_eq!(
        (
            unauthorized["status"].as_u64(),
            unauthorized["service"].as_str()
        ),
        (Some(401), Some("_unknown"))
    );
    assert_eq!(unauthorized["auth_failure"], "api_key");
    assert!(unauthorized["principal_id"].is_null() && unauthorized["upstream_ttfb_ms"].is_null());
    assert_eq!(fields("log-3")["service"], "_local");
    assert_eq!(fields("log-4")["path"], "/nowhere");
    assert_eq!(fields("log-4")["status"], 404);
    assert_eq!(fields("log-5")["service"], "chatx");
    assert_eq!(fields("log-6")["auth_failure"], "missing");

    let text = std::fs::read_to_string(&path).unwrap();
    for secret in [
        &key[20..],
        &wrong[20..],
        "querysecret",
        "BODYMARKER",
        "upstream-secret-77",
        "x=1",
    ] {
        assert!(!text.contains(secret), "the access log holds {secret:?}");
    }
    assert!(gw
        .metrics()
        .contains("portcullis_access_log_dropped_total 0"));
}

#[test]
fn the_access_log_file_is_reopened_on_sighup_and_rotated_by_size() {
    let up = Upstream::start();
    let mut gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n")
        .start();
    let dir = gw.dir.path().to_path_buf();
    let healthz = |id: &str| {
        let req = format!(
            "GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Request-Id: {id}\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(gw.raw(req.as_bytes()).0, 200);
    };
    healthz("before");
    access_lines(&dir.join("access.log"), &["before"]);
    // What logrotate does: move the file away, then SIGHUP.
    std::fs::rename(dir.join("access.log"), dir.join("access.log.rotated")).unwrap();
    healthz("moved");
    access_lines(&dir.join("access.log.rotated"), &["moved"]);
    gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dir.join("access.log").exists() {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reopen the access log"
        );
        thread::sleep(Duration::from_millis(50));
    }
    healthz("after");
    let fresh = access_lines(&dir.join("access.log"), &["after"]);
    assert_eq!(fresh.len(), 1);
    assert!(
        gw.wait_exit(Duration::from_millis(200)).is_none(),
        "SIGHUP stopped the gateway"
    );
    drop(gw);

    // By size: three files of at most 1000 bytes, the newest lines in access.log.
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .extra(
            "[access_log]\ndestination = \"{dir}/access.log\"\nmax_bytes = 1000\nmax_files = 2\n",
        )
        .start();
    let dir = gw.dir.path();
    for i in 0..15 {
        let req = format!(
            "GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Request-Id: r{i}\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(gw.raw(req.as_bytes()).0, 200);
    }
    access_lines(&dir.join("access.log"), &["r14"]);
    for name in ["access.log", "access.log.1", "access.log.2"] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        assert!(
            !text.is_empty() && text.len() <= 1000,
            "{name}: {} bytes",
            text.len()
        );
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }
    assert!(!dir.join("access.log.3").exists());
}

#[test]
fn the_logged_model_is_cut_to_256_bytes_on_a_character_boundary() {
    let up = Upstream::start();
    let gw = Gateway::builder()
        .service(Service::new("chat", up.url("/oa/chat")).openai())
        .max_body(4 << 20)
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n")
        .start();
    let (key, _) = gw.create_key("chat", &[]);
    // 1 MiB of ASCII, then a name of 3-byte characters: 256 is not a multiple of 3.
    for (id, model) in [
        ("m-ascii", "m".repeat(1 << 20)),
        ("m-euro", "€".repeat(1000)),
    ] {
        let body =
            format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        let req = format!(
            "POST /v1/chat/v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\
             X-Request-Id: {id}\r\ncontent-length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(gw.raw(req.as_bytes()).0, 200);
        // The upstream still gets the name as sent: only the log line is cut.
        assert_eq!(up.last().body, body.as_bytes());
    }
    let path = gw.dir.path().join("access.log");
    let lines = access_lines(&path, &["m-ascii", "m-euro"]);
    assert_eq!(lines["m-ascii"]["model"], "m".repeat(256));
    assert_eq!(lines["m-euro"]["model"], "€".repeat(85));
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 8 * 1024, "the access log holds {size} bytes");
}
