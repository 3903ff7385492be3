/* A library with a lot of thread-local storage, dlopen'ed by contract.c from worker threads. */
static __thread char big[64 * 1024];
static __thread long counter;
long tls_touch(long i) {
    big[i % sizeof big] = (char)i;
    counter += i * 3;
    return counter + big[i % sizeof big] - (char)i;
}
