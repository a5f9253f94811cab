//! The demo model's tool calls on the agent APIs (`tools.rs`): Responses function calls and
//! Messages tool_use blocks, JSON and streamed, the parallel rule, the ids, and the echo of a
//! tool's result.

use serde_json::{json, Value};

use super::tests_tools::{answer, arguments, json_answer, Endpoint};
use super::{agents, Answer};

fn events(endpoint: Endpoint, body: &Value) -> Vec<(String, Value)> {
    match answer(endpoint, body) {
        Answer::Events(events) => events,
        _ => panic!("not events: {body}"),
    }
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
    let events = events(agents::responses, &streamed);
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

fn messages_asking(messages: Value) -> Value {
    json!({"model": "c", "max_tokens": 100, "messages": messages, "tools": [
        {"name": "get_weather", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "custom", "name": "lookup", "input_schema": {"type": "object"}}]})
}

fn tool_use(n: usize, name: &str, text: &str) -> Value {
    json!({"type": "tool_use", "id": format!("toolu_{n}"), "name": name,
        "input": {"text": text}})
}

#[test]
fn a_messages_request_with_tools_is_answered_with_tool_use() {
    let body = messages_asking(json!([{"role": "user", "content": "weather here"}]));
    let v = json_answer(agents::messages, &body);
    assert_eq!(
        v["content"],
        json!([tool_use(0, "get_weather", "weather here")])
    );
    assert_eq!(v["stop_reason"], "tool_use");
    // `{"text":"weather ` `here"}`
    assert_eq!(v["usage"]["output_tokens"], 2);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = events(agents::messages, &streamed);
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    let delta = "content_block_delta";
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            delta,
            delta,
            delta,
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let mut started = tool_use(0, "get_weather", "");
    started["input"] = json!({});
    assert_eq!(events[1].1["content_block"], started);
    let json: String = events[3..6]
        .iter()
        .map(|(_, e)| {
            assert_eq!(e["delta"]["type"], "input_json_delta");
            e["delta"]["partial_json"].as_str().unwrap()
        })
        .collect();
    assert_eq!(json, arguments("weather here"));
    assert_eq!(events[7].1["delta"]["stop_reason"], "tool_use");
    assert_eq!(events[7].1["usage"]["output_tokens"], 2);
}

#[test]
fn messages_tool_use_follows_the_choice_and_results_are_echoed() {
    let ask = |text: &str, choice: Value| {
        let mut body = messages_asking(json!([{"role": "user", "content": text}]));
        body["tool_choice"] = choice;
        json_answer(agents::messages, &body)["content"].clone()
    };
    let both = "both in parallel";
    assert_eq!(
        ask(both, Value::Null),
        json!([
            tool_use(0, "get_weather", both),
            tool_use(1, "lookup", both)
        ])
    );
    let one = json!({"type": "auto", "disable_parallel_tool_use": true});
    assert_eq!(ask(both, one), json!([tool_use(0, "get_weather", both)]));
    let named = json!({"type": "tool", "name": "lookup"});
    assert_eq!(ask(both, named), json!([tool_use(0, "lookup", both)]));
    assert_eq!(
        ask(both, json!({"type": "none"})),
        json!([{"type": "text", "text": "Echo: both in parallel"}])
    );

    let mut turn = json!([{"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [tool_use(0, "get_weather", "weather?")]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0",
            "content": [{"type": "text", "text": "sun"}, {"type": "text", "text": "ny"}]}]}]);
    let v = json_answer(agents::messages, &messages_asking(turn.clone()));
    assert_eq!(
        (v["content"].clone(), v["stop_reason"].clone()),
        (
            json!([{"type": "text", "text": "Echo: sunny"}]),
            json!("end_turn")
        )
    );
    turn.as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "again"}));
    let v = json_answer(agents::messages, &messages_asking(turn));
    assert_eq!(v["content"], json!([tool_use(1, "get_weather", "again")]));
}
