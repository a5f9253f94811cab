//! The request-flow side of `api = "openai"` services: reading the chat/embeddings body,
//! validating it and applying the model policy before anything reaches the upstream, then
//! counting the `usage` the response reports as it streams past.
//!
//! Pingora 0.9 writes the upstream request head before `request_body_filter` ever runs, so
//! a body whose length changes cannot fix its Content-Length there. Two ways through:
//! - **Read ahead** (a Content-Length of at most [`READ_AHEAD_MAX`]): `request_filter` reads
//!   the whole body with Pingora's retry buffer on, before any upstream is contacted. A bad
//!   body is answered 400 and never forwarded; a changed one gets its exact Content-Length
//!   in `upstream_request_filter`. Pingora then replays the retry buffer through
//!   `request_body_filter` (its only way to send a body that was read ahead), where the
//!   changed bytes are swapped in.
//! - **Hold** (bigger or chunked bodies: vision requests with images): the retry buffer
//!   stops at 64 KiB and Pingora would then send no body at all, so the body is instead
//!   held back in `request_body_filter` until complete and sent upstream in one piece,
//!   with chunked framing (the length is not known when the head leaves). A bad body is
//!   answered 400 and the upstream connection is dropped before any body byte was sent:
//!   the upstream has seen a request head, never a request.

use bytes::{Bytes, BytesMut};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};

use crate::access_log;
use crate::errors::GatewayError;
use crate::model_policy::{self, BodyError, Endpoint, Models};
use crate::usage::{Encoding, Framing, Usage, UsageScanner};

/// Pingora's retry buffer (`BODY_BUF_LIMIT` in pingora-core): a body read ahead is only
/// replayed to the upstream if it fits.
pub const READ_AHEAD_MAX: u64 = 64 * 1024;

/// What one chat or embeddings exchange on an `api = "openai"` service carries.
pub struct Exchange {
    pub endpoint: Endpoint,
    body: Body,
    /// The model after the policy, as the access log shows it (cut to 256 bytes).
    pub model: Option<String>,
    /// Set when the body was refused; told to the client in the 400.
    pub error: Option<BodyError>,
    usage: Option<UsageScanner>,
}

enum Body {
    /// Read ahead and unchanged: the retry buffer goes upstream as it is.
    Original,
    /// Read ahead and changed by the policy.
    Replaced(Bytes),
    /// Being held back until complete.
    Held(BytesMut),
}

/// What `request_filter` does next.
pub enum Next {
    Proxy,
    Refuse(GatewayError),
}

impl Exchange {
    /// Reads the body ahead when it is small enough to be replayed, else arranges to hold it.
    pub async fn begin(
        session: &mut Session,
        endpoint: Endpoint,
        models: &Models,
        max_body: u64,
    ) -> Result<(Exchange, Next)> {
        let mut exchange = Exchange {
            endpoint,
            body: Body::Original,
            model: None,
            error: None,
            usage: None,
        };
        let declared = declared_length(session.req_header());
        let Some(len) = declared.filter(|&len| len <= READ_AHEAD_MAX) else {
            let capacity = declared.unwrap_or(0).min(max_body) as usize;
            exchange.body = Body::Held(BytesMut::with_capacity(capacity));
            return Ok((exchange, Next::Proxy));
        };
        if expects_continue(session.req_header()) {
            // The client waits for this before sending the body we are about to read.
            session.write_continue_response().await?;
        }
        session.enable_retry_buffering();
        // Usually the whole body comes in one read: then it is used as it is, not copied.
        let first = session.read_request_body().await?.unwrap_or_default();
        let body = match session.read_request_body().await? {
            None => first,
            Some(second) => {
                let mut all = BytesMut::with_capacity(len as usize);
                all.extend_from_slice(&first);
                all.extend_from_slice(&second);
                while let Some(chunk) = session.read_request_body().await? {
                    all.extend_from_slice(&chunk);
                }
                all.freeze()
            }
        };
        let next = exchange.apply(&body, models);
        Ok((exchange, next))
    }

    fn apply(&mut self, body: &[u8], models: &Models) -> Next {
        match model_policy::plan(self.endpoint, body, models) {
            Ok(plan) => {
                // The access log is the name's only reader: only what it shows is copied.
                self.model = plan.model.map(|m| access_log::model_name(&m).to_owned());
                if let Some(edit) = plan.edit {
                    self.body = Body::Replaced(Bytes::from(edit.applied_to(body)));
                }
                Next::Proxy
            }
            Err(e) => {
                self.error = Some(e);
                Next::Refuse(GatewayError::InvalidBody)
            }
        }
    }

    /// Framing for the body the upstream will get.
    pub fn frame_upstream(&self, upstream: &mut RequestHeader) -> Result<()> {
        match &self.body {
            Body::Original => {}
            Body::Replaced(body) => {
                upstream.insert_header(http::header::CONTENT_LENGTH, body.len())?;
            }
            // Without a length Pingora frames the body chunked.
            Body::Held(_) => {
                upstream.remove_header(&http::header::CONTENT_LENGTH);
            }
        }
        Ok(())
    }

    /// Swaps in the changed body, or holds the body back until it is complete.
    pub fn filter_body(
        &mut self,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        models: &Models,
    ) -> Result<()> {
        match &mut self.body {
            Body::Original => Ok(()),
            Body::Replaced(replacement) => {
                // Pingora replays the retry buffer (the client's bytes) in one piece.
                if body.is_some() || end_of_stream {
                    *body = Some(replacement.clone());
                }
                Ok(())
            }
            Body::Held(held) => {
                if let Some(chunk) = body.as_ref() {
                    held.extend_from_slice(chunk);
                }
                if !end_of_stream {
                    // An empty chunk tells Pingora "nothing yet"; `None` would end the body.
                    *body = Some(Bytes::new());
                    return Ok(());
                }
                let complete = std::mem::take(held).freeze();
                match self.apply(&complete, models) {
                    Next::Proxy => {
                        *body = Some(match std::mem::replace(&mut self.body, Body::Original) {
                            Body::Replaced(changed) => changed,
                            _ => complete,
                        });
                        Ok(())
                    }
                    Next::Refuse(_) => {
                        Error::e_explain(ErrorType::HTTPStatus(400), "request body refused")
                    }
                }
            }
        }
    }

    /// Starts counting usage for a response, if its encoding can be read.
    pub fn response_started(&mut self, response: &ResponseHeader, event_stream: bool) {
        let framing = if event_stream {
            Framing::EventStream
        } else {
            Framing::Json
        };
        let encoding = response
            .headers
            .get(http::header::CONTENT_ENCODING)
            .map(|v| v.as_bytes());
        self.usage = Encoding::from_header(encoding).map(|e| UsageScanner::new(framing, e));
    }

    /// Reads a response chunk as it passes: the chunk itself is not touched.
    pub fn response_chunk(&mut self, chunk: &[u8]) {
        if let Some(scanner) = &mut self.usage {
            scanner.feed(chunk);
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        self.usage.as_ref().and_then(|s| s.usage())
    }
}

/// A well-formed Content-Length and no Transfer-Encoding (`decide` already refused a malformed
/// one, and Pingora drops the length when both are sent).
fn declared_length(req: &RequestHeader) -> Option<u64> {
    if req.headers.contains_key(http::header::TRANSFER_ENCODING) {
        return None;
    }
    req.headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn expects_continue(req: &RequestHeader) -> bool {
    req.headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}
