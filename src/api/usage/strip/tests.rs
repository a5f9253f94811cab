use bytes::Bytes;

use super::UsageStripper;

/// An OpenAI stream of `n` content chunks; with `usage`, as `include_usage` makes it: every
/// chunk carries `"usage":null` and a usage-only chunk comes before `[DONE]`.
fn stream(n: usize, usage: bool, eol: &str) -> String {
    let mut out = String::new();
    for i in 0..n {
        let tail = if usage { r#","usage":null"# } else { "" };
        out += &format!(
            r#"data: {{"id":"c1","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"t{i}"}}}}]{tail}}}{eol}{eol}"#
        );
    }
    if usage {
        out += &format!(
            r#"data: {{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":2}}}}{eol}{eol}"#
        );
    }
    out + &format!("data: [DONE]{eol}{eol}")
}

/// Feeds `input` in pieces of `size` bytes and returns everything sent on.
fn filtered(input: &str, size: usize) -> String {
    let mut stripper = UsageStripper::new();
    let mut out = Vec::new();
    for piece in input.as_bytes().chunks(size) {
        out.extend_from_slice(&stripper.filter(Bytes::copy_from_slice(piece)));
    }
    out.extend_from_slice(&stripper.finish());
    String::from_utf8(out).unwrap()
}

#[test]
fn what_include_usage_added_is_taken_back_whatever_the_chunking() {
    for eol in ["\n", "\r\n", "\r"] {
        let with = stream(4, true, eol);
        let without = stream(4, false, eol);
        for size in [1, 2, 3, 7, 64, with.len()] {
            assert_eq!(
                filtered(&with, size),
                without,
                "eol {eol:?}, pieces of {size}"
            );
        }
    }
}

#[test]
fn a_stream_without_usage_passes_unchanged_and_uncopied() {
    let input = stream(3, false, "\n");
    assert_eq!(filtered(&input, 5), input);
    let chunk = Bytes::from(input);
    let mut stripper = UsageStripper::new();
    let out = stripper.filter(chunk.clone());
    assert_eq!(
        out.as_ptr(),
        chunk.as_ptr(),
        "whole events are passed as they are"
    );
    assert_eq!(out.len(), chunk.len());
}

#[test]
fn an_incomplete_event_waits_for_its_end_then_goes_on() {
    let mut stripper = UsageStripper::new();
    assert_eq!(stripper.filter(Bytes::from_static(b"data: {\"a\"")), "");
    assert_eq!(
        stripper.filter(Bytes::from_static(b":1}\n\ndata: {\"b\"")),
        "data: {\"a\":1}\n\n"
    );
    assert_eq!(
        stripper.finish(),
        "data: {\"b\"",
        "a cut event is sent as it was"
    );
}

#[test]
fn usage_as_the_first_member_goes_with_the_comma_after_it() {
    let out = filtered("data: {\"usage\": null , \"choices\":[{\"x\":1}]}\n\n", 100);
    assert_eq!(out, "data: {\"choices\":[{\"x\":1}]}\n\n");
    let out = filtered("data: {\"usage\":null}\n\n", 100);
    assert_eq!(out, "data: {}\n\n");
}

#[test]
fn a_usage_object_beside_content_is_removed_and_the_content_kept() {
    // LiteLLM's trap: the final chunk still carries choices.
    let input = "data: {\"choices\":[{\"delta\":{\"content\":\"end\"}}],\"usage\":{\"prompt_tokens\":1}}\n\n";
    assert_eq!(
        filtered(input, 9),
        "data: {\"choices\":[{\"delta\":{\"content\":\"end\"}}]}\n\n"
    );
}

#[test]
fn usage_that_is_not_a_top_level_member_is_left_alone() {
    for input in [
        "data: {\"choices\":[{\"usage\":{\"prompt_tokens\":1}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\"\"}}]}\n\n",
        "data: not json \"usage\"\n\n",
        // Two data lines: one event, left as it is.
        "data: {\"choices\":[],\ndata: \"usage\":{}}\n\n",
        "event: x\nid: 1\n: \"usage\"\n\n",
    ] {
        assert_eq!(filtered(input, 4), input);
    }
}

#[test]
fn other_fields_of_the_usage_event_go_with_it() {
    let input = "event: chunk\nid: 9\ndata: {\"choices\":[ ],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n";
    assert_eq!(filtered(input, 3), "data: [DONE]\n\n");
}
