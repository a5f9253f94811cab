//! A streamed chat or completions request is made to ask for its usage, by one splice.

use serde_json::{json, Value};

use super::*;

/// The body the upstream gets: the policy's edit and the usage edit, both made.
fn upstream_body(endpoint: Endpoint, body: &str, models: &Models) -> (String, bool) {
    let plan = plan(endpoint, body.as_bytes(), models).unwrap_or_else(|e| panic!("{body}: {e}"));
    let adds_usage = plan.usage.is_some();
    let edit = match (plan.edit, plan.usage) {
        (Some(a), Some(b)) => Some(a.and(b)),
        (a, b) => a.or(b),
    };
    let out = edit.map_or(body.as_bytes().to_vec(), |e| {
        let copy = e.applied_to(body.as_bytes());
        let mut in_place = Vec::with_capacity(body.len() + e.growth());
        in_place.extend_from_slice(body.as_bytes());
        e.apply_in_place(&mut in_place);
        assert_eq!(copy, in_place, "{body}");
        assert!(e.growth() <= models.max_growth() + USAGE_MAX_GROWTH);
        copy
    });
    (String::from_utf8(out).unwrap(), adds_usage)
}

#[test]
fn a_stream_that_does_not_ask_for_usage_is_made_to() {
    let none = Models::new(None, []);
    let default = Models::new(Some("m".into()), [("a".into(), "target".into())]);
    let cases = [
        (r#"{"messages":[{"role":"user"}],"stream":true}"#, None),
        (
            r#"{"stream":true,"stream_options":null,"prompt":"x"}"#,
            None,
        ),
        (r#"{"prompt":"x","stream":true,"stream_options":{ }}"#, None),
        (
            r#"{"prompt":"x","stream":true,"stream_options":{"include_usage":false}}"#,
            None,
        ),
        (
            r#"{"prompt":"x","stream":true,"stream_options":{"include_usage":null,"x":1}}"#,
            None,
        ),
        (
            r#"{"prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":true}}"#,
            None,
        ),
        (
            r#"{"model":"a","prompt":"x","stream":true,"stream_options":{"x":[1]}}"#,
            Some("target"),
        ),
        (
            r#"{"prompt":"x","stream_options":{"include_usage":false},"model":"a","stream":true}"#,
            Some("target"),
        ),
    ];
    for (body, aliased) in cases {
        let endpoint = if body.contains("messages") {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        };
        for models in [&none, &default] {
            let (out, adds) = upstream_body(endpoint, body, models);
            assert!(adds, "{body}");
            let mut want: Value = serde_json::from_str(body).unwrap();
            let options = &mut want["stream_options"];
            if !options.is_object() {
                *options = json!({});
            }
            options["include_usage"] = Value::Bool(true);
            if std::ptr::eq(models, &default) {
                want["model"] = json!(aliased.unwrap_or("m"));
            }
            let got: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
            assert_eq!(got, want, "{body} became {out}");
        }
    }
}

#[test]
fn requests_that_ask_for_usage_or_do_not_stream_are_left_alone() {
    let none = Models::new(None, []);
    for (endpoint, body) in [
        (
            Endpoint::Chat,
            r#"{"messages":[{"role":"user"}],"stream":true,"stream_options":{"include_usage":true}}"#,
        ),
        (
            Endpoint::Chat,
            r#"{"messages":[{"role":"user"}],"stream":false,"stream_options":{"include_usage":false}}"#,
        ),
        (
            Endpoint::Chat,
            r#"{"messages":[{"role":"user"}],"stream":null}"#,
        ),
        (
            Endpoint::Completions,
            r#"{"prompt":[1,2],"stream_options":null}"#,
        ),
        (Endpoint::Embeddings, r#"{"input":"x","stream":true}"#),
    ] {
        assert_eq!(
            upstream_body(endpoint, body, &none),
            (body.to_string(), false)
        );
    }
}

#[test]
fn stream_options_of_the_wrong_shape_are_refused_by_name() {
    let none = Models::new(None, []);
    for (body, message) in [
        (r#"{"prompt":"x","stream_options":1}"#, "stream_options must be an object"),
        (r#"{"prompt":"x","stream":true,"stream_options":[]}"#, "stream_options must be an object"),
        (r#"{"prompt":"x","stream_options":{"include_usage":"yes"}}"#, "stream_options.include_usage must be a boolean"),
        (r#"{"prompt":"x","stream_options":{"include_usage":true,"include_usage":false}}"#, "stream_options.include_usage appears more than once"),
        (r#"{"prompt":"x","stream_options":{},"stream_options":{}}"#, "stream_options appears more than once"),
        (r#"{"stream":true}"#, "prompt is required"),
        (r#"{"prompt":{}}"#, "prompt must be a string, an array of strings, an array of integers or an array of integer arrays"),
    ] {
        let e = plan(Endpoint::Completions, body.as_bytes(), &none).unwrap_err();
        assert_eq!(e.message(), message, "{body}");
    }
    // vLLM's prompt embeddings stand in for a prompt.
    assert!(plan(Endpoint::Completions, br#"{"prompt_embeds":"b64"}"#, &none).is_ok());
}
