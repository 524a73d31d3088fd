/* The runtime of tlc-compiled code: a thread pool, the thread-count setting and a cache of
 * workspace arenas. Compiled into every library tlc-compile writes (its internal functions
 * hidden, so two libraries in one process each keep their own pool), and built once as a
 * helper shared object for the JIT (TLC_RT_EXPORT: every function visible).
 * docs/threads-memory.md describes how generated code uses it.
 *
 * State, all of it here, each piece behind its own mutex (the pool's region word is atomic):
 *   - the thread count new calls use (tlc_set_num_threads; default: the CPUs this process may
 *     run on);
 *   - the pool: worker threads created on the first parallel region that needs them, and the
 *     one region they run at a time (a region started while another runs, e.g. by a second
 *     calling thread, runs on its caller alone: same results, no waiting); workers join a
 *     region only while it is open, so a caller never waits for one that has not woken;
 *   - the arena cache: workspace blocks returned by finished calls, handed to the next call
 *     that fits, so a graph's workspace is allocated (and page-faulted) once, not per call.
 *     Concurrent calls take different blocks, so the cache holds at most as many as calls ever
 *     ran at once.
 * Results never depend on the thread count: a region's tasks are fixed by the compiled code,
 * each writes its own part of the output, and a worker only chooses which task it runs. */

#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef TLC_RT_EXPORT
#define RT __attribute__((visibility("default")))
#else
#define RT __attribute__((visibility("hidden")))
#endif

typedef int32_t (*tlc_task)(void *ctx, int64_t index, int64_t worker);
/* A split node's parts [first, end) in one call (tlc_rt_parallel_parts). */
typedef int32_t (*tlc_parts_task)(void *ctx, int64_t first, int64_t end, int64_t worker);

/* -- the thread count ------------------------------------------------------------------------ */

static pthread_mutex_t setting_lock = PTHREAD_MUTEX_INITIALIZER;
static int32_t setting; /* 0: not chosen yet */

static int32_t available_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int32_t)n : 1;
}

/* Threads a call uses: n >= 1 sets the count, n <= 0 restores the default (every CPU this
 * process may run on). Returns the count now in force. */
int tlc_set_num_threads(int n) {
    pthread_mutex_lock(&setting_lock);
    int32_t now = n >= 1 ? n : available_cpus();
    __atomic_store_n(&setting, now, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&setting_lock);
    return now;
}

/* Read on every call of an entry point: a plain atomic load once the count is known. */
int tlc_get_num_threads(void) {
    int32_t now = __atomic_load_n(&setting, __ATOMIC_RELAXED);
    if (now > 0) return now;
    pthread_mutex_lock(&setting_lock);
    if (setting == 0) __atomic_store_n(&setting, available_cpus(), __ATOMIC_RELAXED);
    now = setting;
    pthread_mutex_unlock(&setting_lock);
    return now;
}

RT int32_t tlc_rt_threads(void) { return tlc_get_num_threads(); }

/* -- the pool -------------------------------------------------------------------------------- */

/* A region's workers join it while it is open and only then: the caller runs tasks from the
 * first moment, closes the region once every task is taken, and waits for the workers that
 * joined (running a task), never for one that has not woken up yet. A worker that wakes late
 * (asleep, or its core held by another process) finds the region closed and leaves it alone:
 * a region waits only for tasks already running, and at worst costs its tasks on the calling
 * thread. (Before, the caller waited for every helper to wake and check in, on a loaded
 * machine often a scheduler time slice: hundreds of microseconds for a region of 20.)
 *
 * `state` packs the region's generation, whether it is open, and the workers inside it:
 * generation * GENERATION + (open ? OPEN : 0) + joined. A worker joins by one compare-and-swap
 * on the whole word, which succeeds only while the region it saw is open, so what it reads of
 * the region (task, context, count) is that region's. */
#define GENERATION ((uint64_t)1 << 32)
#define OPEN ((uint64_t)1 << 31)
#define JOINED (OPEN - 1)

static pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER; /* one region at a time */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;   /* sleeping and waking */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;          /* a region opened, or stop */
static pthread_cond_t idle = PTHREAD_COND_INITIALIZER;          /* the last joined worker left */
static pthread_t *workers;
static int64_t n_workers;
static uint64_t state;   /* atomic, see above */
static int64_t sleepers; /* workers asleep on `wake` (atomic) */
static int stopping;     /* atomic */
/* The region running: task(ctx, i, worker) for i < count, by the caller (worker 0) and the
 * workers 1 .. job_helpers that join it; or, when job_parts is set, job_parts(ctx, first,
 * end, worker) over ranges of the count parts (run_parts). */
