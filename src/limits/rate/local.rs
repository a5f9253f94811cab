//! The per-process limiter, lock-free on the request path: counts per process and per fixed
//! one-minute window, estimated with Pingora's count-min sketch, so a caller may burst to
//! twice the limit across a window edge. It is the whole limit without `[rate_limits] redis`,
//! and the fallback when Redis fails.

use std::time::Duration;

use pingora_limits::rate::{Rate, RateComponents};

use crate::auth::Principal;

/// The window, and the longest Retry-After this limiter gives.
const WINDOW: Duration = Duration::from_secs(60);
/// Wider than Pingora's default (1024) so distinct callers rarely share all four counters.
const SLOTS: usize = 4096;
const HASHES: usize = 4;

pub(crate) struct Limiter {
    rate: Rate,
    per_window: isize,
}

impl Limiter {
    pub(crate) fn per_minute(limit: u32) -> Limiter {
        Limiter {
            rate: Rate::new_with_estimator_config(WINDOW, HASHES, SLOTS),
            per_window: limit as isize,
        }
    }

    /// Counts this request; `Err(seconds)` until the window ends if it is over the limit.
    pub(crate) fn check(&self, principal: &Principal) -> Result<(), u64> {
        let key = principal.rate_subject();
        if self.rate.observe(&key, 1) <= self.per_window {
            return Ok(());
        }
        let left = self.rate.rate_with(&key, |c: RateComponents| {
            c.interval.as_secs_f64() * (1.0 - c.current_interval_fraction)
        });
        Err(left.ceil().clamp(1.0, WINDOW.as_secs_f64()) as u64)
    }
}
