//! A model file that lacks what its architecture needs is refused with an
//! error naming the key or tensor. The fixtures are rewritten with one thing
//! removed or changed.

use std::borrow::Cow;

use tern_gguf::{File, Value, Writer, WriterTensor};
use tern_models::{Error, Model};

fn fixture(name: &str) -> File {
    File::open(tern_testutil::compact_model(name)).unwrap()
}

/// The BitNet fixture with metadata edited by `md` and tensors filtered/renamed by `tensor`.
fn variant(
    md: impl Fn(&mut tern_gguf::Metadata),
    tensor: impl Fn(&WriterTensor) -> Option<WriterTensor>,
) -> Result<Model, Error> {
    variant_of("b158-e512-tq2_0.gguf", md, tensor)
}

fn variant_of(
    name: &str,
    md: impl Fn(&mut tern_gguf::Metadata),
    tensor: impl Fn(&WriterTensor) -> Option<WriterTensor>,
) -> Result<Model, Error> {
    let f = fixture(name);
    let mut meta = f.metadata.clone();
    md(&mut meta);
    let mut w = Writer::new(meta);
    let mut keep = Vec::new();
    for (i, t) in f.tensors.iter().enumerate() {
        if let Some(t) = tensor(&WriterTensor { name: t.name.clone(), ty: t.ty, dims: t.dims().to_vec() }) {
            w.tensors.push(t);
            keep.push(i);
        }
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |i| Ok(Cow::Borrowed(f.tensor_data(&f.tensors[keep[i]])))).unwrap();
    Model::load(&File::from_bytes(bytes)?)
}

fn same(t: &WriterTensor) -> Option<WriterTensor> {
    Some(t.clone())
}

#[test]
fn the_unmodified_fixture_loads() {
    let m = variant(|_| {}, same).unwrap();
    assert_eq!(m.config.n_layer, 2);
    assert!(m.weights.output_is_tied());
}

#[test]
fn missing_key_is_named() {
    let err = variant(|md| drop(md.remove("bitnet-b1.58.embedding_length")), same).unwrap_err();
    assert!(err.to_string().contains("bitnet-b1.58.embedding_length"), "{err}");
    let err = variant(|md| drop(md.remove("bitnet-b1.58.attention.layer_norm_rms_epsilon")), same).unwrap_err();
    assert!(err.to_string().contains("layer_norm_rms_epsilon"), "{err}");
}

#[test]
fn missing_tensor_is_named() {
    let err = variant(|_| {}, |t| (t.name != "blk.1.ffn_sub_norm.weight").then(|| t.clone())).unwrap_err();
    assert!(matches!(&err, Error::MissingTensor { name } if name == "blk.1.ffn_sub_norm.weight"), "{err}");
}

#[test]
fn wrong_shape_is_named() {
    let err = variant(|md| md.set("bitnet-b1.58.feed_forward_length", Value::U32(256)), same).unwrap_err();
    assert!(matches!(&err, Error::BadShape { name, .. } if name == "blk.0.ffn_gate.weight"), "{err}");
}

#[test]
fn unknown_architecture_lists_the_known_ones() {
    let err = variant(|md| md.set("general.architecture", Value::String("gpt-j".into())), same).unwrap_err();
    assert!(err.to_string().contains("gpt-j") && err.to_string().contains("bitnet-b1.58"), "{err}");
}

#[test]
fn bad_head_counts_and_rope_are_refused() {
    let err = variant(|md| md.set("bitnet-b1.58.attention.head_count_kv", Value::U32(3)), same).unwrap_err();
    assert!(err.to_string().contains("head_count_kv"), "{err}");
    let err =
        variant(|md| md.set("bitnet-b1.58.rope.scaling.type", Value::String("longrope".into())), same).unwrap_err();
    assert!(err.to_string().contains("longrope"), "{err}");
    let err = variant(|md| md.set("bitnet-b1.58.hidden_activation", Value::String("gelu".into())), same).unwrap_err();
    assert!(err.to_string().contains("gelu"), "{err}");
}

