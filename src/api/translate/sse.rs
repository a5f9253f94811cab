//! Server-sent events on both sides of a translated stream: the upstream's read as their bytes
//! arrive (an event is complete at its blank line), the client's written whole.

use serde_json::Value;

/// The upstream's events, read from its bytes however they are split.
#[derive(Default)]
pub(crate) struct Events {
    /// The start of a line not yet complete.
    line: Vec<u8>,
    /// The data lines of the event being read, joined with LF.
    data: Vec<u8>,
}

impl Events {
    /// The data of the next event completed by `bytes` (with what came before); `bytes` is
    /// left after it. `None` once `bytes` holds no complete event: its rest is kept.
    pub(crate) fn next(&mut self, bytes: &mut &[u8]) -> Option<Vec<u8>> {
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
            if complete.is_some() {
                return complete;
            }
        }
        self.line.extend_from_slice(bytes);
        *bytes = &[];
        None
    }

    /// The body ended: the event its last lines make, if they make one.
    pub(crate) fn last(&mut self) -> Option<Vec<u8>> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line);
        }
        Some(std::mem::take(&mut self.data)).filter(|d| !d.is_empty())
    }

    /// One line (without its LF): the event's data when the line ends it.
    fn line_done(&mut self, line: &[u8]) -> Option<Vec<u8>> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return Some(std::mem::take(&mut self.data)).filter(|d| !d.is_empty());
        }
        if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(data);
        }
        None
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

#[cfg(test)]
mod tests {
    use super::*;

    fn all(parts: &[&[u8]]) -> Vec<String> {
        let mut events = Events::default();
        let mut found = Vec::new();
        for part in parts {
            let mut bytes = *part;
            while let Some(data) = events.next(&mut bytes) {
                found.push(String::from_utf8(data).unwrap());
            }
        }
        found.extend(events.last().map(|d| String::from_utf8(d).unwrap()));
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
    }
}
