//! A fast upstream for the load benchmark (`benches/load/run.py`): hand-written HTTP/1.1 with
//! keep-alive on one tokio thread, so the proxy in front of it, not the upstream, is measured.
//!
//! - a path ending in `/sse` answers a chunked `text/event-stream`: one event at once, then one
//!   every `--tick-ms`; `?ticks=N` ends the stream after N more events (the connection stays
//!   alive), without it the stream stays open until the client goes away or `--max-stream-s`;
//! - a `POST …/chat/completions` whose body has `"stream": true` answers like an
//!   OpenAI-compatible server: a chunked `text/event-stream` of `--stream-chunks` (16)
//!   `chat.completion.chunk` events (role first, `finish_reason` last), then `data: [DONE]`.
//!   With `"include_usage": true` in the body, OpenAI's shape: `"usage":null` in every chunk and
//!   a usage-only chunk (`"choices":[]`) before `[DONE]`. Preformatted once, written at once;
//!   each event is its own HTTP chunk, as a server that flushes per token frames it;
//! - any other request gets a small chat-completion JSON with a Content-Length.
//!
//! Request bodies may have a Content-Length or be chunked (the gateway sends bodies it held
//! back for the model policy chunked).
//!
//! Usage: `fast_upstream [--port P] [--hosts N] [--tick-ms MS] [--max-stream-s S] [--max-life-s S]
//! [--stream-chunks N]`.
//! `--hosts N` listens on 127.0.0.1 … 127.0.0.N, all on the same port: N replicas served by
//! one process, so a many-replica service costs the upstream side nothing more.
//! Binds 127.0.0.1 only; prints `listening 127.0.0.1:<port>` once ready.

use std::sync::Arc;
use std::time::Duration;

use memchr::memmem;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const CHAT: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}"#;
const EVENT: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tick\"},\"finish_reason\":null}]}\n\n";
const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";
/// A streamed chat, in OpenAI's words (their `chat.completion.chunk`, fields in their order).
const CHUNK_HEAD: &str = r#"{"id":"chatcmpl-AaBbCcDdEeFfGgHhIiJjKkLlMmNn","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0123456789","choices":"#;
const WORDS: [&str; 8] = [
    "Hello", "!", " How", " can", " I", " help", " you", " today",
];
const USAGE: &str = r#""usage":{"prompt_tokens":9,"completion_tokens":16,"total_tokens":25,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}"#;
const MAX_HEAD: usize = 16 * 1024;
/// Vision requests carry images of several MB.
const MAX_BODY: usize = 40 * 1024 * 1024;

#[derive(Clone, Copy)]
struct Opts {
    port: u16,
    tick: Duration,
    max_stream: Duration,
    max_life: Duration,
    hosts: u8,
    stream_chunks: usize,
    /// Runtime worker threads (`--threads`, default 1).
    threads: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        port: 0,
        tick: Duration::from_millis(5000),
        max_stream: Duration::from_secs(900),
        max_life: Duration::from_secs(3600),
        hosts: 1,
        stream_chunks: 16,
        threads: 1,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let n: u64 = value
            .parse()
            .unwrap_or_else(|_| panic!("{flag}: not a number"));
        match flag.as_str() {
            "--port" => o.port = n as u16,
            "--tick-ms" => o.tick = Duration::from_millis(n),
            "--max-stream-s" => o.max_stream = Duration::from_secs(n),
            "--max-life-s" => o.max_life = Duration::from_secs(n),
            "--hosts" => o.hosts = n.clamp(1, 254) as u8,
            "--stream-chunks" => o.stream_chunks = n.clamp(2, 10_000) as usize,
            "--threads" => o.threads = n.clamp(1, 256) as usize,
            _ => panic!("unknown flag {flag}"),
        }
    }
    o
}

fn chunk(payload: &str) -> Vec<u8> {
    format!("{:x}\r\n{payload}\r\n", payload.len()).into_bytes()
}

