//! The agent APIs: OpenAI's Responses API (`…/responses`) and Anthropic's Messages API
//! (`…/messages`, `…/messages/count_tokens`), shaped as the official SDKs parse them. The
//! shape builders here serve both modes: the `/oa/…` endpoints below, with the fixed token
//! counts stated in the constants (what the gateway's meter is held to), and the demo model
//! (`model/agents.rs`), which counts tokens as it counts them for chat.
//!
//! Streams are SSE with named events, `event: <type>\ndata: <json>\n\n`, no `[DONE]`:
//!   Responses  response.created, response.in_progress, response.output_item.added,
//!              response.content_part.added, response.output_text.delta ×N,
//!              response.output_text.done, response.content_part.done,
//!              response.output_item.done, response.completed (the whole response, usage
//!              included); each `data` has `type` and `sequence_number`. A function call
//!              (the demo model's) streams as output_item.added,
//!              function_call_arguments.delta ×3, function_call_arguments.done,
//!              output_item.done
//!   Messages   message_start (usage with input tokens and output_tokens 1),
//!              content_block_start, ping, content_block_delta ×N, content_block_stop,
//!              message_delta (stop_reason, and usage: the cumulative output_tokens),
//!              message_stop; a tool_use block starts with `input: {}`, then
//!              input_json_delta ×3; a thinking block (the demo model's, when asked) comes
//!              first: thinking_delta ×N, then one signature_delta

use std::time::Duration;

use serde_json::{json, Value};
use tokio::net::TcpStream;

use super::model::tools::Call;
use super::openai::{stream, write_json, Pacing, Usage, CREATED};
use super::wire::query_param;
use super::{coding, Hit, State};

/// A usage object as Anthropic reports it: the prompt is split in three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MessagesUsage {
    pub input: u64,
    pub cache_creation: u64,
    pub cache_read: u64,
    pub output: u64,
}

impl MessagesUsage {
    /// What a gateway records: prompt = input + cache creation + cache read; cached = cache read.
    pub const fn usage(&self) -> Usage {
        Usage {
            prompt: self.input + self.cache_creation + self.cache_read,
            completion: self.output,
            reasoning: 0,
            cached: self.cache_read,
        }
    }

    pub fn json(&self) -> Value {
        json!({"input_tokens": self.input, "cache_creation_input_tokens": self.cache_creation,
            "cache_read_input_tokens": self.cache_read, "output_tokens": self.output})
    }
}

/// `POST /oa/…/responses` without `"stream":true`.
pub const RESPONSES_JSON_USAGE: Usage = Usage {
    prompt: 51,
    completion: 27,
    reasoning: 9,
    cached: 13,
};
/// `POST /oa/…/responses` streamed, in `response.completed`.
pub const RESPONSES_SSE_USAGE: Usage = Usage {
    prompt: 61,
    completion: 33,
    reasoning: 11,
    cached: 17,
};
/// `POST /oa/…/messages` without `"stream":true`.
pub const MESSAGES_JSON_USAGE: MessagesUsage = MessagesUsage {
    input: 71,
    cache_creation: 5,
    cache_read: 19,
    output: 29,
};
/// `POST /oa/…/messages` streamed: input and cache counts in `message_start` (with
/// `output_tokens` 1, as Anthropic sends it), the final `output_tokens` in `message_delta`.
pub const MESSAGES_SSE_USAGE: MessagesUsage = MessagesUsage {
    input: 81,
    cache_creation: 7,
    cache_read: 23,
    output: 37,
};
/// `POST /oa/…/messages/count_tokens`: `{"input_tokens": COUNT_TOKENS}`, no usage.
pub const COUNT_TOKENS: u64 = 43;

/// The text of the JSON answers: it quotes usage, and only the real usage object counts.
const TRAP: &str = "a trap: \"usage\":{\"input_tokens\":999,\"output_tokens\":999}";

