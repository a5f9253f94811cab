//! Budgets on the key API: the `budget` member of a create and of `PATCH /v1/keys/{id}` (read
//! strictly: only the six names, each once, each a whole number or, for a cost, an amount of
//! the currency), the rule that an owner's key never goes above the owner's own budget, the
//! JSON of budgets, their use and their resets, and `GET`/`PUT /v1/owners/{sub}/budget`.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::reply::{store_failed, Reply};
use super::KeyEvent;
use crate::auth::Principal;
use crate::pricing::money;
use crate::store::{
    amount_json, amount_text, Budget, BudgetStore, Store, Subject, Unit, WindowStarts, WindowUsage,
};
use crate::time::{rfc3339, unix_now};

/// The `budget` member of a request body: absent (`None`), or the budget it sets (empty for
/// `null` or `{}`: no budget), or the message of a 400 naming what is wrong. Duplicate members
/// are refused, which a parse into `serde_json::Value` would hide (it keeps the last).
pub(crate) fn budget_member(body: &[u8]) -> Result<Option<Budget>, String> {
    let mut de = serde_json::Deserializer::from_slice(body);
    match de.deserialize_map(Member) {
        Ok(found) => found,
        // The caller has checked that the body is one JSON object.
        Err(_) => Err("the body must be a JSON object".into()),
    }
}

/// Walks the body's members, reading `budget` and passing over the others.
struct Member;

impl<'de> Visitor<'de> for Member {
    type Value = Result<Option<Budget>, String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found: Option<Result<Budget, String>> = None;
        while let Some(name) = map.next_key::<Cow<str>>()? {
            if name != "budget" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let Limits(read) = map.next_value()?;
            if found.is_some() {
                found = Some(Err("budget is given twice".into()));
            } else {
                found = Some(read);
            }
        }
        Ok(found.transpose())
    }
}

/// A budget object or `null`, read whole whatever it holds; the first problem is kept.
struct Limits(Result<Budget, String>);

const NOT_AN_OBJECT: &str =
    "budget must be an object of limits (tokens_per_hour, tokens_per_day, tokens_per_month, \
     requests_per_day, cost_per_day, cost_per_month) or null";

impl<'de> Deserialize<'de> for Limits {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Limits, D::Error> {
        d.deserialize_any(LimitsVisitor)
    }
}

struct LimitsVisitor;

impl LimitsVisitor {
    fn wrong<E>(self) -> Result<Limits, E> {
        Ok(Limits(Err(NOT_AN_OBJECT.into())))
    }
}

impl<'de> Visitor<'de> for LimitsVisitor {
    type Value = Limits;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(NOT_AN_OBJECT)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Limits, E> {
        Ok(Limits(Ok(Budget::default())))
    }

