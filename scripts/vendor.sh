#!/usr/bin/env bash
# Rebuilds vendor/ from crates.io sources plus vendor/patches/*.patch (see vendor/README.md).
#   scripts/vendor.sh          unpack each crate of vendor/crates.txt, apply the patches in
#                              order, and replace vendor/<crate>/ with the result
#   scripts/vendor.sh --check  the same into a temporary directory, then fail if vendor/
#                              differs from it in any byte (`make test` runs this)
#   scripts/vendor.sh --test   the patched crates' own tests of the modules the patches touch,
#                              run in a copy (cargo would rewrite the crate's Cargo.lock) with
#                              the gateway's Cargo.lock and the rustls feature, as we ship it
# A .crate file is taken from cargo's download cache when there, else from static.crates.io;
# either way its sha256 must match vendor/crates.txt (the checksum Cargo.lock had for it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
NAME=vendor
. scripts/lib.sh
CHECK=${1:-}

if [ "$CHECK" = --test ]; then
    WORK=$(mktemp -d /tmp/portcullis-vendor-test.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
    cp -a vendor/pingora-core "$WORK/"
    cp Cargo.lock "$WORK/pingora-core/Cargo.lock"
    # The modules the patches change; the crate's tests that need the public internet are
    # left out (they fail in a sandbox with or without the patches).
    (cd "$WORK/pingora-core" && CARGO_TARGET_DIR="$ROOT/target/vendor-test" cargo test --lib --quiet --features rustls -- \
        protocols::http::v1 connectors::http::tests::test_session_future_stays_small) ||
        die "the patched pingora-core fails its own tests"
    exit 0
fi

WORK=$(mktemp -d /tmp/portcullis-vendor.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/vendor"

grep -v '^#' vendor/crates.txt | while read -r crate version sum; do
    [ -n "$crate" ] || continue
    file=$crate-$version.crate
    cached=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$file" 2>/dev/null | head -n 1 || true)
    if [ -n "$cached" ]; then
        cp "$cached" "$WORK/$file"
    else
        curl -sSfL --retry 3 -o "$WORK/$file" "https://static.crates.io/crates/$crate/$file" ||
            die "could not download $file"
    fi
    [ "$(hash_of "$WORK/$file")" = "$sum" ] || die "$file: sha256 is not the one in vendor/crates.txt"
    tar -xzf "$WORK/$file" -C "$WORK/vendor"
    mv "$WORK/vendor/$crate-$version" "$WORK/vendor/$crate"
done

# Each patch names its files from vendor/ (a/pingora-core/src/...), so one `patch -p1` per file.
for p in vendor/patches/*.patch; do
    [ -e "$p" ] || continue
    patch -s -p1 -d "$WORK/vendor" --no-backup-if-mismatch <"$p" >"$WORK/patch.log" 2>&1 ||
        die "$p does not apply: $(cat "$WORK/patch.log")"
done

crates=$(grep -v '^#' vendor/crates.txt | awk 'NF { print $1 }')
if [ "$CHECK" = --check ]; then
    for c in $crates; do
        diff -r "$WORK/vendor/$c" "vendor/$c" >"$WORK/diff" 2>&1 ||
            die "vendor/$c is not crates.io's source plus vendor/patches (scripts/vendor.sh rebuilds it):
$(head -n 20 "$WORK/diff")"
    done
    say "vendor/ is crates.io's source plus $(ls vendor/patches/*.patch 2>/dev/null | wc -l) patches"
else
    for c in $crates; do
        rm -rf "vendor/$c"
        cp -a "$WORK/vendor/$c" "vendor/$c"
    done
    say "rebuilt vendor/ ($crates)"
fi
