use std::path::Path;
use std::time::Duration;

use super::validate::DEFAULT_MAX_BODY;
use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("test.toml"), text, |name| {
        (name == "CHATX_UPSTREAM_KEY").then(|| "sk-upstream".to_string())
    })
}

fn problems(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

const MINIMAL: &str = "[services.infer]\nupstream = \"http://127.0.0.1:8000\"\nscope = \"infer\"\n";

#[test]
fn the_reference_config_parses() {
    // The reference names example hosts; resolve them locally so the test needs no DNS.
    let text = std::fs::read_to_string("conf/portcullis.toml")
        .unwrap()
        .replace("api.provider-x.example", "127.0.0.1")
        .replace("api.provider-y.example", "127.0.0.1")
        .replace("console.example.com", "127.0.0.1");
    let c = parse(&text).unwrap();
    assert_eq!(c.services.len(), 4);
    let chatx = c.services.iter().find(|s| s.name == "chatx").unwrap();
    assert!(chatx.replicas[0].tls);
    assert_eq!(chatx.replicas[0].port, 443);
    assert_eq!(chatx.upstream_headers[0].1, "Bearer sk-upstream");
    let chaty = c.services.iter().find(|s| s.name == "chaty").unwrap();
    assert_eq!(chaty.replicas[0].base_path, "/openai");
    assert_eq!(c.server.max_request_body_bytes, 33_554_432);
    assert_eq!(c.api_keys.unwrap().cache_ttl, Duration::from_secs(15));
    assert_eq!(c.jwt.unwrap().algorithms.len(), 3);
}

#[test]
fn the_demo_config_parses() {
    let text = std::fs::read_to_string("conf/demo.toml").unwrap();
    let services = parse(&text).unwrap().services;
    assert_eq!(services.len(), 7);
    let bridge = services.iter().find(|s| s.name == "bridge").unwrap();
    assert_eq!(bridge.translate, [crate::api::Pair::MessagesToChat]);
    let codex = services.iter().find(|s| s.name == "codex").unwrap();
    assert_eq!(codex.translate, [crate::api::Pair::ResponsesToChat]);
}

#[test]
fn defaults_apply() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.server.listen, vec!["127.0.0.1:8080"]);
    assert_eq!(c.server.max_request_body_bytes, DEFAULT_MAX_BODY);
    let s = &c.services[0];
    assert_eq!(s.connect_timeout, Duration::from_secs(3));
    assert_eq!(s.read_timeout, Duration::from_secs(300));
    assert_eq!(s.replicas[0].base_path, "");
    assert_eq!(s.replicas[0].host_header, "127.0.0.1:8000");
    assert!(c.api_keys.is_none() && c.jwt.is_none() && c.metrics.is_none());
}

#[test]
fn unknown_keys_are_refused_naming_file_and_key() {
    let p = problems(&format!("{MINIMAL}[server]\nlisten_addr = \"x\"\n"));
    assert!(p.contains("test.toml") && p.contains("listen_addr"), "{p}");
    let p = problems(&format!("{MINIMAL}timeout = 3\n"));
    assert!(p.contains("timeout"), "{p}");
}

#[test]
fn unset_variables_are_refused_without_echoing_values() {
    let p = problems(
        "[services.x]\nupstream = \"http://127.0.0.1:1\"\nscope = \"x\"\n\
         [services.x.upstream_headers]\nauthorization = \"Bearer ${NOT_SET}\"\n",
    );
    assert!(
        p.contains("services.x.upstream_headers.authorization") && p.contains("NOT_SET"),
        "{p}"
    );
    let p = problems(
        "[services.x]\nupstream = \"http://127.0.0.1:1\"\nscope = \"x\"\n\
         [services.x.upstream_headers]\nx-key = \"${CHATX_UPSTREAM_KEY}\\n\"\n",
    );
    assert!(
        p.contains("not a valid header value") && !p.contains("sk-upstream"),
        "{p}"
    );
}

