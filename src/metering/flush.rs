//! The ledger's flusher: a thread of its own that, every `flush_seconds`, takes the meter's
//! totals and adds them to the key store in one transaction, exactly once (a batch id written
//! in the same transaction). A failed write keeps its batch for the next tick, under the same
//! id: nothing is lost while the process lives, and nothing is counted twice.
//!
//! The thread has its own runtime and its own store connections, so it outlives Pingora's
//! runtimes: the last flush of a clean stop runs after every request has recorded, when those
//! runtimes are stopping or gone (`final_flush`, called by the drain and by `serve`).

use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::{IntCounterVec, IntGauge, Opts};

use super::Meter;
use crate::observe::metrics::Metrics;
use crate::store::{open_store, LedgerStore, StoreError, UsageRow};

/// A write that takes longer is abandoned (rolled back) and retried on the next tick.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping process waits for the ledger's last write.
pub(crate) const FINAL_FLUSH: Duration = Duration::from_secs(5);
/// While writes keep failing, one warning this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

pub(crate) struct Ledger {
    meter: Arc<Meter>,
    /// `[auth.api_keys] database`; may hold a password: never logged.
    database: String,
    every: Duration,
    flushes: IntCounterVec,
    pending: IntGauge,
    /// Asks the thread for a flush now; the answer says whether everything was written.
    now: Mutex<Option<tokio::sync::mpsc::UnboundedSender<mpsc::Sender<bool>>>>,
}

impl Ledger {
    pub(crate) fn new(
        meter: Arc<Meter>,
        database: &str,
        every: Duration,
        metrics: &Metrics,
    ) -> Ledger {
        let flushes = IntCounterVec::new(
            Opts::new(
                "portcullis_ledger_flushes_total",
                "Batched writes of the usage ledger to the key store (one transaction each, at most one per [metering] flush_seconds), by result (ok, error).",
            ),
            &["result"],
        )
        .expect("valid metric");
        for result in ["ok", "error"] {
            flushes.with_label_values(&[result]);
        }
        let pending = IntGauge::new(
            "portcullis_ledger_pending_rows",
            "Usage-ledger rows kept in memory after a failed write, retried on the next flush.",
        )
        .expect("valid metric");
        metrics.register(Box::new(flushes.clone()));
        metrics.register(Box::new(pending.clone()));
        Ledger {
            meter,
            database: database.to_string(),
            every,
            flushes,
            pending,
            now: Mutex::new(None),
        }
    }

    /// Starts the flusher thread; after any daemon fork, since threads do not survive it.
    pub(super) fn start(self: &Arc<Self>) {
        let (ask, asked) = tokio::sync::mpsc::unbounded_channel();
        let ledger = self.clone();
        let spawned = std::thread::Builder::new()
            .name("ledger".into())
            .spawn(move || ledger.run(asked));
        match spawned {
            Ok(_) => *self.now.lock().unwrap_or_else(|e| e.into_inner()) = Some(ask),
            Err(e) => log::error!("cannot start the usage ledger's flusher: {e}"),
        }
    }

