#[inline(never)]
#[no_mangle]
pub fn probe_alloc(size: usize) -> *mut u8 { edgepool::raw::alloc(size, 8) }
#[inline(never)]
#[no_mangle]
pub unsafe fn probe_free(p: *mut u8) { unsafe { edgepool::raw::free(p) } }
fn main() { let p = probe_alloc(std::hint::black_box(24)); unsafe { probe_free(p) }; }
