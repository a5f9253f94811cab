//! The model policy's body validator and rewriter.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

use super::agent_bodies::{
    self, ANTHROPIC_ERRORS, MESSAGES_ERRORS, RESPONSES_ERRORS, RESPONSES_STREAM,
};
use crate::api::{self, Applied, BodyError, Endpoint, Models};

/// The policy `model_body` applies besides none at all: a default, an alias, an alias to
/// itself (a body naming it is left alone) and one whose name and target need JSON escapes.
const DEFAULT_MODEL: &str = "default-model";
const ALIASES: [(&str, &str); 3] = [
    ("fast", "gpt-4o-mini"),
    ("same", "same"),
    ("q\"\u{e9}", "org/model \"v2\"\u{2028}\\"),
];

/// Every message a refused body can get, digits written `N`: a message outside this list
/// might quote the body.
const BODY_ERRORS: [&str; 4] = [
    "body is not valid JSON (line N, column N)",
    "body must be a JSON object",
    "model appears more than once",
    "model must be a string",
];
/// What chat and completions bodies can both get for `stream` and `stream_options`.
const STREAM_ERRORS: [&str; 6] = [
    "stream appears more than once",
    "stream must be a boolean",
    "stream_options appears more than once",
    "stream_options must be an object",
    "stream_options.include_usage appears more than once",
    "stream_options.include_usage must be a boolean",
];
/// What chat and completions bodies can get for the counts budgets reserve from.
const COUNT_ERRORS: [&str; 8] = [
    "max_tokens appears more than once",
    "max_tokens must be a non-negative integer",
    "max_completion_tokens appears more than once",
    "max_completion_tokens must be a non-negative integer",
    "n appears more than once",
    "n must be a non-negative integer",
    "best_of appears more than once",
    "best_of must be a non-negative integer",
];
/// The counts read on chat and completions.
const COUNTS: [&str; 4] = ["max_tokens", "max_completion_tokens", "n", "best_of"];
const CHAT_ERRORS: [&str; 9] = [
    "messages is required",
    "messages appears more than once",
    "messages must be a non-empty array",
    "messages[N] must be an object",
    "messages[N].role appears more than once",
    "messages[N].role must be a string",
    "messages[N].content appears more than once",
    "messages[N].content must be a string, an array of content parts or null",
    "messages[N].content[N] must be an object",
];
const COMPLETIONS_ERRORS: [&str; 3] = [
    "prompt is required",
    "prompt appears more than once",
    "prompt must be a string, an array of strings, an array of integers or an array of \
     integer arrays",
];
const EMBEDDINGS_ERRORS: [&str; 3] = [
    "input is required",
    "input appears more than once",
    "input must be a string, an array of strings, an array of integers or an array of \
     integer arrays",
];
/// `model_policy::apply` on an arbitrary body, for the chat, completions and embeddings
/// endpoints, with and without a policy: it never panics; the policy never changes whether a
/// body is accepted; an accepted body is a JSON object of the promised shape (checked here on
/// serde_json's own reading); a changed body is the original with only its model token
/// replaced or a model inserted; a refusal is one line from a fixed vocabulary, so it never
/// quotes the body.
pub fn model_body(data: &[u8]) {
    bodies(
        data,
        &[Endpoint::Chat, Endpoint::Completions, Endpoint::Embeddings],
    );
}

/// The same invariants on OpenAI Responses bodies.
pub fn responses_body(data: &[u8]) {
    bodies(data, &[Endpoint::Responses]);
}

/// The same invariants on Anthropic Messages and count_tokens bodies.
pub fn messages_body(data: &[u8]) {
    bodies(data, &[Endpoint::Messages, Endpoint::CountTokens]);
}

