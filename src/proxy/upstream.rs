//! The upstream peer of each service, built once at start-up and cloned per request.

use pingora::upstreams::peer::HttpPeer;

use crate::config::ServiceConfig;

pub fn peer_for(service: &ServiceConfig) -> HttpPeer {
    let up = &service.upstream;
    // SNI is the host name: with rustls an empty SNI would turn certificate checks off.
    let sni = if up.tls {
        up.host.clone()
    } else {
        String::new()
    };
    let mut peer = HttpPeer::new(up.address, up.tls, sni);
    let o = &mut peer.options;
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
    }
    peer
}
