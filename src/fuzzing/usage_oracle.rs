//! What the usage scanner should read, computed the slow way: serde_json reads each document
//! whole, and the dialect's rules are applied to its members in order.

use serde_json::Value;

use crate::api::{Framing, Usage, UsageContainer};

use super::model_body::top_level_members;

/// Largest `usage` object the scanner reads (its documented 4 KiB).
const USAGE_CAP: usize = 4096;

/// What a body reads as: its usage, and whether that is only a Messages stream's opening
/// report (every usage read came from `message`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Reading {
    pub(super) usage: Option<Usage>,
    pub(super) opening_only: bool,
}

/// The reading of `body` as serde_json sees it; None when that cannot be told: a document
/// (or an event's data) starts as an object but serde_json refuses it (not JSON, nested
/// deeper than serde_json's limit, or a lone surrogate escape: the scanner checks neither).
pub(super) fn reading(framing: Framing, dialect: UsageContainer, body: &[u8]) -> Option<Reading> {
    let mut oracle = Oracle {
        dialect,
        reading: Reading::default(),
    };
    match framing {
        Framing::Json => oracle.document(body)?,
        Framing::EventStream => {
            for data in event_data(body).0 {
                oracle.document(&data)?;
            }
        }
    }
    Some(oracle.reading)
}

/// How many events of an event stream carried a JSON object: events ended by a blank line
/// whose data starts (after JSON whitespace) with `{`, valid JSON or not.
pub(super) fn object_events(stream: &[u8]) -> u64 {
    event_data(stream).1
}

struct Oracle {
    dialect: UsageContainer,
    reading: Reading,
}

impl Oracle {
    /// One JSON document: its root `usage` members, and the `usage` members of the dialect's
    /// container (`response`, `message`) when it is an object, in the order they close.
    fn document(&mut self, document: &[u8]) -> Option<()> {
        let start = document.iter().find(|b| !b" \t\n\r".contains(b));
        if start != Some(&b'{') {
            return Some(());
        }
        let container = match self.dialect {
            UsageContainer::Root => None,
            UsageContainer::Response => Some("response"),
            UsageContainer::Message => Some("message"),
        };
        for (key, raw) in top_level_members(document)? {
            let raw = raw.get();
            if key == "usage" {
                self.usage_member(raw, false)?;
            } else if Some(key.as_str()) == container && raw.starts_with('{') {
                for (key, raw) in top_level_members(raw.as_bytes())? {
                    if key == "usage" {
                        self.usage_member(raw.get(), true)?;
                    }
                }
            }
        }
        Some(())
    }

    /// A `usage` member's value: counts when it is an object of at most 4 KiB. The last one
    /// wins; on Messages, for the counts it states.
    fn usage_member(&mut self, raw: &str, from_container: bool) -> Option<()> {
        if !raw.starts_with('{') || raw.len() > USAGE_CAP {
            return Some(());
        }
        let usage = usage_object(&serde_json::from_str(raw).ok()?);
        let merge = self.dialect == UsageContainer::Message;
        let reading = &mut self.reading;
        reading.opening_only =
            merge && from_container && (reading.usage.is_none() || reading.opening_only);
        reading.usage = Some(match (merge, reading.usage) {
            (true, Some(old)) => Usage {
                prompt_tokens: usage.prompt_tokens.or(old.prompt_tokens),
                completion_tokens: usage.completion_tokens.or(old.completion_tokens),
                reasoning_tokens: usage.reasoning_tokens.or(old.reasoning_tokens),
                cached_tokens: usage.cached_tokens.or(old.cached_tokens),
            },
            _ => usage,
        });
        Some(())
    }
}

/// The counts of a usage object, under either OpenAI API's names (the chat name wins when
/// both are present, even if its value is no count); Anthropic's prompt adds the tokens its
/// cache wrote and read to `input_tokens`, and the cache's read counts as cached when no
/// `_details` object says.
fn usage_object(object: &Value) -> Usage {
    let either = |a: &str, b: &str| object.get(a).or_else(|| object.get(b));
    let count = |name: &str| object.get(name).and_then(Value::as_u64);
    let detail = |a, b, name| either(a, b).and_then(|d| d.get(name)?.as_u64());
    let (cache_written, cache_read) = (
        count("cache_creation_input_tokens"),
        count("cache_read_input_tokens"),
    );
    let prompt = match object.get("prompt_tokens") {
        Some(prompt) => prompt.as_u64(),
        None => count("input_tokens").map(|input| {
            input
                .saturating_add(cache_written.unwrap_or(0))
                .saturating_add(cache_read.unwrap_or(0))
        }),
    };
    Usage {
        prompt_tokens: prompt,
        completion_tokens: either("completion_tokens", "output_tokens").and_then(Value::as_u64),
        reasoning_tokens: detail(
            "completion_tokens_details",
            "output_tokens_details",
            "reasoning_tokens",
        ),
        cached_tokens: detail(
            "prompt_tokens_details",
            "input_tokens_details",
            "cached_tokens",
        )
        .or(cache_read),
    }
}

/// The data of each event of a stream, read as WHATWG says (one BOM skipped; lines end in
/// CRLF, LF or CR; a `data` field's value loses one leading space; an event's data lines are
/// joined with LF). The event the stream ends in counts even without its blank line, as the
/// scanner reads usage as soon as it is complete; it is not counted in the object events
/// (the second value), which the scanner counts at the blank line.
fn event_data(stream: &[u8]) -> (Vec<Vec<u8>>, u64) {
    let stream = stream.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(stream);
    let mut events = Vec::new();
    let mut objects = 0;
    let mut data: Option<Vec<u8>> = None;
    let mut rest = stream;
    while !rest.is_empty() {
        let eol = rest.iter().position(|&b| b == b'\n' || b == b'\r');
        let line = &rest[..eol.unwrap_or(rest.len())];
        rest = match eol {
            Some(at) if rest[at..].starts_with(b"\r\n") => &rest[at + 2..],
            Some(at) => &rest[at + 1..],
            None => &[],
        };
        if line.is_empty() && eol.is_some() {
            if let Some(data) = data.take() {
                let start = data.iter().find(|b| !b" \t\n\r".contains(b));
                objects += u64::from(start == Some(&b'{'));
                events.push(data);
            }
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
    events.extend(data);
    (events, objects)
}
