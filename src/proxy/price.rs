//! Prices, in two steps of the flow: in step 6 the price that applies to the request's
//! service and model (its worst case is reserved at it, and `unpriced = "refuse"` stops a
//! cost-budgeted caller whose model has none), and in step 10 what the request cost, once its
//! usage is settled, for the budget, the ledger, the access log and the metrics alike.

use super::{Gateway, RequestCtx};
use crate::metering::Cost;
use crate::pricing::{Price, Tokens, Unpriced};
use crate::time::unix_now;

/// The price that applies to the request now, if the gateway has a table and one does.
pub(super) fn price(gw: &Gateway, ctx: &RequestCtx) -> Option<Price> {
    let pricing = gw.pricing.as_deref()?;
    let model = ctx.exchange()?.model()?;
    pricing.price(gw.service_label(ctx), model, unix_now())
}

/// The 403's message when the request may not go on unpriced: its caller has a cost budget,
/// the table says `unpriced = "refuse"`, and no price applies to its model.
pub(super) fn refused_unpriced(
    gw: &Gateway,
    ctx: &RequestCtx,
    price: Option<Price>,
) -> Option<String> {
    let pricing = gw.pricing.as_deref()?;
    if price.is_some() || !ctx.cost_budgeted || pricing.unpriced != Unpriced::Refuse {
        return None;
    }
    let service = gw.service_label(ctx);
    Some(match ctx.exchange().and_then(|x| x.model()) {
        Some(model) => format!(
            "no price applies to model {:?} on service {service:?}, and the caller has a cost \
             budget",
            // The caller's own text, cut as the access log cuts it.
            model.chars().take(256).collect::<String>()
        ),
        None => format!(
            "the request names no model, so no price applies on service {service:?}, and the \
             caller has a cost budget"
        ),
    })
}

/// What the finished request cost: its settled usage at the price of the day it was made.
pub(super) fn cost(gw: &Gateway, ctx: &RequestCtx) -> Cost {
    let Some(pricing) = gw.pricing.as_deref() else {
        return Cost::NoTable;
    };
    let exchange = ctx.exchange();
    let Some(model) = exchange.and_then(|x| x.model()) else {
        return Cost::Unpriced;
    };
    let usage = (exchange.and_then(|x| x.charged()))
        .map(|c| c.usage)
        .unwrap_or_default();
    let tokens = Tokens {
        prompt: usage.prompt_tokens.unwrap_or(0),
        cached: usage.cached_tokens.unwrap_or(0),
        completion: usage.completion_tokens.unwrap_or(0),
    };
    let made = unix_now() - ctx.start.elapsed().as_secs() as i64;
    match pricing.cost(gw.service_label(ctx), model, made, tokens) {
        Some(micros) => Cost::Micros(micros),
        None => Cost::Unpriced,
    }
}
