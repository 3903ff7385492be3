/* Debug mode under LD_PRELOAD (EDGEPOOL_DEBUG=1): one bug per run, named by argv[1]; the program
 * prints "survived" if nothing stopped it. "ok" is a correct workload: blocks of many sizes, reallocs,
 * frees from another thread, then edgepool_check() (printed) and malloc_usable_size of a 40-byte
 * block (printed: debug mode answers the requested size). Built with -O2: every bug goes through a
 * volatile pointer so the compiler keeps it. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long edgepool_check(void) __attribute__((weak));

static void *free_it(void *p) {
    free(p);
    return NULL;
}

static void *worker(void *arg) {
    unsigned s = (unsigned)(size_t)arg;
    void *live[256] = {0};
    for (int i = 0; i < 20000; i++) {
        s = s * 1103515245u + 12345u;
        int j = (s >> 8) % 256;
        size_t n = (s >> 16) % 3000 + 1;
        if (s % 61 == 0) n = 200000;
        if (live[j]) {
            if (s % 5 == 0) {
                live[j] = realloc(live[j], n);
                memset(live[j], 3, n);
                continue;
            }
            free(live[j]);
        }
        live[j] = malloc(n);
        memset(live[j], 1, n);
    }
    for (int j = 0; j < 256; j++) free(live[j]);
    return NULL;
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "ok";
    char *volatile p = malloc(40);
    if (!strcmp(c, "ok")) {
        pthread_t t[3];
        for (long i = 0; i < 3; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
        for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
        pthread_t f;
        pthread_create(&f, NULL, free_it, malloc(100));
        pthread_join(f, NULL);
        printf("checked %ld usable %zu\n", edgepool_check ? edgepool_check() : -2, malloc_usable_size(p));
        free(p);
    } else if (!strcmp(c, "overflow")) {
        p[40] = 'x';
        free(p);
    } else if (!strcmp(c, "double_thread")) {
        pthread_t f;
        pthread_create(&f, NULL, free_it, p);
        pthread_join(f, NULL);
        free(p);
    } else if (!strcmp(c, "double_large")) {
        char *volatile q = malloc(1 << 20);
        memset(q, 1, 1 << 20);
        free(q);
        free(q);
    } else if (!strcmp(c, "stack")) {
        char buf[64];
        char *volatile s = buf + 16;
        free(s);
    } else if (!strcmp(c, "interior")) {
        free(p + 16);
    } else if (!strcmp(c, "uaf")) {
        free(p);
        p[20] = 1;
        if (edgepool_check) edgepool_check();
    } else if (!strcmp(c, "segv")) {
        char *volatile q = malloc(4242);
        (void)q;
        *(volatile int *)(size_t)16 = 1;
    }
    printf("survived\n");
    return 0;
}
