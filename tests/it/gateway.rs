//! The gateway core end to end: real gateway binary, real TCP, a recording upstream.

use std::time::{Duration, Instant};

use testkit::Upstream;
use testkit::{header, Gateway, Service};

fn gateway_with(up: &Upstream) -> Gateway {
    Gateway::builder()
        .service(Service::new("infer", up.url("/base")))
        .service(Service::new("embed", up.url("")))
        .service(
            Service::new("chatx", up.url(""))
                .upstream_header("x-api-key", "${TEST_UPSTREAM_SECRET}")
                .upstream_header("authorization", "Bearer ${TEST_UPSTREAM_SECRET}"),
        )
        .env("TEST_UPSTREAM_SECRET", "upstream-secret-42")
        .start()
}

fn get(path: &str, key: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n{extra}Connection: close\r\n\r\n").into_bytes()
}

#[tokio::test]
async fn forwards_rest_query_and_body_byte_for_byte() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    let body = "{\"model\":\"alpha3.6-vl\",\"messages\":[{\"role\":\"user\",\"content\":\"h\u{e9}llo \\\"q\\\"\"}]}   \n";
    let resp = testkit::client()
        .post(gw.url("/v1/infer/v1/chat/completions?a=1&b=%2F&c=x%20y&&d"))
        .bearer_auth(&key)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: serde_json::Value = resp.json().await.unwrap();
    let target = "/base/v1/chat/completions?a=1&b=%2F&c=x%20y&&d";
    let expected =
        serde_json::json!({"ok": true, "replica": "upstream", "method": "POST", "target": target});
    assert_eq!(answer, expected, "the upstream's answer, unchanged");
    let got = up.last();
    assert_eq!(got.method, "POST");
    assert_eq!(got.target, "/base/v1/chat/completions?a=1&b=%2F&c=x%20y&&d");
    assert_eq!(got.body, body.as_bytes());
}

#[tokio::test]
async fn every_allowed_method_is_forwarded_as_sent() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("embed", &[]);
    for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"] {
        let req = format!(
            "{method} /v1/embed/x/y HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\ncontent-length: 0\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(gw.raw(req.as_bytes()).0, 200, "{method}");
        let got = up.last();
        assert_eq!((got.method.as_str(), got.target.as_str()), (method, "/x/y"));
    }
}

