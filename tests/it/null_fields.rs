//! Optional body fields given as `null` on `api = "openai"` services, against the real binary:
//! treated as absent, as the OpenAI API treats them, instead of refused.

use serde_json::Value;
use testkit::{Gateway, Service, Upstream};

const INFER: &str = "/v1/infer/v1/chat/completions";
const CHATX: &str = "/v1/chatx/v1/chat/completions";
const EMBED: &str = "/v1/embed/v1/embeddings";
const MESSAGES: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

/// `infer` validates only; `chatx` and `embed` insert the default `m-default`.
fn gateway(up: &Upstream) -> (Gateway, String) {
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("/oa/infer")).openai())
        .service(
            Service::new("chatx", up.url("/oa/chatx"))
                .openai()
                .models("m-default", &[]),
        )
        .service(
            Service::new("embed", up.url("/oa/embed"))
                .openai()
                .models("m-default", &[]),
        )
        .max_body(1 << 20)
        .start();
    let (key, _) = gw.create_key("infer,chatx,embed", &[]);
    (gw, key)
}

/// Sends `body` with a Content-Length, or chunked; returns the status.
fn post(gw: &Gateway, key: &str, path: &str, body: &str, chunked: bool) -> u16 {
    let framing = if chunked {
        format!(
            "Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        )
    } else {
        format!("Content-Length: {}\r\n\r\n{body}", body.len())
    };
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n{framing}"
    );
    gw.raw(req.as_bytes()).0
}

#[test]
fn null_stream_and_null_model_are_forwarded_as_sent_without_a_default() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    for body in [
        format!(r#"{{"stream":null,{MESSAGES}}}"#),
        format!(r#"{{"model":null,{MESSAGES},"stream":null}}"#),
        format!(r#"{{"model":null,{MESSAGES},"temperature":null,"stream_options":null}}"#),
    ] {
        assert_eq!(post(&gw, &key, INFER, &body, false), 200, "{body}");
        assert_eq!(String::from_utf8_lossy(&up.last().body), body);
    }
}

#[test]
fn a_null_model_gets_the_default_in_its_place() {
    let up = Upstream::start();
    let (gw, key) = gateway(&up);
    let cases = [
        (CHATX, format!(r#"{{"model":null,{MESSAGES}}}"#), false),
        (
            CHATX,
            format!(r#"{{{MESSAGES}, "model" : null ,"stream":null}}"#),
            false,
        ),
        // Held (chunked): the same rewrite, made where the body is held.
        (CHATX, format!(r#"{{{MESSAGES},"model":null}}"#), true),
        (EMBED, r#"{"input":"a","model":null}"#.to_string(), false),
    ];
    for (path, body, chunked) in cases {
        assert_eq!(post(&gw, &key, path, &body, chunked), 200, "{body}");
        let got = up.last();
        let want = body.replacen("null", r#""m-default""#, 1);
        assert_eq!(String::from_utf8_lossy(&got.body), want);
        // Still JSON, with exactly one model member.
        let value: Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(value["model"], "m-default");
        assert_eq!(
            String::from_utf8_lossy(&got.body)
                .matches("\"model\"")
                .count(),
            1
        );
    }
    // Null is absent only where the field is optional: a null role is still refused.
    let body = r#"{"messages":[{"role":null,"content":"hi"}]}"#;
    assert_eq!(post(&gw, &key, CHATX, body, false), 400);
}
