//! What reading the agent APIs' bodies costs on the request path (`make bench`;
//! `cargo bench --bench bodies`): the model policy's validation of a 200 KB Responses body
//! (an agent turn: messages, function calls and their outputs, tools) and of a Messages body
//! and a chat body of the same size; and the usage scanner on 200 KB Responses, Messages and
//! chat streams, as throughput.

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use portcullis::{plan_body, Encoding, Endpoint, Framing, Models, UsageContainer, UsageScanner};
use serde_json::{json, Value};

/// The size every body and stream is grown to.
const SIZE: usize = 200 * 1024;

/// A file's worth of source text, with the quotes, backslashes and newlines that JSON
/// escapes: what a tool's output carries.
fn file_text(turn: usize) -> String {
    let mut text = String::new();
    for line in 0..24 {
        text.push_str(&format!(
            "    let path_{turn}_{line} = \"src/\\\"quoted\\\"/mod.rs\"; // übersetzt, line {line}\n"
        ));
    }
    text
}

/// A JSON schema for a tool's parameters.
fn schema(names: &[&str]) -> Value {
    let properties: serde_json::Map<String, Value> = names
        .iter()
        .map(|name| {
            let about = format!("The {name} to act on, relative to the workspace root.");
            (
                name.to_string(),
                json!({"type": "string", "description": about}),
            )
        })
        .collect();
    json!({"type": "object", "properties": properties, "required": names,
           "additionalProperties": false})
}

const TOOLS: [(&str, &[&str]); 6] = [
    ("read_file", &["path"]),
    ("write_file", &["path", "contents"]),
    ("run_command", &["command", "cwd"]),
    ("search", &["query", "glob"]),
    ("list_directory", &["path"]),
    ("apply_patch", &["patch"]),
];

/// Adds turns until the serialized body reaches `SIZE`.
fn grown(mut body: Value, list: &str, turn: impl Fn(usize) -> Vec<Value>) -> Vec<u8> {
    let mut i = 0;
    while serde_json::to_vec(&body).unwrap().len() < SIZE {
        let items = body[list].as_array_mut().unwrap();
        items.extend(turn(i));
        i += 1;
    }
    serde_json::to_vec(&body).unwrap()
}

/// A Responses request of an agent's turn: `input` of user and assistant messages, function
/// calls and their outputs; function tools; streamed.
fn responses_body() -> Vec<u8> {
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|(name, params)| {
            json!({"type": "function", "name": name, "description": format!("{name} in the workspace"),
                   "parameters": schema(params), "strict": true})
        })
        .collect();
    let body = json!({
        "model": "gpt-4.1",
        "instructions": "You are a coding agent. Use the tools to read and change the workspace.",
        "input": [{"role": "user", "content": "Fix the failing test in src/usage."}],
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "max_output_tokens": 4096,
        "stream": true,
        "store": false,
    });
    grown(body, "input", |i| {
        let call = format!("call_{i:04}");
        vec![
            json!({"type": "function_call", "call_id": call, "name": "read_file",
                   "arguments": json!({"path": format!("src/usage/file_{i}.rs")}).to_string()}),
            json!({"type": "function_call_output", "call_id": call, "output": file_text(i)}),
            json!({"role": "assistant", "content": [{"type": "output_text",
                   "text": format!("Read file {i}; the scanner's state carries over chunks.")}]}),
            json!({"role": "user", "content": [{"type": "input_text", "text": "Go on."}]}),
        ]
    })
}

/// A Messages request of the same turn: tool_use and tool_result blocks, a system prompt.
fn messages_body() -> Vec<u8> {
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|(name, params)| {
            json!({"name": name, "description": format!("{name} in the workspace"),
                   "input_schema": schema(params)})
        })
        .collect();
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "system": [{"type": "text", "text": "You are a coding agent.",
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Fix the failing test in src/usage."}],
        "tools": tools,
        "stream": true,
    });
    grown(body, "messages", |i| {
        let id = format!("toolu_{i:04}");
        vec![
            json!({"role": "assistant", "content": [
                {"type": "text", "text": format!("Reading file {i}.")},
                {"type": "tool_use", "id": id, "name": "read_file",
                 "input": {"path": format!("src/usage/file_{i}.rs")}}]}),
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": file_text(i)}]}),
        ]
    })
}

/// A chat request of the same turn: tool calls and tool messages.
fn chat_body() -> Vec<u8> {
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|(name, params)| {
            json!({"type": "function", "function": {"name": name,
                   "description": format!("{name} in the workspace"), "parameters": schema(params)}})
        })
        .collect();
    let body = json!({
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": "You are a coding agent."},
                     {"role": "user", "content": "Fix the failing test in src/usage."}],
        "tools": tools,
        "max_completion_tokens": 4096,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    grown(body, "messages", |i| {
        let call = format!("call_{i:04}");
        vec![
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": call,
                   "type": "function", "function": {"name": "read_file",
                   "arguments": json!({"path": format!("src/usage/file_{i}.rs")}).to_string()}}]}),
            json!({"role": "tool", "tool_call_id": call, "content": file_text(i)}),
        ]
    })
}

