//! Budgets: per-key, per-owner and per-team limits on tokens per hour, day and month, requests
//! per day and cost per day and month, in fixed UTC windows (`[budgets]`, docs/budgets.md,
//! docs/costs.md).
//!
//! The request flow asks `reserve` once the body is read and before anything is forwarded:
//! the request's worst case (prompt estimate + the completion tokens it may use, and that
//! priced) is reserved on every limited counter of its key, its owner and its owner's team at
//! once, or it is refused. `settle`, in the record phase, replaces the reservation by what the
//! response really used. Counters are per process (`local.rs`, seeded from the ledger) or,
//! with `[rate_limits] redis`, shared by the fleet (`shared.rs`), falling back to per process
//! while Redis fails. With Redis a settlement's refund is batched off the request path and
//! sent by a flusher every 50 ms, while a charge above the reservation goes at once: shared.rs
//! says why that keeps the fleet exact. `sync.rs` keeps the table of who has which budget
//! current (one poll of the store's changes every 250 ms) and runs the flusher.

mod local;
mod shared;
mod sync;
pub(crate) mod window;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus::{IntCounterVec, Opts};

use crate::api::CapRule;
use crate::auth::Principal;
use crate::config::{BudgetSettings, Enforcement};
use crate::limits::SharedRedis;
use crate::observe::metrics::Metrics;
use crate::pricing::Price;
use crate::store::{amount_text, Budget, Store, Subject, Unit};
use crate::time::{rfc3339, Clock};
use local::Local;
use shared::{Counter, Reply, Shared};
pub(crate) use sync::{BudgetSync, SyncState, FINAL_REFUNDS};
use window::{Kind, Windows};

/// The longest a request waits on the ledger to seed a shared counter that went missing (once
/// per subject and window, or after Redis lost its data); past it, this process's own count.
const SEED_TIMEOUT: Duration = Duration::from_secs(2);

/// Whose counter: an API key, an owner (a key's owner or a JWT `sub`), or a team.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who<'a> {
    Key(&'a str),
    Owner(&'a str),
    Team(&'a str),
}

impl Who<'_> {
    fn subject(self) -> Subject {
        match self {
            Who::Key(id) => Subject::Key(id.to_owned()),
            Who::Owner(id) => Subject::Owner(id.to_owned()),
            Who::Team(id) => Subject::Team(id.to_owned()),
        }
    }

    fn describe(self) -> String {
        match self {
            Who::Key(id) => format!("key {id}"),
            Who::Owner(id) => format!("owner {id:?}"),
            Who::Team(id) => format!("team {id:?}"),
        }
    }
}

/// What a request asks of its budgets: tokens, one request, and its cost in micros.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ask {
    pub tokens: u64,
    pub requests: u64,
    pub cost: u64,
}

/// A counter without room: which subject (0: key, 1: owner, 2: team) and which window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    pub subject: usize,
    pub kind: Kind,
    pub used: u64,
    pub limit: u64,
    /// What the request asked of that counter.
    pub asked: u64,
}

/// Who has which budget and which owner is in which team: swapped whole when one changes
/// (rarely), read lock-free. A cleared budget stays as an empty one: it overrides the budget a
/// cached key was looked up with.
#[derive(Default, Clone)]
pub(crate) struct Table {
    keys: HashMap<Box<str>, Budget>,
    owners: HashMap<Box<str>, Budget>,
    teams: HashMap<Arc<str>, Budget>,
    /// Owner → its team (owners in none are left out).
    members: HashMap<Box<str>, Arc<str>>,
}

impl Table {
    fn set(&mut self, subject: &Subject, budget: Budget) {
        match subject {
            Subject::Key(id) => self.keys.insert(id.as_str().into(), budget),
            Subject::Owner(id) => self.owners.insert(id.as_str().into(), budget),
            Subject::Team(id) => self.teams.insert(id.as_str().into(), budget),
        };
    }

    fn set_team(&mut self, owner: &str, team: Option<&str>) {
        match team {
            Some(team) => self.members.insert(owner.into(), team.into()),
            None => self.members.remove(owner),
        };
    }

