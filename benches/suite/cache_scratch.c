/* cache-scratch: passive false sharing (after Hoard's cache-scratch). The main thread allocates one
 * small block per thread, back to back, and hands one to each thread; each thread frees it, then
 * repeatedly allocates a block of the same size, writes it many times and frees it. An allocator that
 * gives a thread memory on a cache line another thread writes makes the writes slow. */
#include "suite.h"

#define THREADS 2
#define SIZE 16

static long rounds;

static void *scratch(void *arg) {
    char *first = arg;
    if (first[0] != 'x') suite_fail("first block lost its byte", first, SIZE);
    free(first);
    for (long r = 0; r < rounds; r++) {
        volatile char *p = xmalloc(SIZE);
        for (int w = 0; w < 500; w++) {
            for (int k = 0; k < SIZE; k++) p[k] = (char)(w + k);
        }
        for (int k = 0; k < SIZE; k++)
            if (p[k] != (char)(499 + k)) suite_fail("scratch block changed", (void *)p, SIZE);
        free((void *)p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    rounds = scaled(400000, suite_scale(argc, argv));
    pthread_t t[THREADS];
    char *b[THREADS];
    for (int i = 0; i < THREADS; i++) {
        b[i] = xmalloc(SIZE);
        b[i][0] = 'x';
    }
    for (int i = 0; i < THREADS; i++) start_thread(&t[i], scratch, b[i]);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    puts("ok cache_scratch");
    return 0;
}
