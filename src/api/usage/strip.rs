//! Takes back from a client's event stream what the gateway's `include_usage` added: the
//! usage-only chunk (`"choices": []` with a `usage` object) is dropped, and the `usage` member
//! OpenAI then puts in every other chunk (`"usage": null`) is removed. Everything else reaches
//! the client byte for byte.
//!
//! An event can only be judged whole, so the bytes of an event the upstream split across
//! reads wait for its end (servers write each event in one piece, so in practice nothing
//! waits); whole events pass as soon as they arrive, and a chunk of whole events in which no
//! `"usage"` appears passes as it is, uncopied. An event with several `data` lines is left
//! as it is.

use std::ops::Range;

use bytes::{Buf, Bytes, BytesMut};
use memchr::memchr2;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// Filters one event stream (identity-coded), chunk by chunk.
#[derive(Default)]
pub(crate) struct UsageStripper {
    /// The start of an event not yet complete.
    held: BytesMut,
    lines: Lines,
    /// Where events end in the current chunk (reused).
    ends: Vec<usize>,
    /// The last event was dropped: the LF of its closing CRLF, if it comes next, goes too.
    dropped: bool,
}

impl UsageStripper {
    pub(crate) fn new() -> UsageStripper {
        UsageStripper::default()
    }

    /// The bytes to send on for `chunk`: the same bytes when nothing in it changes.
    pub(crate) fn filter(&mut self, mut chunk: Bytes) -> Bytes {
        if self.lines.cr_ended_event && chunk.first() == Some(&b'\n') {
            self.lines.cr_ended_event = false;
            self.lines.after_cr = false;
            if self.dropped {
                chunk = chunk.slice(1..);
            } else {
                // It stays with the event it ends, which was sent: send it on.
                let lf = chunk.split_to(1);
                let rest = self.filter(chunk);
                return if rest.is_empty() {
                    lf
                } else {
                    [lf, rest].concat().into()
                };
            }
        }
        self.ends.clear();
        self.lines.scan(&chunk, &mut self.ends);
        let complete = self.ends.last().copied().unwrap_or(0);
        if self.held.is_empty() && !mentions_usage(&chunk[..complete]) {
            // The common case: whole events, none touched.
            if complete > 0 {
                self.dropped = false;
            }
            if complete < chunk.len() {
                self.held.extend_from_slice(&chunk[complete..]);
            }
            return chunk.slice(..complete);
        }
        let mut out = BytesMut::with_capacity(self.held.len() + complete);
        if self.held.is_empty() {
            // Whole events judged where they are; only an unfinished one is copied, to wait.
            if let Some(dropped) = emit(&chunk, &self.ends, 0, &mut out) {
                self.dropped = dropped;
            }
            self.held.extend_from_slice(&chunk[complete..]);
        } else {
            let offset = self.held.len();
            self.held.extend_from_slice(&chunk);
            if let Some(dropped) = emit(&self.held, &self.ends, offset, &mut out) {
                self.dropped = dropped;
            }
            // Without a complete event, everything waits.
            let sent = self.ends.last().map_or(0, |end| offset + end);
            self.held.advance(sent);
        }
        out.freeze()
    }

    /// What is still held when the stream ends (an event never completed): sent as it is.
    pub(crate) fn finish(&mut self) -> Bytes {
        self.held.split().freeze()
    }
}

/// The events of `buf` that end at `ends` (offsets past `offset`), as they go on, into
/// `out`; whether the last one was dropped (None when there was none).
fn emit(buf: &[u8], ends: &[usize], offset: usize, out: &mut BytesMut) -> Option<bool> {
    let mut start = 0;
    let mut dropped = None;
    for &end in ends {
        let event = &buf[start..offset + end];
        let verdict = judge(event);
        dropped = Some(matches!(verdict, Verdict::Drop));
        match verdict {
            Verdict::Keep => out.extend_from_slice(event),
            Verdict::Drop => {}
            Verdict::Remove(member) => {
                out.extend_from_slice(&event[..member.start]);
                out.extend_from_slice(&event[member.end..]);
            }
        }
        start = offset + end;
    }
    dropped
}

use super::mentions_usage;

/// Where lines and events end, across chunks (WHATWG: CRLF, LF or CR end a line; a blank
/// line ends an event).
#[derive(Default)]
struct Lines {
    /// The current line has bytes.
    open: bool,
    /// The last byte seen was a CR: an LF right after it belongs to it.
    after_cr: bool,
    /// ... and that CR, the last byte of a chunk, ended an event.
    cr_ended_event: bool,
}

