//! The cache logic, against an in-memory store that counts lookups and can fail on demand.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;

use super::*;
use crate::auth::token::{classify, Bearer};
use crate::auth::PrincipalKind;
use crate::store::SqliteStore;

#[derive(Default)]
struct FakeStore {
    keys: Mutex<Vec<StoredKey>>,
    lookups: AtomicUsize,
    down: AtomicBool,
}

#[async_trait]
impl KeyStore for FakeStore {
    async fn find(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        // Slow enough that concurrent misses overlap.
        tokio::time::sleep(Duration::from_millis(50)).await;
        if self.down.load(Ordering::SeqCst) {
            return Err("store unreachable".into());
        }
        Ok(self
            .keys
            .lock()
            .unwrap()
            .iter()
            .find(|k| k.record.key_id == key_id)
            .cloned())
    }
    async fn insert(&self, key: &StoredKey) -> Result<(), StoreError> {
        self.keys.lock().unwrap().push(key.clone());
        Ok(())
    }
    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        Ok(self
            .keys
            .lock()
            .unwrap()
            .iter()
            .map(|k| k.record.clone())
            .collect())
    }
    async fn revoke(&self, key_id: &str, at: i64) -> Result<bool, StoreError> {
        let mut keys = self.keys.lock().unwrap();
        let key = keys.iter_mut().find(|k| k.record.key_id == key_id);
        Ok(key.map(|k| k.record.revoked_at = Some(at)).is_some())
    }
}

/// A verifier over `store` whose positive and negative entries both live `ttl` seconds.
fn verifier_over(store: Arc<dyn KeyStore>, ttl: u64) -> ApiKeyVerifier {
    ApiKeyVerifier::new(store, Duration::from_secs(ttl), Duration::from_secs(ttl))
}

fn split(token: &str) -> (KeyId, String) {
    match classify(token) {
        Some(Bearer::ApiKey { key_id, secret }) => (key_id, secret.to_string()),
        other => panic!("not an api key: {other:?}"),
    }
}

async fn setup(ttl: u64) -> (Arc<FakeStore>, ApiKeyVerifier, String) {
    let store = Arc::new(FakeStore::default());
    let key = create_key(&*store, "t", vec!["infer".into()], None)
        .await
        .unwrap();
    let verifier = verifier_over(store.clone(), ttl);
    (store, verifier, key.token)
}

#[tokio::test]
async fn created_keys_verify_and_only_a_hash_is_stored() {
    let (store, verifier, token) = setup(60).await;
    let (id, secret) = split(&token);
    let principal = verifier.verify(id, &secret).await.unwrap();
    assert_eq!(principal.kind, PrincipalKind::ApiKey);
    assert_eq!(&*principal.id, id.as_str());
    assert!(principal.has_scope("infer") && !principal.has_scope("embed"));
    let stored = store.keys.lock().unwrap()[0].clone();
    assert_ne!(&stored.verifier[..], secret.as_bytes());
    assert_eq!(
        stored.verifier,
        <[u8; 32]>::from(Sha256::digest(secret.as_bytes()))
    );
}

