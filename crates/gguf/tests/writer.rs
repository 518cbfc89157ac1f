//! Writer tests: faithful rewrite of every fixture, a round trip of every
//! metadata value type, and atomic `write_to_path`.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use tern_gguf::{Array, Error, File, GgmlType, Metadata, Value, Writer, WriterTensor};

fn compact_models() -> Vec<PathBuf> {
    let dir = tern_testutil::compact_dir().join("models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("testdata/compact/models is missing")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    v.sort();
    v
}

/// Re-emits `file` through the public writer API only: same metadata entries
/// in order, same tensors in order, data straight from the file.
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
    let mut failures = Vec::new();
    let mut n = 0;
    for path in compact_models() {
        let file = File::open(&path).unwrap();
        let out = rewrite(&file);
        let orig = file.bytes();
        if out.as_slice() != orig {
            let first_diff = orig.iter().zip(&out).position(|(a, b)| a != b);
            failures.push(format!(
                "{}: {} bytes vs original {}, first difference at {first_diff:?}",
                path.display(),
                out.len(),
                orig.len()
            ));
        }
        n += 1;
    }
    assert!(n >= 17, "expected the 17 compact .gguf fixtures, found {n}");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// One metadata entry of every scalar type, a non-empty and an empty array of
/// every element type, and awkward strings.
fn every_value_type() -> Metadata {
    let mut md = Metadata::new();
    let scalars = [
        ("t.u8", Value::U8(0xfe)),
        ("t.i8", Value::I8(-128)),
        ("t.u16", Value::U16(0xbeef)),
        ("t.i16", Value::I16(-32768)),
        ("t.u32", Value::U32(u32::MAX)),
        ("t.i32", Value::I32(i32::MIN)),
        ("t.f32", Value::F32(-1.5e-38)),
        ("t.bool_true", Value::Bool(true)),
        ("t.bool_false", Value::Bool(false)),
        ("t.string", Value::String("héllo\n\u{1F600}".into())),
        ("t.empty_string", Value::String(String::new())),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.f32_inf", Value::F32(f32::INFINITY)),
    ];
    for (k, v) in scalars {
        md.set(k, v);
    }
    let arrays = [
        Array::U8(vec![0, 1, 255]),
        Array::I8(vec![-1, 0, 127]),
        Array::U16(vec![1, 65535]),
        Array::I16(vec![-2, 2]),
        Array::U32(vec![7, u32::MAX]),
        Array::I32(vec![-7, i32::MAX]),
        Array::F32(vec![0.25, -3.0, f32::MAX]),
        Array::Bool(vec![true, false, true]),
        Array::String(vec!["a".into(), String::new(), "ünï".into()]),
        Array::U64(vec![u64::MAX, 0]),
        Array::I64(vec![i64::MIN, 1]),
        Array::F64(vec![1e300, -0.5]),
    ];
    for a in arrays {
        let ty = format!("{:?}", a.elem_type()).to_lowercase();
        let empty = match &a {
            Array::U8(_) => Array::U8(vec![]),
            Array::I8(_) => Array::I8(vec![]),
            Array::U16(_) => Array::U16(vec![]),
            Array::I16(_) => Array::I16(vec![]),
            Array::U32(_) => Array::U32(vec![]),
            Array::I32(_) => Array::I32(vec![]),
            Array::F32(_) => Array::F32(vec![]),
            Array::Bool(_) => Array::Bool(vec![]),
            Array::String(_) => Array::String(vec![]),
            Array::U64(_) => Array::U64(vec![]),
            Array::I64(_) => Array::I64(vec![]),
            Array::F64(_) => Array::F64(vec![]),
        };
        md.set(format!("t.array.{ty}"), Value::Array(a));
        md.set(format!("t.array.empty_{ty}"), Value::Array(empty));
    }
    md
}

fn pattern(n: u64, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn write_vec(w: &Writer) -> Vec<u8> {
    let data: Vec<Vec<u8>> = w.tensors.iter().enumerate().map(|(i, t)| pattern(t.nbytes().unwrap(), i as u8)).collect();
    let mut out = Vec::new();
    w.write(&mut out, |i| Ok(Cow::Borrowed(&data[i]))).unwrap();
    out
}

#[test]
fn every_value_type_round_trips() {
    let md = every_value_type();
    assert_eq!(md.entries().len(), 15 + 24);
    for with_tensors in [false, true] {
        let mut w = Writer::new(md.clone());
        if with_tensors {
            w.tensors.push(WriterTensor { name: "a".into(), ty: GgmlType::F32, dims: vec![3] });
            w.tensors.push(WriterTensor { name: "b".into(), ty: GgmlType::Q8_0, dims: vec![64, 2, 1, 3] });
        }
        let bytes = write_vec(&w);
        let file = File::from_bytes(bytes.clone()).unwrap();
        assert_eq!(file.version, 3);
        // Order and values, including the element type of every empty array.
        assert_eq!(file.metadata, md);
        for (k, v) in md.entries() {
            assert_eq!(file.metadata.get(k).map(Value::value_type), Some(v.value_type()), "{k}");
        }
        assert_eq!(file.tensors.len(), w.tensors.len());
        assert!(file.strict_layout);
        for (i, t) in file.tensors.iter().enumerate() {
            assert_eq!(t.dims(), w.tensors[i].dims.as_slice());
            assert_eq!(file.tensor_data(t), pattern(t.nbytes, i as u8).as_slice());
        }
        assert_eq!(rewrite(&file), bytes, "a read file must rewrite to itself");
    }
}

#[test]
fn non_default_alignment_is_honoured_and_preserved() {
    let mut md = Metadata::new();
    md.set("general.architecture", Value::String("llama".into()));
    md.set("general.alignment", Value::U32(256));
    let mut w = Writer::new(md);
    for (i, n) in [5u64, 300, 1].into_iter().enumerate() {
        w.tensors.push(WriterTensor { name: format!("t{i}"), ty: GgmlType::F32, dims: vec![n] });
    }
    let bytes = write_vec(&w);
    let file = File::from_bytes(bytes.clone()).unwrap();
    assert_eq!(file.alignment, 256);
    assert_eq!(file.data_start % 256, 0);
    let rel: Vec<u64> = file.tensors.iter().map(|t| t.offset - file.data_start).collect();
    assert_eq!(rel, [0, 256, 256 + 1280]);
    assert_eq!(bytes.len() as u64, file.data_start + 256 + 1280 + 256, "the last tensor is padded too");
    assert!(file.strict_layout);
    assert_eq!(rewrite(&file), bytes);
}

#[test]
fn writer_refuses_what_the_reader_would_refuse() {
    let t = |name: &str, dims: Vec<u64>| WriterTensor { name: name.into(), ty: GgmlType::Q4_0, dims };
    let mut w = Writer::new(Metadata::new());
    w.tensors = vec![t("x", vec![64]), t("x", vec![32])];
    let mut out = Vec::new();
    let err = w.write(&mut out, |_| Ok(Cow::Owned(vec![0; 36]))).unwrap_err();
    assert!(matches!(&err, Error::BadWrite { name, reason } if name == "x" && reason.contains("duplicate")), "{err}");
    assert!(out.is_empty(), "validation happens before any byte is written");
    for dims in [vec![], vec![32, 1, 1, 1, 1], vec![33]] {
        w.tensors = vec![t("y", dims)];
        let err = w.write(&mut out, |_| Ok(Cow::Owned(vec![]))).unwrap_err();
        assert!(matches!(&err, Error::BadWrite { name, .. } if name == "y"), "{err}");
    }
    let mut md = Metadata::new();
    md.set("general.alignment", Value::U32(24));
    let err = Writer::new(md).write(&mut out, |_| Ok(Cow::Owned(vec![]))).unwrap_err();
    assert!(matches!(&err, Error::BadValue { key, .. } if key == "general.alignment"), "{err}");
    assert!(out.is_empty());
}

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tern-gguf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn write_to_path_is_atomic() {
    let dir = scratch_dir("atomic");
    let dest = dir.join("model.gguf");
    let mut w = Writer::new(every_value_type());
    w.tensors.push(WriterTensor { name: "a".into(), ty: GgmlType::F16, dims: vec![8, 2] });
    w.tensors.push(WriterTensor { name: "b".into(), ty: GgmlType::F32, dims: vec![4] });

    // The second tensor's data is one byte short: the error names it, and
    // neither the destination nor the temporary file exists afterwards.
    let bad = |i: usize| Ok(Cow::Owned(vec![0u8; if i == 0 { 32 } else { 15 }]));
    let err = w.write_to_path(&dest, bad).unwrap_err();
    assert!(matches!(&err, Error::BadWrite { name, .. } if name == "b"), "{err}");
    assert_eq!(listing(&dir), Vec::<String>::new());

    // An error from the data callback itself behaves the same.
    let err = w
        .write_to_path(&dest, |i| {
            if i == 1 {
                Err(Error::MissingTensor { name: "b".into() })
            } else {
                Ok(Cow::Owned(vec![0; 32]))
            }
        })
        .unwrap_err();
    assert!(matches!(err, Error::MissingTensor { .. }));
    assert_eq!(listing(&dir), Vec::<String>::new());

    // A good write leaves exactly the destination, readable.
    let good = |i: usize| Ok(Cow::Owned(pattern(if i == 0 { 32 } else { 16 }, i as u8)));
    w.write_to_path(&dest, good).unwrap();
    assert_eq!(listing(&dir), ["model.gguf"]);
    let before = std::fs::read(&dest).unwrap();
    assert_eq!(File::open(&dest).unwrap().tensors.len(), 2);

    // A failed overwrite leaves the old file untouched.
    w.write_to_path(&dest, bad).unwrap_err();
    assert_eq!(listing(&dir), ["model.gguf"]);
    assert_eq!(std::fs::read(&dest).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}
