//! The bridge's converters on arbitrary bytes, one check per converter kind run for every
//! pair: a request converter never panics and gives JSON; a stream converter never panics,
//! writes only well-formed events, ends its stream the dialect's way, and gives the same
//! events however the upstream's bytes are split.

use crate::api::{Asked, Pair, TranslatedStream};

/// Any JSON body (the converter sees what the client's reader accepted, and more).
fn request(pair: Pair, data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let mut asked = Asked::of(&body);
    if let Ok(out) = (pair.converters().request)(body, &mut asked) {
        let text = serde_json::to_string(&out).expect("the request serializes");
        let back: serde_json::Value = serde_json::from_str(&text).expect("and reads back as JSON");
        if pair.target() == crate::api::Endpoint::Responses {
            assert_eq!(
                back["store"], false,
                "the bridge never asks the upstream to store"
            );
        }
    }
}

/// How a client's stream may end, by pair: its last event's `event:` name or its data.
fn ends_well(pair: Pair, last: (Option<&str>, &str)) -> bool {
    match pair {
        Pair::MessagesToChat => matches!(last.0, Some("message_stop" | "error")),
        Pair::ResponsesToChat => matches!(
            last.0,
            Some("response.completed" | "response.incomplete" | "response.failed")
        ),
        Pair::ChatToResponses => last.1 == "[DONE]" || last.1.starts_with("{\"error\""),
    }
}

/// Any upstream bytes: the first byte picks where they are split, and its low bit whether a
/// chat client asked for its usage.
fn stream(pair: Pair, data: &[u8]) {
    let Some((&cut, bytes)) = data.split_first() else {
        return;
    };
    let asked = Asked {
        model: "m".into(),
        usage: cut & 1 == 1,
        freeform: vec!["exec".into()],
    };
    let convert = |parts: &[&[u8]]| {
        let mut conv = TranslatedStream::new((pair.converters().stream)(&asked));
        let mut out = Vec::new();
        for part in parts {
            conv.feed(part, &mut out);
        }
        conv.finish(&mut out);
        out
    };
    let whole = convert(&[bytes]);
    let at = (cut as usize * bytes.len()) / 255;
    assert_eq!(
        convert(&[&bytes[..at], &bytes[at..]]),
        whole,
        "split at {at}"
    );
    let text = std::str::from_utf8(&whole).expect("events are UTF-8");
    let mut last = None;
    for event in text.split_terminator("\n\n") {
        let (name, data) = match event.split_once('\n') {
            Some((name, data)) => {
                let name = name.strip_prefix("event: ").expect("an event line");
                assert!(!name.contains(['\n', '\r']), "{name:?}");
                (Some(name), data)
            }
            None => (None, event),
        };
        let data = data.strip_prefix("data: ").expect("a data line");
        assert!(!data.contains('\n'), "one data line");
        if data != "[DONE]" {
            let data: serde_json::Value =
                serde_json::from_str(data).expect("data is one JSON document");
            if pair.client() == crate::api::Endpoint::Chat && data.get("error").is_none() {
                assert_eq!(data["object"], "chat.completion.chunk", "{data}");
                assert!(
                    asked.usage || data.get("usage").is_none(),
                    "usage only when asked"
                );
            }
        }
        last = Some((name, data));
    }
    // A stream with no event at all may end silently only in chat, whose end is [DONE].
    let last = last.expect("every client stream ends with an event");
    assert!(ends_well(pair, last), "{pair:?} ends with {last:?}");
}

pub fn messages_to_chat_request(data: &[u8]) {
    request(Pair::MessagesToChat, data);
}

pub fn chat_stream_to_messages(data: &[u8]) {
    stream(Pair::MessagesToChat, data);
}

pub fn responses_to_chat_request(data: &[u8]) {
    request(Pair::ResponsesToChat, data);
}

pub fn chat_stream_to_responses(data: &[u8]) {
    stream(Pair::ResponsesToChat, data);
}

pub fn chat_to_responses_request(data: &[u8]) {
    request(Pair::ChatToResponses, data);
}

pub fn responses_stream_to_chat(data: &[u8]) {
    stream(Pair::ChatToResponses, data);
}