fn validating(c: &mut Criterion) {
    let openai = Models::new(None, []);
    let anthropic = Models::new(None, []);
    for (name, endpoint, body, models) in [
        ("responses", Endpoint::Responses, responses_body(), &openai),
        ("messages", Endpoint::Messages, messages_body(), &anthropic),
        ("chat", Endpoint::Chat, chat_body(), &openai),
    ] {
        plan_body(endpoint, &body, models).expect("a valid body");
        let mut group = c.benchmark_group("bodies/validate");
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(format!("{name} {} KB", body.len() / 1024), |b| {
            b.iter(|| black_box(plan_body(endpoint, black_box(&body), models).is_ok()))
        });
        group.finish();
    }
}

/// An event stream of `event` lines and `data` events, grown to `SIZE` with content deltas
/// between its opening and closing events.
fn stream(
    open: &[(&str, Value)],
    delta: impl Fn(usize) -> (String, Value),
    close: &[(&str, Value)],
) -> Vec<u8> {
    let mut out = String::new();
    let event = |out: &mut String, name: &str, data: &Value| {
        if !name.is_empty() {
            out.push_str(&format!("event: {name}\n"));
        }
        out.push_str(&format!("data: {data}\n\n"));
    };
    for (name, data) in open {
        event(&mut out, name, data);
    }
    let mut tail = String::new();
    for (name, data) in close {
        event(&mut tail, name, data);
    }
    let mut i = 0;
    while out.len() + tail.len() < SIZE {
        let (name, data) = delta(i);
        event(&mut out, &name, &data);
        i += 1;
    }
    out.push_str(&tail);
    out.into_bytes()
}

fn word(i: usize) -> String {
    format!(" token{} \"q\"", i % 97)
}

fn responses_stream() -> Vec<u8> {
    let response = |status: &str, usage: Value| {
        json!({"id": "resp_1", "object": "response", "status": status, "model": "gpt-4.1",
               "output": [], "usage": usage})
    };
    stream(
        &[(
            "response.created",
            json!({"type": "response.created", "sequence_number": 0,
              "response": response("in_progress", Value::Null)}),
        )],
        |i| {
            (
                "response.output_text.delta".into(),
                json!({"type": "response.output_text.delta",
              "sequence_number": i + 1, "item_id": "msg_1", "output_index": 0,
              "content_index": 0, "delta": word(i), "logprobs": []}),
            )
        },
        &[(
            "response.completed",
            json!({"type": "response.completed", "sequence_number": 0,
              "response": response("completed", json!({"input_tokens": 36000,
                "input_tokens_details": {"cached_tokens": 8000}, "output_tokens": 4000,
                "output_tokens_details": {"reasoning_tokens": 500}, "total_tokens": 40000}))}),
        )],
    )
}

fn messages_stream() -> Vec<u8> {
    stream(
        &[
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1",
              "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5",
              "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 25,
              "cache_creation_input_tokens": 1000, "cache_read_input_tokens": 35000,
              "output_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
              "content_block": {"type": "text", "text": ""}}),
            ),
        ],
        |i| {
            (
                "content_block_delta".into(),
                json!({"type": "content_block_delta", "index": 0,
              "delta": {"type": "text_delta", "text": word(i)}}),
            )
        },
        &[
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason":
              "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 4000}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ],
    )
}

/// A chat stream that asked for its usage: `"usage":null` on every chunk, the counts last.
fn chat_stream() -> Vec<u8> {
    let chunk = |choices: Value, usage: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1741476542,
               "model": "gpt-4o", "system_fingerprint": "fp_1", "choices": choices,
               "usage": usage})
    };
    let mut out = stream(
        &[],
        |i| {
            (
                String::new(),
                chunk(
                    json!([{"index": 0, "delta": {"content": word(i)},
              "logprobs": null, "finish_reason": null}]),
                    Value::Null,
                ),
            )
        },
        &[(
            "",
            chunk(
                json!([]),
                json!({"prompt_tokens": 36000, "completion_tokens": 4000,
              "total_tokens": 40000, "prompt_tokens_details": {"cached_tokens": 8000}}),
            ),
        )],
    );
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

/// The scanner as the proxy feeds it: the body in 16 KiB chunks.
fn scan(dialect: UsageContainer, body: &[u8]) -> bool {
    let mut scanner = UsageScanner::new(Framing::EventStream, Encoding::Identity, dialect);
    for chunk in body.chunks(16 * 1024) {
        scanner.feed(chunk);
    }
    scanner.usage().is_some()
}

fn scanning(c: &mut Criterion) {
    for (name, dialect, body) in [
        ("responses", UsageContainer::Response, responses_stream()),
        ("messages", UsageContainer::Message, messages_stream()),
        ("chat", UsageContainer::Root, chat_stream()),
    ] {
        assert!(scan(dialect, &body), "{name}: no usage read");
        let mut group = c.benchmark_group("bodies/usage stream");
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(format!("{name} {} KB", body.len() / 1024), |b| {
            b.iter(|| black_box(scan(dialect, black_box(&body))))
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = validating, scanning
}
criterion_main!(benches);
