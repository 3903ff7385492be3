/* model_load: the pattern of loading a model, then running it. Inside a load phase (edgepool's C API,
 * found with dlsym, so the same binary runs on every allocator): a burst of 250 000 parse-sized
 * temporaries (16-256 bytes) interleaved with one graph node in 80 (64-512 bytes, survivors) and 50
 * weights of 1-4 MiB, each read into a temporary buffer and copied into its final one; then most
 * temporaries are freed, optimisation scratch (four 8 MiB buffers and 20 000 small objects) comes and
 * goes, and the phase ends. Then 50 inference steps allocate and free activations (256 KiB-2 MiB) and
 * small temporaries. Weights and nodes are checked at the end. Peak RSS is the figure that matters. */
#include <dlfcn.h>
#include "suite.h"

#define WEIGHTS 50

int main(int argc, char **argv) {
    double s = suite_scale(argc, argv);
    void (*load_begin)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "edgepool_load_begin");
    int (*load_end)(void *) = (int (*)(void *))dlsym(RTLD_DEFAULT, "edgepool_load_end");
    uint64_t rng = 0x10ADULL;
    long n_temps = scaled(250000, s);
    size_t weight_max = (size_t)scaled(4 << 20, s < 1 ? s : 1);
    if (weight_max < (64 << 10)) weight_max = 64 << 10;
    void **temps = xmalloc(n_temps * sizeof(void *));
    void **nodes = xmalloc((n_temps / 80 + 1) * sizeof(void *));
    void *weights[WEIGHTS];
    long n_nodes = 0, n_weights = 0;

    if (load_begin) load_begin();
    for (long i = 0; i < n_temps; i++) {
        size_t n = rng_log_size(&rng, 16, 256);
        temps[i] = xmalloc(n);
        stamp(temps[i], n, rng_next(&rng) | 1);
        if (i % 80 == 0) {
            n = rng_range(&rng, 64, 512);
            nodes[n_nodes] = xmalloc(n);
            stamp(nodes[n_nodes++], n, rng_next(&rng) | 1);
        }
        if (n_weights < WEIGHTS && i % (n_temps / WEIGHTS + 1) == 0) {
            n = rng_range(&rng, weight_max / 4, weight_max);
            void *raw = xmalloc(n);
            stamp(raw, n, rng_next(&rng) | 1);
            memset((char *)raw + 16, 0x5A, n / 2); /* the bytes of the weight, as read */
            stamp(raw, n, ((uint64_t *)raw)[1]);
            void *w = xmalloc(n);
            memcpy(w, raw, n);
            check_free(raw);
            weights[n_weights++] = w;
        }
    }
    /* Parsing done: most temporaries go; one in 20 stays (names, attributes). */
    for (long i = 0; i < n_temps; i++) {
        if (i % 20) {
            check_free(temps[i]);
            temps[i] = NULL;
        }
    }
    /* Optimisation scratch. */
    void *scratch[4];
    for (int k = 0; k < 4; k++) {
        size_t n = (size_t)scaled(8 << 20, s < 1 ? s : 1) + 64;
        scratch[k] = xmalloc(n);
        stamp(scratch[k], n, rng_next(&rng) | 1);
    }
    long n_small = scaled(20000, s);
    void **small = xmalloc(n_small * sizeof(void *));
    for (long i = 0; i < n_small; i++) {
        size_t n = rng_log_size(&rng, 16, 512);
        small[i] = xmalloc(n);
        stamp(small[i], n, rng_next(&rng) | 1);
    }
    for (long i = 0; i < n_small; i++) check_free(small[i]);
    for (int k = 0; k < 4; k++) check_free(scratch[k]);
    free(small);
    if (load_end) load_end(NULL);

    /* Run: inference steps. */
    for (int step = 0; step < 50; step++) {
        void *act[6], *tmp[200];
        for (int k = 0; k < 6; k++) {
            size_t n = rng_log_size(&rng, 256 << 10, (size_t)scaled(2 << 20, s < 1 ? s : 1) + (256 << 10));
            act[k] = xmalloc(n);
            stamp(act[k], n, rng_next(&rng) | 1);
        }
        for (int k = 0; k < 200; k++) {
            size_t n = rng_log_size(&rng, 16, 1024);
            tmp[k] = xmalloc(n);
            stamp(tmp[k], n, rng_next(&rng) | 1);
        }
        for (int k = 0; k < 200; k++) check_free(tmp[k]);
        for (int k = 0; k < 6; k++) check_free(act[k]);
    }
    for (long i = 0; i < n_weights; i++) check_free(weights[i]);
    for (long i = 0; i < n_nodes; i++) check_free(nodes[i]);
    for (long i = 0; i < n_temps; i++)
        if (temps[i]) check_free(temps[i]);
    free(temps);
    free(nodes);
    puts("ok model_load");
    return 0;
}
