//! Seeds for the `gguf` fuzz target: small valid models that `Model::load`
//! accepts, so that mutations start past the parser and reach the model's
//! config, weight table and tokenizer (random bytes seldom form a model).
//! One per architecture family, each under the `-max_len` the fuzz README
//! gives, with the type ids the reader has to disambiguate (I2_S, Q2_0):
//!
//! - `seed-llama.gguf`: llama, the compact fixtures' 512-token BPE vocabulary
//!   and a ChatML template, a Q8_0 embedding, F16 and Q4_0 matrices;
//! - `seed-bitnet.gguf`: bitnet-b1.58, two layers with sub-norms, a 1bitLLM
//!   scale tensor, `ffn_down` in TQ2_0 and I2_S, an untied Q8_0 head;
//! - `seed-qwen3.gguf`: qwen3 (QK-norm, head size ≠ n_embd / n_head), Q2_0
//!   matrices.
//!
//! They live in `fuzz/regressions/gguf/`, which the fuzz README passes as a
//! corpus and `regressions.rs` runs as a test. This file checks that they
//! still load; `cargo test -p tern-fuzz-harness --test seeds -- --ignored`
//! writes them again (after a format change, say).

use std::borrow::Cow;
use std::path::PathBuf;

use tern_gguf::{Array, File, GgmlType, Metadata, Value, Writer, WriterTensor};
use tern_models::Model;
use tern_testutil::Rng;

/// The fuzz README's `-max_len` for the gguf target.
const MAX_LEN: usize = 65536;

fn dir() -> PathBuf {
    tern_testutil::repo_root().join("fuzz/regressions/gguf")
}

/// A model under construction: metadata, then tensors with their bytes.
struct Seed {
    md: Metadata,
    tensors: Vec<(WriterTensor, Vec<u8>)>,
    rng: Rng,
}

impl Seed {
    fn new(arch: &str, n_embd: u32, n_layer: u32, heads: (u32, u32), n_ff: u32) -> Seed {
        let mut md = Metadata::new();
        md.set("general.architecture", Value::String(arch.into()));
        md.set("general.name", Value::String(format!("fuzz seed ({arch})")));
        let key = |k: &str| format!("{arch}.{k}");
        md.set(key("embedding_length"), Value::U32(n_embd));
        md.set(key("block_count"), Value::U32(n_layer));
        md.set(key("attention.head_count"), Value::U32(heads.0));
        md.set(key("attention.head_count_kv"), Value::U32(heads.1));
        md.set(key("feed_forward_length"), Value::U32(n_ff));
        md.set(key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
        md.set(key("context_length"), Value::U32(256));
        md.set(key("rope.freq_base"), Value::F32(10000.0));
        Seed { md, tensors: Vec::new(), rng: Rng::new(arch.len() as u64) }
    }

    fn set(&mut self, key: String, value: Value) {
        self.md.set(key, value);
    }

    /// A tensor of random values (norms near 1), quantized to `ty`.
    fn tensor(&mut self, name: &str, ty: GgmlType, dims: &[u64]) {
        let n: u64 = dims.iter().product();
        let norm = dims.len() == 1;
        let x: Vec<f32> =
            (0..n).map(|_| if norm { 1.0 + 0.1 * self.rng.f32() } else { 0.1 * self.rng.f32() }).collect();
        let t = WriterTensor { name: name.into(), ty, dims: dims.to_vec() };
        let mut bytes = vec![0u8; t.nbytes().unwrap() as usize];
        match ty {
            GgmlType::F32 => bytes = x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => tern_quant::quantize_tensor(ty, &x, dims[0] as usize, &mut bytes),
        }
        self.tensors.push((t, bytes));
    }

    /// One layer's norms and projections (`ty`, and `down` for `ffn_down`),
    /// with bitnet's sub-norms or qwen3's per-head norms as `extra` says.
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &mut self,
        i: usize,
        e: u64,
        q_dim: u64,
        kv_dim: u64,
        ff: u64,
        ty: GgmlType,
        down: GgmlType,
        extra: Extra,
    ) {
        let b = |s: &str| format!("blk.{i}.{s}.weight");
        self.tensor(&b("attn_norm"), GgmlType::F32, &[e]);
        self.tensor(&b("attn_q"), ty, &[e, q_dim]);
        self.tensor(&b("attn_k"), ty, &[e, kv_dim]);
        self.tensor(&b("attn_v"), ty, &[e, kv_dim]);
        match extra {
            Extra::SubNorms => {
                self.tensor(&b("attn_sub_norm"), GgmlType::F32, &[q_dim]);
                self.tensor(&b("ffn_sub_norm"), GgmlType::F32, &[ff]);
            }
            Extra::QkNorms(hd) => {
                self.tensor(&b("attn_q_norm"), GgmlType::F32, &[hd]);
                self.tensor(&b("attn_k_norm"), GgmlType::F32, &[hd]);
            }
            Extra::None => {}
        }
        self.tensor(&b("attn_output"), ty, &[q_dim, e]);
        self.tensor(&b("ffn_norm"), GgmlType::F32, &[e]);
        self.tensor(&b("ffn_gate"), ty, &[e, ff]);
        self.tensor(&b("ffn_up"), ty, &[e, ff]);
        self.tensor(&b("ffn_down"), down, &[ff, e]);
    }