#[test]
fn every_problem_is_listed_at_once() {
    let p = problems(
        "[services.a]\nscope = \"a\"\n\
         [services.b]\nupstream = \"http://127.0.0.1:1\"\n\
         [services.c]\nupstream = \"ftp://127.0.0.1\"\nscope = \"c\"\n\
         [services.d]\nupstream = \"http://user:pw@127.0.0.1\"\nscope = \"d\"\n\
         [services.E]\nupstream = \"http://127.0.0.1\"\nscope = \"e\"\n\
         [services.f]\nupstream = \"http://127.0.0.1\"\nscope = \"f\"\n\
         [services.f.upstream_headers]\nhost = \"evil\"\n",
    );
    for needle in [
        "services.a.upstream: is required",
        "services.b.scope: is required",
        "services.c.upstream",
        "services.d.upstream: must not carry credentials",
        "services.E: a service name",
        "services.f.upstream_headers.host",
    ] {
        assert!(p.contains(needle), "missing `{needle}` in:\n{p}");
    }
    assert!(!p.contains("pw"), "{p}");
}

#[test]
fn refuses_bad_server_and_auth_values() {
    let p = problems(&format!(
        "{MINIMAL}[server]\nlisten = [\"nope\"]\nthreads = 0\n"
    ));
    assert!(
        p.contains("server.listen") && p.contains("server.threads"),
        "{p}"
    );
    let p = problems(&format!(
        "{MINIMAL}[auth.jwt]\nissuer = \"not a url\"\naudience = \"a\"\nalgorithms = [\"HS256\", \"none\"]\n"
    ));
    assert!(
        p.contains("auth.jwt.issuer") && p.contains("`HS256`") && p.contains("`none`"),
        "{p}"
    );
    let p = problems(&format!(
        "{MINIMAL}[auth.api_keys]\ndatabase = \"mysql://x\"\n"
    ));
    assert!(p.contains("auth.api_keys.database"), "{p}");
    let p = problems(&format!(
        "{MINIMAL}[auth.api_keys]\ndatabase = \"postgres://u:pw-7@db:notaport/keys\"\n"
    ));
    assert!(
        p.contains("auth.api_keys.database: is not a valid postgres://") && !p.contains("pw-7"),
        "{p}"
    );
    let p = problems(&format!(
        "{MINIMAL}[auth.api_keys]\ndatabase = \"sqlite://k.db\"\nrevocation_push = true\n"
    ));
    assert!(
        p.contains("revocation_push: needs a postgres:// database"),
        "{p}"
    );
}

#[test]
fn a_postgres_key_store_pushes_revocations_unless_told_not_to() {
    let c = parse(&format!(
        "{MINIMAL}[auth.api_keys]\ndatabase = \"postgres://u:pw@db.example:5433/keys\"\n"
    ))
    .unwrap();
    let keys = c.api_keys.unwrap();
    assert!(crate::store::is_postgres_url(&keys.database) && keys.revocation_push);
    let c = parse(&format!(
        "{MINIMAL}[auth.api_keys]\ndatabase = \"postgresql://db/keys\"\nrevocation_push = false\n"
    ))
    .unwrap();
    assert!(!c.api_keys.unwrap().revocation_push);
    let c = parse(&format!(
        "{MINIMAL}[auth.api_keys]\ndatabase = \"sqlite://k.db\"\n"
    ))
    .unwrap();
    assert!(!c.api_keys.unwrap().revocation_push);
}

#[test]
fn no_services_is_an_error() {
    assert!(problems("").contains("no service is configured"));
}

#[test]
fn every_listener_address_is_checked() {
    let p = problems(&format!(
        "{MINIMAL}[metrics]\nlisten = \"nope\"\n[server]\nlisten = [\"127.0.0.1:80\", \"::1\"]\n"
    ));
    assert!(p.contains("metrics.listen") && p.contains("`nope`"), "{p}");
    assert!(p.contains("server.listen") && p.contains("`::1`"), "{p}");
    assert!(parse(&format!("{MINIMAL}[metrics]\nlisten = \"[::1]:9100\"\n")).is_ok());
}

