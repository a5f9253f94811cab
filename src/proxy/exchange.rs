//! The request-flow side of services with an `api`: reading the body of an endpoint the
//! gateway reads (chat, completions, embeddings, Responses, Messages), validating it and
//! applying the model policy before anything reaches the upstream, then metering the response
//! as it streams past (`metered.rs`).
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
//!
//! Either way the body sits in memory whole, so it is bounded three ways ([`Buffering`]): by
//! size (413 past `max_buffered_body_bytes`), by the memory of all such bodies at once and of
//! one caller's (503 when `buffered_bodies_max_bytes` or `buffered_bytes_per_caller` cannot
//! cover it, reserved as its bytes arrive and before they are allocated, never from a declared
//! length), and by time (408 when it is not complete `buffered_body_timeout_seconds` after the
//! request head, however it trickles in).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::{Error, ErrorSource, ErrorType, Result};

use super::budget::{Budget, Reservation};
use super::held::Held;
use super::metered::Metered;
use crate::access_log;
use crate::api::{self, BodyError, CapRule, Edit, Endpoint, Models};
use crate::auth::Principal;
use crate::config::BufferLimits;
use crate::errors::GatewayError;

/// Pingora's retry buffer (`BODY_BUF_LIMIT` in pingora-core): a body read ahead is only
/// replayed to the upstream if it fits.
pub(crate) const READ_AHEAD_MAX: u64 = 64 * 1024;

/// The bounds on bodies read whole, from `[server]`.
pub(crate) struct Buffering {
    /// `buffered_bodies_max_bytes`, shared by every request.
    budget: Arc<Budget>,
    /// `max_buffered_body_bytes`.
    max_body: u64,
    /// `buffered_body_timeout_seconds`.
    timeout: Duration,
}

impl Buffering {
    pub(crate) fn new(limits: &BufferLimits) -> Buffering {
        Buffering {
            budget: Budget::with_caller_limit(limits.total, limits.per_caller),
            max_body: limits.max_body,
            timeout: limits.timeout,
        }
    }
}

/// What one exchange on an endpoint the gateway reads carries.
pub(crate) struct Exchange {
    pub endpoint: Endpoint,
    body: Body,
    /// The model after the policy, as the access log shows it (cut to 256 bytes).
    pub model: Option<String>,
    /// Set when the body was refused; told to the client in the 400 (or 403).
    pub error: Option<BodyError>,
    /// How a refused body is answered: 400, or 403 for a background Responses request.
    refused_as: GatewayError,
    /// The response's usage, read as it passes.
    pub metered: Metered,
    /// What the budgets need once the body is checked: its size, and the completion tokens
    /// it may use as it states them.
    pub ask: Option<(u64, Option<u64>)>,
    /// With `balance = "prefix_affinity"`: the hash of the conversation's start
    /// (`replicas::prefix`), from a body read ahead or the first bytes of a held one.
    pub affinity_key: Option<u64>,
    /// The memory of a body read ahead: Pingora keeps the client's bytes in its retry buffer
    /// until the request ends, so this is held as long.
    reserved: Option<Reservation>,
    /// The caller has a token budget: a body stating no completion cap gets the budgets' one.
    capped: bool,
}

enum Body {
    /// Read ahead and unchanged: the retry buffer goes upstream as it is.
    Original,
    /// Read ahead and changed by the policy.
    Replaced(Bytes),
    /// Being held back until complete, by this time.
    Held(Held, Deadline),
}

/// When a body read whole must be complete; no read may wait past it.
#[derive(Clone, Copy)]
struct Deadline {
    at: Instant,
    /// Pingora's own per-read timeout, which the deadline only ever shortens.
    per_read: Option<Duration>,
}

/// What `request_filter` does next.
pub(crate) enum Next {
    Proxy,
    Refuse(GatewayError),
}

