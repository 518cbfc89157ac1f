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
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("version", &self.version)
            .field("n_kv", &self.metadata.entries().len())
            .field("n_tensors", &self.tensors.len())
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

    pub fn architecture(&self) -> Result<&str> {
        self.metadata.str("general.architecture")
    }

    fn parse(bytes: Bytes) -> Result<File> {
        let (version, metadata, tensors, alignment, data_start) = {
            let buf = bytes.as_slice();
            let mut r = Cursor { buf, pos: 0 };
            let magic: [u8; 4] = r.take(4, "magic")?.try_into().expect("4 bytes");
            if magic != MAGIC {
                return Err(Error::BadMagic { found: magic });
            }
            let version = r.u32("version")?;
            if version != 2 && version != 3 {
                let hint = if version & 0xffff == 0 { "; this looks like a big-endian file" } else { "" };
                return Err(Error::BadVersion { version, hint });
            }
            let n_tensors = r.count("tensor", 8 + 4 + 8 + 4 + 8)?;
            let n_kv = r.count("metadata key", 8 + 4)?;
            let metadata = read_metadata(&mut r, n_kv)?;
            let alignment = match metadata.get(ALIGNMENT_KEY) {
                None => DEFAULT_ALIGNMENT,
                Some(Value::U32(a)) if a.is_power_of_two() => *a as u64,
                Some(v) => {
                    return Err(Error::BadValue {
                        key: ALIGNMENT_KEY.into(),
                        reason: format!("must be a u32 power of two, found {}", v.display_short()),
                    })
                }
            };
            let infos = read_tensor_infos(&mut r, n_tensors)?;
            let data_start = if infos.is_empty() { r.pos } else { align_up(r.pos, alignment) };
            let tensors = resolve_tensors(infos, data_start, alignment, buf.len() as u64, &metadata)?;
            (version, metadata, tensors, alignment, data_start)
        };
        Ok(File { bytes: Arc::new(bytes), version, metadata, tensors, alignment, data_start })
    }
}

pub(crate) fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        self.buf.len() as u64 - self.pos
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::Truncated {
                what: what.to_string(),
                offset: self.pos,
                needed: n,
                file_size: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos as usize..(self.pos + n) as usize];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("exact length"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items that each need at least `min_item_bytes`; refuses counts
    /// the rest of the file cannot hold, so later allocations stay bounded.
    fn count(&mut self, what: &'static str, min_item_bytes: u64) -> Result<u64> {
        let offset = self.pos;
        let count = self.u64(what)?;
        if count.checked_mul(min_item_bytes).is_none_or(|need| need > self.remaining()) {
            return Err(Error::HugeCount { what, count, offset, file_size: self.buf.len() as u64 });
        }
        Ok(count)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > MAX_STRING || len > self.remaining() {
            return Err(Error::Truncated {
                what: format!("{what} of length {len}"),
                offset: at,
                needed: len.saturating_add(8),
                file_size: self.buf.len() as u64,
            });
        }
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| Error::BadKey { offset: at, reason: format!("{what} is not UTF-8") })
    }
}

fn read_metadata(r: &mut Cursor, n_kv: u64) -> Result<Metadata> {
    let mut md = Metadata::new();
    for _ in 0..n_kv {
        let at = r.pos;
        let key = r.string("metadata key")?;
        if key.is_empty() {
            return Err(Error::BadKey { offset: at, reason: "empty key".into() });
        }
        let type_at = r.pos;
        let type_id = r.u32("value type")?;
        let ty = ValueType::from_id(type_id)
            .ok_or_else(|| Error::UnknownValueType { key: key.clone(), offset: type_at, type_id })?;
        let value = read_value(r, ty, &key)?;
        if !md.push_unique(key.clone(), value) {
            return Err(Error::DuplicateKey { key, offset: at });
        }
    }
    Ok(md)
}

