//! Loading the 128k Llama 3 vocabulary must stay fast even in debug builds.

mod common;
use common::*;
use std::time::Instant;
use tern_tokenizer::Tokenizer;

#[test]
fn llama3_vocab_loads_quickly() {
    let t0 = Instant::now();
    let file = tern_gguf::File::open(testdata(LLAMA3_VOCAB)).unwrap();
    let t1 = Instant::now();
    let tok = Tokenizer::from_metadata(&file.metadata).unwrap();
    let t2 = Instant::now();
    let (read, build) = (t1 - t0, t2 - t1);
    eprintln!("gguf read {read:?}, tokenizer build {build:?}, n_vocab {}", tok.n_vocab());
    // Generous bounds: the target is well under a second for the build
    // alone; CI machines are slower and noisier than a workstation.
    assert!(build.as_secs_f64() < 1.0, "tokenizer build took {build:?}");
    assert!((read + build).as_secs_f64() < 3.0, "read + build took {:?}", read + build);
}
