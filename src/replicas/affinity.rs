//! `balance = "prefix_affinity"`: consistent hashing with bounded loads. Each replica owns
//! the keys that fall after its points on a hash ring, so a conversation keeps going to the
//! replica whose prefix cache holds it, and a replica that leaves or fails gives only its own
//! keys to the next replicas on the ring. A replica takes a key only while under the load
//! bound; over it, the key spills to the next replica on the ring that is under it.

use xxhash_rust::xxh3::xxh3_64;

use prometheus::IntCounter;

/// Points per replica: enough that each replica's share of keys is within a few percent of
/// 1/n, few enough that the ring of 64 replicas stays in the L2 cache.
const POINTS_PER_REPLICA: usize = 160;

/// What the choice made of the request's key: the `result` label of
/// `portcullis_affinity_total` and the access log's `affinity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity {
    /// The key's own replica took it.
    Hit,
    /// Its replica was over the bound, out of rotation or already tried: another took it.
    Spill,
    /// No key (no `X-Session-Id`, no body read): least_requests chose.
    NoKey,
}

impl Affinity {
    pub const ALL: [Affinity; 3] = [Affinity::Hit, Affinity::Spill, Affinity::NoKey];

    pub fn as_str(self) -> &'static str {
        match self {
            Affinity::Hit => "hit",
            Affinity::Spill => "spill",
            Affinity::NoKey => "none",
        }
    }
}

/// The ring of a service's replicas, built once at start-up: the replica set is the
/// configured list (DNS changes a replica's addresses, never the list).
pub(crate) struct Ring {
    /// (point, replica index), sorted by point.
    points: Box<[(u64, u8)]>,
    replicas: usize,
}

impl Ring {
    /// Points come from the configured `host:port` labels, so every gateway of a fleet with
    /// the same config builds the same ring and sends a conversation to the same replica.
    pub(crate) fn new<'a>(labels: impl ExactSizeIterator<Item = &'a str>) -> Ring {
        let replicas = labels.len();
        let mut points = Vec::with_capacity(replicas * POINTS_PER_REPLICA);
        let mut name = Vec::new();
        for (i, label) in labels.enumerate() {
            for v in 0..POINTS_PER_REPLICA {
                name.clear();
                name.extend_from_slice(label.as_bytes());
                name.push(b'#');
                name.extend_from_slice(v.to_string().as_bytes());
                points.push((xxh3_64(&name), i as u8));
            }
        }
        points.sort_unstable();
        Ring {
            points: points.into(),
            replicas,
        }
    }

    /// Every replica once, in ring order from `key`'s place: its owner first.
    pub(crate) fn walk(&self, key: u64) -> Walk<'_> {
        Walk {
            start: self.points.partition_point(|&(p, _)| p < key),
            ring: self,
            steps: 0,
            seen: 0,
            left: self.replicas,
        }
    }
}

pub(crate) struct Walk<'a> {
    ring: &'a Ring,
    start: usize,
    steps: usize,
    /// Bit i: replica i was yielded.
    seen: u64,
    left: usize,
}

impl Iterator for Walk<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let points = &self.ring.points;
        while self.left > 0 && self.steps < points.len() {
            let (_, r) = points[(self.start + self.steps) % points.len()];
            self.steps += 1;
            if self.seen & (1 << r) == 0 {
                self.seen |= 1 << r;
                self.left -= 1;
                return Some(r as usize);
            }
        }
        None
    }
}

/// The most requests a replica may have in flight and still take one more for its keys:
/// ⌈factor × (in flight across the service + 1) / replicas in rotation⌉. Never below 1, so an
/// idle service never spills.
pub(crate) fn bound(load_factor: f64, total_in_flight: usize, in_rotation: usize) -> usize {
    let mean = (total_in_flight + 1) as f64 / in_rotation.max(1) as f64;
    ((load_factor * mean).ceil() as usize).max(1)
}

/// `portcullis_affinity_total{service, result}` of one service, present at 0 from start-up.
pub(crate) struct Counters([IntCounter; 3]);

impl Counters {
    pub(crate) fn new(metrics: &crate::observe::metrics::Metrics, service: &str) -> Counters {
        Counters(Affinity::ALL.map(|a| metrics.affinity(service, a.as_str())))
    }

    pub(crate) fn count(&self, result: Affinity) {
        self.0[result as usize].inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(n: usize) -> Ring {
        let labels: Vec<String> = (0..n).map(|i| format!("10.0.0.{i}:8000")).collect();
        Ring::new(labels.iter().map(String::as_str))
    }

    #[test]
    fn a_walk_visits_every_replica_once_and_keys_spread_evenly() {
        let r = ring(3);
        let mut owners = [0usize; 3];
        for k in 0..30_000u64 {
            let walk: Vec<usize> = r.walk(xxh3_64(&k.to_le_bytes())).collect();
            let mut sorted = walk.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2]);
            owners[walk[0]] += 1;
        }
        for o in owners {
            assert!((8_000..12_000).contains(&o), "{owners:?}");
        }
    }

    #[test]
    fn a_replica_added_takes_keys_only_from_others_never_moves_theirs() {
        let (three, four) = (ring(3), ring(4));
        let mut moved = 0;
        for k in 0..10_000u64 {
            let key = xxh3_64(&k.to_le_bytes());
            let (before, after) = (three.walk(key).next(), four.walk(key).next());
            if before != after {
                assert_eq!(after, Some(3), "a key only ever moves to the new replica");
                moved += 1;
            }
        }
        assert!(
            (2_000..3_000).contains(&moved),
            "about a quarter moves: {moved}"
        );
    }

    #[test]
    fn the_bound_is_the_factor_times_the_mean_rounded_up() {
        assert_eq!(bound(1.25, 0, 3), 1, "an idle service never spills");
        assert_eq!(bound(1.25, 2, 3), 2);
        assert_eq!(bound(1.25, 11, 3), 5);
        assert_eq!(bound(2.0, 5, 0), 12, "no replica in rotation counts as one");
    }
}
