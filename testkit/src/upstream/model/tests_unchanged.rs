//! Requests without tools are answered byte for byte as before tool calls and validation came
//! (the SDK, admin-API and operations suites assert on these answers): `no_tools.golden` was
//! recorded from the model before them. `UPDATE_GOLDEN=1` rewrites it, for a deliberate change.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{agents, text, Answer, Model, Refusal};

type Endpoint = fn(&Map<String, Value>, &Model) -> Result<Answer, Refusal>;

const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/upstream/model/no_tools.golden"
);

/// The answer as text, its clock readings zeroed (ids count from 1 on a fresh model).
fn render(answer: Answer) -> String {
    fn zero(v: &mut Value) {
        match v {
            Value::Object(o) => {
                for (k, v) in o.iter_mut() {
                    if k == "created" || k == "created_at" {
                        *v = json!(0);
                    } else {
                        zero(v);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(zero),
            _ => {}
        }
    }
    let mut lines = Vec::new();
    let mut push = |name: &str, mut v: Value| {
        zero(&mut v);
        lines.push(format!("{name}{v}"));
    };
    match answer {
        Answer::Json(v) => push("", v),
        Answer::JsonWith(v, headers) => push(&headers, v),
        Answer::Stream(chunks) => chunks.into_iter().for_each(|c| push("data: ", c)),
        Answer::Events(events) => {
            (events.into_iter()).for_each(|(e, d)| push(&format!("{e}: "), d))
        }
    }
    lines.join("\n")
}

fn cases() -> Vec<(&'static str, Endpoint, Value)> {
    let history = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "Echo: hello there"},
        {"role": "user", "content": [{"type": "text", "text": "and  now"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]);
    let input = json!([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one two"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"role": "user", "content": "three"}]);
    let claude = json!([{"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "Echo: hi there"},
        {"role": "user", "content": [{"type": "text", "text": "again", "cache_control": {"type": "ephemeral"}}]}]);
    vec![
        (
            "chat",
            text::chat as Endpoint,
            json!({"model": "m", "messages": history}),
        ),
        (
            "chat thinking off, cut",
            text::chat,
            json!({"messages": history, "max_tokens": 2,
            "chat_template_kwargs": {"enable_thinking": false}}),
        ),
        (
            "chat streamed",
            text::chat,
            json!({"model": "m", "messages": history, "stream": true}),
        ),
        (
            "chat streamed with usage",
            text::chat,
            json!({"model": "m", "messages": history,
            "stream": true, "stream_options": {"include_usage": true}, "top_k": 5}),
        ),
        (
            "chat ending with the assistant",
            text::chat,
            json!({"messages": [
            {"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}]}),
        ),
        (
            "completions",
            text::completions,
            json!({"prompt": ["a b", "c"], "stream": true}),
        ),
        (
            "responses",
            agents::responses,
            json!({"model": "r", "instructions": "Be terse.",
            "input": input}),
        ),
        (
            "responses streamed",
            agents::responses,
            json!({"input": "say it back", "stream": true}),
        ),
        (
            "responses cut",
            agents::responses,
            json!({"input": input, "stream": true,
            "max_output_tokens": 1}),
        ),
        (
            "messages",
            agents::messages,
            json!({"model": "c", "max_tokens": 100,
            "system": "Be terse.", "messages": claude}),
        ),
        (
            "messages streamed",
            agents::messages,
            json!({"model": "c", "max_tokens": 1,
            "messages": claude, "stream": true}),
        ),
    ]
}

#[test]
fn requests_without_tools_are_answered_as_before() {
    let mut got = String::new();
    for (name, endpoint, body) in cases() {
        let model = Model::new(Duration::ZERO);
        let Ok(answer) = endpoint(body.as_object().unwrap(), &model) else {
            panic!("{name}: refused");
        };
        got.push_str(&format!("## {name}\n{}\n", render(answer)));
    }
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(GOLDEN, &got).unwrap();
    }
    let want = std::fs::read_to_string(GOLDEN).unwrap();
    for (got, want) in got.lines().zip(want.lines()) {
        assert_eq!(got, want);
    }
    assert_eq!(got.lines().count(), want.lines().count());
}
