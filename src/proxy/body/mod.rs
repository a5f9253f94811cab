//! Step 5, the body: on an endpoint the gateway reads (`api::Endpoint`), the body is read
//! whole and handed to the call's `api::Exchange`, which checks it and plans the model
//! policy's edit, before anything reaches the upstream. This module is the Pingora side of
//! that: how the bytes are got, held, bounded and swapped.
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

use super::{budget, Gateway, RequestCtx, Stop};
use crate::api::{self, CapRule, Endpoint, Exchange, Models, Pair};
use crate::auth::Principal;
use crate::config::BufferLimits;
use crate::errors::GatewayError;
use held::Held;
use pool::{Claim, MemoryPool};

mod held;
mod pool;

/// Pingora's retry buffer (`BODY_BUF_LIMIT` in pingora-core): a body read ahead is only
/// replayed to the upstream if it fits.
pub(crate) const READ_AHEAD_MAX: u64 = 64 * 1024;

/// The bounds on bodies read whole, from `[server]`.
pub(crate) struct Buffering {
    /// `buffered_bodies_max_bytes`, shared by every request.
    pool: Arc<MemoryPool>,
    /// `max_buffered_body_bytes`.
    max_body: u64,
    /// `buffered_body_timeout_seconds`.
    timeout: Duration,
}

impl Buffering {
    pub(crate) fn new(limits: &BufferLimits) -> Buffering {
        Buffering {
            pool: MemoryPool::with_caller_limit(limits.total, limits.per_caller),
            max_body: limits.max_body,
            timeout: limits.timeout,
        }
    }
}

/// A call on an endpoint the gateway reads: the API's side of it, and its body as Pingora
/// moves it.
pub(crate) struct Body {
    pub(crate) exchange: Exchange,
    state: State,
    /// The memory of a body read ahead: Pingora keeps the client's bytes in its retry buffer
    /// until the request ends, so this is held as long.
    reserved: Option<Claim>,
}

enum State {
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

/// The call, once its body is read ahead and checked (or arranged to be held); `Err`: the
/// gateway's answer instead (`Body` kept for the refusal's message), or Pingora's error.
type Begun = Result<Box<Body>, (Option<Box<Body>>, Refused)>;

/// Why a call does not go on.
enum Refused {
    Answer(GatewayError),
    Failed(Box<Error>),
}

/// What the body step needs of the request.
struct Call<'a> {
    endpoint: Endpoint,
    models: &'a Models,
    /// The completion cap the caller's token budget needs, if it has one.
    cap: Option<&'a CapRule>,
    caller: Option<&'a Arc<Principal>>,
    /// The service balances by affinity: a generating call gives its key.
    keyed: bool,
    /// The service translates this endpoint to another API's.
    translate: Option<Pair>,
}

/// Step 5 on the request head: on an endpoint the gateway reads, the body is read ahead and
/// checked, or arranged to be held until complete.
pub(super) async fn read(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
) -> Result<(), Stop> {
    let Some((endpoint, route)) = ctx.endpoint.zip(gw.route(ctx)) else {
        return Ok(());
    };
    let Some(models) = route.models() else {
        return Ok(());
    };
    // The pair the service translates the client's `endpoint` by, if any.
    let translated = |client| {
        let pairs = route.settings.translate.iter();
        pairs.copied().find(|pair| pair.client() == client)
    };
    if endpoint == Endpoint::CountTokens && translated(Endpoint::Messages).is_some() {
        // The upstream speaks another API, which counts no Messages: counted here.
        let per_token = gw
            .budgets
            .as_deref()
            .map_or(4, |b| b.prompt_bytes_per_token());
        return count_here(session, models, ctx, &gw.buffering, per_token).await;
    }
    let call = Call {
        endpoint,
        models,
        cap: budget::cap_rule(gw, ctx),
        caller: ctx.principal.as_ref(),
        keyed: route.replicas.keyed(),
        translate: translated(endpoint),
    };
    match begin(session, call, &gw.buffering).await {
        Ok(body) => {
            ctx.body = Some(body);
            Ok(())
        }
        Err((body, Refused::Answer(e))) => {
            ctx.body = body;
            Err(Stop::Refused(e))
        }
        Err((_, Refused::Failed(e))) => Err(Stop::Failed(e)),
    }
}

