/* A shadow-model oracle in C, for the allocator under LD_PRELOAD (tests/oracle.rs is the linked-in
 * Rust one). Random programs on several threads: malloc, calloc (must read zero), realloc (grow,
 * shrink, to and from NULL, to 0), posix_memalign / aligned_alloc / memalign (alignment must hold),
 * free, and hand-over of blocks to the next thread through a locked queue. Every live block carries a
 * pattern from its address and generation — all of it for blocks up to 4 KiB, else its first and last
 * 64 bytes and one byte every 16 KiB — which must be intact before every realloc and free; a block
 * handed out twice breaks the pattern of the other.
 *
 *     oracle SEED OPS_PER_THREAD THREADS
 *
 * Prints "oracle: N operations, seed S: 1 passed, 0 failed" or the seed and the failing operation. */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned char *p;
    size_t size, align;
    uint64_t gen;
} block;

typedef struct {
    pthread_mutex_t lock;
    block items[4096];
    size_t n;
} queue;

static unsigned long long g_seed;
static long g_ops;
static int g_threads;
static queue *g_queues;

static uint64_t next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static unsigned char byte_at(const block *b, size_t i) {
    uint64_t k = ((uint64_t)(uintptr_t)b->p ^ (b->gen << 17)) * 0x9E3779B97F4A7C15ULL;
    return (unsigned char)((k >> 56) ^ (i * 31) ^ (i >> 12));
}

/* Calls f(i) for every offset that carries the pattern of a block of `size` bytes. */
#define FOR_OFFSETS(size, i, body)                                                                       \
    do {                                                                                                 \
        size_t size_ = (size);                                                                           \
        if (size_ <= 4096) {                                                                             \
            for (size_t i = 0; i < size_; i++) body;                                                     \
        } else {                                                                                         \
            for (size_t i = 0; i < 64; i++) body;                                                        \
            for (size_t i = size_ - 64; i < size_; i++) body;                                            \
            for (size_t i = 16384; i < size_; i += 16384) body;                                          \
        }                                                                                                \
    } while (0)

static void fill(const block *b) { FOR_OFFSETS(b->size, i, { b->p[i] = byte_at(b, i); }); }

static void die(int t, long op, const char *what, const block *b) {
    printf("oracle: seed %llu thread %d operation %ld: %s (block %p, %zu bytes)\n0 passed, 1 failed\n", g_seed, t,
           op, what, (void *)b->p, b->size);
    fflush(stdout);
    exit(1);
}

static void verify(int t, long op, const block *b, size_t upto, const block *key) {
    FOR_OFFSETS(b->size, i, {
        if (i < upto && b->p[i] != byte_at(key, i)) die(t, op, "pattern damaged", b);
    });
}

static size_t random_size(uint64_t *s) {
    uint64_t r = next(s) % 1000;
    if (r < 650) return next(s) % 4097;
    if (r < 940) return 4097 + next(s) % (256 << 10);
    if (r < 997) return (256 << 10) + next(s) % (15 << 20);
    return (66u << 20) + next(s) % (8 << 20);
}

