//! The bridge's converters on arbitrary bytes: the Messages→chat request converter never
//! panics and gives JSON; the chat→Messages stream converter never panics, writes only
//! well-formed events, and gives the same events however the upstream's bytes are split.

use crate::api::{messages_to_chat, StreamToMessages, TranslatedStream};

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
