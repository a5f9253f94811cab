//! The shapes the body reader checks, on every endpoint, and its messages.

use super::*;

pub(super) fn no_policy() -> Models {
    Models::new(None, [])
}

/// A default and two aliases, as a service's `[models]` table would give.
pub(super) fn policy() -> Models {
    Models::new(
        Some("llama-3.1-8b".to_string()),
        [
            ("large".to_string(), "llama-3.1-70b".to_string()),
            ("vision".to_string(), "qwen2.5-vl-72b".to_string()),
        ],
    )
}

fn refused(endpoint: Endpoint, body: &str) -> String {
    match apply(endpoint, body.as_bytes(), &no_policy()) {
        Err(e) => e.message().to_string(),
        Ok(applied) => panic!("accepted {body}: {applied:?}"),
    }
}

/// Asserts each body is refused with its message.
pub(super) fn assert_refused(endpoint: Endpoint, cases: &[(&str, &str)]) {
    for (body, message) in cases {
        assert_eq!(refused(endpoint, body), *message, "body: {body}");
    }
}

pub(super) fn applied(endpoint: Endpoint, body: &str, models: &Models) -> Applied {
    match apply(endpoint, body.as_bytes(), models) {
        Ok(applied) => applied,
        Err(e) => panic!("refused {body}: {e}"),
    }
}

pub(super) fn changed(endpoint: Endpoint, body: &str, models: &Models) -> String {
    let applied = applied(endpoint, body, models);
    String::from_utf8(applied.body.expect("a changed body")).expect("UTF-8")
}

/// Whether `body` has a top-level model.
pub(super) fn has_model(body: &str) -> bool {
    let value: serde_json::Value = serde_json::from_str(body).expect("JSON");
    value.get("model").is_some()
}

pub(super) const USER_HI: &str = r#"[{"role":"user","content":"hi"}]"#;

// ---- Real-world bodies: valid, and untouched when no policy applies ----

pub(super) const CHAT_BODIES: &[&str] = &[
    // OpenAI SDK: tools and tool_choice.
    r#"{"model":"gpt-4o","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"What's the weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}}],"tool_choice":"auto","parallel_tool_calls":false,"temperature":0.2,"max_tokens":256}"#,
    // An assistant message with tool_calls and no content, then the tool's answer.
    r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","tool_calls":[{"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_abc","content":"{\"temp_c\":21}"}],"tool_choice":{"type":"function","function":{"name":"get_weather"}}}"#,
    // The same with content null, as some SDKs send it.
    r#"{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]}"#,
    // A vision request: text and image_url parts, the image a data URI.
    r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":[{"type":"text","text":"What is in this image?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==","detail":"low"}}]}],"max_tokens":300}"#,
    // Streaming with usage in the last chunk.
    r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Count to 3"}],"stream":true,"stream_options":{"include_usage":true}}"#,
    r#"{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"stream":false}"#,
    // Structured output.
    r#"{"model":"gpt-4o-2024-08-06","messages":[{"role":"system","content":"Extract the event."},{"role":"user","content":"Alice and Bob meet on Friday."}],"response_format":{"type":"json_schema","json_schema":{"name":"event","strict":true,"schema":{"type":"object","properties":{"name":{"type":"string"},"participants":{"type":"array","items":{"type":"string"}}},"required":["name","participants"],"additionalProperties":false}}}}"#,
    // Log probabilities, several choices, a seed, stop strings.
    r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}],"logprobs":true,"top_logprobs":5,"n":2,"seed":42,"stop":["\n\n","END"],"frequency_penalty":-0.5,"logit_bias":{"50256":-100},"user":"user-1234"}"#,
    // A vLLM extension.
    r#"{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Why is the sky blue?"}],"chat_template_kwargs":{"enable_thinking":false},"top_k":20,"min_p":0.0}"#,
    // Unicode, escapes, a surrogate pair, an escaped model name.
    r#"{"model":"m\u00f6del","messages":[{"role":"user","name":"J\u00fcrgen","content":"Grüße, 世界 😀 \ud83d\ude00 \"quoted\" \\ back\/slash\nnew line\ttab"}]}"#,
    // Pretty-printed with CRLF line ends, a developer message, text parts.
    "{\r\n  \"messages\": [\r\n    {\"role\": \"developer\", \"content\": [{\"type\": \"text\", \"text\": \"Be brief.\"}]},\r\n    {\"role\": \"user\", \"content\": \"Hi\"}\r\n  ],\r\n  \"max_completion_tokens\": 64,\r\n  \"metadata\": {\"trace\": \"a\"}\r\n}\r\n",
    // Unknown fields of every JSON type, including some that share names with embeddings.
    r#"{"messages":[{"role":"user","content":"hi","extra":[1,{"a":null}]}],"input":5,"x":null,"y":1.5e-3,"z":[[[]]],"w":{"model":5}}"#,
];

