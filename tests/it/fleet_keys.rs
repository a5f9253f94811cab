//! Fleet mode on a real PostgreSQL server: three gateway processes and the CLI share one key
//! store; a revoke reaches every gateway within a second through LISTEN/NOTIFY, also after
//! the listening connection was killed; a store outage costs no waiting and no 5xx.

use std::time::{Duration, Instant};

use testkit::postgres::{Postgres, PASSWORD};
use testkit::Upstream;
use testkit::{cli, Gateway, Service};

/// Gateways whose cache would keep a revoked key for a minute: only the push can be fast.
fn fleet(pg: &Postgres, up: &Upstream, n: usize) -> Vec<Gateway> {
    (0..n)
        .map(|_| {
            Gateway::builder()
                .service(Service::new("infer", up.url("")))
                .key_store(&pg.url)
                .cache_ttl(60)
                .start()
        })
        .collect()
}

fn status(gw: &Gateway, key: &str) -> (u16, Duration) {
    let req = format!(
        "GET /v1/infer/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    let start = Instant::now();
    let (status, _, _) = gw.raw(req.as_bytes());
    (status, start.elapsed())
}

/// Revokes through the CLI and returns, per gateway, how long after the CLI returned the key
/// was first refused.
fn revoke_and_time(fleet: &[Gateway], key: &str, id: &str) -> Vec<Duration> {
    fleet[0].revoke(id);
    let revoked = Instant::now();
    fleet
        .iter()
        .map(|gw| loop {
            if status(gw, key).0 == 401 {
                break revoked.elapsed();
            }
            assert!(
                revoked.elapsed() < Duration::from_secs(5),
                "a revoked key still works 5 s later"
            );
            std::thread::sleep(Duration::from_millis(10));
        })
        .collect()
}

fn metric(gw: &Gateway, line_start: &str) -> u64 {
    gw.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[test]
fn a_key_from_the_cli_works_fleet_wide_and_its_revoke_reaches_every_gateway_within_a_second() {
    let pg = Postgres::start();
    let up = Upstream::start();
    let fleet = fleet(&pg, &up, 3);
    let (key, id) = fleet[1].create_key("infer", &[]);
    for gw in &fleet {
        assert_eq!(
            status(gw, &key).0,
            200,
            "the key is cached on every gateway"
        );
    }
    let delays = revoke_and_time(&fleet, &key, &id);
    println!("revocation reached the three gateways after {delays:?}");
    assert!(
        delays.iter().all(|d| *d < Duration::from_secs(1)),
        "{delays:?}"
    );

    // Kill every listening connection: the gateways listen again and a revoke still arrives.
    let killed = pg.sql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'",
    );
    assert_eq!(killed, "3", "one listening connection per gateway");
    let deadline = Instant::now() + Duration::from_secs(10);
    for gw in &fleet {
        while metric(
            gw,
            "portcullis_revocation_push_total{event=\"reconnected\"} ",
        ) < 1
        {
            assert!(Instant::now() < deadline, "a gateway did not listen again");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (key, id) = fleet[2].create_key("infer", &[]);
    for gw in &fleet {
        assert_eq!(status(gw, &key).0, 200);
    }
    let delays = revoke_and_time(&fleet, &key, &id);
    println!("after reconnecting: {delays:?}");
    assert!(
        delays.iter().all(|d| *d < Duration::from_secs(1)),
        "{delays:?}"
    );
    // The password in the URL is never shown.
    for gw in &fleet {
        assert!(
            !gw.log().contains(PASSWORD),
            "the gateway logged the password"
        );
    }
}

#[test]
fn a_store_outage_keeps_cached_keys_refuses_new_ones_at_once_and_heals_without_restart() {
    let mut pg = Postgres::start();
    if !pg.is_local() {
        eprintln!("skipped: an external PORTCULLIS_TEST_POSTGRES_URL cannot be stopped");
        return;
    }
    let up = Upstream::start();
    let fleet = fleet(&pg, &up, 3);
    let (cached, _) = fleet[0].create_key("infer", &[]);
    let (fresh, _) = fleet[0].create_key("infer", &[]);
    for gw in &fleet {
        assert_eq!(status(gw, &cached).0, 200);
    }
    pg.stop();
    let mut worst = Duration::ZERO;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        for gw in &fleet {
            assert_eq!(status(gw, &cached).0, 200, "a cached key failed");
            let (s, took) = status(gw, &fresh);
            assert_eq!(s, 401, "an uncached key during the outage");
            worst = worst.max(took);
        }
    }
    println!("worst uncached-key answer during the outage: {worst:?}");
    assert!(
        worst < Duration::from_millis(100),
        "a request waited {worst:?} on a dead store"
    );
    for gw in &fleet {
        let log = gw.log();
        assert_eq!(
            log.matches("key store unavailable").count(),
            1,
            "one warning when the store goes down:\n{log}"
        );
    }
    pg.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    for gw in &fleet {
        while status(gw, &fresh).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "the store came back, the key did not"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn gateways_and_clis_starting_at_once_apply_the_schema_once() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[auth.api_keys]\ndatabase = \"{}\"\n[services.infer]\nupstream = \"http://127.0.0.1:1\"\nscope = \"infer\"\n",
            pg.url
        ),
    )
    .unwrap();
    let runs: Vec<_> = (0..6)
        .map(|i| {
            let config = config.clone();
            std::thread::spawn(move || {
                let name = format!("k{i}");
                cli(
                    &config,
                    &["keys", "create", "--name", &name, "--scopes", "infer"],
                )
            })
        })
        .collect();
    for run in runs {
        let out = run.join().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // One row per schema step (the table, key ownership, the listing indexes, the usage
    // ledger, budgets, ledger batches, teams, the ledger's costs), each applied once.
    assert_eq!(
        pg.sql("SELECT string_agg(version::text, ',' ORDER BY version) FROM portcullis_migrations"),
        "1,2,3,4,5,6,7,8"
    );
    let out = cli(&config, &["keys", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        (0..6).filter(|i| listed.contains(&format!("k{i}"))).count(),
        6
    );
    // A wrong password: a clear one-line error that does not echo the URL's secrets.
    std::fs::write(
        &config,
        format!(
            "[auth.api_keys]\ndatabase = \"{}\"\n",
            pg.url.replace(PASSWORD, "wrong-password-77")
        ),
    )
    .unwrap();
    let out = cli(&config, &["keys", "list"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot open the key store"), "{err}");
    assert!(
        !err.contains("wrong-password-77") && !err.contains(PASSWORD),
        "{err}"
    );
}

#[test]
fn a_gateway_starts_while_postgres_is_down_and_takes_keys_once_it_answers() {
    let mut pg = Postgres::start();
    if !pg.is_local() {
        eprintln!("skipped: an external PORTCULLIS_TEST_POSTGRES_URL cannot be stopped");
        return;
    }
    let up = Upstream::start();
    // A key made before the outage: the gateway has never seen it.
    let seed = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .key_store(&pg.url)
        .start();
    let (key, _) = seed.create_key("infer", &[]);
    drop(seed);
    pg.stop();
    let gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .key_store(&pg.url)
        .start();
    let (s, took) = status(&gw, &key);
    assert_eq!(s, 401);
    assert!(
        took < Duration::from_secs(1),
        "waited {took:?} on a dead store"
    );
    pg.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    while status(&gw, &key).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the store came back, the key did not:\n{}",
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(gw.log().contains("starting anyway"));
}

/// Lookups racing revokes through the real binary: a request whose cache miss reads the key's
/// row just before the revoke commits must not leave that row cached once the NOTIFY has
/// evicted the key (it would then work for the 60 s cache TTL). The in-process test
/// (`src/auth/api_keys/race_tests.rs`) runs more races, on both announcement paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_racing_a_revoke_never_leaves_the_key_working() {
    use rand::Rng;
    const RACES: usize = 400;
    let pg = tokio::task::block_in_place(Postgres::start);
    let up = Upstream::start();
    let gw = tokio::task::block_in_place(|| fleet(&pg, &up, 1).remove(0));
    let store = portcullis::open_store(&pg.url, false).await.unwrap();
    let port = gw.port;
    let mut keys = Vec::with_capacity(RACES);
    for _ in 0..RACES {
        let made = portcullis::create_key(&*store, "race", vec!["infer".into()], None)
            .await
            .unwrap();
        let (key, id) = (made.token, made.record.key_id);
        // A revoke takes four round trips to commit, a request's lookup one after the
        // request is read: the revoke mostly starts first, so its commit sweeps the lookup.
        let offset = rand::thread_rng().gen_range(-5000i64..1000);
        let request = {
            let key = key.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros(offset.max(0) as u64)).await;
                tokio::task::spawn_blocking(move || status_on(port, &key)).await
            })
        };
        let revoke = {
            let store = store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros((-offset).max(0) as u64)).await;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64;
                assert!(store.revoke(&id, now).await.unwrap());
            })
        };
        request.await.unwrap().unwrap();
        revoke.await.unwrap();
        keys.push(key);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let still_working = tokio::task::block_in_place(|| {
        keys.iter()
            .filter(|key| status_on(port, key) == 200)
            .count()
    });
    println!("{RACES} races: {still_working} revoked key(s) still worked 1 s later");
    assert_eq!(still_working, 0);
}

fn status_on(port: u16, key: &str) -> u16 {
    let req = format!(
        "GET /v1/infer/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    testkit::raw(port, req.as_bytes()).0
}
