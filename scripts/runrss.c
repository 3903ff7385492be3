/* runrss COMMAND ARGS...: runs COMMAND with posix_spawnp, waits for it and prints
 * "<exit status> <wall seconds> <peak RSS in bytes>" on stderr's last line. The peak is the child's
 * ru_maxrss from wait4 (the child and the descendants it waited for). Measuring from this small
 * program, rather than from a Python parent, keeps the parent's own pages out of a forked child's
 * peak. Used by scripts/compare-allocators.py and scripts/bench-all. */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: runrss COMMAND ARGS...\n");
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid;
    int err = posix_spawnp(&pid, argv[1], NULL, NULL, argv + 1, environ);
    if (err) {
        fprintf(stderr, "runrss: cannot run %s\n", argv[1]);
        return 127;
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("runrss: wait4");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    fprintf(stderr, "\nrunrss %d %.6f %ld\n", code, wall, ru.ru_maxrss * 1024L);
    return 0;
}
