//! Per-principal request limits per service (`rate_limit_per_minute`).
//!
//! Without `[rate_limits] redis` each process counts on its own (`local`), lock-free. With it,
//! every gateway sharing that Redis enforces one limit together (`limits::redis`: GCRA in a Lua
//! script, one round trip per limited request), and a request that Redis does not answer
//! within 50 ms is decided by the per-process count instead: never by no limit.

pub(super) mod local;

use std::sync::Arc;

use crate::auth::Principal;

pub(crate) use self::local::Limiter;
use super::redis::{self, SharedRedis};

/// One service's limit.
pub(crate) enum Limit {
    None,
    Local(Limiter),
    Shared(redis::Shared),
}

impl Limit {
    /// `backend`: this process's Redis, when `[rate_limits] redis` is set.
    pub(crate) fn new(
        service: &str,
        per_minute: Option<u32>,
        backend: Option<&Arc<SharedRedis>>,
    ) -> Limit {
        match (per_minute, backend) {
            (None, _) => Limit::None,
            (Some(n), None) => Limit::Local(Limiter::per_minute(n)),
            (Some(n), Some(b)) => Limit::Shared(redis::Shared::new(b.clone(), service, n)),
        }
    }

    /// Counts this request; `Err(seconds)` (the Retry-After) when it is over the limit.
    pub(crate) async fn check(&self, principal: &Principal) -> Result<(), u64> {
        match self {
            Limit::None => Ok(()),
            Limit::Local(local) => local.check(principal),
            // Boxed: the Redis call's state would otherwise make every request's future larger.
            Limit::Shared(shared) => Box::pin(shared.check(principal)).await,
        }
    }
}

#[cfg(test)]
mod tests;
