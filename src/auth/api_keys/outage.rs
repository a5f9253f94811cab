//! Remembers that the key store is down, so that a dead store costs the gateway one attempt a
//! second instead of a wait (up to the pool's acquire timeout) and a warning per request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// While the store is down, at most one lookup per this interval goes to it.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_secs(1);

pub(crate) struct StoreHealth {
    down: AtomicBool,
    /// Set by the revocation listener while its connection to the store is lost: no request
    /// then waits on the store at all; the listener's reconnection is the probe.
    held_down: AtomicBool,
    /// Milliseconds since `epoch` before which no new attempt is made while down.
    next_attempt_ms: AtomicU64,
    epoch: Instant,
}

impl Default for StoreHealth {
    fn default() -> StoreHealth {
        StoreHealth {
            down: AtomicBool::new(false),
            held_down: AtomicBool::new(false),
            next_attempt_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl StoreHealth {
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// Whether a lookup may go to the store now: always while it is up; while it is down, only
    /// the one caller that claims the next attempt slot.
    pub(crate) fn may_try(&self) -> bool {
        if !self.is_down() {
            return true;
        }
        if self.held_down.load(Ordering::Acquire) {
            return false;
        }
        let now = self.now_ms();
        let at = self.next_attempt_ms.load(Ordering::Acquire);
        now >= at
            && self
                .next_attempt_ms
                .compare_exchange(at, now + retry_ms(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The listener lost its connection and could not get it back: the store is down.
    pub(crate) fn hold_down(&self, error: &dyn std::fmt::Display) {
        self.held_down.store(true, Ordering::Release);
        self.failed(error);
    }

    /// The listener is connected again: the store answers.
    pub(crate) fn release(&self) {
        if self.held_down.swap(false, Ordering::AcqRel) {
            self.succeeded();
        }
    }

    pub(crate) fn succeeded(&self) {
        if self.down.swap(false, Ordering::AcqRel) {
            log::warn!("api key store is reachable again");
        }
    }

    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        self.next_attempt_ms
            .store(self.now_ms() + retry_ms(), Ordering::Release);
        if !self.down.swap(true, Ordering::AcqRel) {
            log::warn!(
                "api key store unavailable ({error}): cached keys keep working, other keys get 401; \
                 retrying at most once a second"
            );
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

fn retry_ms() -> u64 {
    RETRY_INTERVAL.as_millis() as u64
}
