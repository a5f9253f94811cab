//! The validated model the gateway runs on: every value checked, expanded, parsed and
//! resolved once, at start-up.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};

use super::{AdminSettings, Balancing};
use crate::api::{Api, Models, Pair};
use crate::pricing::PricingSettings;
use crate::scope::Scope;

#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub server: ServerSettings,
    pub metrics: Option<MetricsSettings>,
    pub access_log: AccessLogSettings,
    pub api_keys: Option<ApiKeySettings>,
    pub jwt: Option<JwtSettings>,
    pub services: Vec<ServiceConfig>,
    pub rate_limits: RateLimitSettings,
    pub admin: Option<AdminSettings>,
    /// `[dns] servers`: upstream host names are resolved there; `None`: the system's resolver.
    pub dns_servers: Option<Vec<SocketAddr>>,
    pub metering: MeteringSettings,
    /// `[budgets]`; without it nothing is budgeted.
    pub budgets: Option<BudgetSettings>,
    /// `[pricing]`: the price table, checked whole at start-up; without it nothing is costed.
    pub pricing: Option<PricingSettings>,
}

/// How budgets are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// The worst case is reserved before forwarding and reconciled after.
    Reserve,
    /// Only real usage is charged, after the response.
    After,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetSettings {
    pub enforcement: Enforcement,
    /// The completion cap of a budgeted request that states none.
    pub default_max_tokens: u64,
    /// The prompt estimate: one token per this many request-body bytes (rounded up).
    pub prompt_bytes_per_token: u64,
    /// `unstated_cap = "refuse"`: such a request is refused (400) rather than capped.
    pub refuse_unstated_cap: bool,
}

/// `[metering]`: the usage ledger (kept only with a key store, `[auth.api_keys]`).
#[derive(Debug, Clone)]
pub struct MeteringSettings {
    /// `flush_seconds`: how often recorded usage is written to the store, and so the most a
    /// `kill -9` can lose.
    pub flush: Duration,
    /// `max_models_per_key_hour`: rows per caller and hour are bounded, whatever it sends.
    pub max_models_per_key_hour: usize,
    /// `tail_seconds`: after the client left, how long the upstream's answer on a metered
    /// endpoint is still read (and dropped) for its usage; zero: not at all.
    pub tail: Duration,
}

#[derive(Debug, Clone)]
pub struct ServerSettings {
    pub listen: Vec<String>,
    pub threads: usize,
    pub grace_period_seconds: u64,
    pub graceful_shutdown_timeout_seconds: u64,
    pub upgrade_sock: String,
    pub pid_file: String,
    pub max_request_body_bytes: u64,
    pub buffering: BufferLimits,
    pub connections: ConnectionLimits,
    /// TLS listeners terminating HTTPS at the gateway.
    pub tls: Option<TlsListenSettings>,
}

/// What every listener (data plane, key API, metrics) admits, counted per process.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// From a connection's start (or a kept-alive request's first byte) to its head's end.
    pub header_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_client: usize,
}

