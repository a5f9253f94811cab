//! Server-sent events on both sides of a translated stream: the upstream's read as their bytes
//! arrive (an event is complete at its blank line), the client's written whole.

use serde_json::Value;

/// The upstream's events, read from its bytes however they are split.
#[derive(Default)]
pub(crate) struct Events {
    /// The start of a line not yet complete.
    line: Vec<u8>,
    /// The data lines of the event being read, joined with LF; kept between events so that
    /// one buffer serves the whole stream.
    data: Vec<u8>,
    /// `data` holds an event already handed out.
    handed: bool,
}

impl Events {
    /// The data of the next event completed by `bytes` (with what came before); `bytes` is
    /// left after it. `None` once `bytes` holds no complete event: its rest is kept.
    pub(crate) fn next(&mut self, bytes: &mut &[u8]) -> Option<&[u8]> {
        self.hand_back();
        while let Some(end) = memchr::memchr(b'\n', bytes) {
            let (head, rest) = bytes.split_at(end);
            *bytes = &rest[1..];
            let complete = if self.line.is_empty() {
                self.line_done(head)
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(head);
                let complete = self.line_done(&line);
                line.clear();
                self.line = line;
                complete
            };
            if complete {
                self.handed = true;
                return Some(&self.data);
            }
        }
        self.line.extend_from_slice(bytes);
        *bytes = &[];
        None
    }

    /// The body ended: the event its last lines make, if they make one.
    pub(crate) fn last(&mut self) -> Option<&[u8]> {
        self.hand_back();
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line);
        }
        self.handed = true;
        Some(&self.data[..]).filter(|d| !d.is_empty())
    }

    /// The event handed out last is done with: its buffer is reused.
    fn hand_back(&mut self) {
        if self.handed {
            self.data.clear();
            self.handed = false;
        }
    }

    /// One line (without its LF): whether it ends an event that has data.
    fn line_done(&mut self, line: &[u8]) -> bool {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return !self.data.is_empty();
        }
        if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(data);
        }
        false
    }
}

/// Writes one event for the client: `event: <name>` when the dialect names its events
/// (Messages, Responses), then its data on one line.
pub(crate) fn write(out: &mut Vec<u8>, name: Option<&str>, data: &Value) {
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    // Writing to a Vec cannot fail, and a Value always serializes.
    let _ = serde_json::to_writer(&mut *out, data);
    out.extend_from_slice(b"\n\n");
}

/// Writes `text` as a JSON string.
pub(crate) fn write_str(out: &mut Vec<u8>, text: &str) {
    // Writing to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// Writes `text` as the inside of a JSON string (escaped, without its quotes).
pub(crate) fn write_str_content(out: &mut Vec<u8>, text: &str) {
    let plain = |b: &u8| *b >= 0x20 && *b != b'"' && *b != b'\\';
    if text.as_bytes().iter().all(plain) {
        out.extend_from_slice(text.as_bytes());
        return;
    }
    let start = out.len();
    write_str(out, text);
    // Drop the quotes the full writer put around it.
    out.pop();
    out.remove(start);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(parts: &[&[u8]]) -> Vec<String> {
        let mut events = Events::default();
        let mut found = Vec::new();
        for part in parts {
            let mut bytes = *part;
            while let Some(data) = events.next(&mut bytes) {
                found.push(String::from_utf8(data.to_vec()).unwrap());
            }
        }
        found.extend(
            events
                .last()
                .map(|d| String::from_utf8(d.to_vec()).unwrap()),
        );
        found
    }

    #[test]
    fn events_end_at_blank_lines_whatever_the_split_and_line_ending() {
        let stream = b"event: a\ndata: 1\n\n: comment\r\ndata: 2\r\ndata: 3\r\n\r\ndata: 4";
        let whole = all(&[stream]);
        assert_eq!(whole, ["1", "2\n3", "4"]);
        for at in 0..stream.len() {
            assert_eq!(all(&[&stream[..at], &stream[at..]]), whole, "split at {at}");
        }
    }

    #[test]
    fn written_events_name_themselves_only_when_asked() {
        let mut out = Vec::new();
        write(&mut out, Some("ping"), &serde_json::json!({"a": 1}));
        write(&mut out, None, &serde_json::json!([]));
        assert_eq!(out, b"event: ping\ndata: {\"a\":1}\n\ndata: []\n\n");
        let mut inside = Vec::new();
        write_str_content(&mut inside, "plain_id");
        write_str_content(&mut inside, "q\"\n\\");
        assert_eq!(inside, b"plain_idq\\\"\\n\\\\");
    }
}
