//! The argument structs against the kernels' `extern "C"` signatures in
//! `kernels/*.cu`, and the integer codes against prelude.cuh's enums. No
//! GPU or NVRTC is needed: both read the embedded sources.

use std::collections::HashMap;

use super::*;
use crate::kernels::SOURCES;

const PRELUDE: &str = include_str!("../kernels/prelude.cuh");

/// The `Arg` variant a parameter of C type `ty` takes.
fn c_kind(ty: &str) -> &'static str {
    if ty.contains('*') {
        return "Ptr";
    }
    match ty.split_whitespace().last() {
        Some("u64") => "U64",
        // Four bytes either way; `Enc::u32` passes a u32 as `Arg::I32`.
        Some("int" | "u32") => "I32",
        Some("float") => "F32",
        Some("TernaryBatch") => "Batch",
        Some("AttRope") => "Rope",
        Some("TmaMap") => "Map",
        _ => panic!("no argument kind for the C type {ty:?}"),
    }
}

fn arg_kind(a: &Arg) -> &'static str {
    match a {
        Arg::Ptr(_) => "Ptr",
        Arg::U64(_) => "U64",
        Arg::I32(_) => "I32",
        Arg::F32(_) => "F32",
        Arg::Batch(_) => "Batch",
        Arg::Rope(_) => "Rope",
        Arg::Map(_) => "Map",
    }
}

/// The index of the parenthesis closing the one at `open`.
fn close_paren(s: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in s[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return open + i;
        }
    }
    panic!("unbalanced parentheses after byte {open}")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every `extern "C"` entry point of `src` and its parameters' C types. An
/// entry point a macro defines (named `NAME`) is listed under the first
/// argument of each line that invokes the macro.
fn signatures(src: &str) -> Vec<(String, Vec<String>)> {
    let src = src.replace("\\\n", " ");
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = src[at..].find("extern \"C\"") {
        let start = at + i;
        // The name is the identifier before the first parenthesis that is
        // not `__launch_bounds__`'s.
        let mut from = start;
        let (name, open) = loop {
            let open = from + src[from..].find('(').expect("a parameter list");
            let name = src[..open].trim_end().rsplit(|c: char| !is_ident(c)).next().unwrap_or_default();
            if name == "__launch_bounds__" {
                from = close_paren(&src, open) + 1;
                continue;
            }
            break (name.to_string(), open);
        };
        let close = close_paren(&src, open);
        let types: Vec<String> = src[open + 1..close]
            .split(',')
            .map(|p| {
                let p = p.trim();
                let ty = p.trim_end_matches(is_ident);
                assert!(!ty.trim().is_empty(), "{name}: a parameter without a type: {p:?}");
                ty.trim().to_string()
            })
            .collect();
        if name == "NAME" {
            let def = src[..start].rfind("#define ").expect("the macro defining NAME");
            let mac = src[def + 8..].split('(').next().unwrap_or_default().trim();
            let uses: Vec<_> = src
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("{mac}(")))
                .map(|rest| rest.split(',').next().unwrap_or_default().trim().to_string())
                .collect();
            assert!(!uses.is_empty(), "{mac} defines kernels but is never used");
            out.extend(uses.into_iter().map(|n| (n, types.clone())));
        } else {
            out.push((name, types));
        }
        at = close;
    }
    out
}

/// Each kernel's struct encodes, in order, an argument of the kind each
/// parameter of its `extern "C"` signature takes; every kernel has one
/// struct.
#[test]
fn argument_structs_match_the_kernel_signatures() {
    let mut sigs: HashMap<String, Vec<String>> = HashMap::new();
    for (_, body) in SOURCES {
        for (name, types) in signatures(body) {
            let seen = sigs.entry(name.clone()).or_insert_with(|| types.clone());
            assert_eq!(*seen, types, "{name} is declared twice, differently");
        }
    }
    let mut covered = Vec::new();
    for args in Args::every() {
        let kinds: Vec<_> = args.encode().args.iter().map(arg_kind).collect();
        for &k in args.kernels() {
            let entry = k.symbol().1;
            let types = sigs.get(entry).unwrap_or_else(|| panic!("{k:?}: no signature of {entry} in kernels/"));
            let want: Vec<_> = types.iter().map(|t| c_kind(t)).collect();
            assert_eq!(kinds, want, "{k:?} ({entry}: {types:?})");
            covered.push(k);
        }
    }
    for k in Kernel::ALL {
        assert_eq!(covered.iter().filter(|&&c| c == k).count(), 1, "{k:?} needs exactly one argument struct");
    }
    // The parser read the macro-defined entry points too.
    for entry in ["q8_gemv1", "q6k_gemv", "ternary_gemv1", "ternary_gemm_wg_narrow"] {
        assert!(sigs.contains_key(entry), "{entry}");
    }
}

/// `enum NAME { CONST = value, ... };` lines of prelude.cuh.
fn c_enums(src: &str) -> HashMap<String, Vec<(String, i32)>> {
    let mut out = HashMap::new();
    for line in src.lines() {
        let Some(rest) = line.strip_prefix("enum ") else { continue };
        let (name, body) = rest.split_once('{').expect("an enum body");
        let body = body.split('}').next().unwrap_or_default();
        let values = body
            .split(',')
            .map(|c| {
                let (k, v) = c.split_once('=').expect("explicit values");
                (k.trim().to_string(), v.trim().parse().expect("an integer"))
            })
            .collect();
        out.insert(name.trim().to_string(), values);
    }
    out
}

/// The host's codes are the kernels' (prelude.cuh).
#[test]
fn integer_codes_match_the_prelude() {
    let c = c_enums(PRELUDE);
    let want = |pairs: &[(&str, i32)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect::<Vec<_>>();
    assert_eq!(
        c["Act"],
        want(&[("ACT_NONE", Act::None as i32), ("ACT_SILU", Act::Silu as i32), ("ACT_RELU2", Act::Relu2 as i32)])
    );
    assert_eq!(c["RopeMode"], want(&[("ROPE_NORM", RopeMode::Norm as i32), ("ROPE_NEOX", RopeMode::Neox as i32)]));
    assert_eq!(c["BinOp"], want(&[("BIN_ADD", BinOp::Add as i32), ("BIN_MUL", BinOp::Mul as i32)]));
    let fused = [
        ("FUSED_LEVELS", FusedMode::Levels as i32),
        ("FUSED_BLOCK", FusedMode::Block as i32),
        ("FUSED_STATS", FusedMode::Stats as i32),
    ];
    assert_eq!(c["Fused"], want(&fused));
    let gating = [("GATE_SOFTMAX", Gating::Softmax as i32), ("GATE_SIGMOID", Gating::Sigmoid as i32)];
    assert_eq!(c["Gating"], want(&gating));
    assert_eq!(c.len(), 5, "a new enum in prelude.cuh wants its host twin here");
}

/// A `decode_run` launch refuses to run until its table is bound, and
/// encodes in signature order once it is.
#[test]
fn late_arguments_are_refused_until_bound() {
    let a = DecodeRunArgs { n: 5, ..Default::default() };
    assert!(Args::from(a).encode().unbound);
    let bound = DecodeRunArgs { phases: Some(0x1100), bar: Some(0x1000), ..a };
    let e = Args::from(bound).encode();
    assert!(!e.unbound);
    assert_eq!(e.args[..3], [Arg::Ptr(0x1100), Arg::I32(5), Arg::Ptr(0x1000)]);
}
