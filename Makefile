# Portcullis: `make run` starts the demo, `make test` runs every test, `make bench` prints figures.
CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all build deps test-deps run test test-clients soak bench fuzz fmt lint clean

all: build

# Pingora's zlib-ng build needs cmake; install it when the machine lacks it.
deps:
	@command -v cmake >/dev/null 2>&1 || { \
	  echo "installing cmake (needed by Pingora's zlib-ng build)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake >/dev/null; }

build: deps
	$(CARGO) build

run: build
	scripts/demo.sh

# promtool (Debian's prometheus package) lints the real /metrics output in tests/it/metrics.rs;
# the openssl CLI makes the throwaway CA of tests/it/tls.rs; PostgreSQL's server binaries run the
# fleet key-store tests (testkit/src/postgres.rs starts its own server in a temp directory);
# redis-server runs the fleet rate-limit tests (testkit/src/redis.rs, likewise).
test-deps: deps
	@command -v promtool >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 || { \
	  echo "installing promtool (Debian package prometheus) and openssl"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends prometheus openssl >/dev/null; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "installing postgresql (the fleet tests start a real server of their own)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends postgresql >/dev/null; }
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (the fleet rate-limit tests start a real one of their own)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends redis-server >/dev/null; }
	@[ -x /usr/bin/chromium ] || { \
	  echo "installing chromium (scripts/browser-tests.sh drives the key console in it)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

# vendor/ must be crates.io's source plus vendor/patches, and the patched crate must pass its own
# tests of what the patches touch (vendor/README.md).
test: test-deps
	scripts/vendor.sh --check
	scripts/vendor.sh --test
	$(CARGO) test --features fuzzing --lib --bins --tests -- --test-threads=4
	SOAK_MINUTES=3 $(CARGO) test --features fuzzing --test it soak -- --ignored --nocapture
	$(CARGO) test --bench auth --bench replicas --bench bodies --bench translate --bench pricing
	scripts/fuzz.sh smoke
	scripts/sdk-tests.sh
	scripts/admin-api-tests.sh
	scripts/browser-tests.sh

# Optional: the real Claude Code and Codex CLIs (from npm, into target/clients) each complete a
# turn through the dialect bridge (tests/clients/run.py). Not part of `make test`.
test-clients: build
	scripts/client-tests.sh

# The soak (tests/it/soak/): one gateway for SOAK_MINUTES under paced mixed traffic and a fault
# schedule (an upgrade every 5 minutes; key revocations, Postgres, Redis and a replica restarted,
# the JWKS rotated), its RSS, fds and connections sampled every 10 s into target/soak/ (CSV, PNG
# drawn by scripts/soak-plot.sh, one line of figures; SOAK_OUT elsewhere). make test runs 3 minutes.
SOAK_MINUTES ?= 60
soak: test-deps
	SOAK_MINUTES=$(SOAK_MINUTES) $(CARGO) test --features fuzzing --test it soak -- --ignored --nocapture

# Coverage-guided fuzzing of every parser that reads client bytes: 10 million executions or
# 30 minutes per target (FUZZ_RUNS, FUZZ_SECONDS). Installs cargo-fuzz when missing.
fuzz: deps
	scripts/fuzz.sh run

# Criterion micro-benchmarks of authentication (API keys on SQLite and on a throwaway
# PostgreSQL server, hence test-deps) and of the usage ledger's report query (100 keys × 90
# days of hourly rows, on both stores) and of reading 200 KB agent bodies and streams (model
# policy validation, usage scanner) and of the dialect bridge (the captured Claude Code and Codex
# requests translated, a stream per direction converted) and of costing a request against a
# LiteLLM-sized price table, then the load benchmark on loopback against the upstream
# direct, nginx and the bare-Pingora floor, and instructions per request under callgrind
# (benches/load/run.py installs wrk, nginx, redis-server and valgrind when missing).
# `make bench ONLY=scaling` (or metering, budgets, routing): that stage of the load benchmark
# alone, without the micro-benchmarks; its knobs are environment variables (benches/load/run.py).
bench: test-deps
ifeq ($(ONLY),)
	$(CARGO) bench --bench auth
	$(CARGO) bench --bench replicas
	$(CARGO) bench --bench ledger
	$(CARGO) bench --bench bodies
	$(CARGO) bench --bench translate
	$(CARGO) bench --bench pricing
endif
	python3 benches/load/run.py

fmt:
	$(CARGO) fmt --all

# `-D warnings` also denies the crate's `unreachable_pub` (src/lib.rs): `pub` means re-exported.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets --features fuzzing -- -D warnings
# No import circles between src/ files (scripts/modgraph.py): each builds on lower-level ones.
	python3 scripts/modgraph.py src

clean:
	$(CARGO) clean
	rm -rf data
