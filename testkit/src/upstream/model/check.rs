//! What the demo model refuses: a body malformed in its own dialect, as vLLM and OpenAI refuse
//! one, so that a suite whose request was answered has proved the gateway (a dialect bridge
//! above all) sent a valid body. Each refusal names the member at fault; members not checked
//! are accepted, as vLLM accepts extensions such as `top_k` and `chat_template_kwargs`.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::Refusal;

type Checked = Result<(), Refusal>;

fn bad(message: String) -> Refusal {
    Refusal::Invalid(message)
}

/// `obj[key]` as a string; `at` names `obj` in the refusal.
fn string<'a>(obj: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, Refusal> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(bad(format!("{at}.{key} is required"))),
        Some(_) => Err(bad(format!("{at}.{key} must be a string"))),
    }
}

fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, Refusal> {
    v.as_object()
        .ok_or_else(|| bad(format!("{at} must be an object")))
}

/// `v` as an array, absent or null as none.
fn list<'a>(v: Option<&'a Value>, at: &str) -> Result<&'a [Value], Refusal> {
    match v {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(bad(format!("{at} must be an array"))),
    }
}

const CHAT_ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// A chat completions body; the function names of its `tools`, in order, when valid.
pub(super) fn chat(body: &Map<String, Value>) -> Result<Vec<&str>, Refusal> {
    let messages = match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        _ => return Err(bad("messages must be a non-empty array".into())),
    };
    // A tool result answers a call the conversation made before it, as vLLM's templates need.
    let mut issued = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let m = object(m, &at)?;
        let role = string(m, "role", &at)?;
        if !CHAT_ROLES.contains(&role) {
            let roles = CHAT_ROLES.join(", ");
            return Err(bad(format!("{at}.role must be one of {roles}")));
        }
        chat_content(m.get("content"), &at)?;
        match role {
            "assistant" => issued.extend(assistant_calls(m, &at)?),
            "tool" if !issued.contains(string(m, "tool_call_id", &at)?) => {
                return Err(bad(format!(
                    "{at}.tool_call_id names no tool call of an earlier assistant message"
                )))
            }
            _ => {}
        }
    }
    let names = chat_tools(body.get("tools"))?;
    chat_tool_choice(body, &names)?;
    Ok(names)
}

fn chat_content(content: Option<&Value>, at: &str) -> Checked {
    let parts = match content {
        None | Some(Value::Null | Value::String(_)) => return Ok(()),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(bad(format!(
                "{at}.content must be a string, null or an array of content parts"
            )))
        }
    };
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let part = object(part, &at)?;
        match string(part, "type", &at)? {
            "text" => {
                string(part, "text", &at)?;
            }
            "image_url" => {
                let at = format!("{at}.image_url");
                string(
                    object(part.get("image_url").unwrap_or(&Value::Null), &at)?,
                    "url",
                    &at,
                )?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The ids of an assistant message's tool calls.
fn assistant_calls<'a>(m: &'a Map<String, Value>, at: &str) -> Result<Vec<&'a str>, Refusal> {
    let at = format!("{at}.tool_calls");
    let calls = list(m.get("tool_calls"), &at)?;
    let mut ids = Vec::new();
    for (k, call) in calls.iter().enumerate() {
        let at = format!("{at}[{k}]");
        let call = object(call, &at)?;
        ids.push(string(call, "id", &at)?);
        if call.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(format!("{at}.type must be \"function\"")));
        }
        let at = format!("{at}.function");
        let function = object(call.get("function").unwrap_or(&Value::Null), &at)?;
        string(function, "name", &at)?;
        // A string of JSON, never the object itself: the mistake a converter makes.
        string(function, "arguments", &at)?;
    }
    Ok(ids)
}

fn chat_tools(tools: Option<&Value>) -> Result<Vec<&str>, Refusal> {
    let tools = list(tools, "tools")?;
    let mut names = Vec::new();
    for (k, tool) in tools.iter().enumerate() {
        let at = format!("tools[{k}]");
        let tool = object(tool, &at)?;
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(format!("{at}.type must be \"function\"")));
        }
        let at = format!("{at}.function");
        let function = object(tool.get("function").unwrap_or(&Value::Null), &at)?;
        names.push(string(function, "name", &at)?);
    }
    Ok(names)
}

fn chat_tool_choice(body: &Map<String, Value>, names: &[&str]) -> Checked {
    let named = match body.get("tool_choice") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) if s == "none" => return Ok(()),
        Some(Value::String(s)) if s == "auto" || s == "required" => None,
        Some(Value::Object(c)) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let at = "tool_choice.function";
            Some(string(
                object(c.get("function").unwrap_or(&Value::Null), at)?,
                "name",
                at,
            )?)
        }
        Some(_) => {
            return Err(bad(
                "tool_choice must be \"none\", \"auto\", \"required\" or \
                 {\"type\": \"function\", \"function\": {\"name\": <string>}}"
                    .into(),
            ))
        }
    };
    // vLLM: "When using `tool_choice`, `tools` must be set."
    if matches!(body.get("tools"), None | Some(Value::Null)) {
        return Err(bad("tool_choice needs tools".into()));
    }
    match named {
        Some(name) if !names.contains(&name) => Err(bad(
            "tool_choice.function.name names no function in tools".into(),
        )),
        _ => Ok(()),
    }
}

