use super::*;

fn day(s: &str) -> i64 {
    parse_date(s).unwrap()
}

fn prices(text: &str) -> Prices {
    Prices::parse("prices.toml", text).unwrap()
}

fn problems(text: &str) -> Vec<String> {
    Prices::parse("prices.toml", text).unwrap_err()
}

/// `input` of the price that applies, in currency units per million tokens (for readable
/// assertions).
fn input(p: &Prices, service: &str, model: &str, now: i64) -> Option<String> {
    p.price(service, model, now).map(|p| price_text(p.input))
}

const DATED: &str = r#"
[[price]]
model = "x-large-2"
from = "2026-11-01"
input = 2.50
cached_input = 1.25
output = 10.00

[[price]]
model = "x-large-2"
from = "2026-01-01"
input = 3
output = 12

[[price]]
model = "x-large-2"
from = "2026-12-01"
input = 2
output = 8

[[price]]
service = "chatx"
model = "x-large-2"
from = "2026-11-15"
input = 1.5
output = 6

[[price]]
service = "chaty"
model = "x-large-2"
from = "2027-01-01"
input = 9
output = 9
"#;

#[test]
fn the_newest_entry_whose_day_has_started_applies() {
    let p = prices(DATED);
    assert_eq!(input(&p, "infer", "x-large-2", day("2025-12-31")), None);
    assert_eq!(
        input(&p, "infer", "x-large-2", day("2026-01-01")).as_deref(),
        Some("3")
    );
    assert_eq!(
        input(&p, "infer", "x-large-2", day("2026-10-31") + 86_399).as_deref(),
        Some("3")
    );
    // The new price from the first second of its UTC day, whatever the order in the file.
    assert_eq!(
        input(&p, "infer", "x-large-2", day("2026-11-01")).as_deref(),
        Some("2.5")
    );
    assert_eq!(
        input(&p, "infer", "x-large-2", day("2026-11-30") + 86_399).as_deref(),
        Some("2.5")
    );
    assert_eq!(
        input(&p, "infer", "x-large-2", day("2026-12-01")).as_deref(),
        Some("2")
    );
    assert_eq!(
        input(&p, "infer", "x-large-2", i64::MAX).as_deref(),
        Some("2")
    );
    assert_eq!(input(&p, "infer", "x-small-1", day("2026-12-01")), None);
}

#[test]
fn a_price_dated_tomorrow_leaves_today_alone() {
    let p = prices(DATED);
    let today = day("2026-11-30") + 43_200;
    let tomorrow = day("2026-12-01");
    assert_eq!(
        input(&p, "infer", "x-large-2", today).as_deref(),
        Some("2.5")
    );
    assert_eq!(
        input(&p, "infer", "x-large-2", tomorrow).as_deref(),
        Some("2")
    );
}

#[test]
fn a_service_entry_wins_once_its_day_has_started() {
    let p = prices(DATED);
    // Before chatx's own entry starts, chatx pays the general price.
    assert_eq!(
        input(&p, "chatx", "x-large-2", day("2026-11-14")).as_deref(),
        Some("2.5")
    );
    assert_eq!(
        input(&p, "chatx", "x-large-2", day("2026-11-15")).as_deref(),
        Some("1.5")
    );
    // Its own entry wins over a newer general one.
    assert_eq!(
        input(&p, "chatx", "x-large-2", day("2026-12-05")).as_deref(),
        Some("1.5")
    );
    // chaty's only entry is in the future: the general entries apply.
    assert_eq!(
        input(&p, "chaty", "x-large-2", day("2026-12-05")).as_deref(),
        Some("2")
    );
    assert_eq!(
        input(&p, "chaty", "x-large-2", day("2027-01-01")).as_deref(),
        Some("9")
    );
    // A service's name matches exactly.
    assert_eq!(
        input(&p, "chatX", "x-large-2", day("2026-11-20")).as_deref(),
        Some("2.5")
    );
}

#[test]
fn a_service_entry_alone_prices_only_its_service() {
    let p = prices(
        "[[price]]\nservice = \"chatx\"\nmodel = \"m\"\nfrom = \"2026-01-01\"\ninput = 1\noutput = 1\n",
    );
    assert!(p.price("chatx", "m", day("2026-01-01")).is_some());
    assert_eq!(p.price("chaty", "m", day("2026-01-01")), None);
}

#[test]
fn counts_entries_and_pairs_that_apply() {
    let p = prices(DATED);
    assert_eq!(p.len(), 5);
    assert_eq!(p.applying_pairs(day("2025-06-01")), 0);
    // (any, x-large-2)
    assert_eq!(p.applying_pairs(day("2026-11-01")), 1);
    // + (chatx, x-large-2)
    assert_eq!(p.applying_pairs(day("2026-11-15")), 2);
    // + (chaty, x-large-2)
    assert_eq!(p.applying_pairs(day("2027-01-01")), 3);
    assert_eq!(prices("").len(), 0);
}

/// gpt-4o-mini's prices: 0.15 input, 0.075 cached, 0.60 output per million tokens.
const MINI: Price = Price {
    input: 150_000_000,
    cached_input: 75_000_000,
    output: 600_000_000,
};

