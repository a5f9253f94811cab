//! Configuration: the TOML file (`file`) validated (`validate`, `service`, `replicas`,
//! `admin`) into the model the gateway runs on (`model`). Everything that can be checked or
//! computed once is done here, at start-up: `${VAR}` expansion, URL parsing, DNS resolution,
//! header encoding.

mod admin;
mod env;
mod file;
mod model;
mod parse;
mod pricing;
mod replicas;
mod service;
mod validate;

use std::fmt;
use std::path::{Path, PathBuf};

pub(crate) use crate::one_line::one_line;
use crate::one_line::toml_problem;

use crate::pricing::PricingSettings;
pub(crate) use admin::AdminSettings;
pub(crate) use env::expand as expand_env;
pub use model::*;
pub(crate) use parse::{resolve_system, Resolver};
pub(crate) use replicas::{Balance, Balancing, HealthCheckSettings};
use validate::Validator;

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

impl std::error::Error for ConfigError {}

impl Config {
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            problems: vec![format!("{}: cannot read: {e}", path.display())],
        })?;
        Config::parse(path, &text, |name| std::env::var(name).ok())
    }

    /// Parses and validates `text`, the file at `path`; `lookup` reads the environment for
    /// `${VAR}`.
    pub fn parse(
        path: &Path,
        text: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::parse_with(path, text, &lookup, &resolve_system)
    }

    /// `parse` with the host resolver given.
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
        // Price entries may name a service: every one in the file, even one with problems.
        let service_names: Vec<String> = raw.services.keys().cloned().collect();
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
            metering: v.metering(raw.metering),
            budgets: None,
            admin: None,
            pricing: None,
        };
        let mut config = config;
        config.admin = raw.admin.map(|a| v.admin(a, &config));
        config.budgets = raw.budgets.map(|b| v.budgets(b, config.api_keys.is_some()));
        let names: Vec<&str> = service_names.iter().map(String::as_str).collect();
        config.pricing = raw.pricing.map(|p| v.pricing(p, &names));
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

    /// Only `[pricing]` (its table checked, against the service names), for `prices check`:
    /// like the `keys` commands, it needs no upstream secrets or DNS.
    pub(crate) fn pricing_from_file(path: &Path) -> Result<PricingSettings, ConfigError> {
        let shown = path.display().to_string();
        let one = |problem: String| ConfigError {
            problems: vec![problem],
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| one(format!("{shown}: cannot read: {e}")))?;
        let raw: file::File =
            toml::from_str(&text).map_err(|e| one(toml_problem(&shown, &text, &e)))?;
        let raw_pricing = raw.pricing.ok_or_else(|| {
            one(format!(
                "{shown}: pricing: section missing, so there is no price table"
            ))
        })?;
        let lookup = |name: &str| std::env::var(name).ok();
        let mut v = Validator {
            file: shown,
            problems: Vec::new(),
            lookup: &lookup,
            resolve: &resolve_system,
        };
        let names: Vec<&str> = raw.services.keys().map(String::as_str).collect();
        let settings = v.pricing(raw_pricing, &names);
        if v.problems.is_empty() {
            Ok(settings)
        } else {
            Err(ConfigError {
                problems: v.problems,
            })
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

#[cfg(test)]
mod tests;
