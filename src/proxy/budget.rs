//! The memory bound of every body the gateway holds whole at once (`buffered_bodies_max_bytes`):
//! one atomic count of reserved bytes shared by all requests. A request reserves before it
//! allocates and gives its bytes back when its `Reservation` drops, so an upload that aborts,
//! times out or is refused returns its share at once, whatever path it ends by.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// `bytes` of the budget, or None when they would take it past its limit.
    pub fn reserve(self: &Arc<Budget>, bytes: u64) -> Option<Reservation> {
        self.take(bytes).then(|| Reservation {
            budget: Arc::clone(self),
            bytes,
        })
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, bytes: u64) -> bool {
        // A plain counter: nothing else is published through it, so Relaxed is enough.
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }
}

/// Bytes held from the budget until dropped.
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Reservation {
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reserves `more` bytes besides; false, and nothing taken, when the budget is spent.
    pub fn grow(&mut self, more: u64) -> bool {
        let taken = self.budget.take(more);
        if taken {
            self.bytes += more;
        }
        taken
    }

    /// Gives back what is held beyond `bytes`.
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.budget
                .used
                .fetch_sub(self.bytes - bytes, Ordering::Relaxed);
            self.bytes = bytes;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_the_limit_and_are_given_back_when_dropped() {
        let budget = Budget::new(100);
        let mut a = budget.reserve(60).unwrap();
        assert!(budget.reserve(41).is_none());
        let b = budget.reserve(40).unwrap();
        assert_eq!(budget.used(), 100);
        assert!(!a.grow(1));
        assert_eq!(a.bytes(), 60);
        drop(b);
        assert!(a.grow(40));
        assert_eq!(budget.used(), 100);
        a.shrink_to(10);
        assert_eq!(budget.used(), 10);
        a.shrink_to(50);
        assert_eq!(a.bytes(), 10, "shrink_to never grows");
        drop(a);
        assert_eq!(budget.used(), 0);
        // A request as large as the whole budget still fits alone; an overflow never wraps.
        let all = budget.reserve(100).unwrap();
        assert!(budget.reserve(u64::MAX).is_none());
        drop(all);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let budget = Budget::new(1000);
        let peak = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        if let Some(r) = budget.reserve(300) {
                            peak.fetch_max(budget.used(), Ordering::Relaxed);
                            drop(r);
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Relaxed) <= 1000);
        assert_eq!(budget.used(), 0);
    }
}
