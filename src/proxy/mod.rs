//! The gateway's one `ProxyHttp`. A request flows through ten steps, one file each; every hook
//! below is the ordered list of the steps it runs, one line each:
//!
//! 1. `validate`: the request head (method, path shape, header and body limits)
//! 2. `authenticate`: the bearer token, before anything reveals which services exist
//! 3. `route`: the service the path names
//! 4. `authorise`: its scope, its rate limit, and no free generation for a budgeted caller
//! 5. `body`: on an endpoint the gateway reads, the body read whole, checked and edited
//! 6. `budget`: the worst case reserved, or the request refused
//! 7. `upstream`: the replica chosen, and whether a failed attempt may be retried
//! 8. `rewrite`: the forwarded path and the headers the upstream gets
//! 9. `respond`: the answer streamed through (usage read on the side) and cleaned
//! 10. `record`: the charge settled, the metrics, the ledger and the access log
//!
//! The gateway's own answers (`/healthz`, refusals, failed attempts) are in `answers`.

mod answers;
mod authenticate;
mod authorise;
mod body;
mod budget;
mod context;
mod headers;
mod path;
mod price;
mod record;
mod respond;
mod rewrite;
mod route;
mod upstream;
mod validate;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, Result};

pub(crate) use context::{RequestCtx, RequestId};
pub use path::{classify as classify_path, Target};
use route::Route;
pub(crate) use route::RouteId;
pub use upstream::peer_for;

use crate::api::Models;
use crate::auth::Authenticator;
use crate::config::Config;
use crate::errors::GatewayError;
use crate::limits::budgets::Budgets;
use crate::limits::SharedRedis;
use crate::metering::Meter;
use crate::observe::access_log::AccessLog;
use crate::observe::metrics::{Metrics, ServiceMetrics};
use crate::pricing::Pricing;
use crate::replicas::Replicas;

pub(crate) struct Gateway {
    routes: Vec<Route>,
    /// The metric handles of `/healthz` (`_local`) and of everything unrouted (`_unknown`).
    local_metrics: ServiceMetrics,
    unknown_metrics: ServiceMetrics,
    max_body: u64,
    /// The bounds on bodies read whole, on services with an `api`.
    buffering: body::Buffering,
    auth: Authenticator,
    metrics: Arc<Metrics>,
    access_log: AccessLog,
    meter: Arc<Meter>,
    /// `[budgets]`: limits on what keys, owners and teams may use.
    budgets: Option<Arc<Budgets>>,
    /// `[pricing]`: what requests cost.
    pricing: Option<Arc<Pricing>>,
    /// `[metering] tail_seconds`: how long a metered answer is read on after the client left.
    tail: Option<Duration>,
}

/// Why `admit` stopped a request before it was proxied.
enum Stop {
    /// `/healthz`: answered here.
    Health,
    /// The gateway's refusal.
    Refused(GatewayError),
    /// Refused for its budget (429, or 503 before the budgets are seeded).
    OverBudget(budget::BudgetStop),
    /// Pingora's error (reading the body failed).
    Failed(Box<Error>),
    /// A token count the gateway answers itself (`count_tokens` on a translated service).
    Counted(u64),
}

