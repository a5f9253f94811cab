//! What the fake upstream answers. Routes match the percent-decoded path, as uvicorn and
//! Starlette route (`/oa/v1/chat/%63ompletions` is the chat endpoint); `Hit::target` keeps
//! the target as received.
//!   GET …/health          200 `{"status":"ok","replica":NAME}`, or 503 after `set_healthy(false)`
//!   …/sse?n=N&gap_ms=G    text/event-stream: N chat chunks G ms apart (the first at once), each
//!                         `{"replica":NAME,"i":I,"choices":[{"index":0,"delta":{"content":"tokI "}}]}`,
//!                         then `data: [DONE]`
//!   …/hang                reads the request and never answers
//!   …/close               closes the connection without a response
//!   …/garbage             answers bytes that are not HTTP
//!   …/status/CODE         answers CODE with an upstream WWW-Authenticate
//!   /oa/…/chat/completions  an OpenAI chat completion echoing the model received, with usage
//!                         `CHAT_JSON_USAGE`; with `"stream":true` an SSE stream of ?n=N (3)
//!                         chunks ?gap_ms=G (50) apart, the last with `finish_reason: "stop"`,
//!                         then with `stream_options.include_usage` a usage chunk
//!                         (`CHAT_SSE_USAGE`) written in two TCP writes ?split_ms=S (50) apart
//!                         (cut inside `"prompt_tokens"`), then `data: [DONE]` (`openai.rs`)
//!   /oa/…/completions     the same for text completions (`object: "text_completion"`,
//!                         `choices[].text`): `COMPLETIONS_JSON_USAGE`, `COMPLETIONS_SSE_USAGE`
//!   /oa/…/embeddings      an OpenAI embeddings answer with usage `EMBEDDINGS_USAGE`
//!   /oa/…/responses       an OpenAI Responses answer (`RESPONSES_JSON_USAGE`); streamed, its
//!                         events with ?n=N (3) text deltas, ?gap_ms=G (50) apart, usage
//!                         (`RESPONSES_SSE_USAGE`) in `response.completed` (`agents.rs`);
//!                         with ?status=N (as `/messages`) N and an OpenAI error
//!   /oa/…/messages        an Anthropic Messages answer (`MESSAGES_JSON_USAGE`); streamed, the
//!                         same pacing, usage (`MESSAGES_SSE_USAGE`) in `message_start` and
//!                         `message_delta`
//!   /oa/…/messages/count_tokens  `{"input_tokens": COUNT_TOKENS}`
//!   anything else         after ?ms=M milliseconds, 200 `{"ok":true,"replica":NAME,"method":…,
//!                         "target":…}` with the session headers a gateway must strip
//!
//! The `/oa/` endpoints answer in the content coding the request's `Accept-Encoding`
//! asks for (gzip, deflate, br, zstd; identity when it is absent), or in
//! `?force_encoding=NAME` whatever was asked (`coding.rs`).
//!
//! In model mode every request but `/health` goes to `model.rs` instead; in sim mode, to
//! `sim.rs`.
//!
//! With `set_reset_before_answer(true)` every request but `/health` is read in full, recorded,
//! and answered by a TCP reset: the "accepted, then died" replica.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::agents::{self, AgentEndpoint};
use super::openai::{self, Endpoint};
use super::wire::{query_param, read_request, write_chunk, write_json};
use super::{State, StreamLog};
use crate::net::{set_reset_on_close, unread_bytes};

const SESSION_HEADERS: &str = "set-cookie: session=abc; Path=/\r\nset-cookie: other=1\r\n\
    set-cookie2: old=1\r\nwww-authenticate: Bearer realm=\"upstream\"\r\n\
    proxy-authenticate: Basic\r\nx-upstream-header: kept\r\n";
const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
    cache-control: no-cache\r\ntransfer-encoding: chunked\r\nset-cookie: s=1\r\n\r\n";

enum End {
    /// Peer closed, or an I/O error: a normal close.
    Close,
    /// Close with a reset (reset-before-answer mode).
    Reset,
}

pub(super) async fn connection(
    mut conn: TcpStream,
    state: Arc<State>,
    mut kill: watch::Receiver<bool>,
) {
    let _ = conn.set_nodelay(true);
    // Set while a request of this connection is in flight; read after `serve` is dropped.
    let busy = AtomicBool::new(false);
    let killed = tokio::select! {
        end = serve(&mut conn, &state, &busy) => {
            if let End::Reset = end {
                set_reset_on_close(&conn);
            }
            false
        }
        _ = kill.changed() => true,
    };
    if busy.swap(false, Ordering::SeqCst) {
        state.in_flight.fetch_sub(1, Ordering::SeqCst);
        if killed {
            state.cut_in_flight.fetch_add(1, Ordering::SeqCst);
        }
    } else if killed && unread_bytes(&conn) > 0 {
        // A request sent before the kill that this task had not read yet: in flight too.
        state.cut_in_flight.fetch_add(1, Ordering::SeqCst);
    }
    if killed {
        set_reset_on_close(&conn);
    }
    drop(conn);
    state.conns.fetch_sub(1, Ordering::SeqCst);
}