/// The bodies the gateway reads whole (the endpoints of services with an `api`).
#[derive(Debug, Clone)]
pub struct BufferLimits {
    /// `max_buffered_body_bytes`: one body.
    pub max_body: u64,
    /// `buffered_bodies_max_bytes`: all of them in memory at once.
    pub total: u64,
    /// `buffered_bytes_per_caller`: all of one caller's (owner, else key) at once.
    pub per_caller: u64,
    /// `buffered_body_timeout_seconds`: from the request head to the body's last byte.
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct TlsListenSettings {
    pub listen: Vec<String>,
    /// PEM certificate chain and private key, checked to parse at start-up.
    pub cert_file: String,
    pub key_file: String,
}

#[derive(Debug, Clone)]
pub struct MetricsSettings {
    pub listen: String,
}

#[derive(Debug, Clone)]
pub struct AccessLogSettings {
    pub destination: AccessLogDestination,
    /// Lines queued for the writer thread; beyond this, lines are dropped and counted.
    pub buffer_lines: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogDestination {
    Off,
    Stdout,
    File {
        path: PathBuf,
        /// Rotate to `<path>.1` once the file would grow past this; `None`: never (logrotate + SIGHUP).
        max_bytes: Option<u64>,
        /// Rotated files kept: `<path>.1` … `<path>.N`.
        max_files: usize,
    },
}

pub(crate) const DEFAULT_ACCESS_LOG_BUFFER: usize = 16 * 1024;

#[derive(Debug, Clone)]
pub struct ApiKeySettings {
    /// `sqlite://…` or `postgres://…`; may hold a password: never print it.
    pub database: String,
    pub cache_ttl: Duration,
    pub negative_cache_ttl: Duration,
    /// Listen for revocations made anywhere (Postgres only).
    pub revocation_push: bool,
}

#[derive(Debug, Clone)]
pub struct JwtSettings {
    pub issuer: String,
    pub audience: String,
    pub jwks_uri: Option<String>,
    pub algorithms: Vec<jsonwebtoken::Algorithm>,
    pub leeway_seconds: u64,
    pub token_types: Vec<String>,
    pub jwks_refresh: Duration,
}

#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The `<service>` segment of `/v1/<service>/...`.
    pub name: String,
    pub scope: Scope,
    /// One or more; all share a scheme and a base path.
    pub replicas: Vec<Upstream>,
    pub balancing: Balancing,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub idle_timeout: Duration,
    /// Set on every upstream request, values already expanded; marked sensitive so they never print.
    pub upstream_headers: Vec<(HeaderName, HeaderValue)>,
    /// Requests per principal per minute: per process, or per fleet with `[rate_limits] redis`;
    /// `None` for no limit.
    pub rate_limit_per_minute: Option<u32>,
    /// DER certificates from `ca_file`: the only roots trusted for this upstream when set.
    pub ca_certs: Option<Vec<Vec<u8>>>,
    /// `api` (`openai` or `anthropic`): the bodies of that API's endpoints are validated and
    /// the model policy applied. `None`: bodies are never read.
    pub api: Option<Api>,
    /// The model policy (`[services.<name>.models]`): set exactly when `api` is.
    pub models: Option<Models>,
    /// `unmetered_paths`: forwarded paths (and what is below them) a caller with a token
    /// budget may call on this `api` service although nothing there is metered.
    pub unmetered_paths: Vec<String>,
    /// `translate`: the endpoints whose calls are translated to another API's endpoint.
    pub(crate) translate: Vec<Pair>,
}

#[derive(Debug, Clone, Default)]
pub struct RateLimitSettings {
    /// `[rate_limits] redis`: counts shared by every gateway using this Redis; `None`: per process.
    pub redis: Option<RedisServer>,
}

/// A validated `redis://` URL. It may hold a password: `Debug` shows `shown` only.
#[derive(Clone)]
pub struct RedisServer {
    /// Made from the URL without connecting: connections are made on first use.
    pub client: redis::Client,
    /// `redis://host:port/db`: never the user name or password.
    pub shown: String,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

#[derive(Debug, Clone)]
pub struct Upstream {
    pub tls: bool,
    /// Host name or IP as written (IPv6 without brackets): the TLS SNI and certificate name.
    pub host: String,
    pub port: u16,
    /// Path prefix the forwarded remainder is appended to; empty or `/base` without a trailing slash.
    pub base_path: String,
    /// Resolved at start-up (Pingora would otherwise resolve, blocking, per request), then
    /// every `dns_refresh_seconds` off the request path when `host` is a name. Empty when
    /// `[dns]` servers resolve it at start-up instead.
    pub addresses: Vec<SocketAddr>,
    /// `host:port`, the Host header the upstream is sent.
    pub host_header: HeaderValue,
}
