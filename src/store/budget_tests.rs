//! Budgets in both stores: a key's budget written with it, set and cleared later, owners'
//! budgets, the stamps pollers read, and the ledger's window sums for one subject, a page of
//! keys and every subject, on SQLite and on a real Postgres server.

use super::budget_sql::columns;
use super::window_sql::{window_sql, Which};
use super::{
    Budget, KeyRecord, SqliteStore, Store, StoredKey, Subject, UsageCounts, UsageRow, WindowStarts,
    WindowUsage,
};

fn key(id: &str, owner: &str, budget: Budget) -> StoredKey {
    StoredKey {
        record: KeyRecord {
            key_id: id.into(),
            name: "k".into(),
            scopes: vec!["infer".into()],
            created_at: 1_700_000_000,
            expires_at: None,
            revoked_at: None,
            owner: Some(owner.into()),
            budget,
        },
        verifier: [0; 32],
    }
}

fn budget(limits: [Option<u64>; 4]) -> Budget {
    let [h, d, m, r] = limits;
    Budget::from_limits([h, d, m, r, None, None])
}

/// Keys and owners: written, read back, stamped, cleared (keeping the stamp).
async fn budgets_are_kept_and_stamped(store: &dyn Store) {
    let day = budget([None, Some(100_000), None, Some(500)]);
    store.insert(&key("b1", "alice", day)).await.unwrap();
    store
        .insert(&key("b2", "alice", Budget::default()))
        .await
        .unwrap();
    let found = store.find("b1").await.unwrap().unwrap();
    assert_eq!(found.record.budget, day);
    assert!(store
        .find("b2")
        .await
        .unwrap()
        .unwrap()
        .record
        .budget
        .is_empty());
    let listed = store.list_by_owner("alice").await.unwrap();
    assert_eq!(
        listed.iter().map(|k| k.budget).collect::<Vec<_>>(),
        [day, Budget::default()]
    );
    let page = store.page(Some("alice"), None, 10).await.unwrap();
    assert!(page.iter().any(|k| k.budget == day));

    // Only the key made with a budget is stamped, on the store's clock.
    let changes = store.budget_changes(0).await.unwrap();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].subject, Subject::Key("b1".into()));
    assert_eq!(changes[0].budget, day);
    // The test runs on the store's host: its clock agrees with this one within seconds.
    let now = |ms: i64| (ms - crate::time::unix_now() * 1000).abs() < 60_000;
    assert!(now(changes[0].changed_at_ms), "{changes:?}");

    // Set on the other key; an unknown key is not found.
    let hour = budget([Some(u64::MAX >> 1), None, None, None]);
    assert!(store.set_key_budget("b2", &hour).await.unwrap());
    assert!(!store.set_key_budget("nope", &hour).await.unwrap());
    assert_eq!(store.find("b2").await.unwrap().unwrap().record.budget, hour);
    assert!(store
        .set_key_budget("b2", &budget([Some(u64::MAX), None, None, None]))
        .await
        .is_err());

    // Owners: none, set, changed, cleared; a clear is still a change pollers see.
    assert_eq!(store.owner_budget("alice").await.unwrap(), None);
    let month = budget([None, None, Some(3_000_000), None]);
    store.set_owner_budget("alice", &month).await.unwrap();
    assert_eq!(store.owner_budget("alice").await.unwrap(), Some(month));
    store.set_owner_budget("alice", &day).await.unwrap();
    assert_eq!(store.owner_budget("alice").await.unwrap(), Some(day));
    store.set_owner_budget("bob", &month).await.unwrap();
    let before_clears = store.budget_changes(0).await.unwrap();
    let newest = before_clears.iter().map(|c| c.changed_at_ms).max().unwrap();
    // The store's clock moves on (SQLite's is in milliseconds).
    std::thread::sleep(std::time::Duration::from_millis(5));

    // Cleared: the key's limits are gone but its stamp moves on.
    assert!(store
        .set_key_budget("b2", &Budget::default())
        .await
        .unwrap());
    store
        .set_owner_budget("alice", &Budget::default())
        .await
        .unwrap();
    assert_eq!(store.owner_budget("alice").await.unwrap(), None);
    assert!(store
        .find("b2")
        .await
        .unwrap()
        .unwrap()
        .record
        .budget
        .is_empty());

    let mut since: Vec<_> = store
        .budget_changes(newest + 1)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.subject, c.budget))
        .collect();
    since.sort_by(|a, b| a.0.cmp(&b.0));
    let want = vec![
        (Subject::Key("b2".into()), Budget::default()),
        (Subject::Owner("alice".into()), Budget::default()),
    ];
    assert_eq!(since, want, "only the clears are newer than the sets");
    let all = store.budget_changes(0).await.unwrap();
    assert_eq!(all.len(), 4);
    assert!(all.iter().all(|c| now(c.changed_at_ms)), "{all:?}");
}

