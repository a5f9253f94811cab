//! Step 3, route: the registered service the path names (404 for any other), as the request
//! path uses it, built once at start-up: its settings, its replicas, its rate limit and its
//! metric handles, side by side.

use std::sync::Arc;

use super::RequestCtx;
use crate::api::Models;
use crate::config::{Config, ServiceConfig};
use crate::errors::GatewayError;
use crate::limits::rate::Limit;
use crate::limits::SharedRedis;
use crate::observe::metrics::{Metrics, ServiceMetrics};
use crate::replicas::Replicas;

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
        redis: Option<&Arc<SharedRedis>>,
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

/// The route of `service`, noted in `ctx`.
pub(super) fn find<'g>(
    routes: &'g [Route],
    service: Option<&[u8]>,
    ctx: &mut RequestCtx,
) -> Result<&'g Route, GatewayError> {
    let index = service
        .and_then(|name| (routes.iter()).position(|r| r.settings.name.as_bytes() == name))
        .ok_or(GatewayError::NotFound)?;
    ctx.route = Some(RouteId::new(index));
    Ok(&routes[index])
}
