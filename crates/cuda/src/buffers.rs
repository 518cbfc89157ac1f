//! The backend's buffer table: device allocations, mapped host memory and
//! borrowed host arenas, each with the weight layout it holds.

use tern_backend::BufferId;

use crate::Weight;

pub(crate) struct DevBuf {
    /// The device's address (for mapped host memory, its device alias).
    pub ptr: u64,
    pub bytes: usize,
    pub weight: Option<Weight>,
    pub backing: Backing,
}

/// What memory backs a buffer, which says who frees it and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backing {
    Device,
    /// Mapped host memory this backend allocated, at this host address.
    Mapped(usize),
    /// A host backend's pinned arena, seen through its device alias; the
    /// host backend owns it.
    Borrowed,
}

#[derive(Default)]
pub(crate) struct Buffers {
    list: Vec<Option<DevBuf>>,
}

impl Buffers {
    pub fn get(&self, id: BufferId) -> Option<&DevBuf> {
        self.list.get(id.0 as usize)?.as_ref()
    }

    /// Forgets a buffer without freeing its memory.
    pub fn forget(&mut self, id: BufferId) {
        if let Some(b) = self.list.get_mut(id.0 as usize) {
            *b = None;
        }
    }

    pub fn insert(&mut self, b: DevBuf) -> BufferId {
        match self.list.iter().position(|b| b.is_none()) {
            Some(i) => {
                self.list[i] = Some(b);
                BufferId(i as u32)
            }
            None => {
                self.list.push(Some(b));
                BufferId(self.list.len() as u32 - 1)
            }
        }
    }

    /// Removes a buffer from the table and hands it back to be freed.
    pub fn take(&mut self, id: BufferId) -> Option<DevBuf> {
        self.list.get_mut(id.0 as usize)?.take()
    }

    /// Every live buffer.
    pub fn iter(&self) -> impl Iterator<Item = &DevBuf> {
        self.list.iter().flatten()
    }
}
