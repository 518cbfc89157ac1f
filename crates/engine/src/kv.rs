//! The KV cache: per layer one K and one V tensor `[width, n_ctx]` (f32, f16
//! or q8_0 rows; widths from `Config::kv_widths`: `head_dim * n_head_kv`, or
//! an MLA layer's latent and rope values in K and no V), allocated in the
//! buffers of the backend that is the layer's home.

use tern_backend::{BackendId, TensorLoc};
use tern_gguf::GgmlType;
use tern_models::{Config, KvSpec};
use tern_sched::Backends;

use crate::error::{Error, Result};

pub struct KvCache {
    pub spec: KvSpec,
    /// Per layer: (K, V).
    pub layers: Vec<(TensorLoc, TensorLoc)>,
}

impl KvCache {
    pub fn new(c: &Config, spec: KvSpec, homes: &[BackendId], backends: &mut Backends) -> Result<KvCache> {
        let (k_row, v_row) = c.kv_widths();
        let bytes = |ty: GgmlType, row: usize| -> Result<usize> {
            let b = ty.tensor_bytes(&[row as u64, spec.n_ctx as u64]).ok_or_else(|| {
                Error::KvType(format!("{ty}: a KV row of {row} is not whole {}-element blocks", ty.block_elems()))
            })?;
            Ok(b as usize)
        };
        let (kb, vb) = (bytes(spec.k_type, k_row)?, bytes(spec.v_type, v_row)?);
        let mut layers = Vec::with_capacity(c.n_layer);
        for home in homes {
            let b = backends.get_mut(*home)?;
            let mut alloc =
                |nbytes: usize| -> Result<TensorLoc> { Ok(TensorLoc { buffer: b.alloc(nbytes)?, offset: 0, nbytes }) };
            layers.push((alloc(kb)?, alloc(vb)?));
        }
        Ok(KvCache { spec, layers })
    }

    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|(k, v)| k.nbytes + v.nbytes).sum()
    }
}

/// Parses `-ctk`/`-ctv` names: f32, f16, q8_0.
pub fn parse_kv_type(s: &str) -> Option<GgmlType> {
    match s.to_ascii_lowercase().as_str() {
        "f32" => Some(GgmlType::F32),
        "f16" => Some(GgmlType::F16),
        "q8_0" => Some(GgmlType::Q8_0),
        _ => None,
    }
}
