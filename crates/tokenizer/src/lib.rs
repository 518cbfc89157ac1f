//! placeholder
mod bytes;
mod unicode;
mod unicode_tables;
