/* The C allocation contract, run under LD_PRELOAD=libedgepool.so (see tests/preload.rs).
 * Built with -D_FORTIFY_SOURCE=3 -O2. Every check prints on failure; the last line is
 * "contract: N passed, M failed"; the exit status is 0 only if nothing failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* C23; glibc 2.36 lacks them, so weak: under LD_PRELOAD they resolve to edgepool's. */
__attribute__((weak)) void free_sized(void *p, size_t size);
__attribute__((weak)) void free_aligned_sized(void *p, size_t align, size_t size);

static int passed, failed;
#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (cond) {                                                         \
            passed++;                                                       \
        } else {                                                            \
            failed++;                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

static volatile size_t huge = (size_t)PTRDIFF_MAX + 1; /* volatile: keep the compiler out of it */
static volatile size_t half = SIZE_MAX / 2;

/* 40 keys before any thread starts, so that the allocator's own key is high (>= 32): glibc's
 * pthread_setspecific then calls calloc, i.e. re-enters the allocator. */
static pthread_key_t early_keys[40];
__attribute__((constructor)) static void make_keys(void) {
    for (int i = 0; i < 40; i++) pthread_key_create(&early_keys[i], free);
}

static void test_malloc(void) {
    void *a = malloc(0), *b = malloc(0);
    CHECK(a && b && a != b, "malloc(0) must give unique non-NULL pointers");
    free(a);
    free(b);
    errno = 0;
    CHECK(malloc(huge) == NULL && errno == ENOMEM, "malloc(PTRDIFF_MAX+1) errno=%d", errno);
    for (size_t n = 1; n <= 70000; n = n < 5000 ? n + 1 : n * 3 / 2) {
        unsigned char *p = malloc(n);
        CHECK(p && ((uintptr_t)p % 16) == 0, "malloc(%zu) = %p not 16-aligned", n, (void *)p);
        size_t u = malloc_usable_size(p);
        CHECK(u >= n, "usable %zu < %zu", u, n);
        memset(p, 0xA5, u); /* all of the usable size is writable (FORTIFY checks this) */
        free(p);
    }
    CHECK(malloc_usable_size(NULL) == 0, "malloc_usable_size(NULL)");
}

static void test_calloc(void) {
    errno = 0;
    CHECK(calloc(half, 3) == NULL && errno == ENOMEM, "calloc overflow errno=%d", errno);
    void *z = calloc(0, 8);
    CHECK(z != NULL, "calloc(0, 8) must be non-NULL");
    free(z);
    /* Dirty memory, free it, and calloc the same sizes: must read zero. */
    for (size_t n = 16; n <= (8u << 20); n *= 4) {
        unsigned char *p = malloc(n);
        memset(p, 0xFF, n);
        free(p);
        unsigned char *q = calloc(1, n);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += q[i] != 0;
        CHECK(bad == 0, "calloc(1, %zu) has %zu non-zero bytes", n, bad);
        free(q);
    }
}

static void test_realloc(void) {
    char *p = realloc(NULL, 100);
    CHECK(p != NULL, "realloc(NULL, 100)");
    memset(p, 'x', 100);
    size_t u = malloc_usable_size(p);
    char *q = realloc(p, u);
    CHECK(q == p, "growing within the usable size moved the block");
    errno = 0;
    q = realloc(p, huge);
    CHECK(q == NULL && errno == ENOMEM, "realloc to PTRDIFF_MAX+1 errno=%d", errno);
    CHECK(p[0] == 'x' && p[99] == 'x', "failed realloc damaged the block");
    for (size_t n = 200; n < (64u << 20); n = n * 3) {
        p = realloc(p, n);
        CHECK(p && p[0] == 'x' && p[99] == 'x', "realloc up to %zu lost data", n);
    }
    p = realloc(p, 50);
    CHECK(p && p[0] == 'x' && p[49] == 'x', "realloc down lost data");
    errno = 4321;
    q = realloc(p, 0);
    CHECK(q == NULL && errno == 4321, "realloc(p, 0) must free, return NULL, keep errno (%d)", errno);
    errno = 0;
    CHECK(reallocarray(NULL, half, 3) == NULL && errno == ENOMEM, "reallocarray overflow");
    errno = 0;
    void *r = reallocarray(NULL, 0, 16);
    CHECK(errno == 0, "reallocarray(NULL, 0, 16) set errno %d", errno);
    free(r);
}

static void test_aligned(void) {
    void *p = (void *)0x1234;
    CHECK(posix_memalign(&p, 3, 8) == EINVAL && p == (void *)0x1234, "posix_memalign(3) must be EINVAL, p untouched");
    CHECK(posix_memalign(&p, sizeof(void *) / 2, 8) == EINVAL && p == (void *)0x1234, "alignment below sizeof(void*)");
    CHECK(posix_memalign(&p, 64, huge) == ENOMEM && p == (void *)0x1234, "posix_memalign huge must be ENOMEM");
    CHECK(posix_memalign(&p, 64, 0) == 0 && p != NULL && ((uintptr_t)p % 64) == 0, "posix_memalign(64, 0)");
    free(p);
    for (size_t a = sizeof(void *); a <= (1u << 22); a *= 2) {
        for (size_t n = 1; n < (1u << 21); n = n * 7 + 3) {
            void *q = NULL;
            int rc = posix_memalign(&q, a, n);
            CHECK(rc == 0 && q && ((uintptr_t)q % a) == 0, "posix_memalign(%zu, %zu) rc=%d p=%p", a, n, rc, q);
            memset(q, 1, n);
            free(q);
            q = aligned_alloc(a, n);
            CHECK(q && ((uintptr_t)q % a) == 0, "aligned_alloc(%zu, %zu) = %p", a, n, q);
            if (free_aligned_sized) free_aligned_sized(q, a, n);
            else free(q);
        }
    }
    errno = 0;
    CHECK(aligned_alloc(0, 16) == NULL && errno == EINVAL, "aligned_alloc(0) errno=%d", errno);
    errno = 0;
    CHECK(aligned_alloc(24, 16) == NULL && errno == EINVAL, "aligned_alloc(24) errno=%d", errno);
    void *m = memalign(8, 100);
    CHECK(m && ((uintptr_t)m % 16) == 0, "memalign(8) acts as malloc");
    free(m);
    m = memalign(24, 100);
    CHECK(m && ((uintptr_t)m % 32) == 0, "memalign(24) rounds the alignment up to 32");
    free(m);
    errno = 0;
    CHECK(memalign(half + 2, 16) == NULL && errno == EINVAL, "memalign huge alignment errno=%d", errno);
    errno = 0;
    CHECK(memalign((size_t)1 << 63, 1) == NULL && errno == ENOMEM, "memalign(1<<63) must be ENOMEM errno=%d", errno);
    long page = sysconf(_SC_PAGESIZE);
    void *v = valloc(10);
    CHECK(v && ((uintptr_t)v % page) == 0, "valloc page aligned");
    free(v);
    v = pvalloc(1);
    CHECK(v && ((uintptr_t)v % page) == 0 && malloc_usable_size(v) >= (size_t)page, "pvalloc(1) one page");
    free(v);
    errno = 0;
    CHECK(pvalloc(half * 2 - 10) == NULL && errno == ENOMEM, "pvalloc overflow errno=%d", errno);
}

static void test_free(void) {
    free(NULL);
    void *big = malloc(200u << 20); /* beyond the largest buddy block: a direct mapping */
    void *mid = malloc(3u << 20);
    void *small = malloc(24);
    errno = 777;
    free(big);
    free(mid);
    CHECK(free_sized != NULL && free_aligned_sized != NULL, "free_sized/free_aligned_sized not exported");
    if (free_sized) free_sized(small, 24);
    else free(small);
    CHECK(errno == 777, "free changed errno to %d", errno);
}

static void test_introspection(void) {
    void *keep[100];
    for (int i = 0; i < 100; i++) keep[i] = malloc(1000 + i * 100);
    struct mallinfo2 mi = mallinfo2();
    CHECK(mi.arena > 0 && mi.uordblks > 0, "mallinfo2 reports zeros: arena %zu uord %zu", mi.arena, mi.uordblks);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo m1 = mallinfo();
#pragma GCC diagnostic pop
    CHECK(m1.arena > 0, "mallinfo reports zeros");
    for (int i = 0; i < 100; i++) free(keep[i]);
    CHECK(mallopt(M_ARENA_MAX, 1) == 1, "mallopt");
    malloc_trim(0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(malloc_info(0, f) == 0, "malloc_info");
    fclose(f);
    CHECK(buf && strstr(buf, "<malloc") != NULL, "malloc_info wrote no XML");
    free(buf);
    const char *(*version)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "edgepool_version");
    CHECK(version != NULL && strlen(version()) > 0, "edgepool_version not found: not preloaded?");
}

/* Multi-threaded random mix with cross-thread frees: each thread fills blocks with a pattern, passes
 * half of them to the next thread through a shared ring, and checks every block before freeing. */
#define THREADS 4
#define SLOTS 4096
static void *_Atomic ring[SLOTS];
static _Atomic int mix_errors;

static unsigned long xs(unsigned long *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n && i < 64; i++) p[i] = (unsigned char)(((uintptr_t)p >> 4) + i);
}
static int verify(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n && i < 64; i++)
        if (p[i] != (unsigned char)(((uintptr_t)p >> 4) + i)) return 0;
    return 1;
}

