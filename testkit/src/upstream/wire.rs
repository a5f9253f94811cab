//! HTTP/1.1 as the fake upstream speaks it: one request read (Content-Length or chunked
//! body), JSON answers, and the query parameters that steer an answer.

use std::sync::atomic::AtomicBool;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Hit, State};

/// Reads one request; marks the connection busy from its first byte. None when the peer
/// closed or sent something that is not HTTP.
pub(super) async fn read_request(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    state: &State,
    busy: &AtomicBool,
) -> Option<Hit> {
    let mut chunk = [0u8; 16 * 1024];
    let (mut hit, head_len) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(buf) {
            Ok(httparse::Status::Complete(n)) => {
                let hit = Hit {
                    replica: state.name.clone(),
                    method: parsed.method?.to_string(),
                    target: parsed.path?.to_string(),
                    headers: crate::http::header_pairs(parsed.headers),
                    body: Vec::new(),
                    at: std::time::Instant::now(),
                };
                break (hit, n);
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return None,
        }
        fill(conn, buf, &mut chunk, state, busy).await?;
    };
    buf.drain(..head_len);
    if let Some(len) = hit
        .header("content-length")
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        while buf.len() < len {
            fill(conn, buf, &mut chunk, state, busy).await?;
        }
        hit.body = buf.drain(..len).collect();
    } else if hit
        .header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        loop {
            // Size line, then data and CRLF; a zero size ends the body (no trailers expected).
            let line_end = loop {
                if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                    break p;
                }
                fill(conn, buf, &mut chunk, state, busy).await?;
            };
            let size_text = String::from_utf8_lossy(&buf[..line_end]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            while buf.len() < line_end + 2 + size + 2 {
                fill(conn, buf, &mut chunk, state, busy).await?;
            }
            hit.body
                .extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    }
    Some(hit)
}

async fn fill(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    chunk: &mut [u8],
    state: &State,
    busy: &AtomicBool,
) -> Option<()> {
    let n = conn.read(chunk).await.ok()?;
    if n == 0 {
        return None;
    }
    buf.extend_from_slice(&chunk[..n]);
    state.set_busy(busy, true);
    Some(())
}

/// `status` is the status line's tail, e.g. `200 OK`; `extra` are header lines, each ending
/// in CRLF.
pub(super) async fn write_json(
    conn: &mut TcpStream,
    status: &str,
    extra: &str,
    body: &str,
) -> bool {
    write_body(conn, status, "application/json", extra, body.as_bytes()).await
}

/// As `write_json`, for a body of any type and bytes (a compressed one).
pub(super) async fn write_body(
    conn: &mut TcpStream,
    status: &str,
    content_type: &str,
    extra: &str,
    body: &[u8],
) -> bool {
    let mut msg = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    msg.extend_from_slice(body);
    conn.write_all(&msg).await.is_ok()
}

/// Writes one chunk of a chunked body and flushes it, so each event leaves at once.
pub(super) async fn write_chunk(conn: &mut TcpStream, data: &[u8]) -> bool {
    let size = format!("{:x}\r\n", data.len());
    conn.write_all(size.as_bytes()).await.is_ok()
        && conn.write_all(data).await.is_ok()
        && conn.write_all(b"\r\n").await.is_ok()
        && conn.flush().await.is_ok()
}

pub(super) fn query_param(target: &str, name: &str, default: u64) -> u64 {
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or(default)
}
