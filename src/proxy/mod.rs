//! The gateway's one `ProxyHttp`. A request flows top to bottom:
//! validate → authenticate → route → authorise → rewrite → stream → clean the response → record.

mod budget;
mod budgeted;
mod context;
pub(crate) mod exchange;
mod headers;
mod held;
mod local;
mod metered;
mod record;
mod route;
mod unmetered;
pub(crate) mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType, Result};

pub(crate) use context::{RequestCtx, RequestId};
use route::Route;
pub(crate) use route::RouteId;
pub use upstream::peer_for;

use crate::access_log::{self, AccessLog};
use crate::api::Endpoint;
use crate::auth::Authenticator;
use crate::budgets::Budgets;
use crate::config::Config;
use crate::errors::{GatewayError, Malformed};
use crate::metering::Meter;
use crate::metrics::{Metrics, ServiceMetrics};
use crate::rate_limit::Backend;
use crate::replicas::Replicas;
use crate::routing::{self, Target};

pub(crate) struct Gateway {
    routes: Vec<Route>,
    /// The metric handles of `/healthz` (`_local`) and of everything unrouted (`_unknown`).
    local_metrics: ServiceMetrics,
    unknown_metrics: ServiceMetrics,
    max_body: u64,
    /// The bounds on bodies read whole, on services with an `api`.
    buffering: exchange::Buffering,
    auth: Authenticator,
    metrics: Arc<Metrics>,
    access_log: AccessLog,
    meter: Arc<Meter>,
    /// `[budgets]`: limits on what keys and owners may use.
    budgets: Option<Arc<Budgets>>,
    /// `[metering] tail_seconds`: how long a metered answer is read on after the client left.
    tail: Option<Duration>,
}

/// What `request_filter` decided, taken out of the borrowed request before acting on it.
enum Decision {
    /// `ctx.route` is set by then; the forwarded part starts at `forward_from`.
    Proxy {
        forward_from: usize,
        /// A call on an endpoint of the service's `api`: its body is read.
        endpoint: Option<Endpoint>,
    },
    Health,
    Reject(GatewayError),
}

impl Gateway {
    /// `replicas`: per service, in the order of `config.services`; `redis`: the process's
    /// connection to `[rate_limits] redis`, shared by rate limits and budgets.
    pub(crate) fn new(
        config: &Config,
        auth: Authenticator,
        metrics: Arc<Metrics>,
        access_log: AccessLog,
        replicas: Vec<Arc<Replicas>>,
        metering: (Arc<Meter>, Option<Arc<Budgets>>),
        redis: Option<&Arc<Backend>>,
    ) -> Gateway {
        let (meter, budgets) = metering;
        Gateway {
            routes: Route::all(config, &metrics, replicas, redis),
            local_metrics: metrics.for_service("_local"),
            unknown_metrics: metrics.for_service("_unknown"),
            max_body: config.server.max_request_body_bytes,
            buffering: exchange::Buffering::new(&config.server.buffering),
            auth,
            metrics,
            access_log,
            meter,
            budgets,
            tail: Some(config.metering.tail).filter(|t| !t.is_zero()),
        }
    }

