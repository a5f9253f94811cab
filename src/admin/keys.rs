//! The key operations: create, list, revoke, for the caller's own keys (every key with the
//! admin scope). Bodies and answers are the shapes docs/console-and-key-api.md gives.

use serde::Serialize;
use serde_json::{Map, Value};

use super::paging::{cursor, ListQuery};
use super::reply::Reply;
use super::KeyEvent;
use crate::auth::api_keys::{create_owned_key, KeyEvictor, KeyRecord, KeySpec, KeyStore, PageEnd};
use crate::auth::token::KeyId;
use crate::auth::Principal;
use crate::scope::Scope;
use crate::time::rfc3339;
use crate::time::{parse_lifetime, unix_now};

/// Longest key name, in characters: it is a label for people, shown in lists.
const MAX_NAME_CHARS: usize = 64;
/// Most scopes on one key: far more than services a gateway has.
const MAX_SCOPES: usize = 32;

pub struct Ops<'a> {
    pub store: &'a dyn KeyStore,
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
}

impl<'a> KeyInfo<'a> {
    fn of(r: &'a KeyRecord) -> KeyInfo<'a> {
        KeyInfo {
            id: &r.key_id,
            name: &r.name,
            scopes: &r.scopes,
            owner: r.owner.as_deref(),
            created: rfc3339(r.created_at),
            expires: r.expires_at.map(rfc3339),
            revoked: r.revoked_at.map(rfc3339),
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
}

fn bad_request(message: &str) -> Reply {
    Reply::error(400, "bad_request", Some(message))
}

/// The store failed: the client may retry; the cause goes to the log only.
pub(super) fn store_failed(what: &str, e: &dyn std::fmt::Display) -> Reply {
    log::warn!("admin: cannot {what}: {e}");
    Reply::error(
        503,
        "unavailable",
        Some("the key store is unavailable; try again shortly"),
    )
    .header("retry-after", "1")
}

impl Ops<'_> {
    pub async fn create(&self, body: &[u8]) -> (Reply, Option<KeyEvent>) {
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
        })
        .unwrap_or_default();
        let event = KeyEvent {
            event: "created",
            key_id: r.key_id.clone(),
        };
        (Reply::json(201, body), Some(event))
    }

    /// One page of keys, newest first: the caller's own, or (for an administrator) every
    /// key or one owner's. One row more than the page is read, to tell whether a next exists.
    pub async fn list(&self, query: Option<&str>) -> Reply {
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
        let keys: Vec<KeyInfo> = keys.iter().map(KeyInfo::of).collect();
        let body = serde_json::json!({ "keys": keys, "next": next.flatten() });
        Reply::json(200, serde_json::to_vec(&body).unwrap_or_default())
    }

    pub async fn revoke(&self, id: &str) -> (Reply, Option<KeyEvent>) {
        let not_found = || Reply::error(404, "not_found", None);
        let Some(key_id) = KeyId::parse(id) else {
            return (not_found(), None);
        };
        let record = match self.store.find(key_id.as_str()).await {
            Ok(Some(stored)) => stored.record,
            Ok(None) => return (not_found(), None),
            Err(e) => return (store_failed("find a key", &e), None),
        };
        // Another owner's key is "not found", so ids cannot be probed.
        if !self.is_admin && record.owner.as_deref() != Some(&*self.caller.id) {
            return (not_found(), None);
        }
        if let Err(e) = self.store.revoke(key_id.as_str(), unix_now()).await {
            return (store_failed("revoke a key", &e), None);
        }
        self.evictor.evict(key_id).await;
        // Idempotent: a second revoke answers 204 too, but only the first is an event.
        let event = record.revoked_at.is_none().then_some(KeyEvent {
            event: "revoked",
            key_id: record.key_id,
        });
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
    if !fields.is_empty() {
        return Err("unknown field: only name, scopes and expires_in are accepted".into());
    }
    Ok(KeySpec {
        name,
        scopes,
        expires_in,
        budget: Default::default(),
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
