/* Threads whose thread-exit destructor runs after edgepool's (a pthread key made after edgepool's, so
 * later in glibc's destructor order) and allocates: such allocations come after the thread's cache was
 * abandoned. Each used to adopt a cache and abandon it again; tests/preload.rs counts adoptions.
 * Prints "late: N threads ok" when every block held its pattern. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 50
#define THREADS 8
#define LATE_ALLOCS 25

static pthread_key_t key;
/* Stores through a volatile pointer keep the compiler from eliding a malloc/free pair. */
void *volatile sink;
static int bad;

static void late(void *arg) {
    unsigned char *p[LATE_ALLOCS];
    for (int i = 0; i < LATE_ALLOCS; i++) {
        size_t n = 24 + 40 * (i % 8);
        p[i] = malloc(n);
        if (!p[i]) { __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED); return; }
        memset(p[i], (int)(i + (size_t)arg), n);
        sink = p[i];
    }
    for (int i = 0; i < LATE_ALLOCS; i++) {
        size_t n = 24 + 40 * (i % 8);
        for (size_t k = 0; k < n; k++)
            if (p[i][k] != (unsigned char)(i + (size_t)arg)) { __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED); break; }
        free(p[i]);
    }
}

static void *run(void *arg) {
    void *x = malloc(100);
    memset(x, 1, 100);
    sink = x;
    free(x);
    pthread_setspecific(key, arg);
    return NULL;
}

int main(void) {
    /* A thread with a cache first: edgepool's key exists before ours. */
    pthread_t t0;
    pthread_create(&t0, NULL, run, NULL);
    pthread_join(t0, NULL);
    if (pthread_key_create(&key, late) != 0) return 2;
    for (int r = 0; r < ROUNDS; r++) {
        pthread_t t[THREADS];
        for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, run, (void *)(size_t)(1 + i));
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    }
    if (bad) { printf("late: %d bad blocks\n", bad); return 1; }
    printf("late: %d threads ok\n", ROUNDS * THREADS);
    return 0;
}
