//! The reader: parse the header, metadata and tensor infos from a byte slice
//! (normally an mmap), validating everything before any tensor is touched.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::types::GgmlType;
use crate::value::{Array, Metadata, Value, ValueType};
use crate::MAX_DIMS;

pub const MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
const ALIGNMENT_KEY: &str = "general.alignment";
/// Strings longer than this are refused: no real key, token or name comes close.
const MAX_STRING: u64 = 1 << 30;

/// One tensor's header entry. `offset` is absolute in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions, `ne[0]` innermost; always `MAX_DIMS` long, missing dims are 1.
    pub ne: [u64; MAX_DIMS],
    pub n_dims: usize,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Exact number of data bytes.
    pub nbytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// The dims that were written (`n_dims` of them).
    pub fn dims(&self) -> &[u64] {
        &self.ne[..self.n_dims]
    }
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An opened, validated GGUF file. Cheap to clone (the bytes are shared).
#[derive(Clone)]
pub struct File {
    bytes: Arc<Bytes>,
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_start: u64,
    /// True when the tensors are laid out exactly as mainline ggml writes and
    /// requires them: in info order from offset 0, each padded to the
    /// alignment (`offset[i+1] == offset[i] + align_up(nbytes[i])`). Files
    /// without it are still accepted when every tensor is aligned, in bounds
    /// and disjoint, but mainline llama.cpp would refuse them. Trailing padding
    /// after the last tensor is not part of this relation.
    pub strict_layout: bool,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("version", &self.version)
            .field("n_kv", &self.metadata.entries().len())
            .field("n_tensors", &self.tensors.len())
            .field("strict_layout", &self.strict_layout)
            .finish()
    }
}

impl File {
    /// Memory-maps and validates `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<File> {
        let path = path.as_ref();
        let io = |source| Error::Io { path: path.display().to_string(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; like every mmap-based loader we assume
        // the file is not truncated by another process while we hold it.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        File::parse(Bytes::Mapped(map))
    }

    /// Validates an in-memory image (tests, fuzzing, network input).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<File> {
        File::parse(Bytes::Owned(bytes))
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The data bytes of a tensor (already bounds-checked at open).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.bytes()[info.offset as usize..(info.offset + info.nbytes) as usize]
    }

    /// Tells the OS that the bytes `[offset, offset + len)` will not be read
    /// again (a backend copied or repacked them), so their pages leave the
    /// process's resident set. Reading them later is still valid: the mapping
    /// is read-only and pages come back from the file.
    pub fn release(&self, offset: u64, len: u64) {
        #[cfg(unix)]
        if let Bytes::Mapped(m) = &*self.bytes {
            let end = offset.saturating_add(len).min(m.len() as u64);
            if offset < end {
                // SAFETY: a read-only private file mapping: MADV_DONTNEED only
                // drops clean pages, which a later read faults back in.
                let _ = unsafe {
                    m.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        offset as usize,
                        (end - offset) as usize,
                    )
                };
            }
        }
    }

    pub fn architecture(&self) -> Result<&str> {
        self.metadata.str("general.architecture")
    }

    fn parse(bytes: Bytes) -> Result<File> {
        let (version, metadata, alignment, data_start, layout) = {
            let buf = bytes.as_slice();
            let mut r = Cursor { buf, pos: 0 };
            let magic: [u8; 4] = r.take(4, &"magic")?.try_into().expect("4 bytes");
            if magic != MAGIC {
                return Err(Error::BadMagic { found: magic });
            }
            let version = r.u32(&"version")?;
            if version != 2 && version != 3 {
                let hint = if version & 0xffff == 0 { "; this looks like a big-endian file" } else { "" };
                return Err(Error::BadVersion { version, hint });
            }
            // Smallest tensor info: empty name, one dim.
            let n_tensors = r.count(&"tensor", 8 + 4 + 8 + 4 + 8)?;
            // Smallest KV: a one-byte key, its type, a one-byte value.
            let n_kv = r.count(&"metadata key", 8 + 1 + 4 + 1)?;
            let metadata = read_metadata(&mut r, n_kv)?;
            let alignment = match metadata.get(ALIGNMENT_KEY) {
                Some(Value::U32(a)) => *a as u64, // validated in read_metadata
                _ => DEFAULT_ALIGNMENT,
            };
            let infos = read_tensor_infos(&mut r, n_tensors)?;
            let data_start = if infos.is_empty() { r.pos } else { align_up(r.pos, alignment) };
            let layout = resolve_tensors(infos, data_start, alignment, buf.len() as u64, &metadata)?;
            (version, metadata, alignment, data_start, layout)
        };
        let (tensors, strict_layout) = layout;
        Ok(File { bytes: Arc::new(bytes), version, metadata, tensors, alignment, data_start, strict_layout })
    }
}