    async fn decide(&self, session: &Session, ctx: &mut RequestCtx) -> Decision {
        let req = session.req_header();
        ctx.health = routing::is_health_target(req.raw_path());
        // 1. Validate: method, then path shape.
        let target = match routing::classify(&req.method, req.raw_path()) {
            Ok(t) => t,
            Err(e) => return Decision::Reject(e),
        };
        if !headers::within_limits(req) {
            return Decision::Reject(GatewayError::BadRequest(Malformed::HeadersTooLarge));
        }
        let (service, forward) = match target {
            Target::Health => return Decision::Health,
            Target::NotFound => return Decision::Reject(GatewayError::NotFound),
            Target::Protected { service, forward } => (service, forward),
        };
        // 2. Authenticate, before anything reveals which services exist.
        let principal = match self.auth.authenticate(&req.headers).await {
            Ok(p) => p,
            Err(failure) => {
                // Debug only: stderr logging is synchronous, and a flood of bad tokens must not
                // turn into blocking writes. The access log and the metric carry the reason.
                log::debug!(
                    "request {} unauthorized: {}",
                    ctx.request_id.as_str(),
                    failure.as_str()
                );
                ctx.auth_failure = Some(failure);
                return Decision::Reject(GatewayError::Unauthorized);
            }
        };
        ctx.principal = Some(principal.clone());
        // 3. Route.
        let Some(id) = service.and_then(|name| {
            (self.routes.iter())
                .position(|r| r.settings.name.as_bytes() == name)
                .map(RouteId::new)
        }) else {
            return Decision::Reject(GatewayError::NotFound);
        };
        ctx.route = Some(id);
        let route = &self.routes[id.index()];
        // 4. Authorise.
        if !principal.has_scope(&route.settings.scope) {
            return Decision::Reject(GatewayError::Forbidden);
        }
        // Per process, or per fleet through Redis (`[rate_limits] redis`).
        if let Err(retry_after) = route.limit.check(&principal).await {
            return Decision::Reject(GatewayError::RateLimited(retry_after));
        }
        // A declared body over the limit is refused before a byte of it is read.
        if let Some(declared) = req.headers.get(http::header::CONTENT_LENGTH) {
            match declared.to_str().ok().and_then(|v| v.parse::<u64>().ok()) {
                Some(len) if len > self.max_body => {
                    return Decision::Reject(GatewayError::PayloadTooLarge)
                }
                Some(_) => {}
                None => {
                    return Decision::Reject(GatewayError::BadRequest(Malformed::ContentLength))
                }
            }
        }
        ctx.budget_class = self.budgets.as_ref().and_then(|b| b.class_of(&principal));
        let forward_from = req.raw_path().len() - forward.len();
        let endpoint =
            (route.models()).and_then(|models| Endpoint::of(models.api(), &req.method, forward));
        // 4a. Metered only: a caller with a token budget generates nothing the meter misses.
        let settings = &route.settings;
        if settings.models.is_some()
            && endpoint.is_none()
            && ctx.budget_class == Some(true)
            && !unmetered::allowed(&settings.unmetered_paths, &req.method, forward)
        {
            ctx.forward_from = forward_from;
            return Decision::Reject(GatewayError::EndpointNotMetered);
        }
        Decision::Proxy {
            forward_from,
            endpoint,
        }
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        ctx.start = Instant::now();
        // new_ctx already drew a random id; the client's replaces it only if it sent one.
        if let Some(client_id) = session.req_header().headers.get(&headers::X_REQUEST_ID) {
            ctx.request_id = RequestId::from_client_or_new(Some(client_id.as_bytes()));
        }
        match self.decide(session, ctx).await {
            Decision::Proxy {
                forward_from,
                endpoint,
            } => {
                ctx.forward_from = forward_from;
                if let (Some(endpoint), Some(models)) = (endpoint, self.models(ctx.route)) {
                    // Validate the body and apply the model policy before any upstream is chosen.
                    let keyed = self.route(ctx).is_some_and(|r| r.replicas.keyed());
                    let cap = self.cap_rule(ctx);
                    let (exchange, next) = exchange::Exchange::begin(
                        session,
                        endpoint,
                        models,
                        cap,
                        ctx.principal.as_ref(),
                        &self.buffering,
                        keyed,
                    )
                    .await?;
                    ctx.exchange = Some(Box::new(exchange));
                    if let exchange::Next::Refuse(e) = next {
                        return local::reject(session, ctx, e).await;
                    }
                }
                // 4b. Budget: the worst case reserved, or refused before anything is forwarded.
                match self.reserve_budget(ctx).await {
                    Ok(()) => Ok(false),
                    Err(stop) => local::over_budget(session, ctx, &stop).await,
                }
            }
            Decision::Health => local::health(session, ctx).await,
            Decision::Reject(e) => local::reject(session, ctx, e).await,
        }
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // Chunked bodies declare no length: count what arrives.
        ctx.body_bytes += body.as_ref().map_or(0, |b| b.len() as u64);
        if ctx.body_bytes > self.max_body {
            session.set_keepalive(None);
            return Error::e_explain(ErrorType::HTTPStatus(413), "request body over the limit");
        }
        if let (Some(exchange), Some(models)) = (&mut ctx.exchange, self.models(ctx.route)) {
            let cap = self.budgets.as_deref().map(Budgets::cap_rule);
            exchange.filter_body(session, body, end_of_stream, models, cap)?;
            // A held body is complete: its budget, before any of it is sent upstream.
            if end_of_stream && !ctx.budget_decided {
                if let Err(stop) = self.reserve_budget(ctx).await {
                    ctx.budget_refusal = Some(stop);
                    *body = None;
                    return Error::e_explain(ErrorType::HTTPStatus(429), "over budget");
                }
            }
        }
        Ok(())
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let replicas = &self
            .route(ctx)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route chosen"))?
            .replicas;
        let chosen = route::choose(replicas, session.req_header(), ctx);
        let Some((chosen, peer)) = chosen else {
            return Error::e_explain(ErrorType::ConnectNoRoute, "every replica was tried");
        };
        ctx.tried |= 1 << chosen.index;
        // Replacing the previous choice ends its in-flight count.
        ctx.replica = Some(chosen);
        Ok(Box::new(peer))
    }

