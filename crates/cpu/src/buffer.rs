//! Host buffers: 64-byte aligned owned memory, or aliases of host bytes that
//! outlive the engine (the mmapped model file, never copied).

use std::alloc::{alloc_zeroed, dealloc, Layout};

use tern_backend::{BufferId, HostBytes, TensorLoc};

use crate::kernels::ternary::PackedTernary;

const ALIGN: usize = 64;
/// Large buffers (the per-step arenas) start on a page, so a device can
/// page-lock them whole for its copies.
const PAGE: usize = 4096;

fn align_for(len: usize) -> usize {
    if len >= 16 * PAGE {
        PAGE
    } else {
        ALIGN
    }
}

/// Zeroed bytes, 64-byte aligned (page-aligned when large).
pub struct Aligned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `Aligned` uniquely owns its allocation, like a `Vec<u8>`.
unsafe impl Send for Aligned {}

impl Aligned {
    pub fn new(len: usize) -> Option<Aligned> {
        if len == 0 {
            return Some(Aligned { ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(), len: 0 });
        }
        let layout = Layout::from_size_align(len, align_for(len)).ok()?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(Aligned { ptr, len })
    }
}

impl Aligned {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

// SAFETY: shared references only read.
unsafe impl Sync for Aligned {}

impl Drop for Aligned {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with this exact layout.
            unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, align_for(self.len))) }
        }
    }
}

pub enum Storage {
    Owned(Aligned),
    Host(HostBytes),
    /// A ternary weight repacked for the kernels (read through `packed`).
    Ternary(PackedTernary),
}

impl Storage {
    /// Bytes addressable through `TensorLoc`s (a repacked weight keeps the
    /// file size it was loaded with, but only `packed` reads it).
    fn len(&self) -> usize {
        match self {
            Storage::Owned(a) => a.len,
            Storage::Host(h) => h.as_slice().len(),
            Storage::Ternary(_) => usize::MAX,
        }
    }

    fn base(&self) -> Option<*mut u8> {
        match self {
            Storage::Owned(a) => Some(a.ptr),
            Storage::Host(h) => Some(h.as_slice().as_ptr() as *mut u8),
            Storage::Ternary(_) => None,
        }
    }
}

#[derive(Default)]
pub struct Buffers {
    slots: Vec<Option<Storage>>,
}

impl Buffers {
    pub fn insert(&mut self, s: Storage) -> BufferId {
        let id = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[id] = Some(s);
        BufferId(id as u32)
    }

    pub fn alloc(&mut self, bytes: usize) -> Option<BufferId> {
        Some(self.insert(Storage::Owned(Aligned::new(bytes)?)))
    }

    pub fn free(&mut self, id: BufferId) {
        if let Some(slot) = self.slots.get_mut(id.0 as usize) {
            *slot = None;
        }
    }

    fn storage(&self, loc: TensorLoc) -> Option<&Storage> {
        let s = self.slots.get(loc.buffer.0 as usize)?.as_ref()?;
        (loc.offset.checked_add(loc.nbytes)? <= s.len()).then_some(s)
    }

    /// Base pointer of `loc`, bounds-checked. Host aliases must only be read.
    pub fn ptr(&self, loc: TensorLoc) -> Option<*mut u8> {
        // SAFETY: `storage` checked that offset + nbytes lies inside the buffer.
        self.storage(loc)?.base().map(|b| unsafe { b.add(loc.offset) })
    }

    /// The repacked ternary weight at `loc`, if that is what it holds.
    pub fn packed(&self, loc: TensorLoc) -> Option<&PackedTernary> {
        match self.slots.get(loc.buffer.0 as usize)?.as_ref()? {
            Storage::Ternary(p) => Some(p),
            _ => None,
        }
    }

    pub fn bytes(&self, loc: TensorLoc) -> Option<&[u8]> {
        let p = self.ptr(loc)?;
        // SAFETY: bounds checked by `ptr`; shared borrow of self.
        Some(unsafe { std::slice::from_raw_parts(p, loc.nbytes) })
    }

    /// Writable bytes of an owned buffer (host aliases are read-only).
    pub fn bytes_mut(&mut self, loc: TensorLoc) -> Option<&mut [u8]> {
        match self.storage(loc)? {
            Storage::Owned(_) => {
                let p = self.ptr(loc)?;
                // SAFETY: bounds checked; exclusive borrow of self; owned memory.
                Some(unsafe { std::slice::from_raw_parts_mut(p, loc.nbytes) })
            }
            Storage::Host(_) | Storage::Ternary(_) => None,
        }
    }
}
