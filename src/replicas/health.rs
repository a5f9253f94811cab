//! Active health checks (`health_check = { path, interval_seconds, timeout_seconds }`): a
//! background task per service sends `GET path` to every address of every replica, never on
//! the request path. A 2xx within the timeout passes. The same task keeps
//! `portcullis_upstream_healthy` current as passive ejections run out.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::lb::health_check::{HealthCheck, HttpHealthCheck};
use pingora::lb::Backend;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::upstreams::peer::{HttpPeer, Peer};
use pingora::{Error, ErrorType};

use super::Replicas;
use crate::config::{HealthCheckSettings, Upstream};

struct Checked {
    replicas: Arc<Replicas>,
    interval: Duration,
    timeout: Duration,
    /// One per replica, parallel to `replicas.members()`.
    checks: Vec<HttpHealthCheck>,
}

#[derive(Default)]
pub(crate) struct HealthChecks {
    checked: Vec<Arc<Checked>>,
    all: Vec<Arc<Replicas>>,
}

impl HealthChecks {
    /// `make_peer` gives the service's connection settings (TLS, trusted roots) to the checks.
    pub(crate) fn add(
        &mut self,
        replicas: Arc<Replicas>,
        settings: Option<&HealthCheckSettings>,
        upstreams: &[Upstream],
        make_peer: &dyn Fn(&Upstream, std::net::SocketAddr) -> HttpPeer,
    ) {
        self.all.push(replicas.clone());
        let Some(settings) = settings else { return };
        let checks = upstreams
            .iter()
            .map(|up| check_for(up, settings, make_peer))
            .collect();
        self.checked.push(Arc::new(Checked {
            replicas,
            interval: settings.interval,
            timeout: settings.timeout,
            checks,
        }));
    }
}

fn check_for(
    up: &Upstream,
    settings: &HealthCheckSettings,
    make_peer: &dyn Fn(&Upstream, std::net::SocketAddr) -> HttpPeer,
) -> HttpHealthCheck {
    let host = up.host_header.to_str().unwrap_or_default();
    let mut check = HttpHealthCheck::new(host, up.tls);
    let mut template = make_peer(up, ([0, 0, 0, 0], 1).into());
    template.options.connection_timeout = Some(settings.timeout);
    template.options.total_connection_timeout = Some(settings.timeout);
    template.options.read_timeout = Some(settings.timeout);
    template.options.write_timeout = Some(settings.timeout);
    check.peer_template = template;
    let path = format!("{}{}", up.base_path, settings.path);
    let mut req = RequestHeader::build("GET", path.as_bytes(), None).expect("checked path");
    let _ = req.append_header("host", host);
    let _ = req.append_header("user-agent", "portcullis-health-check");
    check.req = req;
    check.validator = Some(Box::new(|resp: &ResponseHeader| {
        if resp.status.is_success() {
            Ok(())
        } else {
            Error::e_explain(
                ErrorType::CustomCode("status", resp.status.as_u16()),
                "not 2xx",
            )
        }
    }));
    check
}

impl Checked {
    async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // Every replica at once: one slow replica must not delay the others' verdicts.
            let rounds: Vec<_> = (0..self.checks.len())
                .map(|i| {
                    let this = self.clone();
                    tokio::spawn(async move { this.check_one(i).await })
                })
                .collect();
            for round in rounds {
                let _ = round.await;
            }
        }
    }

    /// Healthy if any current address of replica `i` passes.
    async fn check_one(&self, i: usize) {
        let peers = self.replicas.members()[i].peers.load_full();
        let mut why = String::from("no address");
        for peer in peers.iter() {
            let Ok(backend) = Backend::new(&peer.address().to_string()) else {
                continue;
            };
            let outcome = tokio::time::timeout(
                self.timeout + Duration::from_millis(100),
                self.checks[i].check(&backend),
            )
            .await;
            match outcome {
                Ok(Ok(())) => {
                    self.replicas.checked(i, true, "");
                    return;
                }
                Ok(Err(e)) => why = e.to_string(),
                Err(_) => why = format!("no answer within {} s", self.timeout.as_secs()),
            }
        }
        self.replicas.checked(i, false, &why);
    }
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let tasks: Vec<_> = self
            .checked
            .iter()
            .map(|c| tokio::spawn(c.clone().run()))
            .collect();
        let mut gauges = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = gauges.tick() => self.all.iter().for_each(|r| r.refresh_gauges()),
                _ = shutdown.changed() => break,
            }
        }
        for t in tasks {
            t.abort();
        }
    }
}
