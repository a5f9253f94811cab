//! Live DNS for upstream host names: resolved again every `dns_refresh_seconds` by a background
//! task (asynchronously: never a blocking `getaddrinfo` on a worker), through `[dns] servers`
//! or the system's resolv.conf and hosts file. A changed address set replaces the replica's
//! peers at once; a failed resolution keeps the last good set, logged once until it recovers.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::TokioResolver;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::upstreams::peer::{HttpPeer, Peer};

use super::Replicas;
use crate::config::Upstream;

#[derive(Clone)]
pub(crate) struct UpstreamResolver(Arc<TokioResolver>);

impl UpstreamResolver {
    /// `servers`: `[dns] servers`, each asked over UDP and TCP; `None`: the system's.
    pub(crate) fn new(servers: Option<&[SocketAddr]>) -> Result<UpstreamResolver, String> {
        let mut builder = match servers {
            Some(servers) => {
                let group: Vec<NameServerConfig> = servers
                    .iter()
                    .flat_map(|a| {
                        [Protocol::Udp, Protocol::Tcp].map(|p| NameServerConfig::new(*a, p))
                    })
                    .collect();
                TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, vec![], group),
                    TokioConnectionProvider::default(),
                )
            }
            None => TokioResolver::builder_tokio()
                .map_err(|e| format!("cannot read the system's DNS configuration: {e}"))?,
        };
        let options = builder.options_mut();
        // Each refresh asks anew: the refresh interval, not record TTLs, sets the pace.
        options.positive_max_ttl = Some(Duration::from_secs(1));
        options.negative_max_ttl = Some(Duration::from_secs(1));
        options.timeout = Duration::from_secs(2);
        options.attempts = 2;
        Ok(UpstreamResolver(Arc::new(builder.build())))
    }

    /// Every address of `host`, sorted, with `port`.
    pub(crate) async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let found = self
            .0
            .lookup_ip(host)
            .await
            .map_err(|e| format!("cannot resolve `{host}`: {e}"))?;
        let mut addresses: Vec<SocketAddr> =
            found.iter().map(|ip| SocketAddr::new(ip, port)).collect();
        addresses.sort();
        addresses.dedup();
        if addresses.is_empty() {
            return Err(format!("`{host}` resolves to no address"));
        }
        Ok(addresses)
    }
}

/// Builds the peer of one address with the service's connection settings.
pub(crate) type MakePeer = Arc<dyn Fn(&Upstream, SocketAddr) -> HttpPeer + Send + Sync>;

/// A replica whose host is a name, and how to build a peer for a new address of it.
#[derive(Clone)]
struct Watched {
    replicas: Arc<Replicas>,
    index: usize,
    upstream: Upstream,
    every: Duration,
    make_peer: MakePeer,
}

/// The background service. Its resolver is made when it starts, on the runtime that uses it
/// (after a daemon's fork).
pub(crate) struct DnsRefresh {
    servers: Option<Vec<SocketAddr>>,
    watched: Vec<Watched>,
}

impl DnsRefresh {
    pub(crate) fn new(servers: Option<Vec<SocketAddr>>) -> DnsRefresh {
        DnsRefresh {
            servers,
            watched: Vec::new(),
        }
    }

    /// Watches every replica of `replicas` named by host name (IP literals never change).
    pub(crate) fn add(
        &mut self,
        replicas: &Arc<Replicas>,
        upstreams: &[Upstream],
        every: Duration,
        make_peer: &MakePeer,
    ) {
        for (index, up) in upstreams.iter().enumerate() {
            if up.host.parse::<IpAddr>().is_err() {
                self.watched.push(Watched {
                    replicas: replicas.clone(),
                    index,
                    upstream: up.clone(),
                    every,
                    make_peer: make_peer.clone(),
                });
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }
}

impl Watched {
    async fn run(self, resolver: UpstreamResolver) {
        let replica = &self.replicas.members()[self.index];
        let mut failing = false;
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the start-up resolution is fresh
        loop {
            tick.tick().await;
            match resolver
                .resolve(&self.upstream.host, self.upstream.port)
                .await
            {
                Ok(addresses) => {
                    if failing {
                        failing = false;
                        log::warn!(
                            "service {} replica {}: resolves again",
                            self.replicas.service,
                            replica.label
                        );
                    }
                    let current: Vec<SocketAddr> = replica
                        .peers
                        .load()
                        .iter()
                        .filter_map(|p| p.address().as_inet().copied())
                        .collect();
                    if current != addresses {
                        log::info!(
                            "service {} replica {}: addresses {:?} → {:?}",
                            self.replicas.service,
                            replica.label,
                            current,
                            addresses
                        );
                        let peers = addresses
                            .iter()
                            .map(|a| (self.make_peer)(&self.upstream, *a))
                            .collect();
                        replica.peers.store(Arc::new(peers));
                    }
                }
                Err(e) if !failing => {
                    failing = true;
                    log::warn!(
                        "service {} replica {}: {e}; keeping its last addresses",
                        self.replicas.service,
                        replica.label
                    );
                }
                Err(_) => {}
            }
        }
    }
}

#[async_trait]
impl BackgroundService for DnsRefresh {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let resolver = match UpstreamResolver::new(self.servers.as_deref()) {
            Ok(r) => r,
            Err(e) => {
                log::error!("upstream DNS refresh is off: {e}");
                return;
            }
        };
        let tasks: Vec<_> = self
            .watched
            .iter()
            .map(|w| tokio::spawn(w.clone().run(resolver.clone())))
            .collect();
        let _ = shutdown.changed().await;
        for t in tasks {
            t.abort();
        }
    }
}