#[test]
fn service_names_may_not_take_the_reserved_labels() {
    for name in ["_local", "_unknown", "_x"] {
        let p = problems(&format!(
            "[services.{name}]\nupstream = \"http://127.0.0.1:1\"\nscope = \"a\"\n"
        ));
        assert!(p.contains("may not start with `_`"), "{name}: {p}");
    }
    assert!(parse("[services.a_b]\nupstream = \"http://127.0.0.1:1\"\nscope = \"a\"\n").is_ok());
}

#[test]
fn a_scope_must_be_one_scope_token() {
    for scope in ["chat x", "chat\tx", "a\\u0001", "\\\"q\\\"", "a\\\\b", " "] {
        let p = problems(&format!(
            "[services.a]\nupstream = \"http://127.0.0.1:1\"\nscope = \"{scope}\"\n"
        ));
        assert!(p.contains("services.a.scope"), "{scope:?}: {p}");
    }
    for scope in ["chatx", "portcullis:admin", "api://x/y.read", "a-b_c~!"] {
        let text =
            format!("[services.a]\nupstream = \"http://127.0.0.1:1\"\nscope = \"{scope}\"\n");
        assert!(parse(&text).is_ok(), "{scope:?}");
    }
}

#[test]
fn values_echoed_in_problems_cannot_break_the_line() {
    // Found by the config_loader fuzz target.
    let e =
        parse("[services.infer]\nupstream = \"http:000/fed_\\nt \\u001b[31m\"\nscope = \"a\"\n")
            .unwrap_err();
    assert_eq!(e.problems.len(), 1);
    let p = &e.problems[0];
    assert!(!p.chars().any(char::is_control), "{p:?}");
    assert!(p.contains("http:000/fed_\\nt \\u{1b}[31m"), "{p}");
}

#[test]
fn toml_errors_and_summaries_are_one_line() {
    let e =
        parse("[services.a]\nupstream = \"http://127.0.0.1:1\"\nscope = = \"a\"\n").unwrap_err();
    assert_eq!(e.problems.len(), 1);
    let line = &e.problems[0];
    assert!(!line.contains('\n'), "{line}");
    assert!(line.starts_with("test.toml: line 3, column "), "{line}");
    let e = parse("[services.a]\nscope = \"a\"\n[services.b]\nscope = \"b\"\n").unwrap_err();
    let summary = e.summary();
    assert!(!summary.contains('\n'), "{summary}");
    assert!(
        summary.contains("services.a.upstream") && summary.contains("and 1 more"),
        "{summary}"
    );
}

#[test]
fn the_model_policy_is_opt_in_and_checked() {
    let c = parse(MINIMAL).unwrap();
    assert!(
        c.services[0].models.is_none(),
        "bodies are never read by default"
    );
    let c = parse(&format!(
        "{MINIMAL}api = \"openai\"\n[services.infer.models]\ndefault = \"m-1\"\naliases = {{ m = \"m-1\" }}\n"
    ))
    .unwrap();
    assert!(c.services[0].models.is_some());
    let c = parse(&format!("{MINIMAL}api = \"anthropic\"\n")).unwrap();
    assert_eq!(c.services[0].api, Some(crate::api::Api::Anthropic));
    assert!(c.services[0].models.is_some());
    let p = problems(&format!("{MINIMAL}api = \"gemini\"\n"));
    assert!(
        p.contains("services.infer.api")
            && p.contains(
                "`gemini` is not a known API: the ones supported are `openai` and `anthropic`"
            ),
        "{p}"
    );
    let p = problems(&format!(
        "{MINIMAL}[services.infer.models]\ndefault = \"m\"\n"
    ));
    assert!(
        p.contains("services.infer.models: needs `api = \"openai\"` or `api = \"anthropic\"`"),
        "{p}"
    );
    let p = problems(&format!(
        "{MINIMAL}api = \"openai\"\n[services.infer.models]\ndefault = \"\"\naliases = {{ \"\" = \"x\" }}\n"
    ));
    assert!(
        p.contains("models.default: must not be empty") && p.contains("models.aliases"),
        "{p}"
    );
    let p = problems(&format!(
        "{MINIMAL}api = \"openai\"\n[services.infer.models]\nfallback = \"m\"\n"
    ));
    assert!(p.contains("fallback"), "{p}");
}

