//! The dialect bridge (issue 32): converters between the wire APIs, one folder per direction,
//! each with its request, answer and stream converters.
//!
//! A call is translated when its service's `translate` names its endpoint (`Pair`): the
//! call's `api::Exchange` converts its body, its answer and its stream with the pair's row of
//! `Converters`; the proxy only sends it to the target endpoint's path (`forward_path`).

mod chat_chunk;
pub(crate) mod chat_responses;
pub(crate) mod messages_chat;
pub(crate) mod responses_chat;
pub(crate) mod sse;

use serde_json::{json, Value};

use super::{Api, Endpoint};

/// A translated endpoint: what the client speaks, and what the upstream is sent
/// (`services.<name>.translate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pair {
    /// `messages = "chat"` on `api = "anthropic"`.
    MessagesToChat,
    /// `responses = "chat"` on `api = "openai"`.
    ResponsesToChat,
    /// `chat = "responses"` on `api = "openai"`.
    ChatToResponses,
}

/// What the gateway knows of one pair: one row per `Pair`, in its order.
struct Row {
    /// The API of the services it may be configured on.
    api: Api,
    /// Its config key and value: `messages = "chat"`.
    key: &'static str,
    value: &'static str,
    /// As the access log and the metrics name it: `messages>chat`.
    name: &'static str,
    client: Endpoint,
    target: Endpoint,
    convert: Converters,
}

/// One direction's converters, from the client's dialect to the upstream's and back.
pub(crate) struct Converters {
    /// The client's request (as the reader checked and the policy edited it); what its answer
    /// will need beyond `Asked::of` is noted in the `Asked`.
    pub(crate) request: fn(Value, &mut Asked) -> Result<Value, Untranslatable>,
    /// The upstream's JSON answer, a success.
    pub(crate) answer: fn(&Value, &Asked) -> Value,
    /// The upstream's error answer (any bytes) in the client dialect's error shape.
    pub(crate) error: fn(u16, &[u8]) -> Value,
    /// A converter for the upstream's event stream.
    pub(crate) stream: fn(&Asked) -> Box<dyn StreamConvert>,
}

/// What the client's request said that its answer depends on.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    /// The model it named, for answers that name none.
    pub(crate) model: String,
    /// A chat client asked for its stream's usage (`stream_options.include_usage`); the
    /// other dialects always get it.
    pub(crate) usage: bool,
    /// The client's freeform tools (Responses `custom`), sent as functions: their calls go
    /// back as the client's own call type.
    pub(crate) freeform: Vec<String>,
}

impl Asked {
    pub(crate) fn of(request: &Value) -> Asked {
        Asked {
            model: request["model"].as_str().unwrap_or_default().to_string(),
            usage: request.pointer("/stream_options/include_usage") == Some(&Value::Bool(true)),
            freeform: Vec::new(),
        }
    }
}

/// One direction's stream converter, fed the upstream's events one by one.
pub(crate) trait StreamConvert: Send + Sync {
    /// One complete upstream event's data; the client's events for it go to `out`.
    fn event(&mut self, data: &[u8], out: &mut Vec<u8>);
    /// The upstream's stream is over (its body ended, or its connection failed): the client's
    /// stream ends, in its dialect's error form when the answer was not complete.
    fn end(&mut self, out: &mut Vec<u8>);
    /// Whether it ended in the error form.
    fn was_cut(&self) -> bool;
}

/// A translated stream: the upstream's bytes in, as they arrive, the client's events out.
pub(crate) struct Stream {
    events: sse::Events,
    convert: Box<dyn StreamConvert>,
    ended: bool,
}

impl Stream {
    pub(crate) fn new(convert: Box<dyn StreamConvert>) -> Stream {
        Stream {
            events: sse::Events::default(),
            convert,
            ended: false,
        }
    }

    /// Converts the events `bytes` completes, appending the client's to `out`.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<u8>) {
        while let Some(data) = self.events.next(&mut bytes) {
            self.convert.event(data, out);
        }
    }

    /// The upstream's stream is over: its last event, then the client's stream's end.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        if let Some(data) = self.events.last() {
            self.convert.event(data, out);
        }
        self.convert.end(out);
        self.ended = true;
    }

    pub(crate) fn was_cut(&self) -> bool {
        self.convert.was_cut()
    }
}

