//! Step 10, record: once the request is over, its usage settled, its charge in the ledger,
//! its metrics, and one access-log line (queued for its writer thread, never waited on).

use std::time::SystemTime;

use pingora::proxy::Session;
use pingora::{Error, ErrorSource, ErrorType};

use super::{answers, price, Gateway, RequestCtx};
use crate::metering::{Charge, Cost};
use crate::observe::access_log::{millis, path_only, HttpFields, ProxiedFields, Record, Time};

/// The access-log line of a finished request; `service` is its bounded metrics label.
fn access_line<'a>(
    session: &'a Session,
    ctx: &'a RequestCtx,
    service: &'a str,
    status: u16,
    replica: Option<&'a str>,
) -> Record<'a> {
    let req = session.req_header();
    let elapsed = ctx.start.elapsed();
    let charged = ctx.exchange().and_then(|x| x.charged());
    let usage = charged.map(|c| c.usage);
    Record {
        time: Time(SystemTime::now() - elapsed),
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
            model: (ctx.exchange())
                .filter(|_| (200..300).contains(&status))
                .and_then(|x| x.model()),
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
            translated: ctx
                .exchange()
                .and_then(|x| x.translation())
                .map(|p| p.name()),
            cost: ctx.cost.and_then(|cost| match cost {
                Cost::NoTable => None,
                Cost::Unpriced => Some(None),
                Cost::Micros(n) => Some(Some(crate::pricing::money::units(n))),
            }),
        }),
        key_event: None,
    }
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
    let charged = ctx.exchange().and_then(|x| x.charged());
    let usage = charged.map(|c| c.usage).unwrap_or_default();
    Some(Charge {
        key_id: principal.key_id(),
        owner: principal.owner.as_deref(),
        team: ctx.team.as_deref(),
        service,
        // The model named by a caller whose request failed is not a model anyone served: a
        // caller could add a ledger row per name it makes up.
        model: (ctx.exchange())
            .filter(|_| (200..300).contains(&status))
            .and_then(|x| x.model()),
        prompt_tokens: usage.prompt_tokens.unwrap_or(0),
        completion_tokens: usage.completion_tokens.unwrap_or(0),
        reasoning_tokens: usage.reasoning_tokens.unwrap_or(0),
        cached_tokens: usage.cached_tokens.unwrap_or(0),
        estimated: charged.is_some_and(|c| c.estimated),
        cost: ctx.cost.unwrap_or(Cost::NoTable),
    })
}

/// The status the client got: the answer's, or the gateway's own; 0 when none was sent.
pub(super) fn status(session: &Session, ctx: &RequestCtx) -> u16 {
    session
        .response_written()
        .map(|r| r.status.as_u16())
        .or(ctx.local_status)
        .unwrap_or(0)
}

/// Settles the call's usage: read, estimated, or charged its worst case.
pub(super) fn settle_usage(gw: &Gateway, status: u16, e: Option<&Error>, ctx: &mut RequestCtx) {
    let handles = gw.service_metrics(ctx);
    let service = handles.service();
    if ctx.streaming {
        gw.metrics.stream_ended(service);
    }
    let Some(body) = &mut ctx.body else {
        return;
    };
    if let Some(reason) = body.exchange.settle(status, e.is_some()) {
        gw.metrics.usage_unread(service, reason);
    }
    if let Some(charged) = body.exchange.charged() {
        gw.metrics.tokens(handles, &charged.usage);
    }
    let exchange = &body.exchange;
    if let (Some(pair), Some(result)) = (
        exchange.translation(),
        exchange.translation_result(status, e.is_some()),
    ) {
        gw.metrics.translated(service, pair.name(), result);
    }
}

/// What the request cost, once its usage is settled: only a request the ledger charges.
pub(super) fn settle_cost(gw: &Gateway, status: u16, ctx: &mut RequestCtx) {
    // Without a price table nothing is costed: not a step of the request's path at all.
    if gw.pricing.is_none() {
        return;
    }
    let handles = gw.service_metrics(ctx);
    if charge(ctx, handles.service(), status).is_some() {
        let cost = price::cost(gw, ctx);
        match cost {
            Cost::NoTable => {}
            Cost::Unpriced => gw.metrics.cost(handles, None),
            Cost::Micros(n) => gw.metrics.cost(handles, Some(n)),
        }
        ctx.cost = Some(cost);
    }
}

/// The ledger's charge, for its next flush.
pub(super) fn charge_ledger(gw: &Gateway, status: u16, ctx: &RequestCtx) {
    if let Some(charge) = charge(ctx, gw.service_label(ctx), status) {
        gw.meter.record(&charge);
    }
}

/// The request's metrics, and the affinity choice it made.
pub(super) fn metrics(gw: &Gateway, session: &Session, status: u16, ctx: &RequestCtx) {
    gw.metrics.record_for(
        gw.service_metrics(ctx),
        &session.req_header().method,
        status,
        ctx.start.elapsed(),
        ctx.upstream_ttfb,
        ctx.auth_failure,
    );
    let affinity = ctx.replica.as_ref().and_then(|c| c.affinity);
    if let (Some(route), Some(result)) = (gw.route(ctx), affinity) {
        route.replicas.count_affinity(result);
    }
}

/// The access-log line, queued for the writer thread (counted when the queue is full).
pub(super) fn access_log(gw: &Gateway, session: &Session, status: u16, ctx: &RequestCtx) {
    if !gw.access_log.enabled() {
        return;
    }
    let replica = (gw.route(ctx))
        .zip(ctx.replica.as_ref())
        .map(|(route, chosen)| route.replicas.label(chosen.index));
    let line = access_line(session, ctx, gw.service_label(ctx), status, replica);
    if !gw.access_log.log(&line) {
        gw.metrics.access_log_dropped();
    }
}

/// A failed proxy attempt the upstream caused, counted by kind.
pub(super) fn upstream_error(gw: &Gateway, e: &Error, ctx: &RequestCtx) {
    if let Some(kind) = answers::upstream_error_kind(e) {
        gw.metrics.upstream_error(gw.service_label(ctx), kind);
    }
}

/// What Pingora's own log lines (e.g. `Fail to proxy`) say about the request: method, path
/// without its query (which may carry anything, keys included) and our request id; never a
/// header, token or body.
pub(super) fn summary(session: &Session, ctx: &RequestCtx) -> String {
    let req = session.req_header();
    format!(
        "{} {:?} request_id={}",
        req.method,
        path_only(req.raw_path()),
        ctx.request_id.as_str()
    )
}

/// A client that goes away mid-stream is normal for chat UIs, not an error to log.
pub(super) fn is_client_gone(e: &Error) -> bool {
    e.esource() == &ErrorSource::Downstream
        && matches!(
            e.etype(),
            ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed
        )
}
