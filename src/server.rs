//! Assembles the Pingora server from a validated config: the proxy service on the data-plane
//! listeners, the metrics endpoint, the key API (`[admin]`), the JWKS refresher, the access-log
//! writer, the usage ledger's flusher and the drain watcher. Signals (Pingora's): SIGQUIT hands the listeners to a new `-u` process, SIGTERM
//! drains, SIGINT stops at once; SIGHUP (ours) reopens the access-log file and reloads the
//! price table.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::HttpServerOptions;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;

use crate::admin::{AdminApp, AdminDeps, Retention};
use crate::admission::Admission;
use crate::auth::api_keys::{ApiKeyVerifier, KeyEvictor, RevocationPush};
use crate::auth::jwt::JwtVerifier;
use crate::auth::Authenticator;
use crate::config::{BudgetSettings, Config};
use crate::limits::budgets::{BudgetSync, Budgets, SyncState, FINAL_REFUNDS};
use crate::limits::SharedRedis;
use crate::metering::{Ledger, LedgerService, Meter, FINAL_FLUSH};
use crate::observe::access_log;
use crate::observe::metrics::Metrics;
use crate::observe::metrics_app::MetricsApp;
use crate::pricing::{Pricing, PricingReload};
use crate::proxy::{peer_for, Gateway};
use crate::replicas::{DnsRefresh, HealthChecks, MakePeer, Replicas, UpstreamResolver};
use crate::shutdown::{Connections, Drain, Tracked, Watchdog};
use crate::store::{open_store, Store};

pub(crate) struct ServeOptions {
    pub daemon: bool,
    pub upgrade: bool,
}

