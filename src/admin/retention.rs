//! Keys revoked longer ago than `[admin] revoked_retention_days` are deleted, in the
//! background, off the request path: without it, create-then-revoke would grow the store
//! forever (the per-owner cap counts active keys only). Their creation and revocation stay in
//! the access log.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::store::KeyStore;
use crate::time::unix_now;

/// How often the store is swept (and once at start-up): retention is counted in days.
const INTERVAL: Duration = Duration::from_secs(3600);
/// Rows deleted per statement: short writes that never hold up creates and revokes for long.
const BATCH: u32 = 500;

pub(crate) struct Retention {
    store: Arc<dyn KeyStore>,
    keep: Duration,
}

impl Retention {
    pub(crate) fn new(store: Arc<dyn KeyStore>, keep: Duration) -> Retention {
        Retention { store, keep }
    }

    /// Deletes every key revoked more than `keep` ago, a batch at a time. A failure is logged
    /// and left to the next sweep: the rows are only kept a little longer.
    async fn sweep(&self) {
        let before = unix_now().saturating_sub(self.keep.as_secs() as i64);
        let mut deleted = 0;
        loop {
            match self.store.purge_revoked(before, BATCH).await {
                Ok(n) => {
                    deleted += n;
                    if n < u64::from(BATCH) {
                        break;
                    }
                }
                Err(e) => {
                    log::warn!("key store: cannot delete keys revoked long ago: {e}");
                    break;
                }
            }
        }
        if deleted > 0 {
            log::info!(
                "key store: deleted {deleted} key(s) revoked more than {} day(s) ago",
                self.keep.as_secs() / 86_400
            );
        }
    }
}

#[async_trait]
impl BackgroundService for Retention {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            self.sweep().await;
            tokio::select! {
                _ = tokio::time::sleep(INTERVAL) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}
