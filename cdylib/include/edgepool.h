/* edgepool: a memory allocator for machine-learning inference on small devices.
 *
 * libedgepool.so exports the whole C allocation API (malloc, free, calloc, realloc, posix_memalign,
 * aligned_alloc, ...) with glibc's semantics, for use under LD_PRELOAD; and the functions below.
 * Link with -ledgepool, or find them at run time (dlsym, Python ctypes) when preloaded.
 */
#ifndef EDGEPOOL_H
#define EDGEPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version, e.g. "0.1.0". Static storage. */
const char *edgepool_version(void);

/* Returns every free page of the heap to the OS (also what exited threads left). Returns the bytes. */
size_t edgepool_trim(void);

/* Debug mode (EDGEPOOL_DEBUG=1): checks the canary after every live block and the fill of every block
 * in the quarantine. Returns the number of live blocks checked, or -1 when debug mode is off. At the
 * first damaged block it prints what it found and the last allocator events, and aborts. */
long edgepool_check(void);

/* Writes the statistics report (bytes taken from the OS, peak, counters) to file descriptor `fd`. */
void edgepool_print_stats(int fd);

/* Statistics, versioned by size: pass sizeof(struct edgepool_stats) of the header you built with.
 * The library fills at most that many bytes (whole fields), sets `size` to the bytes it filled, and
 * returns 0; -1 with errno = EINVAL when out is NULL or size < 8. Fields only ever join at the end.
 * The same figures as edgepool_print_stats, in its order. */
struct edgepool_stats {
    uint64_t size;                   /* bytes filled by the library */
    uint64_t os_bytes;               /* held from the OS and possibly resident (what the budget caps) */
    uint64_t peak_os_bytes;          /* the highest os_bytes seen */
    uint64_t committed_bytes;        /* heap address space grown so far */
    uint64_t free_bytes;             /* free bytes inside the heap */
    uint64_t dirty_free_bytes;       /* free heap bytes that may still be resident */
    uint64_t slab_bytes;             /* bytes in slabs, their free slots included */
    uint64_t limit_bytes;            /* the memory budget (0 = none) */
    uint64_t slabs_acquired;         /* slabs taken from the heap */
    uint64_t slabs_released;         /* slabs given back (empty) */
    uint64_t slab_refills;           /* small-allocation slow paths */
    uint64_t remote_frees;           /* slabs queued for their owner by another thread's free */
    uint64_t large_allocs;           /* large (buddy) allocations */
    uint64_t large_frees;            /* large (buddy) frees */
    uint64_t large_realloc_in_place; /* large reallocations done in place */
    uint64_t direct_allocs;          /* requests mapped directly (beyond the largest block) */
    uint64_t direct_frees;           /* direct mappings unmapped */
    uint64_t direct_bytes;           /* bytes mapped directly now */
    uint64_t purges;                 /* purge calls that returned memory to the OS */
    uint64_t purged_bytes;           /* bytes returned to the OS by purging */
    uint64_t caches_created;         /* thread caches created */
    uint64_t caches_adopted;         /* thread caches adopted after their thread exited */
    uint64_t caches_abandoned;       /* thread caches given back at thread exit */
    uint64_t arena_chunks_released;  /* load-arena chunks given back */
    uint64_t budget_refusals;        /* requests refused by the memory budget */
    uint64_t oom_refusals;           /* requests refused for lack of memory from the OS */
    uint64_t lock_contended;         /* lock acquisitions that found the lock taken (in practice the heap's) */
    uint64_t lock_wait_ns;           /* nanoseconds threads spent waiting for those locks */
    uint64_t run_cache_hits;         /* large allocations (up to 64 KiB) served from the thread's run cache */
    uint64_t run_cache_bytes;        /* bytes of freed runs held in threads' run caches now */
    uint64_t os_mmap_calls;          /* the allocator's calls into the OS's memory map: mmap (purges too, once pages moved), */
    uint64_t os_munmap_calls;        /* munmap, */
    uint64_t os_madvise_calls;       /* madvise (purges and populates), */
    uint64_t os_mprotect_calls;      /* mprotect (heap growth, hardened mode), */
    uint64_t os_mremap_calls;        /* mremap (direct mappings, pages that move) */
    uint64_t page_faults;            /* page faults the process has taken (every thread, all memory) */
    uint64_t live_bytes;             /* bytes of the blocks the program holds, at their usable size */
    uint64_t in_use_bytes;           /* bytes in allocated heap blocks (slabs whole) and direct mappings */
    uint64_t peak_in_use_bytes;      /* the highest in_use_bytes seen */
    uint64_t large_bytes;            /* bytes in live large blocks (threads' cached runs included) */
    uint64_t moved_bytes;            /* resident pages moved between heap blocks (mremap) instead of purged and faulted in */
};
int edgepool_stats(struct edgepool_stats *out, size_t size);
/* Fragmentation, as edgepool_print_stats prints it: 1 - live_bytes / os_bytes (0 when os_bytes is 0). */

