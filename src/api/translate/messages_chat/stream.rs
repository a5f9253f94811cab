//! A chat stream as a Messages stream, converted event by event as the bytes arrive: nothing
//! waits for more than the rest of the event it is in.
//!
//! `message_start` on the first chunk; then one content block at a time, in the order the
//! chat deltas come: `thinking` (from `reasoning_content`) with `thinking_delta`s, `text` with
//! `text_delta`s, a `tool_use` per tool call with its arguments as `input_json_delta`s; each
//! closed by `content_block_stop` when the next begins. At the end (`[DONE]`, or the end of the
//! body after a `finish_reason`, for servers that send no `[DONE]`) `message_delta` with the
//! stop reason and the usage, then `message_stop`. A stream that ends before its finish reason
//! was cut: the client's stream ends with an `error` event, as Anthropic's API ends one.
//!
//! Tool calls are taken to stream one after another (as OpenAI, vLLM and SGLang send them): a
//! delta for a call whose block was already closed is dropped, since a Messages stream cannot
//! reopen a block.

use serde_json::{json, Value};

use super::answer::message_id;
use super::{stop_reason, usage};
use crate::api::translate::chat_chunk::{CallDelta, ChatChunk};
use crate::api::translate::{sse, StreamConvert};

/// The block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    None,
    Thinking,
    Text,
    /// A tool call, by its chat index.
    Tool(u64),
}

pub(crate) struct StreamToMessages {
    /// The model the client asked for, for a stream whose chunks name none.
    model: String,
    started: bool,
    block: Block,
    /// The index of the next content block.
    next_index: u64,
    /// The highest chat tool index whose block was opened.
    last_tool: Option<u64>,
    stop_reason: Option<&'static str>,
    usage: Option<Value>,
    ended: bool,
    /// Ended with an `error` event: the answer was cut.
    cut: bool,
}

impl StreamConvert for StreamToMessages {
    /// One complete chat event.
    fn event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        if data.trim_ascii() == b"[DONE]" {
            if self.stop_reason.is_some() {
                self.end_message(out);
            } else {
                self.cut(out, "the upstream's stream ended without a finish reason");
            }
            return;
        }
        let Some(chunk) = ChatChunk::read(data) else {
            return;
        };
        if let Some(error) = &chunk.error {
            let message = error["message"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_string);
            self.cut(out, &message);
            return;
        }
        self.start(&chunk, out);
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        if let Some(text) = chunk.reasoning.as_deref().filter(|t| !t.is_empty()) {
            self.open(Block::Thinking, out);
            self.delta("thinking_delta", "thinking", text, out);
        }
        if let Some(text) = chunk.content.as_deref().filter(|t| !t.is_empty()) {
            self.open(Block::Text, out);
            self.delta("text_delta", "text", text, out);
        }
        for call in &chunk.tool_calls {
            self.tool_call(call, out);
        }
        if let Some(finish) = chunk.finish_reason.as_deref() {
            self.stop_reason = Some(stop_reason(finish));
        }
    }

    /// The end of the Messages stream, or its `error` event when the chat stream was cut.
    fn end(&mut self, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        if self.stop_reason.is_some() {
            self.end_message(out);
        } else {
            self.cut(
                out,
                "the upstream's stream ended before its answer was complete",
            );
        }
    }

    fn was_cut(&self) -> bool {
        self.cut
    }
}

impl StreamToMessages {
    pub(crate) fn new(model: &str) -> StreamToMessages {
        StreamToMessages {
            model: model.to_string(),
            started: false,
            block: Block::None,
            next_index: 0,
            last_tool: None,
            stop_reason: None,
            usage: None,
            ended: false,
            cut: false,
        }
    }

    fn tool_call(&mut self, call: &CallDelta, out: &mut Vec<u8>) {
        if self.block != Block::Tool(call.index) {
            if self.last_tool.is_some_and(|last| call.index <= last) {
                return; // its block was closed: Messages cannot reopen it
            }
            self.close(out);
            let block = json!({
                "type": "tool_use",
                "id": call.id.as_deref(),
                "name": call.name.as_deref(),
                "input": {},
            });
            self.begin(Block::Tool(call.index), block, out);
            self.last_tool = Some(call.index);
        }
        if let Some(part) = call.arguments.as_deref().filter(|a| !a.is_empty()) {
            self.delta("input_json_delta", "partial_json", part, out);
        }
    }

