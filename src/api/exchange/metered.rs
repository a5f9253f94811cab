//! Metering one exchange on an endpoint the gateway reads, so that no client can make its
//! usage go unread:
//! - the upstream may only answer in codings the usage scanner decodes (`limit_codings`);
//! - a streamed request that did not ask for its usage was made to (the model policy's
//!   `stream_options` edit), and what that adds is taken out of the client's stream here;
//! - a stream that ends without a usage report is charged an estimate (`settle`).

use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::Result;

use crate::api::{Encoding, Framing, Usage, UsageContainer, UsageScanner, UsageStripper};

/// What an exchange was charged, once it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charged {
    pub usage: Usage,
    /// Estimated: the stream ended without a usage report.
    pub estimated: bool,
}

#[derive(Default)]
pub(crate) struct Metered {
    /// Request body bytes, for the estimate of a stream's prompt.
    request_bytes: usize,
    /// The gateway turned `include_usage` on: what it adds is removed from the stream.
    adds_usage: bool,
    /// Where the endpoint's API puts its usage.
    usage_at: UsageContainer,
    /// The endpoint generates nothing and reports no usage (Messages' `count_tokens`): its
    /// answer is charged no tokens.
    free: bool,
    /// None before the response, or when its coding cannot be read.
    scanner: Option<UsageScanner>,
    /// The response arrived in a coding the scanner does not read.
    unreadable: bool,
    event_stream: bool,
    strip: Option<UsageStripper>,
    charged: Option<Charged>,
    /// A budgeted request's worst case (prompt estimate, completion cap): what a successful
    /// answer whose usage goes unread is charged.
    worst_case: Option<(u64, u64)>,
}

/// The most tokens of one kind a single request is believed to use; a count above it is the
/// upstream's error (or a lie), charged as if no usage came.
pub(crate) const IMPLAUSIBLE: u64 = 1 << 32;

impl Metered {
    /// The request body as it was checked: its size, and whether the gateway asked for the
    /// usage the client did not.
    /// `usage_at` is `None` for an endpoint that reports no usage because it generates nothing.
    pub(crate) fn request_read(
        &mut self,
        body_len: usize,
        adds_usage: bool,
        usage_at: Option<UsageContainer>,
    ) {
        self.request_bytes = body_len;
        self.adds_usage = adds_usage;
        self.usage_at = usage_at.unwrap_or_default();
        self.free = usage_at.is_none();
    }

    /// The upstream's `Accept-Encoding`: only codings the scanner decodes, of those the client
    /// accepts (`identity` when none). A stream the gateway takes usage out of stays
    /// uncompressed, as it must be edited.
    pub(crate) fn limit_codings(&self, upstream: &mut RequestHeader) -> Result<()> {
        let codings = if self.adds_usage {
            "identity"
        } else {
            let client = upstream.headers.get(http::header::ACCEPT_ENCODING);
            readable_codings(client.map(|v| v.as_bytes()))
        };
        // A static value: no copy of the text per request.
        let codings = http::HeaderValue::from_static(codings);
        upstream.insert_header(http::header::ACCEPT_ENCODING, codings)?;
        Ok(())
    }

    /// The budgeted request's worst case, charged should its usage go unread.
    pub(crate) fn charge_if_unread(&mut self, prompt: u64, completion: u64) {
        self.worst_case = Some((prompt, completion));
    }

    /// Starts reading the response, if its coding can be read. A stream the gateway takes
    /// usage out of loses any `Content-Length` (it will be shorter): chunked to an HTTP/1.1
    /// client, delimited by the close to an HTTP/1.0 one, framed by HTTP/2 itself.
    pub(crate) fn response_started(
        &mut self,
        response: &mut ResponseHeader,
        event_stream: bool,
        client: http::Version,
    ) -> Result<()> {
        let framing = if event_stream {
            Framing::EventStream
        } else {
            Framing::Json
        };
        let coding = response.headers.get(http::header::CONTENT_ENCODING);
        let encoding = Encoding::from_header(coding.map(|v| v.as_bytes()));
        let usage_at = self.usage_at;
        self.scanner =
            (encoding.filter(|_| !self.free)).map(|e| UsageScanner::new(framing, e, usage_at));
        self.unreadable = encoding.is_none();
        self.event_stream = event_stream;
        self.strip = (self.adds_usage && event_stream && encoding == Some(Encoding::Identity))
            .then(UsageStripper::new);
        if self.strip.is_some() {
            super::length_changes(response, client)?;
        }
        Ok(())
    }

    /// Reads a response chunk as it passes; on a stream where the gateway asked for usage,
    /// what that added is taken out.
    pub(crate) fn response_chunk(&mut self, body: &mut Option<Bytes>, end_of_stream: bool) {
        if let (Some(scanner), Some(chunk)) = (&mut self.scanner, body.as_ref()) {
            scanner.feed(chunk);
        }
        let Some(strip) = &mut self.strip else {
            return;
        };
        if let Some(chunk) = body.take() {
            *body = Some(strip.filter(chunk));
        }
        if end_of_stream {
            let rest = strip.finish();
            if !rest.is_empty() {
                *body = Some(match body.take() {
                    Some(last) if !last.is_empty() => [last, rest].concat().into(),
                    _ => rest,
                });
            }
        }
    }