impl Exchange {
    /// Reads the body ahead when it is small enough to be replayed, else arranges to hold it.
    /// `keyed`: the service balances by affinity, so a chat or completions body gives its key.
    pub(crate) async fn begin(
        session: &mut Session,
        endpoint: Endpoint,
        models: &Models,
        cap: Option<&CapRule>,
        caller: Option<&Arc<Principal>>,
        bounds: &Buffering,
        keyed: bool,
    ) -> Result<(Exchange, Next)> {
        let mut exchange = Exchange {
            capped: cap.is_some(),
            refused_as: GatewayError::InvalidBody,
            endpoint,
            body: Body::Original,
            model: None,
            error: None,
            metered: Metered::default(),
            ask: None,
            affinity_key: None,
            reserved: None,
        };
        let refuse = |exchange, e| Ok((exchange, Next::Refuse(e)));
        // Embeddings and token counts have no conversation to keep together: least_requests
        // places them. Chat, completions, Responses and Messages do.
        let keyed = keyed && endpoint.generates();
        let declared = declared_length(session.req_header());
        if declared.is_some_and(|len| len > bounds.max_body) {
            return refuse(exchange, GatewayError::PayloadTooLarge);
        }
        let deadline = Deadline {
            at: Instant::now() + bounds.timeout,
            per_read: session.get_read_timeout(),
        };
        let Some(len) = declared.filter(|&len| len <= READ_AHEAD_MAX) else {
            let declared = declared.map(|len| len as usize);
            let max = bounds.max_body as usize;
            let room = max_growth(endpoint, models, cap);
            return match Held::new(&bounds.budget, caller, declared, max, room) {
                Ok(held) => {
                    exchange.body = Body::Held(held, deadline);
                    if keyed {
                        match exchange.read_start(session, deadline, bounds, caller).await {
                            Ok(()) => {}
                            Err(e) if *e.etype() == ErrorType::ReadTimedout => {
                                return refuse(exchange, GatewayError::RequestTimeout)
                            }
                            Err(e) => return Err(e),
                        }
                        if exchange.reserved.is_none() {
                            return refuse(exchange, GatewayError::Overloaded);
                        }
                    }
                    deadline.limit_next_read(session)?;
                    Ok((exchange, Next::Proxy))
                }
                Err(e) => refuse(exchange, e),
            };
        };
        // Pingora's retry-buffer copy, the copy read here, and the changed copy if the policy
        // can change a body; what is not kept is given back once the policy has run.
        let growth = max_growth(endpoint, models, cap) as u64;
        let changed = if growth > 0 { len + growth } else { 0 };
        if expects_continue(session.req_header()) {
            // The client waits for this before sending the body we are about to read.
            session.write_continue_response().await?;
        }
        session.enable_retry_buffering();
        let body = match read_ahead(session, len, deadline).await {
            Ok(body) => body,
            Err(e) if *e.etype() == ErrorType::ReadTimedout => {
                return refuse(exchange, GatewayError::RequestTimeout)
            }
            Err(e) => return Err(e),
        };
        // Reserved once the bytes are here, not from the declared length: a head that
        // declares a body and sends none holds nothing.
        let Some(reserved) = bounds.budget.reserve(caller, 2 * len + changed) else {
            return refuse(exchange, GatewayError::Overloaded);
        };
        exchange.reserved = Some(reserved);
        let next = exchange.apply(&body, models, cap);
        if keyed && matches!(next, Next::Proxy) {
            // The client's bytes, before the policy's edit: what every turn sends alike.
            exchange.affinity_key = api::affinity_body_key(&body);
        }
        let kept = match &exchange.body {
            Body::Replaced(changed) => len + changed.len() as u64,
            _ => len,
        };
        if let Some(reserved) = &mut exchange.reserved {
            reserved.shrink_to(kept);
        }
        Ok((exchange, next))
    }