    /// The team of `owner`, if any.
    fn team_of(&self, owner: Option<&str>) -> Option<&Arc<str>> {
        self.members.get(owner?)
    }

    /// The budgets that apply to `principal`, non-empty ones only: its key's (as the table
    /// has it, else as the key was looked up), its owner's and its owner's team's.
    fn of<'p>(&self, p: &'p Principal) -> Budgeted<'p> {
        let key = p.key_id().and_then(|k| {
            let budget = self.keys.get(k).copied().unwrap_or(p.budget);
            (!budget.is_empty()).then_some((k, budget))
        });
        let owner = p.owner.as_deref().and_then(|o| {
            let budget = self.owners.get(o).copied()?;
            (!budget.is_empty()).then_some((o, budget))
        });
        let team = self.team_of(p.owner.as_deref()).and_then(|t| {
            let budget = self.teams.get(t).copied()?;
            (!budget.is_empty()).then(|| (Arc::clone(t), budget))
        });
        Budgeted { key, owner, team }
    }

    fn get(&self, subject: &Subject) -> Option<Budget> {
        match subject {
            Subject::Key(id) => self.keys.get(id.as_str()).copied(),
            Subject::Owner(id) => self.owners.get(id.as_str()).copied(),
            Subject::Team(id) => self.teams.get(id.as_str()).copied(),
        }
    }

    fn budgets(&self) -> impl Iterator<Item = &Budget> {
        (self.keys.values())
            .chain(self.owners.values())
            .chain(self.teams.values())
    }
}

/// The budgets of a request's key, its owner and its owner's team (non-empty ones), by id.
#[derive(Debug, Clone, Default)]
pub(crate) struct Budgeted<'p> {
    key: Option<(&'p str, Budget)>,
    owner: Option<(&'p str, Budget)>,
    team: Option<(Arc<str>, Budget)>,
}

impl Budgeted<'_> {
    fn is_empty(&self) -> bool {
        self.key.is_none() && self.owner.is_none() && self.team.is_none()
    }

    /// The budgets by subject (0: key, 1: owner, 2: team).
    fn all(&self) -> [Option<(Who<'_>, Budget)>; 3] {
        [
            self.key.map(|(k, b)| (Who::Key(k), b)),
            self.owner.map(|(o, b)| (Who::Owner(o), b)),
            self.team.as_ref().map(|(t, b)| (Who::Team(t), *b)),
        ]
    }

    /// Whether any of them limits cost.
    pub(crate) fn limits_cost(&self) -> bool {
        self.all().iter().flatten().any(|(_, b)| b.limits_cost())
    }
}

/// What the authorise step learns of a caller from one lookup.
#[derive(Debug, Clone, Default)]
pub(crate) struct Standing {
    /// None: no budget; `Some(true)`: its key, owner or team limits tokens or cost (its
    /// requests must then be bounded and metered); `Some(false)`: requests only.
    pub class: Option<bool>,
    /// A budget of the caller's limits cost (`unpriced = "refuse"` applies).
    pub cost: bool,
    /// The owner's team, which the ledger records.
    pub team: Option<Arc<str>>,
}

/// One window of a caller's budget as its answers' rate headers state it.
pub(crate) use crate::api::RateLine as Line;

/// The headers a budgeted caller's response carries: its tightest token window and, when a
/// request budget applies, its request window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Quota {
    pub tokens: Option<Line>,
    pub requests: Option<Line>,
}

impl Quota {
    /// Keeps, per unit, the line with the least left (then the soonest reset).
    fn consider(&mut self, kind: Kind, line: Line) {
        let slot = if kind.counts_tokens() {
            &mut self.tokens
        } else {
            &mut self.requests
        };
        if slot.is_none_or(|old| (line.remaining, line.reset) < (old.remaining, old.reset)) {
            *slot = Some(line);
        }
    }
}