/* One size class's slots (edgepool_class_stats). */
struct edgepool_class_stats {
    uint64_t size;           /* slot size in bytes */
    uint64_t slots_in_use;   /* slots handed out and not freed */
    uint64_t slots_reserved; /* slots of the class's slabs: in use or free (utilisation = in_use / reserved) */
    uint64_t allocations;    /* slots handed out, ever */
    uint64_t frees;          /* slots freed, ever */
};
/* Fills the first `count` entries of out, smallest class first, and returns the number of size
 * classes (call it with count = 0 to learn it); -1 with errno = EINVAL when out is NULL and count > 0. */
int edgepool_class_stats(struct edgepool_class_stats *out, size_t count);

/* Sets the memory budget in bytes (0 = none), as EDGEPOOL_LIMIT does: requests beyond it fail with
 * NULL and errno = ENOMEM. */
void edgepool_set_limit(size_t bytes);

/* Faults in every page of [p, p+n) for writing, without changing its contents, so that the first
 * inference does not pay for page faults (MADV_POPULATE_WRITE where the kernel has it, one byte per
 * page where not). The range must be writable memory that no other thread writes during the call.
 * Returns 0, or -1 with errno = EINVAL for p == NULL with n > 0. */
int edgepool_prefault(void *p, size_t n);

/* Faults in `bytes` of edgepool's free heap memory, so that the next allocations (up to that many
 * bytes) land on resident pages, and keeps that much free memory resident from then on
 * (edgepool_prefault_free(0) stops that; edgepool_trim() and a load phase's end still purge it once).
 * Call it after loading, before the first inference. Returns the bytes made resident (fewer when the
 * budget or the OS refused). */
size_t edgepool_prefault_free(size_t bytes);

/* What a load phase did. */
struct edgepool_phase_report {
    uint64_t allocations;     /* allocations made during the phase */
    uint64_t peak_bytes;      /* the most memory edgepool held from the OS during the phase */
    uint64_t survivor_bytes;  /* bytes of load-phase allocations still live at the end */
    uint64_t released_bytes;  /* bytes handed back to the OS by the phase's end (not by purges while it ran) */
    uint64_t os_bytes_before; /* memory held from the OS when the phase began */
    uint64_t os_bytes_after;  /* ... and right after it ended */
    uint64_t duration_ns;
};

/* Opens a process-wide load phase (nests). While it is open, small allocations of every thread come
 * from memory kept apart from run-phase memory; when it ends, every page that no surviving allocation
 * uses goes back to the OS at once. Survivors stay valid and may be freed later from any thread. */
void edgepool_load_begin(void);

/* Ends the innermost load phase (opened by edgepool_load_begin or EDGEPOOL_LOAD_PHASE=1) and fills
 * *out if out is not NULL. Returns 0, or -1 with errno = EINVAL when no phase is open. */
int edgepool_load_end(struct edgepool_phase_report *out);

#ifdef __cplusplus
}
#endif

#endif /* EDGEPOOL_H */
