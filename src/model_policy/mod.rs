//! The model policy of `api = "openai"` services: chat and embeddings bodies are checked for
//! the shapes the gateway relies on, then a default model is inserted or an alias replaced.
//! Everything else in the body goes upstream byte for byte as the client sent it.

mod body;
#[cfg(test)]
mod edit_tests;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

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
    /// The most bytes an edit can add to a body (see `Edit::growth`).
    max_growth: usize,
}

#[derive(Debug, Clone)]
struct DefaultModel {
    name: String,
    /// `"model":<name>,`, inserted right after the body's opening brace.
    insert: Vec<u8>,
    /// The name as a JSON string, quotes included: what replaces a `null` model.
    token: Vec<u8>,
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
        let default = default.map(|name| {
            let token = json_string(&name);
            DefaultModel {
                insert: format!("\"model\":{token},").into_bytes(),
                token: token.into_bytes(),
                name,
            }
        });
        let aliases: HashMap<String, Target> = aliases
            .into_iter()
            .map(|(alias, name)| {
                let token = json_string(&name).into_bytes();
                (alias, Target { name, token })
            })
            .collect();
        let max_growth = (default.iter())
            .map(|d| d.insert.len().max(d.token.len()))
            .chain(aliases.values().map(|t| t.token.len()))
            .max()
            .unwrap_or(0);
        Models {
            default,
            aliases,
            max_growth,
        }
    }

    /// The most bytes the policy can add to a body: room a held body keeps for its edit.
    pub fn max_growth(&self) -> usize {
        self.max_growth
    }
}

/// The outcome of the policy for one valid body, as a new body (what the tests and the fuzz
/// invariants check; the proxy edits in place through `plan`).
#[cfg(any(test, feature = "fuzzing"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Some(new body) only when the policy changed the body; None means: forward the
    /// original bytes.
    pub body: Option<Vec<u8>>,
    /// The model after the policy (None when the body has no model and there is no default).
    pub model: Option<String>,
}

/// The outcome of the policy for one valid body, as the edit to make: a body held whole is
/// changed where it lies, never copied.
#[derive(Debug)]
pub struct Plan<'a, 'm> {
    pub edit: Option<Edit<'m>>,
    /// The model after the policy, borrowed from the body or the policy.
    pub model: Option<Cow<'a, str>>,
}

/// Bytes `range` of the body replaced by `with`: an insertion when the range is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit<'m> {
    range: Range<usize>,
    with: &'m [u8],
}

impl Edit<'_> {
    /// How many bytes longer the body gets; at most `Models::max_growth`.
    pub fn growth(&self) -> usize {
        self.with.len().saturating_sub(self.range.len())
    }

    /// A new body: `body` with the edit made.
    pub fn applied_to(&self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(body.len() + self.growth());
        out.extend_from_slice(&body[..self.range.start]);
        out.extend_from_slice(self.with);
        out.extend_from_slice(&body[self.range.end..]);
        out
    }

    /// Makes the edit in `body` itself; no allocation when it has `growth()` bytes to spare.
    pub fn apply_in_place(&self, body: &mut Vec<u8>) {
        body.splice(self.range.clone(), self.with.iter().copied());
    }
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

/// Checks a chat or embeddings body and applies the policy to it, as a new body.
#[cfg(any(test, feature = "fuzzing"))]
pub fn apply(endpoint: Endpoint, body: &[u8], models: &Models) -> Result<Applied, BodyError> {
    let plan = plan(endpoint, body, models)?;
    Ok(Applied {
        body: plan.edit.map(|edit| edit.applied_to(body)),
        model: plan.model.map(Cow::into_owned),
    })
}

/// Checks a chat or embeddings body and says what the policy changes in it.
pub fn plan<'a, 'm: 'a>(
    endpoint: Endpoint,
    body: &'a [u8],
    models: &'m Models,
) -> Result<Plan<'a, 'm>, BodyError> {
    let plan = match body::scan(endpoint, body)? {
        Some(body::Model {
            token,
            name: Some(name),
        }) => match models.aliases.get(&*name) {
            Some(target) => Plan {
                // An alias to the name as the body spells it changes nothing.
                edit: (token.as_bytes() != target.token).then(|| Edit {
                    range: range_of(body, token),
                    with: &target.token,
                }),
                model: Some(Cow::Borrowed(&target.name)),
            },
            None => Plan {
                edit: None,
                model: Some(name),
            },
        },
        // No model, or `null`: the default goes in (in the null's place), or nothing changes.
        absent => match &models.default {
            None => Plan {
                edit: None,
                model: None,
            },
            Some(default) => {
                let edit = match absent {
                    Some(null) => Edit {
                        range: range_of(body, null.token),
                        with: &default.token,
                    },
                    None => {
                        let at = after_brace(body);
                        Edit {
                            range: at..at,
                            with: &default.insert,
                        }
                    }
                };
                Plan {
                    edit: Some(edit),
                    model: Some(Cow::Borrowed(&default.name)),
                }
            }
        },
    };
    Ok(plan)
}

/// Where, in `body`, the default goes: right after its opening brace.
fn after_brace(body: &[u8]) -> usize {
    // The body was checked to be an object: only JSON whitespace comes before its brace, and
    // it is never empty (it holds `messages` or `input`), so the inserted trailing comma is
    // right.
    let after = body.iter().position(|&b| b == b'{').map_or(0, |i| i + 1);
    debug_assert!(body[..after.saturating_sub(1)]
        .iter()
        .all(|b| b" \t\n\r".contains(b)));
    after
}

/// The position of `token`, a slice of `body`.
fn range_of(body: &[u8], token: &str) -> Range<usize> {
    let start = token.as_ptr() as usize - body.as_ptr() as usize;
    debug_assert!(body.as_ptr_range().contains(&token.as_ptr()));
    debug_assert!(start + token.len() <= body.len());
    start..start + token.len()
}