    /// A connect refusal or timeout: nothing of the request reached the replica, so the next
    /// untried replica may take it (each at most once; `upstream_peer` chooses). Not once a
    /// replica may have seen it (see `error_while_proxy`).
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let (Some(route), Some(chosen)) = (self.route(ctx), &ctx.replica) {
            let replicas = &route.replicas;
            replicas.connect_failed(chosen.index);
            if !ctx.reached_replica && (ctx.tried.count_ones() as usize) < replicas.len() {
                e.set_retry(true);
            }
        }
        e
    }

    /// An error once connected: never replayed on another replica. Once the request head is
    /// written, the replica may have started a generation, and a replay elsewhere would run
    /// (and bill) it twice; the caller gets the 502 instead. Pingora's own rule stays: it
    /// retries an idempotent request whose pooled connection failed at once (most often the
    /// replica had closed it while idle), but only on the same replica: a replica that died
    /// with the request in hand may have read it, so if it cannot be reached the answer is 502.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        if !session.req_header().method.is_idempotent() || session.as_ref().retry_buffer_truncated()
        {
            e.set_retry(false);
        } else {
            e.retry.decide_reuse(client_reused);
        }
        ctx.reached_replica = true;
        e
    }

    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        _reused: bool,
        _peer: &HttpPeer,
        #[cfg(unix)] _fd: std::os::unix::io::RawFd,
        #[cfg(windows)] _sock: std::os::windows::io::RawSocket,
        _digest: Option<&pingora::protocols::Digest>,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let (Some(route), Some(chosen)) = (self.route(ctx), &ctx.replica) {
            route.replicas.connected(chosen.index);
        }
        Ok(())
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let Some(route) = self.route(ctx) else {
            return Error::e_explain(ErrorType::InternalError, "no route chosen");
        };
        let service = &route.settings;
        // 5. Rewrite: the upstream's base path, then the remainder and query byte for byte.
        let forward = &session.req_header().raw_path()[ctx.forward_from..];
        let base_path = service.replicas[0].base_path.as_bytes();
        if base_path.is_empty() {
            upstream.set_raw_path(forward)?;
        } else {
            upstream.set_raw_path(&[base_path, forward].concat())?;
        }
        let client_ip = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let client_tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        let Some(replica) = &ctx.replica else {
            return Error::e_explain(ErrorType::InternalError, "no replica chosen");
        };
        headers::to_upstream(
            upstream,
            service,
            route.replicas.host_header(replica.index),
            client_ip,
            client_tls,
            ctx.request_id.as_str(),
        )?;
        if let Some(exchange) = &ctx.exchange {
            exchange.frame_upstream(upstream)?;
        }
        ctx.upstream_sent = Some(Instant::now());
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.upstream_ttfb = ctx.upstream_sent.map(|t| t.elapsed());
        // 6. Stream: Pingora relays each chunk as it comes; we only note that it is a stream.
        let event_stream = headers::is_event_stream(upstream_response);
        if event_stream && !ctx.streaming {
            ctx.streaming = true;
            self.metrics.stream_started(self.service_label(ctx));
        }
        if let Some(exchange) = &mut ctx.exchange {
            let client = session.req_header().version;
            (exchange.metered).response_started(upstream_response, event_stream, client)?;
        }
        Ok(())
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<Duration>> {
        // Usage is read from the bytes as they pass; the chunk goes on at once, untouched
        // but for what the gateway's own `include_usage` added.
        if let Some(exchange) = &mut ctx.exchange {
            exchange.metered.response_chunk(body, end_of_stream);
        }
        // The replica is done with this request: before the client has the last byte, so its
        // next request already sees the replica free.
        if end_of_stream {
            if let Some(chosen) = &mut ctx.replica {
                chosen.release();
            }
        }
        Ok(None)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // 7. Clean the response; a budgeted caller learns what its budget has left.
        if let Some(reservation) = &ctx.budget {
            budgeted::quota_headers(response, &reservation.quota)?;
        }
        headers::to_client(response, ctx.request_id.as_str())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        if let Some(kind) = local::upstream_error_kind(e) {
            self.metrics.upstream_error(self.service_label(ctx), kind);
        }
        local::failed(session, e, ctx).await
    }

    /// What Pingora's own log lines (e.g. `Fail to proxy`) say about the request: method, path
    /// without its query (which may carry anything, keys included) and our request id; never
    /// a header, token or body.
    fn request_summary(&self, session: &Session, ctx: &RequestCtx) -> String {
        let req = session.req_header();
        format!(
            "{} {:?} request_id={}",
            req.method,
            access_log::path_only(req.raw_path()),
            ctx.request_id.as_str()
        )
    }

    fn tail_after_client_left(&self, _session: &Session, ctx: &RequestCtx) -> Option<Duration> {
        // 6b. The client left before the usage report: read on for it (metered answers only).
        ctx.exchange
            .as_ref()
            .and_then(|x| x.metered.usage_pending().then_some(self.tail?))
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        // A client that goes away mid-stream is normal for chat UIs, not an error.
        e.esource() == &ErrorSource::Downstream
            && matches!(
                e.etype(),
                ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed
            )
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        // 8. Record: metrics, then the access log (queued for its writer thread, never waited on).
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .or(ctx.local_status)
            .unwrap_or(0);
        let handles = self.service_metrics(ctx);
        let service = handles.service();
        if ctx.streaming {
            self.metrics.stream_ended(service);
        }
        if let Some(exchange) = &mut ctx.exchange {
            let metered = &mut exchange.metered;
            if let Some(reason) = metered.settle(status, e.is_some()) {
                self.metrics.usage_unread(service, reason);
            }
            if let Some(charged) = metered.charged() {
                self.metrics.tokens(handles, &charged.usage);
            }
        }
        if let Some(charge) = record::charge(ctx, service, status) {
            self.meter.record(&charge);
        }
        self.settle_budget(ctx).await;
        self.metrics.record_for(
            handles,
            &session.req_header().method,
            status,
            ctx.start.elapsed(),
            ctx.upstream_ttfb,
            ctx.auth_failure,
        );
        let affinity = ctx.replica.as_ref().and_then(|c| c.affinity);
        if let (Some(route), Some(result)) = (self.route(ctx), affinity) {
            route.replicas.count_affinity(result);
        }
        if self.access_log.enabled() {
            let replica = (self.route(ctx))
                .zip(ctx.replica.as_ref())
                .map(|(route, chosen)| route.replicas.label(chosen.index));
            let line = record::access_line(session, ctx, service, status, replica);
            if !self.access_log.send(line) {
                self.metrics.access_log_dropped();
            }
        }
    }
}
