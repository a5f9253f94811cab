//! The byte-level state machines behind [`UsageScanner`](super::UsageScanner).
//!
//! [`JsonScan`] reads one JSON document incrementally and remembers the last `usage` object of
//! its root object; [`SseScan`](super::sse::SseScan) splits a WHATWG event stream into lines and feeds each event's
//! data to a [`JsonScan`] that it resets between events. Neither buffers input: state carries
//! over between calls, so a chunk may end anywhere (inside a key, a number, an escape, a
//! `data:` prefix or a CRLF). Memory is fixed except for the captured `usage` object, which is
//! capped at [`USAGE_CAP`] bytes.

use memchr::memchr2;

use super::{Usage, UsageContainer};

/// Longest raw (still escaped) top-level key kept for comparison: `response` written
/// entirely with `\uXXXX` escapes is 48 bytes, so a longer key cannot be one we read.
const KEY_CAP: usize = 48;

/// Largest `usage` object (its raw bytes) that is kept and parsed; a longer one is dropped as
/// unknown and the previous usage, if any, stands.
pub(super) const USAGE_CAP: usize = 4096;

/// Where the scanner is in the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the root value: whitespace, then `{` (anything else: not an object, ignored).
    Start,
    /// Just after the root `{`: a key or `}`.
    FirstKey,
    /// After a `,` in the root object: a key.
    NextKey,
    /// Inside a top-level key (the string itself).
    Key,
    /// After a top-level key: `:`.
    Colon,
    /// After the `:`: the start of a top-level value.
    Value,
    /// Inside a top-level value that is a string, object or array (skipped or captured).
    Nested,
    /// Inside a top-level number or literal (`true`, `false`, `null`).
    Scalar,
    /// After a top-level value: `,` or `}`.
    AfterValue,
    /// The root object closed, or the document is not an object / not JSON: ignore the rest.
    Done,
}

/// Incremental reader of one JSON document that picks out the root object's `usage` value.
///
/// Only the root object's own members are parsed strictly (key, colon, value, comma); their
/// values are skipped by counting brackets outside strings, with string and escape state
/// tracked, so `usage` inside `choices` or inside a string never counts. A `usage` value that
/// is an object is captured byte for byte and parsed by serde_json when it closes; it then
/// becomes the current usage (the last one wins).
pub(super) struct JsonScan {
    state: State,
    /// Bracket depth inside the current top-level value (`Nested`); 0 for a string value.
    depth: u32,
    /// Inside a string within the current top-level value (`Nested`).
    in_string: bool,
    /// The previous byte was a backslash inside a string (`Key` or `Nested`).
    escape: bool,
    /// The first `KEY_CAP` raw bytes of the current top-level key.
    key: [u8; KEY_CAP],
    /// Raw length of the current top-level key so far (may exceed `KEY_CAP`).
    key_len: usize,
    /// The current top-level key contains an escape and must be decoded to compare.
    key_escaped: bool,
    /// The current top-level key is `usage`.
    usage_key: bool,
    /// The current top-level key is the usage's container (`response`, `message`).
    container_key: bool,
    /// The member holding another `usage` (Responses' `response`, Messages' `message`).
    container: Option<&'static [u8]>,
    /// Usage objects complete each other field by field instead of replacing each other.
    merge: bool,
    /// Reads the container's own members while its value passes, when it is an object.
    inner: Option<Box<JsonScan>>,
    /// The current top-level value is the container, fed to `inner`.
    descending: bool,
    /// The usage so far came only from a container in `merge` mode: Messages' opening report,
    /// whose output count is not final.
    opening_only: bool,
    /// The current top-level value is a `usage` object being copied into `capture`.
    capturing: bool,
    /// The captured `usage` object is longer than `USAGE_CAP`: it will be dropped.
    overflow: bool,
    capture: Vec<u8>,
    /// The last usage object seen (in this document or an earlier one: survives `reset`).
    usage: Option<Usage>,
    /// This document began with `{`.
    object: bool,
}

impl JsonScan {
    pub(super) fn new(at: UsageContainer) -> JsonScan {
        let (container, merge) = match at {
            UsageContainer::Root => (None, false),
            UsageContainer::Response => (Some(&b"response"[..]), false),
            UsageContainer::Message => (Some(&b"message"[..]), true),
        };
        JsonScan {
            container_key: false,
            container,
            merge,
            inner: None,
            descending: false,
            opening_only: false,
            state: State::Start,
            depth: 0,
            in_string: false,
            escape: false,
            key: [0; KEY_CAP],
            key_len: 0,
            key_escaped: false,
            usage_key: false,
            capturing: false,
            overflow: false,
            capture: Vec::new(),
            usage: None,
            object: false,
        }
    }