    fn run(&self, mut asked: tokio::sync::mpsc::UnboundedReceiver<mpsc::Sender<bool>>) {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            log::error!("cannot start the usage ledger's runtime");
            return;
        };
        runtime.block_on(async {
            let mut writer = Writer::default();
            // The first tick one period after start: an immediate one would race a test's
            // (or a stop's) own flush of the same rows and count a failed write twice.
            let first = tokio::time::Instant::now() + self.every;
            let mut tick = tokio::time::interval_at(first, self.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let reply = tokio::select! {
                    _ = tick.tick() => None,
                    asked = asked.recv() => match asked {
                        Some(reply) => Some(reply),
                        None => return,
                    },
                };
                let written = self.flush(&mut writer).await;
                if let Some(reply) = reply {
                    let _ = reply.send(written);
                }
            }
        });
    }

    /// Writes what the meter holds; true when it is all in the store. A batch whose write
    /// failed is kept, with its id, and written first on the next tick: if its commit did
    /// happen (a timeout, a connection lost after the commit), the store adds nothing.
    async fn flush(&self, writer: &mut Writer) -> bool {
        let now = crate::time::unix_now();
        self.meter.forget_models_before(now - now.rem_euclid(3600));
        // The batch left over first, then one new one: a flush never chases a busy meter.
        if let Some(batch) = writer.pending.take() {
            if !self.write(writer, batch).await {
                return false;
            }
        }
        let rows = self.meter.take();
        rows.is_empty() || self.write(writer, Batch::new(rows)).await
    }

    /// Writes one batch, or keeps it for the next tick; whether it was written.
    async fn write(&self, writer: &mut Writer, batch: Batch) -> bool {
        match writer.write(&self.database, &batch).await {
            Ok(()) => {
                self.flushes.with_label_values(&["ok"]).inc();
                self.pending.set(0);
                if let Some(since) = writer.failing.take() {
                    log::info!(
                        "usage ledger: written again after {} s of failed writes",
                        since.elapsed().as_secs()
                    );
                }
                true
            }
            Err(e) => {
                let n = batch.rows.len();
                writer.pending = Some(batch);
                self.flushes.with_label_values(&["error"]).inc();
                self.pending.set(n as i64);
                let now = Instant::now();
                if writer.warned.is_none_or(|at| now - at >= WARN_EVERY) {
                    writer.warned = Some(now);
                    log::warn!(
                        "usage ledger: cannot write {n} row(s) to the key store ({e}); \
                         kept in memory and retried every {} s",
                        self.every.as_secs()
                    );
                }
                writer.failing.get_or_insert(now);
                false
            }
        }
    }

    /// Flushes everything recorded so far and waits for it, at most `within`: the last step
    /// of a clean stop, once no request is left to record. False if it was not all written.
    pub(crate) fn final_flush(&self, within: Duration) -> bool {
        let ask = self.now.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (reply, answer) = mpsc::channel();
        let written = ask.is_some_and(|ask| ask.send(reply).is_ok())
            && answer.recv_timeout(within).unwrap_or(false);
        if written {
            log::info!("usage ledger: flushed");
        } else {
            log::error!(
                "usage ledger: the last flush did not complete within {} s: the usage of up to \
                 {} s before the stop may be missing",
                within.as_secs(),
                self.every.as_secs()
            );
        }
        written
    }
}

/// The flusher's own store handle, opened on its first write (and again after a failed open).
#[derive(Default)]
struct Writer {
    store: Option<Arc<dyn LedgerStore>>,
    /// A batch whose write failed, to be written again under the same id.
    pending: Option<Batch>,
    /// Since when writes fail, and when that was last logged.
    failing: Option<Instant>,
    warned: Option<Instant>,
}

impl Writer {
    async fn write(&mut self, database: &str, batch: &Batch) -> Result<(), StoreError> {
        let store = match &self.store {
            Some(store) => store.clone(),
            None => {
                let store: Arc<dyn LedgerStore> = open_store(database, false).await?;
                self.store = Some(store.clone());
                store
            }
        };
        tokio::time::timeout(WRITE_TIMEOUT, store.add_usage_once(&batch.id, &batch.rows))
            .await
            .map_err(|_| format!("no answer within {} s", WRITE_TIMEOUT.as_secs()))?
    }
}

/// Rows taken from the meter for one write, and the id that makes the write happen once.
struct Batch {
    id: String,
    rows: Vec<UsageRow>,
}

impl Batch {
    fn new(rows: Vec<UsageRow>) -> Batch {
        let id = format!(
            "{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        Batch { id, rows }
    }
}

/// Starts the flusher when Pingora starts its services.
pub(crate) struct LedgerService(pub Arc<Ledger>);

#[async_trait]
impl BackgroundService for LedgerService {
    async fn start(&self, _shutdown: ShutdownWatch) {
        self.0.start();
    }
}
