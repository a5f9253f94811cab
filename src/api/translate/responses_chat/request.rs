//! A Responses request as a chat request. The bridge is stateless: everything the answer
//! needs must be in the request.
//!
//! Kept or converted: `model`; `instructions` as a leading system message; `input` as a string
//! (one user message) or items in order: messages of any role (`developer` as `system`, which
//! every chat server takes) with `input_text`/`output_text` parts as text and `input_image`
//! (URL or data URI) as `image_url`; `function_call` and `custom_tool_call` items as the
//! assistant's `tool_calls` (consecutive calls in one message); `function_call_output` and
//! `custom_tool_call_output` as `tool` messages; function tools as functions, `custom`
//! (freeform) tools as a function with one string parameter `input`, the tools of a
//! `namespace` (and of Codex's `additional_tools` items) flattened; `tool_choice`,
//! `parallel_tool_calls`; `text.format` as `response_format`; `reasoning.effort` as
//! `reasoning_effort`; `max_output_tokens` as `max_tokens`; `temperature`, `top_p`; `user` (or
//! `safety_identifier`); a streamed request always asks for its usage.
//!
//! Dropped: `reasoning` items (a chat server cannot read them back), `store: false`,
//! `include`, `prompt_cache_key`, `client_metadata`, `metadata`, `text.verbosity`,
//! `truncation`, `service_tier`. Refused (400 naming the field): what needs state or the
//! provider's own tools: `previous_response_id`, `conversation`, `prompt`, `store: true`,
//! `background: true`, `item_reference` items, image and file parts by `file_id`, hosted tools
//! (`web_search`, `file_search`, `mcp`, …) and items of their calls.

use serde_json::{json, Map, Value};

use super::super::{shown, Asked, Untranslatable};

