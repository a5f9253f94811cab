//! A captured `usage` object, parsed: the counts the gateway records, wherever the APIs put
//! them (chat and completions: `prompt_tokens`, `completion_tokens` and their `_details`;
//! the Responses API: `input_tokens`, `output_tokens` and theirs; Anthropic's Messages API:
//! `input_tokens` and `output_tokens`, with the cached prompt counted apart, in
//! `cache_creation_input_tokens` and `cache_read_input_tokens`).

use std::fmt;

use serde::de::{
    self, Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

use super::Usage;

/// Parses a captured `usage` object; `None` when it is not a valid JSON object.
pub(super) fn parse_usage(object: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<UsageObject>(object)
        .ok()
        .map(|UsageObject(usage)| usage)
}

/// A `usage` object as sent: unknown members are skipped without allocating, a duplicated
/// member takes its last value, and a count that is not a non-negative integer is `None`.
struct UsageObject(Usage);

impl<'de> Deserialize<'de> for UsageObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = UsageObject;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a usage object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UsageObject, A::Error> {
                // Each count under either API's name; the chat name wins when both are sent.
                let (mut prompt, mut input) = (None, None);
                let (mut completion, mut output) = (None, None);
                let (mut prompt_details, mut input_details) = (None, None);
                let (mut cache_written, mut cache_read) = (None, None);
                let (mut completion_details, mut output_details) = (None, None);
                while let Some(member) = map.next_key::<Member>()? {
                    let slot = match member {
                        Member::Prompt => &mut prompt,
                        Member::Input => &mut input,
                        Member::Completion => &mut completion,
                        Member::Output => &mut output,
                        Member::CacheCreation => &mut cache_written,
                        Member::CacheRead => &mut cache_read,
                        Member::PromptDetails => {
                            prompt_details = Some(map.next_value_seed(Details("cached_tokens"))?);
                            continue;
                        }
                        Member::InputDetails => {
                            input_details = Some(map.next_value_seed(Details("cached_tokens"))?);
                            continue;
                        }
                        Member::CompletionDetails => {
                            let seed = Details("reasoning_tokens");
                            completion_details = Some(map.next_value_seed(seed)?);
                            continue;
                        }
                        Member::OutputDetails => {
                            let seed = Details("reasoning_tokens");
                            output_details = Some(map.next_value_seed(seed)?);
                            continue;
                        }
                        Member::Other => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = Some(map.next_value::<Count>()?.0);
                }
                // Anthropic's `input_tokens` leaves out the prompt tokens read from or written
                // to its cache: the prompt is all three.
                let (cache_written, cache_read) = (cache_written.flatten(), cache_read.flatten());
                let cached = cache_written
                    .unwrap_or(0)
                    .saturating_add(cache_read.unwrap_or(0));
                let input = input.map(|input| input.map(|n| n.saturating_add(cached)));
                Ok(UsageObject(Usage {
                    prompt_tokens: prompt.or(input).flatten(),
                    completion_tokens: completion.or(output).flatten(),
                    reasoning_tokens: completion_details.or(output_details).flatten(),
                    cached_tokens: prompt_details.or(input_details).flatten().or(cache_read),
                }))
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// A `…_tokens_details` object, read for its one count named `.0` (`cached_tokens` in the
/// prompt's, `reasoning_tokens` in the completion's). Anything but an object counts nothing.
struct Details(&'static str);

impl<'de> DeserializeSeed<'de> for Details {
    type Value = Option<u64>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<u64>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Details {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<u64>, A::Error> {
        let mut count = None;
        while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if name == self.0 {
                count = map.next_value::<Count>()?.0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(count)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<u64>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }
}

/// The members read, by name.
enum Member {
    Prompt,
    Input,
    Completion,
    Output,
    PromptDetails,
    InputDetails,
    CompletionDetails,
    OutputDetails,
    CacheCreation,
    CacheRead,
    Other,
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MemberVisitor;
        impl Visitor<'_> for MemberVisitor {
            type Value = Member;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Member, E> {
                Ok(match name {
                    "prompt_tokens" => Member::Prompt,
                    "input_tokens" => Member::Input,
                    "completion_tokens" => Member::Completion,
                    "output_tokens" => Member::Output,
                    "prompt_tokens_details" => Member::PromptDetails,
                    "input_tokens_details" => Member::InputDetails,
                    "completion_tokens_details" => Member::CompletionDetails,
                    "output_tokens_details" => Member::OutputDetails,
                    "cache_creation_input_tokens" => Member::CacheCreation,
                    "cache_read_input_tokens" => Member::CacheRead,
                    _ => Member::Other,
                })
            }
        }
        deserializer.deserialize_identifier(MemberVisitor)
    }
}

/// A token count: `Some` only for an integer in `0..=u64::MAX`; any other value is `None`.
struct Count(Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountVisitor;
        impl<'de> Visitor<'de> for CountVisitor {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Count, E> {
                Ok(Count(Some(n)))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Count, E> {
                Ok(Count(u64::try_from(n).ok()))
            }
            fn visit_u128<E: de::Error>(self, n: u128) -> Result<Count, E> {
                Ok(Count(u64::try_from(n).ok()))
            }
            fn visit_i128<E: de::Error>(self, n: i128) -> Result<Count, E> {
                Ok(Count(u64::try_from(n).ok()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_none<E: de::Error>(self) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Count(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Count, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Count(None))
            }
        }
        deserializer.deserialize_any(CountVisitor)
    }
}