pub(crate) fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// `align_up` for sizes taken from untrusted dims, which may be near `u64::MAX`.
fn checked_align_up(x: u64, a: u64) -> Option<u64> {
    x.div_ceil(a).checked_mul(a)
}

/// Reads little-endian fields from the image. `what` describes the field for
/// error messages; it is a `Display` so callers can name the key or tensor
/// without allocating unless something fails.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: u64,
}

type What<'w> = &'w dyn std::fmt::Display;

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        self.buf.len() as u64 - self.pos
    }

    fn file_size(&self) -> u64 {
        self.buf.len() as u64
    }

    fn take(&mut self, n: u64, what: What) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::Truncated {
                what: what.to_string(),
                offset: self.pos,
                needed: n,
                file_size: self.file_size(),
            });
        }
        let s = &self.buf[self.pos as usize..(self.pos + n) as usize];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("exact length"))
    }

    fn u32(&mut self, what: What) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: What) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items that each need at least `min_item_bytes`; refuses counts
    /// the rest of the file cannot hold, so later allocations stay bounded.
    fn count(&mut self, what: What, min_item_bytes: u64) -> Result<u64> {
        let offset = self.pos;
        let count = self.u64(what)?;
        if count.checked_mul(min_item_bytes).is_none_or(|need| need > self.remaining()) {
            return Err(Error::HugeCount { what: what.to_string(), count, offset, file_size: self.file_size() });
        }
        Ok(count)
    }

    /// A length longer than the whole file (or absurdly long) is a corrupt
    /// count; one that merely runs past the end is a truncated file.
    fn string(&mut self, what: What) -> Result<String> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > MAX_STRING || len > self.file_size() {
            return Err(Error::HugeCount {
                what: format!("length of {what}"),
                count: len,
                offset: at,
                file_size: self.file_size(),
            });
        }
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec())
            .map_err(|_| Error::BadKey { offset: at, reason: format!("{what} is not UTF-8") })
    }
}

