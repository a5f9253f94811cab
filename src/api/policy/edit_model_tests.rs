//! The model policy's edits: the default model, aliases, and the budget's completion cap.

use super::tests::{applied, changed, has_model, no_policy, policy, CHAT_BODIES, USER_HI};
use super::*;
use crate::api::Api;

// ---- Default model ----

#[test]
fn the_default_is_inserted_after_the_brace() {
    let body = format!(r#"{{"messages":{USER_HI},"stream":true,"temperature":0.5}}"#);
    let got = applied(Endpoint::Chat, &body, &policy());
    assert_eq!(got.model.as_deref(), Some("llama-3.1-8b"));
    // Byte for byte: key order and everything else as sent.
    assert_eq!(
        String::from_utf8(got.body.expect("changed")).expect("UTF-8"),
        format!(
            r#"{{"model":"llama-3.1-8b","messages":{USER_HI},"stream":true,"temperature":0.5}}"#
        )
    );
}

#[test]
fn the_default_changes_nothing_else() {
    let insert = br#""model":"llama-3.1-8b","#;
    let models = policy();
    for body in CHAT_BODIES.iter().filter(|b| !has_model(b)) {
        let new = changed(Endpoint::Chat, body, &models);
        let at = body.find('{').expect("an object") + 1;
        assert_eq!(new.len(), body.len() + insert.len());
        assert_eq!(new.as_bytes()[..at], body.as_bytes()[..at]);
        assert_eq!(new.as_bytes()[at..at + insert.len()], insert[..]);
        assert_eq!(new.as_bytes()[at + insert.len()..], body.as_bytes()[at..]);
        // The same JSON plus the model.
        let mut old: serde_json::Value = serde_json::from_str(body).expect("JSON");
        old["model"] = "llama-3.1-8b".into();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&new).expect("JSON"),
            old
        );
        // And the policy has nothing more to do with the result.
        assert_eq!(applied(Endpoint::Chat, &new, &models).body, None);
    }
}

#[test]
fn the_default_goes_inside_leading_whitespace() {
    let body = " \r\n\t{ \"input\" : [\"a\"] }\n";
    assert_eq!(
        changed(Endpoint::Embeddings, body, &policy()),
        " \r\n\t{\"model\":\"llama-3.1-8b\", \"input\" : [\"a\"] }\n"
    );
}

