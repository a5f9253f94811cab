//! A typed builder for the gateway's TOML: the sections every test gateway needs, written
//! once, with setters for the keys tests vary and an escape hatch for the rest.

use std::fmt::Write as _;
use std::path::Path;

/// One `[services.NAME]` table.
#[derive(Clone)]
pub struct Service<'a> {
    pub name: &'a str,
    /// One URL, or several replicas (written as a list).
    pub upstreams: Vec<String>,
    pub scope: &'a str,
    settings: Vec<(String, String)>,
    upstream_headers: Vec<(String, String)>,
    models: Option<(String, Vec<(String, String)>)>,
    /// Lines written as they are at the end of the service's table.
    lines: &'a str,
}

impl<'a> Service<'a> {
    /// A service whose scope is its name.
    pub fn new(name: &'a str, upstream: impl Into<String>) -> Service<'a> {
        Service {
            name,
            upstreams: vec![upstream.into()],
            scope: name,
            settings: Vec::new(),
            upstream_headers: Vec::new(),
            models: None,
            lines: "",
        }
    }

    /// A service with a list of replicas: `upstream = ["url1", "url2", …]`.
    pub fn replicas(name: &'a str, urls: &[String]) -> Service<'a> {
        Service {
            upstreams: urls.to_vec(),
            ..Service::new(name, "")
        }
    }

    /// Any `key = value` of the service's table; `value` is TOML as written.
    pub fn set(mut self, key: &str, value: impl ToString) -> Self {
        self.settings.push((key.to_string(), value.to_string()));
        self
    }

    /// `api = "openai"`: the gateway reads OpenAI request bodies on this service.
    pub fn openai(self) -> Self {
        self.set("api", "\"openai\"")
    }

    pub fn read_timeout(self, seconds: u64) -> Self {
        self.set("read_timeout_seconds", seconds)
    }

    pub fn rate_limit_per_minute(self, n: u64) -> Self {
        self.set("rate_limit_per_minute", n)
    }

    pub fn dns_refresh(self, seconds: u64) -> Self {
        self.set("dns_refresh_seconds", seconds)
    }

    /// `ca_file`: the CA bundle an https upstream's certificate is verified against.
    pub fn ca_file(self, path: &std::path::Path) -> Self {
        self.set("ca_file", format!("\"{}\"", path.display()))
    }

    /// `[services.NAME.models]`: the model policy's default and aliases.
    pub fn models(mut self, default: &str, aliases: &[(&str, &str)]) -> Self {
        let aliases = aliases.iter().map(|(a, m)| (a.to_string(), m.to_string()));
        self.models = Some((default.to_string(), aliases.collect()));
        self
    }

    /// TOML lines written as they are at the end of the service's table (keys the typed
    /// setters do not cover, e.g. `balance = "round_robin"`).
    pub fn lines(mut self, toml: &'a str) -> Self {
        self.lines = toml;
        self
    }

    /// A header set on every upstream request (`${VAR}` expands from the environment).
    pub fn upstream_header(mut self, name: &str, value: &str) -> Self {
        self.upstream_headers.push((name.into(), value.into()));
        self
    }

    fn write(&self, toml: &mut String) {
        let quoted: Vec<String> = self.upstreams.iter().map(|u| format!("\"{u}\"")).collect();
        let upstream = if quoted.len() == 1 {
            quoted[0].clone()
        } else {
            format!("[{}]", quoted.join(", "))
        };
        let _ = writeln!(toml, "[services.{}]", self.name);
        let _ = writeln!(toml, "upstream = {upstream}\nscope = \"{}\"", self.scope);
        for (k, v) in &self.settings {
            let _ = writeln!(toml, "{k} = {v}");
        }
        let _ = writeln!(toml, "{}", self.lines);
        if !self.upstream_headers.is_empty() {
            let _ = writeln!(toml, "[services.{}.upstream_headers]", self.name);
            for (k, v) in &self.upstream_headers {
                let _ = writeln!(toml, "{k} = \"{v}\"");
            }
        }
        if let Some((default, aliases)) = &self.models {
            let aliases: Vec<String> = aliases
                .iter()
                .map(|(a, m)| format!("{a} = \"{m}\""))
                .collect();
            let _ = writeln!(toml, "[services.{}.models]", self.name);
            let _ = writeln!(
                toml,
                "default = \"{default}\"\naliases = {{ {} }}",
                aliases.join(", ")
            );
        }
    }
}

/// The gateway's config file, minus what only a started gateway knows (its directory and ports).
#[derive(Clone)]
pub struct GatewayConfig<'a> {
    pub services: Vec<Service<'a>>,
    /// TOML appended after the generated sections; `{dir}` stands for the gateway's directory.
    pub extra: String,
    pub cache_ttl: u64,
    pub grace_period: u64,
    pub max_body: u64,
    pub threads: u32,
    /// `[auth.api_keys] database`; a SQLite file in the gateway's directory by default.
    pub key_store: Option<String>,
    /// More `key = value` lines of `[server]` (TOML as written).
    pub server: Vec<(String, String)>,
}

impl Default for GatewayConfig<'_> {
    fn default() -> Self {
        GatewayConfig {
            services: Vec::new(),
            extra: String::new(),
            cache_ttl: 15,
            grace_period: 5,
            max_body: 4096,
            threads: 2,
            key_store: None,
            server: Vec::new(),
        }
    }
}

impl GatewayConfig<'_> {
    /// The TOML for a gateway living in `dir`, serving on `port`, with metrics on `metrics_port`.
    pub fn render(&self, dir: &Path, port: u16, metrics_port: u16) -> String {
        let d = dir.display().to_string();
        let database = self
            .key_store
            .clone()
            .unwrap_or_else(|| format!("sqlite://{d}/keys.db"));
        let mut toml = format!(
            "[server]\nlisten = [\"127.0.0.1:{port}\"]\nthreads = {}\n\
             grace_period_seconds = {}\ngraceful_shutdown_timeout_seconds = 1\n\
             upgrade_sock = \"{d}/upgrade.sock\"\npid_file = \"{d}/portcullis.pid\"\n\
             max_request_body_bytes = {}\n{}\
             [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\
             [auth.api_keys]\ndatabase = \"{database}\"\n\
             cache_ttl_seconds = {}\nnegative_cache_ttl_seconds = 1\n",
            self.threads,
            self.grace_period,
            self.max_body,
            self.server
                .iter()
                .map(|(k, v)| format!("{k} = {v}\n"))
                .collect::<String>(),
            self.cache_ttl
        );
        for s in &self.services {
            s.write(&mut toml);
        }
        toml.push_str(&self.extra.replace("{dir}", &d));
        toml
    }
}
