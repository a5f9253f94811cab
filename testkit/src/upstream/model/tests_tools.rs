//! The demo model's tool calls on chat completions (`tools.rs`): the call, JSON and streamed,
//! the parallel rule, the ids, and the echo of a tool's result (the agent APIs':
//! `tests_agent_tools.rs`).

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{text, Answer, Model, Refusal};

pub(super) type Endpoint = fn(&Map<String, Value>, &Model) -> Result<Answer, Refusal>;

pub(super) fn answer(endpoint: Endpoint, body: &Value) -> Answer {
    match endpoint(body.as_object().unwrap(), &Model::new(Duration::ZERO)) {
        Ok(answer) => answer,
        Err(_) => panic!("refused {body}"),
    }
}

pub(super) fn json_answer(endpoint: Endpoint, body: &Value) -> Value {
    match answer(endpoint, body) {
        Answer::Json(v) => v,
        _ => panic!("not JSON: {body}"),
    }
}

fn chunks(body: &Value) -> Vec<Value> {
    match answer(text::chat, body) {
        Answer::Stream(chunks) => chunks,
        _ => panic!("not a stream: {body}"),
    }
}

fn chat_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "lookup"}}])
}

fn chat_asking(text: &str) -> Value {
    json!({"model": "m", "tools": chat_tools(), "messages": [{"role": "user", "content": text}]})
}

/// The JSON text of `{"text": text}`, as the model writes arguments.
pub(super) fn arguments(text: &str) -> String {
    json!({ "text": text }).to_string()
}

#[test]
fn a_chat_request_with_tools_is_answered_with_a_call() {
    let text = "weather in \"Paris\", météo ☀";
    let v = json_answer(text::chat, &chat_asking(text));
    let args = r#"{"text":"weather in \"Paris\", météo ☀"}"#;
    assert_eq!(arguments(text), args);
    assert_eq!(
        v["choices"][0],
        json!({"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
            "content": null, "reasoning_content": "Thinking about it.", "tool_calls": [{
                "id": "call_0", "type": "function",
                "function": {"name": "get_weather", "arguments": args}}]}})
    );
    // Prompt: 5 fragments; completion: the arguments' 5 and the reasoning's 3.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13,
            "completion_tokens_details": {"reasoning_tokens": 3}})
    );

    let mut streamed = chat_asking(text);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = chunks(&streamed);
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert_eq!(deltas[0], &json!({"role": "assistant", "content": ""}));
    assert!(deltas[1..4]
        .iter()
        .all(|d| d["reasoning_content"].is_string()));
    assert_eq!(
        deltas[4],
        &json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}]})
    );
    let pieces: Vec<&str> = deltas[5..8]
        .iter()
        .map(|d| {
            assert_eq!(d["tool_calls"][0]["index"], 0);
            assert!(d["tool_calls"][0].get("id").is_none());
            d["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert!(pieces.iter().all(|p| !p.is_empty()));
    assert_eq!(pieces.concat(), args);
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(rest.len(), 9);
    assert_eq!(rest[8]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(usage["usage"], v["usage"]);
}

#[test]
fn tools_are_called_by_the_parallel_rule_or_by_name() {
    let single = chat_tools()[0].clone();
    let cases = [
        (
            "check both in parallel please",
            json!({}),
            vec!["get_weather", "lookup"],
        ),
        ("PARALLEL, now", json!({}), vec!["get_weather", "lookup"]),
        (
            "parallelism is not the word",
            json!({}),
            vec!["get_weather"],
        ),
        (
            "in parallel",
            json!({"parallel_tool_calls": false}),
            vec!["get_weather"],
        ),
        (
            "in parallel",
            json!({"tools": [single]}),
            vec!["get_weather"],
        ),
        (
            "in parallel",
            json!({"tool_choice": {"type": "function", "function": {"name": "lookup"}}}),
            vec!["lookup"],
        ),
        (
            "one",
            json!({"tool_choice": "required"}),
            vec!["get_weather"],
        ),
        ("in parallel", json!({"tool_choice": "none"}), vec![]),
    ];
    for (text, extra, want) in cases {
        let mut body = chat_asking(text);
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let v = json_answer(text::chat, &body);
        let message = &v["choices"][0]["message"];
        let calls = message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = calls
            .iter()
            .map(|c| c["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, want, "{body}");
        for (i, call) in calls.iter().enumerate() {
            assert_eq!(call["id"], format!("call_{i}"));
            assert_eq!(call["function"]["arguments"], arguments(text));
        }
        if want.is_empty() {
            assert_eq!(message["content"], format!("Echo: {text}"));
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
        }
    }
    // Streamed, one call after the other; the completion counts both arguments joined.
    let mut body = chat_asking("a b in parallel");
    body["stream"] = json!(true);
    let indices: Vec<(u64, bool)> = chunks(&body)
        .iter()
        .filter_map(|c| {
            let call = &c["choices"][0]["delta"]["tool_calls"][0];
            Some((call["index"].as_u64()?, call.get("id").is_some()))
        })
        .collect();
    let want = [(0, true), (0, false), (0, false), (0, false)];
    let want: Vec<(u64, bool)> = [want, want.map(|(_, id)| (1, id))].concat();
    assert_eq!(indices, want);
    let v = json_answer(text::chat, &chat_asking("a b in parallel"));
    // `{"text":"a ` `b ` `in ` `parallel"}{"text":"a ` `b ` `in ` `parallel"}`: 7, and 3 reasoning.
    assert_eq!(v["usage"]["completion_tokens"], 10);
}

#[test]
fn a_chat_tool_result_is_echoed_and_later_calls_count_on() {
    let call = |id: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
        "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]})
    };
    let result = json!({"role": "tool", "tool_call_id": "call_0",
        "content": [{"type": "text", "text": "sun"}, {"type": "text", "text": "ny"}]});
    let mut body = chat_asking("weather?");
    body["messages"] = json!([{"role": "user", "content": "weather?"}, call("call_0"), result]);
    let v = json_answer(text::chat, &body);
    assert_eq!(
        v["choices"][0],
        json!({"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
            "content": "Echo: sunny", "reasoning_content": "Thinking about it."}})
    );
    body["stream"] = json!(true);
    let streamed: String = chunks(&body)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(streamed, "Echo: sunny");
    // The next user turn: call_1, call_0 being the conversation's.
    body["stream"] = json!(false);
    body["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "again"}));
    let v = json_answer(text::chat, &body);
    assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["id"], "call_1");
}
