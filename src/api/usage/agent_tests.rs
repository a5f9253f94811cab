//! The usage of Responses and Messages answers: JSON bodies and their event streams.

use super::*;

fn scan(container: UsageContainer, framing: Framing, body: &str) -> (Option<Usage>, bool) {
    let mut scanner = UsageScanner::new(framing, Encoding::Identity, container);
    scanner.feed(body.as_bytes());
    (scanner.usage(), scanner.opening_only())
}

/// The same body split at every byte reads the same.
fn scan_split_everywhere(container: UsageContainer, framing: Framing, body: &str) -> Option<Usage> {
    let (whole, _) = scan(container, framing, body);
    for at in 0..=body.len() {
        let mut scanner = UsageScanner::new(framing, Encoding::Identity, container);
        scanner.feed(&body.as_bytes()[..at]);
        scanner.feed(&body.as_bytes()[at..]);
        assert_eq!(scanner.usage(), whole, "split at {at}");
    }
    whole
}

fn counts(prompt: u64, completion: u64, reasoning: Option<u64>, cached: Option<u64>) -> Usage {
    Usage {
        prompt_tokens: Some(prompt),
        completion_tokens: Some(completion),
        reasoning_tokens: reasoning,
        cached_tokens: cached,
    }
}

const RESPONSES_STREAM: &str = concat!(
    "event: response.created\n",
    r#"data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}"#,
    "\n\n",
    "event: response.output_text.delta\n",
    r#"data: {"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"the \"usage\": {"}"#,
    "\n\n",
    "event: response.completed\n",
    r#"data: {"type":"response.completed","sequence_number":2,"response":{"id":"resp_1","output":[{"type":"message","content":[{"type":"output_text","text":"hi","usage":{"input_tokens":999}}]}],"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":8},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":5},"total_tokens":123}}}"#,
    "\n\n",
);

#[test]
fn a_responses_stream_is_read_from_response_completed() {
    let usage = scan_split_everywhere(
        UsageContainer::Response,
        Framing::EventStream,
        RESPONSES_STREAM,
    );
    assert_eq!(usage, Some(counts(36, 87, Some(5), Some(8))));
    // Chat's reading does not look inside `response`.
    let (chat, _) = scan(UsageContainer::Root, Framing::EventStream, RESPONSES_STREAM);
    assert_eq!(chat, None);
}

#[test]
fn a_responses_json_body_is_read_from_its_root() {
    let body = r#"{"id":"resp_1","object":"response","output":[{"type":"message","content":[]}],"usage":{"input_tokens":10,"output_tokens":20,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}"#;
    let usage = scan_split_everywhere(UsageContainer::Response, Framing::Json, body);
    assert_eq!(usage, Some(counts(10, 20, Some(0), Some(0))));
}

#[test]
fn a_container_key_written_with_escapes_is_read() {
    let body = concat!(
        r#"data: {"type":"response.completed","\u0072\u0065\u0073\u0070\u006f\u006e\u0073\u0065":{"usage":{"input_tokens":1,"output_tokens":2}}}"#,
        "\n\n"
    );
    let (usage, _) = scan(UsageContainer::Response, Framing::EventStream, body);
    assert_eq!(usage, Some(counts(1, 2, None, None)));
}

const MESSAGES_STREAM: &str = concat!(
    "event: message_start\n",
    r#"data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    "\n\n",
    "event: ping\n",
    r#"data: {"type": "ping"}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":0}"#,
    "\n\n",
);
const MESSAGES_END: &str = concat!(
    "event: message_delta\n",
    r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
    "\n\n",
    "event: message_stop\n",
    r#"data: {"type":"message_stop"}"#,
    "\n\n",
);

#[test]
fn a_messages_stream_takes_its_prompt_from_message_start_and_its_output_from_message_delta() {
    let stream = format!("{MESSAGES_STREAM}{MESSAGES_END}");
    let usage = scan_split_everywhere(UsageContainer::Message, Framing::EventStream, &stream);
    // The prompt is the input plus what the cache wrote and read.
    assert_eq!(usage, Some(counts(40, 15, None, Some(5))));
    let (_, opening_only) = scan(UsageContainer::Message, Framing::EventStream, &stream);
    assert!(!opening_only);
}

#[test]
fn a_messages_stream_cut_before_message_delta_says_its_output_is_not_final() {
    let (usage, opening_only) = scan(
        UsageContainer::Message,
        Framing::EventStream,
        MESSAGES_STREAM,
    );
    assert_eq!(usage, Some(counts(40, 1, None, Some(5))));
    assert!(opening_only);
}

#[test]
fn a_message_delta_that_restates_the_input_replaces_it() {
    let stream = format!(
        "{MESSAGES_STREAM}data: {}\n\n",
        r#"{"type":"message_delta","usage":{"input_tokens":30,"cache_read_input_tokens":0,"output_tokens":9}}"#
    );
    let (usage, _) = scan(UsageContainer::Message, Framing::EventStream, &stream);
    assert_eq!(usage, Some(counts(30, 9, None, Some(0))));
}

#[test]
fn a_messages_json_body_is_read_from_its_root() {
    let body = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"model":"m","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":6}}"#;
    let usage = scan_split_everywhere(UsageContainer::Message, Framing::Json, body);
    assert_eq!(usage, Some(counts(12, 6, None, Some(0))));
    // count_tokens' answer states no usage object: nothing is charged for counting.
    let (usage, _) = scan(
        UsageContainer::Message,
        Framing::Json,
        r#"{"input_tokens":12}"#,
    );
    assert_eq!(usage, None);
}

#[test]
fn an_invalid_input_count_is_not_made_up_from_the_cache_counts() {
    let body = r#"{"usage":{"input_tokens":-1,"cache_read_input_tokens":4,"output_tokens":2}}"#;
    let (usage, _) = scan(UsageContainer::Message, Framing::Json, body);
    assert_eq!(usage.and_then(|u| u.prompt_tokens), None);
}

#[test]
fn two_usages_in_one_message_merge_however_the_stream_is_split() {
    // Read whole, the container's second usage used to replace its first before the merge;
    // split between them, the two merged: the charge depended on the network's chunking.
    let body = r#"{"message":{"usage":{"input_tokens":1},"usage":{"output_tokens":2}},"usage":{"cache_read_input_tokens":3}}"#;
    let usage = scan_split_everywhere(UsageContainer::Message, Framing::Json, body);
    assert_eq!(usage, Some(counts(1, 2, None, Some(3))));
}
