//! A Responses stream as a chat-completion chunk stream, converted event by event as the bytes
//! arrive: nothing waits for more than the rest of the event it is in. Events are told apart
//! by their data's `type` (servers such as `transformers serve` send no `event:` lines).
//!
//! Every chunk carries the response's id (as `chatcmpl-…`), `created` and model. The first
//! (at `response.created`, or the first event that says anything) has the delta
//! `{role: "assistant", content: ""}`. Then, in the order they come: `output_text` deltas as
//! `content`, `refusal` deltas as `refusal`, reasoning summary and reasoning text deltas as
//! `reasoning_content` (pieces separated by a blank line, as the JSON answer joins them), each
//! `function_call` (or `custom_tool_call`) item as a tool call numbered in the order the calls
//! come, announced with its id and name when its item is added and given its arguments as
//! they stream. Arguments or text a server sends only whole (in the `.done` events, or the
//! final response) are sent then, as what the deltas had not yet said. At
//! `response.completed` (or `response.incomplete`) a chunk with the finish reason, then —
//! only when the client asked for it (`stream_options.include_usage`) — a chunk with no
//! choices and the usage, then `data: [DONE]`.
//!
//! A stream that fails (`response.failed`, an `error` event) or ends before its response is
//! complete was cut: the client's stream ends with an error chunk (`data: {"error": {…}}`,
//! which the OpenAI SDKs raise) and without `[DONE]`.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{completion_id, created, finish_reason, usage};
use crate::api::translate::{sse, Asked, StreamConvert};

/// A tool call of the stream, by the order it came in (its chat `index`).
struct Call {
    /// The Responses item it is, by id and by place, as delta events name it.
    item_id: Option<String>,
    output_index: Option<u64>,
    call_id: Value,
    custom: bool,
    /// Its arguments (a custom call's input) as sent so far.
    sent: String,
}

pub(crate) struct StreamToChat {
    id: String,
    created: u64,
    model: String,
    /// The client asked for its usage.
    usage_asked: bool,
    started: bool,
    calls: Vec<Call>,
    /// The text part being streamed (its item id and content index), and the bytes of it
    /// sent.
    text_at: Option<(String, u64, usize)>,
    /// The reasoning piece the last reasoning delta came from: item id, event type, index.
    reasoning_at: Option<(String, String, u64)>,
    /// Every chunk's bytes before its delta, and after it (finish reason null), written once
    /// the response is named: a delta chunk per token is written around its delta.
    head: Vec<u8>,
    tail: &'static [u8],
    ended: bool,
    /// Ended with an error chunk: the answer was cut.
    cut: bool,
}

