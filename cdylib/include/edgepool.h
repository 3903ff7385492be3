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

/* Writes the statistics report (bytes taken from the OS, peak, counters) to file descriptor `fd`. */
void edgepool_print_stats(int fd);

/* Sets the memory budget in bytes (0 = none), as EDGEPOOL_LIMIT does: requests beyond it fail with
 * NULL and errno = ENOMEM. */
void edgepool_set_limit(size_t bytes);

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
