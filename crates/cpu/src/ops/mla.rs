//! Multi-head latent attention's ops: a head's slice of a row, products with
//! per-head blocks of weight rows (the absorbed key and value projections),
//! and attention over the latent cache.

use tern_graph::{HeadMatMul, LatentAttentionParams, Precision};
use tern_quant::ternary::rows;

use super::attention::Cache;
use super::matmul::{weight_type, Acts, RowDot};
use super::{Ctx, Tensor};

/// [`tern_graph::Op::Columns`].
pub fn columns(x: &[f32], width: usize, start: usize, len: usize, y: &mut [f32]) {
    for (piece, out) in x.chunks_exact(width).zip(y.chunks_exact_mut(len)) {
        out.copy_from_slice(&piece[start..start + len]);
    }
}

/// A weight's rows as f32, whatever its storage (file bytes or repacked ternary).
struct Widen<'w> {
    w: &'w Tensor<'w>,
    file: Option<RowDot<'w>>,
}

impl<'w> Widen<'w> {
    fn new(w: &'w Tensor<'w>, cx: &Ctx) -> Widen<'w> {
        let (k, rows) = (w.node.ne[0], w.node.n_rows());
        let file =
            w.packed.is_none().then(|| RowDot::new(weight_type(w), w.bytes(), k, k * rows, Precision::Float, cx));
        Widen { w, file }
    }

    fn row(&self, j: usize, out: &mut [f32]) {
        match (&self.file, self.w.packed) {
            (Some(d), _) => d.widen(j, out),
            (None, Some(p)) => {
                let mut values = vec![0i8; p.layout.k_pad];
                rows::unpack_row(&p.layout, p.row(j), &mut values);
                let s = p.row_scales(j);
                for (i, (o, &v)) in out.iter_mut().zip(&values).enumerate() {
                    *o = v as f32 * s[i / p.layout.group()];
                }
            }
            (None, None) => unreachable!("a weight is file bytes or packed"),
        }
    }
}

struct Out(*mut f32);
// SAFETY: each head's outputs are written by one thread only.
unsafe impl Sync for Out {}

/// [`tern_graph::Op::MulMatHeads`]: `x [k_in · n_head, n]` → `y [k_out · n_head, n]`.
pub fn mul_mat_heads(w: &Tensor, x: &[f32], mm: &HeadMatMul, precision: Precision, y: &mut [f32], cx: &Ctx) {
    let (kd, h) = (w.node.ne[0], mm.n_head);
    let first = |head: usize| head * mm.stride + mm.offset;
    let out = Out(y.as_mut_ptr());
    if mm.transposed {
        // y_h = Σ_i x_h[i] · row_i: each row widened once for every token.
        let n = x.len() / (mm.len * h);
        y.fill(0.0);
        let widen = Widen::new(w, cx);
        let out = &out;
        cx.pool.for_chunks(h, 1, |heads| {
            let mut row = vec![0f32; kd];
            for head in heads {
                for i in 0..mm.len {
                    widen.row(first(head) + i, &mut row);
                    for t in 0..n {
                        let a = x[(t * h + head) * mm.len + i];
                        // SAFETY: head `head`'s outputs belong to this thread.
                        let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add((t * h + head) * kd), kd) };
                        dst.iter_mut().zip(&row).for_each(|(d, r)| *d += a * r);
                    }
                }
            }
        });
        return;
    }
    let n = x.len() / (kd * h);
    // Paired activations need whole blocks; a head slice that is not gets float.
    let paired = precision == Precision::Paired
        && w.packed.is_none()
        && kd.is_multiple_of(tern_quant::act_type(weight_type(w)).block_elems());
    if !paired {
        let widen = Widen::new(w, cx);
        let out = &out;
        return cx.pool.for_chunks(h, 1, |heads| {
            let mut row = vec![0f32; kd];
            for head in heads {
                for i in 0..mm.len {
                    widen.row(first(head) + i, &mut row);
                    for t in 0..n {
                        let xs = &x[(t * h + head) * kd..][..kd];
                        let v: f64 = xs.iter().zip(&row).map(|(a, b)| *a as f64 * *b as f64).sum();
                        // SAFETY: as above.
                        unsafe { *out.0.add((t * h + head) * mm.len + i) = v as f32 };
                    }
                }
            }
        });
    }
    let dot = RowDot::new(weight_type(w), w.bytes(), kd, kd * w.node.n_rows(), precision, cx);
    let acts = Acts::quantize(dot.act, x, kd, cx);
    let out = &out;
    cx.pool.for_chunks(h, 1, |heads| {
        for head in heads {
            for i in 0..mm.len {
                let wr = dot.row(first(head) + i);
                for t in 0..n {
                    // SAFETY: as above.
                    unsafe { *out.0.add((t * h + head) * mm.len + i) = dot.dot(wr, &acts, t * h + head) };
                }
            }
        }
    });
}

