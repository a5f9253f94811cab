//! The usage scanner, over every framing and content coding it reads.

use std::io::Write;

use flate2::write::{DeflateEncoder, GzEncoder, ZlibEncoder};
use serde_json::Value;

use bytes::Bytes;

use crate::usage::strip::UsageStripper;
use crate::usage::{Dialect, Encoding, Framing, Usage, UsageScanner};

use super::model_body::top_level_members;

/// Largest `usage` object the scanner reads (its documented 4 KiB).
const USAGE_CAP: usize = 4096;

/// `UsageScanner` on an arbitrary response body (and `UsageStripper` on it as an event
/// stream, see `strip_invariants`): the chunking never changes the usage (whole,
/// cut once where the first byte says, a byte at a time, chunk sizes drawn from the data),
/// nor does compressing the body; where serde_json can read the body, the usage is the one it
/// finds; and the bytes fed as a gzip or deflate body (garbage, almost always) never panic.
pub fn usage_scanner(data: &[u8]) {
    let cut = data.first().map_or(1, |&b| usize::from(b) % data.len());
    let drawn: Vec<usize> = data.iter().take(16).map(|&b| usize::from(b % 32)).collect();
    let compressed = compressed(data);
    strip_invariants(data, cut, &drawn);
    for framing in [Framing::Json, Framing::EventStream] {
        let usage = |encoding, body: &[u8], sizes: &[usize]| {
            usage_in_chunks(framing, encoding, body, sizes)
        };
        let whole = usage(Encoding::Identity, data, &[data.len()]);
        let cut_once = usage(Encoding::Identity, data, &[cut, data.len()]);
        assert_eq!(cut_once, whole, "{framing:?}: cut at {cut}");
        assert_eq!(
            usage(Encoding::Identity, data, &drawn),
            whole,
            "{framing:?}: {drawn:?}"
        );
        if data.len() <= 1024 {
            assert_eq!(
                usage(Encoding::Identity, data, &[1]),
                whole,
                "{framing:?}: bytewise"
            );
        }
        let reference = match framing {
            Framing::Json => json_usage(data),
            Framing::EventStream => event_stream_usage(data),
        };
        if let Some(reference) = reference {
            assert_eq!(
                whole, reference,
                "{framing:?}: not the usage serde_json reads"
            );
        }
        for (encoding, body) in &compressed {
            let cut = cut % body.len().max(1);
            assert_eq!(
                usage(*encoding, body, &[body.len()]),
                whole,
                "{framing:?} {encoding:?}"
            );
            let cut_once = usage(*encoding, body, &[cut, body.len()]);
            assert_eq!(cut_once, whole, "{framing:?} {encoding:?}: cut at {cut}");
        }
        for encoding in [Encoding::Gzip, Encoding::Deflate] {
            usage(encoding, data, &[data.len()]);
            usage(encoding, data, &[cut, data.len()]);
            usage(encoding, data, &drawn);
        }
    }
}

/// Feeds `body` in chunks of the given sizes (cycled; 0 counts as 1), then asks for the usage.
/// What `UsageStripper` sends on for `body` fed in chunks of `sizes` (cycled).
fn stripped_in_chunks(body: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut stripper = UsageStripper::new();
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (chunk, tail) = rest.split_at(size.clamp(1, rest.len()));
        out.extend_from_slice(&stripper.filter(Bytes::copy_from_slice(chunk)));
        rest = tail;
    }
    out.extend_from_slice(&stripper.finish());
    out
}

/// `UsageStripper` on an arbitrary event stream: the chunking never changes what it sends on,
/// a stream in which `"usage"` never appears is sent on byte for byte, and nothing is ever
/// added.
fn strip_invariants(data: &[u8], cut: usize, drawn: &[usize]) {
    let whole = stripped_in_chunks(data, &[data.len()]);
    assert_eq!(
        stripped_in_chunks(data, &[cut, data.len()]),
        whole,
        "strip: cut at {cut}"
    );
    assert_eq!(stripped_in_chunks(data, drawn), whole, "strip: {drawn:?}");
    if data.len() <= 1024 {
        assert_eq!(stripped_in_chunks(data, &[1]), whole, "strip: bytewise");
    }
    assert!(whole.len() <= data.len(), "the stripper added bytes");
    if memchr::memmem::find(data, b"\"usage\"").is_none() {
        assert_eq!(whole, data, "a stream without usage was changed");
    }
}

