//! One registered service as the request path uses it, built once at start-up: its settings,
//! its replicas, its rate limit and its metric handles, side by side.

use std::sync::Arc;

use crate::config::ServiceConfig;
use crate::metrics::ServiceMetrics;
use crate::model_policy::Models;
use crate::rate_limit::Limit;
use crate::replicas::Replicas;

pub struct Route {
    pub settings: ServiceConfig,
    pub replicas: Arc<Replicas>,
    pub limit: Limit,
    /// Resolved once, so a request records without looking labels up.
    pub metrics: ServiceMetrics,
}

impl Route {
    /// The model policy, on an `api = "openai"` service.
    pub fn models(&self) -> Option<&Models> {
        self.settings.openai.as_ref()
    }
}

/// Which `Route` a request took, once routed and authorised; an index into the gateway's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteId(u32);

impl RouteId {
    pub fn new(index: usize) -> RouteId {
        RouteId(index as u32)
    }

    pub fn index(self) -> usize {
        self.0 as usize
    }
}
