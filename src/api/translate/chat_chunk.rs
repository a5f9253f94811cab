//! A chat stream's chunk as the stream converters read it: only the members they use, read in
//! place (strings borrowed unless escaped) rather than built into a `serde_json::Value`, since
//! a converter reads one per token. Every member is optional and of any JSON type: a member
//! of the wrong type reads as absent, as `Value` indexing would read it.
//!
//! Two readers: a one-pass typed read for chunks whose members have their usual types (every
//! server's), and, when that fails, one that reads each level as raw JSON and takes what has
//! the right type.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// Any JSON value, kept as its text until asked for.
type Raw<'a> = Option<&'a RawValue>;

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    id: Raw<'a>,
    #[serde(borrow, default)]
    model: Raw<'a>,
    #[serde(borrow, default)]
    created: Raw<'a>,
    #[serde(borrow, default)]
    choices: Raw<'a>,
    #[serde(borrow, default)]
    usage: Raw<'a>,
    #[serde(borrow, default)]
    error: Raw<'a>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    delta: Raw<'a>,
    #[serde(borrow, default)]
    finish_reason: Raw<'a>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Raw<'a>,
    #[serde(borrow, default)]
    reasoning_content: Raw<'a>,
    #[serde(borrow, default)]
    reasoning: Raw<'a>,
    #[serde(borrow, default)]
    tool_calls: Raw<'a>,
}

#[derive(Deserialize)]
struct Call<'a> {
    #[serde(borrow, default)]
    index: Raw<'a>,
    #[serde(borrow, default)]
    id: Raw<'a>,
    #[serde(borrow, default)]
    function: Raw<'a>,
}

#[derive(Deserialize)]
struct Function<'a> {
    #[serde(borrow, default)]
    name: Raw<'a>,
    #[serde(borrow, default)]
    arguments: Raw<'a>,
}

/// One chat chunk: what its first choice's delta says, and its envelope.
#[derive(Default)]
pub(crate) struct ChatChunk<'a> {
    pub(crate) id: Option<Cow<'a, str>>,
    pub(crate) model: Option<Cow<'a, str>>,
    pub(crate) created: Option<u64>,
    /// The usage, when the chunk carries it (an object).
    pub(crate) usage: Option<Value>,
    /// The error a server streams in place of a chunk.
    pub(crate) error: Option<Value>,
    pub(crate) finish_reason: Option<Cow<'a, str>>,
    /// `reasoning_content` (vLLM, SGLang, DeepSeek) or `reasoning` (Ollama, OpenRouter).
    pub(crate) reasoning: Option<Cow<'a, str>>,
    pub(crate) content: Option<Cow<'a, str>>,
    pub(crate) tool_calls: Vec<CallDelta<'a>>,
}

/// One tool call's part of a delta.
pub(crate) struct CallDelta<'a> {
    pub(crate) index: u64,
    pub(crate) id: Option<Cow<'a, str>>,
    pub(crate) name: Option<Cow<'a, str>>,
    pub(crate) arguments: Option<Cow<'a, str>>,
}

/// The usual shape, read in one pass.
#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow)]
    id: Option<Text<'a>>,
    #[serde(borrow)]
    model: Option<Text<'a>>,
    created: Option<u64>,
    #[serde(borrow)]
    choices: Option<Vec<TypedChoice<'a>>>,
    usage: Option<Value>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct TypedChoice<'a> {
    #[serde(borrow)]
    delta: Option<TypedDelta<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct TypedDelta<'a> {
    #[serde(borrow)]
    content: Option<Text<'a>>,
    #[serde(borrow)]
    reasoning_content: Option<Text<'a>>,
    #[serde(borrow)]
    reasoning: Option<Text<'a>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<TypedCall<'a>>>,
}

#[derive(Deserialize)]
struct TypedCall<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    id: Option<Text<'a>>,
    #[serde(borrow)]
    function: Option<TypedFunction<'a>>,
}

#[derive(Deserialize)]
struct TypedFunction<'a> {
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    arguments: Option<Text<'a>>,
}

