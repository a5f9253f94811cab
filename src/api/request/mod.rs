//! One pass over a chat or embeddings body: checks the shapes the gateway relies on and finds
//! the top-level `model` token, without copying the strings it only type-checks.
//!
//! Each checked value is a [`Shape`]: it accepts some kinds of JSON value and refuses the rest
//! with the message naming the field. Values nobody inspects are skipped with [`Skip`].

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::Endpoint;

pub(crate) mod shapes;

use shapes::Stream;

/// The top-level `model` of a body.
#[derive(Debug)]
pub(crate) struct Model<'a> {
    /// The JSON token (a string, quotes included, or `null`), borrowed from the body.
    pub token: &'a str,
    /// The string after unescaping; None for `null`, which stands for no model.
    pub name: Option<Cow<'a, str>>,
}

/// What a valid body holds that the gateway acts on.
#[derive(Debug, Default)]
pub(crate) struct Scanned<'a> {
    pub model: Option<Model<'a>>,
    /// `"stream": true`.
    pub stream: bool,
    /// A `stream_options` member (chat and completions), found valid.
    pub stream_options: bool,
    /// The largest of `max_tokens` and `max_completion_tokens` (chat and completions), when
    /// either is stated.
    pub max_tokens: Option<u64>,
    /// The largest of `n` and `best_of`: completions generated per request (default 1).
    pub choices: Option<u64>,
    /// The prompts of a completions `prompt` (each gets its own choices; default 1).
    pub prompts: Option<u64>,
    /// Responses' `"background": true`: generated server-side, fetched by a later call.
    pub background: bool,
}

impl Scanned<'_> {
    /// How many completions the request generates, each up to its cap: its choices (the
    /// larger of `n` and `best_of`) times its prompts.
    pub(crate) fn completions(&self) -> u64 {
        let choices = self.choices.unwrap_or(1).max(1);
        choices.saturating_mul(self.prompts.unwrap_or(1).max(1))
    }

    /// The most completion tokens the request states it may use: its cap times its
    /// completions; `None` when it states no cap.
    pub(crate) fn completion_cap(&self) -> Option<u64> {
        let per_completion = self.max_tokens?;
        Some(per_completion.saturating_mul(self.completions()))
    }
}

/// Checks `body` and returns what it holds.
pub(crate) fn scan(endpoint: Endpoint, body: &[u8]) -> Result<Scanned<'_>, BodyError> {
    // serde_json skips the strings it ignores without checking their UTF-8, so check it all
    // first (fast, and `from_str` then skips the per-string check).
    let text = std::str::from_utf8(body).map_err(|e| {
        let (line, column) = position(body, e.valid_up_to());
        not_json(line, column)
    })?;
    let problem = Problem::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let top = Check(Top {
        endpoint,
        problem: &problem,
    });
    let model = top
        .deserialize(&mut de)
        .and_then(|model| de.end().map(|()| model));
    // A shape problem was left aside; any other error is one of JSON syntax. serde_json's own
    // data errors quote the body, so none of its texts is ever passed on.
    model.map_err(|e| {
        let shape = problem.0.take();
        shape.unwrap_or_else(|| not_json(e.line(), e.column()))
    })
}

fn not_json(line: usize, column: usize) -> BodyError {
    BodyError(format!(
        "body is not valid JSON (line {line}, column {column})"
    ))
}

/// Line and column of the byte at `index`, counted as serde_json counts them.
fn position(body: &[u8], index: usize) -> (usize, usize) {
    let before = &body[..index.min(body.len())];
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    (line, index - line_start + 1)
}

/// Why a body is refused: the message names the field and never quotes the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError(String);

impl BodyError {
    pub fn new(message: String) -> BodyError {
        BodyError(message)
    }

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

/// Where a shape problem waits for `scan`: a message carried in serde_json's error would get
/// " at line L column C" appended.
#[derive(Default)]
pub(crate) struct Problem(Cell<Option<BodyError>>);

impl Problem {
    /// Leaves `message` for `scan` and returns the error that stops the parse.
    pub(crate) fn raise<E: de::Error>(&self, message: impl Into<String>) -> E {
        self.0.set(Some(BodyError(message.into())));
        E::custom("shape problem")
    }
}

/// A checked value. The kinds of value a shape does not override are refused with `wrong_type`.
pub(crate) trait Shape<'de>: Sized {
    type Value;

    fn problem(&self) -> &Problem;

    /// The message when the value is of a kind this shape does not accept.
    fn wrong_type(&self) -> String;

    fn refuse<E: de::Error>(&self) -> E {
        self.problem().raise(self.wrong_type())
    }
    fn string<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(self.refuse())
    }
    /// A string, for shapes that want its value (after unescaping).
    fn text<E: de::Error>(self, _value: &str) -> Result<Self::Value, E> {
        self.string()
    }
    /// A number without fraction or exponent that fits i64 or u64.
    fn integer<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(self.refuse())
    }
    /// A non-negative integer, for shapes that want its value.
    fn unsigned<E: de::Error>(self, _value: u64) -> Result<Self::Value, E> {
        self.integer()
    }
    /// Any other number.
    fn float<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(self.refuse())
    }
    fn boolean<E: de::Error>(self, _value: bool) -> Result<Self::Value, E> {
        Err(self.refuse())
    }
    fn null<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(self.refuse())
    }
    fn array<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.refuse())
    }
    fn object<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.refuse())
    }
}

