//! A service's replicas: the `upstream` list, how requests are spread over it, how replicas
//! are checked and taken out, and where their host names are resolved (`[dns]`).

use std::net::SocketAddr;
use std::time::Duration;

use super::parse::parse_upstream;
use super::validate::Validator;
use super::{file, Upstream};

/// Most replicas one service may list: a request marks the replicas it tried in a `u64`.
pub(crate) const MAX_REPLICAS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Balance {
    /// The replica with the fewest requests in flight from this gateway: LLM requests differ
    /// in length by orders of magnitude, so counting turns is not spreading load.
    LeastRequests,
    RoundRobin,
    /// Bounded-load consistent hashing on the conversation's start or `X-Session-Id`, so a
    /// replica's prefix cache is reused; the factor bounds a replica's share of the load.
    PrefixAffinity {
        load_factor: f64,
    },
}

/// `affinity_load_factor` unless set.
pub(crate) const DEFAULT_AFFINITY_LOAD_FACTOR: f64 = 1.25;

#[derive(Debug, Clone)]
pub struct HealthCheckSettings {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Balancing {
    pub balance: Balance,
    pub health_check: Option<HealthCheckSettings>,
    /// How often host names are resolved again, off the request path.
    pub dns_refresh: Duration,
    /// Consecutive connect failures that take a replica out of rotation.
    pub eject_after: u32,
    /// How long a replica taken out by connect failures stays out, unless a health check
    /// passes first.
    pub eject_for: Duration,
}

impl Validator<'_> {
    /// `[dns] servers`: `None` for the system's configuration.
    pub(super) fn dns(&mut self, d: Option<file::Dns>) -> Option<Vec<SocketAddr>> {
        let d = d?;
        let mut servers = Vec::new();
        for s in &d.servers {
            match s.parse::<SocketAddr>() {
                Ok(a) => servers.push(a),
                Err(_) => self.problem("dns.servers", format!("`{s}` is not an ip:port address")),
            }
        }
        if d.servers.is_empty() {
            self.problem(
                "dns.servers",
                "needs at least one server (omit [dns] for the system's)",
            );
        }
        Some(servers)
    }

