//! The budget phase of the request flow: after authorisation and the body's validation,
//! before anything is forwarded, a budgeted caller's request reserves its worst case
//! (`budgets::Budgets::reserve`) or is refused with `429 budget_exceeded`; its responses carry
//! OpenAI's `x-ratelimit-*` headers for its tightest window; the record phase settles the
//! reservation with what was really used.

use pingora::http::ResponseHeader;
use pingora::Result;

use super::{Gateway, RequestCtx};
use crate::api::CapRule;
use crate::budgets::window::openai_duration;
use crate::budgets::{Line, Quota, Refusal};

const TOKENS: [&str; 3] = [
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];
const REQUESTS: [&str; 3] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
];

/// Why a request may not go on for its budget.
pub(crate) enum BudgetStop {
    /// `429 budget_exceeded`.
    Over(Box<Refusal>),
    /// `503 budget_unavailable`: the counters are not seeded yet.
    Unavailable,
}

impl Gateway {
    /// The completion cap a request of this caller must have: only with a token budget.
    pub(super) fn cap_rule(&self, ctx: &RequestCtx) -> Option<&CapRule> {
        let budgets = self.budgets.as_deref()?;
        (ctx.budget_class == Some(true)).then(|| budgets.cap_rule())
    }

    /// Reserves the request's budget once what it asks is known: at once for a request
    /// whose body is not read, once the body is read for one that is. `Err`: refused.
    pub(super) async fn reserve_budget(&self, ctx: &mut RequestCtx) -> Result<(), BudgetStop> {
        let (Some(budgets), Some(principal)) = (&self.budgets, &ctx.principal) else {
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
        let ask = match &mut ctx.exchange {
            Some(exchange) => match exchange.ask {
                Some((bytes, cap)) => {
                    // Charged in full should its usage go unread.
                    let (prompt, completion) = budgets.worst_case(bytes, cap);
                    exchange.metered.charge_if_unread(prompt, completion);
                    budgets.ask(bytes, cap, true)
                }
                // A body held until complete: decided when it is.
                None => return Ok(()),
            },
            None => budgets.ask(0, None, false),
        };
        ctx.budget_decided = true;
        match Box::pin(budgets.reserve_for(budgeted, ask, budgets.now())).await {
            Ok(reservation) => {
                ctx.budget = Some(Box::new(reservation));
                Ok(())
            }
            Err(refusal) => {
                budgets.rejected(self.service_label(ctx), refusal.kind);
                Err(BudgetStop::Over(Box::new(refusal)))
            }
        }
    }

    /// Gives back what the request reserved beyond what it used.
    pub(super) async fn settle_budget(&self, ctx: &mut RequestCtx) {
        let (Some(budgets), Some(reservation)) = (&self.budgets, ctx.budget.take()) else {
            return;
        };
        let charged = ctx.exchange.as_ref().and_then(|x| x.metered.charged());
        let tokens = charged.map_or(0, |c| {
            c.usage.prompt_tokens.unwrap_or(0) + c.usage.completion_tokens.unwrap_or(0)
        });
        let forwarded = ctx.upstream_sent.is_some() && !ctx.refused_held;
        budgets.settle(*reservation, tokens, forwarded).await;
    }
}

/// OpenAI's rate-limit headers for `quota`, replacing the upstream's of the same names. The
/// upstream's token headers go even when no token budget applies (a request budget only):
/// its account's limits are not the caller's.
pub(crate) fn quota_headers(response: &mut ResponseHeader, quota: &Quota) -> Result<()> {
    for (names, line) in [(TOKENS, quota.tokens), (REQUESTS, quota.requests)] {
        let Some(line) = line else {
            if names == TOKENS {
                for name in names {
                    response.remove_header(name);
                }
            }
            continue;
        };
        let Line {
            limit,
            remaining,
            reset,
        } = line;
        response.insert_header(names[0], limit)?;
        response.insert_header(names[1], remaining)?;
        response.insert_header(names[2], openai_duration(reset))?;
    }
    Ok(())
}
