//! The test kit's gateway-config builder (testkit/src/config.rs) as a program, so that the
//! suites outside Rust (tests/sdk, tests/admin_api, tests/browser, benches/load) write their
//! gateways' TOML through the same typed code as the Rust tests, never by hand.
//!
//!   gateway-config < description.json > portcullis.toml
//!
//! Reads one JSON object on stdin and prints the TOML on stdout (exit 0), or a message on
//! stderr (exit 2). The description has the TOML's shape; a key left out is left out of the
//! file, so the gateway's own default applies:
//!
//!   {
//!     "comment": "written by tests/sdk/run.py",     the file's first line, as a comment
//!     "dir": "/tmp/x",                  upgrade_sock, pid_file and the SQLite key store go here
//!     "port": 8080,                     [server] listen = ["127.0.0.1:8080"]
//!     "metrics_port": 9090,             [metrics] listen = "127.0.0.1:9090" (none without it)
//!     "server": {"threads": 1, "grace_period_seconds": 1, "graceful_shutdown_timeout_seconds": 1,
//!                "max_request_body_bytes": 4096, "upgrade_sock": "…", "pid_file": "…", …},
//!     "api_keys": {"database": "sqlite://…", "cache_ttl_seconds": 1,
//!                  "negative_cache_ttl_seconds": 1, …},           [auth.api_keys]
//!     "jwt": {"issuer": "…", "audience": "…", …},                 [auth.jwt]
//!     "access_log": {…}, "admin": {…}, "budgets": {…}, "dns": {…}, "metering": {…},
//!     "pricing": {…}, "rate_limits": {…},  those tables as given ({} writes the bare table)
//!     "services": [{"name": "chatx", "upstream": "http://…" or ["http://…", …] (one: a string),
//!                   "scope": "chatx" (default: the name),
//!                   "models": {"default": "m", "aliases": {"a": "m2"}},
//!                   "upstream_headers": {"X-Org": "${ORG}"},
//!                   "api": "openai", "read_timeout_seconds": 30, …}]
//!   }
//!
//! "…" in a table: any more keys of it, JSON values written as TOML (objects as inline
//! tables); the gateway checks them when it reads the file (`portcullis serve -t`). Unknown
//! top-level keys are refused here.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use testkit::config::{self, GatewayConfig, Service, Table};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Description {
    comment: Option<String>,
    dir: String,
    port: u16,
    metrics_port: Option<u16>,
    #[serde(default)]
    server: Entries,
    #[serde(default)]
    api_keys: Entries,
    jwt: Option<Entries>,
    access_log: Option<Entries>,
    admin: Option<Entries>,
    budgets: Option<Entries>,
    dns: Option<Entries>,
    metering: Option<Entries>,
    pricing: Option<Entries>,
    rate_limits: Option<Entries>,
    #[serde(default)]
    services: Vec<ServiceDescription>,
}

