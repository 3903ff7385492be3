/* A heap overflow past the last slot of a slab must reach no allocator state (slab headers and
 * bitmaps are out of band): 64-byte blocks are allocated until one sits at the end of its 64 KiB
 * slab with the next slab's first slot also ours; 64 bytes are written past its end (the program's
 * bug, landing in that next slot); then every block must still report its size, and everything must
 * free and allocate again. Prints "overflow ok N" with N the overflows done. Run under edgepool. */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 20000

int main(void) {
    static char *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = malloc(64);
        if (!b[i]) { printf("malloc failed\n"); return 1; }
        memset(b[i], 7, 64);
    }
    int done = 0;
    for (int i = 0; i < N; i++) {
        uintptr_t a = (uintptr_t)b[i];
        if ((a & 0xffff) != 0x10000 - 64) continue;
        for (int j = 0; j < N; j++) {
            if ((uintptr_t)b[j] == a + 64) {
                memset(b[i] + 64, 0x41, 64); /* the overflow */
                done++;
                break;
            }
        }
    }
    for (int i = 0; i < N; i++) {
        size_t u = malloc_usable_size(b[i]);
        if (u < 64 || u > 4096) { printf("block %d: usable size %zu after the overflow\n", i, u); return 1; }
    }
    for (int i = 0; i < N; i++) free(b[i]);
    for (int i = 0; i < N; i++) {
        b[i] = malloc(64);
        if (!b[i] || malloc_usable_size(b[i]) < 64) { printf("malloc after the overflow failed\n"); return 1; }
    }
    for (int i = 0; i < N; i++) free(b[i]);
    printf("overflow ok %d\n", done);
    return 0;
}