const PAIRS: [Row; 3] = [
    Row {
        api: Api::Anthropic,
        key: "messages",
        value: "chat",
        name: "messages>chat",
        client: Endpoint::Messages,
        target: Endpoint::Chat,
        convert: messages_chat::CONVERTERS,
    },
    Row {
        api: Api::OpenAi,
        key: "responses",
        value: "chat",
        name: "responses>chat",
        client: Endpoint::Responses,
        target: Endpoint::Chat,
        convert: responses_chat::CONVERTERS,
    },
    Row {
        api: Api::OpenAi,
        key: "chat",
        value: "responses",
        name: "chat>responses",
        client: Endpoint::Chat,
        target: Endpoint::Responses,
        convert: chat_responses::CONVERTERS,
    },
];

/// Every pair, in `PAIRS`' order.
const ALL: [Pair; 3] = [
    Pair::MessagesToChat,
    Pair::ResponsesToChat,
    Pair::ChatToResponses,
];

impl Pair {
    fn row(self) -> &'static Row {
        &PAIRS[self as usize]
    }

    /// The pair `key = "value"` names on a service speaking `api`; why not, for the config's
    /// problem list.
    pub(crate) fn configured(api: Api, key: &str, value: &str) -> Result<Pair, String> {
        let on_api = || ALL.into_iter().filter(move |p| p.row().api == api);
        let listed = || {
            let pairs: Vec<String> = on_api()
                .map(|p| format!("`{} = \"{}\"`", p.row().key, p.row().value))
                .collect();
            pairs.join(" or ")
        };
        let Some(pair) = on_api().find(|p| p.row().key == key && p.row().value == value) else {
            return Err(format!(
                "{} = {} is not a translation this service's api can make: {} is",
                shown(key),
                shown(value),
                listed()
            ));
        };
        Ok(pair)
    }

    /// The pair the access log and the metrics name `name`.
    pub(crate) fn named(name: &str) -> Option<Pair> {
        ALL.into_iter().find(|p| p.row().name == name)
    }

    /// As the access log and the metrics name it: `messages>chat`.
    pub(crate) fn name(self) -> &'static str {
        self.row().name
    }

    /// The endpoint the client calls.
    pub(crate) fn client(self) -> Endpoint {
        self.row().client
    }

    /// The endpoint the upstream is sent.
    pub(crate) fn target(self) -> Endpoint {
        self.row().target
    }

    /// Its converters.
    pub(crate) fn converters(self) -> &'static Converters {
        &self.row().convert
    }
}

/// Why a request cannot be translated: a `400 bad_request` whose message names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Untranslatable(pub(crate) String);

impl Untranslatable {
    fn field(field: &str, why: &str) -> Untranslatable {
        Untranslatable(format!("{field} {why}"))
    }
}

/// A client-chosen name shown in a message: quoted, cut short.
fn shown(name: &str) -> String {
    let short: String = name.chars().take(64).collect();
    Value::from(short).to_string()
}

/// The path the upstream is sent for a translated call: everything but the client endpoint's
/// own suffix, which becomes the target's (`…/v1/messages?beta=true` →
/// `…/v1/chat/completions?beta=true`); the query is kept.
pub(crate) fn forward_path(pair: Pair, forward: &[u8]) -> Vec<u8> {
    let (path, query) = match forward.iter().position(|&b| b == b'?') {
        Some(at) => forward.split_at(at),
        None => (forward, &b""[..]),
    };
    let (client, target) = (pair.client().spec().suffix, pair.target().spec().suffix);
    let trimmed = |p: &[u8]| p.len() - p.iter().rev().take_while(|&&b| b == b'/').count();
    let plain = &path[..trimmed(path)];
    // The endpoint was matched however it was spelt; a plain spelling is kept as it is.
    let mut out = match plain.len().checked_sub(client.len()) {
        Some(at) if plain[at..].eq_ignore_ascii_case(client) => plain[..at].to_vec(),
        _ => {
            let normal = super::endpoint::normalized(path);
            let normal = &normal[..trimmed(&normal)];
            normal[..normal.len().saturating_sub(client.len())].to_vec()
        }
    };
    out.extend_from_slice(target);
    out.extend_from_slice(query);
    out
}

