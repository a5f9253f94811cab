//! Step 9, respond: Pingora relays the answer chunk by chunk as it comes (nothing buffers a
//! stream); on the side the call's `api::Exchange` reads its usage, and the answer's head is
//! cleaned of what the gateway never lets through (cookies, session headers).

use std::time::Duration;

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::Result;

use super::{headers, Gateway, RequestCtx};

/// The answer's head, as the upstream sent it.
pub(super) fn head(
    gw: &Gateway,
    session: &Session,
    response: &mut ResponseHeader,
    ctx: &mut RequestCtx,
) -> Result<()> {
    ctx.upstream_ttfb = ctx.upstream_sent.map(|t| t.elapsed());
    let event_stream = headers::is_event_stream(response);
    if event_stream && !ctx.streaming {
        ctx.streaming = true;
        gw.metrics.stream_started(gw.service_label(ctx));
    }
    if let Some(exchange) = ctx.exchange_mut() {
        let client = session.req_header().version;
        exchange.response_head(response, event_stream, client)?;
    }
    Ok(())
}

/// Each chunk goes on at once, untouched but for what the gateway's own `include_usage`
/// added; its usage is read as it passes.
pub(super) fn chunk(body: &mut Option<Bytes>, end_of_stream: bool, ctx: &mut RequestCtx) {
    if let Some(exchange) = ctx.exchange_mut() {
        exchange.response_chunk(body, end_of_stream);
    }
}

/// The client left before the usage report: read on for it (metered answers only).
pub(super) fn tail(tail: Option<Duration>, ctx: &RequestCtx) -> Option<Duration> {
    ctx.exchange()
        .and_then(|x| x.usage_pending().then_some(tail?))
}

/// The head the client gets: cleaned, and with the request's id.
pub(super) fn clean(response: &mut ResponseHeader, ctx: &RequestCtx) -> Result<()> {
    headers::to_client(response, ctx.request_id.as_str())
}