#[tokio::test]
async fn unknown_services_are_404_only_after_authentication() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    for path in ["/v1/nope/v1/models", "/v1/infer", "/v1/", "/v1/INFER/x"] {
        let (status, _, body) = gw.raw(&get(path, &key, ""));
        assert_eq!(
            (status, body.as_slice()),
            (404, &br#"{"error":"not_found"}"#[..]),
            "{path}"
        );
        let (status, headers, body) = gw.raw(&get(path, "wrong", ""));
        assert_eq!(
            status, 401,
            "{path}: an unauthenticated caller must learn nothing"
        );
        assert_eq!(body, br#"{"error":"unauthorized"}"#);
        assert_eq!(header(&headers, "www-authenticate"), Some("Bearer"));
    }
    assert!(up.requests().is_empty());
}

#[tokio::test]
async fn paths_outside_v1_are_404_without_authentication() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    for path in [
        "/",
        "/v2/infer/x",
        "/metrics",
        "/healthz/",
        "/v1",
        "/index.html",
    ] {
        let (status, headers, body) = gw.raw(
            format!("GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        assert_eq!(status, 404, "{path}");
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
        assert_eq!(body, br#"{"error":"not_found"}"#);
    }
    assert!(up.requests().is_empty());
}

#[tokio::test]
async fn methods_outside_the_allowed_set_are_405() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    for method in ["TRACE", "PROPFIND", "BREW"] {
        let req = format!("{method} /v1/infer/v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n");
        let (status, headers, body) = gw.raw(req.as_bytes());
        assert_eq!(status, 405, "{method}");
        assert_eq!(
            header(&headers, "allow"),
            Some("GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS")
        );
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "method_not_allowed");
    }
    // The method is checked before the path or the token.
    let (status, _, _) =
        gw.raw(b"TRACE /v1/infer/../x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 405);
    // CONNECT is a method like any other, not framing: the same JSON 405, and no tunnel.
    for target in ["upstream.example:443", "/v1/infer/v1/models"] {
        let req = format!(
            "CONNECT {target} HTTP/1.1\r\nHost: upstream.example:443\r\nAuthorization: Bearer {key}\r\n\r\n"
        );
        let (status, headers, body) = gw.raw(req.as_bytes());
        assert_eq!(status, 405, "CONNECT {target}");
        assert_eq!(
            header(&headers, "allow"),
            Some("GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS")
        );
        assert!(header(&headers, "x-request-id").is_some_and(|id| id.len() == 32));
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "method_not_allowed");
    }
    assert!(up.requests().is_empty());
}

#[tokio::test]
async fn malformed_paths_are_400_before_authentication() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    for path in [
        "/v1/infer/../embed/x",
        "/v1/infer/./x",
        "/v1/infer/%2e%2e/x",
        "/v1/infer/.%2E/x",
        "/v1/infer/a%2fb",
        "/v1/infer/a%2Fb",
        "/v1/infer/a%5Cb",
        "/v1/infer/a\\b",
        "/v1/infer/a//b",
        "/v1/infer/a%00b",
        "/v1/infer/a%0d%0ab",
        "/v1/../healthz",
        // Tomcat, Jetty and Spring cut `;params` off and then resolve the dots.
        "/v1/infer/..;/embed/x",
        "/v1/infer/.;/x",
        "/v1/infer/%2e%2e;x/x",
        "/v1/infer/..%3b/x",
    ] {
        for token in [key.as_str(), "none"] {
            let (status, headers, body) = gw.raw(&get(path, token, ""));
            assert_eq!(status, 400, "{path}");
            assert_eq!(header(&headers, "content-type"), Some("application/json"));
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["error"], "bad_request", "{path}");
            assert!(body["message"].is_string());
        }
    }
    assert!(
        up.requests().is_empty(),
        "a malformed path reached the upstream"
    );
}

#[tokio::test]
async fn client_credentials_never_reach_the_upstream_and_configured_headers_do() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer,chatx", &[]);
    let extra = "Cookie: session=client\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\n\
                 x-api-key: client-chosen\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\n\
                 Forwarded: for=6.6.6.6;proto=https;host=evil\r\nX-Real-IP: 6.6.6.6\r\n\
                 X-Forwarded-Host: evil.example\r\nX-Forwarded-Port: 443\r\n";
    for path in ["/v1/infer/v1/models", "/v1/chatx/v1/models"] {
        let (status, _, _) = gw.raw(&get(path, &key, extra));
        assert_eq!(status, 200);
        let got = up.last();
        assert_eq!(got.header("cookie"), None);
        assert_eq!(got.header("proxy-authorization"), None);
        assert!(
            !format!("{:?}", got.headers).contains(&key),
            "the client's key was forwarded"
        );
        assert_eq!(
            got.header("host"),
            Some(format!("127.0.0.1:{}", up.port).as_str())
        );
        assert_eq!(got.header("x-forwarded-for"), Some("127.0.0.1"));
        assert_eq!(got.header_count("x-forwarded-for"), 1);
        assert_eq!(got.header("x-forwarded-proto"), Some("http"));
        assert_eq!(got.header_count("x-forwarded-proto"), 1);
        // Client-claimed identity never reaches the upstream.
        for spoofable in [
            "forwarded",
            "x-real-ip",
            "x-forwarded-host",
            "x-forwarded-port",
        ] {
            assert_eq!(got.header(spoofable), None, "{spoofable} was forwarded");
        }
        if path.contains("chatx") {
            assert_eq!(
                got.header("authorization"),
                Some("Bearer upstream-secret-42")
            );
            assert_eq!(got.header("x-api-key"), Some("upstream-secret-42"));
            assert_eq!(got.header_count("x-api-key"), 1);
        } else {
            assert_eq!(got.header("authorization"), None);
            // A client's key header (Anthropic's, Azure's) is a credential too: never passed on.
            assert_eq!(got.header("x-api-key"), None);
        }
    }
    assert!(
        !gw.log().contains("upstream-secret-42"),
        "an upstream credential was logged"
    );
    assert!(!gw.log().contains(&key[20..]), "a client secret was logged");
}

