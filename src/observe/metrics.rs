//! Prometheus metrics (names as docs/reference.md lists them) on a registry of our own, served at
//! `GET /metrics` on the `[metrics] listen` address. Labels are bounded enumerations only. The
//! ones every request writes are kept per worker thread and summed when scraped (`sharded`).

use std::time::Duration;

use http::Method;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use super::sharded::{shard, Sharded, SHARDS};
use crate::api::Usage;

use crate::auth::AuthFailure;

/// From a 2 ms embedding call to a 10-minute reasoning stream.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

pub struct Metrics {
    registry: Registry,
    requests: Sharded<IntCounterVec>,
    duration: Sharded<HistogramVec>,
    upstream_ttfb: Sharded<HistogramVec>,
    auth_failures: Sharded<IntCounterVec>,
    active_streams: IntGaugeVec,
    access_log_dropped: IntCounter,
    rate_limit_backend_errors: IntCounterVec,
    upstream_errors: IntCounterVec,
    key_store_lookups: IntCounterVec,
    jwks_fetches: IntCounterVec,
    tokens: Sharded<IntCounterVec>,
    cost_micros: Sharded<IntCounterVec>,
    unpriced: Sharded<IntCounterVec>,
    usage_unread: IntCounterVec,
    translations: Sharded<IntCounterVec>,
    revocation_push: IntCounterVec,
    key_events: IntCounterVec,
    upstream_healthy: IntGaugeVec,
    upstream_connect_failures: IntCounterVec,
    affinity: IntCounterVec,
    connections_refused: IntCounterVec,
    connections_open: IntGauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = Sharded::new(|| {
            IntCounterVec::new(
                Opts::new(
                    "portcullis_requests_total",
                    "Requests answered, by service, method and status.",
                ),
                &["service", "method", "status"],
            )
            .expect("valid metric")
        });
        let duration = Sharded::new(|| {
            HistogramVec::new(
                HistogramOpts::new(
                    "portcullis_request_duration_seconds",
                    "Whole-request duration.",
                )
                .buckets(BUCKETS.to_vec()),
                &["service"],
            )
            .expect("valid metric")
        });
        let upstream_ttfb = Sharded::new(|| {
            HistogramVec::new(
                HistogramOpts::new(
                    "portcullis_upstream_ttfb_seconds",
                    "Time from sending the request upstream to its first response byte.",
                )
                .buckets(BUCKETS.to_vec()),
                &["service"],
            )
            .expect("valid metric")
        });
        let auth_failures = Sharded::new(|| {
            IntCounterVec::new(
                Opts::new(
                    "portcullis_auth_failures_total",
                    "Authentication failures by internal reason.",
                ),
                &["kind"],
            )
            .expect("valid metric")
        });
        let active_streams = IntGaugeVec::new(
            Opts::new("portcullis_active_streams", "SSE responses in flight."),
            &["service"],
        )
        .expect("valid metric");
        let access_log_dropped = IntCounter::new(
            "portcullis_access_log_dropped_total",
            "Access-log lines dropped because the writer fell behind.",
        )
        .expect("valid metric");
        let rate_limit_backend_errors = IntCounterVec::new(
            Opts::new(
                "portcullis_rate_limit_backend_errors_total",
                "Rate-limited requests decided per process because Redis ([rate_limits] redis) failed, by reason: error, timeout, unavailable (down, not asked).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let upstream_errors = IntCounterVec::new(
            Opts::new(
                "portcullis_upstream_errors_total",
                "Upstream failures answered 502/504, by service and kind (refused, timeout, invalid).",
            ),
            &["service", "kind"],
        )
        .expect("valid metric");
        let key_store_lookups = IntCounterVec::new(
            Opts::new(
                "portcullis_key_store_lookups_total",
                "API-key cache misses by result: found, unknown, error (the store failed), unavailable (store known down, not asked).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let jwks_fetches = IntCounterVec::new(
            Opts::new(
                "portcullis_jwks_fetches_total",
                "JWKS fetches (start-up, refreshes, retries and unknown-kid refetches), by result (ok, error).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let tokens = Sharded::new(|| {
            IntCounterVec::new(
                Opts::new(
                    "portcullis_tokens_total",
                    "Tokens reported by the upstream's `usage` on api = \"openai\" services (or estimated for a cut stream), by service and kind (prompt, completion, reasoning, cached).",
                ),
                &["service", "kind"],
            )
            .expect("valid metric")
        });
        let cost_micros = Sharded::new(|| {
            IntCounterVec::new(
                Opts::new(
                    "portcullis_cost_micros_total",
                    "What priced requests cost, in millionths of the price table's currency, by service.",
                ),
                &["service"],
            )
            .expect("valid metric")
        });
        let unpriced = Sharded::new(|| {
            IntCounterVec::new(
                Opts::new(
                    "portcullis_unpriced_requests_total",
                    "Requests whose model had no price that applied (never costed 0), by service.",
                ),
                &["service"],
            )
            .expect("valid metric")
        });
        let usage_unread = IntCounterVec::new(
            Opts::new(
                "portcullis_usage_unread_total",
                "Successful responses on api = \"openai\" services whose usage could not be read, by service and reason (encoding, missing, abandoned, implausible: a count over 2^32).",
            ),
            &["service", "reason"],
        )
        .expect("valid metric");
        let translations = Sharded::new(|| {
            IntCounterVec::new(
                Opts::new(
                    "portcullis_translations_total",
                    "Calls translated to another API (translate), by service, pair (messages>chat) and result: ok, refused (the gateway's 4xx before forwarding), upstream_error (the upstream's error answer, or none), cut (the answer ended early).",
                ),
                &["service", "pair", "result"],
            )
            .expect("valid metric")
        });
        let revocation_push = IntCounterVec::new(
            Opts::new(
                "portcullis_revocation_push_total",
                "Fleet revocation push (Postgres LISTEN) events: notified, disconnected, reconnected, error (a failed attempt to listen).",
            ),
            &["event"],
        )
        .expect("valid metric");
        let key_events = IntCounterVec::new(
            Opts::new(
                "portcullis_key_events_total",
                "API keys created and revoked, and budgets set or cleared, through this gateway's key API, by event (created, revoked, budget).",
            ),
            &["event"],
        )
        .expect("valid metric");
        // Present at 0 from start-up, so a rate() over them is defined before the first event.
        for event in ["created", "revoked", "budget"] {
            key_events.with_label_values(&[event]);
        }
        let upstream_healthy = IntGaugeVec::new(
            Opts::new(
                "portcullis_upstream_healthy",
                "1 while a replica is in rotation, 0 while a health check fails or connect failures took it out; replica is the configured host:port.",
            ),
            &["service", "replica"],
        )
        .expect("valid metric");
        let upstream_connect_failures = IntCounterVec::new(
            Opts::new(
                "portcullis_upstream_connect_failures_total",
                "Connects to a replica refused or timed out, by service and replica (the configured host:port); a request fails over to another replica after one.",
            ),
            &["service", "replica"],
        )
        .expect("valid metric");
        let affinity = IntCounterVec::new(
            Opts::new(
                "portcullis_affinity_total",
                "Requests to balance = \"prefix_affinity\" services, by service and result: hit (the key's own replica), spill (its replica over the load bound, out of rotation or tried), none (no X-Session-Id and no body read).",
            ),
            &["service", "result"],
        )
        .expect("valid metric");
        let connections_refused = IntCounterVec::new(
            Opts::new(
                "portcullis_connections_refused_total",
                "Client connections closed by the gateway, by listener (data, admin, metrics) and reason: total (server.max_connections), per_client (server.max_connections_per_client), header_timeout.",
            ),
            &["listener", "reason"],
        )
        .expect("valid metric");
        let connections_open = IntGauge::new(
            "portcullis_connections_open",
            "Client connections open now, over every listener: what server.max_connections caps.",
        )
        .expect("valid metric");
        for m in [
            Box::new(revocation_push.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(connections_refused.clone()),
            Box::new(connections_open.clone()),
            Box::new(upstream_connect_failures.clone()),
            Box::new(affinity.clone()),
            Box::new(upstream_healthy.clone()),
            Box::new(key_events.clone()),
            Box::new(tokens.clone()),
            Box::new(cost_micros.clone()),
            Box::new(unpriced.clone()),
            Box::new(usage_unread.clone()),
            Box::new(translations.clone()),
            Box::new(upstream_errors.clone()),
            Box::new(key_store_lookups.clone()),
            Box::new(jwks_fetches.clone()),
            Box::new(requests.clone()),
            Box::new(duration.clone()),
            Box::new(upstream_ttfb.clone()),
            Box::new(auth_failures.clone()),
            Box::new(active_streams.clone()),
            Box::new(access_log_dropped.clone()),
            Box::new(rate_limit_backend_errors.clone()),
        ] {
            registry.register(m).expect("metric names are unique");
        }
        Metrics {
            registry,
            requests,
            duration,
            upstream_ttfb,
            auth_failures,
            active_streams,
            access_log_dropped,
            rate_limit_backend_errors,
            upstream_errors,
            key_store_lookups,
            jwks_fetches,
            tokens,
            cost_micros,
            unpriced,
            usage_unread,
            translations,
            revocation_push,
            key_events,
            upstream_healthy,
            upstream_connect_failures,
            affinity,
            connections_refused,
            connections_open,
        }
    }

    /// One service's handles, resolved once: the request path then records without hashing
    /// label values (the common status, 200, per method; others are looked up).
    pub fn for_service(&self, service: &str) -> ServiceMetrics {
        let children = |vec: &Sharded<HistogramVec>| {
            (vec.all().iter())
                .map(|shard| shard.with_label_values(&[service]))
                .collect()
        };
        ServiceMetrics {
            service: service.into(),
            duration: children(&self.duration),
            ttfb: children(&self.upstream_ttfb),
            counters: (0..SHARDS).map(|_| Default::default()).collect(),
        }
    }

    /// `record` through a service's resolved handles.
    pub fn record_for(
        &self,
        handles: &ServiceMetrics,
        method: &Method,
        status: u16,
        duration: Duration,
        ttfb: Option<Duration>,
        auth_failure: Option<AuthFailure>,
    ) {
        let i = method_index(method);
        let method = METHOD_LABELS[i];
        let shard = shard();
        if status == 200 {
            // Made on the first 200 of each method, so /metrics shows only series that happened.
            handles.counters[shard].ok[i]
                .get_or_init(|| {
                    self.requests.all()[shard].with_label_values(&[&handles.service, method, "200"])
                })
                .inc();
        } else {
            self.count_request(&handles.service, method, status);
        }
        handles.duration[shard].observe(duration.as_secs_f64());
        if let Some(t) = ttfb {
            handles.ttfb[shard].observe(t.as_secs_f64());
        }
        if let Some(kind) = auth_failure {
            (self.auth_failures.local())
                .with_label_values(&[kind.as_str()])
                .inc();
        }
    }

    fn count_request(&self, service: &str, method: &str, status: u16) {
        let mut code = [b'0'; 3];
        let status = status.min(999);
        code[0] += (status / 100) as u8;
        code[1] += (status / 10 % 10) as u8;
        code[2] += (status % 10) as u8;
        let code = std::str::from_utf8(&code).unwrap_or("000");
        (self.requests.local())
            .with_label_values(&[service, method, code])
            .inc();
    }

    pub fn record(
        &self,
        service: &str,
        method: &Method,
        status: u16,
        duration: Duration,
        ttfb: Option<Duration>,
        auth_failure: Option<AuthFailure>,
    ) {
        self.count_request(service, method_label(method), status);
        (self.duration.local())
            .with_label_values(&[service])
            .observe(duration.as_secs_f64());
        if let Some(t) = ttfb {
            (self.upstream_ttfb.local())
                .with_label_values(&[service])
                .observe(t.as_secs_f64());
        }
        if let Some(kind) = auth_failure {
            (self.auth_failures.local())
                .with_label_values(&[kind.as_str()])
                .inc();
        }
    }

    /// Every kind of token of `service` at 0, so a rate() over it is defined from the start.
    pub fn register_tokens(&self, service: &str) {
        for kind in TOKEN_KINDS {
            self.tokens.all()[0].with_label_values(&[service, kind]);
        }
    }

    /// Usage as the upstream reported it, through a service's handles (each kind's counter
    /// looked up once); a kind it did not report is not counted.
    pub fn tokens(&self, handles: &ServiceMetrics, usage: &Usage) {
        let counts = [
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.reasoning_tokens,
            usage.cached_tokens,
        ];
        let shard = shard();
        let mine = &handles.counters[shard].tokens;
        for ((kind, counter), n) in TOKEN_KINDS.iter().zip(mine).zip(counts) {
            if let Some(n) = n.filter(|&n| n > 0) {
                let labels = [&*handles.service, kind];
                counter
                    .get_or_init(|| self.tokens.all()[shard].with_label_values(&labels))
                    .inc_by(n);
            }
        }
    }

    /// What a request cost in micros (`None`: unpriced), through a service's handles (each
    /// counter looked up once).
    pub(crate) fn cost(&self, handles: &ServiceMetrics, micros: Option<u64>) {
        let service = [&*handles.service];
        let shard = shard();
        let mine = &handles.counters[shard].cost;
        match micros {
            Some(n) => mine[0]
                .get_or_init(|| self.cost_micros.all()[shard].with_label_values(&service))
                .inc_by(n),
            None => mine[1]
                .get_or_init(|| self.unpriced.all()[shard].with_label_values(&service))
                .inc(),
        }
    }

    /// A response whose usage could not be read (`reason` from a fixed set).
    pub fn usage_unread(&self, service: &str, reason: &'static str) {
        self.usage_unread
            .with_label_values(&[service, reason])
            .inc();
    }

    /// A translated call ended: `result` is `ok`, `refused`, `upstream_error` or `cut`.
    pub fn translated(&self, service: &str, pair: &'static str, result: &'static str) {
        (self.translations.local())
            .with_label_values(&[service, pair, result])
            .inc();
    }

    pub fn stream_started(&self, service: &str) {
        self.active_streams.with_label_values(&[service]).inc();
    }

    pub fn stream_ended(&self, service: &str) {
        self.active_streams.with_label_values(&[service]).dec();
    }

    pub fn access_log_dropped(&self) {
        self.access_log_dropped.inc();
    }

    /// Handed to the Redis rate-limit backend, which counts its failures.
    pub fn rate_limit_backend_errors(&self) -> IntCounterVec {
        self.rate_limit_backend_errors.clone()
    }

    pub fn upstream_error(&self, service: &str, kind: &'static str) {
        self.upstream_errors
            .with_label_values(&[service, kind])
            .inc();
    }

    /// Handed to the API-key verifier, which counts its store lookups.
    pub fn key_store_lookups(&self) -> IntCounterVec {
        self.key_store_lookups.clone()
    }

    /// Handed to the revocation listener, which counts what happens to it.
    pub fn revocation_push_events(&self) -> IntCounterVec {
        self.revocation_push.clone()
    }

    /// The gauge of one replica, set by its health.
    pub fn upstream_healthy(&self, service: &str, replica: &str) -> IntGauge {
        self.upstream_healthy.with_label_values(&[service, replica])
    }

    /// The connect failures of one replica (present at 0 from start-up).
    pub fn upstream_connect_failures(&self, service: &str, replica: &str) -> IntCounter {
        self.upstream_connect_failures
            .with_label_values(&[service, replica])
    }

    /// One `portcullis_affinity_total` series, made at start-up so it shows at 0.
    pub fn affinity(&self, service: &str, result: &str) -> IntCounter {
        self.affinity.with_label_values(&[service, result])
    }

    /// `created`, `revoked` or `budget`, counted by the key API.
    pub fn key_event(&self, event: &'static str) {
        self.key_events.with_label_values(&[event]).inc();
    }

    /// Handed to the listeners' admission, which counts the connections it closes.
    pub fn connections_refused(&self) -> IntCounterVec {
        self.connections_refused.clone()
    }

    /// Handed to the listeners' admission, which keeps it equal to the connections it counts.
    pub fn connections_open(&self) -> IntGauge {
        self.connections_open.clone()
    }

    /// Handed to the JWT verifier, which counts its JWKS fetches.
    pub fn jwks_fetches(&self) -> IntCounterVec {
        self.jwks_fetches.clone()
    }

    /// Registers a collector another module keeps (the usage ledger's), so `/metrics` shows it.
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        if let Err(e) = self.registry.register(collector) {
            log::error!("cannot register a metric: {e}");
        }
    }

    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * 1024);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            log::error!("metrics encoding failed: {e}");
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// A service's metric handles (see `Metrics::for_service`), one set per shard: a worker
/// thread writes its own.
pub struct ServiceMetrics {
    service: Box<str>,
    duration: Box<[prometheus::Histogram]>,
    ttfb: Box<[prometheus::Histogram]>,
    counters: Box<[Counters]>,
}

/// A shard's counters of one service, each made when first counted.
#[derive(Default)]
struct Counters {
    /// `portcullis_requests_total{status="200"}`, per `METHOD_LABELS`.
    ok: [std::sync::OnceLock<IntCounter>; 8],
    /// `portcullis_tokens_total`, per `TOKEN_KINDS`.
    tokens: [std::sync::OnceLock<IntCounter>; 4],
    /// `portcullis_cost_micros_total` and `portcullis_unpriced_requests_total`.
    cost: [std::sync::OnceLock<IntCounter>; 2],
}

/// The `kind` labels of `portcullis_tokens_total`, in `Usage`'s order.
const TOKEN_KINDS: [&str; 4] = ["prompt", "completion", "reasoning", "cached"];

impl ServiceMetrics {
    /// The service label these handles carry.
    pub fn service(&self) -> &str {
        &self.service
    }
}

const METHOD_LABELS: [&str; 8] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "OTHER",
];

/// Methods outside the allowed set are folded into one label: they are client-chosen strings.
fn method_label(method: &Method) -> &'static str {
    METHOD_LABELS[method_index(method)]
}

/// The index of a method's label in `METHOD_LABELS`.
fn method_index(method: &Method) -> usize {
    match *method {
        Method::GET => 0,
        Method::POST => 1,
        Method::PUT => 2,
        Method::PATCH => 3,
        Method::DELETE => 4,
        Method::HEAD => 5,
        Method::OPTIONS => 6,
        _ => 7,
    }
}
