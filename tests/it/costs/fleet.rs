//! A team's cost budget across four gateways, one Postgres and one Redis: three owners, five
//! keys and JWT calls, two models at different prices, 200 concurrent streams; the ledger's cost
//! never passes the budget.

use std::thread;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::postgres::Postgres;
use testkit::redis::RedisServer;
use testkit::Gateway;

use super::{micros, price_table};
use crate::budgets::{header, key, portcullis, post, Fixture, Setup, CHAT};
use crate::ledger::{total, usage_cli, wait_for};

/// Per million tokens. A stream reports 21 prompt tokens (6 cached) and 9 completion ones:
/// m-a costs 15×100 + 6×50 + 9×400 = 5400 micros, m-b 21×30 + 9×60 = 1170.
const TABLE: &str = r#"
[[price]]
model = "m-a"
from = "2000-01-01"
input = 100
cached_input = 50
output = 400

[[price]]
model = "m-b"
from = "2000-01-01"
input = 30
output = 60
"#;

/// The team's budget: 0.2 of the currency a day, room for a few dozen of the 200 streams.
const BUDGET_MICROS: u64 = 200_000;

fn stream(port: u16, token: &str, model: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let body = json!({"model": model, "stream": true, "max_tokens": 9,
        "messages": [{"role": "user", "content": "hello there, how are you today?"}]});
    post(
        port,
        token,
        &format!("{CHAT}?n=3&gap_ms=2"),
        &body.to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_cost_budget_holds_across_owners_keys_jwts_and_four_gateways() {
    let pg = tokio::task::block_in_place(Postgres::start);
    let redis = RedisServer::start();
    let fx = Fixture::start().await;
    let (_dir, prices) = price_table(TABLE);
    let pricing = format!("file = \"{}\"", prices.display());
    let fleet: Vec<Gateway> = (0..4)
        .map(|_| {
            fx.gateway(&Setup {
                database: Some(&pg.url),
                redis: Some(redis.url()),
                pricing: &pricing,
                ..Setup::default()
            })
        })
        .collect();
    let suffix = format!("{:08x}", rand::random::<u32>());
    let team = format!("team-{suffix}");
    let owners: Vec<String> = (0..3).map(|i| format!("owner{i}-{suffix}")).collect();
    for owner in &owners {
        portcullis(&fleet[0], &["owners", "team", owner, &team]);
    }
    let budget = format!("{}", BUDGET_MICROS as f64 / 1e6);
    let shown = portcullis(
        &fleet[0],
        &["teams", "budget", &team, "--cost-per-day", &budget],
    );
    assert!(shown.contains("cost_per_day"), "{shown}");
    // Five keys over the three owners, and each owner's own JWT calls.
    let mut principals: Vec<String> = (0..5)
        .map(|i| key(&fleet[0], &["--owner", &owners[i % 3]]).0)
        .collect();
    principals.extend(owners.iter().map(|o| fx.token(o, "chat plain")));
    // Every gateway knows the team and its budget before the storm.
    thread::sleep(Duration::from_secs(1));
    let ports: Vec<u16> = fleet.iter().map(|g| g.port).collect();
    let threads: Vec<_> = (0..200)
        .map(|i| {
            let port = ports[i % ports.len()];
            let token = principals[i % principals.len()].clone();
            let model = if i % 3 == 0 { "m-a" } else { "m-b" };
            thread::spawn(move || stream(port, &token, model))
        })
        .collect();
    let (mut admitted, mut refused) = (0, 0);
    for t in threads {
        let (status, headers, body) = t.join().unwrap();
        match status {
            200 => admitted += 1,
            429 => {
                let body: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(body["error"], "budget_exceeded", "{body}");
                let message = body["message"].as_str().unwrap();
                assert!(
                    message.contains("cost_per_day") && message.contains("USD"),
                    "{message}"
                );
                assert!(message.contains(&team), "{message}");
                assert!(header(&headers, "retry-after").is_some());
                refused += 1;
            }
            other => panic!("status {other}: {}", String::from_utf8_lossy(&body)),
        }
    }
    // The team's ledger, once every gateway has flushed.
    let read = || usage_cli(&fleet[0].config, &["--team", &team, "--group-by", ""]);
    let rows = tokio::task::block_in_place(|| {
        wait_for(Duration::from_secs(30), read, |rows| {
            total(rows, "requests") as usize >= admitted
        })
    });
    let spent: u64 = rows.iter().map(|r| micros(&r["cost"])).sum();
    eprintln!("admitted {admitted}, refused {refused}, ledger {spent} micros");
    assert!(
        spent <= BUDGET_MICROS,
        "{spent} micros admitted past a team budget of {BUDGET_MICROS}"
    );
    assert!(admitted > 0 && refused > 0);
    assert_eq!(total(&rows, "requests") as usize, admitted);
    assert_eq!(total(&rows, "unpriced_requests"), 0);
    // Refused requests were never forwarded.
    assert_eq!(fx.chats_upstream(), admitted);
    // Every owner of the team is in its rows.
    let seen: Vec<&str> = rows.iter().filter_map(|r| r["owner"].as_str()).collect();
    for owner in &owners {
        assert!(
            seen.contains(&owner.as_str()),
            "{owner} missing from {seen:?}"
        );
    }
}
