//! `tern quantize IN OUT TYPE`: rewrite a model with its matrices in another
//! type. TYPE is either one of llama-quantize's presets (`Q4_K_M`, `Q3_K_M`,
//! `IQ4_XS`, `Q6_K`, `Q8_0`, ...: the mix of types per tensor that mainline's
//! llama-quantize picks, `quantize_presets`), or a plain type (`TQ2_0`,
//! `Q4_0`, `Q4_K`, ...) for every matrix, where norms and other vectors stay
//! F32 and the token embedding and the output head get their own types (Q6_K
//! by default below 8 bits). Ternary targets are exact on ternary-valued
//! weights.

use std::borrow::Cow;
use std::path::PathBuf;

use tern_gguf::{File, GgmlType, TensorInfo, Value, Writer, WriterTensor};
use tern_quant::TensorScale;

use crate::quantize_presets::{self as presets, ModelFacts, Overrides, Pick, Preset};
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Input GGUF.
    pub input: PathBuf,
    /// Output GGUF (written atomically).
    pub output: PathBuf,
    /// A llama-quantize preset (Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_XS,
    /// Q8_0), or a type for every matrix (e.g. TQ2_0, TQ1_0, I2_S, IQ2_BN, IQ1_BN, Q5_1, Q5_0, Q4_1, Q4_0,
    /// Q4_K, Q3_K, IQ4_NL, F16). Case-insensitive.
    pub ty: String,
    /// Type of token_embd.weight.
    #[arg(long = "token-embedding-type")]
    pub token_embedding_type: Option<String>,
    /// Type of output.weight.
    #[arg(long = "output-tensor-type")]
    pub output_tensor_type: Option<String>,
    /// Quantize every matrix, embedding and head included, to TYPE (with a preset: its base type, no mix).
    #[arg(long)]
    pub pure: bool,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
}

fn unknown_type(s: &str) -> CliError {
    let names: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
    CliError(format!("unknown type {s:?}; valid types: {}", names.join(", ")))
}

fn parse_type(s: &str) -> Result<GgmlType, CliError> {
    GgmlType::from_name(s).ok_or_else(|| unknown_type(s))
}

/// What TYPE names: a preset first (Q6_K and Q8_0 are both), else a type.
enum Target {
    Preset(Preset),
    Type(GgmlType),
}

fn parse_target(s: &str) -> Result<Target, CliError> {
    if let Some(p) = Preset::from_name(s) {
        return Ok(Target::Preset(p));
    }
    GgmlType::from_name(s).map(Target::Type).ok_or_else(|| {
        let presets: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
        let names: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        CliError(format!(
            "unknown type {s:?}; valid presets: {}; valid types: {}",
            presets.join(", "),
            names.join(", ")
        ))
    })
}

struct Choice {
    embd: GgmlType,
    output: GgmlType,
    target: GgmlType,
    pure: bool,
}

impl Choice {
    /// The type tensor `t` is written as.
    fn for_tensor(&self, t: &TensorInfo) -> GgmlType {
        let is_matrix = t.n_dims >= 2 && t.ne[1] > 1;
        // The MoE router stays as it is, as llama-quantize leaves it: its
        // logits pick the experts, and near-ties would flip on rounding.
        if !is_matrix
            || t.name.ends_with("_norm.weight")
            || t.name.ends_with(".scale")
            || t.name.ends_with("ffn_gate_inp.weight")
        {
            return t.ty;
        }
        let want = match t.name.as_str() {
            "token_embd.weight" if !self.pure => self.embd,
            "output.weight" if !self.pure => self.output,
            _ => self.target,
        };
        // A row that is not a whole number of blocks cannot take the type.
        if want.row_bytes(t.ne[0]).is_some() {
            want
        } else {
            GgmlType::F16
        }
    }
}

