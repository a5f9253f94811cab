//! Keeping budgets current: the table of who has which budget, loaded before the gateway
//! serves and then polled from the store every `POLL` (so a change made anywhere, by the CLI
//! or the key API, is enforced within about a second by every gateway, with or without
//! Redis); and the counters' seeds from the ledger: at start-up, for a newly budgeted
//! subject, after a Redis outage (raising the shared counters to what the ledger holds),
//! and every `RESEED` while Redis is down (so per-process counting sees the fleet's flushed
//! usage). And the refunds' flusher: a thread of its own with its own runtime and Redis
//! connection (like the ledger's), so the last flush of a clean stop runs after every request
//! has settled, whatever state Pingora's runtimes are in (`final_flush`).

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::shared::{counter_key, expiry, PERIOD};
use super::window::{Kind, Windows};
use super::{Budgets, Table, Who};
use crate::store::{
    Budget, BudgetChange, LedgerStore, Store, StoreError, Subject, TeamChange, WindowUsage,
};

/// How often the store is asked for budget changes.
pub(crate) const POLL: Duration = Duration::from_millis(250);
/// Changes are read back this far before the newest one seen: a writer's clock may lag, and
/// a change committed late with an older stamp is still picked up.
const OVERLAP_MS: i64 = 10_000;
/// How long a stopping process waits for its last refunds to reach Redis: one ADJUST per 256
/// counters, each given the budget calls' 1 s.
pub(crate) const FINAL_REFUNDS: Duration = Duration::from_secs(2);
/// While Redis is down, per-process counters are raised to the ledger this often.
const RESEED: Duration = Duration::from_secs(5);

/// What the poller remembers between ticks.
#[derive(Default)]
pub(crate) struct SyncState {
    newest_ms: i64,
    /// The newest team membership change seen.
    newest_team_ms: i64,
    recoveries: u64,
    reseeded: Option<Instant>,
    store_down: bool,
}

impl Budgets {
    /// Loads every budget and seeds this process's counters from the ledger. Called before
    /// serving, so the first request is already decided against spent budget.
    pub(crate) async fn load(
        &self,
        store: &dyn Store,
        state: &mut SyncState,
    ) -> Result<usize, StoreError> {
        let changes = store.budget_changes(0).await?;
        let teams = store.team_changes(0).await?;
        let mut table = Table::default();
        for c in &changes {
            table.set(&c.subject, c.budget);
        }
        for c in &teams {
            table.set_team(&c.owner, c.team.as_deref());
        }
        state.newest_ms = changes.iter().map(|c| c.changed_at_ms).max().unwrap_or(0);
        state.newest_team_ms = teams.iter().map(|c| c.changed_at_ms).max().unwrap_or(0);
        let n = table.budgets().filter(|b| !b.is_empty()).count();
        self.table.store(Arc::new(table));
        self.seed_all(store, false).await?;
        self.seeded.store(true, Ordering::Release);
        Ok(n)
    }

    /// One tick: budget changes, then whatever seeding Redis's state calls for.
    pub(crate) async fn poll(&self, state: &mut SyncState) {
        // A start-up load or seed that failed is retried until it succeeds: until then no
        // budget is decided (requests of budgeted callers get 503 budget_unavailable).
        if !self.is_seeded() {
            match self.load(&*self.store, state).await {
                Ok(n) => log::warn!(
                    "budgets: {n} key and owner budget(s) loaded and seeded from the ledger;                      budgets are decided again"
                ),
                Err(e) => {
                    if !state.store_down {
                        state.store_down = true;
                        log::warn!("budgets: cannot seed budgets from the ledger ({e}); retrying");
                    }
                    return;
                }
            }
        }
        let result = self.poll_changes(state).await;
        let result = match (result, &self.shared) {
            (Ok(()), Some(shared)) => {
                let backend = shared.backend();
                if backend.recoveries() != state.recoveries {
                    state.recoveries = backend.recoveries();
                    self.seed_all(&*self.store, true).await
                } else if backend.is_down() && state.reseeded.is_none_or(|t| t.elapsed() > RESEED) {
                    state.reseeded = Some(Instant::now());
                    self.seed_all(&*self.store, false).await
                } else {
                    Ok(())
                }
            }
            (result, _) => result,
        };
        match result {
            Ok(()) if state.store_down => {
                state.store_down = false;
                log::warn!("budgets: the key store answers again; budget changes apply again");
            }
            Err(e) if !state.store_down => {
                state.store_down = true;
                log::warn!(
                    "budgets: cannot read budgets from the key store ({e}); enforcing the \
                     budgets known until it answers"
                );
            }
            _ => {}
        }
    }