    fn start(&mut self, chunk: &ChatChunk, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let model = chunk.model.as_deref().unwrap_or(&self.model);
        let message = json!({
            "id": message_id(chunk.id.as_deref()),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        });
        event(
            out,
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
    }

    /// Makes `kind` the open block (a text or thinking block, started empty).
    fn open(&mut self, kind: Block, out: &mut Vec<u8>) {
        if self.block == kind {
            return;
        }
        self.close(out);
        let block = match kind {
            Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "text", "text": ""}),
        };
        self.begin(kind, block, out);
    }

    fn begin(&mut self, kind: Block, block: Value, out: &mut Vec<u8>) {
        let start = json!({"type": "content_block_start", "index": self.next_index, "content_block": block});
        event(out, "content_block_start", &start);
        self.block = kind;
    }

    /// A delta of the open block, written as it is read: one per token.
    fn delta(&self, kind: &str, field: &str, text: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
        );
        out.extend_from_slice(itoa::Buffer::new().format(self.next_index).as_bytes());
        out.extend_from_slice(b",\"delta\":{\"type\":\"");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\",\"");
        out.extend_from_slice(field.as_bytes());
        out.extend_from_slice(b"\":");
        sse::write_str(out, text);
        out.extend_from_slice(b"}}\n\n");
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if self.block == Block::None {
            return;
        }
        let stop = json!({"type": "content_block_stop", "index": self.next_index});
        event(out, "content_block_stop", &stop);
        self.block = Block::None;
        self.next_index += 1;
    }

    fn end_message(&mut self, out: &mut Vec<u8>) {
        self.close(out);
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason.unwrap_or("end_turn"), "stop_sequence": null},
            "usage": usage(self.usage.as_ref()),
        });
        event(out, "message_delta", &delta);
        event(out, "message_stop", &json!({"type": "message_stop"}));
        self.ended = true;
    }

    fn cut(&mut self, out: &mut Vec<u8>, message: &str) {
        let error = json!({"type": "error", "error": {"type": "api_error", "message": message}});
        event(out, "error", &error);
        self.ended = true;
        self.cut = true;
    }
}

fn event(out: &mut Vec<u8>, name: &str, data: &Value) {
    sse::write(out, Some(name), data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::translate::test_kit::{
        assert_split_independent, convert_all, named_events as events,
    };
    use crate::api::translate::Stream;

    /// A chat stream with thinking, text, two tool calls and usage, as vLLM sends it.
    fn chat_stream() -> String {
        let chunks = [
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"reasoning_content": "Think"}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"reasoning_content": "ing."}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"content": "lo"}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "w", "arguments": ""}}]}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "t", "arguments": "{}"}}]}}]}),
            json!({"id": "c1", "model": "qwen", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"id": "c1", "model": "qwen", "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 10}}}),
        ];
        let mut s: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        s.push_str("data: [DONE]\n\n");
        s
    }

    fn convert(chunks: &[&[u8]]) -> Vec<u8> {
        convert_all(Box::new(StreamToMessages::new("claude-x")), chunks)
    }

    #[test]
    fn blocks_come_in_order_with_their_deltas_and_the_usage_at_the_end() {
        let out = convert(&[chat_stream().as_bytes()]);
        let names: Vec<String> = events(&out).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        let all = events(&out);
        assert_eq!(all[0].1["message"]["id"], "msg_c1");
        assert_eq!(all[0].1["message"]["model"], "qwen");
        assert_eq!(all[1].1["content_block"]["type"], "thinking");
        assert_eq!(
            all[2].1["delta"],
            json!({"type": "thinking_delta", "thinking": "Think"})
        );
        assert_eq!(
            all[5].1,
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}})
        );
        assert_eq!(
            all[9].1["content_block"],
            json!({"type": "tool_use", "id": "call_a", "name": "w", "input": {}})
        );
        assert_eq!(
            all[10].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"city\":"})
        );
        assert_eq!(all[13].1["index"], 3);
        assert_eq!(
            all[16].1,
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                   "usage": {"input_tokens": 40, "cache_read_input_tokens": 10, "output_tokens": 9}})
        );
    }

    #[test]
    fn the_output_does_not_depend_on_how_the_bytes_are_split() {
        let make = || -> Box<dyn StreamConvert> { Box::new(StreamToMessages::new("claude-x")) };
        assert_split_independent(make, &chat_stream());
    }

    #[test]
    fn each_event_is_converted_as_soon_as_it_is_complete() {
        let mut conv = Stream::new(Box::new(StreamToMessages::new("m")));
        let mut out = Vec::new();
        conv.feed(
            b"data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n",
            &mut out,
        );
        assert!(out.is_empty(), "the event is not complete yet");
        conv.feed(b"\n", &mut out);
        let names: Vec<String> = events(&out).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta"
            ]
        );
    }

    #[test]
    fn a_cut_stream_ends_with_an_error_event_and_one_without_done_still_ends() {
        let cut =
            convert(&[b"data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"]);
        let last = events(&cut).pop().unwrap();
        assert_eq!(last.0, "error");
        assert_eq!(last.1["error"]["type"], "api_error");
        // transformers serve: usage on the last chunk, no [DONE].
        let no_done = convert(&[b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n"]);
        let names: Vec<String> = events(&no_done).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names.last().map(String::as_str), Some("message_stop"));
        assert_eq!(events(&no_done)[0].1["message"]["model"], "claude-x");
        let error = convert(&[b"data: {\"error\":{\"message\":\"overloaded\"}}\n\n"]);
        assert_eq!(events(&error)[0].1["error"]["message"], "overloaded");
    }
}