#[tokio::test]
async fn concurrent_misses_share_one_lookup_and_wrong_secrets_never_reach_the_store() {
    let (store, verifier, token) = setup(60).await;
    let (id, secret) = split(&token);
    let verifier = Arc::new(verifier);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (v, s) = (verifier.clone(), secret.clone());
            tokio::spawn(async move { v.verify(id, &s).await.is_some() })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap());
    }
    assert_eq!(store.lookups.load(Ordering::SeqCst), 1);
    for _ in 0..5 {
        assert!(verifier.verify(id, &"A".repeat(43)).await.is_none());
    }
    assert_eq!(store.lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unknown_ids_are_cached_negatively() {
    let (store, verifier, _) = setup(60).await;
    let (id, secret) = split(&format!("ak_00000000000000ff.{}", "b".repeat(43)));
    assert!(verifier.verify(id, &secret).await.is_none());
    assert!(verifier.verify(id, &secret).await.is_none());
    assert_eq!(store.lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn revocation_takes_effect_when_the_entry_expires() {
    let (store, verifier, token) = setup(1).await;
    let (id, secret) = split(&token);
    assert!(verifier.verify(id, &secret).await.is_some());
    store.revoke(id.as_str(), unix_now()).await.unwrap();
    // Still cached: the TTL is the bound, not an instant effect.
    assert!(verifier.verify(id, &secret).await.is_some());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(verifier.verify(id, &secret).await.is_none());
}

/// Verifies `token` on a thread of its own (its own copy of the key), `times` times.
fn verify_on_a_thread(
    verifier: &Arc<ApiKeyVerifier>,
    token: &str,
    times: usize,
) -> Vec<Option<Arc<Principal>>> {
    let (verifier, token) = (verifier.clone(), token.to_string());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (id, secret) = split(&token);
        (0..times)
            .map(|_| runtime.block_on(verifier.verify(id, &secret)))
            .collect()
    })
    .join()
    .unwrap()
}

#[tokio::test]
async fn each_thread_holds_its_own_copy_of_a_key() {
    let (store, verifier, token) = setup(60).await;
    let verifier = Arc::new(verifier);
    let (id, secret) = split(&token);
    let here = verifier.verify(id, &secret).await.unwrap();
    // The same copy again on this thread: nothing shared with other threads is written.
    assert!(Arc::ptr_eq(
        &here,
        &verifier.verify(id, &secret).await.unwrap()
    ));
    let there = verify_on_a_thread(&verifier, &token, 2);
    let (a, b) = (there[0].as_ref().unwrap(), there[1].as_ref().unwrap());
    assert!(Arc::ptr_eq(a, b) && !Arc::ptr_eq(a, &here));
    assert_eq!(**a, *here);
    assert_eq!(store.lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_eviction_reaches_every_threads_copy_at_once() {
    let (store, verifier, token) = setup(60).await;
    let verifier = Arc::new(verifier);
    let (id, secret) = split(&token);
    assert!(verifier.verify(id, &secret).await.is_some());
    assert!(verify_on_a_thread(&verifier, &token, 1)[0].is_some());
    store.revoke(id.as_str(), unix_now()).await.unwrap();
    verifier.evictor().evict(id).await;
    assert!(verifier.verify(id, &secret).await.is_none());
    assert!(verify_on_a_thread(&verifier, &token, 1)[0].is_none());
}

#[tokio::test]
async fn an_unreachable_store_keeps_cached_keys_and_refuses_the_rest() {
    let (store, verifier, token) = setup(60).await;
    let other = create_key(&*store, "u", vec!["infer".into()], None)
        .await
        .unwrap();
    let (id, secret) = split(&token);
    assert!(verifier.verify(id, &secret).await.is_some());
    store.down.store(true, Ordering::SeqCst);
    assert!(verifier.verify(id, &secret).await.is_some());
    let (other_id, other_secret) = split(&other.token);
    assert!(verifier.verify(other_id, &other_secret).await.is_none());
    // A failed lookup is not cached: the key works once the store is back, found by the
    // next once-a-second attempt.
    store.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(outage::RETRY_INTERVAL).await;
    assert!(verifier.verify(other_id, &other_secret).await.is_some());
}

#[tokio::test]
async fn expired_keys_are_refused_even_while_cached() {
    let store = Arc::new(FakeStore::default());
    // Two seconds: expiry is counted in whole seconds, so one could pass before the first check.
    let key = create_key(&*store, "t", vec![], Some(Duration::from_secs(2)))
        .await
        .unwrap();
    let verifier = verifier_over(store.clone(), 60);
    let (id, secret) = split(&key.token);
    assert!(verifier.verify(id, &secret).await.is_some());
    let expires_at = key.record.expires_at.unwrap();
    while unix_now() < expires_at {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(verifier.verify(id, &secret).await.is_none());
}

/// Two real SQLite stores behind one switch: the live one, and one whose directory is gone
/// and whose pool holds no connection, so every lookup really fails to reach its database.
struct Switchable {
    live: SqliteStore,
    dead: SqliteStore,
    down: AtomicBool,
    dead_attempts: AtomicUsize,
}

impl Switchable {
    fn current(&self) -> &SqliteStore {
        if self.down.load(Ordering::SeqCst) {
            self.dead_attempts.fetch_add(1, Ordering::SeqCst);
            &self.dead
        } else {
            &self.live
        }
    }
}

#[async_trait]
impl KeyStore for Switchable {
    async fn find(&self, key_id: &str) -> Result<Option<StoredKey>, StoreError> {
        self.current().find(key_id).await
    }
    async fn insert(&self, key: &StoredKey) -> Result<(), StoreError> {
        self.current().insert(key).await
    }
    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        self.current().list().await
    }
    async fn revoke(&self, key_id: &str, at: i64) -> Result<bool, StoreError> {
        self.current().revoke(key_id, at).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_store_answers_at_once_and_is_asked_at_most_once_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let live = SqliteStore::open(&format!("sqlite://{}/keys.db", dir.path().display()))
        .await
        .unwrap();
    let gone = dir.path().join("gone");
    let dead = SqliteStore::open(&format!("sqlite://{}/keys.db", gone.display()))
        .await
        .unwrap();
    std::fs::remove_dir_all(&gone).unwrap();
    let store = Arc::new(Switchable {
        live,
        dead,
        down: AtomicBool::new(false),
        dead_attempts: AtomicUsize::new(0),
    });
    let cached = create_key(&*store, "cached", vec!["infer".into()], None)
        .await
        .unwrap();
    let later = create_key(&*store, "later", vec!["infer".into()], None)
        .await
        .unwrap();
    let v = verifier_over(store.clone(), 60);
    let (cached_id, cached_secret) = split(&cached.token);
    assert!(v.verify(cached_id, &cached_secret).await.is_some());

    store.down.store(true, Ordering::SeqCst);
    let started = Instant::now();
    // The first miss meets the outage (and waits for it once)...
    let unknown = |i: u64| KeyId::parse(&format!("{i:016x}")).unwrap();
    assert!(v.verify(unknown(1), &cached_secret).await.is_none());
    assert!(v.store_down());
    // ...then every miss is refused at once, and cached keys keep working.
    let mut slowest = Duration::ZERO;
    for i in 2..200 {
        let t = Instant::now();
        assert!(v.verify(unknown(i), &cached_secret).await.is_none());
        assert!(v.verify(cached_id, &cached_secret).await.is_some());
        slowest = slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    let attempts = store.dead_attempts.load(Ordering::SeqCst);
    eprintln!("{attempts} store attempts in {elapsed:?}; slowest refusal took {slowest:?} (an attempt included)");
    assert!(
        attempts as u64 <= elapsed.as_secs() + 1,
        "{attempts} attempts in {elapsed:?}"
    );

    // Back: within a second a new key is found again.
    store.down.store(false, Ordering::SeqCst);
    let (later_id, later_secret) = split(&later.token);
    let back = Instant::now();
    while v.verify(later_id, &later_secret).await.is_none() {
        assert!(back.elapsed() < Duration::from_secs(3), "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!v.store_down());
}
