//! The weights a model uses: found by name, shape-checked against the config,
//! and listed in a table that placement and backends index.

use tern_gguf::{File, GgmlType, TensorInfo};
use tern_graph::{HeadMatMul, RouteParams};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::names::TensorName;

/// A weight: its index in the [`WeightTable`], type and dims (`ne[0]` first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightRef {
    pub index: usize,
    pub ty: GgmlType,
    pub ne: [usize; 4],
}

/// Every weight the graph reads, in file order of first use.
#[derive(Clone, Debug, Default)]
pub struct WeightTable {
    pub entries: Vec<TensorInfo>,
}

impl WeightTable {
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|t| t.name.as_str())
    }
}

/// One transformer block: a normed attention and a normed FFN, each added
/// to the residual stream. Shapes are ggml order `[in, out]`.
#[derive(Clone, Debug)]
pub struct Layer {
    pub attn_norm: WeightRef, // [n_embd]
    pub attn: Attention,
    pub ffn_norm: WeightRef, // [n_embd]
    pub ffn: Ffn,
}

/// A block's attention.
#[derive(Clone, Debug)]
pub enum Attention {
    /// Grouped-query attention (multi-head when n_head_kv == n_head).
    Gqa(Gqa),
    /// Multi-head latent attention (DeepSeek-V2/V3), over a latent KV cache.
    Mla(Mla),
}

/// MLA's weights; dims from [`crate::config::MlaConfig`]: `dk = nope + rope`.
#[derive(Clone, Debug)]
pub struct Mla {
    pub q: MlaQuery,
    pub kv_a: WeightRef,      // [n_embd, rank + rope]
    pub kv_a_norm: WeightRef, // [rank]
    /// Per head `q_lat = K_b · q_nope`: `attn_k_b` `[nope, rank, n_head]`, or
    /// the k rows of `attn_kv_b` `[rank, n_head · (nope + v)]`, transposed.
    pub k_b: HeadProj,
    /// Per head `o = V_b · o_lat`: `attn_v_b` `[rank, v, n_head]`, or the v
    /// rows of `attn_kv_b`.
    pub v_b: HeadProj,
    pub wo: WeightRef, // [n_head * v, n_embd]
}

#[derive(Clone, Debug)]
pub enum MlaQuery {
    /// `attn_q` `[n_embd, n_head · dk]` (V2-Lite).
    Direct(WeightRef),
    /// `attn_q_b · norm(attn_q_a · h)`: `[n_embd, q_lora]`, `[q_lora]`, `[q_lora, n_head · dk]`.
    LowRank { a: WeightRef, norm: WeightRef, b: WeightRef },
}

/// A weight used per head, with which of its rows each head reads.
#[derive(Clone, Copy, Debug)]
pub struct HeadProj {
    pub w: WeightRef,
    pub mm: HeadMatMul,
}

#[derive(Clone, Debug)]
pub struct Gqa {
    pub wq: WeightRef,               // [n_embd, n_head * head_dim]
    pub wk: WeightRef,               // [n_embd, n_head_kv * head_dim]
    pub wv: WeightRef,               // [n_embd, n_head_kv * head_dim]
    pub wo: WeightRef,               // [n_head * head_dim, n_embd]
    pub q_norm: Option<WeightRef>,   // [head_dim] (Qwen3)
    pub k_norm: Option<WeightRef>,   // [head_dim] (Qwen3)
    pub sub_norm: Option<WeightRef>, // [n_head * head_dim] (BitNet)
    /// Output multipliers of q, k, v and o (1.0 unless the file has them).
    pub scales: [f32; 4],
}

/// A block's feed-forward network.
#[derive(Clone, Debug)]
pub enum Ffn {
    /// `down(act(gate·h) ⊙ up·h)`.
    Dense(DenseFfn),
    /// Routed experts, plus shared ones when the model has them.
    Moe(Box<MoeFfn>),
}

#[derive(Clone, Debug)]
pub struct MoeFfn {
    pub router: WeightRef,       // [n_embd, n_expert]
    pub bias: Option<WeightRef>, // [n_expert] (exp_probs_b: the choice only)
    pub gate: WeightRef,         // [n_embd, n_ff_exp, n_expert]
    pub up: WeightRef,           // [n_embd, n_ff_exp, n_expert]
    pub down: WeightRef,         // [n_ff_exp, n_embd, n_expert]
    /// Shared experts as one dense FFN `[n_embd, n_shared · n_ff_exp]`.
    pub shared: Option<DenseFfn>,
    pub route: RouteParams,
}

#[derive(Clone, Debug)]
pub struct DenseFfn {
    pub gate: WeightRef,             // [n_embd, n_ff]
    pub up: WeightRef,               // [n_embd, n_ff]
    pub down: WeightRef,             // [n_ff, n_embd]
    pub sub_norm: Option<WeightRef>, // [n_ff] (BitNet)
    /// Output multipliers of gate, up and down.
    pub scales: [f32; 3],
}

