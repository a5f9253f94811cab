//! The `/oa/…` endpoints: chat completions, text completions and embeddings answered as the
//! OpenAI API answers them, with the token counts below, so a test can hold a gateway's meter
//! to exact numbers.
//!
//! Bodies are written with their keys in OpenAI's order (serde_json's map would sort them), and
//! `id` and `created` are fixed: two answers to the same request are the same bytes, so a test
//! can compare what a client got through a gateway with what the upstream sent, or with
//! `json_body`, `sse_body` and `embeddings_body`, which state those bytes.
//!
//! Streams follow `stream_options.include_usage` as OpenAI does: when it is `true`, every
//! content chunk carries `"usage":null` and one more chunk, `"choices":[]` with the usage,
//! comes before `data: [DONE]`; otherwise (absent, null, false) no chunk has a `usage` member
//! and no usage is sent at all.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::coding::{self, Coding, Encoder};
use super::wire::{query_param, write_body, write_chunk};
use super::{Hit, State, StreamLog};

/// Token counts as the fake upstream reports them in a `usage` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    /// `completion_tokens_details.reasoning_tokens` (part of `completion`).
    pub reasoning: u64,
    /// `prompt_tokens_details.cached_tokens` (part of `prompt`).
    pub cached: u64,
}

impl Usage {
    pub const fn total(&self) -> u64 {
        self.prompt + self.completion
    }

    /// The `usage` object as written: OpenAI's fields in OpenAI's order, the details (with the
    /// zero audio and prediction counts OpenAI also sends) only where reasoning or cached
    /// tokens are counted, as for embeddings they are not.
    pub fn json(&self) -> String {
        let mut fields = vec![
            ("prompt_tokens", self.prompt.to_string()),
            ("completion_tokens", self.completion.to_string()),
            ("total_tokens", self.total().to_string()),
        ];
        if self.reasoning == 0 && self.cached == 0 {
            // Embeddings: OpenAI sends prompt_tokens and total_tokens only.
            fields.remove(1);
        } else {
            let cached = [
                ("cached_tokens", self.cached.to_string()),
                ("audio_tokens", "0".into()),
            ];
            let reasoning = [
                ("reasoning_tokens", self.reasoning.to_string()),
                ("audio_tokens", "0".into()),
                ("accepted_prediction_tokens", "0".into()),
                ("rejected_prediction_tokens", "0".into()),
            ];
            fields.push(("prompt_tokens_details", object(&cached)));
            fields.push(("completion_tokens_details", object(&reasoning)));
        }
        object(&fields)
    }
}

/// `POST /oa/…/chat/completions` without `"stream":true`.
pub const CHAT_JSON_USAGE: Usage = Usage {
    prompt: 11,
    completion: 5,
    reasoning: 2,
    cached: 3,
};
/// `POST /oa/…/chat/completions` streamed, in the usage chunk (with `include_usage`).
pub const CHAT_SSE_USAGE: Usage = Usage {
    prompt: 21,
    completion: 9,
    reasoning: 4,
    cached: 6,
};
/// `POST /oa/…/completions` without `"stream":true`.
pub const COMPLETIONS_JSON_USAGE: Usage = Usage {
    prompt: 31,
    completion: 19,
    reasoning: 14,
    cached: 12,
};
/// `POST /oa/…/completions` streamed, in the usage chunk (with `include_usage`).
pub const COMPLETIONS_SSE_USAGE: Usage = Usage {
    prompt: 41,
    completion: 23,
    reasoning: 16,
    cached: 18,
};
/// `POST /oa/…/embeddings`: prompt tokens only, as OpenAI reports them.
pub const EMBEDDINGS_USAGE: Usage = Usage {
    prompt: 7,
    completion: 0,
    reasoning: 0,
    cached: 0,
};

/// The `created` of every answer: fixed, so answers to one request are identical bytes.
pub const CREATED: u64 = 1_764_000_000;

/// The text of every JSON answer: it quotes a usage object, and only the top-level one counts.
const TRAP: &str = "a trap: \"usage\":{\"prompt_tokens\":999,\"completion_tokens\":999}";

/// A JSON object from keys and JSON texts, in the order given.
fn object(fields: &[(&str, String)]) -> String {
    let items: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{v}", json!(k)))
        .collect();
    format!("{{{}}}", items.join(","))
}

