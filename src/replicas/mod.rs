//! A service's replicas at run time: which one a request goes to (`least_requests`,
//! `round_robin` or `prefix_affinity`, `affinity.rs`), which are in rotation (active health
//! checks, passive ejection after connect failures), and their current addresses (re-resolved
//! off the request path, `dns.rs`).
//!
//! The request path only reads atomics and one `ArcSwap` per replica: no lock, no await, no
//! allocation beyond the peer clone every proxied request already paid for.

mod affinity;
mod dns;
mod health;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::HeaderValue;
use pingora::upstreams::peer::HttpPeer;
use prometheus::{IntCounter, IntGauge};

use crate::config::{Balance, Balancing, ServiceConfig, Upstream};
use crate::observe::metrics::Metrics;

pub(crate) use affinity::Affinity;
pub(crate) use dns::{DnsRefresh, MakePeer, UpstreamResolver};
pub(crate) use health::HealthChecks;

pub struct Replicas {
    pub service: Box<str>,
    balance: Balance,
    members: Box<[Replica]>,
    /// With `prefix_affinity`: the ring and the `portcullis_affinity_total` counters.
    affinity: Option<(affinity::Ring, affinity::Counters)>,
    /// Where the next rotation (round robin, or the tie-break of least_requests) starts.
    turn: AtomicUsize,
    eject_after: u32,
    eject_for: Duration,
    /// The zero of every replica's `ejected_until_ms`.
    epoch: Instant,
}

pub struct Replica {
    /// The configured `host:port`: the metric and access-log label.
    pub label: Box<str>,
    /// Sent as `Host` to this replica.
    pub host_header: HeaderValue,
    /// One prepared peer per current address of the host.
    peers: ArcSwap<Vec<HttpPeer>>,
    next_address: AtomicUsize,
    in_flight: AtomicUsize,
    /// The last active health check passed (true without checks).
    checked_healthy: AtomicBool,
    connect_failures: AtomicU32,
    /// Out of rotation until then (ms since `epoch`), after `eject_after` connect failures.
    ejected_until_ms: AtomicU64,
    healthy_gauge: IntGauge,
    connect_failures_total: IntCounter,
}

/// The replica a request goes to. Counts as in flight until released or dropped (the response
/// ended, or the request moved to another replica after a connect failure). A service with
/// one replica counts nothing: there is nothing to balance.
pub struct Chosen {
    pub index: usize,
    /// On a `prefix_affinity` service, what the choice made of the request's key.
    pub affinity: Option<Affinity>,
    counted: Option<Arc<Replicas>>,
}

impl Drop for Chosen {
    fn drop(&mut self) {
        self.release();
    }
}

impl Chosen {
    fn with(mut self, affinity: Option<Affinity>) -> Chosen {
        self.affinity = affinity;
        self
    }

