//! One registered service as the request path uses it, built once at start-up: its settings,
//! its replicas, its rate limit and its metric handles, side by side.

use std::sync::Arc;

use pingora::http::RequestHeader;
use pingora::upstreams::peer::HttpPeer;

use super::{exchange, headers, Gateway, RequestCtx};
use crate::api::Models;
use crate::config::{Config, ServiceConfig};
use crate::metrics::{Metrics, ServiceMetrics};
use crate::rate_limit::{Backend, Limit};
use crate::replicas::{Chosen, Replicas};

pub(crate) struct Route {
    pub settings: ServiceConfig,
    pub replicas: Arc<Replicas>,
    pub limit: Limit,
    /// Resolved once, so a request records without looking labels up.
    pub metrics: ServiceMetrics,
}

impl Route {
    /// Every service's route; `replicas` in the order of `config.services`.
    pub(crate) fn all(
        config: &Config,
        metrics: &Metrics,
        replicas: Vec<Arc<Replicas>>,
        redis: Option<&Arc<Backend>>,
    ) -> Vec<Route> {
        for service in config.services.iter().filter(|s| s.models.is_some()) {
            // Present from the start at 0, so a rate() over it is defined before the first call.
            metrics.register_tokens(&service.name);
        }
        (config.services.iter().zip(replicas))
            .map(|(settings, replicas)| Route {
                limit: Limit::new(&settings.name, settings.rate_limit_per_minute, redis),
                metrics: metrics.for_service(&settings.name),
                settings: settings.clone(),
                replicas,
            })
            .collect()
    }

    /// The model policy, on a service with an `api`.
    pub(crate) fn models(&self) -> Option<&Models> {
        self.settings.models.as_ref()
    }
}

/// Which `Route` a request took, once routed and authorised; an index into the gateway's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RouteId(u32);

impl RouteId {
    pub(crate) fn new(index: usize) -> RouteId {
        RouteId(index as u32)
    }

    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// Lookups the request flow makes of the routed service.
impl Gateway {
    /// The service the request was routed to, once routed and authorised.
    pub(super) fn route(&self, ctx: &RequestCtx) -> Option<&Route> {
        ctx.route.map(|id| &self.routes[id.index()])
    }

    /// The model policy of the routed service, on a service with an `api`.
    pub(super) fn models(&self, route: Option<RouteId>) -> Option<&Models> {
        route.and_then(|id| self.routes[id.index()].models())
    }

    /// The metric handles of `service_label`.
    pub(super) fn service_metrics(&self, ctx: &RequestCtx) -> &ServiceMetrics {
        match self.route(ctx) {
            Some(route) => &route.metrics,
            None if ctx.health => &self.local_metrics,
            None => &self.unknown_metrics,
        }
    }

    /// A bounded metric label: a registered service, `_local` or `_unknown`.
    pub(super) fn service_label(&self, ctx: &RequestCtx) -> &str {
        self.service_metrics(ctx).service()
    }
}

/// The replica of the request's next attempt: the same one again once the request may have
/// reached it (never replayed elsewhere), else a choice, by affinity key on a
/// `prefix_affinity` service.
pub(super) fn choose(
    replicas: &Arc<Replicas>,
    req: &RequestHeader,
    ctx: &RequestCtx,
) -> Option<(Chosen, HttpPeer)> {
    match (ctx.reached_replica, &ctx.replica) {
        (true, Some(same)) => {
            let affinity = same.affinity;
            replicas.again(same.index).map(|(mut c, peer)| {
                c.affinity = affinity;
                (c, peer)
            })
        }
        _ if replicas.keyed() => {
            let key = affinity_key(req, ctx.exchange.as_deref());
            replicas.choose_for(ctx.tried, key)
        }
        _ => replicas.choose(ctx.tried),
    }
}

/// A request's affinity key: its `X-Session-Id`, else the start of a body already read.
fn affinity_key(req: &RequestHeader, exchange: Option<&exchange::Exchange>) -> Option<u64> {
    match req.headers.get(&headers::X_SESSION_ID) {
        Some(id) if !id.is_empty() => Some(crate::api::affinity_session_key(id.as_bytes())),
        _ => exchange.and_then(|x| x.affinity_key),
    }
}