/// A request's hold on its budgets until `settle`.
#[derive(Debug)]
pub(crate) struct Reservation {
    key: Option<Box<str>>,
    owner: Option<Box<str>>,
    team: Option<Arc<str>>,
    windows: Windows,
    /// The limited counters, by subject (0: key, 1: owner, 2: team).
    limited: [Budget; 3],
    ask: Ask,
    /// Made in the shared counters (else only in this process's).
    shared: bool,
    pub quota: Quota,
}

impl Reservation {
    fn subjects(&self) -> impl Iterator<Item = (usize, Who<'_>)> {
        let key = self.key.as_deref().map(|k| (0, Who::Key(k)));
        let owner = self.owner.as_deref().map(|o| (1, Who::Owner(o)));
        let team = self.team.as_deref().map(|t| (2, Who::Team(t)));
        key.into_iter().chain(owner).chain(team)
    }
}

/// A request refused for its budget: the 429's `Retry-After`, message and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub kind: Kind,
    pub retry_after: u64,
    pub message: String,
    pub quota: Quota,
}

pub(crate) struct Budgets {
    settings: BudgetSettings,
    /// The completion cap a request with a token budget must have (`default_max_tokens`).
    cap_rule: CapRule,
    table: ArcSwap<Table>,
    local: Local,
    shared: Option<Shared>,
    store: Arc<dyn Store>,
    /// The windows' clock, for seeding as for requests: a test's stays on its fixed day.
    clock: Clock,
    /// The counters were seeded from the ledger: until then no budget is decided (a restart
    /// must not forget what was spent), and the poller retries the seed.
    seeded: AtomicBool,
    /// `portcullis_budget_rejections_total{service, window}`.
    rejections: IntCounterVec,
    /// `[pricing] currency`, named in a cost budget's refusal.
    currency: Box<str>,
}

impl Budgets {
    /// `services`: every registered service, whose rejection counters start at 0.
    pub(crate) fn new(
        settings: BudgetSettings,
        store: Arc<dyn Store>,
        redis: Option<Arc<SharedRedis>>,
        metrics: &Metrics,
        services: &[&str],
    ) -> Budgets {
        let rejections = IntCounterVec::new(
            Opts::new(
                "portcullis_budget_rejections_total",
                "Requests refused with 429 budget_exceeded, by service and the window that had no room (tokens_per_hour, tokens_per_day, tokens_per_month, requests_per_day, cost_per_day, cost_per_month).",
            ),
            &["service", "window"],
        )
        .expect("valid metric");
        for service in services {
            for kind in Kind::ALL {
                rejections.with_label_values(&[service, kind.name()]);
            }
        }
        metrics.register(Box::new(rejections.clone()));
        Budgets {
            cap_rule: CapRule::new(settings.default_max_tokens, settings.refuse_unstated_cap),
            settings,
            table: ArcSwap::from_pointee(Table::default()),
            local: Local::default(),
            shared: redis.map(Shared::new),
            store,
            clock: Clock::system(),
            seeded: AtomicBool::new(false),
            rejections,
            currency: "USD".into(),
        }
    }

    /// The currency a cost budget's refusal names (`[pricing] currency`).
    pub(crate) fn with_currency(mut self, currency: &str) -> Budgets {
        self.currency = currency.into();
        self
    }

    /// The same budgets on another clock (tests).
    #[cfg(test)]
    pub(crate) fn with_clock(mut self, clock: Clock) -> Budgets {
        self.clock = clock;
        self
    }

    /// Whether the counters were seeded from the ledger, so budgets can be decided.
    pub(crate) fn is_seeded(&self) -> bool {
        self.seeded.load(Ordering::Acquire)
    }

    /// Now, on the budgets' clock: the time a request is reserved at.
    pub(crate) fn now(&self) -> i64 {
        self.clock.now()
    }

    /// Counts a refusal.
    pub(crate) fn rejected(&self, service: &str, kind: Kind) {
        self.rejections
            .with_label_values(&[service, kind.name()])
            .inc();
    }