static void *mix_thread(void *arg) {
    unsigned long s = (unsigned long)arg * 2654435761u + 1;
    for (int round = 0; round < 200000; round++) {
        /* Every block holds its size in its first 8 bytes, then a pattern derived from its address. */
        size_t n = (xs(&s) % 8 == 0) ? xs(&s) % 100000 + 8 : xs(&s) % 512 + 8;
        unsigned char *p = malloc(n);
        if (!p) { mix_errors++; continue; }
        memcpy(p, &n, sizeof n);
        if (n >= 72) fill(p + 8, n - 8);
        void *old = atomic_exchange(&ring[xs(&s) % SLOTS], p);
        if (old) {
            size_t m;
            memcpy(&m, old, sizeof m);
            if (m >= 72 && !verify((unsigned char *)old + 8, m - 8)) mix_errors++;
            if (xs(&s) % 4 == 0) {
                /* realloc keeps the header; the pattern depends on the address, so refill it. */
                unsigned char *q = realloc(old, m + 100);
                if (!q) {
                    mix_errors++;
                } else {
                    size_t m2 = m + 100, m0;
                    memcpy(&m0, q, sizeof m0);
                    if (m0 != m) mix_errors++;
                    memcpy(q, &m2, sizeof m2);
                    fill(q + 8, m2 - 8);
                    old = q;
                }
            }
            free(old);
        }
    }
    return NULL;
}