#[test]
fn rate_limits_redis_is_optional_and_checked_without_connecting() {
    assert!(parse(MINIMAL).unwrap().rate_limits.redis.is_none());
    assert!(parse(&format!("{MINIMAL}[rate_limits]\n"))
        .unwrap()
        .rate_limits
        .redis
        .is_none());
    let redis = |url: &str| {
        parse(&format!("{MINIMAL}[rate_limits]\nredis = \"{url}\"\n"))
            .map(|c| c.rate_limits.redis.unwrap().shown)
    };
    assert_eq!(
        redis("redis://10.0.0.5:6380/2").unwrap(),
        "redis://10.0.0.5:6380/2"
    );
    // Neither resolved nor connected at start-up: a Redis that is down must not stop the gateway.
    assert_eq!(
        redis("redis://redis.invalid").unwrap(),
        "redis://redis.invalid:6379/0"
    );
    assert_eq!(
        redis("redis://[::1]:7000/").unwrap(),
        "redis://[::1]:7000/0"
    );
    // A password (here from the environment) is never shown, not even by Debug.
    let c = parse(&format!(
        "{MINIMAL}[rate_limits]\nredis = \"redis://portcullis:${{CHATX_UPSTREAM_KEY}}@cache.internal:6379/1\"\n"
    ))
    .unwrap();
    assert_eq!(
        c.rate_limits.redis.as_ref().unwrap().shown,
        "redis://cache.internal:6379/1"
    );
    let debug = format!("{c:?}");
    assert!(
        !debug.contains("sk-upstream") && !debug.contains("portcullis:"),
        "{debug}"
    );
    for bad in [
        "http://cache:6379",
        "rediss://:hunter2@cache:6379",
        "redis+unix:///run/redis.sock",
        "redis://:hunter2@cache:6379/zero",
        "redis://:hunter2@cache:6379/0?protocol=resp3",
        "redis://:hunter2@0.0.0.0:6379",
        "redis://:hunter2@cache:99999",
        "hunter2",
        "",
    ] {
        let p = problems(&format!("{MINIMAL}[rate_limits]\nredis = \"{bad}\"\n"));
        assert!(
            p.starts_with("test.toml: rate_limits.redis: "),
            "{bad}: {p}"
        );
        assert_eq!(p.lines().count(), 1, "{bad}: {p}");
        assert!(!p.contains("hunter2"), "{bad}: the password is quoted: {p}");
    }
    let p = problems(&format!(
        "{MINIMAL}[rate_limits]\nredis = \"redis://${{NOT_SET}}@cache\"\n"
    ));
    assert!(
        p.contains("rate_limits.redis") && p.contains("NOT_SET"),
        "{p}"
    );
    let p = problems(&format!(
        "{MINIMAL}[rate_limits]\nredis_url = \"redis://cache\"\n"
    ));
    assert!(p.contains("test.toml") && p.contains("redis_url"), "{p}");
}

#[test]
fn the_reference_rate_limits_example_parses_when_uncommented() {
    let text = std::fs::read_to_string("conf/portcullis.toml")
        .unwrap()
        .replace("api.provider-x.example", "127.0.0.1")
        .replace("api.provider-y.example", "127.0.0.1")
        .replace("console.example.com", "127.0.0.1")
        .replace("# [rate_limits]", "[rate_limits]")
        .replace("# redis = ", "redis = ")
        .replace("${REDIS_PASSWORD}", "${CHATX_UPSTREAM_KEY}");
    let c = parse(&text).unwrap();
    assert_eq!(
        c.rate_limits.redis.unwrap().shown,
        "redis://redis.internal:6379/0"
    );
}

