//! `GET /v1/usage`: ledger totals of a range of UTC days. A caller sees its own usage (its
//! keys' and its own JWT calls', both billed to its `sub`); an administrator everyone's, or
//! one owner's with `?owner=` or one team's owners' with `?team=`. Rows are always split by
//! owner, so `owner` is always present; `cost` is in the price table's currency.

use serde::Serialize;

use super::paging;
use super::reply::{store_failed, Reply};
use crate::auth::Principal;
use crate::metering::query::from_query_string;
use crate::store::{amount_json, LedgerStore, Unit, UsageTotal};
use crate::time::{date, unix_now};

/// One row as the API shows it. A part not grouped by is left out; a grouped part with no
/// value is `null` (`key` of JWT calls, `model` unknown, `owner` of keys made without one).
#[derive(Serialize)]
struct Row<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    day: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<Option<&'a str>>,
    owner: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    team: Option<Option<&'a str>>,
    requests: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    reasoning_tokens: u64,
    cached_tokens: u64,
    /// The priced requests' cost; null when none was priced (never 0 for unpriced ones).
    cost: serde_json::Value,
    unpriced_requests: u64,
}

/// `''` is the ledger's "none".
fn some(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

impl<'a> Row<'a> {
    fn of(t: &'a UsageTotal) -> Row<'a> {
        Row {
            day: t.day.map(date),
            key: t.key_id.as_deref().map(some),
            owner: some(&t.owner),
            service: t.service.as_deref(),
            model: t.model.as_deref().map(some),
            team: t.team.as_deref().map(some),
            requests: t.counts.requests,
            prompt_tokens: t.counts.prompt_tokens,
            completion_tokens: t.counts.completion_tokens,
            reasoning_tokens: t.counts.reasoning_tokens,
            cached_tokens: t.counts.cached_tokens,
            cost: (t.counts.cost()).map_or(serde_json::Value::Null, |m| amount_json(Unit::Cost, m)),
            unpriced_requests: t.counts.unpriced_requests,
        }
    }
}

pub(crate) async fn report(
    store: &dyn LedgerStore,
    caller: &Principal,
    is_admin: bool,
    query: Option<&str>,
) -> Reply {
    let mut q = match from_query_string(query, unix_now()) {
        Ok(q) => q,
        Err(message) => return Reply::error(400, "bad_request", Some(&message)),
    };
    if !is_admin {
        if q.owner.as_deref().is_some_and(|o| *o != *caller.id) {
            return Reply::error(
                403,
                "forbidden",
                Some("only an administrator may read another owner's usage"),
            );
        }
        if q.team.is_some() {
            return Reply::error(
                403,
                "forbidden",
                Some("only an administrator may read a team's usage"),
            );
        }
        q.owner = Some(caller.id.to_string());
    }
    let (limit, from) = match page(query) {
        Ok(page) => page,
        Err(message) => return Reply::error(400, "bad_request", Some(message)),
    };
    let totals = match store.usage(&q).await {
        Ok(totals) => totals,
        Err(e) => return store_failed("read usage", &e),
    };
    let start = from.min(totals.len());
    let end = start.saturating_add(limit).min(totals.len());
    let rows: Vec<Row> = totals[start..end].iter().map(Row::of).collect();
    let next = (end < totals.len()).then(|| format!("{end:016x}"));
    let body = serde_json::json!({ "usage": rows, "next": next });
    Reply::json(200, serde_json::to_vec(&body).unwrap_or_default())
}

const BAD_CURSOR: &str =
    "cursor is not one this API gave out: send the `next` of the previous page";

/// The page asked for: `limit` (default 100, at most 1000) rows from the position `cursor`
/// names (the previous page's `next`: the index of its first row, 16 hex digits; rows are in a
/// fixed order, and the ledger of past days only grows in counts, not in rows).
fn page(query: Option<&str>) -> Result<(usize, usize), &'static str> {
    let (mut limit, mut from) = (paging::DEFAULT_LIMIT, 0);
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*name {
            "limit" => limit = paging::parse_limit(&value).ok_or(paging::BAD_LIMIT)?,
            "cursor" => {
                let well_formed = value.len() == 16
                    && value
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                let position = well_formed.then(|| u64::from_str_radix(&value, 16).ok());
                from = position
                    .flatten()
                    .ok_or(BAD_CURSOR)?
                    .try_into()
                    .unwrap_or(usize::MAX);
            }
            _ => {}
        }
    }
    Ok((limit as usize, from))
}
