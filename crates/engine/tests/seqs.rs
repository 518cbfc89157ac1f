//! Multi-sequence batches (`Session::eval_seqs`) against each sequence
//! evaluated alone (`Session::eval_last` on a session of its own), on the
//! demo model and on fixtures with grouped-query attention, latent attention
//! and experts, over steps that mix prompt chunks and decoding tokens of
//! three sequences in varied orders.
//!
//! Bound: per model, on the largest |Δ| of a logits row relative to its
//! largest logit. Attention works per sequence as it would alone (its cut
//! depends on the sequence only, `crates/cpu/tests/seq_attention.rs`),
//! norms, ropes and lookups work per token, ternary matrices form the same
//! integers in any batch, and float matrices take the same row dots, so the
//! demo model, the ternary fixture and the f16 latent-attention fixture
//! match bit for bit. Block-quantized matrices multiply 4 or more tokens
//! (a batch, or an expert's tokens) by a GEMM whose f32 sums run in another
//! order than one token's row dots (`crates/cpu/tests/gemm_kernels.rs`):
//! those logits move by rounding only, 1e-5.

use tern_engine::{LoadOptions, SeqInput, Session};
use tern_gguf::GgmlType;
use tern_testutil::logits::max_abs_diff;

const SEQS: usize = 3;
const N_CTX: usize = 96;

/// Each step's inputs: (sequence, tokens, logits wanted).
const STEPS: [&[(usize, usize, bool)]; 6] = [
    &[(0, 7, true), (1, 1, false), (2, 40, true)],
    &[(1, 3, true), (0, 1, true), (2, 1, true)],
    &[(2, 1, true), (0, 1, true), (1, 1, true)],
    &[(0, 20, false), (2, 1, true)],
    &[(1, 1, true), (2, 9, true), (0, 1, true)],
    &[(0, 1, true)],
];

fn opts(n_seqs: usize) -> LoadOptions {
    LoadOptions {
        n_ctx: N_CTX,
        n_seqs,
        n_threads: 2,
        k_type: GgmlType::F32,
        v_type: GgmlType::F32,
        ..LoadOptions::default()
    }
}

/// The largest |Δ| over the rows, relative to each reference row's largest logit.
fn compare(model: &std::path::Path) -> f64 {
    let mut batched = Session::load(model, &opts(SEQS)).unwrap();
    let mut alone: Vec<Session> = (0..SEQS).map(|_| Session::load(model, &opts(1)).unwrap()).collect();
    let n_vocab = batched.n_vocab();
    let mut rng = tern_testutil::Rng::new(0x5E05_E61E);
    let mut worst = 0f64;
    for (si, step) in STEPS.iter().enumerate() {
        let tokens: Vec<Vec<u32>> =
            step.iter().map(|&(_, n, _)| (0..n).map(|_| rng.below(n_vocab) as u32).collect()).collect();
        let inputs: Vec<SeqInput> =
            step.iter().zip(&tokens).map(|(&(seq, _, logits), t)| SeqInput { seq, tokens: t, logits }).collect();
        let got = batched.eval_seqs(&inputs).unwrap().to_vec();
        let mut rows = got.chunks_exact(n_vocab);
        for (&(seq, _, logits), t) in step.iter().zip(&tokens) {
            let want = alone[seq].eval_last(t).unwrap().to_vec();
            assert_eq!(batched.seq_pos(seq).unwrap(), alone[seq].pos(), "step {si}: sequence {seq}'s position");
            if logits {
                let row = rows.next().expect("a row per input that asks");
                let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
                worst = worst.max(max_abs_diff(&want, row) / scale);
            }
        }
        assert!(rows.next().is_none(), "step {si}: more rows than inputs asking");
    }
    worst
}

#[test]
fn batches_of_sequences_match_each_sequence_alone() {
    let fixtures = [
        ("b158-e512-tq2_0.gguf", 0.0),
        ("ds2-e128-f16.gguf", 0.0),
        ("llama-e256-q4_k.gguf", 1e-5),
        ("q3moe-e128-q8_0.gguf", 1e-5),
    ];
    let models = fixtures.iter().map(|&(f, bound)| (tern_testutil::compact_model(f), bound));
    for (model, bound) in std::iter::once((tern_testutil::demo_model(), 0.0)).chain(models) {
        let worst = compare(&model);
        eprintln!("{}: max |Δ| / max |logit| = {worst:.2e}", model.display());
        assert!(worst <= bound, "{}: {worst:e} > {bound:e}", model.display());
    }
}

#[test]
fn bad_batches_are_errors() {
    let mut s = Session::load(tern_testutil::demo_model(), &opts(2)).unwrap();
    let t = [1u32, 2, 3];
    let one = |seq, tokens: &'static [u32]| SeqInput { seq, tokens, logits: true };
    let e = |r: tern_engine::Result<&[f32]>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e(s.eval_seqs(&[])).contains("empty"));
    assert!(e(s.eval_seqs(&[one(2, &[1])])).contains("sequence 2 does not exist"));
    assert!(e(s.eval_seqs(&[one(1, &[1]), one(1, &[2])])).contains("twice"));
    assert!(e(s.eval_seqs(&[one(0, &[])])).contains("empty"));
    assert!(e(s.eval_seqs(&[one(1, &[99999])])).contains("outside the vocabulary"));
    let long = vec![1u32; N_CTX + 1];
    assert!(e(s.eval_seqs(&[SeqInput { seq: 1, tokens: &long, logits: false }])).contains("context is full"));
    // Nothing ran: both sequences are still empty, and then fill independently.
    assert_eq!((s.seq_pos(0).unwrap(), s.seq_pos(1).unwrap()), (0, 0));
    assert_eq!(s.eval_seqs(&[SeqInput { seq: 1, tokens: &t, logits: false }]).unwrap().len(), 0);
    assert_eq!((s.seq_pos(0).unwrap(), s.seq_pos(1).unwrap()), (0, 3));
    s.truncate_seq(1, 1).unwrap();
    assert_eq!(s.seq_pos(1).unwrap(), 1);
    assert!(s.truncate_seq(5, 0).is_err());
    let zero = LoadOptions { n_seqs: 0, ..opts(1) };
    assert!(Session::load(tern_testutil::demo_model(), &zero).err().unwrap().to_string().contains("at least one"));
}
