//! Authentication costs on the request path: API-key verification from the cache and from
//! the store (SQLite, and a throwaway PostgreSQL server started for the run), JWT verification per algorithm with and without the verified-token cache.
//! Run with `make bench` (or `cargo bench --bench auth`); figures go to stdout.

use testkit::{idp, postgres};

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use idp::{Idp, TestKey};
use portcullis::{
    classify_bearer as classify, create_key, open_store, ApiKeyVerifier, Bearer, JwtSettings,
    JwtVerifier, KeyStore,
};
use serde_json::json;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// The same verifier over each store: SQLite (the embedded default) and a real Postgres
/// server started for the run (the fleet store). The cached path never reaches the store, so
/// its figures should agree; the uncached path shows what a cache miss costs on each.
fn api_keys(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}/keys.db", dir.path().display());
    let pg = postgres::Postgres::start();
    for (name, url) in [("sqlite", sqlite.as_str()), ("postgres", pg.url.as_str())] {
        let store = rt.block_on(open_store(url, false)).unwrap();
        bench_store(c, &rt, name, store);
    }
}

fn bench_store(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: Arc<dyn KeyStore>,
) {
    let tokens: Vec<String> = rt.block_on(async {
        let mut out = Vec::new();
        for i in 0..256 {
            let key = create_key(&*store, &format!("k{i}"), vec!["infer".into()], None).await;
            out.push(key.unwrap().token);
        }
        out
    });
    let parts = |t: &str| match classify(t) {
        Some(Bearer::ApiKey { key_id, secret }) => (key_id, secret.to_string()),
        _ => unreachable!(),
    };
    let ttl = Duration::from_secs(3600);

    let verifier = ApiKeyVerifier::new(store.clone(), ttl, ttl);
    let (id, secret) = parts(&tokens[0]);
    rt.block_on(verifier.verify(id, &secret)).unwrap();
    c.bench_function(&format!("api_key/cached_{name}"), |b| {
        b.iter(|| rt.block_on(verifier.verify(id, &secret)).unwrap())
    });

    // Every verification a miss: a fresh cache per batch, each key seen once.
    c.bench_function(&format!("api_key/uncached_{name}"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let verifier = ApiKeyVerifier::new(store.clone(), ttl, ttl);
                let n = left.min(tokens.len() as u64);
                let start = Instant::now();
                for t in &tokens[..n as usize] {
                    let (id, secret) = parts(t);
                    rt.block_on(verifier.verify(id, &secret)).unwrap();
                }
                total += start.elapsed();
                left -= n;
            }
            total
        })
    });
}

fn jwts(c: &mut Criterion) {
    let rt = runtime();
    let keys = [TestKey::rsa("r"), TestKey::ec("e"), TestKey::ed("d")];
    let idp = rt.block_on(Idp::start(&[&keys[0], &keys[1], &keys[2]]));
    let settings = JwtSettings {
        issuer: idp.issuer.clone(),
        audience: idp::AUD.into(),
        jwks_uri: None,
        algorithms: vec![
            jsonwebtoken::Algorithm::RS256,
            jsonwebtoken::Algorithm::ES256,
            jsonwebtoken::Algorithm::EdDSA,
        ],
        leeway_seconds: 30,
        token_types: vec!["at+jwt".into()],
        jwks_refresh: Duration::from_secs(3600),
    };
    let verifier = JwtVerifier::new(settings).unwrap();
    rt.block_on(verifier.load_keys()).unwrap();
    for key in &keys {
        // Distinct tokens (unique jti), so every verification misses the cache.
        c.bench_function(&format!("jwt/{}/uncached", key.alg), |b| {
            b.iter_custom(|iters| {
                let tokens: Vec<String> = (0..iters)
                    .map(|_| key.access_token(&idp, json!({})))
                    .collect();
                let start = Instant::now();
                for t in &tokens {
                    rt.block_on(verifier.verify(t)).unwrap();
                }
                start.elapsed()
            })
        });
        let token = key.access_token(&idp, json!({}));
        rt.block_on(verifier.verify(&token)).unwrap();
        c.bench_function(&format!("jwt/{}/cached", key.alg), |b| {
            b.iter(|| rt.block_on(verifier.verify(&token)).unwrap())
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = api_keys, jwts
}
criterion_main!(benches);