/// OpenAI's `usage` object of a response.
pub fn responses_usage_json(u: &Usage) -> Value {
    json!({"input_tokens": u.prompt, "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.total()})
}

/// One Responses answer: what both modes fill in.
pub(super) struct Response<'a> {
    pub id: String,
    pub created_at: u64,
    /// As received (null when absent).
    pub model: Value,
    pub instructions: Value,
    pub max_output_tokens: Value,
    /// Answered after a reasoning item (its text never shown, as OpenAI hides it).
    pub reasoning: bool,
    pub deltas: Vec<&'a str>,
    /// Function calls made instead of the message (the demo model's; never in `/oa/`).
    pub calls: Vec<Call>,
    /// `incomplete` (cut by `max_output_tokens`) rather than `completed`.
    pub incomplete: bool,
    pub usage: Value,
}

impl Response<'_> {
    fn reasoning_item(&self) -> Value {
        json!({"id": format!("rs_{}", self.id), "type": "reasoning", "summary": []})
    }

    fn message_item(&self, done: bool) -> Value {
        let content = if done {
            json!([self.part(&self.deltas.concat())])
        } else {
            json!([])
        };
        let status = match (done, self.incomplete) {
            (false, _) => "in_progress",
            (true, false) => "completed",
            (true, true) => "incomplete",
        };
        json!({"id": format!("msg_{}", self.id), "type": "message", "status": status,
            "content": content, "role": "assistant"})
    }

    fn part(&self, text: &str) -> Value {
        json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
    }

    fn output(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if self.reasoning {
            out.push(self.reasoning_item());
        }
        if self.calls.is_empty() {
            out.push(self.message_item(true));
        }
        out.extend(self.calls.iter().map(|c| c.item(true)));
        out
    }

    /// The response object; `done`: with its output and usage, else as it starts.
    pub fn object(&self, done: bool) -> Value {
        let status = match (done, self.incomplete) {
            (false, _) => "in_progress",
            (true, false) => "completed",
            (true, true) => "incomplete",
        };
        let incomplete = (done && self.incomplete).then(|| json!({"reason": "max_output_tokens"}));
        json!({"id": format!("resp_{}", self.id), "object": "response",
            "created_at": self.created_at, "status": status, "background": false, "error": null,
            "incomplete_details": incomplete, "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens, "model": self.model,
            "output": if done { json!(self.output()) } else { json!([]) },
            "parallel_tool_calls": true, "previous_response_id": null,
            "reasoning": {"effort": null, "summary": null}, "store": true, "temperature": 1.0,
            "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
            "top_p": 1.0, "truncation": "disabled",
            "usage": if done { self.usage.clone() } else { Value::Null },
            "user": null, "metadata": {}})
    }

    /// The stream's events, numbered by `sequence_number`.
    pub fn events(&self) -> Vec<(String, Value)> {
        let m = usize::from(self.reasoning);
        let mut events = vec![
            ("response.created", json!({"response": self.object(false)})),
            (
                "response.in_progress",
                json!({"response": self.object(false)}),
            ),
        ];
        if self.reasoning {
            let item = self.reasoning_item();
            events.push((
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
            ));
            events.push((
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            ));
        }
        if self.calls.is_empty() {
            events.extend(self.message_events(m));
        }
        for (i, call) in self.calls.iter().enumerate() {
            events.extend(call.events(m + i));
        }
        let last = if self.incomplete {
            "response.incomplete"
        } else {
            "response.completed"
        };
        events.push((last, json!({"response": self.object(true)})));
        events
            .into_iter()
            .enumerate()
            .map(|(i, (kind, mut data))| {
                data["type"] = json!(kind);
                data["sequence_number"] = json!(i);
                (kind.to_string(), data)
            })
            .collect()
    }

    /// The message item's events, as output item `m`.
    fn message_events(&self, m: usize) -> Vec<(&'static str, Value)> {
        let msg_id = format!("msg_{}", self.id);
        let text = self.deltas.concat();
        let at = |extra: Value| {
            let mut v = json!({"item_id": msg_id, "output_index": m, "content_index": 0});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            v
        };
        let mut events = vec![
            (
                "response.output_item.added",
                json!({"output_index": m, "item": self.message_item(false)}),
            ),
            (
                "response.content_part.added",
                at(json!({"part": self.part("")})),
            ),
        ];
        for delta in &self.deltas {
            events.push((
                "response.output_text.delta",
                at(json!({"delta": delta, "logprobs": []})),
            ));
        }
        events.push((
            "response.output_text.done",
            at(json!({"text": text, "logprobs": []})),
        ));
        events.push((
            "response.content_part.done",
            at(json!({"part": self.part(&text)})),
        ));
        events.push((
            "response.output_item.done",
            json!({"output_index": m, "item": self.message_item(true)}),
        ));
        events
    }
}

