//! The request path's cost of choosing a replica (`make bench`; `cargo bench --bench replicas`):
//! one replica (the fast path every single-upstream service takes), three with
//! `least_requests` and with `round_robin`, against the one peer clone a request paid for
//! before replicas existed.

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
