//! The model policy of services with an `api`: the bodies of the endpoints the gateway reads
//! (chat, completions, embeddings and Responses on `api = "openai"`; Messages and their token
//! counting on `api = "anthropic"`) are checked for the shapes the gateway relies on, then a
//! default model is inserted or an alias replaced, and a streamed chat or completions request
//! is made to report its usage. Everything else in the body goes upstream byte for byte as
//! the client sent it.

#[cfg(test)]
mod agent_tests;
#[cfg(test)]
mod edit_model_tests;
#[cfg(test)]
mod edit_tests;
mod include_usage;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod usage_tests;

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

use super::request::{self as body, BodyError};
use super::Endpoint;
use include_usage::UsageRequest;
pub(crate) use include_usage::MAX_GROWTH as USAGE_MAX_GROWTH;

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
pub(crate) struct Applied {
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
    /// The model policy's edit.
    pub edit: Option<Edit<'m>>,
    /// The model after the policy, borrowed from the body or the policy.
    pub model: Option<Cow<'a, str>>,
    /// A streamed request that does not ask for its usage: the edit that asks for it.
    pub usage: Option<Edit<'static>>,
    /// The most completion tokens the request may use, as it states them (`max_tokens` or
    /// `max_completion_tokens`, times `n` or `best_of` and its prompts; `max_output_tokens` on
    /// Responses; the required `max_tokens` on Messages) or as `plan_capped` inserted them; 0
    /// for embeddings and token counting; `None` when not stated.
    pub completion_cap: Option<u64>,
    /// How many completions it generates (choices × prompts): what an unstated cap is
    /// multiplied by.
    pub completions: u64,
    /// A Responses request run in the background: its generation is fetched later, by calls
    /// the gateway does not meter.
    pub background: bool,
}

/// Up to three places of the body replaced (an insertion when a range is empty), in order and
/// not overlapping: the model's, `stream_options`' and a budget's completion cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit<'m> {
    /// The splices made, by position; the filled ones first.
    splices: [Option<Splice<'m>>; 3],
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Splice<'m> {
    range: Range<usize>,
    with: &'m [u8],
}

impl<'m> Edit<'m> {
    fn splice(range: Range<usize>, with: &'m [u8]) -> Edit<'m> {
        Edit {
            splices: [Some(Splice { range, with }), None, None],
        }
    }

    /// Both edits, one after the other; each was planned on the original body, in a
    /// different member (insertions after the opening brace are all kept).
    pub fn and<'o: 'm>(self, other: Edit<'o>) -> Edit<'m> {
        let mut splices = self.splices;
        let mut free = splices.iter_mut().filter(|s| s.is_none());
        for splice in other.splices.into_iter().flatten() {
            match free.next() {
                Some(slot) => *slot = Some(splice),
                None => debug_assert!(false, "at most three splices"),
            }
        }
        // Stable and small: no allocation; equal starts (insertions) keep their order.
        splices.sort_by_key(|s| s.as_ref().map_or(usize::MAX, |s| s.range.start));
        debug_assert!(splices.windows(2).all(|w| match (&w[0], &w[1]) {
            (Some(a), Some(b)) => a.range.end <= b.range.start,
            _ => true,
        }));
        Edit { splices }
    }

    /// Either edit, or both.
    pub fn merge<'o: 'm>(a: Option<Edit<'m>>, b: Option<Edit<'o>>) -> Option<Edit<'m>> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.and(b)),
            (a, b) => a.or(b),
        }
    }

    fn splices(&self) -> impl DoubleEndedIterator<Item = &Splice<'m>> {
        self.splices.iter().flatten()
    }

    /// How many bytes longer the body gets.
    pub fn growth(&self) -> usize {
        let grows = |s: &Splice| s.with.len().saturating_sub(s.range.len());
        self.splices().map(grows).sum()
    }

    /// A new body: `body` with the edit made.
    pub fn applied_to(&self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(body.len() + self.growth());
        let mut at = 0;
        for splice in self.splices() {
            out.extend_from_slice(&body[at..splice.range.start]);
            out.extend_from_slice(splice.with);
            at = splice.range.end;
        }
        out.extend_from_slice(&body[at..]);
        out
    }

    /// Makes the edit in `body` itself; no allocation when it has `growth()` bytes to spare.
    pub fn apply_in_place(&self, body: &mut Vec<u8>) {
        // The later splice first: the earlier one's range still holds after it.
        for splice in self.splices().rev() {
            body.splice(splice.range.clone(), splice.with.iter().copied());
        }
    }
}

/// Checks a body and applies the model policy to it, as a new body (the usage edit aside).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn apply(
    endpoint: Endpoint,
    body: &[u8],
    models: &Models,
) -> Result<Applied, BodyError> {
    let plan = plan(endpoint, body, models)?;
    Ok(Applied {
        body: plan.edit.map(|edit| edit.applied_to(body)),
        model: plan.model.map(Cow::into_owned),
    })
}

