/* The live-heap tracer for scripts/load-bench.py: an LD_PRELOAD shim over glibc's malloc that keeps
 * the bytes live in the heap (malloc_usable_size of every block) and their peak. A loader that finds
 * `live_heap_bytes` and `live_heap_peak` (dlsym / ctypes) reports them, and the benchmark computes
 * the floor of a load: RSS before loading + (peak live heap while loading - live heap before
 * loading), that is, what an allocator that wastes nothing would need.
 *
 *     gcc -O2 -shared -fPIC -o target/live-heap.so scripts/live-heap.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static size_t live, peak;

static void add(void *p) {
    if (!p) return;
    size_t now = __atomic_add_fetch(&live, malloc_usable_size(p), __ATOMIC_RELAXED);
    size_t old = __atomic_load_n(&peak, __ATOMIC_RELAXED);
    while (now > old && !__atomic_compare_exchange_n(&peak, &old, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

static void sub(void *p) {
    if (p) __atomic_sub_fetch(&live, malloc_usable_size(p), __ATOMIC_RELAXED);
}

/* The live bytes now; also restarts the peak from them (called once, as loading starts). */
size_t live_heap_bytes(void) {
    size_t now = __atomic_load_n(&live, __ATOMIC_RELAXED);
    __atomic_store_n(&peak, now, __ATOMIC_RELAXED);
    return now;
}
size_t live_heap_peak(void) { return __atomic_load_n(&peak, __ATOMIC_RELAXED); }

void *malloc(size_t n) { void *p = __libc_malloc(n); add(p); return p; }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); add(p); return p; }
void free(void *p) { sub(p); __libc_free(p); }
void *realloc(void *o, size_t n) {
    size_t was = o ? malloc_usable_size(o) : 0;
    void *p = __libc_realloc(o, n);
    if (p || n == 0) {
        __atomic_sub_fetch(&live, was, __ATOMIC_RELAXED);
        add(p);
    }
    return p;
}
void *memalign(size_t a, size_t n) { void *p = __libc_memalign(a, n); add(p); return p; }
void *aligned_alloc(size_t a, size_t n) { return memalign(a, n); }
void *valloc(size_t n) { return memalign(4096, n); }
void *pvalloc(size_t n) { return memalign(4096, (n + 4095) & ~(size_t)4095); }
int posix_memalign(void **r, size_t a, size_t n) {
    if (a < sizeof(void *) || (a & (a - 1))) return EINVAL;
    void *p = memalign(a, n);
    if (!p) return ENOMEM;
    *r = p;
    return 0;
}