    async fn poll_changes(&self, state: &mut SyncState) -> Result<(), StoreError> {
        let since = (state.newest_ms - OVERLAP_MS).max(0);
        let changes = self.store.budget_changes(since).await?;
        let since_team = (state.newest_team_ms - OVERLAP_MS).max(0);
        let teams = self.store.team_changes(since_team).await?;
        let current = self.table.load_full();
        let changed: Vec<&BudgetChange> = (changes.iter())
            .filter(|c| current.get(&c.subject) != Some(c.budget))
            .collect();
        let moved: Vec<&TeamChange> = (teams.iter())
            .filter(|c| current.team_of(Some(&c.owner)).map(|t| &**t) != c.team.as_deref())
            .collect();
        if let Some(newest) = changes.iter().map(|c| c.changed_at_ms).max() {
            state.newest_ms = state.newest_ms.max(newest);
        }
        if let Some(newest) = teams.iter().map(|c| c.changed_at_ms).max() {
            state.newest_team_ms = state.newest_team_ms.max(newest);
        }
        if changed.is_empty() && moved.is_empty() {
            return Ok(());
        }
        // Subjects budgeted anew (never, or not since their budget was cleared: meanwhile
        // nothing was counted) start from what the ledger holds, before they are enforced.
        let windows = Windows::at(self.clock.now());
        let anew = |c: &&&BudgetChange| {
            !c.budget.is_empty() && current.get(&c.subject).is_none_or(|b| b.is_empty())
        };
        let mut seeds = Vec::new();
        for c in changed.iter().filter(anew) {
            let usage = self.store.window_usage(&c.subject, windows.starts).await?;
            seeds.push((c.subject.clone(), c.budget, usage));
        }
        // Shared counters too: one left from before a clear missed what was used meanwhile.
        self.raise(&seeds, &windows, true).await;
        let mut table = Table::clone(&current);
        for c in &changed {
            table.set(&c.subject, c.budget);
        }
        for c in &moved {
            table.set_team(&c.owner, c.team.as_deref());
        }
        log::info!(
            "budgets: {} budget(s) and {} team membership(s) changed",
            changed.len(),
            moved.len()
        );
        self.table.store(Arc::new(table));
        Ok(())
    }

    /// Raises every budgeted subject's counters to the ledger's values: this process's, and
    /// with `shared` Redis's too.
    async fn seed_all(&self, store: &dyn LedgerStore, shared: bool) -> Result<(), StoreError> {
        let windows = Windows::at(self.clock.now());
        let usage = store.all_window_usage(windows.starts).await?;
        let table = self.table.load_full();
        let seeds: Vec<(Subject, Budget, WindowUsage)> = (usage.into_iter())
            .filter_map(|(subject, used)| Some((subject.clone(), table.get(&subject)?, used)))
            .collect();
        self.raise(&seeds, &windows, shared).await;
        Ok(())
    }

