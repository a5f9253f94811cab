//! The dialect bridge end to end (`translate = { messages = "chat" }`): a Messages client in
//! front of the fake upstream's OpenAI chat endpoint, through the real binary. The upstream
//! receives a chat request at the chat path; the client gets a Messages answer (JSON, or a
//! Messages stream converted event by event); the ledger's usage is the upstream's; an
//! upstream error reaches the client in Anthropic's error shape with its status.

use serde_json::{json, Value};
use testkit::upstream::{CHAT_JSON_USAGE, CHAT_SSE_USAGE};
use testkit::{Gateway, Service, Upstream};

use crate::metering::{access_log, send};

const MESSAGES: &str = "/v1/claude/oa/v1/messages?beta=true";

fn gateway(up: &Upstream) -> Gateway {
    let claude = Service::new("claude", up.url(""))
        .set("api", "\"anthropic\"")
        .set("translate", "{ messages = \"chat\" }");
    Gateway::builder()
        .service(claude)
        .max_body(1 << 20)
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n")
        .start()
}

fn messages_body(stream: bool) -> Value {
    json!({"model": "m-1", "max_tokens": 200, "stream": stream, "system": "be brief",
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
}

/// The SSE events of a body, as (event name, data): Messages and Responses name theirs.
pub(crate) fn events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).expect("UTF-8");
    (text.split("\n\n").filter(|e| !e.trim().is_empty()))
        .map(|e| {
            let (name, data) = e.split_once('\n').expect("event and data lines");
            let name = name.strip_prefix("event: ").expect("an event line");
            let data = data.strip_prefix("data: ").expect("a data line");
            (
                name.to_string(),
                serde_json::from_str(data).expect("JSON data"),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_messages_client_is_answered_in_messages_by_a_chat_upstream() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("claude", &[]);

    // JSON: the upstream gets a chat request at the chat path, query kept.
    let sent = send(
        &gw.url(MESSAGES),
        Some(&key),
        &messages_body(false),
        "identity",
        "tr-json",
    )
    .await;
    assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
    let hit = up.last();
    assert_eq!(hit.target, "/oa/v1/chat/completions?beta=true");
    let upstream_body: Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(
        upstream_body["messages"][0],
        json!({"role": "system", "content": "be brief"})
    );
    assert_eq!(
        upstream_body["messages"][1],
        json!({"role": "user", "content": "hi"})
    );
    assert_eq!(upstream_body["tools"][0]["function"]["name"], "get_weather");
    assert!(upstream_body.get("system").is_none());
    let answer: Value = serde_json::from_slice(&sent.body).expect("a JSON answer");
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["role"], "assistant");
    assert_eq!(answer["stop_reason"], "end_turn");
    let text = answer["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "text");
    assert!(
        text.is_some_and(|t| !t["text"].as_str().unwrap().is_empty()),
        "{answer}"
    );
    let u = CHAT_JSON_USAGE;
    assert_eq!(
        answer["usage"],
        json!({"input_tokens": u.prompt - u.cached, "cache_read_input_tokens": u.cached, "output_tokens": u.completion})
    );

    // A stream: Messages events, in order, ending with message_stop; the upstream was asked for
    // its usage, and the usage the client sees is the upstream's.
    let sent = send(
        &gw.url(MESSAGES),
        Some(&key),
        &messages_body(true),
        "identity",
        "tr-sse",
    )
    .await;
    assert_eq!(sent.status, 200);
    let upstream_body: Value = serde_json::from_slice(&up.last().body).unwrap();
    assert_eq!(
        upstream_body["stream_options"],
        json!({"include_usage": true})
    );
    let all = events(&sent.body);
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
    assert!(names.contains(&"content_block_delta"));
    let u = CHAT_SSE_USAGE;
    assert_eq!(all[all.len() - 2].1["usage"]["output_tokens"], u.completion);
    assert_eq!(
        all[all.len() - 2].1["usage"]["input_tokens"],
        u.prompt - u.cached
    );

    // The ledger's usage is the upstream's, in the gateway's own terms.
    let log = access_log(&gw.dir.path().join("access.log"), &["tr-json", "tr-sse"]);
    assert_eq!(log["tr-json"]["prompt_tokens"], CHAT_JSON_USAGE.prompt);
    assert_eq!(
        log["tr-json"]["completion_tokens"],
        CHAT_JSON_USAGE.completion
    );
    assert_eq!(log["tr-sse"]["prompt_tokens"], CHAT_SSE_USAGE.prompt);
    assert_eq!(
        log["tr-sse"]["completion_tokens"],
        CHAT_SSE_USAGE.completion
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_and_upstream_errors_take_the_clients_shape() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("claude", &[]);
    // A server tool cannot run on a chat server: 400 naming it, never forwarded.
    let mut body = messages_body(false);
    body["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
    let before = up.requests().len();
    let sent = send(
        &gw.url(MESSAGES),
        Some(&key),
        &body,
        "identity",
        "tr-refused",
    )
    .await;
    assert_eq!(sent.status, 400);
    let error: Value = serde_json::from_slice(&sent.body).unwrap();
    assert!(
        error
            .to_string()
            .contains("tools[0] is of type \\\"web_search_20250305\\\""),
        "{error}"
    );
    assert_eq!(
        up.requests().len(),
        before,
        "a refused request never reaches the upstream"
    );
    // The upstream's own error (here a 503 it is told to give) keeps its status and reads as
    // Anthropic's error.
    let url = gw.url("/v1/claude/oa/v1/messages?status=503");
    let sent = send(
        &url,
        Some(&key),
        &messages_body(false),
        "identity",
        "tr-503",
    )
    .await;
    assert_eq!(sent.status, 503);
    let error: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "overloaded_error");
    assert!(error["error"]["message"].is_string());
    let lines = ["refused", "upstream_error"].map(|result| {
        format!("portcullis_translations_total{{pair=\"messages>chat\",result=\"{result}\",service=\"claude\"}} 1")
    });
    gw.metrics_with(&lines.each_ref().map(String::as_str));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_captured_claude_code_request_is_held_translated_and_answered_as_a_stream() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("claude", &[]);
    let text = include_str!("../fixtures/agents/claude_code_messages.json");
    let body: Value = serde_json::from_str(text).unwrap();
    assert!(
        text.len() > 64 * 1024,
        "big enough to take the held-body path"
    );
    let sent = send(
        &gw.url(MESSAGES),
        Some(&key),
        &body,
        "identity",
        "tr-claude",
    )
    .await;
    assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
    let upstream_body: Value = serde_json::from_slice(&up.last().body).unwrap();
    assert_eq!(up.last().target, "/oa/v1/chat/completions?beta=true");
    let tools = upstream_body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), body["tools"].as_array().unwrap().len());
    assert_eq!(upstream_body["max_tokens"], body["max_tokens"]);
    let names: Vec<String> = events(&sent.body).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.first().map(String::as_str), Some("message_start"));
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
}

#[tokio::test(flavor = "multi_thread")]
async fn count_tokens_is_answered_by_the_gateway_never_forwarded() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("claude", &[]);
    let url = gw.url("/v1/claude/oa/v1/messages/count_tokens?beta=true");
    let body = json!({"model": "m-1", "messages": [{"role": "user", "content": "hello there"}]});
    let before = up.requests().len();
    let sent = send(&url, Some(&key), &body, "identity", "tr-count").await;
    assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
    let answer: Value = serde_json::from_slice(&sent.body).unwrap();
    // A token per 4 bytes of the body, as the budgets estimate a prompt.
    let expected = (body.to_string().len() as u64).div_ceil(4);
    assert_eq!(answer, json!({"input_tokens": expected}));
    // A bad body is refused as on any Messages endpoint; neither reaches the upstream.
    let bad = send(
        &url,
        Some(&key),
        &json!({"model": "m-1"}),
        "identity",
        "tr-count-bad",
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(String::from_utf8_lossy(&bad.body).contains("messages is required"));
    // The Claude Code request's size takes no other path: the whole body is read and counted.
    let text = include_str!("../fixtures/agents/claude_code_messages.json");
    let big: Value = serde_json::from_str(text).unwrap();
    let sent = send(&url, Some(&key), &big, "identity", "tr-count-big").await;
    assert_eq!(sent.status, 200);
    let answer: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(
        answer["input_tokens"],
        (big.to_string().len() as u64).div_ceil(4)
    );
    assert_eq!(up.requests().len(), before, "counted here, never forwarded");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_the_upstream_cuts_ends_with_an_error_event() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("claude", &[]);
    // Two events, then the upstream's connection drops mid-body: no end of body reaches the
    // gateway's filters, so the end comes from the failed proxy's handler.
    let url = gw.url("/v1/claude/oa/v1/messages?cut_after=2&gap_ms=5");
    let sent = send(&url, Some(&key), &messages_body(true), "identity", "tr-cut").await;
    assert_eq!(sent.status, 200);
    let all = events(&sent.body);
    let (name, last) = all.last().expect("events");
    assert_eq!(name, "error", "{all:?}");
    assert_eq!(last["error"]["type"], "api_error");
    assert_eq!(all[0].0, "message_start");
    gw.metrics_with(&[
        "portcullis_translations_total{pair=\"messages>chat\",result=\"cut\",service=\"claude\"} 1",
    ]);
}