impl Layer {
    /// The weight whose type decides the model's precision (its first projection).
    pub fn first_projection(&self) -> WeightRef {
        match &self.attn {
            Attention::Gqa(a) => a.wq,
            Attention::Mla(Mla { q: MlaQuery::Direct(w), .. }) => *w,
            Attention::Mla(Mla { q: MlaQuery::LowRank { a, .. }, .. }) => *a,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Weights {
    pub table: WeightTable,
    pub token_embd: WeightRef,  // [n_embd, n_vocab]
    pub output_norm: WeightRef, // [n_embd]
    /// `output.weight`, or the tied `token_embd` when the file has none.
    pub output: WeightRef, // [n_embd, n_vocab]
    pub rope_freqs: Option<WeightRef>, // [n_rot / 2] (Llama 3.1 scaling)
    pub layers: Vec<Layer>,
}

impl Weights {
    /// True when the file has no `output.weight` and the head reads `token_embd`.
    pub fn output_is_tied(&self) -> bool {
        self.output.index == self.token_embd.index
    }
}

struct Loader<'a> {
    file: &'a File,
    table: WeightTable,
}

impl Loader<'_> {
    fn get(&mut self, name: TensorName, layer: Option<usize>, ne: &[usize]) -> Result<WeightRef> {
        let key = name.key(layer);
        self.find(&key, ne)?.ok_or(Error::MissingTensor { name: key })
    }

    fn find(&mut self, key: &str, ne: &[usize]) -> Result<Option<WeightRef>> {
        let Some(info) = self.file.tensor(key) else { return Ok(None) };
        let found: Vec<usize> = info.dims().iter().map(|&d| d as usize).collect();
        let trimmed = &found[..found.iter().rposition(|&d| d != 1).map_or(1, |p| p + 1).max(ne.len())];
        if trimmed != ne {
            return Err(Error::BadShape { name: key.to_string(), expected: ne.to_vec(), found });
        }
        let is_norm = ne.len() == 1;
        if is_norm && info.ty != GgmlType::F32 {
            return Err(Error::BadType { name: key.to_string(), ty: info.ty, expected: "F32" });
        }
        let index = match self.table.entries.iter().position(|t| t.name == key) {
            Some(i) => i,
            None => {
                self.table.entries.push(info.clone());
                self.table.entries.len() - 1
            }
        };
        let mut dims = [1usize; 4];
        dims[..ne.len()].copy_from_slice(ne);
        Ok(Some(WeightRef { index, ty: info.ty, ne: dims }))
    }

    /// A 1bitLLM scale tensor: one f32, or 1.0 when absent.
    fn scale(&self, name: TensorName, layer: usize) -> Result<f32> {
        let key = name.scale_key(layer);
        let Some(info) = self.file.tensor(&key) else { return Ok(1.0) };
        if info.ty != GgmlType::F32 || info.n_elements() != 1 {
            return Err(Error::BadType { name: key, ty: info.ty, expected: "F32 with one element" });
        }
        let b = self.file.tensor_data(info);
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

impl Weights {
    pub fn load(file: &File, c: &Config) -> Result<Weights> {
        use TensorName::*;
        let mut l = Loader { file, table: WeightTable::default() };
        let (e, v) = (c.n_embd, c.n_vocab);
        let token_embd = l.get(TokenEmbd, None, &[e, v])?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let attn_norm = l.get(AttnNorm, Some(i), &[e])?;
            let attn = match c.mla {
                Some(_) => Attention::Mla(l.mla(c, i)?),
                None => Attention::Gqa(l.gqa(c, i)?),
            };
            let ffn_norm = l.get(FfnNorm, Some(i), &[e])?;
            let ffn = match c.is_moe_layer(i) {
                true => Ffn::Moe(Box::new(l.moe(c, i)?)),
                false => Ffn::Dense(l.dense_ffn(c, i)?),
            };
            layers.push(Layer { attn_norm, attn, ffn_norm, ffn });
        }
        let output_norm = l.get(OutputNorm, None, &[e])?;
        let output = match l.find(&Output.key(None), &[e, v])? {
            Some(w) => w,
            None => token_embd,
        };
        let rope_freqs = l.find(&RopeFreqs.key(None), &[c.n_rot / 2])?;
        Ok(Weights { table: l.table, token_embd, output_norm, output, rope_freqs, layers })
    }
}

impl Loader<'_> {
    /// A weight the architecture has only when `present`.
    fn optional(&mut self, present: bool, name: TensorName, layer: usize, ne: &[usize]) -> Result<Option<WeightRef>> {
        if present {
            self.get(name, Some(layer), ne).map(Some)
        } else {
            Ok(None)
        }
    }

    fn proj_scale(&self, c: &Config, name: TensorName, layer: usize) -> Result<f32> {
        if c.arch.proj_scales {
            self.scale(name, layer)
        } else {
            Ok(1.0)
        }
    }

    fn gqa(&mut self, c: &Config, i: usize) -> Result<Gqa> {
        use TensorName::*;
        let (e, hd) = (c.n_embd, c.head_dim);
        let (q_dim, kv_dim) = (c.n_head * hd, c.n_head_kv * hd);
        let at = Some(i);
        Ok(Gqa {
            wq: self.get(AttnQ, at, &[e, q_dim])?,
            wk: self.get(AttnK, at, &[e, kv_dim])?,
            wv: self.get(AttnV, at, &[e, kv_dim])?,
            q_norm: self.optional(c.arch.qk_norm, AttnQNorm, i, &[hd])?,
            k_norm: self.optional(c.arch.qk_norm, AttnKNorm, i, &[hd])?,
            sub_norm: self.optional(c.arch.sub_norms, AttnSubNorm, i, &[q_dim])?,
            wo: self.get(AttnOutput, at, &[q_dim, e])?,
            scales: [
                self.proj_scale(c, AttnQ, i)?,
                self.proj_scale(c, AttnK, i)?,
                self.proj_scale(c, AttnV, i)?,
                self.proj_scale(c, AttnOutput, i)?,
            ],
        })
    }

    fn dense_ffn(&mut self, c: &Config, i: usize) -> Result<DenseFfn> {
        use TensorName::*;
        let (e, f, at) = (c.n_embd, c.n_ff, Some(i));
        Ok(DenseFfn {
            gate: self.get(FfnGate, at, &[e, f])?,
            up: self.get(FfnUp, at, &[e, f])?,
            sub_norm: self.optional(c.arch.sub_norms, FfnSubNorm, i, &[f])?,
            down: self.get(FfnDown, at, &[f, e])?,
            scales: [self.proj_scale(c, FfnGate, i)?, self.proj_scale(c, FfnUp, i)?, self.proj_scale(c, FfnDown, i)?],
        })
    }
}

impl Loader<'_> {
    fn mla(&mut self, c: &Config, i: usize) -> Result<Mla> {
        use TensorName::*;
        let m = c.mla.expect("an MLA architecture");
        let (e, h, at) = (c.n_embd, c.n_head, Some(i));
        let dk = m.nope + m.rope;
        let q = match m.q_lora {
            Some(r) => MlaQuery::LowRank {
                a: self.get(AttnQA, at, &[e, r])?,
                norm: self.get(AttnQANorm, at, &[r])?,
                b: self.get(AttnQB, at, &[r, h * dk])?,
            },
            None => MlaQuery::Direct(self.get(AttnQ, at, &[e, h * dk])?),
        };
        let kv_a = self.get(AttnKvAMqa, at, &[e, m.rank + m.rope])?;
        let kv_a_norm = self.get(AttnKvANorm, at, &[m.rank])?;
        let per_head = |w: WeightRef, stride: usize, offset: usize, len: usize, transposed: bool| HeadProj {
            w,
            mm: HeadMatMul { n_head: h, stride, offset, len, transposed },
        };
        let (k_b, v_b) = match self.file.tensor(&AttnKB.key(at)) {
            Some(_) => (
                per_head(self.get(AttnKB, at, &[m.nope, m.rank, h])?, m.rank, 0, m.rank, false),
                per_head(self.get(AttnVB, at, &[m.rank, m.v_dim, h])?, m.v_dim, 0, m.v_dim, false),
            ),
            None => {
                let kv_b = self.get(AttnKvB, at, &[m.rank, h * (m.nope + m.v_dim)])?;
                let stride = m.nope + m.v_dim;
                (per_head(kv_b, stride, 0, m.nope, true), per_head(kv_b, stride, m.nope, m.v_dim, false))
            }
        };
        let wo = self.get(AttnOutput, at, &[h * m.v_dim, e])?;
        Ok(Mla { q, kv_a, kv_a_norm, k_b, v_b, wo })
    }

    fn moe(&mut self, c: &Config, i: usize) -> Result<MoeFfn> {
        use TensorName::*;
        let m = c.moe.expect("an MoE architecture");
        let (e, f, n, at) = (c.n_embd, m.n_ff_exp, m.n_expert, Some(i));
        let router = self.get(FfnGateInp, at, &[e, n])?;
        let bias = self.find(&ExpProbsB.bias_key(i), &[n])?;
        let shared = match m.n_shared {
            0 => None,
            s => Some(DenseFfn {
                gate: self.get(FfnGateShexp, at, &[e, s * f])?,
                up: self.get(FfnUpShexp, at, &[e, s * f])?,
                down: self.get(FfnDownShexp, at, &[s * f, e])?,
                sub_norm: None,
                scales: [1.0; 3],
            }),
        };
        Ok(MoeFfn {
            router,
            bias,
            gate: self.get(FfnGateExps, at, &[e, f, n])?,
            up: self.get(FfnUpExps, at, &[e, f, n])?,
            down: self.get(FfnDownExps, at, &[f, e, n])?,
            shared,
            route: RouteParams { biased: bias.is_some(), ..m.route },
        })
    }
}
