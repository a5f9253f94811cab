//! What the key API refuses, and how: API keys (403), every failed token (the data plane's
//! 401, byte for byte), bad bodies, the key limit, other methods and paths, other origins.

use serde_json::{json, Value};
use testkit::header;

use super::{Admin, ORIGIN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_get_403_and_every_failed_token_the_data_planes_401() {
    let a = Admin::start("").await;
    let (key, _) = a.gw.create_key("infer", &[]);
    let (status, _, body) = a.call("GET", "/v1/keys", Some(&key), None);
    assert_eq!(status, 403);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"],
        "forbidden"
    );
    let (status, _, _) = a.call(
        "POST",
        "/v1/keys",
        Some(&key),
        Some(r#"{"name":"x","scopes":["infer"]}"#),
    );
    assert_eq!(status, 403, "a leaked key must not mint keys");

    // The same bytes as the data plane's 401 (but for the request id), and the connection
    // closed after it like there: nothing tells the two apart, or one failure from another.
    let data_plane = raw_bytes(a.gw.port, "GET /v1/infer/x", None);
    assert!(data_plane.starts_with("HTTP/1.1 401"), "{data_plane}");
    let expired = a
        .signer
        .access_token(&a.idp, json!({"sub": "alice", "exp": 1000}));
    let wrong_aud = a
        .signer
        .access_token(&a.idp, json!({"sub": "alice", "aud": "other"}));
    for token in [
        None,
        Some("garbage"),
        Some(expired.as_str()),
        Some(wrong_aud.as_str()),
    ] {
        let got = raw_bytes(a.port, "GET /v1/keys", token);
        assert_eq!(got, data_plane, "token {token:?}");
    }
}

/// The whole response to a request sent without `Connection: close`, read until the server
/// closes (a 401 must), with the request id masked.
fn raw_bytes(port: u16, request_line: &str, token: Option<&str>) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(s, "{request_line} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .expect("the connection is closed after a 401");
    let text = String::from_utf8(out).unwrap();
    text.lines()
        .map(|l| match l.split_once(": ") {
            // Per request, and the clock's second may turn between the two requests compared.
            Some((name, _))
                if name.eq_ignore_ascii_case("x-request-id")
                    || name.eq_ignore_ascii_case("date") =>
            {
                format!("{name}: *")
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_the_key_limit_holds() {
    let a = Admin::start("max_keys_per_owner = 2").await;
    let alice = a.token("alice", "infer");
    for (body, message) in [
        ("{", "the body must be a JSON object"),
        (r#"{"scopes":["infer"]}"#, "name must be a string"),
        (r#"{"name":"x","scopes":[]}"#, "scopes must hold"),
        (
            r#"{"name":"x","scopes":["infer"],"expires_in":"soon"}"#,
            "expires_in must be",
        ),
        (
            r#"{"name":"x","scopes":["infer"],"admin":true}"#,
            "unknown field",
        ),
    ] {
        let (status, _, out) = a.call("POST", "/v1/keys", Some(&alice), Some(body));
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(status, 400, "{body}: {out}");
        assert_eq!(out["error"], "bad_request");
        assert!(
            out["message"].as_str().unwrap().starts_with(message),
            "{body}: {out}"
        );
    }
    let big = format!(
        r#"{{"name":"{}","scopes":["infer"]}}"#,
        "n".repeat(17 * 1024)
    );
    let (status, headers, _) = a.call("POST", "/v1/keys", Some(&alice), Some(&big));
    assert_eq!(status, 413);
    assert_eq!(header(&headers, "connection"), Some("close"));

    let (status, headers, _) = a.call("PUT", "/v1/keys", Some(&alice), Some("{}"));
    assert_eq!(status, 405);
    assert_eq!(header(&headers, "allow"), Some("GET, POST, OPTIONS"));
    assert_eq!(a.call("GET", "/v1/other", Some(&alice), None).0, 404);
    assert_eq!(
        a.call("GET", "/console/", None, None).0,
        404,
        "console off by default"
    );
    let (status, headers, doc) = a.call("GET", "/openapi.json", None, None);
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    let doc: Value = serde_json::from_slice(&doc).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));

    // Two active keys at most: a third is refused until one is revoked.
    let body = json!({"name": "k", "scopes": ["infer"]});
    let (_, first) = a.create(&alice, body.clone());
    assert_eq!(a.create(&alice, body.clone()).0, 201);
    let (status, err) = a.create(&alice, body.clone());
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["error"], "conflict");
    assert_eq!(
        a.create(&a.token("bob", "infer"), body.clone()).0,
        201,
        "the limit is per owner"
    );
    assert_eq!(a.revoke(&alice, first["id"].as_str().unwrap()), 204);
    assert_eq!(a.create(&alice, body).0, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_only_the_allowed_origin() {
    let a = Admin::start("").await;
    let alice = a.token("alice", "infer");
    let preflight = |origin: &str| {
        a.call_with(
            "OPTIONS",
            "/v1/keys",
            None,
            None,
            &format!(
                "Origin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: authorization, content-type\r\n"
            ),
        )
    };
    let (status, headers, _) = preflight(ORIGIN);
    assert_eq!(status, 204);
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some(ORIGIN)
    );
    assert!(header(&headers, "access-control-allow-methods")
        .unwrap()
        .contains("POST"));
    let allowed_headers = header(&headers, "access-control-allow-headers").unwrap();
    assert!(allowed_headers.contains("authorization") && allowed_headers.contains("content-type"));
    assert!(header(&headers, "access-control-allow-credentials").is_none());

    let body = r#"{"name":"web","scopes":["infer"]}"#;
    let (status, headers, _) = a.call_with(
        "POST",
        "/v1/keys",
        Some(&alice),
        Some(body),
        &format!("Origin: {ORIGIN}\r\n"),
    );
    assert_eq!(status, 201);
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some(ORIGIN)
    );

    for other in [
        "https://evil.example",
        "https://console.example.com.evil.example",
        "null",
    ] {
        let (_, headers, _) = preflight(other);
        assert!(
            header(&headers, "access-control-allow-origin").is_none(),
            "{other}"
        );
        assert!(
            header(&headers, "access-control-allow-methods").is_none(),
            "{other}"
        );
        let (_, headers, _) = a.call_with(
            "GET",
            "/v1/keys",
            Some(&alice),
            None,
            &format!("Origin: {other}\r\n"),
        );
        assert!(
            header(&headers, "access-control-allow-origin").is_none(),
            "{other}"
        );
    }
    for (_, headers, _) in [
        preflight(ORIGIN),
        a.call("GET", "/v1/keys", Some(&alice), None),
    ] {
        assert!(header(&headers, "set-cookie").is_none());
    }
}
