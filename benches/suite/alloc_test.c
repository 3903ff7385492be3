/* alloc-test: single-thread churn of mixed small sizes (after the alloc-test benchmark). A window of
 * 100 000 live blocks; each step frees a random one and allocates a new one: 60 % of 16-64 bytes,
 * 30 % of 65-256, 10 % of 257-2048. */
#include "suite.h"

#define LIVE 100000

int main(int argc, char **argv) {
    long n_steps = scaled(8000000, suite_scale(argc, argv));
    uint64_t rng = 0xA110CULL;
    static void *live[LIVE];
    for (long i = 0; i < n_steps; i++) {
        size_t k = rng_next(&rng) % LIVE;
        if (live[k]) check_free(live[k]);
        uint64_t r = rng_next(&rng) % 10;
        size_t n = r < 6 ? rng_range(&rng, 16, 64) : r < 9 ? rng_range(&rng, 65, 256) : rng_range(&rng, 257, 2048);
        live[k] = xmalloc(n);
        stamp(live[k], n, rng_next(&rng) | 1);
    }
    for (size_t k = 0; k < LIVE; k++)
        if (live[k]) check_free(live[k]);
    puts("ok alloc_test");
    return 0;
}