impl StreamConvert for StreamToChat {
    /// One complete Responses event.
    fn event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        if data.trim_ascii() == b"[DONE]" {
            self.fail(
                out,
                None,
                "the upstream's stream ended before its response was complete",
            );
            return;
        }
        if let Some(delta) = DeltaEvent::read(data) {
            self.delta(&delta, out);
            return;
        }
        let Ok(event) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        let kind = event["type"].as_str().unwrap_or_default();
        match kind {
            "response.created" | "response.in_progress" | "response.queued" => {
                self.start(&event["response"], out);
            }
            "response.output_item.added" => {
                self.start(&Value::Null, out);
                self.item(&event["item"], event["output_index"].as_u64(), out);
            }
            "response.output_item.done" => {
                self.start(&Value::Null, out);
                let item = &event["item"];
                self.item(item, event["output_index"].as_u64(), out);
                self.whole_call(item, event["output_index"].as_u64(), out);
            }
            "response.output_text.delta" | "response.output_text.done" => {
                self.start(&Value::Null, out);
                let (item_id, index) = (str_of(&event["item_id"]), event["content_index"].as_u64());
                let done = kind.ends_with("done");
                let text = str_of(&event[if done { "text" } else { "delta" }]);
                self.text(item_id, index.unwrap_or(0), text, done, out);
            }
            "response.refusal.delta" => {
                self.start(&Value::Null, out);
                if let Some(delta) = event["delta"].as_str().filter(|d| !d.is_empty()) {
                    self.send(json!({"refusal": delta}), None, out);
                }
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                self.start(&Value::Null, out);
                let index = event["summary_index"]
                    .as_u64()
                    .or(event["content_index"].as_u64());
                let item_id = str_of(&event["item_id"]);
                self.reasoning(
                    item_id,
                    kind,
                    index.unwrap_or(0),
                    str_of(&event["delta"]),
                    out,
                );
            }
            "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
                self.start(&Value::Null, out);
                let at = self.find(event["item_id"].as_str(), event["output_index"].as_u64());
                if let (Some(at), Some(delta)) = (at, event["delta"].as_str()) {
                    self.arguments(at, delta, out);
                }
            }
            "response.function_call_arguments.done" | "response.custom_tool_call_input.done" => {
                let whole = event["arguments"].as_str().or(event["input"].as_str());
                let at = self.find(event["item_id"].as_str(), event["output_index"].as_u64());
                if let (Some(at), Some(whole)) = (at, whole) {
                    self.rest_of(at, whole, out);
                }
            }
            "response.completed" | "response.incomplete" => self.complete(&event["response"], out),
            "response.failed" => {
                let error = &event["response"]["error"];
                self.fail(out, Some(error), "the upstream's response failed");
            }
            "error" => {
                let error = event
                    .get("error")
                    .filter(|e| e.is_object())
                    .unwrap_or(&event);
                self.fail(out, Some(error), "the upstream's stream failed");
            }
            // A server that puts an error object in its stream without a type.
            "" if event.get("error").is_some() => {
                self.fail(out, Some(&event["error"]), "the upstream's stream failed");
            }
            _ => {}
        }
    }

    /// The end of the chat stream: an error chunk when the response never completed.
    fn end(&mut self, out: &mut Vec<u8>) {
        if !self.ended {
            self.fail(
                out,
                None,
                "the upstream's stream ended before its response was complete",
            );
        }
    }

    fn was_cut(&self) -> bool {
        self.cut
    }
}

impl StreamToChat {
    pub(crate) fn new(asked: &Asked) -> StreamToChat {
        StreamToChat {
            id: completion_id(None),
            created: 0,
            model: asked.model.clone(),
            usage_asked: asked.usage,
            started: false,
            calls: Vec::new(),
            text_at: None,
            reasoning_at: None,
            head: Vec::new(),
            tail: if asked.usage {
                b",\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}"
            } else {
                b",\"logprobs\":null,\"finish_reason\":null}]}"
            },
            ended: false,
            cut: false,
        }
    }

    /// The first chunk, named after `response` when it is the first event to name one.
    fn start(&mut self, response: &Value, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        self.identify(response);
        self.send(json!({"role": "assistant", "content": ""}), None, out);
    }

