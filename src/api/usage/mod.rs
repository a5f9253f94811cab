//! Token usage of OpenAI-style responses (`usage.prompt_tokens`, `usage.completion_tokens`),
//! read on the side as the body passes through the proxy.
//!
//! The gateway hands each response body chunk to [`UsageScanner::feed`] and forwards the same
//! chunk unchanged: nothing is held back, delayed or re-chunked. At the end it asks
//! [`UsageScanner::usage`] what was seen. The scanner keeps no copy of the body: a small fixed
//! state, at most 30 bytes of the current top-level key and at most 4 KiB of the current
//! `usage` object (plus the decoder's window for compressed bodies).
//!
//! What counts:
//! - [`Framing::Json`]: the body is one JSON document; its root object's `usage` member.
//!   [`Framing::EventStream`]: each event's data (its `data:` lines joined with LF) is one JSON
//!   document, read the same way; `[DONE]` and other non-JSON data are ignored.
//! - Only a root object counts, and only its own `usage` member: `usage` nested deeper (in
//!   `choices`) or inside a string never does. A key written with escapes is decoded, so
//!   `"us\u0061ge"` is `usage`. The one exception is the [`UsageContainer`]'s container: the
//!   `usage` member of the root's `response` (Responses) or `message` (Messages) object.
//! - The value must be an object (`"usage": null` is ignored). `prompt_tokens` and
//!   `completion_tokens` (or the Responses API's `input_tokens` and `output_tokens`), and
//!   `cached_tokens` and `reasoning_tokens` in their `_details` objects, are read when they
//!   are integers in `0..=u64::MAX` (otherwise that field is `None`); other members are
//!   ignored. A usage object that is not valid JSON, or is
//!   longer than 4 KiB, is ignored.
//! - A usage object counts as soon as it closes, even if the rest of its document or event is
//!   cut off or malformed. The last one seen wins (on Messages, for the counts it states);
//!   nothing is summed. Anthropic's prompt is its `input_tokens` plus its cache's.

#[cfg(test)]
mod agent_tests;
mod object;
mod scan;
mod sse;
pub(crate) mod strip;
#[cfg(test)]
mod tests;

use std::io::{self, Write};

use flate2::write::{DeflateDecoder, GzDecoder, ZlibDecoder};

use object::parse_usage;
use scan::JsonScan;
use sse::SseScan;

/// Built once: `memmem::find` would build its searcher again on every call (per chunk and
/// per event), which costs more than the search.
static USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usage\""));

/// Whether `"usage"` appears in `bytes`: where it does not, no `usage` member can be.
pub(crate) fn mentions_usage(bytes: &[u8]) -> bool {
    USAGE_KEY.find(bytes).is_some()
}

/// Where `"usage"` appears in `bytes`.
fn usage_key_positions(bytes: &[u8]) -> impl Iterator<Item = usize> + '_ {
    USAGE_KEY.find_iter(bytes)
}

/// Where an API puts the usage of a response, besides its root object's `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UsageContainer {
    /// Chat, completions and embeddings: the root `usage` only; the last one seen wins.
    #[default]
    Root,
    /// The Responses API: also `response.usage`, in the `response.completed` event of a
    /// stream (and `response.incomplete` or `response.failed`); the last one seen wins.
    Response,
    /// Anthropic's Messages API: also `message.usage`, in a stream's `message_start`; a later
    /// usage (the root `usage` of `message_delta`, whose `output_tokens` is cumulative)
    /// replaces only the counts it states, since it may state the output alone.
    Message,
}

/// How the response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One JSON document (`application/json`).
    Json,
    /// Server-sent events (`text/event-stream`), one JSON document per event.
    EventStream,
}

/// The response's content coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    /// zlib-wrapped deflate, as HTTP means it; raw deflate is accepted too.
    Deflate,
}

impl Encoding {
    /// From a Content-Encoding header value: absent/"identity" → Identity, "gzip"/"x-gzip" → Gzip,
    /// "deflate" → Deflate (zlib-wrapped, as HTTP means it; fall back to raw deflate if the zlib header is wrong),
    /// anything else (br, zstd, lists of several codings) → None: the caller then does not scan.
    ///
    /// Codings are compared case-insensitively, around optional whitespace; an empty value is
    /// Identity.
    pub fn from_header(value: Option<&[u8]>) -> Option<Encoding> {
        let Some(value) = value else {
            return Some(Encoding::Identity);
        };
        let value = value.trim_ascii();
        let is = |name: &str| value.eq_ignore_ascii_case(name.as_bytes());
        if value.is_empty() || is("identity") {
            Some(Encoding::Identity)
        } else if is("gzip") || is("x-gzip") {
            Some(Encoding::Gzip)
        } else if is("deflate") {
            Some(Encoding::Deflate)
        } else {
            None
        }
    }
}

/// Token counts from a response's `usage` object; a field is `None` when absent or not a
/// non-negative integer (embeddings responses have no `completion_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// `prompt_tokens` (`input_tokens` in the Responses API).
    pub prompt_tokens: Option<u64>,
    /// `completion_tokens` (`output_tokens`).
    pub completion_tokens: Option<u64>,
    /// `completion_tokens_details.reasoning_tokens` (`output_tokens_details.…`): part of
    /// the completion tokens.
    pub reasoning_tokens: Option<u64>,
    /// `prompt_tokens_details.cached_tokens` (`input_tokens_details.…`): part of the prompt
    /// tokens.
    pub cached_tokens: Option<u64>,
}

/// Reads the token usage of one response body, chunk by chunk, without holding any of it.
pub struct UsageScanner {
    inner: Inner,
}

