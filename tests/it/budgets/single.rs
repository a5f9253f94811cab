//! One gateway: what a budgeted caller sees, what survives a restart, and the bounds of the
//! modes that do not reserve a stated cap.

use std::thread;
use std::time::Duration;

use testkit::redis::RedisServer;
use testkit::{raw, Gateway};

use super::{header, key, ledger_of, metric, stream_chat, Fixture, Setup, STREAM_TOKENS};

/// The size of `stream_chat`'s body with `max_tokens` (digits included) or without.
fn body_bytes(max_tokens: Option<u64>) -> u64 {
    let mut body = serde_json::json!({"model": "m", "stream": true,
        "messages": [{"role": "user", "content": "hello there, how are you today?"}]});
    if let Some(n) = max_tokens {
        body["max_tokens"] = serde_json::json!(n);
    }
    body.to_string().len() as u64
}

/// What the gateway reserves for `stream_chat` at one token per 4 body bytes.
fn reservation(max_tokens: Option<u64>, default_max_tokens: u64) -> u64 {
    body_bytes(max_tokens).div_ceil(4) + max_tokens.unwrap_or(default_max_tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budgeted_caller_gets_openais_headers_and_a_429_naming_the_window() {
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup::default());
    let (k, _) = key(&gw, &["--tokens-per-day", "100"]);
    let ask = reservation(Some(9), 0);
    assert!(ask >= 21 + 9 && 2 * STREAM_TOKENS + ask <= 100 && 3 * STREAM_TOKENS + ask > 100);
    let mut remaining = Vec::new();
    for _ in 0..3 {
        let (status, headers, body) = stream_chat(gw.port, &k, Some(9));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        // The upstream's own headers (OpenAI's account limits) are replaced by the budget's.
        assert_eq!(header(&headers, "x-ratelimit-limit-tokens"), Some("100"));
        let reset = header(&headers, "x-ratelimit-reset-tokens").unwrap();
        assert!(reset.ends_with('s') && reset.len() >= 2, "{reset}");
        remaining.push(
            header(&headers, "x-ratelimit-remaining-tokens")
                .unwrap()
                .to_string(),
        );
        // No request budget: the upstream's request headers pass as they were.
        assert_eq!(
            header(&headers, "x-ratelimit-limit-requests"),
            Some("30000")
        );
    }
    let used = |n: u64| (n * STREAM_TOKENS + ask).to_string();
    let expect: Vec<String> = (0..3)
        .map(|n| (100 - used(n).parse::<u64>().unwrap()).to_string())
        .collect();
    assert_eq!(remaining, expect);
    let before = fx.chats_upstream();
    let (status, headers, body) = stream_chat(gw.port, &k, Some(9));
    assert_eq!(status, 429);
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "budget_exceeded");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("tokens_per_day budget of key")
            && message.contains("has 10 of 100 tokens left")
            && message.contains(&format!("reserves {ask}")),
        "{message}"
    );
    let retry: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    let now = testkit::idp::unix_now() as u64;
    let to_midnight = 86_400 - now % 86_400;
    assert!(retry.abs_diff(to_midnight) <= 5, "{retry} vs {to_midnight}");
    // Hours away: the SDKs are told not to retry (Node's would sleep out the Retry-After).
    if retry > 60 {
        assert_eq!(header(&headers, "x-should-retry"), Some("false"));
    }
    assert_eq!(header(&headers, "x-ratelimit-remaining-tokens"), Some("10"));
    assert_eq!(
        fx.chats_upstream(),
        before,
        "a refused request is never forwarded"
    );
    assert_eq!(
        metric(
            &gw,
            "portcullis_budget_rejections_total{service=\"chat\",window=\"tokens_per_day\"}"
        ),
        1.0
    );
    // A request budget alone: the request triple is the budget's, and the upstream's
    // account-wide token headers are not passed on as if they were the caller's.
    let (counted, _) = key(&gw, &["--requests-per-day", "5"]);
    let (status, headers, _) = stream_chat(gw.port, &counted, Some(9));
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "x-ratelimit-limit-requests"), Some("5"));
    assert_eq!(
        header(&headers, "x-ratelimit-remaining-requests"),
        Some("4")
    );
    assert_eq!(header(&headers, "x-ratelimit-limit-tokens"), None);
    // A caller without a budget gets the upstream's headers untouched.
    let (free, _) = key(&gw, &[]);
    let (status, headers, _) = stream_chat(gw.port, &free, Some(9));
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "x-ratelimit-limit-tokens"),
        Some("150000000")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_does_not_reset_a_spent_budget() {
    let fx = Fixture::start().await;
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}/keys.db", dir.path().display());
    let setup = Setup {
        database: Some(&database),
        ..Setup::default()
    };
    let mut gw = fx.gateway(&setup);
    let (k, _) = key(&gw, &["--requests-per-day", "3"]);
    let statuses: Vec<u16> = (0..4)
        .map(|_| stream_chat(gw.port, &k, Some(9)).0)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    gw.signal("TERM");
    assert!(tokio::task::block_in_place(|| gw.wait_exit(Duration::from_secs(20))).is_some());
    let gw = fx.gateway(&setup);
    let (status, headers, _) = stream_chat(gw.port, &k, Some(9));
    assert_eq!(status, 429, "the new process starts from the ledger");
    assert_eq!(
        header(&headers, "x-ratelimit-remaining-requests"),
        Some("0")
    );
}

