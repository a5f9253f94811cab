//! The agent APIs of the fake upstream (`agents.rs`, `model/agents.rs`): the event sequences the
//! official SDKs' stream accumulators need, the stated bodies and counts of the `/oa/` mode, and
//! the demo model's counts as the SDK suite states them.

use std::time::Duration;

use serde_json::{json, Value};

use super::tests::{post, Resp};
use super::*;

/// The named events of an SSE body: (event, data), checking each is `event:` then `data:`.
fn named_events(resp: &Resp) -> Vec<(String, Value)> {
    let text = String::from_utf8(resp.body()).unwrap();
    assert!(text.ends_with("\n\n"), "{text}");
    text.trim_end_matches("\n\n")
        .split("\n\n")
        .map(|block| {
            let (event, data) = block.split_once('\n').expect(block);
            let event = event.strip_prefix("event: ").expect(block);
            let data = data.strip_prefix("data: ").expect(block);
            (event.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

const RESPONSES: &str = "/oa/v1/responses";
const MESSAGES: &str = "/oa/v1/messages";
const FAST: &str = "?n=3&gap_ms=0&split_ms=0";

const RESPONSE_EVENTS: [&str; 11] = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
];

#[test]
fn agent_counts_are_distinct_from_each_other_and_from_chats() {
    let m = MESSAGES_JSON_USAGE.usage();
    assert_eq!((m.prompt, m.completion, m.cached), (95, 29, 19));
    let s = MESSAGES_SSE_USAGE.usage();
    assert_eq!((s.prompt, s.completion, s.cached), (111, 37, 23));
    let all = [
        RESPONSES_JSON_USAGE.prompt,
        RESPONSES_SSE_USAGE.prompt,
        m.prompt,
        s.prompt,
        CHAT_JSON_USAGE.prompt,
        CHAT_SSE_USAGE.prompt,
        COUNT_TOKENS,
    ];
    for (i, a) in all.iter().enumerate() {
        assert!(!all[i + 1..].contains(a), "{a} repeats");
    }
}

#[test]
fn responses_json_is_a_response_object_with_openais_usage() {
    let up = Upstream::start();
    let resp = post(&up, RESPONSES, &[], r#"{"model":"m-4","input":"hi"}"#);
    assert_eq!(resp.status, 200);
    let v = resp.json();
    assert_eq!(
        (v["object"].clone(), v["status"].clone(), v["model"].clone()),
        (json!("response"), json!("completed"), json!("m-4"))
    );
    let item = &v["output"][0];
    assert_eq!(
        (item["type"].clone(), item["role"].clone()),
        (json!("message"), json!("assistant"))
    );
    assert_eq!(item["content"][0]["type"], "output_text");
    let u = RESPONSES_JSON_USAGE;
    assert_eq!(
        v["usage"],
        json!({"input_tokens": u.prompt, "input_tokens_details": {"cached_tokens": u.cached},
            "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": u.reasoning},
            "total_tokens": u.prompt + u.completion})
    );
    assert_eq!(
        resp.body(),
        agent_json_body(AgentEndpoint::Responses, Some("m-4")).as_bytes()
    );
    // No model: null echoed, as chat does.
    let v = post(&up, RESPONSES, &[], r#"{"input":"hi","stream":null}"#).json();
    assert_eq!(
        (v["object"].clone(), v["model"].clone()),
        (json!("response"), Value::Null)
    );
}

#[test]
fn responses_stream_is_the_sdk_event_sequence_numbered_with_usage_at_completion() {
    let up = Upstream::start();
    let body = r#"{"model":"m-5","input":[{"role":"user","content":"hi"}],"stream":true}"#;
    let resp = post(&up, &format!("{RESPONSES}{FAST}"), &[], body);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let events = named_events(&resp);
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names, RESPONSE_EVENTS);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(
            (&data["type"], &data["sequence_number"]),
            (&json!(name), &json!(i))
        );
    }
    let created = &events[0].1["response"];
    assert_eq!(
        (created["status"].clone(), created["usage"].clone()),
        (json!("in_progress"), Value::Null)
    );
    let item_id = events[2].1["item"]["id"].clone();
    let deltas: String = events[4..7]
        .iter()
        .map(|(_, d)| {
            assert_eq!(
                (&d["item_id"], &d["output_index"], &d["content_index"]),
                (&item_id, &json!(0), &json!(0))
            );
            d["delta"].as_str().unwrap()
        })
        .collect();
    assert_eq!(deltas, "tok0 tok1 tok2 ");
    assert_eq!(events[7].1["text"], deltas);
    assert_eq!(events[9].1["item"]["content"][0]["text"], deltas);
    let done = &events[10].1["response"];
    assert_eq!(
        (done["status"].clone(), done["model"].clone()),
        (json!("completed"), json!("m-5"))
    );
    assert_eq!(done["output"][0], events[9].1["item"]);
    assert_eq!(done["usage"], responses_usage_json(&RESPONSES_SSE_USAGE));
    assert_eq!(
        resp.body(),
        agent_sse_body(AgentEndpoint::Responses, Some("m-5"), 3).as_bytes()
    );
    // One chunk per event (the usage event's two writes are one chunk when not compressed).
    assert_eq!(resp.chunks.len(), 11);
    let log = up.stream(0);
    assert_eq!(log.lock().unwrap().sent.len(), 11);
}

#[test]
fn messages_json_and_stream_state_anthropics_usage_split_across_events() {
    let up = Upstream::start();
    let v = post(
        &up,
        MESSAGES,
        &[],
        r#"{"model":"c-1","max_tokens":9,"messages":[]}"#,
    )
    .json();
    assert_eq!(
        (
            v["type"].clone(),
            v["role"].clone(),
            v["model"].clone(),
            v["stop_reason"].clone()
        ),
        (
            json!("message"),
            json!("assistant"),
            json!("c-1"),
            json!("end_turn")
        )
    );
    assert_eq!(v["content"][0]["type"], "text");
    assert_eq!(v["usage"], MESSAGES_JSON_USAGE.json());
    assert_eq!(
        v.to_string(),
        agent_json_body(AgentEndpoint::Messages, Some("c-1"))
    );

    let body = r#"{"model":"c-2","max_tokens":9,"messages":[],"stream":true}"#;
    let resp = post(
        &up,
        &format!("{MESSAGES}?n=2&gap_ms=0&split_ms=0"),
        &[],
        body,
    );
    let events = named_events(&resp);
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(events.iter().all(|(e, d)| d["type"] == json!(e)));
    let start = &events[0].1["message"];
    let u = MESSAGES_SSE_USAGE;
    assert_eq!(start["usage"], MessagesUsage { output: 1, ..u }.json());
    assert_eq!(
        (start["model"].clone(), start["content"].clone()),
        (json!("c-2"), json!([]))
    );
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = events[3..5]
        .iter()
        .map(|(_, d)| {
            assert_eq!(
                (&d["index"], &d["delta"]["type"]),
                (&json!(0), &json!("text_delta"))
            );
            d["delta"]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, "tok0 tok1 ");
    assert_eq!(
        events[6].1,
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": u.output}})
    );
    assert_eq!(
        resp.body(),
        agent_sse_body(AgentEndpoint::Messages, Some("c-2"), 2).as_bytes()
    );

    let v = post(
        &up,
        "/oa/v1/messages/count_tokens",
        &[],
        r#"{"messages":[]}"#,
    )
    .json();
    assert_eq!(v, json!({"input_tokens": COUNT_TOKENS}));
}

#[test]
fn agent_streams_decode_event_by_event_in_every_coding() {
    let up = Upstream::start();
    let body = r#"{"stream":true}"#;
    // The usage event's index, and where its first half ends (compressed, each half is a chunk).
    for (path, usage_event, cut) in [(RESPONSES, 10, "\"inpu"), (MESSAGES, 7, "\"outp")] {
        let plain = post(&up, &format!("{path}{FAST}"), &[], body).raw_body();
        for coding in Coding::COMPRESSED {
            let ae = [("accept-encoding", coding.name())];
            let resp = post(&up, &format!("{path}{FAST}"), &ae, body);
            assert_eq!(resp.header("content-encoding"), Some(coding.name()));
            assert_eq!(resp.body(), plain, "{path} {coding:?}");
            let first = coding.decode_prefix(&resp.chunks[..1].concat());
            assert!(
                first.starts_with(b"event: ") && first.ends_with(b"\n\n"),
                "{coding:?}"
            );
            let half = coding.decode_prefix(&resp.chunks[..usage_event + 1].concat());
            let half = String::from_utf8(half).unwrap();
            assert!(half.ends_with(cut), "{path} {coding:?}: {half}");
        }
    }
}

/// The demo model on the agent APIs, counted as the SDK suite states it.
#[test]
fn the_demo_model_echoes_and_counts_on_the_agent_apis() {
    let up = Upstream::model("demo", crate::net::local_addr(), Duration::ZERO);
    let body = json!({"model": "x-9", "instructions": "Be brief now.", "input": [
        {"role": "user", "content": "first words"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "say this back"}]}]});
    let v = post(&up, "/r/v1/responses", &[], &body.to_string()).json();
    assert_eq!(v["model"], "x-9");
    assert_eq!(v["output"][0]["type"], "reasoning");
    assert_eq!(v["output"][1]["content"][0]["text"], "Echo: say this back");
    // Prompt: 3 (instructions, cached) + 2 + 1 + 3; output: 4 + 3 reasoning.
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 9, "input_tokens_details": {"cached_tokens": 3},
            "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 16})
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = named_events(&post(&up, "/r/v1/responses", &[], &streamed.to_string()));
    let text: String = events
        .iter()
        .filter(|(e, _)| e == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Echo: say this back");
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["usage"], v["usage"]);
    assert_eq!(done["output"][1]["content"], v["output"][1]["content"]);

    let msgs = json!({"model": "c-9", "max_tokens": 100, "system": "You are terse.",
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "long context here", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": " and a question"}]}]});
    let v = post(&up, "/c/v1/messages", &[], &msgs.to_string()).json();
    assert_eq!(
        (v["model"].clone(), v["content"][0]["text"].clone()),
        (
            json!("c-9"),
            json!("Echo: long context here and a question")
        )
    );
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 3, "cache_creation_input_tokens": 3,
            "cache_read_input_tokens": 3, "output_tokens": 7})
    );
    let mut streamed = msgs.clone();
    streamed["stream"] = json!(true);
    streamed["max_tokens"] = json!(2);
    let events = named_events(&post(&up, "/c/v1/messages", &[], &streamed.to_string()));
    assert_eq!(events[0].1["message"]["usage"]["output_tokens"], 1);
    assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 3);
    let delta = &events[events.len() - 2].1;
    assert_eq!(
        (
            delta["delta"]["stop_reason"].clone(),
            delta["usage"]["output_tokens"].clone()
        ),
        (json!("max_tokens"), json!(2))
    );

    let resp = post(&up, "/c/v1/messages/count_tokens", &[], &msgs.to_string());
    assert_eq!(resp.json(), json!({"input_tokens": 9}));
    assert_eq!(resp.header("x-demo-model"), Some("c-9"));
}

