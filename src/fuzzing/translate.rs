//! The bridge's converters on arbitrary bytes: the request converters (Messages→chat,
//! chat→Responses) never panic and give JSON; the stream converters (chat→Messages,
//! Responses→chat) never panic, write only well-formed events, end every stream, and give the
//! same events however the upstream's bytes are split.

use crate::api::{
    chat_to_responses, messages_to_chat, StreamToChat, StreamToMessages, TranslatedAsked,
    TranslatedStream,
};

/// Any JSON body (the converter sees what the Messages reader accepted, and more).
pub fn messages_to_chat_request(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(chat) = messages_to_chat(&body) {
        let text = serde_json::to_string(&chat).expect("the chat request serializes");
        serde_json::from_str::<serde_json::Value>(&text).expect("and reads back as JSON");
    }
}

/// Any upstream bytes: the first byte picks where they are split.
pub fn chat_stream_to_messages(data: &[u8]) {
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let convert = |parts: &[&[u8]]| {
        let mut conv = TranslatedStream::new(Box::new(StreamToMessages::new("m")));
        let mut out = Vec::new();
        for part in parts {
            conv.feed(part, &mut out);
        }
        conv.finish(&mut out);
        out
    };
    let whole = convert(&[stream]);
    let at = (cut as usize * stream.len()) / 255;
    assert_eq!(
        convert(&[&stream[..at], &stream[at..]]),
        whole,
        "split at {at}"
    );
    let text = std::str::from_utf8(&whole).expect("events are UTF-8");
    for event in text.split_terminator("\n\n") {
        let (name, data) = event
            .split_once('\n')
            .expect("an event line and a data line");
        assert!(
            name.starts_with("event: ") && !name[7..].contains(['\n', '\r']),
            "{name:?}"
        );
        let data = data.strip_prefix("data: ").expect("a data line");
        serde_json::from_str::<serde_json::Value>(data).expect("data is one JSON document");
    }
    assert!(
        text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
            || text.contains("event: error\n"),
        "every stream ends, with message_stop or an error event"
    );
}

/// Any JSON body (the converter sees what the chat reader accepted, and more).
pub fn chat_to_responses_request(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(responses) = chat_to_responses(&body) {
        let text = serde_json::to_string(&responses).expect("the Responses request serializes");
        let back: serde_json::Value = serde_json::from_str(&text).expect("and reads back as JSON");
        assert_eq!(
            back["store"], false,
            "the bridge never asks the upstream to store"
        );
    }
}

/// Any upstream bytes: the first byte picks where they are split, and its low bit whether the
/// client asked for its usage.
pub fn responses_stream_to_chat(data: &[u8]) {
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let asked = TranslatedAsked {
        model: "m".into(),
        usage: cut & 1 == 1,
    };
    let convert = |parts: &[&[u8]]| {
        let mut conv = TranslatedStream::new(Box::new(StreamToChat::new(&asked)));
        let mut out = Vec::new();
        for part in parts {
            conv.feed(part, &mut out);
        }
        conv.finish(&mut out);
        (out, conv.was_cut())
    };
    let (whole, cut_short) = convert(&[stream]);
    let at = (cut as usize * stream.len()) / 255;
    assert_eq!(
        convert(&[&stream[..at], &stream[at..]]),
        (whole.clone(), cut_short),
        "split at {at}"
    );
    let text = std::str::from_utf8(&whole).expect("chunks are UTF-8");
    let events: Vec<&str> = text.split_terminator("\n\n").collect();
    let Some((last, chunks)) = events.split_last() else {
        panic!("every stream ends, with [DONE] or an error chunk");
    };
    let parse = |event: &str| {
        let data = event.strip_prefix("data: ").expect("only data lines");
        assert!(!data.contains('\n'), "one line of data: {data:?}");
        serde_json::from_str::<serde_json::Value>(data).expect("data is one JSON document")
    };
    for chunk in chunks {
        let chunk = parse(chunk);
        assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
        assert!(
            chunk["id"].is_string() && chunk["model"].is_string(),
            "{chunk}"
        );
        assert!(
            asked.usage || chunk.get("usage").is_none(),
            "usage only when asked"
        );
    }
    if cut_short {
        assert!(
            parse(last)["error"]["message"].is_string(),
            "ends in an error chunk"
        );
    } else {
        assert_eq!(*last, "data: [DONE]", "ends in [DONE]");
    }
}
