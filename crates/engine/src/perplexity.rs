//! Perplexity the way llama.cpp's `perplexity` tool measures it: the text is
//! tokenized once (with BOS), cut into non-overlapping chunks of `n_ctx`
//! tokens whose first token is replaced by BOS, and only the second half of
//! each chunk is scored, so every scored token sees at least `n_ctx / 2` of
//! context. The KL-divergence mode compares a model's token distributions
//! with those saved from a base model on the same chunks.

use std::io::{Read, Write};
use std::path::Path;

use half::f16;

use crate::error::{Error, Result};
use crate::session::{Logits, Session};

/// Running sums over scored tokens.
#[derive(Clone, Debug, Default)]
pub struct NllStats {
    pub count: usize,
    sum: f64,
    sum_sq: f64,
}

impl NllStats {
    fn push(&mut self, nll: f64) {
        self.count += 1;
        self.sum += nll;
        self.sum_sq += nll * nll;
    }

    pub fn ppl(&self) -> f64 {
        (self.sum / self.count.max(1) as f64).exp()
    }

    /// Standard error of the PPL estimate (delta method on the mean NLL).
    pub fn ppl_error(&self) -> f64 {
        let n = self.count as f64;
        if n < 2.0 {
            return 0.0;
        }
        let mean = self.sum / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0);
        self.ppl() * (var / (n - 1.0)).sqrt()
    }
}

/// `log_softmax(row)` in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    row.iter().map(|&v| v as f64 - lse).collect()
}

/// The chunk plan for `n_tokens` of text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunking {
    pub n_ctx: usize,
    pub n_chunks: usize,
}

impl Chunking {
    /// `max_chunks` = 0 means as many as the text holds.
    pub fn new(n_tokens: usize, n_ctx: usize, max_chunks: usize) -> Result<Chunking> {
        let available = n_tokens / n_ctx.max(1);
        if n_ctx < 4 || available == 0 {
            return Err(Error::Perplexity(format!(
                "the text has {n_tokens} tokens; at least one chunk of {n_ctx} (and a context of 4 or more) is needed"
            )));
        }
        let n_chunks = if max_chunks == 0 { available } else { available.min(max_chunks) };
        Ok(Chunking { n_ctx, n_chunks })
    }

    /// First scored row of a chunk; rows `first..n_ctx-1` predict the next token.
    pub fn first(&self) -> usize {
        self.n_ctx / 2
    }

    pub fn scored_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.first()
    }
}

/// Evaluates chunk `c` of `tokens` and returns the log-probabilities of its
/// scored rows (`scored_per_chunk` rows of `n_vocab`).
pub fn chunk_log_probs(
    session: &mut Session,
    tokens: &[u32],
    plan: Chunking,
    c: usize,
    bos: u32,
) -> Result<Vec<Vec<f64>>> {
    let mut chunk = tokens[c * plan.n_ctx..(c + 1) * plan.n_ctx].to_vec();
    chunk[0] = bos;
    session.reset();
    let logits = session.eval(&chunk, Logits::All)?;
    let n_vocab = session.n_vocab();
    Ok((plan.first()..plan.n_ctx - 1).map(|j| log_softmax(&logits[j * n_vocab..(j + 1) * n_vocab])).collect())
}

/// Adds the NLL of chunk `c`'s scored tokens.
pub fn score_chunk(stats: &mut NllStats, rows: &[Vec<f64>], tokens: &[u32], plan: Chunking, c: usize) {
    for (i, lp) in rows.iter().enumerate() {
        let target = tokens[c * plan.n_ctx + plan.first() + i + 1] as usize;
        stats.push(-lp[target]);
    }
}

const KLD_MAGIC: &[u8; 8] = b"TERNKLD1";

/// Base log-probabilities saved by `--kl-divergence-base`: a header naming
/// the chunking and the tokens, then f16 log-probs of every scored row.
pub struct KldWriter {
    file: std::io::BufWriter<std::fs::File>,
    tmp: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl KldWriter {
    pub fn create(path: &Path, plan: Chunking, n_vocab: usize, tokens: &[u32]) -> Result<KldWriter> {
        let tmp = path.with_extension("tern-tmp");
        let io = |e: std::io::Error| Error::Perplexity(format!("{}: {e}", path.display()));
        let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
        let used = &tokens[..plan.n_chunks * plan.n_ctx];
        let mut header = Vec::new();
        header.extend_from_slice(KLD_MAGIC);
        for v in [plan.n_ctx, n_vocab, plan.n_chunks, used.len()] {
            header.extend_from_slice(&(v as u32).to_le_bytes());
        }
        for t in used {
            header.extend_from_slice(&t.to_le_bytes());
        }
        file.write_all(&header).map_err(io)?;
        Ok(KldWriter { file, tmp, path: path.to_path_buf() })
    }

    pub fn push(&mut self, rows: &[Vec<f64>]) -> Result<()> {
        let mut bytes = Vec::with_capacity(rows.len() * rows.first().map_or(0, Vec::len) * 2);
        for row in rows {
            for &v in row {
                bytes.extend_from_slice(&f16::from_f64(v).to_bits().to_le_bytes());
            }
        }
        self.file.write_all(&bytes).map_err(|e| Error::Perplexity(format!("{}: {e}", self.path.display())))
    }

    /// Flushes and moves the file into place (nothing half-written is left on error).
    pub fn finish(self) -> Result<()> {
        let io = |e: std::io::Error| Error::Perplexity(format!("{}: {e}", self.path.display()));
        let file = self.file.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&self.tmp, &self.path).map_err(io)
    }
}