/// A token count answered by the gateway (`count_tokens` on a service that translates
/// Messages): the body read whole (never forwarded), checked, and counted from its size as the
/// budgets estimate a prompt.
async fn count_here(
    session: &mut Session,
    models: &Models,
    ctx: &mut RequestCtx,
    bounds: &Buffering,
    bytes_per_token: u64,
) -> Result<(), Stop> {
    let failed = |e: Box<Error>| match e.etype() {
        ErrorType::ReadTimedout => Stop::Refused(GatewayError::RequestTimeout),
        _ => Stop::Failed(e),
    };
    let mut claim = (bounds.pool.reserve(ctx.principal.as_ref(), 0))
        .ok_or(Stop::Refused(GatewayError::Overloaded))?;
    let deadline = Deadline {
        at: Instant::now() + bounds.timeout,
        per_read: session.get_read_timeout(),
    };
    if expects_continue(session.req_header()) {
        session.write_continue_response().await.map_err(failed)?;
    }
    let mut whole = BytesMut::new();
    loop {
        deadline.limit_next_read(session).map_err(failed)?;
        let Some(chunk) = session.read_request_body().await.map_err(failed)? else {
            break;
        };
        if (whole.len() + chunk.len()) as u64 > bounds.max_body {
            return Err(Stop::Refused(GatewayError::PayloadTooLarge));
        }
        if !claim.grow(chunk.len() as u64) {
            return Err(Stop::Refused(GatewayError::Overloaded));
        }
        whole.extend_from_slice(&chunk);
    }
    let mut body = Box::new(Body {
        exchange: Exchange::new(Endpoint::CountTokens, false, None),
        state: State::Original,
        reserved: None,
    });
    let checked = body.exchange.plan(&whole, models, None).is_some();
    let refused = body.exchange.refusal().map(|(as_, _)| as_);
    ctx.body = Some(body);
    match (checked, refused) {
        (true, _) => Err(Stop::Counted(
            (whole.len() as u64).div_ceil(bytes_per_token.max(1)),
        )),
        (false, e) => Err(Stop::Refused(e.unwrap_or(GatewayError::InvalidBody))),
    }
}

/// Step 5 on each chunk of the body: a changed body swapped in, a held one held until
/// complete, then checked.
pub(super) fn filter(
    gw: &Gateway,
    session: &mut Session,
    chunk: &mut Option<Bytes>,
    end_of_stream: bool,
    ctx: &mut RequestCtx,
) -> Result<()> {
    let models = gw.models(ctx);
    if let (Some(body), Some(models)) = (&mut ctx.body, models) {
        let cap = gw
            .budgets
            .as_deref()
            .map(crate::limits::budgets::Budgets::cap_rule);
        body.filter_body(session, chunk, end_of_stream, models, cap)?;
    }
    Ok(())
}

/// The framing of the body the upstream gets, and the codings its answer may come in.
pub(super) fn frame_upstream(upstream: &mut RequestHeader, ctx: &RequestCtx) -> Result<()> {
    match &ctx.body {
        Some(body) => body.frame_upstream(upstream),
        None => Ok(()),
    }
}

/// Reads the body ahead when it is small enough to be replayed, else arranges to hold it.
async fn begin(session: &mut Session, call: Call<'_>, bounds: &Buffering) -> Begun {
    let mut body = Box::new(Body {
        exchange: Exchange::new(call.endpoint, call.cap.is_some(), call.translate),
        state: State::Original,
        reserved: None,
    });
    match body.begin(session, &call, bounds).await {
        Ok(None) => Ok(body),
        Ok(Some(e)) => Err((Some(body), Refused::Answer(e))),
        Err(e) => Err((Some(body), Refused::Failed(e))),
    }
}

