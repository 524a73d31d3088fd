/* The pool's regions with serial work between them: how often the caller finds its worker
 * asleep (and wakes it), and the wall time per region against its work.
 *
 *     cc -O2 -pthread -o /tmp/pool_gaps bench/pool_gaps.c && /tmp/pool_gaps 20 100 200
 *
 * Each argument is a gap in microseconds: the caller works that long (a serial node), then
 * runs a region of two tasks of 50 us each on two threads, 2,000 times. Includes the runtime
 * (codegen/runtime.c, or -DRUNTIME='"other/runtime.c"' to compare another) to read its
 * sleeper count. On a loaded machine the worker often shares the caller's core: a worker that
 * polls without giving the core up then holds back the caller it waits for. */
#ifndef RUNTIME
#define RUNTIME "../codegen/runtime.c"
#endif
#include RUNTIME
#include <stdio.h>
#include <time.h>

static int64_t wall_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void work(int64_t ns) {
    for (int64_t start = wall_ns(); wall_ns() - start < ns;) continue;
}

static int32_t task(void *ctx, int64_t index, int64_t worker) {
    (void)ctx, (void)index, (void)worker;
    work(50000);
    return 0;
}

int main(int argc, char **argv) {
    enum { REGIONS = 2000 };
    tlc_rt_parallel(task, NULL, 2, 2); /* start the worker */
    for (int a = 1; a < argc; a++) {
        int64_t gap = atol(argv[a]) * 1000, woken = 0, start = wall_ns();
        for (int r = 0; r < REGIONS; r++) {
            work(gap);
            woken += __atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0;
            tlc_rt_parallel(task, NULL, 2, 2);
        }
        printf("gap %ld us: worker woken for %ld of %d regions, %.1f us per region (work: "
               "%.1f)\n", (long)(gap / 1000), (long)woken, REGIONS,
               (double)(wall_ns() - start) / 1e3 / REGIONS, (double)(gap + 50000) / 1e3);
    }
    return 0;
}
