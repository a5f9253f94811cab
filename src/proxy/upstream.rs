//! Step 7, upstream: the replica of each attempt (by affinity key on a `prefix_affinity`
//! service), and whether a failed attempt may be tried again, and where. Also the upstream
//! peer of each replica address, built when the address is learnt (start-up, DNS refresh)
//! and cloned per request.

use std::sync::Arc;

use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::{parse_x509, WrappedX509};
use pingora::{Error, ErrorType, Result};

use super::route::Route;
use super::{headers, RequestCtx};
use crate::api::Exchange;
use crate::config::{ServiceConfig, Upstream};
use crate::replicas::{Chosen, Replicas};

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

/// The peer of the request's next attempt, noted in `ctx`.
pub(super) fn choose(
    route: Option<&Route>,
    req: &RequestHeader,
    ctx: &mut RequestCtx,
) -> Result<Box<HttpPeer>> {
    let replicas = &route
        .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route chosen"))?
        .replicas;
    let Some((chosen, peer)) = next_replica(replicas, req, ctx) else {
        return Error::e_explain(ErrorType::ConnectNoRoute, "every replica was tried");
    };
    ctx.tried |= 1 << chosen.index;
    // Replacing the previous choice ends its in-flight count.
    ctx.replica = Some(chosen);
    Ok(Box::new(peer))
}

/// The replica of the request's next attempt: the same one again once the request may have
/// reached it (never replayed elsewhere), else a choice, by affinity key on a
/// `prefix_affinity` service.
fn next_replica(
    replicas: &Arc<Replicas>,
    req: &RequestHeader,
    ctx: &RequestCtx,
) -> Option<(Chosen, HttpPeer)> {
    match (ctx.reached_replica, &ctx.replica) {
        (true, Some(same)) => {
            let affinity = same.affinity;
            replicas.again(same.index).map(|(mut c, peer)| {
                c.affinity = affinity;
                (c, peer)
            })
        }
        _ if replicas.keyed() => {
            let key = affinity_key(req, ctx.exchange());
            replicas.choose_for(ctx.tried, key)
        }
        _ => replicas.choose(ctx.tried),
    }
}

/// A request's affinity key: its `X-Session-Id`, else the start of a body already read.
fn affinity_key(req: &RequestHeader, exchange: Option<&Exchange>) -> Option<u64> {
    match req.headers.get(&headers::X_SESSION_ID) {
        Some(id) if !id.is_empty() => Some(crate::api::affinity_session_key(id.as_bytes())),
        _ => exchange.and_then(|x| x.affinity_key),
    }
}

/// A connect refusal or timeout: nothing of the request reached the replica, so the next
/// untried replica may take it (each at most once; `choose` chooses). Not once a replica may
/// have seen it (see `failed_once_connected`).
pub(super) fn connect_failed(
    route: Option<&Route>,
    ctx: &RequestCtx,
    mut e: Box<Error>,
) -> Box<Error> {
    if let (Some(route), Some(chosen)) = (route, &ctx.replica) {
        let replicas = &route.replicas;
        replicas.connect_failed(chosen.index);
        if !ctx.reached_replica && (ctx.tried.count_ones() as usize) < replicas.len() {
            e.set_retry(true);
        }
    }
    e
}

/// An error once connected: never replayed on another replica. Once the request head is
/// written, the replica may have started a generation, and a replay elsewhere would run (and
/// bill) it twice; the caller gets the 502 instead. Pingora's own rule stays: it retries an
/// idempotent request whose pooled connection failed at once (most often the replica had
/// closed it while idle), but only on the same replica: a replica that died with the request
/// in hand may have read it, so if it cannot be reached the answer is 502.
pub(super) fn failed_once_connected(
    peer: &HttpPeer,
    session: &mut Session,
    e: Box<Error>,
    ctx: &mut RequestCtx,
    client_reused: bool,
) -> Box<Error> {
    let mut e = e.more_context(format!("Peer: {peer}"));
    if !session.req_header().method.is_idempotent() || session.as_ref().retry_buffer_truncated() {
        e.set_retry(false);
    } else {
        e.retry.decide_reuse(client_reused);
    }
    ctx.reached_replica = true;
    e
}

/// Connected: the replica's connect failures are forgiven.
pub(super) fn connected(route: Option<&Route>, ctx: &RequestCtx) {
    if let (Some(route), Some(chosen)) = (route, &ctx.replica) {
        route.replicas.connected(chosen.index);
    }
}

/// The replica is done with this request: before the client has the last byte, so its next
/// request already sees the replica free.
pub(super) fn release_at_end(end_of_stream: bool, ctx: &mut RequestCtx) {
    if end_of_stream {
        if let Some(chosen) = &mut ctx.replica {
            chosen.release();
        }
    }
}