    /// Raises these subjects' counters to the ledger's values: this process's, and with
    /// `shared` Redis's too (a missed raise is made up by the reservation's own seeding).
    async fn raise(
        &self,
        seeds: &[(Subject, Budget, WindowUsage)],
        windows: &Windows,
        shared: bool,
    ) {
        let mut keys = Vec::new();
        let mut floors = Vec::new();
        for (subject, budget, used) in seeds {
            let who = who(subject);
            self.local.seed(who, &windows.starts, used);
            for kind in Kind::ALL.into_iter().filter(|k| k.limit(budget).is_some()) {
                keys.push(counter_key(who, kind, kind.start(&windows.starts)));
                floors.push((kind.used(used), expiry(kind, windows)));
            }
        }
        if let (true, Some(shared)) = (shared && !keys.is_empty(), &self.shared) {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            for (keys, floors) in keys.chunks(256).zip(floors.chunks(256)) {
                shared.raise(keys, floors).await;
            }
        }
    }
}

impl Budgets {
    /// Starts the thread that sends settled refunds to Redis every `PERIOD` (none without
    /// Redis); after any daemon fork, since threads do not survive it.
    pub(crate) fn start_flusher(self: &Arc<Self>) {
        let Some(shared) = &self.shared else {
            return;
        };
        let (ask, asked) = tokio::sync::mpsc::unbounded_channel();
        let budgets = self.clone();
        let spawned = std::thread::Builder::new()
            .name("budget-refunds".into())
            .spawn(move || budgets.run_flusher(asked));
        match spawned {
            Ok(_) => *shared.now.lock().unwrap_or_else(|e| e.into_inner()) = Some(ask),
            Err(e) => log::error!("cannot start the budgets' refund flusher: {e}"),
        }
    }

    fn run_flusher(&self, mut asked: tokio::sync::mpsc::UnboundedReceiver<mpsc::Sender<bool>>) {
        let Some(shared) = &self.shared else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            log::error!("cannot start the budgets' refund flusher's runtime");
            return;
        };
        runtime.block_on(async {
            let mut tick = tokio::time::interval(PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let reply = tokio::select! {
                    _ = tick.tick() => None,
                    _ = shared.large() => None,
                    asked = asked.recv() => match asked {
                        Some(reply) => Some(reply),
                        None => return,
                    },
                };
                let sent = shared.flush().await;
                if let Some(reply) = reply {
                    let _ = reply.send(sent);
                }
            }
        });
    }

    /// Sends every refund settled so far and waits for it, at most `within`: the last step of
    /// a clean stop, once no request is left to settle. False if some did not reach Redis
    /// (they over-count their counters until the window ends; never the other way).
    pub(crate) fn final_flush(&self, within: Duration) -> bool {
        let Some(shared) = &self.shared else {
            return true;
        };
        let ask = shared.now.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (reply, answer) = mpsc::channel();
        let sent = ask.is_some_and(|ask| ask.send(reply).is_ok())
            && answer.recv_timeout(within).unwrap_or(false);
        if !sent {
            log::warn!(
                "budgets: the last refunds did not reach Redis within {} ms: the shared \
                 counters keep what those requests reserved beyond their use until the window ends",
                within.as_millis()
            );
        }
        sent
    }

    /// Sends every pending refund now, on the caller's runtime (tests).
    #[cfg(test)]
    pub(crate) async fn flush_refunds(&self) -> bool {
        match &self.shared {
            Some(shared) => shared.flush().await,
            None => true,
        }
    }
}

fn who(subject: &Subject) -> Who<'_> {
    match subject {
        Subject::Key(id) => Who::Key(id),
        Subject::Owner(id) => Who::Owner(id),
        Subject::Team(id) => Who::Team(id),
    }
}

/// The background service polling budget changes.
pub(crate) struct BudgetSync {
    pub budgets: Arc<Budgets>,
    pub state: std::sync::Mutex<Option<SyncState>>,
}

#[async_trait]
impl BackgroundService for BudgetSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut state = (self.state.lock().unwrap_or_else(|e| e.into_inner()))
            .take()
            .unwrap_or_default();
        self.budgets.start_flusher();
        if let Some(shared) = &self.budgets.shared {
            shared.warm().await;
        }
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.budgets.poll(&mut state).await,
                _ = shutdown.changed() => return,
            }
        }
    }
}
