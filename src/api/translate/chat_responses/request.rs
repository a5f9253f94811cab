//! A chat-completions request as a stateless Responses request.
//!
//! Kept or converted: `model`; every message in order, as an `input` item: `system` and
//! `developer` messages stay in place as messages of their role (not `instructions`, which
//! would move them ahead of the turns they were written between); user, assistant and unknown
//! roles as messages, a string content kept a string, parts converted (`text` → `input_text`,
//! or `output_text` for the assistant; `image_url` → `input_image` with its `detail`, `auto`
//! when unsaid; `file` → `input_file`; an assistant's `refusal` part and `refusal` member →
//! a `refusal` part; other parts passed as they are); an assistant's `tool_calls` →
//! `function_call` (or `custom_tool_call`) items after its text; `tool` messages →
//! `function_call_output` (or `custom_tool_call_output`) items, their content as text;
//! function tools flattened (`strict: false` when unsaid: Responses' default is strict, chat's
//! is not) and custom tools likewise; `tool_choice`; `parallel_tool_calls`;
//! `response_format` → `text.format` (`json_schema` flattened); `verbosity` →
//! `text.verbosity`; `reasoning_effort` → `reasoning.effort`; `max_completion_tokens` (else
//! `max_tokens`) → `max_output_tokens`; `temperature`, `top_p`, `user`, `metadata`,
//! `service_tier`, `prompt_cache_key`, `safety_identifier`, `stream`; members this module
//! does not know are passed as they are (a server's own extensions, as on a chat server).
//! `store` is always `false`: the bridge is stateless, and Responses stores by default.
//!
//! Dropped: `stream_options` (a Responses stream always ends with its usage), `store` as the
//! client said it, `seed` and `prediction` (hints a Responses server has no member for),
//! `top_logprobs` (without `logprobs` it asks for nothing), what asks for nothing beyond the
//! default (`n: 1`, `logprobs: false`, text-only `modalities`, zero penalties, an empty
//! `logit_bias` or `stop`), a message's `name`, an
//! assistant's `reasoning_content` (Responses takes reasoning back only as items it issued),
//! and Responses' own members sent by a chat client (`input`, `text`, `reasoning`,
//! `max_output_tokens`, `instructions`, `include`, `truncation`: the converted ones stand).
//!
//! Refused (400 naming the member): `n` above 1, `logprobs: true`, `audio` and audio in
//! `modalities`, `stop`, non-zero `presence_penalty`/`frequency_penalty`, `logit_bias` (no
//! Responses member expresses them), `web_search_options` (a hosted tool), tools of another
//! type than `function` or `custom`, the deprecated `functions`/`function_call` and `function`
//! messages (send `tools`), an assistant's `audio`, and `previous_response_id`,
//! `conversation` and `background: true` (they would make the bridge stateful).

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use super::super::Untranslatable;

/// Members converted here or dropped: never passed on as they are.
const HANDLED: [&str; 38] = [
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "verbosity",
    "reasoning_effort",
    "max_completion_tokens",
    "max_tokens",
    "temperature",
    "top_p",
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "stream",
    "stream_options",
    "store",
    "seed",
    "prediction",
    "top_logprobs",
    "n",
    "logprobs",
    "audio",
    "modalities",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "web_search_options",
    "functions",
    "function_call",
    "previous_response_id",
    "conversation",
    "background",
    // Written by the converter from the members above; a client's own would contradict them.
    "input",
];

/// Responses members that no chat member names: a chat client sending one would change what the
/// converted request asks (or make it depend on stored state), so they are dropped.
const RESPONSES_ONLY: [&str; 6] = [
    "text",
    "reasoning",
    "max_output_tokens",
    "instructions",
    "include",
    "truncation",
];

/// Kept under the same name.
const KEPT: [&str; 10] = [
    "model",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "stream",
];

