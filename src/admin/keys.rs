//! The key operations: create, list, revoke and set a budget, for the caller's own keys (every
//! key with the admin scope). Bodies and answers are the shapes docs/console-and-key-api.md
//! gives.

use serde::Serialize;
use serde_json::{Map, Value};

use super::budgets::{self, budget_json, key_used_json};
use super::paging::{cursor, ListQuery};
use super::reply::{store_failed, Reply};
use super::KeyEvent;
use crate::auth::api_keys::{create_owned_key, KeyEvictor, KeySpec};
use crate::auth::token::KeyId;
use crate::auth::Principal;
use crate::scope::Scope;
use crate::store::{KeyRecord, PageEnd, Store, WindowStarts, WindowUsage};
use crate::time::rfc3339;
use crate::time::{parse_lifetime, unix_now};

/// Longest key name, in characters: it is a label for people, shown in lists.
const MAX_NAME_CHARS: usize = 64;
/// Most scopes on one key: far more than services a gateway has.
const MAX_SCOPES: usize = 32;

pub(crate) struct Ops<'a> {
    pub store: &'a dyn Store,
    pub evictor: &'a KeyEvictor,
    pub caller: &'a Principal,
    pub is_admin: bool,
    pub max_keys_per_owner: u32,
}

/// A key as the API shows it: never a secret or verifier.
#[derive(Serialize)]
struct KeyInfo<'a> {
    id: &'a str,
    name: &'a str,
    scopes: &'a [String],
    owner: Option<&'a str>,
    created: String,
    expires: Option<String>,
    revoked: Option<String>,
    /// The limits set, `null` for none.
    budget: Value,
    /// The current windows' use, for the windows the budget limits; `null` without one.
    used: Value,
}

impl<'a> KeyInfo<'a> {
    /// `used`: the ledger's sums of the key in the current windows (none: nothing used).
    fn of(r: &'a KeyRecord, used: Option<&WindowUsage>) -> KeyInfo<'a> {
        KeyInfo {
            id: &r.key_id,
            name: &r.name,
            scopes: &r.scopes,
            owner: r.owner.as_deref(),
            created: rfc3339(r.created_at),
            expires: r.expires_at.map(rfc3339),
            revoked: r.revoked_at.map(rfc3339),
            budget: budget_json(&r.budget),
            used: key_used_json(&r.budget, used.unwrap_or(&WindowUsage::default())),
        }
    }
}

/// The answer to a create: the key's record and, this once, the full key.
#[derive(Serialize)]
struct Created<'a> {
    id: &'a str,
    key: &'a str,
    name: &'a str,
    scopes: &'a [String],
    owner: Option<&'a str>,
    created: String,
    expires: Option<String>,
    budget: Value,
}

fn bad_request(message: &str) -> Reply {
    Reply::error(400, "bad_request", Some(message))
}

