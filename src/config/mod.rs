//! Configuration: the TOML file (`file`) validated into the model the gateway runs on.
//! Everything that can be checked or computed once is done here, at start-up:
//! `${VAR}` expansion, URL parsing, DNS resolution, header encoding.

mod admin;
mod env;
mod file;
mod replicas;

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};

use crate::model_policy::Models;
use crate::scope::Scope;

pub use admin::AdminSettings;
pub use env::expand as expand_env;
pub use replicas::{Balance, Balancing, HealthCheckSettings, MAX_REPLICAS};

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
    /// TLS listeners terminating HTTPS at the gateway.
    pub tls: Option<TlsListenSettings>,
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

pub const DEFAULT_ACCESS_LOG_BUFFER: usize = 16 * 1024;
const DEFAULT_ACCESS_LOG_FILES: usize = 5;

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
    /// Set by `api = "openai"`: chat and embeddings bodies are validated and the model policy
    /// applied. `None`: bodies are never read.
    pub openai: Option<Models>,
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

/// Every problem found in a config file, each naming the file and the key.
#[derive(Debug)]
pub struct ConfigError {
    pub problems: Vec<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("\n"))
    }
}

impl ConfigError {
    /// One line for the end of stderr: the first problem, and how many more were listed.
    pub fn summary(&self) -> String {
        let first = self.problems.first().map_or("invalid configuration", |p| p);
        match self.problems.len() {
            0 | 1 => first.to_string(),
            n => format!("{first} (and {} more problem(s))", n - 1),
        }
    }
}

/// A problem as one line: values echoed from the file may hold newlines or other control
/// characters (found by fuzzing), which are shown escaped.
fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A TOML syntax or shape error on one line: toml's own message draws the source over
/// several lines, which a one-line reason on stderr cannot carry.
fn toml_problem(shown: &str, text: &str, e: &toml::de::Error) -> String {
    let message = one_line(&e.message().split_whitespace().collect::<Vec<_>>().join(" "));
    match e.span() {
        Some(span) => {
            let before = &text.as_bytes()[..span.start.min(text.len())];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
            format!("{shown}: line {line}, column {column}: {message}")
        }
        None => format!("{shown}: {message}"),
    }
}

/// Resolves an upstream's host once, at start-up; a parameter so that checks which must not
/// touch the network (fuzzing) can pass their own.
pub type Resolver<'a> = &'a dyn Fn(&str, u16) -> Result<Vec<SocketAddr>, String>;

/// The system resolver (blocking, at start-up only).
pub fn resolve_system(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let addresses: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve `{host}`: {e}"))?
        .collect();
    if addresses.is_empty() {
        return Err(format!("`{host}` resolves to no address"));
    }
    Ok(addresses)
}

impl std::error::Error for ConfigError {}

pub const DEFAULT_MAX_BODY: u64 = 32 * 1024 * 1024;
const ALGORITHMS: [(&str, jsonwebtoken::Algorithm); 9] = {
    use jsonwebtoken::Algorithm::*;
    [
        ("RS256", RS256),
        ("RS384", RS384),
        ("RS512", RS512),
        ("PS256", PS256),
        ("PS384", PS384),
        ("PS512", PS512),
        ("ES256", ES256),
        ("ES384", ES384),
        ("EdDSA", EdDSA),
    ]
};
/// Request headers an operator may not inject: they would break framing or routing.
const RESERVED_HEADERS: [&str; 8] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
];

