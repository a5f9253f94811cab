//! The revocation race on a real PostgreSQL server: a lookup in flight while a key is revoked
//! must not put the row it read before the revoke back into the cache once the revoke has
//! been announced (NOTIFY) or evicted locally (the key API), or the key would keep working for
//! `cache_ttl_seconds` instead of about a second.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use testkit::postgres::Postgres;

use super::*;
use crate::auth::token::{classify, Bearer};
use crate::store::open_store;

/// Races per announcement path; the delays sweep the revoke across the lookup's round trip.
const RACES: usize = 600;

fn split(token: &str) -> (KeyId, String) {
    match classify(token) {
        Some(Bearer::ApiKey { key_id, secret }) => (key_id, secret.to_string()),
        other => panic!("not an api key: {other:?}"),
    }
}

async fn wait_listening(pg: &Postgres) {
    let listening = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'";
    for _ in 0..200 {
        if tokio::task::block_in_place(|| pg.sql(listening)) == "1" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the revocation listener never listened");
}

/// Runs `RACES` lookups against revokes of the same fresh key, announced by NOTIFY only
/// (`local: false`) or also evicted locally as the key API does; returns how many keys still
/// verified once every announcement had had a second to arrive.
async fn stale_after_races(
    store: &Arc<dyn KeyStore>,
    verifier: &Arc<ApiKeyVerifier>,
    local: bool,
) -> usize {
    let mut keys = Vec::with_capacity(RACES);
    for _ in 0..RACES {
        let made = create_key(&**store, "race", vec!["infer".into()], None)
            .await
            .unwrap();
        let (id, secret) = split(&made.token);
        // A revoke takes four round trips to commit, a lookup one: the revoke mostly starts
        // first, by up to 4 ms, so that its commit falls anywhere around the lookup's read.
        let offset = rand::thread_rng().gen_range(-4000i64..1000);
        let (lookup_after, revoke_after) = (
            Duration::from_micros(offset.max(0) as u64),
            Duration::from_micros((-offset).max(0) as u64),
        );
        let lookup = {
            let verifier = verifier.clone();
            let secret = secret.clone();
            tokio::spawn(async move {
                tokio::time::sleep(lookup_after).await;
                verifier.verify(id, &secret).await.is_some()
            })
        };
        let revoke = {
            let (store, evictor) = (store.clone(), verifier.evictor());
            tokio::spawn(async move {
                tokio::time::sleep(revoke_after).await;
                assert!(store.revoke(id.as_str(), unix_now()).await.unwrap());
                if local {
                    evictor.evict(id).await;
                }
            })
        };
        lookup.await.unwrap();
        revoke.await.unwrap();
        keys.push((id, secret));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut stale = 0;
    for (id, secret) in &keys {
        stale += usize::from(verifier.verify(*id, secret).await.is_some());
    }
    stale
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_racing_a_revoke_never_caches_the_row_it_read_before_it() {
    let pg = tokio::task::block_in_place(Postgres::start);
    let store: Arc<dyn KeyStore> = open_store(&pg.url, false).await.unwrap();
    // A cache that would keep a stale row for a minute: only the push can be fast.
    let verifier = Arc::new(ApiKeyVerifier::new(
        store.clone(),
        Duration::from_secs(60),
        Duration::from_secs(1),
    ));
    let push = verifier.revocation_push(&pg.url);
    tokio::spawn(async move { push.run().await });
    wait_listening(&pg).await;

    let by_notify = stale_after_races(&store, &verifier, false).await;
    let by_eviction = stale_after_races(&store, &verifier, true).await;
    println!(
        "{RACES} races each: a revoked key still verified after 1 s {by_notify} time(s) when \
         announced by NOTIFY, {by_eviction} when also evicted locally"
    );
    assert_eq!((by_notify, by_eviction), (0, 0));
}
