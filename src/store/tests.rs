//! Files made by earlier releases open with their keys, and take only the steps they lack;
//! paged listings and the removal of old revocations on a real SQLite file; the usage ledger
//! on SQLite and on a real Postgres server.

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use super::key_sql::page_sql;
use super::{
    Grouping, KeyRecord, KeyStore, LedgerStore, PageEnd, SqliteStore, StoredKey, UsageCounts,
    UsageQuery, UsageRow,
};

/// The table exactly as the releases before the shared migration list wrote it, with one row,
/// and their step counter.
async fn release_file(path: &std::path::Path, with_owner: bool) {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    let mut sql = String::from(
        "CREATE TABLE IF NOT EXISTS api_keys (
            key_id TEXT PRIMARY KEY, name TEXT NOT NULL, verifier BLOB NOT NULL,
            scopes TEXT NOT NULL, created_at BIGINT NOT NULL, expires_at BIGINT,
            revoked_at BIGINT);",
    );
    if with_owner {
        sql.push_str(
            "ALTER TABLE api_keys ADD COLUMN owner TEXT;
             CREATE INDEX IF NOT EXISTS api_keys_owner ON api_keys (owner);
             PRAGMA user_version = 1;",
        );
    }
    sqlx::raw_sql(&sql).execute(&mut conn).await.unwrap();
    let owner = if with_owner { "'alice'" } else { "NULL" };
    let insert = format!(
        "INSERT INTO api_keys (key_id, name, verifier, scopes, created_at{}) \
         VALUES ('00112233aabbccdd', 'old', zeroblob(32), 'infer chatx', 1700000000{})",
        if with_owner { ", owner" } else { "" },
        if with_owner {
            format!(", {owner}")
        } else {
            String::new()
        },
    );
    sqlx::raw_sql(&insert).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
}

async fn recorded(path: &std::path::Path) -> (Vec<i64>, i64) {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .unwrap();
    let versions = sqlx::query_scalar("SELECT version FROM portcullis_migrations ORDER BY version")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    let user_version = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    (versions, user_version)
}

#[tokio::test]
async fn a_file_of_every_earlier_schema_opens_with_its_keys() {
    for with_owner in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.db");
        release_file(&path, with_owner).await;
        let url = format!("sqlite://{}", path.display());
        for _reopen in 0..2 {
            let store = SqliteStore::open(&url).await.unwrap();
            let key = store.find("00112233aabbccdd").await.unwrap().unwrap();
            assert_eq!(key.record.scopes, ["infer", "chatx"]);
            assert_eq!(key.record.created_at, 1_700_000_000);
            let owner = with_owner.then(|| "alice".to_string());
            assert_eq!(key.record.owner, owner, "with_owner = {with_owner}");
            assert_eq!(store.list().await.unwrap().len(), 1);
        }
        // Every step of the shared list; the old counter counts the steps after the table.
        assert_eq!(
            recorded(&path).await,
            (vec![1, 2, 3, 4, 5, 6, 7, 8], 7),
            "with_owner = {with_owner}"
        );
    }
}

#[tokio::test]
async fn a_new_file_records_the_shared_steps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let url = format!("sqlite://{}", path.display());
    SqliteStore::open(&url).await.unwrap();
    SqliteStore::open(&url).await.unwrap();
    assert_eq!(recorded(&path).await, (vec![1, 2, 3, 4, 5, 6, 7, 8], 7));
}

/// A key of `owner` made at `created_at`.
fn key(id: u64, owner: Option<&str>, created_at: i64) -> StoredKey {
    StoredKey {
        record: KeyRecord {
            key_id: format!("{id:016x}"),
            name: "k".into(),
            scopes: vec!["infer".into()],
            created_at,
            expires_at: None,
            revoked_at: None,
            owner: owner.map(str::to_string),
            budget: Default::default(),
        },
        verifier: [0; 32],
    }
}