    /// What a request asks: one request, and in `reserve` mode its worst case in tokens, a
    /// prompt estimate from its body's size plus the completion tokens it may use (`None`:
    /// not stated, so `default_max_tokens`), and that worst case priced by `price` (none: no
    /// price applies, so no cost is reserved). `reads_usage`: false where no usage is ever
    /// read (a service without `api`), so no tokens are charged either.
    pub(crate) fn ask(
        &self,
        body_bytes: u64,
        completion_cap: Option<u64>,
        reads_usage: bool,
        price: Option<Price>,
    ) -> Ask {
        match self.settings.enforcement {
            Enforcement::Reserve if reads_usage => {
                let (prompt, completion) = self.worst_case(body_bytes, completion_cap);
                Ask {
                    tokens: prompt.saturating_add(completion),
                    requests: 1,
                    cost: price.map_or(0, |p| p.worst_case(prompt, completion)),
                }
            }
            _ => Ask {
                requests: 1,
                ..Ask::default()
            },
        }
    }

    /// The completion cap a request must have when its caller has a token budget.
    pub(crate) fn cap_rule(&self) -> &CapRule {
        &self.cap_rule
    }

    /// What applies to `principal`, from one lookup: its budget class, whether a budget of
    /// its limits cost, and its owner's team.
    pub(crate) fn standing(&self, principal: &Principal) -> Standing {
        let table = self.table.load();
        let team = table.team_of(principal.owner.as_deref()).cloned();
        let budgeted = table.of(principal);
        if budgeted.is_empty() {
            return Standing {
                team,
                ..Standing::default()
            };
        }
        let metered = |b: &Budget| {
            (Kind::ALL.iter()).any(|k| k != &Kind::RequestsPerDay && k.limit(b).is_some())
        };
        let all = budgeted.all();
        Standing {
            class: Some(all.iter().flatten().any(|(_, b)| metered(b))),
            cost: budgeted.limits_cost(),
            team,
        }
    }

    /// How many bytes of a request body the prompt estimate counts as one token.
    pub(crate) fn prompt_bytes_per_token(&self) -> u64 {
        self.settings.prompt_bytes_per_token
    }

    /// A request's worst case as (prompt estimate, completion cap): what it reserves, and
    /// what it is charged when its usage cannot be read.
    pub(crate) fn worst_case(&self, body_bytes: u64, completion_cap: Option<u64>) -> (u64, u64) {
        (
            body_bytes.div_ceil(self.settings.prompt_bytes_per_token),
            completion_cap.unwrap_or(self.settings.default_max_tokens),
        )
    }

