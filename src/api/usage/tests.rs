use std::io::Write;

use flate2::write::{DeflateEncoder, GzEncoder, ZlibEncoder};
use flate2::Compression;

use super::scan::{find_structural, USAGE_CAP};
use super::*;

fn tokens(prompt: Option<u64>, completion: Option<u64>) -> Option<Usage> {
    Some(Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        ..Usage::default()
    })
}

/// `CHAT`'s usage, its details included.
fn chat_usage() -> Option<Usage> {
    Some(Usage {
        reasoning_tokens: Some(2),
        cached_tokens: Some(4),
        ..tokens(Some(13), Some(7)).unwrap()
    })
}

fn scan(framing: Framing, body: &[u8]) -> Option<Usage> {
    let mut scanner = UsageScanner::new(framing, Encoding::Identity, UsageContainer::Root);
    scanner.feed(body);
    scanner.usage()
}

fn json(body: &str) -> Option<Usage> {
    scan(Framing::Json, body.as_bytes())
}

fn sse(body: &str) -> Option<Usage> {
    scan(Framing::EventStream, body.as_bytes())
}

// Feeds `body` in chunks of the given sizes (cycled), then asks for the usage: the fuzz check's helper.
use crate::fuzzing::usage_in_chunks as chunked;

/// A small deterministic generator (xorshift64*), enough for fuzz-style loops.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const CHAT: &str = r#"{
  "id": "chatcmpl-abc123",
  "object": "chat.completion",
  "created": 1677858242,
  "model": "gpt-4o-mini",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "Write \"usage\": {\"prompt_tokens\": 999} and a backslash \\",
        "refusal": null
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 13,
    "completion_tokens": 7,
    "total_tokens": 20,
    "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 2, "accepted_prediction_tokens": 0}
  },
  "system_fingerprint": "fp_44709d6fcb"
}"#;

const EMBEDDINGS: &str = r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.0023064255,-0.009327292,1.5e-7,-4E+2]},{"object":"embedding","index":1,"embedding":[]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}"#;

/// OpenAI with `stream_options.include_usage`: `"usage": null` on every chunk, the usage on a
/// last chunk with no choices, then `[DONE]`.
const OPENAI_SSE: &str = concat!(
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"JSON: \\\"usage\\\":{\\\"prompt_tokens\\\":1} \\\\\"},\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\n",
    "data: [DONE]\n\n",
);

/// An event stream exercising every line ending, comments, other fields, a BOM, a multi-line
/// event, `[DONE]` and a usage object that is later replaced: for the split tests.
const MIXED_SSE: &str = concat!(
    "\u{feff}: ping\r\n",
    "retry: 3000\r\n\r\n",
    "event: chunk\r\nid: 1\r\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\"a \\\"usage\\\":{} b\"},\"usage\":{\"prompt_tokens\":1}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\r\n\r\n",
    ": data: {\"usage\":{\"prompt_tokens\":666}}\r",
    "data:{\"usage\":null,\r",
    "data:  \"x\":[1,2,{\"usage\":{}}]}\r\r",
    "event: usage\n",
    "data: {\"id\":\"x\",\n",
    "data: \"usage\":\n",
    "data: {\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\r\n",
    "\r\n",
    "data: [DONE]\n\n",
);

#[test]
fn either_apis_names_are_read_and_the_chat_names_win() {
    let responses = r#"{"usage":{"input_tokens":3,"output_tokens":4,"input_tokens_details":{"cached_tokens":1},"output_tokens_details":{"reasoning_tokens":2}}}"#;
    let want = Usage {
        prompt_tokens: Some(3),
        completion_tokens: Some(4),
        reasoning_tokens: Some(2),
        cached_tokens: Some(1),
    };
    assert_eq!(json(responses), Some(want));
    let both = r#"{"usage":{"prompt_tokens":5,"input_tokens":3,"completion_tokens_details":7,"output_tokens_details":{"reasoning_tokens":2}}}"#;
    let want = Usage {
        prompt_tokens: Some(5),
        completion_tokens: None,
        reasoning_tokens: None,
        cached_tokens: None,
    };
    assert_eq!(
        json(both),
        Some(want),
        "a details member that is not an object counts none"
    );
}

#[test]
fn json_chat_response() {
    assert_eq!(json(CHAT), chat_usage());
}

