//! A simulated model server (`Upstream::sim`): an OpenAI-compatible `/v1/chat/completions`
//! replica with a vLLM-like prefix cache, for the affinity tests and the routing benchmark.
//!
//! - Tokens: the whitespace-separated words of each message's `role` and `content`, in order.
//! - Blocks of [`BLOCK`] tokens, each identified by a hash chained on the previous block's (as
//!   vLLM's automatic prefix caching does), so a block hits only if everything before it does.
//!   A partial last block is never cached.
//! - An LRU cache of `cache_blocks` blocks. A request's cached tokens are its leading blocks
//!   found in the cache; then all its blocks are stored (the least recently used evicted).
//! - Time: prefill sleeps `prefill_per_token` per uncached prompt token, one prefill at a time
//!   (the GPU does one at a time; requests queue behind it); decoding sleeps `decode_per_token`
//!   per generated token (`max_tokens`, default 16), alongside other requests' decoding.
//! - Answers: usage with `prompt_tokens_details.cached_tokens`, and the `x-sim-replica` and
//!   `x-sim-cached-tokens` headers; `"stream": true` streams a chunk per token.
//! - `GET /metrics`: `sim_prefix_cache_hit_blocks_total`, `sim_prefix_cache_query_blocks_total`,
//!   `sim_requests_total`, `sim_busy_seconds_total` (the sum of request durations: the time
//!   integral of requests in flight) and `sim_in_flight`.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::wire::{write_chunk, write_json};
use super::Hit;

/// Tokens per cache block (vLLM's default block size).
pub const BLOCK: usize = 16;

/// How a simulated replica serves.
#[derive(Debug, Clone)]
pub struct SimSettings {
    /// Blocks the prefix cache holds.
    pub cache_blocks: usize,
    pub prefill_per_token: Duration,
    pub decode_per_token: Duration,
}

impl Default for SimSettings {
    fn default() -> SimSettings {
        SimSettings {
            cache_blocks: 4096,
            prefill_per_token: Duration::from_micros(20),
            decode_per_token: Duration::from_millis(2),
        }
    }
}

pub(super) struct Sim {
    settings: SimSettings,
    cache: Mutex<Lru>,
    /// One prefill at a time.
    prefill: tokio::sync::Mutex<()>,
    hit_blocks: AtomicU64,
    query_blocks: AtomicU64,
    requests: AtomicU64,
    busy_micros: AtomicU64,
    in_flight: AtomicUsize,
}

/// Block hashes by last use.
#[derive(Default)]
struct Lru {
    stamp: u64,
    by_hash: HashMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
}

impl Lru {
    /// Leading blocks found, then every block stored as just used.
    fn lookup_and_store(&mut self, blocks: &[u64], capacity: usize) -> usize {
        let hits = blocks
            .iter()
            .take_while(|b| self.by_hash.contains_key(b))
            .count();
        for &b in blocks {
            self.stamp += 1;
            if let Some(old) = self.by_hash.insert(b, self.stamp) {
                self.by_stamp.remove(&old);
            }
            self.by_stamp.insert(self.stamp, b);
        }
        while self.by_hash.len() > capacity {
            let Some((_, b)) = self.by_stamp.pop_first() else {
                break;
            };
            self.by_hash.remove(&b);
        }
        hits
    }
}

impl Sim {
    pub(super) fn new(settings: SimSettings) -> Sim {
        Sim {
            settings,
            cache: Mutex::default(),
            prefill: tokio::sync::Mutex::new(()),
            hit_blocks: AtomicU64::new(0),
            query_blocks: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            busy_micros: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }
}

/// The chained block hashes of a chat body's messages, and its token count.
fn blocks(body: &Value) -> (Vec<u64>, usize) {
    let mut tokens: Vec<&str> = Vec::new();
    for m in body["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        tokens.extend(m["role"].as_str().unwrap_or_default().split_whitespace());
        tokens.extend(m["content"].as_str().unwrap_or_default().split_whitespace());
    }
    let mut previous = 0u64;
    let blocks = tokens
        .chunks_exact(BLOCK)
        .map(|block| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            previous.hash(&mut h);
            block.hash(&mut h);
            previous = h.finish();
            previous
        })
        .collect();
    (blocks, tokens.len())
}