/// One whole streamed chat response (head and chunked body); `usage`: as OpenAI answers a
/// request with `stream_options.include_usage`.
fn chat_stream(chunks: usize, usage: bool) -> Vec<u8> {
    let tail = if usage { ",\"usage\":null}" } else { "}" };
    let mut out = SSE_HEAD.as_bytes().to_vec();
    for i in 0..chunks {
        let choice = if i == 0 {
            r#"[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]"#.to_string()
        } else if i == chunks - 1 {
            r#"[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]"#.to_string()
        } else {
            let word = WORDS[(i - 1) % WORDS.len()];
            format!(
                r#"[{{"index":0,"delta":{{"content":"{word}"}},"logprobs":null,"finish_reason":null}}]"#
            )
        };
        out.extend(chunk(&format!("data: {CHUNK_HEAD}{choice}{tail}\n\n")));
    }
    if usage {
        out.extend(chunk(&format!("data: {CHUNK_HEAD}[],{USAGE}}}\n\n")));
    }
    out.extend(chunk("data: [DONE]\n\n"));
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// The preformatted streamed chats: without and with the usage OpenAI adds.
struct Streams {
    plain: Vec<u8>,
    usage: Vec<u8>,
}

/// Whether a JSON body sets `key` to `true` (`"key": true`, any spacing): enough for the
/// bodies the bench sends, without parsing them.
fn sets_true(body: &[u8], key: &[u8]) -> bool {
    memmem::find_iter(body, key).any(|at| {
        let rest = body[at + key.len()..].trim_ascii_start();
        rest.strip_prefix(b":")
            .is_some_and(|v| v.trim_ascii_start().starts_with(b"true"))
    })
}

fn main() {
    let o = opts();
    let streams = Arc::new(Streams {
        plain: chat_stream(o.stream_chunks, false),
        usage: chat_stream(o.stream_chunks, true),
    });
    // One thread unless asked: a proxy on many cores needs an upstream on several (the scaling
    // stage), where one thread would be what bounds it.
    let rt = match o.threads {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => (tokio::runtime::Builder::new_multi_thread())
            .worker_threads(n)
            .enable_all()
            .build(),
    }
    .unwrap();
    rt.block_on(async move {
        let listen = |host: u8, port: u16| {
            let socket = TcpSocket::new_v4().unwrap();
            socket.set_reuseaddr(true).unwrap();
            socket
                .bind(([127, 0, 0, host], port).into())
                .unwrap_or_else(|e| panic!("bind 127.0.0.{host}:{port}: {e}"));
            // A deep backlog: the streams test opens thousands of connections in bursts.
            socket.listen(8192).unwrap()
        };
        let first = listen(1, o.port);
        let port = first.local_addr().unwrap().port();
        let mut listeners = vec![first];
        for host in 2..=o.hosts {
            listeners.push(listen(host, port));
        }
        println!("listening {}", listeners[0].local_addr().unwrap());
        let serve = async {
            for listener in listeners {
                let streams = streams.clone();
                tokio::spawn(async move {
                    loop {
                        let Ok((sock, _)) = listener.accept().await else {
                            continue;
                        };
                        let _ = sock.set_nodelay(true);
                        tokio::spawn(connection(sock, o.tick, o.max_stream, streams.clone()));
                    }
                });
            }
            std::future::pending::<()>().await
        };
        // Bounded: the script kills it, but a forgotten one still goes away.
        let _ = tokio::time::timeout(o.max_life, serve).await;
    });
}

async fn connection(
    mut sock: TcpStream,
    tick: Duration,
    max_stream: Duration,
    streams: Arc<Streams>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let chat_response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    loop {
        // Parse every complete request already buffered (pipelining), answer them at once.
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            let head_len = match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => break,
                _ => return,
            };
            let chunked = req.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("transfer-encoding")
                    && h.value.eq_ignore_ascii_case(b"chunked")
            });
            let body_len = if chunked {
                match chunked_len(&buf[head_len..]) {
                    Ok(Some(n)) => n,
                    Ok(None) if buf.len() - head_len < MAX_BODY => break,
                    _ => return,
                }
            } else {
                req.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| {
                        std::str::from_utf8(h.value)
                            .ok()?
                            .trim()
                            .parse::<usize>()
                            .ok()
                    })
                    .unwrap_or(0)
            };
            if body_len > MAX_BODY {
                return;
            }
            if buf.len() < head_len + body_len {
                break;
            }
            let path = req.path.unwrap_or("/");
            let (route, query) = path.split_once('?').unwrap_or((path, ""));
            if route.ends_with("/sse") {
                let ticks = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("ticks="))
                    .and_then(|v| v.parse::<u64>().ok());
                buf.drain(..head_len + body_len);
                if sock.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
                if !stream(&mut sock, ticks, tick, max_stream).await {
                    return;
                }
                continue;
            }
            let body = &buf[head_len..head_len + body_len];
            let streamed = req.method == Some("POST")
                && route.ends_with("/chat/completions")
                && sets_true(body, b"\"stream\"");
            out.extend_from_slice(match streamed {
                true if sets_true(body, b"\"include_usage\"") => &streams.usage,
                true => &streams.plain,
                false => chat_response.as_bytes(),
            });
            buf.drain(..head_len + body_len);
        }
        if !out.is_empty() {
            if sock.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        let mut chunk_buf = [0u8; 64 * 1024];
        match sock.read(&mut chunk_buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk_buf[..n]),
        }
    }
}

/// The length of a complete chunked body at the start of `buf` (framing included);
/// `Ok(None)` while incomplete, `Err` when malformed. No trailers expected.
fn chunked_len(buf: &[u8]) -> Result<Option<usize>, ()> {
    let mut at = 0;
    loop {
        let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[at..at + eol]).map_err(|_| ())?;
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| ())?;
        at += eol + 2 + size + 2;
        if buf.len() < at {
            return Ok(None);
        }
        if size == 0 {
            return Ok(Some(at));
        }
    }
}

/// Writes one SSE response. True when it ended cleanly and the connection can be reused.
async fn stream(sock: &mut TcpStream, ticks: Option<u64>, tick: Duration, max: Duration) -> bool {
    let event = chunk(EVENT);
    let mut first = SSE_HEAD.as_bytes().to_vec();
    first.extend_from_slice(&event);
    if sock.write_all(&first).await.is_err() {
        return false;
    }
    match ticks {
        Some(n) => {
            // A short stream, ticks back to back: for response-head latency on reused connections.
            for _ in 0..n {
                if sock.write_all(&event).await.is_err() {
                    return false;
                }
            }
            let mut end = chunk("data: [DONE]\n\n");
            end.extend_from_slice(b"0\r\n\r\n");
            sock.write_all(&end).await.is_ok()
        }
        None => {
            // Held open with a slow tick; a write error means the client (or proxy) went away.
            let deadline = tokio::time::Instant::now() + max;
            while tokio::time::Instant::now() < deadline {
                tokio::time::sleep(tick).await;
                if sock.write_all(&event).await.is_err() {
                    return false;
                }
            }
            false
        }
    }
}
