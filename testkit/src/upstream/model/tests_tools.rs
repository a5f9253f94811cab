//! The demo model's tool calls (`tools.rs`): the call, JSON and streamed, the parallel rule,
//! the ids, and the echo of a tool's result, on chat completions and Responses.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{agents, text, Answer, Model, Refusal};

type Endpoint = fn(&Map<String, Value>, &Model) -> Result<Answer, Refusal>;

fn answer(endpoint: Endpoint, body: &Value) -> Answer {
    match endpoint(body.as_object().unwrap(), &Model::new(Duration::ZERO)) {
        Ok(answer) => answer,
        Err(_) => panic!("refused {body}"),
    }
}

fn json_answer(endpoint: Endpoint, body: &Value) -> Value {
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

fn events(body: &Value) -> Vec<(String, Value)> {
    match answer(agents::responses, body) {
        Answer::Events(events) => events,
        _ => panic!("not events: {body}"),
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
fn arguments(text: &str) -> String {
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

fn responses_asking(input: Value) -> Value {
    json!({"model": "r", "input": input, "tools": [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
        {"type": "web_search"},
        {"type": "function", "name": "lookup"}]})
}

fn function_call(n: usize, name: &str, args: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_{n}"),
        "name": name, "arguments": args, "status": "completed"})
}

#[test]
fn a_responses_request_with_tools_is_answered_with_function_calls() {
    let body = responses_asking(json!("what now"));
    let v = json_answer(agents::responses, &body);
    let args = arguments("what now");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["type"], "reasoning");
    assert_eq!(v["output"][1], function_call(0, "get_weather", &args));
    assert_eq!(v["output"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 2, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 3},
            "total_tokens": 7})
    );
    // The tools as received, as OpenAI states them.
    assert_eq!(
        (v["tools"].clone(), v["tool_choice"].clone()),
        (body["tools"].clone(), json!("auto"))
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = events(&streamed);
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    let delta = "response.function_call_arguments.delta";
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.output_item.added",
            delta,
            delta,
            delta,
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(
            (&data["type"], &data["sequence_number"]),
            (&json!(name), &json!(i))
        );
    }
    let mut added = function_call(0, "get_weather", "");
    added["status"] = json!("in_progress");
    assert_eq!(events[4].1["item"], added);
    assert_eq!(events[4].1["output_index"], 1);
    let pieces: String = events[5..8]
        .iter()
        .map(|(_, d)| {
            assert_eq!(
                (&d["item_id"], &d["output_index"]),
                (&json!("fc_0"), &json!(1))
            );
            d["delta"].as_str().unwrap()
        })
        .collect();
    assert_eq!(pieces, args);
    assert_eq!(events[8].1["arguments"], args);
    assert_eq!(events[9].1["item"], v["output"][1]);
    let done = &events[10].1["response"];
    assert_eq!(
        (&done["output"], &done["usage"]),
        (&v["output"], &v["usage"])
    );
}

#[test]
fn responses_calls_follow_the_parallel_rule_and_outputs_are_echoed() {
    let v = json_answer(
        agents::responses,
        &responses_asking(json!([{"role": "user", "content": "both in parallel"}])),
    );
    let args = arguments("both in parallel");
    assert_eq!(
        v["output"].as_array().unwrap()[1..],
        [
            function_call(0, "get_weather", &args),
            function_call(1, "lookup", &args)
        ]
    );
    let mut named = responses_asking(json!("in parallel"));
    named["tool_choice"] = json!({"type": "function", "name": "lookup"});
    let v = json_answer(agents::responses, &named);
    assert_eq!(v["output"][1]["name"], "lookup");
    assert_eq!(v["output"].as_array().unwrap().len(), 2);

    let mut turn = json!([{"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "call_0", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_0", "output": "sunny"}]);
    let v = json_answer(agents::responses, &responses_asking(turn.clone()));
    assert_eq!(v["output"][1]["type"], "message");
    assert_eq!(v["output"][1]["content"][0]["text"], "Echo: sunny");
    turn.as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "again"}));
    let v = json_answer(agents::responses, &responses_asking(turn));
    assert_eq!(
        v["output"][1],
        function_call(1, "get_weather", &arguments("again"))
    );
}