/// The Responses request for a chat request `body` (already checked by the chat reader).
pub(crate) fn to_responses(body: &Value) -> Result<Value, Untranslatable> {
    let Some(request) = body.as_object() else {
        return Err(Untranslatable::field("body", "must be a JSON object"));
    };
    refuse_the_inexpressible(request)?;
    let mut out = Map::new();
    for name in KEPT {
        if let Some(value) = request.get(name).filter(|v| !v.is_null()) {
            out.insert(name.into(), value.clone());
        }
    }
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return Err(Untranslatable::field("messages", "must be an array"));
    };
    out.insert("input".into(), Value::Array(input(messages)?));
    if let Some(tools) = request.get("tools").filter(|v| !v.is_null()) {
        let Some(tools) = tools.as_array() else {
            return Err(Untranslatable::field("tools", "must be an array"));
        };
        let tools = (tools.iter().enumerate())
            .map(|(i, tool)| tool_of(tool, i))
            .collect::<Result<Vec<_>, _>>()?;
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = request.get("tool_choice").filter(|v| !v.is_null()) {
        out.insert("tool_choice".into(), tool_choice(choice));
    }
    let mut text = Map::new();
    if let Some(format) = request.get("response_format").filter(|v| !v.is_null()) {
        text.insert("format".into(), text_format(format));
    }
    if let Some(verbosity) = request.get("verbosity").filter(|v| !v.is_null()) {
        text.insert("verbosity".into(), verbosity.clone());
    }
    if !text.is_empty() {
        out.insert("text".into(), Value::Object(text));
    }
    if let Some(effort) = request.get("reasoning_effort").filter(|v| !v.is_null()) {
        out.insert("reasoning".into(), json!({"effort": effort}));
    }
    let cap = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|name| request.get(*name).filter(|v| !v.is_null()));
    if let Some(cap) = cap {
        out.insert("max_output_tokens".into(), cap.clone());
    }
    out.insert("store".into(), Value::Bool(false));
    for (name, value) in request {
        let name = name.as_str();
        if !HANDLED.contains(&name) && !RESPONSES_ONLY.contains(&name) && !out.contains_key(name) {
            out.insert(name.into(), value.clone());
        }
    }
    Ok(Value::Object(out))
}

/// Members whose meaning a Responses request cannot carry: refused by name rather than
/// silently answered otherwise.
fn refuse_the_inexpressible(request: &Map<String, Value>) -> Result<(), Untranslatable> {
    let set = |name: &str| request.get(name).filter(|v| !v.is_null());
    let no_member = "has no Responses equivalent";
    if set("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err(Untranslatable::field(
            "n",
            "above 1 has no Responses equivalent (a response has one answer)",
        ));
    }
    if set("logprobs") == Some(&Value::Bool(true)) {
        return Err(Untranslatable::field("logprobs", no_member));
    }
    if set("audio").is_some() {
        return Err(Untranslatable::field("audio", no_member));
    }
    let modalities = set("modalities").and_then(Value::as_array);
    if modalities.is_some_and(|m| m.iter().any(|m| m == "audio")) {
        return Err(Untranslatable::field(
            "modalities",
            "asks for audio, which a Responses answer cannot carry",
        ));
    }
    let stop = set("stop").filter(|s| !matches!(s, Value::Array(a) if a.is_empty()));
    if stop.is_some() {
        return Err(Untranslatable::field("stop", no_member));
    }
    for penalty in ["presence_penalty", "frequency_penalty"] {
        if set(penalty)
            .and_then(Value::as_f64)
            .is_some_and(|p| p != 0.0)
        {
            return Err(Untranslatable::field(penalty, no_member));
        }
    }
    let bias = set("logit_bias").filter(|b| !matches!(b, Value::Object(o) if o.is_empty()));
    if bias.is_some() {
        return Err(Untranslatable::field("logit_bias", no_member));
    }
    if set("web_search_options").is_some() {
        return Err(Untranslatable::field(
            "web_search_options",
            "asks for a hosted tool, which the bridge does not run",
        ));
    }
    for deprecated in ["functions", "function_call"] {
        if set(deprecated).is_some() {
            return Err(Untranslatable::field(
                deprecated,
                "is deprecated and not translated: send tools",
            ));
        }
    }
    for state in ["previous_response_id", "conversation"] {
        if set(state).is_some() {
            return Err(Untranslatable::field(
                state,
                "names stored state, which the stateless bridge cannot use",
            ));
        }
    }
    if set("background") == Some(&Value::Bool(true)) {
        return Err(Untranslatable::field(
            "background",
            "is not translated: the bridge is stateless",
        ));
    }
    Ok(())
}

