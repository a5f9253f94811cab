//! A recording upstream on real TCP: it keeps every request it gets and answers by path.
//!   …/sse?n=N&gap_ms=G  text/event-stream, N events G ms apart, then `data: [DONE]`
//!   …/hang              reads the request and never answers
//!   …/close             closes the connection without a response
//!   …/garbage           answers bytes that are not HTTP
//!   …/status/CODE       answers CODE with an upstream WWW-Authenticate
//!   /oa/…/chat/completions  an OpenAI-style answer echoing the model received, with `usage`
//!                       (prompt 11, completion 5); with `"stream":true` in the body an SSE
//!                       stream of ?n=N chunks ?gap_ms=G apart whose usage event (prompt 21,
//!                       completion 9) is written in two TCP segments ?split_ms=S apart
//!   /oa/…/embeddings    an OpenAI-style embeddings answer with `usage` (prompt 7)
//!   anything else       200 JSON, plus the session headers the gateway must strip

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        super::header(&self.headers, name)
    }

    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    }
}

#[derive(Default)]
pub struct StreamLog {
    /// When each event was written.
    pub sent: Vec<Instant>,
    /// When a write first failed because the gateway closed the connection.
    pub aborted: Option<Instant>,
    pub finished: bool,
}

#[derive(Clone, Default)]
pub struct Shared {
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    pub streams: Arc<Mutex<Vec<Arc<Mutex<StreamLog>>>>>,
}

pub struct Upstream {
    pub port: u16,
    pub shared: Shared,
}

impl Upstream {
    pub fn start() -> Upstream {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let shared = Shared::default();
        let s = shared.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).unwrap();
                loop {
                    let Ok((conn, _)) = listener.accept().await else {
                        continue;
                    };
                    tokio::spawn(serve(conn, s.clone()));
                }
            });
        });
        Upstream { port, shared }
    }

    pub fn url(&self, base: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, base)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    pub fn last(&self) -> Recorded {
        self.requests()
            .pop()
            .expect("the upstream received no request")
    }

    pub fn stream(&self, i: usize) -> Arc<Mutex<StreamLog>> {
        self.shared.streams.lock().unwrap()[i].clone()
    }
}

async fn serve(mut conn: TcpStream, shared: Shared) {
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(&mut conn, &mut buf).await else {
            return;
        };
        shared.requests.lock().unwrap().push(req.clone());
        let path = req.target.split('?').next().unwrap_or_default().to_string();
        let keep_going = if path.ends_with("/sse") {
            sse(&mut conn, &req.target, &shared).await
        } else if path.ends_with("/hang") {
            tokio::time::sleep(Duration::from_secs(120)).await;
            false
        } else if path.ends_with("/close") {
            false
        } else if path.ends_with("/garbage") {
            let _ = conn.write_all(b"this is not http\r\n\r\n").await;
            false
        } else if path.starts_with("/oa/")
            && (path.ends_with("/chat/completions") || path.ends_with("/embeddings"))
        {
            openai_like(&mut conn, &req, &shared).await
        } else if let Some(code) = path.rsplit_once("/status/").map(|(_, c)| c.to_string()) {
            let body = br#"{"error":"upstream says no"}"#;
            let head = format!(
                "HTTP/1.1 {code} Upstream\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 www-authenticate: Basic realm=\"upstream\"\r\nset-cookie: s=1\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).await.is_ok() && conn.write_all(body).await.is_ok()
        } else {
            let body = br#"{"ok":true}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 set-cookie: session=abc; Path=/\r\nset-cookie: other=1\r\nset-cookie2: old=1\r\n\
                 www-authenticate: Bearer realm=\"upstream\"\r\nproxy-authenticate: Basic\r\n\
                 x-upstream-header: kept\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).await.is_ok() && conn.write_all(body).await.is_ok()
        };
        if !keep_going {
            return;
        }
    }
}

fn query_param(target: &str, name: &str, default: u64) -> u64 {
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or(default)
}

