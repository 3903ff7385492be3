/* edgepool_stats() from C, against edgepool_print_stats(): the struct's fields, printed by name, must
 * equal the report's figures of the same moment; a short size fills a prefix; NULL is EINVAL. */
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
    fflush(stdout);
    edgepool_print_stats(1); /* the report, right away: nothing allocated in between */
    printf("struct\n");
    F(size); F(os_bytes); F(peak_os_bytes); F(committed_bytes); F(free_bytes); F(dirty_free_bytes);
    F(slab_bytes); F(limit_bytes); F(slabs_acquired); F(slabs_released); F(slab_refills); F(remote_frees);
    F(large_allocs); F(large_frees); F(large_realloc_in_place); F(direct_allocs); F(direct_frees);
    F(direct_bytes); F(purges); F(purged_bytes); F(caches_created); F(caches_adopted); F(caches_abandoned);
    F(arena_chunks_released); F(budget_refusals); F(oom_refusals); F(lock_contended); F(lock_wait_ns);
    F(run_cache_hits); F(run_cache_bytes); F(os_mmap_calls); F(os_munmap_calls); F(os_madvise_calls);
    F(os_mprotect_calls); F(os_mremap_calls); F(page_faults);
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
