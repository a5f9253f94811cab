//! Price tables through the real binary: `prices import` (LiteLLM's JSON to our table, exactly
//! the expected fixture), `prices check`, `serve -t` refusing a bad table, and SIGHUP
//! reloading the table of a running gateway (a bad one kept out, naming the entry).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use testkit::{gateway_bin, Gateway, Service, Upstream};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/litellm")
        .join(name)
}

fn portcullis(args: &[&str]) -> Output {
    Command::new(gateway_bin()).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A config naming `table` (written next to it) and one service, `infer`.
fn config_with(dir: &Path, table: &str) -> PathBuf {
    let prices = dir.join("prices.toml");
    std::fs::write(&prices, table).unwrap();
    let config = dir.join("c.toml");
    let toml = format!(
        "[services.infer]\nupstream = \"http://127.0.0.1:1\"\nscope = \"infer\"\n\n\
         [pricing]\nfile = \"{}\"\ncurrency = \"EUR\"\n",
        prices.display()
    );
    std::fs::write(&config, toml).unwrap();
    config
}

const ENTRY: &str = "[[price]]\nmodel = \"m\"\nfrom = \"2020-01-01\"\ninput = 1\noutput = 2\n";

#[test]
fn import_prints_the_litellm_table_converted_exactly() {
    let json = fixture("model_prices_and_context_window.json");
    let json = json.to_str().unwrap();
    let out = portcullis(&[
        "prices",
        "import",
        "--litellm",
        json,
        "--from",
        "2026-11-01",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let expected = std::fs::read_to_string(fixture("expected_prices.toml")).unwrap();
    assert_eq!(text(&out.stdout), expected);
    assert_eq!(
        text(&out.stderr),
        "7 models priced, dated 2026-11-01; 4 without prices per token and 0 unreadable left out\n"
    );

    // Without --from, dated today: the table a check then finds in force.
    let out = portcullis(&["prices", "import", "--litellm", json]);
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(dir.path(), &text(&out.stdout));
    let out = portcullis(&["prices", "check", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(": 7 entries; 7 (service, model) pairs priced today"));

    let out = portcullis(&[
        "prices",
        "import",
        "--litellm",
        json,
        "--from",
        "2026-02-30",
    ]);
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr),
        "portcullis: --from: \"2026-02-30\" is not a date, YYYY-MM-DD\n"
    );
    let out = portcullis(&["prices", "import", "--litellm", "/nonexistent.json"]);
    assert!(text(&out.stderr).starts_with("portcullis: /nonexistent.json: cannot read"));
}

#[test]
fn check_counts_the_pairs_priced_today_not_those_priced_later() {
    let dir = tempfile::tempdir().unwrap();
    let table = format!(
        "{ENTRY}\n{}\n{}\n{}",
        ENTRY.replace("2020-01-01", "2021-01-01"),
        ENTRY.replace("model = \"m\"", "service = \"infer\"\nmodel = \"m\""),
        ENTRY
            .replace("model = \"m\"", "model = \"later\"")
            .replace("2020", "9999")
    );
    let config = config_with(dir.path(), &table);
    let out = portcullis(&["prices", "check", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let prices = dir.path().join("prices.toml");
    assert!(
        stdout.starts_with(&format!(
            "{}: 4 entries; 2 (service, model) pairs priced today (",
            prices.display()
        )),
        "{stdout}"
    );
    assert!(stdout.ends_with(" UTC), in EUR\n"), "{stdout}");
}

#[test]
fn a_bad_table_fails_check_and_serve_t_naming_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let bad = format!("{ENTRY}\n{}", ENTRY.replace("input = 1", "input = -1"));
    let config = config_with(dir.path(), &bad);
    let prices = dir.path().join("prices.toml");
    let problem = format!(
        "{}: pricing.file: {}: price[2] (model \"m\", from 2020-01-01): input: must be a \
         non-negative number (per million tokens)",
        config.display(),
        prices.display()
    );
    let out = portcullis(&["prices", "check", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(text(&out.stderr), format!("portcullis: {problem}\n"));
    let out = portcullis(&["serve", "-t", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(text(&out.stderr), format!("portcullis: {problem}\n"));

    // Every problem listed, then the summary.
    let worse = format!("{bad}\n[[price]]\nmodel = \"n\"\n");
    std::fs::write(&prices, worse).unwrap();
    let out = portcullis(&["prices", "check", "--config", config.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 5, "{stderr}");
    assert!(
        stderr.contains("price[3] (model \"n\"): from: is required"),
        "{stderr}"
    );
    assert!(stderr.ends_with(" (and 3 more problem(s))\n"), "{stderr}");
}

#[test]
fn check_needs_a_pricing_section() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "[services.infer]\nupstream = \"http://127.0.0.1:1\"\nscope = \"infer\"\n",
    )
    .unwrap();
    let out = portcullis(&["prices", "check", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr),
        format!(
            "portcullis: {}: pricing: section missing, so there is no price table\n",
            config.display()
        )
    );
}

/// Waits until the gateway's log holds `needle`.
fn logged(gw: &Gateway, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gw.log().contains(needle) {
        assert!(Instant::now() < deadline, "no `{needle}` in:\n{}", gw.log());
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_reloads_the_table_and_keeps_it_over_a_bad_one() {
    let up = Upstream::start();
    let tables = tempfile::tempdir().unwrap();
    let prices = tables.path().join("prices.toml");
    std::fs::write(&prices, ENTRY).unwrap();
    let mut gw = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .extra(&format!("[pricing]\nfile = \"{}\"\n", prices.display()))
        .start();

    std::fs::write(
        &prices,
        format!(
            "{ENTRY}\n[[price]]\nmodel = \"n\"\nfrom = \"2020-13-01\"\ninput = 1\noutput = 1\n"
        ),
    )
    .unwrap();
    gw.signal("HUP");
    logged(
        &gw,
        "price[2] (model \"n\"): from: must be a date, YYYY-MM-DD",
    );
    logged(
        &gw,
        "refused, so the price table in use (1 entries) is kept",
    );

    std::fs::write(
        &prices,
        format!("{ENTRY}\n{}", ENTRY.replace("\"m\"", "\"n\"")),
    )
    .unwrap();
    gw.signal("HUP");
    logged(&gw, "price table reloaded, 2 entries");
    assert!(
        gw.wait_exit(Duration::from_millis(200)).is_none(),
        "SIGHUP stopped the gateway"
    );
}