/// Runs until shutdown. A drained graceful shutdown exits the process from `Drain`.
pub(crate) fn serve(mut config: Config, options: ServeOptions) -> Result<(), String> {
    // Stores and key sets are opened now, so a bad database path or an unreachable issuer
    // fails at start-up, not on the first request. The runtime is dropped before Pingora forks.
    let metrics = Arc::new(Metrics::new());
    let startup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let (auth, jwt, push, keys) = startup.block_on(build_auth(&config, &metrics))?;
    let redis = redis_backend(&config, &metrics);
    // Loaded before serving: the first request is decided against spent budget.
    let budgets = (config.budgets.zip(keys.as_ref()))
        .map(|(settings, (store, _))| budgets(&config, settings, store, redis.clone(), &metrics));
    let budget_sync = (budgets.as_ref().zip(config.api_keys.as_ref()))
        .map(|(b, keys)| startup.block_on(load_budgets(b, &keys.database)));
    // With `[dns] servers`, host names are first resolved there, now: a name that does not
    // resolve fails the start like any other config error.
    startup.block_on(resolve_with_own_dns(&mut config))?;
    drop(startup);
    // Opened before the fork too: a path that cannot be written is a start-up error.
    let (access_log, access_log_service) = access_log::open(&config.access_log)
        .map_err(|e| format!("access_log.destination: cannot open: {e}"))?;
    // Checked with the config; read again here, so a table spoilt since fails the start.
    let pricing = (config.pricing.as_ref())
        .map(Pricing::load)
        .transpose()
        .map_err(|problems| problems.join("; "))?
        .map(Arc::new);
    // A daemon would otherwise run from `/`, changing what relative paths in the config mean.
    let working_directory = std::env::current_dir().ok();

    let server_conf = ServerConf {
        threads: config.server.threads,
        grace_period_seconds: Some(config.server.grace_period_seconds),
        graceful_shutdown_timeout_seconds: Some(config.server.graceful_shutdown_timeout_seconds),
        upgrade_sock: config.server.upgrade_sock.clone(),
        pid_file: config.server.pid_file.clone(),
        working_directory,
        // One single-threaded runtime per worker thread rather than one work-stealing runtime:
        // a proxied request wakes several short tasks, and the multi-thread scheduler's
        // bookkeeping on each wake cost about 15% of a core's throughput (`make bench`).
        work_stealing: false,
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: options.upgrade,
        daemon: options.daemon,
        nocapture: false,
        test: false,
        conf: None,
    };
    let mut server = Server::new_with_opt_and_conf(opt, server_conf);
    server.bootstrap();

    // Taken before the authenticator moves into the proxy: the key API shares its store, its
    // cache (to evict what it revokes) and its JWT verifier.
    let admin_deps = match (&config.admin, &jwt, keys) {
        (Some(_), Some(jwt), Some((store, evictor))) => Some(AdminDeps {
            jwt: jwt.clone(),
            store,
            evictor,
            metrics: metrics.clone(),
            access_log: access_log.clone(),
        }),
        _ => None,
    };
    let (meter, ledger) = ledger(&config, &metrics);
    // Kept for the last flush of their refunds at a stop.
    let budgets_at_stop = budgets.clone();
    let upstreams = Upstreams::new(&config, &metrics);
    let gateway = Gateway::new(
        &config,
        auth,
        metrics.clone(),
        access_log.clone(),
        upstreams.replicas,
        (meter, budgets, pricing.clone()),
        redis.as_ref(),
    );
    let connections = Arc::new(Connections::default());
    let mut http = pingora::proxy::http_proxy(&server.configuration, gateway);
    // Pingora would answer CONNECT itself with a bare 405; let it reach `request_filter`, which
    // refuses it with the JSON 405, `Allow` and `X-Request-Id` like every other method.
    let mut http_options = HttpServerOptions::default();
    http_options.allow_connect_method_proxying = true;
    http.server_options = Some(http_options);
    // Every listener admits connections against the same process-wide counts.
    let admission = Admission::new(
        &config.server.connections,
        metrics.connections_refused(),
        metrics.connections_open(),
    );
    let (app, gate) = admission.admit("data", http);
    let mut proxy = Service::new(
        "portcullis".to_string(),
        Tracked::new(app, connections.clone()),
    );
    proxy.set_connection_filter(gate);
    for addr in &config.server.listen {
        // No L4 read buffer on plain TCP: Pingora's default is a zeroed 64 KiB per client
        // connection, which held streams and idle keep-alive clients pay in memory, while
        // HTTP/1 reads go into buffers of their own (upstream connections are unbuffered too).
        // TLS listeners keep it: TLS reads in small records.
        let plain =
            ListenerConfig::tcp(addr.as_str()).l4_buffer(L4BufferSettings::default().read(0));
        proxy.add_listener(plain);
    }
    if let Some(tls) = &config.server.tls {
        for addr in &tls.listen {
            proxy
                .add_tls(addr, &tls.cert_file, &tls.key_file)
                .map_err(|e| format!("server.tls: cannot listen on {addr}: {e}"))?;
        }
    }
    proxy.threads = Some(config.server.threads);
    server.add_service(proxy);

    if let Some(m) = &config.metrics {
        let (app, gate) = admission.admit("metrics", MetricsApp(metrics));
        let mut service = Service::new("metrics".to_string(), app);
        service.set_connection_filter(gate);
        service.add_tcp(&m.listen);
        service.threads = Some(1);
        server.add_service(service);
    }
    if let (Some(settings), Some(deps)) = (&config.admin, admin_deps) {
        let retention = Retention::new(deps.store.clone(), settings.revoked_retention);
        let app = AdminApp::new(settings.clone(), &config, deps);
        let (app, gate) = admission.admit("admin", app);
        let mut service = Service::new("admin".to_string(), app);
        service.set_connection_filter(gate);
        if let Some(listen) = &settings.listen {
            service.add_tcp(listen);
        }
        // The same TLS set-up as the data plane's `[server.tls]` listeners.
        if let Some(tls) = &settings.tls {
            for addr in &tls.listen {
                service
                    .add_tls(addr, &tls.cert_file, &tls.key_file)
                    .map_err(|e| format!("admin.tls: cannot listen on {addr}: {e}"))?;
            }
        }
        service.threads = Some(1);
        server.add_service(service);
        server.add_service(background_service("key retention", retention));
    }
    server.add_service(background_service("health checks", upstreams.health));
    if !upstreams.dns.is_empty() {
        server.add_service(background_service("dns refresh", upstreams.dns));
    }
    if let Some(jwt) = jwt {
        server.add_service(background_service("jwks refresh", JwksRefresh(jwt)));
    }
    if let Some(sync) = budget_sync {
        server.add_service(background_service("budgets", sync));
    }
    if let Some(push) = push {
        server.add_service(background_service(
            "revocation push",
            RevocationListener(push),
        ));
    }
    server.add_service(background_service("access log", access_log_service));
    if let Some(pricing) = &pricing {
        let reload = PricingReload {
            pricing: pricing.clone(),
        };
        server.add_service(background_service("price table", reload));
    }
    if let Some(ledger) = &ledger {
        server.add_service(background_service(
            "usage ledger",
            LedgerService(ledger.clone()),
        ));
    }
    server.add_service(background_service(
        "drain",
        Drain {
            connections,
            access_log: access_log.clone(),
            ledger: ledger.clone(),
            budgets: budgets_at_stop.clone(),
        },
    ));
    server.add_service(background_service(
        "shutdown watchdog",
        Watchdog {
            phases: std::sync::Mutex::new(Some(server.watch_execution_phase())),
            grace: Duration::from_secs(config.server.grace_period_seconds),
            graceful_timeout: Duration::from_secs(config.server.graceful_shutdown_timeout_seconds),
            access_log: access_log.clone(),
            ledger: ledger.clone(),
        },
    ));
    log::info!(
        "portcullis listening on {} with services {}",
        config.server.listen.join(", "),
        config
            .services
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Returns after SIGINT, or when the grace period ran out with connections still open.
    server.run(RunArgs::default());
    // Every request has recorded by now (or was cut by the stop): the budgets' last refunds,
    // the ledger's last write.
    if let Some(budgets) = &budgets_at_stop {
        budgets.final_flush(FINAL_REFUNDS);
    }
    if let Some(ledger) = &ledger {
        ledger.final_flush(FINAL_FLUSH);
    }
    access_log.flush(Duration::from_secs(2));
    Ok(())
}

/// The process's one Redis connection, shared by every rate-limited service and the
/// budgets; made only when something uses it.
fn redis_backend(config: &Config, metrics: &Metrics) -> Option<Arc<SharedRedis>> {
    let limited = (config.services.iter()).any(|s| s.rate_limit_per_minute.is_some());
    let server = config.rate_limits.redis.as_ref()?;
    (limited || config.budgets.is_some()).then(|| {
        Arc::new(SharedRedis::new(
            server,
            &metrics.rate_limit_backend_errors(),
        ))
    })
}

fn budgets(
    config: &Config,
    settings: BudgetSettings,
    store: &Arc<dyn Store>,
    redis: Option<Arc<SharedRedis>>,
    metrics: &Metrics,
) -> Arc<Budgets> {
    let services: Vec<&str> = config.services.iter().map(|s| s.name.as_str()).collect();
    let budgets = Budgets::new(settings, store.clone(), redis, metrics, &services);
    // A cost budget's refusal names the price table's currency.
    Arc::new(match &config.pricing {
        Some(pricing) => budgets.with_currency(&pricing.currency),
        None => budgets,
    })
}

/// Every budget and the counters' seeds from the ledger, through connections of this
/// start-up runtime's own (the serving store's pool must not keep connections of a runtime
/// that is about to go). A store that does not answer now delays budgets (warned), never the
/// start: the poller loads them once it answers.
async fn load_budgets(budgets: &Arc<Budgets>, database: &str) -> BudgetSync {
    let mut state = SyncState::default();
    let loaded = match open_store(database, true).await {
        Ok(store) => budgets.load(&*store, &mut state).await,
        Err(e) => Err(e),
    };
    match loaded {
        Ok(n) => log::info!("budgets: {n} key and owner budget(s) loaded, seeded from the ledger"),
        Err(e) => log::warn!(
            "budgets: cannot load budgets from the key store ({e}); they apply once it answers"
        ),
    }
    BudgetSync {
        budgets: budgets.clone(),
        state: std::sync::Mutex::new(Some(state)),
    }
}

/// The meter the proxy records into, and the ledger that writes it to the key store: there
/// is one only with a key store (`[auth.api_keys]`).
fn ledger(config: &Config, metrics: &Metrics) -> (Arc<Meter>, Option<Arc<Ledger>>) {
    let Some(keys) = &config.api_keys else {
        log::info!(
            "no [auth.api_keys] key store, so no usage ledger: usage is in the metrics and \
             the access log only"
        );
        return (Arc::new(Meter::disabled()), None);
    };
    let meter = Arc::new(Meter::keeping_models(
        config.metering.max_models_per_key_hour,
    ));
    let ledger = Ledger::new(
        meter.clone(),
        &keys.database,
        config.metering.flush,
        metrics,
    );
    (meter, Some(Arc::new(ledger)))
}

/// Every service's replicas, and the background services that keep them current.
struct Upstreams {
    replicas: Vec<Arc<Replicas>>,
    health: HealthChecks,
    dns: DnsRefresh,
}

impl Upstreams {
    fn new(config: &Config, metrics: &Metrics) -> Upstreams {
        let mut health = HealthChecks::default();
        let mut dns = DnsRefresh::new(config.dns_servers.clone());
        let replicas = config
            .services
            .iter()
            .map(|service| {
                let settings = service.clone();
                let make_peer: MakePeer =
                    Arc::new(move |up, address| peer_for(&settings, up, address));
                let replicas = Arc::new(Replicas::new(service, metrics, &*make_peer));
                let b = &service.balancing;
                health.add(
                    replicas.clone(),
                    b.health_check.as_ref(),
                    &service.replicas,
                    &*make_peer,
                );
                dns.add(&replicas, &service.replicas, b.dns_refresh, &make_peer);
                replicas
            })
            .collect();
        Upstreams {
            replicas,
            health,
            dns,
        }
    }
}

async fn resolve_with_own_dns(config: &mut Config) -> Result<(), String> {
    let Some(servers) = config.dns_servers.clone() else {
        return Ok(());
    };
    let resolver = UpstreamResolver::new(Some(&servers))?;
    for service in &mut config.services {
        for (i, up) in service.replicas.iter_mut().enumerate() {
            if up.addresses.is_empty() {
                up.addresses = resolver
                    .resolve(&up.host, up.port)
                    .await
                    .map_err(|e| format!("services.{}.upstream[{i}]: {e}", service.name))?;
            }
        }
    }
    Ok(())
}

/// The store and the cache handle the key API shares with the data plane.
type SharedKeys = (Arc<dyn Store>, KeyEvictor);

async fn build_auth(
    config: &Config,
    metrics: &Metrics,
) -> Result<
    (
        Authenticator,
        Option<Arc<JwtVerifier>>,
        Option<RevocationPush>,
        Option<SharedKeys>,
    ),
    String,
> {
    let mut auth = Authenticator::default();
    let mut push = None;
    let mut shared = None;
    if let Some(keys) = &config.api_keys {
        let store = open_store(&keys.database, true)
            .await
            .map_err(|e| format!("auth.api_keys.database: cannot open: {e}"))?;
        let verifier = ApiKeyVerifier::new(store.clone(), keys.cache_ttl, keys.negative_cache_ttl)
            .with_lookup_counter(metrics.key_store_lookups());
        if keys.revocation_push {
            push = Some(
                verifier
                    .revocation_push(&keys.database)
                    .with_event_counter(metrics.revocation_push_events()),
            );
        }
        shared = Some((store, verifier.evictor()));
        auth.api_keys = Some(verifier);
    }
    let jwt = match &config.jwt {
        Some(settings) => {
            let verifier = JwtVerifier::new(settings.clone())
                .map_err(|e| format!("auth.jwt: {e}"))?
                .with_fetch_counter(metrics.jwks_fetches());
            // An unreachable issuer is an outage, not a configuration error: serve API keys
            // now and let the refresh loop retry.
            match verifier.load_keys().await {
                Ok(n) => log::info!("JWT: {n} signing key(s) from the issuer"),
                Err(e) => log::warn!(
                    "auth.jwt: {e}; starting anyway: JWTs get 401 until a fetch succeeds"
                ),
            }
            Some(Arc::new(verifier))
        }
        None => None,
    };
    auth.jwt = jwt.clone();
    Ok((auth, jwt, push, shared))
}

struct RevocationListener(RevocationPush);

#[async_trait]
impl BackgroundService for RevocationListener {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.0.run() => {}
            _ = shutdown.changed() => {}
        }
    }
}

struct JwksRefresh(Arc<JwtVerifier>);

#[async_trait]
impl BackgroundService for JwksRefresh {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.0.clone().refresh_loop() => {}
            _ = shutdown.changed() => {}
        }
    }
}