pub fn main(a: Args) -> Result<(), CliError> {
    let target = parse_target(&a.ty)?;
    let file = File::open(&a.input).map_err(|e| CliError(format!("{}: {e}", a.input.display())))?;
    let (types, file_type) = match target {
        Target::Preset(p) => (preset_types(p, &file, &a)?, Some(p.file_type())),
        Target::Type(t) => (plain_types(t, &file, &a)?, t.file_type()),
    };
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);

    let mut md = file.metadata.clone();
    match file_type {
        Some(ft) => md.set("general.file_type", Value::U32(ft)),
        None => drop(md.remove("general.file_type")),
    }
    md.set("general.quantization_version", Value::U32(2));
    let mut writer = Writer::new(md);
    for (t, &ty) in file.tensors.iter().zip(&types) {
        writer.tensors.push(WriterTensor { name: t.name.clone(), ty, dims: t.dims().to_vec() });
    }
    let started = std::time::Instant::now();
    writer
        .write_to_path(&a.output, |i| {
            let t = &file.tensors[i];
            let data = file.tensor_data(t);
            if types[i] == t.ty {
                return Ok(Cow::Borrowed(data));
            }
            eprintln!("  {:<36} {:>7} -> {:<7} {}", t.name, t.ty.name(), types[i].name(), super::info::shape_of(t));
            Ok(Cow::Owned(convert(t, data, types[i], threads)))
        })
        .map_err(|e| CliError(format!("{}: {e}", a.output.display())))?;
    eprintln!("wrote {} in {:.1} s", a.output.display(), started.elapsed().as_secs_f64());
    Ok(())
}

/// Every tensor's type under tern's own rule for a plain type.
fn plain_types(target: GgmlType, file: &File, a: &Args) -> Result<Vec<GgmlType>, CliError> {
    let high = matches!(target, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0);
    let default_side = if high { target } else { GgmlType::Q6_K };
    let output = a.output_tensor_type.as_deref().map(parse_type).transpose()?.unwrap_or(default_side);
    let tied = file.tensor("output.weight").is_none();
    // A tied embedding is also the head, so it takes the head's type.
    let embd = match a.token_embedding_type.as_deref() {
        Some(s) => parse_type(s)?,
        None if tied => output,
        None => default_side,
    };
    let choice = Choice { embd, output, target, pure: a.pure };
    Ok(file.tensors.iter().map(|t| choice.for_tensor(t)).collect())
}

/// Every tensor's type under llama-quantize's preset `p`.
fn preset_types(p: Preset, file: &File, a: &Args) -> Result<Vec<GgmlType>, CliError> {
    let side = |s: Option<&str>| -> Result<Option<GgmlType>, CliError> {
        s.map(|s| GgmlType::from_name(s).ok_or_else(|| unknown_type(s))).transpose()
    };
    let over = Overrides {
        token_embd: side(a.token_embedding_type.as_deref())?,
        output: side(a.output_tensor_type.as_deref())?,
        pure: a.pure,
    };
    let facts = ModelFacts::of(&file.metadata).map_err(|e| CliError(format!("{}: {e}", a.input.display())))?;
    let tensors: Vec<presets::Tensor> =
        file.tensors.iter().map(|t| presets::Tensor { name: &t.name, dims: t.dims() }).collect();
    let picks = presets::choose(p, &facts, &tensors, over)
        .map_err(|e| CliError(format!("{}: preset {}: {e}", a.input.display(), p.name())))?;
    Ok(file
        .tensors
        .iter()
        .zip(&picks)
        .map(|(t, pick)| match *pick {
            Pick::Keep => t.ty,
            Pick::To(ty) => ty,
        })
        .collect())
}

/// Dequantizes `t` row by row and requantizes it as `to`.
fn convert(t: &TensorInfo, data: &[u8], to: GgmlType, threads: usize) -> Vec<u8> {
    let k = t.ne[0] as usize;
    let rows = (t.n_elements() / t.ne[0]) as usize;
    let scale = TensorScale::of(t.ty, data, k * rows);
    let in_row = t.ty.row_bytes(t.ne[0]).expect("validated by the reader") as usize;
    let dequant =
        |r: usize, out: &mut [f32]| tern_quant::dequantize_row(t.ty, &data[r * in_row..(r + 1) * in_row], scale, out);
    if to == GgmlType::I2_S {
        // I2_S has one scale for the whole tensor, so it quantizes the whole tensor.
        let mut all = vec![0f32; k * rows];
        for (r, out) in all.chunks_exact_mut(k).enumerate() {
            dequant(r, out);
        }
        let mut bytes = vec![0u8; to.tensor_bytes(&t.ne).expect("checked by for_tensor") as usize];
        tern_quant::quantize_i2s_tensor(&all, &mut bytes);
        return bytes;
    }
    let out_row = to.row_bytes(t.ne[0]).expect("checked by for_tensor") as usize;
    let mut bytes = vec![0u8; out_row * rows];
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (c, chunk) in bytes.chunks_mut(per * out_row).enumerate() {
            let dequant = &dequant;
            s.spawn(move || {
                let mut row = vec![0f32; k];
                for (i, out) in chunk.chunks_exact_mut(out_row).enumerate() {
                    dequant(c * per + i, &mut row);
                    tern_quant::quantize_row(to, &row, out);
                }
            });
        }
    });
    bytes
}
