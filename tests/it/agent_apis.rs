//! The agent APIs end to end, against the real binary and the fake upstream's `/oa/` endpoints
//! (which state their own token counts): OpenAI Responses on an `api = "openai"` service and
//! Anthropic Messages and `count_tokens` on an `api = "anthropic"` one.
//!
//! {Responses, Messages} × {JSON, stream, stream abandoned} × {identity, gzip, br asked for by
//! the client}, plus `count_tokens`: each is metered exactly (an abandoned stream estimated),
//! and the client receives what the upstream answers directly. Malformed bodies get the
//! gateway's 400 naming the field and never reach the upstream; a budget too small for a
//! request's `max_tokens` refuses it before it is forwarded; a provider key sent beside the
//! bearer token never reaches the upstream.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::upstream::{
    Usage, COUNT_TOKENS, MESSAGES_JSON_USAGE, MESSAGES_SSE_USAGE, RESPONSES_JSON_USAGE,
    RESPONSES_SSE_USAGE,
};
use testkit::{raw, Gateway, Service, Upstream};

use crate::ledger::{total, usage_cli, wait_for};
use crate::metering::{abandon, access_log, decoded, send};

const RESPONSES: &str = "/v1/chatx/oa/v1/responses";
const MESSAGES: &str = "/v1/claude/oa/v1/messages";
const COUNT: &str = "/v1/claude/oa/v1/messages/count_tokens";
const CODINGS: [&str; 3] = ["identity", "gzip", "br"];

fn gateway(up: &Upstream, extra: &str) -> Gateway {
    Gateway::builder()
        .service(Service::new("chatx", up.url("")).openai())
        .service(Service::new("claude", up.url("")).set("api", "\"anthropic\""))
        .extra(&format!(
            "[access_log]\ndestination = \"{{dir}}/access.log\"\n{extra}"
        ))
        .start()
}

fn responses_body(stream: bool) -> Value {
    json!({"model": "m-1", "input": [{"role": "user", "content": "hi"}], "stream": stream,
        "max_output_tokens": 200})
}

