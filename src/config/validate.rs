//! The validator: the file's sections (`file`) checked into the model (`model`), collecting
//! every problem, each naming the file and the key. Services are in `service.rs`, replicas in
//! `replicas.rs`, `[admin]` in `admin.rs`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::parse::{http_url, load_pem_certs, parse_redis, Resolver};
use super::{
    expand_env, file, one_line, AccessLogDestination, AccessLogSettings, ApiKeySettings,
    BudgetSettings, BufferLimits, ConnectionLimits, Enforcement, JwtSettings, MeteringSettings,
    MetricsSettings, RateLimitSettings, ServerSettings, TlsListenSettings,
    DEFAULT_ACCESS_LOG_BUFFER,
};

pub(crate) const DEFAULT_MAX_BODY: u64 = 32 * 1024 * 1024;
pub(crate) const DEFAULT_MAX_BUFFERED_BODY: u64 = 8 * 1024 * 1024;
pub(crate) const DEFAULT_BUFFERED_BODIES_MAX: u64 = 256 * 1024 * 1024;
/// `[server] buffered_bytes_per_caller`: one caller cannot take every other caller's room.
pub(crate) const DEFAULT_BUFFERED_BYTES_PER_CALLER: u64 = 32 * 1024 * 1024;
pub(crate) const DEFAULT_BUFFERED_BODY_TIMEOUT: u64 = 60;
const DEFAULT_ACCESS_LOG_FILES: usize = 5;
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

pub(super) struct Validator<'a> {
    pub file: String,
    pub problems: Vec<String>,
    pub lookup: &'a dyn Fn(&str) -> Option<String>,
    pub resolve: Resolver<'a>,
}