/// The messages as `input` items, in order.
fn input(messages: &[Value]) -> Result<Vec<Value>, Untranslatable> {
    let mut items = Vec::new();
    // The calls of custom tools: their outputs are items of their own type.
    let mut custom_calls = HashSet::new();
    for (i, message) in messages.iter().enumerate() {
        let at = |member: &str| format!("messages[{i}]{member}");
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("user");
        match role {
            "tool" => items.push(tool_output(message, &custom_calls, &at(""))?),
            "function" => {
                return Err(Untranslatable::field(
                    &at(""),
                    "is a deprecated function message: send tool messages",
                ))
            }
            "assistant" => assistant(message, &mut items, &mut custom_calls, &at)?,
            _ => {
                let content = content(message.get("content"), "input_text", &at(".content"))?;
                items.push(json!({"type": "message", "role": role, "content": content}));
            }
        }
    }
    Ok(items)
}

/// An assistant message: its text (or refusal) as a message item, then its calls.
fn assistant(
    message: &Value,
    items: &mut Vec<Value>,
    custom_calls: &mut HashSet<String>,
    at: &dyn Fn(&str) -> String,
) -> Result<(), Untranslatable> {
    for member in ["function_call", "audio"] {
        if message.get(member).is_some_and(|v| !v.is_null()) {
            let why = match member {
                "audio" => "has no Responses equivalent",
                _ => "is deprecated and not translated: send tool_calls",
            };
            return Err(Untranslatable::field(&at(&format!(".{member}")), why));
        }
    }
    let mut content = match message.get("content") {
        Some(Value::String(text)) if text.is_empty() => None,
        None | Some(Value::Null) => None,
        Some(Value::Array(parts)) if parts.is_empty() => None,
        some => Some(content(some, "output_text", &at(".content"))?),
    };
    if let Some(refusal) = message.get("refusal").and_then(Value::as_str) {
        let part = json!({"type": "refusal", "refusal": refusal});
        content = Some(match content {
            Some(Value::Array(mut parts)) => {
                parts.push(part);
                Value::Array(parts)
            }
            Some(Value::String(text)) => json!([{"type": "output_text", "text": text}, part]),
            _ => json!([part]),
        });
    }
    if let Some(content) = content {
        items.push(json!({"type": "message", "role": "assistant", "content": content}));
    }
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(calls)) => calls,
        Some(_) => {
            return Err(Untranslatable::field(
                &at(".tool_calls"),
                "must be an array",
            ))
        }
    };
    for call in calls {
        let id = call.get("id").cloned().unwrap_or_default();
        if call.get("type").and_then(Value::as_str) == Some("custom") {
            let custom = &call["custom"];
            if let Some(id) = id.as_str() {
                custom_calls.insert(id.to_string());
            }
            items.push(json!({
                "type": "custom_tool_call",
                "call_id": id,
                "name": custom.get("name").cloned().unwrap_or_default(),
                "input": custom.get("input").cloned().unwrap_or_default(),
            }));
            continue;
        }
        let function = &call["function"];
        let arguments = match function.get("arguments") {
            Some(Value::String(text)) => text.clone(),
            None | Some(Value::Null) => "{}".to_string(),
            // Some clients send the arguments as an object: Responses wants the JSON text.
            Some(other) => other.to_string(),
        };
        items.push(json!({
            "type": "function_call",
            "call_id": id,
            "name": function.get("name").cloned().unwrap_or_default(),
            "arguments": arguments,
        }));
    }
    Ok(())
}

/// A `tool` message as the output item of its call.
fn tool_output(
    message: &Value,
    custom_calls: &HashSet<String>,
    at: &str,
) -> Result<Value, Untranslatable> {
    let output = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let texts = parts.iter().filter_map(|p| p.get("text")?.as_str());
            texts.collect::<Vec<_>>().join("\n\n")
        }
        Some(_) => {
            return Err(Untranslatable::field(
                &format!("{at}.content"),
                "must be a string or an array of text parts",
            ))
        }
    };
    let id = message.get("tool_call_id").cloned().unwrap_or_default();
    let custom = id.as_str().is_some_and(|id| custom_calls.contains(id));
    let kind = if custom {
        "custom_tool_call_output"
    } else {
        "function_call_output"
    };
    Ok(json!({"type": kind, "call_id": id, "output": output}))
}

