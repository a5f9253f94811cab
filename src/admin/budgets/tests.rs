//! The budget bodies, the owner rule, owners in paths and the JSON shapes.

use super::*;

fn limits(b: &Budget) -> [Option<u64>; 4] {
    let [h, d, m, r, ..] = b.limits();
    [h, d, m, r]
}

#[test]
fn budget_members() {
    let max = i64::MAX;
    let ok = budget_member(
        format!(r#"{{"name":"x","budget":{{"tokens_per_day":100,"requests_per_day":{max}}}}}"#)
            .as_bytes(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(limits(&ok), [None, Some(100), None, Some(max as u64)]);
    assert_eq!(budget_member(br#"{"name":"x"}"#), Ok(None));
    // Integers written with a zero fraction or an exponent are integers, in JSON Schema too.
    let floats = budget_member(br#"{"budget":{"tokens_per_day":1e3,"requests_per_day":5.0}}"#);
    assert_eq!(
        limits(&floats.unwrap().unwrap()),
        [None, Some(1000), None, Some(5)]
    );
    // Costs are amounts of the currency, to the micro.
    let costs = budget_member(br#"{"budget":{"cost_per_day":12.5,"cost_per_month":0.000001}}"#);
    let costs = costs.unwrap().unwrap();
    assert_eq!(
        (costs.cost_per_day, costs.cost_per_month),
        (Some(12_500_000), Some(1))
    );
    for clear in [&br#"{"budget":null}"#[..], br#"{"budget":{}}"#] {
        assert!(budget_member(clear).unwrap().unwrap().is_empty());
    }
    for (body, message) in [
        (
            &br#"{"budget":{"tokens_per_week":5}}"#[..],
            "budget has an unknown member \"tokens_per_week\"",
        ),
        (
            br#"{"budget":{"tokens_per_day":5,"tokens_per_day":6}}"#,
            "budget.tokens_per_day is given twice",
        ),
        (
            br#"{"budget":{"tokens_per_hour":-1}}"#,
            "budget.tokens_per_hour must be a whole number from 0 to 9223372036854775807",
        ),
        (
            br#"{"budget":{"tokens_per_hour":1.5}}"#,
            "budget.tokens_per_hour must be",
        ),
        (
            br#"{"budget":{"tokens_per_hour":-0.5}}"#,
            "budget.tokens_per_hour must be",
        ),
        (
            br#"{"budget":{"tokens_per_hour":1e19}}"#,
            "budget.tokens_per_hour must be",
        ),
        (
            br#"{"budget":{"tokens_per_hour":9223372036854775807.0}}"#,
            "budget.tokens_per_hour must be",
        ),
        (
            br#"{"budget":{"tokens_per_hour":"5"}}"#,
            "budget.tokens_per_hour must be",
        ),
        (
            br#"{"budget":{"tokens_per_hour":null}}"#,
            "budget.tokens_per_hour must be",
        ),
        (
            br#"{"budget":{"requests_per_day":9223372036854775808}}"#,
            "budget.requests_per_day must be",
        ),
        (
            br#"{"budget":{"requests_per_day":99999999999999999999999}}"#,
            "budget.requests_per_day must be",
        ),
        (
            br#"{"budget":{"cost_per_day":-1}}"#,
            "budget.cost_per_day -1 is negative",
        ),
        (
            br#"{"budget":{"cost_per_month":0.0000001}}"#,
            "budget.cost_per_month 1e-7 has more than 6 decimals",
        ),
        (
            br#"{"budget":{"cost_per_day":"5"}}"#,
            "budget.cost_per_day must be a number",
        ),
        (br#"{"budget":5}"#, "budget must be an object"),
        (
            br#"{"budget":[{"tokens_per_day":5}]}"#,
            "budget must be an object",
        ),
        (br#"{"budget":"none"}"#, "budget must be an object"),
        (br#"{"budget":{},"budget":null}"#, "budget is given twice"),
    ] {
        let got = budget_member(body).unwrap_err();
        assert!(
            got.starts_with(message),
            "{}: {got}",
            String::from_utf8_lossy(body)
        );
    }
    // The first problem is the one named.
    let got = budget_member(br#"{"budget":{"a":1,"tokens_per_day":-1}}"#).unwrap_err();
    assert!(got.contains("\"a\""), "{got}");
}

#[test]
fn patch_and_put_bodies() {
    assert_eq!(
        limits(&budget_body(br#"{"budget":{"tokens_per_month":7}}"#).unwrap()),
        [None, None, Some(7), None]
    );
    assert!(budget_body(br#"{"budget":null}"#).unwrap().is_empty());
    for (body, message) in [
        (&b"{}"[..], "the body must hold budget"),
        (b"[]", "the body must be a JSON object"),
        (b"nope", "the body must be a JSON object"),
        (br#"{"budget":null,"name":"x"}"#, "unknown field \"name\""),
        (br#"{"budget":{"x":1}}"#, "budget has an unknown member"),
    ] {
        let got = budget_body(body).unwrap_err();
        assert!(
            got.starts_with(message),
            "{}: {got}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn a_key_stays_within_its_owner_budget() {
    let owner = Budget::from_limits([None, Some(1000), None, Some(10), None, None]);
    let within = Budget::from_limits([Some(5000), Some(1000), Some(1), None, None, None]);
    assert_eq!(beyond_owner(&within, Some(&owner)), None);
    assert_eq!(beyond_owner(&within, None), None);
    let over = Budget::from_limits([None, Some(999), None, Some(11), None, None]);
    let message = beyond_owner(&over, Some(&owner)).unwrap();
    assert!(
        message.starts_with("budget.requests_per_day 11"),
        "{message}"
    );
}

#[test]
fn owners_in_paths() {
    assert_eq!(owner_in_path("alice").unwrap(), "alice");
    assert_eq!(owner_in_path("auth0%7Cabc%2F1").unwrap(), "auth0|abc/1");
    assert_eq!(owner_in_path("%C3%A9").unwrap(), "é");
    for bad in ["", "%", "%4", "%zz", "%00", "a%0Ab", "%FF"] {
        assert!(owner_in_path(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn json_shapes() {
    let budget = Budget::from_limits([Some(100), None, None, Some(5), None, None]);
    let used = WindowUsage {
        hour_tokens: 7,
        day_tokens: 8,
        month_tokens: 9,
        day_requests: 1,
        ..WindowUsage::default()
    };
    assert_eq!(
        budget_json(&budget),
        json!({"tokens_per_hour": 100, "requests_per_day": 5})
    );
    assert_eq!(budget_json(&Budget::default()), Value::Null);
    assert_eq!(
        key_used_json(&budget, &used),
        json!({"tokens_per_hour": 7, "requests_per_day": 1})
    );
    assert_eq!(key_used_json(&Budget::default(), &used), Value::Null);
    let starts = WindowStarts::at(crate::time::parse_date("2026-12-31").unwrap() + 60);
    let owner = subject_json(&Budget::default(), &used, starts);
    assert_eq!(
        owner,
        json!({
            "budget": null,
            "used": {"tokens_per_hour": 7, "tokens_per_day": 8, "tokens_per_month": 9,
                     "requests_per_day": 1, "cost_per_day": 0, "cost_per_month": 0},
            "resets": {"tokens_per_hour": "2026-12-31T01:00:00Z",
                       "tokens_per_day": "2027-01-01T00:00:00Z",
                       "tokens_per_month": "2027-01-01T00:00:00Z",
                       "requests_per_day": "2027-01-01T00:00:00Z",
                       "cost_per_day": "2027-01-01T00:00:00Z",
                       "cost_per_month": "2027-01-01T00:00:00Z"}
        })
    );
    // Costs in the currency's units: whole ones as integers, at most six decimals.
    let costly = Budget {
        cost_per_day: Some(2_500_000),
        cost_per_month: Some(40_000_000),
        ..Budget::default()
    };
    assert_eq!(
        budget_json(&costly),
        json!({"cost_per_day": 2.5, "cost_per_month": 40})
    );
    let spent = WindowUsage {
        day_cost: 1_234_567,
        ..WindowUsage::default()
    };
    assert_eq!(
        key_used_json(&costly, &spent),
        json!({"cost_per_day": 1.234567, "cost_per_month": 0})
    );
}