impl Ops<'_> {
    pub(crate) async fn create(&self, body: &[u8]) -> (Reply, Option<KeyEvent>) {
        let spec = match parse_create(body) {
            Ok(spec) => spec,
            Err(message) => return (bad_request(&message), None),
        };
        if !self.is_admin {
            if let Some(s) = spec.scopes.iter().find(|s| !self.caller.has_scope(s)) {
                let message = format!("scope {s:?} is not one of your own scopes");
                return (Reply::error(403, "forbidden", Some(&message)), None);
            }
        }
        let rule = budgets::check_owner_rule(self.store, self.caller, self.is_admin, &spec.budget);
        if let Some(refused) = rule.await {
            return (refused, None);
        }
        let spec = KeySpec {
            owner: Some(self.caller.id.to_string()),
            ..spec
        };
        let made = match create_owned_key(self.store, spec, Some(self.max_keys_per_owner)).await {
            Ok(made) => made,
            Err(e) => return (store_failed("create a key", &e), None),
        };
        let Some(key) = made else {
            let message = format!(
                "you already have {} active keys (max_keys_per_owner): revoke one first",
                self.max_keys_per_owner
            );
            return (Reply::error(409, "conflict", Some(&message)), None);
        };
        let r = &key.record;
        let body = serde_json::to_vec(&Created {
            id: &r.key_id,
            key: &key.token,
            name: &r.name,
            scopes: &r.scopes,
            owner: r.owner.as_deref(),
            created: rfc3339(r.created_at),
            expires: r.expires_at.map(rfc3339),
            budget: budget_json(&r.budget),
        })
        .unwrap_or_default();
        let event = KeyEvent {
            budget: (!r.budget.is_empty()).then_some(Some(r.budget)),
            ..KeyEvent::key("created", r.key_id.clone())
        };
        (Reply::json(201, body), Some(event))
    }

    /// One page of keys, newest first: the caller's own, or (for an administrator) every
    /// key or one owner's. One row more than the page is read, to tell whether a next exists.
    pub(crate) async fn list(&self, query: Option<&str>) -> Reply {
        let q = match ListQuery::parse(query) {
            Ok(q) => q,
            Err(message) => return bad_request(message),
        };
        let owner = match (q.owner.as_deref(), self.is_admin) {
            (owner, true) => owner,
            (Some(o), false) if *o != *self.caller.id => {
                return Reply::error(
                    403,
                    "forbidden",
                    Some("only an administrator may list another owner's keys"),
                );
            }
            (_, false) => Some(&*self.caller.id),
        };
        let found = self.store.page(owner, q.after.as_ref(), q.limit + 1).await;
        let mut keys = match found {
            Ok(keys) => keys,
            Err(e) => return store_failed("list keys", &e),
        };
        let next = (keys.len() > q.limit as usize).then(|| {
            keys.truncate(q.limit as usize);
            keys.last().map(|k| cursor(&PageEnd::of(k)))
        });
        // The ledger's sums of the page's budgeted keys, in a few statements for all of them.
        let budgeted: Vec<String> = keys
            .iter()
            .filter(|k| !k.budget.is_empty())
            .map(|k| k.key_id.clone())
            .collect();
        let starts = WindowStarts::at(unix_now());
        let used = match self.store.keys_window_usage(&budgeted, starts).await {
            Ok(used) => used,
            Err(e) => return store_failed("read the keys' usage", &e),
        };
        let keys: Vec<KeyInfo> = keys
            .iter()
            .map(|k| KeyInfo::of(k, used.get(&k.key_id)))
            .collect();
        let body = serde_json::json!({ "keys": keys, "next": next.flatten() });
        Reply::json(200, serde_json::to_vec(&body).unwrap_or_default())
    }

    /// The key `id` names, when the caller may manage it; the reply to send otherwise.
    /// Another owner's key is "not found", so ids cannot be probed.
    async fn own_key(&self, id: &str) -> Result<(KeyId, KeyRecord), Reply> {
        let not_found = || Reply::error(404, "not_found", None);
        let key_id = KeyId::parse(id).ok_or_else(not_found)?;
        let record = match self.store.find(key_id.as_str()).await {
            Ok(Some(stored)) => stored.record,
            Ok(None) => return Err(not_found()),
            Err(e) => return Err(store_failed("find a key", &e)),
        };
        if !self.is_admin && record.owner.as_deref() != Some(&*self.caller.id) {
            return Err(not_found());
        }
        Ok((key_id, record))
    }

    /// `PATCH /v1/keys/{id}` with `{"budget": {…} | null}`: the key's whole budget replaced
    /// (`null` or `{}`: none), within the caller's own budget unless it is an administrator.
    /// Answers the key as listed. A revoked key is gone as far as changes go (`404`, as any
    /// resource after its `DELETE`), though listed until its retention ends.
    pub(crate) async fn set_budget(&self, id: &str, body: &[u8]) -> (Reply, Option<KeyEvent>) {
        let (key_id, mut record) = match self.own_key(id).await {
            Ok(found) => found,
            Err(reply) => return (reply, None),
        };
        if record.revoked_at.is_some() {
            let message = "the key is revoked: its budget no longer changes";
            return (Reply::error(404, "not_found", Some(message)), None);
        }
        let budget = match budgets::budget_body(body) {
            Ok(budget) => budget,
            Err(message) => return (bad_request(&message), None),
        };
        let rule = budgets::check_owner_rule(self.store, self.caller, self.is_admin, &budget);
        if let Some(refused) = rule.await {
            return (refused, None);
        }
        match self.store.set_key_budget(key_id.as_str(), &budget).await {
            Ok(true) => {}
            Ok(false) => return (Reply::error(404, "not_found", None), None),
            Err(e) => return (store_failed("set a key's budget", &e), None),
        }
        record.budget = budget;
        let event = KeyEvent {
            budget: Some((!budget.is_empty()).then_some(budget)),
            ..KeyEvent::key("budget", record.key_id.clone())
        };
        let starts = WindowStarts::at(unix_now());
        let ids = [record.key_id.clone()];
        let used = match self.store.keys_window_usage(&ids, starts).await {
            Ok(used) => used,
            Err(e) => return (store_failed("read a key's usage", &e), Some(event)),
        };
        let info = KeyInfo::of(&record, used.get(&record.key_id));
        let body = serde_json::to_vec(&info).unwrap_or_default();
        (Reply::json(200, body), Some(event))
    }

    pub(crate) async fn revoke(&self, id: &str) -> (Reply, Option<KeyEvent>) {
        let (key_id, record) = match self.own_key(id).await {
            Ok(found) => found,
            Err(reply) => return (reply, None),
        };
        if let Err(e) = self.store.revoke(key_id.as_str(), unix_now()).await {
            return (store_failed("revoke a key", &e), None);
        }
        self.evictor.evict(key_id).await;
        // Idempotent: a second revoke answers 204 too, but only the first is an event.
        let event = record
            .revoked_at
            .is_none()
            .then(|| KeyEvent::key("revoked", record.key_id));
        (Reply::no_content(), event)
    }
}

