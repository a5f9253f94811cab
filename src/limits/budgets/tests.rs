//! Budgets against an in-memory store: per-process counters, windows that roll over at the
//! UTC boundary (an injected clock), and the shared counters against a real redis-server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::window::Kind;
use super::{Ask, Budgets, SyncState};
use crate::auth::{Principal, PrincipalKind};
use crate::config::{BudgetSettings, Enforcement, RedisServer as RedisUrl};
use crate::limits::SharedRedis;
use crate::observe::metrics::Metrics;
use crate::store::{
    Budget, BudgetChange, BudgetStore, KeyRecord, KeyStore, LedgerStore, StoreError, StoredKey,
    Subject, TeamChange, WindowStarts, WindowUsage,
};
use crate::time::{parse_date, Clock};

/// Budgets and ledger sums, as a store would hold them.
#[derive(Default)]
struct Store {
    budgets: Mutex<Vec<BudgetChange>>,
    teams: Mutex<Vec<TeamChange>>,
    ledger: Mutex<HashMap<Subject, WindowUsage>>,
    /// Ledger reads that fail before one succeeds (a store down at start-up).
    failing_reads: std::sync::atomic::AtomicUsize,
}

impl Store {
    fn read_fails(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        (self.failing_reads)
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

#[async_trait]
impl KeyStore for Store {
    async fn find(&self, _: &str) -> Result<Option<StoredKey>, StoreError> {
        Ok(None)
    }
    async fn insert(&self, _: &StoredKey) -> Result<(), StoreError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        Ok(Vec::new())
    }
    async fn revoke(&self, _: &str, _: i64) -> Result<bool, StoreError> {
        Ok(false)
    }
}

#[async_trait]
impl BudgetStore for Store {
    async fn budget_changes(&self, since_ms: i64) -> Result<Vec<BudgetChange>, StoreError> {
        let all = self.budgets.lock().unwrap();
        Ok(all
            .iter()
            .filter(|c| c.changed_at_ms >= since_ms)
            .cloned()
            .collect())
    }
    async fn team_changes(&self, since_ms: i64) -> Result<Vec<TeamChange>, StoreError> {
        let all = self.teams.lock().unwrap();
        Ok((all.iter())
            .filter(|c| c.changed_at_ms >= since_ms)
            .cloned()
            .collect())
    }
}

#[async_trait]
impl LedgerStore for Store {
    async fn window_usage(&self, s: &Subject, _: WindowStarts) -> Result<WindowUsage, StoreError> {
        Ok(self
            .ledger
            .lock()
            .unwrap()
            .get(s)
            .copied()
            .unwrap_or_default())
    }
    async fn all_window_usage(
        &self,
        _: WindowStarts,
    ) -> Result<Vec<(Subject, WindowUsage)>, StoreError> {
        if self.read_fails() {
            return Err("the store is down".into());
        }
        let ledger = self.ledger.lock().unwrap();
        Ok(ledger.iter().map(|(s, u)| (s.clone(), *u)).collect())
    }
}

impl Store {
    fn set(&self, subject: Subject, budget: Budget, at_ms: i64) {
        let mut all = self.budgets.lock().unwrap();
        all.retain(|c| c.subject != subject);
        all.push(BudgetChange {
            subject,
            budget,
            changed_at_ms: at_ms,
        });
    }
}

fn settings(enforcement: Enforcement) -> BudgetSettings {
    BudgetSettings {
        enforcement,
        default_max_tokens: 100,
        prompt_bytes_per_token: 4,
        refuse_unstated_cap: false,
    }
}

fn key(id: &str, owner: Option<&str>) -> Principal {
    Principal {
        kind: PrincipalKind::ApiKey,
        id: id.into(),
        scopes: Box::new([]),
        owner: owner.map(Into::into),
        budget: Default::default(),
    }
}

fn per_day(tokens: u64) -> Budget {
    Budget {
        tokens_per_day: Some(tokens),
        ..Budget::default()
    }
}

async fn budgets(store: &Arc<Store>, redis: Option<Arc<SharedRedis>>) -> Budgets {
    let b = Budgets::new(
        settings(Enforcement::Reserve),
        store.clone(),
        redis,
        &Metrics::new(),
        &["infer"],
    )
    .with_clock(Clock::fixed(noon()));
    b.load(&**store, &mut SyncState::default()).await.unwrap();
    b
}

/// Noon of a fixed UTC day.
fn noon() -> i64 {
    parse_date("2026-11-25").unwrap() + 12 * 3600
}

const ASK: Ask = Ask {
    tokens: 40,
    requests: 1,
    cost: 0,
};

#[tokio::test]
async fn a_key_is_refused_once_its_window_is_spent_and_refunds_make_room() {
    let store = Arc::new(Store::default());
    store.set(Subject::Key("k1".into()), per_day(100), 1);
    let b = budgets(&store, None).await;
    let caller = key("k1", None);
    let first = b.reserve(&caller, ASK, noon()).await.unwrap().unwrap();
    let tokens = first.quota.tokens.unwrap();
    assert_eq!((tokens.limit, tokens.remaining), (100, 60));
    assert_eq!(tokens.reset, 12 * 3600);
    let _second = b.reserve(&caller, ASK, noon()).await.unwrap().unwrap();
    let refused = b.reserve(&caller, ASK, noon()).await.unwrap_err();
    assert_eq!(refused.kind, Kind::TokensPerDay);
    assert_eq!(refused.retry_after, 12 * 3600);
    assert!(
        refused.message.contains("tokens_per_day") && refused.message.contains("key k1"),
        "{}",
        refused.message
    );
    // The first used 10 of its 40: 30 come back, room for 40 again.
    b.settle(first, 10, 0, true).await;
    assert!(b.reserve(&caller, ASK, noon()).await.unwrap().is_some());
    // Another key is not budgeted at all.
    assert!(b
        .reserve(&key("k2", None), ASK, noon())
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn windows_reset_at_the_utc_boundary() {
    let store = Arc::new(Store::default());
    let hourly = Budget {
        tokens_per_hour: Some(50),
        tokens_per_day: Some(60),
        ..Budget::default()
    };
    store.set(Subject::Key("k".into()), hourly, 1);
    let b = budgets(&store, None).await;
    let caller = key("k", None);
    let before = noon() + 3599;
    b.reserve(&caller, ASK, before).await.unwrap();
    let refused = b.reserve(&caller, ASK, before).await.unwrap_err();
    assert_eq!(refused.kind, Kind::TokensPerHour);
    assert_eq!(refused.retry_after, 1);
    // The next hour has room, but the day (60) has only 20 left.
    let next_hour = noon() + 3600;
    let refused = b.reserve(&caller, ASK, next_hour).await.unwrap_err();
    assert_eq!(refused.kind, Kind::TokensPerDay);
    // The next UTC day starts from nothing.
    let next_day = parse_date("2026-11-26").unwrap();
    b.reserve(&caller, ASK, next_day).await.unwrap();
}

#[tokio::test]
async fn an_owner_budget_covers_its_keys_and_its_jwt_calls_and_seeds_from_the_ledger() {
    let store = Arc::new(Store::default());
    store.set(Subject::Owner("alice".into()), per_day(200), 1);
    // Spent before this process started: a restart does not forget it.
    store.ledger.lock().unwrap().insert(
        Subject::Owner("alice".into()),
        WindowUsage {
            day_tokens: 90,
            ..Default::default()
        },
    );
    let b = budgets(&store, None).await;
    let jwt = Principal {
        kind: PrincipalKind::Jwt,
        id: "alice".into(),
        scopes: Box::new([]),
        owner: Some("alice".into()),
        budget: Default::default(),
    };
    b.reserve(&key("a1", Some("alice")), ASK, noon())
        .await
        .unwrap();
    b.reserve(&jwt, ASK, noon()).await.unwrap();
    // 90 + 40 + 40 = 170: 40 more would pass 200.
    let refused = b
        .reserve(&key("a2", Some("alice")), ASK, noon())
        .await
        .unwrap_err();
    assert!(
        refused.message.contains("owner \"alice\""),
        "{}",
        refused.message
    );
    assert!(b
        .reserve(&key("b1", Some("bob")), ASK, noon())
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn requests_per_day_count_requests_and_unforwarded_ones_come_back() {
    let store = Arc::new(Store::default());
    let budget = Budget {
        requests_per_day: Some(2),
        ..Budget::default()
    };
    store.set(Subject::Key("k".into()), budget, 1);
    let b = budgets(&store, None).await;
    let caller = key("k", None);
    let one = b.reserve(&caller, ASK, noon()).await.unwrap().unwrap();
    let requests = one.quota.requests.unwrap();
    assert_eq!((requests.limit, requests.remaining), (2, 1));
    assert!(one.quota.tokens.is_none());
    b.reserve(&caller, ASK, noon()).await.unwrap();
    assert_eq!(
        b.reserve(&caller, ASK, noon()).await.unwrap_err().kind,
        Kind::RequestsPerDay
    );
    // Never forwarded (the upstream could not be reached): the request is not counted.
    b.settle(one, 0, 0, false).await;
    b.reserve(&caller, ASK, noon()).await.unwrap();
}

#[tokio::test]
async fn a_budget_change_applies_on_the_next_poll() {
    let store = Arc::new(Store::default());
    let b = budgets(&store, None).await;
    let caller = key("k", None);
    assert!(b.reserve(&caller, ASK, noon()).await.unwrap().is_none());
    store.set(Subject::Key("k".into()), per_day(10), 5);
    let mut state = SyncState::default();
    b.poll(&mut state).await;
    assert!(b.reserve(&caller, ASK, noon()).await.is_err());
    store.set(Subject::Key("k".into()), Budget::default(), 6);
    b.poll(&mut state).await;
    assert!(b.reserve(&caller, ASK, noon()).await.unwrap().is_none());
}

#[test]
fn asks_reserve_the_prompt_estimate_and_the_stated_cap() {
    let store = Arc::new(Store::default());
    let reserve = Budgets::new(
        settings(Enforcement::Reserve),
        store.clone(),
        None,
        &Metrics::new(),
        &[],
    );
    assert_eq!(reserve.ask(401, Some(7), true, None).tokens, 101 + 7);
    assert_eq!(reserve.ask(400, None, true, None).tokens, 100 + 100);
    assert_eq!(reserve.ask(400, None, false, None).tokens, 0);
    let after = Budgets::new(
        settings(Enforcement::After),
        store,
        None,
        &Metrics::new(),
        &[],
    );
    assert_eq!(
        after.ask(400, Some(7), true, None),
        Ask {
            tokens: 0,
            requests: 1,
            cost: 0,
        }
    );
}

/// `micros` of cost a day, on a team.
fn cost_per_day(micros: u64) -> Budget {
    Budget {
        cost_per_day: Some(micros),
        ..Budget::default()
    }
}

/// 40 tokens worth 400 micros.
const COSTLY: Ask = Ask {
    tokens: 40,
    requests: 1,
    cost: 400,
};

/// Owners `o1` and `o2` in team `red`, whose budget is 1000 micros a day.
fn red_team(store: &Store) {
    store.set(Subject::Team("red".into()), cost_per_day(1000), 1);
    let mut teams = store.teams.lock().unwrap();
    for owner in ["o1", "o2"] {
        teams.push(TeamChange {
            owner: owner.into(),
            team: Some("red".into()),
            changed_at_ms: 1,
        });
    }
}

#[tokio::test]
async fn a_team_cost_budget_covers_every_member_and_settles_to_the_real_cost() {
    let store = Arc::new(Store::default());
    red_team(&store);
    let b = budgets(&store, None).await.with_currency("EUR");
    let (a, c) = (key("ka", Some("o1")), key("kb", Some("o2")));
    let standing = b.standing(&a);
    assert_eq!((standing.class, standing.cost), (Some(true), true));
    assert_eq!(standing.team.as_deref(), Some("red"));
    // Not in the team: nothing applies.
    assert!(b.standing(&key("kc", Some("o3"))).class.is_none());
    let first = b.reserve(&a, COSTLY, noon()).await.unwrap().unwrap();
    let _second = b.reserve(&c, COSTLY, noon()).await.unwrap().unwrap();
    let refused = b.reserve(&a, COSTLY, noon()).await.unwrap_err();
    assert_eq!(refused.kind, Kind::CostPerDay);
    assert_eq!(
        refused.message,
        "cost_per_day budget of team \"red\" has 0.0002 of 0.001 EUR left, and this request \
         reserves 0.0004 (its prompt estimate and max_tokens, or default_max_tokens, priced); \
         it resets at 2026-11-26T00:00:00Z"
    );
    // The first cost 100 of its 400: 300 come back, room for one more.
    b.settle(first, 40, 100, true).await;
    assert!(b.reserve(&c, COSTLY, noon()).await.is_ok());
    assert!(b.reserve(&c, COSTLY, noon()).await.is_err());
    // o2 leaves the team: no longer held by it.
    store.teams.lock().unwrap().push(TeamChange {
        owner: "o2".into(),
        team: None,
        changed_at_ms: 2,
    });
    b.poll(&mut SyncState::default()).await;
    assert!(b.reserve(&c, COSTLY, noon()).await.unwrap().is_none());
}

fn redis_backend(url: &str) -> Arc<SharedRedis> {
    let errors =
        prometheus::IntCounterVec::new(prometheus::Opts::new("errors", "test"), &["reason"])
            .unwrap();
    let server = RedisUrl {
        client: redis::Client::open(url).unwrap(),
        shown: "test".into(),
    };
    Arc::new(SharedRedis::new(&server, &errors))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_sharing_redis_never_admit_past_the_budget_and_a_flush_reseeds_from_the_ledger() {
    let Some(redis) = testkit::redis::RedisServer::start_own_or_skip() else {
        return;
    };
    let id = format!("k{:016x}", rand::random::<u64>());
    let store = Arc::new(Store::default());
    store.set(Subject::Key(id.clone()), per_day(1000), 1);
    let fleet = [
        Arc::new(budgets(&store, Some(redis_backend(redis.url()))).await),
        Arc::new(budgets(&store, Some(redis_backend(redis.url()))).await),
    ];
    // Connected first, as the gateway's poller does at start: a first connection slower than
    // the request timeout would be counted per process.
    for gateway in &fleet {
        let shared = gateway.shared.as_ref().unwrap();
        let start = std::time::Instant::now();
        while !shared.warm().await {
            assert!(start.elapsed().as_secs() < 10, "redis never answered");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let mut tasks = Vec::new();
    for n in 0..100 {
        let gateway = fleet[n % 2].clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            let admitted = gateway.reserve(&key(&id, None), ASK, noon()).await;
            admitted.ok().flatten().map(|r| (n % 2, r))
        }));
    }
    let mut admitted = Vec::new();
    for t in tasks {
        admitted.extend(t.await.unwrap());
    }
    // 1000 / 40: exactly 25, whichever gateway asked.
    assert_eq!(admitted.len(), 25);
    // Each used 10 of its 40: 750 come back, so 75 more fit.
    for (n, reservation) in admitted {
        fleet[n].settle(reservation, 10, 0, true).await;
    }
    // The refunds wait in each gateway's batch for its flusher: sent now.
    for gateway in &fleet {
        assert!(gateway.flush_refunds().await);
    }
    let mut more = 0;
    for n in 0..100 {
        more += u64::from(
            fleet[n % 2]
                .reserve(&key(&id, None), ASK, noon())
                .await
                .is_ok(),
        );
    }
    assert_eq!(more, 18, "(1000 - 250) / 40");
    // Redis loses everything; the ledger knows 700 were used (more than either gateway
    // counted itself, at most 25 × 10 + 9 × 40): 7 more fit.
    redis.flush_all();
    store.ledger.lock().unwrap().insert(
        Subject::Key(id.clone()),
        WindowUsage {
            day_tokens: 700,
            ..Default::default()
        },
    );
    let mut admitted = 0;
    for n in 0..30 {
        let r = fleet[n % 2].reserve(&key(&id, None), ASK, noon()).await;
        admitted += u64::from(r.is_ok());
    }
    assert_eq!(admitted, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_sharing_redis_never_admit_past_a_team_cost_budget() {
    let Some(redis) = testkit::redis::RedisServer::start_own_or_skip() else {
        return;
    };
    let team = format!("t{:016x}", rand::random::<u64>());
    let store = Arc::new(Store::default());
    store.set(Subject::Team(team.clone()), cost_per_day(10_000), 1);
    for owner in ["o1", "o2", "o3"] {
        store.teams.lock().unwrap().push(TeamChange {
            owner: owner.into(),
            team: Some(team.clone()),
            changed_at_ms: 1,
        });
    }
    let fleet = [
        Arc::new(budgets(&store, Some(redis_backend(redis.url()))).await),
        Arc::new(budgets(&store, Some(redis_backend(redis.url()))).await),
    ];
    for gateway in &fleet {
        let shared = gateway.shared.as_ref().unwrap();
        let start = std::time::Instant::now();
        while !shared.warm().await {
            assert!(start.elapsed().as_secs() < 10, "redis never answered");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let mut tasks = Vec::new();
    for n in 0..100 {
        let gateway = fleet[n % 2].clone();
        let owner = ["o1", "o2", "o3"][n % 3];
        tasks.push(tokio::spawn(async move {
            let caller = key(&format!("k{n}"), Some(owner));
            gateway
                .reserve(&caller, COSTLY, noon())
                .await
                .ok()
                .flatten()
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap().is_some());
    }
    // 10 000 / 400: exactly 25, whichever gateway and member asked.
    assert_eq!(admitted, 25);
}

/// Scripts the server has run since it started (`INFO commandstats`: `EVALSHA` and `EVAL`, the
/// commands a reservation or a settlement sends; the commands inside a script are not round
/// trips).
async fn commands_run(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The Redis round trips of `n` reservations and their settlements (each charged less than
/// it reserved, so each refunds), and of the flush that sends the refunds.
async fn round_trips(b: &Budgets, url: &str, caller: &Principal, ask: Ask, n: u64) -> u64 {
    let before = commands_run(url).await;
    for _ in 0..n {
        let r = b.reserve(caller, ask, noon()).await.unwrap().unwrap();
        b.settle(r, ask.tokens / 2, ask.cost / 2, true).await;
    }
    assert!(b.flush_refunds().await);
    commands_run(url).await - before
}

/// A connected gateway's budgets on `url`.
async fn shared_budgets(store: &Arc<Store>, url: &str) -> Budgets {
    let b = budgets(store, Some(redis_backend(url))).await;
    let shared = b.shared.as_ref().unwrap();
    let start = std::time::Instant::now();
    while !shared.warm().await {
        assert!(start.elapsed().as_secs() < 10, "redis never answered");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_and_team_budgets_take_no_more_redis_round_trips_than_a_token_budget() {
    let Some(redis) = testkit::redis::RedisServer::start_own_or_skip() else {
        return;
    };
    let store = Arc::new(Store::default());
    store.set(Subject::Key("tokens".into()), per_day(1_000_000), 1);
    // Every window limited on the key, its owner and its team: six counters each.
    let all = Budget::from_limits([Some(1 << 40); Budget::N]);
    store.set(Subject::Key("money".into()), all, 1);
    store.set(Subject::Owner("o1".into()), all, 1);
    store.set(Subject::Team("red".into()), all, 1);
    store.teams.lock().unwrap().push(TeamChange {
        owner: "o1".into(),
        team: Some("red".into()),
        changed_at_ms: 1,
    });
    let b = shared_budgets(&store, redis.url()).await;
    // Once each first: the counters' seeding is a start-of-window cost, not a request's.
    let url = redis.url();
    round_trips(&b, url, &key("tokens", None), COSTLY, 1).await;
    round_trips(&b, url, &key("money", Some("o1")), COSTLY, 1).await;
    let tokens = round_trips(&b, url, &key("tokens", None), COSTLY, 20).await;
    let money = round_trips(&b, url, &key("money", Some("o1")), COSTLY, 20).await;
    assert_eq!(
        tokens, 21,
        "a reserve per request, one adjust for all their refunds"
    );
    assert_eq!(money, tokens, "18 counters, the same round trips");
}

/// The value of a shared counter, as Redis holds it now.
async fn counter(url: &str, key: &str) -> Option<i64> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// The key of `id`'s tokens_per_day counter on the tests' day.
fn day_counter(id: &str) -> String {
    let starts = super::window::Windows::at(noon()).starts;
    let kind = Kind::TokensPerDay;
    super::shared::counter_key(super::Who::Key(id), kind, kind.start(&starts))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_are_summed_into_one_script_and_a_charge_above_the_reservation_goes_at_once() {
    let Some(redis) = testkit::redis::RedisServer::start_own_or_skip() else {
        return;
    };
    let store = Arc::new(Store::default());
    store.set(Subject::Key("k".into()), per_day(1_000_000), 1);
    let b = shared_budgets(&store, redis.url()).await;
    let (url, caller, day) = (redis.url(), key("k", None), day_counter("k"));
    let before = commands_run(url).await;
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(b.reserve(&caller, ASK, noon()).await.unwrap().unwrap());
    }
    // The first reservation seeds the missing counter: one more script.
    assert_eq!(commands_run(url).await - before, 21);
    for r in held {
        b.settle(r, 10, 0, true).await;
    }
    // Settled here at once, not yet in Redis: it over-counts meanwhile, never under.
    assert_eq!(
        commands_run(url).await - before,
        21,
        "no script per settlement"
    );
    assert_eq!(counter(url, &day).await, Some(20 * 40));
    let sent = b.shared.as_ref().unwrap().flushes_sent();
    assert!(b.flush_refunds().await);
    assert_eq!(b.shared.as_ref().unwrap().flushes_sent() - sent, 1);
    assert_eq!(
        commands_run(url).await - before,
        22,
        "one script for 20 refunds"
    );
    assert_eq!(counter(url, &day).await, Some(20 * 10));
    // Used 50 of 40 reserved: the 10 beyond are in Redis before `settle` returns.
    let r = b.reserve(&caller, ASK, noon()).await.unwrap().unwrap();
    b.settle(r, 50, 0, true).await;
    assert_eq!(counter(url, &day).await, Some(20 * 10 + 50));
    assert!(b.flush_refunds().await, "nothing left to send");
    assert_eq!(commands_run(url).await - before, 24);
    // A request never forwarded gives its count back through the batch too.
    let counted = Budget {
        requests_per_day: Some(100),
        ..Budget::default()
    };
    store.set(Subject::Key("r".into()), counted, 2);
    b.poll(&mut SyncState::default()).await;
    let r = b
        .reserve(&key("r", None), ASK, noon())
        .await
        .unwrap()
        .unwrap();
    b.settle(r, 0, 0, false).await;
    assert!(b.flush_refunds().await);
    let starts = super::window::Windows::at(noon()).starts;
    let kind = Kind::RequestsPerDay;
    let requests = super::shared::counter_key(super::Who::Key("r"), kind, kind.start(&starts));
    assert_eq!(counter(url, &requests).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flusher_sends_a_refund_within_its_period_and_a_stop_sends_what_is_left() {
    let Some(redis) = testkit::redis::RedisServer::start_own_or_skip() else {
        return;
    };
    let store = Arc::new(Store::default());
    store.set(Subject::Key("k".into()), per_day(1_000_000), 1);
    let b = Arc::new(shared_budgets(&store, redis.url()).await);
    b.start_flusher();
    let (url, caller, day) = (redis.url(), key("k", None), day_counter("k"));
    let r = b.reserve(&caller, ASK, noon()).await.unwrap().unwrap();
    let settled = std::time::Instant::now();
    b.settle(r, 10, 0, true).await;
    while counter(url, &day).await != Some(10) {
        assert!(
            settled.elapsed().as_secs() < 10,
            "the refund never reached Redis"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let took = settled.elapsed();
    eprintln!("a refund reached Redis {took:?} after its settlement");
    // Its period, with room for a loaded test machine; never the request's to wait for.
    assert!(took < super::shared::PERIOD * 10, "{took:?}");
    // A stop: what was settled last is in Redis when the final flush returns.
    let r = b.reserve(&caller, ASK, noon()).await.unwrap().unwrap();
    b.settle(r, 5, 0, true).await;
    let stopping = b.clone();
    let sent = tokio::task::spawn_blocking(move || {
        stopping.final_flush(std::time::Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert!(sent);
    assert_eq!(counter(url, &day).await, Some(15));
}

#[tokio::test]
async fn a_key_made_with_a_budget_is_held_to_it_before_the_poller_sees_it_and_a_clear_wins() {
    let store = Arc::new(Store::default());
    let b = budgets(&store, None).await;
    // As the key's lookup found it in the store, before any poll.
    let caller = Principal {
        budget: per_day(50),
        ..key("fresh", None)
    };
    b.reserve(&caller, ASK, noon()).await.unwrap();
    assert!(b.reserve(&caller, ASK, noon()).await.is_err());
    // Cleared in the store: the poll's empty budget overrides what the lookup found.
    store.set(Subject::Key("fresh".into()), Budget::default(), 9);
    b.poll(&mut SyncState::default()).await;
    assert!(b.reserve(&caller, ASK, noon()).await.unwrap().is_none());
}

#[tokio::test]
async fn a_failed_start_up_seed_is_retried_and_nothing_is_decided_meanwhile() {
    let store = Arc::new(Store::default());
    store.set(Subject::Key("k".into()), per_day(100), 1);
    store.ledger.lock().unwrap().insert(
        Subject::Key("k".into()),
        WindowUsage {
            day_tokens: 90,
            ..Default::default()
        },
    );
    store
        .failing_reads
        .store(2, std::sync::atomic::Ordering::Relaxed);
    let b = Budgets::new(
        settings(Enforcement::Reserve),
        store.clone(),
        None,
        &Metrics::new(),
        &["infer"],
    )
    .with_clock(Clock::fixed(noon()));
    let mut state = SyncState::default();
    assert!(b.load(&*store, &mut state).await.is_err());
    assert!(
        !b.is_seeded(),
        "decided on counters that forgot the 90 spent"
    );
    b.poll(&mut state).await;
    assert!(!b.is_seeded());
    b.poll(&mut state).await;
    assert!(b.is_seeded());
    // 90 of 100 spent before the restart: 40 more do not fit.
    assert!(b.reserve(&key("k", None), ASK, noon()).await.is_err());
}

#[tokio::test]
async fn a_budget_cleared_and_set_again_starts_from_the_ledger() {
    let store = Arc::new(Store::default());
    store.set(Subject::Key("k".into()), per_day(100), 1);
    let b = budgets(&store, None).await;
    let caller = key("k", None);
    let mut state = SyncState::default();
    store.set(Subject::Key("k".into()), Budget::default(), 2);
    b.poll(&mut state).await;
    assert!(b.reserve(&caller, ASK, noon()).await.unwrap().is_none());
    // Used while unbudgeted, as the ledger has it.
    store.ledger.lock().unwrap().insert(
        Subject::Key("k".into()),
        WindowUsage {
            day_tokens: 70,
            ..Default::default()
        },
    );
    store.set(Subject::Key("k".into()), per_day(100), 3);
    b.poll(&mut state).await;
    let refused = b.reserve(&caller, ASK, noon()).await.unwrap_err();
    assert!(
        refused.message.contains("has 30 of 100"),
        "{}",
        refused.message
    );
}
