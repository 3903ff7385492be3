/* grow-buffer: one buffer grown by realloc, doubling from 64 KiB to 128 MiB as 64 KiB pieces are
 * written into it (a file read into a growing array with no size known ahead). Its peak RSS shows
 * whether a block that realloc moves is held twice: copy-then-free holds the old and the new block
 * at once (64 + 128 MiB at the last step).
 *
 *     gcc -O2 -o target/grow-buffer scripts/grow-buffer.c
 *     python3 scripts/compare-allocators.py --rounds 3 -- target/grow-buffer
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    const size_t total = (size_t)128 << 20, piece = 64 << 10;
    size_t cap = piece, n = 0;
    unsigned char *b = malloc(cap);
    if (!b) return 1;
    while (n < total) {
        if (n == cap) {
            cap *= 2;
            unsigned char *q = realloc(b, cap);
            if (!q) return 1;
            b = q;
        }
        memset(b + n, (int)(n / piece) & 0xff, piece);
        n += piece;
    }
    for (size_t i = 0; i < total; i += piece)
        if (b[i] != (unsigned char)((i / piece) & 0xff) || b[i + piece - 1] != b[i]) {
            fprintf(stderr, "grow-buffer: contents lost at %zu\n", i);
            return 1;
        }
    free(b);
    puts("ok grow-buffer");
    return 0;
}
