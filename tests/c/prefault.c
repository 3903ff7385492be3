/* edgepool_prefault and edgepool_prefault_free from C: a range becomes resident with its contents
 * unchanged; NULL is EINVAL; after prefault_free the next allocations of that much memory take almost
 * no page faults (against a cold round first). Prints one line of figures per check. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "edgepool.h"

#define PAGE 4096
#define N 16
#define SIZE (1 << 20)

static long faults(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

static long round_of_blocks(void) {
    char *b[N];
    for (int i = 0; i < N; i++) b[i] = malloc(SIZE);
    long f0 = faults();
    for (int i = 0; i < N; i++)
        for (int off = 0; off < SIZE; off += PAGE) b[i][off] = 1;
    long f = faults() - f0;
    for (int i = 0; i < N; i++) free(b[i]);
    return f;
}

int main(void) {
    size_t len = 32 * PAGE;
    unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    memset(m + 5 * PAGE, 0x5a, PAGE);
    unsigned char vec[32];
    int rc = edgepool_prefault(m + 2 * PAGE + 10, 20 * PAGE);
    mincore(m, len, vec);
    int resident = 0, intact = 1;
    for (int i = 2; i <= 22; i++) resident += vec[i] & 1;
    for (size_t i = 0; i < len; i++) intact &= m[i] == ((i / PAGE == 5) ? 0x5a : 0);
    printf("prefault rc=%d resident=%d/21 intact=%d\n", rc, resident, intact);
    errno = 0;
    rc = edgepool_prefault(NULL, 100);
    printf("null rc=%d einval=%d\n", rc, errno == EINVAL);

    edgepool_trim();
    long cold = round_of_blocks();
    edgepool_trim();
    size_t got = edgepool_prefault_free((size_t)N * SIZE);
    long warm = round_of_blocks();
    printf("pages=%d cold=%ld warm=%ld prefaulted=%zu\n", N * SIZE / PAGE, cold, warm, got);
    return 0;
}
