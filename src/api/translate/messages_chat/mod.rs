//! Anthropic Messages clients (Claude Code) in front of an OpenAI-compatible chat server: the
//! request becomes a chat request (`request`), the chat answer a Messages answer (`answer`),
//! the chat stream a Messages stream, event by event (`stream`).

pub(crate) mod answer;
pub(crate) mod request;
pub(crate) mod stream;

use super::{Asked, Converters, StreamConvert};

/// The direction's row of converters.
pub(crate) const CONVERTERS: Converters = Converters {
    request: |body, _| request::to_chat(body),
    answer: |chat, asked| answer::to_messages(chat, Some(&asked.model)),
    error: answer::error_to_messages,
    stream: new_stream,
};

fn new_stream(asked: &Asked) -> Box<dyn StreamConvert> {
    Box::new(stream::StreamToMessages::new(&asked.model))
}

/// A chat `finish_reason` as a Messages `stop_reason`.
fn stop_reason(finish: &str) -> &'static str {
    match finish {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// Chat usage (`prompt_tokens` including cached ones) as Messages usage (`input_tokens`
/// excluding cache reads, which are `cache_read_input_tokens`).
fn usage(chat: Option<&serde_json::Value>) -> serde_json::Value {
    let count = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_u64).unwrap_or(0);
    let chat = chat.filter(|u| u.is_object());
    let prompt = count(chat.and_then(|u| u.get("prompt_tokens")));
    let cached = count(chat.and_then(|u| u.pointer("/prompt_tokens_details/cached_tokens")));
    let completion = count(chat.and_then(|u| u.get("completion_tokens")));
    serde_json::json!({
        "input_tokens": prompt.saturating_sub(cached),
        "cache_read_input_tokens": cached,
        "output_tokens": completion,
    })
}
