/* EDGEPOOL_SECURE: memory errors that the hardened mode turns into faults. Run under edgepool.
 *   secure overflow    64-byte blocks until one ends its slab; writes 64 bytes past it (into the
 *                      slab's guard page under EDGEPOOL_SECURE=1, which faults)
 *   secure uaf         frees a 1 MiB block, trims (purges it), writes into it after free (sealed
 *                      memory under EDGEPOOL_SECURE=1, which faults)
 * Prints what it is about to do, then "survived" if nothing faulted. */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *volatile sink;

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "overflow")) {
        static char *b[4000];
        for (int i = 0; i < 4000; i++) {
            b[i] = malloc(64);
            sink = b[i];
        }
        for (int i = 0; i < 4000; i++) {
            if (((uintptr_t)b[i] & 0xffff) == 0x10000 - 64) {
                printf("writing past the end of a slab\n");
                fflush(stdout);
                memset(sink = b[i], 1, 128);
                break;
            }
        }
    } else if (argc == 2 && !strcmp(argv[1], "uaf")) {
        char *p = malloc(1 << 20);
        sink = p;
        memset(p, 1, 1 << 20);
        free(sink);
        malloc_trim(0);
        printf("writing after free into purged memory\n");
        fflush(stdout);
        sink[900000] = 1; /* far into the block: the first pages may be handed out again meanwhile */
        /* Handed out again, the memory is accessible. */
        char *q = malloc(1 << 20);
        sink = q;
        memset(q, 2, 1 << 20);
    } else {
        return 2;
    }
    printf("survived\n");
    return 0;
}
