#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cls {
    L,
    N,
}
pub static RANGES: &[(u32, u32, Cls)] = &[];