#[derive(Deserialize)]
struct ServiceDescription {
    name: String,
    upstream: Upstreams,
    scope: Option<String>,
    models: Option<Models>,
    #[serde(default)]
    upstream_headers: Entries,
    /// Every other key of the service's table.
    #[serde(flatten)]
    settings: Entries,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Upstreams {
    One(String),
    Replicas(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Models {
    default: String,
    #[serde(default)]
    aliases: Entries,
}

/// A JSON object's entries in the order written, so that the file reads as the suite's
/// description does (serde_json's own map sorts them).
#[derive(Default)]
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Ordered;
        impl<'de> Visitor<'de> for Ordered {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(Ordered)
    }
}

impl Entries {
    fn iter(&self) -> std::slice::Iter<'_, (String, Value)> {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a Entries {
    type Item = &'a (String, Value);
    type IntoIter = std::slice::Iter<'a, (String, Value)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

fn main() -> ExitCode {
    if std::env::args().len() > 1 {
        eprintln!(
            "usage: gateway-config < description.json > portcullis.toml (see the source's header)"
        );
        return ExitCode::from(2);
    }
    let mut input = String::new();
    let toml = std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("reading stdin: {e}"))
        .and_then(|_| serde_json::from_str(&input).map_err(|e| format!("the description: {e}")))
        .and_then(|d: Description| render(&d));
    match toml {
        Ok(toml) => {
            print!("{toml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gateway-config: {e}");
            ExitCode::from(2)
        }
    }
}

fn render(d: &Description) -> Result<String, String> {
    let mut c = GatewayConfig::bare();
    c.comment = d.comment.clone();
    for (k, v) in &d.server {
        let at = format!("server.{k}");
        match k.as_str() {
            "listen" => return Err(format!("{at}: give \"port\" instead")),
            "threads" => c.threads = Some(number(v, &at)?),
            "grace_period_seconds" => c.grace_period = Some(number(v, &at)?),
            "graceful_shutdown_timeout_seconds" => c.shutdown_timeout = Some(number(v, &at)?),
            "max_request_body_bytes" => c.max_body = Some(number(v, &at)?),
            "upgrade_sock" => c.upgrade_sock = Some(text(v, &at)?),
            "pid_file" => c.pid_file = Some(text(v, &at)?),
            _ => c.server.push((config::key(k), toml(v, &at)?)),
        }
    }
    for (k, v) in &d.api_keys {
        let at = format!("api_keys.{k}");
        match k.as_str() {
            "database" => c.key_store = Some(text(v, &at)?),
            "cache_ttl_seconds" => c.cache_ttl = Some(number(v, &at)?),
            "negative_cache_ttl_seconds" => c.negative_cache_ttl = Some(number(v, &at)?),
            _ => c.api_keys.push((config::key(k), toml(v, &at)?)),
        }
    }
    let tables = [
        ("auth.jwt", &d.jwt),
        ("access_log", &d.access_log),
        ("admin", &d.admin),
        ("budgets", &d.budgets),
        ("dns", &d.dns),
        ("metering", &d.metering),
        ("pricing", &d.pricing),
        ("rate_limits", &d.rate_limits),
    ];
    for (name, entries) in tables {
        if let Some(entries) = entries {
            let mut t = Table::new(name);
            for (k, v) in entries {
                t = t.set(k, toml(v, &format!("{name}.{k}"))?);
            }
            c = c.table(t);
        }
    }
    for s in &d.services {
        let at = format!("services.{}", s.name);
        let mut service = match &s.upstream {
            Upstreams::One(url) => Service::new(&s.name, url),
            Upstreams::Replicas(urls) => Service::replicas(&s.name, urls),
        };
        if let Some(scope) = &s.scope {
            service = service.scope(scope);
        }
        for (k, v) in &s.settings {
            service = service.set(&config::key(k), toml(v, &format!("{at}.{k}"))?);
        }
        for (k, v) in &s.upstream_headers {
            service = service.upstream_header(k, &text(v, &format!("{at}.upstream_headers"))?);
        }
        if let Some(m) = &s.models {
            let aliases: Vec<(&str, String)> = (m.aliases.iter())
                .map(|(a, v)| Ok((a.as_str(), text(v, &format!("{at}.models.aliases"))?)))
                .collect::<Result<_, String>>()?;
            let aliases: Vec<(&str, &str)> =
                aliases.iter().map(|(a, m)| (*a, m.as_str())).collect();
            service = service.models(&m.default, &aliases);
        }
        c = c.service(service);
    }
    Ok(c.render(Path::new(&d.dir), d.port, d.metrics_port))
}

fn toml(v: &Value, at: &str) -> Result<String, String> {
    config::value(v).map_err(|e| format!("{at}: {e}"))
}

fn number<N: TryFrom<u64>>(v: &Value, at: &str) -> Result<N, String> {
    (v.as_u64().and_then(|n| N::try_from(n).ok()))
        .ok_or_else(|| format!("{at}: {v} is not a whole number in range"))
}

fn text(v: &Value, at: &str) -> Result<String, String> {
    (v.as_str().map(str::to_string)).ok_or_else(|| format!("{at}: {v} is not a string"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(json: &str) -> Result<String, String> {
        let d: Description = serde_json::from_str(json).map_err(|e| e.to_string())?;
        render(&d)
    }

    #[test]
    fn a_description_is_written_in_its_order_with_the_builder_s_layout() {
        let toml = run(r#"{
            "comment": "written by a test", "dir": "/tmp/gw", "port": 1000, "metrics_port": 1001,
            "server": {"threads": 1, "grace_period_seconds": 1, "max_connections": 9},
            "api_keys": {"cache_ttl_seconds": 2},
            "jwt": {"issuer": "http://127.0.0.1:1002", "audience": "a", "algorithms": ["RS256"]},
            "budgets": {},
            "admin": {"listen": "127.0.0.1:1003", "tls": {"listen": ["127.0.0.1:1004"]}},
            "services": [
                {"name": "chat", "upstream": "http://127.0.0.1:1005/v1", "api": "openai",
                 "models": {"default": "m", "aliases": {"small": "m-1", "a.b": "m-2"}},
                 "upstream_headers": {"X-Org": "${ORG}"}},
                {"name": "pool", "upstream": ["http://127.0.0.1:1", "http://127.0.0.2:1"],
                 "scope": "chat", "balance": "round_robin"}
            ]
        }"#)
        .unwrap();
        assert_eq!(
            toml,
            r#"# written by a test
[server]
listen = ["127.0.0.1:1000"]
threads = 1
grace_period_seconds = 1
upgrade_sock = "/tmp/gw/upgrade.sock"
pid_file = "/tmp/gw/portcullis.pid"
max_connections = 9
[metrics]
listen = "127.0.0.1:1001"
[auth.api_keys]
database = "sqlite:///tmp/gw/keys.db"
cache_ttl_seconds = 2
[auth.jwt]
issuer = "http://127.0.0.1:1002"
audience = "a"
algorithms = ["RS256"]
[admin]
listen = "127.0.0.1:1003"
tls = { listen = ["127.0.0.1:1004"] }
[budgets]
[services.chat]
upstream = "http://127.0.0.1:1005/v1"
scope = "chat"
api = "openai"

[services.chat.upstream_headers]
X-Org = "${ORG}"
[services.chat.models]
default = "m"
aliases = { small = "m-1", "a.b" = "m-2" }
[services.pool]
upstream = ["http://127.0.0.1:1", "http://127.0.0.2:1"]
scope = "chat"
balance = "round_robin"

"#
        );
    }

    #[test]
    fn strings_are_escaped_and_what_toml_cannot_say_is_refused() {
        let toml = run(r#"{"dir": "/tmp/a \"b\"", "port": 1, "metering": {"x": "a\\b\n"}}"#);
        let toml = toml.unwrap();
        assert!(
            toml.contains(r#"upgrade_sock = "/tmp/a \"b\"/upgrade.sock""#),
            "{toml}"
        );
        assert!(toml.contains(r#"x = "a\\b\n""#), "{toml}");
        let err = run(r#"{"dir": "/tmp", "port": 1, "budgets": {"enforcement": null}}"#);
        assert!(err.unwrap_err().starts_with("budgets.enforcement: null"));
        let err = run(r#"{"dir": "/tmp", "port": 1, "budget": {}}"#);
        assert!(err.unwrap_err().contains("unknown field `budget`"));
        let err = run(r#"{"dir": "/tmp", "port": 1, "server": {"listen": ["x"]}}"#);
        assert!(err.unwrap_err().contains("give \"port\""));
    }
}
