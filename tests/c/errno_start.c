/* The first malloc of a process whose address space is limited (run with `ulimit -v`): edgepool's
 * start-up halves its reservation until the OS grants it, and the refused attempts must not leave
 * errno set after a malloc that succeeded. Prints "malloc ok errno=0". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    errno = 0;
    void *p = malloc(16);
    int e = errno;
    printf("malloc %s errno=%d\n", p ? "ok" : "NULL", e);
    free(p);
    return 0;
}
