//! Metadata values (`gguf_type`) and typed accessors over the key/value map.

use crate::error::{Error, Result};

/// The value-type tags of GGUF metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Size in bytes of a fixed-size scalar, `None` for strings and arrays.
    pub fn scalar_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

/// A decoded metadata value. Arrays are homogeneous and never nested.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(Array),
}

/// A homogeneous array. Strings are kept as `String`; numbers as their own width.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Integer elements widened to i64 (`None` for float, bool and string arrays).
    pub fn as_i64s(&self) -> Option<Vec<i64>> {
        Some(match self {
            Array::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U64(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I64(v) => v.clone(),
            _ => return None,
        })
    }
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// Any integer type, widened. Converters disagree on widths, so readers accept all.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(x) => x as i64,
            Value::I8(x) => x as i64,
            Value::U16(x) => x as i64,
            Value::I16(x) => x as i64,
            Value::U32(x) => x as i64,
            Value::I32(x) => x as i64,
            Value::U64(x) => i64::try_from(x).ok()?,
            Value::I64(x) => x,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x as f64),
            Value::F64(x) => Some(x),
            _ => self.as_i64().map(|x| x as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short human-readable rendering; long arrays are summarised.
    pub fn display_short(&self) -> String {
        match self {
            Value::String(s) if s.len() > 60 => format!("{:?}…", &s[..s.floor_char_boundary(57)]),
            Value::String(s) => format!("{s:?}"),
            Value::Array(a) => format!("[{:?}; {}]", a.elem_type(), a.len()),
            Value::F32(x) => format!("{x}"),
            Value::F64(x) => format!("{x}"),
            Value::Bool(b) => format!("{b}"),
            other => other.as_i64().map(|x| x.to_string()).unwrap_or_default(),
        }
    }
}

/// Ordered key/value metadata with typed getters that report the key on failure.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn entries(&self) -> &[(String, Value)] {
        &self.entries
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Inserts or replaces `key`, keeping the original position on replace.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.entries.push((key, value)),
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let pos = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(pos).1)
    }

    pub(crate) fn push_unique(&mut self, key: String, value: Value) -> bool {
        if self.contains(&key) {
            return false;
        }
        self.entries.push((key, value));
        true
    }

    fn required<'a>(&'a self, key: &str) -> Result<&'a Value> {
        self.get(key).ok_or_else(|| Error::MissingKey { key: key.to_string() })
    }

    fn wrong(key: &str, want: &'static str, v: &Value) -> Error {
        Error::WrongKeyType { key: key.to_string(), expected: want, found: v.value_type() }
    }

    pub fn u64(&self, key: &str) -> Result<u64> {
        let v = self.required(key)?;
        v.as_i64().and_then(|x| u64::try_from(x).ok()).ok_or_else(|| Self::wrong(key, "unsigned integer", v))
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        let x = self.u64(key)?;
        usize::try_from(x).map_err(|_| Error::BadValue { key: key.to_string(), reason: format!("{x} does not fit") })
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        let v = self.required(key)?;
        v.as_f64().map(|x| x as f32).ok_or_else(|| Self::wrong(key, "number", v))
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        let v = self.required(key)?;
        v.as_str().ok_or_else(|| Self::wrong(key, "string", v))
    }

    pub fn bool(&self, key: &str) -> Result<bool> {
        let v = self.required(key)?;
        v.as_bool().ok_or_else(|| Self::wrong(key, "bool", v))
    }

    pub fn array(&self, key: &str) -> Result<&Array> {
        let v = self.required(key)?;
        v.as_array().ok_or_else(|| Self::wrong(key, "array", v))
    }

    pub fn strings(&self, key: &str) -> Result<&[String]> {
        match self.array(key)? {
            Array::String(s) => Ok(s),
            a => Err(Error::WrongKeyType { key: key.to_string(), expected: "array of strings", found: a.elem_type() }),
        }
    }

    /// Optional variants: `Ok(None)` when absent, an error when present with the wrong type.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key).map(|_| self.u64(key)).transpose()
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key).map(|_| self.usize(key)).transpose()
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key).map(|_| self.f32(key)).transpose()
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key).map(|_| self.str(key)).transpose()
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|_| self.bool(key)).transpose()
    }
}