impl Validator<'_> {
    pub(crate) fn problem(&mut self, key: &str, what: impl fmt::Display) {
        self.problems
            .push(one_line(&format!("{}: {key}: {what}", self.file)));
    }

    pub(crate) fn expand(&mut self, key: &str, value: &str) -> Option<String> {
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
    pub(crate) fn listen_address(&mut self, key: &str, addr: &str) {
        if addr.parse::<SocketAddr>().is_err() {
            self.problem(key, format!("`{addr}` is not an ip:port address"));
        }
    }

    pub(crate) fn metrics(&mut self, m: file::Metrics) -> MetricsSettings {
        self.listen_address("metrics.listen", &m.listen);
        MetricsSettings { listen: m.listen }
    }

    pub(crate) fn server(&mut self, s: file::Server) -> ServerSettings {
        let buffering = self.buffer_limits(&s);
        let connections = self.connection_limits(&s);
        let listen = s
            .listen
            .unwrap_or_else(|| vec!["127.0.0.1:8080".to_string()]);
        let tls = s.tls.map(|t| self.tls("server.tls", t));
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
            buffering,
            connections,
            tls,
        }
    }

    fn connection_limits(&mut self, s: &file::Server) -> ConnectionLimits {
        let header_timeout = s.header_timeout_seconds.unwrap_or(10);
        if !(1..=3600).contains(&header_timeout) {
            self.problem("server.header_timeout_seconds", "must be from 1 to 3600");
        }
        let max = s.max_connections.unwrap_or(10_000);
        if max == 0 {
            self.problem("server.max_connections", "must be at least 1");
        }
        let per_client = s.max_connections_per_client.unwrap_or(256.min(max.max(1)));
        if per_client == 0 {
            self.problem("server.max_connections_per_client", "must be at least 1");
        } else if max > 0 && per_client > max {
            self.problem(
                "server.max_connections_per_client",
                format!("{per_client} is more than server.max_connections ({max})"),
            );
        }
        ConnectionLimits {
            header_timeout: Duration::from_secs(header_timeout),
            max_connections: max as usize,
            max_connections_per_client: per_client as usize,
        }
    }

    /// A body read whole is bounded alone, all of them together, and in time; a total below
    /// one body would refuse every body of the largest allowed size.
    fn buffer_limits(&mut self, s: &file::Server) -> BufferLimits {
        let max_body = s
            .max_buffered_body_bytes
            .unwrap_or(DEFAULT_MAX_BUFFERED_BODY);
        if max_body == 0 {
            self.problem("server.max_buffered_body_bytes", "must be at least 1");
        }
        // Both hold whole bodies: below one body of the largest size, such a body never fits.
        let mut room = |key: &str, value: Option<u64>, default: u64, why: &str| {
            let value = value.unwrap_or(default);
            if value < max_body {
                let problem = format!(
                    "{value} is less than server.max_buffered_body_bytes ({max_body}): {why}"
                );
                self.problem(key, problem);
            }
            value
        };
        let total = room(
            "server.buffered_bodies_max_bytes",
            s.buffered_bodies_max_bytes,
            DEFAULT_BUFFERED_BODIES_MAX,
            "not even one such body would fit",
        );
        let per_caller = room(
            "server.buffered_bytes_per_caller",
            s.buffered_bytes_per_caller,
            DEFAULT_BUFFERED_BYTES_PER_CALLER,
            "no caller could send such a body",
        );
        let timeout = s
            .buffered_body_timeout_seconds
            .unwrap_or(DEFAULT_BUFFERED_BODY_TIMEOUT);
        if !(1..=3600).contains(&timeout) {
            self.problem(
                "server.buffered_body_timeout_seconds",
                "must be from 1 to 3600",
            );
        }
        BufferLimits {
            max_body,
            total,
            per_caller,
            timeout: Duration::from_secs(timeout),
        }
    }

    pub(crate) fn access_log(&mut self, a: Option<file::AccessLog>) -> AccessLogSettings {
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

    /// A TLS listener section (`server.tls` or `admin.tls`: `section` names it in problems).
    pub(crate) fn tls(&mut self, section: &str, t: file::Tls) -> TlsListenSettings {
        for addr in &t.listen {
            self.listen_address(&format!("{section}.listen"), addr);
        }
        if let Err(e) = load_pem_certs(&t.cert_file) {
            self.problem(&format!("{section}.cert_file"), e);
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
            self.problem(&format!("{section}.key_file"), e);
        }
        TlsListenSettings {
            listen: t.listen,
            cert_file: t.cert_file,
            key_file: t.key_file,
        }
    }

    pub(crate) fn api_keys(&mut self, a: file::ApiKeys) -> ApiKeySettings {
        let database = self
            .expand("auth.api_keys.database", &a.database)
            .unwrap_or_default();
        let postgres = crate::store::is_postgres_url(&database);
        if postgres {
            // The URL may carry a password: its problems never quote it.
            if let Err(e) = crate::store::check_postgres_url(&database) {
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

    pub(crate) fn jwt(&mut self, j: file::Jwt) -> Option<JwtSettings> {
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

    /// `[rate_limits]`: the Redis URL may carry a password, so its problems never quote it.
    pub(crate) fn metering(&mut self, m: Option<file::Metering>) -> MeteringSettings {
        let seconds = m.as_ref().and_then(|m| m.flush_seconds).unwrap_or(1);
        if seconds == 0 {
            self.problem("metering.flush_seconds", "must be at least 1");
        }
        let models = m
            .as_ref()
            .and_then(|m| m.max_models_per_key_hour)
            .unwrap_or(32);
        if !(1..=10_000).contains(&models) {
            self.problem(
                "metering.max_models_per_key_hour",
                "must be from 1 to 10000",
            );
        }
        let tail = m.as_ref().and_then(|m| m.tail_seconds).unwrap_or(30);
        if tail > 3600 {
            self.problem("metering.tail_seconds", "must be from 0 to 3600");
        }
        MeteringSettings {
            flush: Duration::from_secs(seconds.max(1)),
            max_models_per_key_hour: models.clamp(1, 10_000) as usize,
            tail: Duration::from_secs(tail.min(3600)),
        }
    }

    /// `[budgets]`: kept in the key store, so they need one.
    pub(crate) fn budgets(&mut self, b: file::Budgets, has_store: bool) -> BudgetSettings {
        if !has_store {
            self.problem(
                "budgets",
                "budgets are kept in the key store: [auth.api_keys] is required",
            );
        }
        let enforcement = match b.enforcement.as_deref() {
            None | Some("reserve") => Enforcement::Reserve,
            Some("after") => Enforcement::After,
            Some(other) => {
                let why = format!("{other:?} is not one of \"reserve\", \"after\"");
                self.problem("budgets.enforcement", why);
                Enforcement::Reserve
            }
        };
        let per_token = b.prompt_bytes_per_token.unwrap_or(4);
        if per_token == 0 {
            self.problem("budgets.prompt_bytes_per_token", "must be at least 1");
        }
        let refuse_unstated_cap = match b.unstated_cap.as_deref() {
            None | Some("insert") => false,
            Some("refuse") => true,
            Some(other) => {
                let why = format!("{other:?} is not one of \"insert\", \"refuse\"");
                self.problem("budgets.unstated_cap", why);
                false
            }
        };
        let default_max_tokens = b.default_max_tokens.unwrap_or(1024);
        if default_max_tokens == 0 {
            self.problem("budgets.default_max_tokens", "must be at least 1");
        }
        BudgetSettings {
            enforcement,
            default_max_tokens,
            prompt_bytes_per_token: per_token.max(1),
            refuse_unstated_cap,
        }
    }

    pub(crate) fn rate_limits(&mut self, r: Option<file::RateLimits>) -> RateLimitSettings {
        let redis = r.and_then(|r| r.redis).and_then(|raw| {
            let url = self.expand("rate_limits.redis", &raw)?;
            parse_redis(&url)
                .map_err(|e| self.problem("rate_limits.redis", e))
                .ok()
        });
        RateLimitSettings { redis }
    }
}