/// 2026-11-25T13:30:00Z: the 25th, so the month holds earlier days.
fn now() -> i64 {
    crate::time::parse_date("2026-11-25").unwrap() + 13 * 3600 + 1800
}

fn row(hour: i64, key: &str, owner: &str, n: u64) -> UsageRow {
    UsageRow {
        hour,
        key_id: key.into(),
        owner: owner.into(),
        service: "infer".into(),
        model: "m".into(),
        team: String::new(),
        counts: UsageCounts {
            requests: n,
            prompt_tokens: 11 * n,
            completion_tokens: 5 * n,
            reasoning_tokens: 2 * n,
            cached_tokens: n,
            estimated_requests: 0,
            ..Default::default()
        },
    }
}

fn used(hour: u64, day: u64, month: u64, requests: u64) -> WindowUsage {
    WindowUsage {
        hour_tokens: hour,
        day_tokens: day,
        month_tokens: month,
        day_requests: requests,
        ..WindowUsage::default()
    }
}

/// The ledger summed per window (16 tokens a request: 11 prompt + 5 completion; reasoning and
/// cached tokens are not counted again), for keys and owners (JWT calls included).
async fn window_sums_come_from_the_ledger(store: &dyn Store) {
    let starts = WindowStarts::at(now());
    let rows = [
        row(starts.hour, "k1", "alice", 2),
        row(starts.hour - 3600, "k1", "alice", 1),
        row(starts.day - 86_400 + 3600, "k1", "alice", 3),
        row(starts.month - 3600, "k1", "alice", 5), // last month
        row(starts.hour, "", "alice", 1),           // alice's own JWT call
        row(starts.hour, "k2", "bob", 4),
        row(starts.day, "k3", "", 1),
        row(starts.hour + 3600, "k1", "alice", 7), // the next hour: not yet
    ];
    store.add_usage(&rows[..7]).await.unwrap();
    let k1 = used(32, 48, 96, 3);
    let alice = used(48, 64, 112, 4);
    let bob = used(64, 64, 64, 4);
    let k3 = used(0, 16, 16, 1);
    let of = |s: Subject| async move { store.window_usage(&s, starts).await.unwrap() };
    assert_eq!(of(Subject::Key("k1".into())).await, k1);
    assert_eq!(of(Subject::Owner("alice".into())).await, alice);
    assert_eq!(of(Subject::Owner("bob".into())).await, bob);
    assert_eq!(
        of(Subject::Key("none".into())).await,
        WindowUsage::default()
    );

    let ids = ["k1", "k2", "k3", "none"].map(String::from);
    let page = store.keys_window_usage(&ids, starts).await.unwrap();
    assert_eq!(page.len(), 3, "{page:?}");
    assert_eq!((page["k1"], page["k2"], page["k3"]), (k1, bob, k3));
    assert!(store
        .keys_window_usage(&[], starts)
        .await
        .unwrap()
        .is_empty());

    let all = store.all_window_usage(starts).await.unwrap();
    let want = vec![
        (Subject::Key("k1".into()), k1),
        (Subject::Key("k2".into()), bob),
        (Subject::Key("k3".into()), k3),
        (Subject::Owner("alice".into()), alice),
        (Subject::Owner("bob".into()), bob),
    ];
    assert_eq!(all, want, "no '' key or owner");

    // An hour later: the hour starts again, the day and month go on.
    store.add_usage(&rows[7..]).await.unwrap();
    let later = WindowStarts::at(now() + 3600);
    let k1_later = store
        .window_usage(&Subject::Key("k1".into()), later)
        .await
        .unwrap();
    assert_eq!(k1_later, used(112, 160, 208, 10));
}

