//! Content codings as a real server applies them to its answers: the request's
//! `Accept-Encoding` negotiated per RFC 9110 §12.5.3 (q-values, `*`, `identity;q=0`), or a
//! coding forced by the test (`?force_encoding=`), the upstream that ignores what it was asked.
//!
//! Absent `Accept-Encoding` means identity here. RFC 9110 lets a server pick any coding then
//! (and some do); this one does not, so a test that sends nothing gets plain bytes every time.
//!
//! Streams are compressed with a flush after every event (gzip and deflate a sync flush, br
//! `BROTLI_OPERATION_FLUSH`, zstd a block flush), so each event can be decoded as soon as it
//! arrives, as a streaming server must.

use std::io::{Read, Write};

use flate2::write::{GzEncoder, ZlibEncoder};
use flate2::Compression;

/// A content coding the fake upstream can answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
    /// `deflate` as HTTP means it: zlib-wrapped (RFC 1950), not raw deflate.
    Deflate,
    Br,
    Zstd,
}

impl Coding {
    /// Every coding but identity, in the order the server prefers them on a tie in q.
    pub const COMPRESSED: [Coding; 4] = [Coding::Zstd, Coding::Br, Coding::Gzip, Coding::Deflate];

    /// The name in `Content-Encoding` / `Accept-Encoding`.
    pub fn name(self) -> &'static str {
        match self {
            Coding::Identity => "identity",
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Br => "br",
            Coding::Zstd => "zstd",
        }
    }

    /// A coding by name, case-insensitive (`x-gzip` is gzip, as RFC 9110 asks).
    pub fn parse(name: &str) -> Option<Coding> {
        let name = name.trim().to_ascii_lowercase();
        Some(match name.as_str() {
            "identity" => Coding::Identity,
            "gzip" | "x-gzip" => Coding::Gzip,
            "deflate" => Coding::Deflate,
            "br" => Coding::Br,
            "zstd" => Coding::Zstd,
            _ => return None,
        })
    }

    /// What a server answers to this `Accept-Encoding` (all of the request's lines joined with
    /// commas; None when absent): the acceptable coding with the highest q, the server's order
    /// (`COMPRESSED`, then identity) breaking ties; identity when no compressed coding is
    /// acceptable or a listed `identity` weighs more. Identity
    /// is also the answer when even identity was refused: a server may send it anyway (RFC 9110
    /// §12.5.3), and a 406 would teach the tests nothing.
    pub fn negotiate(accept_encoding: Option<&str>) -> Coding {
        let Some(value) = accept_encoding else {
            return Coding::Identity;
        };
        let mut star = None;
        let mut listed: Vec<(String, f32)> = Vec::new();
        for item in value.split(',') {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            if name.is_empty() {
                continue;
            }
            let mut q = 1.0f32;
            for param in parts {
                if let Some((k, v)) = param.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("q") {
                        // A malformed weight makes the entry unusable rather than preferred.
                        q = v.trim().parse().unwrap_or(0.0);
                    }
                }
            }
            if name == "*" {
                star = Some(q);
            } else {
                let name = if name == "x-gzip" {
                    "gzip".into()
                } else {
                    name
                };
                listed.push((name, q));
            }
        }
        let weight = |c: Coding| {
            listed
                .iter()
                .find(|(n, _)| n == c.name())
                .map(|(_, q)| *q)
                .or(star)
                .unwrap_or(0.0)
        };
        // Identity competes only when listed: its being acceptable by default gives it no
        // weight over a compressed coding the client asked for.
        let identity = listed
            .iter()
            .find(|(n, _)| n == "identity")
            .map(|(_, q)| *q);
        let mut best = (Coding::Identity, identity.unwrap_or(0.0));
        for c in Coding::COMPRESSED {
            let q = weight(c);
            if q > best.1 || (q == best.1 && q > 0.0 && best.0 == Coding::Identity) {
                best = (c, q);
            }
        }
        best.0
    }

    /// The whole of `body` in this coding (a JSON answer).
    pub fn encode(self, body: &[u8]) -> Vec<u8> {
        let mut enc = Encoder::new(self);
        let mut out = enc.piece(body);
        out.extend(enc.finish());
        out
    }

    /// `body` decoded; an error if it is not a complete, valid body in this coding.
    pub fn decode(self, body: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.reader(body).read_to_end(&mut out)?;
        Ok(out)
    }

    /// As much of `body` as decodes, for the first bytes of a stream that is still open: what
    /// a client can read so far. Proves that the server flushed each event.
    pub fn decode_prefix(self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        // read_to_end keeps what it read before the error a truncated input ends in.
        let _ = self.reader(body).read_to_end(&mut out);
        out
    }

    fn reader<'a>(self, body: &'a [u8]) -> Box<dyn Read + 'a> {
        match self {
            Coding::Identity => Box::new(body),
            Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(body)),
            Coding::Deflate => Box::new(flate2::read::ZlibDecoder::new(body)),
            Coding::Br => Box::new(brotli::Decompressor::new(body, 4096)),
            Coding::Zstd => match zstd::stream::read::Decoder::new(body) {
                Ok(d) => Box::new(d),
                Err(e) => Box::new(FailingReader(Some(e))),
            },
        }
    }
}

