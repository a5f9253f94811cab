//! The TOML file format, exactly as operators write it. Nothing here is trusted yet:
//! `config::Config::from_file` validates it into the internal model.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    #[serde(default)]
    pub server: Server,
    pub metrics: Option<Metrics>,
    pub access_log: Option<AccessLog>,
    #[serde(default)]
    pub auth: Auth,
    #[serde(default)]
    pub services: BTreeMap<String, Service>,
    pub rate_limits: Option<RateLimits>,
    pub admin: Option<Admin>,
    pub dns: Option<Dns>,
    pub metering: Option<Metering>,
    pub budgets: Option<Budgets>,
    pub pricing: Option<Pricing>,
}

/// `[pricing]`: the price table requests are costed with.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Pricing {
    /// The price table (TOML, `[[price]]` entries).
    pub file: String,
    /// A label shown beside amounts; default `USD`.
    pub currency: Option<String>,
    /// `allow` (default) or `refuse`.
    pub unpriced: Option<String>,
}

/// `[budgets]`: enforcing the budgets set on keys and owners.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Budgets {
    /// `reserve` (default) or `after`.
    pub enforcement: Option<String>,
    pub default_max_tokens: Option<u64>,
    pub prompt_bytes_per_token: Option<u64>,
    /// `insert` (default) or `refuse`.
    pub unstated_cap: Option<String>,
}

/// `[metering]`: the usage ledger kept in the key store.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Metering {
    /// How often usage recorded in memory is written to the store.
    pub flush_seconds: Option<u64>,
    /// Distinct models recorded per key (or JWT subject) and hour; the rest as `(other)`.
    pub max_models_per_key_hour: Option<u64>,
    /// How long the upstream's answer is still read, for its usage, after the client left.
    pub tail_seconds: Option<u64>,
}

/// `[dns]`: where upstream host names are resolved.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Dns {
    /// `ip:port` of DNS servers; default: the system's resolv.conf (and hosts file).
    pub servers: Vec<String>,
}

/// `upstream = "http://…"` or `upstream = ["http://…", …]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Replicas {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HealthCheck {
    pub path: String,
    pub interval_seconds: Option<u64>,
    pub timeout_seconds: Option<u64>,
}

/// `[admin]`: the key-management API for the console, on a listener of its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Admin {
    /// Plain HTTP; may be left out when `tls` has addresses.
    pub listen: Option<String>,
    pub admin_scope: Option<String>,
    /// When set, admin rights need a `sub` listed here as well as `admin_scope`.
    pub admin_subjects: Option<Vec<String>>,
    pub allowed_origins: Option<Vec<String>>,
    pub max_keys_per_owner: Option<u32>,
    pub requests_per_minute: Option<u32>,
    pub revoked_retention_days: Option<u32>,
    pub console: Option<bool>,
    pub console_client_id: Option<String>,
    /// Whether the console offers to ask the issuer for `admin_scope`.
    pub console_admin_sign_in: Option<bool>,
    /// HTTPS listeners of the key API, as `[server.tls]`.
    pub tls: Option<Tls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimits {
    /// `redis://[user:password@]host[:port][/db]`: counts shared by every gateway using it.
    pub redis: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Server {
    pub listen: Option<Vec<String>>,
    pub threads: Option<usize>,
    pub grace_period_seconds: Option<u64>,
    pub graceful_shutdown_timeout_seconds: Option<u64>,
    pub upgrade_sock: Option<String>,
    pub pid_file: Option<String>,
    pub max_request_body_bytes: Option<u64>,
    /// One body the gateway reads whole (the model policy's).
    pub max_buffered_body_bytes: Option<u64>,
    /// Every such body in memory at once.
    pub buffered_bodies_max_bytes: Option<u64>,
    /// Such bodies of one caller (owner, else key) in memory at once.
    pub buffered_bytes_per_caller: Option<u64>,
    /// From the request head to the end of such a body.
    pub buffered_body_timeout_seconds: Option<u64>,
    /// The whole request head must arrive within this, on every listener.
    pub header_timeout_seconds: Option<u64>,
    /// Open client connections, over every listener of the process.
    pub max_connections: Option<u32>,
    /// Open client connections from one client address, over every listener.
    pub max_connections_per_client: Option<u32>,
    pub tls: Option<Tls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Tls {
    pub listen: Vec<String>,
    pub cert_file: String,
    pub key_file: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Metrics {
    pub listen: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AccessLog {
    /// `stdout`, `off`, or a file path.
    pub destination: Option<String>,
    pub max_bytes: Option<u64>,
    pub max_files: Option<usize>,
    pub buffer_lines: Option<usize>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Auth {
    pub api_keys: Option<ApiKeys>,
    pub jwt: Option<Jwt>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApiKeys {
    pub database: String,
    pub cache_ttl_seconds: Option<u64>,
    pub negative_cache_ttl_seconds: Option<u64>,
    /// Postgres only: revocations pushed to every gateway (LISTEN/NOTIFY). Default on.
    pub revocation_push: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Jwt {
    pub issuer: String,
    pub audience: String,
    pub jwks_uri: Option<String>,
    pub algorithms: Option<Vec<String>>,
    pub leeway_seconds: Option<u64>,
    /// Accepted `typ` header values; defaults to the RFC 9068 access-token types.
    pub token_types: Option<Vec<String>>,
    pub jwks_refresh_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Service {
    pub upstream: Option<Replicas>,
    /// `least_requests` (default), `round_robin` or `prefix_affinity`.
    pub balance: Option<String>,
    /// With `prefix_affinity`: how far over the mean load a replica may be and keep its keys.
    pub affinity_load_factor: Option<f64>,
    pub health_check: Option<HealthCheck>,
    pub dns_refresh_seconds: Option<u64>,
    pub eject_after_connect_failures: Option<u32>,
    pub eject_seconds: Option<u64>,
    pub scope: Option<String>,
    pub connect_timeout_seconds: Option<u64>,
    pub read_timeout_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
    pub rate_limit_per_minute: Option<u32>,
    /// PEM bundle of CAs trusted for this https upstream instead of the platform roots.
    pub ca_file: Option<String>,
    #[serde(default)]
    pub upstream_headers: BTreeMap<String, String>,
    /// `openai` or `anthropic`: the gateway reads the bodies of that API's endpoints.
    pub api: Option<String>,
    pub models: Option<Models>,
    /// Paths (after the service prefix) a caller with a token budget may call although the
    /// gateway does not meter them.
    #[serde(default)]
    pub unmetered_paths: Vec<String>,
    /// Endpoint -> endpoint: what clients send, translated to what the upstream speaks.
    #[serde(default)]
    pub translate: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Models {
    pub default: Option<String>,
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
}
