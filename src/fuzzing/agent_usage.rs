//! The usage scanner in the agent APIs' dialects: Responses (`response.usage`, last wins) and
//! Messages (`message.usage`, merged field by field with the later root usage).

use crate::api::{Encoding, Framing, Usage, UsageContainer};

use super::usage::{compressed, scanned_in_chunks};
use super::usage_oracle::{self, Reading};

/// `UsageScanner` in the Responses dialect on an arbitrary response body: see `dialect_invariants`.
pub fn responses_usage(data: &[u8]) {
    dialect_invariants(data, UsageContainer::Response);
}

/// `UsageScanner` in the Messages dialect on an arbitrary response body: see `dialect_invariants`.
pub fn messages_usage(data: &[u8]) {
    dialect_invariants(data, UsageContainer::Message);
}

/// What a scanner read: its usage, whether that is only an opening report, and how many
/// events carried an object (what a cut stream is charged by).
type Read = (Option<Usage>, bool, u64);

/// As a JSON body and as an event stream: the chunking never changes what is read (whole,
/// cut once where the first byte says, a byte at a time, chunk sizes drawn from the data),
/// nor does compressing the body; where serde_json can read the body, the usage and the
/// opening-only flag are the ones the dialect's rules give over its documents; the events
/// counted are the stream's object events, whatever their JSON; and the bytes fed as a gzip or
/// deflate body (garbage, almost always) never panic.
fn dialect_invariants(data: &[u8], dialect: UsageContainer) {
    let cut = data.first().map_or(1, |&b| usize::from(b) % data.len());
    let drawn: Vec<usize> = data.iter().take(16).map(|&b| usize::from(b % 32)).collect();
    let compressed = compressed(data);
    for framing in [Framing::Json, Framing::EventStream] {
        let read = |encoding, body: &[u8], sizes: &[usize]| -> Read {
            let scanner = scanned_in_chunks(framing, encoding, dialect, body, sizes);
            (scanner.usage(), scanner.opening_only(), scanner.events())
        };
        let whole = read(Encoding::Identity, data, &[data.len()]);
        let cut_once = read(Encoding::Identity, data, &[cut, data.len()]);
        assert_eq!(cut_once, whole, "{dialect:?} {framing:?}: cut at {cut}");
        assert_eq!(
            read(Encoding::Identity, data, &drawn),
            whole,
            "{dialect:?} {framing:?}: {drawn:?}"
        );
        if data.len() <= 1024 {
            assert_eq!(
                read(Encoding::Identity, data, &[1]),
                whole,
                "{dialect:?} {framing:?}: bytewise"
            );
        }
        if let Some(Reading {
            usage,
            opening_only,
        }) = usage_oracle::reading(framing, dialect, data)
        {
            assert_eq!(
                (whole.0, whole.1),
                (usage, opening_only),
                "{dialect:?} {framing:?}: not what serde_json reads"
            );
        }
        let events = match framing {
            Framing::Json => 0,
            Framing::EventStream => usage_oracle::object_events(data),
        };
        assert_eq!(whole.2, events, "{dialect:?} {framing:?}: events counted");
        for (encoding, body) in &compressed {
            let cut = cut % body.len().max(1);
            assert_eq!(
                read(*encoding, body, &[body.len()]),
                whole,
                "{dialect:?} {framing:?} {encoding:?}"
            );
            let cut_once = read(*encoding, body, &[cut, body.len()]);
            assert_eq!(
                cut_once, whole,
                "{dialect:?} {framing:?} {encoding:?}: cut at {cut}"
            );
        }
        for encoding in [Encoding::Gzip, Encoding::Deflate] {
            read(encoding, data, &[data.len()]);
            read(encoding, data, &[cut, data.len()]);
            read(encoding, data, &drawn);
        }
    }
}
