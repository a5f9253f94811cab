//! Graceful drain that ends when nothing is left in flight.
//!
//! On SIGTERM, and on SIGQUIT once the listening sockets are handed over, Pingora stops
//! accepting, then sleeps the whole `grace_period_seconds` before stopping its runtimes, even
//! with nothing left to serve. We count the open client connections; once the listeners are
//! closed and the count is zero, the access log is flushed and the process exits. Pingora's
//! own sleep stays the upper bound for connections that do not finish.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::access_log::AccessLog;

/// Open client connections of the proxy service, and whether its listeners are closed.
#[derive(Default)]
pub struct Connections {
    open: AtomicUsize,
    listeners_closed: AtomicBool,
}

impl Connections {
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

struct Open<'a>(&'a Connections);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Wraps the proxy app to count each connection for as long as it is served, keep-alive
/// requests included: a connection is counted until Pingora lets go of it.
pub struct Tracked<A> {
    inner: Arc<A>,
    connections: Arc<Connections>,
}

impl<A> Tracked<A> {
    pub fn new(inner: A, connections: Arc<Connections>) -> Tracked<A> {
        Tracked {
            inner: Arc::new(inner),
            connections,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Tracked<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        self.connections.open.fetch_add(1, Ordering::AcqRel);
        let _open = Open(&self.connections);
        self.inner.process_new(stream, shutdown).await
    }

    /// Pingora calls this once every accept loop of the service has ended.
    async fn cleanup(&self) {
        self.connections
            .listeners_closed
            .store(true, Ordering::Release);
        // This also wakes idle keep-alive connections so that they close.
        self.inner.cleanup().await;
    }
}

/// Exits the process once a graceful shutdown has nothing left to wait for.
pub struct Drain {
    pub connections: Arc<Connections>,
    pub access_log: AccessLog,
}

/// A connection accepted just before the listeners closed may not have reached
/// `process_new` yet: give its task this long to be counted.
const SETTLE: Duration = Duration::from_millis(200);
const POLL: Duration = Duration::from_millis(50);

#[async_trait]
impl BackgroundService for Drain {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
        while !self.connections.listeners_closed.load(Ordering::Acquire) {
            tokio::time::sleep(POLL).await;
        }
        tokio::time::sleep(SETTLE).await;
        let mut last = usize::MAX;
        loop {
            let open = self.connections.open();
            if open == 0 {
                break;
            }
            if open != last {
                log::info!("draining: {open} connection(s) still open");
                last = open;
            }
            tokio::time::sleep(POLL).await;
        }
        log::info!("drained: nothing left in flight, exiting");
        // Blocks this worker briefly; nothing else is left to run.
        self.access_log.flush(Duration::from_secs(2));
        std::process::exit(0);
    }
}