impl From<GatewayError> for Stop {
    fn from(e: GatewayError) -> Stop {
        Stop::Refused(e)
    }
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
        metering: (Arc<Meter>, Option<Arc<Budgets>>, Option<Arc<Pricing>>),
        redis: Option<&Arc<SharedRedis>>,
    ) -> Gateway {
        let (meter, budgets, pricing) = metering;
        Gateway {
            routes: Route::all(config, &metrics, replicas, redis),
            local_metrics: metrics.for_service("_local"),
            unknown_metrics: metrics.for_service("_unknown"),
            max_body: config.server.max_request_body_bytes,
            buffering: body::Buffering::new(&config.server.buffering),
            auth,
            metrics,
            access_log,
            meter,
            budgets,
            pricing,
            tail: Some(config.metering.tail).filter(|t| !t.is_zero()),
        }
    }

    /// Steps 1 to 6, on the request head (and a body read ahead): `Ok` when the request goes
    /// upstream.
    async fn admit(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<(), Stop> {
        let req = session.req_header();
        let (service, forward) = validate::head(req, ctx)?;
        let principal = authenticate::caller(&self.auth, req, ctx).await?;
        let route = route::find(&self.routes, service, ctx)?;
        let budgets = self.budgets.as_deref();
        authorise::call(route, &principal, req, forward, self.max_body, budgets, ctx).await?;
        body::read(self, session, ctx).await?;
        budget::reserve(self, ctx).await.map_err(Stop::OverBudget)
    }

    /// The service the request was routed to, once routed.
    fn route(&self, ctx: &RequestCtx) -> Option<&Route> {
        ctx.route.map(|id| &self.routes[id.index()])
    }

    /// The model policy of the routed service, on a service with an `api`.
    fn models(&self, ctx: &RequestCtx) -> Option<&Models> {
        self.route(ctx).and_then(Route::models)
    }

    /// The metric handles of the request's bounded label: a registered service, `_local` or
    /// `_unknown`.
    fn service_metrics(&self, ctx: &RequestCtx) -> &ServiceMetrics {
        match self.route(ctx) {
            Some(route) => &route.metrics,
            None if ctx.health => &self.local_metrics,
            None => &self.unknown_metrics,
        }
    }

    fn service_label(&self, ctx: &RequestCtx) -> &str {
        self.service_metrics(ctx).service()
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        context::begin(session, ctx);
        match self.admit(session, ctx).await {
            Ok(()) => Ok(false),
            Err(Stop::Health) => answers::health(session, ctx).await,
            Err(Stop::Refused(e)) => answers::reject(session, ctx, e).await,
            Err(Stop::OverBudget(stop)) => answers::over_budget(session, ctx, &stop).await,
            Err(Stop::Failed(e)) => Err(e),
            Err(Stop::Counted(tokens)) => answers::counted(session, ctx, tokens).await,
        }
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        validate::body_size(session, body.as_ref(), self.max_body, ctx)?;
        body::filter(self, session, body, end_of_stream, ctx)?;
        budget::reserve_held(self, body, end_of_stream, ctx).await
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        upstream::choose(self.route(ctx), session.req_header(), ctx)
    }

    /// A connect refusal or timeout: see `upstream::connect_failed`.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        e: Box<Error>,
    ) -> Box<Error> {
        upstream::connect_failed(self.route(ctx), ctx, e)
    }

    /// An error once connected: see `upstream::failed_once_connected`.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        upstream::failed_once_connected(peer, session, e, ctx, client_reused)
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
        upstream::connected(self.route(ctx), ctx);
        Ok(())
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        rewrite::path(self.route(ctx), session, upstream, ctx)?;
        rewrite::headers(self.route(ctx), session, upstream, ctx)?;
        body::frame_upstream(upstream, ctx)?;
        ctx.upstream_sent = Some(Instant::now());
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        respond::head(self, session, upstream_response, ctx)
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<Duration>> {
        respond::chunk(body, end_of_stream, ctx);
        upstream::release_at_end(end_of_stream, ctx);
        Ok(None)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        budget::quota_headers(response, ctx)?;
        respond::clean(response, ctx)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        record::upstream_error(self, e, ctx);
        answers::failed(session, e, ctx).await
    }

    fn request_summary(&self, session: &Session, ctx: &RequestCtx) -> String {
        record::summary(session, ctx)
    }

    fn tail_after_client_left(&self, _session: &Session, ctx: &RequestCtx) -> Option<Duration> {
        respond::tail(self.tail, ctx)
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        record::is_client_gone(e)
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        let status = record::status(session, ctx);
        record::settle_usage(self, status, e, ctx);
        record::settle_cost(self, status, ctx);
        record::charge_ledger(self, status, ctx);
        budget::settle(self, ctx).await;
        record::metrics(self, session, status, ctx);
        record::access_log(self, session, status, ctx);
    }
}