/// The answer's coding for a request: `?force_encoding=NAME` if given, else negotiated.
pub(super) fn for_request(req: &super::Hit) -> Coding {
    let query = req.target.split_once('?').map_or("", |(_, q)| q);
    let forced = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("force_encoding="))
        .and_then(Coding::parse);
    forced.unwrap_or_else(|| {
        let lines: Vec<&str> = req
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("accept-encoding"))
            .map(|(_, v)| v.as_str())
            .collect();
        Coding::negotiate((!lines.is_empty()).then(|| lines.join(",")).as_deref())
    })
}

/// Header lines (each ending in CRLF) that state `coding` on an answer: none for identity.
pub(super) fn headers(coding: Coding) -> String {
    match coding {
        Coding::Identity => String::new(),
        c => format!(
            "content-encoding: {}\r\nvary: accept-encoding\r\n",
            c.name()
        ),
    }
}

struct FailingReader(Option<std::io::Error>);

impl Read for FailingReader {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        Err(self
            .0
            .take()
            .unwrap_or_else(|| std::io::Error::other("bad zstd")))
    }
}

/// A compressor fed one piece (an SSE event, or part of one) at a time, each flushed so that
/// what it returns decodes without what follows.
pub(super) enum Encoder {
    Identity,
    Gzip(GzEncoder<Vec<u8>>),
    Deflate(ZlibEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    pub(super) fn new(coding: Coding) -> Encoder {
        match coding {
            Coding::Identity => Encoder::Identity,
            Coding::Gzip => Encoder::Gzip(GzEncoder::new(Vec::new(), Compression::default())),
            Coding::Deflate => {
                Encoder::Deflate(ZlibEncoder::new(Vec::new(), Compression::default()))
            }
            // Quality 5 and a 4 MiB window: what web servers commonly use on the fly.
            Coding::Br => Encoder::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                5,
                22,
            ))),
            Coding::Zstd => {
                Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap())
            }
        }
    }

    /// The bytes to send for `data`, flushed: writes to a Vec cannot fail.
    pub(super) fn piece(&mut self, data: &[u8]) -> Vec<u8> {
        fn flushed<W: Write>(w: &mut W, data: &[u8]) {
            w.write_all(data).unwrap();
            w.flush().unwrap();
        }
        match self {
            Encoder::Identity => return data.to_vec(),
            Encoder::Gzip(e) => flushed(e, data),
            Encoder::Deflate(e) => flushed(e, data),
            Encoder::Br(e) => flushed(e.as_mut(), data),
            Encoder::Zstd(e) => flushed(e, data),
        }
        match self {
            Encoder::Identity => unreachable!(),
            Encoder::Gzip(e) => std::mem::take(e.get_mut()),
            Encoder::Deflate(e) => std::mem::take(e.get_mut()),
            Encoder::Br(e) => std::mem::take(e.get_mut()),
            Encoder::Zstd(e) => std::mem::take(e.get_mut()),
        }
    }

    /// The coding's trailer (gzip's CRC and length, zlib's Adler-32, the last br/zstd block).
    pub(super) fn finish(self) -> Vec<u8> {
        match self {
            Encoder::Identity => Vec::new(),
            Encoder::Gzip(e) => e.finish().unwrap(),
            Encoder::Deflate(e) => e.finish().unwrap(),
            Encoder::Br(e) => e.into_inner(),
            Encoder::Zstd(e) => e.finish().unwrap(),
        }
    }
}