    pub(super) fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether the document began with `{`.
    pub(super) fn began_object(&self) -> bool {
        self.object
    }

    /// Starts a new document (the next event of an event stream); keeps the usage seen.
    pub(super) fn reset(&mut self) {
        self.state = State::Start;
        self.depth = 0;
        self.in_string = false;
        self.escape = false;
        self.capturing = false;
        self.overflow = false;
        self.capture.clear();
        self.object = false;
        self.descending = false;
    }

    /// Whether the usage so far is only a stream's opening report (see `opening_only`).
    pub(super) fn opening_only(&self) -> bool {
        self.opening_only
    }

    /// A usage object read: the current usage from now on, or (`merge`) what it states of it.
    fn record(&mut self, usage: Usage, from_container: bool) {
        self.opening_only =
            self.merge && from_container && (self.usage.is_none() || self.opening_only);
        let merged = match (self.merge, self.usage) {
            (true, Some(old)) => Usage {
                prompt_tokens: usage.prompt_tokens.or(old.prompt_tokens),
                completion_tokens: usage.completion_tokens.or(old.completion_tokens),
                reasoning_tokens: usage.reasoning_tokens.or(old.reasoning_tokens),
                cached_tokens: usage.cached_tokens.or(old.cached_tokens),
            },
            _ => usage,
        };
        self.usage = Some(merged);
    }

    /// The next bytes of the document.
    pub(super) fn feed(&mut self, mut buf: &[u8]) {
        while let Some(&byte) = buf.first() {
            let used = match self.state {
                State::Done => return,
                State::Nested => self.nested(buf),
                State::Key => self.key(buf),
                _ => {
                    self.step(byte);
                    1
                }
            };
            buf = &buf[used..];
        }
    }

    /// One byte in a state where the root object's syntax is checked byte by byte.
    fn step(&mut self, byte: u8) {
        let space = matches!(byte, b' ' | b'\t' | b'\n' | b'\r');
        self.state = match (self.state, byte) {
            (state, _) if space && state != State::Scalar => state,
            (State::Start, b'{') => {
                self.object = true;
                State::FirstKey
            }
            (State::FirstKey | State::NextKey, b'"') => {
                self.key_len = 0;
                self.key_escaped = false;
                self.escape = false;
                State::Key
            }
            (State::Colon, b':') => State::Value,
            (State::Value, b'{' | b'[') => {
                self.depth = 1;
                self.in_string = false;
                self.escape = false;
                if byte == b'{' && self.usage_key {
                    self.capturing = true;
                    self.overflow = false;
                    self.capture.clear();
                    if self.capture.capacity() == 0 {
                        self.capture.reserve_exact(USAGE_CAP);
                    }
                    self.capture.push(b'{');
                } else if byte == b'{' && self.container_key {
                    let inner = self
                        .inner
                        .get_or_insert_with(|| Box::new(JsonScan::new(UsageContainer::Root)));
                    inner.reset();
                    inner.usage = None;
                    // Two usages in one container merge there as they would here: what is
                    // read must not depend on whether they came in one chunk or two.
                    inner.merge = self.merge;
                    inner.feed(b"{");
                    self.descending = true;
                }
                State::Nested
            }
            (State::Value, b'"') => {
                self.depth = 0;
                self.in_string = true;
                self.escape = false;
                State::Nested
            }
            (
                State::Value | State::Scalar,
                b'-' | b'+' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z',
            ) => State::Scalar,
            (State::Scalar, _) if space => State::AfterValue,
            (State::Scalar | State::AfterValue, b',') => State::NextKey,
            // The root object closes (an empty one too): the rest of the body is not ours.
            (State::FirstKey | State::Scalar | State::AfterValue, b'}') => State::Done,
            // Anything else is not the JSON we are looking for: stop reading this document.
            _ => State::Done,
        };
    }

    /// Bytes of a top-level key; returns how many were consumed.
    fn key(&mut self, buf: &[u8]) -> usize {
        let mut i = 0;
        while i < buf.len() {
            if self.escape {
                self.escape = false;
                self.push_key(&buf[i..i + 1]);
                i += 1;
                continue;
            }
            let Some(at) = memchr2(b'"', b'\\', &buf[i..]) else {
                self.push_key(&buf[i..]);
                return buf.len();
            };
            self.push_key(&buf[i..i + at]);
            i += at + 1;
            if buf[i - 1] == b'\\' {
                self.push_key(b"\\");
                self.escape = true;
                self.key_escaped = true;
            } else {
                self.end_key();
                return i;
            }
        }
        i
    }

