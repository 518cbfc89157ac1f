mod common;
use common::*;
use std::time::Instant;
#[test]
fn bench() {
    let t = llama3();
    let base = std::fs::read_to_string(testdata("tokenizer/ggml-vocab-llama-bpe.gguf.inp")).unwrap();
    let text = base.repeat(1_000_000 / base.len() + 1);
    for ps in [false, true] {
        let t0 = Instant::now();
        let ids = t.encode(&text, false, ps);
        let dt = t0.elapsed();
        eprintln!("parse_special={ps}: {} bytes -> {} ids in {dt:?} ({:.1} MB/s)", text.len(), ids.len(), text.len() as f64 / dt.as_secs_f64() / 1e6);
    }
    let ids = t.encode(&text, false, false);
    let t0 = Instant::now();
    let s = t.decode(&ids);
    eprintln!("decode {:?}", t0.elapsed());
    assert_eq!(s, text);
}