    /// The budgets that apply to `principal` (its key's, its owner's, its team's), or None
    /// when none has one: a few lookups, made once per request.
    pub(crate) fn of<'p>(&self, principal: &'p Principal) -> Option<Budgeted<'p>> {
        let budgeted = self.table.load().of(principal);
        (!budgeted.is_empty()).then_some(budgeted)
    }

    /// Reserves `ask` on every limited counter of the caller's key, owner and team, or none.
    #[cfg(test)]
    pub(crate) async fn reserve(
        &self,
        principal: &Principal,
        ask: Ask,
        now: i64,
    ) -> Result<Option<Reservation>, Refusal> {
        match self.of(principal) {
            Some(budgeted) => self.reserve_for(budgeted, ask, now).await.map(Some),
            None => Ok(None),
        }
    }

    /// Reserves `ask` on every limited counter of `budgeted` (from `of`), or none.
    pub(crate) async fn reserve_for(
        &self,
        budgeted: Budgeted<'_>,
        ask: Ask,
        now: i64,
    ) -> Result<Reservation, Refusal> {
        let windows = Windows::at(now);
        // Key first, then owner, then team; no allocation.
        let mut present = [(Who::Key(""), Budget::default()); 3];
        let mut n = 0;
        let mut limited = [Budget::default(); 3];
        for (i, found) in budgeted.all().into_iter().enumerate() {
            if let Some((who, budget)) = found {
                present[n] = (who, budget);
                n += 1;
                limited[i] = budget;
            }
        }
        let subjects = &present[..n];
        let reserved = match &self.shared {
            Some(shared) if !shared.backend().is_down() => {
                self.reserve_shared(shared, subjects, ask, &windows).await
            }
            _ => None,
        };
        let (used, shared) = match reserved {
            Some(Ok(used)) => {
                // Counted here too, so a fallback starts from this process's traffic.
                let _ = self.local.reserve(subjects, ask, &windows, false);
                (used, true)
            }
            Some(Err(refused)) => return Err(self.refusal(subjects, refused, &windows)),
            None => match self.local.reserve(subjects, ask, &windows, true) {
                Ok(used) => (used, false),
                Err(refused) => return Err(self.refusal(subjects, refused, &windows)),
            },
        };
        let mut quota = Quota::default();
        for (n, (_, budget)) in subjects.iter().enumerate() {
            // Cost has no rate header of its own.
            for kind in Kind::ALL.into_iter().filter(|k| k.unit() != Unit::Cost) {
                if let Some(limit) = kind.limit(budget) {
                    let line = Line {
                        limit,
                        remaining: limit.saturating_sub(used[n][kind.index()]),
                        reset: windows.seconds_left(kind),
                    };
                    quota.consider(kind, line);
                }
            }
        }
        Ok(Reservation {
            key: budgeted.key.map(|(k, _)| k.into()),
            owner: budgeted.owner.map(|(o, _)| o.into()),
            team: budgeted.team.map(|(t, _)| t),
            windows,
            limited,
            ask,
            shared,
            quota,
        })
    }

    /// Through Redis: `None` when it did not answer (the caller then counts per process).
    async fn reserve_shared(
        &self,
        shared: &Shared,
        subjects: &[(Who<'_>, Budget)],
        ask: Ask,
        windows: &Windows,
    ) -> Option<Result<local::Used, Refused>> {
        let mut counters = Vec::with_capacity(12);
        for (n, (who, budget)) in subjects.iter().enumerate() {
            for kind in Kind::ALL {
                if let Some(limit) = kind.limit(budget) {
                    counters.push(Counter {
                        key: shared::counter_key(*who, kind, kind.start(&windows.starts)),
                        subject: n,
                        kind,
                        limit: Some(limit),
                    });
                }
            }
        }
        let amounts: Vec<u64> = counters.iter().map(|c| c.kind.amount(ask)).collect();
        let mut seeds = vec![None; counters.len()];
        for _ in 0..2 {
            match shared.reserve(&counters, &amounts, &seeds, windows).await? {
                Reply::Reserved(values) => {
                    let mut used = [[0; Budget::N]; 3];
                    for (c, v) in counters.iter().zip(values) {
                        used[c.subject][c.kind.index()] = v;
                    }
                    return Some(Ok(used));
                }
                Reply::Refused(i, used) => {
                    let c = counters.get(i)?;
                    return Some(Err(Refused {
                        subject: c.subject,
                        kind: c.kind,
                        used,
                        limit: c.limit.unwrap_or(0),
                        asked: amounts[i],
                    }));
                }
                Reply::Missing(missing) => {
                    self.seed(&counters, subjects, &missing, &mut seeds, windows)
                        .await;
                }
            }
        }
        None
    }

    /// Seeds for missing shared counters: the ledger's value, or at least this process's.
    async fn seed(
        &self,
        counters: &[Counter],
        subjects: &[(Who<'_>, Budget)],
        missing: &[usize],
        seeds: &mut [Option<u64>],
        windows: &Windows,
    ) {
        let mut ledger = [None; 3];
        for &i in missing {
            let Some(c) = counters.get(i) else { continue };
            let who = subjects[c.subject].0;
            if ledger[c.subject].is_none() {
                let subject = who.subject();
                let read = self.store.window_usage(&subject, windows.starts);
                ledger[c.subject] = Some(match tokio::time::timeout(SEED_TIMEOUT, read).await {
                    Ok(Ok(usage)) => usage,
                    _ => Default::default(),
                });
            }
            let from_ledger = ledger[c.subject].map_or(0, |u| c.kind.used(&u));
            let here = self.local.value(who, c.kind, &windows.starts);
            seeds[i] = Some(from_ledger.max(here));
        }
    }

    fn refusal(&self, subjects: &[(Who<'_>, Budget)], r: Refused, windows: &Windows) -> Refusal {
        let who = subjects.get(r.subject).map_or(Who::Key("?"), |s| s.0);
        let retry_after = windows.seconds_left(r.kind);
        let (name, whose) = (r.kind.name(), who.describe());
        let resets = rfc3339(r.kind.start(&windows.ends));
        let unit = match r.kind.unit() {
            Unit::Tokens => "tokens",
            Unit::Requests => "requests",
            Unit::Cost => &*self.currency,
        };
        let number = |n: u64| amount_text(r.kind.unit(), n);
        let message = if r.used >= r.limit {
            format!(
                "{name} budget of {whose} exhausted: {} of {} {unit} used or reserved; it \
                 resets at {resets}",
                number(r.used.min(r.limit)),
                number(r.limit),
            )
        } else {
            let why = match r.kind.unit() {
                Unit::Tokens => "its prompt estimate plus its max_tokens, or default_max_tokens",
                Unit::Requests => "one request",
                Unit::Cost => "its prompt estimate and max_tokens, or default_max_tokens, priced",
            };
            format!(
                "{name} budget of {whose} has {} of {} {unit} left, and this request reserves \
                 {} ({why}); it resets at {resets}",
                number(r.limit - r.used),
                number(r.limit),
                number(r.asked),
            )
        };
        let mut quota = Quota::default();
        if r.kind.unit() != Unit::Cost {
            let line = Line {
                limit: r.limit,
                remaining: r.limit.saturating_sub(r.used),
                reset: retry_after,
            };
            quota.consider(r.kind, line);
        }
        Refusal {
            kind: r.kind,
            retry_after,
            message,
            quota,
        }
    }

    /// Replaces a reservation by what the request used: `tokens` (prompt + completion), `cost`
    /// (micros; 0 when unpriced), and whether it was forwarded at all (a request never sent
    /// upstream gives its count back). This process's counters at once; the shared ones get a
    /// refund with the thread's next batch and a charge above the reservation now (awaited).
    pub(crate) async fn settle(&self, r: Reservation, tokens: u64, cost: u64, forwarded: bool) {
        let signed = |used: u64, reserved: u64| used as i64 - reserved as i64;
        let deltas = (
            signed(tokens, r.ask.tokens),
            if forwarded { 0 } else { -1 },
            signed(cost, r.ask.cost),
        );
        if deltas == (0, 0, 0) {
            return;
        }
        (self.local).adjust(r.subjects().map(|(_, w)| w), &r.windows.starts, deltas);
        let Some(shared) = self.shared.as_ref().filter(|_| r.shared) else {
            return;
        };
        // Refunds go to this thread's batch, which the flusher sends every `shared::PERIOD`;
        // a charge above the reservation goes at once (shared.rs says why).
        let mut charges: Vec<(String, i64)> = Vec::new();
        let mut refunds = Vec::with_capacity(12);
        for (n, who) in r.subjects() {
            for kind in Kind::ALL {
                if kind.limit(&r.limited[n]).is_none() {
                    continue;
                }
                let delta = kind.delta(deltas);
                if delta != 0 {
                    let key = shared::counter_key(who, kind, kind.start(&r.windows.starts));
                    if delta < 0 {
                        refunds.push((key, delta));
                    } else {
                        charges.push((key, delta));
                    }
                }
            }
        }
        if !refunds.is_empty() {
            shared.refund(refunds.into_iter());
        }
        if !charges.is_empty() {
            let (keys, deltas): (Vec<&str>, Vec<i64>) =
                charges.iter().map(|(k, d)| (k.as_str(), *d)).unzip();
            shared.adjust(&keys, &deltas).await;
        }
    }
}

#[cfg(test)]
mod tests;
