//! Answers the gateway writes itself: `/healthz`, refusals, and the error that ends a failed
//! proxy attempt. Each records its status in the context for the metrics and the log.

use bytes::Bytes;
use http::Method;
use pingora::http::ResponseHeader;
use pingora::proxy::{FailToProxy, Session};
use pingora::{Error, ErrorSource, ErrorType, Result};

use super::budget::{write_quota, BudgetStop};
use super::RequestCtx;
use crate::api;
use crate::errors::{write_local, GatewayError};

pub(crate) async fn health(session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
    ok_json(session, ctx, Bytes::from_static(br#"{"status":"ok"}"#)).await
}

/// A token count the gateway makes itself: Messages' `{"input_tokens": N}`.
pub(crate) async fn counted(
    session: &mut Session,
    ctx: &mut RequestCtx,
    tokens: u64,
) -> Result<bool> {
    let body = Bytes::from(format!("{{\"input_tokens\":{tokens}}}"));
    ok_json(session, ctx, body).await
}

/// A 200 the gateway answers itself, never cached.
async fn ok_json(session: &mut Session, ctx: &mut RequestCtx, body: Bytes) -> Result<bool> {
    let mut h = ResponseHeader::build(200, Some(4))?;
    h.insert_header("content-type", "application/json")?;
    h.insert_header("content-length", body.len())?;
    h.insert_header("cache-control", "no-store")?;
    h.insert_header("x-request-id", ctx.request_id.as_str())?;
    ctx.local_status = Some(200);
    let head_only = session.req_header().method == Method::HEAD;
    write_local(session, h, body, head_only).await?;
    Ok(true)
}

pub(crate) async fn reject(
    session: &mut Session,
    ctx: &mut RequestCtx,
    e: GatewayError,
) -> Result<bool> {
    // Never drain an unread body just to keep the connection; and every 401 closes,
    // so all of them look alike and guessing costs a new connection.
    // CONNECT would turn the connection into a tunnel: never read on after refusing it.
    if e == GatewayError::Unauthorized
        || !session.is_body_done()
        || session.req_header().method == Method::CONNECT
    {
        session.set_keepalive(None);
    }
    let head_only = session.req_header().method == Method::HEAD;
    ctx.local_status = Some(e.status());
    let forward = &session.req_header().raw_path()[ctx.forward_from..];
    let not_metered = (e == GatewayError::EndpointNotMetered && ctx.body.is_none())
        .then(|| api::unmetered_refusal(forward));
    let message = match &not_metered {
        Some(m) => Some(m.as_str()),
        None => refused_body(ctx),
    };
    e.respond_with_message(session, ctx.request_id.as_str(), head_only, message)
        .await?;
    Ok(true)
}

/// `429 budget_exceeded`, naming the window, with `Retry-After` and the window's
/// `x-ratelimit-*` headers; or `503 budget_unavailable`.
pub(crate) async fn over_budget(
    session: &mut Session,
    ctx: &mut RequestCtx,
    stop: &BudgetStop,
) -> Result<bool> {
    if !session.is_body_done() {
        session.set_keepalive(None);
    }
    let refusal = match stop {
        BudgetStop::Over(refusal) => refusal,
        BudgetStop::Unavailable => {
            return reject(session, ctx, GatewayError::BudgetUnavailable).await
        }
        BudgetStop::Unpriced(message) => {
            let e = GatewayError::ModelUnpriced;
            ctx.local_status = Some(e.status());
            let head_only = session.req_header().method == Method::HEAD;
            let id = ctx.request_id.as_str();
            e.respond_with_message(session, id, head_only, Some(message))
                .await?;
            return Ok(true);
        }
    };
    let e = GatewayError::BudgetExceeded(refusal.retry_after);
    ctx.local_status = Some(e.status());
    let head_only = session.req_header().method == Method::HEAD;
    let message = Some(refusal.message.as_str());
    e.respond_with(session, ctx.request_id.as_str(), head_only, message, |h| {
        // A window that ends in more than a minute will not have room by an SDK's retry:
        // the OpenAI SDKs honour this rather than retrying (Node's would sleep out a
        // Retry-After of hours).
        if refusal.retry_after > 60 {
            h.insert_header("x-should-retry", "false")?;
        }
        write_quota(h, &refusal.quota)
    })
    .await?;
    Ok(true)
}

/// The answer to a proxy attempt that failed: a refused body's 400, a held body's 408, 413
/// or 503, or the upstream's 502/504.
pub(crate) async fn failed(session: &mut Session, e: &Error, ctx: &mut RequestCtx) -> FailToProxy {
    // Pingora closes the client's connection after a failed proxy attempt whatever this
    // returns (it reuses it only after an error before proxying), so the answer must say
    // `Connection: close`: a client told keep-alive would send its next request into a reset.
    session.set_keepalive(None);
    if let Some(stop) = ctx.budget_refusal.take() {
        ctx.refused_held = true;
        // A held body's request, refused for its budget before any body byte went upstream.
        if let Err(write_err) = over_budget(session, ctx, &stop).await {
            log::debug!("could not send error response: {write_err}");
        }
        return FailToProxy {
            error_code: ctx.local_status.unwrap_or(429),
            can_reuse_downstream: false,
        };
    }
    if session.response_written().is_some() {
        // A translated stream the upstream cut: the client's stream ends in its dialect's
        // error form rather than in a bare reset.
        if let Some(tail) = ctx.exchange_mut().and_then(|x| x.upstream_failed()) {
            if let Err(write_err) = session.write_response_body(Some(tail), true).await {
                log::debug!("could not end the translated stream: {write_err}");
            }
        }
    }
    let error = (ctx.body.as_ref().and_then(|b| b.failure(e)))
        .or_else(|| GatewayError::from_proxy_error(e));
    let Some(error) = error else {
        return FailToProxy {
            error_code: 0,
            can_reuse_downstream: false,
        };
    };
    // The gateway's own refusal of a held body: the upstream saw a head, never a request.
    ctx.refused_held = matches!(
        error,
        GatewayError::InvalidBody
            | GatewayError::EndpointNotMetered
            | GatewayError::RequestTimeout
            | GatewayError::PayloadTooLarge
            | GatewayError::Overloaded
            | GatewayError::BudgetUnavailable
    ) && session.response_written().is_none();
    // Once a response has started, all that can be done is to cut it.
    if session.response_written().is_none() {
        let head_only = session.req_header().method == Method::HEAD;
        let message = refused_body(ctx);
        if let Err(write_err) = error
            .respond_with_message(session, ctx.request_id.as_str(), head_only, message)
            .await
        {
            log::debug!("could not send error response: {write_err}");
        }
    }
    ctx.local_status = Some(error.status());
    FailToProxy {
        error_code: error.status(),
        can_reuse_downstream: false,
    }
}

/// A bounded label for an upstream failure; `None` when the failure was not the upstream's.
pub(crate) fn upstream_error_kind(e: &Error) -> Option<&'static str> {
    use ErrorType::*;
    match e.etype() {
        ConnectRefused | ConnectNoRoute | ConnectError => Some("refused"),
        ConnectTimedout => Some("timeout"),
        ReadTimedout | WriteTimedout if e.esource() == &ErrorSource::Upstream => Some("timeout"),
        _ if e.esource() == &ErrorSource::Upstream => Some("invalid"),
        _ => None,
    }
}

/// Why the call's body was refused, told to the client.
fn refused_body(ctx: &RequestCtx) -> Option<&str> {
    ctx.exchange()?.refusal().map(|(_, e)| e.message())
}