/// The chat request for a Responses request `body` (already checked by the Responses reader);
/// notes in `asked` the freeform tools, whose calls go back as their own item type.
pub(crate) fn to_chat(body: &Value, asked: &mut Asked) -> Result<Value, Untranslatable> {
    let Some(request) = body.as_object() else {
        return Err(Untranslatable::field("body", "must be a JSON object"));
    };
    refuse_state(request)?;
    let mut out = Map::new();
    if let Some(model) = request.get("model") {
        out.insert("model".into(), model.clone());
    }
    let mut messages = Vec::new();
    let mut tools = Vec::new();
    match request.get("instructions") {
        Some(Value::String(text)) if !text.is_empty() => {
            messages.push(json!({"role": "system", "content": text}));
        }
        _ => {}
    }
    match request.get("input") {
        Some(text @ Value::String(_)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                push_item(&mut messages, &mut tools, asked, item, i)?;
            }
        }
        _ => {}
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(list) = request.get("tools").and_then(Value::as_array) {
        for (i, tool) in list.iter().enumerate() {
            add_tool(&mut tools, asked, tool, &format!("tools[{i}]"))?;
        }
    }
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = request.get("tool_choice") {
        out.insert("tool_choice".into(), tool_choice(choice)?);
    }
    if let Some(parallel) = request
        .get("parallel_tool_calls")
        .filter(|v| v.is_boolean())
    {
        out.insert("parallel_tool_calls".into(), parallel.clone());
    }
    if let Some(format) = body.pointer("/text/format") {
        if let Some(format) = response_format(format) {
            out.insert("response_format".into(), format);
        }
    }
    if let Some(effort) = body.pointer("/reasoning/effort").filter(|e| e.is_string()) {
        out.insert("reasoning_effort".into(), effort.clone());
    }
    for (from, to) in [
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("safety_identifier", "user"),
        ("user", "user"),
    ] {
        if let Some(value) = request.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), value.clone());
        }
    }
    if request.get("stream") == Some(&Value::Bool(true)) {
        out.insert("stream".into(), Value::Bool(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(Value::Object(out))
}

/// What only a stateful Responses server can do.
fn refuse_state(request: &Map<String, Value>) -> Result<(), Untranslatable> {
    let set = |name: &str| request.get(name).is_some_and(|v| !v.is_null());
    for name in ["previous_response_id", "conversation", "prompt"] {
        if set(name) {
            return Err(Untranslatable::field(
                name,
                "needs state the gateway's bridge does not keep: send the whole conversation in `input`",
            ));
        }
    }
    for name in ["store", "background"] {
        if request.get(name) == Some(&Value::Bool(true)) {
            return Err(Untranslatable::field(
                name,
                "cannot be true on a translated service: the chat server behind it keeps nothing",
            ));
        }
    }
    Ok(())
}

/// One input item as chat messages (or, for Codex's `additional_tools`, as tools).
fn push_item(
    messages: &mut Vec<Value>,
    tools: &mut Vec<Value>,
    asked: &mut Asked,
    item: &Value,
    i: usize,
) -> Result<(), Untranslatable> {
    let at = || format!("input[{i}]");
    let kind = item.get("type").and_then(Value::as_str);
    match kind {
        None | Some("message") => messages.push(message(item, &at())?),
        Some("function_call") => {
            let arguments = match item.get("arguments") {
                Some(Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
                None => "{}".to_string(),
            };
            push_call(messages, item, arguments);
        }
        Some("custom_tool_call") => {
            let input = item.get("input").cloned().unwrap_or_default();
            push_call(messages, item, json!({"input": input}).to_string());
        }
        Some("function_call_output" | "custom_tool_call_output") => messages.push(json!({
            "role": "tool",
            "tool_call_id": item.get("call_id").cloned().unwrap_or_default(),
            "content": output_text(item.get("output"), &format!("{}.output", at()))?,
        })),
        // The model's own reasoning: a chat server cannot read it back.
        Some("reasoning") => {}
        Some("additional_tools") => {
            let list = item.get("tools").and_then(Value::as_array);
            for (j, tool) in list.into_iter().flatten().enumerate() {
                add_tool(tools, asked, tool, &format!("{}.tools[{j}]", at()))?;
            }
        }
        Some(other) => {
            let why = format!(
                "is of type {}, which the bridge cannot send to a chat server",
                shown(other)
            );
            return Err(Untranslatable::field(&at(), &why));
        }
    }
    Ok(())
}

/// A message item: its role (`developer` read as `system`) and its parts.
fn message(item: &Value, at: &str) -> Result<Value, Untranslatable> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some("developer") => "system",
        Some(role) => role,
        None => "user",
    };
    let content = match item.get("content") {
        Some(text @ Value::String(_)) => text.clone(),
        Some(Value::Array(parts)) => {
            let parts = (parts.iter().enumerate())
                .map(|(j, part)| chat_part(part, &format!("{at}.content[{j}]")))
                .collect::<Result<Vec<_>, _>>()?;
            match parts.as_slice() {
                // Text alone reads as a plain string, which every chat server takes.
                texts if texts.iter().all(|p| p["type"] == "text") => {
                    let texts: Vec<&str> =
                        texts.iter().filter_map(|p| p["text"].as_str()).collect();
                    Value::from(texts.concat())
                }
                _ => Value::Array(parts),
            }
        }
        _ => {
            let field = format!("{at}.content");
            return Err(Untranslatable::field(
                &field,
                "must be a string or an array",
            ));
        }
    };
    Ok(json!({"role": role, "content": content}))
}

/// One content part as a chat part.
fn chat_part(part: &Value, at: &str) -> Result<Value, Untranslatable> {
    match part.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => {
            Ok(json!({"type": "text", "text": part.get("text").cloned().unwrap_or_default()}))
        }
        Some("refusal") => {
            Ok(json!({"type": "text", "text": part.get("refusal").cloned().unwrap_or_default()}))
        }
        Some("input_image") => match part.get("image_url").and_then(Value::as_str) {
            Some(url) => {
                let mut image = json!({"url": url});
                if let Some(detail) = part.get("detail").filter(|d| d.is_string()) {
                    image["detail"] = detail.clone();
                }
                Ok(json!({"type": "image_url", "image_url": image}))
            }
            None => Err(Untranslatable::field(
                at,
                "is an image without an `image_url` (a `file_id` names a file the chat server does not have)",
            )),
        },
        other => {
            let why = format!(
                "of type {} has no chat equivalent",
                shown(other.unwrap_or("(none)"))
            );
            Err(Untranslatable::field(at, &why))
        }
    }
}

