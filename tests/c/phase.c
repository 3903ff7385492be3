/* Load phases and the budget from C, under LD_PRELOAD=libedgepool.so (see tests/preload.rs).
 *   phase budget   : allocate 1 MiB blocks under EDGEPOOL_LIMIT until refused (NULL + ENOMEM), free
 *                    half, allocate again, exit 0.
 *   phase trigger  : run with EDGEPOOL_LOAD_PHASE=1: allocate (inside the start-up phase), send
 *                    SIGUSR2 to ourselves, allocate again (the next slow path ends the phase);
 *                    edgepool_load_end() must then report that no phase is open.
 *   phase api      : edgepool_load_begin/end around a load-like workload; prints the report.
 *   phase large    : run with EDGEPOOL_LOAD_PHASE=1: for 0.3 s allocate, touch and free large
 *                    blocks only (256 KiB-2 MiB), sending SIGUSR2 to ourselves halfway (the next
 *                    large block's allocation ends the phase); then edgepool_load_end() must report
 *                    that no phase is open. Nothing small is allocated before that check. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct edgepool_phase_report {
    uint64_t allocations, peak_bytes, survivor_bytes, released_bytes, os_bytes_before, os_bytes_after, duration_ns;
};

static void *sym(const char *name) {
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p) {
        fprintf(stderr, "%s not found: not preloaded?\n", name);
        exit(2);
    }
    return p;
}

static int budget(void) {
    void *blocks[4096];
    int n = 0;
    errno = 0;
    for (; n < 4096; n++) {
        blocks[n] = malloc(1 << 20);
        if (!blocks[n]) break;
        memset(blocks[n], 1, 1 << 20);
    }
    if (n == 4096 || errno != ENOMEM) {
        fprintf(stderr, "no clean refusal: n=%d errno=%d\n", n, errno);
        return 1;
    }
    printf("refused after %d MiB\n", n);
    for (int i = 0; i < n / 2; i++) free(blocks[i]);
    for (int i = 0; i < n / 2 - 2; i++) {
        blocks[i] = malloc(1 << 20);
        if (!blocks[i]) {
            fprintf(stderr, "could not take freed memory again (%d)\n", i);
            return 1;
        }
    }
    printf("took %d MiB again\n", n / 2 - 2);
    return 0;
}

static int trigger(void) {
    int (*end)(struct edgepool_phase_report *) = sym("edgepool_load_end");
    char **tmp = malloc(100000 * sizeof *tmp);
    for (int i = 0; i < 100000; i++) tmp[i] = malloc(40 + i % 200);
    for (int i = 0; i < 100000; i++) free(tmp[i]);
    raise(SIGUSR2);
    for (int i = 0; i < 100000; i++) tmp[i] = malloc(40 + i % 200); /* a slow path ends the phase */
    for (int i = 0; i < 100000; i++) free(tmp[i]);
    free(tmp);
    errno = 0;
    if (end(NULL) != -1 || errno != EINVAL) {
        fprintf(stderr, "the start-up phase was still open after SIGUSR2\n");
        return 1;
    }
    printf("trigger ended the phase\n");
    return 0;
}

static int api(void) {
    void (*begin)(void) = sym("edgepool_load_begin");
    int (*end)(struct edgepool_phase_report *) = sym("edgepool_load_end");
    begin();
    enum { N = 300000 };
    char **tmp = malloc(N * sizeof *tmp);
    char **keep = malloc(N / 50 * sizeof *keep);
    for (int i = 0; i < N; i++) {
        tmp[i] = malloc(24 + i % 100);
        memset(tmp[i], 1, 24);
        if (i % 50 == 0) keep[i / 50] = strdup("a survivor of the load phase");
    }
    for (int i = 0; i < N; i++) free(tmp[i]);
    free(tmp);
    struct edgepool_phase_report r;
    if (end(&r) != 0) return 1;
    printf("allocations=%llu peak=%llu survivors=%llu released=%llu before=%llu after=%llu\n",
           (unsigned long long)r.allocations, (unsigned long long)r.peak_bytes, (unsigned long long)r.survivor_bytes,
           (unsigned long long)r.released_bytes, (unsigned long long)r.os_bytes_before,
           (unsigned long long)r.os_bytes_after);
    for (int i = 0; i < N / 50; i++) {
        if (strcmp(keep[i], "a survivor of the load phase") != 0) return 1;
        free(keep[i]);
    }
    free(keep);
    return r.allocations >= N && r.released_bytes > 0 && r.survivor_bytes >= N / 50 * 29 ? 0 : 1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int large(void) {
    double t0 = now_s();
    int raised = 0;
    unsigned long n = 0;
    for (double t = 0; t < 0.3; t = now_s() - t0, n++) {
        if (!raised && t >= 0.15) {
            raise(SIGUSR2);
            raised = 1;
        }
        size_t len = (size_t)(256 << 10) << (n % 4);
        char *p = malloc(len);
        if (!p) return 1;
        for (size_t i = 0; i < len; i += 4096) p[i] = (char)n;
        free(p);
    }
    int (*end)(struct edgepool_phase_report *) = sym("edgepool_load_end");
    errno = 0;
    if (end(NULL) != -1 || errno != EINVAL) {
        fprintf(stderr, "the start-up phase was still open after SIGUSR2 and %lu large blocks\n", n);
        return 1;
    }
    printf("large blocks ended the phase (%lu blocks)\n", n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "budget")) return budget();
    if (!strcmp(argv[1], "trigger")) return trigger();
    if (!strcmp(argv[1], "api")) return api();
    if (!strcmp(argv[1], "large")) return large();
    return 2;
}