#[tokio::test]
async fn request_ids_are_kept_when_well_formed_and_made_otherwise() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    let (_, headers, _) = gw.raw(&get("/v1/infer/x", &key, "X-Request-Id: abc.DEF_123-x\r\n"));
    assert_eq!(header(&headers, "x-request-id"), Some("abc.DEF_123-x"));
    assert_eq!(up.last().header("x-request-id"), Some("abc.DEF_123-x"));
    let too_long = "a".repeat(129);
    for bad in ["has space", "semi;colon", too_long.as_str(), ""] {
        let (_, headers, _) = gw.raw(&get(
            "/v1/infer/x",
            &key,
            &format!("X-Request-Id: {bad}\r\n"),
        ));
        let returned = header(&headers, "x-request-id").unwrap().to_string();
        assert_eq!(returned.len(), 32, "{bad:?}");
        assert_ne!(returned, bad);
        assert_eq!(up.last().header("x-request-id"), Some(returned.as_str()));
    }
    // Local responses carry one too.
    for req in [
        &b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"[..],
        b"GET /nowhere HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
        b"GET /v1/infer/x HTTP/1.1\r\nHost: gw\r\nX-Request-Id: mine-1\r\nConnection: close\r\n\r\n",
    ] {
        let (_, headers, _) = gw.raw(req);
        assert!(header(&headers, "x-request-id").is_some());
    }
    let (_, headers, _) = gw.raw(b"GET /v1/infer/x HTTP/1.1\r\nHost: gw\r\nX-Request-Id: mine-1\r\nConnection: close\r\n\r\n");
    assert_eq!(header(&headers, "x-request-id"), Some("mine-1"));
}

#[tokio::test]
async fn session_and_challenge_headers_are_removed_from_responses() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    let (status, headers, _) = gw.raw(&get("/v1/infer/x", &key, ""));
    assert_eq!(status, 200);
    for name in [
        "set-cookie",
        "set-cookie2",
        "www-authenticate",
        "proxy-authenticate",
    ] {
        assert_eq!(header(&headers, name), None, "{name} leaked");
    }
    assert_eq!(header(&headers, "x-upstream-header"), Some("kept"));
    // An upstream's own 401 passes through, without its challenge or cookie.
    let (status, headers, body) = gw.raw(&get("/v1/infer/status/401", &key, ""));
    assert_eq!(status, 401);
    assert_eq!(body, br#"{"error":"upstream says no"}"#);
    assert_eq!(header(&headers, "www-authenticate"), None);
    assert_eq!(header(&headers, "set-cookie"), None);
    // And an SSE response.
    let (_, headers, _) = gw.raw(&get("/v1/infer/sse?n=1&gap_ms=1", &key, ""));
    assert_eq!(header(&headers, "set-cookie"), None);
}