/// An OpenAI-compatible server's error answer (chat or Responses) as OpenAI's error shape (`{"error": {"message", "type",
/// "param", "code"}}`): kept as it is when it already has that shape; the status is kept.
pub(crate) fn openai_error(status: u16, body: &[u8]) -> Value {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    if let Some(parsed) = &parsed {
        if parsed["error"]["message"].is_string() {
            return parsed.clone();
        }
    }
    // `{"error": "text"}`, vLLM's flat `{"object": "error", "message", "type", "code"}`,
    // FastAPI's `{"detail": …}`, or anything else.
    let error = parsed.as_ref().map(|b| match b.get("error") {
        Some(e) if !e.is_null() => e,
        _ => b,
    });
    let message = match error {
        Some(Value::String(text)) => text.clone(),
        Some(e) => match (e.get("message"), e.get("detail")) {
            (Some(Value::String(text)), _) | (_, Some(Value::String(text))) => text.clone(),
            _ => e.to_string(),
        },
        None => String::from_utf8_lossy(body).chars().take(1024).collect(),
    };
    let by_status = match status {
        400 | 404 | 405 | 409 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        _ => "server_error",
    };
    let given = |member: &str| error.and_then(|e| e.get(member)).filter(|v| !v.is_null());
    let kind = given("type")
        .filter(|t| t.is_string())
        .cloned()
        .unwrap_or_else(|| json!(by_status));
    let code = given("code").cloned().unwrap_or(Value::Null);
    let param = given("param").cloned().unwrap_or(Value::Null);
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// What the converters' unit tests share.
#[cfg(test)]
pub(crate) mod test_kit {
    use serde_json::Value;

    use super::{Stream, StreamConvert};

    /// `chunks` of an upstream stream through `convert`, then its end: the client's bytes.
    pub(crate) fn convert_all(convert: Box<dyn StreamConvert>, chunks: &[&[u8]]) -> Vec<u8> {
        let mut stream = Stream::new(convert);
        let mut out = Vec::new();
        for chunk in chunks {
            stream.feed(chunk, &mut out);
        }
        stream.finish(&mut out);
        out
    }

    /// A converted stream's named events (Messages, Responses), as (name, data).
    pub(crate) fn named_events(out: &[u8]) -> Vec<(String, Value)> {
        let text = std::str::from_utf8(out).unwrap();
        (text.split("\n\n").filter(|e| !e.is_empty()))
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                let name = name.strip_prefix("event: ").unwrap().to_string();
                let data = data.strip_prefix("data: ").unwrap();
                (name, serde_json::from_str(data).unwrap())
            })
            .collect()
    }

    /// `stream` (with CRLF line ends) converts to the same bytes whether it comes whole, in two
    /// pieces split anywhere, or a byte at a time.
    pub(crate) fn assert_split_independent(
        make: impl Fn() -> Box<dyn StreamConvert>,
        stream: &str,
    ) {
        let stream = stream.replace('\n', "\r\n");
        let bytes = stream.as_bytes();
        let whole = convert_all(make(), &[bytes]);
        for at in 0..bytes.len() {
            let split = convert_all(make(), &[&bytes[..at], &bytes[at..]]);
            assert_eq!(split, whole, "split at {at}");
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(convert_all(make(), &singles), whole);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_pair_in_order() {
        for (i, pair) in ALL.iter().enumerate() {
            assert_eq!(*pair as usize, i);
            assert_eq!(
                pair.name(),
                format!("{}>{}", pair.row().key, pair.row().value)
            );
        }
    }

    #[test]
    fn the_endpoints_suffix_becomes_the_targets_and_the_rest_is_kept() {
        let path =
            |p: &str| String::from_utf8(forward_path(Pair::MessagesToChat, p.as_bytes())).unwrap();
        assert_eq!(
            path("/v1/messages?beta=true"),
            "/v1/chat/completions?beta=true"
        );
        assert_eq!(path("/v1/messages/"), "/v1/chat/completions");
        assert_eq!(path("/api/v1/Messages"), "/api/v1/chat/completions");
        assert_eq!(path("/v1/%6Dessages?x=1"), "/v1/chat/completions?x=1");
    }
}
