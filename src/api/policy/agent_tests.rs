//! The Responses and Messages bodies: what is refused and why, and the policy on them.

use super::tests::{applied, assert_refused, changed, policy};
use super::*;

#[test]
fn real_world_responses_bodies_pass_untouched() {
    for body in [
        r#"{"model":"llama-3.1-8b","input":"Tell me a story"}"#,
        r#"{"model":"m","input":[{"role":"user","content":"hi"}],"stream":true,"max_output_tokens":64}"#,
        r#"{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}],"tools":[{"type":"function","name":"f","parameters":{}}],"reasoning":{"effort":"low"},"store":false,"instructions":"be brief"}"#,
        r#"{"model":"m","prompt":{"id":"pmpt_1","variables":{"x":"y"}}}"#,
        r#"{"model":"m","input":[],"previous_response_id":"resp_1","stream":null,"max_output_tokens":null}"#,
    ] {
        let applied = applied(Endpoint::Responses, body, &Models::new(None, []));
        assert_eq!(applied.body, None, "{body}");
    }
}

#[test]
fn malformed_responses_bodies_are_refused_naming_the_field() {
    assert_refused(
        Endpoint::Responses,
        &[
            (r#"{"model":"m"}"#, "input is required"),
            (r#"{"model":"m","input":null}"#, "input is required"),
            (r#"{"input":7}"#, "input must be a string or an array"),
            (
                r#"{"input":{"role":"user"}}"#,
                "input must be a string or an array",
            ),
            (
                r#"{"input":[{"role":"user"},"hi"]}"#,
                "input[1] must be an object",
            ),
            (
                r#"{"input":"a","input":"b"}"#,
                "input appears more than once",
            ),
            (r#"{"input":"a","model":7}"#, "model must be a string"),
            (
                r#"{"input":"a","stream":"yes"}"#,
                "stream must be a boolean",
            ),
            (
                r#"{"input":"a","max_output_tokens":-1}"#,
                "max_output_tokens must be a non-negative integer",
            ),
            (
                r#"{"input":"a","max_output_tokens":1.5}"#,
                "max_output_tokens must be a non-negative integer",
            ),
            ("[]", "body must be a JSON object"),
        ],
    );
}

#[test]
fn the_policy_applies_to_responses_as_to_chat() {
    let models = policy();
    assert_eq!(
        changed(Endpoint::Responses, r#"{"input":"hi"}"#, &models),
        r#"{"model":"llama-3.1-8b","input":"hi"}"#
    );
    assert_eq!(
        changed(
            Endpoint::Responses,
            r#"{"model":"large","input":"hi"}"#,
            &models
        ),
        r#"{"model":"llama-3.1-70b","input":"hi"}"#
    );
    // Streams report usage unasked on this API: nothing is added to a streamed body.
    let plan = plan(
        Endpoint::Responses,
        br#"{"model":"m","input":"hi","stream":true,"max_output_tokens":50}"#,
        &models,
    )
    .unwrap();
    assert!(plan.usage.is_none() && plan.edit.is_none());
    assert_eq!(plan.completion_cap, Some(50));
    let plan = plan_of(Endpoint::Responses, r#"{"input":"hi"}"#);
    assert_eq!(plan, None, "no cap stated");
}

fn plan_of(endpoint: Endpoint, body: &str) -> Option<u64> {
    plan(endpoint, body.as_bytes(), &Models::new(None, []))
        .unwrap()
        .completion_cap
}

#[test]
fn real_world_messages_bodies_pass_untouched() {
    for body in [
        r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Hello"}]}"#,
        r#"{"model":"m","max_tokens":16,"system":"be brief","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"thinking":{"type":"enabled","budget_tokens":1024}}"#,
        r#"{"model":"m","max_tokens":1,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"x"}],"metadata":{"user_id":"u"}}"#,
    ] {
        let applied = applied(Endpoint::Messages, body, &Models::new(None, []));
        assert_eq!(applied.body, None, "{body}");
    }
    assert_eq!(
        plan_of(
            Endpoint::Messages,
            r#"{"max_tokens":300,"messages":[{"role":"user","content":"x"}]}"#
        ),
        Some(300)
    );
}

#[test]
fn malformed_messages_bodies_are_refused_naming_the_field() {
    let user = r#"[{"role":"user","content":"x"}]"#;
    let with = |rest: &str| format!(r#"{{"max_tokens":8,{rest}}}"#);
    let cases = [
        (
            format!(r#"{{"messages":{user}}}"#),
            "max_tokens is required",
        ),
        (
            format!(r#"{{"max_tokens":null,"messages":{user}}}"#),
            "max_tokens is required",
        ),
        (
            format!(r#"{{"max_tokens":0,"messages":{user}}}"#),
            "max_tokens must be a positive integer",
        ),
        (
            format!(r#"{{"max_tokens":"8","messages":{user}}}"#),
            "max_tokens must be a positive integer",
        ),
        (with(r#""model":"m""#), "messages is required"),
        (
            with(r#""messages":[]"#),
            "messages must be a non-empty array",
        ),
        (
            with(r#""messages":"hi""#),
            "messages must be a non-empty array",
        ),
        (
            with(r#""messages":["hi"]"#),
            "messages[0] must be an object",
        ),
        (
            with(r#""messages":[{"role":7,"content":"x"}]"#),
            "messages[0].role must be a string",
        ),
        (
            with(r#""messages":[{"content":"x"}]"#),
            "messages[0].role must be a string",
        ),
        (
            with(r#""messages":[{"role":"user"}]"#),
            "messages[0].content must be a string or an array of content blocks",
        ),
        (
            with(r#""messages":[{"role":"user","content":null}]"#),
            "messages[0].content must be a string or an array of content blocks",
        ),
        (
            with(r#""messages":[{"role":"user","content":[{"type":"text","text":"a"},"b"]}]"#),
            "messages[0].content[1] must be an object",
        ),
        (
            with(&format!(r#""system":7,"messages":{user}"#)),
            "system must be a string or an array",
        ),
        (
            with(&format!(r#""stream":1,"messages":{user}"#)),
            "stream must be a boolean",
        ),
        (
            with(&format!(r#""model":["m"],"messages":{user}"#)),
            "model must be a string",
        ),
    ];
    for (body, message) in cases {
        assert_refused(Endpoint::Messages, &[(body.as_str(), message)]);
    }
}

#[test]
fn count_tokens_needs_no_max_tokens_and_generates_nothing() {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"system":"s"}"#;
    assert_eq!(plan_of(Endpoint::CountTokens, body), Some(0));
    assert_refused(
        Endpoint::CountTokens,
        &[(r#"{"model":"m"}"#, "messages is required")],
    );
}

#[test]
fn the_policy_applies_to_messages_byte_for_byte() {
    let models = policy();
    let body = r#"{"max_tokens":8,"messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(
        changed(Endpoint::Messages, body, &models),
        r#"{"model":"llama-3.1-8b","max_tokens":8,"messages":[{"role":"user","content":"x"}]}"#
    );
    let body =
        r#"{ "model" : "vision", "max_tokens":8,"messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(
        changed(Endpoint::CountTokens, body, &models),
        r#"{ "model" : "qwen2.5-vl-72b", "max_tokens":8,"messages":[{"role":"user","content":"x"}]}"#
    );
    let plan = plan(
        Endpoint::Messages,
        br#"{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"x"}]}"#,
        &models,
    )
    .unwrap();
    assert!(
        plan.usage.is_none(),
        "Messages streams report usage unasked"
    );
}
