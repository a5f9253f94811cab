//! The values the config holds that have a syntax of their own: URLs (http upstreams, Redis),
//! PEM files, and host names resolved at start-up.

use std::net::{SocketAddr, ToSocketAddrs};

use http::header::HeaderValue;

use super::{RedisServer, Upstream};

/// Resolves an upstream's host once, at start-up; a parameter so that checks which must not
/// touch the network (fuzzing) can pass their own.
pub(crate) type Resolver<'a> = &'a dyn Fn(&str, u16) -> Result<Vec<SocketAddr>, String>;

/// The system resolver (blocking, at start-up only).
pub(crate) fn resolve_system(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let addresses: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve `{host}`: {e}"))?
        .collect();
    if addresses.is_empty() {
        return Err(format!("`{host}` resolves to no address"));
    }
    Ok(addresses)
}

/// Every certificate of a PEM bundle (a CA bundle or a certificate chain), each checked to
/// parse, so a bad file fails at start-up.
pub(crate) fn load_pem_certs(path: &str) -> Result<Vec<Vec<u8>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
    let mut certs = Vec::new();
    for item in rustls_pemfile::certs(&mut pem.as_slice()) {
        let der = item.map_err(|e| format!("`{path}` is not valid PEM: {e}"))?;
        x509_parser::parse_x509_certificate(&der)
            .map_err(|e| format!("`{path}` holds an invalid certificate: {e}"))?;
        certs.push(der.to_vec());
    }
    if certs.is_empty() {
        return Err(format!("`{path}` holds no certificate"));
    }
    Ok(certs)
}

pub(crate) fn http_url(s: &str) -> Option<http::Uri> {
    let uri: http::Uri = s.parse().ok()?;
    matches!(uri.scheme_str(), Some("http" | "https")).then_some(())?;
    uri.host()?;
    Some(uri)
}

/// `redis://[user[:password]@]host[:port][/db]`. Not resolved or connected here: a Redis that is
/// down or unresolvable at start-up must not stop the gateway. Problems never quote the URL.
pub(crate) fn parse_redis(url: &str) -> Result<RedisServer, String> {
    const SHAPE: &str = "expected redis://[user:password@]host[:port][/db]";
    let parsed =
        redis::parse_redis_url(url).ok_or_else(|| format!("is not a valid URL: {SHAPE}"))?;
    if parsed.scheme() != "redis" {
        return Err(format!(
            "`{}://` is not supported (no TLS or unix socket in this build): {SHAPE}",
            parsed.scheme()
        ));
    }
    let host = parsed.host_str().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("has no host: {SHAPE}"));
    }
    if matches!(host, "0.0.0.0" | "[::]") {
        return Err(format!("`{host}` is a wildcard address, not a server"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!("must not have a query string or fragment: {SHAPE}"));
    }
    let db = match parsed.path().trim_start_matches('/') {
        "" => 0,
        path => path
            .parse::<u32>()
            .map_err(|_| format!("the path must be a database number such as /0: {SHAPE}"))?,
    };
    // TCP_NODELAY: requests share one connection, and Nagle's algorithm would hold a command
    // back until the previous one is acknowledged (40 ms with delayed ACKs).
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .map_err(|e| format!("is not usable: {e}"))?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    let client = redis::Client::open(info).map_err(|e| format!("is not usable: {e}"))?;
    let port = parsed.port().unwrap_or(6379);
    Ok(RedisServer {
        client,
        shown: format!("redis://{host}:{port}/{db}"),
    })
}

/// `scheme://host[:port][/base-path]`, resolved to a socket address now.
pub(crate) fn parse_upstream(url: &str, resolve: Resolver<'_>) -> Result<Upstream, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| format!("`{url}` is not a valid URL"))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(format!("`{url}` must start with http:// or https://")),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("`{url}` has no host"))?;
    if authority.as_str().contains('@') {
        return Err("must not carry credentials: use upstream_headers".to_string());
    }
    if uri.query().is_some() {
        return Err(format!("`{url}` must not have a query string"));
    }
    let bracketed = authority.host();
    let host = bracketed
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if host.is_empty() {
        return Err(format!("`{url}` has no host"));
    }
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let base_path = uri.path().trim_end_matches('/').to_string();
    let addresses = resolve(&host, port)?;
    let host_header = HeaderValue::from_str(&format!("{bracketed}:{port}"))
        .map_err(|_| format!("`{url}` has an invalid host"))?;
    Ok(Upstream {
        tls,
        host,
        port,
        base_path,
        addresses,
        host_header,
    })
}