/// A malformed body is refused over HTTP in OpenAI's error shape; a tool call streams whole.
#[test]
fn the_demo_model_refuses_malformed_bodies_and_streams_tool_calls() {
    let up = Upstream::model("demo", crate::net::local_addr(), Duration::ZERO);
    let bad = r#"{"messages":[{"role":"user","content":"hi"},{"role":"tool","content":"x"}]}"#;
    let resp = post(&up, "/v1/chat/completions", &[], bad);
    assert_eq!(resp.status, 400);
    assert_eq!(
        resp.json(),
        json!({"error": {"message": "messages[1].tool_call_id is required",
            "type": "invalid_request_error", "param": null, "code": null}})
    );
    let body = json!({"input": "go", "stream": true,
        "tools": [{"type": "function", "name": "f"}]});
    let events = named_events(&post(&up, "/v1/responses", &[], &body.to_string()));
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["output"][1]["arguments"], r#"{"text":"go"}"#);
    assert_eq!(done["output"][1]["call_id"], "call_0");
}

/// `?cut_after=K` in model mode: K events, then the connection drops with no end of body.
#[test]
fn the_demo_models_streams_are_cut_after_k_events_when_asked() {
    let up = Upstream::model("demo", crate::net::local_addr(), Duration::ZERO);
    for (path, body, k) in [
        (
            "/v1/chat/completions?cut_after=3",
            json!({"stream": true, "messages": [{"role": "user", "content": "a b c d"}]}),
            3,
        ),
        (
            "/v1/messages?cut_after=2",
            json!({"stream": true, "max_tokens": 9, "messages": [{"role": "user", "content": "a"}]}),
            2,
        ),
    ] {
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: up\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        let (status, _, raw) = crate::http::raw(up.port, request.as_bytes());
        assert_eq!(status, 200);
        let text = String::from_utf8_lossy(&raw);
        assert_eq!(text.matches("data: ").count(), k, "{path}: {text}");
        assert!(
            !text.contains("[DONE]") && !text.ends_with("0\r\n\r\n"),
            "{text}"
        );
    }
}
