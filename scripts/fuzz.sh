#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser that reads client bytes (fuzz/fuzz_targets).
#   scripts/fuzz.sh run   [TARGET...]  long runs: FUZZ_RUNS executions or FUZZ_SECONDS each
#   scripts/fuzz.sh smoke [TARGET...]  a few seconds each, from the committed corpus (make test)
# Seeds live in fuzz/corpus/<target> (committed, small); what libFuzzer finds goes to
# fuzz/work/<target> (ignored); crashes land in fuzz/artifacts/<target> and, once fixed, are
# committed to fuzz/regressions/<target> so the corpus replay in `make test` keeps them.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(path_classifier bearer_token api_key jwt_precheck config_loader access_log_json
  model_body responses_body messages_body usage_scanner responses_usage messages_usage
  messages_to_chat_request chat_stream_to_messages responses_to_chat_request chat_stream_to_responses
  chat_to_responses_request responses_stream_to_chat)

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "installing cargo-fuzz (crates.io)"
  cargo install cargo-fuzz --locked --quiet
fi
# The fuzz crate is a workspace member, so it gets the workspace's release profile: without
# thin LTO (eight binaries to link) and with line tables for readable crash backtraces.
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_DEBUG=1
# -s none: no sanitizer, so the stable toolchain builds it (Rust code; ASan needs nightly).
(cd fuzz && cargo fuzz build -s none -O)

# glibc hands freed heap pages back and faults fresh ones in at the next large allocation;
# usage_scanner builds 27 gzip/deflate coders per input, and that churn took two thirds of
# its time. A standing pad at the heap top keeps the pages: 3x executions/s.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.top_pad=67108864}

case "$mode" in
  run)   limits=(-runs="${FUZZ_RUNS:-10000000}" -max_total_time="${FUZZ_SECONDS:-1800}") ;;
  smoke) limits=(-max_total_time="${FUZZ_SMOKE_SECONDS:-4}") ;;
  *) echo "usage: $0 run|smoke [TARGET...]" >&2; exit 2 ;;
esac
for t in "${targets[@]}"; do
  mkdir -p "fuzz/work/$t" "fuzz/regressions/$t"
  echo "== $t ($mode)"
  (cd fuzz && cargo fuzz run -s none -O "$t" "work/$t" "corpus/$t" "regressions/$t" -- \
      "${limits[@]}" -print_final_stats=1 2>&1) | tee "fuzz/work/$t.log" \
      | grep -E "^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|Done|==|.*(ERROR|panicked|deadly signal))" || true
  if grep -qE "ERROR: libFuzzer|panicked|deadly signal" "fuzz/work/$t.log"; then
    echo "fuzz target $t failed: see fuzz/work/$t.log and fuzz/artifacts/$t" >&2
    exit 1
  fi
done
