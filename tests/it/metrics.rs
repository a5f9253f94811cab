//! The Prometheus endpoint on a real gateway: pinned names, bounded labels, the stream gauge
//! returning to zero, and the exposition format as promtool reads it.

use std::time::{Duration, Instant};

use testkit::Upstream;
use testkit::{Gateway, Service};

fn sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn wait_for(gw: &Gateway, series: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = gw.metrics();
        if sample(&m, series) == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never became {want}:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_failures_and_streams_are_counted_with_bounded_labels() {
    let up = Upstream::start();
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .start();
    let (key, _) = gw.create_key("infer", &[]);
    let secret_path = "/v1/infer/private-path-123?token=query-secret";
    tokio::task::block_in_place(|| {
        for req in [
            "GET /healthz HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n".to_string(),
            // Refused requests to /healthz are still the gateway's own: `_local`.
            "POST /healthz HTTP/1.1\r\nHost: g\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string(),
            format!(
                "GET /healthz HTTP/1.1\r\nHost: g\r\n{}Connection: close\r\n\r\n",
                "X-Filler: 1\r\n".repeat(101)
            ),
            "GET /nowhere-at-all HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n".to_string(),
            "BREW /v1/infer/x HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n".to_string(),
            format!("GET {secret_path} HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n"),
            "GET /v1/infer/x HTTP/1.1\r\nHost: g\r\nAuthorization: Basic eA==\r\nConnection: close\r\n\r\n".to_string(),
            format!("GET /v1/infer/x HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer ak_00000000000000aa.{}\r\nConnection: close\r\n\r\n", "a".repeat(43)),
            format!("GET {secret_path} HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"),
        ] {
            gw.raw(req.as_bytes());
        }
    });
    // `_local` 200 is two: the harness's readiness probe stops at its first 200, plus ours.
    let expect = [
        (
            r#"portcullis_requests_total{method="GET",service="_local",status="200"}"#,
            2.0,
        ),
        (
            r#"portcullis_requests_total{method="POST",service="_local",status="405"}"#,
            1.0,
        ),
        (
            r#"portcullis_requests_total{method="GET",service="_local",status="400"}"#,
            1.0,
        ),
        (
            r#"portcullis_requests_total{method="GET",service="_unknown",status="404"}"#,
            1.0,
        ),
        (
            r#"portcullis_requests_total{method="OTHER",service="_unknown",status="405"}"#,
            1.0,
        ),
        (
            r#"portcullis_requests_total{method="GET",service="_unknown",status="401"}"#,
            3.0,
        ),
        (
            r#"portcullis_requests_total{method="GET",service="infer",status="200"}"#,
            1.0,
        ),
        (r#"portcullis_auth_failures_total{kind="missing"}"#, 1.0),
        (r#"portcullis_auth_failures_total{kind="malformed"}"#, 1.0),
        (r#"portcullis_auth_failures_total{kind="api_key"}"#, 1.0),
        (
            r#"portcullis_upstream_ttfb_seconds_count{service="infer"}"#,
            1.0,
        ),
        (
            r#"portcullis_request_duration_seconds_count{service="infer"}"#,
            1.0,
        ),
    ];
    // Hit in the logging phase, just after the response is sent: poll, do not snapshot.
    tokio::task::block_in_place(|| {
        for (series, want) in expect {
            wait_for(&gw, series, want);
        }
    });
    let m = gw.metrics();
    for leak in [
        "private-path",
        "query-secret",
        "BREW",
        &key[3..19],
        "nowhere",
    ] {
        assert!(!m.contains(leak), "`{leak}` reached a metric label");
    }

    // A stream raises the gauge while it runs and lowers it when it ends...
    let gauge = r#"portcullis_active_streams{service="infer"}"#;
    let mut resp = gw.open_sse(&key, "/v1/infer/sse?n=3&gap_ms=300").await;
    tokio::task::block_in_place(|| wait_for(&gw, gauge, 1.0));
    while resp.chunk().await.unwrap().is_some() {}
    tokio::task::block_in_place(|| wait_for(&gw, gauge, 0.0));
    // ...and also when the client walks away mid-stream.
    let resp = gw.open_sse(&key, "/v1/infer/sse?n=100&gap_ms=100").await;
    tokio::task::block_in_place(|| wait_for(&gw, gauge, 1.0));
    drop(resp);
    tokio::task::block_in_place(|| wait_for(&gw, gauge, 0.0));
}

#[test]
fn the_exposition_passes_promtool() {
    let up = Upstream::start();
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .start();
    let (key, _) = gw.create_key("infer", &[]);
    gw.raw(format!("GET /v1/infer/x HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n").as_bytes());
    gw.raw(b"GET /v1/infer/x HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n");
    let text = gw.metrics();
    let promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    // `make test` installs promtool; without it this test fails rather than pass unchecked.
    let mut child = promtool.unwrap_or_else(|e| {
        panic!("promtool is needed to check the exposition (`make test` installs it): {e}")
    });
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool: {report}\n{text}");
    // promtool also lints (e.g. counters must end in _total); it prints nothing when clean.
    assert!(report.trim().is_empty(), "promtool lint: {report}");
}

#[test]
fn operator_counters_track_upstream_failures_and_key_store_lookups() {
    let up = Upstream::start();
    let gw = crate::failing_gateway(&up);
    let (key, _) = gw.create_key("infer,embed", &[]);
    let unknown = format!("ak_00000000000000bb.{}", "c".repeat(43));
    for (path, token) in [
        ("/v1/infer/x", key.as_str()),
        ("/v1/embed/hang", &key),
        ("/v1/embed/garbage", &key),
        ("/v1/embed/x", &key),
        ("/v1/embed/x", &unknown),
    ] {
        gw.raw(format!("GET {path} HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n").as_bytes());
    }
    for (series, want) in [
        (
            r#"portcullis_upstream_errors_total{kind="refused",service="infer"}"#,
            1.0,
        ),
        (
            r#"portcullis_upstream_errors_total{kind="timeout",service="embed"}"#,
            1.0,
        ),
        (
            r#"portcullis_upstream_errors_total{kind="invalid",service="embed"}"#,
            1.0,
        ),
        // One lookup for the key (then cached for the other four uses), one for the unknown id.
        (r#"portcullis_key_store_lookups_total{result="found"}"#, 1.0),
        (
            r#"portcullis_key_store_lookups_total{result="unknown"}"#,
            1.0,
        ),
    ] {
        wait_for(&gw, series, want);
    }
}