/// One Messages answer: what both modes fill in.
pub(super) struct Message<'a> {
    pub id: String,
    pub model: Value,
    /// The thinking block's fragments, first (the demo model's when asked; none in `/oa/`).
    pub thinking: Vec<&'a str>,
    pub deltas: Vec<&'a str>,
    /// Tools used instead of the text (the demo model's; never in `/oa/`).
    pub calls: Vec<Call>,
    pub stop_reason: &'static str,
    pub usage: MessagesUsage,
}

/// What a thinking block is signed with: Anthropic's signatures are opaque, so any constant.
const SIGNATURE: &str = "demo-signature";

impl Message<'_> {
    pub fn object(&self) -> Value {
        let mut content: Vec<Value> = Vec::new();
        if !self.thinking.is_empty() {
            content.push(
                json!({"type": "thinking", "thinking": self.thinking.concat(),
                "signature": SIGNATURE}),
            );
        }
        if self.calls.is_empty() {
            content.push(json!({"type": "text", "text": self.deltas.concat()}));
        } else {
            content.extend(self.calls.iter().map(|c| c.tool_use(true)));
        }
        json!({"id": format!("msg_{}", self.id), "type": "message", "role": "assistant",
            "model": self.model, "content": content,
            "stop_reason": self.stop_reason, "stop_sequence": null, "usage": self.usage.json()})
    }

    pub fn events(&self) -> Vec<(String, Value)> {
        let start_usage = MessagesUsage {
            output: 1,
            ..self.usage
        };
        let mut message = self.object();
        message["content"] = json!([]);
        message["stop_reason"] = Value::Null;
        message["usage"] = start_usage.json();
        let mut blocks = Vec::new();
        if !self.thinking.is_empty() {
            blocks.push(json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""}}));
            blocks.extend(self.thinking.iter().map(|d| {
                json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": d}})
            }));
            // As Anthropic sends it: the signature last, just before the block stops.
            blocks.push(json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "signature_delta", "signature": SIGNATURE}}));
            blocks.push(json!({"type": "content_block_stop", "index": 0}));
        }
        let first = usize::from(!self.thinking.is_empty());
        if self.calls.is_empty() {
            blocks.push(json!({"type": "content_block_start", "index": first,
                "content_block": {"type": "text", "text": ""}}));
            blocks.extend(self.deltas.iter().map(|d| {
                json!({"type": "content_block_delta", "index": first,
                    "delta": {"type": "text_delta", "text": d}})
            }));
            blocks.push(json!({"type": "content_block_stop", "index": first}));
        } else {
            blocks.extend(
                (self.calls.iter().enumerate()).flat_map(|(i, c)| c.block_events(first + i)),
            );
        }
        let mut events = vec![json!({"type": "message_start", "message": message})];
        // A ping after the first block starts, as Anthropic sends it.
        let mut blocks = blocks.into_iter();
        events.extend(blocks.next());
        events.push(json!({"type": "ping"}));
        events.extend(blocks);
        events.push(json!({"type": "message_delta",
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": self.usage.output}}));
        events.push(json!({"type": "message_stop"}));
        events
            .into_iter()
            .map(|e| (e["type"].as_str().unwrap().to_string(), e))
            .collect()
    }
}

/// `event: <name>\ndata: <json>\n\n`.
pub(super) fn sse_event((name, data): &(String, Value)) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// The agent endpoints of the `/oa/` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentEndpoint {
    Responses,
    Messages,
}