impl Body {
    /// `Ok(Some(e))`: refused with `e`.
    async fn begin(
        &mut self,
        session: &mut Session,
        call: &Call<'_>,
        bounds: &Buffering,
    ) -> Result<Option<GatewayError>> {
        let (models, cap, caller) = (call.models, call.cap, call.caller);
        // Embeddings and token counts have no conversation to keep together: least_requests
        // places them. Chat, completions, Responses and Messages do.
        let keyed = call.keyed && call.endpoint.generates();
        let declared = declared_length(session.req_header());
        if declared.is_some_and(|len| len > bounds.max_body) {
            return Ok(Some(GatewayError::PayloadTooLarge));
        }
        let deadline = Deadline {
            at: Instant::now() + bounds.timeout,
            per_read: session.get_read_timeout(),
        };
        let room = self.exchange.max_growth(models, cap);
        let Some(len) = declared.filter(|&len| len <= READ_AHEAD_MAX) else {
            let declared = declared.map(|len| len as usize);
            let max = bounds.max_body as usize;
            return match Held::new(&bounds.pool, caller, declared, max, room) {
                Ok(held) => {
                    self.state = State::Held(held, deadline);
                    if keyed {
                        match self.read_start(session, deadline, bounds, caller).await {
                            Ok(()) => {}
                            Err(e) if *e.etype() == ErrorType::ReadTimedout => {
                                return Ok(Some(GatewayError::RequestTimeout))
                            }
                            Err(e) => return Err(e),
                        }
                        if self.reserved.is_none() {
                            return Ok(Some(GatewayError::Overloaded));
                        }
                    }
                    deadline.limit_next_read(session)?;
                    Ok(None)
                }
                Err(e) => Ok(Some(e)),
            };
        };
        // Pingora's retry-buffer copy, the copy read here, and the changed copy if the policy
        // can change a body; what is not kept is given back once the policy has run.
        let growth = room as u64;
        let changed = if growth > 0 { len + growth } else { 0 };
        if expects_continue(session.req_header()) {
            // The client waits for this before sending the body we are about to read.
            session.write_continue_response().await?;
        }
        session.enable_retry_buffering();
        let body = match read_ahead(session, len, deadline).await {
            Ok(body) => body,
            Err(e) if *e.etype() == ErrorType::ReadTimedout => {
                return Ok(Some(GatewayError::RequestTimeout))
            }
            Err(e) => return Err(e),
        };
        // Reserved once the bytes are here, not from the declared length: a head that
        // declares a body and sends none holds nothing.
        let Some(reserved) = bounds.pool.reserve(caller, 2 * len + changed) else {
            return Ok(Some(GatewayError::Overloaded));
        };
        self.reserved = Some(reserved);
        let Some(edit) = self.exchange.plan(&body, models, cap) else {
            return Ok(self.exchange.refusal().map(|(as_, _)| as_));
        };
        if let Some(edit) = edit {
            self.state = State::Replaced(Bytes::from(edit.applied_to(&body)));
        }
        if self.exchange.translation().is_some() {
            let checked = match &self.state {
                State::Replaced(edited) => edited.clone(),
                _ => body.clone(),
            };
            let Some(converted) = self.exchange.translate_request(&checked) else {
                return Ok(self.exchange.refusal().map(|(as_, _)| as_));
            };
            self.state = State::Replaced(Bytes::from(converted));
        }
        if keyed {
            // The client's bytes, before the policy's edit: what every turn sends alike.
            self.exchange.affinity_key = api::affinity_body_key(&body);
        }
        let kept = match &self.state {
            State::Replaced(changed) => len + changed.len() as u64,
            _ => len,
        };
        if let Some(reserved) = &mut self.reserved {
            reserved.shrink_to(kept);
        }
        Ok(None)
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
        let Some(reserved) = bounds.pool.reserve(caller, READ_AHEAD_MAX) else {
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
        self.exchange.affinity_key = api::affinity_body_key(&start);
        Ok(())
    }

    /// Framing for the body the upstream will get, and the codings it may answer in.
    fn frame_upstream(&self, upstream: &mut RequestHeader) -> Result<()> {
        self.exchange.upstream_head(upstream)?;
        match &self.state {
            State::Original => {}
            State::Replaced(body) => {
                upstream.insert_header(http::header::CONTENT_LENGTH, body.len())?;
            }
            // Without a length Pingora frames the body chunked.
            State::Held(..) => {
                upstream.remove_header(&http::header::CONTENT_LENGTH);
            }
        }
        Ok(())
    }

    /// Swaps in the changed body, or holds the body back until it is complete.
    fn filter_body(
        &mut self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        models: &Models,
        cap: Option<&CapRule>,
    ) -> Result<()> {
        let (held, deadline) = match &mut self.state {
            State::Original => return Ok(()),
            State::Replaced(replacement) => {
                // Pingora replays the retry buffer (the client's bytes) in one piece.
                if body.is_some() || end_of_stream {
                    *body = Some(replacement.clone());
                }
                return Ok(());
            }
            State::Held(held, deadline) => (held, *deadline),
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
        let State::Held(mut held, _) = std::mem::replace(&mut self.state, State::Original) else {
            unreachable!("matched as held above");
        };
        let Some(edit) = self.exchange.plan(held.bytes(), models, cap) else {
            return Error::e_explain(ErrorType::HTTPStatus(400), "request body refused");
        };
        if let Some(edit) = edit {
            held.edit(&edit).or_else(refused)?;
        }
        let whole = held.into_bytes();
        *body = Some(match self.exchange.translation() {
            None => whole,
            Some(_) => match self.exchange.translate_request(&whole) {
                Some(converted) => Bytes::from(converted),
                None => return Error::e_explain(ErrorType::HTTPStatus(400), "not translatable"),
            },
        });
        Ok(())
    }

    /// The gateway's own answer to a failure while this exchange was under way, if it has
    /// one: the 400 of a refused body, or the 408 of a held body that did not arrive in time.
    pub(crate) fn failure(&self, e: &Error) -> Option<GatewayError> {
        if let Some((refused_as, _)) = self.exchange.refusal() {
            return Some(refused_as);
        }
        let client_too_slow =
            *e.etype() == ErrorType::ReadTimedout && *e.esource() == ErrorSource::Downstream;
        (client_too_slow && matches!(self.state, State::Held(..)))
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

/// A held body that cannot grow, as the error that ends the proxy attempt (`answers::failed`
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
