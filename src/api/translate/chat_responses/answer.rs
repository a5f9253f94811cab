//! A Responses answer as a chat completion, and a Responses server's error as OpenAI's error
//! shape.
//!
//! One choice: its `content` the `output_text` parts of the message items joined (null when
//! there are none), its `refusal` their `refusal` parts; each `function_call` item a tool call
//! (`custom_tool_call` a custom one), in order; the reasoning items' summaries (or, from open
//! servers that show it, their reasoning text) as `reasoning_content`, vLLM's name for it. The
//! `finish_reason` is `length` or `content_filter` for a response cut short for that reason,
//! else `tool_calls` when it calls tools, else `stop`. The usage is the same counts under
//! chat's names. Other items (hosted tools' calls, which the request never asks for) are
//! dropped.

use serde_json::{json, Map, Value};

use super::{completion_id, created, finish_reason, usage};
use crate::api::translate::Asked;

/// The chat completion for a Responses answer (`asked.model` when it names no model).
pub(crate) fn to_chat(response: &Value, asked: &Asked) -> Value {
    let mut text = String::new();
    let mut any_text = false;
    let mut refusal: Option<String> = None;
    let mut reasoning = Vec::new();
    let mut calls = Vec::new();
    for item in response["output"].as_array().into_iter().flatten() {
        match item["type"].as_str() {
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    match part["type"].as_str() {
                        Some("output_text") => {
                            any_text = true;
                            text.push_str(part["text"].as_str().unwrap_or_default());
                        }
                        Some("refusal") => {
                            let said = part["refusal"].as_str().unwrap_or_default();
                            refusal.get_or_insert_with(String::new).push_str(said);
                        }
                        _ => {}
                    }
                }
            }
            Some("reasoning") => reasoning.extend(reasoning_texts(item)),
            Some("function_call") => calls.push(json!({
                "id": item["call_id"].clone(),
                "type": "function",
                "function": {"name": item["name"].clone(), "arguments": arguments(&item["arguments"])},
            })),
            Some("custom_tool_call") => calls.push(json!({
                "id": item["call_id"].clone(),
                "type": "custom",
                "custom": {"name": item["name"].clone(), "input": item["input"].as_str().unwrap_or_default()},
            })),
            _ => {}
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert("content".into(), any_text.then_some(text).into());
    message.insert("refusal".into(), refusal.into());
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(reasoning.join("\n\n")));
    }
    let has_calls = !calls.is_empty();
    if has_calls {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let model = response["model"].as_str().unwrap_or(&asked.model);
    let mut chat = Map::new();
    chat.insert("id".into(), json!(completion_id(response["id"].as_str())));
    chat.insert("object".into(), json!("chat.completion"));
    chat.insert("created".into(), json!(created(response)));
    chat.insert("model".into(), json!(model));
    chat.insert(
        "choices".into(),
        json!([{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(response, has_calls),
        }]),
    );
    if let Some(usage) = usage(response.get("usage")) {
        chat.insert("usage".into(), usage);
    }
    if let Some(tier) = response.get("service_tier").filter(|t| t.is_string()) {
        chat.insert("service_tier".into(), tier.clone());
    }
    Value::Object(chat)
}

/// A reasoning item's texts: its summary's, else the reasoning text open servers show.
fn reasoning_texts(item: &Value) -> Vec<String> {
    let texts = |member: &str| -> Vec<String> {
        (item[member].as_array().into_iter().flatten())
            .filter_map(|part| part["text"].as_str())
            .filter(|text| !text.is_empty())
            .map(str::to_string)
            .collect()
    };
    let summary = texts("summary");
    if summary.is_empty() {
        texts("content")
    } else {
        summary
    }
}