/// Sends `n` streamed chats at once; the statuses.
fn burst(gw: &Gateway, token: &str, n: usize, max_tokens: Option<u64>) -> Vec<u16> {
    let port = gw.port;
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let token = token.to_string();
            thread::spawn(move || stream_chat(port, &token, max_tokens).0)
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charging_after_the_response_overshoots_at_most_the_requests_in_flight() {
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup {
        budgets: "enforcement = \"after\"",
        ..Setup::default()
    });
    let (k, id) = key(&gw, &["--tokens-per-day", "300"]);
    const IN_FLIGHT: usize = 40;
    let statuses = tokio::task::block_in_place(|| burst(&gw, &k, IN_FLIGHT, Some(9)));
    assert!(
        statuses.iter().all(|s| [200, 429].contains(s)),
        "{statuses:?}"
    );
    let (used, _) = tokio::task::block_in_place(|| ledger_of(&gw, &id));
    // Documented bound: the budget plus what the requests admitted together may use.
    assert!(used <= 300 + IN_FLIGHT as u64 * STREAM_TOKENS, "{used}");
    // Once spent, refused.
    assert_eq!(stream_chat(gw.port, &k, Some(9)).0, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_max_tokens_overshoot_at_most_what_default_max_tokens_left_out() {
    let fx = Fixture::start().await;
    // A default below the 9 completion tokens the upstream really uses.
    const DEFAULT: u64 = 1;
    let gw = fx.gateway(&Setup {
        budgets: "default_max_tokens = 1",
        ..Setup::default()
    });
    let (k, id) = key(&gw, &["--tokens-per-day", "600"]);
    const IN_FLIGHT: usize = 40;
    let statuses = tokio::task::block_in_place(|| burst(&gw, &k, IN_FLIGHT, None));
    let admitted = statuses.iter().filter(|s| **s == 200).count() as u64;
    assert!(admitted > 0 && admitted < IN_FLIGHT as u64, "{statuses:?}");
    let (used, _) = tokio::task::block_in_place(|| ledger_of(&gw, &id));
    // Documented bound: per request in flight, what it used beyond its reservation.
    let beyond = STREAM_TOKENS.saturating_sub(reservation(None, DEFAULT));
    assert!(
        used <= 600 + IN_FLIGHT as u64 * beyond,
        "{used}, {beyond} each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_keys_of_one_owner_and_its_jwt_share_one_rate_limit() {
    let redis = tokio::task::block_in_place(RedisServer::start);
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup {
        redis: Some(redis.url()),
        rate_limit_per_minute: Some(6),
        ..Setup::default()
    });
    let owner = format!("bob-{:08x}", rand::random::<u32>());
    let mut callers: Vec<String> = (0..3).map(|_| key(&gw, &["--owner", &owner]).0).collect();
    callers.push(fx.token(&owner, "chat plain"));
    let get = |token: &str| {
        let req = format!(
            "GET /v1/plain/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n\
             Connection: close\r\n\r\n"
        );
        tokio::task::block_in_place(|| raw(gw.port, req.as_bytes())).0
    };
    let statuses: Vec<u16> = (0..8).map(|i| get(&callers[i % 4])).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 429, 429]);
    // A key of nobody's counts for itself.
    let (alone, _) = key(&gw, &[]);
    assert_eq!(get(&alone), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_held_until_complete_is_refused_for_its_budget_before_any_of_it_goes_upstream() {
    let fx = Fixture::start().await;
    let gw = fx.gateway(&Setup {
        max_body: Some(1 << 20),
        ..Setup::default()
    });
    let (k, _) = key(&gw, &["--tokens-per-day", "10000"]);
    // 200 KB of prompt: past the 64 KiB read ahead, so the body is held until complete and
    // its budget decided then; 50,000 estimated tokens do not fit in 10,000.
    let content = "x".repeat(200_000);
    let body = serde_json::json!({"model": "m", "max_tokens": 9,
        "messages": [{"role": "user", "content": content}]})
    .to_string();
    let (status, headers, reply) = super::post(gw.port, &k, super::CHAT, &body);
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&reply));
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply["error"], "budget_exceeded");
    assert!(reply["message"]
        .as_str()
        .unwrap()
        .contains("tokens_per_day"));
    assert!(header(&headers, "retry-after").is_some());
    assert_eq!(header(&headers, "x-ratelimit-limit-tokens"), Some("10000"));
    assert_eq!(fx.chats_upstream(), 0, "the upstream never got the request");
    // The same key still has its whole budget for a request that fits.
    let (status, _, _) = stream_chat(gw.port, &k, Some(9));
    assert_eq!(status, 200);
}
