/* rptest: producer/consumer rings (after the rpmalloc benchmark). Four threads in a ring; each
 * allocates blocks of which three quarters are 4-16 KiB and the rest 32 bytes-4 KiB, keeps half in a
 * local window of 64 (freeing the oldest), and sends the other half in batches of 32 to the next
 * thread, which checks and frees them (a sender waits, freeing what it was sent, while more than 1024
 * blocks wait there). */
#include <sched.h>
#include "suite.h"

#define THREADS 4
#define WINDOW 64
#define SEND 32
#define LIMIT 1024

struct inbox {
    pthread_mutex_t mu;
    void *head;
    int count; /* blocks waiting; a sender waits while it is over LIMIT (draining its own inbox) */
} __attribute__((aligned(64)));

static struct inbox inbox[THREADS];
static int finished;
static long iterations;

static inline void **link_of(void *p) { return (void **)((char *)p + 16); }

static void take_and_free(struct inbox *mine);

static void free_list(void *p) {
    while (p) {
        void *next = *link_of(p);
        check_free(p);
        p = next;
    }
}

static void take_and_free(struct inbox *mine) {
    pthread_mutex_lock(&mine->mu);
    void *got = mine->head;
    mine->head = NULL;
    __atomic_store_n(&mine->count, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&mine->mu);
    free_list(got);
}

static void *ring(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t rng = 0x9E3779B97F4A7C15ULL * (id + 1);
    void *window[WINDOW] = {0};
    void *out = NULL, *out_tail = NULL;
    int out_len = 0;
    struct inbox *next = &inbox[(id + 1) % THREADS], *mine = &inbox[id];
    for (long i = 0; i < iterations; i++) {
        size_t n = rng_next(&rng) % 4 ? rng_range(&rng, 4097, 16384) : rng_log_size(&rng, 32, 4096);
        void *p = xmalloc(n);
        stamp(p, n, rng_next(&rng) | 1);
        if (rng_next(&rng) & 1) {
            int k = (int)(i % WINDOW);
            if (window[k]) check_free(window[k]);
            window[k] = p;
        } else {
            *link_of(p) = NULL;
            if (out_tail) *link_of(out_tail) = p; else out = p;
            out_tail = p;
            if (++out_len == SEND) {
                while (__atomic_load_n(&next->count, __ATOMIC_RELAXED) > LIMIT) {
                    take_and_free(mine);
                    sched_yield();
                }
                pthread_mutex_lock(&next->mu);
                *link_of(out_tail) = next->head;
                next->head = out;
                __atomic_store_n(&next->count, next->count + SEND, __ATOMIC_RELAXED);
                pthread_mutex_unlock(&next->mu);
                out = out_tail = NULL;
                out_len = 0;
            }
        }
        if (i % 16 == 15) take_and_free(mine);
    }
    free_list(out);
    for (int k = 0; k < WINDOW; k++)
        if (window[k]) check_free(window[k]);
    /* Keep draining until every thread is done sending (one may be waiting on this inbox). */
    __atomic_add_fetch(&finished, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&finished, __ATOMIC_ACQUIRE) < THREADS) {
        take_and_free(mine);
        sched_yield();
    }
    take_and_free(mine);
    return NULL;
}

int main(int argc, char **argv) {
    iterations = scaled(400000, suite_scale(argc, argv));
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_mutex_init(&inbox[i].mu, NULL);
    for (int i = 0; i < THREADS; i++) start_thread(&t[i], ring, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    puts("ok rptest");
    return 0;
}
