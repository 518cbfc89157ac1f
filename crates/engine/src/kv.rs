//! The KV cache: per layer one K and one V tensor `[head_dim * n_head_kv,
//! n_ctx]`, allocated in the buffers of the backend that is the layer's home.

use tern_backend::{BackendId, TensorLoc};
use tern_gguf::GgmlType;
use tern_models::{Config, KvSpec};
use tern_sched::Backends;

use crate::error::Result;

pub struct KvCache {
    pub spec: KvSpec,
    /// Per layer: (K, V).
    pub layers: Vec<(TensorLoc, TensorLoc)>,
}

impl KvCache {
    pub fn new(c: &Config, spec: KvSpec, homes: &[BackendId], backends: &mut Backends) -> Result<KvCache> {
        let row = c.head_dim * c.n_head_kv;
        let bytes = spec.dtype.tensor_bytes(&[row as u64, spec.n_ctx as u64]).expect("f32/f16 rows") as usize;
        let mut layers = Vec::with_capacity(c.n_layer);
        for home in homes {
            let b = backends.get_mut(*home)?;
            let mut half =
                || -> Result<TensorLoc> { Ok(TensorLoc { buffer: b.alloc(bytes)?, offset: 0, nbytes: bytes }) };
            layers.push((half()?, half()?));
        }
        Ok(KvCache { spec, layers })
    }

    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|(k, v)| k.nbytes + v.nbytes).sum()
    }
}

/// Parses `-ctk`/`-ctv` style names.
pub fn parse_kv_type(s: &str) -> Option<GgmlType> {
    match s.to_ascii_lowercase().as_str() {
        "f32" => Some(GgmlType::F32),
        "f16" => Some(GgmlType::F16),
        _ => None,
    }
}