static void test_threads(void) {
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, mix_thread, (void *)(i + 1));
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < SLOTS; i++) free(atomic_exchange(&ring[i], NULL));
    CHECK(mix_errors == 0, "%d corrupted or failed blocks in the threaded mix", (int)mix_errors);
}

/* Thread churn: threads that only live long enough to allocate and exit, first op varying. */
static void *churn_thread(void *arg) {
    long k = (long)arg;
    void *p = (k % 3 == 0) ? calloc(3, 100) : (k % 3 == 1) ? malloc(5000) : aligned_alloc(256, 300);
    free(p);
    free(malloc(40));
    return NULL;
}

static void test_churn(void) {
    for (long i = 0; i < 3000; i++) {
        pthread_t t;
        pthread_create(&t, NULL, churn_thread, (void *)i);
        pthread_join(t, NULL);
    }
    CHECK(1, "churn");
}

/* fork() while other threads allocate: the child must be able to allocate. */
static _Atomic int stop_busy;
static void *busy_thread(void *arg) {
    (void)arg;
    while (!stop_busy) {
        void *p[64];
        for (int i = 0; i < 64; i++) p[i] = malloc(16 + i * 64);
        for (int i = 0; i < 64; i++) free(p[i]);
        free(malloc(1 << 20));
    }
    return NULL;
}

static void test_fork(void) {
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, busy_thread, NULL);
    int ok_children = 0;
    for (int k = 0; k < 50; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            for (int i = 0; i < 1000; i++) free(malloc(i * 13 + 1));
            void *b = malloc(5 << 20);
            free(b);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        ok_children += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    stop_busy = 1;
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK(ok_children == 50, "only %d of 50 forked children could allocate", ok_children);
}

/* dlopen of TLS-using libraries from worker threads: glibc allocates their TLS blocks and grows the
 * DTV with malloc from inside __tls_get_addr. */
static const char *tls_libs[8];
static int n_tls_libs;
static void *dlopen_thread(void *arg) {
    long i = (long)arg;
    void *h = dlopen(tls_libs[i % n_tls_libs], RTLD_NOW | RTLD_LOCAL);
    if (!h) return (void *)1;
    long (*touch)(long) = (long (*)(long))dlsym(h, "tls_touch");
    long r = touch ? touch(i) : -1;
    void *p = malloc(100);
    free(p);
    return (void *)(r == i * 3 ? 0L : 1L);
}

static void test_dlopen_tls(void) {
    if (n_tls_libs == 0) {
        CHECK(0, "no TLS libraries given (argv)");
        return;
    }
    pthread_t t[16];
    long bad = 0;
    for (long i = 0; i < 16; i++) pthread_create(&t[i], NULL, dlopen_thread, (void *)i);
    for (int i = 0; i < 16; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (long)r;
    }
    CHECK(bad == 0, "%ld threads failed to dlopen or use a TLS library: %s", bad, dlerror() ? dlerror() : "");
}

/* Frees during exit. */
static void *at_exit_block;
static void free_at_exit(void) {
    free(at_exit_block);
    free(malloc(77));
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc && n_tls_libs < 8; i++) tls_libs[n_tls_libs++] = argv[i];
    at_exit_block = malloc(12345);
    atexit(free_at_exit);
    for (int i = 0; i < 40; i++) pthread_setspecific(early_keys[i], malloc(8));
    test_malloc();
    test_calloc();
    test_realloc();
    test_aligned();
    test_free();
    test_introspection();
    test_threads();
    test_churn();
    test_fork();
    test_dlopen_tls();
    printf("contract: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