/// A message's content: a string kept a string, parts converted (`text` as `text_kind`).
fn content(content: Option<&Value>, text_kind: &str, at: &str) -> Result<Value, Untranslatable> {
    match content {
        None | Some(Value::Null) => Ok(Value::from("")),
        Some(text @ Value::String(_)) => Ok(text.clone()),
        Some(Value::Array(parts)) => Ok(Value::Array(
            parts.iter().map(|part| part_of(part, text_kind)).collect(),
        )),
        Some(_) => Err(Untranslatable::field(at, "must be a string or an array")),
    }
}

/// One content part; a part this module does not know is passed as it is.
fn part_of(part: &Value, text_kind: &str) -> Value {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => {
            json!({"type": text_kind, "text": part.get("text").cloned().unwrap_or_default()})
        }
        Some("image_url") => {
            let image = &part["image_url"];
            // Some clients send the URL itself rather than `{url}`.
            let url = image.get("url").unwrap_or(image).clone();
            let detail = image.get("detail").filter(|d| d.is_string());
            json!({"type": "input_image", "image_url": url, "detail": detail.cloned().unwrap_or_else(|| json!("auto"))})
        }
        Some("file") => {
            let mut file = Map::new();
            file.insert("type".into(), json!("input_file"));
            for member in ["file_id", "file_data", "filename"] {
                if let Some(value) = part["file"].get(member).filter(|v| !v.is_null()) {
                    file.insert(member.into(), value.clone());
                }
            }
            Value::Object(file)
        }
        Some("refusal") => {
            json!({"type": "refusal", "refusal": part.get("refusal").cloned().unwrap_or_default()})
        }
        _ => part.clone(),
    }
}

/// A chat tool as a Responses tool: functions and custom tools flattened; other types refused
/// (a Responses server could read an unknown type as one of its hosted tools).
fn tool_of(tool: &Value, i: usize) -> Result<Value, Untranslatable> {
    let kind = match tool.get("type").and_then(Value::as_str) {
        Some(kind @ ("function" | "custom")) => kind,
        other => {
            let why = format!(
                "is of type {}, which the bridge does not translate (only function and custom)",
                shown(other.unwrap_or("(none)"))
            );
            return Err(Untranslatable::field(&format!("tools[{i}]"), &why));
        }
    };
    // Chat nests the tool under its type's name; Responses does not.
    let inner = &tool[kind];
    let mut out = Map::new();
    out.insert("type".into(), json!(kind));
    out.insert(
        "name".into(),
        inner.get("name").cloned().unwrap_or_default(),
    );
    if let Some(description) = inner.get("description").filter(|v| !v.is_null()) {
        out.insert("description".into(), description.clone());
    }
    if kind == "function" {
        // A function without parameters takes none, as on chat.
        let parameters = inner.get("parameters").filter(|v| !v.is_null()).cloned();
        out.insert(
            "parameters".into(),
            parameters.unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        );
        let strict = inner.get("strict").filter(|v| !v.is_null());
        out.insert(
            "strict".into(),
            strict.cloned().unwrap_or(Value::Bool(false)),
        );
    } else if let Some(format) = inner.get("format").filter(|v| !v.is_null()) {
        out.insert("format".into(), custom_format(format));
    }
    Ok(Value::Object(out))
}

/// A custom tool's format: chat nests a grammar's members, Responses does not.
fn custom_format(format: &Value) -> Value {
    match format.get("grammar").and_then(Value::as_object) {
        Some(grammar) if format["type"] == "grammar" => {
            let mut out = grammar.clone();
            out.insert("type".into(), json!("grammar"));
            Value::Object(out)
        }
        _ => format.clone(),
    }
}