/// The endpoints with a text answer and a usage: chat or text completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    fn usage(self, stream: bool) -> Usage {
        match (self, stream) {
            (Endpoint::Chat, false) => CHAT_JSON_USAGE,
            (Endpoint::Chat, true) => CHAT_SSE_USAGE,
            (Endpoint::Completions, false) => COMPLETIONS_JSON_USAGE,
            (Endpoint::Completions, true) => COMPLETIONS_SSE_USAGE,
        }
    }

    fn id(self) -> &'static str {
        match self {
            Endpoint::Chat => "\"chatcmpl-fake\"",
            Endpoint::Completions => "\"cmpl-fake\"",
        }
    }

    fn object(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Endpoint::Chat, false) => "\"chat.completion\"",
            (Endpoint::Chat, true) => "\"chat.completion.chunk\"",
            (Endpoint::Completions, _) => "\"text_completion\"",
        }
    }

    /// `id`, `object`, `created`, `model`: how every answer and chunk starts.
    fn head(self, stream: bool, model: &str) -> Vec<(&'static str, String)> {
        vec![
            ("id", self.id().into()),
            ("object", self.object(stream).into()),
            ("created", CREATED.to_string()),
            ("model", model.into()),
        ]
    }

    /// One choice: a message or text (JSON), a delta or text (stream).
    fn choice(self, stream: bool, text: &str, first: bool, finish: Option<&str>) -> String {
        let text = json!(text).to_string();
        let finish = json!(finish).to_string();
        let index = ("index", "0".to_string());
        match (self, stream) {
            (Endpoint::Chat, false) => {
                let message = [
                    ("role", "\"assistant\"".into()),
                    ("content", text),
                    ("refusal", "null".into()),
                ];
                let fields = [
                    index,
                    ("message", object(&message)),
                    ("logprobs", "null".into()),
                    ("finish_reason", finish),
                ];
                object(&fields)
            }
            (Endpoint::Chat, true) => {
                // The first delta names the role, as OpenAI's and vLLM's first chunk does.
                let mut delta = vec![("content", text)];
                if first {
                    delta.insert(0, ("role", "\"assistant\"".into()));
                }
                let fields = [
                    index,
                    ("delta", object(&delta)),
                    ("logprobs", "null".into()),
                    ("finish_reason", finish),
                ];
                object(&fields)
            }
            (Endpoint::Completions, _) => {
                let fields = [
                    ("text", text),
                    index,
                    ("logprobs", "null".into()),
                    ("finish_reason", finish),
                ];
                object(&fields)
            }
        }
    }
}

/// The model received, as JSON text (`null` when there was none), so the gateway's model
/// policy shows in the answer.
fn model_of(req: &Hit) -> (Value, String) {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let model = body
        .get("model")
        .cloned()
        .unwrap_or(Value::Null)
        .to_string();
    (body, model)
}

/// The rate-limit headers OpenAI sends with every answer: a gateway with budgets of its own
/// must replace them with its own.
pub const RATE_LIMIT_HEADERS: &str = "x-ratelimit-limit-tokens: 150000000\r\n\
    x-ratelimit-remaining-tokens: 149999000\r\nx-ratelimit-reset-tokens: 0s\r\n\
    x-ratelimit-limit-requests: 30000\r\nx-ratelimit-remaining-requests: 29999\r\n\
    x-ratelimit-reset-requests: 2ms\r\n";

pub(super) async fn write_json(conn: &mut TcpStream, req: &Hit, body: &str) -> bool {
    let coding = coding::for_request(req);
    let extra = format!("{}{RATE_LIMIT_HEADERS}", coding::headers(coding));
    write_body(
        conn,
        "200 OK",
        "application/json",
        &extra,
        &coding.encode(body.as_bytes()),
    )
    .await
}

pub(super) async fn embeddings(conn: &mut TcpStream, req: &Hit) -> bool {
    let (_, model) = model_of(req);
    write_json(conn, req, &embeddings_answer(&model)).await
}

fn embeddings_answer(model: &str) -> String {
    let item = object(&[
        ("object", "\"embedding\"".into()),
        ("index", "0".into()),
        ("embedding", "[0.25,-0.5]".into()),
    ]);
    object(&[
        ("object", "\"list\"".into()),
        ("data", format!("[{item}]")),
        ("model", model.into()),
        ("usage", EMBEDDINGS_USAGE.json()),
    ])
}

/// The body the fake upstream sends (decoded) for an embeddings request with this `model`.
pub fn embeddings_body(model: Option<&str>) -> String {
    embeddings_answer(&json!(model).to_string())
}

