//! Step 6, budget: after authorisation and the body's validation,
//! before anything is forwarded, a budgeted caller's request reserves its worst case
//! (`budgets::Budgets::reserve`) or is refused with `429 budget_exceeded`; its responses carry
//! OpenAI's `x-ratelimit-*` headers for its tightest window; the record phase settles the
//! reservation with what was really used.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::{Error, ErrorType, Result};

use super::{price, Gateway, RequestCtx};
use crate::api::{self, CapRule};
use crate::limits::budgets::{Quota, Refusal};

/// Why a request may not go on for its budget.
pub(crate) enum BudgetStop {
    /// `429 budget_exceeded`.
    Over(Box<Refusal>),
    /// `503 budget_unavailable`: the counters are not seeded yet.
    Unavailable,
    /// `403 model_unpriced`, with its message.
    Unpriced(String),
}

/// The completion cap a request of this caller must have: only with a token or cost budget.
pub(super) fn cap_rule<'g>(gw: &'g Gateway, ctx: &RequestCtx) -> Option<&'g CapRule> {
    let budgets = gw.budgets.as_deref()?;
    (ctx.budget_class == Some(true)).then(|| budgets.cap_rule())
}

/// Reserves the request's budget once what it asks is known: at once for a request whose
/// body is not read, once the body is read for one that is. `Err`: refused.
pub(super) async fn reserve(gw: &Gateway, ctx: &mut RequestCtx) -> Result<(), BudgetStop> {
    let (Some(budgets), Some(principal)) = (&gw.budgets, &ctx.principal) else {
        return Ok(());
    };
    // No budget at all (looked up when the caller was authorised): nothing to decide.
    if ctx.budget_decided || ctx.budget_class.is_none() {
        ctx.budget_decided = true;
        return Ok(());
    }
    let Some(budgeted) = budgets.of(principal) else {
        ctx.budget_decided = true;
        return Ok(());
    };
    if !budgets.is_seeded() {
        ctx.budget_decided = true;
        return Err(BudgetStop::Unavailable);
    }
    if ctx.exchange().is_some_and(|x| x.ask().is_none()) {
        // A body held until complete: decided when it is.
        return Ok(());
    }
    // Only a cost budget reserves money: no price is looked up for the others.
    let price = if ctx.cost_budgeted {
        price::price(gw, ctx)
    } else {
        None
    };
    if let Some(message) = price::refused_unpriced(gw, ctx, price) {
        ctx.budget_decided = true;
        return Err(BudgetStop::Unpriced(message));
    }
    let ask = match ctx.body.as_mut().map(|b| &mut b.exchange) {
        Some(exchange) => {
            let (bytes, cap) = exchange.ask().unwrap_or_default();
            // Charged in full should its usage go unread.
            let (prompt, completion) = budgets.worst_case(bytes, cap);
            exchange.charge_if_unread(prompt, completion);
            budgets.ask(bytes, cap, true, price)
        }
        None => budgets.ask(0, None, false, None),
    };
    ctx.budget_decided = true;
    match Box::pin(budgets.reserve_for(budgeted, ask, budgets.now())).await {
        Ok(reservation) => {
            ctx.budget = Some(Box::new(reservation));
            Ok(())
        }
        Err(refusal) => {
            budgets.rejected(gw.service_label(ctx), refusal.kind);
            Err(BudgetStop::Over(Box::new(refusal)))
        }
    }
}

/// A held body's budget, once it is complete and before any of it is sent upstream.
pub(super) async fn reserve_held(
    gw: &Gateway,
    chunk: &mut Option<Bytes>,
    end_of_stream: bool,
    ctx: &mut RequestCtx,
) -> Result<()> {
    if ctx.body.is_none() || !end_of_stream || ctx.budget_decided {
        return Ok(());
    }
    if let Err(stop) = reserve(gw, ctx).await {
        ctx.budget_refusal = Some(stop);
        *chunk = None;
        return Error::e_explain(ErrorType::HTTPStatus(429), "over budget");
    }
    Ok(())
}

/// Gives back what the request reserved beyond what it used.
pub(super) async fn settle(gw: &Gateway, ctx: &mut RequestCtx) {
    let (Some(budgets), Some(reservation)) = (&gw.budgets, ctx.budget.take()) else {
        return;
    };
    let charged = ctx.exchange().and_then(|x| x.charged());
    let tokens = charged.map_or(0, |c| {
        c.usage.prompt_tokens.unwrap_or(0) + c.usage.completion_tokens.unwrap_or(0)
    });
    let forwarded = ctx.upstream_sent.is_some() && !ctx.refused_held;
    let cost = ctx.cost.map_or(0, |c| c.micros());
    budgets.settle(*reservation, tokens, cost, forwarded).await;
}

/// A budgeted caller's answer states what its budget has left, in the rate headers of its API.
pub(super) fn quota_headers(response: &mut ResponseHeader, ctx: &RequestCtx) -> Result<()> {
    match &ctx.budget {
        Some(reservation) => write_quota(response, &reservation.quota),
        None => Ok(()),
    }
}

/// `quota` as rate headers, replacing the upstream's of the same names.
pub(super) fn write_quota(response: &mut ResponseHeader, quota: &Quota) -> Result<()> {
    api::rate_headers(response, quota.tokens, quota.requests)
}
