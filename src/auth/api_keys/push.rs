//! Fleet-wide revocation: every gateway LISTENs on the Postgres channel a revoke notifies,
//! and drops the key from its cache at once, well inside `cache_ttl_seconds`.
//!
//! A notification sent while the listening connection is down is lost, so after every
//! reconnection the whole cache is emptied: a key revoked meanwhile is looked up afresh.

use std::time::Duration;

use std::sync::Arc;

use super::cache::KeyCache;
use super::lookup::{self, Lookup};
use crate::auth::token::KeyId;
use crate::store::Revocations;

const BACKOFF_START: Duration = Duration::from_secs(1);
/// Also how long a store that is back can go unnoticed: while the listener is down, it is
/// the only probe of the store.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long one attempt to (re)connect may take.
const CONNECT_WAIT: Duration = Duration::from_secs(2);

pub struct RevocationPush {
    url: String,
    cache: KeyCache,
    /// The store lookup, whose health a lost connection marks down: requests then stop
    /// waiting on the store at once, and reconnecting tells when it is back.
    lookup: Arc<Lookup>,
    /// `portcullis_revocation_push_total{event}`, when metrics are on.
    events: Option<prometheus::IntCounterVec>,
}

impl RevocationPush {
    pub(super) fn new(url: String, cache: KeyCache, lookup: Arc<Lookup>) -> RevocationPush {
        RevocationPush {
            url,
            cache,
            lookup,
            events: None,
        }
    }

    pub fn with_event_counter(mut self, events: prometheus::IntCounterVec) -> Self {
        self.events = Some(events);
        self
    }

    fn count(&self, event: &str) {
        if let Some(events) = &self.events {
            events.with_label_values(&[event]).inc();
        }
    }

    /// Runs for the life of the process.
    pub async fn run(&self) {
        let mut backoff = BACKOFF_START;
        let mut connected_before = false;
        loop {
            // The listener never reconnects by itself: each reconnection is seen here, to
            // empty the cache.
            match Revocations::listen(&self.url, CONNECT_WAIT).await {
                Ok(mut listener) => {
                    backoff = BACKOFF_START;
                    self.lookup.health.release();
                    if connected_before {
                        // Revokes may have been announced while nobody listened.
                        self.cache.invalidate_all();
                        self.count("reconnected");
                        log::warn!("revocation push: listening again; API-key cache emptied");
                    } else {
                        log::info!("revocation push: listening for revoked keys");
                    }
                    connected_before = true;
                    self.receive(&mut listener).await;
                    self.count("disconnected");
                    // Most likely the server went away: stop sending lookups its way until
                    // the listener is back (at once, if only this connection was cut).
                    self.lookup
                        .health
                        .hold_down(&"the revocation listener lost its connection");
                    log::warn!(
                        "revocation push: connection lost; revoked keys are refused within \
                         cache_ttl_seconds until it is back"
                    );
                }
                Err(e) => {
                    self.count("error");
                    log::debug!("revocation push: cannot listen: {e}");
                    self.lookup.health.hold_down(&e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Evicts each announced key until the connection is lost.
    async fn receive(&self, listener: &mut Revocations) {
        while let Some(payload) = listener.recv().await {
            self.count("notified");
            match KeyId::parse(&payload) {
                Some(id) => {
                    self.cache.invalidate(&id).await;
                    // Off the receive loop: the next notification need not wait on a query.
                    let (cache, lookup) = (self.cache.clone(), self.lookup.clone());
                    tokio::spawn(async move { lookup::recheck(&cache, &lookup, id).await });
                }
                None => log::debug!("revocation push: ignored a payload that is no key id"),
            }
        }
    }
}