    /// Settles the charge once the exchange is over: `status` as sent to the client, `cut`
    /// when the exchange ended in an error (the client left, the upstream failed). Returns
    /// why a successful response's usage was not read, if it was not.
    ///
    /// A successful answer whose usage cannot be read (none reported, an unreadable coding, a
    /// client gone before the report, a count over [`IMPLAUSIBLE`]) is charged, when the
    /// request was budgeted, its whole worst case: hidden reasoning is never visible in the
    /// stream, so what was seen is no bound. Otherwise a stream is charged an estimate: one
    /// completion token per streamed event that carried a JSON object (OpenAI-compatible
    /// servers stream a token per chunk), and a prompt of a token per 4 bytes of the request
    /// body. A stream cut after its opening report only (Messages states its usage at the
    /// start, and its output again at the end) is charged at least a token per event, or the
    /// completion cap when budgeted.
    pub(crate) fn settle(&mut self, status: u16, cut: bool) -> Option<&'static str> {
        if self.free {
            // A token count: a request in the ledger, never tokens, and nothing to read.
            self.charged = (200..300).contains(&status).then_some(Charged {
                usage: Usage {
                    prompt_tokens: Some(0),
                    completion_tokens: Some(0),
                    reasoning_tokens: None,
                    cached_tokens: None,
                },
                estimated: false,
            });
            return None;
        }
        let read = self.scanner.as_ref().and_then(UsageScanner::usage);
        let implausible = read.is_some_and(|u| implausible(&u));
        if let Some(mut usage) = read.filter(|_| !implausible) {
            let scanner = self.scanner.as_ref();
            let events = scanner.map_or(0, UsageScanner::events);
            let short = scanner.is_some_and(UsageScanner::opening_only)
                && usage.completion_tokens.is_none_or(|n| n < events || cut);
            if short {
                let floor = self.worst_case.map_or(events, |(_, cap)| cap.max(events));
                usage.completion_tokens = Some(floor);
            }
            self.charged = Some(Charged {
                usage,
                estimated: short,
            });
            return None;
        }
        if !(200..300).contains(&status) {
            return implausible.then_some("implausible");
        }
        let reason = if implausible {
            "implausible"
        } else if self.unreadable {
            "encoding"
        } else if cut && self.event_stream {
            "abandoned"
        } else {
            "missing"
        };
        let estimate = match (self.worst_case, &self.scanner) {
            (Some((prompt, completion)), _) => Some((prompt, completion)),
            (None, Some(scanner)) if self.event_stream => {
                Some((self.request_bytes.div_ceil(4) as u64, scanner.events()))
            }
            _ => None,
        };
        if let Some((prompt, completion)) = estimate {
            self.charged = Some(Charged {
                usage: Usage {
                    prompt_tokens: Some(prompt),
                    completion_tokens: Some(completion),
                    reasoning_tokens: None,
                    cached_tokens: None,
                },
                estimated: true,
            });
        }
        Some(reason)
    }

    /// Whether an answer's usage may still come: it generates, its coding is read, and no
    /// usage report was seen yet (or only a Messages stream's opening one).
    pub(crate) fn usage_pending(&self) -> bool {
        let read = self.scanner.as_ref().and_then(UsageScanner::usage);
        let opening = self
            .scanner
            .as_ref()
            .is_some_and(UsageScanner::opening_only);
        !self.free && self.scanner.is_some() && (read.is_none() || opening)
    }

    /// What the exchange was charged, once settled.
    pub(crate) fn charged(&self) -> Option<&Charged> {
        self.charged.as_ref()
    }
}

/// The codings of a client's `Accept-Encoding` that the scanner reads (gzip, deflate), as
/// the value sent upstream; `identity` when it accepts neither or sent none (no header would
/// let the upstream pick any coding).
fn readable_codings(client: Option<&[u8]>) -> &'static str {
    let (mut gzip, mut deflate) = (false, false);
    for item in client.unwrap_or_default().split(|&b| b == b',') {
        let mut parts = item.split(|&b| b == b';');
        let coding = parts.next().unwrap_or_default().trim_ascii();
        let refused = parts.any(|p| {
            let p = p.trim_ascii();
            p.len() > 2
                && p[..2].eq_ignore_ascii_case(b"q=")
                && std::str::from_utf8(&p[2..])
                    .ok()
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
        });
        if refused {
            continue;
        }
        let is = |name: &[u8]| coding.eq_ignore_ascii_case(name);
        gzip |= is(b"gzip") || is(b"x-gzip") || is(b"*");
        deflate |= is(b"deflate") || is(b"*");
    }
    match (gzip, deflate) {
        (true, true) => "gzip, deflate",
        (true, false) => "gzip",
        (false, true) => "deflate",
        (false, false) => "identity",
    }
}

/// A count no single request uses: the upstream's usage is not believed.
fn implausible(u: &Usage) -> bool {
    [
        u.prompt_tokens,
        u.completion_tokens,
        u.reasoning_tokens,
        u.cached_tokens,
    ]
    .into_iter()
    .flatten()
    .any(|n| n > IMPLAUSIBLE)
}

#[cfg(test)]
mod tests {
    use super::readable_codings;

    #[test]
    fn the_upstream_may_answer_only_in_codings_the_scanner_reads() {
        for (client, upstream) in [
            (None, "identity"),
            (Some("zstd"), "identity"),
            (Some("br, zstd"), "identity"),
            (Some("gzip, deflate, br, zstd"), "gzip, deflate"),
            (Some("br;q=1.0, gzip;q=0.5"), "gzip"),
            (Some("GZIP"), "gzip"),
            (Some("gzip;q=0, deflate"), "deflate"),
            (Some("gzip; q=0.000"), "identity"),
            (Some("*"), "gzip, deflate"),
            (Some("identity"), "identity"),
            (Some(""), "identity"),
        ] {
            assert_eq!(
                readable_codings(client.map(str::as_bytes)),
                upstream,
                "{client:?}"
            );
        }
    }
}