    /// Every replica of `key`, each problem listed; `None` if any is wrong. With `[dns]`
    /// servers, host names are left for the gateway's own resolver at start-up.
    pub(super) fn replicas(
        &mut self,
        key: &str,
        raw: Option<&file::Replicas>,
        own_dns: bool,
    ) -> Option<Vec<Upstream>> {
        let ukey = format!("{key}.upstream");
        let urls: Vec<&String> = match raw {
            None => {
                self.problem(&ukey, "is required");
                return None;
            }
            Some(file::Replicas::One(u)) => vec![u],
            Some(file::Replicas::Many(list)) => list.iter().collect(),
        };
        if urls.is_empty() {
            self.problem(&ukey, "needs at least one replica");
            return None;
        }
        if urls.len() > MAX_REPLICAS {
            self.problem(&ukey, format!("lists more than {MAX_REPLICAS} replicas"));
            return None;
        }
        let system = self.resolve;
        let mut replicas = Vec::new();
        let mut ok = true;
        for (i, raw) in urls.iter().enumerate() {
            let rkey = if urls.len() == 1 {
                ukey.clone()
            } else {
                format!("{ukey}[{i}]")
            };
            let Some(url) = self.expand(&rkey, raw) else {
                ok = false;
                continue;
            };
            let resolve = |host: &str, port: u16| match host.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(vec![SocketAddr::new(ip, port)]),
                Err(_) if own_dns => Ok(Vec::new()),
                Err(_) => system(host, port),
            };
            match parse_upstream(&url, &resolve) {
                Ok(u) => replicas.push(u),
                Err(e) => {
                    self.problem(&rkey, e);
                    ok = false;
                }
            }
        }
        if let Some(first) = replicas.first() {
            for (i, r) in replicas.iter().enumerate().skip(1) {
                if r.tls != first.tls || r.base_path != first.base_path {
                    self.problem(
                        &format!("{ukey}[{i}]"),
                        "every replica must have the first one's scheme and base path",
                    );
                    ok = false;
                }
                if replicas[..i]
                    .iter()
                    .any(|o| o.host == r.host && o.port == r.port)
                {
                    self.problem(&format!("{ukey}[{i}]"), "repeats an earlier replica");
                    ok = false;
                }
            }
        }
        ok.then_some(replicas)
    }

    pub(super) fn balancing(&mut self, key: &str, s: &file::Service) -> Balancing {
        let balance = match s.balance.as_deref() {
            None | Some("least_requests") => Balance::LeastRequests,
            Some("round_robin") => Balance::RoundRobin,
            Some("prefix_affinity") => Balance::PrefixAffinity {
                load_factor: DEFAULT_AFFINITY_LOAD_FACTOR,
            },
            Some(other) => {
                self.problem(
                    &format!("{key}.balance"),
                    format!("`{other}` is not least_requests, round_robin or prefix_affinity"),
                );
                Balance::LeastRequests
            }
        };
        let balance = match (balance, s.affinity_load_factor) {
            (_, None) => balance,
            (Balance::PrefixAffinity { .. }, Some(f)) if f > 1.0 && f <= 1000.0 => {
                Balance::PrefixAffinity { load_factor: f }
            }
            (Balance::PrefixAffinity { .. }, Some(_)) => {
                self.problem(
                    &format!("{key}.affinity_load_factor"),
                    "must be greater than 1.0 (and at most 1000)",
                );
                balance
            }
            (_, Some(_)) => {
                self.problem(
                    &format!("{key}.affinity_load_factor"),
                    "only applies with balance = \"prefix_affinity\"",
                );
                balance
            }
        };
        let health_check = s.health_check.as_ref().map(|h| {
            let hkey = format!("{key}.health_check");
            if !h.path.starts_with('/') || h.path.bytes().any(|b| b.is_ascii_control() || b == b' ')
            {
                self.problem(
                    &format!("{hkey}.path"),
                    "must be an absolute path such as /health",
                );
            }
            let interval = h.interval_seconds.unwrap_or(5);
            // The default follows a shorter interval, so that `interval_seconds = 1` alone is
            // a valid check rather than a problem with a key the operator never wrote.
            let timeout = h.timeout_seconds.unwrap_or(2.min(interval.max(1)));
            if interval == 0 {
                self.problem(&format!("{hkey}.interval_seconds"), "must be at least 1");
            }
            if timeout == 0 || timeout > interval.max(1) {
                self.problem(
                    &format!("{hkey}.timeout_seconds"),
                    "must be at least 1 and at most interval_seconds",
                );
            }
            HealthCheckSettings {
                path: h.path.clone(),
                interval: Duration::from_secs(interval.max(1)),
                timeout: Duration::from_secs(timeout.max(1)),
            }
        });
        let dns_refresh = s.dns_refresh_seconds.unwrap_or(30);
        if dns_refresh == 0 {
            self.problem(&format!("{key}.dns_refresh_seconds"), "must be at least 1");
        }
        let eject_after = s.eject_after_connect_failures.unwrap_or(3);
        if eject_after == 0 {
            self.problem(
                &format!("{key}.eject_after_connect_failures"),
                "must be at least 1",
            );
        }
        let eject_for = s.eject_seconds.unwrap_or(10);
        if eject_for == 0 {
            self.problem(&format!("{key}.eject_seconds"), "must be at least 1");
        }
        Balancing {
            balance,
            health_check,
            dns_refresh: Duration::from_secs(dns_refresh.max(1)),
            eject_after: eject_after.max(1),
            eject_for: Duration::from_secs(eject_for.max(1)),
        }
    }
}
