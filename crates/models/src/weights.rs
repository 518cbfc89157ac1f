//! The weights a model uses: found by name, shape-checked against the config,
//! and listed in a table that placement and backends index.

use tern_gguf::{File, GgmlType, TensorInfo};

use crate::config::{Arch, Config};
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

/// One transformer block. Shapes are ggml order `[in, out]`.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: WeightRef,             // [n_embd]
    pub wq: WeightRef,                    // [n_embd, n_head * head_dim]
    pub wk: WeightRef,                    // [n_embd, n_head_kv * head_dim]
    pub wv: WeightRef,                    // [n_embd, n_head_kv * head_dim]
    pub wo: WeightRef,                    // [n_head * head_dim, n_embd]
    pub attn_sub_norm: Option<WeightRef>, // [n_head * head_dim] (BitNet)
    pub ffn_norm: WeightRef,              // [n_embd]
    pub w_gate: WeightRef,                // [n_embd, n_ff]
    pub w_up: WeightRef,                  // [n_embd, n_ff]
    pub w_down: WeightRef,                // [n_ff, n_embd]
    pub ffn_sub_norm: Option<WeightRef>,  // [n_ff] (BitNet)
    /// 1bitLLM per-weight output scales (`blk.N.*.scale`), 1.0 when absent.
    pub scales: ProjScales,
}

/// Output multipliers of the seven projections of a block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProjScales {
    pub q: f32,
    pub k: f32,
    pub v: f32,
    pub o: f32,
    pub gate: f32,
    pub up: f32,
    pub down: f32,
}

#[derive(Clone, Debug)]
pub struct Weights {
    pub table: WeightTable,
    pub token_embd: WeightRef,  // [n_embd, n_vocab]
    pub output_norm: WeightRef, // [n_embd]
    /// `output.weight`, or the tied `token_embd` when the file has none.
    pub output: WeightRef, // [n_embd, n_vocab]
    pub rope_freqs: Option<WeightRef>, // [n_rot / 2] (Llama 3.1 scaling)
    pub layers: Vec<LayerWeights>,
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
        let (e, v, f) = (c.n_embd, c.n_vocab, c.n_ff);
        let (q_dim, kv_dim) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let token_embd = l.get(TokenEmbd, None, &[e, v])?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let at = Some(i);
            let sub = |l: &mut Loader, name, n| if c.sub_norms { l.get(name, at, &[n]).map(Some) } else { Ok(None) };
            let scales = match c.arch {
                Arch::BitNet => ProjScales {
                    q: l.scale(AttnQ, i)?,
                    k: l.scale(AttnK, i)?,
                    v: l.scale(AttnV, i)?,
                    o: l.scale(AttnOutput, i)?,
                    gate: l.scale(FfnGate, i)?,
                    up: l.scale(FfnUp, i)?,
                    down: l.scale(FfnDown, i)?,
                },
                Arch::Llama => ProjScales { q: 1.0, k: 1.0, v: 1.0, o: 1.0, gate: 1.0, up: 1.0, down: 1.0 },
            };
            layers.push(LayerWeights {
                attn_norm: l.get(AttnNorm, at, &[e])?,
                wq: l.get(AttnQ, at, &[e, q_dim])?,
                wk: l.get(AttnK, at, &[e, kv_dim])?,
                wv: l.get(AttnV, at, &[e, kv_dim])?,
                attn_sub_norm: sub(&mut l, AttnSubNorm, q_dim)?,
                wo: l.get(AttnOutput, at, &[q_dim, e])?,
                ffn_norm: l.get(FfnNorm, at, &[e])?,
                w_gate: l.get(FfnGate, at, &[e, f])?,
                w_up: l.get(FfnUp, at, &[e, f])?,
                ffn_sub_norm: sub(&mut l, FfnSubNorm, f)?,
                w_down: l.get(FfnDown, at, &[f, e])?,
                scales,
            });
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
