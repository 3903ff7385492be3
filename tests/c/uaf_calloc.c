/* calloc must return zeros even where the program wrote after free (run under edgepool only: on
 * glibc the freed 1 MiB chunk is unmapped and the write faults). Large blocks are freed, purged by
 * malloc_trim, written after free (which faults the purged pages back in with the data), and calloc'd
 * again. Prints "uaf-calloc ok N" with N the number of callocs that got the written block back. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    size_t sizes[] = {64 << 10, 100000, 1 << 20, 3 << 20};
    int reused = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = sizes[i];
        char *p = malloc(n);
        if (!p) { printf("malloc %zu failed\n", n); return 1; }
        memset(p, 1, n);
        free(p);
        malloc_trim(0);
        volatile char *stale = p;
        for (size_t j = 0; j < n; j += 512) stale[j] = 0x77; /* the program's bug */
        char *q = calloc(1, n);
        if (!q) { printf("calloc %zu failed\n", n); return 1; }
        reused += q == p;
        for (size_t j = 0; j < n; j++)
            if (q[j]) { printf("calloc(1, %zu) byte %zu is %d\n", n, j, q[j]); return 1; }
        free(q);
    }
    printf("uaf-calloc ok %d\n", reused);
    return 0;
}