impl Config {
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            problems: vec![format!("{}: cannot read: {e}", path.display())],
        })?;
        Config::from_str(path, &text, |name| std::env::var(name).ok())
    }

    /// Parses and validates; `lookup` reads the environment for `${VAR}`.
    pub fn from_str(
        path: &Path,
        text: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::parse_with(path, text, &lookup, &resolve_system)
    }

    /// `from_str` with the host resolver given.
    pub fn parse_with(
        path: &Path,
        text: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
        resolve: Resolver<'_>,
    ) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let raw: file::File = toml::from_str(text).map_err(|e| ConfigError {
            problems: vec![toml_problem(&shown, text, &e)],
        })?;
        let mut v = Validator {
            file: shown,
            problems: Vec::new(),
            lookup,
            resolve,
        };
        let dns_servers = v.dns(raw.dns);
        let own_dns = dns_servers.is_some();
        let config = Config {
            dns_servers,
            path: path.to_path_buf(),
            server: v.server(raw.server),
            metrics: raw.metrics.map(|m| v.metrics(m)),
            access_log: v.access_log(raw.access_log),
            api_keys: raw.auth.api_keys.map(|a| v.api_keys(a)),
            jwt: raw.auth.jwt.and_then(|j| v.jwt(j)),
            services: raw
                .services
                .into_iter()
                .filter_map(|(name, s)| v.service(name, s, own_dns))
                .collect(),
            rate_limits: v.rate_limits(raw.rate_limits),
            admin: None,
        };
        let mut config = config;
        config.admin = raw.admin.map(|a| v.admin(a, &config));
        if config.services.is_empty() && v.problems.is_empty() {
            v.problem("services", "no service is configured");
        }
        if v.problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError {
                problems: v.problems,
            })
        }
    }

    /// Only the key store, for the `keys` commands: they need no upstream secrets or DNS.
    /// The access-log file, when the config names one: the `keys` commands append their
    /// create and revoke events to it. Problems are ignored here (`serve -t` reports them).
    pub fn access_log_file_from(path: &Path) -> Option<PathBuf> {
        let text = std::fs::read_to_string(path).ok()?;
        let raw: file::File = toml::from_str(&text).ok()?;
        let lookup = |name: &str| std::env::var(name).ok();
        let mut v = Validator {
            file: path.display().to_string(),
            problems: Vec::new(),
            lookup: &lookup,
            resolve: &resolve_system,
        };
        match v.access_log(raw.access_log).destination {
            AccessLogDestination::File { path, .. } => Some(path),
            _ => None,
        }
    }

    pub fn key_store_from_file(path: &Path) -> Result<ApiKeySettings, ConfigError> {
        let shown = path.display().to_string();
        let one = |problem: String| ConfigError {
            problems: vec![problem],
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| one(format!("{shown}: cannot read: {e}")))?;
        let raw: file::File =
            toml::from_str(&text).map_err(|e| one(toml_problem(&shown, &text, &e)))?;
        let raw_keys = raw.auth.api_keys.ok_or_else(|| {
            one(format!(
                "{shown}: auth.api_keys: section missing, so there is no key store"
            ))
        })?;
        let lookup = |name: &str| std::env::var(name).ok();
        let mut v = Validator {
            file: shown,
            problems: Vec::new(),
            lookup: &lookup,
            resolve: &resolve_system,
        };
        let settings = v.api_keys(raw_keys);
        if v.problems.is_empty() {
            Ok(settings)
        } else {
            Err(ConfigError {
                problems: v.problems,
            })
        }
    }
}

struct Validator<'a> {
    file: String,
    problems: Vec<String>,
    lookup: &'a dyn Fn(&str) -> Option<String>,
    resolve: Resolver<'a>,
}