    fn push_key(&mut self, bytes: &[u8]) {
        let end = self.key_len.saturating_add(bytes.len());
        if end <= KEY_CAP {
            self.key[self.key_len..end].copy_from_slice(bytes);
        }
        self.key_len = end;
    }

    fn end_key(&mut self) {
        self.usage_key = self.key_is(b"usage");
        self.container_key = self.container.is_some_and(|name| self.key_is(name));
        self.state = State::Colon;
    }

    /// Whether the current top-level key, decoded, is `name`.
    fn key_is(&self, name: &[u8]) -> bool {
        if self.key_len > KEY_CAP {
            return false;
        }
        let raw = &self.key[..self.key_len];
        if self.key_escaped {
            decoded_key_is(raw, name)
        } else {
            raw == name
        }
    }

    /// Bytes of a top-level string, object or array value; returns how many were consumed.
    fn nested(&mut self, buf: &[u8]) -> usize {
        let mut i = 0;
        let mut closed = false;
        while i < buf.len() {
            if self.in_string {
                if self.escape {
                    self.escape = false;
                    i += 1;
                    continue;
                }
                let Some(at) = memchr2(b'"', b'\\', &buf[i..]) else {
                    i = buf.len();
                    break;
                };
                i += at + 1;
                if buf[i - 1] == b'\\' {
                    self.escape = true;
                } else {
                    self.in_string = false;
                    if self.depth == 0 {
                        closed = true;
                        break;
                    }
                }
            } else {
                let Some(at) = find_structural(&buf[i..]) else {
                    i = buf.len();
                    break;
                };
                i += at + 1;
                match buf[i - 1] {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth = self.depth.saturating_add(1),
                    b'}' | b']' => {
                        self.depth = self.depth.saturating_sub(1);
                        if self.depth == 0 {
                            closed = true;
                            break;
                        }
                    }
                    // 0x02, which the word-at-a-time search cannot tell from `"`.
                    _ => {}
                }
            }
        }
        if self.capturing {
            self.capture_bytes(&buf[..i]);
        }
        if self.descending {
            if let Some(inner) = &mut self.inner {
                inner.feed(&buf[..i]);
                // The container's usage counts as soon as it closes, as a root usage does.
                if let Some(usage) = inner.usage.take() {
                    self.record(usage, true);
                }
            }
        }
        if closed {
            self.state = State::AfterValue;
            self.descending = false;
            if self.capturing {
                self.capturing = false;
                if !self.overflow {
                    if let Some(usage) = super::parse_usage(&self.capture) {
                        self.record(usage, false);
                    }
                }
                self.capture.clear();
            }
        }
        i
    }

    fn capture_bytes(&mut self, bytes: &[u8]) {
        if self.overflow {
            return;
        }
        if self.capture.len() + bytes.len() > USAGE_CAP {
            self.overflow = true;
            self.capture.clear();
        } else {
            self.capture.extend_from_slice(bytes);
        }
    }
}

/// Whether a top-level key written with escapes (`"us\u0061ge"`) means `name`. Rare, so it
/// goes through serde_json; `raw` is at most `KEY_CAP` bytes.
fn decoded_key_is(raw: &[u8], name: &[u8]) -> bool {
    let mut quoted = [b'"'; KEY_CAP + 2];
    quoted[1..=raw.len()].copy_from_slice(raw);
    serde_json::from_slice::<String>(&quoted[..raw.len() + 2])
        .is_ok_and(|key| key.as_bytes() == name)
}

/// Position of the first `"`, `[`, `]`, `{` or `}` in `hay`, eight bytes at a time. May also
/// stop at a 0x02 byte (it looks like `"` once bit 5 is set); the caller skips it.
#[inline]
pub(super) fn find_structural(hay: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    /// High bit set in the first zero byte of `v` (and maybe in later ones; never earlier).
    #[inline(always)]
    fn zero_bytes(v: u64) -> u64 {
        v.wrapping_sub(ONES) & !v & HIGH
    }
    let mut words = hay.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(word);
        // Setting bit 5 folds `[` into `{`, `]` into `}` (and 0x02 into `"`).
        let v = u64::from_le_bytes(bytes) | (0x20 * ONES);
        let hits = zero_bytes(v ^ (b'{' as u64 * ONES))
            | zero_bytes(v ^ (b'}' as u64 * ONES))
            | zero_bytes(v ^ (b'"' as u64 * ONES));
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&b| matches!(b, b'"' | b'[' | b']' | b'{' | b'}'))
        .map(|p| at + p)
}