#[test]
fn the_default_is_json_encoded() {
    let name = "we\"ird\\name/ü\n";
    let models = Models::new(Some(name.to_string()), []);
    let new = changed(Endpoint::Embeddings, r#"{"input":"x"}"#, &models);
    assert_eq!(new, r#"{"model":"we\"ird\\name/ü\n","input":"x"}"#);
    let value: serde_json::Value = serde_json::from_str(&new).expect("JSON");
    assert_eq!(value["model"], name);
}

#[test]
fn a_present_model_is_kept_over_the_default() {
    let body = format!(r#"{{"messages":{USER_HI},"model":"mistral-7b"}}"#);
    let got = applied(Endpoint::Chat, &body, &policy());
    assert_eq!(got.body, None);
    assert_eq!(got.model.as_deref(), Some("mistral-7b"));
    // Even an empty one: that is the upstream's to judge.
    let got = applied(
        Endpoint::Embeddings,
        r#"{"model":"","input":"x"}"#,
        &policy(),
    );
    assert_eq!((got.body, got.model.as_deref()), (None, Some("")));
}

// ---- Aliases ----

#[test]
fn an_alias_is_replaced_in_place() {
    let body = format!(r#"{{"messages":{USER_HI},"model":"large","stream":false}}"#);
    let got = applied(Endpoint::Chat, &body, &policy());
    assert_eq!(got.model.as_deref(), Some("llama-3.1-70b"));
    assert_eq!(
        String::from_utf8(got.body.expect("changed")).expect("UTF-8"),
        body.replace(r#""large""#, r#""llama-3.1-70b""#)
    );
}

#[test]
fn only_the_token_is_replaced() {
    // Whitespace around the token, and the same text elsewhere in the body, stay as they are.
    let body = "{\n  \"model\" :  \"large\" ,\n  \"input\": [\"large\", \"model\"]\n}";
    assert_eq!(
        changed(Endpoint::Embeddings, body, &policy()),
        "{\n  \"model\" :  \"llama-3.1-70b\" ,\n  \"input\": [\"large\", \"model\"]\n}"
    );
}

#[test]
fn an_escaped_alias_is_still_the_alias() {
    let body = format!(r#"{{"model":"l\u0061rge","messages":{USER_HI}}}"#);
    let got = applied(Endpoint::Chat, &body, &policy());
    assert_eq!(got.model.as_deref(), Some("llama-3.1-70b"));
    assert_eq!(
        String::from_utf8(got.body.expect("changed")).expect("UTF-8"),
        format!(r#"{{"model":"llama-3.1-70b","messages":{USER_HI}}}"#)
    );
}

#[test]
fn an_escaped_model_key_is_the_model() {
    let body = format!(r#"{{"mod\u0065l":"vision","messages":{USER_HI}}}"#);
    let got = applied(Endpoint::Chat, &body, &policy());
    assert_eq!(got.model.as_deref(), Some("qwen2.5-vl-72b"));
    assert_eq!(
        String::from_utf8(got.body.expect("changed")).expect("UTF-8"),
        format!(r#"{{"mod\u0065l":"qwen2.5-vl-72b","messages":{USER_HI}}}"#)
    );
    // Present, so no default is inserted beside it.
    let body = format!(r#"{{"m\u006fdel":"gpt-4o","messages":{USER_HI}}}"#);
    assert_eq!(applied(Endpoint::Chat, &body, &policy()).body, None);
}

#[test]
fn alias_keys_are_matched_exactly() {
    for model in [
        "Large",
        "large ",
        "larger",
        "llama-3.1-70b",
        "gpt-4o",
        "claude-3-5-sonnet",
    ] {
        let body = format!(r#"{{"model":"{model}","input":"x"}}"#);
        let got = applied(Endpoint::Embeddings, &body, &policy());
        assert_eq!((got.body, got.model.as_deref()), (None, Some(model)));
    }
}

#[test]
fn alias_targets_are_json_encoded() {
    let models = Models::new(None, [("q".to_string(), "org/model \"v2\"".to_string())]);
    let new = changed(
        Endpoint::Embeddings,
        r#"{"model":"q","input":"x"}"#,
        &models,
    );
    assert_eq!(new, r#"{"model":"org/model \"v2\"","input":"x"}"#);
}

#[test]
fn an_alias_to_itself_changes_nothing() {
    let models = Models::new(None, [("same".to_string(), "same".to_string())]);
    let got = applied(
        Endpoint::Embeddings,
        r#"{"model":"same","input":"x"}"#,
        &models,
    );
    assert_eq!((got.body, got.model.as_deref()), (None, Some("same")));
}

#[test]
fn a_big_vision_body_is_changed_only_at_the_model() {
    let image = "A".repeat(3 << 20);
    let body = format!(
        r#"{{"model":"vision","messages":[{{"role":"user","content":[{{"type":"text","text":"?"}},{{"type":"image_url","image_url":{{"url":"data:image/jpeg;base64,{image}"}}}}]}}]}}"#
    );
    let new = changed(Endpoint::Chat, &body, &policy());
    assert_eq!(new, body.replacen(r#""vision""#, r#""qwen2.5-vl-72b""#, 1));
}

// ---- Endpoints ----

#[test]
fn endpoints() {
    use http::Method;
    let cases: &[(&Method, &str, Option<Endpoint>)] = &[
        (&Method::POST, "/v1/chat/completions", Some(Endpoint::Chat)),
        (
            &Method::POST,
            "/openai/v1/chat/completions?api-version=2024-06-01",
            Some(Endpoint::Chat),
        ),
        (&Method::POST, "/v1/embeddings", Some(Endpoint::Embeddings)),
        (
            &Method::POST,
            "/embeddings?x=/chat/completions",
            Some(Endpoint::Embeddings),
        ),
        (&Method::POST, "/v1/chat/completions/", Some(Endpoint::Chat)),
        (&Method::POST, "/v1/chat/completions-x", None),
        (
            &Method::POST,
            "/v1/completions",
            Some(Endpoint::Completions),
        ),
        (&Method::POST, "/v1/myembeddings", None),
        (&Method::POST, "/v1/models?x=/embeddings", None),
        (&Method::POST, "", None),
        (&Method::GET, "/v1/chat/completions", None),
        (&Method::PUT, "/v1/embeddings", None),
    ];
    for (method, path, endpoint) in cases {
        assert_eq!(
            Endpoint::of(Api::OpenAi, method, path.as_bytes()),
            *endpoint,
            "{method} {path}"
        );
    }
}

#[test]
fn every_prompt_of_a_completions_array_and_every_choice_multiplies_the_cap() {
    let cap = |body: &str| {
        crate::api::plan(Endpoint::Completions, body.as_bytes(), &no_policy())
            .map(|p| (p.completion_cap, p.completions))
            .unwrap()
    };
    assert_eq!(
        cap(r#"{"prompt":["a","b","c"],"max_tokens":10}"#),
        (Some(30), 3)
    );
    assert_eq!(
        cap(r#"{"prompt":[[1,2],[3],[4]],"max_tokens":10,"n":2}"#),
        (Some(60), 6)
    );
    // One token array is one prompt.
    assert_eq!(cap(r#"{"prompt":[1,2,3],"max_tokens":10}"#), (Some(10), 1));
    // No cap stated: none, but the completions are still counted for the one inserted.
    assert_eq!(cap(r#"{"prompt":["a","b"],"best_of":4}"#), (None, 8));
}

#[test]
fn a_budgeted_request_without_a_cap_gets_one_inserted_or_is_refused() {
    use crate::api::{plan_capped, CapRule};
    let insert = CapRule::new(1024, false);
    let refuse = CapRule::new(1024, true);
    let models = no_policy();
    let cases = [
        (
            Endpoint::Chat,
            format!(r#"{{"messages":{USER_HI},"n":3}}"#),
            "max_completion_tokens",
            3,
        ),
        (
            Endpoint::Completions,
            r#"{"prompt":["a","b"]}"#.to_string(),
            "max_tokens",
            2,
        ),
        (
            Endpoint::Responses,
            r#"{"input":"hi"}"#.to_string(),
            "max_output_tokens",
            1,
        ),
    ];
    for (endpoint, body, field, completions) in cases {
        let plan = plan_capped(endpoint, body.as_bytes(), &models, Some(&insert)).unwrap();
        assert_eq!(plan.completion_cap, Some(1024 * completions), "{body}");
        let sent = plan.edit.unwrap().applied_to(body.as_bytes());
        let sent: serde_json::Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(sent[field], 1024, "{sent}");
        // Byte-exact: the client's body follows the inserted member unchanged.
        let mut original: serde_json::Value = serde_json::from_str(&body).unwrap();
        original[field] = 1024.into();
        assert_eq!(sent, original);
        let refused = plan_capped(endpoint, body.as_bytes(), &models, Some(&refuse));
        let message = refused.unwrap_err().message().to_string();
        assert!(
            message.starts_with(&format!("{field} is required")),
            "{message}"
        );
    }
    // A stated cap (a chat's legacy max_tokens included) is kept as it is.
    let stated = format!(r#"{{"messages":{USER_HI},"max_tokens":5}}"#);
    let plan = plan_capped(Endpoint::Chat, stated.as_bytes(), &models, Some(&refuse)).unwrap();
    assert_eq!((plan.completion_cap, plan.edit), (Some(5), None));
    // Embeddings generate nothing: no cap to insert.
    let embed = r#"{"input":"a"}"#;
    let plan = plan_capped(
        Endpoint::Embeddings,
        embed.as_bytes(),
        &models,
        Some(&refuse),
    )
    .unwrap();
    assert_eq!((plan.completion_cap, plan.edit), (Some(0), None));
}