/// Chat or text completions: JSON, or with `"stream":true` an SSE stream of `?n=N` chunks
/// `?gap_ms=G` apart whose usage chunk (with `include_usage`) is written in two pieces
/// `?split_ms=S` apart, cut inside `"prompt_tokens"`.
pub(super) async fn completion(
    conn: &mut TcpStream,
    req: &Hit,
    state: &State,
    endpoint: Endpoint,
) -> bool {
    // `?status=N`: the server refuses the request (an unknown model, a bad parameter).
    let status = query_param(&req.target, "status", 200);
    if status != 200 {
        let head = format!("{status} Refused");
        let body =
            r#"{"error":{"message":"the model does not exist","type":"invalid_request_error"}}"#;
        return super::wire::write_json(conn, &head, "", body).await;
    }
    let (body, model) = model_of(req);
    let streamed = body.get("stream") == Some(&Value::Bool(true));
    let usage = reported_usage(req, &body, endpoint.usage(streamed));
    if !streamed {
        return write_json(conn, req, &json_answer_with(endpoint, &model, usage)).await;
    }
    let include_usage = body.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
    let events = sse_events_with(
        endpoint,
        &model,
        query_param(&req.target, "n", 3),
        include_usage,
        usage,
    );
    let pacing = Pacing {
        gap: Duration::from_millis(query_param(&req.target, "gap_ms", 50)),
        split: Duration::from_millis(query_param(&req.target, "split_ms", 50)),
        // The usage chunk, just before [DONE].
        split_event: include_usage.then(|| events.len() - 2),
        split_at: "prompt_t",
        cut_after: cut_after(req),
    };
    let log = super::serve::new_stream(state);
    stream(conn, coding::for_request(req), &events, &pacing, &log).await
}

/// `?cut_after=K`: how many events a stream sends before its connection drops.
pub(super) fn cut_after(req: &Hit) -> Option<usize> {
    let k = query_param(&req.target, "cut_after", u64::MAX);
    (k != u64::MAX).then(|| usize::try_from(k).unwrap_or(usize::MAX))
}

/// The usage a request's answer reports, `stated` unless its query says otherwise (for tests
/// of a gateway that must not take the upstream's word): `?usage=none` reports none at all,
/// `?usage=cap` a completion as long as the request allowed (its `max_completion_tokens` or
/// `max_tokens`, else 100,000, times its `n` and its prompts, as a model server generates),
/// and `?prompt_tokens=P&completion_tokens=C&reasoning_tokens=R` those counts.
fn reported_usage(req: &Hit, body: &Value, stated: Usage) -> Option<Usage> {
    let mode = (req
        .target
        .split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default())
    .split('&')
    .find_map(|kv| kv.strip_prefix("usage="));
    let count = |name: &str, default: u64| query_param(&req.target, name, default);
    match mode {
        Some("none") => None,
        Some("cap") => {
            let num = |name: &str| body.get(name).and_then(Value::as_u64);
            let cap = (num("max_completion_tokens").or(num("max_tokens"))).unwrap_or(100_000);
            let choices = num("n").max(num("best_of")).unwrap_or(1).max(1);
            let prompts = match body.get("prompt") {
                Some(Value::Array(items)) if items.first().is_some_and(|i| !i.is_number()) => {
                    items.len() as u64
                }
                _ => 1,
            };
            let completion = cap * choices * prompts;
            Some(Usage {
                prompt: 21,
                completion,
                // Hidden: never streamed, as an o-series model's.
                reasoning: completion / 2,
                cached: 0,
            })
        }
        _ if !req.target.contains("_tokens=") => Some(stated),
        _ => Some(Usage {
            prompt: count("prompt_tokens", stated.prompt),
            completion: count("completion_tokens", stated.completion),
            // Non-zero, so the report keeps its completion count (`Usage::json`).
            reasoning: count("reasoning_tokens", stated.reasoning.max(1)),
            cached: stated.cached,
        }),
    }
}

/// The JSON answer; `model` as JSON text.
fn json_answer(endpoint: Endpoint, model: &str) -> String {
    json_answer_with(endpoint, model, Some(endpoint.usage(false)))
}

fn json_answer_with(endpoint: Endpoint, model: &str, usage: Option<Usage>) -> String {
    let mut fields = endpoint.head(false, model);
    let choice = endpoint.choice(false, TRAP, true, Some("stop"));
    fields.push(("choices", format!("[{choice}]")));
    if let Some(usage) = usage {
        fields.push(("usage", usage.json()));
    }
    object(&fields)
}

/// The stream's events, `data: [DONE]` last; `model` as JSON text.
fn sse_events(endpoint: Endpoint, model: &str, n: u64, include_usage: bool) -> Vec<String> {
    sse_events_with(
        endpoint,
        model,
        n,
        include_usage,
        Some(endpoint.usage(true)),
    )
}

