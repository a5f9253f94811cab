//! The demo model: what the fake upstream answers in model mode (`Upstream::model`, the
//! `fake-upstream` binary), for `make run` and the SDK, admin-API and operations suites. The
//! answers are deterministic so the suites can assert on them:
//!   GET  …/models            the chat model and the embedding model
//!   POST …/chat/completions  a reasoning phase (`Thinking about it.`, unless
//!                            `chat_template_kwargs.enable_thinking` is `false`), then
//!                            `Echo: <last user text>`; image parts read as ` [image:<type>]`;
//!                            `max_tokens` cuts the answer; with `stream` an SSE stream of one
//!                            fragment per event, the token delay apart, then `data: [DONE]`;
//!                            usage as OpenAI reports it, `include_usage` included (`text.rs`);
//!                            a `tool` message last: `Echo: <its text>`
//!   POST …/completions       text completions: `Echo: <prompt>` per prompt, likewise
//!   POST …/embeddings        1024 values per input, the same for the same text, L2-normalised
//!   POST …/responses, …/messages, …/messages/count_tokens  the agent APIs (`agents.rs`)
//!   other GET and POST       404; other methods 501
//! Every stream takes `?cut_after=K` as the `/oa/` endpoints do: the connection drops after K
//! events (`[DONE]` counted), no end of body sent.
//! Tool calls (`tools.rs`), on chat, Responses and Messages alike: with function tools offered,
//! tool_choice not none and the user's message last, the model calls the tool tool_choice
//! names, else the first, or the first two when the user's text has the word `parallel` and
//! parallel calls are allowed; arguments `{"text":"<last user text>"}`; ids `call_<n>`
//! (Responses items `fc_<n>`, Messages `toolu_<n>`), n counting the conversation's earlier
//! calls from 0; finish_reason `tool_calls` (stop_reason `tool_use`); streamed as each call's
//! id and name, then its arguments in three pieces; completion tokens: the fragments of all
//! arguments joined, plus the reasoning's. A tool's result last is echoed as a user text is.
//! Malformed chat and Responses bodies are refused (`check.rs`): 400 `{"error": {"message":
//! "<the member>…", "type": "invalid_request_error", "param": null, "code": null}}`.
//! A token is a fragment: a run of non-space characters and the spaces after it. Every answer
//! carries `Set-Cookie: demo_session=abc`, which the gateway in front must strip, and OpenAI's
//! account-wide `x-ratelimit-*` headers (`RATE_LIMIT_HEADERS`), which a gateway with budgets
//! must replace for a budgeted caller and pass untouched to any other.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lc_rs::digest::{digest, SHA256};
use base64::Engine;
use serde_json::{json, Map, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

mod agents;
mod check;
mod python;
#[cfg(test)]
mod tests_agent_tools;
#[cfg(test)]
mod tests_check;
#[cfg(test)]
mod tests_dialects;
#[cfg(test)]
mod tests_tools;
#[cfg(test)]
mod tests_unchanged;
mod text;
pub(super) mod tools;

use self::python::{py_str, py_truthy, PyRandom};
use self::text::fragments;
use super::openai::RATE_LIMIT_HEADERS;
use super::wire::{write_chunk, write_json};
use super::{Hit, State, StreamLog};

const CHAT_MODEL: &str = "alpha3.6-vl";
const EMB_MODEL: &str = "emb-m3";
const EMB_DIM: usize = 1024;
const REASONING: &str = "Thinking about it.";
/// Bodies past this are refused, not answered (once read: the shared reader takes any size).
const MAX_BODY: usize = 32 * 1024 * 1024;

pub(super) struct Model {
    token_delay: Duration,
    ids: AtomicU64,
    pub(super) verbose: AtomicBool,
}

impl Model {
    pub(super) fn new(token_delay: Duration) -> Model {
        Model {
            token_delay,
            ids: AtomicU64::new(0),
            verbose: AtomicBool::new(false),
        }
    }
}

enum Answer {
    Json(Value),
    /// JSON with more header lines (each ending in CRLF).
    JsonWith(Value, String),
    /// The chunks of a chat stream, `data: [DONE]` not included.
    Stream(Vec<Value>),
    /// Named events (`event:` and `data:`), as the agent APIs stream; no `[DONE]`.
    Events(Vec<(String, Value)>),
}

enum Refusal {
    /// 400 with this message; the connection stays open.
    Bad(&'static str),
    /// A malformed body (`check.rs`): 400 with this message, in OpenAI's full error shape.
    Invalid(String),
    NotFound,
    /// This status and message, then the connection closes.
    Close(u16, String),
}

/// Answers one request; false when the connection must close.
pub(super) async fn answer(conn: &mut TcpStream, req: &Hit, state: &State, model: &Model) -> bool {
    let path = req.path().trim_end_matches('/');
    let keep_alive = !req
        .header("connection")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("close"));
    let outcome = match req.method.as_str() {
        "GET" if path.ends_with("/models") => Ok(Answer::Json(models())),
        "POST" if req.body.len() > MAX_BODY => {
            // The message the Python gave: it checked a Content-Length before reading.
            let chunked = req
                .header("transfer-encoding")
                .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
            let message = if chunked {
                "request body too large"
            } else {
                "invalid Content-Length"
            };
            Err(Refusal::Close(400, message.to_string()))
        }
        "POST" if path.ends_with("/chat/completions") => {
            parse(&req.body).and_then(|b| text::chat(&b, model))
        }
        "POST" if path.ends_with("/completions") => {
            parse(&req.body).and_then(|b| text::completions(&b, model))
        }
        "POST" if path.ends_with("/embeddings") => parse(&req.body).and_then(|b| embeddings(&b)),
        "POST" if path.ends_with("/responses") => {
            parse(&req.body).and_then(|b| agents::responses(&b, model))
        }
        "POST" if path.ends_with("/messages/count_tokens") => {
            parse(&req.body).and_then(|b| agents::count_tokens(&b))
        }
        "POST" if path.ends_with("/messages") => {
            parse(&req.body).and_then(|b| agents::messages(&b, model))
        }
        "GET" | "POST" => Err(Refusal::NotFound),
        other => Err(Refusal::Close(
            501,
            format!("Unsupported method ('{other}')"),
        )),
    };
    let ok = match outcome {
        Ok(Answer::Json(body)) => reply(conn, req, state, model, 200, &body, "").await,
        Ok(Answer::JsonWith(body, extra)) => {
            reply(conn, req, state, model, 200, &body, &extra).await
        }
        Ok(Answer::Stream(chunks)) => {
            let mut events: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
            events.push("data: [DONE]\n\n".to_string());
            // [DONE] follows the last chunk at once.
            stream(conn, req, state, model, &events, chunks.len()).await
        }
        Ok(Answer::Events(events)) => {
            let n = events.len();
            let events: Vec<String> = events.iter().map(super::agents::sse_event).collect();
            stream(conn, req, state, model, &events, n).await
        }
        Err(Refusal::Bad(message)) => {
            reply(conn, req, state, model, 400, &error(message), "").await
        }
        Err(Refusal::Invalid(message)) => {
            let body = json!({"error": {"message": message, "type": "invalid_request_error",
                "param": null, "code": null}});
            reply(conn, req, state, model, 400, &body, "").await
        }
        Err(Refusal::NotFound) => {
            reply(conn, req, state, model, 404, &error("not found"), "").await
        }
        Err(Refusal::Close(code, message)) => {
            let close = "connection: close\r\n";
            reply(conn, req, state, model, code, &error(&message), close).await;
            false
        }
    };
    ok && keep_alive
}

/// Header lines every answer carries.
fn common_headers(state: &State) -> String {
    format!(
        "server: DemoUpstream/1.0\r\nset-cookie: demo_session=abc; Path=/\r\nx-demo-upstream: {}\r\n\
         {RATE_LIMIT_HEADERS}",
        state.name
    )
}

fn log(req: &Hit, model: &Model, code: u16) {
    if model.verbose.load(Ordering::Relaxed) {
        eprintln!("\"{} {}\" {code}", req.method, req.target);
    }
}

async fn reply(
    conn: &mut TcpStream,
    req: &Hit,
    state: &State,
    model: &Model,
    code: u16,
    body: &Value,
    extra_headers: &str,
) -> bool {
    log(req, model, code);
    let status = match code {
        200 => "200 OK",
        400 => "400 Bad Request",
        404 => "404 Not Found",
        _ => "501 Not Implemented",
    };
    let mut extra = common_headers(state);
    extra.push_str(extra_headers);
    write_json(conn, status, &extra, &body.to_string()).await
}

/// The events (whole SSE events), the first `paced` of them `token_delay` apart (the first at
/// once), the rest right after; with `?cut_after=K`, the connection drops after K of them, as
/// on the `/oa/` endpoints (a server dying mid-answer).
async fn stream(
    conn: &mut TcpStream,
    req: &Hit,
    state: &State,
    model: &Model,
    events: &[String],
    paced: usize,
) -> bool {
    log(req, model, 200);
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
         transfer-encoding: chunked\r\n{}\r\n",
        common_headers(state)
    );
    if conn.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let log = Arc::new(Mutex::new(StreamLog::default()));
    state.streams.lock().unwrap().push(log.clone());
    let cut_after = super::openai::cut_after(req);
    for (i, event) in events.iter().enumerate() {
        if cut_after == Some(i) {
            log.lock().unwrap().aborted = Some(Instant::now());
            return false;
        }
        if i > 0 && i < paced && !model.token_delay.is_zero() {
            tokio::time::sleep(model.token_delay).await;
        }
        if !write_chunk(conn, event.as_bytes()).await {
            // The client went away (e.g. the gateway cancelled): stop generating, and say so.
            log.lock().unwrap().aborted = Some(Instant::now());
            eprintln!("STREAM_ABORTED");
            return false;
        }
        log.lock().unwrap().sent.push(Instant::now());
    }
    let ok = conn.write_all(b"0\r\n\r\n").await.is_ok();
    log.lock().unwrap().finished = ok;
    ok
}

