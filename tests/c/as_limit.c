/* Runs under an address-space limit (`ulimit -v`), on glibc and on edgepool.
 *
 *   as_limit count SIZE   allocates SIZE-byte blocks, touching every page, until malloc fails; then
 *                         checks that errno is ENOMEM and that small blocks still work (malloc,
 *                         realloc, calloc), frees everything, and checks that the same number of
 *                         blocks can be had again.
 *                         Prints "blocks N again M small ok".
 *   as_limit gaps [ALIGN] allocates pairs of a 25-page and a 7-page block until malloc fails, frees the
 *                         25-page ones (each leaves a gap of 25 free pages in no aligned 32-page
 *                         block), and allocates 25-page blocks again until malloc fails; the 7-page
 *                         blocks must keep their contents. With ALIGN, the 25-page blocks come from
 *                         aligned_alloc(ALIGN). Prints "gaps N again M".
 *   as_limit holes        maps foreign memory where the heap's next pieces would go (a lazy region
 *                         grows piece by piece, see init.rs), then allocates 64 blocks of 1 MiB:
 *                         none may overlap the foreign memory, whose contents must survive. Prints
 *                         "holes ok F" with F the number of pieces it took first. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

static size_t fill(size_t sz, char ***out) {
    size_t n = 0, cap = 1024;
    char **v = malloc(cap * sizeof *v);
    if (!v) return 0;
    for (;;) {
        char *p = malloc(sz);
        if (!p) break;
        for (size_t i = 0; i < sz; i += 4096) p[i] = (char)n;
        if (n == cap) {
            /* Keep the list in a mapping of its own: it must not change what malloc can get. */
            char **w = mmap(0, 2 * cap * sizeof *v, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (w == MAP_FAILED) { free(p); break; }
            memcpy(w, v, cap * sizeof *v);
            if (cap == 1024) free(v); else munmap(v, cap * sizeof *v);
            v = w;
            cap *= 2;
        }
        v[n++] = p;
    }
    *out = v;
    return n;
}

static int count(size_t sz) {
    char **v;
    size_t n = fill(sz, &v);
    int e = errno;
    if (n == 0) { printf("no block at all\n"); return 1; }
    if (e != ENOMEM) { printf("errno %d, not ENOMEM\n", e); return 1; }
    /* Small blocks once the large ones ran out: usable as any (written, grown, zeroed, freed). */
    char *s = malloc(16);
    char *z = calloc(4, 8);
    if (s) {
        memset(s, 7, 16);
        char *t = realloc(s, 40);
        if (t) {
            s = t;
            if (s[15] != 7) { printf("small block lost its contents in realloc\n"); return 1; }
        }
    }
    if (z) {
        for (int i = 0; i < 32; i++)
            if (z[i]) { printf("calloc block not zero\n"); return 1; }
        free(z);
    }
    for (size_t i = 0; i < n; i++) {
        if (v[i][0] != (char)i) { printf("block %zu damaged\n", i); return 1; }
        free(v[i]);
    }
    free(s);
    char **w;
    size_t m = fill(sz, &w);
    printf("blocks %zu again %zu small %s\n", n, m, s ? "ok" : "NULL");
    return 0;
}

#define MAX_PAIRS 65536

static int gaps(size_t align) {
    const size_t a = 25 * 4096, b = 7 * 4096;
    /* The lists in a mapping of their own, made in this mode only (static arrays would take address
     * space from the other modes too). */
    char **gap_a = mmap(0, 2 * MAX_PAIRS * sizeof(char *), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (gap_a == MAP_FAILED) { printf("no room for the lists\n"); return 1; }
    char **gap_b = gap_a + MAX_PAIRS;
    size_t n = 0;
    while (n < MAX_PAIRS) {
        char *p = align ? aligned_alloc(align, a) : malloc(a);
        if (!p) break;
        char *q = malloc(b);
        if (!q) { free(p); break; }
        memset(p, 1, a);
        memset(q, (char)n, b);
        gap_a[n] = p;
        gap_b[n++] = q;
    }
    if (n == 0) { printf("no pair at all\n"); return 1; }
    for (size_t i = 0; i < n; i++) free(gap_a[i]);
    size_t m = 0;
    while (m < n && (gap_a[m] = align ? aligned_alloc(align, a) : malloc(a))) {
        if ((uintptr_t)gap_a[m] % (align ? align : 16)) { printf("block %zu not aligned\n", m); return 1; }
        memset(gap_a[m++], 3, a);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < b; j += 4096)
            if (gap_b[i][j] != (char)i) { printf("block %zu damaged\n", i); return 1; }
    printf("gaps %zu again %zu\n", n, m);
    return 0;
}

static int holes(void) {
    const uintptr_t piece = 2u << 20;
    char *p = malloc(1 << 20);
    if (!p) { printf("first malloc failed\n"); return 1; }
    uintptr_t at = ((uintptr_t)p & ~(piece - 1)) + piece;
    char *foreign[8];
    int taken = 0;
    for (int k = 0; k < 8; k++) {
        char *q = mmap((void *)(at + (uintptr_t)k * piece), piece, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        foreign[k] = (q == MAP_FAILED || (uintptr_t)q != at + (uintptr_t)k * piece) ? NULL : q;
        if (foreign[k]) { memset(foreign[k], 0x5a, piece); taken++; }
        else if (q != MAP_FAILED) munmap(q, piece);
    }
    char *b[64];
    for (int i = 0; i < 64; i++) {
        b[i] = malloc(1 << 20);
        if (!b[i]) { printf("malloc %d failed\n", i); return 1; }
        memset(b[i], i, 1 << 20);
        for (int k = 0; k < 8; k++) {
            if (foreign[k] && b[i] + (1 << 20) > foreign[k] && b[i] < foreign[k] + piece) {
                printf("block %d overlaps foreign piece %d\n", i, k);
                return 1;
            }
        }
    }
    for (int k = 0; k < 8; k++)
        for (uintptr_t j = 0; foreign[k] && j < piece; j += 4096)
            if (foreign[k][j] != 0x5a) { printf("foreign piece %d damaged\n", k); return 1; }
    for (int i = 0; i < 64; i++) {
        if (b[i][12345] != (char)i) { printf("block %d damaged\n", i); return 1; }
        free(b[i]);
    }
    free(p);
    printf("holes ok %d\n", taken);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "count")) return count(strtoul(argv[2], 0, 0));
    if (argc == 2 && !strcmp(argv[1], "holes")) return holes();
    if (argc == 2 && !strcmp(argv[1], "gaps")) return gaps(0);
    if (argc == 3 && !strcmp(argv[1], "gaps")) return gaps(strtoul(argv[2], 0, 0));
    fprintf(stderr, "usage: as_limit count SIZE | as_limit gaps [ALIGN] | as_limit holes\n");
    return 2;
}
