use std::path::PathBuf;

use tern_gguf::File;

use super::*;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// The outcome's type name, as `gguf`'s reader names the written tensor's type.
fn written(pick: Pick, file_ty: GgmlType) -> &'static str {
    match pick {
        Pick::Keep => file_ty.name(),
        Pick::To(ty) => ty.name(),
    }
}

/// One `testdata/quantize/<model>.tsv`: a header `tensor PRESET...`, a row per
/// tensor with the type llama-quantize wrote under each preset, and a
/// `general.file_type` row; `refused` where llama-quantize refused the preset.
struct Expected {
    presets: Vec<Preset>,
    rows: Vec<(String, Vec<String>)>,
    /// `None`: refused.
    file_types: Vec<Option<u32>>,
}

fn read_expected(path: &std::path::Path) -> Expected {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    let header: Vec<&str> = lines.next().expect("header").split('\t').collect();
    assert_eq!(header[0], "tensor", "{}", path.display());
    let presets =
        header[1..].iter().map(|n| Preset::from_name(n).unwrap_or_else(|| panic!("{n}: not a preset"))).collect();
    let (mut rows, mut file_types) = (Vec::new(), Vec::new());
    for line in lines {
        let cells: Vec<&str> = line.split('\t').collect();
        assert_eq!(cells.len(), header.len(), "{}: {line}", path.display());
        if cells[0] == "general.file_type" {
            file_types = cells[1..].iter().map(|&c| (c != "refused").then(|| c.parse().unwrap())).collect();
        } else {
            rows.push((cells[0].to_string(), cells[1..].iter().map(|c| c.to_string()).collect()));
        }
    }
    assert_eq!(file_types.len(), header.len() - 1, "{}: no general.file_type row", path.display());
    Expected { presets, rows, file_types }
}