    fn identify(&mut self, response: &Value) {
        if let Some(id) = response["id"].as_str() {
            self.id = completion_id(Some(id));
        }
        self.created = created(response);
        if let Some(model) = response["model"].as_str() {
            self.model = model.to_string();
        }
        self.head.clear();
        self.head.extend_from_slice(b"data: {\"id\":");
        sse::write_str(&mut self.head, &self.id);
        self.head
            .extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        self.head
            .extend_from_slice(itoa::Buffer::new().format(self.created).as_bytes());
        self.head.extend_from_slice(b",\"model\":");
        sse::write_str(&mut self.head, &self.model);
        self.head
            .extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":");
    }

    /// A chunk whose delta is one text member, as `send` would write it.
    fn send_text(&self, out: &mut Vec<u8>, member: &str, text: &str) {
        self.write_delta(out, |out| {
            out.extend_from_slice(b"{\"");
            out.extend_from_slice(member.as_bytes());
            out.extend_from_slice(b"\":");
            sse::write_str(out, text);
            out.push(b'}');
        });
    }

    /// A chunk with the delta `write` writes, and no finish reason.
    fn write_delta(&self, out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
        out.extend_from_slice(&self.head);
        write(out);
        out.extend_from_slice(self.tail);
        out.extend_from_slice(b"\n\n");
    }

    /// An output item: a call not yet announced is announced.
    fn item(&mut self, item: &Value, output_index: Option<u64>, out: &mut Vec<u8>) {
        let custom = match item["type"].as_str() {
            Some("function_call") => false,
            Some("custom_tool_call") => true,
            _ => return,
        };
        let item_id = item["id"].as_str();
        let known = self.calls.iter().any(|call| {
            (item_id.is_some() && call.item_id.as_deref() == item_id)
                || (!item["call_id"].is_null() && call.call_id == item["call_id"])
        });
        if known {
            return;
        }
        let index = self.calls.len();
        self.calls.push(Call {
            item_id: item_id.map(str::to_string),
            output_index,
            call_id: item["call_id"].clone(),
            custom,
            sent: String::new(),
        });
        let call = if custom {
            json!({"index": index, "id": item["call_id"], "type": "custom",
                "custom": {"name": item["name"], "input": ""}})
        } else {
            json!({"index": index, "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": ""}})
        };
        self.send(json!({"tool_calls": [call]}), None, out);
        // A server that gives the arguments with the item, not as deltas.
        let whole = if custom {
            &item["input"]
        } else {
            &item["arguments"]
        };
        if let Some(whole) = whole.as_str() {
            self.rest_of(index, whole, out);
        }
    }

    /// A finished call item: what its arguments say that the deltas did not.
    fn whole_call(&mut self, item: &Value, output_index: Option<u64>, out: &mut Vec<u8>) {
        let whole = item["arguments"].as_str().or(item["input"].as_str());
        let at = self.find(item["id"].as_str(), output_index);
        if let (Some(at), Some(whole)) = (at, whole) {
            self.rest_of(at, whole, out);
        }
    }

    /// The call a delta event names, by its item's id, else by its place in the output.
    fn find(&self, item_id: Option<&str>, output_index: Option<u64>) -> Option<usize> {
        if let Some(id) = item_id {
            let mut calls = self.calls.iter();
            if let Some(at) = calls.position(|c| c.item_id.as_deref() == Some(id)) {
                return Some(at);
            }
        }
        let index = output_index?;
        (self.calls.iter()).position(|c| c.output_index == Some(index))
    }

    fn arguments(&mut self, at: usize, delta: &str, out: &mut Vec<u8>) {
        if delta.is_empty() {
            return;
        }
        let call = &mut self.calls[at];
        call.sent.push_str(delta);
        let (kind, member): (&[u8], &[u8]) = match call.custom {
            true => (b"custom", b"input"),
            false => (b"function", b"arguments"),
        };
        self.write_delta(out, |out| {
            out.extend_from_slice(b"{\"tool_calls\":[{\"index\":");
            out.extend_from_slice(itoa::Buffer::new().format(at).as_bytes());
            out.extend_from_slice(b",\"");
            out.extend_from_slice(kind);
            out.extend_from_slice(b"\":{\"");
            out.extend_from_slice(member);
            out.extend_from_slice(b"\":");
            sse::write_str(out, delta);
            out.extend_from_slice(b"}}]}");
        });
    }

    /// The part of a call's whole arguments the deltas have not sent (all of them, when none
    /// came); nothing when the deltas said something else.
    fn rest_of(&mut self, at: usize, whole: &str, out: &mut Vec<u8>) {
        if let Some(rest) = whole.strip_prefix(self.calls[at].sent.as_str()) {
            let rest = rest.to_string();
            self.arguments(at, &rest, out);
        }
    }

    /// An `output_text` delta, or the whole part's text at its `.done` (its unsent rest).
    fn text(&mut self, item_id: &str, index: u64, text: &str, done: bool, out: &mut Vec<u8>) {
        let sent = match &self.text_at {
            Some((id, at, sent)) if id == item_id && *at == index => *sent,
            _ => 0,
        };
        let text = if done {
            text.get(sent..).unwrap_or_default()
        } else {
            text
        };
        match &mut self.text_at {
            Some((id, at, sent)) if id == item_id && *at == index => *sent += text.len(),
            _ => self.text_at = Some((item_id.to_string(), index, text.len())),
        }
        if !text.is_empty() {
            self.send_text(out, "content", text);
        }
    }

    fn reasoning(&mut self, item_id: &str, kind: &str, index: u64, delta: &str, out: &mut Vec<u8>) {
        if delta.is_empty() {
            return;
        }
        let same = |at: &(String, String, u64)| at.0 == item_id && at.1 == kind && at.2 == index;
        if self.reasoning_at.as_ref().is_some_and(same) {
            self.send_text(out, "reasoning_content", delta);
            return;
        }
        // A new piece: set apart from the one before by a blank line, as the JSON answer joins them.
        let after = self.reasoning_at.is_some();
        self.reasoning_at = Some((item_id.to_string(), kind.to_string(), index));
        match after {
            true => self.send_text(out, "reasoning_content", &format!("\n\n{delta}")),
            false => self.send_text(out, "reasoning_content", delta),
        }
    }

    /// One delta event read in one pass (a text, reasoning or arguments delta), the events a
    /// stream has one of per token.
    fn delta(&mut self, event: &DeltaEvent, out: &mut Vec<u8>) {
        self.start(&Value::Null, out);
        let item_id = event.item_id.as_ref().map(|t| t.0.as_ref());
        let kind = event.kind.0.as_ref();
        match kind {
            "response.output_text.delta" => {
                let index = event.content_index.unwrap_or(0);
                self.text(
                    item_id.unwrap_or_default(),
                    index,
                    &event.delta.0,
                    false,
                    out,
                );
            }
            "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
                if let Some(at) = self.find(item_id, event.output_index) {
                    self.arguments(at, &event.delta.0, out);
                }
            }
            _ => {
                let index = event.summary_index.or(event.content_index).unwrap_or(0);
                let (item_id, delta) = (item_id.unwrap_or_default(), &event.delta.0);
                self.reasoning(item_id, kind, index, delta, out);
            }
        }
    }

    /// The response is complete: the calls it holds that no event announced, the finish
    /// reason, the usage when asked, `[DONE]`.
    fn complete(&mut self, response: &Value, out: &mut Vec<u8>) {
        self.start(response, out);
        for (i, item) in (response["output"].as_array().into_iter().flatten()).enumerate() {
            self.item(item, Some(i as u64), out);
            self.whole_call(item, Some(i as u64), out);
        }
        let finish = finish_reason(response, !self.calls.is_empty());
        self.send(json!({}), Some(finish), out);
        if self.usage_asked {
            if let Some(usage) = usage(response.get("usage")) {
                let mut chunk = self.chunk(Value::Null, None);
                chunk["choices"] = json!([]);
                chunk["usage"] = usage;
                sse::write(out, None, &chunk);
            }
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        self.ended = true;
    }

    /// The stream failed: an error chunk in OpenAI's error shape, and no `[DONE]`.
    fn fail(&mut self, out: &mut Vec<u8>, error: Option<&Value>, otherwise: &str) {
        let error = error.filter(|e| e.is_object());
        let given = |member: &str| {
            (error.and_then(|e| e.get(member)))
                .filter(|v| !v.is_null())
                .cloned()
        };
        let message = given("message")
            .filter(Value::is_string)
            .unwrap_or_else(|| json!(otherwise));
        let kind = given("type")
            .filter(|t| t.is_string() && t != "error")
            .unwrap_or_else(|| json!("server_error"));
        let body = json!({"error": {
            "message": message,
            "type": kind,
            "param": given("param").unwrap_or(Value::Null),
            "code": given("code").unwrap_or(Value::Null),
        }});
        sse::write(out, None, &body);
        self.ended = true;
        self.cut = true;
    }

    /// One chunk of the one choice.
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        // As OpenAI sends it: a client that asked for usage finds the member on every chunk.
        if self.usage_asked {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn send(&self, delta: Value, finish: Option<&str>, out: &mut Vec<u8>) {
        sse::write(out, None, &self.chunk(delta, finish));
    }
}

/// A string's text, or "" for anything else.
fn str_of(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// A string, borrowed from the event unless it has escapes.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// A delta event (`response.output_text.delta`, a reasoning delta, an arguments delta) with
/// its members of their usual types, read in one pass; any other event is `None`.
#[derive(Deserialize)]
struct DeltaEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    delta: Text<'a>,
    #[serde(borrow)]
    item_id: Option<Text<'a>>,
    output_index: Option<u64>,
    content_index: Option<u64>,
    summary_index: Option<u64>,
}

impl<'a> DeltaEvent<'a> {
    fn read(data: &'a [u8]) -> Option<DeltaEvent<'a>> {
        let data = std::str::from_utf8(data).ok()?.trim_ascii();
        // An array would be read as the members in order: only objects.
        if !data.starts_with('{') {
            return None;
        }
        let event: DeltaEvent = serde_json::from_str(data).ok()?;
        let per_token = matches!(
            event.kind.0.as_ref(),
            "response.output_text.delta"
                | "response.reasoning_summary_text.delta"
                | "response.reasoning_text.delta"
                | "response.function_call_arguments.delta"
                | "response.custom_tool_call_input.delta"
        );
        per_token.then_some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::translate::test_kit::{assert_split_independent, convert_all};
    use crate::api::translate::Stream;

    /// A Responses stream with reasoning, text and two calls, as OpenAI sends it; `named`:
    /// with `event:` lines.
    fn responses_stream(named: bool) -> String {
        let response = |status: &str, output: Value, usage: Value| {
            json!({"id": "resp_1", "object": "response", "created_at": 1_764_000_000,
                "model": "gpt-5", "status": status, "incomplete_details": null,
                "output": output, "usage": usage})
        };
        let call = |id: &str, call_id: &str, name: &str, arguments: &str| json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": "completed"});
        let events = [
            json!({"type": "response.created", "response": response("in_progress", json!([]), Value::Null)}),
            json!({"type": "response.in_progress", "response": response("in_progress", json!([]), Value::Null)}),
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
            json!({"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0, "summary_index": 0}),
            json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "Think"}),
            json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "ing."}),
            json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 1, "delta": "More."}),
            json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
            json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}),
            json!({"type": "response.content_part.added", "item_id": "msg_1", "output_index": 1, "content_index": 0, "part": {"type": "output_text", "text": ""}}),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "Hel"}),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "lo"}),
            json!({"type": "response.output_text.done", "item_id": "msg_1", "output_index": 1, "content_index": 0, "text": "Hello"}),
            json!({"type": "response.output_item.added", "output_index": 2, "item": call("fc_a", "call_a", "w", "")}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_a", "output_index": 2, "delta": "{\"city\":"}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_a", "output_index": 2, "delta": "\"Paris\"}"}),
            json!({"type": "response.function_call_arguments.done", "item_id": "fc_a", "output_index": 2, "arguments": "{\"city\":\"Paris\"}"}),
            json!({"type": "response.output_item.done", "output_index": 2, "item": call("fc_a", "call_a", "w", "{\"city\":\"Paris\"}")}),
            json!({"type": "response.output_item.added", "output_index": 3, "item": call("fc_b", "call_b", "t", "")}),
            // No deltas: the arguments come whole.
            json!({"type": "response.output_item.done", "output_index": 3, "item": call("fc_b", "call_b", "t", "{}")}),
            json!({"type": "response.completed", "response": response("completed", json!([
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
                call("fc_a", "call_a", "w", "{\"city\":\"Paris\"}"),
                call("fc_b", "call_b", "t", "{}"),
            ]), json!({"input_tokens": 61, "output_tokens": 33, "total_tokens": 94,
                "input_tokens_details": {"cached_tokens": 17}, "output_tokens_details": {"reasoning_tokens": 11}}))}),
        ];
        (events.iter().enumerate())
            .map(|(i, e)| match named {
                true => format!("event: {}\ndata: {}\n\n", e["type"].as_str().unwrap(), {
                    let mut e = e.clone();
                    e["sequence_number"] = json!(i);
                    e
                }),
                false => format!("data: {e}\n\n"),
            })
            .collect()
    }

    fn asked(usage: bool) -> Asked {
        Asked {
            model: "gpt-asked".into(),
            usage,
            freeform: Vec::new(),
        }
    }

    fn convert_with(asked: &Asked, chunks: &[&[u8]]) -> Vec<u8> {
        convert_all(Box::new(StreamToChat::new(asked)), chunks)
    }

    fn convert(chunks: &[&[u8]]) -> Vec<u8> {
        convert_with(&asked(true), chunks)
    }

    /// The chunks of a converted stream, `[DONE]` as a string.
    fn chunks(out: &[u8]) -> Vec<Value> {
        let text = std::str::from_utf8(out).unwrap();
        (text.split_terminator("\n\n"))
            .map(|e| {
                let data = e.strip_prefix("data: ").expect("only data lines");
                serde_json::from_str(data).unwrap_or_else(|_| json!(data))
            })
            .collect()
    }

    #[test]
    fn chunks_come_in_order_with_the_finish_reason_usage_and_done() {
        let out = convert(&[responses_stream(true).as_bytes()]);
        let all = chunks(&out);
        let deltas: Vec<Value> = all
            .iter()
            .filter_map(|c| c.pointer("/choices/0/delta").cloned())
            .collect();
        assert_eq!(
            deltas,
            [
                json!({"role": "assistant", "content": ""}),
                json!({"reasoning_content": "Think"}),
                json!({"reasoning_content": "ing."}),
                json!({"reasoning_content": "\n\nMore."}),
                json!({"content": "Hel"}),
                json!({"content": "lo"}),
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "w", "arguments": ""}}]}),
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}),
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
                json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "t", "arguments": ""}}]}),
                json!({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
                json!({}),
            ]
        );
        for chunk in &all[..all.len() - 1] {
            assert_eq!(chunk["id"], "chatcmpl-resp_1");
            assert_eq!(chunk["object"], "chat.completion.chunk");
            assert_eq!(chunk["created"], 1_764_000_000);
            assert_eq!(chunk["model"], "gpt-5");
        }
        let finish = &all[all.len() - 3];
        assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(finish["usage"], Value::Null);
        let usage = &all[all.len() - 2];
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens": 61, "completion_tokens": 33, "total_tokens": 94,
                "prompt_tokens_details": {"cached_tokens": 17},
                "completion_tokens_details": {"reasoning_tokens": 11}})
        );
        assert_eq!(all.last().unwrap(), &json!("[DONE]"));
    }

    #[test]
    fn the_usage_chunk_comes_only_when_asked() {
        let out = convert_with(&asked(false), &[responses_stream(false).as_bytes()]);
        let all = chunks(&out);
        assert!(
            all.iter().all(|c| c.get("usage").is_none()),
            "no usage member at all"
        );
        assert_eq!(
            all[all.len() - 2]["choices"][0]["finish_reason"],
            "tool_calls"
        );
        assert_eq!(all.last().unwrap(), &json!("[DONE]"));
        // Without `event:` lines the same chunks come.
        let named = convert_with(&asked(false), &[responses_stream(true).as_bytes()]);
        assert_eq!(named, out);
    }

    #[test]
    fn the_output_does_not_depend_on_how_the_bytes_are_split() {
        let make = || -> Box<dyn StreamConvert> { Box::new(StreamToChat::new(&asked(true))) };
        assert_split_independent(make, &responses_stream(true));
    }

    #[test]
    fn each_event_is_converted_as_soon_as_it_is_complete() {
        let mut conv = Stream::new(Box::new(StreamToChat::new(&asked(false))));
        let mut out = Vec::new();
        conv.feed(
            b"data: {\"type\":\"response.output_text.delta\",\"item_id\":\"m\",\"delta\":\"a\"}\n",
            &mut out,
        );
        assert!(out.is_empty(), "the event is not complete yet");
        conv.feed(b"\n", &mut out);
        let deltas: Vec<Value> = chunks(&out)
            .iter()
            .map(|c| c["choices"][0]["delta"].clone())
            .collect();
        assert_eq!(
            deltas,
            [
                json!({"role": "assistant", "content": ""}),
                json!({"content": "a"})
            ]
        );
        // Before any response is named: the client's model, a placeholder id.
        assert_eq!(chunks(&out)[0]["model"], "gpt-asked");
    }

    #[test]
    fn a_cut_or_failed_stream_ends_with_an_error_chunk_and_no_done() {
        let ends_in_error = |out: &[u8]| {
            let all = chunks(out);
            assert!(!String::from_utf8_lossy(out).contains("[DONE]"));
            all.last().unwrap()["error"].clone()
        };
        let stream = responses_stream(false);
        let cut_at = stream.find("response.completed").unwrap();
        let mut conv = Stream::new(Box::new(StreamToChat::new(&asked(true))));
        let mut out = Vec::new();
        conv.feed(&stream.as_bytes()[..cut_at], &mut out);
        conv.finish(&mut out);
        assert!(conv.was_cut());
        let error = ends_in_error(&out);
        assert_eq!(error["type"], "server_error");
        assert!(error["message"]
            .as_str()
            .unwrap()
            .contains("before its response was complete"));

        let failed = convert(&[b"data: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"}}}\n\n"]);
        assert_eq!(
            ends_in_error(&failed),
            json!({"message": "boom", "type": "server_error", "param": null, "code": "server_error"})
        );
        let error = convert(&[b"data: {\"type\":\"error\",\"code\":\"rate_limit_exceeded\",\"message\":\"slow\",\"param\":null}\n\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n"]);
        assert_eq!(ends_in_error(&error)["code"], "rate_limit_exceeded");
        assert_eq!(chunks(&error).len(), 1, "nothing after the error");
    }

    #[test]
    fn an_incomplete_response_finishes_with_length() {
        let out = convert_with(
            &asked(false),
            &[b"data: {\"type\":\"response.output_text.delta\",\"item_id\":\"m\",\"delta\":\"a\"}\n\n\
                data: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"}}}\n\n"],
        );
        let all = chunks(&out);
        assert_eq!(all[2]["choices"][0]["finish_reason"], "length");
        assert_eq!(all[3], json!("[DONE]"));
    }

    #[test]
    fn text_and_calls_sent_only_whole_still_arrive() {
        let out = convert_with(
            &asked(false),
            &[b"data: {\"type\":\"response.output_text.done\",\"item_id\":\"m\",\"content_index\":0,\"text\":\"all at once\"}\n\n\
                data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[\
                {\"type\":\"function_call\",\"id\":\"fc\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"}]}}\n\n"],
        );
        let deltas: Vec<Value> = chunks(&out)
            .iter()
            .filter_map(|c| c.pointer("/choices/0/delta").cloned())
            .collect();
        assert_eq!(
            deltas,
            [
                json!({"role": "assistant", "content": ""}),
                json!({"content": "all at once"}),
                json!({"tool_calls": [{"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                json!({}),
            ]
        );
    }

    #[test]
    fn delta_events_read_in_one_pass_give_the_chunks_the_general_reader_gives() {
        // The same events, the second time with a member of an odd type, which sends each
        // through the general reader.
        let events = |odd: bool| {
            let extra = if odd {
                ",\"obfuscation\":7,\"output_index\":\"x\""
            } else {
                ""
            };
            let index = if odd { "" } else { ",\"output_index\":1" };
            let list = [
                r#"{"type":"response.created","response":{"id":"resp_1","created_at":5,"model":"g"}}"#.to_string(),
                r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"c1","name":"f","arguments":""}}"#.to_string(),
                format!(r#"{{"type":"response.function_call_arguments.delta","item_id":"fc_1"{index},"delta":"{{\"a\""{extra}}}"#),
                format!(r#"{{"type":"response.output_text.delta","item_id":"m1","content_index":0,"delta":"Hé \"q\""{extra}}}"#),
                format!(r#"{{"type":"response.reasoning_text.delta","item_id":"r1","content_index":0,"delta":"x"{extra}}}"#),
                format!(r#"{{"type":"response.reasoning_summary_text.delta","item_id":"r1","summary_index":1,"delta":"y"{extra}}}"#),
            ];
            let text: String = list.iter().map(|e| format!("data: {e}\n\n")).collect();
            chunks(&convert(&[text.as_bytes()]))
        };
        let (fast, general) = (events(false), events(true));
        assert_eq!(
            fast.len(),
            7,
            "the first chunk, 5 deltas, the cut: {fast:?}"
        );
        assert_eq!(fast, general);
        assert_eq!(
            fast[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
            "{\"a\""
        );
        assert_eq!(fast[3]["choices"][0]["delta"]["content"], "Hé \"q\"");
        assert_eq!(fast[5]["choices"][0]["delta"]["reasoning_content"], "\n\ny");
    }
}
