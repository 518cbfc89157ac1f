//! Writer tests: faithful rewrite of every fixture, a round trip of every
//! metadata value type, and atomic `write_to_path`.

use std::borrow::Cow;
use std::path::PathBuf;

use tern_gguf::{Array, File, GgmlType, Metadata, Value, Writer, WriterTensor};

fn compact_models() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/compact/models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("testdata/compact/models is missing")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    v.sort();
    v
}

/// Re-emits `file` through the public writer API only.
fn rewrite(file: &File) -> Vec<u8> {
    let mut w = Writer::new(file.metadata.clone());
    for t in &file.tensors {
        w.tensors.push(WriterTensor { name: t.name.clone(), ty: t.ty, dims: t.dims().to_vec() });
    }
    let mut out = Vec::new();
    w.write(&mut out, |i| Ok(Cow::Borrowed(file.tensor_data(&file.tensors[i])))).unwrap();
    out
}

#[test]
fn every_fixture_rewrites_byte_identically() {
    let mut report = Vec::new();
    for path in compact_models() {
        let file = File::open(&path).unwrap();
        let out = rewrite(&file);
        let orig = file.bytes();
        let first_diff = orig.iter().zip(&out).position(|(a, b)| a != b);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if out.as_slice() != orig {
            report.push(format!(
                "{name}: {} bytes vs original {}, first difference at {first_diff:?}",
                out.len(),
                orig.len()
            ));
        }
        eprintln!("{name}: identical={}", out.as_slice() == orig);
    }
    assert!(report.is_empty(), "{report:#?}");
}