const EMBEDDINGS_BODIES: &[&str] = &[
    r#"{"input":"The food was delicious and the waiter...","model":"text-embedding-3-small","encoding_format":"float"}"#,
    r#"{"model":"text-embedding-3-large","input":["first","second","Grüße \u00e9"],"dimensions":256,"user":"u"}"#,
    r#"{"input":[1820,6543,25,0,-1,18446744073709551615,-9223372036854775808],"model":"bge-m3"}"#,
    r#"{"input":[[1820,6543],[25],[]],"model":"bge-m3"}"#,
    r#"{"input":[]}"#,
    r#"{"input":"x","messages":5,"stream":"yes"}"#,
];

#[test]
fn real_world_chat_bodies_pass_untouched() {
    for body in CHAT_BODIES {
        let got = applied(Endpoint::Chat, body, &no_policy());
        assert_eq!(got.body, None, "body: {body}");
    }
}

#[test]
fn real_world_embeddings_bodies_pass_untouched() {
    for body in EMBEDDINGS_BODIES {
        let got = applied(Endpoint::Embeddings, body, &no_policy());
        assert_eq!(got.body, None, "body: {body}");
    }
}

#[test]
fn a_model_no_alias_names_passes_untouched() {
    for body in CHAT_BODIES.iter().filter(|b| has_model(b)) {
        let got = applied(Endpoint::Chat, body, &policy());
        assert_eq!(got.body, None, "body: {body}");
        assert!(got.model.is_some());
    }
}

#[test]
fn the_model_is_reported_unescaped() {
    let got = applied(Endpoint::Chat, CHAT_BODIES[9], &no_policy());
    assert_eq!(got.model.as_deref(), Some("mödel"));
    let got = applied(Endpoint::Chat, CHAT_BODIES[0], &no_policy());
    assert_eq!(got.model.as_deref(), Some("gpt-4o"));
}