fn error(message: &str) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error"}})
}

fn models() -> Value {
    let model = |id: &str| json!({"id": id, "object": "model", "created": 1_700_000_000, "owned_by": "demo"});
    json!({"object": "list", "data": [model(CHAT_MODEL), model(EMB_MODEL)]})
}

fn parse(raw: &[u8]) -> Result<Map<String, Value>, Refusal> {
    match serde_json::from_slice(raw) {
        Ok(Value::Object(body)) => Ok(body),
        Ok(_) => Err(Refusal::Bad("request body must be a JSON object")),
        Err(_) => Err(Refusal::Bad("invalid JSON body")),
    }
}

/// The model as received, so the gateway's model policy shows in the answer.
fn received_model(body: &Map<String, Value>) -> &str {
    body.get("model")
        .and_then(Value::as_str)
        .unwrap_or("(none received)")
}

fn embeddings(body: &Map<String, Value>) -> Result<Answer, Refusal> {
    let bad = Refusal::Bad("'input' must be a non-empty string or array of strings");
    let texts: Vec<String> = match body.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if !items.is_empty() => {
            if items.iter().all(Value::is_string) {
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            } else if let Some(tokens) = token_words(items) {
                // One token array, as some SDKs send.
                vec![tokens]
            } else {
                let arrays: Option<Vec<String>> = items
                    .iter()
                    .map(|t| t.as_array().and_then(|a| token_words(a)))
                    .collect();
                arrays.ok_or(bad)?
            }
        }
        _ => return Err(bad),
    };
    let base64 = match body.get("encoding_format") {
        f if !py_truthy(f) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        _ => {
            return Err(Refusal::Bad(
                "'encoding_format' must be 'float' or 'base64'",
            ))
        }
    };
    let data: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let vec = embed(text);
            let embedding = if base64 {
                // What the official openai Python SDK asks for by default: little-endian f32s.
                let bytes: Vec<u8> = vec.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vec)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let n: usize = texts.iter().map(|t| fragments(t).len().max(1)).sum();
    Ok(Answer::Json(
        json!({"object": "list", "data": data, "model": received_model(body),
        "usage": {"prompt_tokens": n, "total_tokens": n}}),
    ))
}

