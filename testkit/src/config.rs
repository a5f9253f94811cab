//! A typed builder for the gateway's TOML: the sections every test gateway needs, written
//! once, with setters for the keys tests vary and an escape hatch for the rest. The Rust tests
//! use it through `Gateway::builder()`; the Python, Node and bench suites through the
//! `gateway-config` binary (src/bin/gateway-config.rs), which maps a JSON description onto it.

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

    /// A service with a list of replicas: `upstream = ["url1", "url2", …]` (one URL is written
    /// as a string).
    pub fn replicas(name: &'a str, urls: &[String]) -> Service<'a> {
        Service {
            upstreams: urls.to_vec(),
            ..Service::new(name, "")
        }
    }

    /// `scope`, when it is not the service's name.
    pub fn scope(mut self, scope: &'a str) -> Self {
        self.scope = scope;
        self
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
        let quoted: Vec<String> = self.upstreams.iter().map(|u| string(u)).collect();
        let upstream = if quoted.len() == 1 {
            quoted[0].clone()
        } else {
            format!("[{}]", quoted.join(", "))
        };
        let _ = writeln!(toml, "[services.{}]", self.name);
        let _ = writeln!(
            toml,
            "upstream = {upstream}\nscope = {}",
            string(self.scope)
        );
        for (k, v) in &self.settings {
            let _ = writeln!(toml, "{k} = {v}");
        }
        let _ = writeln!(toml, "{}", self.lines);
        if !self.upstream_headers.is_empty() {
            let _ = writeln!(toml, "[services.{}.upstream_headers]", self.name);
            for (k, v) in &self.upstream_headers {
                let _ = writeln!(toml, "{} = {}", key(k), string(v));
            }
        }
        if let Some((default, aliases)) = &self.models {
            let aliases: Vec<String> = aliases
                .iter()
                .map(|(a, m)| format!("{} = {}", key(a), string(m)))
                .collect();
            let _ = writeln!(toml, "[services.{}.models]", self.name);
            let _ = writeln!(
                toml,
                "default = {}\naliases = {{ {} }}",
                string(default),
                aliases.join(", ")
            );
        }
    }
}

/// One more top-level table, e.g. `[auth.jwt]`, `[admin]` or `[budgets]`: its `key = value`
/// lines in order (values TOML as written: `string` quotes one, `value` writes JSON as TOML). No
/// lines: the table alone, which switches a section on with its defaults (`[budgets]`).
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub name: String,
    entries: Vec<(String, String)>,
}

impl Table {
    pub fn new(name: &str) -> Table {
        Table {
            name: name.to_string(),
            entries: Vec::new(),
        }
    }

    /// Any `key = value`; `value` is TOML as written.
    pub fn set(mut self, key: &str, value: impl ToString) -> Self {
        self.entries.push((key.to_string(), value.to_string()));
        self
    }

    fn write(&self, toml: &mut String) {
        let _ = writeln!(toml, "[{}]", self.name);
        for (k, v) in &self.entries {
            let _ = writeln!(toml, "{} = {v}", key(k));
        }
    }
}

/// The gateway's config file, minus what only a started gateway knows (its directory and ports).
/// A key whose value is `None` is left out, so that the gateway's own default applies.
#[derive(Clone)]
pub struct GatewayConfig<'a> {
    /// A comment written on the first line (who wrote the file).
    pub comment: Option<String>,
    pub services: Vec<Service<'a>>,
    /// TOML appended after the generated sections; `{dir}` stands for the gateway's directory.
    pub extra: String,
    pub threads: Option<u32>,
    /// `grace_period_seconds`.
    pub grace_period: Option<u64>,
    /// `graceful_shutdown_timeout_seconds`.
    pub shutdown_timeout: Option<u64>,
    /// `upgrade_sock`, `pid_file`: in the gateway's directory (`upgrade.sock`, `portcullis.pid`)
    /// unless set.
    pub upgrade_sock: Option<String>,
    pub pid_file: Option<String>,
    /// `max_request_body_bytes`.
    pub max_body: Option<u64>,
    /// More `key = value` lines of `[server]` (TOML as written).
    pub server: Vec<(String, String)>,
    /// `[auth.api_keys] database`; a SQLite file in the gateway's directory by default.
    pub key_store: Option<String>,
    /// `cache_ttl_seconds`, `negative_cache_ttl_seconds` of `[auth.api_keys]`.
    pub cache_ttl: Option<u64>,
    pub negative_cache_ttl: Option<u64>,
    /// More `key = value` lines of `[auth.api_keys]` (TOML as written).
    pub api_keys: Vec<(String, String)>,
    /// More tables (`[auth.jwt]`, `[admin]`, `[budgets]` …), written after `[auth.api_keys]`.
    pub tables: Vec<Table>,
}

