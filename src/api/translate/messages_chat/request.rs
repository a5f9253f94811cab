//! A Messages request as a chat request.
//!
//! Kept or converted: `model`; `system` (a string or text blocks) as a leading system message;
//! each message in order, a `system` one mid-conversation kept in place; text blocks, images
//! (base64 or URL) and text documents as content parts; an assistant's `tool_use` blocks as
//! its `tool_calls` (the input as a JSON string); a user's `tool_result` blocks as `tool`
//! messages, in order, before the rest of that user turn; `tools` as functions; `tool_choice`
//! and `disable_parallel_tool_use`; `max_tokens`, `stop_sequences`, `temperature`, `top_p`,
//! `top_k` (the vLLM and SGLang extension); `metadata.user_id` as `user`; `thinking` as
//! `chat_template_kwargs.enable_thinking` and `reasoning_effort`; a streamed request always
//! asks for its usage.
//!
//! Dropped: thinking blocks in the history (a chat server cannot check their signatures),
//! `cache_control`, and members only Anthropic's API acts on (`context_management`,
//! `output_config`, `service_tier`, …). Refused (400 naming them): server tools and
//! Anthropic-defined tools (a `type` other than `custom`), and content blocks a chat message
//! cannot carry.

use serde_json::{json, Map, Value};

use super::super::{shown, Untranslatable};

/// `thinking.budget_tokens` below which effort is `low`, then `medium`; `high` above.
const EFFORT_STEPS: [(u64, &str); 2] = [(4_096, "low"), (16_384, "medium")];

/// The chat request for a Messages request `body` (already checked by the Messages reader).
pub(crate) fn to_chat(body: Value) -> Result<Value, Untranslatable> {
    let Value::Object(mut request) = body else {
        return Err(Untranslatable::field("body", "must be a JSON object"));
    };
    // Most of an agent's request is its tools' descriptions and schemas: moved, not copied.
    let tools = request.remove("tools");
    let request = &request;
    let mut out = Map::new();
    if let Some(model) = request.get("model") {
        out.insert("model".into(), model.clone());
    }
    let mut messages = Vec::new();
    if let Some(system) = request.get("system") {
        messages.push(json!({"role": "system", "content": text_of(system, "system")?}));
    }
    let history = request.get("messages").and_then(Value::as_array);
    for (i, message) in history.into_iter().flatten().enumerate() {
        push_message(&mut messages, message, i)?;
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(Value::Array(tools)) = tools {
        let tools = (tools.into_iter().enumerate())
            .map(|(i, tool)| function(tool, i))
            .collect::<Result<Vec<_>, _>>()?;
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = request.get("tool_choice") {
        tool_choice(choice, &mut out)?;
    }
    for (from, to) in [
        ("max_tokens", "max_tokens"),
        ("stop_sequences", "stop"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
    ] {
        if let Some(value) = request.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), value.clone());
        }
    }
    let user = request.get("metadata").and_then(|m| m.get("user_id"));
    if let Some(user) = user.filter(|v| v.is_string()) {
        out.insert("user".into(), user.clone());
    }
    if let Some(thinking) = request.get("thinking") {
        thinking_options(thinking, &mut out);
    }
    if request.get("stream") == Some(&Value::Bool(true)) {
        out.insert("stream".into(), Value::Bool(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(Value::Object(out))
}

/// One Messages message as one or more chat messages.
fn push_message(out: &mut Vec<Value>, message: &Value, i: usize) -> Result<(), Untranslatable> {
    let role = message
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("user");
    let blocks = match message.get("content") {
        Some(Value::Array(blocks)) => blocks,
        Some(text @ Value::String(_)) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        _ => {
            let field = format!("messages[{i}].content");
            return Err(Untranslatable::field(
                &field,
                "must be a string or an array",
            ));
        }
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let at = || format!("messages[{i}].content[{j}]");
        match kind {
            "text" => parts.push(
                json!({"type": "text", "text": block.get("text").cloned().unwrap_or_default()}),
            ),
            "image" => parts.push(image(block, &at())?),
            "document" => parts.push(json!({"type": "text", "text": document_text(block, &at())?})),
            "tool_use" => calls.push(tool_call(block)),
            // The tool's answer is its own chat message, before what the user says next.
            "tool_result" => out.push(tool_message(block, &at())?),
            // A chat server cannot check a thinking block's signature: the history goes without.
            "thinking" | "redacted_thinking" => {}
            other => {
                let why = format!("of type {} has no chat equivalent", shown(other));
                return Err(Untranslatable::field(&at(), &why));
            }
        }
    }
    if parts.is_empty() && calls.is_empty() {
        return Ok(());
    }
    let mut chat = Map::new();
    chat.insert("role".into(), Value::from(role));
    let content = match (parts.len(), parts.first()) {
        (0, _) => Value::Null,
        // One text part reads as a plain string, which every chat server takes.
        (1, Some(only)) if only["type"] == "text" => only["text"].clone(),
        _ => Value::Array(parts),
    };
    chat.insert("content".into(), content);
    if !calls.is_empty() {
        chat.insert("tool_calls".into(), Value::Array(calls));
    }
    out.push(Value::Object(chat));
    Ok(())
}

/// `system`, or a tool result's content: a string, or the text of its text blocks joined.
fn text_of(value: &Value, field: &str) -> Result<String, Untranslatable> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let texts = blocks.iter().filter_map(|b| b.get("text")?.as_str());
            Ok(texts.collect::<Vec<_>>().join("\n\n"))
        }
        _ => Err(Untranslatable::field(
            field,
            "must be a string or an array of text blocks",
        )),
    }
}