/// A stand-in for an OpenAI-compatible server: what the gateway's usage accounting reads.
async fn openai_like(conn: &mut TcpStream, req: &Recorded, shared: &Shared) -> bool {
    let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let model = body
        .get("model")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    if req
        .target
        .split('?')
        .next()
        .unwrap_or_default()
        .ends_with("/embeddings")
    {
        let answer = serde_json::json!({"object": "list", "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}],
            "usage": {"prompt_tokens": 7, "total_tokens": 7}});
        return write_json(conn, &answer).await;
    }
    if body.get("stream") != Some(&serde_json::Value::Bool(true)) {
        // The answer text quotes a usage object: only the top-level one may be counted.
        let answer = serde_json::json!({"id": "c1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                "content": "a trap: \"usage\":{\"prompt_tokens\":999,\"completion_tokens\":999}"}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}});
        return write_json(conn, &answer).await;
    }
    let n = query_param(&req.target, "n", 3);
    let gap = Duration::from_millis(query_param(&req.target, "gap_ms", 50));
    let split = Duration::from_millis(query_param(&req.target, "split_ms", 50));
    let log = Arc::new(Mutex::new(StreamLog::default()));
    shared.streams.lock().unwrap().push(log.clone());
    let _ = conn.set_nodelay(true);
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                transfer-encoding: chunked\r\n\r\n";
    if conn.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let mut events: Vec<String> = (0..n)
        .map(|i| {
            let chunk = serde_json::json!({"object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}}], "usage": null});
            format!("data: {chunk}\n\n")
        })
        .collect();
    let usage = serde_json::json!({"object": "chat.completion.chunk", "model": model, "choices": [],
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

async fn write_json(conn: &mut TcpStream, value: &serde_json::Value) -> bool {
    let body = value.to_string();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.is_ok() && conn.write_all(body.as_bytes()).await.is_ok()
}

async fn sse(conn: &mut TcpStream, target: &str, shared: &Shared) -> bool {
    let param = |name: &str, default: u64| query_param(target, name, default);
    let (n, gap) = (param("n", 5), Duration::from_millis(param("gap_ms", 100)));
    let log = Arc::new(Mutex::new(StreamLog::default()));
    shared.streams.lock().unwrap().push(log.clone());
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                transfer-encoding: chunked\r\nset-cookie: s=1\r\n\r\n";
    if conn.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for i in 0..=n {
        if i > 0 {
            tokio::time::sleep(gap).await;
        }
        let event = if i == n {
            "data: [DONE]\n\n".to_string()
        } else {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}}}}]}}\n\n"
            )
        };
        let chunk = format!("{:x}\r\n{event}\r\n", event.len());
        if conn.write_all(chunk.as_bytes()).await.is_err() || conn.flush().await.is_err() {
            log.lock().unwrap().aborted = Some(Instant::now());
            return false;
        }
        log.lock().unwrap().sent.push(Instant::now());
    }
    let ok = conn.write_all(b"0\r\n\r\n").await.is_ok();
    log.lock().unwrap().finished = ok;
    ok
}

async fn read_request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Recorded> {
    let mut chunk = [0u8; 16 * 1024];
    let (mut req, head_len) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(n)) = parsed.parse(buf) {
            let req = Recorded {
                method: parsed.method?.to_string(),
                target: parsed.path?.to_string(),
                headers: super::header_pairs(parsed.headers),
                body: Vec::new(),
            };
            break (req, n);
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    buf.drain(..head_len);
    if let Some(len) = req
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        while buf.len() < len {
            let n = conn.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        req.body = buf.drain(..len).collect();
    } else if req
        .header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        loop {
            // Size line, then data and CRLF; a zero size ends the body (no trailers expected).
            let line_end = loop {
                if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                    break p;
                }
                let n = conn.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            };
            let size_text = String::from_utf8_lossy(&buf[..line_end]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            while buf.len() < line_end + 2 + size + 2 {
                let n = conn.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            req.body
                .extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    }
    Some(req)
}
