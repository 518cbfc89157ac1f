#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tern_fuzz_harness::gguf(data));