/// Answers one request; false when the connection must close.
pub(super) async fn answer(conn: &mut TcpStream, req: &Hit, sim: &Sim, name: &str) -> bool {
    if req.method == "GET" && req.path().ends_with("/metrics") {
        return write_json(conn, "200 OK", "", &metrics(sim)).await;
    }
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(b) if req.path().ends_with("/chat/completions") => b,
        _ => {
            let e =
                r#"{"error":{"message":"POST a chat completion","type":"invalid_request_error"}}"#;
            return write_json(conn, "400 Bad Request", "", e).await;
        }
    };
    let started = Instant::now();
    sim.in_flight.fetch_add(1, Ordering::SeqCst);
    let ok = serve(conn, name, sim, &body).await;
    sim.in_flight.fetch_sub(1, Ordering::SeqCst);
    let micros = started.elapsed().as_micros() as u64;
    sim.busy_micros.fetch_add(micros, Ordering::Relaxed);
    ok
}

async fn serve(conn: &mut TcpStream, name: &str, sim: &Sim, body: &Value) -> bool {
    let (blocks, prompt_tokens) = blocks(body);
    let hits = {
        let mut cache = sim.cache.lock().unwrap();
        cache.lookup_and_store(&blocks, sim.settings.cache_blocks)
    };
    sim.requests.fetch_add(1, Ordering::Relaxed);
    sim.hit_blocks.fetch_add(hits as u64, Ordering::Relaxed);
    sim.query_blocks
        .fetch_add(blocks.len() as u64, Ordering::Relaxed);
    let cached = hits * BLOCK;
    let uncached = (prompt_tokens - cached) as u32;
    {
        let _gpu = sim.prefill.lock().await;
        tokio::time::sleep(sim.settings.prefill_per_token * uncached).await;
    }
    let completion = body["max_tokens"].as_u64().unwrap_or(16).clamp(1, 4096) as usize;
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached}});
    let headers = format!(
        "x-sim-replica: {}\r\nx-sim-cached-tokens: {cached}\r\n",
        name
    );
    let decode = sim.settings.decode_per_token;
    if body["stream"].as_bool() != Some(true) {
        tokio::time::sleep(decode * completion as u32).await;
        let text = "tok ".repeat(completion);
        let answer = json!({"id": "chatcmpl-sim", "object": "chat.completion", "created": 0,
            "model": body["model"], "usage": usage, "choices": [{"index": 0,
            "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]});
        return write_json(conn, "200 OK", &headers, &answer.to_string()).await;
    }
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
         transfer-encoding: chunked\r\n{headers}\r\n"
    );
    if conn.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for i in 0..completion {
        if i > 0 {
            tokio::time::sleep(decode).await;
        }
        let last = i + 1 == completion;
        let chunk = json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk",
            "created": 0, "model": body["model"], "choices": [{"index": 0,
            "delta": {"content": "tok "},
            "finish_reason": if last { json!("stop") } else { Value::Null }}],
            "usage": if last { usage.clone() } else { Value::Null }});
        if !write_chunk(conn, format!("data: {chunk}\n\n").as_bytes()).await {
            return false;
        }
    }
    write_chunk(conn, b"data: [DONE]\n\n").await && conn.write_all(b"0\r\n\r\n").await.is_ok()
}

fn metrics(sim: &Sim) -> String {
    format!(
        "sim_prefix_cache_hit_blocks_total {}\nsim_prefix_cache_query_blocks_total {}\n\
         sim_requests_total {}\nsim_busy_seconds_total {:.6}\nsim_in_flight {}\n",
        sim.hit_blocks.load(Ordering::Relaxed),
        sim.query_blocks.load(Ordering::Relaxed),
        sim.requests.load(Ordering::Relaxed),
        sim.busy_micros.load(Ordering::Relaxed) as f64 / 1e6,
        sim.in_flight.load(Ordering::SeqCst),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_chain_so_a_later_turn_hits_the_earlier_turns_blocks() {
        let words = |n: usize| {
            (0..n)
                .map(|i| format!("w{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let one = json!({"messages": [{"role": "system", "content": words(40)},
            {"role": "user", "content": "hello there"}]});
        let two = json!({"messages": [{"role": "system", "content": words(40)},
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": words(30)}]});
        let (a, tokens) = blocks(&one);
        assert_eq!((a.len(), tokens), (2, 44));
        let (b, _) = blocks(&two);
        assert_eq!(&b[..2], &a[..], "the same start, the same blocks");
        let mut lru = Lru::default();
        assert_eq!(lru.lookup_and_store(&a, 100), 0);
        assert_eq!(lru.lookup_and_store(&b, 100), 2);
        // Capacity 2: b's four blocks all hit, then only its last two are kept.
        assert_eq!(lru.lookup_and_store(&b, 2), 4);
        assert_eq!(
            lru.lookup_and_store(&a, 2),
            0,
            "the first block was evicted"
        );
    }
}