/// `tool_choice`: the modes kept; a named function or custom tool, and an allowed-tools list,
/// flattened; anything else passed as it is.
fn tool_choice(choice: &Value) -> Value {
    let Some(kind) = choice.get("type").and_then(Value::as_str) else {
        return choice.clone();
    };
    match kind {
        "function" | "custom" => {
            let name = choice[kind].get("name").cloned().unwrap_or_default();
            json!({"type": kind, "name": name})
        }
        "allowed_tools" => {
            let allowed = &choice["allowed_tools"];
            let tools: Vec<Value> = (allowed["tools"].as_array().into_iter().flatten())
                .map(|tool| match tool.get("type").and_then(Value::as_str) {
                    Some(kind @ ("function" | "custom")) => {
                        json!({"type": kind, "name": tool[kind].get("name").cloned().unwrap_or_default()})
                    }
                    _ => tool.clone(),
                })
                .collect();
            let mode = allowed
                .get("mode")
                .cloned()
                .unwrap_or_else(|| json!("auto"));
            json!({"type": "allowed_tools", "mode": mode, "tools": tools})
        }
        _ => choice.clone(),
    }
}

/// `response_format` as `text.format`: a JSON schema's members flattened beside its type.
fn text_format(format: &Value) -> Value {
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let mut out = Map::new();
            out.insert("type".into(), json!("json_schema"));
            if let Some(schema) = format["json_schema"].as_object() {
                for (name, value) in schema {
                    out.insert(name.clone(), value.clone());
                }
            }
            Value::Object(out)
        }
        _ => format.clone(),
    }
}

