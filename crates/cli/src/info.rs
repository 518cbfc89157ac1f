//! `tern info`: metadata, the tensor table with totals, and (with `--plan`)
//! where every weight and node goes and why.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tern_gguf::{File, GgmlType};

use crate::json;
use crate::run::ModelArgs;
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also print the placement plan (weights, node assignment, splits, copies).
    #[arg(long)]
    pub plan: bool,
    /// Plan for these GPUs instead of the ones found: CUDA0=80GiB[,CUDA1=24GiB...].
    #[arg(long, value_name = "NAME=SIZE,...")]
    pub devices: Option<String>,
}

struct TypeTotal {
    tensors: usize,
    elements: u64,
    bytes: u64,
}

fn totals(file: &File) -> BTreeMap<GgmlType, TypeTotal> {
    let mut by_type = BTreeMap::new();
    for t in &file.tensors {
        let e = by_type.entry(t.ty).or_insert(TypeTotal { tensors: 0, elements: 0, bytes: 0 });
        e.tensors += 1;
        e.elements += t.n_elements();
        e.bytes += t.nbytes;
    }
    by_type
}

fn shape(dims: &[u64]) -> String {
    dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" x ")
}

pub fn shape_of(t: &tern_gguf::TensorInfo) -> String {
    shape(t.dims())
}

/// `general.file_type` with llama.cpp's name for it (the llama-quantize
/// preset that writes it, e.g. `Q4_K_M (15)`), if the key is there.
fn file_type(file: &File) -> Option<String> {
    let ft = file.metadata.get("general.file_type")?.as_i64()?;
    // Microsoft's fork gave I2_S files the id mainline later gave Q1_0.
    let i2s = ft == 40 && file.tensors.iter().any(|t| t.ty == GgmlType::I2_S);
    let name =
        if i2s { Some("I2_S") } else { u64::try_from(ft).ok().and_then(crate::quantize_presets::file_type_name) };
    Some(match name {
        Some(n) => format!("{n} ({ft})"),
        None => format!("{ft}"),
    })
}

fn bpw(bytes: u64, elements: u64) -> f64 {
    bytes as f64 * 8.0 / elements.max(1) as f64
}

pub fn main(a: Args) -> Result<(), CliError> {
    let path: &PathBuf = &a.model.path()?;
    let file = File::open(path).map_err(|e| CliError(format!("{}: {e}", path.display())))?;
    let by_type = totals(&file);
    let n_params: u64 = file.tensors.iter().map(|t| t.n_elements()).sum();
    let n_bytes: u64 = file.tensors.iter().map(|t| t.nbytes).sum();
    let plan = if a.plan { Some(crate::info_plan::Plan::of(&a.model, a.devices.as_deref())?) } else { None };
    if a.json {
        let md: Vec<String> = file
            .metadata
            .entries()
            .iter()
            .map(|(k, v)| {
                json::object(&[
                    ("key", json::string(k)),
                    ("type", json::string(&format!("{:?}", v.value_type()))),
                    ("value", json::string(&v.display_short())),
                ])
            })
            .collect();
        let tensors: Vec<String> = file
            .tensors
            .iter()
            .map(|t| {
                let dims: Vec<String> = t.dims().iter().map(|d| d.to_string()).collect();
                json::object(&[
                    ("name", json::string(&t.name)),
                    ("type", json::string(t.ty.name())),
                    ("shape", json::array(&dims)),
                    ("offset", t.offset.to_string()),
                    ("bytes", t.nbytes.to_string()),
                ])
            })
            .collect();
        let types: Vec<String> = by_type
            .iter()
            .map(|(ty, t)| {
                json::object(&[
                    ("type", json::string(ty.name())),
                    ("tensors", t.tensors.to_string()),
                    ("params", t.elements.to_string()),
                    ("bytes", t.bytes.to_string()),
                    ("bpw", format!("{:.4}", bpw(t.bytes, t.elements))),
                ])
            })
            .collect();
        let mut fields = vec![
            ("path", json::string(&path.display().to_string())),
            ("version", file.version.to_string()),
            ("alignment", file.alignment.to_string()),
            ("n_tensors", file.tensors.len().to_string()),
            ("n_params", n_params.to_string()),
            ("tensor_bytes", n_bytes.to_string()),
            ("file_type", file_type(&file).map_or("null".to_string(), |f| json::string(&f))),
            ("types", json::array(&types)),
            ("metadata", json::array(&md)),
            ("tensors", json::array(&tensors)),
        ];
        if let Some(p) = &plan {
            fields.push(("plan", p.json()));
        }
        println!("{}", json::object(&fields));
        return Ok(());
    }
    println!(
        "{}: GGUF v{}, {} tensors, {} metadata keys, alignment {}",
        path.display(),
        file.version,
        file.tensors.len(),
        file.metadata.entries().len(),
        file.alignment
    );
    println!("\nmetadata:");
    for (k, v) in file.metadata.entries() {
        println!("  {k:<44} {}", v.display_short());
    }
    println!("\ntensors:");
    println!("  {:<36} {:<7} {:>18} {:>12}", "name", "type", "shape", "bytes");
    for t in &file.tensors {
        println!("  {:<36} {:<7} {:>18} {:>12}", t.name, t.ty.name(), shape(t.dims()), t.nbytes);
    }
    match file_type(&file) {
        Some(ft) => println!("\ntotals (file type {ft}):"),
        None => println!("\ntotals:"),
    }
    for (ty, t) in &by_type {
        println!(
            "  {:<7} {:>4} tensors {:>14} params {:>14} bytes  {:.3} bpw",
            ty.name(),
            t.tensors,
            t.elements,
            t.bytes,
            bpw(t.bytes, t.elements)
        );
    }
    println!(
        "  all     {:>4} tensors {:>14} params {:>14} bytes  {:.3} bpw",
        file.tensors.len(),
        n_params,
        n_bytes,
        bpw(n_bytes, n_params)
    );
    if let Some(p) = plan {
        p.print();
    }
    Ok(())
}
