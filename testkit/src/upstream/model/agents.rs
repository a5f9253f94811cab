//! What the demo model answers on the agent APIs, counting tokens as it does for chat (a token
//! is a fragment, `text.rs`), so the SDK suite can state each count independently:
//!   POST …/responses   OpenAI Responses: a reasoning item (its text hidden, as OpenAI hides
//!                      it), then a message `Echo: <last user text>`. input_tokens: the
//!                      fragments of `instructions` and of every input text and function
//!                      output (at least 1), of which the instructions' are `cached_tokens`
//!                      (a cached system prompt);
//!                      output_tokens: the answer's plus the reasoning's (`reasoning_tokens`).
//!                      `max_output_tokens` cuts the answer (status `incomplete`). Function
//!                      calls (`tools.rs`) come after the reasoning item, in place of the
//!                      message; the response states the request's tools and tool_choice.
//!   POST …/messages    Anthropic Messages: with `thinking` enabled (or adaptive), a thinking
//!                      block `Thinking about it.` (signed), then `Echo: <last user text>`.
//!                      The `system` text counts as cache_read_input_tokens, message blocks
//!                      marked `cache_control` as cache_creation_input_tokens, other message
//!                      text, images and tool results as input_tokens (at least 1 in all);
//!                      output_tokens: the answer's plus the thinking's. `max_tokens` cuts the
//!                      answer (stop_reason `max_tokens`). tool_use blocks (`tools.rs`) in
//!                      place of the text.
//! Images read as chat reads them (` [image:<media type>]`, in the text echoed and counted)
//! on both, so that one conversation counts and reads the same in all three dialects.
//!   POST …/messages/count_tokens  `{"input_tokens": <all three prompt counts>}`, and the
//!                      model received in `x-demo-model` (the body has no room for it).
//! Streams: one text delta per fragment (`agents.rs` of the upstream has the event shapes).

use serde_json::{json, Map, Value};

use super::python::py_int;
use super::text::{fragments, image_text, now};
use super::{check, tools};
use super::{received_model, Answer, Model, Refusal, REASONING};
use crate::upstream::agents::{responses_usage_json, Message, MessagesUsage, Response};
use crate::upstream::Usage;

fn streamed(body: &Map<String, Value>) -> bool {
    body.get("stream") == Some(&Value::Bool(true))
}

/// The answer's fragments, cut to `max` when it is a positive integer; and whether it was cut.
fn cut<'a>(answer: Vec<&'a str>, max: Option<&Value>) -> (Vec<&'a str>, bool) {
    match py_int(max) {
        Some(m) if m > 0 && (m as u64) < answer.len() as u64 => {
            (answer[..m as usize].to_vec(), true)
        }
        _ => (answer, false),
    }
}

/// The text of parts: those with a `text` (input_text, output_text), and each `input_image`
/// read as chat reads an image part, ` [image:<media type>]`.
fn parts_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p.get("type").and_then(Value::as_str) {
                Some("input_image") => {
                    let url = p.get("image_url").and_then(Value::as_str).unwrap_or("");
                    Some(image_text(url))
                }
                _ => p.get("text").and_then(Value::as_str).map(String::from),
            })
            .collect(),
        _ => String::new(),
    }
}

/// Each input item's role and text (`check.rs` has let the input through): a string input is
/// one user message, a call has the role `function_call` and no text, its output the role
/// `tool`; reasoning items are left out.
fn input_texts(input: Option<&Value>) -> Vec<(String, String)> {
    let items = match input {
        Some(Value::String(s)) => return vec![("user".into(), s.clone())],
        Some(Value::Array(items)) => items,
        _ => return Vec::new(),
    };
    let kind = |item: &Value| item.get("type").and_then(Value::as_str).map(String::from);
    (items.iter())
        .filter_map(|item| match kind(item).as_deref() {
            None | Some("message") => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                Some((role.to_string(), parts_text(item.get("content"))))
            }
            Some("function_call") => Some(("function_call".into(), String::new())),
            Some("function_call_output") => Some(("tool".into(), parts_text(item.get("output")))),
            _ => None,
        })
        .collect()
}

pub(super) fn responses(body: &Map<String, Value>, model: &Model) -> Result<Answer, Refusal> {
    let names = check::responses(body)?;
    let texts = input_texts(body.get("input"));
    let calls = tools::responses_calls(body, &names, &texts);
    let echoed = match texts.last() {
        Some((role, text)) if role == "tool" => text.as_str(),
        _ => texts
            .iter()
            .rev()
            .find(|(role, _)| role == "user")
            .map_or("", |(_, t)| t.as_str()),
    };
    let instructions = body
        .get("instructions")
        .and_then(Value::as_str)
        .unwrap_or("");
    let cached = fragments(instructions).len();
    let prompt = (cached + texts.iter().map(|(_, t)| fragments(t).len()).sum::<usize>()).max(1);
    let answer_text = format!("Echo: {echoed}");
    let (answer, incomplete, answer_tokens) = if calls.is_empty() {
        let (answer, incomplete) = cut(fragments(&answer_text), body.get("max_output_tokens"));
        let n = answer.len();
        (answer, incomplete, n)
    } else {
        (Vec::new(), false, tools::tokens(&calls))
    };
    let reasoning = fragments(REASONING).len();
    let usage = Usage {
        prompt: prompt as u64,
        completion: (answer_tokens + reasoning) as u64,
        reasoning: reasoning as u64,
        cached: cached as u64,
    };
    let r = Response {
        id: model.next_id("r").replace('-', "_"),
        created_at: now(),
        model: json!(received_model(body)),
        instructions: body.get("instructions").cloned().unwrap_or(Value::Null),
        max_output_tokens: body
            .get("max_output_tokens")
            .cloned()
            .unwrap_or(Value::Null),
        reasoning: true,
        deltas: answer,
        calls,
        incomplete,
        usage: responses_usage_json(&usage),
    };
    if !streamed(body) {
        let mut object = r.object(true);
        tools::state_tools(body, &mut object);
        return Ok(Answer::Json(object));
    }
    let mut events = r.events();
    for (_, data) in &mut events {
        if let Some(response) = data.get_mut("response") {
            tools::state_tools(body, response);
        }
    }
    Ok(Answer::Events(events))
}

