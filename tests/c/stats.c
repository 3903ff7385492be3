/* edgepool_stats() and edgepool_class_stats() from C, against edgepool_print_stats(): the struct's
 * fields, printed by name, and the classes must equal the report's figures of the same moment; a short
 * size fills a prefix; NULL is EINVAL. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edgepool.h"

#define F(name) printf("%s %llu\n", #name, (unsigned long long)s.name)

int main(void) {
    void *keep[100];
    for (int i = 0; i < 100; i++) keep[i] = malloc(i < 90 ? 100 : 200000);
    struct edgepool_stats s;
    memset(&s, 0xff, sizeof s);
    if (edgepool_stats(&s, sizeof s) != 0) return 1;
    /* The size classes, read right after (nothing allocated in between), as the report's rows. */
    struct edgepool_class_stats cs[64];
    int n = edgepool_class_stats(NULL, 0);
    int m = edgepool_class_stats(cs, n < 64 ? (size_t)n : 64);
    fflush(stdout);
    edgepool_print_stats(1); /* the report, right away: nothing allocated in between */
    printf("struct\n");
    F(size); F(os_bytes); F(peak_os_bytes); F(committed_bytes); F(free_bytes); F(dirty_free_bytes);
    F(slab_bytes); F(limit_bytes); F(slabs_acquired); F(slabs_released); F(slab_refills); F(remote_frees);
    F(large_allocs); F(large_frees); F(large_realloc_in_place); F(direct_allocs); F(direct_frees);
    F(direct_bytes); F(purges); F(purged_bytes); F(caches_created); F(caches_adopted); F(caches_abandoned);
    F(arena_chunks_released); F(budget_refusals); F(oom_refusals); F(lock_contended); F(lock_wait_ns);
    F(run_cache_hits); F(run_cache_bytes); F(os_mmap_calls); F(os_munmap_calls); F(os_madvise_calls);
    F(os_mprotect_calls); F(os_mremap_calls); F(page_faults); F(live_bytes); F(in_use_bytes);
    F(peak_in_use_bytes); F(large_bytes); F(moved_bytes);
    printf("classes n=%d m=%d\n", n, m);
    for (int i = 0; i < n && i < 64; i++)
        printf("class %llu %llu %llu %llu %llu\n", (unsigned long long)cs[i].size,
               (unsigned long long)cs[i].slots_in_use, (unsigned long long)cs[i].slots_reserved,
               (unsigned long long)cs[i].allocations, (unsigned long long)cs[i].frees);
    errno = 0;
    int crc = edgepool_class_stats(NULL, 1);
    printf("class null rc=%d einval=%d\n", crc, errno == EINVAL);
    /* An older, shorter struct: three fields filled, the rest untouched. */
    struct edgepool_stats t;
    memset(&t, 0xab, sizeof t);
    int rc = edgepool_stats(&t, 3 * sizeof(uint64_t));
    printf("short rc=%d size=%llu untouched=%d\n", rc, (unsigned long long)t.size,
           t.committed_bytes == 0xabababababababababULL);
    errno = 0;
    rc = edgepool_stats(NULL, sizeof s);
    printf("null rc=%d einval=%d\n", rc, errno == EINVAL);
    for (int i = 0; i < 100; i++) free(keep[i]);
    return 0;
}