/// An image block as an `image_url` part: a data URI for base64 data, else its URL.
fn image(block: &Value, at: &str) -> Result<Value, Untranslatable> {
    let source = &block["source"];
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => {
            let media = source["media_type"].as_str().unwrap_or("image/png");
            let data = source["data"].as_str().unwrap_or_default();
            format!("data:{media};base64,{data}")
        }
        Some("url") => source["url"].as_str().unwrap_or_default().to_string(),
        _ => {
            return Err(Untranslatable::field(
                at,
                "is an image whose source is neither base64 nor a URL",
            ))
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// A document block's text: only plain-text documents have one a chat message can carry.
fn document_text(block: &Value, at: &str) -> Result<String, Untranslatable> {
    let source = &block["source"];
    match (source["type"].as_str(), source["data"].as_str()) {
        (Some("text"), Some(text)) => Ok(text.to_string()),
        _ => Err(Untranslatable::field(
            at,
            "is a document that is not plain text",
        )),
    }
}

/// A `tool_use` block as a chat tool call (its input as a JSON string).
fn tool_call(block: &Value) -> Value {
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    json!({
        "id": block.get("id").cloned().unwrap_or_default(),
        "type": "function",
        "function": {"name": block.get("name").cloned().unwrap_or_default(), "arguments": input.to_string()},
    })
}

/// A `tool_result` block as a `tool` message; an error result says so in its first words.
fn tool_message(block: &Value, at: &str) -> Result<Value, Untranslatable> {
    let mut content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(content) => text_of(content, &format!("{at}.content"))?,
    };
    if block.get("is_error") == Some(&Value::Bool(true)) {
        content.insert_str(0, "Error: ");
    }
    Ok(json!({
        "role": "tool",
        "tool_call_id": block.get("tool_use_id").cloned().unwrap_or_default(),
        "content": content,
    }))
}

/// A client tool as a chat function; server tools and Anthropic-defined ones are refused.
fn function(tool: Value, i: usize) -> Result<Value, Untranslatable> {
    match tool.get("type").and_then(Value::as_str) {
        None | Some("custom") => {}
        Some(other) => {
            let why = format!(
                "is of type {}, which a chat server cannot run",
                shown(other)
            );
            return Err(Untranslatable::field(&format!("tools[{i}]"), &why));
        }
    }
    let Value::Object(mut tool) = tool else {
        return Err(Untranslatable::field(
            &format!("tools[{i}]"),
            "must be an object",
        ));
    };
    let mut function = Map::new();
    function.insert("name".into(), tool.remove("name").unwrap_or_default());
    if let Some(description) = tool.remove("description") {
        function.insert("description".into(), description);
    }
    let schema = tool.remove("input_schema");
    function.insert(
        "parameters".into(),
        schema.unwrap_or_else(|| json!({"type": "object"})),
    );
    Ok(json!({"type": "function", "function": function}))
}

/// `tool_choice`: `auto`, `any` (required), `tool` (that function) or `none`;
/// `disable_parallel_tool_use` as `parallel_tool_calls: false`.
fn tool_choice(choice: &Value, out: &mut Map<String, Value>) -> Result<(), Untranslatable> {
    let chat = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            json!({"type": "function", "function": {"name": choice.get("name").cloned().unwrap_or_default()}})
        }
        _ => {
            return Err(Untranslatable::field(
                "tool_choice.type",
                "must be auto, any, tool or none",
            ))
        }
    };
    out.insert("tool_choice".into(), chat);
    if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
        out.insert("parallel_tool_calls".into(), Value::Bool(false));
    }
    Ok(())
}

