//! Pointer → owner: the one place that answers "what is this pointer?".
//!
//! - inside the heap region, the page map says `Slab` (the slab's header is the slab-table entry of
//!   `p`'s 64 KiB block),
//!   `Arena` (the chunk starts at `p` rounded down to 1 MiB) or `Large` (a block starting exactly at
//!   `p`); anything else is not a live block, except a hole of a lazy region (`Outside`), which is
//!   looked at as if outside the region;
//! - outside the region, a direct mapping if the direct table knows it; otherwise not ours.

use crate::arena::{Chunk, CHUNK_SIZE};
use crate::buddy::PageKind;
use crate::direct;
use crate::heap;
use crate::os::PAGE;
use crate::slab::Slab;

/// What a pointer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A slot of this slab (not yet checked to be the start of a slot).
    Slab(*mut Slab),
    /// An object of this load-arena chunk (not yet checked).
    Arena(*mut Chunk),
    /// The head of a large block.
    Large,
    /// A direct mapping of this many bytes.
    Direct(usize),
    /// Not a live block of ours.
    Unknown,
}

/// The owner of a pointer inside the heap region (`None` outside it): no lock, one load.
#[inline(always)]
pub fn in_heap(p: *mut u8) -> Option<Owner> {
    let a = p as usize;
    let (kind, off) = heap::page_kind_off(a)?;
    Some(match kind {
        PageKind::Slab => Owner::Slab(heap::slab_at(off)),
        PageKind::Arena => Owner::Arena((a & !(CHUNK_SIZE - 1)) as *mut Chunk),
        PageKind::Large if a & (PAGE - 1) == 0 => Owner::Large,
        // A hole of a lazy region: another mapping, maybe a direct one of ours.
        PageKind::Outside => return None,
        _ => Owner::Unknown,
    })
}

/// Finds the owner of `p` (not null). Outside the heap this looks the pointer up in the direct table
/// (one look-up under its lock).
#[inline]
pub fn owner(p: *mut u8) -> Owner {
    if let Some(o) = in_heap(p) {
        return o;
    }
    if heap::is_ready() {
        if let Some(len) = direct::size_of(p) {
            return Owner::Direct(len);
        }
    }
    Owner::Unknown
}

/// The usable size of the live block at `p` whose owner is `o` (`None` for [`Owner::Unknown`]).
///
/// # Safety
/// - `p` is a live block of `o` (for a slab or an arena, the start of one of its blocks).
pub unsafe fn usable(o: Owner, p: *mut u8) -> Option<usize> {
    Some(match o {
        // SAFETY: a live slab's header is immutable after init.
        Owner::Slab(s) => unsafe { (*s).size as usize },
        // SAFETY: a live arena object (contract).
        Owner::Arena(c) => unsafe { crate::arena::usable_size(c, p) },
        // SAFETY: a live large block head (contract).
        Owner::Large => unsafe { heap::block_size(p) },
        Owner::Direct(len) => len,
        Owner::Unknown => return None,
    })
}