/// A call item as a tool call of the assistant message before it (one message per turn).
fn push_call(messages: &mut Vec<Value>, item: &Value, arguments: String) {
    let call = json!({
        "id": item.get("call_id").cloned().unwrap_or_default(),
        "type": "function",
        "function": {"name": item.get("name").cloned().unwrap_or_default(), "arguments": arguments},
    });
    if let Some(last) = messages.last_mut().filter(|m| m["role"] == "assistant") {
        if let Some(calls) = last.get_mut("tool_calls").and_then(Value::as_array_mut) {
            calls.push(call);
            return;
        }
        if let Some(last) = last.as_object_mut() {
            // An assistant message with no calls yet: its text and these calls are one turn.
            if last.get("content").is_some_and(|c| c.as_str() == Some("")) {
                last.insert("content".into(), Value::Null);
            }
            last.insert("tool_calls".into(), Value::Array(vec![call]));
            return;
        }
    }
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
}

/// A call's output: a string, or its text parts joined.
fn output_text(output: Option<&Value>, at: &str) -> Result<String, Untranslatable> {
    match output {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let texts = parts.iter().filter_map(|p| p.get("text")?.as_str());
            Ok(texts.collect::<Vec<_>>().concat())
        }
        Some(_) => Err(Untranslatable::field(
            at,
            "must be a string or an array of parts",
        )),
    }
}

/// A client tool as chat functions (a namespace's tools flattened); hosted tools are refused.
fn add_tool(
    out: &mut Vec<Value>,
    asked: &mut Asked,
    tool: &Value,
    at: &str,
) -> Result<(), Untranslatable> {
    let name = tool.get("name").cloned().unwrap_or_default();
    let mut function = Map::new();
    function.insert("name".into(), name.clone());
    if let Some(description) = tool.get("description").filter(|d| d.is_string()) {
        function.insert("description".into(), description.clone());
    }
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {
            let parameters = tool.get("parameters").filter(|p| p.is_object()).cloned();
            let parameters =
                parameters.unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            function.insert("parameters".into(), parameters);
            if let Some(strict) = tool.get("strict").filter(|s| s.is_boolean()) {
                function.insert("strict".into(), strict.clone());
            }
        }
        // Freeform text in, as the one string a function can take.
        Some("custom") => {
            function.insert("parameters".into(), freeform_parameters());
            if let Some(name) = name.as_str() {
                asked.freeform.push(name.to_string());
            }
        }
        Some("namespace") => {
            let list = tool.get("tools").and_then(Value::as_array);
            for (j, inner) in list.into_iter().flatten().enumerate() {
                add_tool(out, asked, inner, &format!("{at}.tools[{j}]"))?;
            }
            return Ok(());
        }
        other => {
            let kind = other.unwrap_or("(none)");
            // Codex offers web search unless told not to: say how.
            let hint = match kind {
                "web_search" | "web_search_preview" => " (Codex: web_search = \"disabled\")",
                _ => "",
            };
            let why = format!(
                "is of type {}, a tool only the provider can run: leave it out{hint}",
                shown(kind)
            );
            return Err(Untranslatable::field(at, &why));
        }
    }
    out.push(json!({"type": "function", "function": function}));
    Ok(())
}

/// The parameters of a freeform tool's function: its text as `input`.
fn freeform_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The tool's whole input, as free text."}},
        "required": ["input"],
    })
}

/// `tool_choice`: the modes kept, a named function or freeform tool as that function.
fn tool_choice(choice: &Value) -> Result<Value, Untranslatable> {
    if choice.is_string() {
        return Ok(choice.clone());
    }
    match choice.get("type").and_then(Value::as_str) {
        Some("function" | "custom") => Ok(json!({
            "type": "function",
            "function": {"name": choice.get("name").cloned().unwrap_or_default()},
        })),
        // A subset of the tools: the chat server is given them all, and `auto`/`required`.
        Some("allowed_tools") => Ok(choice.get("mode").cloned().unwrap_or_else(|| json!("auto"))),
        other => {
            let why = format!(
                "of type {} names a tool only the provider can run",
                shown(other.unwrap_or("(none)"))
            );
            Err(Untranslatable::field("tool_choice", &why))
        }
    }
}