/// `{"name", "scopes", "expires_in"?}`, each field checked with a message naming it. The
/// messages never quote the body beyond a scope the caller sent.
fn parse_create(body: &[u8]) -> Result<KeySpec, String> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|_| "the body must be a JSON object: {\"name\", \"scopes\", \"expires_in\"?}")?;
    let Value::Object(mut fields) = value else {
        return Err(
            "the body must be a JSON object: {\"name\", \"scopes\", \"expires_in\"?}".into(),
        );
    };
    let name = take_name(&mut fields)?;
    let scopes = take_scopes(&mut fields)?;
    let expires_in = match fields.remove("expires_in") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(lifetime(&s)?),
        Some(_) => return Err("expires_in must be a string such as \"90d\"".into()),
    };
    fields.remove("budget");
    let budget = budgets::budget_member(body)?.unwrap_or_default();
    if !fields.is_empty() {
        return Err("unknown field: only name, scopes, expires_in and budget are accepted".into());
    }
    Ok(KeySpec {
        name,
        scopes,
        expires_in,
        budget,
        owner: None,
    })
}

fn take_name(fields: &mut Map<String, Value>) -> Result<String, String> {
    let Some(Value::String(name)) = fields.remove("name") else {
        return Err("name must be a string".into());
    };
    if name.trim().is_empty() || name.chars().any(char::is_control) {
        return Err("name must be non-empty printable text".into());
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(format!("name must be at most {MAX_NAME_CHARS} characters"));
    }
    Ok(name)
}

