//! Typed errors. Every message names the key or tensor and, when reading, the
//! byte offset where the problem was found.

use crate::types::GgmlType;
use crate::value::ValueType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a GGUF file: magic is {found:02x?} at offset 0, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} at offset 4 (tern reads versions 2 and 3{hint})")]
    BadVersion { version: u32, hint: &'static str },
    #[error("file truncated: needed {needed} bytes at offset {offset} for {what}, but the file has {file_size}")]
    Truncated { what: String, offset: u64, needed: u64, file_size: u64 },
    /// A count or length that the file cannot possibly hold (corrupt, or truncated).
    #[error(
        "{what} count {count} at offset {offset} cannot fit in a file of {file_size} bytes (corrupt or truncated)"
    )]
    HugeCount { what: String, count: u64, offset: u64, file_size: u64 },
    #[error("metadata key at offset {offset}: {reason}")]
    BadKey { offset: u64, reason: String },
    #[error("metadata key {key:?} at offset {offset}: unknown value type {type_id}")]
    UnknownValueType { key: String, offset: u64, type_id: u32 },
    #[error("metadata key {key:?} at offset {offset}: {reason}")]
    BadMetadata { key: String, offset: u64, reason: String },
    #[error("duplicate metadata key {key:?} at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("tensor {name:?} (info at offset {offset}): {reason}")]
    BadTensor { name: String, offset: u64, reason: String },
    #[error("tensor {name:?} (info at offset {offset}): unknown type id {type_id}{hint}")]
    UnknownType { name: String, offset: u64, type_id: u32, hint: &'static str },
    /// A type whose id means different things in different forks, whose size
    /// disagrees with the gap to the next tensor (docs/spec/gguf.md §3 rule 1).
    #[error(
        "tensor {name:?} (info at offset {offset}): type id {type_id} read as {ty} needs {expected} bytes \
         ({rule}; {padded} with padding), but the gap to the next tensor's data is {gap} bytes; \
         the file was probably written by a tool where id {type_id} means another type"
    )]
    SizeMismatch {
        name: String,
        offset: u64,
        type_id: u32,
        ty: GgmlType,
        rule: &'static str,
        expected: u64,
        padded: u64,
        gap: u64,
    },
    #[error("duplicate tensor name {name:?} (info at offset {offset})")]
    DuplicateTensor { name: String, offset: u64 },
    #[error("missing required metadata key {key:?}")]
    MissingKey { key: String },
    #[error("metadata key {key:?} has type {found:?}, expected {expected}")]
    WrongKeyType { key: String, expected: &'static str, found: ValueType },
    #[error("metadata key {key:?}: {reason}")]
    BadValue { key: String, reason: String },
    #[error("missing tensor {name:?}")]
    MissingTensor { name: String },
    #[error("writing {path}: {source}")]
    Write { path: String, source: std::io::Error },
    #[error("cannot write tensor {name:?}: {reason}")]
    BadWrite { name: String, reason: String },
}