async fn serve(conn: &mut TcpStream, state: &State, busy: &AtomicBool) -> End {
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(conn, &mut buf, state, busy).await else {
            return End::Close;
        };
        // The demo model serves `make run` for hours: it keeps no record of what it answered.
        if state.model.get().is_none() && state.sim.get().is_none() {
            state.log.push(req.clone());
        }
        let path = req.decoded_path();
        let path = path.as_str();
        let ok = if path.ends_with("/health") {
            health(conn, state).await
        } else if state.reset.load(Ordering::Relaxed) {
            return End::Reset;
        } else if let Some(sim) = state.sim.get() {
            super::sim::answer(conn, &req, sim, &state.name).await
        } else if let Some(model) = state.model.get() {
            super::model::answer(conn, &req, state, model).await
        } else if path.ends_with("/sse") {
            sse(conn, &req.target, state).await
        } else if path.ends_with("/hang") {
            tokio::time::sleep(Duration::from_secs(120)).await;
            false
        } else if path.ends_with("/close") {
            false
        } else if path.ends_with("/garbage") {
            let _ = conn.write_all(b"this is not http\r\n\r\n").await;
            false
        } else if path.starts_with("/oa/") && path.ends_with("/responses") {
            agents::answer(conn, &req, state, AgentEndpoint::Responses).await
        } else if path.starts_with("/oa/") && path.ends_with("/messages/count_tokens") {
            agents::count_tokens(conn, &req).await
        } else if path.starts_with("/oa/") && path.ends_with("/messages") {
            agents::answer(conn, &req, state, AgentEndpoint::Messages).await
        } else if path.starts_with("/oa/") && path.ends_with("/embeddings") {
            openai::embeddings(conn, &req).await
        } else if path.starts_with("/oa/") && path.ends_with("/chat/completions") {
            openai::completion(conn, &req, state, Endpoint::Chat).await
        } else if path.starts_with("/oa/") && path.ends_with("/completions") {
            openai::completion(conn, &req, state, Endpoint::Completions).await
        } else if let Some((_, code)) = path.rsplit_once("/status/") {
            let extra = "www-authenticate: Basic realm=\"upstream\"\r\nset-cookie: s=1\r\n";
            let status = format!("{code} Upstream");
            write_json(conn, &status, extra, r#"{"error":"upstream says no"}"#).await
        } else {
            let ms = query_param(&req.target, "ms", 0);
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let body = json!({"ok": true, "replica": state.name, "method": req.method,
                "target": req.target});
            write_json(conn, "200 OK", SESSION_HEADERS, &body.to_string()).await
        };
        state.set_busy(busy, !buf.is_empty());
        if !ok {
            return End::Close;
        }
    }
}

async fn health(conn: &mut TcpStream, state: &State) -> bool {
    let (code, status) = if state.healthy.load(Ordering::Relaxed) {
        ("200 OK", "ok")
    } else {
        ("503 Service Unavailable", "unhealthy")
    };
    let body = json!({"status": status, "replica": state.name}).to_string();
    write_json(conn, code, "", &body).await
}

pub(super) fn new_stream(state: &State) -> Arc<Mutex<StreamLog>> {
    let log = Arc::new(Mutex::new(StreamLog::default()));
    state.streams.lock().unwrap().push(log.clone());
    log
}

/// Writes `events` (whole SSE events) `gap` apart, logging each; false when the peer left.
async fn stream_events(
    conn: &mut TcpStream,
    events: &[String],
    gap: Duration,
    log: &Mutex<StreamLog>,
) -> bool {
    if conn.write_all(SSE_HEAD.as_bytes()).await.is_err() {
        return false;
    }
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(gap).await;
        }
        if !write_chunk(conn, event.as_bytes()).await {
            log.lock().unwrap().aborted = Some(Instant::now());
            return false;
        }
        log.lock().unwrap().sent.push(Instant::now());
    }
    let ok = conn.write_all(b"0\r\n\r\n").await.is_ok();
    log.lock().unwrap().finished = ok;
    ok
}

async fn sse(conn: &mut TcpStream, target: &str, state: &State) -> bool {
    let n = query_param(target, "n", 5);
    let gap = Duration::from_millis(query_param(target, "gap_ms", 100));
    let mut events: Vec<String> = (0..n)
        .map(|i| {
            let chunk = json!({"replica": state.name, "i": i,
                "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}}]});
            format!("data: {chunk}\n\n")
        })
        .collect();
    events.push("data: [DONE]\n\n".to_string());
    let log = new_stream(state);
    stream_events(conn, &events, gap, &log).await
}