/// Runs a shape as the serde visitor (and seed) of one value.
pub(crate) struct Check<S>(pub(crate) S);

impl<'de, S: Shape<'de>> DeserializeSeed<'de> for Check<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, S: Shape<'de>> Visitor<'de> for Check<S> {
    type Value = S::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0.wrong_type())
    }
    fn visit_bool<E: de::Error>(self, value: bool) -> Result<S::Value, E> {
        self.0.boolean(value)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<S::Value, E> {
        self.0.integer()
    }
    fn visit_u64<E: de::Error>(self, value: u64) -> Result<S::Value, E> {
        self.0.unsigned(value)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<S::Value, E> {
        self.0.float()
    }
    // Borrowed and escaped strings both end here; neither is copied into a String.
    fn visit_str<E: de::Error>(self, value: &str) -> Result<S::Value, E> {
        self.0.text(value)
    }
    fn visit_unit<E: de::Error>(self) -> Result<S::Value, E> {
        self.0.null()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<S::Value, A::Error> {
        self.0.array(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<S::Value, A::Error> {
        self.0.object(map)
    }
}

/// Skips a value nobody inspects. Not `IgnoredAny`: serde_json skips that one without any
/// depth limit, so a body nested too deep would pass; through `deserialize_any` its nesting
/// limit (128) holds everywhere. Strings are still borrowed, never copied into a String.
pub(crate) struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry_seed(Skip, Skip)?.is_some() {}
        Ok(())
    }
}

/// A string after unescaping, borrowed from the body when it has no escapes.
pub(crate) struct Text<'de>(pub(crate) Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

/// Marks `key` as seen, refusing a second copy: an upstream might read the other one.
pub(crate) fn first_time<E: de::Error>(
    seen: &mut bool,
    problem: &Problem,
    key: impl FnOnce() -> String,
) -> Result<(), E> {
    if std::mem::replace(seen, true) {
        return Err(problem.raise(format!("{} appears more than once", key())));
    }
    Ok(())
}

/// The whole body.
struct Top<'p> {
    endpoint: Endpoint,
    problem: &'p Problem,
}

impl<'de> Shape<'de> for Top<'_> {
    type Value = Scanned<'de>;

    fn problem(&self) -> &Problem {
        self.problem
    }
    fn wrong_type(&self) -> String {
        "body must be a JSON object".into()
    }

    fn object<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let p = self.problem;
        let endpoint = self.endpoint;
        let spec = endpoint.spec();
        let mut found = Scanned::default();
        let mut seen = Seen::default();
        while let Some(Text(key)) = map.next_key()? {
            match key.as_ref() {
                "model" => {
                    first_time(&mut seen.model, p, || "model".into())?;
                    let token: &'de RawValue = map.next_value()?;
                    found.model = Some(
                        model_of(token.get())
                            .ok_or_else(|| p.raise::<A::Error>("model must be a string"))?,
                    );
                }
                // The endpoints that generate have a streamed variant.
                "stream" if spec.generates => {
                    first_time(&mut seen.stream, p, || "stream".into())?;
                    found.stream = map.next_value_seed(Check(Stream(p)))?;
                }
                _ => super::read_member(endpoint, &key, &mut map, p, &mut seen, &mut found)?,
            }
        }
        // A stored prompt template (Responses' `prompt`) or vLLM's `prompt_embeds` may stand
        // in for the required member.
        if !seen.required && !seen.alternative {
            return Err(p.raise(format!("{} is required", spec.required)));
        }
        if spec.cap_required && found.max_tokens.is_none() {
            return Err(p.raise(format!(
                "{} is required",
                spec.cap_field.unwrap_or_default()
            )));
        }
        Ok(found)
    }
}

/// The members met so far in a body: a second copy of one is refused.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) model: bool,
    pub(crate) stream: bool,
    pub(crate) options: bool,
    /// The endpoint's required member (`messages`, `input` or `prompt`).
    pub(crate) required: bool,
    /// What stands in for it: vLLM's `prompt_embeds`, a Responses `prompt` template.
    pub(crate) alternative: bool,
    /// `max_tokens`, `max_completion_tokens`, `n`, `best_of` (Responses' `max_output_tokens`
    /// and Messages' `max_tokens` in the first slot), and Messages' `system`.
    pub(crate) counts: [bool; 4],
    pub(crate) system: bool,
    /// Responses' `input` and `prompt` members, even when `null`.
    pub(crate) input: bool,
    pub(crate) prompt: bool,
    pub(crate) background: bool,
}

