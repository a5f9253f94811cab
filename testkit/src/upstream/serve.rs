//! What the fake upstream answers, by path:
//!   GET …/health          200 `{"status":"ok","replica":NAME}`, or 503 after `set_healthy(false)`
//!   …/sse?n=N&gap_ms=G    text/event-stream: N chat chunks G ms apart (the first at once), each
//!                         `{"replica":NAME,"i":I,"choices":[{"index":0,"delta":{"content":"tokI "}}]}`,
//!                         then `data: [DONE]`
//!   …/hang                reads the request and never answers
//!   …/close               closes the connection without a response
//!   …/garbage             answers bytes that are not HTTP
//!   …/status/CODE         answers CODE with an upstream WWW-Authenticate
//!   /oa/…/chat/completions  an OpenAI-style answer echoing the model received, with `usage`
//!                         (prompt 11, completion 5); with `"stream":true` in the body an SSE
//!                         stream of ?n=N chunks ?gap_ms=G apart whose usage event (prompt 21,
//!                         completion 9) is written in two TCP segments ?split_ms=S apart
//!   /oa/…/embeddings      an OpenAI-style embeddings answer with `usage` (prompt 7)
//!   anything else         after ?ms=M milliseconds, 200 `{"ok":true,"replica":NAME,"method":…,
//!                         "target":…}` with the session headers a gateway must strip
//!
//! In model mode every request but `/health` goes to `model.rs` instead.
//!
//! With `set_reset_before_answer(true)` every request but `/health` is read in full, recorded,
//! and answered by a TCP reset: the "accepted, then died" replica.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::wire::{query_param, read_request, write_chunk, write_json};
use super::{Hit, State, StreamLog};
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
        if state.model.get().is_none() {
            state.log.push(req.clone());
        }
        let path = req.path();
        let ok = if path.ends_with("/health") {
            health(conn, state).await
        } else if state.reset.load(Ordering::Relaxed) {
            return End::Reset;
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
        } else if path.starts_with("/oa/") && path.ends_with("/embeddings") {
            embeddings(conn, &req).await
        } else if path.starts_with("/oa/") && path.ends_with("/chat/completions") {
            chat(conn, &req, state).await
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

fn new_stream(state: &State) -> Arc<Mutex<StreamLog>> {
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

fn model_of(req: &Hit) -> (Value, Value) {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let model = body.get("model").cloned().unwrap_or(Value::Null);
    (body, model)
}

async fn embeddings(conn: &mut TcpStream, req: &Hit) -> bool {
    let (_, model) = model_of(req);
    let answer = json!({"object": "list", "model": model,
        "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}],
        "usage": {"prompt_tokens": 7, "total_tokens": 7}});
    write_json(conn, "200 OK", "", &answer.to_string()).await
}

/// A stand-in for an OpenAI-compatible server: what the gateway's usage accounting reads.
async fn chat(conn: &mut TcpStream, req: &Hit, state: &State) -> bool {
    let (body, model) = model_of(req);
    if body.get("stream") != Some(&Value::Bool(true)) {
        // The answer text quotes a usage object: only the top-level one may be counted.
        let answer = json!({"id": "c1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                "content": "a trap: \"usage\":{\"prompt_tokens\":999,\"completion_tokens\":999}"}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}});
        return write_json(conn, "200 OK", "", &answer.to_string()).await;
    }
    let n = query_param(&req.target, "n", 3);
    let gap = Duration::from_millis(query_param(&req.target, "gap_ms", 50));
    let split = Duration::from_millis(query_param(&req.target, "split_ms", 50));
    let log = new_stream(state);
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                transfer-encoding: chunked\r\n\r\n";
    if conn.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let mut events: Vec<String> = (0..n)
        .map(|i| {
            let chunk = json!({"object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}}], "usage": null});
            format!("data: {chunk}\n\n")
        })
        .collect();
    let usage = json!({"object": "chat.completion.chunk", "model": model, "choices": [],
        "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}});
    events.push(format!("data: {usage}\n\n"));
    events.push("data: [DONE]\n\n".to_string());
    let usage_event = events.len() - 2;
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(gap).await;
        }
        let chunk = format!("{:x}\r\n{event}\r\n", event.len());
        let pieces: Vec<&[u8]> = if i == usage_event {
            // Cut inside `"prompt_tokens"`: the gateway sees the event in two reads.
            let cut = chunk.find("prompt_t").unwrap() + 5;
            vec![&chunk.as_bytes()[..cut], &chunk.as_bytes()[cut..]]
        } else {
            vec![chunk.as_bytes()]
        };
        for (j, piece) in pieces.iter().enumerate() {
            if j > 0 {
                tokio::time::sleep(split).await;
            }
            if conn.write_all(piece).await.is_err() || conn.flush().await.is_err() {
                log.lock().unwrap().aborted = Some(Instant::now());
                return false;
            }
        }
        log.lock().unwrap().sent.push(Instant::now());
    }
    let ok = conn.write_all(b"0\r\n\r\n").await.is_ok();
    log.lock().unwrap().finished = ok;
    ok
}
