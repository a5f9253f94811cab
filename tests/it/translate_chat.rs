//! The dialect bridge end to end for chat clients (`translate = { chat = "responses" }`): a
//! chat-completions client in front of the fake upstream's Responses endpoint, through the
//! real binary. The upstream receives a stateless Responses request at the Responses path,
//! query kept; the client gets a chat completion (JSON, or chunks converted event by event,
//! ending in `[DONE]`); the usage it sees and the usage the access log records are the
//! upstream's; an upstream error reaches the client in OpenAI's error shape with its status.

use serde_json::{json, Value};
use testkit::upstream::{RESPONSES_JSON_USAGE, RESPONSES_SSE_USAGE};
use testkit::{Gateway, Service, Upstream, Usage};

use crate::metering::{access_log, send};

const CHAT: &str = "/v1/gpt/oa/v1/chat/completions?trace=1";

fn gateway(up: &Upstream) -> Gateway {
    let gpt = Service::new("gpt", up.url(""))
        .set("api", "\"openai\"")
        .set("translate", "{ chat = \"responses\" }");
    Gateway::builder()
        .service(gpt)
        .max_body(1 << 20)
        .extra("[access_log]\ndestination = \"{dir}/access.log\"\n")
        .start()
}

fn chat_body(stream: bool) -> Value {
    let mut body = json!({"model": "gpt-x", "max_completion_tokens": 200, "stream": stream,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]});
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// Chat usage as the client should see it for the upstream's `u`.
fn chat_usage(u: Usage) -> Value {
    json!({"prompt_tokens": u.prompt, "completion_tokens": u.completion, "total_tokens": u.total(),
        "prompt_tokens_details": {"cached_tokens": u.cached},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning}})
}

/// The data of each SSE event of a chat stream (`[DONE]` as a string).
fn chunks(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("UTF-8");
    (text.split("\n\n").filter(|e| !e.trim().is_empty()))
        .map(|e| {
            let data = e.strip_prefix("data: ").expect("only data lines");
            serde_json::from_str(data).unwrap_or_else(|_| json!(data))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chat_client_is_answered_in_chat_by_a_responses_upstream() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("gpt", &[]);

    // JSON: the upstream gets a stateless Responses request at the Responses path, query kept.
    let sent = send(
        &gw.url(CHAT),
        Some(&key),
        &chat_body(false),
        "identity",
        "c2r-json",
    )
    .await;
    assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
    let hit = up.last();
    assert_eq!(hit.target, "/oa/v1/responses?trace=1");
    let upstream_body: Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(
        upstream_body["input"],
        json!([
            {"type": "message", "role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": "hi"},
        ])
    );
    assert_eq!(
        upstream_body["tools"],
        json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": false}])
    );
    assert_eq!(upstream_body["max_output_tokens"], 200);
    assert_eq!(upstream_body["store"], false);
    assert!(upstream_body.get("messages").is_none());
    let answer: Value = serde_json::from_slice(&sent.body).expect("a JSON answer");
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["id"], "chatcmpl-resp_fake");
    assert_eq!(answer["model"], "gpt-x");
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(
        !choice["message"]["content"].as_str().unwrap().is_empty(),
        "{answer}"
    );
    assert_eq!(answer["usage"], chat_usage(RESPONSES_JSON_USAGE));

    // A stream: chat chunks, the finish reason, the usage asked for, [DONE].
    let sent = send(
        &gw.url(CHAT),
        Some(&key),
        &chat_body(true),
        "identity",
        "c2r-sse",
    )
    .await;
    assert_eq!(sent.status, 200);
    let upstream_body: Value = serde_json::from_slice(&up.last().body).unwrap();
    assert_eq!(upstream_body["stream"], true);
    assert!(upstream_body.get("stream_options").is_none());
    let all = chunks(&sent.body);
    assert_eq!(all.last(), Some(&json!("[DONE]")));
    assert_eq!(
        all[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let text: String = (all.iter())
        .filter_map(|c| c.pointer("/choices/0/delta/content")?.as_str())
        .collect();
    assert_eq!(text, "tok0 tok1 tok2 ");
    for chunk in &all[..all.len() - 1] {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], "chatcmpl-resp_fake");
    }
    assert_eq!(all[all.len() - 3]["choices"][0]["finish_reason"], "stop");
    assert_eq!(all[all.len() - 2]["choices"], json!([]));
    assert_eq!(all[all.len() - 2]["usage"], chat_usage(RESPONSES_SSE_USAGE));

    // The ledger's usage is the upstream's; the call is marked translated.
    let log = access_log(&gw.dir.path().join("access.log"), &["c2r-json", "c2r-sse"]);
    for (id, u) in [
        ("c2r-json", RESPONSES_JSON_USAGE),
        ("c2r-sse", RESPONSES_SSE_USAGE),
    ] {
        let line = &log[id];
        assert_eq!(line["translated"], "chat>responses");
        assert_eq!(line["prompt_tokens"], u.prompt, "{line}");
        assert_eq!(line["completion_tokens"], u.completion, "{line}");
        assert_eq!(line["cached_tokens"], u.cached, "{line}");
        assert_eq!(line["reasoning_tokens"], u.reasoning, "{line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_without_usage_asked_gets_none_and_refusals_and_errors_take_openais_shape() {
    let up = Upstream::start();
    let gw = gateway(&up);
    let (key, _) = gw.create_key("gpt", &[]);

    // Not asked: no usage chunk for the client, yet the ledger still charges the upstream's.
    let mut body = chat_body(true);
    body.as_object_mut().unwrap().remove("stream_options");
    let sent = send(&gw.url(CHAT), Some(&key), &body, "identity", "c2r-quiet").await;
    assert_eq!(sent.status, 200);
    let all = chunks(&sent.body);
    assert_eq!(all.last(), Some(&json!("[DONE]")));
    assert!(all.iter().all(|c| c.get("usage").is_none()), "{all:?}");
    let log = access_log(&gw.dir.path().join("access.log"), &["c2r-quiet"]);
    assert_eq!(
        log["c2r-quiet"]["completion_tokens"],
        RESPONSES_SSE_USAGE.completion
    );

    // What Responses cannot express: 400 naming it, never forwarded.
    let mut body = chat_body(false);
    body["n"] = json!(2);
    let before = up.requests().len();
    let sent = send(&gw.url(CHAT), Some(&key), &body, "identity", "c2r-refused").await;
    assert_eq!(sent.status, 400);
    assert!(
        String::from_utf8_lossy(&sent.body).contains("n above 1"),
        "{}",
        String::from_utf8_lossy(&sent.body)
    );
    assert_eq!(up.requests().len(), before, "never reaches the upstream");

    // The upstream's error keeps its status and OpenAI's shape.
    let url = gw.url("/v1/gpt/oa/v1/chat/completions?status=404");
    let sent = send(&url, Some(&key), &chat_body(false), "identity", "c2r-404").await;
    assert_eq!(sent.status, 404);
    let error: Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(error["error"]["message"], "the model does not exist");
    assert_eq!(error["error"]["code"], "model_not_found");
    // Counted as each call is logged, after its answer: wait for the lines.
    access_log(
        &gw.dir.path().join("access.log"),
        &["c2r-refused", "c2r-404"],
    );
    let metrics = gw.metrics();
    for result in ["ok", "refused", "upstream_error"] {
        let line = format!(
            "portcullis_translations_total{{pair=\"chat>responses\",result=\"{result}\",service=\"gpt\"}} 1"
        );
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
}
