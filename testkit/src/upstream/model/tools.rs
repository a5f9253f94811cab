//! The demo model's tool calls, deterministic so that a suite can test a whole tool_use →
//! tool_result turn through the gateway. When a request offers function tools, its
//! `tool_choice` is not `"none"` and its last message (input item) is the user's, the model
//! calls instead of writing: the function `tool_choice` names, else the first tool, else, when
//! the user's text has the word `parallel` (any case), two tools or more are offered and
//! `parallel_tool_calls` is not false, the first two. Every call's arguments are
//! `{"text":"<the user's text>"}`, its id `call_<n>`, n counting the calls already in the
//! conversation (unique over a conversation, the same for the same request).

use serde_json::{json, Map, Value};

use super::text::fragments;

pub(in crate::upstream) struct Call {
    pub n: usize,
    pub name: String,
    pub arguments: String,
}

impl Call {
    fn id(&self) -> String {
        format!("call_{}", self.n)
    }

    /// The arguments in three pieces of about equal length, cut between characters: a client
    /// must join them before it parses.
    fn thirds(&self) -> [&str; 3] {
        let a = &self.arguments;
        let mut cuts: Vec<usize> = a.char_indices().map(|(i, _)| i).collect();
        cuts.push(a.len());
        let chars = cuts.len() - 1;
        let (one, two) = (cuts[chars / 3], cuts[chars * 2 / 3]);
        [&a[..one], &a[one..two], &a[two..]]
    }

    /// The Responses `function_call` output item, as streamed first (`done` false) or at last.
    pub(in crate::upstream) fn item(&self, done: bool) -> Value {
        let (arguments, status) = if done {
            (self.arguments.as_str(), "completed")
        } else {
            ("", "in_progress")
        };
        json!({"type": "function_call", "id": format!("fc_{}", self.n), "call_id": self.id(),
            "name": self.name, "arguments": arguments, "status": status})
    }

    /// Its Responses stream events as output item `index`, not yet numbered.
    pub(in crate::upstream) fn events(&self, index: usize) -> Vec<(&'static str, Value)> {
        let item_id = format!("fc_{}", self.n);
        let mut events = vec![(
            "response.output_item.added",
            json!({"output_index": index, "item": self.item(false)}),
        )];
        events.extend(self.thirds().map(|delta| {
            (
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": delta}),
            )
        }));
        events.push((
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": index, "name": self.name,
                "arguments": self.arguments}),
        ));
        events.push((
            "response.output_item.done",
            json!({"output_index": index, "item": self.item(true)}),
        ));
        events
    }
}

/// The calls for a conversation that ends with the user's `text`; `names`: the function
/// tools offered, `named`: the one `tool_choice` names, `first`: the calls made before.
fn plan(
    body: &Map<String, Value>,
    names: &[&str],
    named: Option<&str>,
    text: &str,
    first: usize,
) -> Vec<Call> {
    if names.is_empty() || body.get("tool_choice").and_then(Value::as_str) == Some("none") {
        return Vec::new();
    }
    let parallel = names.len() >= 2
        && body.get("parallel_tool_calls") != Some(&Value::Bool(false))
        && text
            .split(|c: char| !c.is_alphanumeric())
            .any(|word| word.eq_ignore_ascii_case("parallel"));
    let called = match named {
        Some(name) => vec![name],
        None if parallel => names[..2].to_vec(),
        None => names[..1].to_vec(),
    };
    let arguments = json!({ "text": text }).to_string();
    (called.into_iter().enumerate())
        .map(|(i, name)| Call {
            n: first + i,
            name: name.to_string(),
            arguments: arguments.clone(),
        })
        .collect()
}

fn role(v: &Value) -> Option<&str> {
    v.get("role").and_then(Value::as_str)
}

/// A chat request's calls; `texts`: each message's text.
pub(super) fn chat_calls(
    body: &Map<String, Value>,
    names: &[&str],
    messages: &[Value],
    texts: &[String],
) -> Vec<Call> {
    let (Some(last), Some(text)) = (messages.last(), texts.last()) else {
        return Vec::new();
    };
    if role(last) != Some("user") {
        return Vec::new();
    }
    let named = body
        .get("tool_choice")
        .and_then(|c| c.get("function")?.get("name")?.as_str());
    let first = (messages.iter())
        .filter_map(|m| m.get("tool_calls")?.as_array().map(Vec::len))
        .sum();
    plan(body, names, named, text, first)
}

/// The text a chat request's answer echoes: the tool result that ends the conversation, else
/// the last user text.
pub(super) fn chat_echoed<'a>(messages: &[Value], texts: &'a [String]) -> &'a str {
    let echoed = if messages.last().and_then(role) == Some("tool") {
        texts.last()
    } else {
        (messages.iter().zip(texts).rev())
            .find(|(m, _)| role(m) == Some("user"))
            .map(|(_, text)| text)
    };
    echoed.map_or("", String::as_str)
}

/// A Responses request's calls; `texts`: (role, text) per input item, `function_call` and
/// `tool` (an output) standing for the roles calls and their outputs lack.
pub(super) fn responses_calls(
    body: &Map<String, Value>,
    names: &[&str],
    texts: &[(String, String)],
) -> Vec<Call> {
    let Some((_, text)) = texts.last().filter(|(role, _)| role == "user") else {
        return Vec::new();
    };
    let named = body
        .get("tool_choice")
        .filter(|c| c.get("type").and_then(Value::as_str) == Some("function"))
        .and_then(|c| c.get("name")?.as_str());
    let first = texts.iter().filter(|(r, _)| r == "function_call").count();
    plan(body, names, named, text, first)
}

/// The chat message's `tool_calls`.
pub(super) fn chat_tool_calls(calls: &[Call]) -> Value {
    (calls.iter())
        .map(|c| {
            json!({"id": c.id(), "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

/// The chat stream's deltas: each call's id and name, then its arguments in three pieces.
pub(super) fn chat_deltas(calls: &[Call]) -> Vec<Value> {
    let mut deltas = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        deltas.push(
            json!({"tool_calls": [{"index": i, "id": c.id(), "type": "function",
            "function": {"name": c.name, "arguments": ""}}]}),
        );
        deltas.extend(
            c.thirds().map(
                |piece| json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
            ),
        );
    }
    deltas
}

/// The completion tokens the calls count: the fragments of their arguments joined.
pub(super) fn tokens(calls: &[Call]) -> usize {
    let joined: String = calls.iter().map(|c| c.arguments.as_str()).collect();
    fragments(&joined).len()
}

/// A response to a request with tools states them as OpenAI's does: its tools, tool_choice and
/// parallel_tool_calls (defaults where the request left them out).
pub(super) fn state_tools(body: &Map<String, Value>, response: &mut Value) {
    let Some(tools) = body
        .get("tools")
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
    else {
        return;
    };
    let or = |key: &str, default: Value| {
        body.get(key)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(default)
    };
    response["tools"] = tools.clone();
    response["tool_choice"] = or("tool_choice", json!("auto"));
    response["parallel_tool_calls"] = or("parallel_tool_calls", json!(true));
}