#[test]
fn a_service_lists_at_most_sixty_four_replicas() {
    let list = |n: u16| -> String {
        let urls: Vec<String> = (0..n)
            .map(|i| format!("\"http://127.0.0.1:{}\"", 8000 + i))
            .collect();
        format!(
            "[services.infer]\nupstream = [{}]\nscope = \"infer\"\n",
            urls.join(", ")
        )
    };
    assert_eq!(parse(&list(64)).unwrap().services[0].replicas.len(), 64);
    assert!(problems(&list(65)).contains("services.infer.upstream: lists more than 64 replicas"));
}

#[test]
fn a_health_check_timeout_defaults_to_two_seconds_or_the_interval() {
    let check = |line: &str| {
        let c = parse(&format!(
            "{MINIMAL}health_check = {{ path = \"/h\"{line} }}\n"
        ));
        let h = c.unwrap().services[0]
            .balancing
            .health_check
            .clone()
            .unwrap();
        (h.interval.as_secs(), h.timeout.as_secs())
    };
    assert_eq!(check(""), (5, 2));
    assert_eq!(check(", interval_seconds = 1"), (1, 1));
    assert_eq!(check(", interval_seconds = 3"), (3, 2));
    assert_eq!(check(", interval_seconds = 1, timeout_seconds = 1"), (1, 1));
    // A timeout the operator wrote is still checked against the interval.
    let p = problems(&format!(
        "{MINIMAL}health_check = {{ path = \"/h\", interval_seconds = 1, timeout_seconds = 2 }}\n"
    ));
    assert!(
        p.contains("test.toml: services.infer.health_check.timeout_seconds"),
        "{p}"
    );
}

#[test]
fn bodies_read_whole_are_bounded_by_default_and_their_bounds_checked() {
    let b = parse(MINIMAL).unwrap().server.buffering;
    assert_eq!(
        (b.max_body, b.total, b.timeout),
        (8 << 20, 256 << 20, Duration::from_secs(60))
    );
    // A budget as large as one body is the smallest accepted.
    let c = parse(&format!(
        "[server]\nmax_buffered_body_bytes = 4096\nbuffered_bodies_max_bytes = 4096\n{MINIMAL}"
    ));
    assert_eq!(c.unwrap().server.buffering.total, 4096);
    let p = problems(&format!(
        "[server]\nmax_buffered_body_bytes = 4096\nbuffered_bodies_max_bytes = 4095\n\
         buffered_body_timeout_seconds = 0\n{MINIMAL}"
    ));
    assert!(
        p.contains(
            "test.toml: server.buffered_bodies_max_bytes: 4095 is less than \
             server.max_buffered_body_bytes (4096)"
        ),
        "{p}"
    );
    assert!(
        p.contains("test.toml: server.buffered_body_timeout_seconds: must be from 1 to 3600"),
        "{p}"
    );
    let p = problems(&format!("[server]\nmax_buffered_body_bytes = 0\n{MINIMAL}"));
    assert!(
        p.contains("test.toml: server.max_buffered_body_bytes: must be at least 1"),
        "{p}"
    );
}

#[test]
fn prefix_affinity_takes_a_load_factor_over_one() {
    let balance = |lines: &str| {
        parse(&format!("{MINIMAL}{lines}")).unwrap().services[0]
            .balancing
            .balance
    };
    assert_eq!(
        balance("balance = \"prefix_affinity\"\n"),
        Balance::PrefixAffinity { load_factor: 1.25 }
    );
    assert_eq!(
        balance("balance = \"prefix_affinity\"\naffinity_load_factor = 2.0\n"),
        Balance::PrefixAffinity { load_factor: 2.0 }
    );
    for bad in ["1.0", "0.5", "-3.0", "nan"] {
        let p = problems(&format!(
            "{MINIMAL}balance = \"prefix_affinity\"\naffinity_load_factor = {bad}\n"
        ));
        assert!(
            p.contains("test.toml: services.infer.affinity_load_factor: must be greater than 1.0"),
            "{bad}: {p}"
        );
    }
    let p = problems(&format!("{MINIMAL}affinity_load_factor = 1.5\n"));
    assert!(
        p.contains(
            "services.infer.affinity_load_factor: only applies with balance = \"prefix_affinity\""
        ),
        "{p}"
    );
    let p = problems(&format!("{MINIMAL}balance = \"sticky\"\n"));
    assert!(
        p.contains("is not least_requests, round_robin or prefix_affinity"),
        "{p}"
    );
}