pub(crate) fn usage_in_chunks(
    framing: Framing,
    encoding: Encoding,
    body: &[u8],
    sizes: &[usize],
) -> Option<Usage> {
    let mut scanner = UsageScanner::new(framing, encoding, Dialect::OpenAi);
    let mut rest = body;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (chunk, tail) = rest.split_at(size.clamp(1, rest.len()));
        scanner.feed(chunk);
        rest = tail;
    }
    scanner.usage()
}

/// `body` as a gzip, a zlib-wrapped deflate and a raw deflate response body.
fn compressed(body: &[u8]) -> [(Encoding, Vec<u8>); 3] {
    let level = flate2::Compression::fast();
    let mut gzip = GzEncoder::new(Vec::new(), level);
    let mut zlib = ZlibEncoder::new(Vec::new(), level);
    let mut raw = DeflateEncoder::new(Vec::new(), level);
    gzip.write_all(body).unwrap();
    zlib.write_all(body).unwrap();
    raw.write_all(body).unwrap();
    [
        (Encoding::Gzip, gzip.finish().unwrap()),
        (Encoding::Deflate, zlib.finish().unwrap()),
        (Encoding::Deflate, raw.finish().unwrap()),
    ]
}

/// The usage of one JSON document as serde_json reads it: Some(None) when it is no object
/// (the scanner ignores it); None when that cannot be told: it starts as an object but
/// serde_json refuses it (not JSON, or nested deeper than serde_json's limit, or a lone
/// surrogate escape: the scanner checks neither).
fn json_usage(document: &[u8]) -> Option<Option<Usage>> {
    let start = document.iter().find(|b| !b" \t\n\r".contains(b));
    if start != Some(&b'{') {
        return Some(None);
    }
    let mut usage = None;
    // The last usage object wins; one that is not an object or is too long is passed over.
    for (key, raw) in top_level_members(document)? {
        let raw = raw.get();
        if key == "usage" && raw.starts_with('{') && raw.len() <= USAGE_CAP {
            let object: Value = serde_json::from_str(raw).ok()?;
            // The chat API's name wins over the Responses API's when both are sent.
            let either = |a: &str, b: &str| object.get(a).or_else(|| object.get(b));
            let count = |a, b| either(a, b).and_then(Value::as_u64);
            let detail = |a, b, name| either(a, b).and_then(|d| d.get(name)?.as_u64());
            usage = Some(Usage {
                prompt_tokens: count("prompt_tokens", "input_tokens"),
                completion_tokens: count("completion_tokens", "output_tokens"),
                reasoning_tokens: detail(
                    "completion_tokens_details",
                    "output_tokens_details",
                    "reasoning_tokens",
                ),
                cached_tokens: detail(
                    "prompt_tokens_details",
                    "input_tokens_details",
                    "cached_tokens",
                ),
            });
        }
    }
    Some(usage)
}

/// The usage of an event stream, read as WHATWG says (one BOM skipped; lines end in CRLF, LF
/// or CR; a `data` field's value loses one leading space; an event's data lines are joined
/// with LF) and each event's data by `json_usage`. The event the stream ends in counts even
/// without its blank line, as the scanner reads usage as soon as it is complete.
fn event_stream_usage(stream: &[u8]) -> Option<Option<Usage>> {
    let stream = stream.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(stream);
    let mut usage = None;
    let mut data: Option<Vec<u8>> = None;
    let mut end_event = |data: &mut Option<Vec<u8>>| -> Option<()> {
        if let Some(data) = data.take() {
            usage = json_usage(&data)?.or(usage);
        }
        Some(())
    };
    let mut rest = stream;
    while !rest.is_empty() {
        let eol = rest.iter().position(|&b| b == b'\n' || b == b'\r');
        let line = &rest[..eol.unwrap_or(rest.len())];
        rest = match eol {
            Some(at) if rest[at..].starts_with(b"\r\n") => &rest[at + 2..],
            Some(at) => &rest[at + 1..],
            None => &[],
        };
        if line.is_empty() {
            end_event(&mut data)?;
            continue;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        if field == b"data" {
            match &mut data {
                Some(data) => {
                    data.push(b'\n');
                    data.extend_from_slice(value);
                }
                None => data = Some(value.to_vec()),
            }
        }
    }
    end_event(&mut data)?;
    Some(usage)
}