fn messages_body(stream: bool) -> Value {
    json!({"model": "m-1", "max_tokens": 200, "stream": stream, "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
}

/// The access log's usage fields: `null` for a count the upstream did not state.
fn logged(line: &Value) -> [Option<u64>; 4] {
    [
        "prompt_tokens",
        "completion_tokens",
        "reasoning_tokens",
        "cached_tokens",
    ]
    .map(|field| line[field].as_u64())
}

fn stated(usage: Usage) -> [Option<u64>; 4] {
    let some = |n: u64| (n > 0).then_some(n);
    [
        Some(usage.prompt),
        Some(usage.completion),
        some(usage.reasoning),
        Some(usage.cached),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn responses_and_messages_are_metered_exactly_and_reach_the_client_unchanged() {
    let up = Upstream::start();
    // The estimates of streams left early are checked here: no tail read.
    let gw = gateway(&up, "[metering]\ntail_seconds = 0\n");
    let (key, _) = gw.create_key("chatx,claude", &[]);
    let mut exact: Vec<(String, [Option<u64>; 4])> = Vec::new();
    for (name, path, json_usage, sse_usage) in [
        (
            "responses",
            RESPONSES,
            RESPONSES_JSON_USAGE,
            RESPONSES_SSE_USAGE,
        ),
        (
            "messages",
            MESSAGES,
            MESSAGES_JSON_USAGE.usage(),
            MESSAGES_SSE_USAGE.usage(),
        ),
    ] {
        for stream in [false, true] {
            let body = match path {
                RESPONSES => responses_body(stream),
                _ => messages_body(stream),
            };
            for accept in CODINGS {
                let id = format!("{name}-{stream}-{accept}");
                let through = send(&gw.url(path), Some(&key), &body, accept, &id).await;
                let text = decoded(through.coding.as_deref(), &through.body);
                let text = String::from_utf8_lossy(&text).into_owned();
                assert_eq!(through.status, 200, "{id}: {text}");
                let upstream = path.split_once("/oa/").unwrap().1;
                let url = up.url(&format!("/oa/{upstream}"));
                let direct = send(&url, None, &body, accept, "d").await;
                let direct = decoded(direct.coding.as_deref(), &direct.body);
                assert_eq!(
                    text,
                    String::from_utf8_lossy(&direct),
                    "{id}: the client got something else than the upstream's own answer"
                );
                let usage = if stream { sse_usage } else { json_usage };
                exact.push((id, stated(usage)));
            }
        }
    }
    // count_tokens: a request, no tokens.
    let count_body = json!({"model": "m-1", "messages": [{"role": "user", "content": "hi"}]});
    let counted = send(&gw.url(COUNT), Some(&key), &count_body, "gzip", "count").await;
    assert_eq!(counted.status, 200);
    let answer = decoded(counted.coding.as_deref(), &counted.body);
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer, json!({"input_tokens": COUNT_TOKENS}));
    // A Responses stream left early has no usage report: estimated from the request. A
    // Messages stream left after `message_start` has its prompt, and at least a token per
    // event it delivered.
    let (abandon_after, stream_len) = (4, 40);
    let query = format!("?n={stream_len}&gap_ms=20");
    let (responses_cut, messages_cut) = (responses_body(true), messages_body(true));
    let url = gw.url(&format!("{RESPONSES}{query}"));
    abandon(
        &url,
        &key,
        &responses_cut,
        "identity",
        "responses-cut",
        abandon_after,
    )
    .await;
    let url = gw.url(&format!("{MESSAGES}{query}"));
    abandon(
        &url,
        &key,
        &messages_cut,
        "identity",
        "messages-cut",
        abandon_after,
    )
    .await;
    let responses_cut = responses_cut.to_string();

    let mut ids: Vec<&str> = exact.iter().map(|(id, _)| id.as_str()).collect();
    ids.extend(["count", "responses-cut", "messages-cut"]);
    let log = access_log(&gw.dir.path().join("access.log"), &ids);
    let mut totals = [0u64; 2];
    for (id, want) in &exact {
        let line = &log[id];
        assert_eq!(logged(line), *want, "{id}: {line}");
        assert_eq!(line["usage_estimated"], false, "{id}");
        assert_eq!(line["model"], "m-1", "{id}");
        totals[0] += want[0].unwrap();
        totals[1] += want[1].unwrap();
    }
    let count = &log["count"];
    assert_eq!(logged(count)[..2], [Some(0), Some(0)], "{count}");
    let cut = &log["responses-cut"];
    assert_eq!(cut["usage_estimated"], true, "{cut}");
    assert_eq!(cut["prompt_tokens"], json!(responses_cut.len().div_ceil(4)));
    let cut_completion = cut["completion_tokens"].as_u64().unwrap();
    assert!((abandon_after as u64..stream_len).contains(&cut_completion));
    totals[0] += responses_cut.len().div_ceil(4) as u64;
    totals[1] += cut_completion;
    let cut = &log["messages-cut"];
    assert_eq!(cut["usage_estimated"], true, "{cut}");
    assert_eq!(
        cut["prompt_tokens"],
        json!(MESSAGES_SSE_USAGE.usage().prompt),
        "the prompt from message_start: {cut}"
    );
    let cut_completion = cut["completion_tokens"].as_u64().unwrap();
    assert!(
        (abandon_after as u64..stream_len).contains(&cut_completion),
        "{cut}"
    );
    totals[0] += MESSAGES_SSE_USAGE.usage().prompt;
    totals[1] += cut_completion;
    // The ledger, read back from the store: the same totals, every request counted once.
    let requests = (exact.len() + 3) as u64;
    let rows = wait_for(
        Duration::from_secs(20),
        || usage_cli(&gw.config, &["--group-by", "key"]),
        |rows| !rows.is_empty() && total(rows, "requests") == requests,
    );
    let ledger = ["prompt_tokens", "completion_tokens"].map(|field| total(&rows, field));
    assert_eq!(ledger, totals, "the ledger: {rows:?}");
    assert_eq!(total(&rows, "estimated"), 2, "{rows:?}");
}

#[test]
fn malformed_agent_bodies_get_400_naming_the_field_and_never_reach_the_upstream() {
    let up = Upstream::start();
    let gw = gateway(&up, "");
    let (key, _) = gw.create_key("chatx,claude", &[]);
    let cases = [
        (RESPONSES, r#"{"model":"m"}"#, "input is required"),
        (
            RESPONSES,
            r#"{"input":[{"role":"user"},"hi"]}"#,
            "input[1] must be an object",
        ),
        (
            RESPONSES,
            r#"{"input":"hi","max_output_tokens":"many"}"#,
            "max_output_tokens must be a non-negative integer",
        ),
        (
            MESSAGES,
            r#"{"messages":[{"role":"user","content":"x"}]}"#,
            "max_tokens is required",
        ),
        (
            MESSAGES,
            r#"{"max_tokens":8,"messages":[{"role":["user"],"content":"x"}]}"#,
            "messages[0].role must be a string",
        ),
        (
            COUNT,
            r#"{"messages":[{"role":"user","content":7}]}"#,
            "messages[0].content must be a string or an array of content blocks",
        ),
        // However the endpoint is spelt.
        (
            "/v1/claude/oa/v1/%6Dessages/",
            r#"{"max_tokens":8,"messages":[]}"#,
            "messages must be a non-empty array",
        ),
    ];
    for (path, body, message) in cases {
        let (status, _, answer) = post_raw(
            &gw,
            path,
            &[("authorization", &format!("Bearer {key}"))],
            body,
        );
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(status, 400, "{path} {body}: {text}");
        let json: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json,
            json!({"error": "bad_request", "message": message}),
            "{path} {body}"
        );
    }
    let reached: Vec<String> = up.requests().iter().map(|h| h.path().to_string()).collect();
    assert!(reached.is_empty(), "forwarded: {reached:?}");
}

#[test]
fn a_budget_refuses_a_messages_request_whose_max_tokens_it_cannot_cover() {
    let up = Upstream::start();
    let gw = gateway(&up, "[budgets]\n");
    let (key, _) = gw.create_key("claude", &["--tokens-per-day", "1000"]);
    let body = |max_tokens: u64| {
        json!({"model": "m-1", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
    };
    let bearer = format!("Bearer {key}");
    let status = |max_tokens| {
        let (status, _, answer) = post_raw(
            &gw,
            MESSAGES,
            &[("authorization", &bearer)],
            &body(max_tokens),
        );
        (status, String::from_utf8_lossy(&answer).into_owned())
    };
    let (code, text) = status(5000);
    assert_eq!(code, 429, "{text}");
    assert!(
        text.contains("budget_exceeded") && text.contains("tokens_per_day"),
        "{text}"
    );
    assert!(up.requests().is_empty(), "a refused request was forwarded");
    let (code, text) = status(100);
    assert_eq!(code, 200, "{text}");
    assert_eq!(up.requests().len(), 1);
}

#[test]
fn a_provider_key_sent_beside_the_bearer_token_never_reaches_the_upstream() {
    let up = Upstream::start();
    let gw = gateway(&up, "");
    let (key, _) = gw.create_key("claude", &[]);
    let body = messages_body(false).to_string();
    let headers = [
        ("authorization", format!("Bearer {key}")),
        ("x-api-key", "sk-ant-provider-secret".to_string()),
        ("anthropic-version", "2023-06-01".to_string()),
    ];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let (status, _, answer) = post_raw(&gw, MESSAGES, &headers, &body);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    let hit = up.last();
    assert_eq!(hit.header("x-api-key"), None);
    assert_eq!(hit.header("authorization"), None);
    assert_eq!(hit.header("anthropic-version"), Some("2023-06-01"));
    // The provider key alone is no credential here.
    let (status, _, _) = post_raw(&gw, MESSAGES, &[("x-api-key", &key)], &body);
    assert_eq!(status, 401);
}

/// One POST on its own connection, headers as given.
fn post_raw(
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> testkit::RawResponse {
    let mut request = format!("POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    raw(gw.port, request.as_bytes())
}

/// What Claude Code and Codex really send (tests/fixtures/agents: a mid-conversation `system`
/// message, thinking, `additional_tools` input items, no `max_output_tokens`), byte for byte,
/// from a key with a token budget: answered 200, metered exactly, and reserved for.
#[tokio::test(flavor = "multi_thread")]
async fn claude_code_and_codex_requests_pass_and_are_metered_and_budgeted() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agents");
    let claude_code = std::fs::read(fixtures.join("claude_code_messages.json")).unwrap();
    let codex = std::fs::read(fixtures.join("codex_responses.json")).unwrap();
    let up = Upstream::start();
    // Their bodies are 60-80 KB: over the test kit's default body limit.
    let gw = Gateway::builder()
        .service(Service::new("chatx", up.url("")).openai())
        .service(Service::new("claude", up.url("")).set("api", "\"anthropic\""))
        .max_body(1 << 20)
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n[budgets]\ndefault_max_tokens = 4096\n")
        .start();
    let (key, _) = gw.create_key("chatx,claude", &["--tokens-per-day", "100000000"]);
    let client = testkit::client();
    for (id, path, body, completion) in [
        (
            "claude-code",
            format!("{MESSAGES}?beta=true"),
            &claude_code,
            MESSAGES_SSE_USAGE.output,
        ),
        (
            "codex",
            RESPONSES.to_string(),
            &codex,
            RESPONSES_SSE_USAGE.completion,
        ),
    ] {
        let resp = (client.post(gw.url(&path)))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .header("x-request-id", id)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{id}");
        let limit = resp.headers().get("x-ratelimit-limit-tokens").cloned();
        assert_eq!(limit.unwrap(), "100000000", "{id}: budgeted");
        let text = resp.text().await.unwrap();
        assert!(text.contains("event:"), "{id}: streamed: {text}");
        let line = &access_log(&gw.dir.path().join("access.log"), &[id])[id];
        assert_eq!(line["status"], 200, "{id}");
        assert_eq!(line["usage_estimated"], false, "{id}: {line}");
        assert_eq!(line["completion_tokens"], completion, "{id}: {line}");
        assert!(line["prompt_tokens"].as_u64().unwrap() > 0, "{id}: {line}");
    }
    let reached = up.requests();
    assert_eq!(reached.len(), 2);
    // Claude Code states its max_tokens: its body reaches the upstream unchanged.
    assert_eq!(reached[0].body, claude_code);
    // Codex states no cap: the budget's is written in, and nothing else changes.
    let mut capped = b"{\"max_output_tokens\":4096,".to_vec();
    capped.extend_from_slice(&codex[1..]);
    assert_eq!(
        String::from_utf8_lossy(&reached[1].body),
        String::from_utf8_lossy(&capped)
    );
}
