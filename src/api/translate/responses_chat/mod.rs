//! OpenAI Responses clients (Codex CLI) in front of an OpenAI-compatible chat server: the
//! request becomes a chat request (`request`), the chat answer a Responses answer (`answer`),
//! the chat stream a Responses stream, event by event (`stream`). What a Responses answer is
//! made of (its items, its envelope, its usage) is built here for both.

pub(crate) mod answer;
pub(crate) mod request;
pub(crate) mod stream;

use serde_json::{json, Value};

use super::{Asked, Converters, StreamConvert};

/// The direction's row of converters.
pub(crate) const CONVERTERS: Converters = Converters {
    request: |body, asked| request::to_chat(&body, asked),
    answer: answer::to_response,
    error: super::openai_error,
    stream: new_stream,
};

fn new_stream(asked: &Asked) -> Box<dyn StreamConvert> {
    Box::new(stream::StreamToResponses::new(asked))
}

/// A chat `finish_reason` as the Responses `status` and its `incomplete_details`.
fn status(finish: Option<&str>) -> (&'static str, Value) {
    match finish {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("content_filter") => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// Chat usage as Responses usage: the same counts, cached and reasoning tokens included.
fn usage(chat: Option<&Value>) -> Value {
    let count = |path: &str| {
        chat.and_then(|u| u.pointer(path))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (input, output) = (count("/prompt_tokens"), count("/completion_tokens"));
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": count("/prompt_tokens_details/cached_tokens")},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": count("/completion_tokens_details/reasoning_tokens")},
        "total_tokens": input + output,
    })
}

/// The response object around `output`, with the members the SDKs' models expect.
fn envelope(id: &str, created: Option<u64>, model: &str, status: &str) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": created.unwrap_or(0),
        "status": status,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "metadata": {},
        "model": model,
        "output": [],
        "parallel_tool_calls": true,
        "temperature": null,
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "store": false,
        "usage": null,
    })
}

/// The response id for a chat id.
fn response_id(chat_id: Option<&str>) -> String {
    match chat_id {
        Some(id) if id.starts_with("resp_") => id.to_string(),
        Some(id) => format!("resp_{id}"),
        None => "resp_translated".to_string(),
    }
}

/// A reasoning item: the chat server's reasoning text, as open-weight models' Responses
/// servers give it (`reasoning_text` content, no summary).
fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "reasoning", "id": format!("rs_{id}"), "status": status, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    })
}

/// The assistant's message item.
fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message", "id": format!("msg_{id}"), "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    })
}

/// A tool call as the client declared the tool: a freeform tool's call carries its `input`
/// text (the function's one argument), any other a function call with its arguments.
fn call_item(
    freeform: &[String],
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    if freeform.iter().any(|f| f == name) {
        return json!({
            "type": "custom_tool_call", "id": format!("ctc_{call_id}"), "status": status,
            "call_id": call_id, "name": name, "input": freeform_input(arguments),
        });
    }
    json!({
        "type": "function_call", "id": format!("fc_{call_id}"), "status": status,
        "call_id": call_id, "name": name, "arguments": arguments,
    })
}

/// A freeform tool's input from the arguments its function was called with.
fn freeform_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(mut args)) => match args.remove("input") {
            Some(Value::String(text)) => text,
            _ => arguments.to_string(),
        },
        _ => arguments.to_string(),
    }
}