enum Inner {
    Identity(Sink),
    Gzip(Box<GzDecoder<Sink>>),
    Zlib(Box<ZlibDecoder<Sink>>),
    RawDeflate(Box<DeflateDecoder<Sink>>),
    /// Deflate before its first two bytes are in: they tell zlib from raw deflate.
    DeflateHead {
        sink: Sink,
        head: [u8; 2],
        len: usize,
    },
    /// The body could not be decoded: scanning stopped with this usage.
    Stopped(Option<Usage>),
}

impl UsageScanner {
    pub fn new(framing: Framing, encoding: Encoding, at: UsageContainer) -> UsageScanner {
        let sink = match framing {
            Framing::Json => Sink::Json(JsonScan::new(at)),
            Framing::EventStream => Sink::EventStream(SseScan::new(at)),
        };
        let inner = match encoding {
            Encoding::Identity => Inner::Identity(sink),
            Encoding::Gzip => Inner::Gzip(Box::new(GzDecoder::new(sink))),
            Encoding::Deflate => Inner::DeflateHead {
                sink,
                head: [0; 2],
                len: 0,
            },
        };
        UsageScanner { inner }
    }

    /// One response body chunk, as it passes. Never panics, whatever the bytes.
    pub fn feed(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        let decoded = match &mut self.inner {
            Inner::Identity(sink) => {
                sink.feed(chunk);
                true
            }
            Inner::Gzip(decoder) => decode(decoder.as_mut(), chunk),
            Inner::Zlib(decoder) => decode(decoder.as_mut(), chunk),
            Inner::RawDeflate(decoder) => decode(decoder.as_mut(), chunk),
            Inner::DeflateHead { head, len, .. } => {
                let take = (head.len() - *len).min(chunk.len());
                head[*len..*len + take].copy_from_slice(&chunk[..take]);
                *len += take;
                if *len < head.len() {
                    return;
                }
                let Inner::DeflateHead { sink, head, .. } =
                    std::mem::replace(&mut self.inner, Inner::Stopped(None))
                else {
                    return;
                };
                self.inner = start_deflate(sink, head);
                // The head went in with the decoder; now the rest of this chunk.
                return self.feed(&chunk[take..]);
            }
            Inner::Stopped(_) => true,
        };
        if !decoded {
            self.inner = Inner::Stopped(self.usage());
        }
    }

    /// The scanner behind the decoder, while scanning goes on.
    fn sink(&self) -> Option<&Sink> {
        match &self.inner {
            Inner::Identity(sink) | Inner::DeflateHead { sink, .. } => Some(sink),
            Inner::Gzip(decoder) => Some(decoder.get_ref()),
            Inner::Zlib(decoder) => Some(decoder.get_ref()),
            Inner::RawDeflate(decoder) => Some(decoder.get_ref()),
            Inner::Stopped(_) => None,
        }
    }

    /// How many events of an event stream carried a JSON object so far (0 for a JSON body):
    /// what an estimate of a cut stream counts.
    pub fn events(&self) -> u64 {
        self.sink().map_or(0, Sink::events)
    }

    /// The usage of the last top-level `usage` object seen so far (None when none seen).
    pub fn usage(&self) -> Option<Usage> {
        match &self.inner {
            Inner::Stopped(usage) => *usage,
            _ => self.sink().and_then(Sink::usage),
        }
    }

    /// Whether the usage so far is only a Messages stream's opening report (`message_start`),
    /// whose output count is not final: a stream cut there has not told what it generated.
    pub fn opening_only(&self) -> bool {
        self.sink().is_some_and(Sink::opening_only)
    }
}

/// The decoder for a deflate body, by its first two bytes: a valid zlib header (method 8,
/// window ≤ 32 KiB, check bits) means zlib, anything else raw deflate.
fn start_deflate(sink: Sink, head: [u8; 2]) -> Inner {
    let [cmf, flg] = head;
    let zlib = cmf & 0x0F == 8 && cmf >> 4 <= 7 && (u16::from(cmf) << 8 | u16::from(flg)) % 31 == 0;
    let inner = if zlib {
        let mut decoder = Box::new(ZlibDecoder::new(sink));
        if decode(decoder.as_mut(), &head) {
            return Inner::Zlib(decoder);
        }
        decoder.get_ref().usage()
    } else {
        let mut decoder = Box::new(DeflateDecoder::new(sink));
        if decode(decoder.as_mut(), &head) {
            return Inner::RawDeflate(decoder);
        }
        decoder.get_ref().usage()
    };
    Inner::Stopped(inner)
}

/// Feeds compressed bytes to a decoder and flushes what it decoded into the scanner (so that
/// `usage` is current after every chunk); false on a decode error.
fn decode<W: Write>(decoder: &mut W, chunk: &[u8]) -> bool {
    decoder
        .write_all(chunk)
        .and_then(|()| decoder.flush())
        .is_ok()
}

/// The scanner proper, behind the decoder (as its `Write`) or directly.
enum Sink {
    Json(JsonScan),
    EventStream(SseScan),
}

impl Sink {
    fn feed(&mut self, bytes: &[u8]) {
        match self {
            Sink::Json(scan) => scan.feed(bytes),
            Sink::EventStream(scan) => scan.feed(bytes),
        }
    }

    fn usage(&self) -> Option<Usage> {
        match self {
            Sink::Json(scan) => scan.usage(),
            Sink::EventStream(scan) => scan.usage(),
        }
    }

    fn events(&self) -> u64 {
        match self {
            Sink::Json(_) => 0,
            Sink::EventStream(scan) => scan.events,
        }
    }

    fn opening_only(&self) -> bool {
        match self {
            Sink::Json(scan) => scan.opening_only(),
            Sink::EventStream(scan) => scan.opening_only(),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.feed(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
