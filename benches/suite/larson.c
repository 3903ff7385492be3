/* larson: server churn across threads (after Larson and Krishnan's benchmark). Four lanes each own an
 * array of 1000 blocks of 16-1000 bytes. A worker thread replaces random blocks (checking and freeing
 * the old one), then dies; a new thread takes the array over, so most blocks are freed by a thread
 * other than the one that allocated them. */
#include "suite.h"

#define LANES 4
#define SLOTS 1000

struct lane {
    void *slot[SLOTS];
    uint64_t rng;
    long steps;
};

static void *worker(void *arg) {
    struct lane *l = arg;
    for (long i = 0; i < l->steps; i++) {
        size_t k = rng_next(&l->rng) % SLOTS;
        check_free(l->slot[k]);
        size_t n = rng_range(&l->rng, 16, 1000);
        l->slot[k] = xmalloc(n);
        stamp(l->slot[k], n, rng_next(&l->rng) | 1);
    }
    return NULL;
}

static void *lane_main(void *arg) {
    struct lane *l = arg;
    for (int k = 0; k < SLOTS; k++) {
        size_t n = rng_range(&l->rng, 16, 1000);
        l->slot[k] = xmalloc(n);
        stamp(l->slot[k], n, rng_next(&l->rng) | 1);
    }
    for (int gen = 0; gen < 40; gen++) {
        pthread_t t;
        start_thread(&t, worker, l);
        pthread_join(t, NULL);
    }
    for (int k = 0; k < SLOTS; k++) check_free(l->slot[k]);
    return NULL;
}

int main(int argc, char **argv) {
    double s = suite_scale(argc, argv);
    static struct lane lanes[LANES];
    pthread_t t[LANES];
    for (int i = 0; i < LANES; i++) {
        lanes[i].rng = 0x1234567ULL * (i + 1);
        lanes[i].steps = scaled(400000, s);
        start_thread(&t[i], lane_main, &lanes[i]);
    }
    for (int i = 0; i < LANES; i++) pthread_join(t[i], NULL);
    puts("ok larson");
    return 0;
}
