//! Replays every committed fuzz input (seed corpora and fixed crash inputs) through the same
//! invariant checks the libFuzzer targets run, on the stable toolchain: a regression of any
//! input fuzzing once found is caught by `make test`.
#![cfg(feature = "fuzzing")]

use std::path::Path;

use portcullis::fuzzing::TARGETS;

#[test]
fn every_committed_fuzz_input_still_holds_its_invariants() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for (name, check) in TARGETS {
        let mut seen_for_target = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let input = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| check(&input));
                assert!(
                    outcome.is_ok(),
                    "{name}: {} broke an invariant",
                    path.display()
                );
                seen_for_target += 1;
            }
        }
        assert!(
            seen_for_target > 0,
            "no committed corpus for fuzz target {name}"
        );
        replayed += seen_for_target;
    }
    eprintln!("replayed {replayed} fuzz inputs");
}
