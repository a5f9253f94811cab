//! The claims the gateway reads from a verified access token. The registered claims
//! (`exp`, `nbf`, `iss`, `aud`, `sub`) are checked by jsonwebtoken before these are used.

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::scope::Scope;

#[derive(Deserialize)]
pub(crate) struct Claims {
    pub sub: String,
    exp: serde_json::Number,
    /// RFC 9068 / RFC 6749: one space-separated string.
    scope: Option<String>,
    /// Okta sends an array, Entra ID a string.
    scp: Option<ScopeList>,
    /// Auth0 sends an array.
    permissions: Option<ScopeList>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScopeList {
    Spaced(String),
    List(Vec<String>),
}

impl Claims {
    /// `exp` in whole seconds, rounded down so a cache entry never outlives the token.
    pub(crate) fn exp(&self) -> Option<i64> {
        self.exp
            .as_i64()
            .or_else(|| self.exp.as_f64().map(|f| f.floor() as i64))
    }

    /// The union of `scope`, `scp` and `permissions`, sorted and without duplicates.
    pub(crate) fn scopes(&self) -> Box<[Box<str>]> {
        let mut all = BTreeSet::new();
        if let Some(s) = &self.scope {
            all.extend(s.split_ascii_whitespace());
        }
        for list in [&self.scp, &self.permissions].into_iter().flatten() {
            match list {
                ScopeList::Spaced(s) => all.extend(s.split_ascii_whitespace()),
                ScopeList::List(v) => {
                    all.extend(v.iter().map(String::as_str).filter(|s| !s.is_empty()))
                }
            }
        }
        // Only well-formed scope tokens (RFC 6749 §3.3): an array element such as "\nx" or
        // "a b" is not a scope (fuzzing found one carried through as given).
        all.into_iter()
            .filter(|s| Scope::is_token(s))
            .map(Box::from)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scopes(v: serde_json::Value) -> Option<Vec<String>> {
        let c: Claims = serde_json::from_value(v).ok()?;
        Some(c.scopes().iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn scopes_from_every_claim_shape_are_united() {
        let base = |extra: serde_json::Value| {
            let mut v = json!({"sub": "u", "exp": 1});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            v
        };
        assert_eq!(scopes(base(json!({}))).unwrap(), Vec::<String>::new());
        assert_eq!(
            scopes(base(json!({"scope": " infer  chatx "}))).unwrap(),
            ["chatx", "infer"]
        );
        assert_eq!(
            scopes(base(
                json!({"scope": "a b", "scp": ["b", "c", ""], "permissions": "d a"})
            ))
            .unwrap(),
            ["a", "b", "c", "d"]
        );
        // Array elements that are not one scope token are dropped, not kept as given.
        assert_eq!(
            scopes(base(json!({"scp": ["\nx", "a b", "q\"", "ok", "\u{1}"]}))).unwrap(),
            ["ok"]
        );
        assert_eq!(
            scopes(base(
                json!({"scope": null, "scp": "x", "permissions": ["y"]})
            ))
            .unwrap(),
            ["x", "y"]
        );
        // A shape that is neither a string nor a list of strings voids the token.
        assert!(scopes(base(json!({"scp": [1, 2]}))).is_none());
        assert!(scopes(base(json!({"scope": ["a"]}))).is_none());
    }

    #[test]
    fn exp_is_read_as_whole_seconds() {
        let c: Claims = serde_json::from_value(json!({"sub": "u", "exp": 1700000000.9})).unwrap();
        assert_eq!(c.exp(), Some(1700000000));
        let c: Claims = serde_json::from_value(json!({"sub": "u", "exp": 1700000000})).unwrap();
        assert_eq!(c.exp(), Some(1700000000));
    }
}
