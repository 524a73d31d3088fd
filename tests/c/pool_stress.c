/* A stress test of the thread pool in codegen/runtime.c (tests/test_codegen_runtime.py
 * builds it with the runtime and runs it): every task of every region runs exactly once, on a
 * worker id below the region's thread count; a region returns the status of its lowest failing task
 * after running all of them; a parts region (tlc_rt_parallel_parts) covers every part exactly
 * once with ranges taken by any thread, and returns the status of the failing range that
 * starts lowest; regions started by several calling threads at once (each runs on its caller
 * alone while another region runs) are as correct. Prints "ok" and exits 0, or says what
 * failed and exits 1. */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int32_t (*tlc_task)(void *ctx, int64_t index, int64_t worker);
typedef int32_t (*tlc_parts_task)(void *ctx, int64_t first, int64_t end, int64_t worker);
int32_t tlc_rt_parallel(tlc_task task, void *ctx, int64_t count, int32_t threads);
int32_t tlc_rt_parallel_parts(tlc_parts_task task, void *ctx, int64_t parts, int32_t threads);

#define MOST_TASKS 64

typedef struct {
    int32_t hits[MOST_TASKS];
    int64_t threads;
    int64_t failing_every; /* task i fails (status 100 + i) when i % failing_every == 1 */
    int32_t bad_worker;
    volatile int32_t spin;
} region;

static int32_t task(void *ctx, int64_t index, int64_t worker) {
    region *r = ctx;
    __atomic_add_fetch(&r->hits[index], 1, __ATOMIC_RELAXED);
    if (worker < 0 || worker >= r->threads) __atomic_store_n(&r->bad_worker, 1, __ATOMIC_RELAXED);
    for (int32_t i = 0; i < r->spin; i++) __asm__ volatile("" ::: "memory");
    if (r->failing_every > 1 && index % r->failing_every == 1) return (int32_t)(100 + index);
    return 0;
}

/* Parts [first, end), each spinning its own while (so ranges finish unevenly and threads
 * take from each other's); fails (status 100 + its lowest failing part) when a part p has
 * p % failing_every == 1. */
static int32_t parts_task(void *ctx, int64_t first, int64_t end, int64_t worker) {
    region *r = ctx;
    int32_t status = 0;
    if (worker < 0 || worker >= r->threads || first < 0 || first >= end)
        __atomic_store_n(&r->bad_worker, 1, __ATOMIC_RELAXED);
    for (int64_t part = first; part < end; part++) {
        __atomic_add_fetch(&r->hits[part], 1, __ATOMIC_RELAXED);
        for (int32_t i = 0; i < r->spin * (int32_t)(part % 3); i++) __asm__ volatile("" ::: "memory");
        if (status == 0 && r->failing_every > 1 && part % r->failing_every == 1)
            status = (int32_t)(100 + part);
    }
    return status;
}

/* Regions of every count and thread count; returns a description of the first failure. */
static const char *regions(int rounds, unsigned seed) {
    static const int64_t counts[] = {1, 2, 3, 7, 8, 64};
    region r;
    for (int round = 0; round < rounds; round++) {
        for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
            for (int32_t threads = 1; threads <= 4; threads++) {
                int64_t count = counts[c];
                memset(&r, 0, sizeof r);
                r.threads = threads;
                r.failing_every = (int64_t)(rand_r(&seed) % 4);
                r.spin = (int32_t)(rand_r(&seed) % 2000);
                int32_t status = tlc_rt_parallel(task, &r, count, threads);
                for (int64_t i = 0; i < count; i++)
                    if (r.hits[i] != 1) return "a task did not run exactly once";
                if (r.bad_worker) return "a worker id outside 0 .. threads-1";
                int32_t expected = r.failing_every > 1 && count > 1 ? 101 : 0;
                if (status != expected) return "the status is not the lowest failing task's";
                memset(r.hits, 0, sizeof r.hits);
                status = tlc_rt_parallel_parts(parts_task, &r, count, threads);
                for (int64_t i = 0; i < count; i++)
                    if (r.hits[i] != 1) return "a part was not computed exactly once";
                if (r.bad_worker) return "a worker id outside 0 .. threads-1, or an empty range";
                if (status != expected) return "the status is not the lowest failing range's";
            }
        }
    }
    return NULL;
}

static void *caller(void *arg) {
    return (void *)regions(200, (unsigned)(intptr_t)arg);
}

int main(void) {
    const char *failed = regions(500, 1);
    if (failed == NULL) {
        pthread_t callers[4];
        for (intptr_t i = 0; i < 4; i++) pthread_create(&callers[i], NULL, caller, (void *)(i + 2));
        for (int i = 0; i < 4; i++) {
            void *result;
            pthread_join(callers[i], &result);
            if (result != NULL) failed = result;
        }
    }
    if (failed != NULL) {
        printf("%s\n", failed);
        return 1;
    }
    printf("ok\n");
    return 0;
}
