//! The model policy of `api = "openai"` services: chat and embeddings bodies are checked for
//! the shapes the gateway relies on, then a default model is inserted or an alias replaced.
//! Everything else in the body goes upstream byte for byte as the client sent it.

mod body;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;

/// The requests whose bodies the gateway reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Embeddings,
}

impl Endpoint {
    /// A POST whose path (the part before any '?') ends in "/chat/completions" or
    /// "/embeddings"; anything else is not read.
    pub fn of(method: &http::Method, forwarded_path: &[u8]) -> Option<Endpoint> {
        if method != http::Method::POST {
            return None;
        }
        let path = match forwarded_path.iter().position(|&b| b == b'?') {
            Some(query) => &forwarded_path[..query],
            None => forwarded_path,
        };
        if path.ends_with(b"/chat/completions") {
            Some(Endpoint::Chat)
        } else if path.ends_with(b"/embeddings") {
            Some(Endpoint::Embeddings)
        } else {
            None
        }
    }
}

/// A service's policy, built once at start-up so that `apply` encodes nothing.
#[derive(Debug, Clone)]
pub struct Models {
    default: Option<DefaultModel>,
    /// Alias name (unescaped) -> the model it stands for.
    aliases: HashMap<String, Target>,
}

#[derive(Debug, Clone)]
struct DefaultModel {
    name: String,
    /// `"model":<name>,`, inserted right after the body's opening brace.
    insert: Vec<u8>,
}

#[derive(Debug, Clone)]
struct Target {
    name: String,
    /// The name as a JSON string, quotes included.
    token: Vec<u8>,
}

/// `name` as a JSON string token.
fn json_string(name: &str) -> String {
    serde_json::Value::from(name).to_string()
}

impl Models {
    pub fn new(
        default: Option<String>,
        aliases: impl IntoIterator<Item = (String, String)>,
    ) -> Models {
        let default = default.map(|name| DefaultModel {
            insert: format!("\"model\":{},", json_string(&name)).into_bytes(),
            name,
        });
        let aliases = aliases
            .into_iter()
            .map(|(alias, name)| {
                let token = json_string(&name).into_bytes();
                (alias, Target { name, token })
            })
            .collect();
        Models { default, aliases }
    }
}

/// The outcome of the policy for one valid body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Some(new body) only when the policy changed the body; None means: forward the
    /// original bytes.
    pub body: Option<Vec<u8>>,
    /// The model after the policy (None when the body has no model and there is no default).
    pub model: Option<String>,
}

/// Why a body is refused: the message names the field and never quotes the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError(String);

impl BodyError {
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BodyError {}

/// Checks a chat or embeddings body and applies the policy to it.
pub fn apply(endpoint: Endpoint, body: &[u8], models: &Models) -> Result<Applied, BodyError> {
    let applied = match body::scan(endpoint, body)? {
        None => match &models.default {
            Some(default) => Applied {
                body: Some(insert_default(body, &default.insert)),
                model: Some(default.name.clone()),
            },
            None => Applied {
                body: None,
                model: None,
            },
        },
        Some(model) => match models.aliases.get(&*model.name) {
            Some(target) => Applied {
                body: replace_token(body, model.token, &target.token),
                model: Some(target.name.clone()),
            },
            None => Applied {
                body: None,
                model: Some(model.name.into_owned()),
            },
        },
    };
    Ok(applied)
}

/// `body` with `insert` right after its opening brace.
fn insert_default(body: &[u8], insert: &[u8]) -> Vec<u8> {
    // The body was checked to be an object: only JSON whitespace comes before its brace, and
    // it is never empty (it holds `messages` or `input`), so the trailing comma is right.
    let after_brace = body.iter().position(|&b| b == b'{').map_or(0, |i| i + 1);
    debug_assert!(body[..after_brace.saturating_sub(1)]
        .iter()
        .all(|b| b" \t\n\r".contains(b)));
    let mut out = Vec::with_capacity(body.len() + insert.len());
    out.extend_from_slice(&body[..after_brace]);
    out.extend_from_slice(insert);
    out.extend_from_slice(&body[after_brace..]);
    out
}

/// `body` with `token` (a slice of it) replaced by `with`; None when that changes nothing.
fn replace_token(body: &[u8], token: &str, with: &[u8]) -> Option<Vec<u8>> {
    if token.as_bytes() == with {
        return None;
    }
    let start = token.as_ptr() as usize - body.as_ptr() as usize;
    let end = start + token.len();
    debug_assert!(body.as_ptr_range().contains(&token.as_ptr()) && end <= body.len());
    let mut out = Vec::with_capacity(body.len() - token.len() + with.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(with);
    out.extend_from_slice(&body[end..]);
    Some(out)
}