#[test]
fn json_embeddings_response_has_no_completion_tokens() {
    assert_eq!(json(EMBEDDINGS), tokens(Some(8), None));
}

#[test]
fn usage_before_choices() {
    let body = r#"{"usage":{"completion_tokens":2,"prompt_tokens":3},"choices":[{"message":{"content":"hi"}}],"id":"x"}"#;
    assert_eq!(json(body), tokens(Some(3), Some(2)));
}

#[test]
fn nested_usage_is_ignored() {
    let nested = r#"{"choices":[{"usage":{"prompt_tokens":100,"completion_tokens":100}}],"data":{"usage":{"prompt_tokens":1}}}"#;
    assert_eq!(json(nested), None);
    let both = r#"{"choices":[{"usage":{"prompt_tokens":100}}],"usage":{"prompt_tokens":4,"completion_tokens":5},"x":{"usage":{"prompt_tokens":6}}}"#;
    assert_eq!(json(both), tokens(Some(4), Some(5)));
}

#[test]
fn usage_inside_a_string_is_ignored() {
    let body = r#"{"choices":[{"message":{"content":"{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}"}}],"text":"\"usage\":{\"prompt_tokens\":3}"}"#;
    assert_eq!(json(body), None);
    let top = r#"{"note":"\"usage\":{\"prompt_tokens\":3}","usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
    assert_eq!(json(top), tokens(Some(1), Some(2)));
}

#[test]
fn escaped_quotes_and_backslashes_before_the_usage() {
    let body = r#"{"a":"\\","b":"\\\"","c":"\"}{[","d":["\\\\\"]}",{"e":"\\"}],"usage":{"prompt_tokens":11,"completion_tokens":22}}"#;
    assert_eq!(json(body), tokens(Some(11), Some(22)));
    // A string ending in an escaped backslash must not swallow the closing quote.
    let trap = r#"{"a":"x\\","usage":{"prompt_tokens":1}}"#;
    assert_eq!(json(trap), tokens(Some(1), None));
    // A quote after an odd run of backslashes is escaped: `"usage"` here is inside the string.
    let inside = r#"{"a":"x\\\",\"usage\":{\"prompt_tokens\":1}}"}"#;
    assert_eq!(json(inside), None);
}

