//! `[services.<name>]`: the name, scope, upstream headers, CA, limits, timeouts and the
//! model policy of one service (its replicas are in `replicas.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};

use super::parse::load_pem_certs;
use super::validate::Validator;
use super::{file, one_line, ServiceConfig};
use crate::api::{Api, Models, Pair};
use crate::scope::Scope;

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

impl Validator<'_> {
    pub(crate) fn service(
        &mut self,
        name: String,
        s: file::Service,
        own_dns: bool,
    ) -> Option<ServiceConfig> {
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
        let (api, models) = self.model_policy(&key, s.api.as_deref(), s.models).unzip();
        let pkey = format!("{key}.unmetered_paths");
        if models.is_none() && !s.unmetered_paths.is_empty() {
            self.problem(
                &pkey,
                "needs `api`: without it no path is metered or refused",
            );
        }
        for path in &s.unmetered_paths {
            let well_formed = path.starts_with('/')
                && path.len() > 1
                && !path.ends_with('/')
                && !path
                    .bytes()
                    .any(|b| b == b'?' || b == b'#' || b.is_ascii_control());
            if !well_formed {
                let why = format!(
                    "{} is not a path like \"/v1/files\" (a leading `/`, no trailing `/`, no query)",
                    one_line(path)
                );
                self.problem(&pkey, why);
            }
        }
        let translate = self.translate(&key, api, &s.translate);
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
            api,
            models,
            unmetered_paths: s.unmetered_paths,
            translate,
        })
    }

    /// `translate`: each pair must be one the service's `api` can serve.
    fn translate(
        &mut self,
        key: &str,
        api: Option<Api>,
        pairs: &BTreeMap<String, String>,
    ) -> Vec<Pair> {
        let key = format!("{key}.translate");
        if pairs.is_empty() {
            return Vec::new();
        }
        let Some(api) = api else {
            self.problem(
                &key,
                "needs `api`: only the endpoints of a service's API are translated",
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (from, to) in pairs {
            match Pair::configured(api, from, to) {
                Ok(pair) => out.push(pair),
                Err(why) => self.problem(&key, why),
            }
        }
        // One pair sending calls to the endpoint another says the upstream lacks.
        let clash = (out.iter())
            .flat_map(|a| out.iter().map(move |b| (a, b)))
            .find(|(a, b)| a.target() == b.client());
        if let Some((a, b)) = clash {
            let why = format!(
                "`{}` sends calls to the endpoint that `{}` says the upstream does not serve: \
                 keep the one that matches the upstream",
                a.name(),
                b.name()
            );
            self.problem(&key, why);
        }
        out
    }

    /// `api` and `[services.<name>.models]`: a policy only means something on a service whose
    /// bodies the gateway reads, so `models` without `api` is refused, not ignored.
    fn model_policy(
        &mut self,
        key: &str,
        api: Option<&str>,
        models: Option<file::Models>,
    ) -> Option<(Api, Models)> {
        let api = match api {
            None => {
                if models.is_some() {
                    let needs = Api::listed("`api = \"{}\"`", " or ");
                    self.problem(&format!("{key}.models"), format!("needs {needs}"));
                }
                return None;
            }
            Some(name) => match Api::named(name) {
                Some(api) => api,
                None => {
                    self.problem(
                        &format!("{key}.api"),
                        format!(
                            "`{}` is not a known API: the ones supported are {}",
                            one_line(name),
                            Api::listed("`{}`", " and ")
                        ),
                    );
                    return None;
                }
            },
        };
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
        Some((api, Models::new(models.default, models.aliases)))
    }
}
