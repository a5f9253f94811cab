//! Budgets through the real CLI: `keys create` with limits, `keys budget`, `owners budget`
//! and `keys list`'s BUDGET and LEFT.

use serde_json::{json, Value};

use super::{listed, refused, table, wait_for, window, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_shows_and_clears_key_and_owner_budgets() {
    let f = Fixture::start(None).await;
    let (ok, out, err) = f.cli(&[
        "keys",
        "create",
        "--name",
        "capped",
        "--scopes",
        "chat",
        "--owner",
        "alice",
        "--tokens-per-day",
        "1000",
        "--requests-per-day",
        "5",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("budget:  tokens_per_day=1000,requests_per_day=5\n"),
        "{out}"
    );
    let key = out.lines().last().unwrap().to_string();
    let id = key[3..19].to_string();
    assert!(key.starts_with("ak_"), "the key is the last line: {out}");
    let secret = key.split('.').nth(1).unwrap().to_string();
    let (plain, plain_id) = tokio::task::block_in_place(|| f.gw.create_key("chat", &[]));

    // Used on the data plane: the ledger's use shows in LEFT within a flush.
    assert_eq!(f.chat(&key), 200);
    assert_eq!(f.chat(&plain), 200);
    let (budget, left) = wait_for(
        || listed(&f, &id),
        |(_, left)| left != "tokens_per_day=1000,requests_per_day=5",
    );
    assert_eq!(budget, "tokens_per_day=1000,requests_per_day=5");
    assert_eq!(left, "tokens_per_day=984,requests_per_day=4");
    assert_eq!(listed(&f, &plain_id), ("-".into(), "-".into()));

    // Flags set their windows and keep the others; `none` removes one.
    let (ok, out, err) = f.cli(&["keys", "budget", &id, "--tokens-per-hour", "10"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("key id:  {id}\nowner:   alice\n")),
        "{out}"
    );
    let rows = table(&out);
    let (limit, used, left) = window(&rows, "tokens_per_hour");
    assert_eq!(limit, "10");
    let used: u64 = used.parse().unwrap();
    assert_eq!(left, 10u64.saturating_sub(used).to_string());
    assert_eq!(window(&rows, "tokens_per_day"), ("1000", "16", "984"));
    assert_eq!(window(&rows, "requests_per_day"), ("5", "1", "4"));
    assert_eq!(window(&rows, "tokens_per_month"), ("-", "16", "-"));
    let (ok, out, _) = f.cli(&["keys", "budget", &id, "--requests-per-day", "none"]);
    assert!(ok);
    assert_eq!(window(&table(&out), "requests_per_day"), ("-", "1", "-"));
    assert_eq!(listed(&f, &id).0, "tokens_per_hour=10,tokens_per_day=1000");

    // Refusals: one line on stderr, non-zero, nothing changed.
    refused(&f, &["keys", "budget", &id], "or --clear");
    refused(
        &f,
        &["keys", "budget", &id, "--clear", "--tokens-per-day", "5"],
        "--clear removes the whole budget",
    );
    refused(
        &f,
        &["keys", "budget", "ffffffffffffffff", "--clear"],
        "no key with id ffffffffffffffff",
    );
    refused(
        &f,
        &["keys", "budget", "nope", "--clear"],
        "is not a key id",
    );
    tokio::task::block_in_place(|| f.gw.revoke(&plain_id));
    refused(
        &f,
        &["keys", "budget", &plain_id, "--tokens-per-day", "5"],
        "is revoked",
    );
    refused(
        &f,
        &["keys", "budget", &id, "--tokens-per-day", "1.5"],
        "--tokens-per-day: \"1.5\" is not a whole number from 0 to 9223372036854775807",
    );
    refused(
        &f,
        &["keys", "budget", &id, "--tokens-per-day=-1"],
        "is not a whole number",
    );
    refused(
        &f,
        &[
            "keys",
            "budget",
            &id,
            "--tokens-per-day",
            "9223372036854775808",
        ],
        "is not a whole number",
    );
    refused(
        &f,
        &[
            "keys",
            "create",
            "--name",
            "x",
            "--scopes",
            "chat",
            "--tokens-per-month",
            "x",
        ],
        "--tokens-per-month",
    );
    refused(&f, &["owners", "budget", "alice"], "or --clear");
    refused(
        &f,
        &["owners", "budget", "", "--clear"],
        "owner must be non-empty",
    );
    let max = i64::MAX.to_string();
    let (ok, _, err) = f.cli(&["keys", "budget", &id, "--tokens-per-month", &max]);
    assert!(ok, "{err}");

    // Cleared: every limit goes.
    let (ok, out, _) = f.cli(&["keys", "budget", &id, "--clear"]);
    assert!(ok);
    assert!(
        table(&out).iter().all(|r| r.1 == "-" && r.3 == "-"),
        "{out}"
    );
    assert_eq!(listed(&f, &id), ("-".into(), "-".into()));

    // An owner's budget covers its keys' use: alice's is the capped key's 16 tokens.
    let (ok, out, err) = f.cli(&["owners", "budget", "alice", "--tokens-per-month", "100"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("owner:   alice\n"), "{out}");
    let rows = table(&out);
    assert_eq!(window(&rows, "tokens_per_month"), ("100", "16", "84"));
    assert_eq!(window(&rows, "tokens_per_day"), ("-", "16", "-"));
    let (ok, out, _) = f.cli(&["owners", "budget", "alice", "--tokens-per-day", "50"]);
    assert!(ok);
    let rows = table(&out);
    assert_eq!(window(&rows, "tokens_per_month"), ("100", "16", "84"));
    assert_eq!(window(&rows, "tokens_per_day"), ("50", "16", "34"));
    let (ok, out, _) = f.cli(&["owners", "budget", "alice", "--clear"]);
    assert!(ok);
    assert!(table(&out).iter().all(|r| r.1 == "-"), "{out}");

    // Every change is on record: the key or the owner, the budget, never a secret.
    let events = f.events();
    let budgets: Vec<(Value, Value, Value)> = events
        .iter()
        .filter(|e| e["key_event"] == "budget")
        .map(|e| {
            (
                e["key_id"].clone(),
                e["budget_owner"].clone(),
                e["budget"].clone(),
            )
        })
        .collect();
    let key = json!(id);
    assert_eq!(
        budgets,
        [
            (
                key.clone(),
                Value::Null,
                json!({"tokens_per_hour": 10, "tokens_per_day": 1000, "requests_per_day": 5})
            ),
            (
                key.clone(),
                Value::Null,
                json!({"tokens_per_hour": 10, "tokens_per_day": 1000})
            ),
            (
                key.clone(),
                Value::Null,
                json!({"tokens_per_hour": 10, "tokens_per_day": 1000, "tokens_per_month": i64::MAX})
            ),
            (key.clone(), Value::Null, Value::Null),
            (
                Value::Null,
                json!("alice"),
                json!({"tokens_per_month": 100})
            ),
            (
                Value::Null,
                json!("alice"),
                json!({"tokens_per_month": 100, "tokens_per_day": 50})
            ),
            (Value::Null, json!("alice"), Value::Null),
        ]
    );
    assert!(events
        .iter()
        .filter(|e| e["key_event"] == "budget")
        .all(|e| e["service"] == "_cli"
            && e.get("budget_owner").is_none() != e.get("key_id").is_none()));
    let created = events.iter().find(|e| e["key_event"] == "created").unwrap();
    assert_eq!(
        created["budget"],
        json!({"tokens_per_day": 1000, "requests_per_day": 5})
    );
    let log = std::fs::read_to_string(f.gw.config.parent().unwrap().join("access.log")).unwrap();
    assert!(!log.contains(&secret), "the access log shows a secret");
}
