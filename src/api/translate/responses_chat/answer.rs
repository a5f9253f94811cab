//! A chat answer as a Responses answer.
//!
//! The first choice becomes the output, in the order a Responses server writes it: its
//! `reasoning_content` a reasoning item, its text a message item, each tool call a
//! `function_call` item (a `custom_tool_call` for the client's freeform tools). `length` and
//! `content_filter` finish reasons make the response `incomplete`, with the reason. The usage
//! is the chat server's counts in Responses' terms.

use serde_json::Value;

use super::{call_item, envelope, message_item, reasoning_item, response_id, status, usage, Asked};

/// The Responses answer for a chat answer.
pub(crate) fn to_response(chat: &Value, asked: &Asked) -> Value {
    let choice = &chat["choices"][0];
    let message = &choice["message"];
    let id = response_id(chat["id"].as_str());
    let item_id = id.strip_prefix("resp_").unwrap_or(&id);
    let mut output = Vec::new();
    let reasoning = (message["reasoning_content"].as_str()).or(message["reasoning"].as_str());
    if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
        output.push(reasoning_item(item_id, text, "completed"));
    }
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        output.push(message_item(item_id, text, "completed"));
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        let function = &call["function"];
        output.push(call_item(
            &asked.freeform,
            call["id"].as_str().unwrap_or_default(),
            function["name"].as_str().unwrap_or_default(),
            function["arguments"].as_str().unwrap_or("{}"),
            "completed",
        ));
    }
    let model = chat["model"].as_str().unwrap_or(&asked.model);
    let (status, incomplete) = status(choice["finish_reason"].as_str());
    let mut response = envelope(&id, chat["created"].as_u64(), model, status);
    response["incomplete_details"] = incomplete;
    response["output"] = Value::Array(output);
    response["usage"] = usage(chat.get("usage"));
    response
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn asked(freeform: &[&str]) -> Asked {
        Asked {
            model: "gpt-x".into(),
            usage: false,
            freeform: freeform.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn reasoning_text_and_calls_become_items_in_order_with_the_usage() {
        let chat = json!({
            "id": "chatcmpl-1", "created": 1700000000, "model": "qwen",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Checking.", "reasoning_content": "need weather",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "exec", "arguments": "{\"input\":\"ls -la\"}"}},
                ],
            }}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
                      "prompt_tokens_details": {"cached_tokens": 100},
                      "completion_tokens_details": {"reasoning_tokens": 7}},
        });
        let response = to_response(&chat, &asked(&["exec"]));
        assert_eq!(response["id"], "resp_chatcmpl-1");
        assert_eq!(response["object"], "response");
        assert_eq!(response["created_at"], 1700000000);
        assert_eq!(response["status"], "completed");
        assert_eq!(response["model"], "qwen");
        assert_eq!(
            response["output"],
            json!([
                {"type": "reasoning", "id": "rs_chatcmpl-1", "status": "completed", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "need weather"}]},
                {"type": "message", "id": "msg_chatcmpl-1", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}]},
                {"type": "function_call", "id": "fc_call_1", "status": "completed", "call_id": "call_1",
                 "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "custom_tool_call", "id": "ctc_call_2", "status": "completed", "call_id": "call_2",
                 "name": "exec", "input": "ls -la"},
            ])
        );
        assert_eq!(
            response["usage"],
            json!({"input_tokens": 120, "input_tokens_details": {"cached_tokens": 100},
                   "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 7},
                   "total_tokens": 150})
        );
    }

    #[test]
    fn a_cut_answer_is_incomplete_with_its_reason() {
        for (finish, status, reason) in [
            ("stop", "completed", Value::Null),
            (
                "length",
                "incomplete",
                json!({"reason": "max_output_tokens"}),
            ),
            (
                "content_filter",
                "incomplete",
                json!({"reason": "content_filter"}),
            ),
        ] {
            let chat = json!({"choices": [{"finish_reason": finish, "message": {"content": "x"}}]});
            let response = to_response(&chat, &asked(&[]));
            assert_eq!(response["status"], status, "{finish}");
            assert_eq!(response["incomplete_details"], reason, "{finish}");
            assert_eq!(
                response["model"], "gpt-x",
                "the client's model when the answer names none"
            );
        }
    }
}