#[tokio::test]
async fn pages_walk_every_key_once_newest_first_and_old_revocations_are_purged() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&format!("sqlite://{}/keys.db", dir.path().display()))
        .await
        .unwrap();
    // Several keys share a second, so the key id breaks the ties.
    for i in 0..25u64 {
        let owner = if i % 2 == 0 { "alice" } else { "bob" };
        let made = key(i, Some(owner), 100 + (i / 4) as i64);
        store.insert(&made).await.unwrap();
        if i < 6 {
            store
                .revoke(&made.record.key_id, 1_000 + i as i64)
                .await
                .unwrap();
        }
    }
    for (owner, want) in [(None, 25), (Some("alice"), 13)] {
        let mut seen: Vec<KeyRecord> = Vec::new();
        let mut after = None;
        loop {
            let page = store.page(owner, after.as_ref(), 4).await.unwrap();
            assert!(page.len() <= 4);
            let Some(last) = page.last() else { break };
            after = Some(PageEnd::of(last));
            seen.extend(page);
        }
        assert_eq!(seen.len(), want, "{owner:?}");
        let order: Vec<_> = seen.iter().map(|k| (k.created_at, &k.key_id)).collect();
        let mut sorted = order.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        sorted.dedup();
        assert_eq!(order, sorted, "newest first, each once ({owner:?})");
        assert!(owner.is_none_or(|o| seen.iter().all(|k| k.owner.as_deref() == Some(o))));
    }
    // Revoked at 1000..1005: those before 1004 go, two at a time; the rest stay.
    assert_eq!(store.purge_revoked(1_004, 2).await.unwrap(), 2);
    assert_eq!(store.purge_revoked(1_004, 2).await.unwrap(), 2);
    assert_eq!(store.purge_revoked(1_004, 2).await.unwrap(), 0);
    let left = store.list().await.unwrap();
    assert_eq!(left.len(), 21);
    assert!(left
        .iter()
        .all(|k| k.revoked_at.is_none_or(|at| at >= 1_004)));
}

#[test]
fn page_statements_number_their_parameters_in_order() {
    assert_eq!(
        page_sql(true, true, '$'),
        "SELECT * FROM api_keys WHERE owner = $1 AND (created_at, key_id) < ($2, $3) \
         ORDER BY created_at DESC, key_id DESC LIMIT $4"
    );
    assert_eq!(
        page_sql(false, false, '?'),
        "SELECT * FROM api_keys ORDER BY created_at DESC, key_id DESC LIMIT ?1"
    );
}

const DAY: i64 = 86_400;
const D0: i64 = 1_795_000_000 / DAY * DAY;

fn row(hour: i64, key: &str, owner: &str, service: &str, model: &str, n: u64) -> UsageRow {
    UsageRow {
        hour,
        key_id: key.into(),
        owner: owner.into(),
        service: service.into(),
        model: model.into(),
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

fn query(from: i64, to: i64, owner: Option<&str>, group: Grouping) -> UsageQuery {
    UsageQuery {
        from_day: from,
        to_day: to,
        owner: owner.map(str::to_string),
        team: None,
        group,
    }
}

/// The same ledger on either store: repeated flushes add up, hours roll up into days, and
/// reports filter by owner and days and group as asked.
/// A batch written again under its id (its commit succeeded but was reported failed, and the
/// flusher retried it) adds nothing; another batch adds.
async fn a_batch_is_added_once(store: &dyn LedgerStore) {
    let day = D0 + 40 * DAY;
    let batch = [row(day, "once", "carol", "infer", "m", 3)];
    store.add_usage_once("b-1", &batch).await.unwrap();
    store.add_usage_once("b-1", &batch).await.unwrap();
    store.add_usage_once("b-2", &batch[..]).await.unwrap();
    let rows = (store.usage(&query(day, day, Some("carol"), Grouping::default())))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].counts.requests, 6, "b-1 once, b-2 once");
}