    /// No longer in flight on the replica; which replica it was is still known.
    pub fn release(&mut self) {
        if let Some(replicas) = self.counted.take() {
            replicas.members[self.index]
                .in_flight
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Replicas {
    /// Peers are built by `make_peer` (the service's timeouts, TLS and trust) for each address.
    pub fn new(
        service: &ServiceConfig,
        metrics: &Metrics,
        make_peer: &dyn Fn(&Upstream, std::net::SocketAddr) -> HttpPeer,
    ) -> Replicas {
        let b: &Balancing = &service.balancing;
        let members = service
            .replicas
            .iter()
            .map(|up| {
                let label: Box<str> = format!("{}:{}", bracketed(&up.host), up.port).into();
                let gauge = metrics.upstream_healthy(&service.name, &label);
                let failures = metrics.upstream_connect_failures(&service.name, &label);
                gauge.set(1);
                Replica {
                    host_header: up.host_header.clone(),
                    peers: ArcSwap::from_pointee(
                        up.addresses.iter().map(|a| make_peer(up, *a)).collect(),
                    ),
                    label,
                    next_address: AtomicUsize::new(0),
                    in_flight: AtomicUsize::new(0),
                    checked_healthy: AtomicBool::new(true),
                    connect_failures: AtomicU32::new(0),
                    ejected_until_ms: AtomicU64::new(0),
                    healthy_gauge: gauge,
                    connect_failures_total: failures,
                }
            })
            .collect::<Box<[Replica]>>();
        let affinity = matches!(b.balance, Balance::PrefixAffinity { .. }).then(|| {
            let ring = affinity::Ring::new(members.iter().map(|r| &*r.label));
            (ring, affinity::Counters::new(metrics, &service.name))
        });
        Replicas {
            service: service.name.as_str().into(),
            balance: b.balance,
            members,
            affinity,
            turn: AtomicUsize::new(0),
            eject_after: b.eject_after,
            eject_for: b.eject_for,
            epoch: Instant::now(),
        }
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn members(&self) -> &[Replica] {
        &self.members
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn in_rotation(&self, r: &Replica, now_ms: u64) -> bool {
        r.checked_healthy.load(Ordering::Relaxed)
            && r.ejected_until_ms.load(Ordering::Relaxed) <= now_ms
    }

    /// Whether requests should bring an affinity key (`prefix_affinity`): else none is made.
    pub fn keyed(&self) -> bool {
        self.affinity.is_some()
    }

    /// Counts a finished request's affinity result.
    pub fn count_affinity(&self, result: Affinity) {
        if let Some((_, counters)) = &self.affinity {
            counters.count(result);
        }
    }

    /// `choose` without an affinity key.
    pub fn choose(self: &Arc<Self>, tried: u64) -> Option<(Chosen, HttpPeer)> {
        self.choose_for(tried, None)
    }

    /// The replica for a request that already tried those in `tried` (bit i = replica i), and
    /// the peer to connect to. Replicas in rotation first; with none left, any untried one
    /// (better a likely 502 than a certain one). `None` when every replica was tried. `key`:
    /// the request's affinity key, on a `prefix_affinity` service.
    pub fn choose_for(
        self: &Arc<Self>,
        tried: u64,
        key: Option<u64>,
    ) -> Option<(Chosen, HttpPeer)> {
        let n = self.members.len();
        // Every replica has an address: start-up resolves each or fails, and a refresh only
        // ever swaps in a non-empty set.
        let untried = |i: usize| tried & (1 << i) == 0;
        let result = self.affinity.as_ref().map(|_| match key {
            Some(_) => Affinity::Hit,
            None => Affinity::NoKey,
        });
        if n == 1 {
            // One replica: nothing to choose, and nothing to pay for choosing.
            let chosen = if tried & 1 == 0 { self.again(0) } else { None };
            return chosen.map(|(c, peer)| (c.with(result), peer));
        }
        let now = self.now_ms();
        if let (Some((ring, _)), Some(key), Balance::PrefixAffinity { load_factor }) =
            (&self.affinity, key, self.balance)
        {
            if let Some((index, result)) = self.affine(ring, key, load_factor, tried, now) {
                return self
                    .again(index)
                    .map(|(c, peer)| (c.with(Some(result)), peer));
            }
        }
        let spilled = result.map(|r| match r {
            Affinity::Hit => Affinity::Spill,
            other => other,
        });
        let index = {
            let start = self.turn.fetch_add(1, Ordering::Relaxed);
            let pick = |usable: &dyn Fn(usize) -> bool| -> Option<usize> {
                let mut best: Option<(usize, usize)> = None;
                for k in 0..n {
                    let i = (start + k) % n;
                    if !usable(i) {
                        continue;
                    }
                    match self.balance {
                        Balance::RoundRobin => return Some(i),
                        Balance::LeastRequests | Balance::PrefixAffinity { .. } => {
                            let load = self.members[i].in_flight.load(Ordering::Relaxed);
                            if best.is_none_or(|(_, b)| load < b) {
                                best = Some((i, load));
                            }
                        }
                    }
                }
                best.map(|(i, _)| i)
            };
            pick(&|i| untried(i) && self.in_rotation(&self.members[i], now))
                .or_else(|| pick(&untried))?
        };
        self.again(index).map(|(c, peer)| (c.with(spilled), peer))
    }

    /// The first replica on the ring from `key` that is untried, in rotation and under the
    /// load bound: a hit if it is the key's own, else a spill. `None` when none is under it
    /// (the least loaded then takes the request, a spill).
    fn affine(
        &self,
        ring: &affinity::Ring,
        key: u64,
        load_factor: f64,
        tried: u64,
        now: u64,
    ) -> Option<(usize, Affinity)> {
        let (mut total, mut rotation) = (0, 0);
        for r in self.members.iter() {
            total += r.in_flight.load(Ordering::Relaxed);
            rotation += self.in_rotation(r, now) as usize;
        }
        let bound = affinity::bound(load_factor, total, rotation);
        for (k, i) in ring.walk(key).enumerate() {
            let r = &self.members[i];
            let usable = tried & (1 << i) == 0 && self.in_rotation(r, now);
            if usable && r.in_flight.load(Ordering::Relaxed) < bound {
                let result = if k == 0 {
                    Affinity::Hit
                } else {
                    Affinity::Spill
                };
                return Some((i, result));
            }
        }
        None
    }

    /// Replica `index` again, for a retry that must stay with it.
    pub fn again(self: &Arc<Self>, index: usize) -> Option<(Chosen, HttpPeer)> {
        let replica = self.members.get(index)?;
        let peers = replica.peers.load();
        let peer = match peers.len() {
            0 => return None,
            1 => peers[0].clone(),
            n => peers[replica.next_address.fetch_add(1, Ordering::Relaxed) % n].clone(),
        };
        let counted = (self.members.len() > 1).then(|| {
            replica.in_flight.fetch_add(1, Ordering::Relaxed);
            self.clone()
        });
        let affinity = None;
        Some((
            Chosen {
                index,
                affinity,
                counted,
            },
            peer,
        ))
    }

    /// The configured `host:port` of replica `index`.
    pub fn label(&self, index: usize) -> &str {
        &self.members[index].label
    }

    /// The `Host` header replica `index` is sent.
    pub fn host_header(&self, index: usize) -> &HeaderValue {
        &self.members[index].host_header
    }

    /// A connect to replica `index` was refused or timed out.
    pub fn connect_failed(&self, index: usize) {
        let r = &self.members[index];
        r.connect_failures_total.inc();
        let failures = r.connect_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures == self.eject_after {
            let until = self.now_ms() + self.eject_for.as_millis() as u64;
            r.ejected_until_ms.store(until, Ordering::Relaxed);
            r.healthy_gauge.set(0);
            log::warn!(
                "service {} replica {}: {failures} connect failures in a row, out of rotation for {} s",
                self.service,
                r.label,
                self.eject_for.as_secs()
            );
        }
    }

    /// A connection to replica `index` was made (or reused).
    pub fn connected(&self, index: usize) {
        let r = &self.members[index];
        // Read first: every request passes here, and almost never with a failure to clear.
        if r.connect_failures.load(Ordering::Relaxed) == 0 {
            return;
        }
        if r.connect_failures.swap(0, Ordering::Relaxed) >= self.eject_after {
            r.ejected_until_ms.store(0, Ordering::Relaxed);
            self.refresh_gauge(r);
            log::warn!(
                "service {} replica {}: connects again, back in rotation",
                self.service,
                r.label
            );
        }
    }

    /// The result of an active health check of replica `index`.
    fn checked(&self, index: usize, healthy: bool, why: &str) {
        let r = &self.members[index];
        let was = r.checked_healthy.swap(healthy, Ordering::Relaxed);
        if healthy {
            // A pass also ends a passive ejection: the replica answers again.
            r.ejected_until_ms.store(0, Ordering::Relaxed);
            r.connect_failures.store(0, Ordering::Relaxed);
        }
        if was != healthy {
            if healthy {
                log::warn!(
                    "service {} replica {}: health check passes, back in rotation",
                    self.service,
                    r.label
                );
            } else {
                log::warn!(
                    "service {} replica {}: health check failed ({why}), out of rotation",
                    self.service,
                    r.label
                );
            }
        }
        self.refresh_gauge(r);
    }

    /// `portcullis_upstream_healthy` from the replica's state now (an ejection that ran out
    /// shows as healthy again).
    fn refresh_gauge(&self, r: &Replica) {
        r.healthy_gauge
            .set(self.in_rotation(r, self.now_ms()) as i64);
    }

    pub fn refresh_gauges(&self) {
        for r in self.members.iter() {
            self.refresh_gauge(r);
        }
    }
}

/// An IPv6 literal in brackets, as in a URL.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

#[cfg(test)]
mod tests;
