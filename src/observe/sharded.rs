//! Per-worker-thread copies of the metrics the request path writes, summed when scraped.
//!
//! A Prometheus counter is an atomic, a histogram a few (a count, a bucket, a sum updated by
//! compare-and-swap), and every worker thread writes them on every request: on many cores the
//! cache lines holding them move from core to core on each write, and the per-core rate falls
//! as threads are added (issue 33). Here each thread writes a copy of its own, its shard, chosen
//! once per thread; `/metrics` sums the copies, so it shows the same names, labels and values
//! one shared metric would.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Counter, Histogram, LabelPair, Metric, MetricFamily, MetricType};

/// Copies of each sharded metric. Threads beyond this many share copies: still exact, only
/// shared again.
pub(crate) const SHARDS: usize = 32;

/// The next shard to hand out: threads take them in turn.
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, once it has one.
    static SHARD: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The shard of the calling thread: chosen on its first call, the same ever after.
pub(crate) fn shard() -> usize {
    SHARD.with(|s| match s.get() {
        Some(n) => n,
        None => {
            let n = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
            s.set(Some(n));
            n
        }
    })
}

/// A value alone on its cache lines: 128 bytes, as adjacent x86 lines are fetched in pairs.
/// Per-thread state in an array without it shares lines with its neighbours' (false
/// sharing), and their writes bounce those lines between cores as a shared one would.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// `SHARDS` copies of one metric vector, made alike and registered nowhere themselves: the
/// registry gets this, which collects them as one.
#[derive(Clone)]
pub(crate) struct Sharded<V> {
    shards: Box<[V]>,
}

impl<V: Collector> Sharded<V> {
    pub(crate) fn new(make: impl Fn() -> V) -> Sharded<V> {
        Sharded {
            shards: (0..SHARDS).map(|_| make()).collect(),
        }
    }

    /// The calling thread's copy.
    pub(crate) fn local(&self) -> &V {
        &self.shards[shard()]
    }

    /// Every copy, by shard.
    pub(crate) fn all(&self) -> &[V] {
        &self.shards
    }
}

impl<V: Collector> Collector for Sharded<V> {
    fn desc(&self) -> Vec<&Desc> {
        self.shards[0].desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        merge(self.shards.iter().flat_map(|s| s.collect()))
    }
}

/// One series' sum over the shards: a counter's value, or a histogram's count, sum and
/// cumulative bucket counts.
struct Sum {
    labels: Vec<LabelPair>,
    value: f64,
    count: u64,
    sum: f64,
    buckets: Vec<(f64, u64)>,
}

/// A family's series by their labels (name, value).
type Series = BTreeMap<Vec<(String, String)>, Sum>;

/// The families of every shard merged into one per name: series with the same labels summed.
/// Counters and histograms only (what is sharded); the registry sorts the series.
fn merge(families: impl Iterator<Item = MetricFamily>) -> Vec<MetricFamily> {
    let mut merged: Vec<(MetricFamily, Series)> = Vec::new();
    for family in families {
        let at = match merged.iter().position(|(f, _)| f.name() == family.name()) {
            Some(at) => at,
            None => {
                let mut head = MetricFamily::new();
                head.set_name(family.name().to_string());
                head.set_help(family.help().to_string());
                head.set_field_type(family.get_field_type());
                merged.push((head, BTreeMap::new()));
                merged.len() - 1
            }
        };
        let series = &mut merged[at].1;
        for m in family.get_metric() {
            let key: Vec<(String, String)> = (m.get_label().iter())
                .map(|l| (l.name().to_string(), l.value().to_string()))
                .collect();
            let sum = series.entry(key).or_insert_with(|| Sum {
                labels: m.get_label().to_vec(),
                value: 0.0,
                count: 0,
                sum: 0.0,
                buckets: Vec::new(),
            });
            add(sum, family.get_field_type(), m);
        }
    }
    merged
        .into_iter()
        .map(|(mut family, series)| {
            let kind = family.get_field_type();
            family.set_metric(series.into_values().map(|s| metric(kind, s)).collect());
            family
        })
        .collect()
}

fn add(sum: &mut Sum, kind: MetricType, m: &Metric) {
    match kind {
        MetricType::HISTOGRAM => {
            let h = m.get_histogram();
            sum.count += h.get_sample_count();
            sum.sum += h.get_sample_sum();
            let buckets = h.get_bucket();
            if sum.buckets.is_empty() {
                sum.buckets = buckets.iter().map(|b| (b.upper_bound(), 0)).collect();
            }
            for (total, b) in sum.buckets.iter_mut().zip(buckets) {
                total.1 += b.cumulative_count();
            }
        }
        _ => sum.value += m.get_counter().value(),
    }
}

fn metric(kind: MetricType, s: Sum) -> Metric {
    let mut m = Metric::from_label(s.labels);
    match kind {
        MetricType::HISTOGRAM => {
            let mut h = Histogram::new();
            h.set_sample_count(s.count);
            h.set_sample_sum(s.sum);
            let buckets = (s.buckets.into_iter())
                .map(|(bound, count)| {
                    let mut b = Bucket::new();
                    b.set_upper_bound(bound);
                    b.set_cumulative_count(count);
                    b
                })
                .collect();
            h.set_bucket(buckets);
            m.set_histogram(h);
        }
        _ => {
            let mut c = Counter::new();
            c.set_value(s.value);
            m.set_counter(c);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

    /// What a registry holding `c` renders.
    fn text(c: Box<dyn Collector>) -> String {
        let registry = Registry::new();
        registry.register(c).unwrap();
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn shards_written_by_many_threads_render_as_one_metric_would() {
        let make = || IntCounterVec::new(Opts::new("c_total", "help c"), &["a", "b"]).unwrap();
        let (counters, sharded) = (make(), Sharded::new(make));
        let opts = HistogramOpts::new("h_seconds", "help h").buckets(vec![0.1, 1.0]);
        let one = HistogramVec::new(opts.clone(), &["s"]).unwrap();
        let histograms = Sharded::new(|| HistogramVec::new(opts.clone(), &["s"]).unwrap());
        std::thread::scope(|scope| {
            for t in 0..8 {
                let (sharded, histograms, counters, one) = (&sharded, &histograms, &counters, &one);
                scope.spawn(move || {
                    for i in 0..100u64 {
                        let b = if i % 3 == 0 { "x" } else { "y" };
                        sharded.local().with_label_values(&["p", b]).inc_by(t + 1);
                        counters.with_label_values(&["p", b]).inc_by(t + 1);
                        let v = (i % 5) as f64 * 0.4;
                        histograms.local().with_label_values(&["svc"]).observe(v);
                        one.with_label_values(&["svc"]).observe(v);
                    }
                });
            }
        });
        assert_eq!(text(Box::new(sharded)), text(Box::new(counters)));
        assert_eq!(text(Box::new(histograms)), text(Box::new(one)));
    }

    #[test]
    fn a_thread_keeps_its_shard() {
        let first = shard();
        assert!(first < SHARDS);
        assert_eq!(shard(), first);
    }
}
