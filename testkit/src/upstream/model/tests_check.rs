//! What the demo model refuses (`check.rs`): each malformed body a 400 naming the member, and
//! what real servers accept passes.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{agents, text, Answer, Model, Refusal};

type Endpoint = fn(&Map<String, Value>, &Model) -> Result<Answer, Refusal>;

/// The refusal's message; None when answered.
fn refusal(endpoint: Endpoint, body: &Value) -> Option<String> {
    match endpoint(body.as_object().unwrap(), &Model::new(Duration::ZERO)) {
        Ok(_) => None,
        Err(Refusal::Invalid(message)) => Some(message),
        Err(_) => Some("(another refusal)".into()),
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// The chat members around a call `call_0` and its result.
fn call_turn() -> (Value, Value) {
    let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_0",
        "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
    (
        call,
        json!({"role": "tool", "tool_call_id": "call_0", "content": "done"}),
    )
}

#[test]
fn malformed_chat_bodies_are_refused_naming_the_member() {
    let (call, result) = call_turn();
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let msgs = |m: Value| json!({"messages": m});
    let content = |c: Value| msgs(json!([{"role": "user", "content": c}]));
    let calls = |c: Value| msgs(json!([user("hi"), {"role": "assistant", "tool_calls": c}]));
    let with_tools = |t: Value| json!({"messages": [user("hi")], "tools": t});
    let choice = |c: Value| json!({"messages": [user("hi")], "tools": tools, "tool_choice": c});
    let choice_must = "tool_choice must be \"none\", \"auto\", \"required\" or \
        {\"type\": \"function\", \"function\": {\"name\": <string>}}";
    let table = [
        (json!({}), "messages must be a non-empty array"),
        (msgs(json!([])), "messages must be a non-empty array"),
        (msgs(json!("hi")), "messages must be a non-empty array"),
        (msgs(json!([1])), "messages[0] must be an object"),
        (
            msgs(json!([{"content": "x"}])),
            "messages[0].role is required",
        ),
        (
            msgs(json!([{"role": 7}])),
            "messages[0].role must be a string",
        ),
        (
            msgs(json!([user("a"), {"role": "function", "content": "x"}])),
            "messages[1].role must be one of system, developer, user, assistant, tool",
        ),
        (
            content(json!(5)),
            "messages[0].content must be a string, null or an array of content parts",
        ),
        (
            content(json!(["hi"])),
            "messages[0].content[0] must be an object",
        ),
        (
            content(json!([{"text": "x"}])),
            "messages[0].content[0].type is required",
        ),
        (
            content(json!([{"type": "text"}])),
            "messages[0].content[0].text is required",
        ),
        (
            content(json!([{"type": "text", "text": 5}])),
            "messages[0].content[0].text must be a string",
        ),
        (
            content(json!([{"type": "image_url", "image_url": "data:image/png;base64,AA"}])),
            "messages[0].content[0].image_url must be an object",
        ),
        (
            content(json!([{"type": "image_url", "image_url": {"url": 5}}])),
            "messages[0].content[0].image_url.url must be a string",
        ),
        (
            msgs(json!([user("a"), call, {"role": "tool", "content": "x"}])),
            "messages[2].tool_call_id is required",
        ),
        (
            msgs(json!([user("a"), call, {"role": "tool", "tool_call_id": 0, "content": "x"}])),
            "messages[2].tool_call_id must be a string",
        ),
        (
            msgs(json!([user("a"), call, {"role": "tool", "tool_call_id": "call_9"}])),
            "messages[2].tool_call_id names no tool call of an earlier assistant message",
        ),
        (
            msgs(json!([user("a"), result, call])),
            "messages[1].tool_call_id names no tool call of an earlier assistant message",
        ),
        (calls(json!({})), "messages[1].tool_calls must be an array"),
        (
            calls(json!([5])),
            "messages[1].tool_calls[0] must be an object",
        ),
        (
            calls(json!([{"type": "function", "function": {"name": "f", "arguments": "{}"}}])),
            "messages[1].tool_calls[0].id is required",
        ),
        (
            calls(json!([{"id": "c", "function": {"name": "f", "arguments": "{}"}}])),
            "messages[1].tool_calls[0].type must be \"function\"",
        ),
        (
            calls(json!([{"id": "c", "type": "function"}])),
            "messages[1].tool_calls[0].function must be an object",
        ),
        (
            calls(json!([{"id": "c", "type": "function", "function": {"arguments": "{}"}}])),
            "messages[1].tool_calls[0].function.name is required",
        ),
        (
            calls(
                json!([{"id": "c", "type": "function", "function": {"name": "f",
                "arguments": {"city": "Paris"}}}]),
            ),
            "messages[1].tool_calls[0].function.arguments must be a string",
        ),
        (with_tools(json!({})), "tools must be an array"),
        (with_tools(json!(["f"])), "tools[0] must be an object"),
        (
            with_tools(json!([{"function": {"name": "f"}}])),
            "tools[0].type must be \"function\"",
        ),
        // The Responses shape, flat, is not chat's.
        (
            with_tools(json!([{"type": "function", "name": "f"}])),
            "tools[0].function must be an object",
        ),
        (
            with_tools(json!([{"type": "function", "function": {"description": "d"}}])),
            "tools[0].function.name is required",
        ),
        (choice(json!("sometimes")), choice_must),
        (choice(json!(1)), choice_must),
        (
            choice(json!({"type": "function", "name": "f"})),
            "tool_choice.function must be an object",
        ),
        (
            choice(json!({"type": "function", "function": {"name": "g"}})),
            "tool_choice.function.name names no function in tools",
        ),
        (
            json!({"messages": [user("hi")], "tool_choice": "auto"}),
            "tool_choice needs tools",
        ),
    ];
    for (body, want) in table {
        assert_eq!(refusal(text::chat, &body).as_deref(), Some(want), "{body}");
    }
}

#[test]
fn what_real_chat_servers_accept_is_answered() {
    let (call, result) = call_turn();
    let accepted = [
        // vLLM's extensions, a developer message, parts of other types.
        json!({"messages": [{"role": "developer", "content": "terse"}, {"role": "user",
            "content": [{"type": "input_audio", "input_audio": {}}, {"type": "text", "text": "x"}]}],
            "top_k": 5, "chat_template_kwargs": {"enable_thinking": false}, "repetition_penalty": 1}),
        json!({"messages": [user("a"), call, result], "tools": null, "tool_choice": "none"}),
        json!({"messages": [user("a"), call, result, user("b")],
            "tools": [{"type": "function", "function": {"name": "f", "strict": true}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        json!({"messages": [user("a"), {"role": "assistant", "content": "x", "tool_calls": []}],
            "tools": []}),
    ];
    for body in accepted {
        assert_eq!(refusal(text::chat, &body), None, "{body}");
    }
}

#[test]
fn malformed_responses_bodies_are_refused_naming_the_member() {
    let call =
        json!({"type": "function_call", "call_id": "call_0", "name": "f", "arguments": "{}"});
    let input = |items: Value| json!({"input": items});
    let part = |p: Value| input(json!([{"role": "user", "content": [p]}]));
    let tools = |t: Value| json!({"input": "hi", "tools": t});
    let choice = |c: Value| json!({"input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": c});
    let table = [
        (
            json!({}),
            "input must be a string or an array of items".to_string(),
        ),
        (
            input(json!(5)),
            "input must be a string or an array of items".into(),
        ),
        (input(json!([5])), "input[0] must be an object".into()),
        (
            input(json!([{"type": 5}])),
            "input[0].type must be a string".into(),
        ),
        (
            input(json!([{"type": "item_reference", "id": "x"}])),
            "input[0].type must be one of message, function_call, function_call_output, \
             reasoning"
                .into(),
        ),
        (
            input(json!([{"content": "x"}])),
            "input[0].role is required".into(),
        ),
        (
            input(json!([{"role": "tool", "content": "x"}])),
            "input[0].role must be one of user, assistant, system, developer".into(),
        ),
        (
            input(json!([{"type": "message", "role": "user"}])),
            "input[0].content must be a string or an array".into(),
        ),
        (
            part(json!({"type": "text", "text": "x"})),
            "input[0].content[0].type must be one of input_text, output_text, input_image, \
             input_file, refusal"
                .into(),
        ),
        (
            part(json!({"type": "input_text"})),
            "input[0].content[0].text is required".into(),
        ),
        (
            part(json!({"type": "input_image", "image_url": {"url": "u"}})),
            "input[0].content[0].image_url must be a string (or file_id)".into(),
        ),
        (
            input(json!(["x", {"type": "function_call", "name": "f", "arguments": "{}"}])),
            "input[0] must be an object".into(),
        ),
        (
            input(json!([{"type": "function_call", "name": "f", "arguments": "{}"}])),
            "input[0].call_id is required".into(),
        ),
        (
            input(
                json!([{"type": "function_call", "call_id": "c", "name": "f",
                "arguments": {}}]),
            ),
            "input[0].arguments must be a string".into(),
        ),
        (
            input(
                json!([call, {"type": "function_call_output", "call_id": "call_1",
                "output": "x"}]),
            ),
            "input[1].call_id names no earlier function_call".into(),
        ),
        (
            input(
                json!([call, {"type": "function_call_output", "call_id": "call_0",
                "output": 5}]),
            ),
            "input[1].output must be a string or an array".into(),
        ),
        (tools(json!("f")), "tools must be an array".into()),
        (
            tools(json!([{"name": "f"}])),
            "tools[0].type is required".into(),
        ),
        (
            tools(json!([{"type": "function"}])),
            "tools[0].name is required".into(),
        ),
        (
            choice(json!({"type": "function", "function": {"name": "f"}})),
            "tool_choice.name is required".into(),
        ),
        (
            choice(json!({"type": "function", "name": "g"})),
            "tool_choice.name names no function in tools".into(),
        ),
        (
            choice(json!("sometimes")),
            "tool_choice must be \"none\", \"auto\", \"required\" or \
             {\"type\": \"function\", \"name\": <string>}"
                .into(),
        ),
    ];
    for (body, want) in table {
        assert_eq!(refusal(agents::responses, &body), Some(want), "{body}");
    }
    // The chat shape of a tool, named as such.
    let chat_tool = tools(json!([{"type": "function", "function": {"name": "f"}}]));
    let message = refusal(agents::responses, &chat_tool).unwrap();
    assert!(message.starts_with("tools[0].function: "), "{message}");
}

#[test]
fn what_openai_accepts_on_responses_is_answered() {
    let accepted = [
        // Codex's: tool_choice without tools, a reasoning item, developer messages.
        json!({"input": [{"type": "reasoning", "summary": []}, {"role": "developer",
            "content": "x"}, {"role": "user", "content": [{"type": "input_image",
            "file_id": "f"}, {"type": "input_file", "file_id": "g"}]}], "tool_choice": "auto",
            "parallel_tool_calls": false, "include": []}),
        json!({"input": "hi", "tools": [{"type": "web_search"}, {"type": "function",
            "name": "f", "parameters": {}, "strict": true}], "tool_choice": {"type": "web_search"}}),
        json!({"input": [{"role": "user", "content": "a"}, {"type": "function_call",
            "call_id": "c", "name": "f", "arguments": "{}", "id": "fc_1"},
            {"type": "function_call_output", "call_id": "c",
                "output": [{"type": "input_text", "text": "done"}]}],
            "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"}),
    ];
    for body in accepted {
        assert_eq!(refusal(agents::responses, &body), None, "{body}");
    }
}
