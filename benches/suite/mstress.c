/* mstress: random sizes, a slowly growing live set, and threads that die and are replaced (after
 * mimalloc-bench's mstress). Ten generations of four threads; each thread keeps a local array of
 * blocks (its length grows with the generation), replaces random entries, and swaps one block in four
 * with a shared transfer array, so blocks move between threads and outlive them. Sizes: 89 % 16-256
 * bytes, 10 % up to 16 KiB, 1 % up to 1 MiB. */
#include "suite.h"

#define THREADS 4
#define GENERATIONS 10
#define TRANSFER 2000

static void *transfer[TRANSFER];
static long steps;

struct worker {
    int gen, id;
};

static size_t pick_size(uint64_t *rng) {
    uint64_t r = rng_next(rng) % 100;
    if (r < 89) return rng_log_size(rng, 16, 256);
    if (r < 99) return rng_log_size(rng, 257, 16384);
    return rng_log_size(rng, 16385, 1 << 20);
}

static void *new_block(uint64_t *rng) {
    size_t n = pick_size(rng);
    void *p = xmalloc(n);
    stamp(p, n, rng_next(rng) | 1);
    return p;
}

static void swap_out(void *p, uint64_t *rng) {
    void *old = __atomic_exchange_n(&transfer[rng_next(rng) % TRANSFER], p, __ATOMIC_ACQ_REL);
    if (old) check_free(old);
}

static void *stress(void *arg) {
    struct worker *w = arg;
    uint64_t rng = 0x51ED2701ULL * (uint64_t)(w->gen * THREADS + w->id + 1);
    size_t len = 2000 + (size_t)w->gen * 500;
    void **local = calloc(len, sizeof(void *));
    if (!local) suite_fail("calloc returned NULL", NULL, len);
    for (long i = 0; i < steps; i++) {
        size_t k = rng_next(&rng) % len;
        if (local[k]) check_free(local[k]);
        local[k] = new_block(&rng);
        if (rng_next(&rng) % 4 == 0) {
            swap_out(local[k], &rng);
            local[k] = NULL;
        }
    }
    /* Dying: free seven eighths, leave the rest to later generations. */
    for (size_t k = 0; k < len; k++) {
        if (!local[k]) continue;
        if (k % 8 == 0) swap_out(local[k], &rng); else check_free(local[k]);
    }
    free(local);
    return NULL;
}

int main(int argc, char **argv) {
    steps = scaled(60000, suite_scale(argc, argv));
    for (int gen = 0; gen < GENERATIONS; gen++) {
        pthread_t t[THREADS];
        struct worker w[THREADS];
        for (int i = 0; i < THREADS; i++) {
            w[i] = (struct worker){gen, i};
            start_thread(&t[i], stress, &w[i]);
        }
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    }
    for (int k = 0; k < TRANSFER; k++)
        if (transfer[k]) check_free(transfer[k]);
    puts("ok mstress");
    return 0;
}
