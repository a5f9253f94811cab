//! A chat answer as a Messages answer, and a chat server's error as Anthropic's error shape.
//!
//! The first choice becomes the message: its `reasoning_content` a thinking block (with an
//! empty signature: the chat server signs nothing), its text a text block, each tool call a
//! `tool_use` block with its arguments parsed into the `input` object (arguments that are not
//! a JSON object are kept as `{"arguments": "<the text>"}`, so nothing is lost). The usage is
//! the chat server's counts in Messages' terms.

use serde_json::{json, Map, Value};

use super::{stop_reason, usage};

/// The Messages answer for a chat answer (`model` as the client asked for it when the chat
/// answer has none).
pub(crate) fn to_messages(chat: &Value, model: Option<&str>) -> Value {
    let choice = &chat["choices"][0];
    let message = &choice["message"];
    let mut content = Vec::new();
    if let Some(thinking) = message["reasoning_content"]
        .as_str()
        .filter(|t| !t.is_empty())
    {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        let function = &call["function"];
        let arguments = function["arguments"].as_str().unwrap_or("{}");
        content.push(json!({
            "type": "tool_use",
            "id": call["id"].clone(),
            "name": function["name"].clone(),
            "input": tool_input(arguments),
        }));
    }
    let model = chat["model"].as_str().or(model).unwrap_or_default();
    json!({
        "id": message_id(chat["id"].as_str()),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice["finish_reason"].as_str().unwrap_or("stop")),
        "stop_sequence": Value::Null,
        "usage": usage(chat.get("usage")),
    })
}

/// A tool call's arguments as the `input` object a Messages client expects.
pub(crate) fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => json!({"arguments": arguments}),
    }
}

/// The message id: the chat id with Anthropic's prefix, so clients that check it are content.
pub(crate) fn message_id(chat_id: Option<&str>) -> String {
    match chat_id {
        Some(id) if id.starts_with("msg_") => id.to_string(),
        Some(id) => format!("msg_{id}"),
        None => "msg_translated".to_string(),
    }
}

/// A chat server's error answer (`{"error": {"message", "type"}}`, or anything else) as
/// Anthropic's (`{"type": "error", "error": {"type", "message"}}`); the status is kept.
pub(crate) fn error_to_messages(status: u16, body: &[u8]) -> Value {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().map(|b| b.get("error").unwrap_or(b));
    let message = match error {
        Some(Value::String(text)) => text.clone(),
        Some(e) => {
            (e.get("message").and_then(Value::as_str)).map_or_else(|| e.to_string(), str::to_string)
        }
        None => String::from_utf8_lossy(body).chars().take(1024).collect(),
    };
    let kind = match status {
        400 | 404 | 405 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        529 | 503 => "overloaded_error",
        _ => "api_error",
    };
    let mut error = Map::new();
    error.insert("type".into(), Value::from(kind));
    error.insert("message".into(), Value::from(message));
    json!({"type": "error", "error": error})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_thinking_and_tool_calls_become_blocks_in_order() {
        let chat = json!({
            "id": "chatcmpl-1", "model": "qwen", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me check.", "reasoning_content": "need weather",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "echo", "arguments": "not json"}},
                ],
            }}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 100}},
        });
        assert_eq!(
            to_messages(&chat, Some("claude-x")),
            json!({
                "id": "msg_chatcmpl-1", "type": "message", "role": "assistant", "model": "qwen",
                "content": [
                    {"type": "thinking", "thinking": "need weather", "signature": ""},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "call_2", "name": "echo", "input": {"arguments": "not json"}},
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 20, "cache_read_input_tokens": 100, "output_tokens": 30},
            })
        );
    }

    #[test]
    fn finish_reasons_map_to_stop_reasons() {
        for (finish, stop) in [
            ("stop", "end_turn"),
            ("length", "max_tokens"),
            ("tool_calls", "tool_use"),
            ("content_filter", "refusal"),
        ] {
            let chat = json!({"choices": [{"finish_reason": finish, "message": {"content": "x"}}]});
            assert_eq!(
                to_messages(&chat, Some("m"))["stop_reason"],
                stop,
                "{finish}"
            );
        }
    }

    #[test]
    fn upstream_errors_take_anthropics_shape_with_the_message() {
        let body = br#"{"error":{"message":"model not found","type":"invalid_request_error"}}"#;
        assert_eq!(
            error_to_messages(404, body),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "model not found"}})
        );
        assert_eq!(
            error_to_messages(500, b"upstream broke")["error"]["message"],
            "upstream broke"
        );
        assert_eq!(
            error_to_messages(429, b"{}")["error"]["type"],
            "rate_limit_error"
        );
        assert_eq!(
            error_to_messages(422, br#"{"detail":"bad"}"#)["error"]["message"],
            "{\"detail\":\"bad\"}"
        );
    }
}
