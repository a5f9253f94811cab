//! A raw HTTP/1.1 client for requests no well-behaved client library would send, and the
//! helpers that read responses and headers the way every test server and client records them.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Status, lower-cased headers in order, body.
pub type RawResponse = (u16, Vec<(String, String)>, Vec<u8>);

/// Reads one response with a Content-Length from a connection that may be kept alive.
/// `Ok(None)` when the server closed the connection before sending a byte of it.
pub fn read_response(s: &mut TcpStream) -> std::io::Result<Option<RawResponse>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match s.read(&mut chunk) {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && buf.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        }
        if let Some(done) = complete_response(&buf) {
            buf.truncate(done);
            break;
        }
    }
    parse_response(&buf).map(Some).ok_or_else(|| {
        std::io::Error::other(format!(
            "unparsable response: {:?}",
            String::from_utf8_lossy(&buf)
        ))
    })
}

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Sends raw bytes (the request should say `Connection: close`) and parses the response.
pub fn raw(port: u16, request: &[u8]) -> RawResponse {
    try_raw(port, request).unwrap_or_else(|e| panic!("raw request failed: {e}"))
}

pub fn try_raw(port: u16, request: &[u8]) -> std::io::Result<RawResponse> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    s.write_all(request)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !buf.is_empty() => break,
            Err(e) => return Err(e),
        }
        if let Some(done) = complete_response(&buf) {
            buf.truncate(done);
            break;
        }
    }
    parse_response(&buf).ok_or_else(|| {
        std::io::Error::other(format!(
            "unparsable response: {:?}",
            String::from_utf8_lossy(&buf)
        ))
    })
}

/// Length of a complete response with a Content-Length, so keep-alive replies need no close.
fn complete_response(buf: &[u8]) -> Option<usize> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = resp.parse(buf).ok()? else {
        return None;
    };
    let len: usize = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())?;
    (buf.len() >= head + len).then_some(head + len)
}

/// Header names lowercased, values as text: how the test servers and clients record headers.
pub fn header_pairs(headers: &[httparse::Header]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect()
}

fn parse_response(buf: &[u8]) -> Option<RawResponse> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = resp.parse(buf).ok()? else {
        return None;
    };
    let headers = header_pairs(resp.headers);
    Some((resp.code?, headers, buf[head..].to_vec()))
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}