static void *worker(void *arg) {
    int t = (int)(intptr_t)arg;
    uint64_t s = g_seed ^ ((uint64_t)(t + 1) * 0x9E3779B97F4A7C15ULL);
    if (!s) s = 1;
    block *live = calloc(100000, sizeof(block));
    size_t n = 0, bytes = 0;
    uint64_t gen = (uint64_t)t << 48;
    for (long op = 0; op < g_ops; op++) {
        uint64_t r = next(&s) % 100;
        if (n == 0 || (r < 45 && bytes < (96u << 20) && n < 100000)) {
            block b = {0};
            b.size = random_size(&s);
            b.align = 16;
            b.gen = ++gen;
            uint64_t how = next(&s) % 8;
            errno = 0;
            if (how == 0) {
                b.p = calloc(1, b.size);
                if (b.p) FOR_OFFSETS(b.size, i, { if (b.p[i]) die(t, op, "calloc memory not zero", &b); });
            } else if (how == 1) {
                b.align = (size_t)1 << (3 + next(&s) % 18);
                void *q = NULL;
                int rc = posix_memalign(&q, b.align, b.size);
                if (rc) die(t, op, "posix_memalign failed", &b);
                b.p = q;
            } else if (how == 2) {
                b.align = (size_t)1 << (4 + next(&s) % 14);
                b.p = aligned_alloc(b.align, b.size);
            } else if (how == 3) {
                b.align = (size_t)1 << (4 + next(&s) % 14);
                b.p = memalign(b.align, b.size);
            } else if (how == 4) {
                b.p = realloc(NULL, b.size);
            } else {
                b.p = malloc(b.size);
            }
            if (!b.p) die(t, op, "allocation returned NULL", &b);
            if ((uintptr_t)b.p % b.align) die(t, op, "misaligned", &b);
            if (malloc_usable_size(b.p) < b.size) die(t, op, "usable size below the request", &b);
            fill(&b);
            live[n++] = b;
            bytes += b.size;
        } else {
            size_t k = next(&s) % n;
            block b = live[k];
            verify(t, op, &b, b.size, &b);
            live[k] = live[--n];
            bytes -= b.size;
            if (r < 60 && b.align <= 16) {
                uint64_t how = next(&s) % 4;
                size_t ns = how == 0 ? b.size / 2 : how == 1 ? b.size + 1 + next(&s) % (64 << 10)
                          : how == 2 ? 0 : random_size(&s);
                errno = 0;
                unsigned char *q = realloc(b.p, ns);
                if (ns == 0) {
                    if (q) die(t, op, "realloc(p, 0) returned a block", &b);
                    continue;
                }
                if (!q) die(t, op, "realloc returned NULL", &b);
                block moved = b;
                moved.p = q;
                /* The kept prefix carries the old pattern, keyed by the old block. */
                FOR_OFFSETS(b.size, i, {
                    if (i < ns && q[i] != byte_at(&b, i)) die(t, op, "realloc lost data", &moved);
                });
                block nb = {q, ns, 16, ++gen};
                fill(&nb);
                live[n++] = nb;
                bytes += ns;
            } else if (r < 62) {
                queue *dst = &g_queues[(t + 1) % g_threads];
                pthread_mutex_lock(&dst->lock);
                if (dst->n < 4096) {
                    dst->items[dst->n++] = b;
                    b.p = NULL;
                }
                pthread_mutex_unlock(&dst->lock);
                if (b.p) free(b.p);
            } else {
                free(b.p);
            }
        }
        if (op % 32 == 0) {
            queue *mine = &g_queues[t];
            pthread_mutex_lock(&mine->lock);
            for (size_t i = 0; i < mine->n; i++) {
                verify(t, op, &mine->items[i], mine->items[i].size, &mine->items[i]);
                free(mine->items[i].p);
            }
            mine->n = 0;
            pthread_mutex_unlock(&mine->lock);
        }
    }
    for (size_t i = 0; i < n; i++) {
        verify(t, g_ops, &live[i], live[i].size, &live[i]);
        free(live[i].p);
    }
    free(live);
    return NULL;
}

int main(int argc, char **argv) {
    g_seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    g_ops = argc > 2 ? atol(argv[2]) : 20000;
    g_threads = argc > 3 ? atoi(argv[3]) : 4;
    g_queues = calloc((size_t)g_threads, sizeof(queue));
    pthread_t th[64];
    for (int t = 0; t < g_threads; t++) {
        pthread_mutex_init(&g_queues[t].lock, NULL);
        pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    }
    for (int t = 0; t < g_threads; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < g_threads; t++) {
        for (size_t i = 0; i < g_queues[t].n; i++) {
            verify(t, g_ops, &g_queues[t].items[i], g_queues[t].items[i].size, &g_queues[t].items[i]);
            free(g_queues[t].items[i].p);
        }
    }
    free(g_queues);
    printf("oracle: %ld operations, seed %llu: 1 passed, 0 failed\n", g_ops * g_threads, g_seed);
    return 0;
}
