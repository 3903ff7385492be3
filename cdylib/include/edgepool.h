/* edgepool: a memory allocator for machine-learning inference on small devices.
 *
 * libedgepool.so exports the whole C allocation API (malloc, free, calloc, realloc, posix_memalign,
 * aligned_alloc, ...) with glibc's semantics, for use under LD_PRELOAD; and the functions below.
 * Link with -ledgepool, or find them at run time (dlsym, Python ctypes) when preloaded.
 */
#ifndef EDGEPOOL_H
#define EDGEPOOL_H

#include <stddef.h>

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

#ifdef __cplusplus
}
#endif

#endif /* EDGEPOOL_H */
