//! The agent APIs' part of the model-body oracle (`model_body.rs`): the refusals Responses,
//! Messages and `count_tokens` bodies may get, and the bodies they must accept, on
//! serde_json's own reading.

use serde_json::{Map, Value};

use crate::api::Endpoint;

pub(super) const RESPONSES_ERRORS: [&str; 8] = [
    "input is required",
    "input appears more than once",
    "input must be a string or an array",
    "input[N] must be an object",
    "prompt appears more than once",
    "max_output_tokens appears more than once",
    "max_output_tokens must be a non-negative integer",
    "stream appears more than once",
];
pub(super) const RESPONSES_STREAM: [&str; 1] = ["stream must be a boolean"];
/// What Messages and count_tokens bodies can both get.
pub(super) const ANTHROPIC_ERRORS: [&str; 12] = [
    "messages is required",
    "messages appears more than once",
    "messages must be a non-empty array",
    "messages[N] must be an object",
    "messages[N].role appears more than once",
    "messages[N].role must be a string",
    "messages[N].content appears more than once",
    "messages[N].content must be a string or an array of content blocks",
    "messages[N].content[N] must be an object",
    "system appears more than once",
    "system must be a string or an array",
    "stream appears more than once",
];
/// What only Messages bodies get (count_tokens reads neither `stream` nor `max_tokens`).
pub(super) const MESSAGES_ERRORS: [&str; 4] = [
    "max_tokens is required",
    "max_tokens appears more than once",
    "max_tokens must be a positive integer",
    "stream must be a boolean",
];

/// Whether a Responses, Messages or `count_tokens` body (an object) has the promised shape.
pub(super) fn well_shaped(endpoint: Endpoint, body: &Map<String, Value>) -> bool {
    match endpoint {
        Endpoint::Responses => {
            let boolean = |v: &Value| v.is_boolean() || v.is_null();
            let count = |v: &Value| v.is_u64() || v.is_null();
            let present = |name| body.get(name).is_some_and(|v| !v.is_null());
            body.get("stream").is_none_or(boolean)
                && body.get("max_output_tokens").is_none_or(count)
                && match body.get("input") {
                    Some(Value::String(_)) => true,
                    Some(Value::Array(items)) => items.iter().all(Value::is_object),
                    None | Some(Value::Null) => present("prompt"),
                    Some(_) => false,
                }
        }
        Endpoint::Messages | Endpoint::CountTokens => {
            let messages = endpoint == Endpoint::Messages;
            let message = |m: &Value| {
                m.as_object().is_some_and(|m| {
                    m.get("role").is_some_and(Value::is_string)
                        && match m.get("content") {
                            Some(Value::String(_)) => true,
                            Some(Value::Array(blocks)) => blocks.iter().all(Value::is_object),
                            _ => false,
                        }
                })
            };
            let max_tokens = body.get("max_tokens").and_then(Value::as_u64);
            let stream = body.get("stream");
            let streams = stream.is_none_or(|v| v.is_boolean() || v.is_null());
            (!messages || (max_tokens.is_some_and(|n| n > 0) && streams))
                && body
                    .get("system")
                    .is_none_or(|s| s.is_null() || s.is_string() || s.is_array())
                && body
                    .get("messages")
                    .and_then(Value::as_array)
                    .is_some_and(|ms| !ms.is_empty() && ms.iter().all(message))
        }
        _ => unreachable!("only the agent endpoints come here"),
    }
}