fn bodies(data: &[u8], endpoints: &[Endpoint]) {
    let none = Models::new(None, []);
    let policy = Models::new(
        Some(DEFAULT_MODEL.to_string()),
        ALIASES.map(|(alias, name)| (alias.to_string(), name.to_string())),
    );
    // What serde_json reads, the reference every outcome is compared with.
    let parsed = serde_json::from_slice::<Value>(data).ok();
    for &endpoint in endpoints {
        let plain = api::apply(endpoint, data, &none);
        let with = api::apply(endpoint, data, &policy);
        let (plain, with) = match (plain, with) {
            (Ok(plain), Ok(with)) => (plain, with),
            (Err(plain), Err(with)) => {
                assert_eq!(plain, with, "the policy changes why a body is refused");
                assert_refusal(endpoint, &plain, data, parsed.as_ref());
                continue;
            }
            (plain, with) => panic!("accepted under one policy only: {plain:?} / {with:?}"),
        };
        let Some(value) = &parsed else {
            panic!("{endpoint:?}: accepted a body serde_json refuses");
        };
        assert!(
            well_shaped(endpoint, value),
            "{endpoint:?}: accepted a body of the wrong shape"
        );
        // A `null` model is no model.
        let model = value
            .get("model")
            .filter(|m| !m.is_null())
            .map(|m| m.as_str().expect("a string model"));
        // Without a policy nothing changes and the model is reported as the body has it.
        assert_eq!(
            plain,
            Applied {
                body: None,
                model: model.map(str::to_string),
            }
        );
        let expected = match model {
            None => DEFAULT_MODEL,
            Some(name) => ALIASES
                .iter()
                .find(|(alias, _)| *alias == name)
                .map_or(name, |(_, target)| target),
        };
        assert_eq!(with.model.as_deref(), Some(expected));
        match &with.body {
            // Left alone: the body already names the model it goes to.
            None => assert_eq!(model, Some(expected), "an alias or default not applied"),
            Some(new) => assert_rewrite(data, value, new, expected),
        }
        assert_usage_asked(endpoint, data, value, &policy, expected);
        assert_completion_cap(endpoint, data, value, &policy);
    }
}

/// The completion tokens a request states it may use, as budgets reserve them: the larger
/// of `max_tokens` and `max_completion_tokens` times the larger of `n` and `best_of` (1 when
/// neither) times the prompts of a completions `prompt` array, none without a cap, 0 on embeddings and token counting; Responses'
/// `max_output_tokens`, Messages' `max_tokens`.
fn assert_completion_cap(endpoint: Endpoint, data: &[u8], value: &Value, policy: &Models) {
    let plan = api::plan(endpoint, data, policy).expect("accepted above");
    let count = |name: &str| value.get(name).and_then(Value::as_u64);
    let larger = |a: Option<u64>, b: Option<u64>| a.max(b);
    let wanted = match endpoint {
        Endpoint::Embeddings | Endpoint::CountTokens => Some(0),
        Endpoint::Responses => count("max_output_tokens"),
        Endpoint::Messages => count("max_tokens"),
        _ => larger(count("max_tokens"), count("max_completion_tokens")).map(|cap| {
            let choices = larger(count("n"), count("best_of")).unwrap_or(1).max(1);
            // One completion per prompt of an array of strings or of token arrays.
            let prompts = match value.get("prompt") {
                Some(Value::Array(items)) if endpoint == Endpoint::Completions => {
                    match items.first() {
                        Some(Value::Number(_)) | None => 1,
                        Some(_) => items.len() as u64,
                    }
                }
                _ => 1,
            };
            cap.saturating_mul(choices).saturating_mul(prompts)
        }),
    };
    assert_eq!(plan.completion_cap, wanted, "{endpoint:?}: completion cap");
}

/// A streamed chat or completions body that does not ask for its usage is made to, and the
/// body the upstream gets (both edits made, copied or in place) means the original with
/// `stream_options.include_usage` true and the policy's model; any other body gets no edit.
fn assert_usage_asked(
    endpoint: Endpoint,
    data: &[u8],
    value: &Value,
    policy: &Models,
    model: &str,
) {
    let plan = api::plan(endpoint, data, policy).expect("accepted above");
    let streamed = value.get("stream") == Some(&Value::Bool(true));
    let asks = value
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        == Some(&Value::Bool(true));
    let classic = matches!(endpoint, Endpoint::Chat | Endpoint::Completions);
    let wanted_edit = streamed && !asks && classic;
    assert_eq!(
        plan.usage.is_some(),
        wanted_edit,
        "{endpoint:?}: include_usage"
    );
    let Some(usage) = plan.usage else {
        return;
    };
    let edit = match plan.edit {
        Some(edit) => edit.and(usage),
        None => usage,
    };
    let new = edit.applied_to(data);
    let mut in_place = data.to_vec();
    in_place.reserve_exact(edit.growth());
    edit.apply_in_place(&mut in_place);
    assert_eq!(in_place, new, "in place and copied differ");
    let mut wanted = value.clone();
    wanted["model"] = Value::from(model);
    if !wanted["stream_options"].is_object() {
        wanted["stream_options"] = Value::Object(Default::default());
    }
    wanted["stream_options"]["include_usage"] = Value::Bool(true);
    let got: Value = serde_json::from_slice(&new).expect("the edited body is JSON");
    assert_eq!(got, wanted, "the edited body means something else");
}

