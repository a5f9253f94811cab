//! The request path's cost of choosing a replica (`make bench`; `cargo bench --bench replicas`):
//! one replica (the fast path every single-upstream service takes), three with
//! `least_requests` and with `round_robin`, against the one peer clone a request paid for
//! before replicas existed; and `prefix_affinity` for a 220 KB chat prompt (its key hashed
//! from at most 16 KiB of the body, then the ring walked): the target is 5 µs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use portcullis::Config;
use portcullis::Metrics;
use portcullis::Replicas;

fn replicas(upstreams: &[&str], balance: &str) -> Arc<Replicas> {
    let list: Vec<String> = upstreams.iter().map(|u| format!("\"{u}\"")).collect();
    let text = format!(
        "[services.infer]\nupstream = [{}]\nscope = \"infer\"\nbalance = \"{balance}\"\n",
        list.join(", ")
    );
    let config = Config::parse(Path::new("bench.toml"), &text, |_| None).unwrap();
    let service = config.services[0].clone();
    let metrics = Metrics::new();
    Arc::new(Replicas::new(&service, &metrics, &|up, a| {
        portcullis::peer_for(&service, up, a)
    }))
}

fn choosing(c: &mut Criterion) {
    let one = replicas(&["http://127.0.0.1:8000"], "least_requests");
    let three = [
        "http://127.0.0.1:8000",
        "http://127.0.0.2:8000",
        "http://127.0.0.3:8000",
    ];
    let least = replicas(&three, "least_requests");
    let rr = replicas(&three, "round_robin");

    // What every proxied request did before: clone its service's one prepared peer.
    let (_, peer) = one.choose(0).unwrap();
    c.bench_function("replicas/before: clone the peer", |b| {
        b.iter(|| black_box(peer.clone()))
    });
    for (name, r) in [
        ("one replica", &one),
        ("three, least_requests", &least),
        ("three, round_robin", &rr),
    ] {
        // Chosen and released, as a request does: the in-flight count goes up and down.
        c.bench_function(&format!("replicas/choose: {name}"), |b| {
            b.iter(|| black_box(r.choose(0).unwrap()))
        });
    }

    let affine = replicas(&three, "prefix_affinity");
    let body = prompt_220kb();
    c.bench_function(
        "replicas/choose: three, prefix_affinity, 220 KB prompt",
        |b| {
            b.iter(|| {
                let key = portcullis::affinity_body_key(black_box(&body));
                black_box(affine.choose_for(0, key).unwrap())
            })
        },
    );
    c.bench_function(
        "replicas/choose: three, prefix_affinity, X-Session-Id",
        |b| {
            b.iter(|| {
                let key = portcullis::affinity_session_key(black_box(b"conversation-0123456789"));
                black_box(affine.choose_for(0, Some(key)).unwrap())
            })
        },
    );
}

/// A long conversation: a 6 KB system prompt, a 20 KB first user message (past the 16 KiB
/// hashed), then turns up to 220 KB.
fn prompt_220kb() -> Vec<u8> {
    let words = |n: usize, w: &str| vec![w; n].join(" ");
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": words(1_000, "rules")}),
        serde_json::json!({"role": "user", "content": words(4_000, "read")}),
    ];
    while serde_json::to_vec(&messages).unwrap().len() < 220_000 {
        messages.push(serde_json::json!({"role": "assistant", "content": words(2_000, "said")}));
        messages.push(serde_json::json!({"role": "user", "content": words(500, "asks")}));
    }
    let body = serde_json::json!({"model": "m", "stream": true, "messages": messages});
    let body = serde_json::to_vec(&body).unwrap();
    assert!(body.len() >= 220_000 && portcullis::affinity_body_key(&body).is_some());
    body
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = choosing
}
criterion_main!(benches);