/// Teams: cost limits kept to the micro on keys, owners and teams; an owner's team set,
/// changed and cleared, each change stamped for the pollers; a team's budget read back.
async fn teams_and_cost_limits_are_kept(store: &dyn Store) {
    let costly = Budget {
        cost_per_day: Some(2_500_001),
        cost_per_month: Some(40_000_000),
        ..Budget::default()
    };
    store.insert(&key("c1", "carol", costly)).await.unwrap();
    assert_eq!(
        store.find("c1").await.unwrap().unwrap().record.budget,
        costly
    );
    store.set_owner_budget("carol", &costly).await.unwrap();
    assert_eq!(store.owner_budget("carol").await.unwrap(), Some(costly));
    assert_eq!(store.team_budget("red").await.unwrap(), None);
    store.set_team_budget("red", &costly).await.unwrap();
    assert_eq!(store.team_budget("red").await.unwrap(), Some(costly));
    let changes = store.budget_changes(0).await.unwrap();
    assert!(changes
        .iter()
        .any(|c| c.subject == Subject::Team("red".into()) && c.budget == costly));

    assert_eq!(store.owner_team("carol").await.unwrap(), None);
    store.set_owner_team("carol", Some("red")).await.unwrap();
    store.set_owner_team("dave", Some("red")).await.unwrap();
    assert_eq!(
        store.owner_team("carol").await.unwrap().as_deref(),
        Some("red")
    );
    let joined = store.team_changes(0).await.unwrap();
    let newest = joined.iter().map(|c| c.changed_at_ms).max().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    store.set_owner_team("carol", None).await.unwrap();
    assert_eq!(store.owner_team("carol").await.unwrap(), None);
    let since = store.team_changes(newest + 1).await.unwrap();
    assert_eq!(since.len(), 1, "{since:?}");
    assert_eq!(
        (since[0].owner.as_str(), since[0].team.as_deref()),
        ("carol", None)
    );
    store
        .set_team_budget("red", &Budget::default())
        .await
        .unwrap();
    assert_eq!(store.team_budget("red").await.unwrap(), None);
}

#[tokio::test]
async fn budgets_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&format!("sqlite://{}/keys.db", dir.path().display()))
        .await
        .unwrap();
    budgets_are_kept_and_stamped(&store).await;
    window_sums_come_from_the_ledger(&store).await;
    teams_and_cost_limits_are_kept(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn budgets_on_postgres() {
    let pg = tokio::task::spawn_blocking(testkit::postgres::Postgres::start)
        .await
        .unwrap();
    let store = super::open_store(&pg.url, false).await.unwrap();
    budgets_are_kept_and_stamped(&*store).await;
    window_sums_come_from_the_ledger(&*store).await;
    teams_and_cost_limits_are_kept(&*store).await;
    // A clear keeps the row and its stamp; the limits are NULL.
    assert_eq!(
        pg.sql(
            "SELECT count(*) FROM owner_budgets WHERE owner = 'alice' AND tokens_per_day IS NULL \
             AND changed_at > 1700000000000"
        ),
        "1"
    );
    drop(store);
    tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
}

#[test]
fn limits_fit_the_columns() {
    let max = i64::MAX as u64;
    assert_eq!(
        columns(&budget([Some(0), None, Some(max), None])).unwrap(),
        [Some(0), None, Some(i64::MAX), None, None, None]
    );
    let err = columns(&budget([None, None, None, Some(max + 1)])).unwrap_err();
    assert!(err.to_string().contains("requests_per_day"), "{err}");
}

#[test]
fn window_statements_number_their_parameters_in_order() {
    let [hourly, daily] = window_sql("key_id", Which::Named(2), '$');
    assert!(
        hourly.ends_with("WHERE hour = $1 AND key_id IN ($2, $3) GROUP BY key_id"),
        "{hourly}"
    );
    assert!(
        daily.contains("WHERE day >= $2 AND key_id IN ($3, $4) GROUP BY key_id"),
        "{daily}"
    );
    let [hourly, _] = window_sql("owner", Which::All, '?');
    assert!(
        hourly.contains("AND owner <> '' GROUP BY owner"),
        "{hourly}"
    );
}