fn read_metadata(r: &mut Cursor, n_kv: u64) -> Result<Metadata> {
    let mut md = Metadata::new();
    for i in 0..n_kv {
        let at = r.pos;
        let key = r.string(&format_args!("metadata key #{i}"))?;
        if key.is_empty() {
            return Err(Error::BadKey { offset: at, reason: format!("key #{i} is empty") });
        }
        let type_at = r.pos;
        let type_id = r.u32(&format_args!("value type of {key:?}"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| Error::UnknownValueType {
            key: key.clone(),
            offset: type_at,
            type_id,
        })?;
        let value_at = r.pos;
        let value = read_value(r, ty, &key)?;
        // Checked here, where the offset is known; ggml refuses anything but a u32 power of two.
        if key == ALIGNMENT_KEY && !matches!(value, Value::U32(a) if a.is_power_of_two()) {
            return Err(Error::BadMetadata {
                key,
                offset: value_at,
                reason: format!("must be a u32 power of two, found {:?} {}", ty, value.display_short()),
            });
        }
        if md.contains(&key) {
            return Err(Error::DuplicateKey { key, offset: at });
        }
        md.push_unique(key, value);
    }
    Ok(md)
}

fn read_bool(r: &mut Cursor, key: &str) -> Result<bool> {
    let at = r.pos;
    match r.array::<1>(&format_args!("{key:?}"))?[0] {
        0 => Ok(false),
        1 => Ok(true),
        b => {
            Err(Error::BadMetadata { key: key.into(), offset: at, reason: format!("bool byte {b} is neither 0 nor 1") })
        }
    }
}

fn read_value(r: &mut Cursor, ty: ValueType, key: &str) -> Result<Value> {
    let k = &format_args!("{key:?}");
    Ok(match ty {
        ValueType::U8 => Value::U8(r.array::<1>(k)?[0]),
        ValueType::I8 => Value::I8(r.array::<1>(k)?[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(r.array(k)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(r.array(k)?)),
        ValueType::U32 => Value::U32(r.u32(k)?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(r.array(k)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(r.array(k)?)),
        ValueType::U64 => Value::U64(r.u64(k)?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(r.array(k)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(r.array(k)?)),
        ValueType::Bool => Value::Bool(read_bool(r, key)?),
        ValueType::String => Value::String(r.string(k)?),
        ValueType::Array => Value::Array(read_array(r, key)?),
    })
}

fn read_array(r: &mut Cursor, key: &str) -> Result<Array> {
    let k = &format_args!("{key:?}");
    let at = r.pos;
    let type_id = r.u32(&format_args!("element type of {key:?}"))?;
    let ty =
        ValueType::from_id(type_id).ok_or_else(|| Error::UnknownValueType { key: key.into(), offset: at, type_id })?;
    if ty == ValueType::Array {
        return Err(Error::BadMetadata { key: key.into(), offset: at, reason: "nested arrays are not allowed".into() });
    }
    // A string needs at least its 8-byte length.
    let min = ty.scalar_size().unwrap_or(8) as u64;
    let n = r.count(&format_args!("element of {key:?}"), min)? as usize;
    macro_rules! collect {
        ($variant:ident, $read:expr) => {{
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push($read);
            }
            Array::$variant(v)
        }};
    }
    Ok(match ty {
        ValueType::U8 => Array::U8(r.take(n as u64, k)?.to_vec()),
        ValueType::I8 => Array::I8(r.take(n as u64, k)?.iter().map(|&b| b as i8).collect()),
        ValueType::U16 => collect!(U16, u16::from_le_bytes(r.array(k)?)),
        ValueType::I16 => collect!(I16, i16::from_le_bytes(r.array(k)?)),
        ValueType::U32 => collect!(U32, r.u32(k)?),
        ValueType::I32 => collect!(I32, i32::from_le_bytes(r.array(k)?)),
        ValueType::F32 => collect!(F32, f32::from_le_bytes(r.array(k)?)),
        ValueType::U64 => collect!(U64, r.u64(k)?),
        ValueType::I64 => collect!(I64, i64::from_le_bytes(r.array(k)?)),
        ValueType::F64 => collect!(F64, f64::from_le_bytes(r.array(k)?)),
        ValueType::Bool => collect!(Bool, read_bool(r, key)?),
        ValueType::String => collect!(String, r.string(k)?),
        ValueType::Array => unreachable!("rejected above"),
    })
}

/// A tensor info as written, before its type id is resolved.
struct RawInfo {
    name: String,
    info_offset: u64,
    ne: [u64; MAX_DIMS],
    n_dims: usize,
    type_id: u32,
    rel_offset: u64,
}

fn read_tensor_infos(r: &mut Cursor, n: u64) -> Result<Vec<RawInfo>> {
    let mut out = Vec::with_capacity(n as usize);
    let mut seen = HashSet::new();
    for i in 0..n {
        let info_offset = r.pos;
        let name = r.string(&format_args!("name of tensor #{i}"))?;
        let bad = |reason: String| Error::BadTensor { name: name.clone(), offset: info_offset, reason };
        let n_dims = r.u32(&format_args!("n_dims of tensor {name:?}"))? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad(format!("n_dims {n_dims} is outside 1..={MAX_DIMS}")));
        }
        let mut ne = [1u64; MAX_DIMS];
        for (j, d) in ne.iter_mut().take(n_dims).enumerate() {
            *d = r.u64(&format_args!("ne[{j}] of tensor {name:?}"))?;
            if *d == 0 || *d > i64::MAX as u64 {
                return Err(bad(format!("ne[{j}] = {d} is not a positive int64")));
            }
        }
        // ggml counts elements in int64; anything larger cannot be addressed.
        if ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).is_none_or(|n| n > i64::MAX as u64) {
            return Err(bad(format!("dims {:?} overflow the element count", &ne[..n_dims])));
        }
        let type_id = r.u32(&format_args!("type of tensor {name:?}"))?;
        let rel_offset = r.u64(&format_args!("data offset of tensor {name:?}"))?;
        if !seen.insert(name.clone()) {
            return Err(Error::DuplicateTensor { name, offset: info_offset });
        }
        out.push(RawInfo { name, info_offset, ne, n_dims, type_id, rel_offset });
    }
    Ok(out)
}

/// Resolves every type id (docs/spec/gguf.md §3), checks sizes against the layout,
/// and checks every tensor lies inside the file, aligned and disjoint.
/// Returns the tensors and whether the layout is strict.
fn resolve_tensors(
    infos: Vec<RawInfo>,
    data_start: u64,
    alignment: u64,
    file_size: u64,
    metadata: &Metadata,
) -> Result<(Vec<TensorInfo>, bool)> {
    let is_ms_bitnet = metadata
        .get("general.architecture")
        .and_then(Value::as_str)
        .is_some_and(|a| matches!(a, "bitnet" | "bitnet-b1.58" | "bitnet-25"));
    let mut out = Vec::with_capacity(infos.len());
    for raw in &infos {
        let bad = |reason: String| Error::BadTensor { name: raw.name.clone(), offset: raw.info_offset, reason };
        let ty = resolve_type(raw, is_ms_bitnet)?;
        let ne = raw.ne;
        let nbytes = ty.tensor_bytes(&ne).ok_or_else(|| {
            bad(format!("{ty} needs ne[0] to be a multiple of {}, got {:?}", ty.block_elems(), &ne[..raw.n_dims]))
        })?;
        if raw.rel_offset % alignment != 0 {
            return Err(bad(format!("data offset {} is not a multiple of the alignment {alignment}", raw.rel_offset)));
        }
        let offset = data_start.checked_add(raw.rel_offset).ok_or_else(|| bad("data offset overflows".into()))?;
        out.push(TensorInfo { name: raw.name.clone(), ty, ne, n_dims: raw.n_dims, offset, nbytes });
    }
    // Before the bounds and overlap checks, so that a misread type id gets
    // the error that explains it rather than a generic overlap.
    let strict = check_layout(&out, &infos, alignment)?;
    for (t, raw) in out.iter().zip(&infos) {
        let end = t.offset.checked_add(t.nbytes).filter(|&e| e <= file_size);
        if end.is_none() {
            return Err(Error::BadTensor {
                name: t.name.clone(),
                offset: raw.info_offset,
                reason: format!(
                    "data at {} ({} bytes of {}) runs past the end of the file ({file_size} bytes)",
                    t.offset, t.nbytes, t.ty
                ),
            });
        }
    }
    check_no_overlap(&out, &infos)?;
    Ok((out, strict))
}

fn resolve_type(raw: &RawInfo, is_ms_bitnet: bool) -> Result<GgmlType> {
    let unknown = |hint: &'static str| Error::UnknownType {
        name: raw.name.clone(),
        offset: raw.info_offset,
        type_id: raw.type_id,
        hint,
    };
    match raw.type_id {
        38 if is_ms_bitnet => Err(unknown(
            " (Microsoft TL1: its layout depends on per-model generated kernels; convert the model to I2_S or TQ2_0)",
        )),
        39 if is_ms_bitnet => Err(unknown(
            " (Microsoft TL2: its layout depends on per-model generated kernels; convert the model to I2_S or TQ2_0)",
        )),
        id => GgmlType::from_id(id).ok_or_else(|| unknown("")),
    }
}