/// Integers (Python counts booleans as integers) joined by spaces; None if any is not one.
fn token_words(items: &[Value]) -> Option<String> {
    let words = items
        .iter()
        .map(|t| match t {
            Value::Bool(_) => Some(py_str(t)),
            Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            _ => None,
        })
        .collect::<Option<Vec<String>>>()?;
    Some(words.join(" "))
}

/// Deterministic per text: a PRNG seeded by the text's SHA-256, then L2-normalised and rounded
/// to 6 decimals. The PRNG is CPython's, so the vectors are the Python demo's to the bit.
fn embed(text: &str) -> Vec<f64> {
    let mut rng = PyRandom::from_bytes(digest(&SHA256, text.as_bytes()).as_ref());
    let vec: Vec<f64> = (0..EMB_DIM).map(|_| -1.0 + 2.0 * rng.random()).collect();
    // A plain running sum, as the Python summed (no compensated summation).
    let mut sum = 0.0;
    for v in &vec {
        sum += v * v;
    }
    let norm = if sum == 0.0 { 1.0 } else { sum.sqrt() };
    // Formatting with a precision rounds correctly, like Python's round(x, 6).
    vec.iter()
        .map(|v| format!("{:.6}", v / norm).parse().unwrap())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_the_python_demos_to_the_last_digit() {
        // Values the Python original computed for these texts.
        let v = embed("first text");
        assert_eq!(v.len(), EMB_DIM);
        assert_eq!(v[..3], [-0.023933, 0.007016, -0.012334]);
        assert_eq!(v[EMB_DIM - 1], 0.020253);
        assert_eq!(embed("")[..2], [0.001361, 0.0071]);
    }

    #[test]
    fn fragments_keep_trailing_spaces_as_pythons_regex_did() {
        assert_eq!(
            fragments(" a  b\u{1c}c\u{a0}"),
            ["a  ", "b\u{1c}", "c\u{a0}"]
        );
        assert_eq!(fragments("  "), ["  "]);
        assert!(fragments("").is_empty());
    }
}
