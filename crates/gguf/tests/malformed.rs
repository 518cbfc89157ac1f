//! Malformed input: one test per class of corruption, each checking the exact
//! error variant and that the message names the key or tensor and the offset.
//! Files are built with the crate's own `Writer` and then patched, so no
//! binary blobs are shipped.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::path::PathBuf;

use tern_gguf::{Array, Error, File, GgmlType, Metadata, Value, Writer, WriterTensor};
use tern_testutil::Rng;

// ---------------------------------------------------------------- helpers

type Spec<'a> = (&'a str, GgmlType, &'a [u64]);

const TOK: &str = "tok_embd.weight"; // F32 [32, 2]: 256 bytes
const NORM: &str = "blk.0.attn_norm.weight"; // F16 [64]: 128 bytes
const UP: &str = "blk.0.ffn_up.weight"; // Q4_0 [64, 2]: 72 bytes, 96 padded
const TENSORS: [Spec; 3] =
    [(TOK, GgmlType::F32, &[32, 2]), (NORM, GgmlType::F16, &[64]), (UP, GgmlType::Q4_0, &[64, 2])];

fn metadata(arch: &str) -> Metadata {
    let mut md = Metadata::new();
    md.set("general.architecture", Value::String(arch.into()));
    md.set("general.alignment", Value::U32(32));
    md.set("test.flag", Value::Bool(true));
    md.set("test.name", Value::String("tiny".into()));
    md.set("test.list", Value::Array(Array::U32(vec![1, 2, 3])));
    md.set("test.bools", Value::Array(Array::Bool(vec![true, false])));
    md.set("test.words", Value::Array(Array::String(vec!["ab".into(), "cd".into()])));
    md.set("test.nest", Value::Array(Array::U8(vec![])));
    md.set("test.dup1", Value::U8(1));
    md.set("test.dup2", Value::U8(2));
    md
}

fn build(md: Metadata, tensors: &[Spec]) -> Vec<u8> {
    let mut w = Writer::new(md);
    for &(name, ty, dims) in tensors {
        w.tensors.push(WriterTensor { name: name.into(), ty, dims: dims.to_vec() });
    }
    let mut out = Vec::new();
    w.write(&mut out, |i| Ok(Cow::Owned(vec![i as u8 + 1; w.tensors[i].nbytes()? as usize]))).unwrap();
    out
}

fn small() -> Vec<u8> {
    build(metadata("llama"), &TENSORS)
}

/// The unique position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    let hits: Vec<usize> =
        hay.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i).collect();
    assert_eq!(hits.len(), 1, "{:?} occurs {} times", String::from_utf8_lossy(needle), hits.len());
    hits[0]
}

