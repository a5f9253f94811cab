//! How many client connections the process has open, in all and per client address: what
//! `[server] max_connections` and `max_connections_per_client` are checked against. A place is
//! taken when a connection is accepted and given back when its `Slot` is dropped.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::IntGauge;

/// Per-client counts are split over this many locks, so that accepts on different worker
/// threads rarely wait on each other; each lock is held for one map operation.
const SHARDS: usize = 64;

pub(crate) struct Counts {
    max_total: usize,
    max_per_client: usize,
    total: AtomicUsize,
    /// `portcullis_connections_open`: `total`, for scrapes.
    open: IntGauge,
    hasher: RandomState,
    per_client: Box<[Mutex<HashMap<IpAddr, usize>>]>,
}

/// Why a connection was not admitted: the `reason` label of
/// `portcullis_connections_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Total,
    PerClient,
}

/// One open connection's place in the counts, given back when dropped.
pub(crate) struct Slot {
    counts: Arc<Counts>,
    client: IpAddr,
}

impl Counts {
    pub(crate) fn new(max_total: usize, max_per_client: usize, open: IntGauge) -> Arc<Counts> {
        Arc::new(Counts {
            max_total,
            max_per_client,
            total: AtomicUsize::new(0),
            open,
            hasher: RandomState::new(),
            per_client: (0..SHARDS).map(|_| Mutex::default()).collect(),
        })
    }

    /// A place for a connection from `client`, unless that client or the process is at its
    /// limit. The client's own limit is checked first: it names the one to blame.
    pub(crate) fn acquire(self: &Arc<Self>, client: IpAddr) -> Result<Slot, Refusal> {
        // An IPv4 client reaching a dual-stack listener shows as ::ffff:a.b.c.d.
        let client = client.to_canonical();
        let mut shard = self.shard(&client);
        if shard
            .get(&client)
            .is_some_and(|&open| open >= self.max_per_client)
        {
            return Err(Refusal::PerClient);
        }
        if self.total.fetch_add(1, Ordering::AcqRel) >= self.max_total {
            self.total.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::Total);
        }
        *shard.entry(client).or_insert(0) += 1;
        self.open.inc();
        Ok(Slot {
            counts: self.clone(),
            client,
        })
    }

    fn shard(&self, client: &IpAddr) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        let i = self.hasher.hash_one(client) as usize % SHARDS;
        // A panic elsewhere while holding a shard leaves its counts valid: keep counting.
        self.per_client[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Connections open now, in all.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let counts = &self.counts;
        let mut shard = counts.shard(&self.client);
        if let Some(open) = shard.get_mut(&self.client) {
            *open -= 1;
            if *open == 0 {
                // Only clients with open connections are kept: the map stays as small as the
                // connections themselves.
                shard.remove(&self.client);
            }
        }
        counts.total.fetch_sub(1, Ordering::AcqRel);
        counts.open.dec();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn counts(max_total: usize, max_per_client: usize) -> Arc<Counts> {
        Counts::new(
            max_total,
            max_per_client,
            IntGauge::new("open", "test").unwrap(),
        )
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_client_over_its_limit_is_refused_others_are_not_and_drops_give_places_back() {
        let counts = counts(10, 2);
        let a1 = counts.acquire(ip("10.0.0.1")).unwrap();
        let _a2 = counts.acquire(ip("10.0.0.1")).unwrap();
        assert_eq!(
            counts.acquire(ip("10.0.0.1")).err(),
            Some(Refusal::PerClient)
        );
        // The same client through a dual-stack listener is the same client.
        assert_eq!(
            counts.acquire(ip("::ffff:10.0.0.1")).err(),
            Some(Refusal::PerClient)
        );
        let _b = counts.acquire(ip("10.0.0.2")).unwrap();
        assert_eq!(counts.open(), 3);
        drop(a1);
        let _a3 = counts.acquire(ip("10.0.0.1")).unwrap();
        assert_eq!(counts.open(), 3);
    }

    #[test]
    fn the_total_is_shared_by_every_client_and_a_refusal_takes_nothing() {
        let counts = counts(2, 2);
        let a = counts.acquire(ip("10.0.0.1")).unwrap();
        let _b = counts.acquire(ip("10.0.0.2")).unwrap();
        assert_eq!(counts.acquire(ip("10.0.0.3")).err(), Some(Refusal::Total));
        assert_eq!(counts.open(), 2);
        drop(a);
        let _c = counts.acquire(ip("10.0.0.3")).unwrap();
        assert_eq!(counts.acquire(ip("10.0.0.1")).err(), Some(Refusal::Total));
        assert_eq!(counts.open.get(), 2);
    }

    #[test]
    fn no_client_is_remembered_once_its_connections_are_gone() {
        let counts = counts(100, 5);
        let slots: Vec<_> = (0..50)
            .map(|i| counts.acquire(ip(&format!("10.0.1.{i}"))).unwrap())
            .collect();
        drop(slots);
        let remembered: usize = counts
            .per_client
            .iter()
            .map(|s| s.lock().unwrap().len())
            .sum();
        assert_eq!((counts.open(), remembered), (0, 0));
        assert_eq!(counts.open.get(), 0);
    }
}
