//! Block patterns: what a live block of the tests holds, checked before it is freed. Shared by the
//! integration tests and the fuzz target (`fuzz/`), which includes this file by path.
#![allow(dead_code)]

/// The byte expected at offset `i` of a block filled with `key` (usually its first address): any
/// prefix of a filled block verifies with the same key, so shrinking can be checked too.
#[inline]
pub fn pattern(key: usize, i: usize) -> u8 {
    let k = (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (k >> 56) as u8 ^ (i as u8).wrapping_mul(31) ^ ((i >> 8) as u8)
}

/// Fills `[p, p+size)` with its pattern (the pattern depends on `key`, usually the address).
///
/// # Safety
/// - `[p, p+size)` is writable.
pub unsafe fn fill(p: *mut u8, size: usize, key: usize) {
    for i in 0..size {
        // SAFETY: i < size, inside the writable range (caller).
        unsafe { *p.add(i) = pattern(key, i) };
    }
}

/// Checks the pattern of `[p, p+size)`; returns the first bad offset.
///
/// # Safety
/// - `[p, p+size)` is readable.
pub unsafe fn verify(p: *const u8, size: usize, key: usize) -> Option<usize> {
    // SAFETY: i < size, inside the readable range (caller).
    (0..size).find(|&i| unsafe { *p.add(i) } != pattern(key, i))
}

/// The offsets of a block of `size` bytes that carry a sampled pattern: the first and last 64 bytes,
/// and one byte every `step` bytes (large blocks are checked without touching every page).
pub fn sampled(size: usize, step: usize) -> impl Iterator<Item = usize> {
    (0..size.min(64)).chain(size.saturating_sub(64).max(64)..size).chain((step..size).step_by(step))
}

/// Writes the pattern of `key` at the [`sampled`] offsets of `[p, p+size)`.
///
/// # Safety
/// - `[p, p+size)` is writable.
pub unsafe fn fill_sampled(p: *mut u8, size: usize, key: usize, step: usize) {
    for i in sampled(size, step) {
        // SAFETY: i < size, inside the writable range (caller).
        unsafe { *p.add(i) = pattern(key, i) };
    }
}

/// Checks the pattern of `key` at the [`sampled`] offsets below `upto` of a block of `size` bytes at
/// `p`; returns the first bad offset.
///
/// # Safety
/// - `[p, p+min(size, upto))` is readable.
pub unsafe fn verify_sampled(p: *const u8, size: usize, upto: usize, key: usize, step: usize) -> Option<usize> {
    // SAFETY: i < min(size, upto), inside the readable range (caller).
    sampled(size, step).filter(|&i| i < upto).find(|&i| unsafe { *p.add(i) } != pattern(key, i))
}