async fn ledger_adds_up_and_reports(store: &dyn LedgerStore) {
    let first = [
        row(D0, "k1", "alice", "infer", "m1", 2),
        row(D0 + 3600, "k1", "alice", "infer", "m1", 1),
        row(D0 + 7200, "", "alice", "infer", "", 1),
        row(D0, "k2", "bob", "embed", "m2", 4),
        row(D0 + DAY + 3600, "k1", "alice", "infer", "m1", 3),
        row(D0 + 2 * DAY, "k3", "", "infer", "m1", 1),
    ];
    store.add_usage(&first).await.unwrap();
    // A second flush of an hour already written adds to it.
    store
        .add_usage(&[row(D0, "k1", "alice", "infer", "m1", 1)])
        .await
        .unwrap();
    store.add_usage(&[]).await.unwrap();

    let all = Grouping {
        day: true,
        key: true,
        service: true,
        model: true,
        team: false,
    };
    let rows = store.usage(&query(D0, D0, None, all)).await.unwrap();
    let got: Vec<_> = rows
        .iter()
        .map(|t| {
            (
                t.key_id.as_deref().unwrap(),
                t.owner.as_str(),
                t.counts.requests,
            )
        })
        .collect();
    assert_eq!(
        got,
        [("", "alice", 1), ("k1", "alice", 4), ("k2", "bob", 4)]
    );
    assert_eq!(rows[1].day, Some(D0));
    assert_eq!(rows[1].model.as_deref(), Some("m1"));
    assert_eq!(rows[1].counts.prompt_tokens, 44);
    assert_eq!(rows[1].counts.reasoning_tokens, 8);
    assert_eq!(
        rows[0].model.as_deref(),
        Some(""),
        "a JWT call's unknown model"
    );

    // One owner, every day, by nothing: one row of totals.
    let alice = store
        .usage(&query(D0, D0 + 2 * DAY, Some("alice"), Grouping::default()))
        .await
        .unwrap();
    assert_eq!(alice.len(), 1);
    assert_eq!((alice[0].day, alice[0].key_id.as_ref()), (None, None));
    assert_eq!(alice[0].counts.requests, 8);
    assert_eq!(alice[0].counts.completion_tokens, 40);

    // By day, everyone: split by owner too, in day then owner order.
    let by_day = Grouping {
        day: true,
        ..Grouping::default()
    };
    let days = store
        .usage(&query(D0, D0 + 2 * DAY, None, by_day))
        .await
        .unwrap();
    let got: Vec<_> = days
        .iter()
        .map(|t| {
            (
                (t.day.unwrap() - D0) / DAY,
                t.owner.as_str(),
                t.counts.requests,
            )
        })
        .collect();
    assert_eq!(
        got,
        [(0, "alice", 5), (0, "bob", 4), (1, "alice", 3), (2, "", 1)]
    );
    // The range is inclusive and nothing outside it counts.
    let later = store
        .usage(&query(D0 + DAY, D0 + DAY, None, by_day))
        .await
        .unwrap();
    assert_eq!(later.len(), 1);
    let none = store
        .usage(&query(D0 + 3 * DAY, D0 + 9 * DAY, None, by_day))
        .await
        .unwrap();
    assert!(none.is_empty());
    let by_service = Grouping {
        service: true,
        model: true,
        ..Grouping::default()
    };
    let services = store
        .usage(&query(D0, D0 + 2 * DAY, Some("bob"), by_service))
        .await
        .unwrap();
    assert_eq!(services.len(), 1);
    assert_eq!(services[0].service.as_deref(), Some("embed"));
}