impl Validator<'_> {
    fn problem(&mut self, key: &str, what: impl fmt::Display) {
        self.problems
            .push(one_line(&format!("{}: {key}: {what}", self.file)));
    }

    fn expand(&mut self, key: &str, value: &str) -> Option<String> {
        match expand_env(value, self.lookup) {
            Ok(v) => Some(v),
            Err(e) => {
                self.problem(key, e);
                None
            }
        }
    }

    /// Every listener is an `ip:port`, checked here so that `serve -t` catches what would
    /// otherwise only fail at bind time.
    fn listen_address(&mut self, key: &str, addr: &str) {
        if addr.parse::<SocketAddr>().is_err() {
            self.problem(key, format!("`{addr}` is not an ip:port address"));
        }
    }

    fn metrics(&mut self, m: file::Metrics) -> MetricsSettings {
        self.listen_address("metrics.listen", &m.listen);
        MetricsSettings { listen: m.listen }
    }

    fn server(&mut self, s: file::Server) -> ServerSettings {
        let listen = s
            .listen
            .unwrap_or_else(|| vec!["127.0.0.1:8080".to_string()]);
        let tls = s.tls.map(|t| self.tls(t));
        if listen.is_empty() && tls.as_ref().is_none_or(|t| t.listen.is_empty()) {
            self.problem(
                "server.listen",
                "needs at least one address (here or in server.tls)",
            );
        }
        for addr in &listen {
            self.listen_address("server.listen", addr);
        }
        let threads = s.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        if threads == 0 {
            self.problem("server.threads", "must be at least 1");
        }
        let max_request_body_bytes = s.max_request_body_bytes.unwrap_or(DEFAULT_MAX_BODY);
        if max_request_body_bytes == 0 {
            self.problem("server.max_request_body_bytes", "must be at least 1");
        }
        ServerSettings {
            listen,
            threads,
            grace_period_seconds: s.grace_period_seconds.unwrap_or(300),
            graceful_shutdown_timeout_seconds: s.graceful_shutdown_timeout_seconds.unwrap_or(5),
            upgrade_sock: s
                .upgrade_sock
                .unwrap_or_else(|| "/tmp/portcullis-upgrade.sock".to_string()),
            pid_file: s
                .pid_file
                .unwrap_or_else(|| "/tmp/portcullis.pid".to_string()),
            max_request_body_bytes,
            tls,
        }
    }

    fn access_log(&mut self, a: Option<file::AccessLog>) -> AccessLogSettings {
        let Some(a) = a else {
            return AccessLogSettings {
                destination: AccessLogDestination::Stdout,
                buffer_lines: DEFAULT_ACCESS_LOG_BUFFER,
            };
        };
        let buffer_lines = a.buffer_lines.unwrap_or(DEFAULT_ACCESS_LOG_BUFFER);
        if buffer_lines == 0 {
            self.problem("access_log.buffer_lines", "must be at least 1");
        }
        let destination = match a.destination.as_deref().unwrap_or("stdout") {
            "" => {
                self.problem(
                    "access_log.destination",
                    "must be `stdout`, `off` or a file path",
                );
                AccessLogDestination::Off
            }
            "stdout" => AccessLogDestination::Stdout,
            "off" => AccessLogDestination::Off,
            path => {
                if path.ends_with('/') {
                    self.problem("access_log.destination", "names a directory, not a file");
                }
                if a.max_bytes == Some(0) {
                    self.problem("access_log.max_bytes", "must be at least 1");
                }
                let max_files = a.max_files.unwrap_or(DEFAULT_ACCESS_LOG_FILES);
                if max_files == 0 {
                    self.problem("access_log.max_files", "must be at least 1");
                }
                AccessLogDestination::File {
                    path: PathBuf::from(path),
                    max_bytes: a.max_bytes,
                    max_files,
                }
            }
        };
        if !matches!(destination, AccessLogDestination::File { .. }) {
            for (key, set) in [
                ("access_log.max_bytes", a.max_bytes.is_some()),
                ("access_log.max_files", a.max_files.is_some()),
            ] {
                if set {
                    self.problem(key, "applies only when destination is a file");
                }
            }
        }
        AccessLogSettings {
            destination,
            buffer_lines,
        }
    }

    fn tls(&mut self, t: file::Tls) -> TlsListenSettings {
        for addr in &t.listen {
            self.listen_address("server.tls.listen", addr);
        }
        if let Err(e) = load_pem_certs(&t.cert_file) {
            self.problem("server.tls.cert_file", e);
        }
        let key = std::fs::read(&t.key_file)
            .map_err(|e| format!("cannot read `{}`: {e}", t.key_file))
            .and_then(
                |pem| match rustls_pemfile::private_key(&mut pem.as_slice()) {
                    Ok(Some(_)) => Ok(()),
                    _ => Err(format!("`{}` holds no PEM private key", t.key_file)),
                },
            );
        if let Err(e) = key {
            self.problem("server.tls.key_file", e);
        }
        TlsListenSettings {
            listen: t.listen,
            cert_file: t.cert_file,
            key_file: t.key_file,
        }
    }

    fn api_keys(&mut self, a: file::ApiKeys) -> ApiKeySettings {
        let database = self
            .expand("auth.api_keys.database", &a.database)
            .unwrap_or_default();
        let postgres = crate::auth::api_keys::is_postgres_url(&database);
        if postgres {
            // The URL may carry a password: its problems never quote it.
            if let Err(e) = crate::auth::api_keys::check_postgres_url(&database) {
                self.problem("auth.api_keys.database", e);
            }
        } else if !database.starts_with("sqlite:") {
            self.problem(
                "auth.api_keys.database",
                "must be a sqlite:// or postgres:// URL",
            );
        }
        if a.revocation_push == Some(true) && !postgres {
            self.problem(
                "auth.api_keys.revocation_push",
                "needs a postgres:// database (a SQLite store serves one host)",
            );
        }
        let cache_ttl = a.cache_ttl_seconds.unwrap_or(15);
        if cache_ttl == 0 {
            self.problem("auth.api_keys.cache_ttl_seconds", "must be at least 1");
        }
        ApiKeySettings {
            database,
            cache_ttl: Duration::from_secs(cache_ttl),
            negative_cache_ttl: Duration::from_secs(a.negative_cache_ttl_seconds.unwrap_or(5)),
            revocation_push: postgres && a.revocation_push.unwrap_or(true),
        }
    }

    fn jwt(&mut self, j: file::Jwt) -> Option<JwtSettings> {
        if http_url(&j.issuer).is_none() {
            self.problem("auth.jwt.issuer", "must be an http(s) URL");
        }
        if let Some(uri) = &j.jwks_uri {
            if http_url(uri).is_none() {
                self.problem("auth.jwt.jwks_uri", "must be an http(s) URL");
            }
        }
        if j.audience.is_empty() {
            self.problem("auth.jwt.audience", "must not be empty");
        }
        let names = j
            .algorithms
            .unwrap_or_else(|| vec!["RS256".into(), "ES256".into(), "EdDSA".into()]);
        let mut algorithms = Vec::new();
        for name in &names {
            match ALGORITHMS.iter().find(|(n, _)| n == name) {
                Some((_, alg)) => algorithms.push(*alg),
                None => self.problem(
                    "auth.jwt.algorithms",
                    format!("`{name}` is not an accepted asymmetric algorithm (RS*, PS*, ES256, ES384, EdDSA)"),
                ),
            }
        }
        if names.is_empty() {
            self.problem("auth.jwt.algorithms", "needs at least one algorithm");
        }
        let leeway_seconds = j.leeway_seconds.unwrap_or(30);
        if leeway_seconds > 3600 {
            self.problem("auth.jwt.leeway_seconds", "at most 3600 is accepted");
        }
        Some(JwtSettings {
            issuer: j.issuer,
            audience: j.audience,
            jwks_uri: j.jwks_uri,
            algorithms,
            leeway_seconds,
            token_types: j
                .token_types
                .unwrap_or_else(|| vec!["at+jwt".into(), "application/at+jwt".into()]),
            jwks_refresh: Duration::from_secs(j.jwks_refresh_seconds.unwrap_or(300).max(1)),
        })
    }

    fn service(&mut self, name: String, s: file::Service, own_dns: bool) -> Option<ServiceConfig> {
        let key = format!("services.{name}");
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            self.problem(&key, "a service name may hold only a-z, 0-9, `-` and `_`");
        } else if name.starts_with('_') {
            // `_local` and `_unknown` are metric labels of their own.
            self.problem(&key, "a service name may not start with `_`");
        }
        let balancing = self.balancing(&key, &s);
        let scope = match s.scope.filter(|s| !s.is_empty()) {
            None => {
                self.problem(&format!("{key}.scope"), "is required");
                None
            }
            Some(scope) => scope
                .parse::<Scope>()
                .map_err(|e| self.problem(&format!("{key}.scope"), e))
                .ok(),
        };
        let replicas = self.replicas(&key, s.upstream.as_ref(), own_dns);
        let mut upstream_headers = Vec::new();
        for (header, value) in &s.upstream_headers {
            let hkey = format!("{key}.upstream_headers.{header}");
            let Ok(name) = HeaderName::from_bytes(header.as_bytes()) else {
                self.problem(&hkey, "is not a valid header name");
                continue;
            };
            if RESERVED_HEADERS.contains(&name.as_str()) {
                self.problem(&hkey, "may not be set: the gateway manages it");
                continue;
            }
            let Some(value) = self.expand(&hkey, value) else {
                continue;
            };
            match HeaderValue::from_str(&value) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    upstream_headers.push((name, v));
                }
                // The value may be a secret: never echo it.
                Err(_) => {
                    self.problem(&hkey, "expands to a value that is not a valid header value")
                }
            }
        }
        let ca_certs = s.ca_file.as_deref().and_then(|path| {
            let ckey = format!("{key}.ca_file");
            if replicas.as_ref().is_some_and(|r| !r[0].tls) {
                self.problem(&ckey, "applies only to an https upstream");
            }
            match load_pem_certs(path) {
                Ok(certs) => Some(certs),
                Err(e) => {
                    self.problem(&ckey, e);
                    None
                }
            }
        });
        if s.rate_limit_per_minute == Some(0) {
            self.problem(
                &format!("{key}.rate_limit_per_minute"),
                "must be at least 1 (omit it for no limit)",
            );
        }
        let seconds = |v: Option<u64>, default: u64| Duration::from_secs(v.unwrap_or(default));
        let connect_timeout = seconds(s.connect_timeout_seconds, 3);
        let read_timeout = seconds(s.read_timeout_seconds, 300);
        let idle_timeout = seconds(s.idle_timeout_seconds, 4);
        for (k, d) in [
            ("connect_timeout_seconds", connect_timeout),
            ("read_timeout_seconds", read_timeout),
            ("idle_timeout_seconds", idle_timeout),
        ] {
            if d.is_zero() {
                self.problem(&format!("{key}.{k}"), "must be at least 1");
            }
        }
        let openai = self.openai_policy(&key, s.api.as_deref(), s.models);
        Some(ServiceConfig {
            name,
            scope: scope?,
            replicas: replicas?,
            balancing,
            connect_timeout,
            read_timeout,
            idle_timeout,
            upstream_headers,
            rate_limit_per_minute: s.rate_limit_per_minute,
            ca_certs,
            openai,
        })
    }

    /// `[rate_limits]`: the Redis URL may carry a password, so its problems never quote it.
    fn rate_limits(&mut self, r: Option<file::RateLimits>) -> RateLimitSettings {
        let redis = r.and_then(|r| r.redis).and_then(|raw| {
            let url = self.expand("rate_limits.redis", &raw)?;
            parse_redis(&url)
                .map_err(|e| self.problem("rate_limits.redis", e))
                .ok()
        });
        RateLimitSettings { redis }
    }

    /// `api` and `[services.<name>.models]`: a policy only means something on a service whose
    /// bodies the gateway reads, so `models` without `api = "openai"` is refused, not ignored.
    fn openai_policy(
        &mut self,
        key: &str,
        api: Option<&str>,
        models: Option<file::Models>,
    ) -> Option<Models> {
        match api {
            None => {
                if models.is_some() {
                    self.problem(&format!("{key}.models"), "needs `api = \"openai\"`");
                }
                return None;
            }
            Some("openai") => {}
            Some(other) => {
                self.problem(
                    &format!("{key}.api"),
                    format!(
                        "`{}` is not a known API: the one supported is `openai`",
                        one_line(other)
                    ),
                );
                return None;
            }
        }
        let models = models.unwrap_or(file::Models {
            default: None,
            aliases: Default::default(),
        });
        if models.default.as_deref() == Some("") {
            self.problem(&format!("{key}.models.default"), "must not be empty");
        }
        for (alias, target) in &models.aliases {
            if alias.is_empty() || target.is_empty() {
                self.problem(
                    &format!("{key}.models.aliases"),
                    "an alias and its model must both be non-empty",
                );
            }
        }
        Some(Models::new(models.default, models.aliases))
    }
}

