//! The bridge for Responses clients (`translate = { responses = "chat" }`): a Responses client
//! (Codex CLI) in front of the fake upstream's chat endpoint, through the real binary. The
//! upstream receives a chat request at the chat path; the client gets a Responses answer (JSON,
//! or a Responses stream converted event by event); the usage is the upstream's everywhere; what
//! needs state is refused before any byte goes upstream; a stream the upstream cuts ends in
//! `response.failed`.

use serde_json::{json, Value};
use testkit::upstream::{CHAT_JSON_USAGE, CHAT_SSE_USAGE};
use testkit::{Gateway, Service, Upstream};

use crate::metering::{access_log, send};

const RESPONSES: &str = "/v1/codex/oa/v1/responses?trace=1";

fn gateway(up: &Upstream) -> Gateway {
    let codex = Service::new("codex", up.url(""))
        .set("api", "\"openai\"")
        .set("translate", "{ responses = \"chat\" }");
    Gateway::builder()
        .service(codex)
        .max_body(1 << 20)
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n")
        .start()
}

fn responses_body(stream: bool) -> Value {
    json!({"model": "gpt-x", "stream": stream, "store": false, "instructions": "be brief",
        "max_output_tokens": 200, "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]})
}

/// The SSE events of a body, as (event name, data); each data names its own type.
fn events(body: &[u8]) -> Vec<(String, Value)> {
    let all = crate::translate::events(body);
    for (name, data) in &all {
        assert_eq!(data["type"], name.as_str());
    }
    all
}

/// Responses usage for the fake upstream's chat usage.
fn responses_usage(u: testkit::upstream::Usage) -> Value {
    json!({"input_tokens": u.prompt, "input_tokens_details": {"cached_tokens": u.cached},
           "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": u.reasoning},
           "total_tokens": u.prompt + u.completion})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_responses_client_is_answered_in_responses_by_a_chat_upstream() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("codex", &[]);

    // JSON: the upstream gets a chat request at the chat path, query kept.
    let sent = send(
        &gw.url(RESPONSES),
        Some(&key),
        &responses_body(false),
        "identity",
        "rc-json",
    )
    .await;
    assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
    let hit = up.last();
    assert_eq!(hit.target, "/oa/v1/chat/completions?trace=1");
    let upstream_body: Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(
        upstream_body["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    );
    assert_eq!(upstream_body["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(upstream_body["max_tokens"], 200);
    assert_eq!(upstream_body["reasoning_effort"], "low");
    for member in [
        "input",
        "instructions",
        "store",
        "max_output_tokens",
        "reasoning",
    ] {
        assert!(
            upstream_body.get(member).is_none(),
            "{member} in {upstream_body}"
        );
    }
    let answer: Value = serde_json::from_slice(&sent.body).expect("a JSON answer");
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["status"], "completed");
    let message = (answer["output"].as_array().unwrap().iter()).find(|i| i["type"] == "message");
    let text = message.map(|m| &m["content"][0]["text"]);
    assert!(
        text.is_some_and(|t| !t.as_str().unwrap().is_empty()),
        "{answer}"
    );
    assert_eq!(answer["usage"], responses_usage(CHAT_JSON_USAGE));

    // A stream: Responses events in order, ending with response.completed and the usage; the
    // upstream was asked for its usage.
    let sent = send(
        &gw.url(RESPONSES),
        Some(&key),
        &responses_body(true),
        "identity",
        "rc-sse",
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
    assert_eq!(
        &names[..2],
        ["response.created", "response.in_progress"],
        "{names:?}"
    );
    assert_eq!(names.last(), Some(&"response.completed"));
    assert!(names.contains(&"response.output_text.delta"), "{names:?}");
    let completed = &all.last().unwrap().1["response"];
    assert_eq!(completed["usage"], responses_usage(CHAT_SSE_USAGE));
    let deltas: String = (all.iter())
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    let message = (completed["output"].as_array().unwrap().iter()).find(|i| i["type"] == "message");
    assert_eq!(message.unwrap()["content"][0]["text"], deltas.as_str());

    // The ledger's usage is the upstream's.
    let log = access_log(&gw.dir.path().join("access.log"), &["rc-json", "rc-sse"]);
    assert_eq!(log["rc-json"]["prompt_tokens"], CHAT_JSON_USAGE.prompt);
    assert_eq!(
        log["rc-json"]["completion_tokens"],
        CHAT_JSON_USAGE.completion
    );
    assert_eq!(log["rc-sse"]["prompt_tokens"], CHAT_SSE_USAGE.prompt);
    assert_eq!(
        log["rc-sse"]["completion_tokens"],
        CHAT_SSE_USAGE.completion
    );
    assert_eq!(log["rc-sse"]["translated"], "responses>chat");
}

#[tokio::test(flavor = "multi_thread")]
async fn what_needs_state_is_refused_and_upstream_errors_keep_openais_shape() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("codex", &[]);
    let before = up.requests().len();
    for (member, value) in [
        ("previous_response_id", json!("resp_1")),
        ("store", json!(true)),
    ] {
        let mut body = responses_body(false);
        body[member] = value;
        let sent = send(
            &gw.url(RESPONSES),
            Some(&key),
            &body,
            "identity",
            "rc-refused",
        )
        .await;
        assert_eq!(sent.status, 400, "{member}");
        let error: Value = serde_json::from_slice(&sent.body).unwrap();
        assert!(error.to_string().contains(member), "{error}");
    }
    assert_eq!(
        up.requests().len(),
        before,
        "a refused request never reaches the upstream"
    );
    let url = gw.url("/v1/codex/oa/v1/responses?status=404");
    let sent = send(
        &url,
        Some(&key),
        &responses_body(false),
        "identity",
        "rc-404",
    )
    .await;
    assert_eq!(sent.status, 404);
    let error: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(error["error"]["message"], "the model does not exist");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    let lines = [("refused", 2), ("upstream_error", 1)].map(|(result, n)| {
        format!("portcullis_translations_total{{pair=\"responses>chat\",result=\"{result}\",service=\"codex\"}} {n}")
    });
    gw.metrics_with(&lines.each_ref().map(String::as_str));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_the_upstream_cuts_ends_in_response_failed() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("codex", &[]);
    // Two events, then the upstream's connection drops mid-body.
    let url = gw.url("/v1/codex/oa/v1/responses?cut_after=2&gap_ms=5");
    let sent = send(
        &url,
        Some(&key),
        &responses_body(true),
        "identity",
        "rc-cut",
    )
    .await;
    assert_eq!(sent.status, 200);
    let all = events(&sent.body);
    let (name, last) = all.last().expect("events");
    assert_eq!(name, "response.failed", "{all:?}");
    assert_eq!(last["response"]["status"], "failed");
    assert!(all.iter().any(|(n, _)| n == "response.output_text.delta"));
    gw.metrics_with(&[
        "portcullis_translations_total{pair=\"responses>chat\",result=\"cut\",service=\"codex\"} 1",
    ]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_captured_codex_request_is_translated_and_answered_as_a_stream() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("codex", &[]);
    let text = include_str!("../fixtures/agents/codex_responses.json");
    let body: Value = serde_json::from_str(text).unwrap();
    let sent = send(
        &gw.url(RESPONSES),
        Some(&key),
        &body,
        "identity",
        "rc-codex",
    )
    .await;
    assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
    let upstream_body: Value = serde_json::from_slice(&up.last().body).unwrap();
    // Its tools come in an `additional_tools` item, in namespaces: every one becomes a function.
    let declared: usize = (body["input"][0]["tools"].as_array().unwrap().iter())
        .map(|ns| ns["tools"].as_array().unwrap().len())
        .sum();
    assert_eq!(upstream_body["tools"].as_array().unwrap().len(), declared);
    let roles: Vec<&str> = (upstream_body["messages"].as_array().unwrap().iter())
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "system", "system", "system", "user", "user"]
    );
    assert_eq!(upstream_body["parallel_tool_calls"], false);
    let names: Vec<String> = events(&sent.body).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.first().map(String::as_str), Some("response.created"));
    assert_eq!(names.last().map(String::as_str), Some("response.completed"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_budgeted_callers_translated_request_reserves_from_its_own_cap_and_is_charged_the_upstreams_usage(
) {
    let up = Upstream::start();
    let codex = Service::new("codex", up.url(""))
        .set("api", "\"openai\"")
        .set("translate", "{ responses = \"chat\" }");
    let gw = Gateway::builder()
        .service(codex)
        .extra("[budgets]\ndefault_max_tokens = 77\n[access_log]\ndestination = \"{dir}/access.log\"\n")
        .start();
    let (key, _) = gw.create_key("codex", &["--tokens-per-day", "1000"]);
    // Codex states no max_output_tokens: the budgets' cap is written into the Responses body,
    // and reaches the chat server as its max_tokens.
    let mut body = responses_body(true);
    body.as_object_mut().unwrap().remove("max_output_tokens");
    let sent = send(
        &gw.url(RESPONSES),
        Some(&key),
        &body,
        "identity",
        "rc-budget",
    )
    .await;
    assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
    let upstream_body: Value = serde_json::from_slice(&up.last().body).unwrap();
    assert_eq!(upstream_body["max_tokens"], 77);
    let log = access_log(&gw.dir.path().join("access.log"), &["rc-budget"]);
    assert_eq!(log["rc-budget"]["prompt_tokens"], CHAT_SSE_USAGE.prompt);
    assert_eq!(
        log["rc-budget"]["completion_tokens"],
        CHAT_SSE_USAGE.completion
    );
    // A cap the budget cannot hold is refused before any byte goes upstream, in the gateway's
    // own pinned shape.
    let before = up.requests().len();
    let mut big = responses_body(false);
    big["max_output_tokens"] = json!(5000);
    let sent = send(&gw.url(RESPONSES), Some(&key), &big, "identity", "rc-over").await;
    assert_eq!(sent.status, 429, "{}", String::from_utf8_lossy(&sent.body));
    let error: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(error["error"], "budget_exceeded");
    assert_eq!(up.requests().len(), before);
}
