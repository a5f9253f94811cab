//! Step 2, authenticate: the bearer token (an API key or a JWT), before anything reveals
//! which services exist. Every failure is the same 401.

use std::sync::Arc;

use pingora::http::RequestHeader;

use super::RequestCtx;
use crate::auth::{Authenticator, Principal};
use crate::errors::GatewayError;

pub(super) async fn caller(
    auth: &Authenticator,
    req: &RequestHeader,
    ctx: &mut RequestCtx,
) -> Result<Arc<Principal>, GatewayError> {
    match auth.authenticate(&req.headers).await {
        Ok(principal) => {
            ctx.principal = Some(principal.clone());
            Ok(principal)
        }
        Err(failure) => {
            // Debug only: stderr logging is synchronous, and a flood of bad tokens must not
            // turn into blocking writes. The access log and the metric carry the reason.
            log::debug!(
                "request {} unauthorized: {}",
                ctx.request_id.as_str(),
                failure.as_str()
            );
            ctx.auth_failure = Some(failure);
            Err(GatewayError::Unauthorized)
        }
    }
}