#[test]
fn no_model_and_no_default_is_no_model() {
    let body = format!(r#"{{"messages":{USER_HI}}}"#);
    let got = applied(Endpoint::Chat, &body, &no_policy());
    assert_eq!(
        got,
        Applied {
            body: None,
            model: None
        }
    );
}

#[test]
fn every_prefix_of_a_valid_body_is_refused() {
    let chat = CHAT_BODIES.iter().map(|b| (Endpoint::Chat, b));
    let embeddings = EMBEDDINGS_BODIES.iter().map(|b| (Endpoint::Embeddings, b));
    for (endpoint, body) in chat.chain(embeddings) {
        let bytes = body.trim_end().as_bytes();
        for len in 0..bytes.len() {
            assert!(
                apply(endpoint, &bytes[..len], &policy()).is_err(),
                "prefix {len} of {body}"
            );
        }
    }
}

// ---- Not JSON ----

#[test]
fn not_json_names_line_and_column() {
    let complete = format!(r#"{{"messages":{USER_HI}}}"#);
    assert_refused(
        Endpoint::Chat,
        &[
            ("", "body is not valid JSON (line 1, column 0)"),
            ("   ", "body is not valid JSON (line 1, column 3)"),
            ("{", "body is not valid JSON (line 1, column 1)"),
            ("hello", "body is not valid JSON (line 1, column 1)"),
            (r#"{"a":1,}"#, "body is not valid JSON (line 1, column 8)"),
            (
                "{\n\"model\": 'x'}",
                "body is not valid JSON (line 2, column 10)",
            ),
            (
                &format!("{complete} x"),
                "body is not valid JSON (line 1, column 47)",
            ),
            (
                &format!("{complete}{{}}"),
                "body is not valid JSON (line 1, column 46)",
            ),
            // Escapes are checked in values nobody inspects too.
            (r#"{"x":"\q"}"#, "body is not valid JSON (line 1, column 8)"),
        ],
    );
    // Whitespace after the object is fine.
    assert!(apply(
        Endpoint::Chat,
        format!("{complete} \n").as_bytes(),
        &no_policy()
    )
    .is_ok());
}

#[test]
fn invalid_utf8_is_not_json_wherever_it_is() {
    let cases: &[(&[u8], &str)] = &[
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
            "body is not valid JSON (line 1, column 40)",
        ),
        // In a value nobody inspects, which serde_json alone would skip unchecked.
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\n\"x\":\"a\xc3\"}",
            "body is not valid JSON (line 2, column 7)",
        ),
        (
            b"\xef\xbb\xbf{}",
            "body is not valid JSON (line 1, column 1)",
        ),
    ];
    for (body, message) in cases {
        let got = apply(Endpoint::Chat, body, &no_policy());
        assert_eq!(got.map_err(|e| e.to_string()), Err(message.to_string()));
    }
}

#[test]
fn nesting_too_deep_is_not_json_even_where_nobody_looks() {
    let nested = |depth: usize| {
        format!(
            r#"{{"messages":{USER_HI},"x":{}{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    };
    assert!(apply(Endpoint::Chat, nested(100).as_bytes(), &no_policy()).is_ok());
    assert_eq!(
        refused(Endpoint::Chat, &nested(100_000)),
        "body is not valid JSON (line 1, column 176)"
    );
}

#[test]
fn a_lone_surrogate_escape_is_not_json() {
    // serde_json's rule, wherever the string is.
    let body = format!(r#"{{"messages":{USER_HI},"x":"\ud800"}}"#);
    assert_eq!(
        refused(Endpoint::Chat, &body),
        "body is not valid JSON (line 1, column 57)"
    );
}

// ---- Shapes ----

#[test]
fn the_body_must_be_an_object() {
    for body in ["[]", "[1,", r#""s""#, "1", "-1.5", "null", "true", " [{}]"] {
        assert_eq!(refused(Endpoint::Chat, body), "body must be a JSON object");
        assert_eq!(
            refused(Endpoint::Embeddings, body),
            "body must be a JSON object"
        );
    }
}

#[test]
fn chat_messages() {
    assert_refused(
        Endpoint::Chat,
        &[
            ("{}", "messages is required"),
            (r#"{"model":"m","stream":true}"#, "messages is required"),
            (r#"{"messages":[]}"#, "messages must be a non-empty array"),
            (r#"{"messages":null}"#, "messages must be a non-empty array"),
            (r#"{"messages":"hi"}"#, "messages must be a non-empty array"),
            (
                r#"{"messages":{"role":"user"}}"#,
                "messages must be a non-empty array",
            ),
            (r#"{"messages":[1]}"#, "messages[0] must be an object"),
            (
                r#"{"messages":[{"role":"user","content":"a"},"b"]}"#,
                "messages[1] must be an object",
            ),
            (r#"{"messages":[null]}"#, "messages[0] must be an object"),
        ],
    );
}

#[test]
fn chat_roles() {
    assert_refused(
        Endpoint::Chat,
        &[
            (
                r#"{"messages":[{"content":"hi"}]}"#,
                "messages[0].role must be a string",
            ),
            (r#"{"messages":[{}]}"#, "messages[0].role must be a string"),
            (
                r#"{"messages":[{"role":"user"},{"role":null}]}"#,
                "messages[1].role must be a string",
            ),
            (
                r#"{"messages":[{"role":7}]}"#,
                "messages[0].role must be a string",
            ),
            (
                r#"{"messages":[{"role":["user"]}]}"#,
                "messages[0].role must be a string",
            ),
        ],
    );
}

#[test]
fn chat_contents() {
    let must = "messages[0].content must be a string, an array of content parts or null";
    assert_refused(
        Endpoint::Chat,
        &[
            (r#"{"messages":[{"role":"user","content":5}]}"#, must),
            (r#"{"messages":[{"role":"user","content":true}]}"#, must),
            (
                r#"{"messages":[{"content":{"text":"hi"},"role":"user"}]}"#,
                must,
            ),
            (
                r#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":1.5}]}"#,
                "messages[1].content must be a string, an array of content parts or null",
            ),
            (
                r#"{"messages":[{"role":"user","content":["hi"]}]}"#,
                "messages[0].content[0] must be an object",
            ),
            (
                r#"{"messages":[{"role":"system","content":"a"},{"role":"user","content":[{"type":"text","text":"a"},null]}]}"#,
                "messages[1].content[1] must be an object",
            ),
        ],
    );
    // An empty array of parts is not the gateway's business.
    let body = r#"{"messages":[{"role":"user","content":[]}]}"#;
    assert!(apply(Endpoint::Chat, body.as_bytes(), &no_policy()).is_ok());
}

#[test]
fn model_and_stream_types() {
    for endpoint in [Endpoint::Chat, Endpoint::Embeddings] {
        // `null` is absent (edit_tests.rs).
        for model in ["5", "true", "[\"gpt-4o\"]", "{\"name\":\"gpt-4o\"}"] {
            let body = format!(r#"{{"model":{model},"messages":{USER_HI},"input":"x"}}"#);
            assert_eq!(refused(endpoint, &body), "model must be a string");
        }
    }
    for stream in ["\"true\"", "1", "{}"] {
        let body = format!(r#"{{"messages":{USER_HI},"stream":{stream}}}"#);
        assert_eq!(refused(Endpoint::Chat, &body), "stream must be a boolean");
    }
}

#[test]
fn embeddings_input() {
    let must = "input must be a string, an array of strings, an array of integers or an array \
                of integer arrays";
    assert_refused(Endpoint::Embeddings, &[("{}", "input is required")]);
    assert_refused(
        Endpoint::Embeddings,
        &[
            (r#"{"model":"m"}"#, "input is required"),
            (
                r#"{"messages":[{"role":"user","content":"a"}]}"#,
                "input is required",
            ),
        ],
    );
    for input in [
        "null",
        "5",
        "true",
        "{}",
        "[null]",
        "[true]",
        "[{}]",
        "[1.0]",
        "[1e3]",
        "[18446744073709551616]",
        "[-9223372036854775809]",
        r#"["a",1]"#,
        r#"[1,"a"]"#,
        "[1,[2]]",
        r#"[[1],"a"]"#,
        "[[1,2.5]]",
        r#"[[1,"2"]]"#,
        "[[[1]]]",
        r#"[["a"]]"#,
    ] {
        let body = format!(r#"{{"input":{input},"model":"m"}}"#);
        assert_eq!(refused(Endpoint::Embeddings, &body), must, "input: {input}");
    }
}

#[test]
fn a_key_read_twice_is_refused() {
    let user = r#"{"role":"user","content":"a"}"#;
    assert_refused(
        Endpoint::Chat,
        &[
            (
                &format!(r#"{{"model":"a","messages":{USER_HI},"model":"b"}}"#),
                "model appears more than once",
            ),
            // Refused before the second value's type is looked at.
            (
                &format!(r#"{{"model":"a","model":null,"messages":{USER_HI}}}"#),
                "model appears more than once",
            ),
            (
                &format!(r#"{{"messages":{USER_HI},"messages":{USER_HI}}}"#),
                "messages appears more than once",
            ),
            (
                &format!(r#"{{"messages":{USER_HI},"stream":true,"stream":false}}"#),
                "stream appears more than once",
            ),
            (
                &format!(r#"{{"messages":[{user},{{"role":"user","role":"system"}}]}}"#),
                "messages[1].role appears more than once",
            ),
            (
                r#"{"messages":[{"role":"user","content":"a","content":[]}]}"#,
                "messages[0].content appears more than once",
            ),
            // Spelled with escapes, it is the same key to every parser upstream.
            (
                &format!(r#"{{"model":"a","messages":{USER_HI},"mod\u0065l":"b"}}"#),
                "model appears more than once",
            ),
            (
                r#"{"messages":[{"role":"user","r\u006fle":"user"}]}"#,
                "messages[0].role appears more than once",
            ),
        ],
    );
    assert_refused(
        Endpoint::Embeddings,
        &[
            (
                r#"{"input":"a","input":"b"}"#,
                "input appears more than once",
            ),
            (
                r#"{"model":"a","input":"b","model":"a"}"#,
                "model appears more than once",
            ),
        ],
    );
    // Keys the gateway does not read may repeat, as may keys of other endpoints.
    let body = format!(r#"{{"messages":{USER_HI},"user":1,"user":2,"input":1,"input":2}}"#);
    assert!(apply(Endpoint::Chat, body.as_bytes(), &no_policy()).is_ok());
}

#[test]
fn the_caps_budgets_reserve_are_read_and_checked() {
    let cap = |endpoint, body: &str| {
        crate::api::plan(endpoint, body.as_bytes(), &no_policy())
            .map(|p| p.completion_cap)
            .map_err(|e| e.message().to_string())
    };
    let chat = |extra: &str| format!(r#"{{"messages":{USER_HI}{extra}}}"#);
    assert_eq!(cap(Endpoint::Chat, &chat("")), Ok(None));
    assert_eq!(
        cap(Endpoint::Chat, &chat(r#","max_tokens":50"#)),
        Ok(Some(50))
    );
    assert_eq!(
        cap(
            Endpoint::Chat,
            &chat(r#","max_tokens":50,"max_completion_tokens":70,"n":3"#)
        ),
        Ok(Some(210))
    );
    assert_eq!(
        cap(Endpoint::Chat, &chat(r#","max_tokens":null,"n":4"#)),
        Ok(None)
    );
    assert_eq!(
        cap(
            Endpoint::Completions,
            r#"{"prompt":"a","max_tokens":8,"n":2,"best_of":5}"#
        ),
        Ok(Some(40))
    );
    assert_eq!(
        cap(Endpoint::Embeddings, r#"{"input":"a","max_tokens":9}"#),
        Ok(Some(0))
    );
    for (extra, message) in [
        (
            r#","max_tokens":-1"#,
            "max_tokens must be a non-negative integer",
        ),
        (
            r#","max_tokens":1.5"#,
            "max_tokens must be a non-negative integer",
        ),
        (
            r#","max_completion_tokens":"9""#,
            "max_completion_tokens must be a non-negative integer",
        ),
        (r#","n":[1]"#, "n must be a non-negative integer"),
        (
            r#","max_tokens":1,"max_tokens":2"#,
            "max_tokens appears more than once",
        ),
    ] {
        assert_eq!(
            cap(Endpoint::Chat, &chat(extra)),
            Err(message.to_string()),
            "{extra}"
        );
    }
}

#[test]
fn the_first_problem_found_wins() {
    assert_refused(
        Endpoint::Chat,
        &[
            (r#"{"model":1,"messages":[]}"#, "model must be a string"),
            (
                r#"{"messages":[],"model":1}"#,
                "messages must be a non-empty array",
            ),
            (r#"{"stream":1,"messages":[5]}"#, "stream must be a boolean"),
            (
                r#"{"messages":[{"content":5}]}"#,
                "messages[0].content must be a string, an array of content parts or null",
            ),
            (
                r#"{"messages":[{"content":"a"}],"model":1}"#,
                "messages[0].role must be a string",
            ),
            // A shape problem before a syntax error wins, and the other way round.
            (
                r#"{"messages":5,"x":"#,
                "messages must be a non-empty array",
            ),
            (
                r#"{"x":,"messages":5}"#,
                "body is not valid JSON (line 1, column 6)",
            ),
        ],
    );
}

#[test]
fn messages_never_quote_the_body() {
    let secret = "sk-secret-value";
    let bodies = [
        format!(r#"{{"messages":"{secret}"}}"#),
        format!(r#"{{"messages":[{{"role":"user","content":{{"{secret}":1}}}}]}}"#),
        format!(r#"{{"model":{{"{secret}":1}},"messages":{USER_HI}}}"#),
        format!(r#"{{"messages":{USER_HI},"stream":"{secret}"}}"#),
        format!(r#"{{"{secret}":1,"{secret}":tru}}"#),
        format!(r#""{secret}""#),
    ];
    for body in &bodies {
        let message = refused(Endpoint::Chat, body);
        assert!(!message.contains(secret), "{message}");
    }
    let message = refused(
        Endpoint::Embeddings,
        &format!(r#"{{"input":["{secret}",1]}}"#),
    );
    assert!(!message.contains(secret), "{message}");
}

#[test]
fn body_error_displays_its_message() {
    let e = apply(Endpoint::Chat, b"{}", &no_policy()).unwrap_err();
    assert_eq!(e.to_string(), "messages is required");
    assert_eq!(e.message(), "messages is required");
}