/// Every (model, preset) that llama-quantize 3f545be ran on the compact
/// fixtures' F16 files (`tools/quantize-presets/`): the same type, tensor
/// by tensor, and the same `general.file_type`.
#[test]
fn presets_choose_what_llama_quantize_chose() {
    let dir = testdata().join("quantize");
    let mut tables: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tsv"))
        .collect();
    tables.sort();
    let models: Vec<String> = tables.iter().map(|p| p.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    for want in ["q3moe-e128-f16", "ds2-e128-f16", "ds3-e128-f16", "llama-e256-f16", "qwen3-e256-f16"] {
        assert!(models.iter().any(|m| m == want), "no table for {want} in {}", dir.display());
    }
    let mut compared = 0;
    let mut wrong = Vec::new();
    for (table, model) in tables.iter().zip(&models) {
        let exp = read_expected(table);
        let file = File::open(testdata().join("compact/models").join(format!("{model}.gguf"))).unwrap();
        let facts = ModelFacts::of(&file.metadata).unwrap();
        let tensors: Vec<Tensor> = file.tensors.iter().map(|t| Tensor { name: &t.name, dims: t.dims() }).collect();
        assert_eq!(exp.rows.len(), file.tensors.len(), "{model}: tensor count");
        for (col, &preset) in exp.presets.iter().enumerate() {
            let chosen = choose(preset, &facts, &tensors, Overrides::default());
            let Some(file_type) = exp.file_types[col] else {
                assert!(chosen.is_err(), "{model} {}: llama-quantize refused, tern chose {chosen:?}", preset.name());
                continue;
            };
            assert_eq!(preset.file_type(), file_type, "{model} {}: general.file_type", preset.name());
            let picks = chosen.unwrap_or_else(|e| panic!("{model} {}: llama-quantize chose, tern: {e}", preset.name()));
            for (name, types) in &exp.rows {
                let i = file.tensors.iter().position(|t| &t.name == name).unwrap_or_else(|| panic!("{model}: {name}"));
                let got = written(picks[i], file.tensors[i].ty);
                compared += 1;
                if got != types[col] {
                    wrong.push(format!(
                        "{model} {:<7} {name}: llama-quantize {}, tern {got}",
                        preset.name(),
                        types[col]
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{} of {compared} choices differ:\n{}", wrong.len(), wrong.join("\n"));
    assert!(compared > 1000, "only {compared} choices compared");
}

#[test]
fn more_bits_takes_the_ends_and_every_third_layer() {
    let on: Vec<i64> = (0..32).filter(|&i| more_bits(i, 32)).collect();
    assert_eq!(on, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
    // Three layers: no eighth, so only the last (7·3/8 = 2) and (i − 0) % 3 == 2.
    assert_eq!((0..3).filter(|&i| more_bits(i, 3)).collect::<Vec<_>>(), [2]);
}

#[test]
fn layers_are_read_like_sscanf() {
    assert_eq!(layer_of("blk.12.ffn_down_exps.weight"), Some(12));
    assert_eq!(layer_of("blk.7"), Some(7));
    assert_eq!(layer_of("output.weight"), None);
    assert_eq!(layer_of("blk.x.attn_v.weight"), None);
}

fn t<'a>(name: &'a str, dims: &'a [u64]) -> Tensor<'a> {
    Tensor { name, dims }
}

#[test]
fn rows_that_are_not_whole_blocks_fall_back() {
    let row = |n: u64, ty: Ty| fallback(&t("x.weight", &[n, 4]), ty);
    assert_eq!(row(128, Q2_K), Ok(Q4_0));
    assert_eq!(row(128, Q3_K), Ok(Q4_0));
    assert_eq!(row(128, Q4_K), Ok(Q5_0));
    assert_eq!(row(128, Q5_K), Ok(Q5_1));
    assert_eq!(row(128, Q6_K), Ok(Q8_0));
    assert_eq!(row(128, IQ4_XS), Ok(IQ4_NL));
    assert_eq!(row(512, Q4_K), Ok(Q4_K));
    assert_eq!(row(48, Q4_K), Ok(F16));
    assert!(matches!(row(48, Q8_0), Err(ChoiceError::NoFallback { row: 48, .. })));
}

#[test]
fn vectors_norms_and_the_router_are_kept() {
    assert!(quantizable(&t("blk.0.ffn_gate_exps.weight", &[128, 32, 8])));
    assert!(quantizable(&t("blk.0.attn_k_b.weight", &[32, 64, 4])));
    assert!(!quantizable(&t("blk.0.ffn_gate_inp.weight", &[128, 8])));
    assert!(!quantizable(&t("blk.0.attn_kv_a_norm.weight", &[64])));
    assert!(!quantizable(&t("blk.0.attn_q.weight", &[128, 1])));
    assert!(!quantizable(&t("blk.1.exp_probs_b.bias", &[16])));
    assert!(quantizable(&t("blk.0.attn_q.weight", &[1, 128])));
}

#[test]
fn preset_names_and_file_types() {
    assert_eq!(Preset::from_name("q4_k_m"), Some(Preset::Q4_K_M));
    assert_eq!(Preset::from_name("Q4_K"), None);
    for p in Preset::ALL {
        assert_eq!(file_type_name(u64::from(p.file_type())), Some(p.name()));
    }
    assert_eq!(Ty::from_name("iq4_xs"), Some(Ty::IQ4_XS));
    assert_eq!(Ty::from_name("q6_k"), Some(Q6_K));
}

fn facts(arch: &str, n_layer: u32, n_expert: u32, n_head: u32, n_head_kv: u32) -> ModelFacts {
    ModelFacts { arch: arch.into(), n_layer, n_expert, n_head, n_head_kv }
}

/// A dense Llama-style layout of `n_layer` layers, rows of 8192 (all 256-blocks).
fn dense_names(n_layer: usize, tied: bool) -> Vec<String> {
    let mut names = vec!["token_embd.weight".to_string()];
    if !tied {
        names.push("output.weight".into());
    }
    for i in 0..n_layer {
        for part in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
            names.push(format!("blk.{i}.{part}.weight"));
        }
    }
    names
}

fn pick_of(preset: Preset, f: &ModelFacts, names: &[String], name: &str) -> Ty {
    let dims = [8192u64, 1024];
    let tensors: Vec<Tensor> = names.iter().map(|n| t(n, &dims)).collect();
    let picks = choose(preset, f, &tensors, Overrides::default()).unwrap();
    match picks[names.iter().position(|n| n == name).unwrap()] {
        Pick::To(ty) => ty,
        Pick::Keep => panic!("{name} kept"),
    }
}

/// Rules the compact fixtures do not reach, on a Llama-3.1-70B layout
/// (80 layers, GQA 8; mainline's own snapshot of that model agrees).
#[test]
fn a_70b_lifts_its_v_projections_and_gqa_8_takes_q4_k_for_q2_k() {
    let f = facts("llama", 80, 0, 64, 8);
    let names = dense_names(80, false);
    // Q4_K_S: Q5_K on the first four V projections, then Q4_K lifted to Q5_K.
    assert_eq!(pick_of(Preset::Q4_K_S, &f, &names, "blk.3.attn_v.weight"), Q5_K);
    assert_eq!(pick_of(Preset::Q4_K_S, &f, &names, "blk.40.attn_v.weight"), Q5_K);
    // Q2_K: Q4_K at GQA >= 4, lifted as well; ffn_down Q3_K, attn_output Q3_K.
    assert_eq!(pick_of(Preset::Q2_K, &f, &names, "blk.40.attn_v.weight"), Q5_K);
    assert_eq!(pick_of(Preset::Q2_K, &f, &names, "blk.40.ffn_down.weight"), Q3_K);
    assert_eq!(pick_of(Preset::Q2_K, &f, &names, "blk.40.attn_output.weight"), Q3_K);
    // Q3_K_M: ffn_down Q5_K in the first 1/16 (5 layers), Q4_K after.
    assert_eq!(pick_of(Preset::Q3_K_M, &f, &names, "blk.4.ffn_down.weight"), Q5_K);
    assert_eq!(pick_of(Preset::Q3_K_M, &f, &names, "blk.5.ffn_down.weight"), Q4_K);
    // IQ4_XS: V Q5_K at GQA >= 4; ffn_down Q5_K in the first 1/8.
    assert_eq!(pick_of(Preset::IQ4_XS, &f, &names, "blk.50.attn_v.weight"), Q5_K);
    assert_eq!(pick_of(Preset::IQ4_XS, &f, &names, "blk.9.ffn_down.weight"), Q5_K);
    assert_eq!(pick_of(Preset::IQ4_XS, &f, &names, "blk.10.ffn_down.weight"), IQ4_XS);
    // The untied head is Q6_K, the embedding the base type.
    assert_eq!(pick_of(Preset::Q4_K_M, &f, &names, "output.weight"), Q6_K);
    assert_eq!(pick_of(Preset::Q4_K_M, &f, &names, "token_embd.weight"), Q4_K);
    // Not a 70B without GQA (a 65B), nor as another architecture.
    let g = facts("llama", 80, 0, 64, 64);
    assert_eq!(pick_of(Preset::Q4_K_S, &g, &names, "blk.40.attn_v.weight"), Q4_K);
    let q = facts("qwen3", 80, 0, 64, 8);
    assert_eq!(pick_of(Preset::Q4_K_S, &q, &names, "blk.40.attn_v.weight"), Q4_K);
}

/// Q4_K_M's "more bits" layers count V projections in llama-quantize's
/// order (by layer number, not by the file's order), and a tied embedding
/// takes the head's Q6_K.
#[test]
fn q4_k_m_counts_in_layer_order() {
    let f = facts("qwen3", 16, 0, 16, 8);
    let mut names = dense_names(16, true);
    names.reverse();
    for i in 0..16 {
        let want = if more_bits(i, 16) { Q6_K } else { Q4_K };
        assert_eq!(pick_of(Preset::Q4_K_M, &f, &names, &format!("blk.{i}.attn_v.weight")), want, "layer {i}");
        assert_eq!(pick_of(Preset::Q4_K_M, &f, &names, &format!("blk.{i}.ffn_down.weight")), want, "layer {i}");
    }
    assert_eq!(pick_of(Preset::Q4_K_M, &f, &names, "token_embd.weight"), Q6_K);
    assert_eq!(pick_of(Preset::Q8_0, &f, &names, "token_embd.weight"), Q8_0);
}

#[test]
fn user_types_and_pure() {
    let f = facts("qwen3", 4, 0, 16, 8);
    let names = dense_names(4, true);
    let dims = [8192u64, 1024];
    let tensors: Vec<Tensor> = names.iter().map(|n| t(n, &dims)).collect();
    let over = Overrides { output: Some(Q5_K), ..Overrides::default() };
    let picks = choose(Preset::Q4_K_M, &f, &tensors, over).unwrap();
    assert_eq!(picks[0], Pick::To(Q5_K), "a tied embedding takes the head's type");
    let over = Overrides { token_embd: Some(Q8_0), ..Overrides::default() };
    assert_eq!(choose(Preset::Q4_K_M, &f, &tensors, over).unwrap()[0], Pick::To(Q8_0));
    let pure = choose(Preset::Q4_K_M, &f, &tensors, Overrides { pure: true, ..Overrides::default() }).unwrap();
    assert!(pure.iter().all(|&p| p == Pick::To(Q4_K)), "{pure:?}");
}

/// In an MoE model the FFN layer comes from the name; one without a layer is refused.
#[test]
fn moe_ffn_layers_come_from_names() {
    let f = facts("qwen3moe", 2, 16, 4, 2);
    let dims = [256u64, 64, 16];
    let names = ["blk.0.ffn_down_exps.weight", "blk.1.ffn_down_exps.weight", "blk.9.ffn_down_exps.weight"];
    let ok: Vec<Tensor> = names[..2].iter().map(|n| t(n, &dims)).collect();
    assert!(choose(Preset::Q4_K_M, &f, &ok, Overrides::default()).is_ok());
    let bad: Vec<Tensor> = names.iter().map(|n| t(n, &dims)).collect();
    assert!(matches!(choose(Preset::Q4_K_M, &f, &bad, Overrides::default()), Err(ChoiceError::NoLayer { .. })));
}