/// A call's arguments as chat's JSON text (a server that sent an object gets it written).
fn arguments(arguments: &Value) -> String {
    match arguments {
        Value::String(text) => text.clone(),
        Value::Null => "{}".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::translate::openai_error;

    fn asked() -> Asked {
        Asked {
            model: "gpt-asked".into(),
            usage: false,
            freeform: Vec::new(),
        }
    }

    #[test]
    fn text_reasoning_and_calls_become_one_choice() {
        let response = json!({
            "id": "resp_1", "object": "response", "created_at": 1_764_000_000, "model": "gpt-5",
            "status": "completed", "incomplete_details": null,
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": [
                    {"type": "summary_text", "text": "**Plan**"},
                    {"type": "summary_text", "text": "Look it up."},
                ]},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [
                    {"type": "output_text", "text": "Let me ", "annotations": []},
                    {"type": "output_text", "text": "check.", "annotations": []},
                ]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_2", "name": "sql", "input": "SELECT 1"},
                {"type": "web_search_call", "id": "ws_1"},
            ],
            "usage": {"input_tokens": 51, "output_tokens": 27, "total_tokens": 78,
                "input_tokens_details": {"cached_tokens": 13}, "output_tokens_details": {"reasoning_tokens": 9}},
        });
        assert_eq!(
            to_chat(&response, &asked()),
            json!({
                "id": "chatcmpl-resp_1", "object": "chat.completion", "created": 1_764_000_000,
                "model": "gpt-5",
                "choices": [{"index": 0, "logprobs": null, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "Let me check.", "refusal": null,
                    "reasoning_content": "**Plan**\n\nLook it up.",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                        {"id": "call_2", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}},
                    ],
                }}],
                "usage": {"prompt_tokens": 51, "completion_tokens": 27, "total_tokens": 78,
                    "prompt_tokens_details": {"cached_tokens": 13},
                    "completion_tokens_details": {"reasoning_tokens": 9}},
            })
        );
    }

    #[test]
    fn an_answer_without_text_has_null_content_and_reasoning_text_counts() {
        let response = json!({"id": "r", "output": [
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}},
        ]});
        let chat = to_chat(&response, &asked());
        let message = &chat["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["reasoning_content"], "think");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            "{\"a\":1}"
        );
        assert_eq!(chat["model"], "gpt-asked");
        assert!(chat.get("usage").is_none());
        let refused = json!({"output": [{"type": "message", "content": [{"type": "refusal", "refusal": "No."}]}]});
        let message = &to_chat(&refused, &asked())["choices"][0]["message"];
        assert_eq!(
            (&message["content"], &message["refusal"]),
            (&Value::Null, &json!("No."))
        );
    }

    #[test]
    fn finish_reasons_follow_status_and_calls() {
        let call =
            json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]);
        for (status, reason, output, finish) in [
            ("completed", Value::Null, json!([]), "stop"),
            ("completed", Value::Null, call.clone(), "tool_calls"),
            (
                "incomplete",
                json!("max_output_tokens"),
                json!([]),
                "length",
            ),
            // Cut mid-call: the call is not one to run.
            (
                "incomplete",
                json!("max_output_tokens"),
                call.clone(),
                "length",
            ),
            (
                "incomplete",
                json!("content_filter"),
                json!([]),
                "content_filter",
            ),
        ] {
            let response = json!({"status": status, "incomplete_details": {"reason": reason}, "output": output});
            assert_eq!(
                to_chat(&response, &asked())["choices"][0]["finish_reason"],
                finish,
                "{response}"
            );
        }
    }

    #[test]
    fn upstream_errors_take_openais_shape_kept_when_already_in_it() {
        let openai = br#"{"error":{"message":"Unknown parameter: 'x'.","type":"invalid_request_error","param":"x","code":"unknown_parameter"}}"#;
        assert_eq!(
            openai_error(400, openai),
            serde_json::from_slice::<Value>(openai).unwrap()
        );
        let vllm = br#"{"object":"error","message":"model not found","type":"NotFoundError","param":null,"code":404}"#;
        assert_eq!(
            openai_error(404, vllm),
            json!({"error": {"message": "model not found", "type": "NotFoundError", "param": null, "code": 404}})
        );
        assert_eq!(
            openai_error(503, b"upstream broke"),
            json!({"error": {"message": "upstream broke", "type": "server_error", "param": null, "code": null}})
        );
        assert_eq!(
            openai_error(422, br#"{"detail":"bad"}"#)["error"]["message"],
            "bad"
        );
        assert_eq!(
            openai_error(429, br#"{"error":"slow down"}"#)["error"],
            json!({"message": "slow down", "type": "rate_limit_error", "param": null, "code": null})
        );
    }
}