/// A malformed MoE file is refused with the key or tensor at fault: experts
/// missing or fewer than used, expert tensors of the wrong shape, groups that
/// do not divide the experts, an unknown gating function.
#[test]
fn malformed_moe_files_are_refused() {
    const Q3: &str = "q3moe-e128-q8_0.gguf";
    const DS3: &str = "ds3-e128-q8_0.gguf";
    type Edit = Box<dyn Fn(&mut tern_gguf::Metadata)>;
    let cases: [(&str, Edit, &str); 7] = [
        (Q3, Box::new(|md| drop(md.remove("qwen3moe.expert_count"))), "qwen3moe.expert_count"),
        (Q3, Box::new(|md| md.set("qwen3moe.expert_used_count", Value::U32(9))), "expert_used_count"),
        (Q3, Box::new(|md| md.set("qwen3moe.expert_used_count", Value::U32(0))), "expert_used_count"),
        (Q3, Box::new(|md| md.set("qwen3moe.expert_count", Value::U32(6))), "blk.0.ffn_gate_inp.weight"),
        (DS3, Box::new(|md| md.set("deepseek2.expert_group_count", Value::U32(3))), "expert_group_count"),
        (DS3, Box::new(|md| md.set("deepseek2.expert_group_used_count", Value::U32(5))), "expert_group_used_count"),
        (DS3, Box::new(|md| md.set("deepseek2.expert_gating_func", Value::U32(7))), "expert_gating_func"),
    ];
    for (file, edit, named) in cases {
        let err = variant_of(file, edit, same).unwrap_err();
        assert!(err.to_string().contains(named), "{file}: {err}");
    }
    // An expert tensor of the wrong shape (up's dims as down's: the same bytes).
    let err = variant_of(
        Q3,
        |_| {},
        |t| {
            let mut t = t.clone();
            if t.name == "blk.1.ffn_up_exps.weight" {
                t.dims.swap(0, 1);
            }
            Some(t)
        },
    );
    let err = err.unwrap_err();
    assert!(matches!(&err, Error::BadShape { name, .. } if name == "blk.1.ffn_up_exps.weight"), "{err}");
    // Missing MLA keys and tensors.
    let err = variant_of(DS3, |md| drop(md.remove("deepseek2.attention.kv_lora_rank")), same).unwrap_err();
    assert!(err.to_string().contains("kv_lora_rank"), "{err}");
    let err = variant_of(DS3, |_| {}, |t| (t.name != "blk.2.attn_v_b.weight").then(|| t.clone())).unwrap_err();
    assert!(err.to_string().contains("blk.2.attn_v_b.weight"), "{err}");
}

#[test]
fn moe_fixtures_load_with_their_routing() {
    let q3 = variant_of("q3moe-e128-q8_0.gguf", |_| {}, same).unwrap();
    let m = q3.config.moe.unwrap();
    assert_eq!((m.n_expert, m.n_expert_used, m.n_ff_exp, m.n_shared, m.n_dense_lead), (8, 2, 32, 0, 0));
    assert!(m.route.norm && m.route.groups.is_none());
    let ds3 = variant_of("ds3-e128-qlora-legacy-q8_0.gguf", |_| {}, same).unwrap();
    let m = ds3.config.moe.unwrap();
    assert_eq!((m.n_expert, m.n_expert_used, m.n_shared, m.n_dense_lead), (16, 4, 1, 1));
    assert_eq!(m.route.groups, Some(tern_graph::ExpertGroups { count: 4, used: 2 }));
    assert_eq!(m.route.gating, tern_graph::Gating::Sigmoid);
    let mla = ds3.config.mla.unwrap();
    assert_eq!((mla.q_lora, mla.rank, mla.nope, mla.rope, mla.v_dim), (Some(64), 64, 32, 16, 32));
    assert_eq!(ds3.config.kv_widths(), (80, 0));
}
