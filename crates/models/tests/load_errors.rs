//! A model file that lacks what its architecture needs is refused with an
//! error naming the key or tensor. The fixtures are rewritten with one thing
//! removed or changed.

use std::borrow::Cow;

use tern_gguf::{File, Value, Writer, WriterTensor};
use tern_models::{Error, Model};

fn fixture() -> File {
    File::open(tern_testutil::compact_model("b158-e512-tq2_0.gguf")).unwrap()
}

/// The fixture with metadata edited by `md` and tensors filtered/renamed by `tensor`.
fn variant(
    md: impl Fn(&mut tern_gguf::Metadata),
    tensor: impl Fn(&WriterTensor) -> Option<WriterTensor>,
) -> Result<Model, Error> {
    let f = fixture();
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
    let err = variant(|md| md.set("bitnet-b1.58.rope.scaling.type", Value::String("yarn".into())), same).unwrap_err();
    assert!(err.to_string().contains("yarn"), "{err}");
    let err = variant(|md| md.set("bitnet-b1.58.hidden_activation", Value::String("gelu".into())), same).unwrap_err();
    assert!(err.to_string().contains("gelu"), "{err}");
}