impl<'a> ChatChunk<'a> {
    /// The chunk in an event's data; `None` when the data is not a JSON object.
    pub(crate) fn read(data: &'a [u8]) -> Option<ChatChunk<'a>> {
        let data = std::str::from_utf8(data).ok()?.trim_ascii();
        if !data.starts_with('{') {
            return None;
        }
        match serde_json::from_str::<Typed>(data) {
            Ok(typed) if typed.usual() => Some(typed.into()),
            _ => ChatChunk::read_leniently(data),
        }
    }

    fn read_leniently(data: &'a str) -> Option<ChatChunk<'a>> {
        let envelope: Envelope<'a> = read_object(data)?;
        let mut chunk = ChatChunk {
            id: text(envelope.id),
            model: text(envelope.model),
            created: envelope.created.and_then(|c| c.get().parse().ok()),
            usage: envelope.usage.and_then(object),
            error: envelope
                .error
                .and_then(|e| serde_json::from_str(e.get()).ok()),
            ..ChatChunk::default()
        };
        let first = envelope
            .choices
            .and_then(|c| serde_json::from_str::<Vec<&RawValue>>(c.get()).ok())
            .and_then(|choices| choices.first().copied());
        let Some(choice) = first.and_then(|c| read_object::<Choice>(c.get())) else {
            return Some(chunk);
        };
        chunk.finish_reason = text(choice.finish_reason);
        let Some(delta) = choice.delta.and_then(|d| read_object::<Delta>(d.get())) else {
            return Some(chunk);
        };
        chunk.content = text(delta.content);
        chunk.reasoning = text(delta.reasoning_content).or_else(|| text(delta.reasoning));
        let calls = (delta.tool_calls)
            .and_then(|c| serde_json::from_str::<Vec<&RawValue>>(c.get()).ok())
            .unwrap_or_default();
        chunk.tool_calls = calls.into_iter().filter_map(call).collect();
        Some(chunk)
    }
}

impl Typed<'_> {
    /// Its objects were objects (serde would read an array as a struct's members in order)
    /// and its usage an object: else the lenient reader decides.
    fn usual(&self) -> bool {
        self.usage.as_ref().is_none_or(Value::is_object)
    }
}

impl<'a> From<Typed<'a>> for ChatChunk<'a> {
    fn from(typed: Typed<'a>) -> ChatChunk<'a> {
        let mut chunk = ChatChunk {
            id: typed.id.map(|t| t.0),
            model: typed.model.map(|t| t.0),
            created: typed.created,
            usage: typed.usage,
            error: typed.error,
            ..ChatChunk::default()
        };
        let first = typed.choices.and_then(|c| c.into_iter().next());
        let Some(choice) = first else {
            return chunk;
        };
        chunk.finish_reason = choice.finish_reason.map(|t| t.0);
        let Some(delta) = choice.delta else {
            return chunk;
        };
        chunk.content = delta.content.map(|t| t.0);
        chunk.reasoning = delta.reasoning_content.or(delta.reasoning).map(|t| t.0);
        chunk.tool_calls = (delta.tool_calls.into_iter().flatten())
            .map(|call| {
                let (name, arguments) = match call.function {
                    Some(f) => (f.name.map(|t| t.0), f.arguments.map(|t| t.0)),
                    None => (None, None),
                };
                CallDelta {
                    index: call.index.unwrap_or(0),
                    id: call.id.map(|t| t.0),
                    name,
                    arguments,
                }
            })
            .collect();
        chunk
    }
}

/// A tool call's delta; one that is not an object is no call.
fn call(raw: &RawValue) -> Option<CallDelta<'_>> {
    let call: Call = read_object(raw.get())?;
    let function = (call.function).and_then(|f| read_object::<Function>(f.get()));
    Some(CallDelta {
        index: call.index.and_then(|i| i.get().parse().ok()).unwrap_or(0),
        id: text(call.id),
        name: function.as_ref().and_then(|f| text(f.name)),
        arguments: function.and_then(|f| text(f.arguments)),
    })
}

