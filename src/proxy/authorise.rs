//! Step 4, authorise: the caller may call the service (its scope, its rate limit, the size
//! its body declares), and on an `api` service a caller with a token or cost budget calls only
//! what the gateway meters (`api::unmetered_allowed`).

use pingora::http::RequestHeader;

use super::route::Route;
use super::{validate, RequestCtx};
use crate::api::{self, Endpoint};
use crate::auth::Principal;
use crate::errors::GatewayError;
use crate::limits::budgets::Budgets;

pub(super) async fn call(
    route: &Route,
    principal: &Principal,
    req: &RequestHeader,
    forward: &[u8],
    max_body: u64,
    budgets: Option<&Budgets>,
    ctx: &mut RequestCtx,
) -> Result<(), GatewayError> {
    let settings = &route.settings;
    if !principal.has_scope(&settings.scope) {
        return Err(GatewayError::Forbidden);
    }
    // Per process, or per fleet through Redis (`[rate_limits] redis`).
    if let Err(retry_after) = route.limit.check(principal).await {
        return Err(GatewayError::RateLimited(retry_after));
    }
    validate::declared_size(req, max_body)?;
    if let Some(budgets) = budgets {
        let standing = budgets.standing(principal);
        ctx.budget_class = standing.class;
        ctx.cost_budgeted = standing.cost;
        ctx.team = standing.team;
    }
    let endpoint = (settings.api).and_then(|api| Endpoint::of(api, &req.method, forward));
    ctx.endpoint = endpoint;
    // No free generation: a caller with a token budget generates nothing the meter misses.
    if settings.api.is_some()
        && endpoint.is_none()
        && ctx.budget_class == Some(true)
        && !api::unmetered_allowed(&settings.unmetered_paths, &req.method, forward)
    {
        return Err(GatewayError::EndpointNotMetered);
    }
    Ok(())
}