/// A client-chosen name shown in a message: quoted, cut short.
fn shown(name: &str) -> String {
    let short: String = name.chars().take(64).collect();
    Value::from(short).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn responses(body: Value) -> Value {
        to_responses(&body).expect("translated")
    }

    fn refused(body: Value) -> String {
        to_responses(&body).unwrap_err().0
    }

    #[test]
    fn messages_become_input_items_in_order_with_their_roles() {
        let out = responses(json!({
            "model": "gpt-5", "stream": true, "stream_options": {"include_usage": true},
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "file", "file": {"file_id": "file-1"}},
                    {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
                ], "name": "ann"},
                {"role": "system", "content": [{"type": "text", "text": "Mind the image."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A cat."}], "reasoning_content": "hm"},
                {"role": "critic", "content": "fine"},
            ],
        }));
        assert_eq!(
            out,
            json!({
                "model": "gpt-5", "stream": true, "store": false,
                "input": [
                    {"type": "message", "role": "developer", "content": "Be brief."},
                    {"type": "message", "role": "user", "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
                        {"type": "input_file", "file_id": "file-1"},
                        {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
                    ]},
                    {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Mind the image."}]},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A cat."}]},
                    {"type": "message", "role": "critic", "content": "fine"},
                ],
            })
        );
    }

    #[test]
    fn a_tool_round_trip_becomes_calls_after_the_text_then_outputs() {
        let out = responses(json!({
            "model": "m",
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}},
                {"type": "function", "function": {"name": "now"}},
                {"type": "custom", "custom": {"name": "sql", "format": {"type": "grammar",
                    "grammar": {"definition": "start: x", "syntax": "lark"}}}},
            ],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false,
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21 C"}]},
                {"role": "tool", "tool_call_id": "call_2", "content": "1"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_3", "type": "function", "function": {"name": "now", "arguments": "{}"}},
                ]},
            ],
        }));
        assert_eq!(
            out["tools"],
            json!([
                {"type": "function", "name": "get_weather", "description": "Weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true},
                {"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}, "strict": false},
                {"type": "custom", "name": "sql", "format": {"type": "grammar", "definition": "start: x", "syntax": "lark"}},
            ])
        );
        assert_eq!(
            out["tool_choice"],
            json!({"type": "function", "name": "get_weather"})
        );
        assert_eq!(out["parallel_tool_calls"], json!(false));
        assert_eq!(
            out["input"],
            json!([
                {"type": "message", "role": "user", "content": "Weather in Paris?"},
                {"type": "message", "role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "custom_tool_call", "call_id": "call_2", "name": "sql", "input": "SELECT 1"},
                {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
                {"type": "custom_tool_call_output", "call_id": "call_2", "output": "1"},
                {"type": "function_call", "call_id": "call_3", "name": "now", "arguments": "{}"},
            ])
        );
    }

    #[test]
    fn parameters_map_to_their_responses_members() {
        let table = [
            (
                json!({"max_completion_tokens": 100, "max_tokens": 50}),
                json!({"max_output_tokens": 100}),
            ),
            (json!({"max_tokens": 50}), json!({"max_output_tokens": 50})),
            (
                json!({"reasoning_effort": "high"}),
                json!({"reasoning": {"effort": "high"}}),
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}, "strict": true}}}),
                json!({"text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}, "strict": true}}}),
            ),
            (
                json!({"response_format": {"type": "json_object"}, "verbosity": "low"}),
                json!({"text": {"format": {"type": "json_object"}, "verbosity": "low"}}),
            ),
            (
                json!({"tool_choice": "required"}),
                json!({"tool_choice": "required"}),
            ),
            (
                json!({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "f"}}]}}}),
                json!({"tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "f"}]}}),
            ),
            (
                json!({"temperature": 0.2, "top_p": 0.9, "user": "u", "metadata": {"a": "b"}, "service_tier": "flex"}),
                json!({"temperature": 0.2, "top_p": 0.9, "user": "u", "metadata": {"a": "b"}, "service_tier": "flex"}),
            ),
            // Dropped: hints without a member, the client's store, a single answer, no stop.
            (
                json!({"seed": 7, "store": true, "n": 1, "stop": null, "presence_penalty": 0, "logit_bias": {}, "stream_options": {"include_usage": true}}),
                json!({}),
            ),
            // A server's own extension passes, but never over what the converter writes.
            (json!({"top_k": 20, "include": ["x"]}), json!({"top_k": 20})),
        ];
        for (given, expected) in table {
            let mut body = given.clone();
            body["model"] = json!("m");
            body["messages"] = json!([]);
            let mut expected = expected.clone();
            expected["model"] = json!("m");
            expected["input"] = json!([]);
            expected["store"] = json!(false);
            assert_eq!(responses(body), expected, "{given}");
        }
    }

    #[test]
    fn what_a_responses_request_cannot_express_is_refused_by_name() {
        let body = |extra: Value| {
            let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            body
        };
        for (extra, says) in [
            (json!({"n": 2}), "n above 1"),
            (json!({"logprobs": true}), "logprobs has no"),
            (
                json!({"audio": {"voice": "alloy", "format": "wav"}}),
                "audio has no",
            ),
            (
                json!({"modalities": ["text", "audio"]}),
                "modalities asks for audio",
            ),
            (json!({"stop": ["END"]}), "stop has no"),
            (
                json!({"frequency_penalty": 0.5}),
                "frequency_penalty has no",
            ),
            (json!({"logit_bias": {"50256": -100}}), "logit_bias has no"),
            (
                json!({"web_search_options": {}}),
                "web_search_options asks for a hosted tool",
            ),
            (
                json!({"functions": [{"name": "f"}]}),
                "functions is deprecated",
            ),
            (
                json!({"previous_response_id": "resp_1"}),
                "previous_response_id names stored state",
            ),
            (json!({"background": true}), "background is not translated"),
            (
                json!({"tools": [{"type": "web_search"}]}),
                "tools[0] is of type \"web_search\", which the bridge does not translate",
            ),
            (
                json!({"messages": [{"role": "function", "name": "f", "content": "x"}]}),
                "messages[0] is a deprecated function message",
            ),
            (
                json!({"messages": [{"role": "assistant", "audio": {"id": "a"}}]}),
                "messages[0].audio has no",
            ),
            (json!({"messages": {}}), "messages must be an array"),
            (
                json!({"messages": [{"role": "user", "content": 5}]}),
                "messages[0].content must be a string or an array",
            ),
        ] {
            let why = refused(body(extra.clone()));
            assert!(why.starts_with(says), "{extra}: {why}");
        }
        assert!(to_responses(
            &json!({"model": "m", "messages": [], "modalities": ["text"], "logprobs": false})
        )
        .is_ok());
    }

    #[test]
    fn an_assistants_refusal_and_object_arguments_are_carried() {
        let out = responses(json!({"model": "m", "messages": [
            {"role": "assistant", "content": "", "refusal": "I can't."},
            {"role": "assistant", "content": "Sure", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
            ]},
        ]}));
        assert_eq!(
            out["input"],
            json!([
                {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
                {"type": "message", "role": "assistant", "content": "Sure"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{\"a\":1}"},
            ])
        );
    }
}