/// The members of a JSON object; anything else (an array too, which serde would read as the
/// struct's members in order) reads as absent.
fn read_object<'a, T: Deserialize<'a>>(json: &'a str) -> Option<T> {
    if !json.starts_with('{') {
        return None;
    }
    serde_json::from_str(json).ok()
}

/// A string, borrowed from the chunk unless it has escapes (`Cow`'s own impl always copies).
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// A string member's text; any other type reads as absent.
fn text(raw: Raw<'_>) -> Option<Cow<'_, str>> {
    let raw = raw?.get();
    if !raw.starts_with('"') {
        return None;
    }
    serde_json::from_str::<Text>(raw).ok().map(|t| t.0)
}

/// An object member's value; any other type reads as absent.
fn object(raw: &RawValue) -> Option<Value> {
    if !raw.get().starts_with('{') {
        return None;
    }
    serde_json::from_str(raw.get()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_read_in_place_and_wrong_types_read_as_absent() {
        let data = br#"{"id":"c1","model":"qwen","created":7,"object":"chat.completion.chunk",
            "choices":[{"index":0,"delta":{"content":"a \"b\"","reasoning_content":"r",
            "tool_calls":[{"index":1,"id":"call_1","function":{"name":"w","arguments":"{\"x\":"}},7]},
            "finish_reason":null}],"usage":{"prompt_tokens":3}}"#;
        let chunk = ChatChunk::read(data).unwrap();
        assert_eq!(chunk.id.as_deref(), Some("c1"));
        assert!(
            matches!(chunk.id, Some(Cow::Borrowed(_))),
            "no copy of plain strings"
        );
        assert_eq!(chunk.created, Some(7));
        assert_eq!(chunk.content.as_deref(), Some("a \"b\""));
        assert_eq!(chunk.reasoning.as_deref(), Some("r"));
        assert_eq!(chunk.finish_reason, None);
        assert_eq!(chunk.usage, Some(serde_json::json!({"prompt_tokens": 3})));
        assert_eq!(chunk.tool_calls.len(), 1);
        let call = &chunk.tool_calls[0];
        assert_eq!((call.index, call.id.as_deref()), (1, Some("call_1")));
        assert_eq!(
            (call.name.as_deref(), call.arguments.as_deref()),
            (Some("w"), Some("{\"x\":"))
        );

        let odd = br#"{"id":5,"choices":{"delta":1},"usage":"many","model":null}"#;
        let chunk = ChatChunk::read(odd).unwrap();
        assert!(chunk.id.is_none() && chunk.model.is_none() && chunk.usage.is_none());
        let odd = br#"{"choices":[{"delta":"x","finish_reason":"stop"}]}"#;
        assert_eq!(
            ChatChunk::read(odd).unwrap().finish_reason.as_deref(),
            Some("stop")
        );
        assert!(ChatChunk::read(b"[1]").is_none());
        assert!(ChatChunk::read(b"not json").is_none());
    }

    #[test]
    fn both_readers_read_a_usual_chunk_alike() {
        let data = r#"{"id":"c1","model":"qwen","created":7,"object":"chat.completion.chunk",
            "choices":[{"index":0,"delta":{"content":"a \"b\"","reasoning_content":"r",
            "tool_calls":[{"index":1,"id":"call_1","function":{"name":"w","arguments":"{\"x\":"}}]},
            "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3}}"#;
        // Everything a converter reads, owned, for comparing.
        let seen = |c: ChatChunk| {
            let own = |t: &Option<Cow<str>>| t.as_deref().map(str::to_string);
            let calls: Vec<_> = (c.tool_calls.iter())
                .map(|t| (t.index, own(&t.id), own(&t.name), own(&t.arguments)))
                .collect();
            let text = [&c.id, &c.model, &c.finish_reason, &c.reasoning, &c.content].map(own);
            (text, c.created, c.usage, c.error, calls)
        };
        let typed = serde_json::from_str::<Typed>(data).unwrap();
        assert!(typed.usual());
        let lenient = ChatChunk::read_leniently(data).unwrap();
        assert_eq!(seen(typed.into()), seen(lenient));
    }
}