/// Every certificate of a PEM bundle (a CA bundle or a certificate chain), each checked to
/// parse, so a bad file fails at start-up.
fn load_pem_certs(path: &str) -> Result<Vec<Vec<u8>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
    let mut certs = Vec::new();
    for item in rustls_pemfile::certs(&mut pem.as_slice()) {
        let der = item.map_err(|e| format!("`{path}` is not valid PEM: {e}"))?;
        x509_parser::parse_x509_certificate(&der)
            .map_err(|e| format!("`{path}` holds an invalid certificate: {e}"))?;
        certs.push(der.to_vec());
    }
    if certs.is_empty() {
        return Err(format!("`{path}` holds no certificate"));
    }
    Ok(certs)
}

fn http_url(s: &str) -> Option<http::Uri> {
    let uri: http::Uri = s.parse().ok()?;
    matches!(uri.scheme_str(), Some("http" | "https")).then_some(())?;
    uri.host()?;
    Some(uri)
}

/// `redis://[user[:password]@]host[:port][/db]`. Not resolved or connected here: a Redis that is
/// down or unresolvable at start-up must not stop the gateway. Problems never quote the URL.
fn parse_redis(url: &str) -> Result<RedisServer, String> {
    const SHAPE: &str = "expected redis://[user:password@]host[:port][/db]";
    let parsed =
        redis::parse_redis_url(url).ok_or_else(|| format!("is not a valid URL: {SHAPE}"))?;
    if parsed.scheme() != "redis" {
        return Err(format!(
            "`{}://` is not supported (no TLS or unix socket in this build): {SHAPE}",
            parsed.scheme()
        ));
    }
    let host = parsed.host_str().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("has no host: {SHAPE}"));
    }
    if matches!(host, "0.0.0.0" | "[::]") {
        return Err(format!("`{host}` is a wildcard address, not a server"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!("must not have a query string or fragment: {SHAPE}"));
    }
    let db = match parsed.path().trim_start_matches('/') {
        "" => 0,
        path => path
            .parse::<u32>()
            .map_err(|_| format!("the path must be a database number such as /0: {SHAPE}"))?,
    };
    // TCP_NODELAY: requests share one connection, and Nagle's algorithm would hold a command
    // back until the previous one is acknowledged (40 ms with delayed ACKs).
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .map_err(|e| format!("is not usable: {e}"))?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    let client = redis::Client::open(info).map_err(|e| format!("is not usable: {e}"))?;
    let port = parsed.port().unwrap_or(6379);
    Ok(RedisServer {
        client,
        shown: format!("redis://{host}:{port}/{db}"),
    })
}

/// `scheme://host[:port][/base-path]`, resolved to a socket address now.
fn parse_upstream(url: &str, resolve: Resolver<'_>) -> Result<Upstream, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| format!("`{url}` is not a valid URL"))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(format!("`{url}` must start with http:// or https://")),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("`{url}` has no host"))?;
    if authority.as_str().contains('@') {
        return Err("must not carry credentials: use upstream_headers".to_string());
    }
    if uri.query().is_some() {
        return Err(format!("`{url}` must not have a query string"));
    }
    let bracketed = authority.host();
    let host = bracketed
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if host.is_empty() {
        return Err(format!("`{url}` has no host"));
    }
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let base_path = uri.path().trim_end_matches('/').to_string();
    let addresses = resolve(&host, port)?;
    let host_header = HeaderValue::from_str(&format!("{bracketed}:{port}"))
        .map_err(|_| format!("`{url}` has an invalid host"))?;
    Ok(Upstream {
        tls,
        host,
        port,
        base_path,
        addresses,
        host_header,
    })
}

#[cfg(test)]
mod tests;
