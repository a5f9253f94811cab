//! Step 8, rewrite: the upstream's base path, then the remainder and the query byte for
//! byte; the headers the upstream gets (the client's token never among them).

use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};

use super::route::Route;
use super::{headers, RequestCtx};
use crate::api;

pub(super) fn path(
    route: Option<&Route>,
    session: &Session,
    upstream: &mut RequestHeader,
    ctx: &RequestCtx,
) -> Result<()> {
    let Some(route) = route else {
        return Error::e_explain(ErrorType::InternalError, "no route chosen");
    };
    let forward = &session.req_header().raw_path()[ctx.forward_from..];
    let translated = ctx.exchange().and_then(|x| x.translation());
    let converted = translated.map(|pair| api::translated_path(pair, forward));
    let forward = converted.as_deref().unwrap_or(forward);
    let base_path = route.settings.replicas[0].base_path.as_bytes();
    if base_path.is_empty() {
        upstream.set_raw_path(forward)
    } else {
        upstream.set_raw_path(&[base_path, forward].concat())
    }
}

pub(super) fn headers(
    route: Option<&Route>,
    session: &Session,
    upstream: &mut RequestHeader,
    ctx: &RequestCtx,
) -> Result<()> {
    let (Some(route), Some(replica)) = (route, &ctx.replica) else {
        return Error::e_explain(ErrorType::InternalError, "no replica chosen");
    };
    let client_ip = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    let client_tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
    headers::to_upstream(
        upstream,
        &route.settings,
        route.replicas.host_header(replica.index),
        client_ip,
        client_tls,
        ctx.request_id.as_str(),
    )
}
