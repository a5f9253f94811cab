//! What the dialect bridge costs on the request path (`make bench`; `cargo bench --bench
//! translate`), through the request path's own code (`portcullis::Bridge`):
//! - translating the captured Claude Code request (76 KB, Messages → chat) and the captured
//!   Codex request (Responses → chat): body in, the upstream's body out (target: ≤ 0.5 ms p50);
//! - converting a streamed answer event by event, for each direction: a stream of reasoning,
//!   text and a tool call's argument deltas (chat chunks, or the same answer as Responses
//!   events), in 1 KiB chunks as a server flushes them; the throughput is in upstream events
//!   (target: ≤ 2 µs per event, ≥ 500 Kelem/s).

use std::time::Duration;

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use portcullis::Bridge;
use serde_json::{json, Value};

const CLAUDE_CODE: &str = include_str!("../tests/fixtures/agents/claude_code_messages.json");
const CODEX: &str = include_str!("../tests/fixtures/agents/codex_responses.json");

fn requests(c: &mut Criterion) {
    let mut group = c.benchmark_group("translate/request");
    for (pair, name, body) in [
        ("messages>chat", "claude code", CLAUDE_CODE),
        ("responses>chat", "codex", CODEX),
    ] {
        let mut bridge = Bridge::named(pair).expect("a pair");
        bridge.request(body.as_bytes()).expect("translated");
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(format!("{pair} {name} {} KB", body.len() / 1024), |b| {
            b.iter(|| black_box(bridge.request(black_box(body.as_bytes())).map(|v| v.len())))
        });
    }
    group.finish();
}

/// A chat stream: 100 reasoning deltas, 300 text deltas, a tool call with 100 argument deltas,
/// the finish, the usage and `[DONE]`: 504 events.
fn chat_stream() -> (Vec<u8>, u64) {
    let mut events: Vec<Value> = Vec::new();
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
               "model": "qwen3", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    for i in 0..100 {
        events.push(chunk(
            json!({"reasoning_content": format!("step {i} of the plan, ")}),
            Value::Null,
        ));
    }
    for i in 0..300 {
        events.push(chunk(json!({"content": format!("word{i} ")}), Value::Null));
    }
    events.push(chunk(
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "read_file", "arguments": ""}}]}),
        Value::Null,
    ));
    for i in 0..99 {
        let part = if i == 0 {
            "{\"path\": \"src/".to_string()
        } else {
            format!("p{i}/")
        };
        events.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}),
            Value::Null,
        ));
    }
    events.push(chunk(json!({}), json!("tool_calls")));
    events.push(
        json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
        "model": "qwen3", "choices": [],
        "usage": {"prompt_tokens": 30000, "completion_tokens": 600, "total_tokens": 30600}}),
    );
    let mut out = Vec::new();
    for event in &events {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(event.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    (out, events.len() as u64 + 1)
}

/// A Responses stream of the same answer: 100 reasoning deltas, 300 text deltas, a function
/// call with 100 argument deltas, each item added and done, and `response.completed`.
fn responses_stream() -> (Vec<u8>, u64) {
    let mut events: Vec<Value> = Vec::new();
    let response = |status: &str| {
        json!({"id": "resp_bench", "object": "response", "created_at": 1, "model": "gpt-x",
               "status": status, "output": [], "usage": null})
    };
    events.push(json!({"type": "response.created", "response": response("in_progress")}));
    let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": []});
    events
        .push(json!({"type": "response.output_item.added", "output_index": 0, "item": reasoning}));
    for i in 0..100 {
        events.push(json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1",
                           "output_index": 0, "summary_index": 0, "delta": format!("step {i} of the plan, ")}));
    }
    events.push(json!({"type": "response.output_item.done", "output_index": 0, "item": reasoning}));
    let message = json!({"type": "message", "id": "msg_1", "role": "assistant", "content": []});
    events.push(json!({"type": "response.output_item.added", "output_index": 1, "item": message}));
    for i in 0..298 {
        events.push(
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1,
                           "content_index": 0, "delta": format!("word{i} ")}),
        );
    }
    events.push(json!({"type": "response.output_item.done", "output_index": 1, "item": message}));
    let call = json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file", "arguments": ""});
    events.push(json!({"type": "response.output_item.added", "output_index": 2, "item": call}));
    for i in 0..95 {
        events.push(
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1",
                           "output_index": 2, "delta": format!("p{i}/")}),
        );
    }
    events.push(json!({"type": "response.output_item.done", "output_index": 2, "item": call}));
    let mut done = response("completed");
    done["usage"] = json!({"input_tokens": 30000, "output_tokens": 600, "total_tokens": 30600});
    events.push(json!({"type": "response.completed", "response": done}));
    let mut out = Vec::new();
    for event in &events {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event["type"].as_str().unwrap_or_default().as_bytes());
        out.extend_from_slice(b"\ndata: ");
        out.extend_from_slice(event.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }
    (out, events.len() as u64)
}

/// The whole stream through a fresh converter, in 1 KiB chunks.
fn convert(pair: &str, stream: &[u8]) -> usize {
    let mut bridge = Bridge::named(pair).expect("a pair");
    bridge
        .request(br#"{"model":"m","stream":true,"messages":[],"input":"x"}"#)
        .ok();
    bridge.stream();
    let mut out = 0;
    let mut chunks = stream.chunks(1024).peekable();
    while let Some(chunk) = chunks.next() {
        let end = chunks.peek().is_none();
        out += bridge.chunk(Bytes::copy_from_slice(chunk), end).len();
    }
    out
}

fn streams(c: &mut Criterion) {
    let (chat, events) = chat_stream();
    let mut group = c.benchmark_group("translate/stream");
    group.throughput(Throughput::Elements(events));
    for pair in ["messages>chat", "responses>chat"] {
        assert!(convert(pair, &chat) > chat.len() / 2, "{pair}: converted");
        group.bench_function(format!("{pair} {events} events"), |b| {
            b.iter(|| black_box(convert(pair, black_box(&chat))))
        });
    }
    group.finish();
    let (responses, events) = responses_stream();
    let mut group = c.benchmark_group("translate/stream");
    group.throughput(Throughput::Elements(events));
    let pair = "chat>responses";
    assert!(
        convert(pair, &responses) > responses.len() / 4,
        "{pair}: converted"
    );
    group.bench_function(format!("{pair} {events} events"), |b| {
        b.iter(|| black_box(convert(pair, black_box(&responses))))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = requests, streams
}
criterion_main!(benches);
