//! The answer of a translated call, converted to the client's dialect as it passes: a stream
//! event by event, a JSON answer (or an upstream error) once whole, since its shape changes
//! from its first byte.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::Result;
use serde_json::Value;

use crate::api::translate::{Asked, Pair, Stream};
use crate::api::BodyError;

/// The most bytes of a JSON answer held to be converted; past it the answer is cut.
const MAX_WHOLE: usize = 16 << 20;

pub(crate) struct Translated {
    pair: Pair,
    /// What the client's request said that its answer depends on.
    asked: Asked,
    answer: Answer,
}

enum Answer {
    /// Before the response head.
    Waiting,
    /// An answer the gateway cannot convert (a coding it did not ask for): passed as sent.
    AsSent,
    Stream(Stream),
    /// A JSON answer or an error, held until whole.
    Whole {
        status: u16,
        bytes: Vec<u8>,
    },
}

impl Translated {
    pub(crate) fn new(pair: Pair) -> Translated {
        Translated {
            pair,
            asked: Asked::default(),
            answer: Answer::Waiting,
        }
    }

    pub(crate) fn pair(&self) -> Pair {
        self.pair
    }

    /// Whether the converted stream ended in its dialect's error form.
    pub(crate) fn was_cut(&self) -> bool {
        matches!(&self.answer, Answer::Stream(s) if s.was_cut())
    }

    /// The client's request (as the policy left it) in the upstream's dialect.
    pub(crate) fn request(&mut self, body: &[u8]) -> Result<Vec<u8>, BodyError> {
        let parsed: Value = serde_json::from_slice(body)
            .map_err(|_| BodyError::new("body is not valid JSON".into()))?;
        self.asked = Asked::of(&parsed);
        let converted = (self.pair.converters().request)(parsed, &mut self.asked);
        let converted = converted.map_err(|e| BodyError::new(e.0))?;
        Ok(serde_json::to_vec(&converted).unwrap_or_default())
    }

    /// The response head: how the answer will be converted; its length is no longer known.
    pub(crate) fn head(
        &mut self,
        response: &mut ResponseHeader,
        event_stream: bool,
        client: http::Version,
    ) -> Result<()> {
        let coding = response.headers.get(http::header::CONTENT_ENCODING);
        if coding.is_some_and(|c| !c.as_bytes().eq_ignore_ascii_case(b"identity")) {
            self.answer = Answer::AsSent;
            return Ok(());
        }
        let status = response.status.as_u16();
        self.answer = if event_stream && response.status.is_success() {
            Answer::Stream(Stream::new((self.pair.converters().stream)(&self.asked)))
        } else {
            response.insert_header(http::header::CONTENT_TYPE, "application/json")?;
            Answer::Whole {
                status,
                bytes: Vec::new(),
            }
        };
        super::length_changes(response, client)
    }

    /// The upstream failed mid-answer: the end of a converted stream (its error form, unless
    /// the answer was already complete).
    pub(crate) fn upstream_failed(&mut self) -> Option<Bytes> {
        let Answer::Stream(stream) = &mut self.answer else {
            return None;
        };
        let mut out = Vec::new();
        stream.finish(&mut out);
        Some(Bytes::from(out)).filter(|b| !b.is_empty())
    }

    /// Each chunk of the upstream's answer, replaced by what the client gets for it.
    pub(crate) fn chunk(&mut self, body: &mut Option<Bytes>, end_of_stream: bool) {
        match &mut self.answer {
            Answer::Waiting | Answer::AsSent => {}
            Answer::Stream(stream) => {
                let mut out = Vec::new();
                if let Some(chunk) = body.take() {
                    stream.feed(&chunk, &mut out);
                }
                if end_of_stream {
                    stream.finish(&mut out);
                }
                *body = Some(Bytes::from(out));
            }
            Answer::Whole { status, bytes } => {
                if let Some(chunk) = body.take() {
                    if bytes.len() + chunk.len() <= MAX_WHOLE {
                        bytes.extend_from_slice(&chunk);
                    }
                }
                // Nothing for the client until the answer is whole.
                *body = Some(Bytes::new());
                if end_of_stream {
                    let converted = whole(self.pair, *status, bytes, &self.asked);
                    *body = Some(Bytes::from(converted));
                }
            }
        }
    }
}

/// A whole answer in the client's dialect: a success converted, an error in its error shape.
fn whole(pair: Pair, status: u16, bytes: &[u8], asked: &Asked) -> Vec<u8> {
    let convert = pair.converters();
    let converted = match serde_json::from_slice::<Value>(bytes) {
        Ok(answer) if (200..300).contains(&status) => (convert.answer)(&answer, asked),
        _ => (convert.error)(status.max(400), bytes),
    };
    serde_json::to_vec(&converted).unwrap_or_default()
}

/// The bridge's converters as the benchmarks drive them (`benches/translate.rs`): a
/// translated call's request, then its streamed answer, through the request path's own code.
pub struct Bridge(Translated);

impl Bridge {
    /// The pair named as the access log names it (`messages>chat`).
    pub fn named(pair: &str) -> Option<Bridge> {
        Pair::named(pair).map(|pair| Bridge(Translated::new(pair)))
    }

    /// The client's request body in the upstream's dialect, or why not.
    pub fn request(&mut self, body: &[u8]) -> Result<Vec<u8>, String> {
        self.0.request(body).map_err(|e| e.message().to_string())
    }

    /// The upstream's answer starts: an event stream, converted as it comes.
    pub fn stream(&mut self) {
        let mut head = ResponseHeader::build(200, None).expect("a 200 head");
        let _ = head.insert_header(http::header::CONTENT_TYPE, "text/event-stream");
        let _ = self.0.head(&mut head, true, http::Version::HTTP_11);
    }

    /// One chunk of the upstream's stream in, what the client gets for it out.
    pub fn chunk(&mut self, chunk: Bytes, end: bool) -> Bytes {
        let mut body = Some(chunk);
        self.0.chunk(&mut body, end);
        body.unwrap_or_default()
    }
}
