/* Shared by the benchmark suite's programs (benches/suite/, one .c file each): a seeded random generator, the size
 * argument, and the stamps that make every program check its own data.
 *
 * Every program takes one optional argument, a scale (default 1; the tests run 0.01): the amount of
 * work is multiplied by it, the shape of the workload is not. A program prints "ok <name>" and exits 0
 * when every block it freed held what it wrote; it prints what was wrong and exits 1 otherwise.
 *
 * A stamp writes the block's size and a tag at its start, the tag mixed with the size in its last 8
 * bytes, and one word per 4 KiB page in between, so that a large block's pages are all touched (as a
 * real program touches the memory it asks for) and any two blocks that overlap, or a block that lost
 * its contents, fail the check when freed. Blocks are at least 16 bytes. */
#ifndef SUITE_H
#define SUITE_H
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t rng_next(uint64_t *s) {
    /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* A number in [lo, hi]. */
static inline size_t rng_range(uint64_t *s, size_t lo, size_t hi) {
    return lo + (size_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

/* A size in [lo, hi] spread evenly over the powers of two in between (small sizes are common). */
static inline size_t rng_log_size(uint64_t *s, size_t lo, size_t hi) {
    int lb = 63 - __builtin_clzll(lo), hb = 63 - __builtin_clzll(hi);
    int b = lb + (int)(rng_next(s) % (uint64_t)(hb - lb + 1));
    size_t a = (size_t)1 << b, z = a * 2 - 1;
    if (a < lo) a = lo;
    if (z > hi) z = hi;
    return rng_range(s, a, z);
}

static double suite_scale(int argc, char **argv) {
    double s = argc > 1 ? atof(argv[1]) : 1.0;
    if (!(s > 0)) {
        fprintf(stderr, "usage: %s [scale > 0]\n", argv[0]);
        exit(2);
    }
    return s;
}

static inline long scaled(long n, double s) {
    double v = (double)n * s;
    return v < 1 ? 1 : (long)v;
}

static void suite_fail(const char *what, const void *p, size_t n) {
    fprintf(stderr, "FAILED: %s (block %p, %zu bytes)\n", what, p, n);
    exit(1);
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) suite_fail("malloc returned NULL", p, n);
    return p;
}

static inline uint64_t tail_of(uint64_t tag, size_t n) { return (tag ^ (uint64_t)n) * 0x9E3779B97F4A7C15ULL; }

static inline void stamp(void *p, size_t n, uint64_t tag) {
    unsigned char *b = p;
    uint64_t h[2] = {(uint64_t)n, tag};
    memcpy(b, h, 16);
    for (size_t off = 4096; off + 16 <= n; off += 4096) {
        uint64_t w = tag + off;
        memcpy(b + off, &w, 8);
    }
    if (n >= 24) {
        uint64_t t = tail_of(tag, n);
        memcpy(b + n - 8, &t, 8);
    }
}

/* Checks a stamp. `n` and `tag` are what the caller expects, or 0 to take them from the block. The
 * block's first `valid` bytes are checked (after realloc, only the old size's stamp is still there);
 * pass `valid` = 0 for the whole block. Returns the block's size. */
static inline size_t check_stamp(const void *p, size_t n, uint64_t tag, size_t valid) {
    const unsigned char *b = p;
    uint64_t h[2];
    memcpy(h, b, 16);
    if (n && h[0] != n) suite_fail("size word changed", p, n);
    if (tag && h[1] != tag) suite_fail("tag changed", p, n);
    n = (size_t)h[0];
    tag = h[1];
    if (valid == 0) valid = n;
    for (size_t off = 4096; off + 16 <= n && off + 16 <= valid; off += 4096) {
        uint64_t w;
        memcpy(&w, b + off, 8);
        if (w != tag + off) suite_fail("page word changed", p, n);
    }
    if (n >= 24 && valid == n) {
        uint64_t t;
        memcpy(&t, b + n - 8, 8);
        if (t != tail_of(tag, n)) suite_fail("last word changed", p, n);
    }
    return n;
}

/* Checks a block's stamp and frees it. */
static inline void check_free(void *p) {
    check_stamp(p, 0, 0, 0);
    free(p);
}

static inline void start_thread(pthread_t *t, void *(*f)(void *), void *arg) {
    if (pthread_create(t, NULL, f, arg) != 0) suite_fail("pthread_create failed", NULL, 0);
}
#endif
