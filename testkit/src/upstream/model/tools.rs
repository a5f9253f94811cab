//! The demo model's tool calls, deterministic so that a suite can test a whole tool_use →
//! tool_result turn through the gateway. When a request offers function tools, its
//! `tool_choice` is not none and its last message (input item) is the user's, the model calls
//! instead of writing: the function `tool_choice` names; else, when the user's text has the
//! word `parallel` (any case), two tools or more are offered and parallel calls are not turned
//! off, the first two; else the first. Every call's arguments are `{"text":"<the user's
//! text>"}`, its id `call_<n>` (the Responses item's `fc_<n>`, Anthropic's `toolu_<n>`), n
//! counting the calls already in the conversation: unique over a conversation, the same for
//! the same request.

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

    /// The Anthropic `tool_use` content block; its `input` empty as a stream starts it.
    pub(in crate::upstream) fn tool_use(&self, done: bool) -> Value {
        let input = if done {
            serde_json::from_str(&self.arguments).unwrap_or_default()
        } else {
            json!({})
        };
        json!({"type": "tool_use", "id": format!("toolu_{}", self.n), "name": self.name,
            "input": input})
    }

    /// Its Anthropic Messages stream events as content block `index`.
    pub(in crate::upstream) fn block_events(&self, index: usize) -> Vec<Value> {
        let mut events = vec![json!({"type": "content_block_start", "index": index,
            "content_block": self.tool_use(false)})];
        events.extend(self.thirds().map(|piece| {
            json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": piece}})
        }));
        events.push(json!({"type": "content_block_stop", "index": index}));
        events
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

/// What a request lets the model call, read from its `tool_choice` (and parallel switch).
struct Choice<'a> {
    none: bool,
    named: Option<&'a str>,
    parallel: bool,
}

impl<'a> Choice<'a> {
    /// OpenAI's: `tool_choice` `"none"`, `parallel_tool_calls`; `named`: the function named.
    fn openai(body: &'a Map<String, Value>, named: Option<&'a str>) -> Choice<'a> {
        Choice {
            none: body.get("tool_choice").and_then(Value::as_str) == Some("none"),
            named,
            parallel: body.get("parallel_tool_calls") != Some(&Value::Bool(false)),
        }
    }
}

/// The calls for a conversation that ends with the user's `text`; `names`: the function
/// tools offered, `first`: the calls made before.
fn plan(names: &[&str], choice: Choice, text: &str, first: usize) -> Vec<Call> {
    if names.is_empty() || choice.none {
        return Vec::new();
    }
    let parallel = names.len() >= 2
        && choice.parallel
        && text
            .split(|c: char| !c.is_alphanumeric())
            .any(|word| word.eq_ignore_ascii_case("parallel"));
    let called = match choice.named {
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
        .filter(|m| role(m) == Some("assistant"))
        .filter_map(|m| m.get("tool_calls")?.as_array().map(Vec::len))
        .sum();
    plan(names, Choice::openai(body, named), text, first)
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
    plan(names, Choice::openai(body, named), text, first)
}

fn blocks(message: &Value) -> &[Value] {
    message
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn kind(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

/// An Anthropic Messages request's calls, `toolu_<n>`: to its client tools (custom, or
/// untyped), `tool_choice` `{"type": "none"}` calling none, `{"type": "tool", "name"}` that
/// one, `disable_parallel_tool_use` one at most; `text`: the last user text. A last user
/// message of tool results is answered, not called on.
pub(super) fn messages_calls(
    body: &Map<String, Value>,
    messages: &[Value],
    text: &str,
) -> Vec<Call> {
    let Some(last) = messages.last() else {
        return Vec::new();
    };
    if role(last) != Some("user") || tool_result_text(last).is_some() {
        return Vec::new();
    }
    let tools = body.get("tools").and_then(Value::as_array);
    let names: Vec<&str> = (tools.into_iter().flatten())
        .filter(|t| matches!(kind(t), None | Some("custom")))
        .filter_map(|t| t.get("name")?.as_str())
        .collect();
    let tool_choice = body.get("tool_choice");
    let choice_kind = tool_choice.and_then(kind);
    let choice = Choice {
        none: choice_kind == Some("none"),
        named: (choice_kind == Some("tool"))
            .then(|| tool_choice?.get("name")?.as_str())
            .flatten(),
        parallel: tool_choice.and_then(|c| c.get("disable_parallel_tool_use"))
            != Some(&Value::Bool(true)),
    };
    let first = (messages.iter())
        .filter(|m| role(m) == Some("assistant"))
        .flat_map(blocks)
        .filter(|b| kind(b) == Some("tool_use"))
        .count();
    plan(&names, choice, text, first)
}

/// The text of a message's last `tool_result` block (its content a string, or text blocks
/// joined); None when it has none.
pub(super) fn tool_result_text(message: &Value) -> Option<String> {
    let result = blocks(message)
        .iter()
        .rev()
        .find(|b| kind(b) == Some("tool_result"))?;
    Some(match result.get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => (blocks(result).iter())
            .filter_map(|b| b.get("text")?.as_str())
            .collect(),
    })
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
