//! `stream_options.include_usage` on streamed chat and completion requests: without it an
//! OpenAI-compatible server streams no usage at all, so the gateway turns it on (and removes
//! what that adds from the client's stream, see `usage::strip`). The edit is one splice of a
//! fixed text into the body: the rest goes upstream byte for byte.

use std::ops::Range;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::BodyError;

/// The member inserted after the body's opening brace when it has no `stream_options`.
const MEMBER: &[u8] = br#""stream_options":{"include_usage":true},"#;
/// What replaces a `stream_options` that is `null` or `{}`.
const OBJECT: &[u8] = br#"{"include_usage":true}"#;
/// What goes after the brace of a `stream_options` object that lacks `include_usage`.
const FIRST_MEMBER: &[u8] = br#""include_usage":true,"#;
/// What replaces an `include_usage` that is `false` or `null`.
const TRUE: &[u8] = b"true";

/// The most bytes turning usage on adds to a body.
pub(crate) const MAX_GROWTH: usize = MEMBER.len();

/// What a streamed request needs for its usage to be reported: nothing (it asked itself),
/// or this splice (`range` of the body replaced by `with`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum UsageRequest {
    Asked,
    Missing {
        range: Range<usize>,
        with: &'static [u8],
    },
}

/// Where `stream_options` (the token `options`, a slice of `body`, if present) must change
/// so that `include_usage` is true. `after_brace`: where a new top-level member goes.
pub(super) fn plan(
    body: &[u8],
    options: Option<&str>,
    after_brace: usize,
) -> Result<UsageRequest, BodyError> {
    let Some(options) = options else {
        return Ok(UsageRequest::Missing {
            range: after_brace..after_brace,
            with: MEMBER,
        });
    };
    let whole = super::range_of(body, options);
    if options == "null" {
        return Ok(UsageRequest::Missing {
            range: whole,
            with: OBJECT,
        });
    }
    // The body was checked (`body::fields::StreamOptions`): only its shape is read here.
    let mut de = serde_json::Deserializer::from_str(options);
    let found = (de.deserialize_map(OptionsVisitor))
        .map_err(|_| BodyError::new("stream_options must be an object".to_string()))?;
    Ok(match found {
        Options::Empty => UsageRequest::Missing {
            range: whole,
            with: OBJECT,
        },
        Options::Without => {
            let brace = whole.start + options.find('{').map_or(0, |i| i + 1);
            UsageRequest::Missing {
                range: brace..brace,
                with: FIRST_MEMBER,
            }
        }
        Options::On => UsageRequest::Asked,
        Options::Off(token) => UsageRequest::Missing {
            range: super::range_of(body, token),
            with: TRUE,
        },
    })
}

/// What a `stream_options` object says of `include_usage`.
enum Options<'a> {
    /// `{}`.
    Empty,
    /// Other members, no `include_usage`.
    Without,
    On,
    /// `false` or `null` (checked before): this token.
    Off(&'a str),
}

struct OptionsVisitor;

impl<'de> Visitor<'de> for OptionsVisitor {
    type Value = Options<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Options<'de>, A::Error> {
        let mut found = Options::Empty;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let value: &'de RawValue = map.next_value()?;
            found = match (key == "include_usage", value.get()) {
                (false, _) if matches!(found, Options::Empty) => Options::Without,
                (false, _) => found,
                (true, "true") => Options::On,
                (true, token) => Options::Off(token),
            };
        }
        Ok(found)
    }
}