/// A length-prefixed GGUF string, as it appears in the file.
fn gguf_str(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// Offset of the first byte after a metadata key (where its value type is).
fn after_key(bytes: &[u8], key: &str) -> usize {
    find(bytes, &gguf_str(key)) + 8 + key.len()
}

/// Where the fields of one tensor info live.
struct InfoAt {
    start: usize,
    n_dims: usize,
    dims: usize,
    ty: usize,
    offset: usize,
}

fn info_at(bytes: &[u8], name: &str) -> InfoAt {
    let start = find(bytes, &gguf_str(name));
    let n_dims = start + 8 + name.len();
    let nd = u32::from_le_bytes(bytes[n_dims..n_dims + 4].try_into().unwrap()) as usize;
    let dims = n_dims + 4;
    let ty = dims + 8 * nd;
    InfoAt { start, n_dims, dims, ty, offset: ty + 4 }
}

fn put_u32(b: &mut [u8], at: usize, x: u32) {
    b[at..at + 4].copy_from_slice(&x.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, x: u64) {
    b[at..at + 8].copy_from_slice(&x.to_le_bytes());
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn err(bytes: Vec<u8>) -> Error {
    match File::from_bytes(bytes) {
        Ok(f) => panic!("malformed file accepted: {f:?}"),
        Err(e) => e,
    }
}

/// The message mentions every needle (key or tensor name, "offset N", ...).
fn says(e: &Error, needles: &[&str]) {
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} does not mention {n:?}");
    }
}

fn fixture(name: &str) -> PathBuf {
    tern_testutil::compact_model(name)
}

// ---------------------------------------------------------------- classes

#[test]
fn the_unpatched_file_is_valid() {
    let f = File::from_bytes(small()).unwrap();
    assert_eq!(f.tensors.len(), 3);
    assert!(f.strict_layout);
}

/// Every prefix of a real fixture is refused (never a panic), with an error
/// that fits where the cut falls. The one exception is a cut inside the
/// padding after the last tensor's data: that file is complete and is
/// accepted (mainline llama.cpp's mmap loader accepts it too).
#[test]
fn truncated_file() {
    let bytes = std::fs::read(fixture("bitnet-e256-tq1_0.gguf")).unwrap();
    let full = File::from_bytes(bytes.clone()).unwrap();
    let md_end = info_at(&bytes, &full.tensors[0].name).start;
    let infos_end = info_at(&bytes, &full.tensors.last().unwrap().name).offset + 8;
    let data_start = full.data_start as usize;
    let data_end = full.tensors.iter().map(|t| (t.offset + t.nbytes) as usize).max().unwrap();
    let spread = |lo: usize, hi: usize, n: usize| (0..n).map(move |i| lo + (hi - lo) * i / n);

    let mut cuts: BTreeSet<usize> = (0..=32).collect();
    cuts.extend(spread(24, md_end, 40));
    cuts.extend(spread(md_end, infos_end, 50));
    cuts.extend(spread(data_start, data_end, 60));
    cuts.extend([md_end - 1, md_end, md_end + 1, infos_end - 1, infos_end, data_start - 1, data_start]);
    cuts.extend([data_end - 1, data_end, bytes.len() - 1]);
    for t in full.tensors.iter().take(8) {
        cuts.extend([t.offset as usize, t.offset as usize + 1, (t.offset + t.nbytes) as usize - 1]);
    }
    assert!(cuts.len() >= 200, "{} cut points", cuts.len());

    for &cut in &cuts {
        let result = File::from_bytes(bytes[..cut].to_vec());
        if cut >= data_end {
            assert!(result.is_ok(), "cut at {cut} (inside the trailing padding) should be accepted");
            continue;
        }
        let e = result.expect_err("truncated file accepted");
        let msg = e.to_string();
        if cut < infos_end {
            // A count that no longer fits is reported as such; anything else as truncation.
            assert!(matches!(e, Error::Truncated { .. } | Error::HugeCount { .. }), "cut at {cut}: {msg}");
            assert!(msg.contains("at offset"), "cut at {cut}: {msg}");
        } else {
            match &e {
                Error::BadTensor { name, reason, .. } => {
                    assert!(reason.contains("runs past the end"), "cut at {cut}: {msg}");
                    assert!(
                        full.tensor(name).is_some_and(|t| (t.offset + t.nbytes) as usize > cut),
                        "cut at {cut}: {msg}"
                    );
                    says(&e, &[name, "info at offset"]);
                }
                _ => panic!("cut at {cut}: {msg}"),
            }
        }
    }
    // Early cuts leave counts that cannot fit; later ones name the field cut.
    let e = err(bytes[..20].to_vec());
    assert!(matches!(&e, Error::HugeCount { offset: 8, count, .. } if *count as usize == full.tensors.len()), "{e}");
    says(&e, &[&format!("tensor count {}", full.tensors.len()), "offset 8", "truncated"]);
    let last = full.tensors.last().unwrap();
    let cut = infos_end - 4;
    let e = err(bytes[..cut].to_vec());
    assert!(matches!(&e, Error::Truncated { offset, needed: 8, .. } if *offset == cut as u64 - 4), "{e}");
    says(&e, &["data offset of tensor", &last.name, &format!("offset {}", cut - 4)]);
}

#[test]
fn bad_magic() {
    let mut b = small();
    b[..4].copy_from_slice(b"GGML");
    let e = err(b);
    assert!(matches!(e, Error::BadMagic { found } if &found == b"GGML"));
    says(&e, &["magic", "offset 0"]);
    for short in [0, 3] {
        let e = err(small()[..short].to_vec());
        assert!(matches!(e, Error::Truncated { offset: 0, .. }), "{e}");
        says(&e, &["magic", "offset 0"]);
    }
}

#[test]
fn bad_version() {
    for (version, big_endian) in [(1u32, false), (4, false), (0x0300_0000, true), (0x0200_0000, true)] {
        let mut b = small();
        put_u32(&mut b, 4, version);
        let e = err(b);
        assert!(
            matches!(e, Error::BadVersion { version: v, hint } if v == version && hint.contains("big-endian") == big_endian),
            "{e}"
        );
        says(&e, &[&version.to_string(), "offset 4"]);
    }
    let mut b = small();
    put_u32(&mut b, 4, 2);
    assert_eq!(File::from_bytes(b).unwrap().version, 2, "v2 has the same layout");
}

#[test]
fn huge_counts() {
    let check = |at: usize, value: u64, what: &str| {
        let mut b = small();
        put_u64(&mut b, at, value);
        let e = err(b);
        assert!(
            matches!(&e, Error::HugeCount { count, offset, what: w, .. }
                if *count == value && *offset == at as u64 && w.contains(what)),
            "{e}"
        );
        says(&e, &[what, &format!("offset {at}")]);
    };
    for value in [u64::MAX, 1 << 40] {
        check(8, value, "tensor");
        check(16, value, "metadata key");
        // Array counts, numeric and string.
        check(after_key(&small(), "test.list") + 8, value, "test.list");
        check(after_key(&small(), "test.words") + 8, value, "test.words");
        // String lengths: a key, a string value, a string element, a tensor name.
        check(24, value, "metadata key #0");
        check(after_key(&small(), "test.name") + 4, value, "test.name");
        check(after_key(&small(), "test.words") + 16, value, "test.words");
        check(info_at(&small(), TOK).start, value, "tensor #0");
    }
}

#[test]
fn tensor_offset_past_eof() {
    let b = small();
    let at = info_at(&b, UP);
    for (rel, reason) in [(1u64 << 20, "runs past the end"), (!31u64, "overflows")] {
        let mut b = b.clone();
        put_u64(&mut b, at.offset, rel);
        let e = err(b);
        assert!(
            matches!(&e, Error::BadTensor { name, offset, reason: r } if name == UP && *offset == at.start as u64 && r.contains(reason)),
            "{e}"
        );
        says(&e, &[UP, &format!("offset {}", at.start)]);
    }
}

#[test]
fn overflowing_dims() {
    let b = small();
    let at = info_at(&b, TOK); // two dims
    for (d0, d1, reason) in [
        (1u64 << 32, 1u64 << 32, "overflow the element count"), // product overflows u64
        (1 << 62, 4, "overflow the element count"),             // fits u64, not i64
        (u64::MAX, 1, "not a positive int64"),
        (0, 2, "not a positive int64"),
    ] {
        let mut b = b.clone();
        put_u64(&mut b, at.dims, d0);
        put_u64(&mut b, at.dims + 8, d1);
        let e = err(b);
        assert!(
            matches!(&e, Error::BadTensor { name, offset, reason: r } if name == TOK && *offset == at.start as u64 && r.contains(reason)),
            "{d0} {d1}: {e}"
        );
        says(&e, &[TOK, &format!("offset {}", at.start)]);
    }
}

#[test]
fn unaligned_offset() {
    let mut b = small();
    let at = info_at(&b, NORM);
    let rel = get_u64(&b, at.offset);
    put_u64(&mut b, at.offset, rel + 16);
    let e = err(b);
    assert!(
        matches!(&e, Error::BadTensor { name, reason, .. } if name == NORM && reason.contains("not a multiple of the alignment 32")),
        "{e}"
    );
    says(&e, &[NORM, &format!("offset {}", at.start)]);
}

#[test]
fn unknown_tensor_type_id() {
    for id in [77u32, 4, 15, 136, 1000] {
        let mut b = small();
        let at = info_at(&b, NORM);
        put_u32(&mut b, at.ty, id);
        let e = err(b);
        assert!(
            matches!(&e, Error::UnknownType { name, type_id, offset, hint } if name == NORM && *type_id == id && *offset == at.start as u64 && hint.is_empty()),
            "{e}"
        );
        says(&e, &[NORM, &format!("type id {id}"), &format!("offset {}", at.start)]);
    }
}

#[test]
fn tl1_tl2_in_a_bitnet_file() {
    for arch in ["bitnet-b1.58", "bitnet", "bitnet-25", "llama"] {
        for (id, fmt) in [(38u32, "TL1"), (39, "TL2")] {
            let mut b = build(metadata(arch), &TENSORS);
            let at = info_at(&b, UP);
            put_u32(&mut b, at.ty, id);
            let e = err(b);
            let Error::UnknownType { name, type_id, hint, .. } = &e else { panic!("{e}") };
            assert_eq!((name.as_str(), *type_id), (UP, id));
            // Outside a BitNet file 38/39 are other forks' types (39 = MXFP4), which tern lacks.
            assert_eq!(hint.contains(fmt), arch != "llama", "{arch}: {e}");
            says(&e, &[UP, &id.to_string(), &format!("offset {}", at.start)]);
        }
    }
}

#[test]
fn duplicate_tensor_name() {
    let specs: [Spec; 2] = [("blk.0.aaaa", GgmlType::F32, &[8]), ("blk.0.aaab", GgmlType::F32, &[8])];
    let mut b = build(metadata("llama"), &specs);
    let at = info_at(&b, "blk.0.aaab");
    b[at.n_dims - 1] = b'a';
    let e = err(b);
    assert!(
        matches!(&e, Error::DuplicateTensor { name, offset } if name == "blk.0.aaaa" && *offset == at.start as u64),
        "{e}"
    );
    says(&e, &["blk.0.aaaa", &format!("offset {}", at.start)]);
}

#[test]
fn duplicate_key() {
    let mut b = small();
    let at = after_key(&b, "test.dup2");
    b[at - 1] = b'1';
    let start = at - 8 - "test.dup1".len();
    let e = err(b);
    assert!(matches!(&e, Error::DuplicateKey { key, offset } if key == "test.dup1" && *offset == start as u64), "{e}");
    says(&e, &["test.dup1", &format!("offset {start}")]);
}

#[test]
fn nested_array() {
    let mut b = small();
    let elem_type = after_key(&b, "test.nest") + 4;
    put_u32(&mut b, elem_type, 9);
    let e = err(b);
    assert!(
        matches!(&e, Error::BadMetadata { key, offset, reason } if key == "test.nest" && *offset == elem_type as u64 && reason.contains("nested")),
        "{e}"
    );
    says(&e, &["test.nest", &format!("offset {elem_type}")]);
}

#[test]
fn bad_bool_byte() {
    let scalar = after_key(&small(), "test.flag") + 4;
    let element = after_key(&small(), "test.bools") + 4 + 4 + 8 + 1; // the second element
    for (at, key) in [(scalar, "test.flag"), (element, "test.bools")] {
        for byte in [2u8, 0xff] {
            let mut b = small();
            b[at] = byte;
            let e = err(b);
            assert!(
                matches!(&e, Error::BadMetadata { key: k, offset, reason } if k == key && *offset == at as u64 && reason.contains(&format!("bool byte {byte}"))),
                "{e}"
            );
            says(&e, &[key, &format!("offset {at}")]);
        }
    }
}

#[test]
fn bad_alignment() {
    let key = "general.alignment";
    let value = after_key(&small(), key) + 4;
    // Not a power of two, and powers of two with the wrong type (i32, f32, u32 bits of 32.0).
    for (type_id, raw) in [(4u32, 48u32), (4, 0), (4, 33), (5, 32), (6, 32f32.to_bits())] {
        let mut b = small();
        put_u32(&mut b, value - 4, type_id);
        put_u32(&mut b, value, raw);
        let e = err(b);
        assert!(
            matches!(&e, Error::BadMetadata { key: k, offset, reason } if k == key && *offset == value as u64 && reason.contains("power of two")),
            "{type_id} {raw}: {e}"
        );
        says(&e, &[key, &format!("offset {value}")]);
    }
    // 64 is a valid value, but the data section then starts later than the
    // writer (which used 32) put it, so the last tensor no longer fits.
    let mut b = small();
    put_u32(&mut b, value, 64);
    assert!(matches!(err(b), Error::BadTensor { name, reason, .. } if name == UP && reason.contains("past the end")));
}

#[test]
fn n_dims_out_of_range() {
    for n in [0u32, 5, u32::MAX] {
        let mut b = small();
        let at = info_at(&b, NORM);
        put_u32(&mut b, at.n_dims, n);
        let e = err(b);
        assert!(
            matches!(&e, Error::BadTensor { name, offset, reason } if name == NORM && *offset == at.start as u64 && reason.contains(&format!("n_dims {n}"))),
            "{e}"
        );
        says(&e, &[NORM, &format!("offset {}", at.start)]);
    }
}

#[test]
fn overlapping_tensors() {
    // UP placed on NORM's data (same start), then NORM placed inside TOK's.
    for (moved, onto, rel) in [(UP, NORM, 256u64), (NORM, TOK, 64)] {
        let mut b = small();
        let at = info_at(&b, moved);
        put_u64(&mut b, at.offset, rel);
        let e = err(b);
        assert!(
            matches!(&e, Error::BadTensor { name, offset, reason } if name == moved && *offset == at.start as u64 && reason.contains("overlaps") && reason.contains(onto)),
            "{e}"
        );
        says(&e, &[moved, onto, &format!("offset {}", at.start)]);
    }
}

// ---------------------------------------------------------------- I2_S and the strict layout

const Q: &str = "blk.0.attn_q.weight";

/// [F32 norm_a, `q_ty` Q, F32 norm_b] with Q's type id patched to 36 (I2_S).
/// `shift` moves Q and norm_b later by that many bytes (making norm_a's gap
/// non-strict) and grows the file to match.
fn as_i2s(q_ty: GgmlType, q_dims: &[u64], shift: u64) -> (Vec<u8>, InfoAt) {
    let specs: [Spec; 3] = [("norm_a", GgmlType::F32, &[128]), (Q, q_ty, q_dims), ("norm_b", GgmlType::F32, &[128])];
    let mut b = build(metadata("bitnet-b1.58"), &specs);
    let q = info_at(&b, Q);
    put_u32(&mut b, q.ty, 36);
    for name in [Q, "norm_b"] {
        let at = info_at(&b, name).offset;
        let rel = get_u64(&b, at);
        put_u64(&mut b, at, rel + shift);
    }
    b.resize(b.len() + shift as usize, 0);
    (b, q)
}

#[test]
fn i2s_size_must_match_a_strict_layout() {
    // An F16 [128, 2] tensor (512 bytes) relabelled 36: I2_S needs 256/4 + 32 = 96.
    let (b, q) = as_i2s(GgmlType::F16, &[128, 2], 0);
    let e = err(b);
    assert!(
        matches!(&e, Error::SizeMismatch { name, offset, type_id: 36, ty: GgmlType::I2_S, expected: 96, padded: 96, gap: 512, .. }
            if name == Q && *offset == q.start as u64),
        "{e}"
    );
    says(&e, &[Q, "type id 36", "I2_S", "96 bytes", "n_elements/4 + 32", "512 bytes", &format!("offset {}", q.start)]);

    // A gap smaller than the I2_S size is refused even when the layout is not
    // strict: TQ1_0 [256] is 54 bytes (64 padded), I2_S needs 96.
    let (b, _) = as_i2s(GgmlType::TQ1_0, &[256], 32);
    let e = err(b);
    assert!(matches!(&e, Error::SizeMismatch { name, expected: 96, gap: 64, .. } if name == Q), "{e}");

    // A larger gap in a layout that is not strict anyway is accepted (lenient).
    let (b, _) = as_i2s(GgmlType::F16, &[128, 2], 32);
    let f = File::from_bytes(b).unwrap();
    assert!(!f.strict_layout);
    assert_eq!(f.tensor(Q).map(|t| (t.ty, t.nbytes)), Some((GgmlType::I2_S, 96)));

    // A genuine I2_S file is strict and reads with the I2_S size.
    let specs: [Spec; 3] =
        [("norm_a", GgmlType::F32, &[128]), (Q, GgmlType::I2_S, &[128, 2]), ("norm_b", GgmlType::F32, &[128])];
    let f = File::from_bytes(build(metadata("bitnet-b1.58"), &specs)).unwrap();
    assert!(f.strict_layout);
    assert_eq!(f.tensor(Q).unwrap().nbytes, 96);
    assert_eq!(f.tensor("norm_b").unwrap().offset - f.tensor(Q).unwrap().offset, 96);
}

/// PrismML's fork first wrote its group-128 Q2_0 (34-byte blocks of 128)
/// under mainline's id 42 (18-byte blocks of 64). Such a tensor leaves too
/// small a gap for mainline's size, so it is refused, not misread: [256, 16]
/// at group 128 is 1088 bytes (IQ2_BN of that shape stands in, its size is
/// the same), mainline's Q2_0 needs 1152.
#[test]
fn q2_0_of_group_128_is_refused() {
    let specs: [Spec; 3] =
        [("norm_a", GgmlType::F32, &[128]), (Q, GgmlType::IQ2_BN, &[256, 16]), ("norm_b", GgmlType::F32, &[128])];
    let mut b = build(metadata("llama"), &specs);
    let q = info_at(&b, Q);
    put_u32(&mut b, q.ty, 42);
    let e = err(b);
    assert!(
        matches!(&e, Error::SizeMismatch { name, type_id: 42, ty: GgmlType::Q2_0, expected: 1152, gap: 1088, .. }
            if name == Q),
        "{e}"
    );
    says(&e, &[Q, "type id 42", "Q2_0", "18 bytes per 64 elements", "1088 bytes"]);

    // Mainline's Q2_0 reads with its own size.
    let specs: [Spec; 3] =
        [("norm_a", GgmlType::F32, &[128]), (Q, GgmlType::Q2_0, &[256, 16]), ("norm_b", GgmlType::F32, &[128])];
    let f = File::from_bytes(build(metadata("llama"), &specs)).unwrap();
    assert!(f.strict_layout);
    assert_eq!(f.tensor(Q).map(|t| (t.ty, t.nbytes)), Some((GgmlType::Q2_0, 1152)));
}

#[test]
fn lenient_layouts_are_flagged_not_strict() {
    // Tensors stored in reverse order, each still aligned and disjoint.
    let mut b = small();
    let (tok, up) = (info_at(&b, TOK).offset, info_at(&b, UP).offset);
    put_u64(&mut b, tok, 384);
    put_u64(&mut b, up, 0);
    b.resize(b.len() + 256, 0);
    let f = File::from_bytes(b).unwrap();
    assert!(!f.strict_layout);
    assert_eq!(f.tensor(UP).unwrap().offset, f.data_start);
    // No tensors: trivially strict.
    assert!(File::from_bytes(build(metadata("llama"), &[])).unwrap().strict_layout);
}

// ---------------------------------------------------------------- robustness

/// xorshift64*: a tiny seeded PRNG so the mutations are reproducible.
/// Random corruption never panics. Most mutations hit the header (where the
/// parsing is); some write "interesting" integers over a field, some truncate.
/// `TERN_GGUF_FUZZ=<n>` runs n mutations instead of 2000 (for longer hunts).
#[test]
fn random_mutations_never_panic() {
    let iters: usize = std::env::var("TERN_GGUF_FUZZ").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let base = small();
    let header_len = File::from_bytes(base.clone()).unwrap().data_start as usize;
    let interesting = [0u64, 1, 2, 5, 9, 31, 32, 36, 255, 1 << 31, 1 << 40, 1 << 62, i64::MAX as u64, u64::MAX];
    let mut rng = Rng::new(0x7465_726e_6767_7566);
    let (mut ok, mut bad) = (0, 0);
    for i in 0..iters {
        let mut b = base.clone();
        for _ in 0..1 + rng.below(4) {
            let at = if rng.below(4) == 0 { rng.below(b.len()) } else { rng.below(header_len) };
            match rng.below(3) {
                0 => b[at] ^= 1 << rng.below(8),
                1 => b[at] = rng.next_u64() as u8,
                _ => {
                    let at = at.min(b.len() - 8);
                    put_u64(&mut b, at, interesting[rng.below(interesting.len())]);
                }
            }
        }
        if i % 10 == 0 {
            b.truncate(rng.below(b.len()));
        }
        match File::from_bytes(b) {
            Ok(f) => {
                ok += 1;
                // Whatever was accepted must be safe to use.
                for t in &f.tensors {
                    assert_eq!(f.tensor_data(t).len() as u64, t.nbytes);
                }
                for (_, v) in f.metadata.entries() {
                    let _ = v.display_short();
                }
            }
            Err(e) => {
                bad += 1;
                let _ = e.to_string();
            }
        }
    }
    assert!(ok > 50 && bad > 500, "accepted {ok}, refused {bad}");
}