impl Lines {
    /// Pushes to `ends` the index just past each blank line in `bytes`.
    fn scan(&mut self, bytes: &[u8], ends: &mut Vec<usize>) {
        let mut i = 0;
        while let Some(at) = memchr2(b'\n', b'\r', &bytes[i..]) {
            let pos = i + at;
            let crlf = bytes[pos] == b'\n' && self.after_cr && at == 0;
            let blank = !self.open && at == 0;
            self.after_cr = bytes[pos] == b'\r';
            self.open = false;
            i = pos + 1;
            if crlf {
                // The LF of a CRLF that ended an event: the event ends after it.
                if let Some(end) = ends.last_mut().filter(|end| **end == pos) {
                    *end = i;
                }
            } else if blank {
                ends.push(i);
            }
        }
        if i < bytes.len() {
            self.open = true;
            self.after_cr = false;
        }
        self.cr_ended_event = self.after_cr && ends.last() == Some(&bytes.len());
    }
}

enum Verdict {
    Keep,
    Drop,
    /// Remove these bytes of the event: the `usage` member and its comma.
    Remove(Range<usize>),
}

/// What becomes of one whole event.
fn judge(event: &[u8]) -> Verdict {
    if !mentions_usage(event) {
        return Verdict::Keep;
    }
    let Some(data) = single_data(event) else {
        return Verdict::Keep;
    };
    // What OpenAI adds to every content chunk, as its last member: cut without a parse
    // (in a JSON object that ends so, it can only be the root's own last member).
    const NULL_USAGE: &[u8] = b",\"usage\":null}";
    if event[data.clone()].ends_with(NULL_USAGE) {
        return Verdict::Remove(data.end - NULL_USAGE.len()..data.end - 1);
    }
    let Ok(text) = std::str::from_utf8(&event[data.clone()]) else {
        return Verdict::Keep;
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let Ok(members) = de.deserialize_map(Members::default()) else {
        return Verdict::Keep;
    };
    let Some(usage) = members.usage else {
        return Verdict::Keep;
    };
    let no_choices = members.choices.is_none_or(|c| {
        let inner = c.get().trim_start_matches('[').trim_end_matches(']');
        c.get().starts_with('[') && inner.trim().is_empty()
    });
    if usage.value.get().starts_with('{') && no_choices {
        return Verdict::Drop;
    }
    match member_span(text, usage) {
        Some(span) => Verdict::Remove(data.start + span.start..data.start + span.end),
        None => Verdict::Keep,
    }
}

/// The bytes of the event's one `data` line's value; None when it has none or several.
fn single_data(event: &[u8]) -> Option<Range<usize>> {
    let mut found = None;
    let mut start = 0;
    while start < event.len() {
        let end = memchr2(b'\n', b'\r', &event[start..]).map_or(event.len(), |i| start + i);
        let line = &event[start..end];
        if let Some(value) = line.strip_prefix(b"data") {
            if found.is_some() {
                return None;
            }
            let value_start = match value.first() {
                Some(b':') => start + 5 + usize::from(value.get(1) == Some(&b' ')),
                None => end,
                // `dataX: …` is another field.
                Some(_) => {
                    start = end + 1;
                    continue;
                }
            };
            found = Some(value_start..end);
        }
        start = end + 1;
    }
    found
}

/// The top-level `usage` member of an object: its key (without quotes) and value, borrowed
/// from the text.
struct Member<'a> {
    key: &'a str,
    value: &'a RawValue,
}

#[derive(Default)]
struct Members<'a> {
    usage: Option<Member<'a>>,
    choices: Option<&'a RawValue>,
}

impl<'de> Visitor<'de> for Members<'de> {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Members<'de>, A::Error> {
        // A key written with escapes cannot be borrowed: the event is then left as it is.
        while let Some(key) = map.next_key::<&'de str>()? {
            match key {
                "usage" => {
                    let value = map.next_value()?;
                    self.usage = Some(Member { key, value });
                }
                "choices" => self.choices = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(self)
    }
}

/// The bytes of `text` that make up `member` with one comma beside it (the one before, or
/// after when it is the first member), so that the object stays valid JSON.
fn member_span(text: &str, member: Member<'_>) -> Option<Range<usize>> {
    let base = text.as_ptr() as usize;
    // The key's opening quote.
    let key_start = member.key.as_ptr() as usize - base - 1;
    let value_end = member.value.get().as_ptr() as usize - base + member.value.get().len();
    let bytes = text.as_bytes();
    let before = bytes[..key_start]
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())?;
    if bytes[before] == b',' {
        return Some(before..value_end);
    }
    let after = value_end
        + bytes[value_end..]
            .iter()
            .position(|b| !b.is_ascii_whitespace())?;
    match bytes[after] {
        b',' => {
            let next = bytes[after + 1..]
                .iter()
                .position(|b| !b.is_ascii_whitespace());
            Some(key_start..after + 1 + next.unwrap_or(0))
        }
        // The only member: `{}` is left.
        _ => Some(key_start..value_end),
    }
}

#[cfg(test)]
mod tests;
