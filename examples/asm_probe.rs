//! Exposes the allocation and free fast paths as plain symbols, to read their machine code:
//! `cargo build --release --example asm_probe && objdump -d -M intel target/release/examples/asm_probe | awk '/<probe_alloc>:/,/^$/'`,
//! or to count their instructions path by path: `python3 scripts/fast-path-insns.py`.

#[inline(never)]
#[no_mangle]
pub fn probe_alloc(size: usize) -> *mut u8 {
    edgepool::raw::alloc(size, 8)
}

/// # Safety
/// - `p` is null or a live block of edgepool.
#[inline(never)]
#[no_mangle]
pub unsafe fn probe_free(p: *mut u8) {
    // SAFETY: forwarded contract.
    unsafe { edgepool::raw::free(p) }
}

fn main() {
    let p = probe_alloc(std::hint::black_box(24));
    // SAFETY: p was just allocated by edgepool.
    unsafe { probe_free(p) };
}
