//! The record phase: a data-plane request as one access-log line and as a ledger charge.

use std::time::SystemTime;

use pingora::proxy::Session;

use super::RequestCtx;
use crate::access_log::{millis, path_only, HttpFields, ProxiedFields, Record};
use crate::metering::Charge;
use crate::time::rfc3339_millis;

/// The access-log line of a finished request; `service` is its bounded metrics label.
pub(crate) fn access_line(
    session: &Session,
    ctx: &RequestCtx,
    service: &str,
    status: u16,
    replica: Option<&str>,
) -> Vec<u8> {
    let req = session.req_header();
    let elapsed = ctx.start.elapsed();
    let charged = ctx.exchange.as_ref().and_then(|x| x.metered.charged());
    let usage = charged.map(|c| c.usage);
    Record {
        time: rfc3339_millis(SystemTime::now() - elapsed),
        request_id: ctx.request_id.as_str(),
        service,
        principal_kind: ctx.principal.as_ref().map(|p| p.kind.as_str()),
        principal_id: ctx.principal.as_ref().map(|p| &*p.id),
        http: Some(HttpFields {
            method: req.method.as_str(),
            path: path_only(req.raw_path()),
            status,
            duration_ms: millis(elapsed),
            client: session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip()),
            auth_failure: ctx.auth_failure.map(|f| f.as_str()),
        }),
        proxied: Some(ProxiedFields {
            upstream_ttfb_ms: ctx.upstream_ttfb.map(millis),
            bytes_in: session.body_bytes_read() as u64,
            bytes_out: session.body_bytes_sent() as u64,
            // The model named by a caller whose request failed is not a model anyone served: a
            // caller could add a ledger row per name it makes up.
            model: (ctx.exchange.as_ref())
                .filter(|_| (200..300).contains(&status))
                .and_then(|x| x.model.as_deref()),
            prompt_tokens: usage.and_then(|u| u.prompt_tokens),
            completion_tokens: usage.and_then(|u| u.completion_tokens),
            reasoning_tokens: usage.and_then(|u| u.reasoning_tokens),
            cached_tokens: usage.and_then(|u| u.cached_tokens),
            usage_estimated: charged.is_some_and(|c| c.estimated),
            owner: ctx.principal.as_ref().and_then(|p| p.owner.as_deref()),
            replica,
            affinity: ctx
                .replica
                .as_ref()
                .and_then(|c| c.affinity)
                .map(|a| a.as_str()),
        }),
        key_event: None,
    }
    .to_line()
}

/// What the ledger charges for a finished request: every request of an authenticated caller
/// that was routed and sent upstream (not one the gateway refused before its body went), with
/// the usage read from its response (0 when none).
pub(crate) fn charge<'a>(ctx: &'a RequestCtx, service: &'a str, status: u16) -> Option<Charge<'a>> {
    let principal = ctx.principal.as_deref()?;
    ctx.route?;
    ctx.upstream_sent?;
    if ctx.refused_held {
        return None;
    }
    let charged = ctx.exchange.as_ref().and_then(|x| x.metered.charged());
    let usage = charged.map(|c| c.usage).unwrap_or_default();
    Some(Charge {
        key_id: principal.key_id(),
        owner: principal.owner.as_deref(),
        service,
        // The model named by a caller whose request failed is not a model anyone served: a
        // caller could add a ledger row per name it makes up.
        model: (ctx.exchange.as_ref())
            .filter(|_| (200..300).contains(&status))
            .and_then(|x| x.model.as_deref()),
        prompt_tokens: usage.prompt_tokens.unwrap_or(0),
        completion_tokens: usage.completion_tokens.unwrap_or(0),
        reasoning_tokens: usage.reasoning_tokens.unwrap_or(0),
        cached_tokens: usage.cached_tokens.unwrap_or(0),
        estimated: charged.is_some_and(|c| c.estimated),
    })
}
