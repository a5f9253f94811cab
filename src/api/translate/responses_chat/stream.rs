//! A chat stream as a Responses stream, converted event by event as the bytes arrive, in the
//! order the official SDKs accumulate: `response.created` and `response.in_progress` on the
//! first chunk; then one output item at a time, in the order the chat deltas come, each opened
//! by `response.output_item.added` and closed by `response.output_item.done` when the next
//! begins: a reasoning item (`response.reasoning_text.delta`s), the message (its
//! `output_text` part added, `response.output_text.delta`s, the part and text done), each tool
//! call (`response.function_call_arguments.delta`s and `.done`; a freeform tool's input, which
//! is inside its JSON arguments, comes whole when its call closes). At the end (`[DONE]`, or
//! the end of the body after a `finish_reason`) `response.completed` (`response.incomplete`
//! for `length` and `content_filter`) with every item and the usage. A stream that ends
//! before its finish reason was cut: it ends with `response.failed`.
//!
//! Tool calls are taken to stream one after another, as in `messages_chat::stream`.

use serde_json::{json, Value};

use super::{call_item, envelope, message_item, reasoning_item, response_id, status, usage};
use crate::api::translate::chat_chunk::{CallDelta, ChatChunk};
use crate::api::translate::{sse, Asked, StreamConvert};

/// The output item being streamed.
enum Open {
    None,
    Reasoning(String),
    Message(String),
    /// A tool call, by its chat index.
    Call {
        index: u64,
        call_id: String,
        name: String,
        arguments: String,
        freeform: bool,
    },
}

pub(crate) struct StreamToResponses {
    /// The model the client asked for, for a stream whose chunks name none.
    model: String,
    /// The client's freeform tools.
    freeform: Vec<String>,
    /// The response's id, and the items' (the chat id), once the first chunk came.
    id: String,
    item_id: String,
    created: Option<u64>,
    sequence: u64,
    /// The items done, for `response.completed`.
    output: Vec<Value>,
    open: Open,
    /// The highest chat tool index whose item was opened.
    last_tool: Option<u64>,
    finish: Option<String>,
    usage: Option<Value>,
    started: bool,
    ended: bool,
    cut: bool,
}

impl StreamConvert for StreamToResponses {
    fn event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        if data.trim_ascii() == b"[DONE]" {
            self.end(out);
            return;
        }
        let Some(chunk) = ChatChunk::read(data) else {
            return;
        };
        self.start(&chunk, out);
        if let Some(error) = &chunk.error {
            let message = error["message"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_string);
            self.fail(out, &message);
            return;
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        if let Some(text) = chunk.reasoning.as_deref().filter(|t| !t.is_empty()) {
            self.reasoning(text, out);
        }
        if let Some(text) = chunk.content.as_deref().filter(|t| !t.is_empty()) {
            self.text(text, out);
        }
        for call in &chunk.tool_calls {
            self.tool_call(call, out);
        }
        if let Some(finish) = chunk.finish_reason {
            self.finish = Some(finish.into_owned());
        }
    }

    /// `response.completed` once the answer is complete, `response.failed` if it never was.
    fn end(&mut self, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        if self.finish.is_none() {
            let why = "the upstream's stream ended before its answer was complete";
            self.fail(out, why);
            return;
        }
        self.close(out);
        let (status, incomplete) = status(self.finish.as_deref());
        let mut response = self.response(status);
        response["incomplete_details"] = incomplete;
        response["usage"] = usage(self.usage.as_ref());
        let kind = match status {
            "completed" => "response.completed",
            _ => "response.incomplete",
        };
        self.emit(out, kind, json!({"response": response}));
        self.ended = true;
    }

    fn was_cut(&self) -> bool {
        self.cut
    }
}