/// The token of the top-level member `name` of a body `scan` found valid (its key compared
/// unescaped, as `scan` does); a second pass, for the rare member whose place is needed.
pub(crate) fn member<'a>(body: &'a [u8], name: &str) -> Option<&'a str> {
    struct Find<'n>(&'n str);
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = Option<&'de str>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(Text(key)) = map.next_key()? {
                if key == self.0 {
                    found = Some(map.next_value::<&'de RawValue>()?.get());
                } else {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let text = std::str::from_utf8(body).ok()?;
    serde_json::Deserializer::from_str(text)
        .deserialize_map(Find(name))
        .ok()
        .flatten()
}

/// The model in a JSON token that serde_json has already checked, if it is a string or null
/// (an optional member given as `null` is absent to the OpenAI API).
fn model_of(token: &str) -> Option<Model<'_>> {
    if token == "null" {
        return Some(Model { token, name: None });
    }
    if !token.starts_with('"') {
        return None;
    }
    let Text(name) = serde_json::from_str(token).ok()?;
    Some(Model {
        token,
        name: Some(name),
    })
}

#[cfg(test)]
mod tests {
    //! What skipped values are refused for: serde_json's parse, wherever the value is.
    use super::*;

    fn scanned(endpoint: Endpoint, body: &[u8]) -> Result<String, String> {
        let found = scan(endpoint, body);
        found.map(|s| format!("{s:?}")).map_err(|e| e.to_string())
    }

    /// Responses bodies with `value` skipped at the top and inside an input item, and a
    /// Messages body with it inside a content block.
    fn bodies(value: &str) -> [(Endpoint, String); 3] {
        [
            (
                Endpoint::Responses,
                format!(r#"{{"model":"m","input":"hi","metadata":{value}}}"#),
            ),
            (
                Endpoint::Responses,
                format!(r#"{{"input":[{{"type":"message","content":{value}}}]}}"#),
            ),
            (
                Endpoint::Messages,
                format!(
                    r#"{{"max_tokens":1,"messages":[{{"role":"user","content":[{{"type":"text","text":{value}}}]}}]}}"#
                ),
            ),
        ]
    }

    fn accepted(value: &str) {
        for (endpoint, body) in bodies(value) {
            assert!(scanned(endpoint, body.as_bytes()).is_ok(), "{body}");
        }
    }

    fn refused(value: &str) {
        for (endpoint, body) in bodies(value) {
            let message = scanned(endpoint, body.as_bytes()).expect_err(&body);
            assert!(
                message.starts_with("body is not valid JSON"),
                "{body}: {message}"
            );
        }
    }

    #[test]
    fn nesting_is_refused_where_serde_json_refuses_it() {
        for (endpoint, body) in bodies("[]") {
            let mut refused = false;
            for depth in 100..140 {
                let value = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
                let deep = body.replace("[]", &value);
                let parsed = serde_json::from_str::<serde_json::Value>(&deep).is_ok();
                assert_eq!(
                    scanned(endpoint, deep.as_bytes()).is_ok(),
                    parsed,
                    "{depth}"
                );
                refused |= !parsed;
            }
            assert!(refused, "{body}");
        }
    }

    #[test]
    fn skipped_strings_are_checked() {
        for valid in [
            r#""plain""#,
            r#""\" \\ \/ \b \f \n \r \t""#,
            r#""\u00fc\u20AC""#,
            r#""\uD83D\uDE00""#,
            r#""\\uD800""#,
            r#"{"\uD83D\uDE00":"ü"}"#,
        ] {
            accepted(valid);
        }
        for invalid in [
            r#""\x""#,
            r#""\u12G4""#,
            r#""\u12""#,
            r#""\uD800""#,
            r#""\uDC00""#,
            r#""\uD800\u0041""#,
            r#""\uD800\n""#,
            r#""\uDE00\uD83D""#,
            r#"{"\uD800":1}"#,
            "\"tab\there\"",
            "\"new\nline\"",
            r#""unterminated"#,
        ] {
            refused(invalid);
        }
    }

    #[test]
    fn invalid_utf8_in_a_skipped_string_is_refused() {
        let body = b"{\"model\":\"m\",\"input\":\"hi\",\"metadata\":\"\xff\xfe\"}";
        assert_eq!(
            scanned(Endpoint::Responses, body),
            Err("body is not valid JSON (line 1, column 39)".to_string())
        );
        let body = b"{\"input\":[{\"type\":\"message\",\"content\":\"ok \xc3\"}]}";
        assert!(scanned(Endpoint::Responses, body).is_err());
    }

    #[test]
    fn skipped_numbers_and_literals_are_checked() {
        for valid in [
            "0", "-0", "12", "-1.5E+3", "1e-999", "1.5e308", "true", "false", "null",
        ] {
            accepted(valid);
        }
        accepted(&"9".repeat(308));
        for invalid in [
            "01", "1.", ".5", "-", "+1", "1e", "1e+", "0x10", "1e309", "-1e400", "tru", "nul",
            "True", "NaN",
        ] {
            refused(invalid);
        }
        refused(&"9".repeat(400));
    }
}
