//! `PlannedArena`: one allocation from edgepool's heap holding every tensor of a plan at its offset.

use std::collections::HashMap;
use std::ptr::NonNull;

use super::{Plan, PlanError, Tensor};

/// One block of `plan.arena_size` bytes (aligned to at least 64 B and to every tensor's alignment),
/// allocated from edgepool's heap whatever the global allocator is, with each tensor's slice by id.
///
/// Invariants: `ptr` is a live edgepool block of at least `size` bytes aligned to `align`; every
/// `(offset, len)` in `slices` lies inside it, and slices of tensors live at the same op are disjoint
/// (the plan was validated).
pub struct PlannedArena {
    ptr: NonNull<u8>,
    size: usize,
    align: usize,
    slices: HashMap<String, (usize, usize)>,
}

/// Why an arena could not be made.
#[derive(Debug)]
pub enum ArenaError {
    Plan(PlanError),
    /// The allocator returned null (out of memory or over the budget).
    OutOfMemory {
        bytes: usize,
    },
}

impl std::fmt::Display for ArenaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArenaError::Plan(e) => write!(f, "invalid plan: {e}"),
            ArenaError::OutOfMemory { bytes } => write!(f, "out of memory for a {bytes}-byte arena"),
        }
    }
}

impl std::error::Error for ArenaError {}

impl PlannedArena {
    /// Allocates the arena for `plan` (validated again here). With `prefault`, every page is touched
    /// now, so that inference does not take page faults.
    pub fn new(tensors: &[Tensor], plan: &Plan, prefault: bool) -> Result<PlannedArena, ArenaError> {
        super::validate(tensors, &plan.offsets, plan.arena_size).map_err(ArenaError::Plan)?;
        let align = tensors.iter().map(|t| t.align as usize).max().unwrap_or(1).max(64);
        let size = usize::try_from(plan.arena_size).map_err(|_| ArenaError::OutOfMemory { bytes: usize::MAX })?;
        let ptr = NonNull::new(crate::raw::alloc(size.max(1), align)).ok_or(ArenaError::OutOfMemory { bytes: size })?;
        if prefault {
            let page = crate::os::os_page_size();
            let mut off = 0;
            while off < size {
                // SAFETY: off < size, inside the block just allocated.
                unsafe { ptr.as_ptr().add(off).write_volatile(0) };
                off += page;
            }
        }
        let slices =
            tensors.iter().zip(&plan.offsets).map(|(t, &o)| (t.id.clone(), (o as usize, t.size as usize))).collect();
        Ok(PlannedArena { ptr, size, align, slices })
    }

    /// The arena's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The arena's base address (aligned to at least 64 B).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Offset and length of tensor `id`.
    pub fn range(&self, id: &str) -> Option<(usize, usize)> {
        self.slices.get(id).copied()
    }

    /// The bytes of tensor `id`.
    pub fn slice(&self, id: &str) -> Option<&[u8]> {
        let (o, n) = self.range(id)?;
        // SAFETY: (o, n) lies inside the live block (invariant); shared borrow of self.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(o), n) })
    }

    /// The bytes of tensor `id`, writable. Tensors live at the same op never share bytes; tensors with
    /// disjoint lifetimes may, by design.
    pub fn slice_mut(&mut self, id: &str) -> Option<&mut [u8]> {
        let (o, n) = self.range(id)?;
        // SAFETY: (o, n) lies inside the live block; `&mut self` makes this the only borrow.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(o), n) })
    }

    /// Alignment of the base address.
    pub fn align(&self) -> usize {
        self.align
    }
}

impl Drop for PlannedArena {
    fn drop(&mut self) {
        // SAFETY: the block was allocated by edgepool in `new` and is freed once.
        unsafe { crate::raw::free(self.ptr.as_ptr()) }
    }
}

// SAFETY: the arena owns its block; slices are handed out through `&self`/`&mut self` borrows.
unsafe impl Send for PlannedArena {}
// SAFETY: shared access only reads.
unsafe impl Sync for PlannedArena {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_hands_out_disjoint_slices_for_co_live_tensors() {
        let ts = vec![Tensor::new("a", 1000, 0, 1), Tensor::new("b", 500, 1, 2), Tensor::new("c", 1000, 2, 3)];
        let p = super::super::plan(&ts).unwrap();
        let mut arena = PlannedArena::new(&ts, &p, true).unwrap();
        assert_eq!(arena.size(), 1500);
        assert_eq!(arena.as_ptr() as usize % 64, 0);
        arena.slice_mut("a").unwrap().fill(1);
        arena.slice_mut("b").unwrap().fill(2);
        assert!(arena.slice("a").unwrap().iter().all(|&x| x == 1), "b overwrote a while both live");
        arena.slice_mut("c").unwrap().fill(3);
        assert!(arena.slice("b").unwrap().iter().all(|&x| x == 2), "c overwrote b while both live");
        assert!(arena.slice("zzz").is_none());
    }

    #[test]
    fn a_broken_plan_is_refused() {
        let ts = vec![Tensor::new("a", 10, 0, 1), Tensor::new("b", 10, 1, 2)];
        let mut p = super::super::plan(&ts).unwrap();
        p.offsets = vec![0, 5];
        assert!(matches!(PlannedArena::new(&ts, &p, false), Err(ArenaError::Plan(_))));
    }
}