#[test]
fn unmetered_paths_and_unstated_cap_are_checked_naming_the_key() {
    let p = problems(&format!("{MINIMAL}unmetered_paths = [\"/v1/files\"]\n"));
    assert!(
        p.contains("services.infer.unmetered_paths: needs `api`"),
        "{p}"
    );
    let p = problems(&format!(
        "{MINIMAL}api = \"openai\"\nunmetered_paths = [\"v1/files\", \"/x/\", \"/y?z\"]\n"
    ));
    assert_eq!(
        p.matches("services.infer.unmetered_paths:").count(),
        3,
        "{p}"
    );
    let with = |budgets: &str| {
        format!("{MINIMAL}[auth.api_keys]\ndatabase = \"sqlite://k.db\"\n[budgets]\n{budgets}\n")
    };
    let p = problems(&with("unstated_cap = \"guess\""));
    assert!(
        p.contains("budgets.unstated_cap: \"guess\" is not one of"),
        "{p}"
    );
    let p = problems(&format!("{MINIMAL}[metering]\ntail_seconds = 3601\n"));
    assert!(
        p.contains("metering.tail_seconds: must be from 0 to 3600"),
        "{p}"
    );
    let p = problems(&with("default_max_tokens = 0"));
    assert!(
        p.contains("budgets.default_max_tokens: must be at least 1"),
        "{p}"
    );
    let c = parse(&format!(
        "{MINIMAL}api = \"openai\"\nunmetered_paths = [\"/v1/files\"]\n"
    ))
    .unwrap();
    assert_eq!(c.services[0].unmetered_paths, ["/v1/files"]);
}

#[test]
fn translate_names_its_key_and_takes_only_pairs_the_api_can_make() {
    let c = parse(&format!(
        "{MINIMAL}api = \"anthropic\"\ntranslate = {{ messages = \"chat\" }}\n"
    ))
    .unwrap();
    assert_eq!(c.services[0].translate, [crate::api::Pair::MessagesToChat]);
    assert!(parse(MINIMAL).unwrap().services[0].translate.is_empty());
    let responses = "api = \"openai\"\ntranslate = { chat = \"responses\" }\n";
    let c = parse(&format!("{MINIMAL}{responses}")).unwrap();
    assert_eq!(c.services[0].translate, [crate::api::Pair::ChatToResponses]);
    for (lines, says) in [
        ("translate = { messages = \"chat\" }\n", "needs `api`"),
        (
            "api = \"anthropic\"\ntranslate = { messages = \"responses\" }\n",
            "\"messages\" = \"responses\" is not a translation this service's api can make: `messages = \"chat\"` is",
        ),
        (
            "api = \"openai\"\ntranslate = { messages = \"chat\" }\n",
            "`responses = \"chat\"` or `chat = \"responses\"` is",
        ),
        (
            "api = \"openai\"\ntranslate = { responses = \"chat\", chat = \"responses\" }\n",
            "`chat>responses` sends calls to the endpoint that `responses>chat` says the upstream does not serve",
        ),
    ] {
        let p = problems(&format!("{MINIMAL}{lines}"));
        assert!(p.contains("services.infer.translate: ") && p.contains(says), "{lines}: {p}");
    }
}

/// MINIMAL with `[pricing]` naming `table` (written to a temporary file) and `lines`.
fn with_pricing(table: &str, lines: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prices.toml");
    std::fs::write(&file, table).unwrap();
    let text = format!(
        "{MINIMAL}[pricing]\nfile = {}\n{lines}",
        toml::Value::from(file.display().to_string())
    );
    (dir, text)
}

