//! The raw lock used by every global structure of the allocator.
//!
//! A three-state futex mutex (Drepper, "Futexes are tricky"): 0 unlocked, 1 locked, 2 locked with
//! waiters. It never allocates (unlike `parking_lot`, whose parking table is heap-allocated and would
//! re-enter the allocator), spins briefly before sleeping, and can be reset in a `fork` child.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::os;

pub struct RawLock {
    /// 0 = unlocked, 1 = locked without waiters, 2 = locked, maybe with waiters.
    state: AtomicU32,
}

impl Default for RawLock {
    fn default() -> Self {
        Self::new()
    }
}

impl RawLock {
    pub const fn new() -> Self {
        RawLock { state: AtomicU32::new(0) }
    }

    #[inline]
    pub fn lock(&self) {
        if self.state.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_slow();
        }
    }

    #[cold]
    fn lock_slow(&self) {
        for _ in 0..100 {
            if self.state.load(Ordering::Relaxed) == 0
                && self.state.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return;
            }
            os::spin_hint();
        }
        while self.state.swap(2, Ordering::Acquire) != 0 {
            os::futex_wait(&self.state, 2);
        }
    }

    #[inline]
    pub fn unlock(&self) {
        if self.state.swap(0, Ordering::Release) == 2 {
            os::futex_wake(&self.state);
        }
    }

    /// Forces the lock to the unlocked state. Only for a `fork` child, where the thread that held it
    /// no longer exists.
    pub fn reset(&self) {
        self.state.store(0, Ordering::Relaxed);
    }
}
