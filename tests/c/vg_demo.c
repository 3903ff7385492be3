/* A program with three deliberate bugs, for memcheck on edgepool (libedgepool.so built with the
 * `valgrind` feature, under LD_PRELOAD): a leak, a read past the end of a block, and a read after
 * free, for a small block and for a large one. Each bug is on its own line, so the report can be
 * matched to it (tests/preload.rs checks the line numbers). Prints "done". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pointers pass through here so that the compiler cannot drop the allocations. */
static char *volatile keep;
static volatile int sink;

__attribute__((noinline)) static void leak(void) {
    keep = malloc(100); /* BUG: leaked (the only pointer is overwritten below) */
    memset(keep, 1, 100);
    keep = malloc(200000); /* BUG: leaked */
    memset(keep, 2, 200000);
    keep = NULL;
}

__attribute__((noinline)) static int overflow(void) {
    char *p = malloc(20);
    memset(p, 3, 20);
    int v = p[24]; /* BUG: read past the end of a 20-byte block */
    char *big = malloc(100000);
    memset(big, 4, 100000);
    v += big[100000 + 8]; /* BUG: read past the end of a large block */
    free(p);
    free(big);
    return v;
}

__attribute__((noinline)) static int use_after_free(void) {
    char *p = malloc(48);
    memset(p, 5, 48);
    free(p);
    int v = p[40]; /* BUG: read after free */
    char *big = malloc(300000);
    memset(big, 6, 300000);
    free(big);
    v += big[123456]; /* BUG: read after free of a large block */
    return v;
}

int main(void) {
    leak();
    int v = overflow();
    v += use_after_free();
    /* Correct use that must produce no report: realloc keeps data, calloc is zero. */
    char *r = malloc(10);
    memcpy(r, "edgepool!", 10);
    r = realloc(r, 5000);
    r = realloc(r, 30);
    int *z = calloc(64, sizeof(int));
    sink = v;
    int ok = r[0] == 'e' && r[8] == '!' && z[63] == 0;
    free(r);
    free(z);
    printf(ok ? "done\n" : "realloc or calloc broken\n");
    return !ok;
}
