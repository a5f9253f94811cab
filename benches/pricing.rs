//! What costing a request takes on the request path (`cargo bench --bench pricing`): the
//! table in use loaded (lock-free), the model's price found for the service and the day, and
//! the cost computed, through `Pricing::cost` as the gateway calls it. The table is the size of
//! LiteLLM's (2,000 entries: 1,000 models priced twice, dated, plus service-specific prices
//! for some). Target: ≤ 1 µs per request.

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use portcullis::{Prices, Pricing, Tokens, Unpriced};

/// 2,000 entries: every model at an old and a current price, every tenth also on `chatx`,
/// replacing as many general ones so the count stays LiteLLM's.
fn table() -> String {
    let mut text = String::new();
    for i in 0..1000 {
        let model = format!("provider-{}/model-{i:04}-2026-01-15", i % 40);
        let dates: &[&str] = if i % 10 == 0 {
            &["2026-01-01"]
        } else {
            &["2025-01-01", "2026-01-01"]
        };
        for from in dates {
            text.push_str(&format!(
                "[[price]]\nmodel = \"{model}\"\nfrom = \"{from}\"\ninput = {}.25\ncached_input = 0.125\noutput = {}.5\n\n",
                i % 7,
                i % 13
            ));
        }
        if i % 10 == 0 {
            text.push_str(&format!(
                "[[price]]\nservice = \"chatx\"\nmodel = \"{model}\"\nfrom = \"2026-03-01\"\ninput = 1\noutput = 4\n\n"
            ));
        }
    }
    text
}

fn costing(c: &mut Criterion) {
    let prices = Prices::parse("bench.toml", &table()).expect("the table parses");
    let pricing = Pricing::from_prices(prices, "USD", Unpriced::Allow);
    // 2026-11-18T11:06:40Z.
    let now = 1_795_000_000;
    let tokens = Tokens {
        prompt: 12_345,
        cached: 8_192,
        completion: 678,
    };
    let mut group = c.benchmark_group("pricing/cost");
    for (name, service, model) in [
        (
            "general price",
            "infer",
            "provider-13/model-0733-2026-01-15",
        ),
        (
            "service price",
            "chatx",
            "provider-20/model-0420-2026-01-15",
        ),
        (
            "unpriced model",
            "infer",
            "provider-13/model-9999-2026-01-15",
        ),
    ] {
        let priced = pricing.cost(service, model, now, tokens).is_some();
        assert_eq!(priced, name != "unpriced model", "{name}");
        group.bench_function(name, |b| {
            b.iter(|| {
                black_box(pricing.cost(
                    black_box(service),
                    black_box(model),
                    black_box(now),
                    black_box(tokens),
                ))
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = costing
}
criterion_main!(benches);