    /// A held body's affinity key, before the replica is chosen: its first bytes (as many as
    /// `api::affinity_body_key` may look at) are read now, into Pingora's retry buffer, which
    /// replays them through `request_body_filter` into the held body like any chunk. Reads
    /// start at 4 KiB and double only when filled, so stopping at 32 KiB stays within the
    /// buffer's 64 KiB. `reserved` stays unset when the budget cannot cover that buffer.
    async fn read_start(
        &mut self,
        session: &mut Session,
        deadline: Deadline,
        bounds: &Buffering,
        caller: Option<&Arc<Principal>>,
    ) -> Result<()> {
        let Some(reserved) = bounds.budget.reserve(caller, READ_AHEAD_MAX) else {
            return Ok(());
        };
        self.reserved = Some(reserved);
        if expects_continue(session.req_header()) {
            session.write_continue_response().await?;
        }
        session.enable_retry_buffering();
        let want = 2 * api::CONVERSATION_WINDOW;
        deadline.limit_next_read(session)?;
        let mut start = session.read_request_body().await?.unwrap_or_default();
        if start.len() < want {
            let mut more = BytesMut::from(&start[..]);
            while more.len() < want {
                deadline.limit_next_read(session)?;
                match session.read_request_body().await? {
                    Some(chunk) => more.extend_from_slice(&chunk),
                    None => break,
                }
            }
            start = more.freeze();
        }
        if session.as_ref().retry_buffer_truncated() {
            // Pingora would send no body at all: refuse rather than forward an empty one.
            return Error::e_explain(ErrorType::HTTPStatus(503), "retry buffer overflowed");
        }
        self.affinity_key = api::affinity_body_key(&start);
        Ok(())
    }

    /// Applies the policy to a body read ahead: a changed body is a new copy.
    fn apply(&mut self, body: &[u8], models: &Models, cap: Option<&CapRule>) -> Next {
        let Some(edit) = self.plan(body, models, cap) else {
            return Next::Refuse(self.refused_as);
        };
        if let Some(edit) = edit {
            self.body = Body::Replaced(Bytes::from(edit.applied_to(body)));
        }
        Next::Proxy
    }