#[test]
fn a_cost_is_exact_and_rounded_half_up_once() {
    // 210 × 0.15 + 1024 × 0.075 + 567 × 0.60 = 31.5 + 76.8 + 340.2 = 448.5 per million:
    // 448.5 micros, rounded half up to 449.
    let t = Tokens {
        prompt: 1234,
        cached: 1024,
        completion: 567,
    };
    assert_eq!(MINI.cost(t), 449);
    // One cached token fewer: 211 × 0.15 + 1023 × 0.075 + 340.2 = 448.575 → 449.
    assert_eq!(MINI.cost(Tokens { cached: 1023, ..t }), 449);
    // 1 × 0.15 = 0.15 micros → 0; 3 × 0.15 = 0.45 → 0; 4 × 0.15 = 0.6 → 1.
    for (prompt, micros) in [(1, 0), (3, 0), (4, 1), (10, 2), (1_000_000, 150_000)] {
        let t = Tokens {
            prompt,
            ..Tokens::default()
        };
        assert_eq!(MINI.cost(t), micros, "{prompt}");
    }
    // An exact half: 5 cached tokens at 0.1 per million = 0.5 micros → 1.
    let tenth = Price {
        input: 0,
        cached_input: 100_000_000,
        output: 0,
    };
    let five_cached = Tokens {
        prompt: 5,
        cached: 5,
        completion: 0,
    };
    assert_eq!(tenth.cost(five_cached), 1);
    assert_eq!(
        tenth.cost(Tokens {
            prompt: 4,
            cached: 4,
            completion: 0
        }),
        0
    );
}

#[test]
fn gpt_4o_prices_the_worked_example_of_the_docs() {
    // docs/costs.md: 210 × 2.50 + 1024 × 1.25 + 567 × 10.00 = 7475 per million = 0.007475.
    let p = prices(DATED);
    let price = p.price("infer", "x-large-2", day("2026-11-20")).unwrap();
    let t = Tokens {
        prompt: 1234,
        cached: 1024,
        completion: 567,
    };
    assert_eq!(price.cost(t), 7475);
}

#[test]
fn cached_tokens_past_the_prompt_count_as_the_prompt() {
    let t = Tokens {
        prompt: 100,
        cached: 500,
        completion: 0,
    };
    assert_eq!(MINI.cost(t), MINI.cost(Tokens { cached: 100, ..t }));
}

#[test]
fn a_cost_saturates_instead_of_overflowing() {
    let dearest = Price {
        input: MAX_PRICE,
        cached_input: MAX_PRICE,
        output: MAX_PRICE,
    };
    let all = Tokens {
        prompt: u64::MAX,
        cached: u64::MAX / 2,
        completion: u64::MAX,
    };
    assert_eq!(dearest.cost(all), u64::MAX);
    assert_eq!(dearest.worst_case(u64::MAX, u64::MAX), u64::MAX);
    assert_eq!(MINI.cost(Tokens::default()), 0);
}

#[test]
fn the_worst_case_rounds_up_and_covers_the_cost() {
    // 1234 × 0.15 + 567 × 0.60 = 185.1 + 340.2 = 525.3 → 526 micros.
    assert_eq!(MINI.worst_case(1234, 567), 526);
    assert_eq!(MINI.worst_case(1, 0), 1);
    assert_eq!(MINI.worst_case(0, 0), 0);
    assert_eq!(MINI.worst_case(1_000_000, 0), 150_000);
    // A cached price above the input price is what the prompt reserves.
    let odd = Price {
        input: 1_000_000_000,
        cached_input: 2_000_000_000,
        output: 0,
    };
    let t = Tokens {
        prompt: 10,
        cached: 10,
        completion: 0,
    };
    assert!(odd.worst_case(10, 0) >= odd.cost(t));
    for (prompt, cached, completion) in [(1234, 1024, 567), (7, 0, 3), (999_999, 3, 1)] {
        let t = Tokens {
            prompt,
            cached,
            completion,
        };
        assert!(MINI.worst_case(prompt, completion) >= MINI.cost(t));
    }
}

#[test]
fn prices_read_as_written() {
    let p = prices(
        "[[price]]\nmodel = \"a\"\nfrom = 2026-01-01\ninput = 0.15\noutput = 0\n\
         [[price]]\nmodel = \"b\"\nfrom = \"2026-01-01\"\ninput = 0.1234567895\ncached_input = 7\noutput = 1e3\n\
         [[price]]\nmodel = \"c\"\nfrom = \"2026-01-01\"\ninput = 1_000_000_000\noutput = 0.000000001\n",
    );
    let now = day("2026-01-01");
    assert_eq!(
        p.price("s", "a", now),
        Some(Price {
            input: 150_000_000,
            cached_input: 150_000_000,
            output: 0
        })
    );
    assert_eq!(
        p.price("s", "b", now),
        Some(Price {
            input: 123_456_790,
            cached_input: 7_000_000_000,
            output: 1_000_000_000_000
        })
    );
    assert_eq!(
        p.price("s", "c", now),
        Some(Price {
            input: MAX_PRICE,
            cached_input: MAX_PRICE,
            output: 1
        })
    );
}

