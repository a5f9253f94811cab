//! Optional members given as `null`, and the policy's edit made in place.

use super::*;

const USER_HI: &str = r#"[{"role":"user","content":"hi"}]"#;

fn policy() -> Models {
    Models::new(
        Some("llama-3.1-8b".to_string()),
        [("large".to_string(), "llama-3.1-70b".to_string())],
    )
}

fn applied(endpoint: Endpoint, body: &str, models: &Models) -> Applied {
    apply(endpoint, body.as_bytes(), models).unwrap_or_else(|e| panic!("refused {body}: {e}"))
}

#[test]
fn null_optional_members_are_absent() {
    let chat = format!(r#"{{"model":null,"messages":{USER_HI},"stream":null}}"#);
    let embeddings = r#"{"input":"x","model" : null }"#;
    let none = Models::new(None, []);
    for (endpoint, body) in [(Endpoint::Chat, &*chat), (Endpoint::Embeddings, embeddings)] {
        // Without a default nothing changes, and there is no model to report.
        let got = applied(endpoint, body, &none);
        assert_eq!((got.body, got.model), (None, None));
        // With one, the default takes the null's place: still one `model` member.
        let got = applied(endpoint, body, &policy());
        let new = String::from_utf8(got.body.expect("changed")).unwrap();
        assert_eq!(new, body.replacen("null", r#""llama-3.1-8b""#, 1));
        assert_eq!(got.model.as_deref(), Some("llama-3.1-8b"));
        let value: serde_json::Value = serde_json::from_str(&new).unwrap();
        assert_eq!(value["model"], "llama-3.1-8b");
    }
    // `stream: null` alone passes as well.
    let body = format!(r#"{{"messages":{USER_HI},"stream":null}}"#);
    assert_eq!(
        applied(Endpoint::Chat, &body, &Models::new(None, [])).body,
        None
    );
}

#[test]
fn required_members_are_not_made_optional_by_null() {
    let cases = [
        (
            Endpoint::Chat,
            r#"{"messages":null}"#,
            "messages must be a non-empty array",
        ),
        (
            Endpoint::Chat,
            r#"{"messages":[{"role":null}]}"#,
            "messages[0].role must be a string",
        ),
        (
            Endpoint::Embeddings,
            r#"{"input":null}"#,
            "input must be a string, an array of strings, an array of integers or an array of \
             integer arrays",
        ),
        // A repeated model is refused, null or not.
        (
            Endpoint::Chat,
            r#"{"model":null,"model":"a","messages":[{"role":"user"}]}"#,
            "model appears more than once",
        ),
    ];
    for (endpoint, body, message) in cases {
        let e = apply(endpoint, body.as_bytes(), &policy()).unwrap_err();
        assert_eq!(e.message(), message, "{body}");
    }
}

#[test]
fn an_edit_in_place_matches_the_copy_and_fits_in_max_growth() {
    let models = policy();
    let bodies = [
        format!(r#" {{"messages":{USER_HI}}}"#),
        format!(r#"{{"messages":{USER_HI},"model":null}}"#),
        format!(r#"{{"model":"large","messages":{USER_HI}}}"#),
    ];
    for body in &bodies {
        let edit = plan(Endpoint::Chat, body.as_bytes(), &models)
            .unwrap()
            .edit
            .expect("an edit");
        assert!(edit.growth() <= models.max_growth(), "{body}");
        let mut held = Vec::with_capacity(body.len() + models.max_growth());
        held.extend_from_slice(body.as_bytes());
        let before = held.as_ptr();
        edit.apply_in_place(&mut held);
        assert_eq!(held, edit.applied_to(body.as_bytes()), "{body}");
        assert_eq!(held.as_ptr(), before, "the edit reallocated the body");
    }
    // The growth bound covers the longest alias target and the default's insertion.
    assert_eq!(models.max_growth(), r#""model":"llama-3.1-8b","#.len());
    let long = Models::new(None, [("s".to_string(), "x".repeat(100))]);
    assert_eq!(long.max_growth(), 102);
    assert_eq!(Models::new(None, []).max_growth(), 0);
}
