//! The upstream peer of each replica address, built when the address is learnt (start-up, DNS
//! refresh) and cloned per request.

use std::sync::Arc;

use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::{parse_x509, WrappedX509};

use crate::config::{ServiceConfig, Upstream};

pub fn peer_for(service: &ServiceConfig, up: &Upstream, address: std::net::SocketAddr) -> HttpPeer {
    // SNI is the host name: with rustls an empty SNI would turn certificate checks off.
    let sni = if up.tls {
        up.host.clone()
    } else {
        String::new()
    };
    let mut peer = HttpPeer::new(address, up.tls, sni);
    let o = &mut peer.options;
    let mut group_key = 0;
    o.connection_timeout = Some(service.connect_timeout);
    o.total_connection_timeout = Some(service.connect_timeout);
    // Per read, so it bounds the longest silence, the wait for the first byte included.
    o.read_timeout = Some(service.read_timeout);
    o.write_timeout = Some(service.read_timeout);
    // Below common upstream keep-alive timeouts, so a POST never lands on a stale connection.
    o.idle_timeout = Some(service.idle_timeout);
    if up.tls {
        o.verify_cert = true;
        o.verify_hostname = true;
        if let Some(certs) = &service.ca_certs {
            // Parsed at start-up already, so `parse_x509` cannot fail here.
            let roots: Vec<WrappedX509> = certs
                .iter()
                .map(|der| WrappedX509::new(der.clone(), parse_x509))
                .collect();
            o.ca = Some(Arc::from(roots));
            // Pingora's pool key covers address, SNI and verify flags but not the CA set:
            // without this, a connection verified under one service's CA would be reused by
            // a service that trusts only the platform roots.
            group_key = trust_key(certs);
        }
    }
    peer.group_key = group_key;
    peer
}

/// A pool identity for a set of trusted roots; 0 stands for the platform roots.
fn trust_key(certs: &[Vec<u8>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    certs.hash(&mut h);
    h.finish() | 1
}
