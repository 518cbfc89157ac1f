//! The writer. It lays tensors out in the given order, each padded to the
//! alignment (the strict relation mainline's reader enforces), and writes to a
//! temporary file that is renamed into place only when complete, so a failed
//! write never leaves a half-written model behind.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::reader::{align_up, DEFAULT_ALIGNMENT, MAGIC};
use crate::types::GgmlType;
use crate::value::{Array, Metadata, Value};

/// A tensor to be written: its header entry. Data is supplied at write time.
#[derive(Clone, Debug, PartialEq)]
pub struct WriterTensor {
    pub name: String,
    pub ty: GgmlType,
    /// Dims as written, `ne[0]` first (1..=4 of them).
    pub dims: Vec<u64>,
}

impl WriterTensor {
    pub fn nbytes(&self) -> Result<u64> {
        self.ty.tensor_bytes(&self.dims).ok_or_else(|| Error::BadWrite {
            name: self.name.clone(),
            reason: format!("dims {:?} are not valid for {}", self.dims, self.ty),
        })
    }
}

/// A GGUF v3 file under construction.
pub struct Writer {
    pub metadata: Metadata,
    pub tensors: Vec<WriterTensor>,
}

impl Writer {
    pub fn new(metadata: Metadata) -> Writer {
        Writer { metadata, tensors: Vec::new() }
    }

    fn alignment(&self) -> Result<u64> {
        match self.metadata.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(Value::U32(a)) if a.is_power_of_two() => Ok(*a as u64),
            Some(_) => {
                Err(Error::BadValue { key: "general.alignment".into(), reason: "must be a u32 power of two".into() })
            }
        }
    }

    /// Writes the file to `path` atomically. `data(i)` returns tensor `i`'s bytes
    /// and is called in order, so a caller can produce huge tensors one at a time.
    pub fn write_to_path<'a>(
        &self,
        path: impl AsRef<Path>,
        data: impl FnMut(usize) -> Result<Cow<'a, [u8]>>,
    ) -> Result<()> {
        let path = path.as_ref();
        let tmp = path.with_extension(format!(
            "{}tern-tmp",
            path.extension().map(|e| format!("{}.", e.to_string_lossy())).unwrap_or_default()
        ));
        let werr = |source| Error::Write { path: path.display().to_string(), source };
        let result = (|| {
            let file = std::fs::File::create(&tmp).map_err(werr)?;
            let mut out = BufWriter::with_capacity(1 << 20, file);
            self.write(&mut out, data)?;
            let file = out.into_inner().map_err(|e| werr(e.into_error()))?;
            file.sync_all().map_err(werr)?;
            std::fs::rename(&tmp, path).map_err(werr)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Checks everything that could make the output unreadable, before any
    /// byte is written, and returns each tensor's data size.
    fn validate(&self) -> Result<Vec<u64>> {
        if self.metadata.entries().iter().any(|(k, _)| k.is_empty()) {
            return Err(Error::BadValue { key: String::new(), reason: "metadata keys must not be empty".into() });
        }
        let mut names = HashSet::new();
        let mut sizes = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            if t.dims.is_empty() || t.dims.len() > crate::MAX_DIMS {
                return Err(Error::BadWrite { name: t.name.clone(), reason: format!("{} dims", t.dims.len()) });
            }
            if !names.insert(t.name.as_str()) {
                return Err(Error::BadWrite { name: t.name.clone(), reason: "duplicate tensor name".into() });
            }
            sizes.push(t.nbytes()?);
        }
        Ok(sizes)
    }

    /// Writes the whole file to any sink.
    pub fn write<'a>(&self, out: &mut dyn Write, mut data: impl FnMut(usize) -> Result<Cow<'a, [u8]>>) -> Result<()> {
        let align = self.alignment()?;
        let sizes = self.validate()?;
        let mut w = Sink { out, pos: 0 };
        w.bytes(&MAGIC)?;
        w.u32(3)?;
        w.u64(self.tensors.len() as u64)?;
        w.u64(self.metadata.entries().len() as u64)?;
        for (key, value) in self.metadata.entries() {
            w.string(key)?;
            w.u32(value.value_type().id())?;
            w.value(value)?;
        }
        let mut offset = 0u64;
        for (t, &nbytes) in self.tensors.iter().zip(&sizes) {
            w.string(&t.name)?;
            w.u32(t.dims.len() as u32)?;
            for &d in &t.dims {
                w.u64(d)?;
            }
            w.u32(t.ty.id())?;
            w.u64(offset)?;
            offset += align_up(nbytes, align);
        }
        if !self.tensors.is_empty() {
            w.pad_to(align)?;
        }
        for (i, t) in self.tensors.iter().enumerate() {
            let bytes = data(i)?;
            if bytes.len() as u64 != sizes[i] {
                return Err(Error::BadWrite {
                    name: t.name.clone(),
                    reason: format!("got {} data bytes, {} {:?} needs {}", bytes.len(), t.ty, t.dims, sizes[i]),
                });
            }
            w.bytes(&bytes)?;
            // Every tensor is padded, the last one too, as ggml and gguf-py do.
            w.pad_to(align)?;
        }
        w.out.flush().map_err(|source| Error::Write { path: "<sink>".into(), source })
    }
}