static tlc_task job_task;
static tlc_parts_task job_parts;
static void *job_ctx;
static int64_t job_count;
static int64_t job_helpers;
static int64_t job_next;   /* next task index (atomic) */
static int64_t job_failed; /* lowest failing task (or part) index, or job_count */
static int32_t job_status; /* its status */
/* A parts region's ranges, one per thread (job_helpers + 1 of them, grown with the pool):
 * each word packs the parts [lo, hi) not yet taken as lo + hi * RANGE_END (atomic). */
#define RANGE_END ((uint64_t)1 << 32)
static uint64_t *ranges;

static void record_failure(int64_t index, int32_t status) {
    pthread_mutex_lock(&pool_lock);
    if (index < job_failed) {
        job_failed = index;
        job_status = status;
    }
    pthread_mutex_unlock(&pool_lock);
}

/* Take parts from range `slot`: its owner takes the first half of what is left (rounded
 * up), another thread the last half (rounded up): a thread whose range is done helps the
 * others from their ends, whatever they are still running. Returns the count taken (0: the
 * range is empty) and its first part in *first. */
static int64_t take_parts(int64_t slot, int owner, int64_t *first) {
    uint64_t w = __atomic_load_n(&ranges[slot], __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t lo = (int64_t)(w % RANGE_END), hi = (int64_t)(w / RANGE_END);
        if (lo >= hi) return 0;
        int64_t n = (hi - lo + 1) / 2;
        uint64_t left = owner ? (uint64_t)(lo + n) + (uint64_t)hi * RANGE_END
                              : (uint64_t)lo + (uint64_t)(hi - n) * RANGE_END;
        if (__atomic_compare_exchange_n(&ranges[slot], &w, left, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            *first = owner ? lo : hi - n;
            return n;
        }
    }
}

/* A parts region on `worker`: its own range first, then the ends of the others' (the range
 * with the most parts left), until no part is left. */
static void run_parts(int64_t worker) {
    int64_t slots = job_helpers + 1;
    for (;;) {
        int64_t first, n = take_parts(worker, 1, &first);
        while (n == 0) {
            int64_t victim = -1, most = 0;
            for (int64_t slot = 0; slot < slots; slot++) {
                uint64_t w = __atomic_load_n(&ranges[slot], __ATOMIC_ACQUIRE);
                int64_t left = (int64_t)(w / RANGE_END) - (int64_t)(w % RANGE_END);
                if (left > most) victim = slot, most = left;
            }
            if (victim < 0) return;
            n = take_parts(victim, 0, &first);
        }
        int32_t status = job_parts(job_ctx, first, first + n, worker);
        if (status != 0) record_failure(first, status);
    }
}

static void run_tasks(int64_t worker) {
    if (job_parts != NULL) {
        run_parts(worker);
        return;
    }
    for (;;) {
        int64_t i = __atomic_fetch_add(&job_next, 1, __ATOMIC_RELAXED);
        if (i >= job_count) return;
        int32_t status = job_task(job_ctx, i, worker);
        if (status != 0) record_failure(i, status);
    }
}

/* How long a worker (or the caller, waiting for the workers) polls before it sleeps on a
 * condition variable, in ns of the monotonic clock (read every 64 polls): the regions of one
 * call follow each other within tens of microseconds (a serial node between them), and a
 * wake-up costs more than that (in a VM, tens of microseconds: the host wakes the idle
 * vCPU), which a region whose threads start on equal ranges pays in full. A time, not a
 * count of pauses: a pause takes 24 ns on a Zen 4 VM and about 140 cycles on Skylake. */
#define SPIN_NS 500000

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Whether a poll that started at `since` may go on at its `i`-th iteration. After
 * YIELD_NS the poller also yields its core at each clock read: on a loaded machine the
 * thread it waits for may be queued behind it on the same core. */
#define YIELD_NS 50000
static int polling(int64_t since, int64_t i) {
    if ((i & 63) != 63) return 1;
    int64_t spent = now_ns() - since;
    if (spent >= YIELD_NS) sched_yield();
    return spent < SPIN_NS;
}

static void pause_briefly(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t generation_of(uint64_t s) { return s / GENERATION; }

/* Wait (spin, then sleep) until a region newer than `seen` opens or the pool stops; returns
 * the state then read. */
static uint64_t next_region(uint64_t seen) {
    uint64_t s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    int64_t since = now_ns();
    for (int64_t i = 0; generation_of(s) == seen && polling(since, i); i++) {
        if (__atomic_load_n(&stopping, __ATOMIC_RELAXED)) return s;
        pause_briefly();
        s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    }
    if (generation_of(s) != seen) return s;
    pthread_mutex_lock(&pool_lock);
    __atomic_add_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
    while (generation_of(s = __atomic_load_n(&state, __ATOMIC_SEQ_CST)) == seen &&
           !__atomic_load_n(&stopping, __ATOMIC_RELAXED))
        pthread_cond_wait(&wake, &pool_lock);
    __atomic_sub_fetch(&sleepers, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&pool_lock);
    return s;
}

static void *worker_main(void *arg) {
    int64_t id = (int64_t)(intptr_t)arg;
    uint64_t seen = 0; /* generation 0 is never a region: the first one is 1 */
    while (!__atomic_load_n(&stopping, __ATOMIC_RELAXED)) {
        uint64_t s = next_region(seen);
        seen = generation_of(s);
        /* Join while the region seen is open and wants this worker. */
        while ((s & OPEN) && id <= __atomic_load_n(&job_helpers, __ATOMIC_RELAXED)) {
            if (__atomic_compare_exchange_n(&state, &s, s + 1, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                run_tasks(id);
                uint64_t left = __atomic_sub_fetch(&state, 1, __ATOMIC_ACQ_REL);
                if ((left & (OPEN | JOINED)) == 0) { /* closed, and the last one out */
                    pthread_mutex_lock(&pool_lock);
                    pthread_cond_signal(&idle);
                    pthread_mutex_unlock(&pool_lock);
                }
                break;
            }
            if (generation_of(s) != seen) break; /* a newer region: the loop above sees it */
        }
    }
    return NULL;
}

/* Grow the pool to `wanted` workers (region_lock held); returns how many there are. */
static int64_t grow_pool(int64_t wanted) {
    if (wanted <= n_workers) return n_workers;
    uint64_t *more = realloc(ranges, (size_t)(wanted + 1) * sizeof *more);
    if (more == NULL) return n_workers;
    ranges = more;
    pthread_t *grown = realloc(workers, (size_t)wanted * sizeof *grown);
    if (grown == NULL) return n_workers;
    workers = grown;
    while (n_workers < wanted) {
        if (pthread_create(&workers[n_workers], NULL, worker_main,
                           (void *)(intptr_t)(n_workers + 1)) != 0)
            break;
        n_workers++;
    }
    return n_workers;
}

static int32_t run_serially(tlc_task task, void *ctx, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        int32_t status = task(ctx, i, 0);
        if (status != 0) {
            /* The lowest failing index, as in a parallel run: run the rest, report this one. */
            for (int64_t j = i + 1; j < count; j++) task(ctx, j, 0);
            return status;
        }
    }
    return 0;
}

/* Run the region of `task` (or, when `parts` is set, of `parts` over ranges of `count`
 * parts) on the caller and `helpers` workers; region_lock is held, and released here. */
static int32_t run_region(tlc_task task, tlc_parts_task parts, void *ctx, int64_t count,
                          int64_t helpers) {
    job_task = task;
    job_parts = parts;
    job_ctx = ctx;
    job_count = count;
    job_failed = count;
    job_status = 0;
    __atomic_store_n(&job_helpers, helpers, __ATOMIC_RELAXED);
    __atomic_store_n(&job_next, 0, __ATOMIC_RELAXED);
    if (parts != NULL) /* thread t's range: the parts [t count / n, (t + 1) count / n) */
        for (int64_t t = 0; t <= helpers; t++)
            __atomic_store_n(&ranges[t],
                             (uint64_t)(t * count / (helpers + 1)) +
                                 (uint64_t)((t + 1) * count / (helpers + 1)) * RANGE_END,
                             __ATOMIC_RELAXED);
    /* Open it (no worker is inside: the last region waited for its own). */
    uint64_t opened =
        (generation_of(__atomic_load_n(&state, __ATOMIC_RELAXED)) + 1) * GENERATION + OPEN;
    __atomic_store_n(&state, opened, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&pool_lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&pool_lock);
    }
    run_tasks(0);
    /* Every task is taken: close, then wait for the workers still running one. */
    uint64_t s = __atomic_and_fetch(&state, ~OPEN, __ATOMIC_ACQ_REL);
    int64_t since = now_ns();
    for (int64_t i = 0; (s & JOINED) != 0 && polling(since, i); i++) {
        pause_briefly();
        s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    }
    if ((s & JOINED) != 0) {
        pthread_mutex_lock(&pool_lock);
        while ((__atomic_load_n(&state, __ATOMIC_ACQUIRE) & JOINED) != 0)
            pthread_cond_wait(&idle, &pool_lock);
        pthread_mutex_unlock(&pool_lock);
    }
    int32_t status = job_status;
    pthread_mutex_unlock(&region_lock);
    return status;
}

/* Run task(ctx, i, worker) for every i < count on at most `threads` threads (worker ids
 * 0 .. threads-1, the caller being 0); returns the status of the lowest failing index, or 0. */
RT int32_t tlc_rt_parallel(tlc_task task, void *ctx, int64_t count, int32_t threads) {
    int64_t helpers = (threads < count ? threads : count) - 1;
    if (helpers <= 0 || pthread_mutex_trylock(&region_lock) != 0)
        return run_serially(task, ctx, count);
    helpers = grow_pool(helpers) < helpers ? n_workers : helpers;
    return run_region(task, NULL, ctx, count, helpers);
}

/* Run task(ctx, first, end, worker) over ranges that cover the parts 0 .. parts-1 once each,
 * on at most `threads` threads: each thread starts on its equal share of consecutive parts,
 * taking half of what is left of it at a time, and a thread done with its own takes the last
 * half of what is left of another's (run_parts), so a thread that wakes late or loses its
 * core mid-region holds back at most the range it is running. Which thread runs which range
 * never changes a result (a call over any range computes each part's bytes as one call
 * over every part does). One thread (or a region already running): one call over every part.
 * Returns the status of the failing range that starts lowest, or 0. */
RT int32_t tlc_rt_parallel_parts(tlc_parts_task task, void *ctx, int64_t parts, int32_t threads) {
    int64_t helpers = (threads < parts ? threads : parts) - 1;
    if (helpers <= 0 || parts >= (int64_t)(RANGE_END / 2) ||
        pthread_mutex_trylock(&region_lock) != 0)
        return task(ctx, 0, parts, 0);
    helpers = grow_pool(helpers) < helpers ? n_workers : helpers;
    if (helpers == 0) { /* no worker could be started */
        pthread_mutex_unlock(&region_lock);
        return task(ctx, 0, parts, 0);
    }
    return run_region(NULL, task, ctx, parts, helpers);
}

/* -- the arena cache ------------------------------------------------------------------------- */

#define ARENA_ALIGN 64

typedef struct block {
    struct block *next;
    int64_t bytes; /* usable bytes after the header */
} block;

static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static block *free_blocks;

/* A workspace of at least `bytes` bytes, 64-byte aligned: a cached block that fits, else a
 * new one (a cached block too small to serve is freed first, so the cache does not grow with
 * every larger graph). NULL when memory is exhausted. */
RT void *tlc_rt_acquire(int64_t bytes) {
    pthread_mutex_lock(&arena_lock);
    block **best = NULL, **smallest = NULL;
    for (block **p = &free_blocks; *p != NULL; p = &(*p)->next) {
        if ((*p)->bytes >= bytes && (best == NULL || (*p)->bytes < (*best)->bytes)) best = p;
        if (smallest == NULL || (*p)->bytes < (*smallest)->bytes) smallest = p;
    }
    block *found = NULL, *drop = NULL;
    if (best != NULL) {
        found = *best;
        *best = found->next;
    } else if (smallest != NULL) {
        drop = *smallest;
        *smallest = drop->next;
    }
    pthread_mutex_unlock(&arena_lock);
    free(drop);
    if (found == NULL) {
        void *raw = NULL;
        if (bytes < 0 || posix_memalign(&raw, ARENA_ALIGN, ARENA_ALIGN + (size_t)bytes) != 0)
            return NULL;
        found = raw;
        found->bytes = bytes;
    }
    return (char *)found + ARENA_ALIGN;
}

/* Give a workspace from tlc_rt_acquire back to the cache. */
RT void tlc_rt_release(void *memory) {
    block *b = (block *)((char *)memory - ARENA_ALIGN);
    pthread_mutex_lock(&arena_lock);
    b->next = free_blocks;
    free_blocks = b;
    pthread_mutex_unlock(&arena_lock);
}

/* -- process events -------------------------------------------------------------------------- */

/* A forked child has none of the parent's worker threads: start from an empty pool (the locks
 * are re-initialised, since another thread of the parent may have held one at the fork). */
static void after_fork_in_child(void) {
    pthread_mutex_init(&region_lock, NULL);
    pthread_mutex_init(&pool_lock, NULL);
    pthread_mutex_init(&arena_lock, NULL);
    pthread_mutex_init(&setting_lock, NULL);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&idle, NULL);
    free(workers);
    workers = NULL;
    n_workers = 0;
    /* No worker of the child is inside a region or asleep. */
    state = generation_of(state) * GENERATION;
    sleepers = 0;
}

__attribute__((constructor)) static void loaded(void) {
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* Unloading (dlclose, exit) stops the workers before their code goes away and frees the
 * cached arenas. */
__attribute__((destructor)) static void unloaded(void) {
    pthread_mutex_lock(&pool_lock);
    __atomic_store_n(&stopping, 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&pool_lock);
    for (int64_t i = 0; i < n_workers; i++) pthread_join(workers[i], NULL);
    free(workers);
    workers = NULL;
    n_workers = 0;
    free(ranges);
    ranges = NULL;
    for (block *b = free_blocks, *next; b != NULL; b = next) {
        next = b->next;
        free(b);
    }
    free_blocks = NULL;
}