#[tokio::test]
async fn sse_reaches_the_client_chunk_by_chunk_even_with_gzip_accepted() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    let mut resp = testkit::client()
        .post(gw.url("/v1/infer/v1/chat/sse?n=6&gap_ms=150"))
        .bearer_auth(&key)
        .header("accept-encoding", "gzip")
        .header("accept", "text/event-stream")
        .body(r#"{"stream":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(resp.headers().get("content-encoding").is_none());
    let mut arrivals = Vec::new();
    let mut text = String::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        arrivals.push(Instant::now());
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(
        text.contains("tok0 ") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    let log = up.stream(0);
    let sent = log.lock().unwrap().sent.clone();
    assert_eq!(sent.len(), 7);
    // Generous bound, not a benchmark: the first event is seen long before the last is sent.
    assert!(
        arrivals[0] + Duration::from_millis(500) < *sent.last().unwrap(),
        "the stream was buffered"
    );
    assert!(
        arrivals.len() >= 4,
        "events were coalesced: {} chunks",
        arrivals.len()
    );
}

#[tokio::test]
async fn a_client_leaving_mid_stream_closes_the_upstream_connection() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    let mut resp = gw.open_sse(&key, "/v1/infer/sse?n=100&gap_ms=100").await;
    resp.chunk().await.unwrap().unwrap();
    let left = Instant::now();
    drop(resp);
    let log = up.stream(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(at) = log.lock().unwrap().aborted {
            assert!(at - left < Duration::from_secs(3));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the upstream kept generating for a departed client"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!log.lock().unwrap().finished);
}

#[tokio::test]
async fn healthz_answers_locally_without_auth_or_upstream() {
    // Upstreams that refuse every connection: health must not care.
    let dead = format!("http://127.0.0.1:{}", testkit::free_port());
    let gw = Gateway::builder()
        .service(Service::new("infer", dead))
        .start();
    let (status, headers, body) =
        gw.raw(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert_eq!(body, br#"{"status":"ok"}"#);
    let (status, headers, body) =
        gw.raw(b"HEAD /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-length"), Some("15"));
    assert!(body.is_empty());
    // A token, even a bad one, changes nothing.
    let (status, _, _) = gw.raw(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer junk\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 200);
    let (status, _, _) = gw.raw(
        b"POST /healthz HTTP/1.1\r\nHost: gw\r\ncontent-length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 405);
}

#[tokio::test]
async fn upstream_failures_are_json_502_and_504() {
    let up = Upstream::start();
    let gw = crate::failing_gateway(&up);
    let (key, _) = gw.create_key("infer,embed", &[]);
    // Each carries a query: Pingora logs every failure, and no log line may carry a query.
    let cases = [
        (
            "/v1/infer/v1/models?api_key=query-secret-1",
            502,
            "bad_gateway",
        ),
        ("/v1/embed/close?api_key=query-secret-2", 502, "bad_gateway"),
        (
            "/v1/embed/garbage?api_key=query-secret-3",
            502,
            "bad_gateway",
        ),
        (
            "/v1/embed/hang?api_key=query-secret-4",
            504,
            "gateway_timeout",
        ),
    ];
    for (path, want, code) in cases {
        let started = Instant::now();
        let (status, headers, body) = gw.raw(&get(path, &key, ""));
        assert_eq!(status, want, "{path}");
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
        assert!(header(&headers, "x-request-id").is_some());
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], code, "{path}");
        assert!(started.elapsed() < Duration::from_secs(10), "{path} hung");
    }
    // A silent upstream is cut after read_timeout_seconds (1 s here), not after the default 300.
    let started = Instant::now();
    gw.raw(&get("/v1/embed/hang", &key, ""));
    assert!(started.elapsed() >= Duration::from_millis(900));
    // The failures were logged (with the request id, to find them) but never their query.
    let log = gw.log();
    assert!(log.contains("Fail to proxy"), "{log}");
    assert!(log.contains("GET \"/v1/embed/close\" request_id="), "{log}");
    assert!(
        !log.contains("query-secret"),
        "a query string was logged:\n{log}"
    );
}

#[tokio::test]
async fn bodies_over_the_limit_are_413_declared_or_chunked() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    // The test gateway allows 4096 bytes.
    let ok = "x".repeat(4096);
    let (status, _, _) = gw.raw(
        format!("POST /v1/infer/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\ncontent-length: 4096\r\nConnection: close\r\n\r\n{ok}").as_bytes(),
    );
    assert_eq!(status, 200);
    assert_eq!(up.last().body.len(), 4096);
    let before = up.requests().len();
    let big = "x".repeat(5000);
    let (status, _, body) = gw.raw(
        format!("POST /v1/infer/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\ncontent-length: 5000\r\nConnection: close\r\n\r\n{big}").as_bytes(),
    );
    assert_eq!(status, 413);
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "payload_too_large");
    assert_eq!(
        up.requests().len(),
        before,
        "a declared oversize body reached the upstream"
    );
    // Chunked: no length declared, counted as it arrives.
    let chunk = "y".repeat(1000);
    let mut req = format!("POST /v1/infer/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\ntransfer-encoding: chunked\r\nConnection: close\r\n\r\n");
    for _ in 0..6 {
        req.push_str(&format!("3e8\r\n{chunk}\r\n"));
    }
    req.push_str("0\r\n\r\n");
    let (status, _, body) = gw.raw(req.as_bytes());
    assert_eq!(status, 413);
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "payload_too_large");
}

