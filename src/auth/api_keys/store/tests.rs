//! Files made by earlier releases open with their keys, and take only the steps they lack.

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use super::{KeyStore, SqliteStore};

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
        // Steps 1 and 2 of the shared list; the old counter still reads "owners added".
        assert_eq!(
            recorded(&path).await,
            (vec![1, 2], 1),
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
    assert_eq!(recorded(&path).await, (vec![1, 2], 1));
}