    fn bytes(self) -> Vec<u8> {
        let mut w = Writer::new(self.md);
        w.tensors = self.tensors.iter().map(|(t, _)| t.clone()).collect();
        let mut out = Vec::new();
        w.write(&mut out, |i| Ok(Cow::Borrowed(&self.tensors[i].1[..]))).unwrap();
        out
    }
}

#[derive(Clone, Copy)]
enum Extra {
    None,
    SubNorms,
    QkNorms(u64),
}

/// The compact fixtures' vocabulary (512 byte-level BPE tokens), from its
/// metadata, and a chat template.
fn vocabulary(seed: &mut Seed) -> u64 {
    let vocab = File::open(tern_testutil::compact_model("small-bpe-512-vocab.gguf")).unwrap();
    let mut n = 0;
    for (k, v) in vocab.metadata.entries() {
        if k.starts_with("tokenizer.") {
            if let (true, Value::Array(Array::String(tokens))) = (k == "tokenizer.ggml.tokens", v) {
                n = tokens.len() as u64;
            }
            seed.set(k.clone(), v.clone());
        }
    }
    assert!(n > 0, "the vocabulary has tokens");
    seed.set("tokenizer.chat_template".into(), Value::String(CHATML.into()));
    n
}

/// A ChatML template, so that the target renders one.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}\
                      {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn llama() -> Vec<u8> {
    let mut s = Seed::new("llama", 32, 1, (4, 2), 64);
    let vocab = vocabulary(&mut s);
    s.tensor("token_embd.weight", GgmlType::Q8_0, &[32, vocab]);
    s.layer(0, 32, 32, 16, 64, GgmlType::F16, GgmlType::Q4_0, Extra::None);
    s.tensor("output_norm.weight", GgmlType::F32, &[32]);
    s.bytes()
}

fn bitnet() -> Vec<u8> {
    let mut s = Seed::new("bitnet-b1.58", 32, 2, (2, 1), 256);
    s.set("bitnet-b1.58.vocab_size".into(), Value::U32(64));
    s.tensor("token_embd.weight", GgmlType::Q8_0, &[32, 64]);
    s.layer(0, 32, 32, 16, 256, GgmlType::Q8_0, GgmlType::TQ2_0, Extra::SubNorms);
    s.layer(1, 32, 32, 16, 256, GgmlType::Q8_0, GgmlType::I2_S, Extra::SubNorms);
    s.tensor("blk.0.attn_q.scale", GgmlType::F32, &[1]);
    s.tensor("output_norm.weight", GgmlType::F32, &[32]);
    s.tensor("output.weight", GgmlType::Q8_0, &[32, 64]);
    s.bytes()
}

fn qwen3() -> Vec<u8> {
    // head size 32 with 4 q heads over n_embd 64: q is 128 wide.
    let mut s = Seed::new("qwen3", 64, 1, (4, 2), 128);
    s.set("qwen3.attention.key_length".into(), Value::U32(32));
    s.set("qwen3.attention.value_length".into(), Value::U32(32));
    s.tensor("token_embd.weight", GgmlType::Q8_0, &[64, 48]);
    s.layer(0, 64, 128, 64, 128, GgmlType::Q2_0, GgmlType::Q2_0, Extra::QkNorms(32));
    s.tensor("output_norm.weight", GgmlType::F32, &[64]);
    s.bytes()
}

fn seeds() -> [(&'static str, Vec<u8>); 3] {
    [("seed-llama.gguf", llama()), ("seed-bitnet.gguf", bitnet()), ("seed-qwen3.gguf", qwen3())]
}

/// Parses, loads as a model and fits the fuzzer's length limit.
fn check(name: &str, bytes: &[u8]) {
    assert!(bytes.len() <= MAX_LEN, "{name}: {} bytes, over the fuzz README's -max_len {MAX_LEN}", bytes.len());
    let file = File::from_bytes(bytes.to_vec()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let model = Model::load(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(file.architecture().unwrap(), model.config.arch_name, "{name}");
    tern_fuzz_harness::gguf(bytes);
}

#[test]
fn generated_seeds_load() {
    for (name, bytes) in seeds() {
        check(name, &bytes);
    }
    let file = File::from_bytes(llama()).unwrap();
    tern_tokenizer::Tokenizer::from_metadata(&file.metadata).expect("the llama seed carries a vocabulary");
    let chat = tern_tokenizer::ChatTemplate::from_metadata(&file.metadata, "<s>", "</s>").unwrap().unwrap();
    let text = chat.render(&[tern_tokenizer::Message::new("user", "hi")], true).unwrap();
    assert_eq!(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

#[test]
fn checked_in_seeds_load() {
    for (name, _) in seeds() {
        let path = dir().join(name);
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (write the seeds: see this file's header)", path.display()));
        check(name, &bytes);
    }
}

/// Writes the seeds into `fuzz/regressions/gguf/`.
#[test]
#[ignore = "writes fuzz/regressions/gguf/seed-*.gguf"]
fn write_seeds() {
    for (name, bytes) in seeds() {
        std::fs::write(dir().join(name), &bytes).unwrap();
        eprintln!("{name}: {} bytes", bytes.len());
    }
}
