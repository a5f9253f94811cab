//! One conversation reads and counts the same in the three dialects the model speaks, so that
//! a dialect bridge's answer can be held to the model's own answer in the client's dialect:
//! images and tool results are read alike, and Messages thinks when asked, as chat thinks.

use serde_json::{json, Value};

use super::tests_tools::{answer, json_answer};
use super::{agents, text, Answer, REASONING};

const PNG: &str = "data:image/png;base64,AAAA";

#[test]
fn an_image_is_read_and_counted_alike_in_every_dialect() {
    let chat = json_answer(
        text::chat,
        &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": PNG}}]}]}),
    );
    let responses = json_answer(
        agents::responses,
        &json!({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": PNG}]}]}),
    );
    let messages = json_answer(
        agents::messages,
        &json!({"max_tokens": 100, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
    );
    let echo = "Echo: what is this? [image:image/png]";
    assert_eq!(chat["choices"][0]["message"]["content"], echo);
    assert_eq!(responses["output"][1]["content"][0]["text"], echo);
    assert_eq!(messages["content"][0]["text"], echo);
    // `what ` `is ` `this? ` `[image:image/png]`.
    assert_eq!(chat["usage"]["prompt_tokens"], 4);
    assert_eq!(responses["usage"]["input_tokens"], 4);
    assert_eq!(messages["usage"]["input_tokens"], 4);
    // A URL names no media type.
    let url = json!({"max_tokens": 100, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.png"}}]}]});
    let v = json_answer(agents::messages, &url);
    assert_eq!(v["content"][0]["text"], "Echo:  [image:url]");
}

#[test]
fn a_tool_result_counts_as_prompt_in_every_dialect() {
    let chat = json_answer(
        text::chat,
        &json!({"messages": [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny and warm"}]}),
    );
    let responses = json_answer(
        agents::responses,
        &json!({"input": [{"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "call_0", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_0", "output": "sunny and warm"}]}),
    );
    let messages = json_answer(
        agents::messages,
        &json!({"max_tokens": 100, "messages": [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0",
                "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0",
                "content": "sunny and warm"}]}]}),
    );
    let echo = "Echo: sunny and warm";
    assert_eq!(chat["choices"][0]["message"]["content"], echo);
    assert_eq!(responses["output"][1]["content"][0]["text"], echo);
    assert_eq!(messages["content"][0]["text"], echo);
    // `weather?` and `sunny ` `and ` `warm`.
    assert_eq!(chat["usage"]["prompt_tokens"], 4);
    assert_eq!(responses["usage"]["input_tokens"], 4);
    assert_eq!(messages["usage"]["input_tokens"], 4);
}

#[test]
fn messages_think_only_when_asked_and_count_the_thinking_as_output() {
    let ask = |thinking: Value, stream: bool| {
        json!({"max_tokens": 4096, "thinking": thinking, "stream": stream,
            "messages": [{"role": "user", "content": "hi there"}]})
    };
    let on = json!({"type": "enabled", "budget_tokens": 2048});
    let v = json_answer(agents::messages, &ask(on.clone(), false));
    assert_eq!(
        v["content"],
        json!([{"type": "thinking", "thinking": REASONING, "signature": "demo-signature"},
            {"type": "text", "text": "Echo: hi there"}])
    );
    // `Echo: ` `hi ` `there` and `Thinking ` `about ` `it.`, as chat counts them.
    assert_eq!(v["usage"]["output_tokens"], 6);
    for off in [json!({"type": "disabled"}), Value::Null] {
        let v = json_answer(agents::messages, &ask(off, false));
        assert_eq!(
            v["content"],
            json!([{"type": "text", "text": "Echo: hi there"}])
        );
        assert_eq!(v["usage"]["output_tokens"], 3);
    }

    let Answer::Events(events) = answer(agents::messages, &ask(on, true)) else {
        panic!("not a stream")
    };
    let at = |i: usize| &events[i].1;
    assert_eq!(
        at(1)["content_block"],
        json!({"type": "thinking", "thinking": "", "signature": ""})
    );
    assert_eq!(events[2].0, "ping");
    let thinking: String = (events.iter())
        .filter(|(_, e)| e["delta"]["type"] == "thinking_delta")
        .map(|(_, e)| e["delta"]["thinking"].as_str().unwrap())
        .collect();
    assert_eq!(thinking, REASONING);
    assert_eq!(at(6)["delta"]["type"], "signature_delta");
    assert_eq!(at(7), &json!({"type": "content_block_stop", "index": 0}));
    assert_eq!(at(8)["index"], 1);
    assert_eq!(at(8)["content_block"]["type"], "text");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["usage"]["output_tokens"], 6);
}