/// The ids whose meaning differs between forks (spec §2.1), so their size must
/// be confirmed by the layout. 36 is I2_S only in ik's and Microsoft's trees;
/// 42 is mainline's Q2_0 (64-element blocks), but PrismML's fork first wrote
/// its group-128 variant (34-byte blocks) under the same id. 41 is Q1_0 in
/// both.
fn is_ambiguous(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::I2_S | GgmlType::Q2_0)
}

/// Size rule shown when an ambiguous type's size disagrees with the layout.
fn size_rule(ty: GgmlType) -> &'static str {
    match ty {
        GgmlType::I2_S => "n_elements/4 + 32",
        GgmlType::Q2_0 => "18 bytes per 64 elements",
        _ => "blocks x block bytes",
    }
}

/// Spec §3 rule 1: the strict relation between consecutive offsets doubles
/// as a check that each type id was read with the right size. Returns whether
/// the layout is strict. An ambiguous-type tensor whose gap to the next
/// tensor disagrees with its size is an error when the gap is too small
/// (its data would overlap the next) or when every other tensor follows the
/// strict relation (so the writer clearly used it, and read its type
/// differently). Other non-strict layouts are accepted.
fn check_layout(tensors: &[TensorInfo], raw: &[RawInfo], alignment: u64) -> Result<bool> {
    let Some(first) = raw.first() else { return Ok(true) };
    let starts_at_zero = first.rel_offset == 0;
    // gap[i]: bytes from tensor i's data to tensor i+1's (None if out of order).
    let gaps: Vec<Option<u64>> = raw.windows(2).map(|w| w[1].rel_offset.checked_sub(w[0].rel_offset)).collect();
    let fits = |i: usize| {
        let padded = checked_align_up(tensors[i].nbytes, alignment);
        padded.is_some() && gaps[i] == padded
    };
    let strict = starts_at_zero && (0..gaps.len()).all(fits);
    if strict {
        return Ok(true);
    }
    let others_strict = starts_at_zero && (0..gaps.len()).all(|i| is_ambiguous(tensors[i].ty) || fits(i));
    for (i, &gap) in gaps.iter().enumerate() {
        let t = &tensors[i];
        let Some(gap) = gap else { continue };
        if !is_ambiguous(t.ty) || fits(i) {
            continue;
        }
        let padded = checked_align_up(t.nbytes, alignment).unwrap_or(u64::MAX);
        if gap < padded || others_strict {
            return Err(Error::SizeMismatch {
                name: t.name.clone(),
                offset: raw[i].info_offset,
                type_id: raw[i].type_id,
                ty: t.ty,
                rule: size_rule(t.ty),
                expected: t.nbytes,
                padded,
                gap,
            });
        }
    }
    Ok(false)
}

/// Two tensors must never share bytes; a file that claims so is corrupt (or
/// its sizes were misread, which is how an I2_S/other-fork mix-up shows).
fn check_no_overlap(tensors: &[TensorInfo], raw: &[RawInfo]) -> Result<()> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.nbytes > b.offset {
            return Err(Error::BadTensor {
                name: b.name.clone(),
                offset: raw[w[1]].info_offset,
                reason: format!("its data at {} overlaps {:?} ({} bytes of {})", b.offset, a.name, a.nbytes, a.ty),
            });
        }
    }
    Ok(())
}