/// `text.format` as `response_format`; plain text needs none.
fn response_format(format: &Value) -> Option<Value> {
    match format.get("type").and_then(Value::as_str)? {
        "json_object" => Some(json!({"type": "json_object"})),
        "json_schema" => {
            let mut schema = Map::new();
            for member in ["name", "description", "schema", "strict"] {
                if let Some(value) = format.get(member) {
                    schema.insert(member.into(), value.clone());
                }
            }
            Some(json!({"type": "json_schema", "json_schema": schema}))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> (Value, Asked) {
        let mut asked = Asked::default();
        let out = to_chat(&body, &mut asked).expect("translated");
        (out, asked)
    }

    fn refused(body: Value) -> String {
        to_chat(&body, &mut Asked::default())
            .expect_err("refused")
            .0
    }

    #[test]
    fn instructions_and_items_become_messages_in_order() {
        let (out, _) = chat(json!({
            "model": "gpt-x", "instructions": "be brief", "stream": true, "store": false,
            "max_output_tokens": 300, "reasoning": {"effort": "low", "summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
                {"role": "user", "content": [
                    {"type": "input_text", "text": "what is "},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
                ]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xx"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
                {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{\"path\":\".\"}"},
                {"type": "custom_tool_call", "call_id": "c2", "name": "exec", "input": "echo hi"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "hi"}]},
                {"role": "user", "content": "thanks"},
            ],
        }));
        assert_eq!(
            out,
            json!({
                "model": "gpt-x",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "system", "content": "rules"},
                    {"role": "user", "content": [
                        {"type": "text", "text": "what is "},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                    ]},
                    {"role": "assistant", "content": "Let me look.", "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\":\".\"}"}},
                        {"id": "c2", "type": "function", "function": {"name": "exec", "arguments": "{\"input\":\"echo hi\"}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
                    {"role": "tool", "tool_call_id": "c2", "content": "hi"},
                    {"role": "user", "content": "thanks"},
                ],
                "reasoning_effort": "low",
                "max_tokens": 300,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
        );
    }

    #[test]
    fn tools_flatten_namespaces_and_freeform_tools_take_one_string() {
        let (out, asked) = chat(json!({
            "model": "m", "input": "hi", "tool_choice": {"type": "function", "name": "ls"},
            "parallel_tool_calls": false,
            "tools": [
                {"type": "function", "name": "ls", "description": "list", "strict": true,
                 "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
                {"type": "namespace", "name": "functions", "description": "", "tools": [
                    {"type": "custom", "name": "exec", "description": "run", "format": {"type": "grammar"}},
                ]},
            ],
            "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}, "verbosity": "low"},
        }));
        assert_eq!(out["messages"], json!([{"role": "user", "content": "hi"}]));
        assert_eq!(
            out["tools"],
            json!([
                {"type": "function", "function": {"name": "ls", "description": "list", "strict": true,
                  "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
                {"type": "function", "function": {"name": "exec", "description": "run", "parameters": freeform_parameters()}},
            ])
        );
        assert_eq!(asked.freeform, ["exec"]);
        assert_eq!(
            out["tool_choice"],
            json!({"type": "function", "function": {"name": "ls"}})
        );
        assert_eq!(out["parallel_tool_calls"], false);
        assert_eq!(
            out["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": true}})
        );
    }

    #[test]
    fn codex_additional_tools_items_are_tools() {
        let (out, asked) = chat(json!({"model": "m", "input": [
            {"type": "additional_tools", "role": "developer", "tools": [
                {"type": "namespace", "name": "clock", "tools": [
                    {"type": "function", "name": "sleep", "parameters": {"type": "object"}}]}]},
            {"role": "user", "content": "wait"},
        ]}));
        assert_eq!(out["tools"][0]["function"]["name"], "sleep");
        assert_eq!(
            out["messages"],
            json!([{"role": "user", "content": "wait"}])
        );
        assert!(asked.freeform.is_empty());
    }

    #[test]
    fn what_needs_state_or_hosted_tools_is_refused_naming_the_field() {
        for (body, field) in [
            (
                json!({"input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (
                json!({"input": "x", "conversation": "conv_1"}),
                "conversation",
            ),
            (json!({"input": "x", "store": true}), "store"),
            (json!({"input": "x", "background": true}), "background"),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0]",
            ),
            (
                json!({"input": "x", "tool_choice": {"type": "file_search"}}),
                "tool_choice",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
                "input[0]",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
                "input[0].content[0]",
            ),
        ] {
            let message = refused(body.clone());
            assert!(message.starts_with(field), "{body}: {message}");
        }
        // Omitted or false: served.
        chat(
            json!({"input": "x", "store": false, "background": false, "previous_response_id": null}),
        );
    }
}