/// What the Rust tests' gateways get unless they say otherwise.
impl Default for GatewayConfig<'_> {
    fn default() -> Self {
        GatewayConfig {
            threads: Some(2),
            grace_period: Some(5),
            shutdown_timeout: Some(1),
            max_body: Some(4096),
            cache_ttl: Some(15),
            negative_cache_ttl: Some(1),
            ..GatewayConfig::bare()
        }
    }
}

impl<'a> GatewayConfig<'a> {
    /// Only what every gateway needs: the listener, the upgrade socket and pid file, the key
    /// store (the last three in the gateway's directory); every other key is the gateway's
    /// default until set.
    pub fn bare() -> Self {
        GatewayConfig {
            comment: None,
            services: Vec::new(),
            extra: String::new(),
            threads: None,
            grace_period: None,
            shutdown_timeout: None,
            upgrade_sock: None,
            pid_file: None,
            max_body: None,
            server: Vec::new(),
            key_store: None,
            cache_ttl: None,
            negative_cache_ttl: None,
            api_keys: Vec::new(),
            tables: Vec::new(),
        }
    }

    pub fn service(mut self, s: Service<'a>) -> Self {
        self.services.push(s);
        self
    }

    pub fn table(mut self, t: Table) -> Self {
        self.tables.push(t);
        self
    }

    /// The TOML for a gateway living in `dir`, serving on `port`, with metrics on
    /// `metrics_port` (no `[metrics]` listener when `None`).
    pub fn render(&self, dir: &Path, port: u16, metrics_port: Option<u16>) -> String {
        let d = dir.display().to_string();
        let database = self
            .key_store
            .clone()
            .unwrap_or_else(|| format!("sqlite://{d}/keys.db"));
        let upgrade_sock =
            (self.upgrade_sock.clone()).unwrap_or_else(|| format!("{d}/upgrade.sock"));
        let pid_file = (self.pid_file.clone()).unwrap_or_else(|| format!("{d}/portcullis.pid"));
        let mut toml = String::new();
        if let Some(comment) = &self.comment {
            let _ = writeln!(toml, "# {comment}");
        }
        let line = |key: &str, value: Option<u64>| value.map(|v| format!("{key} = {v}\n"));
        let _ = write!(
            toml,
            "[server]\nlisten = [\"127.0.0.1:{port}\"]\n{}{}{}\
             upgrade_sock = {}\npid_file = {}\n{}",
            line("threads", self.threads.map(u64::from)).unwrap_or_default(),
            line("grace_period_seconds", self.grace_period).unwrap_or_default(),
            line("graceful_shutdown_timeout_seconds", self.shutdown_timeout).unwrap_or_default(),
            string(&upgrade_sock),
            string(&pid_file),
            line("max_request_body_bytes", self.max_body).unwrap_or_default(),
        );
        for (k, v) in &self.server {
            let _ = writeln!(toml, "{k} = {v}");
        }
        if let Some(metrics_port) = metrics_port {
            let _ = writeln!(toml, "[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"");
        }
        let _ = writeln!(toml, "[auth.api_keys]\ndatabase = {}", string(&database));
        toml.push_str(&line("cache_ttl_seconds", self.cache_ttl).unwrap_or_default());
        toml.push_str(
            &line("negative_cache_ttl_seconds", self.negative_cache_ttl).unwrap_or_default(),
        );
        for (k, v) in &self.api_keys {
            let _ = writeln!(toml, "{k} = {v}");
        }
        for t in &self.tables {
            t.write(&mut toml);
        }
        for s in &self.services {
            s.write(&mut toml);
        }
        toml.push_str(&self.extra.replace("{dir}", &d));
        toml
    }
}

/// A TOML basic string: quoted, with `"`, `\` and control characters escaped.
pub fn string(s: &str) -> String {
    // A JSON string is a valid TOML basic string (the same escapes; serde_json writes no `\/`).
    serde_json::Value::from(s).to_string()
}

/// A TOML key: bare when it can be (A-Z a-z 0-9 _ -), else quoted.
pub fn key(k: &str) -> String {
    let bare =
        !k.is_empty() && (k.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        k.to_string()
    } else {
        string(k)
    }
}

/// A JSON value written as TOML: strings, numbers, booleans, arrays, and objects as inline
/// tables. TOML has no null: Err names where one was.
pub fn value(v: &serde_json::Value) -> Result<String, String> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => return Err("null has no TOML form (leave the key out)".into()),
        Value::Bool(_) | Value::Number(_) | Value::String(_) => v.to_string(),
        Value::Array(items) => {
            let items: Result<Vec<String>, String> = items.iter().map(value).collect();
            format!("[{}]", items?.join(", "))
        }
        Value::Object(map) => {
            let mut entries = Vec::new();
            for (k, v) in map {
                entries.push(format!(
                    "{} = {}",
                    key(k),
                    value(v).map_err(|e| format!("{k}: {e}"))?
                ));
            }
            format!("{{ {} }}", entries.join(", "))
        }
    })
}