/// A refusal is one line of the fixed vocabulary; "not valid JSON" only when serde_json
/// agrees; and a body serde_json finds well shaped is refused only when it repeats a key
/// somewhere (serde_json keeps the last copy; the policy refuses the repetition, or the
/// first copy when that one is wrong).
fn assert_refusal(endpoint: Endpoint, e: &BodyError, body: &[u8], parsed: Option<&Value>) {
    let message = e.message();
    assert!(!message.contains(['\n', '\r']), "a refusal spans lines");
    // Each run of digits (an index, a line, a column) becomes one `N`.
    let mut shape = String::with_capacity(message.len());
    let mut in_number = false;
    for c in message.chars() {
        if !c.is_ascii_digit() {
            shape.push(c);
        } else if !in_number {
            shape.push('N');
        }
        in_number = c.is_ascii_digit();
    }
    let (for_endpoint, streamed, counts): (&[&str], &[&str], &[&str]) = match endpoint {
        Endpoint::Chat => (&CHAT_ERRORS, &STREAM_ERRORS, &COUNT_ERRORS),
        Endpoint::Completions => (&COMPLETIONS_ERRORS, &STREAM_ERRORS, &COUNT_ERRORS),
        Endpoint::Embeddings => (&EMBEDDINGS_ERRORS, &[], &[]),
        Endpoint::Responses => (&RESPONSES_ERRORS, &RESPONSES_STREAM, &[]),
        Endpoint::Messages => (&ANTHROPIC_ERRORS, &MESSAGES_ERRORS, &[]),
        Endpoint::CountTokens => (&ANTHROPIC_ERRORS, &[], &[]),
    };
    let known = [&BODY_ERRORS[..], for_endpoint, streamed, counts];
    assert!(
        known.iter().any(|list| list.contains(&&*shape)),
        "{endpoint:?}: a refusal outside the vocabulary: {message:?}"
    );
    if let Some(value) = parsed {
        assert!(
            !message.starts_with("body is not valid JSON"),
            "{endpoint:?}: serde_json reads a body refused as not JSON: {message:?}"
        );
        if well_shaped(endpoint, value) && has_unique_keys(body) {
            panic!("{endpoint:?}: a well-shaped body refused: {message:?}");
        }
    }
}

/// Whether serde_json reads `body` as JSON in which no object repeats a key.
fn has_unique_keys(body: &[u8]) -> bool {
    struct Unique;
    impl<'de> Deserialize<'de> for Unique {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(UniqueVisitor)
        }
    }
    struct UniqueVisitor;
    impl<'de> Visitor<'de> for UniqueVisitor {
        type Value = Unique;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("JSON without a repeated key")
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
            while seq.next_element::<Unique>()?.is_some() {}
            Ok(Unique)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
            let mut keys = HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if !keys.insert(key) {
                    return Err(de::Error::custom("a repeated key"));
                }
                map.next_value::<Unique>()?;
            }
            Ok(Unique)
        }
    }
    serde_json::from_slice::<Unique>(body).is_ok()
}

