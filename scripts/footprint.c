/* What an allocator costs a small process in resident memory (scripts/footprint.py runs it).
   Does what a small C program does -- small and large blocks, calloc, realloc growth, an aligned
   block, stdio, a thread that allocates and exits -- then sums /proc/self/smaps by what the pages
   belong to and prints one line: "footprint <allocator library> <libgcc_s> <libc+ld.so> <program
   and other libraries> <anonymous+stack> <total> <VmHWM>", in KiB. The allocator library is the
   file that LD_PRELOAD names, symbolic links resolved (0 without).

   With --code-pages (tests/preload.rs, `the_library_keeps_std_code_out_of_the_pages_a_process_runs`)
   it prints instead, after the same work, every page of libedgepool.so's mappings that is present in
   the process (/proc/self/pagemap), as its address relative to the library's load base (an ELF
   virtual address), one per line: "resident 0x..." for the executable mappings, "data 0x..." for
   the others, then "pages N" (the executable ones). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *worker(void *arg) {
    (void)arg;
    void *keep[64];
    for (int i = 0; i < 64; i++) keep[i] = malloc(16 + 40 * i);
    for (int i = 0; i < 64; i++) free(keep[i]);
    return NULL;
}

static uintptr_t edgepool_base;
static int edgepool_found;

static int find_edgepool(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    if (info->dlpi_name && strstr(info->dlpi_name, "libedgepool")) {
        edgepool_base = info->dlpi_addr;
        edgepool_found = 1;
        return 1;
    }
    return 0;
}

/* The --code-pages output. */
static int code_pages(void) {
    dl_iterate_phdr(find_edgepool, NULL);
    if (!edgepool_found) {
        fprintf(stderr, "libedgepool.so is not loaded\n");
        return 2;
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    int pm = open("/proc/self/pagemap", O_RDONLY);
    if (!maps || pm < 0) return 1;
    char line[4096];
    long pages = 0;
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi;
        char perm[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) != 3) continue;
        if (!strstr(line, "libedgepool")) continue;
        int code = perm[2] == 'x';
        for (unsigned long a = lo; a < hi; a += 4096) {
            uint64_t e = 0;
            if (pread(pm, &e, sizeof e, (off_t)(a / 4096 * 8)) != (ssize_t)sizeof e) return 1;
            if (e >> 63) {
                printf("%s 0x%lx\n", code ? "resident" : "data", (unsigned long)(a - edgepool_base));
                pages += code;
            }
        }
    }
    fclose(maps);
    close(pm);
    printf("pages %ld\n", pages);
    return 0;
}

int main(int argc, char **argv) {
    void *small[200];
    for (int i = 0; i < 200; i++) {
        small[i] = malloc(8 + (i * 37) % 3000);
        memset(small[i], i, 8);
    }
    char *grow = NULL;
    for (size_t n = 16; n < (256u << 10); n = n * 3 / 2) {
        grow = realloc(grow, n);
        grow[n - 1] = 1;
    }
    void *big = calloc(1, 1u << 20);
    void *aligned = NULL;
    if (posix_memalign(&aligned, 4096, 10000) != 0) return 1;
    FILE *null = fopen("/dev/null", "w");
    if (!null) return 1;
    fprintf(null, "%p %p %p\n", (void *)grow, big, aligned);
    fclose(null);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0 || pthread_join(t, NULL) != 0) return 1;
    for (int i = 0; i < 200; i++) free(small[i]);
    free(grow);
    free(big);
    free(aligned);
    if (argc > 1 && !strcmp(argv[1], "--code-pages")) return code_pages();

    const char *pre = getenv("LD_PRELOAD");
    static char real[4096];
    const char *lib = pre && realpath(pre, real) ? strrchr(real, '/') + 1 : NULL;
    const char *prog = strrchr(argv[0], '/');
    prog = prog ? prog + 1 : argv[0];
    long kb[5] = {0}; /* allocator, libgcc_s, libc+ld.so, program, anonymous */
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 1;
    char line[4096], name[4096] = "";
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
            char *slash = strchr(line, '/');
            snprintf(name, sizeof name, "%s", slash ? slash : "");
            name[strcspn(name, "\n")] = 0;
            continue;
        }
        long v;
        if (sscanf(line, "Rss: %ld kB", &v) != 1) continue;
        const char *base = strrchr(name, '/');
        base = base ? base + 1 : "";
        if (lib && *lib && !strcmp(base, lib)) kb[0] += v;
        else if (strstr(base, "libgcc_s")) kb[1] += v;
        else if (!strncmp(base, "libc.so", 7) || !strncmp(base, "ld-linux", 8)) kb[2] += v;
        else if (!strcmp(base, prog)) kb[3] += v;
        else if (!*base) kb[4] += v;
        else kb[3] += v;
    }
    fclose(f);
    long hwm = 0;
    FILE *s = fopen("/proc/self/status", "r");
    while (s && fgets(line, sizeof line, s))
        if (sscanf(line, "VmHWM: %ld kB", &hwm) == 1) break;
    if (s) fclose(s);
    printf("footprint %ld %ld %ld %ld %ld %ld %ld\n", kb[0], kb[1], kb[2], kb[3], kb[4],
           kb[0] + kb[1] + kb[2] + kb[3] + kb[4], hwm);
    return 0;
}