/// Reader for a base file, checked against the current run.
pub struct KldReader {
    file: std::io::BufReader<std::fs::File>,
    n_vocab: usize,
    path: std::path::PathBuf,
}

impl KldReader {
    pub fn open(path: &Path, plan: Chunking, n_vocab: usize, tokens: &[u32]) -> Result<KldReader> {
        let err = |m: String| Error::Perplexity(format!("{}: {m}", path.display()));
        let f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
        let mut file = std::io::BufReader::new(f);
        let mut head = [0u8; 24];
        file.read_exact(&mut head).map_err(|_| err("not a tern KL-divergence base file".into()))?;
        if &head[..8] != KLD_MAGIC {
            return Err(err("not a tern KL-divergence base file".into()));
        }
        let word = |i: usize| u32::from_le_bytes(head[8 + 4 * i..12 + 4 * i].try_into().expect("4 bytes")) as usize;
        let (ctx, vocab, chunks, n_tok) = (word(0), word(1), word(2), word(3));
        if ctx != plan.n_ctx || vocab != n_vocab || chunks < plan.n_chunks {
            return Err(err(format!(
                "base has ctx {ctx}, vocab {vocab}, {chunks} chunks; this run has ctx {}, vocab {n_vocab}, {} chunks",
                plan.n_ctx, plan.n_chunks
            )));
        }
        let mut raw = vec![0u8; n_tok * 4];
        file.read_exact(&mut raw).map_err(|_| err("truncated token list".into()))?;
        let base_tokens: Vec<u32> = raw.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let used = plan.n_chunks * plan.n_ctx;
        if base_tokens.len() < used || base_tokens[..used] != tokens[..used] {
            return Err(err("the base was computed on different tokens (another text or tokenizer)".into()));
        }
        Ok(KldReader { file, n_vocab, path: path.to_path_buf() })
    }

    /// The next chunk's base rows.
    pub fn next_chunk(&mut self, rows: usize) -> Result<Vec<Vec<f64>>> {
        let mut raw = vec![0u8; rows * self.n_vocab * 2];
        self.file
            .read_exact(&mut raw)
            .map_err(|_| Error::Perplexity(format!("{}: truncated log-probabilities", self.path.display())))?;
        let vals: Vec<f64> =
            raw.chunks_exact(2).map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64()).collect();
        Ok(vals.chunks_exact(self.n_vocab).map(<[f64]>::to_vec).collect())
    }
}

/// KL(base ‖ model) and top-1 agreement, accumulated over scored rows.
#[derive(Clone, Debug, Default)]
pub struct KldStats {
    pub rows: usize,
    kl_sum: f64,
    kl_sq: f64,
    same_top: usize,
    pub base: NllStats,
}

impl KldStats {
    /// `base` and `ours` are log-probs of one row; `target` the true next token.
    pub fn push(&mut self, base: &[f64], ours: &[f64], target: usize) {
        let kl: f64 = base.iter().zip(ours).map(|(b, o)| b.exp() * (b - o)).sum();
        self.rows += 1;
        self.kl_sum += kl;
        self.kl_sq += kl * kl;
        let top = |r: &[f64]| (0..r.len()).fold(0, |best, i| if r[i] > r[best] { i } else { best });
        self.same_top += (top(base) == top(ours)) as usize;
        self.base.push(-base[target]);
    }

    pub fn mean_kl(&self) -> (f64, f64) {
        let n = self.rows.max(1) as f64;
        let mean = self.kl_sum / n;
        let var = (self.kl_sq / n - mean * mean).max(0.0);
        (mean, (var / (n - 1.0).max(1.0)).sqrt())
    }

    pub fn same_top(&self) -> (f64, f64) {
        let n = self.rows.max(1) as f64;
        let p = self.same_top as f64 / n;
        (p, (p * (1.0 - p) / (n - 1.0).max(1.0)).sqrt())
    }
}