    /// Checks a complete body and keeps its model: the edit the policy makes, if any, or
    /// None when the body is refused (the reason kept for the 400).
    fn plan<'m>(
        &mut self,
        body: &[u8],
        models: &'m Models,
        cap: Option<&'m CapRule>,
    ) -> Option<Option<Edit<'m>>> {
        let cap = cap.filter(|_| self.capped);
        match api::plan_capped(self.endpoint, body, models, cap) {
            // Generated server-side and fetched by calls the gateway does not meter.
            Ok(plan) if plan.background && self.capped => {
                self.refused_as = GatewayError::EndpointNotMetered;
                self.error = Some(BodyError::new(
                    "a background response is not metered by the gateway, and this caller has \
                     a token budget: send it without \"background\": true"
                        .into(),
                ));
                None
            }
            Ok(plan) => {
                // The access log is the name's only reader: only what it shows is copied.
                self.model = plan.model.map(|m| access_log::model_name(&m).to_owned());
                let usage_at = self.endpoint.spec().usage;
                (self.metered).request_read(body.len(), plan.usage.is_some(), usage_at);
                self.ask = Some((body.len() as u64, plan.completion_cap));
                Some(Edit::merge(plan.edit, plan.usage))
            }
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }

    /// Framing for the body the upstream will get, and the codings it may answer in.
    pub(crate) fn frame_upstream(&self, upstream: &mut RequestHeader) -> Result<()> {
        self.metered.limit_codings(upstream)?;
        match &self.body {
            Body::Original => {}
            Body::Replaced(body) => {
                upstream.insert_header(http::header::CONTENT_LENGTH, body.len())?;
            }
            // Without a length Pingora frames the body chunked.
            Body::Held(..) => {
                upstream.remove_header(&http::header::CONTENT_LENGTH);
            }
        }
        Ok(())
    }

    /// Swaps in the changed body, or holds the body back until it is complete.
    pub(crate) fn filter_body(
        &mut self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        models: &Models,
        cap: Option<&CapRule>,
    ) -> Result<()> {
        let (held, deadline) = match &mut self.body {
            Body::Original => return Ok(()),
            Body::Replaced(replacement) => {
                // Pingora replays the retry buffer (the client's bytes) in one piece.
                if body.is_some() || end_of_stream {
                    *body = Some(replacement.clone());
                }
                return Ok(());
            }
            Body::Held(held, deadline) => (held, *deadline),
        };
        if let Some(chunk) = body.as_ref() {
            held.push(chunk).or_else(refused)?;
        }
        if !end_of_stream {
            deadline.limit_next_read(session)?;
            // An empty chunk tells Pingora "nothing yet"; `None` would end the body.
            *body = Some(Bytes::new());
            return Ok(());
        }
        let Body::Held(mut held, _) = std::mem::replace(&mut self.body, Body::Original) else {
            unreachable!("matched as held above");
        };
        let Some(edit) = self.plan(held.bytes(), models, cap) else {
            return Error::e_explain(ErrorType::HTTPStatus(400), "request body refused");
        };
        if let Some(edit) = edit {
            held.edit(&edit).or_else(refused)?;
        }
        *body = Some(held.into_bytes());
        Ok(())
    }

    /// The gateway's own answer to a failure while this exchange was under way, if it has
    /// one: the 400 of a refused body, or the 408 of a held body that did not arrive in time.
    pub(crate) fn failure(&self, e: &Error) -> Option<GatewayError> {
        if self.error.is_some() {
            return Some(self.refused_as);
        }
        let client_too_slow =
            *e.etype() == ErrorType::ReadTimedout && *e.esource() == ErrorSource::Downstream;
        (client_too_slow && matches!(self.body, Body::Held(..)))
            .then_some(GatewayError::RequestTimeout)
    }
}

impl Deadline {
    /// Gives the next read of the body no longer than the deadline leaves.
    fn limit_next_read(self, session: &mut Session) -> Result<()> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let e = Error::explain(ErrorType::ReadTimedout, "request body deadline passed");
            return Err(e.into_down());
        }
        session.set_read_timeout(Some(self.per_read.map_or(left, |p| p.min(left))));
        Ok(())
    }
}

/// Reads a declared body of `len` bytes whole, before any upstream is contacted.
async fn read_ahead(session: &mut Session, len: u64, deadline: Deadline) -> Result<Bytes> {
    deadline.limit_next_read(session)?;
    // Usually the whole body comes in one read: then it is used as it is, not copied.
    let first = session.read_request_body().await?.unwrap_or_default();
    deadline.limit_next_read(session)?;
    let Some(second) = session.read_request_body().await? else {
        return Ok(first);
    };
    let mut all = BytesMut::with_capacity(len as usize);
    all.extend_from_slice(&first);
    all.extend_from_slice(&second);
    loop {
        deadline.limit_next_read(session)?;
        match session.read_request_body().await? {
            Some(chunk) => all.extend_from_slice(&chunk),
            None => return Ok(all.freeze()),
        }
    }
}

/// The most bytes the gateway may add to a body of `endpoint`: the model policy's edit, and
/// `stream_options` on the endpoints that stream.
fn max_growth(endpoint: Endpoint, models: &Models, cap: Option<&CapRule>) -> usize {
    let usage = match endpoint.spec().usage_on_request {
        true => api::USAGE_MAX_GROWTH,
        false => 0,
    };
    models.max_growth() + usage + cap.map_or(0, CapRule::max_growth)
}

/// A held body that cannot grow, as the error that ends the proxy attempt (`local::failed`
/// answers it).
fn refused(e: GatewayError) -> Result<()> {
    Error::e_explain(
        ErrorType::HTTPStatus(e.status()),
        "held request body refused",
    )
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