/// Cache positions per block: rows widened once per block serve every head of a task.
const POSITIONS: usize = 64;

/// [`tern_graph::Op::LatentAttention`].
///
/// # Safety
/// `srcs[4]` is the layer's cache, not aliased by any other view in use.
pub unsafe fn latent_attention(srcs: &[Tensor], p: &LatentAttentionParams, y: &mut [f32], cx: &Ctx) {
    let (q_lat, q_pe, c, k_pe) = (srcs[0].f32(), srcs[1].f32(), srcs[2].f32(), srcs[3].f32());
    let cache = Cache::new(&srcs[4]);
    let (r, dr, h) = (p.rank, p.rope, p.n_head);
    let width = r + dr;
    let n = c.len() / r;
    let mut row = vec![0f32; width];
    for t in 0..n {
        row[..r].copy_from_slice(&c[t * r..(t + 1) * r]);
        row[r..].copy_from_slice(&k_pe[t * dr..(t + 1) * dr]);
        cache.store(p.kv_pos + t, &row);
    }
    let out = &Out(y.as_mut_ptr());
    let isa = cx.isa;
    // Tasks are (token, run of heads): a decoding step still spreads its
    // heads over the threads.
    let per_task = h.div_ceil((2 * cx.pool.threads()).div_ceil(n).max(1)).max(1);
    let runs = h.div_ceil(per_task);
    cx.pool.for_chunks_claimed(n * runs, 1, |tasks| {
        let mut keys = vec![0f32; POSITIONS * width];
        for task in tasks {
            let (t, heads) = (task / runs, (task % runs) * per_task..((task % runs + 1) * per_task).min(h));
            let queries: Vec<Vec<f32>> = heads
                .clone()
                .map(|hd| [&q_lat[(t * h + hd) * r..][..r], &q_pe[(t * h + hd) * dr..][..dr]].concat())
                .collect();
            let mut state: Vec<Softmax> = heads.clone().map(|_| Softmax::new(r)).collect();
            let visible = p.kv_pos + t + 1;
            for start in (0..visible).step_by(POSITIONS) {
                let n_pos = POSITIONS.min(visible - start);
                for j in 0..n_pos {
                    cache.load(start + j, 0, &mut keys[j * width..(j + 1) * width], isa);
                }
                let mut scores = [0f32; POSITIONS];
                for (q, st) in queries.iter().zip(&mut state) {
                    for (s, key) in scores[..n_pos].iter_mut().zip(keys.chunks_exact(width)) {
                        *s = p.scale * dot(q, key);
                    }
                    st.add(&scores[..n_pos], &keys, width, r);
                }
            }
            for (hd, st) in heads.zip(&state) {
                // SAFETY: token t's heads of this run belong to this task.
                let dst = std::slice::from_raw_parts_mut(out.0.add((t * h + hd) * r), r);
                st.write(dst);
            }
        }
    });
}

/// One query's online softmax over positions, accumulating the latents.
struct Softmax {
    max: f32,
    sum: f32,
    acc: Vec<f32>,
}

impl Softmax {
    fn new(r: usize) -> Softmax {
        Softmax { max: f32::NEG_INFINITY, sum: 0.0, acc: vec![0.0; r] }
    }

    /// Folds in a block of scores; `keys` holds the block's rows of `width`,
    /// whose first `r` values are the latents.
    fn add(&mut self, scores: &[f32], keys: &[f32], width: usize, r: usize) {
        let m = scores.iter().copied().fold(self.max, f32::max);
        let rescale = (self.max - m).exp();
        self.sum *= rescale;
        self.acc.iter_mut().for_each(|a| *a *= rescale);
        for (&s, key) in scores.iter().zip(keys.chunks_exact(width)) {
            let w = (s - m).exp();
            self.sum += w;
            self.acc.iter_mut().zip(&key[..r]).for_each(|(a, k)| *a += w * k);
        }
        self.max = m;
    }

    fn write(&self, out: &mut [f32]) {
        let inv = 1.0 / self.sum;
        out.iter_mut().zip(&self.acc).for_each(|(o, a)| *o = a * inv);
    }
}

/// A dot product in eight f32 lanes.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}