    fn visit_none<E: de::Error>(self) -> Result<Limits, E> {
        self.visit_unit()
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Limits, E> {
        self.wrong()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Limits, E> {
        self.wrong()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Limits, E> {
        self.wrong()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Limits, E> {
        self.wrong()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Limits, E> {
        self.wrong()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Limits, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.wrong()
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Limits, A::Error> {
        let mut limits = [None; Budget::N];
        let mut seen = [false; Budget::N];
        let mut problem: Option<String> = None;
        while let Some(name) = map.next_key::<Cow<str>>()? {
            let Some(i) = Budget::NAMES.iter().position(|n| *n == name) else {
                map.next_value::<IgnoredAny>()?;
                problem.get_or_insert_with(|| unknown_member(&name));
                continue;
            };
            let value: Value = map.next_value()?;
            let limit = limit_of(Budget::UNITS[i], &value);
            let name = Budget::NAMES[i];
            match (seen[i], limit) {
                (true, _) => {
                    problem.get_or_insert_with(|| format!("budget.{name} is given twice"));
                }
                (false, Err(why)) => {
                    problem.get_or_insert_with(|| format!("budget.{name} {why}"));
                }
                (false, Ok(n)) => limits[i] = Some(n),
            }
            seen[i] = true;
        }
        Ok(Limits(match problem {
            Some(problem) => Err(problem),
            None => Ok(Budget::from_limits(limits)),
        }))
    }
}

/// A limit of `unit`: a cost in the currency's units (at most six decimals), anything else a
/// whole number; what is wrong with it otherwise, after its name.
fn limit_of(unit: Unit, value: &Value) -> Result<u64, String> {
    match unit {
        Unit::Cost => money::parse_units_json(value),
        _ => whole_number(value)
            .ok_or_else(|| format!("must be a whole number from 0 to {}", i64::MAX)),
    }
}

/// A limit: a whole number from 0 to `i64::MAX` (what the store holds). JSON (and the JSON
/// Schema of /openapi.json) counts `5.0` and `1e3` as the integers they equal, so they are taken
/// too; a fraction, a negative number or anything larger is not.
fn whole_number(value: &Value) -> Option<u64> {
    const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
    match value.as_u64() {
        Some(n) => (n <= i64::MAX as u64).then_some(n),
        None => value
            .as_f64()
            .filter(|f| f.fract() == 0.0 && (0.0..TWO_TO_63).contains(f))
            .map(|f| f as u64),
    }
}

/// Names the member, cut short: it is whatever the client sent.
fn unknown_member(name: &str) -> String {
    let shown: String = name.chars().take(64).collect();
    format!(
        "budget has an unknown member {shown:?}: only tokens_per_hour, tokens_per_day, \
         tokens_per_month, requests_per_day, cost_per_day and cost_per_month are accepted"
    )
}

/// An owner may give its keys any budget within its own: in every window where the owner has
/// a limit, the key's limit must be absent or at most that. The message of the 403 otherwise,
/// naming the first window over it.
pub(crate) fn beyond_owner(key: &Budget, owner: Option<&Budget>) -> Option<String> {
    let owner = owner?;
    (Budget::NAMES.iter().zip(Budget::UNITS))
        .zip(key.limits().into_iter().zip(owner.limits()))
        .find_map(|((name, unit), limits)| match limits {
            (Some(k), Some(o)) if k > o => Some(format!(
                "budget.{name} {} is above your own budget's {name} ({}); \
                 only an administrator may set it higher",
                amount_text(unit, k),
                amount_text(unit, o),
            )),
            _ => None,
        })
}

/// Refuses a key budget an owner may not set (`None` when it may: an administrator, or within
/// the caller's own budget), reading the caller's budget only when the key has one.
pub(crate) async fn check_owner_rule(
    store: &dyn BudgetStore,
    caller: &Principal,
    is_admin: bool,
    budget: &Budget,
) -> Option<Reply> {
    if is_admin || budget.is_empty() {
        return None;
    }
    match store.owner_budget(&caller.id).await {
        Ok(own) => beyond_owner(budget, own.as_ref())
            .map(|message| Reply::error(403, "forbidden", Some(&message))),
        Err(e) => Some(store_failed("read an owner's budget", &e)),
    }
}

/// A budget as the API shows it: an object of the limits set, `null` for none.
pub(crate) fn budget_json(budget: &Budget) -> Value {
    if budget.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(budget).unwrap_or(Value::Null)
    }
}

/// A key's `used`: for each window its budget limits, the current window's use; `null`
/// without a budget.
pub(crate) fn key_used_json(budget: &Budget, used: &WindowUsage) -> Value {
    if budget.is_empty() {
        return Value::Null;
    }
    let fields: Map<String, Value> = (Budget::NAMES.iter().zip(Budget::UNITS))
        .zip(budget.limits().into_iter().zip(used.in_order()))
        .filter(|(_, (limit, _))| limit.is_some())
        .map(|((name, unit), (_, n))| (name.to_string(), amount_json(unit, n)))
        .collect();
    Value::Object(fields)
}

/// `{"budget", "used", "resets"}` of an owner or a team: `used` and `resets` name every
/// window.
pub(crate) fn subject_json(budget: &Budget, used: &WindowUsage, starts: WindowStarts) -> Value {
    let mut used_json = Map::new();
    let mut resets = Map::new();
    for (((name, unit), n), at) in (Budget::NAMES.iter().zip(Budget::UNITS))
        .zip(used.in_order())
        .zip(starts.resets())
    {
        used_json.insert(name.to_string(), amount_json(unit, n));
        resets.insert(name.to_string(), json!(rfc3339(at)));
    }
    json!({"budget": budget_json(budget), "used": used_json, "resets": resets})
}

/// The `{sub}` of `/v1/owners/{sub}/budget`, percent-decoded: non-empty printable text, or the
/// message of a 400.
pub(crate) fn owner_in_path(raw: &str) -> Result<String, &'static str> {
    const BAD: &str = "the owner in the path must be non-empty printable text, percent-encoded";
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            let byte = hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(BAD)?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let owner = String::from_utf8(out).map_err(|_| BAD)?;
    if owner.is_empty() || owner.chars().any(char::is_control) {
        return Err(BAD);
    }
    Ok(owner)
}

/// `GET /v1/owners/{sub}/budget`: the caller's own, or anyone's for an administrator.
pub(crate) async fn get_owner(
    store: &dyn Store,
    caller: &Principal,
    is_admin: bool,
    raw_owner: &str,
) -> Reply {
    let owner = match owner_in_path(raw_owner) {
        Ok(owner) => owner,
        Err(message) => return Reply::error(400, "bad_request", Some(message)),
    };
    if !is_admin && owner != *caller.id {
        return Reply::error(
            403,
            "forbidden",
            Some("only an administrator may read another owner's budget"),
        );
    }
    let budget = match store.owner_budget(&owner).await {
        Ok(budget) => budget.unwrap_or_default(),
        Err(e) => return store_failed("read an owner's budget", &e),
    };
    owner_reply(store, &owner, &budget).await
}

/// `PUT /v1/owners/{sub}/budget` with `{"budget": {…} | null}`: administrators only.
pub(crate) async fn put_owner(
    store: &dyn Store,
    is_admin: bool,
    raw_owner: &str,
    body: &[u8],
) -> (Reply, Option<KeyEvent>) {
    let owner = match owner_in_path(raw_owner) {
        Ok(owner) => owner,
        Err(message) => return (Reply::error(400, "bad_request", Some(message)), None),
    };
    if !is_admin {
        let message = "only an administrator may set an owner's budget";
        return (Reply::error(403, "forbidden", Some(message)), None);
    }
    let budget = match budget_body(body) {
        Ok(budget) => budget,
        Err(message) => return (Reply::error(400, "bad_request", Some(&message)), None),
    };
    if let Err(e) = store.set_owner_budget(&owner, &budget).await {
        return (store_failed("set an owner's budget", &e), None);
    }
    let event = KeyEvent {
        event: "budget",
        key_id: None,
        budget_owner: Some(owner.clone()),
        team: None,
        member: None,
        budget: Some((!budget.is_empty()).then_some(budget)),
    };
    (owner_reply(store, &owner, &budget).await, Some(event))
}

async fn owner_reply(store: &dyn Store, owner: &str, budget: &Budget) -> Reply {
    let starts = WindowStarts::at(unix_now());
    let used = match store
        .window_usage(&Subject::Owner(owner.to_string()), starts)
        .await
    {
        Ok(used) => used,
        Err(e) => return store_failed("read an owner's usage", &e),
    };
    let body = subject_json(budget, &used, starts);
    Reply::json(200, serde_json::to_vec(&body).unwrap_or_default())
}

/// The body of a `PATCH /v1/keys/{id}` or `PUT /v1/owners/{sub}/budget`: exactly
/// `{"budget": {…} | null}`. The budget it sets (empty: none), or the message of a 400.
pub(crate) fn budget_body(body: &[u8]) -> Result<Budget, String> {
    const SHAPE: &str = "the body must be a JSON object: {\"budget\": {…} or null}";
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
        return Err(SHAPE.into());
    };
    if let Some(other) = fields.keys().find(|k| *k != "budget") {
        let shown: String = other.chars().take(64).collect();
        return Err(format!("unknown field {shown:?}: only budget is accepted"));
    }
    budget_member(body)?.ok_or_else(|| SHAPE.replace("must be", "must hold budget:"))
}

#[cfg(test)]
mod tests;