/// `thinking`: on (`enabled`, `adaptive`) or off, as chat template switch; a budget as effort.
fn thinking_options(thinking: &Value, out: &mut Map<String, Value>) {
    let on = match thinking.get("type").and_then(Value::as_str) {
        Some("disabled") => false,
        Some(_) => true,
        None => return,
    };
    out.insert(
        "chat_template_kwargs".into(),
        json!({"enable_thinking": on}),
    );
    if let Some(budget) = thinking
        .get("budget_tokens")
        .and_then(Value::as_u64)
        .filter(|_| on)
    {
        let effort = (EFFORT_STEPS.iter())
            .find(|(below, _)| budget < *below)
            .map_or("high", |(_, effort)| effort);
        out.insert("reasoning_effort".into(), Value::from(effort));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Value {
        to_chat(body).expect("translated")
    }

    #[test]
    fn system_text_and_a_mid_conversation_system_message_keep_their_places() {
        let out = chat(json!({
            "model": "m", "max_tokens": 64, "stream": true,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "system", "content": "skills: none"},
                {"role": "assistant", "content": "hello"},
            ],
        }));
        assert_eq!(
            out,
            json!({
                "model": "m", "max_tokens": 64, "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "hi"},
                    {"role": "system", "content": "skills: none"},
                    {"role": "assistant", "content": "hello"},
                ],
            })
        );
    }

    #[test]
    fn a_tool_round_trip_becomes_tool_calls_then_a_tool_message() {
        let out = chat(json!({
            "model": "m", "max_tokens": 10,
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "look it up", "signature": "sig"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ]},
            ],
        }));
        assert_eq!(
            out["tools"][0],
            json!({"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
        );
        assert_eq!(out["tool_choice"], json!("required"));
        assert_eq!(out["parallel_tool_calls"], json!(false));
        let messages = out["messages"].as_array().unwrap();
        assert_eq!(
            messages[1],
            json!({
                "role": "assistant", "content": "Checking.",
                "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}],
            })
        );
        assert_eq!(
            messages[2],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"})
        );
        assert_eq!(
            messages[3],
            json!({"role": "user", "content": "And tomorrow?"})
        );
        assert_eq!(messages.len(), 4);
    }

    #[test]
    fn images_documents_and_errors_of_tools_are_carried() {
        let out = chat(json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}},
                {"type": "tool_result", "tool_use_id": "t", "is_error": true, "content": "boom"},
            ]},
        ]}));
        let messages = out["messages"].as_array().unwrap();
        assert_eq!(
            messages[0],
            json!({"role": "tool", "tool_call_id": "t", "content": "Error: boom"})
        );
        assert_eq!(
            messages[1]["content"],
            json!([
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "text", "text": "notes"},
            ])
        );
    }

    #[test]
    fn parameters_thinking_and_the_user_map_across() {
        let out = chat(json!({
            "model": "m", "max_tokens": 100, "stop_sequences": ["END"], "temperature": 0.5,
            "top_p": 0.9, "top_k": 20, "metadata": {"user_id": "u-1"},
            "thinking": {"type": "enabled", "budget_tokens": 8000},
            "context_management": {"edits": []}, "output_config": {"effort": "high"},
            "messages": [{"role": "user", "content": "x"}],
        }));
        assert_eq!(out["stop"], json!(["END"]));
        assert_eq!(out["top_k"], json!(20));
        assert_eq!(out["user"], json!("u-1"));
        assert_eq!(
            out["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
        assert_eq!(out["reasoning_effort"], json!("medium"));
        assert!(out.get("context_management").is_none() && out.get("output_config").is_none());
        assert!(out.get("stream").is_none() && out.get("stream_options").is_none());
        let off = chat(
            json!({"model": "m", "max_tokens": 1, "thinking": {"type": "disabled"}, "messages": []}),
        );
        assert_eq!(
            off["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        assert!(off.get("reasoning_effort").is_none());
    }

    #[test]
    fn server_tools_and_blocks_without_a_chat_form_are_refused_by_name() {
        let refused = |body: Value| to_chat(body).unwrap_err().0;
        assert_eq!(
            refused(
                json!({"max_tokens": 1, "messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
            ),
            "tools[0] is of type \"web_search_20250305\", which a chat server cannot run"
        );
        assert_eq!(
            refused(
                json!({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "server_tool_use"}]}]})
            ),
            "messages[0].content[0] of type \"server_tool_use\" has no chat equivalent"
        );
        assert_eq!(
            refused(json!({"max_tokens": 1, "messages": [], "tool_choice": {"type": "sometimes"}})),
            "tool_choice.type must be auto, any, tool or none"
        );
    }

    #[test]
    fn the_captured_claude_code_request_translates() {
        let text = include_str!("../../../../tests/fixtures/agents/claude_code_messages.json");
        let body: Value = serde_json::from_str(text).unwrap();
        let out = chat(body.clone());
        let tools = out["tools"].as_array().unwrap();
        assert_eq!(tools.len(), body["tools"].as_array().unwrap().len());
        assert!(tools
            .iter()
            .all(|t| t["type"] == "function" && t["function"]["parameters"].is_object()));
        assert_eq!(out["messages"][0]["role"], "system");
        assert_eq!(out["max_tokens"], body["max_tokens"]);
        assert_eq!(out["stream_options"], json!({"include_usage": true}));
        assert_eq!(
            out["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
    }
}
