/*
 * gpu_test.h - what the GPU test programs share.
 *
 * Each program is one cmocka group run against a WEFT_BACKEND_CUDA runtime.
 * Without a GPU it prints "SKIPPED: no GPU" and exits 77, which CTest
 * counts as skipped (SKIP_RETURN_CODE), never as passed.
 *
 * Data are random and new each run; the seed is printed first, and
 * WEFT_TEST_SEED=<n> replays it. WEFT_TEST_FILTER=<glob> runs only the
 * matching tests.
 *
 * cmocka's assertions jump back to the test's own thread, so tasks (on
 * their own stacks, on worker threads) must not use them: they check with
 * GT_CHECK / GT_OK / GT_RC, which count failures and keep the first
 * message; the test asserts gt_passed() after joining its tasks.
 *
 * Under compute-sanitizer (scripts/gpu-check sets WEFT_TEST_SANITIZER to
 * the tool's name) every launch is far slower: gt_scale() shrinks the task
 * counts, gt_deadline() stretches the waits, and tests that compare the
 * order in which things finish keep only their correctness checks.
 */
#ifndef WEFT_GPU_TEST_H
#define WEFT_GPU_TEST_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_kernels.h"
#include "weft.h"

/* A poison byte for outputs: any word still holding it was never written. */
#define GT_POISON 0xa7
#define GT_POISON32 0xa7a7a7a7u
#define GT_POISON64 0xa7a7a7a7a7a7a7a7ull

/* ---- run time and environment ------------------------------------------ */

static inline double gt_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void gt_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

/* The compute-sanitizer tool running us, or NULL. */
static inline const char *gt_sanitizer(void)
{
    const char *s = getenv("WEFT_TEST_SANITIZER");

    return s && *s ? s : NULL;
}

/* n tasks, or a tenth of them (at least 1) under a sanitizer. */
static inline unsigned gt_scale(unsigned n)
{
    if (!gt_sanitizer())
        return n;
    return n / 10 ? n / 10 : 1;
}

/* A limit in seconds for something that should take far less. */
static inline double gt_deadline(double seconds)
{
    return gt_sanitizer() ? seconds * 30 : seconds;
}

/* ---- random data ------------------------------------------------------- */

static uint64_t gt_seed_value;

static inline uint64_t gt_rng_next(uint64_t *state) /* splitmix64 */
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* A generator of its own for each stream of random numbers (a task, a
 * test), all derived from the run's seed. */
static inline uint64_t gt_rng(uint64_t stream)
{
    uint64_t s = gt_seed_value ^ (stream * 0xd1342543de82ef95u);

    gt_rng_next(&s);
    return s;
}

static inline uint32_t gt_u32(uint64_t *state)
{
    return (uint32_t)(gt_rng_next(state) >> 32);
}

/* Uniform in [lo, hi]. */
static inline size_t gt_between(uint64_t *state, size_t lo, size_t hi)
{
    return lo + (size_t)(gt_rng_next(state) % (hi - lo + 1));
}

static inline void gt_fill(uint64_t *state, void *p, size_t n)
{
    unsigned char *b = p;
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        uint64_t v = gt_rng_next(state);
        memcpy(b + i, &v, 8);
    }
    for (; i < n; i++)
        b[i] = (unsigned char)gt_rng_next(state);
}

/* A finite float or double from random bits (no NaN, no infinity). */
static inline float gt_float(uint64_t *state)
{
    return (float)((double)(int32_t)gt_u32(state) / 65536.0);
}

static inline double gt_double(uint64_t *state)
{
    return (double)(int64_t)gt_rng_next(state) / 1048576.0;
}

/* Index of the first byte of p[0..n) that is not `byte`, or n. */
static inline size_t gt_first_not(const void *p, unsigned char byte, size_t n)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < n; i++)
        if (b[i] != byte)
            return i;
    return n;
}

/* Index of the first differing byte, or n. */
static inline size_t gt_first_diff(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;

    if (memcmp(a, b, n) == 0)
        return n;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return i;
    return n;
}

static inline void *gt_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);

    assert_non_null(p);
    return p;
}

/* ---- checks that work inside tasks ------------------------------------- */

static struct {
    pthread_mutex_t mu;
    atomic_uint count;
    char first[1024];
} gt_fails = {PTHREAD_MUTEX_INITIALIZER, 0, ""};

__attribute__((format(printf, 3, 4))) static inline void gt_fail_at(const char *file, int line,
                                                                    const char *fmt, ...)
{
    va_list ap;

    if (atomic_fetch_add(&gt_fails.count, 1) != 0)
        return;
    pthread_mutex_lock(&gt_fails.mu);
    int k = snprintf(gt_fails.first, sizeof gt_fails.first, "%s:%d: ", file, line);
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < sizeof gt_fails.first)
        vsnprintf(gt_fails.first + k, sizeof gt_fails.first - (size_t)k, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&gt_fails.mu);
}

/* The two ends of GT_CHECK: calls, so that it may stand as a statement. */
static inline bool gt_true(void)
{
    return true;
}

/* gt_fail_at that returns false. The message is formatted only on failure. */
__attribute__((format(printf, 3, 4))) static inline bool gt_false_at(const char *file, int line,
                                                                     const char *fmt, ...)
{
    char msg[768];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gt_fail_at(file, line, "%s", msg);
    return false;
}