const TABLE: &str =
    "[[price]]\nservice = \"infer\"\nmodel = \"m\"\nfrom = \"2026-01-01\"\ninput = 1\noutput = 2\n";

#[test]
fn pricing_is_optional_and_defaults_to_usd_allowing_unpriced_models() {
    assert!(parse(MINIMAL).unwrap().pricing.is_none());
    let (dir, text) = with_pricing(TABLE, "");
    let p = parse(&text).unwrap().pricing.unwrap();
    assert_eq!(p.file, dir.path().join("prices.toml"));
    assert_eq!(p.currency, "USD");
    assert_eq!(p.unpriced, crate::pricing::Unpriced::Allow);
    let (_dir, text) = with_pricing(TABLE, "currency = \"€\"\nunpriced = \"refuse\"\n");
    let p = parse(&text).unwrap().pricing.unwrap();
    assert_eq!(p.currency, "€");
    assert_eq!(p.unpriced, crate::pricing::Unpriced::Refuse);
    // A relative path is read as written: relative to the working directory, like the others.
    let p = problems(&format!(
        "{MINIMAL}[pricing]\nfile = \"conf/no-prices.toml\"\n"
    ));
    assert!(
        p.contains("test.toml: pricing.file: conf/no-prices.toml: cannot read"),
        "{p}"
    );
}

#[test]
fn pricing_values_are_checked_naming_the_key() {
    for (lines, says) in [
        (
            "unpriced = \"deny\"\n",
            "test.toml: pricing.unpriced: \"deny\" is not one of \"allow\", \"refuse\"",
        ),
        (
            "currency = \"\"\n",
            "test.toml: pricing.currency: must be 1 to 16 characters",
        ),
        (
            "currency = \"US D\"\n",
            "test.toml: pricing.currency: must be",
        ),
        (
            "currency = \"ABCDEFGHIJKLMNOPQ\"\n",
            "test.toml: pricing.currency: must be",
        ),
        ("colour = \"red\"\n", "unknown field `colour`"),
    ] {
        let (_dir, text) = with_pricing(TABLE, lines);
        let p = problems(&text);
        assert!(p.contains(says), "{lines}: {p}");
    }
    let p = problems(&format!("{MINIMAL}[pricing]\ncurrency = \"USD\"\n"));
    assert!(p.contains("missing field `file`"), "{p}");
    let p = problems(&format!(
        "{MINIMAL}[pricing]\nfile = \"/nonexistent/prices.toml\"\n"
    ));
    assert!(
        p.contains("test.toml: pricing.file: /nonexistent/prices.toml: cannot read"),
        "{p}"
    );
}

#[test]
fn a_bad_price_table_is_a_config_problem_naming_the_entry() {
    let (dir, text) = with_pricing(
        &format!("{TABLE}[[price]]\nservice = \"chatz\"\nmodel = \"n\"\nfrom = \"2026-01-01\"\ninput = -1\noutput = 1\n"),
        "",
    );
    let table = dir.path().join("prices.toml").display().to_string();
    let p = parse(&text).unwrap_err().problems;
    assert_eq!(
        p,
        [
            format!("test.toml: pricing.file: {table}: price[2] (service \"chatz\", model \"n\", from 2026-01-01): service: names no service in [services]"),
            format!("test.toml: pricing.file: {table}: price[2] (service \"chatz\", model \"n\", from 2026-01-01): input: must be a non-negative number (per million tokens)"),
        ]
    );
}

#[test]
fn the_demo_prices_its_models() {
    let text = std::fs::read_to_string("conf/demo.toml").unwrap();
    let pricing = parse(&text).unwrap().pricing.unwrap();
    assert_eq!(pricing.file, Path::new("conf/prices.toml"));
    let prices = crate::pricing::Prices::from_file(&pricing.file).unwrap();
    let june = crate::time::parse_date("2026-06-01").unwrap();
    for model in [
        "alpha3.6-vl",
        "alpha3.6-mini",
        "x-large-2",
        "x-small-1",
        "emb-m3",
    ] {
        assert!(prices.price("chatx", model, june).is_some(), "{model}");
    }
}
