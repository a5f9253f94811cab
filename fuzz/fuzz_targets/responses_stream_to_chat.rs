#![no_main]
// The invariants live in portcullis::fuzzing, shared with the corpus replay in make test.
libfuzzer_sys::fuzz_target!(|data: &[u8]| portcullis::fuzzing::responses_stream_to_chat(data));