fn oa_deltas(n: u64) -> Vec<String> {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

fn oa_answer(endpoint: AgentEndpoint, model: Value, stream: bool, n: u64) -> Vec<(String, Value)> {
    let deltas = oa_deltas(n);
    let deltas: Vec<&str> = if stream {
        deltas.iter().map(String::as_str).collect()
    } else {
        vec![TRAP]
    };
    match endpoint {
        AgentEndpoint::Responses => {
            let usage = if stream {
                RESPONSES_SSE_USAGE
            } else {
                RESPONSES_JSON_USAGE
            };
            let r = Response {
                id: "fake".into(),
                created_at: CREATED,
                model,
                instructions: Value::Null,
                max_output_tokens: Value::Null,
                reasoning: false,
                deltas,
                calls: Vec::new(),
                incomplete: false,
                usage: responses_usage_json(&usage),
            };
            if !stream {
                return vec![(String::new(), r.object(true))];
            }
            r.events()
        }
        AgentEndpoint::Messages => {
            let usage = if stream {
                MESSAGES_SSE_USAGE
            } else {
                MESSAGES_JSON_USAGE
            };
            let m = Message {
                id: "fake".into(),
                model,
                thinking: Vec::new(),
                deltas,
                calls: Vec::new(),
                stop_reason: "end_turn",
                usage,
            };
            if !stream {
                return vec![(String::new(), m.object())];
            }
            m.events()
        }
    }
}

/// The body the fake upstream sends (decoded) for a JSON request to `endpoint` whose `model`
/// is this (None: absent or null).
pub fn agent_json_body(endpoint: AgentEndpoint, model: Option<&str>) -> String {
    oa_answer(endpoint, json!(model), false, 0)[0].1.to_string()
}

/// The same for a streamed request with `?n=N` (N text deltas).
pub fn agent_sse_body(endpoint: AgentEndpoint, model: Option<&str>, n: u64) -> String {
    oa_answer(endpoint, json!(model), true, n)
        .iter()
        .map(sse_event)
        .collect()
}

/// `/oa/…/responses` and `/oa/…/messages`: `?status=N` an error in OpenAI's shape, else
/// JSON, or with `"stream":true` the events, the text deltas `?n=N` (3), every event
/// `?gap_ms=G` (50) apart, the one with the final usage (`response.completed`,
/// `message_delta`) in two writes `?split_ms=S` (50) apart, cut inside `"input_tokens"` or
/// `"output_tokens"`.
pub(super) async fn answer(
    conn: &mut TcpStream,
    req: &Hit,
    state: &State,
    endpoint: AgentEndpoint,
) -> bool {
    // `?status=N`: the server refuses the request, in OpenAI's error shape (what a bridge
    // in front of it must turn into its client's).
    let status = query_param(&req.target, "status", 200);
    if status != 200 {
        let head = format!("{status} Refused");
        let body = r#"{"error":{"message":"the model does not exist","type":"invalid_request_error","param":"model","code":"model_not_found"}}"#;
        return super::wire::write_json(conn, &head, "", body).await;
    }
    let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let model = body.get("model").cloned().unwrap_or(Value::Null);
    let streamed = body.get("stream") == Some(&Value::Bool(true));
    let n = query_param(&req.target, "n", 3);
    let events = oa_answer(endpoint, model, streamed, n);
    if !streamed {
        return write_json(conn, req, &events[0].1.to_string()).await;
    }
    let (usage_event, needle) = match endpoint {
        AgentEndpoint::Responses => ("response.completed", "\"input_t"),
        AgentEndpoint::Messages => ("message_delta", "\"output_t"),
    };
    let pacing = Pacing {
        gap: Duration::from_millis(query_param(&req.target, "gap_ms", 50)),
        split: Duration::from_millis(query_param(&req.target, "split_ms", 50)),
        split_event: events.iter().position(|(k, _)| k == usage_event),
        split_at: needle,
        cut_after: super::openai::cut_after(req),
    };
    let texts: Vec<String> = events.iter().map(sse_event).collect();
    let log = super::serve::new_stream(state);
    stream(conn, coding::for_request(req), &texts, &pacing, &log).await
}

/// `/oa/…/messages/count_tokens`: `{"input_tokens": COUNT_TOKENS}`.
pub(super) async fn count_tokens(conn: &mut TcpStream, req: &Hit) -> bool {
    write_json(
        conn,
        req,
        &json!({"input_tokens": COUNT_TOKENS}).to_string(),
    )
    .await
}
