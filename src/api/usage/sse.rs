//! The event-stream half of the scanner: [`SseScan`] splits a WHATWG event stream into
//! lines and feeds each event's data to a [`JsonScan`] that it resets between events; whole
//! events that cannot hold a usage object are counted and passed over without a JSON walk.

use std::sync::LazyLock;

use memchr::{memchr2, memmem};

use super::scan::JsonScan;
use super::Usage;

static UNICODE_ESCAPE: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\\u"));

/// Whether a JSON text may have a `usage` member whose value is an object: a key `usage`
/// can only be written `"usage"` or with a `\u` escape, and such a member is that key, a
/// colon and a brace, whitespace aside. `"usage":null` (on every OpenAI chunk once usage is
/// asked for) and the word in a string value do not count.
fn may_hold_usage(text: &[u8]) -> bool {
    if UNICODE_ESCAPE.find(text).is_some() {
        return true;
    }
    let after_space = |at: usize| {
        let skipped = (text[at..].iter())
            .take_while(|b| b" \t\n\r".contains(b))
            .count();
        (at + skipped, text.get(at + skipped).copied())
    };
    super::usage_key_positions(text).any(|at| {
        let (colon, byte) = after_space(at + b"\"usage\"".len());
        byte == Some(b':') && after_space(colon + 1).1 == Some(b'{')
    })
}

/// Where the event-stream parser is in the current line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At the very start of the stream: `n` bytes of a UTF-8 BOM seen (it is skipped).
    Bom(u8),
    /// At the start of a line.
    Start,
    /// In the field name; the `n` bytes so far match the start of `data`.
    Field(u8),
    /// Just after `data:`: one optional space.
    Space,
    /// In the value of a `data` line: passed to the JSON scanner.
    Data,
    /// In a comment, another field, or a line that is neither: skipped to its end.
    Ignore,
}

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// Incremental WHATWG event-stream parser: the `data` of each event, lines joined with LF, is
/// one JSON document for a [`JsonScan`], which is reset when a blank line ends the event.
pub(super) struct SseScan {
    line: Line,
    /// The last line ended in CR: an LF right after it belongs to the same line ending.
    after_cr: bool,
    /// The current event already has a data line (the next one is joined with an LF).
    has_data: bool,
    json: JsonScan,
    /// Events whose data began a JSON object (`[DONE]` and other text not counted).
    pub(super) events: u64,
    /// At the first byte of an event's first data line's value.
    fresh: bool,
}

impl SseScan {
    pub(super) fn new(at: super::UsageContainer) -> SseScan {
        SseScan {
            line: Line::Bom(0),
            after_cr: false,
            has_data: false,
            json: JsonScan::new(at),
            events: 0,
            fresh: false,
        }
    }

    pub(super) fn usage(&self) -> Option<Usage> {
        self.json.usage()
    }

    pub(super) fn opening_only(&self) -> bool {
        self.json.opening_only()
    }

    pub(super) fn feed(&mut self, mut buf: &[u8]) {
        while let Some(&byte) = buf.first() {
            if self.after_cr {
                self.after_cr = false;
                if byte == b'\n' {
                    buf = &buf[1..];
                    continue;
                }
            }
            match self.line {
                Line::Data => {
                    if std::mem::take(&mut self.fresh) {
                        if let Some(used) = self.skip_event_without_usage(buf) {
                            buf = &buf[used..];
                            continue;
                        }
                    }
                    let Some(at) = memchr2(b'\n', b'\r', buf) else {
                        self.json.feed(buf);
                        return;
                    };
                    self.json.feed(&buf[..at]);
                    self.end_line(buf[at]);
                    buf = &buf[at + 1..];
                }
                Line::Ignore => {
                    let Some(at) = memchr2(b'\n', b'\r', buf) else {
                        return;
                    };
                    self.end_line(buf[at]);
                    buf = &buf[at + 1..];
                }
                Line::Bom(n) => {
                    if BOM.get(n as usize) == Some(&byte) {
                        self.line = if n == 2 {
                            Line::Start
                        } else {
                            Line::Bom(n + 1)
                        };
                        buf = &buf[1..];
                    } else if n == 0 {
                        self.line = Line::Start;
                    } else {
                        // A partial BOM starts the line: it is not a data line (not blank either).
                        self.line = Line::Ignore;
                    }
                }
                Line::Start => match byte {
                    b'\n' | b'\r' => {
                        self.dispatch();
                        self.end_line(byte);
                        buf = &buf[1..];
                    }
                    b':' => {
                        self.line = Line::Ignore;
                        buf = &buf[1..];
                    }
                    _ => self.line = Line::Field(0),
                },
                Line::Field(n) => {
                    let data = n == 4;
                    match byte {
                        b':' if data => {
                            self.begin_data();
                            self.line = Line::Space;
                        }
                        b'\n' | b'\r' => {
                            // A line without a colon is a field with an empty value.
                            if data {
                                self.begin_data();
                            }
                            self.end_line(byte);
                        }
                        _ if b"data".get(n as usize) == Some(&byte) => {
                            self.line = Line::Field(n + 1)
                        }
                        _ => self.line = Line::Ignore,
                    }
                    buf = &buf[1..];
                }
                Line::Space => {
                    if byte == b' ' {
                        buf = &buf[1..];
                    }
                    self.line = Line::Data;
                }
            }
        }
    }

    fn end_line(&mut self, eol: u8) {
        self.after_cr = eol == b'\r';
        self.line = Line::Start;
    }

    fn begin_data(&mut self) {
        if self.has_data {
            self.json.feed(b"\n");
        }
        self.fresh = !self.has_data;
        self.has_data = true;
    }

    /// At the start of an event's first data line: when `buf` holds that line and the blank
    /// line that ends the event, and the line cannot hold a usage object (`may_hold_usage`),
    /// the event cannot change the usage, so it is counted and passed over without walking
    /// its JSON. Most events of a stream are such content chunks (with OpenAI's
    /// `"usage":null` or without). Returns the bytes used, through the blank line.
    fn skip_event_without_usage(&mut self, buf: &[u8]) -> Option<usize> {
        let eol = memchr2(b'\n', b'\r', buf)?;
        let value = &buf[..eol];
        let line_end = eol
            + if buf[eol..].starts_with(b"\r\n") {
                2
            } else {
                1
            };
        let blank = *buf.get(line_end)?;
        if !matches!(blank, b'\n' | b'\r') || may_hold_usage(value) {
            return None;
        }
        let mut used = line_end + 1;
        if blank == b'\r' && buf.get(used) == Some(&b'\n') {
            used += 1;
        }
        // As `JsonScan` starts a document: JSON whitespace, then `{`.
        let start = value.iter().find(|b| !b" \t\n\r".contains(b));
        if start == Some(&b'{') {
            self.events += 1;
        }
        self.has_data = false;
        self.json.reset();
        self.line = Line::Start;
        // A CR ending the buffer may be the first half of a CRLF.
        self.after_cr = blank == b'\r' && used == line_end + 1;
        Some(used)
    }

    /// A blank line: the event ends, the next data starts a new document.
    fn dispatch(&mut self) {
        if self.has_data && self.json.began_object() {
            self.events += 1;
        }
        self.has_data = false;
        self.json.reset();
    }
}