/// As `sse_events`, reporting `usage` when asked (`None`: a server that never reports it).
fn sse_events_with(
    endpoint: Endpoint,
    model: &str,
    n: u64,
    include_usage: bool,
    usage: Option<Usage>,
) -> Vec<String> {
    let include_usage = include_usage && usage.is_some();
    let mut events: Vec<String> = (0..n)
        .map(|i| {
            let finish = (i + 1 == n).then_some("stop");
            let choice = endpoint.choice(true, &format!("tok{i} "), i == 0, finish);
            let mut fields = endpoint.head(true, model);
            fields.push(("choices", format!("[{choice}]")));
            if include_usage {
                fields.push(("usage", "null".into()));
            }
            format!("data: {}\n\n", object(&fields))
        })
        .collect();
    if include_usage {
        let mut fields = endpoint.head(true, model);
        fields.push(("choices", "[]".into()));
        fields.push(("usage", usage.unwrap_or_default().json()));
        events.push(format!("data: {}\n\n", object(&fields)));
    }
    events.push("data: [DONE]\n\n".to_string());
    events
}

/// The body the fake upstream sends (decoded, de-chunked) for a JSON request to `endpoint`
/// whose `model` is this (None: absent or null): what a client must get through a gateway.
pub fn json_body(endpoint: Endpoint, model: Option<&str>) -> String {
    json_answer(endpoint, &json!(model).to_string())
}

/// The same for a streamed request with `?n=N` and `include_usage` as given. A client that did
/// not ask for usage must get `sse_body(…, false)` however the gateway asked upstream.
pub fn sse_body(endpoint: Endpoint, model: Option<&str>, n: u64, include_usage: bool) -> String {
    sse_events(endpoint, &json!(model).to_string(), n, include_usage).concat()
}

pub(super) struct Pacing {
    pub gap: Duration,
    pub split: Duration,
    /// The event written in two pieces `split` apart, cut 5 bytes into `split_at`.
    pub split_event: Option<usize>,
    pub split_at: &'static str,
    /// `?cut_after=K`: the connection is dropped after K events, mid-body (no last chunk).
    pub cut_after: Option<usize>,
}

/// Writes `events` in `coding`, `gap` apart, logging each; false when the peer left.
pub(super) async fn stream(
    conn: &mut TcpStream,
    coding: Coding,
    events: &[String],
    pacing: &Pacing,
    log: &Mutex<StreamLog>,
) -> bool {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
         transfer-encoding: chunked\r\n{}{RATE_LIMIT_HEADERS}\r\n",
        coding::headers(coding)
    );
    if conn.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let mut encoder = Encoder::new(coding);
    for (i, event) in events.iter().enumerate() {
        if pacing.cut_after == Some(i) {
            log.lock().unwrap().aborted = Some(Instant::now());
            return false;
        }
        if i > 0 {
            tokio::time::sleep(pacing.gap).await;
        }
        let ok = if pacing.split_event == Some(i) {
            split_event(conn, &mut encoder, event, pacing).await
        } else {
            write_chunk(conn, &encoder.piece(event.as_bytes())).await
        };
        if !ok {
            log.lock().unwrap().aborted = Some(Instant::now());
            return false;
        }
        log.lock().unwrap().sent.push(Instant::now());
    }
    let trailer = encoder.finish();
    let ok = (trailer.is_empty() || write_chunk(conn, &trailer).await)
        && conn.write_all(b"0\r\n\r\n").await.is_ok();
    log.lock().unwrap().finished = ok;
    ok
}

/// One event in two TCP writes `split` apart, cut inside the usage (`"prompt_tokens"` for
/// chat), so a reader sees the usage in two reads. Plain: one HTTP chunk cut in two. Compressed: each half flushed as
/// a chunk of its own, so the decoded text is cut at the same place.
async fn split_event(
    conn: &mut TcpStream,
    encoder: &mut Encoder,
    event: &str,
    pacing: &Pacing,
) -> bool {
    let split = pacing.split;
    let cut = event
        .find(pacing.split_at)
        .map_or(event.len() / 2, |p| p + 5);
    let pieces: Vec<Vec<u8>> = if let Encoder::Identity = encoder {
        let chunk = format!("{:x}\r\n{event}\r\n", event.len());
        let cut = cut + chunk.len() - event.len() - 2;
        vec![
            chunk.as_bytes()[..cut].to_vec(),
            chunk.as_bytes()[cut..].to_vec(),
        ]
    } else {
        [&event[..cut], &event[cut..]]
            .iter()
            .map(|half| {
                let data = encoder.piece(half.as_bytes());
                let mut chunk = format!("{:x}\r\n", data.len()).into_bytes();
                chunk.extend(data);
                chunk.extend(b"\r\n");
                chunk
            })
            .collect()
    };
    for (j, piece) in pieces.iter().enumerate() {
        if j > 0 {
            tokio::time::sleep(split).await;
        }
        if conn.write_all(piece).await.is_err() || conn.flush().await.is_err() {
            return false;
        }
    }
    true
}