fn take_scopes(fields: &mut Map<String, Value>) -> Result<Vec<String>, String> {
    let Some(Value::Array(items)) = fields.remove("scopes") else {
        return Err("scopes must be an array of strings".into());
    };
    if items.is_empty() || items.len() > MAX_SCOPES {
        return Err(format!("scopes must hold 1 to {MAX_SCOPES} scopes"));
    }
    let mut scopes = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let Value::String(s) = item else {
            return Err(format!("scopes[{i}] must be a string"));
        };
        if let Err(e) = s.parse::<Scope>() {
            return Err(format!("scopes[{i}] {e}"));
        }
        if scopes.contains(&s) {
            return Err(format!("scopes[{i}] repeats an earlier scope"));
        }
        scopes.push(s);
    }
    Ok(scopes)
}

fn lifetime(s: &str) -> Result<std::time::Duration, String> {
    const SHAPE: &str = "expires_in must be a whole number with a unit: 30s, 15m, 12h or 90d";
    if s.len() > 24 {
        return Err(SHAPE.into());
    }
    parse_lifetime(s, unix_now()).map_err(|_| SHAPE.into())
}

#[cfg(test)]
mod tests {
    use super::parse_create;

    #[test]
    fn create_bodies() {
        let ok = parse_create(br#"{"name":"ci","scopes":["infer","embed"],"expires_in":"90d"}"#)
            .unwrap();
        assert_eq!(ok.name, "ci");
        assert_eq!(ok.scopes, ["infer", "embed"]);
        assert_eq!(ok.expires_in.unwrap().as_secs(), 90 * 86_400);
        let no_expiry = parse_create(br#"{"name":"ci","scopes":["infer"],"expires_in":null}"#);
        assert!(no_expiry.unwrap().expires_in.is_none());
        let budgeted =
            parse_create(br#"{"name":"ci","scopes":["infer"],"budget":{"tokens_per_day":9}}"#);
        assert_eq!(budgeted.unwrap().budget.tokens_per_day, Some(9));
        let none = parse_create(br#"{"name":"ci","scopes":["infer"],"budget":null}"#);
        assert!(none.unwrap().budget.is_empty());
        for (body, message) in [
            (&b"not json"[..], "the body must be a JSON object"),
            (br#"[1]"#, "the body must be a JSON object"),
            (br#"{"scopes":["infer"]}"#, "name must be a string"),
            (
                br#"{"name":" ","scopes":["infer"]}"#,
                "name must be non-empty",
            ),
            (
                br#"{"name":"a\u0007","scopes":["infer"]}"#,
                "name must be non-empty",
            ),
            (br#"{"name":"a","scopes":[]}"#, "scopes must hold 1 to 32"),
            (
                br#"{"name":"a","scopes":"infer"}"#,
                "scopes must be an array",
            ),
            (
                br#"{"name":"a","scopes":[1]}"#,
                "scopes[0] must be a string",
            ),
            (
                br#"{"name":"a","scopes":["a b"]}"#,
                "scopes[0] is not a scope",
            ),
            (br#"{"name":"a","scopes":["x","x"]}"#, "scopes[1] repeats"),
            (
                br#"{"name":"a","scopes":["x"],"expires_in":"5"}"#,
                "expires_in must be a whole",
            ),
            (
                br#"{"name":"a","scopes":["x"],"expires_in":5}"#,
                "expires_in must be a string",
            ),
            (
                br#"{"name":"a","scopes":["x"],"owner":"b"}"#,
                "unknown field",
            ),
            (
                br#"{"name":"a","scopes":["x"],"budget":{"tokens_per_day":-5}}"#,
                "budget.tokens_per_day must be a whole number",
            ),
        ] {
            let got = parse_create(body).err().unwrap_or_default();
            assert!(got.starts_with(message), "{body:?}: {got}");
        }
        let long = format!(r#"{{"name":"{}","scopes":["x"]}}"#, "n".repeat(65));
        assert!(parse_create(long.as_bytes())
            .unwrap_err()
            .contains("at most 64"));
    }
}
