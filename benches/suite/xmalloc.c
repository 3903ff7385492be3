/* xmalloc: one thread allocates, another frees (after Lever and Boreham's xmalloc test). Two pairs;
 * each producer allocates batches of 256 blocks (16-512 bytes, mostly small) and hands each batch to
 * its consumer through a bounded queue; the consumer checks and frees every block. */
#include "suite.h"

#define PAIRS 2
#define BATCH 256
#define DEPTH 16

struct pair {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void **q[DEPTH];
    int head, len;
    long batches;
    uint64_t rng;
};

static void *producer(void *arg) {
    struct pair *p = arg;
    for (long b = 0; b < p->batches; b++) {
        void **batch = xmalloc(BATCH * sizeof(void *));
        for (int i = 0; i < BATCH; i++) {
            size_t n = rng_log_size(&p->rng, 16, 512);
            batch[i] = xmalloc(n);
            stamp(batch[i], n, rng_next(&p->rng) | 1);
        }
        pthread_mutex_lock(&p->mu);
        while (p->len == DEPTH) pthread_cond_wait(&p->cv, &p->mu);
        p->q[(p->head + p->len) % DEPTH] = batch;
        p->len++;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    return NULL;
}

static void *consumer(void *arg) {
    struct pair *p = arg;
    for (long b = 0; b < p->batches; b++) {
        pthread_mutex_lock(&p->mu);
        while (p->len == 0) pthread_cond_wait(&p->cv, &p->mu);
        void **batch = p->q[p->head];
        p->head = (p->head + 1) % DEPTH;
        p->len--;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < BATCH; i++) check_free(batch[i]);
        free(batch);
    }
    return NULL;
}

int main(int argc, char **argv) {
    double s = suite_scale(argc, argv);
    static struct pair pairs[PAIRS];
    pthread_t t[2 * PAIRS];
    for (int i = 0; i < PAIRS; i++) {
        pthread_mutex_init(&pairs[i].mu, NULL);
        pthread_cond_init(&pairs[i].cv, NULL);
        pairs[i].batches = scaled(20000, s);
        pairs[i].rng = 0xABCDEFULL * (i + 3);
        start_thread(&t[2 * i], producer, &pairs[i]);
        start_thread(&t[2 * i + 1], consumer, &pairs[i]);
    }
    for (int i = 0; i < 2 * PAIRS; i++) pthread_join(t[i], NULL);
    puts("ok xmalloc");
    return 0;
}