fn read_value(r: &mut Cursor, ty: ValueType, key: &str) -> Result<Value> {
    Ok(match ty {
        ValueType::U8 => Value::U8(r.array::<1>(key)?[0]),
        ValueType::I8 => Value::I8(r.array::<1>(key)?[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(r.array(key)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(r.array(key)?)),
        ValueType::U32 => Value::U32(r.u32(key)?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(r.array(key)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(r.array(key)?)),
        ValueType::U64 => Value::U64(r.u64(key)?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(r.array(key)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(r.array(key)?)),
        ValueType::Bool => {
            let at = r.pos;
            match r.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(Error::BadMetadata { key: key.into(), offset: at, reason: format!("bool byte {b}") })
                }
            }
        }
        ValueType::String => Value::String(r.string(key)?),
        ValueType::Array => Value::Array(read_array(r, key)?),
    })
}

fn read_array(r: &mut Cursor, key: &str) -> Result<Array> {
    let at = r.pos;
    let type_id = r.u32(key)?;
    let ty = ValueType::from_id(type_id)
        .ok_or_else(|| Error::UnknownValueType { key: key.into(), offset: at, type_id })?;
    if ty == ValueType::Array {
        return Err(Error::BadMetadata { key: key.into(), offset: at, reason: "nested arrays are not allowed".into() });
    }
    // A string needs at least its 8-byte length.
    let min = ty.scalar_size().unwrap_or(8) as u64;
    let n = r.count("array element", min)? as usize;
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
        ValueType::U8 => Array::U8(r.take(n as u64, key)?.to_vec()),
        ValueType::I8 => Array::I8(r.take(n as u64, key)?.iter().map(|&b| b as i8).collect()),
        ValueType::U16 => collect!(U16, u16::from_le_bytes(r.array(key)?)),
        ValueType::I16 => collect!(I16, i16::from_le_bytes(r.array(key)?)),
        ValueType::U32 => collect!(U32, r.u32(key)?),
        ValueType::I32 => collect!(I32, i32::from_le_bytes(r.array(key)?)),
        ValueType::F32 => collect!(F32, f32::from_le_bytes(r.array(key)?)),
        ValueType::U64 => collect!(U64, r.u64(key)?),
        ValueType::I64 => collect!(I64, i64::from_le_bytes(r.array(key)?)),
        ValueType::F64 => collect!(F64, f64::from_le_bytes(r.array(key)?)),
        ValueType::Bool => collect!(Bool, r.array::<1>(key)?[0] != 0),
        ValueType::String => collect!(String, r.string(key)?),
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
    for _ in 0..n {
        let info_offset = r.pos;
        let name = r.string("tensor name")?;
        let bad = |reason: String| Error::BadTensor { name: name.clone(), offset: info_offset, reason };
        let n_dims = r.u32("tensor n_dims")? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad(format!("n_dims {n_dims} is outside 1..={MAX_DIMS}")));
        }
        let mut ne = [1u64; MAX_DIMS];
        for d in ne.iter_mut().take(n_dims) {
            *d = r.u64("tensor dim")?;
            if *d == 0 || *d > i64::MAX as u64 {
                return Err(bad(format!("dimension {d} is not a positive int64")));
            }
        }
        if ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).is_none_or(|n| n > i64::MAX as u64) {
            return Err(bad(format!("dims {:?} overflow the element count", &ne[..n_dims])));
        }
        let type_id = r.u32("tensor type")?;
        let rel_offset = r.u64("tensor offset")?;
        if !seen.insert(name.clone()) {
            return Err(Error::DuplicateTensor { name, offset: info_offset });
        }
        out.push(RawInfo { name, info_offset, ne, n_dims, type_id, rel_offset });
    }
    Ok(out)
}

/// Resolves every type id (spec/gguf.md §3) and checks every tensor lies
/// inside the file, aligned.
fn resolve_tensors(
    infos: Vec<RawInfo>,
    data_start: u64,
    alignment: u64,
    file_size: u64,
    metadata: &Metadata,
) -> Result<Vec<TensorInfo>> {
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
        let end = offset.checked_add(nbytes).ok_or_else(|| bad("data end overflows".into()))?;
        if end > file_size {
            return Err(bad(format!(
                "data [{offset}, {end}) ({nbytes} bytes of {ty}) runs past the end of the file ({file_size} bytes)"
            )));
        }
        out.push(TensorInfo { name: raw.name.clone(), ty, ne, n_dims: raw.n_dims, offset, nbytes });
    }
    check_no_overlap(&out, &infos)?;
    Ok(out)
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