#[test]
fn problems_name_the_file_the_entry_and_the_key() {
    let p = problems(
        r#"
[[price]]
model = "x"
from = "2026-11-01"
input = -2.5
output = 10

[[price]]
service = "chatx"
model = "y"
from = "2026-02-30"
input = "1"
output = inf
cached_input = nan
colour = "red"

[[price]]
from = "2026-11-01"
input = 1

[[price]]
model = ""
from = 20261101
output = 1e300
input = 1

[[price]]
model = "x"
from = 2026-11-01
input = 1
output = 1
"#,
    );
    let expected = [
        r#"prices.toml: price[1] (model "x", from 2026-11-01): input: must be a non-negative number (per million tokens)"#,
        r#"prices.toml: price[2] (service "chatx", model "y"): "colour": unknown key: an entry takes service, model, from, input, cached_input, output"#,
        r#"prices.toml: price[2] (service "chatx", model "y"): from: must be a date, YYYY-MM-DD"#,
        r#"prices.toml: price[2] (service "chatx", model "y"): input: must be a non-negative number (per million tokens)"#,
        r#"prices.toml: price[2] (service "chatx", model "y"): cached_input: must be a non-negative number (per million tokens)"#,
        r#"prices.toml: price[2] (service "chatx", model "y"): output: must be a non-negative number (per million tokens)"#,
        r#"prices.toml: price[3] (from 2026-11-01): model: is required"#,
        r#"prices.toml: price[3] (from 2026-11-01): output: is required"#,
        r#"prices.toml: price[4] (model ""): model: must be a model name (non-empty text)"#,
        r#"prices.toml: price[4] (model ""): from: must be a date, YYYY-MM-DD"#,
        r#"prices.toml: price[4] (model ""): output: must be at most 1000000000 (per million tokens)"#,
    ];
    assert_eq!(p, expected);
}

#[test]
fn the_same_service_model_and_day_twice_is_refused() {
    let entry = |service: &str, from: &str| {
        format!("[[price]]\n{service}model = \"x\"\nfrom = {from}\ninput = 1\noutput = 1\n")
    };
    let text = [
        entry("", "\"2026-11-01\""),
        entry("service = \"chatx\"\n", "\"2026-11-01\""),
        entry("", "2026-11-01"),
        entry("service = \"chatx\"\n", "\"2026-11-02\""),
        entry("service = \"chatx\"\n", "\"2026-11-01\""),
    ]
    .concat();
    assert_eq!(
        problems(&text),
        [
            r#"prices.toml: price[3] (model "x", from 2026-11-01): the same service, model and from as price[1]"#,
            r#"prices.toml: price[5] (service "chatx", model "x", from 2026-11-01): the same service, model and from as price[2]"#,
        ]
    );
}

#[test]
fn the_file_holds_only_price_entries() {
    assert_eq!(
        problems("currency = \"USD\"\n"),
        [r#"prices.toml: "currency": unknown key: the table holds only [[price]] entries"#]
    );
    assert_eq!(
        problems("price = 3\n"),
        ["prices.toml: price: must be [[price]] entries"]
    );
    assert_eq!(
        problems("price = [1]\n"),
        ["prices.toml: price[1]: must be a [[price]] table"]
    );
    let p = problems("[[price]]\nmodel = \"x\"\ninput = \n");
    assert_eq!(p.len(), 1);
    assert!(p[0].starts_with("prices.toml: line 3, column 9: "), "{p:?}");
}

#[test]
fn names_echoed_in_problems_stay_on_one_line() {
    let p = problems("[[price]]\nmodel = \"a\\nb\\u001b\"\nfrom = \"x\"\ninput = 1\noutput = 1\n");
    assert_eq!(
        p,
        [
            r#"prices.toml: price[1] (model "a\nb\u{1b}"): model: must be a model name (non-empty text)"#,
            r#"prices.toml: price[1] (model "a\nb\u{1b}"): from: must be a date, YYYY-MM-DD"#,
        ]
    );
    let p =
        problems("[[price]]\nmodel = \"a\\tb\"\nfrom = \"2026-01-01\"\ninput = 1\noutput = 1\n");
    assert!(
        p[0].ends_with("model: must be a model name (non-empty text)"),
        "{p:?}"
    );
}

#[test]
fn a_service_must_be_configured_when_the_services_are_known() {
    let text = "[[price]]\nservice = \"chatz\"\nmodel = \"m\"\nfrom = \"2026-01-01\"\ninput = 1\noutput = 1\n";
    assert!(Prices::parse("prices.toml", text).is_ok());
    assert!(Prices::parse_for("prices.toml", text, Some(&["chatz"])).is_ok());
    assert_eq!(
        Prices::parse_for("prices.toml", text, Some(&["chatx", "chaty"])).unwrap_err(),
        [
            r#"prices.toml: price[1] (service "chatz", model "m", from 2026-01-01): service: names no service in [services]"#
        ]
    );
}
