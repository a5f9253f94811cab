//! Which client connections every listener (data plane, key API, metrics) lets in, and for how
//! long a request head may take: at most `[server] max_connections` open in the process and
//! `max_connections_per_client` from one client address, counted over all the listeners; a
//! connection over either is closed as soon as it is accepted (before any TLS handshake) and
//! counted in `portcullis_connections_refused_total{listener, reason}`; a request head that
//! does not arrive whole within `header_timeout_seconds` closes its connection (reason
//! `header_timeout`).
//!
//! Built on Pingora's extension points, without an engine patch: its connection filter
//! (`gate`), an app wrapper that ties each connection's place to its stream (`app`), and the
//! stream itself (`conn`). Each process counts its own connections: after a graceful upgrade
//! the new process starts from zero while the old one's count falls as its connections end.

mod app;
mod conn;
mod count;
mod gate;

use std::sync::Arc;

use prometheus::{IntCounterVec, IntGauge};

use crate::config::ConnectionLimits;
pub(crate) use app::Admitted;
use count::Counts;
pub(crate) use gate::Gate;

/// The counts shared by every listener of the process.
pub(crate) struct Admission {
    counts: Arc<Counts>,
    limits: ConnectionLimits,
    refused: IntCounterVec,
}

impl Admission {
    /// `refused`: `portcullis_connections_refused_total`; `open`: `portcullis_connections_open`.
    pub(crate) fn new(
        limits: &ConnectionLimits,
        refused: IntCounterVec,
        open: IntGauge,
    ) -> Admission {
        let (max, per_client) = (limits.max_connections, limits.max_connections_per_client);
        Admission {
            counts: Counts::new(max, per_client, open),
            limits: limits.clone(),
            refused,
        }
    }

    /// `app` behind the gate of the listeners labelled `listener`. Both go to the Pingora
    /// service: the app as its app, the gate as its connection filter
    /// (`Service::set_connection_filter`), which refuses before any TLS handshake.
    pub(crate) fn admit<A>(&self, listener: &str, app: A) -> (Admitted<A>, Arc<Gate>) {
        let gate = Arc::new(Gate::new(
            self.counts.clone(),
            self.limits.header_timeout,
            &self.refused,
            listener,
        ));
        (Admitted::new(app, gate.clone()), gate)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::config::Config;

    const SERVICE: &str =
        "[services.infer]\nupstream = \"http://127.0.0.1:8000\"\nscope = \"infer\"\n";

    fn parse(server: &str) -> Result<Config, String> {
        let text = format!("[server]\n{server}\n{SERVICE}");
        Config::parse(Path::new("c.toml"), &text, |_| None).map_err(|e| e.to_string())
    }

    #[test]
    fn the_limits_have_defaults_and_are_checked_at_start_up() {
        let c = parse("").unwrap().server.connections;
        assert_eq!(c.header_timeout, Duration::from_secs(10));
        assert_eq!(
            (c.max_connections, c.max_connections_per_client),
            (10_000, 256)
        );
        // A total under the per-client default lowers that default with it.
        let c = parse("max_connections = 100").unwrap().server.connections;
        assert_eq!(c.max_connections_per_client, 100);
        for (server, problem) in [
            ("header_timeout_seconds = 0", "c.toml: server.header_timeout_seconds: must be from 1 to 3600"),
            ("header_timeout_seconds = 3601", "c.toml: server.header_timeout_seconds: must be from 1 to 3600"),
            ("max_connections = 0", "c.toml: server.max_connections: must be at least 1"),
            ("max_connections_per_client = 0", "c.toml: server.max_connections_per_client: must be at least 1"),
            (
                "max_connections = 10\nmax_connections_per_client = 11",
                "c.toml: server.max_connections_per_client: 11 is more than server.max_connections (10)",
            ),
        ] {
            assert_eq!(parse(server).unwrap_err(), problem, "{server}");
        }
    }
}
