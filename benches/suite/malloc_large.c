/* malloc-large: large blocks allocated, grown with realloc and freed in a loop (after mimalloc-bench's
 * malloc-large). Eight live blocks; each step replaces one with a block of 64 KiB-16 MiB (spread over
 * the powers of two), writes one word in each of its pages, and grows half of them with realloc to up
 * to twice the size (at most 32 MiB), checking that the contents moved with them. */
#include "suite.h"

#define LIVE 8

int main(int argc, char **argv) {
    long n_steps = scaled(3000, suite_scale(argc, argv));
    uint64_t rng = 0xC0FFEEULL;
    void *live[LIVE] = {0};
    for (long i = 0; i < n_steps; i++) {
        int k = (int)(rng_next(&rng) % LIVE);
        if (live[k]) check_free(live[k]);
        size_t n = rng_log_size(&rng, 64 << 10, 16 << 20);
        uint64_t tag = rng_next(&rng) | 1;
        void *p = xmalloc(n);
        stamp(p, n, tag);
        if (rng_next(&rng) & 1) {
            size_t m = n + rng_range(&rng, 1, n);
            if (m > (32u << 20)) m = 32u << 20;
            void *q = realloc(p, m);
            if (!q) suite_fail("realloc returned NULL", p, m);
            check_stamp(q, n, tag, n);
            stamp(q, m, tag);
            p = q;
        }
        live[k] = p;
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k]) check_free(live[k]);
    puts("ok malloc_large");
    return 0;
}
