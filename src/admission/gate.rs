//! One listening service's gate: the connection filter Pingora calls on every accept, before
//! any TLS handshake, which takes the connection's place in the counts or closes it at once.
//!
//! The filter sees only the peer address and cannot outlive the accept, so the place it took
//! is parked under that address until the connection's task claims it (`Admitted`) and ties it
//! to the stream. A TLS handshake that fails never reaches the task: its place is dropped once
//! it has been parked longer than Pingora lets a handshake take.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::listeners::ConnectionFilter;
use prometheus::{IntCounter, IntCounterVec};

use super::count::{Counts, Refusal, Slot};

/// Pingora gives a downstream TLS handshake 60 s (`services/listening.rs`), then drops the
/// connection; a place parked longer belongs to a connection that is gone.
const PARKED_AT_MOST: Duration = Duration::from_secs(65);
/// How often the accept path looks for such places.
const SWEEP_EVERY_MS: u64 = 1000;
const SHARDS: usize = 16;

type Parked = HashMap<SocketAddr, (Slot, Instant)>;

pub(crate) struct Gate {
    counts: Arc<Counts>,
    pub(super) header_timeout: Duration,
    refused_total: IntCounter,
    refused_per_client: IntCounter,
    pub(super) header_timeouts: IntCounter,
    hasher: RandomState,
    parked: Box<[Mutex<Parked>]>,
    started: Instant,
    last_sweep_ms: AtomicU64,
}

impl Gate {
    /// The gate of the listeners labelled `listener` in `refused`.
    pub(super) fn new(
        counts: Arc<Counts>,
        header_timeout: Duration,
        refused: &IntCounterVec,
        listener: &str,
    ) -> Gate {
        // Resolved once, so that refusing costs no label lookup; present at 0 from start-up.
        let counter = |reason: &str| refused.with_label_values(&[listener, reason]);
        Gate {
            counts,
            header_timeout,
            refused_total: counter("total"),
            refused_per_client: counter("per_client"),
            header_timeouts: counter("header_timeout"),
            hasher: RandomState::new(),
            parked: (0..SHARDS).map(|_| Mutex::default()).collect(),
            started: Instant::now(),
            last_sweep_ms: AtomicU64::new(0),
        }
    }

    /// Takes a place for a connection from `peer` and parks it; `false`: refused (counted).
    /// A connection without an IP peer (none here) is let through uncounted.
    fn admit(&self, peer: Option<&SocketAddr>) -> bool {
        let Some(peer) = peer else {
            return true;
        };
        self.sweep();
        match self.counts.acquire(peer.ip()) {
            Ok(slot) => {
                // Two listeners of one service reached from the same client port would share
                // the key: the older place is then given back early, never kept forever.
                self.shard(peer).insert(*peer, (slot, Instant::now()));
                true
            }
            Err(refusal) => {
                self.refused(refusal);
                false
            }
        }
    }

    /// The place of the connection from `peer`: the one the filter parked, or a new one when
    /// the filter's was swept or never taken. `Err`: refused (counted), close the connection.
    pub(super) fn claim(&self, peer: Option<&SocketAddr>) -> Result<Option<Slot>, Refusal> {
        let Some(peer) = peer else {
            return Ok(None);
        };
        if let Some((slot, _)) = self.shard(peer).remove(peer) {
            return Ok(Some(slot));
        }
        self.counts.acquire(peer.ip()).map(Some).inspect_err(|&r| {
            self.refused(r);
        })
    }

    fn refused(&self, refusal: Refusal) {
        match refusal {
            Refusal::Total => self.refused_total.inc(),
            Refusal::PerClient => self.refused_per_client.inc(),
        }
    }

    fn shard(&self, peer: &SocketAddr) -> std::sync::MutexGuard<'_, Parked> {
        let i = self.hasher.hash_one(peer) as usize % SHARDS;
        self.parked[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops places parked too long, at most once a second (one accept does it).
    fn sweep(&self) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        if now_ms < last + SWEEP_EVERY_MS
            || self
                .last_sweep_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        for shard in self.parked.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            shard.retain(|_, (_, at)| at.elapsed() < PARKED_AT_MOST);
        }
    }

    #[cfg(test)]
    fn parked(&self) -> usize {
        self.parked.iter().map(|s| s.lock().unwrap().len()).sum()
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate").finish_non_exhaustive()
    }
}

#[async_trait]
impl ConnectionFilter for Gate {
    async fn should_accept(&self, peer: Option<&SocketAddr>) -> bool {
        self.admit(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(max_total: usize, max_per_client: usize) -> (Gate, Arc<Counts>) {
        let refused = IntCounterVec::new(
            prometheus::Opts::new("refused", "test"),
            &["listener", "reason"],
        )
        .unwrap();
        let counts = super::super::count::tests::counts(max_total, max_per_client);
        let gate = Gate::new(counts.clone(), Duration::from_secs(1), &refused, "data");
        (gate, counts)
    }

    fn peer(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_place_taken_on_accept_is_claimed_once_by_the_connection() {
        let (gate, counts) = gate(10, 1);
        let a = peer("10.0.0.1:4000");
        assert!(gate.admit(Some(&a)));
        assert!(!gate.admit(Some(&peer("10.0.0.1:4001"))), "over its limit");
        assert_eq!(gate.refused_per_client.get(), 1);
        let slot = gate.claim(Some(&a)).unwrap().expect("the parked place");
        assert_eq!((gate.parked(), counts.open()), (0, 1));
        drop(slot);
        assert_eq!(counts.open(), 0);
        // Not through the filter (or swept): the claim takes a place of its own.
        let again = gate.claim(Some(&a)).unwrap();
        assert!(again.is_some());
        assert_eq!(
            gate.claim(Some(&peer("10.0.0.1:4002"))).err(),
            Some(Refusal::PerClient)
        );
    }

    #[test]
    fn places_of_connections_that_never_reached_their_task_are_swept() {
        let (mut gate, counts) = gate(10, 10);
        assert!(gate.admit(Some(&peer("10.0.0.1:4000"))));
        // As if the gate had been running for a while (the last sweep long ago).
        gate.started = Instant::now() - Duration::from_secs(5);
        let stale = Instant::now() - PARKED_AT_MOST;
        for shard in gate.parked.iter() {
            for (_, at) in shard.lock().unwrap().values_mut() {
                *at = stale;
            }
        }
        assert!(gate.admit(Some(&peer("10.0.0.2:4000"))));
        assert_eq!((gate.parked(), counts.open()), (1, 1));
    }
}