#[tokio::test]
async fn the_ledger_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&format!("sqlite://{}/keys.db", dir.path().display()))
        .await
        .unwrap();
    ledger_adds_up_and_reports(&store).await;
    a_batch_is_added_once(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_on_postgres() {
    let pg = tokio::task::spawn_blocking(testkit::postgres::Postgres::start)
        .await
        .unwrap();
    let store = super::open_store(&pg.url, false).await.unwrap();
    ledger_adds_up_and_reports(&*store).await;
    a_batch_is_added_once(&*store).await;
    // Hourly rows are kept beside the daily ones: what budgets will sum by hour.
    let hours = pg.sql("SELECT count(*) FROM usage_hourly WHERE key_id = 'k1'");
    assert_eq!(hours, "3");
    drop(store);
    tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
}

/// A file made by the release before money (every step up to 6: keys with budgets, the ledger
/// and its batches), with a key, a budget and ledger rows in it, opens with the current steps:
/// its rows are kept, uncosted (no cost, none unpriced), and new rows carry their cost and team.
#[tokio::test]
async fn a_file_of_the_release_before_money_keeps_its_rows_and_costs_new_ones() {
    use super::migrations::{MIGRATIONS, MIGRATIONS_TABLE};
    use super::{BudgetStore, Subject, WindowStarts};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("before-money.db");
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    sqlx::query(MIGRATIONS_TABLE)
        .execute(&mut conn)
        .await
        .unwrap();
    for m in MIGRATIONS.iter().filter(|m| m.version <= 6) {
        sqlx::raw_sql(m.sqlite).execute(&mut conn).await.unwrap();
        sqlx::query("INSERT INTO portcullis_migrations (version, applied_at) VALUES (?1, 0)")
            .bind(m.version)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    // What that release wrote: a key with a token budget, an owner budget, ledger rows.
    sqlx::raw_sql(
        "INSERT INTO api_keys (key_id, name, verifier, scopes, created_at, owner, \
             tokens_per_day, budget_changed_at) \
         VALUES ('00112233aabbccdd', 'old', zeroblob(32), 'infer', 1700000000, 'alice', 500, 1); \
         INSERT INTO owner_budgets (owner, tokens_per_month, changed_at) VALUES ('alice', 9000, 1); \
         INSERT INTO usage_hourly VALUES (1764547200, '00112233aabbccdd', 'alice', 'infer', 'm1', \
             3, 33, 15, 6, 3, 0); \
         INSERT INTO usage_daily VALUES (1764547200, '00112233aabbccdd', 'alice', 'infer', 'm1', \
             3, 33, 15, 6, 3, 0);",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();

    let store = SqliteStore::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let key = store.find("00112233aabbccdd").await.unwrap().unwrap();
    assert_eq!(key.record.budget.tokens_per_day, Some(500));
    assert_eq!(key.record.budget.cost_per_day, None);
    let owner = store.owner_budget("alice").await.unwrap().unwrap();
    assert_eq!(
        (owner.tokens_per_month, owner.cost_per_month),
        (Some(9000), None)
    );
    // A new costed row beside the old one, in a team.
    let mut new = row(1_764_547_200, "00112233aabbccdd", "alice", "infer", "m2", 1);
    new.team = "red".into();
    new.counts.cost_micros = 1234;
    new.counts.priced_requests = 1;
    store.add_usage(&[new]).await.unwrap();
    let by_model = Grouping {
        model: true,
        team: true,
        ..Grouping::default()
    };
    let day = 1_764_547_200;
    let rows = store.usage(&query(day, day, None, by_model)).await.unwrap();
    let old = rows
        .iter()
        .find(|r| r.model.as_deref() == Some("m1"))
        .unwrap();
    assert_eq!(old.counts.requests, 3);
    assert_eq!(old.counts.prompt_tokens, 33);
    assert_eq!((old.counts.cost(), old.counts.unpriced_requests), (None, 0));
    assert_eq!(old.team.as_deref(), Some(""));
    let costed = rows
        .iter()
        .find(|r| r.model.as_deref() == Some("m2"))
        .unwrap();
    assert_eq!(costed.counts.cost(), Some(1234));
    assert_eq!(costed.team.as_deref(), Some("red"));
    // The team's window sums read the new column.
    let used = store
        .window_usage(&Subject::Team("red".into()), WindowStarts::at(day + 60))
        .await
        .unwrap();
    assert_eq!(
        (used.day_cost, used.month_cost, used.day_requests),
        (1234, 1234, 1)
    );
}