/// The text of a `system` (a string or text blocks).
fn system_text(system: Option<&Value>) -> String {
    match system {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// The text a Messages content block reads as: a text block's text, an image as chat reads
/// one (` [image:<media type>]`, ` [image:url]` for a URL source), a tool result's text;
/// None for what has none (tool_use, thinking).
fn block_text(block: &Value) -> Option<String> {
    match block.get("type").and_then(Value::as_str) {
        Some("image") => {
            let source = block.get("source");
            let media = source.and_then(|s| s.get("media_type")?.as_str());
            Some(format!(" [image:{}]", media.unwrap_or("url")))
        }
        Some("tool_result") => tools::tool_result_text(&json!({"content": [block]})),
        _ => block.get("text").and_then(Value::as_str).map(String::from),
    }
}

/// The prompt's usage (output 0) and the last user text.
fn messages_prompt(body: &Map<String, Value>) -> Result<(MessagesUsage, String), Refusal> {
    let Some(Value::Array(messages)) = body.get("messages") else {
        return Err(Refusal::Bad("'messages' must be an array"));
    };
    let mut usage = MessagesUsage {
        cache_read: fragments(&system_text(body.get("system"))).len() as u64,
        ..MessagesUsage::default()
    };
    let mut last_user = String::new();
    for m in messages.iter().filter_map(Value::as_object) {
        let mut text = String::new();
        match m.get("content") {
            Some(Value::String(s)) => {
                usage.input += fragments(s).len() as u64;
                text.push_str(s);
            }
            Some(Value::Array(blocks)) => {
                for b in blocks {
                    let Some(t) = block_text(b) else {
                        continue;
                    };
                    let n = fragments(&t).len() as u64;
                    if b.get("cache_control").is_some_and(Value::is_object) {
                        usage.cache_creation += n;
                    } else {
                        usage.input += n;
                    }
                    // A tool's result is echoed as such (`tools.rs`), never as the user's words.
                    if b.get("type").and_then(Value::as_str) != Some("tool_result") {
                        text.push_str(&t);
                    }
                }
            }
            _ => {}
        }
        if m.get("role").and_then(Value::as_str) == Some("user") {
            last_user = text;
        }
    }
    if usage.input + usage.cache_creation + usage.cache_read == 0 {
        usage.input = 1;
    }
    Ok((usage, last_user))
}

pub(super) fn messages(body: &Map<String, Value>, model: &Model) -> Result<Answer, Refusal> {
    let (usage, last_user) = messages_prompt(body)?;
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let calls = tools::messages_calls(body, messages, &last_user);
    let echoed = (messages.last())
        .and_then(tools::tool_result_text)
        .unwrap_or(last_user);
    let answer_text = format!("Echo: {echoed}");
    let (answer, was_cut) = cut(fragments(&answer_text), body.get("max_tokens"));
    let (output, stop_reason) = match (calls.is_empty(), was_cut) {
        (false, _) => (tools::tokens(&calls), "tool_use"),
        (true, true) => (answer.len(), "max_tokens"),
        (true, false) => (answer.len(), "end_turn"),
    };
    // Thinking only when asked, as Anthropic's models think; it counts as output.
    let thinking = match body.get("thinking").and_then(|t| t.get("type")?.as_str()) {
        Some("enabled" | "adaptive") => fragments(REASONING),
        _ => Vec::new(),
    };
    let m = Message {
        id: model.next_id("m").replace('-', "_"),
        model: json!(received_model(body)),
        stop_reason,
        usage: MessagesUsage {
            output: (output + thinking.len()) as u64,
            ..usage
        },
        thinking,
        deltas: answer,
        calls,
    };
    Ok(if streamed(body) {
        Answer::Events(m.events())
    } else {
        Answer::Json(m.object())
    })
}

pub(super) fn count_tokens(body: &Map<String, Value>) -> Result<Answer, Refusal> {
    let (usage, _) = messages_prompt(body)?;
    // Never a header break, whatever the model string holds.
    let name: String = received_model(body)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    let header = format!("x-demo-model: {name}\r\n");
    Ok(Answer::JsonWith(
        json!({"input_tokens": usage.usage().prompt}),
        header,
    ))
}
