//! Q2_K, Q3_K and IQ4_XS against ggml (no file of these types is in
//! testdata): the decoders on hand-built blocks, whose values the tests
//! derive from ggml's formulas walked in ggml's own loop order, and the
//! quantizers against bytes written by ggml's reference quantizers.

use tern_quant::q4_0::KVALUES_IQ4NL;
use tern_quant::{dequantize_row, quantize_row, row_bytes, GgmlType, TensorScale};
use tern_testutil::Rng;

fn f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn decode(ty: GgmlType, block: &[u8]) -> Vec<f32> {
    let mut y = vec![0.0f32; 256];
    dequantize_row(ty, block, TensorScale::ONE, &mut y);
    y
}

/// Random bytes with a finite f16 (of either sign) at each of `f16_at`.
fn random_blocks(ty: GgmlType, n: usize, f16_fields: &[usize], rng: &mut Rng) -> Vec<u8> {
    let bb = ty.layout().block_bytes;
    let mut raw: Vec<u8> = (0..n * bb).map(|_| rng.next_u64() as u8).collect();
    for b in raw.chunks_exact_mut(bb) {
        for &f in f16_fields {
            b[f..f + 2].copy_from_slice(&f16((rng.uniform() - 0.5) * 0.1));
        }
    }
    raw
}

/// ggml's `dequantize_row_q2_K`: two halves of 128; in each, four shifts;
/// per shift, 16 elements from `qs[l]` and 16 from `qs[l + 16]`, each run
/// taking the next scale byte (low nibble scale, high nibble min).
fn ggml_q2k(b: &[u8]) -> Vec<f32> {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    let mut y = Vec::with_capacity(256);
    let mut is = 0;
    for half in 0..2 {
        let q = &qs[32 * half..];
        for shift in [0, 2, 4, 6] {
            for run in 0..2 {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 15) as f32, dmin * (sc >> 4) as f32);
                for l in 0..16 {
                    y.push(dl * ((q[16 * run + l] >> shift) & 3) as f32 - ml);
                }
            }
        }
    }
    y
}

