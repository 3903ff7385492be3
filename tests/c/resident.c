/* Which pages of libedgepool.so's code a process has resident (tests/preload.rs,
   `the_library_keeps_std_code_out_of_the_pages_a_process_runs`).

   Does what a small C program does -- small and large blocks, calloc, realloc growth, aligned
   blocks, stdio, a second thread that allocates and exits -- then prints, for every page of the
   library's executable mappings that is present in this process (/proc/self/pagemap), its
   address relative to the library's load base (so, an ELF virtual address), one per line:
   "resident 0x...". Ends with "pages N". */
#define _GNU_SOURCE
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uintptr_t base;
static int found;

static int find(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    if (info->dlpi_name && strstr(info->dlpi_name, "libedgepool")) {
        base = info->dlpi_addr;
        found = 1;
        return 1;
    }
    return 0;
}

static void *worker(void *arg) {
    (void)arg;
    void *keep[64];
    for (int i = 0; i < 64; i++) keep[i] = malloc(16 + 40 * i);
    for (int i = 0; i < 64; i++) free(keep[i]);
    return NULL;
}

int main(void) {
    void *small[200];
    for (int i = 0; i < 200; i++) {
        small[i] = malloc(8 + (i * 37) % 3000);
        memset(small[i], i, 8);
    }
    char *grow = NULL;
    for (size_t n = 16; n < (1u << 20); n = n * 3 / 2) {
        grow = realloc(grow, n);
        grow[n - 1] = 1;
    }
    void *big = calloc(1, 3u << 20);
    void *al = NULL;
    if (posix_memalign(&al, 4096, 10000) != 0) return 1;
    FILE *f = fopen("/dev/null", "w");
    if (!f) return 1;
    fprintf(f, "%p %p %p\n", (void *)grow, big, al);
    fclose(f);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0 || pthread_join(t, NULL) != 0) return 1;
    for (int i = 0; i < 200; i++) free(small[i]);
    free(grow);
    free(big);
    free(al);

    dl_iterate_phdr(find, NULL);
    if (!found) {
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
        if (!strstr(line, "libedgepool") || perm[2] != 'x') continue;
        for (unsigned long a = lo; a < hi; a += 4096) {
            uint64_t e = 0;
            if (pread(pm, &e, sizeof e, (off_t)(a / 4096 * 8)) != (ssize_t)sizeof e) return 1;
            if (e >> 63) {
                printf("resident 0x%lx\n", (unsigned long)(a - base));
                pages++;
            }
        }
    }
    printf("pages %ld\n", pages);
    return 0;
}
