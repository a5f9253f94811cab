//! Graceful drain that ends when nothing is left in flight.
//!
//! On SIGTERM, and on SIGQUIT once the listening sockets are handed over, Pingora stops
//! accepting, then sleeps the whole `grace_period_seconds` before stopping its runtimes, even
//! with nothing left to serve. We count the open client connections; once the listeners are
//! closed and the count is zero, every request has recorded: the budgets' refunds, the usage
//! ledger and the access log are flushed and the process exits. Pingora's
//! own sleep stays the upper bound for connections that do not finish.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::{ExecutionPhase, ShutdownWatch};
use pingora::services::background::BackgroundService;

use crate::limits::budgets::{Budgets, FINAL_REFUNDS};
use crate::metering::Ledger;
use crate::observe::access_log::AccessLog;

/// Open client connections of the proxy service, and whether its listeners are closed.
#[derive(Default)]
pub(crate) struct Connections {
    open: AtomicUsize,
    listeners_closed: AtomicBool,
}

impl Connections {
    pub(crate) fn open(&self) -> usize {
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
pub(crate) struct Tracked<A> {
    inner: Arc<A>,
    connections: Arc<Connections>,
}

impl<A> Tracked<A> {
    pub(crate) fn new(inner: A, connections: Arc<Connections>) -> Tracked<A> {
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
pub(crate) struct Drain {
    pub connections: Arc<Connections>,
    pub access_log: AccessLog,
    pub ledger: Option<Arc<Ledger>>,
    /// Their refunds not yet sent to Redis go before the exit.
    pub budgets: Option<Arc<Budgets>>,
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
        if let Some(budgets) = &self.budgets {
            budgets.final_flush(FINAL_REFUNDS);
        }
        if let Some(ledger) = &self.ledger {
            ledger.final_flush(crate::metering::FINAL_FLUSH);
        }
        self.access_log.flush(Duration::from_secs(2));
        std::process::exit(0);
    }
}

/// Ends the process when a shutdown overruns its bound, whatever its tasks are doing:
/// `grace_period_seconds + graceful_shutdown_timeout_seconds` after SIGTERM or an upgrade,
/// `QUICK_BOUND` after SIGINT.
///
/// Why it is needed: with one single-threaded runtime per worker (`work_stealing = false`),
/// Pingora registers a listener with the I/O driver of the worker that started the service
/// but may run its accept loop on another worker. On SIGINT the accept loops are not told to
/// stop; the workers are shut down in parallel, and when the listener's worker goes first its
/// driver wakes the accept loop, whose `accept()` now fails at once ("A Tokio 1.x context was
/// found, but it is being shutdown"). Pingora 0.9.1's loop retries every such error without
/// yielding, so that worker never reaches its own shutdown and the process waits for it
/// forever. The fix belongs in the engine (yield or stop on a failed accept); until then this
/// bounds the exit, and `logging` bounds the error lines.
pub(crate) struct Watchdog {
    pub phases: std::sync::Mutex<Option<tokio::sync::broadcast::Receiver<ExecutionPhase>>>,
    pub grace: Duration,
    pub graceful_timeout: Duration,
    pub access_log: AccessLog,
    pub ledger: Option<Arc<Ledger>>,
}

/// How long a fast shutdown (SIGINT) may take.
pub(crate) const QUICK_BOUND: Duration = Duration::from_secs(2);

#[async_trait]
impl BackgroundService for Watchdog {
    async fn start(&self, _shutdown: ShutdownWatch) {
        // A thread with its own runtime, started after any daemon fork: it must not depend on
        // the runtimes it watches.
        let Some(phases) = self.phases.lock().ok().and_then(|mut p| p.take()) else {
            return;
        };
        let (grace, timeout, access_log) =
            (self.grace, self.graceful_timeout, self.access_log.clone());
        let ledger = self.ledger.clone();
        let spawned = std::thread::Builder::new()
            .name("shutdown-watchdog".into())
            .spawn(move || watch(phases, grace, timeout, access_log, ledger));
        if let Err(e) = spawned {
            log::error!("cannot start the shutdown watchdog: {e}");
        }
    }
}

/// The exit deadline the shutdown phases set so far: the earliest bound wins.
struct Deadline {
    at: Option<std::time::Instant>,
    graceful: bool,
    grace: Duration,
    graceful_timeout: Duration,
}

impl Deadline {
    fn on(&mut self, phase: &ExecutionPhase, now: std::time::Instant) {
        let bound = match phase {
            ExecutionPhase::GracefulTerminate | ExecutionPhase::GracefulUpgradeTransferringFds => {
                self.graceful = true;
                now + self.grace + self.graceful_timeout
            }
            // Without a graceful phase before it, this is SIGINT.
            ExecutionPhase::ShutdownStarted if !self.graceful => now + QUICK_BOUND,
            ExecutionPhase::ShutdownRuntimes if self.graceful => now + self.graceful_timeout,
            ExecutionPhase::ShutdownRuntimes => now + QUICK_BOUND,
            _ => return,
        };
        self.at = Some(self.at.map_or(bound, |at| at.min(bound)));
    }
}

fn watch(
    mut phases: tokio::sync::broadcast::Receiver<ExecutionPhase>,
    grace: Duration,
    graceful_timeout: Duration,
    access_log: AccessLog,
    ledger: Option<Arc<Ledger>>,
) {
    use tokio::sync::broadcast::error::RecvError;
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        log::error!("cannot start the shutdown watchdog's runtime");
        return;
    };
    runtime.block_on(async {
        let mut deadline = Deadline {
            at: None,
            graceful: false,
            grace,
            graceful_timeout,
        };
        loop {
            let far = std::time::Instant::now() + Duration::from_secs(86_400 * 365);
            let wake = tokio::time::Instant::from_std(deadline.at.unwrap_or(far));
            tokio::select! {
                phase = phases.recv() => match phase {
                    Ok(phase) => deadline.on(&phase, std::time::Instant::now()),
                    Err(RecvError::Lagged(_)) => {}
                    // The server is gone: `serve` is returning and the process exits.
                    Err(RecvError::Closed) => return,
                },
                _ = tokio::time::sleep_until(wake) => break,
            }
        }
        log::error!("shutdown did not finish in time: exiting now");
        if let Some(ledger) = &ledger {
            ledger.final_flush(Duration::from_secs(1));
        }
        access_log.flush(Duration::from_millis(200));
        // `_exit`: no atexit handlers, no waiting on the threads that failed to stop.
        // SAFETY: ends the process; nothing runs after it.
        unsafe { libc::_exit(1) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline() -> Deadline {
        Deadline {
            at: None,
            graceful: false,
            grace: Duration::from_secs(300),
            graceful_timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn sigint_bounds_the_exit_to_the_quick_bound() {
        let (mut d, t0) = (deadline(), std::time::Instant::now());
        d.on(&ExecutionPhase::Running, t0);
        assert_eq!(d.at, None, "no deadline while running");
        d.on(&ExecutionPhase::ShutdownStarted, t0);
        d.on(
            &ExecutionPhase::ShutdownRuntimes,
            t0 + Duration::from_millis(1),
        );
        assert_eq!(d.at, Some(t0 + QUICK_BOUND));
    }

    #[test]
    fn sigterm_and_upgrades_are_bounded_by_grace_plus_timeout_from_the_signal() {
        for first in [
            ExecutionPhase::GracefulTerminate,
            ExecutionPhase::GracefulUpgradeTransferringFds,
        ] {
            let (mut d, t0) = (deadline(), std::time::Instant::now());
            d.on(&first, t0);
            let bound = t0 + Duration::from_secs(305);
            assert_eq!(d.at, Some(bound));
            // Later phases never extend it...
            d.on(
                &ExecutionPhase::ShutdownStarted,
                t0 + Duration::from_secs(1),
            );
            d.on(
                &ExecutionPhase::ShutdownGracePeriod,
                t0 + Duration::from_secs(1),
            );
            d.on(
                &ExecutionPhase::ShutdownRuntimes,
                t0 + Duration::from_secs(301),
            );
            assert_eq!(d.at, Some(bound));
            // ...but a drain that reaches the runtimes early brings it forward.
            let (mut d, t0) = (deadline(), std::time::Instant::now());
            d.on(&first, t0);
            d.on(
                &ExecutionPhase::ShutdownRuntimes,
                t0 + Duration::from_secs(10),
            );
            assert_eq!(d.at, Some(t0 + Duration::from_secs(15)));
        }
    }
}
