//! The usage scanner, over every framing and content coding it reads.

use std::io::Write;

use bytes::Bytes;
use flate2::write::{DeflateEncoder, GzEncoder, ZlibEncoder};

use crate::api::UsageStripper;
use crate::api::{Encoding, Framing, Usage, UsageContainer, UsageScanner};

use super::usage_oracle;

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
        if let Some(reference) = usage_oracle::reading(framing, UsageContainer::Root, data) {
            let reference = reference.usage;
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

/// Feeds `body` in chunks of the given sizes (cycled; 0 counts as 1), then asks for the usage.
pub(crate) fn usage_in_chunks(
    framing: Framing,
    encoding: Encoding,
    body: &[u8],
    sizes: &[usize],
) -> Option<Usage> {
    scanned_in_chunks(framing, encoding, UsageContainer::Root, body, sizes).usage()
}

/// A scanner of the dialect that was fed `body` in chunks of the given sizes (cycled; 0
/// counts as 1).
pub(super) fn scanned_in_chunks(
    framing: Framing,
    encoding: Encoding,
    dialect: UsageContainer,
    body: &[u8],
    sizes: &[usize],
) -> UsageScanner {
    let mut scanner = UsageScanner::new(framing, encoding, dialect);
    let mut rest = body;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (chunk, tail) = rest.split_at(size.clamp(1, rest.len()));
        scanner.feed(chunk);
        rest = tail;
    }
    scanner
}

/// `body` as a gzip, a zlib-wrapped deflate and a raw deflate response body.
pub(super) fn compressed(body: &[u8]) -> [(Encoding, Vec<u8>); 3] {
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