/// The completion cap a budgeted request must have (`[budgets] default_max_tokens`,
/// `unstated_cap`): written into a body that states none, or such a body refused. Built once.
#[derive(Debug, Clone)]
pub(crate) struct CapRule {
    pub(crate) tokens: u64,
    pub(crate) refuse: bool,
    /// Per endpoint (in `Endpoint`'s order), its cap member as inserted after the opening
    /// brace (`"max_completion_tokens":N,` on chat…); empty where nothing is generated.
    inserts: [Vec<u8>; 6],
}

impl CapRule {
    pub(crate) fn new(tokens: u64, refuse: bool) -> CapRule {
        let insert = |e: Endpoint| match e.spec().cap_field {
            Some(field) => format!("\"{field}\":{tokens},").into_bytes(),
            None => Vec::new(),
        };
        CapRule {
            tokens,
            refuse,
            inserts: super::ALL.map(insert),
        }
    }

    /// The member that caps `endpoint`'s completion, and its insertion.
    fn insert(&self, endpoint: Endpoint) -> Option<(&'static str, &[u8])> {
        let field = endpoint.spec().cap_field?;
        Some((field, &self.inserts[endpoint as usize]))
    }

    /// The most bytes the insertion adds.
    pub(crate) fn max_growth(&self) -> usize {
        self.inserts.iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// Checks a body and says what the policy changes in it.
pub fn plan<'a, 'm: 'a>(
    endpoint: Endpoint,
    body: &'a [u8],
    models: &'m Models,
) -> Result<Plan<'a, 'm>, BodyError> {
    plan_capped(endpoint, body, models, None)
}

/// `plan`, for a caller with a token budget when `cap` is given: a request that states no
/// completion cap gets `cap`'s (or is refused), so its reservation is a true worst case.
pub(crate) fn plan_capped<'a, 'm: 'a>(
    endpoint: Endpoint,
    body: &'a [u8],
    models: &'m Models,
    cap: Option<&'m CapRule>,
) -> Result<Plan<'a, 'm>, BodyError> {
    let scanned = body::scan(endpoint, body)?;
    // Only chat and completions streams report usage on request; the Responses and Messages
    // streams always do.
    let usage = if scanned.stream && endpoint.spec().usage_on_request {
        let options =
            match scanned.stream_options {
                true => Some(body::member(body, "stream_options").ok_or_else(|| {
                    BodyError::new("stream_options must be an object".to_string())
                })?),
                false => None,
            };
        match include_usage::plan(body, options, after_brace(body))? {
            UsageRequest::Missing { range, with } => Some(Edit::splice(range, with)),
            UsageRequest::Asked => None,
        }
    } else {
        None
    };
    let (completion_cap, cap_edit) = match (endpoint.generates(), scanned.max_tokens) {
        (false, _) => (Some(0), None),
        (true, Some(_)) => (scanned.completion_cap(), None),
        (true, None) => match cap.and_then(|c| Some((c, c.insert(endpoint)?))) {
            Some((rule, (field, _))) if rule.refuse => {
                return Err(BodyError::new(format!(
                    "{field} is required: the caller's token budget needs a completion cap"
                )));
            }
            Some((rule, (_, insert))) => {
                let at = after_brace(body);
                let worst = rule.tokens.saturating_mul(scanned.completions());
                (Some(worst), Some(Edit::splice(at..at, insert)))
            }
            None => (None, None),
        },
    };
    let (completions, background) = (scanned.completions(), scanned.background);
    let (edit, model) = model_edit(scanned.model, body, models);
    Ok(Plan {
        edit: Edit::merge(edit, cap_edit),
        model,
        usage,
        completion_cap,
        completions,
        background,
    })
}

/// The model policy's edit of a body and the model after it.
fn model_edit<'a, 'm: 'a>(
    model: Option<body::Model<'a>>,
    body: &'a [u8],
    models: &'m Models,
) -> (Option<Edit<'m>>, Option<Cow<'a, str>>) {
    let plan = match model {
        Some(body::Model {
            token,
            name: Some(name),
        }) => match models.aliases.get(&*name) {
            Some(target) => (
                // An alias to the name as the body spells it changes nothing.
                (token.as_bytes() != target.token)
                    .then(|| Edit::splice(range_of(body, token), &target.token)),
                Some(Cow::Borrowed(target.name.as_str())),
            ),
            None => (None, Some(name)),
        },
        // No model, or `null`: the default goes in (in the null's place), or nothing changes.
        absent => match &models.default {
            None => (None, None),
            Some(default) => {
                let edit = match absent {
                    Some(null) => Edit::splice(range_of(body, null.token), &default.token),
                    None => {
                        let at = after_brace(body);
                        Edit::splice(at..at, &default.insert)
                    }
                };
                (Some(edit), Some(Cow::Borrowed(default.name.as_str())))
            }
        },
    };
    plan
}

/// Where, in `body`, the default goes: right after its opening brace.
fn after_brace(body: &[u8]) -> usize {
    // The body was checked to be an object: only JSON whitespace comes before its brace, and
    // it is never empty (it holds `messages`, `prompt` or `input`, or on Responses `input`),
    // so the inserted trailing comma is right.
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
