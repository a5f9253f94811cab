//! Step 1, validate: the request head before anything else, from the method and the raw
//! target alone (`path`), and the size of the body as declared and as it arrives.

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};

use super::path::{self, Target};
use super::{headers, RequestCtx, Stop};
use crate::errors::{GatewayError, Malformed};

/// The service the path names (`None` when it has no `/v1/<service>/` shape) and the part
/// forwarded to it; `/healthz` and refusals stop here.
pub(super) fn head<'r>(
    req: &'r RequestHeader,
    ctx: &mut RequestCtx,
) -> Result<(Option<&'r [u8]>, &'r [u8]), Stop> {
    ctx.health = path::is_health_target(req.raw_path());
    // Method, then path shape.
    let target = path::classify(&req.method, req.raw_path())?;
    if !headers::within_limits(req) {
        return Err(GatewayError::BadRequest(Malformed::HeadersTooLarge).into());
    }
    match target {
        Target::Health => Err(Stop::Health),
        Target::NotFound => Err(GatewayError::NotFound.into()),
        Target::Protected { service, forward } => {
            ctx.forward_from = req.raw_path().len() - forward.len();
            Ok((service, forward))
        }
    }
}

/// A declared body over the limit, refused before a byte of it is read. Run once the caller
/// is authorised (`authorise`), so that a stranger learns nothing of the limits.
pub(super) fn declared_size(req: &RequestHeader, max_body: u64) -> Result<(), GatewayError> {
    let Some(declared) = req.headers.get(http::header::CONTENT_LENGTH) else {
        return Ok(());
    };
    match declared.to_str().ok().and_then(|v| v.parse::<u64>().ok()) {
        Some(len) if len > max_body => Err(GatewayError::PayloadTooLarge),
        Some(_) => Ok(()),
        None => Err(GatewayError::BadRequest(Malformed::ContentLength)),
    }
}

/// The body as it arrives: chunked bodies declare no length, so what arrives is counted.
pub(super) fn body_size(
    session: &mut Session,
    chunk: Option<&Bytes>,
    max_body: u64,
    ctx: &mut RequestCtx,
) -> Result<()> {
    ctx.body_bytes += chunk.map_or(0, |b| b.len() as u64);
    if ctx.body_bytes > max_body {
        session.set_keepalive(None);
        return Error::e_explain(ErrorType::HTTPStatus(413), "request body over the limit");
    }
    Ok(())
}