const RESPONSES_ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];

/// A Responses body; the names of its function tools, in order, when valid.
pub(super) fn responses(body: &Map<String, Value>) -> Result<Vec<&str>, Refusal> {
    match body.get("input") {
        Some(Value::String(_)) => {}
        Some(Value::Array(items)) => input_items(items)?,
        _ => return Err(bad("input must be a string or an array of items".into())),
    }
    let names = responses_tools(body.get("tools"))?;
    responses_tool_choice(body.get("tool_choice"), &names)?;
    Ok(names)
}

fn input_items(items: &[Value]) -> Checked {
    let mut issued = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let item = object(item, &at)?;
        // A message may leave its type out (the SDKs' EasyInputMessage).
        let kind = match item.get("type") {
            None => "message",
            Some(_) => string(item, "type", &at)?,
        };
        match kind {
            "message" => input_message(item, &at)?,
            "function_call" => {
                issued.insert(string(item, "call_id", &at)?);
                string(item, "name", &at)?;
                string(item, "arguments", &at)?;
            }
            "function_call_output" => {
                if !issued.contains(string(item, "call_id", &at)?) {
                    return Err(bad(format!("{at}.call_id names no earlier function_call")));
                }
                match item.get("output") {
                    Some(Value::String(_)) => {}
                    Some(Value::Array(parts)) => input_parts(parts, &format!("{at}.output"))?,
                    _ => return Err(bad(format!("{at}.output must be a string or an array"))),
                }
            }
            "reasoning" => {}
            _ => {
                return Err(bad(format!(
                    "{at}.type must be one of message, function_call, function_call_output, \
                     reasoning"
                )))
            }
        }
    }
    Ok(())
}

fn input_message(item: &Map<String, Value>, at: &str) -> Checked {
    if !RESPONSES_ROLES.contains(&string(item, "role", at)?) {
        let roles = RESPONSES_ROLES.join(", ");
        return Err(bad(format!("{at}.role must be one of {roles}")));
    }
    match item.get("content") {
        Some(Value::String(_)) => Ok(()),
        Some(Value::Array(parts)) => input_parts(parts, &format!("{at}.content")),
        _ => Err(bad(format!("{at}.content must be a string or an array"))),
    }
}

fn input_parts(parts: &[Value], at: &str) -> Checked {
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let part = object(part, &at)?;
        match string(part, "type", &at)? {
            "input_text" | "output_text" => {
                string(part, "text", &at)?;
            }
            "input_image" => {
                if !["image_url", "file_id"]
                    .iter()
                    .any(|k| part.get(*k).is_some_and(Value::is_string))
                {
                    return Err(bad(format!("{at}.image_url must be a string (or file_id)")));
                }
            }
            // Accepted, never read.
            "input_file" | "refusal" => {}
            _ => {
                return Err(bad(format!(
                    "{at}.type must be one of input_text, output_text, input_image, input_file, \
                     refusal"
                )))
            }
        }
    }
    Ok(())
}

fn responses_tools(tools: Option<&Value>) -> Result<Vec<&str>, Refusal> {
    let tools = list(tools, "tools")?;
    let mut names = Vec::new();
    for (k, tool) in tools.iter().enumerate() {
        let at = format!("tools[{k}]");
        let tool = object(tool, &at)?;
        // Hosted tools (web_search, file_search, …) are accepted, never called.
        if string(tool, "type", &at)? != "function" {
            continue;
        }
        if tool.contains_key("function") {
            return Err(bad(format!(
                "{at}.function: a Responses function tool is flat, \
                 {{\"type\": \"function\", \"name\": …}}, not the chat shape"
            )));
        }
        names.push(string(tool, "name", &at)?);
    }
    Ok(names)
}

fn responses_tool_choice(choice: Option<&Value>, names: &[&str]) -> Checked {
    match choice {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if ["none", "auto", "required"].contains(&s.as_str()) => Ok(()),
        Some(Value::Object(c)) if c.get("type").and_then(Value::as_str) == Some("function") => {
            if names.contains(&string(c, "name", "tool_choice")?) {
                Ok(())
            } else {
                Err(bad("tool_choice.name names no function in tools".into()))
            }
        }
        // A hosted tool's choice ({"type": "web_search_preview"}, …).
        Some(Value::Object(c)) if c.get("type").is_some_and(Value::is_string) => Ok(()),
        Some(_) => Err(bad(
            "tool_choice must be \"none\", \"auto\", \"required\" or \
             {\"type\": \"function\", \"name\": <string>}"
                .into(),
        )),
    }
}
