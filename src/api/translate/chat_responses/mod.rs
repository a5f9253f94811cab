//! OpenAI chat-completions clients in front of a Responses-only server (the newest OpenAI
//! models, which refuse tools with reasoning on chat): the chat request becomes a stateless
//! Responses request (`request`), the response a chat completion (`answer`), the Responses
//! stream a chat-completion chunk stream, event by event (`stream`).

pub(crate) mod answer;
pub(crate) mod request;
pub(crate) mod stream;

use serde_json::{json, Map, Value};

use super::{Asked, Converters, StreamConvert};

/// The direction's row of converters.
pub(crate) const CONVERTERS: Converters = Converters {
    request: |body, _| request::to_responses(&body),
    answer: answer::to_chat,
    error: super::openai_error,
    stream: new_stream,
};

fn new_stream(asked: &Asked) -> Box<dyn StreamConvert> {
    Box::new(stream::StreamToChat::new(asked))
}

/// The chat completion id for a response id: chat clients expect `chatcmpl-`; the response's
/// id is kept after it, so the call can be found in the upstream's records.
fn completion_id(response_id: Option<&str>) -> String {
    match response_id {
        Some(id) if id.starts_with("chatcmpl-") => id.to_string(),
        Some(id) => format!("chatcmpl-{id}"),
        None => "chatcmpl-translated".to_string(),
    }
}

/// A response's `created_at` (seconds; some servers send a float) as chat's `created`.
fn created(response: &Value) -> u64 {
    let at = &response["created_at"];
    at.as_u64()
        .or_else(|| at.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
        .unwrap_or(0)
}

/// How a response ended, as a chat `finish_reason`. A response cut short says so even when
/// it holds calls: a call cut mid-arguments must not read as one to run.
fn finish_reason(response: &Value, has_calls: bool) -> &'static str {
    let incomplete = response["status"] == "incomplete";
    match response
        .pointer("/incomplete_details/reason")
        .and_then(Value::as_str)
    {
        Some("max_output_tokens") if incomplete => "length",
        Some("content_filter") if incomplete => "content_filter",
        _ if has_calls => "tool_calls",
        _ => "stop",
    }
}

/// Responses usage as chat usage: the same counts (both count cached tokens in the prompt),
/// with the details the upstream gave. `None` when it gave no usage object.
fn usage(responses: Option<&Value>) -> Option<Value> {
    let usage = responses.filter(|u| u.is_object())?;
    let count = |at: &str| usage.pointer(at).and_then(Value::as_u64);
    let prompt = count("/input_tokens").unwrap_or(0);
    let completion = count("/output_tokens").unwrap_or(0);
    let total = count("/total_tokens").unwrap_or(prompt.saturating_add(completion));
    let mut out = Map::new();
    out.insert("prompt_tokens".into(), json!(prompt));
    out.insert("completion_tokens".into(), json!(completion));
    out.insert("total_tokens".into(), json!(total));
    if let Some(cached) = count("/input_tokens_details/cached_tokens") {
        out.insert(
            "prompt_tokens_details".into(),
            json!({"cached_tokens": cached}),
        );
    }
    if let Some(reasoning) = count("/output_tokens_details/reasoning_tokens") {
        out.insert(
            "completion_tokens_details".into(),
            json!({"reasoning_tokens": reasoning}),
        );
    }
    Some(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::translate::Pair;
    use crate::api::Api;

    #[test]
    fn the_pair_is_built_and_accepted_on_openai_services() {
        assert_eq!(
            Pair::configured(Api::OpenAi, "chat", "responses"),
            Ok(Pair::ChatToResponses)
        );
    }

    #[test]
    fn usage_keeps_the_counts_and_the_details_given() {
        let responses = json!({"input_tokens": 51, "output_tokens": 27, "total_tokens": 78,
            "input_tokens_details": {"cached_tokens": 13},
            "output_tokens_details": {"reasoning_tokens": 9}});
        assert_eq!(
            usage(Some(&responses)),
            Some(
                json!({"prompt_tokens": 51, "completion_tokens": 27, "total_tokens": 78,
                "prompt_tokens_details": {"cached_tokens": 13},
                "completion_tokens_details": {"reasoning_tokens": 9}})
            )
        );
        assert_eq!(
            usage(Some(&json!({"input_tokens": 2, "output_tokens": 3}))),
            Some(json!({"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}))
        );
        assert_eq!(usage(Some(&Value::Null)), None);
    }

    #[test]
    fn ids_and_times_read_as_chat_clients_expect() {
        assert_eq!(completion_id(Some("resp_1")), "chatcmpl-resp_1");
        assert_eq!(completion_id(Some("chatcmpl-2")), "chatcmpl-2");
        assert_eq!(created(&json!({"created_at": 17.9})), 17);
        assert_eq!(created(&json!({"created_at": -1})), 0);
    }
}