#[tokio::test]
async fn every_401_is_byte_identical() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, key_id) = gw.create_key("infer", &[]);
    let wrong_secret = format!("ak_{key_id}.{}", "A".repeat(43));
    let unknown_id = format!("ak_0000000000000000.{}", "A".repeat(43));
    let auths = [
        None,
        Some("Basic dXNlcjpwYXNz".to_string()),
        Some("Bearer".to_string()),
        Some(format!("Bearer {wrong_secret}")),
        Some(format!("Bearer {unknown_id}")),
        Some(format!("Bearer {}", &key[..key.len() - 1])),
        Some("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln".to_string()),
        Some(format!("bearer  {key}")),
        Some(format!("Bearer {}", "a".repeat(9000))),
    ];
    let mut seen = None;
    for auth in &auths {
        let auth_line = auth
            .as_ref()
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        let req = format!("GET /v1/infer/v1/models HTTP/1.1\r\nHost: gw\r\n{auth_line}X-Request-Id: same\r\nConnection: close\r\n\r\n");
        let (status, mut headers, body) = gw.raw(req.as_bytes());
        headers.retain(|(k, _)| k != "date");
        let this = (status, headers, body);
        assert_eq!(this.0, 401, "{auth:?}");
        match &seen {
            None => seen = Some(this),
            Some(first) => assert_eq!(&this, first, "{auth:?} answered differently"),
        }
    }
    let (_, headers, body) = seen.unwrap();
    assert_eq!(body, br#"{"error":"unauthorized"}"#);
    assert_eq!(header(&headers, "www-authenticate"), Some("Bearer"));
    // Two Authorization headers are refused too.
    let req = format!("GET /v1/infer/v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n");
    assert_eq!(gw.raw(req.as_bytes()).0, 401);
    assert!(up.requests().is_empty());
}

#[tokio::test]
async fn oversized_header_blocks_are_400() {
    let up = Upstream::start();
    let gw = gateway_with(&up);
    let (key, _) = gw.create_key("infer", &[]);
    let many: String = (0..120).map(|i| format!("x-h{i}: v\r\n")).collect();
    let huge = format!("x-big: {}\r\n", "b".repeat(70 * 1024));
    for extra in [many, huge] {
        let (status, _, body) = gw.raw(&get("/v1/infer/x", &key, &extra));
        assert_eq!(status, 400);
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["message"], "request headers too large");
    }
    assert!(up.requests().is_empty());
    // Ordinary requests with a few dozen headers pass.
    let some: String = (0..40).map(|i| format!("x-h{i}: v\r\n")).collect();
    assert_eq!(gw.raw(&get("/v1/infer/x", &key, &some)).0, 200);
}

#[tokio::test]
async fn rate_limits_apply_per_principal_and_service() {
    let up = Upstream::start();
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("")).rate_limit_per_minute(3))
        .service(Service::new("embed", up.url("")))
        .start();
    let (first, _) = gw.create_key("infer,embed", &[]);
    let (second, _) = gw.create_key("infer", &[]);
    for _ in 0..3 {
        assert_eq!(gw.raw(&get("/v1/infer/x", &first, "")).0, 200);
    }
    let (status, headers, body) = gw.raw(&get("/v1/infer/x", &first, ""));
    assert_eq!(status, 429);
    let retry: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(
        up.requests().len(),
        3,
        "a limited request reached the upstream"
    );
    // Another caller, and another service, are not affected.
    assert_eq!(gw.raw(&get("/v1/infer/x", &second, "")).0, 200);
    for _ in 0..5 {
        assert_eq!(gw.raw(&get("/v1/embed/x", &first, "")).0, 200);
    }
}