/* Reads weft_last_error() at once: it belongs to the calling task and the
 * failing call must be the last weft call before this. */
static inline bool gt_rc_at(int got, int want, const char *expr, const char *file, int line)
{
    if (got == want)
        return true;
    gt_fail_at(file, line, "%s returned %d (%s), expected %d (%s); last error: %s", expr, got,
               weft_strerror(got), want, weft_strerror(want), weft_last_error());
    return false;
}

/* Each evaluates to true when the check held. */
#define GT_CHECK(cond, ...)                                                                        \
    ((cond) ? gt_true() : gt_false_at(__FILE__, __LINE__, "check failed: " __VA_ARGS__))
#define GT_FAIL(...) gt_false_at(__FILE__, __LINE__, __VA_ARGS__) /* false */
#define GT_RC(expr, want) gt_rc_at((expr), (want), #expr, __FILE__, __LINE__)
#define GT_OK(expr) GT_RC(expr, WEFT_OK)

static inline void gt_reset(void)
{
    pthread_mutex_lock(&gt_fails.mu);
    atomic_store(&gt_fails.count, 0);
    gt_fails.first[0] = '\0';
    pthread_mutex_unlock(&gt_fails.mu);
}

/* In the test's thread: fail the test if any task-side check failed. */
#define gt_assert_passed()                                                                         \
    do {                                                                                           \
        unsigned n_ = atomic_load(&gt_fails.count);                                                \
        if (n_ != 0)                                                                               \
            fail_msg("%u check(s) failed in tasks; the first: %s", n_, gt_fails.first);            \
    } while (0)

/* In the test's thread: expr must return want; show the message if not. */
#define assert_rc(expr, want)                                                                      \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != (want))                                                                         \
            fail_msg("%s returned %d (%s), expected %d (%s); last error: %s", #expr, rc_,          \
                     weft_strerror(rc_), (int)(want), weft_strerror(want), weft_last_error());     \
    } while (0)
#define assert_ok(expr) assert_rc(expr, WEFT_OK)

/* ---- runtimes and tasks ------------------------------------------------ */

/* A CUDA runtime with `workers` workers (0: one per CPU); resets the checks. */
static inline weft_runtime *gt_runtime(unsigned workers)
{
    weft_config cfg = {.workers = workers, .backend = WEFT_BACKEND_CUDA};
    weft_runtime *rt = NULL;

    gt_reset();
    assert_ok(weft_runtime_create(&rt, &cfg));
    assert_non_null(rt);
    assert_string_equal(weft_backend_name(rt), "cuda");
    assert_true(weft_device_count(rt) >= 1);
    return rt;
}

static inline void gt_runtime_destroy(weft_runtime *rt)
{
    assert_ok(weft_runtime_destroy(rt));
    gt_assert_passed();
}

/* Run fn(arg) as one task and join it; it must end with WEFT_OK. */
static inline void gt_run(weft_runtime *rt, void *(*fn)(void *), void *arg)
{
    weft_task *t = NULL;

    assert_ok(weft_spawn(rt, &t, fn, arg, NULL));
    assert_ok(weft_join(t, NULL));
    gt_assert_passed();
}

/* Spin (sleeping) until *flag >= want or the deadline passes. */
static inline bool gt_wait_for(atomic_uint *flag, unsigned want, double seconds)
{
    double until = gt_now() + gt_deadline(seconds);

    while (atomic_load(flag) < want) {
        if (gt_now() > until)
            return false;
        gt_sleep_ms(1);
    }
    return true;
}

/* ---- main -------------------------------------------------------------- */

/* Does CUDA see a GPU? Asked in a child process, so that this one starts
 * weft with CUDA untouched: weft sets CUDA_DEVICE_MAX_CONNECTIONS, which
 * only counts if it is set before CUDA starts. */
static inline bool gt_gpu_present(void)
{
    int status;
    pid_t pid;

    fflush(NULL);
    pid = fork();
    if (pid == 0)
        _exit(gk_gpu_count() > 0 ? 0 : 1);
    if (pid < 0)
        return gk_gpu_count() > 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return gk_gpu_count() > 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Call first in main: returns 77 to exit with when there is no GPU, else 0
 * after choosing and printing the seed and setting the filter. */
static inline int gt_start(const char *program)
{
    const char *seed = getenv("WEFT_TEST_SEED");
    const char *filter = getenv("WEFT_TEST_FILTER");

    if (!gt_gpu_present()) {
        printf("SKIPPED: no GPU\n");
        fflush(stdout);
        return 77;
    }
    if (seed && *seed) {
        gt_seed_value = strtoull(seed, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        gt_seed_value = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15u ^ (uint64_t)ts.tv_sec ^
                        (uint64_t)getpid() << 32;
    }
    printf("%s: seed %llu (WEFT_TEST_SEED=%llu replays it)%s%s\n", program,
           (unsigned long long)gt_seed_value, (unsigned long long)gt_seed_value,
           gt_sanitizer() ? ", under compute-sanitizer " : "",
           gt_sanitizer() ? gt_sanitizer() : "");
    fflush(stdout);
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return 0;
}

#endif