#[test]
fn usage_null_and_other_non_objects_are_ignored() {
    assert_eq!(json(r#"{"usage": null, "id": "x"}"#), None);
    assert_eq!(json(r#"{"usage":[{"prompt_tokens":1}]}"#), None);
    assert_eq!(json(r#"{"usage":"{\"prompt_tokens\":1}"}"#), None);
    assert_eq!(json(r#"{"usage":12}"#), None);
    assert_eq!(json(r#"{"usage":true}"#), None);
    // An empty object still is a usage object, with nothing in it.
    assert_eq!(json(r#"{"usage":{}}"#), tokens(None, None));
}

#[test]
fn non_integer_or_negative_tokens_are_none() {
    let cases = [
        (
            r#"{"prompt_tokens":-3,"completion_tokens":2.5}"#,
            tokens(None, None),
        ),
        (
            r#"{"prompt_tokens":"12","completion_tokens":true}"#,
            tokens(None, None),
        ),
        (
            r#"{"prompt_tokens":1e3,"completion_tokens":null}"#,
            tokens(None, None),
        ),
        (
            r#"{"prompt_tokens":{"n":1},"completion_tokens":[1]}"#,
            tokens(None, None),
        ),
        (
            r#"{"prompt_tokens":18446744073709551616,"completion_tokens":18446744073709551615}"#,
            tokens(None, Some(u64::MAX)),
        ),
        // serde_json reads `-0` as a float.
        (
            r#"{"prompt_tokens":0,"completion_tokens":-0}"#,
            tokens(Some(0), None),
        ),
        (
            r#"{"prompt_tokens":7,"total_tokens":"many"}"#,
            tokens(Some(7), None),
        ),
        // A duplicated member takes its last value.
        (
            r#"{"prompt_tokens":1,"prompt_tokens":2}"#,
            tokens(Some(2), None),
        ),
    ];
    for (object, expected) in cases {
        let body = format!(r#"{{"usage":{object}}}"#);
        assert_eq!(json(&body), expected, "{object}");
    }
}

#[test]
fn malformed_usage_object_is_ignored() {
    assert_eq!(json(r#"{"usage":{"prompt_tokens":5,}}"#), None);
    assert_eq!(json(r#"{"usage":{"prompt_tokens" 5}}"#), None);
    // In an event stream the earlier usage stands.
    let body =
        "data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":}}\n\n";
    assert_eq!(sse(body), tokens(Some(1), None));
}

#[test]
fn only_the_root_object_counts() {
    assert_eq!(json(r#"[{"usage":{"prompt_tokens":1}}]"#), None);
    assert_eq!(json(r#""usage":{"prompt_tokens":1}"#), None);
    assert_eq!(json(r#"{"a":1} {"usage":{"prompt_tokens":1}}"#), None);
    assert_eq!(json(r#"{"a":1}, "usage":{"prompt_tokens":1}}"#), None);
    assert_eq!(json(r#"{"a" 1, "usage":{"prompt_tokens":1}}"#), None);
    assert_eq!(json(r#"{"a":1 2, "usage":{"prompt_tokens":1}}"#), None);
    assert_eq!(json(r#"{,"usage":{"prompt_tokens":1}}"#), None);
    assert_eq!(json(r#"{}"#), None);
    assert_eq!(json(""), None);
    // Leading whitespace and every kind of scalar are fine.
    let body = " \r\n\t{\"a\":true,\"b\":null,\"c\":-1.5E+3,\"d\":false ,\"usage\" : {\"prompt_tokens\":2}}";
    assert_eq!(json(body), tokens(Some(2), None));
}

#[test]
fn the_last_usage_in_a_document_wins() {
    let body = r#"{"usage":{"prompt_tokens":1,"completion_tokens":1},"usage":{"prompt_tokens":2}}"#;
    assert_eq!(json(body), tokens(Some(2), None));
}

#[test]
fn keys_are_compared_after_escapes() {
    assert_eq!(
        json(r#"{"us\u0061ge":{"prompt_tokens":3}}"#),
        tokens(Some(3), None)
    );
    let all_escaped = r#"{"\u0075\u0073\u0061\u0067\u0065":{"prompt_tokens":4}}"#;
    assert_eq!(json(all_escaped), tokens(Some(4), None));
    assert_eq!(json(r#"{"usage\u0000":{"prompt_tokens":3}}"#), None);
    assert_eq!(json(r#"{"us\"age":{"prompt_tokens":3}}"#), None);
    assert_eq!(json(r#"{"usag":{"prompt_tokens":3}}"#), None);
    assert_eq!(json(r#"{"usagex":{"prompt_tokens":3}}"#), None);
    assert_eq!(json(r#"{"Usage":{"prompt_tokens":3}}"#), None);
    assert_eq!(json(r#"{"":{"prompt_tokens":3}}"#), None);
    let long = r#"{"a_very_long_key_that_cannot_possibly_be_usage":{"prompt_tokens":3},"usage":{"prompt_tokens":1}}"#;
    assert_eq!(json(long), tokens(Some(1), None));
}

#[test]
fn oversized_usage_object_is_dropped() {
    let padding = "x".repeat(USAGE_CAP);
    let big = format!(r#"{{"prompt_tokens":50,"pad":"{padding}"}}"#);
    assert_eq!(json(&format!(r#"{{"usage":{big}}}"#)), None);
    let body = format!(
        "data: {{\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":2}}}}\n\ndata: {{\"usage\":{big}}}\n\n"
    );
    assert_eq!(sse(&body), tokens(Some(1), Some(2)));
    // Just under the cap is fine.
    let pad = "x".repeat(USAGE_CAP - 60);
    let fits = format!(r#"{{"usage":{{"prompt_tokens":50,"pad":"{pad}"}}}}"#);
    assert_eq!(json(&fits), tokens(Some(50), None));
}

#[test]
fn sse_openai_include_usage() {
    assert_eq!(sse(OPENAI_SSE), tokens(Some(9), Some(12)));
    // Before the last chunk only `"usage": null` was seen.
    let before_last = OPENAI_SSE.split("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],").next().unwrap();
    assert_eq!(sse(before_last), None);
}

#[test]
fn sse_vllm_cumulative_usage_last_wins() {
    let mut body = String::new();
    for i in 1..=5 {
        body.push_str(&format!(
            "data: {{\"id\":\"cmpl-1\",\"choices\":[{{\"index\":0,\"text\":\"t{i}\"}}],\"usage\":{{\"prompt_tokens\":10,\"completion_tokens\":{i},\"total_tokens\":{}}}}}\n\n",
            10 + i
        ));
    }
    body.push_str("data: [DONE]\n\n");
    assert_eq!(sse(&body), tokens(Some(10), Some(5)));
}

#[test]
fn sse_crlf_and_cr_line_endings() {
    let event = "data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}";
    for eol in ["\n", "\r\n", "\r"] {
        let body =
            format!("data: {{\"usage\":null}}{eol}{eol}{event}{eol}{eol}data: [DONE]{eol}{eol}");
        assert_eq!(sse(&body), tokens(Some(3), Some(4)), "{eol:?}");
    }
    assert_eq!(sse(MIXED_SSE), tokens(Some(5), Some(3)));
}

#[test]
fn sse_multi_line_data_event() {
    let body =
        "data: {\"usage\":\ndata: {\"prompt_tokens\":3,\ndata: \"completion_tokens\":4}}\n\n";
    assert_eq!(sse(body), tokens(Some(3), Some(4)));
    // Lines are joined with LF: fine between tokens.
    let body = "data: {\"id\":\"x\"\r\ndata:,\"usage\":{\"prompt_tokens\":1}}\r\n\r\n";
    assert_eq!(sse(body), tokens(Some(1), None));
    // `data` alone is a data line with an empty value.
    let body = "data\ndata: {\"usage\":{\"prompt_tokens\":2}}\n\n";
    assert_eq!(sse(body), tokens(Some(2), None));
}

#[test]
fn sse_comments_and_other_fields_are_ignored() {
    let body = concat!(
        ": this is a comment with data: {\"usage\":{\"prompt_tokens\":99}}\n",
        "event: message\n",
        "id: {\"usage\":{\"prompt_tokens\":98}}\n",
        "retry: 1000\n",
        "Data: {\"usage\":{\"prompt_tokens\":97}}\n",
        "data : {\"usage\":{\"prompt_tokens\":96}}\n",
        "datum: {\"usage\":{\"prompt_tokens\":95}}\n",
        "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n",
        ":\n",
        "\n",
    );
    assert_eq!(sse(body), tokens(Some(1), Some(2)));
    // The comment is in the middle of the event's data lines: they are still joined.
    let body = "data: {\"usage\":\n: hi\nevent: x\ndata: {\"prompt_tokens\":4}}\n\n";
    assert_eq!(sse(body), tokens(Some(4), None));
}

#[test]
fn sse_non_json_data_is_harmless_and_state_resets() {
    let body = concat!(
        "data: [DONE]\n\n",
        "data: hello {\"usage\":{\"prompt_tokens\":1}}\n\n",
        "data: {\"usage\":{\"prompt_tokens\":\n\n",
        "data: {\"prompt_tokens\":7}}\n\n",
        "data: \"unterminated {\n\n",
        "data: {\"choices\":[{\"x\":\"[[[{{{\n\n",
    );
    assert_eq!(sse(body), None);
    let then = format!("{body}data: {{\"usage\":{{\"prompt_tokens\":8}}}}\n\n");
    assert_eq!(sse(&then), tokens(Some(8), None));
    // Without the BOM or space after colon.
    assert_eq!(
        sse("data:{\"usage\":{\"prompt_tokens\":9}}\n\n"),
        tokens(Some(9), None)
    );
    // A partial BOM is not a BOM: the line is not a data line.
    let partial_bom = b"\xef\xbbdata: {\"usage\":{\"prompt_tokens\":9}}\n\n";
    assert_eq!(scan(Framing::EventStream, partial_bom), None);
    // A BOM anywhere but at the very start is not skipped either.
    assert_eq!(
        sse("\n\u{feff}data: {\"usage\":{\"prompt_tokens\":9}}\n\n"),
        None
    );
}

#[test]
fn a_usage_object_counts_once_closed_even_if_the_stream_is_cut() {
    assert_eq!(
        sse("data: {\"usage\":{\"prompt_tokens\":3}"),
        tokens(Some(3), None)
    );
    assert_eq!(sse("data: {\"usage\":{\"prompt_tokens\":3"), None);
    assert_eq!(
        json("{\"usage\":{\"prompt_tokens\":3},\"x\":"),
        tokens(Some(3), None)
    );
}

fn assert_split_invariant(framing: Framing, body: &[u8]) {
    let whole = scan(framing, body);
    assert!(whole.is_some());
    for at in 0..=body.len() {
        let mut scanner = UsageScanner::new(framing, Encoding::Identity, UsageContainer::Root);
        scanner.feed(&body[..at]);
        scanner.feed(&body[at..]);
        assert_eq!(scanner.usage(), whole, "{framing:?} split at {at}");
    }
    assert_eq!(
        chunked(framing, Encoding::Identity, body, &[1]),
        whole,
        "{framing:?} byte by byte"
    );
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..200 {
        let sizes: Vec<usize> = (0..8).map(|_| 1 + rng.below(40)).collect();
        assert_eq!(
            chunked(framing, Encoding::Identity, body, &sizes),
            whole,
            "{sizes:?}"
        );
    }
}

#[test]
fn sse_split_anywhere_reads_the_same() {
    assert_split_invariant(Framing::EventStream, MIXED_SSE.as_bytes());
    assert_split_invariant(Framing::EventStream, OPENAI_SSE.as_bytes());
}

#[test]
fn json_split_anywhere_reads_the_same() {
    assert_split_invariant(Framing::Json, CHAT.as_bytes());
    assert_split_invariant(Framing::Json, EMBEDDINGS.as_bytes());
    let escaped_key = br#"{"a":"\\\"","us\u0061ge":{"prompt_tokens":3,"completion_tokens":1}}"#;
    assert_split_invariant(Framing::Json, escaped_key);
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut encoder = ZlibEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn raw_deflate(data: &[u8]) -> Vec<u8> {
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn compressed_bodies_in_small_chunks() {
    let bodies = [
        (Framing::Json, CHAT.as_bytes(), chat_usage()),
        (
            Framing::EventStream,
            OPENAI_SSE.as_bytes(),
            tokens(Some(9), Some(12)),
        ),
        (
            Framing::EventStream,
            MIXED_SSE.as_bytes(),
            tokens(Some(5), Some(3)),
        ),
    ];
    for (framing, body, expected) in bodies {
        let encoded = [
            (Encoding::Gzip, gzip(body)),
            (Encoding::Deflate, zlib(body)),
            (Encoding::Deflate, raw_deflate(body)),
        ];
        for (encoding, compressed) in encoded {
            for sizes in [&[1][..], &[2], &[3, 1, 7], &[64], &[100_000]] {
                assert_eq!(
                    chunked(framing, encoding, &compressed, sizes),
                    expected,
                    "{framing:?} {encoding:?} {sizes:?}"
                );
            }
        }
    }
}

#[test]
fn compressed_large_body_with_usage_at_the_end() {
    // Far more output than the decoder's 32 KiB buffer, so flushing must drain it all.
    let mut body = String::from(r#"{"object":"list","data":[{"embedding":["#);
    for i in 0..100_000 {
        body.push_str(&format!("{}0.{i:07},", if i % 3 == 0 { "-" } else { "" }));
    }
    body.push_str(r#"1]}],"usage":{"prompt_tokens":77,"total_tokens":77}}"#);
    for (encoding, compressed) in [
        (Encoding::Gzip, gzip(body.as_bytes())),
        (Encoding::Deflate, zlib(body.as_bytes())),
    ] {
        assert_eq!(
            chunked(Framing::Json, encoding, &compressed, &[1024]),
            tokens(Some(77), None)
        );
        assert_eq!(
            chunked(Framing::Json, encoding, &compressed, &[1 << 20]),
            tokens(Some(77), None)
        );
    }
}

#[test]
fn decode_errors_stop_scanning_but_keep_the_usage() {
    let first = "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n";
    let compressed = gzip(first.as_bytes());
    let mut scanner = UsageScanner::new(Framing::EventStream, Encoding::Gzip, UsageContainer::Root);
    scanner.feed(&compressed);
    assert_eq!(scanner.usage(), tokens(Some(1), Some(1)));
    // Bytes after the end of the gzip member (garbage, or another member) change nothing.
    scanner.feed(b"garbage that is not gzip");
    scanner.feed(&gzip(b"data: {\"usage\":{\"prompt_tokens\":2}}\n\n"));
    assert_eq!(scanner.usage(), tokens(Some(1), Some(1)));

    // Corruption before the usage: none, and no panic.
    let mut corrupt = gzip(CHAT.as_bytes());
    let len = corrupt.len();
    for byte in &mut corrupt[12..len - 8] {
        *byte ^= 0x55;
    }
    assert_eq!(chunked(Framing::Json, Encoding::Gzip, &corrupt, &[5]), None);
    assert_eq!(
        chunked(
            Framing::Json,
            Encoding::Deflate,
            b"\x78\x9c\xff\xff\xff\xff",
            &[1]
        ),
        None
    );
    assert_eq!(
        chunked(Framing::Json, Encoding::Gzip, b"not gzip at all", &[1]),
        None
    );

    // A truncated body: whatever was decoded counts.
    let compressed = zlib(OPENAI_SSE.as_bytes());
    for cut in 0..compressed.len() {
        let usage = chunked(
            Framing::EventStream,
            Encoding::Deflate,
            &compressed[..cut],
            &[3],
        );
        assert!(usage.is_none() || usage == tokens(Some(9), Some(12)));
    }
}

#[test]
fn encoding_from_header() {
    let cases: [(Option<&[u8]>, Option<Encoding>); 12] = [
        (None, Some(Encoding::Identity)),
        (Some(b"identity"), Some(Encoding::Identity)),
        (Some(b""), Some(Encoding::Identity)),
        (Some(b"gzip"), Some(Encoding::Gzip)),
        (Some(b" GZip "), Some(Encoding::Gzip)),
        (Some(b"x-gzip"), Some(Encoding::Gzip)),
        (Some(b"deflate"), Some(Encoding::Deflate)),
        (Some(b"br"), None),
        (Some(b"zstd"), None),
        (Some(b"gzip, br"), None),
        (Some(b"gzip,identity"), None),
        (Some(b"compress"), None),
    ];
    for (value, expected) in cases {
        assert_eq!(Encoding::from_header(value), expected, "{value:?}");
    }
}

#[test]
fn scanner_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<UsageScanner>();
}

#[test]
fn find_structural_matches_a_plain_search() {
    let mut rng = Rng(42);
    let alphabet = b"0123456789.,-e \"[]{}\\\x02\xff\x7b\x5b";
    for _ in 0..5_000 {
        let len = rng.below(40);
        let hay: Vec<u8> = (0..len)
            .map(|_| {
                if rng.below(8) == 0 {
                    alphabet[rng.below(alphabet.len())]
                } else {
                    b'0' + rng.below(10) as u8
                }
            })
            .collect();
        let structural = |b: u8| matches!(b, b'"' | b'[' | b']' | b'{' | b'}');
        let first = hay.iter().position(|&b| structural(b));
        match find_structural(&hay) {
            None => assert_eq!(first, None, "{hay:?}"),
            Some(at) => {
                assert!(structural(hay[at]) || hay[at] == 0x02, "{hay:?} {at}");
                assert!(first.is_none_or(|first| at <= first), "{hay:?} {at}");
            }
        }
    }
}

#[test]
fn garbage_and_truncation_never_panic() {
    let mut rng = Rng(7);
    let interesting = b"{}[]\":,\\ \r\n\tdatusge0123456789-.:\x02\xef\xbb\xbf";
    let framings = [Framing::Json, Framing::EventStream];
    let encodings = [Encoding::Identity, Encoding::Gzip, Encoding::Deflate];
    // Random bytes, random structural soup, in random chunks, under every framing and coding.
    for round in 0..3_000 {
        let len = rng.below(300);
        let body: Vec<u8> = if round % 2 == 0 {
            (0..len).map(|_| rng.next() as u8).collect()
        } else {
            (0..len)
                .map(|_| interesting[rng.below(interesting.len())])
                .collect()
        };
        let sizes: Vec<usize> = (0..4).map(|_| 1 + rng.below(20)).collect();
        for framing in framings {
            for encoding in encodings {
                chunked(framing, encoding, &body, &sizes);
            }
        }
    }
    // Mutated real bodies, plain and compressed (valid streams of invalid JSON).
    for round in 0..2_000 {
        let source = [CHAT, OPENAI_SSE, MIXED_SSE, EMBEDDINGS][round % 4].as_bytes();
        let mut body = source.to_vec();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(body.len());
            body[at] = interesting[rng.below(interesting.len())];
        }
        let cut = rng.below(body.len() + 1);
        let body = &body[..cut];
        for framing in framings {
            chunked(framing, Encoding::Identity, body, &[1 + rng.below(16)]);
            chunked(framing, Encoding::Gzip, &gzip(body), &[1 + rng.below(16)]);
        }
    }
    // Every short sequence over a small alphabet, behind a usage key and alone.
    let alphabet = b"{}[]\":,\\\r\n1 ";
    let mut body = Vec::new();
    for len in 1..=4u32 {
        for mut n in 0..alphabet.len().pow(len) {
            body.clear();
            for _ in 0..len {
                body.push(alphabet[n % alphabet.len()]);
                n /= alphabet.len();
            }
            for prefix in [
                &b""[..],
                b"{\"usage\":",
                b"data: {\"usage\":{\"prompt_tokens\":",
            ] {
                let doc = [prefix, &body].concat();
                scan(Framing::Json, &doc);
                scan(Framing::EventStream, &doc);
            }
        }
    }
}

#[test]
fn truncated_streams_give_a_prefix_result() {
    // Cut anywhere, the usage is either not yet seen or the final one (MIXED_SSE's first usage
    // object differs, so allow it too).
    for cut in 0..=OPENAI_SSE.len() {
        let usage = sse(&OPENAI_SSE[..cut]);
        assert!(
            usage.is_none() || usage == tokens(Some(9), Some(12)),
            "cut at {cut}"
        );
    }
    for cut in 0..=CHAT.len() {
        let usage = json(&CHAT[..cut]);
        assert!(usage.is_none() || usage == chat_usage(), "cut at {cut}");
    }
    let bytes = MIXED_SSE.as_bytes();
    for cut in 0..=bytes.len() {
        let usage = scan(Framing::EventStream, &bytes[..cut]);
        assert!(
            usage.is_none()
                || usage == tokens(Some(5), Some(1))
                || usage == tokens(Some(5), Some(3)),
            "cut at {cut}"
        );
    }
}

#[test]
fn events_are_counted_the_same_whether_passed_over_or_walked() {
    // Whole events without usage are passed over; fed a byte at a time, every one is walked.
    for stream in [
        OPENAI_SSE,
        "data: {\"a\":1}\n\ndata: {\"b\":\"\\u0041\"}\r\n\r\ndata: [DONE]\r\rdata: {}\n\n",
        "event: x\ndata:{\"choices\":[]}\n\n: c\n\ndata: {\"usage\":{\"prompt_tokens\":2}}\n\n",
        "data: {\"x\":1}\ndata: {\"y\":2}\n\ndata: not json\n\n",
    ] {
        let mut whole = UsageScanner::new(
            Framing::EventStream,
            Encoding::Identity,
            UsageContainer::Root,
        );
        whole.feed(stream.as_bytes());
        let mut bytewise = UsageScanner::new(
            Framing::EventStream,
            Encoding::Identity,
            UsageContainer::Root,
        );
        for byte in stream.as_bytes() {
            bytewise.feed(std::slice::from_ref(byte));
        }
        assert_eq!(whole.events(), bytewise.events(), "{stream:?}");
        assert_eq!(whole.usage(), bytewise.usage(), "{stream:?}");
    }
    let mut scanner = UsageScanner::new(
        Framing::EventStream,
        Encoding::Identity,
        UsageContainer::Root,
    );
    scanner.feed(b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n");
    assert_eq!(scanner.events(), 2, "[DONE] is not an object");
}

#[test]
fn events_with_usage_null_or_the_word_usage_are_passed_over_and_usage_objects_are_not() {
    let stream = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"the \\\"usage\\\" word\"}}],\"usage\":null}\n\n",
        "data: {\"x\":\"usage\",\"usage\" : null}\n\n",
        "data: {\"choices\":[],\"usage\" :\n",
        " {\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n",
        "data: {\"choices\":[],\"usage\":\t{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n",
        "data: [DONE]\n\n",
    );
    let mut whole = UsageScanner::new(
        Framing::EventStream,
        Encoding::Identity,
        UsageContainer::Root,
    );
    whole.feed(stream.as_bytes());
    assert_eq!(whole.usage(), tokens(Some(5), Some(6)));
    assert_eq!(whole.events(), 4);
}