/// The shapes `model_policy` promises, read independently on serde_json's `Value`. The
/// optional members it reads (`model`, `stream`, `stream_options` and its `include_usage`,
/// and on chat and completions the counts `max_tokens`, `max_completion_tokens`, `n` and
/// `best_of`, non-negative integers) may also be `null`, which means absent.
fn well_shaped(endpoint: Endpoint, body: &Value) -> bool {
    let Some(body) = body.as_object() else {
        return false;
    };
    if body
        .get("model")
        .is_some_and(|m| !m.is_string() && !m.is_null())
    {
        return false;
    }
    let integer = |v: &Value| v.is_i64() || v.is_u64();
    // All strings, all integers, or all arrays of integers.
    let tokens = |input: Option<&Value>| match input {
        Some(Value::String(_)) => true,
        Some(Value::Array(items)) => {
            let kind = |v: &Value| match v {
                Value::String(_) => Some(0),
                v if integer(v) => Some(1),
                Value::Array(tokens) if tokens.iter().all(integer) => Some(2),
                _ => None,
            };
            let kinds: Option<Vec<_>> = items.iter().map(kind).collect();
            kinds.is_some_and(|k| k.windows(2).all(|w| w[0] == w[1]))
        }
        _ => false,
    };
    let streams = || {
        let boolean = |v: &Value| v.is_boolean() || v.is_null();
        let count = |v: &Value| v.is_u64() || v.is_null();
        COUNTS.iter().all(|name| body.get(*name).is_none_or(count))
            && body.get("stream").is_none_or(boolean)
            && body.get("stream_options").is_none_or(|o| match o {
                Value::Null => true,
                Value::Object(o) => o.get("include_usage").is_none_or(boolean),
                _ => false,
            })
    };
    match endpoint {
        Endpoint::Chat => {
            let message = |m: &Value| {
                m.as_object().is_some_and(|m| {
                    m.get("role").is_some_and(Value::is_string)
                        && match m.get("content") {
                            None | Some(Value::Null | Value::String(_)) => true,
                            Some(Value::Array(parts)) => parts.iter().all(Value::is_object),
                            Some(_) => false,
                        }
                })
            };
            streams()
                && body
                    .get("messages")
                    .and_then(Value::as_array)
                    .is_some_and(|ms| !ms.is_empty() && ms.iter().all(message))
        }
        Endpoint::Completions => {
            streams()
                && match body.get("prompt") {
                    None => body.contains_key("prompt_embeds"),
                    prompt => tokens(prompt),
                }
        }
        Endpoint::Embeddings => tokens(body.get("input")),
        Endpoint::Responses | Endpoint::Messages | Endpoint::CountTokens => {
            agent_bodies::well_shaped(endpoint, body)
        }
    }
}

/// A changed body means what the original meant with `model` set to `expected`, and differs
/// from it in one place only: the original's model token, or an insertion when it had none.
fn assert_rewrite(original: &[u8], value: &Value, new: &[u8], expected: &str) {
    let new_value: Value = serde_json::from_slice(new).expect("a changed body is JSON");
    let mut wanted = value.clone();
    wanted["model"] = Value::from(expected);
    assert_eq!(new_value, wanted, "a changed body means something else");
    // The bytes outside the change: common prefix and suffix, not overlapping.
    let prefix = common_len(original.iter(), new.iter());
    let suffix = common_len(original[prefix..].iter().rev(), new[prefix..].iter().rev());
    let removed = prefix..original.len() - suffix;
    let added = new.len() - suffix - prefix;
    let new_token = serde_json::to_string(expected).unwrap();
    let model_token = top_level_members(original)
        .expect("an accepted body is an object")
        .into_iter()
        .find(|(key, _)| key == "model");
    match model_token {
        // A default went in and nothing came out. (A `null` model is a token, replaced below.)
        None => {
            assert!(removed.is_empty(), "a default insertion removed bytes");
            assert_eq!(added, format!("\"model\":{new_token},").len());
        }
        // Only bytes of the model token changed, and only to the new token's.
        Some((_, token)) => {
            let start = token.get().as_ptr() as usize - original.as_ptr() as usize;
            let end = start + token.get().len();
            assert!(
                start <= removed.start && removed.end <= end,
                "bytes outside the model token changed"
            );
            assert!(added <= new_token.len());
            assert_eq!(
                new.len() + token.get().len(),
                original.len() + new_token.len()
            );
        }
    }
}

fn common_len<'a>(a: impl Iterator<Item = &'a u8>, b: impl Iterator<Item = &'a u8>) -> usize {
    a.zip(b).take_while(|(x, y)| x == y).count()
}

/// The root object's members in order, duplicates included, each value as its raw text
/// within `body`; None when `body` is not a JSON object (as serde_json reads it).
pub(super) fn top_level_members(body: &[u8]) -> Option<Vec<(String, &RawValue)>> {
    struct Members<'a>(Vec<(String, &'a RawValue)>);
    impl<'de> Deserialize<'de> for Members<'de> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct MembersVisitor;
            impl<'de> Visitor<'de> for MembersVisitor {
                type Value = Members<'de>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Members<'de>, A::Error> {
                    let mut members = Vec::new();
                    while let Some(member) = map.next_entry()? {
                        members.push(member);
                    }
                    Ok(Members(members))
                }
            }
            deserializer.deserialize_map(MembersVisitor)
        }
    }
    serde_json::from_slice::<Members>(body).ok().map(|m| m.0)
}