impl StreamToResponses {
    pub(crate) fn new(asked: &Asked) -> StreamToResponses {
        StreamToResponses {
            model: asked.model.clone(),
            freeform: asked.freeform.clone(),
            id: String::new(),
            item_id: String::new(),
            created: None,
            sequence: 0,
            output: Vec::new(),
            open: Open::None,
            last_tool: None,
            finish: None,
            usage: None,
            started: false,
            ended: false,
            cut: false,
        }
    }

    fn start(&mut self, chunk: &ChatChunk, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        self.id = response_id(chunk.id.as_deref());
        self.item_id = self
            .id
            .strip_prefix("resp_")
            .unwrap_or(&self.id)
            .to_string();
        self.created = chunk.created;
        if let Some(model) = chunk.model.as_deref() {
            self.model = model.to_string();
        }
        let response = self.response("in_progress");
        self.emit(out, "response.created", json!({"response": response}));
        self.emit(out, "response.in_progress", json!({"response": response}));
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>) {
        if !matches!(self.open, Open::Reasoning(_)) {
            self.close(out);
            let item = json!({"type": "reasoning", "id": format!("rs_{}", self.item_id),
                              "status": "in_progress", "summary": [], "content": []});
            self.added(out, item);
            let part = json!({"type": "reasoning_text", "text": ""});
            self.part_event(
                out,
                "response.content_part.added",
                "rs",
                json!({"part": part}),
            );
            self.open = Open::Reasoning(String::new());
        }
        if let Open::Reasoning(all) = &mut self.open {
            all.push_str(text);
        }
        self.part_event(
            out,
            "response.reasoning_text.delta",
            "rs",
            json!({"delta": text}),
        );
    }

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if !matches!(self.open, Open::Message(_)) {
            self.close(out);
            let item = json!({"type": "message", "id": format!("msg_{}", self.item_id),
                              "status": "in_progress", "role": "assistant", "content": []});
            self.added(out, item);
            let part =
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            self.part_event(
                out,
                "response.content_part.added",
                "msg",
                json!({"part": part}),
            );
            self.open = Open::Message(String::new());
        }
        if let Open::Message(all) = &mut self.open {
            all.push_str(text);
        }
        self.delta(out, "response.output_text.delta", "msg", text);
    }

    fn tool_call(&mut self, call: &CallDelta, out: &mut Vec<u8>) {
        let index = call.index;
        let open_here = matches!(&self.open, Open::Call { index: i, .. } if *i == index);
        if !open_here {
            if self.last_tool.is_some_and(|last| index <= last) {
                return; // its item is done: a Responses stream cannot reopen it
            }
            self.close(out);
            let call_id = call.id.as_deref().unwrap_or_default().to_string();
            let name = call.name.as_deref().unwrap_or_default().to_string();
            let item = call_item(&self.freeform, &call_id, &name, "", "in_progress");
            let freeform = item["type"] == "custom_tool_call";
            self.added(out, item);
            self.open = Open::Call {
                index,
                call_id,
                name,
                arguments: String::new(),
                freeform,
            };
            self.last_tool = Some(index);
        }
        let Some(part) = call.arguments.as_deref().filter(|a| !a.is_empty()) else {
            return;
        };
        let Open::Call {
            arguments,
            freeform,
            ..
        } = &mut self.open
        else {
            return;
        };
        arguments.push_str(part);
        if !*freeform {
            self.delta(out, "response.function_call_arguments.delta", "fc", part);
        }
    }

    /// Closes the open item: its done events, and the item kept for `response.completed`.
    fn close(&mut self, out: &mut Vec<u8>) {
        let item = match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Reasoning(text) => {
                self.part_event(
                    out,
                    "response.reasoning_text.done",
                    "rs",
                    json!({"text": text}),
                );
                let part = json!({"type": "reasoning_text", "text": text});
                self.part_event(
                    out,
                    "response.content_part.done",
                    "rs",
                    json!({"part": part}),
                );
                reasoning_item(&self.item_id, &text, "completed")
            }
            Open::Message(text) => {
                let done = json!({"text": text, "logprobs": []});
                self.part_event(out, "response.output_text.done", "msg", done);
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                self.part_event(
                    out,
                    "response.content_part.done",
                    "msg",
                    json!({"part": part}),
                );
                message_item(&self.item_id, &text, "completed")
            }
            Open::Call {
                call_id,
                name,
                arguments,
                ..
            } => {
                let item = call_item(&self.freeform, &call_id, &name, &arguments, "completed");
                let item_id = item["id"].as_str().unwrap_or_default().to_string();
                if item["type"] == "custom_tool_call" {
                    let input = item["input"].clone();
                    let delta = json!({"delta": input});
                    self.item_event(
                        out,
                        "response.custom_tool_call_input.delta",
                        &item_id,
                        delta,
                    );
                    let done = json!({"input": input});
                    self.item_event(out, "response.custom_tool_call_input.done", &item_id, done);
                } else {
                    let done = json!({"name": name, "arguments": arguments});
                    self.item_event(out, "response.function_call_arguments.done", &item_id, done);
                }
                item
            }
        };
        let output_index = self.output.len();
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": output_index, "item": item}),
        );
        self.output.push(item);
    }

    /// The answer failed: `response.failed` with what was done so far.
    fn fail(&mut self, out: &mut Vec<u8>, message: &str) {
        self.close(out);
        let mut response = self.response("failed");
        response["error"] = json!({"code": "server_error", "message": message});
        response["usage"] = self.usage.as_ref().map_or(Value::Null, |u| usage(Some(u)));
        self.emit(out, "response.failed", json!({"response": response}));
        self.ended = true;
        self.cut = true;
    }

    fn response(&self, status: &str) -> Value {
        let id = if self.id.is_empty() {
            response_id(None)
        } else {
            self.id.clone()
        };
        let mut response = envelope(&id, self.created, &self.model, status);
        response["output"] = Value::Array(self.output.clone());
        response
    }

    fn added(&mut self, out: &mut Vec<u8>, item: Value) {
        let output_index = self.output.len();
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": output_index, "item": item}),
        );
    }

    /// A delta of the open item, written as it is read: one per token. Text has its one
    /// content part; a function call's arguments none. `prefix` names the item.
    fn delta(&mut self, out: &mut Vec<u8>, kind: &str, prefix: &str, text: &str) {
        let number = |out: &mut Vec<u8>, n: u64| {
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        };
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: {\"type\":\"");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\",\"sequence_number\":");
        number(out, self.sequence);
        self.sequence += 1;
        out.extend_from_slice(b",\"item_id\":\"");
        out.extend_from_slice(prefix.as_bytes());
        out.push(b'_');
        let id = match &self.open {
            Open::Call { call_id, .. } => call_id,
            _ => &self.item_id,
        };
        sse::write_str_content(out, id);
        out.push(b'"');
        out.extend_from_slice(b",\"output_index\":");
        number(out, self.output.len() as u64);
        if prefix != "fc" {
            out.extend_from_slice(b",\"content_index\":0");
        }
        out.extend_from_slice(b",\"delta\":");
        sse::write_str(out, text);
        if prefix == "msg" {
            out.extend_from_slice(b",\"logprobs\":[]");
        }
        out.extend_from_slice(b"}\n\n");
    }

    /// An event on the open item's one content part (`rs` or `msg` names the item).
    fn part_event(&mut self, out: &mut Vec<u8>, kind: &str, prefix: &str, body: Value) {
        let mut body = body;
        body["content_index"] = json!(0);
        let item_id = format!("{prefix}_{}", self.item_id);
        self.item_event(out, kind, &item_id, body);
    }

    /// An event on the open item.
    fn item_event(&mut self, out: &mut Vec<u8>, kind: &str, item_id: &str, mut body: Value) {
        body["item_id"] = json!(item_id);
        body["output_index"] = json!(self.output.len());
        self.emit(out, kind, body);
    }

    /// Writes one event: its type and sequence number added to `body`.
    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut body: Value) {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        sse::write(out, Some(kind), &body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::translate::test_kit::{assert_split_independent, convert_all, named_events};

    /// A chat stream with reasoning, text, a function call, a freeform call and usage.
    fn chat_stream(finish: &str) -> String {
        let chunks = [
            json!({"id": "c1", "created": 7, "model": "qwen", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"reasoning_content": "Think"}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"reasoning_content": "ing."}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"content": "lo"}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "w", "arguments": ""}}]}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "exec", "arguments": "{\"input\":"}}]}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "\"ls\"}"}}]}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
            json!({"id": "c1", "model": "qwen", "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 10}}}),
        ];
        let mut s: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        s.push_str("data: [DONE]\n\n");
        s
    }

    fn asked() -> Asked {
        Asked {
            model: "gpt-x".into(),
            usage: false,
            freeform: vec!["exec".into()],
        }
    }

    /// The events of a converted stream, as (name, data), checking each names its type.
    fn events(out: &[u8]) -> Vec<(String, Value)> {
        let all = named_events(out);
        for (name, data) in &all {
            assert_eq!(data["type"], name.as_str());
        }
        all
    }

    fn convert(chunks: &[&[u8]]) -> Vec<u8> {
        convert_all(Box::new(StreamToResponses::new(&asked())), chunks)
    }

    #[test]
    fn items_come_in_order_with_their_deltas_and_the_whole_response_at_the_end() {
        let all = events(&convert(&[chat_stream("tool_calls").as_bytes()]));
        let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (_, data)) in all.iter().enumerate() {
            assert_eq!(data["sequence_number"], i as u64);
        }
        assert_eq!(all[0].1["response"]["id"], "resp_c1");
        assert_eq!(all[0].1["response"]["status"], "in_progress");
        assert_eq!(all[11].1["delta"], "Hel");
        assert_eq!(all[11].1["item_id"], "msg_c1");
        assert_eq!(all[11].1["output_index"], 1);
        assert_eq!(all[17].1["item_id"], "fc_call_a");
        assert_eq!(all[17].1["output_index"], 2);
        assert_eq!(all[22].1["delta"], "ls");
        let completed = &all[25].1["response"];
        assert_eq!(completed["status"], "completed");
        assert_eq!(completed["created_at"], 7);
        assert_eq!(completed["output"][1]["content"][0]["text"], "Hello");
        assert_eq!(completed["output"][2]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(completed["output"][3]["input"], "ls");
        assert_eq!(
            completed["usage"],
            json!({"input_tokens": 50, "input_tokens_details": {"cached_tokens": 10},
                   "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": 59})
        );
        // Each item done is the item the completed response holds.
        let done: Vec<&Value> = (all.iter())
            .filter(|(n, _)| n == "response.output_item.done")
            .map(|(_, d)| &d["item"])
            .collect();
        assert_eq!(
            done,
            completed["output"]
                .as_array()
                .unwrap()
                .iter()
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_output_does_not_depend_on_how_the_bytes_are_split() {
        let make = || -> Box<dyn StreamConvert> { Box::new(StreamToResponses::new(&asked())) };
        assert_split_independent(make, &chat_stream("stop"));
    }

    #[test]
    fn a_cut_stream_fails_and_a_length_stop_is_incomplete() {
        let cut =
            convert(&[b"data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"]);
        let last = events(&cut).pop().unwrap();
        assert_eq!(last.0, "response.failed");
        assert_eq!(last.1["response"]["status"], "failed");
        assert_eq!(last.1["response"]["output"][0]["content"][0]["text"], "a");
        let length = events(&convert(&[chat_stream("length").as_bytes()]));
        let last = &length.last().unwrap().1;
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        let error = convert(&[b"data: {\"error\":{\"message\":\"overloaded\"}}\n\n"]);
        assert_eq!(
            events(&error).last().unwrap().1["response"]["error"]["message"],
            "overloaded"
        );
    }
}