struct Sink<'a> {
    out: &'a mut dyn Write,
    pos: u64,
}

impl Sink<'_> {
    fn bytes(&mut self, b: &[u8]) -> Result<()> {
        self.out.write_all(b).map_err(|source| Error::Write { path: "<sink>".into(), source })?;
        self.pos += b.len() as u64;
        Ok(())
    }
    fn u32(&mut self, x: u32) -> Result<()> {
        self.bytes(&x.to_le_bytes())
    }
    fn u64(&mut self, x: u64) -> Result<()> {
        self.bytes(&x.to_le_bytes())
    }
    fn string(&mut self, s: &str) -> Result<()> {
        self.u64(s.len() as u64)?;
        self.bytes(s.as_bytes())
    }
    fn pad_to(&mut self, align: u64) -> Result<()> {
        let pad = align_up(self.pos, align) - self.pos;
        self.bytes(&vec![0u8; pad as usize])
    }

    fn value(&mut self, v: &Value) -> Result<()> {
        match v {
            Value::U8(x) => self.bytes(&[*x]),
            Value::I8(x) => self.bytes(&[*x as u8]),
            Value::U16(x) => self.bytes(&x.to_le_bytes()),
            Value::I16(x) => self.bytes(&x.to_le_bytes()),
            Value::U32(x) => self.u32(*x),
            Value::I32(x) => self.bytes(&x.to_le_bytes()),
            Value::F32(x) => self.bytes(&x.to_le_bytes()),
            Value::Bool(b) => self.bytes(&[*b as u8]),
            Value::String(s) => self.string(s),
            Value::U64(x) => self.u64(*x),
            Value::I64(x) => self.bytes(&x.to_le_bytes()),
            Value::F64(x) => self.bytes(&x.to_le_bytes()),
            Value::Array(a) => self.array(a),
        }
    }

    fn array(&mut self, a: &Array) -> Result<()> {
        self.u32(a.elem_type().id())?;
        self.u64(a.len() as u64)?;
        macro_rules! each {
            ($v:expr, |$x:ident| $body:expr) => {{
                for $x in $v {
                    $body?;
                }
                Ok(())
            }};
        }
        match a {
            Array::U8(v) => self.bytes(v),
            Array::I8(v) => each!(v, |x| self.bytes(&[*x as u8])),
            Array::U16(v) => each!(v, |x| self.bytes(&x.to_le_bytes())),
            Array::I16(v) => each!(v, |x| self.bytes(&x.to_le_bytes())),
            Array::U32(v) => each!(v, |x| self.u32(*x)),
            Array::I32(v) => each!(v, |x| self.bytes(&x.to_le_bytes())),
            Array::F32(v) => each!(v, |x| self.bytes(&x.to_le_bytes())),
            Array::Bool(v) => each!(v, |x| self.bytes(&[*x as u8])),
            Array::String(v) => each!(v, |x| self.string(x)),
            Array::U64(v) => each!(v, |x| self.u64(*x)),
            Array::I64(v) => each!(v, |x| self.bytes(&x.to_le_bytes())),
            Array::F64(v) => each!(v, |x| self.bytes(&x.to_le_bytes())),
        }
    }
}