/// ggml's `dequantize_row_q3_K`: the twelve scale bytes unpacked as four
/// u32 words (low nibbles and high nibbles of words 0 and 1, their top bits
/// from word 2, two bits at a time); then Q2_K's walk, a `hmask` bit
/// `m = 1, 2, 4, ...` per shift, and 4 subtracted where the bit is clear.
fn ggml_q3k(b: &[u8]) -> Vec<f32> {
    let (hmask, qs) = (&b[..32], &b[32..96]);
    let word = |i: usize| u32::from_le_bytes(b[96 + 4 * i..100 + 4 * i].try_into().unwrap());
    let (a0, a1, tmp) = (word(0), word(1), word(2));
    let (m1, m2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let words = [
        (a0 & m2) | ((tmp & m1) << 4),
        (a1 & m2) | (((tmp >> 2) & m1) << 4),
        ((a0 >> 4) & m2) | (((tmp >> 4) & m1) << 4),
        ((a1 >> 4) & m2) | (((tmp >> 6) & m1) << 4),
    ];
    let scales: Vec<i32> = words.iter().flat_map(|w| w.to_le_bytes()).map(|s| s as i32).collect();
    let d = f16_at(b, 108);
    let mut y = Vec::with_capacity(256);
    let (mut is, mut m) = (0, 1u8);
    for half in 0..2 {
        let q = &qs[32 * half..];
        for shift in [0, 2, 4, 6] {
            for run in 0..2 {
                let dl = d * (scales[is] - 32) as f32;
                is += 1;
                for l in 16 * run..16 * run + 16 {
                    let low = ((q[l] >> shift) & 3) as i32;
                    y.push(dl * (low - if hmask[l] & m != 0 { 0 } else { 4 }) as f32);
                }
            }
            m <<= 1;
        }
    }
    y
}

/// ggml's `dequantize_row_iq4_xs`: eight runs of 32, the scale code of run
/// `ib` from nibble `ib % 2` of `scales_l[ib/2]` and bits `2ib..2ib+2` of
/// the u16 `scales_h`; low nibbles of the run's 16 bytes first, then high.
fn ggml_iq4xs(b: &[u8]) -> Vec<f32> {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    let mut y = vec![0.0f32; 256];
    for ib in 0..8 {
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 15) as i32 | (((scales_h >> (2 * ib)) & 3) as i32) << 4;
        let dl = d * (ls - 32) as f32;
        for j in 0..16 {
            let q = qs[16 * ib + j];
            y[32 * ib + j] = dl * KVALUES_IQ4NL[(q & 15) as usize] as f32;
            y[32 * ib + j + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
    y
}

/// Every byte pattern of random blocks decodes to ggml's values, bit for bit.
#[test]
fn decoders_follow_ggml_on_random_blocks() {
    let mut rng = Rng::new(0x0a11);
    type Reference = fn(&[u8]) -> Vec<f32>;
    let cases: [(GgmlType, &[usize], Reference); 3] = [
        (GgmlType::Q2_K, &[80, 82], ggml_q2k),
        (GgmlType::Q3_K, &[108], ggml_q3k),
        (GgmlType::IQ4_XS, &[0], ggml_iq4xs),
    ];
    for (ty, fields, reference) in cases {
        let bb = ty.layout().block_bytes;
        for (i, b) in random_blocks(ty, 200, fields, &mut rng).chunks_exact(bb).enumerate() {
            let (got, want) = (decode(ty, b), reference(b));
            for e in 0..256 {
                assert_eq!(
                    got[e].to_bits(),
                    want[e].to_bits(),
                    "{ty} block {i} element {e}: {} vs {}",
                    got[e],
                    want[e]
                );
            }
        }
    }
}

/// Hand-set fields and the values they must give, worked out by hand from
/// the layouts.
#[test]
fn hand_built_blocks_decode_to_their_values() {
    // Q2_K: d = 1, dmin = 0.5; group 0 (elements 0..16) scale 2, min 3;
    // group 2 (elements 32..48) scale 5, min 1; group 9 (elements 144..160)
    // scale 1, min 15; group 11 (elements 176..192) scale 3, min 2.
    let mut b = [0u8; 84];
    b[0] = 0x32;
    b[2] = 0x15;
    b[9] = 0xF1;
    b[11] = 0x23;
    b[16] = 0b11_10_01_00; // qs[0]: elements 0 (code 0), 32 (1), 64 (2), 96 (3)
    b[16 + 32 + 16] = 0b00_00_11_00; // qs[48]: element 128 + 32 + 16 = 176 (code 3, group 11)
    b[16 + 32] = 0b00_00_10_00; // qs[32]: element 160 (code 2, group 10)
    b[80..82].copy_from_slice(&f16(1.0));
    b[82..84].copy_from_slice(&f16(0.5));
    let y = decode(GgmlType::Q2_K, &b);
    assert_eq!(y[0], 2.0 * 0.0 - 1.5);
    assert_eq!(y[1], -1.5);
    assert_eq!(y[32], 5.0 * 1.0 - 0.5);
    assert_eq!(y[64], 0.0); // group 4: scale and min 0
    assert_eq!(y[144], -7.5); // group 9: code 0, min 15·0.5
    assert_eq!(y[160], 0.0); // group 10: scale 0
    assert_eq!(y[176], 3.0 * 3.0 - 1.0);
    assert_eq!(y, ggml_q2k(&b));

    // Q3_K: d = 0.5; group 0 code 33 (scale 1): low nibble 1 in scales[0],
    // top bits 2 in scales[8] bits 0..2; group 8 code 31 (scale −1): low
    // nibble 15 in scales[0]'s high nibble, top bits 1 at scales[8] bits 4..6.
    let mut b = [0u8; 110];
    b[96] = 0xF1;
    b[96 + 8] = 0b01_00_10;
    b[0] = 0b1; // hmask[0] bit 0: element 0's third bit
    b[32] = 0b11; // qs[0]: element 0 low bits 3 → level 3; element 1 (qs[1]) 0 with no bit → −4
    b[32 + 32] = 0b10; // qs[32]: element 128 (group 8) low bits 2, bit clear → level −2
    b[108..110].copy_from_slice(&f16(0.5));
    let y = decode(GgmlType::Q3_K, &b);
    assert_eq!(y[0], 1.5);
    assert_eq!(y[1], -2.0);
    assert_eq!(y[128], 1.0);
    assert_eq!(y[129], 2.0); // level −4 times −0.5
    assert_eq!(y[16], 64.0); // group 1: code 0 (scale −32), level −4
    assert_eq!(y, ggml_q3k(&b));

    // IQ4_XS: d = 0.25; sub-block 0 code 47 (scale 15), sub-block 1 code 17 (−15).
    let mut b = [0u8; 136];
    b[0..2].copy_from_slice(&f16(0.25));
    b[2..4].copy_from_slice(&0b01_10u16.to_le_bytes());
    b[4] = 0x1F;
    b[8] = 0x8F; // element 0: index 15 (113); element 16: index 8 (1)
    b[8 + 16] = 0x70; // element 32: index 0 (−127); element 48: index 7 (−10)
    let y = decode(GgmlType::IQ4_XS, &b);
    assert_eq!(y[0], 0.25 * 15.0 * 113.0);
    assert_eq!(y[16], 0.25 * 15.0);
    assert_eq!(y[32], 0.25 * -15.0 * -127.0);
    assert_eq!(y[48], 0.25 * -15.0 * -10.0);
    assert_eq!(y[64], 0.25 * -32.0 * -127.0); // sub-block 2: code 0, index 0
    assert_eq!(y, ggml_iq4xs(&b));
}

/// 24 blocks of test data of eight kinds: Gaussian, small with outliers,
/// all positive, all negative, half zero, every third group zero, values
/// on a grid of quarter steps (ties for the rounding), one spike.
fn reference_input() -> Vec<f32> {
    let mut rng = Rng::new(0x9917);
    let mut x = Vec::with_capacity(24 * 256);
    for b in 0..24 {
        for i in 0..256 {
            let v = rng.normal();
            x.push(match b % 8 {
                0 => v,
                1 => v * 1e-3 * if rng.uniform() < 0.02 { 20.0 } else { 1.0 },
                2 => v.abs() * 3.0,
                3 => -v.abs() * 0.2,
                4 => {
                    if i < 128 {
                        0.0
                    } else {
                        v
                    }
                }
                5 => {
                    if (i / 16) % 3 == 0 {
                        0.0
                    } else {
                        v * 40.0
                    }
                }
                6 => (v * 4.0).round() * 0.25,
                _ => {
                    if i == (b * 7) % 256 {
                        5.0
                    } else {
                        v * 1e-3
                    }
                }
            });
        }
    }
    x
}

/// FNV-1a (64-bit) of each block's bytes.
fn block_hashes(bytes: &[u8], bb: usize) -> Vec<u64> {
    let fnv = |b: &[u8]| b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3));
    bytes.chunks_exact(bb).map(fnv).collect()
}

/// The bytes ggml's `quantize_row_q2_K_ref`, `quantize_row_q3_K_ref` and
/// `quantize_row_iq4_xs_ref` write for [`reference_input`], as per-block
/// FNV-1a hashes (from ggml-org/ggml d99724f, `ggml-quants.c` built
/// without FMA contraction as ggml-base is).
const GGML_Q2_K: [u64; 24] = [
    0xe721cfda17441d59,
    0xcc856795e1fc96b9,
    0x81e6b8cdb8a29333,
    0x3d4ccc5cb47c0017,
    0x37e02023763993fd,
    0x01f9b7892a4209b9,
    0xf4c6f6a9ece84739,
    0x9c4193307d92b054,
    0x44250ad1ffd7864e,
    0xccc60cbd2a147798,
    0x1a2e2833bafd1aa9,
    0xa9c7f1b239e9cabd,
    0xb6122ecf28b5dab3,
    0xbfb4d0002302ee29,
    0x7faa6db83d0a6a67,
    0xa59252cf4be9c18c,
    0xe2fc1ce9858794ec,
    0x6ac44e94bf5a1376,
    0x56ec9207edbcd1cd,
    0x5c781856ccaf5bed,
    0x17e5f814e1a54fd8,
    0x1249cc8bb1f21bc5,
    0xf432193a125a1927,
    0xade02bf71243958c,
];
const GGML_Q3_K: [u64; 24] = [
    0x8d8ab8f5d4fb12f4,
    0x620bbae557110839,
    0x139931a05ca920dd,
    0x313528b9296e8f38,
    0x97c0b06c7e793d93,
    0xafeddff450c01f7c,
    0xb46c6881447c5d68,
    0x265ea741d00c35fb,
    0xef2ecc42ae572439,
    0x60e44794a919f392,
    0x7b07928f49383092,
    0xdf254d1801eda39d,
    0x7fcf70a429e405c3,
    0xdc156aa6c873988b,
    0x486a19872cefcf2d,
    0x35da4f28b95aa382,
    0x954148d92c3c235b,
    0x3e4dc1ce8f625f36,
    0x22ca80aa608e1bd2,
    0xd3c3c1a4133070d1,
    0x0d867dd47719e51c,
    0x9a55c6ccf0d058cd,
    0x48cde7c3d7ab2294,
    0x11166e187c12b4e4,
];
const GGML_IQ4_XS: [u64; 24] = [
    0xe181416c21f50f07,
    0x331372f8209352c5,
    0x8e909b96ff3e8f1a,
    0x1a052e6561f052d4,
    0xd41a988a1d40d009,
    0x6196f87b69734ae5,
    0xa8124e549f41ce1f,
    0x680f63c1d6adfc5c,
    0xa78734404a7b559c,
    0x0aed0ccac66f021f,
    0x6a41294658a1b0df,
    0x54a92bceceda5c50,
    0x6cab0a6ef451db7d,
    0xd8097123ffb80de1,
    0xed02174b87ea37a5,
    0xcc0b4ed4d4e49769,
    0x0f2d3fddcacb119a,
    0x50fb0c007af868dd,
    0x1bcb7d6a5c8d4c33,
    0x9aec040ef26b2916,
    0x59232233cdec1ad1,
    0x60d3234494122ba9,
    0x2c9ec11abece01f6,
    0x1529184769b83151,
];

/// Our quantizers write ggml's reference bytes, block for block.
#[test]
fn quantizers_write_ggml_reference_bytes() {
    let x = reference_input();
    for (ty, want) in [(GgmlType::Q2_K, GGML_Q2_K), (GgmlType::Q3_K, GGML_Q3_K), (GgmlType::IQ4_XS, GGML_IQ4_XS)] {
        let mut q = vec![0u8; row_bytes(ty, x.len())];
        quantize_row(ty, &x, &mut q);
        let got = block_hashes(&q, ty.layout().block_bytes);
        for (b, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{ty} block {b} (kind {}) differs from ggml's", b % 8);
        }
    }
}

/// What ggml's reference quantizers guarantee about the scales they write:
/// the largest fitted scale (and min) takes the top code, so the f16
/// super-scales are those extremes over the code range. (Re-quantizing a
/// dequantized block does not in general give the same bytes: the fits
/// search trial scales, and the decoded values move the optimum. On Gaussian
/// blocks about 99% (Q2_K), 95% (IQ4_XS) and 53% (Q3_K) do.)
#[test]
fn reference_quantizers_put_the_extreme_scale_at_the_end_of_the_code_range() {
    let mut rng = Rng::new(0x5ca1e);
    let x: Vec<f32> = (0..64 * 256).map(|i| rng.normal() * if i / 256 % 2 == 0 { 1.0 } else { 0.02 }).collect();
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_XS] {
        let mut q = vec![0u8; row_bytes(ty, x.len())];
        quantize_row(ty, &x, &mut q);
        for (i, b) in q.chunks_exact(ty.layout().block_bytes).enumerate() {
            match ty {
                // Scale and min codes 0..=15: some group has each at 15.
                GgmlType::Q2_K => {
                    assert!(b[..16].iter().any(|&s| s & 15 == 15), "Q2_K block {i}: no scale code 15");
                    assert!(b[..16].iter().any(|&s| s >> 4 == 15), "Q2_K block {i}: no min code 15");
                    assert!(f16_at(b, 80) > 0.0 && f16_at(b, 82) >= 0.0, "Q2_K block {i}");
                }
                // Signed codes: the scale of largest magnitude is −32·d (code 0).
                GgmlType::Q3_K => {
                    let y = ggml_q3k(b);
                    let has_code0 = (0..16).any(|g| {
                        let low = if g < 8 { b[96 + g] & 15 } else { b[96 + g - 8] >> 4 };
                        low == 0 && (b[104 + g % 4] >> (2 * (g / 4))) & 3 == 0
                    });
                    assert!(has_code0 && y.iter().any(|&v| v != 0.0), "Q3_K block {i}: no scale code 0");
                }
                _ => {
                    let scales_h = u16::from_le_bytes([b[2], b[3]]);
                    let code =
                        |ib: usize| (b[4 + ib / 2] >> (4 * (ib % 2))) & 15 | (((scales_h >> (2 * ib)) & 3) as u8) << 4;
                    assert!((0..8).any(|ib| code(ib) == 0), "IQ4_XS block {i}: no scale code 0");
                }
            }
        }
    }
}

/// An all-zero block: ggml's quantizers write zero scales (IQ4_XS: the f16
/// of −0, code 32 and table index 8 everywhere), and the block decodes to zeros.
#[test]
fn zero_blocks_are_ggml_s() {
    let x = [0.0f32; 256];
    let mut q = vec![0u8; 84];
    quantize_row(GgmlType::Q2_K, &x, &mut q);
    assert!(q.iter().all(|&b| b == 0));
    let mut q = vec![0u8; 110];
    quantize_row(GgmlType::Q3_K, &x, &mut q);
    assert!(q.iter().all(|&b| b == 0));
    let mut q = vec![0u8; 136];
    quantize_row(GgmlType::IQ4_XS, &x, &mut q);
    assert_eq!(&q[..8], &[0x00, 0x80, 0xAA, 0xAA, 0, 0, 0, 0]);
    assert!(q[8..].iter().all(|&b| b == 0x88));
    assert!(decode(GgmlType::IQ4_XS, &q).iter().all(|&v| v == 0.0));
}
