/*
 * test_host_backend.c - the host device backend.
 *
 * Two halves. The first drives the backend directly (device/device.h) from
 * plain threads, where a sync blocks the thread: order on one stream,
 * streams in parallel, what a sync waits for, the stream pool, bad
 * arguments, draining at destroy, an idle device. The second goes through
 * the public API from tasks (weft_memcpy_async, weft_memset_async,
 * weft_host_async, weft_await on a WEFT_BACKEND_HOST runtime), up to
 * 100,000 tasks suspended in weft_await at the same moment.
 *
 * Everything is checked exactly: byte-exact buffers against a reference
 * that applies the same random program at once, logs of call order, counts.
 * Nothing depends on timing, except that a wait that would hang on a bug
 * gives up after GATE_DEADLINE_S and fails the test instead.
 *
 * Results written by operations are read with plain loads after a sync or
 * await, so under TSan these tests also check that completion carries a
 * happens-before edge from the executor to the waiter.
 *
 * WEFT_TEST_FILTER=<glob> runs only the matching tests.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/device.h"
#include "weft.h"

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

enum { GATE_DEADLINE_S = 60 };

/* Tasks alive at once in the task tests. TSan keeps about 1 MB of state per
 * live fiber and allows 8128 of them, so it gets fewer. */
#ifdef UNDER_TSAN
enum { JOBS = 1000, SUSPENDED = 1000 };
#else
enum { JOBS = 4000, SUSPENDED = 100000 };
#endif

/* ---- helpers ---------------------------------------------------------- */

static uint64_t rng_next(uint64_t *state) /* splitmix64 */
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static size_t rng_below(uint64_t *state, size_t n)
{
    return (size_t)(rng_next(state) % n);
}

static void rng_fill(uint64_t *state, void *p, size_t n)
{
    unsigned char *b = p;

    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)rng_next(state);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);

    assert_non_null(p);
    return p;
}

static struct timespec deadline_in(int seconds)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += seconds;
    return ts;
}

static double now_s(clockid_t clock)
{
    struct timespec ts;

    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

/* A one-shot gate a host function can wait at. Waits give up after
 * GATE_DEADLINE_S and record it, so a bug fails the test instead of hanging. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
    bool timed_out;
} gate;

static void gate_init(gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = false;
    g->timed_out = false;
}

static void gate_fini(gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_wait(gate *g)
{
    struct timespec until = deadline_in(GATE_DEADLINE_S);

    pthread_mutex_lock(&g->mu);
    while (!g->open && !g->timed_out)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT)
            g->timed_out = true;
    pthread_mutex_unlock(&g->mu);
}

static bool gate_is_open(gate *g)
{
    bool open;

    pthread_mutex_lock(&g->mu);
    open = g->open;
    pthread_mutex_unlock(&g->mu);
    return open;
}

static bool gate_timed_out(gate *g)
{
    bool t;

    pthread_mutex_lock(&g->mu);
    t = g->timed_out;
    pthread_mutex_unlock(&g->mu);
    return t;
}

static void gate_wait_fn(void *arg)
{
    gate_wait(arg);
}

static void set_flag_fn(void *arg)
{
    *(int *)arg = 1;
}

static weft__device *device_new(unsigned threads)
{
    weft__device *dev = NULL;

    assert_int_equal(weft__host_device_create(&dev, threads), WEFT_OK);
    assert_non_null(dev);
    assert_string_equal(dev->ops->name, "host");
    return dev;
}

static weft__stream *lease(weft__device *dev)
{
    weft__stream *s = NULL;

    assert_int_equal(dev->ops->stream_lease(dev, WEFT_PRIO_NORMAL, &s), WEFT_OK);
    assert_non_null(s);
    return s;
}

/* ---- random programs --------------------------------------------------- */
/*
 * A program is a random sequence of copies, fills and host "kernels" over a
 * few buffers, each step reading what earlier steps wrote. It is enqueued on
 * a stream and, at the same time, applied at once to reference buffers. At
 * every sync the stream's buffers must equal the reference, and the kernels
 * must have logged themselves in enqueue order.
 */

enum { PROG_BUFS = 4, PROG_BUF_SIZE = 2048 };

typedef struct prog prog;

typedef struct prog_kernel {
    prog *p;
    unsigned step;
    unsigned buf;
    size_t off, len;
    uint8_t key;
} prog_kernel;

struct prog {
    const weft__device_ops *ops;
    weft__stream *s;
    uint64_t rng;
    uint8_t *buf[PROG_BUFS];
    uint8_t *ref[PROG_BUFS];
    prog_kernel *kernels; /* one per step at most; read by the executor */
    unsigned *log;        /* written by kernels, in stream order */
    unsigned nlog;
    unsigned *expect; /* steps of the kernels enqueued so far */
    unsigned nexpect;
    unsigned nsteps, step;
    unsigned failures; /* counted here: not every caller is cmocka's thread */
};

static void kernel_apply(uint8_t *b, const prog_kernel *k)
{
    for (size_t i = 0; i < k->len; i++)
        b[k->off + i] = (uint8_t)((b[k->off + i] ^ k->key) * 3u + (uint8_t)k->step);
}

static void prog_kernel_fn(void *arg)
{
    prog_kernel *k = arg;

    kernel_apply(k->p->buf[k->buf], k);
    k->p->log[k->p->nlog++] = k->step;
}

static void prog_init(prog *p, weft__device *dev, weft__stream *s, uint64_t seed, unsigned nsteps)
{
    memset(p, 0, sizeof *p);
    p->ops = dev->ops;
    p->s = s;
    p->rng = seed;
    for (unsigned b = 0; b < PROG_BUFS; b++) {
        p->buf[b] = xmalloc(PROG_BUF_SIZE);
        p->ref[b] = xmalloc(PROG_BUF_SIZE);
        rng_fill(&p->rng, p->buf[b], PROG_BUF_SIZE);
        memcpy(p->ref[b], p->buf[b], PROG_BUF_SIZE);
    }
    p->kernels = xmalloc(nsteps * sizeof *p->kernels);
    p->log = xmalloc(nsteps * sizeof *p->log);
    p->expect = xmalloc(nsteps * sizeof *p->expect);
    p->nsteps = nsteps;
}

static void prog_fini(prog *p)
{
    for (unsigned b = 0; b < PROG_BUFS; b++) {
        free(p->buf[b]);
        free(p->ref[b]);
    }
    free(p->kernels);
    free(p->log);
    free(p->expect);
}

static void prog_range(prog *p, size_t *off, size_t *len)
{
    *len = 1 + rng_below(&p->rng, PROG_BUF_SIZE / 2);
    *off = rng_below(&p->rng, PROG_BUF_SIZE - *len + 1);
}

/* Enqueue the next step and apply it to the reference. */
static void prog_step(prog *p)
{
    unsigned i = p->step++;
    unsigned kind = (unsigned)rng_below(&p->rng, 8);
    unsigned db = (unsigned)rng_below(&p->rng, PROG_BUFS);
    size_t doff, len, soff, slen;
    int rc;

    prog_range(p, &doff, &len);
    if (kind < 3) { /* copy from another buffer (ranges never overlap) */
        unsigned sb = (db + 1 + (unsigned)rng_below(&p->rng, PROG_BUFS - 1)) % PROG_BUFS;
        prog_range(p, &soff, &slen);
        len = len < PROG_BUF_SIZE - soff ? len : PROG_BUF_SIZE - soff;
        rc = p->ops->copy(p->s, p->buf[db] + doff, p->buf[sb] + soff, len);
        memcpy(p->ref[db] + doff, p->ref[sb] + soff, len);
    } else if (kind < 5) { /* fill; values beyond a byte are truncated */
        int value = (int)rng_below(&p->rng, 1024) - 512;
        rc = p->ops->fill(p->s, p->buf[db] + doff, value, len);
        memset(p->ref[db] + doff, value, len);
    } else { /* kernel: transform in place, log the step */
        prog_kernel *k = &p->kernels[i];
        *k = (prog_kernel){p, i, db, doff, len, (uint8_t)rng_next(&p->rng)};
        rc = p->ops->host_fn(p->s, prog_kernel_fn, k);
        kernel_apply(p->ref[db], k);
        p->expect[p->nexpect++] = i;
    }
    if (rc != WEFT_OK)
        p->failures++;
}

/* Sync, then check that everything enqueued so far has taken effect. */
static void prog_sync_check(prog *p)
{
    if (weft__stream_sync(p->ops, p->s) != WEFT_OK)
        p->failures++;
    for (unsigned b = 0; b < PROG_BUFS; b++)
        if (memcmp(p->buf[b], p->ref[b], PROG_BUF_SIZE) != 0)
            p->failures++;
    if (p->nlog != p->nexpect || memcmp(p->log, p->expect, p->nlog * sizeof *p->log) != 0)
        p->failures++;
}

/* ---- direct backend tests ---------------------------------------------- */

/* Copies, fills and host functions on one stream run in enqueue order; a
 * sync in the middle sees exactly the steps before it. */
static void test_one_stream_runs_ops_in_order(void **state)
{
    weft__device *dev = device_new(2);
    weft__stream *s = lease(dev);
    prog p;

    (void)state;
    prog_init(&p, dev, s, 1, 3000);
    while (p.step < p.nsteps) {
        prog_step(&p);
        if (rng_below(&p.rng, 64) == 0)
            prog_sync_check(&p);
    }
    prog_sync_check(&p);
    assert_int_equal(p.failures, 0);
    assert_true(p.nexpect > 1000);
    prog_fini(&p);
    dev->ops->stream_return(dev, s);
    dev->ops->destroy(dev);
}

typedef struct rendezvous {
    gate here[2];
} rendezvous;

static void rendezvous_fn0(void *arg)
{
    rendezvous *r = arg;

    gate_open(&r->here[0]);
    gate_wait(&r->here[1]);
}

static void rendezvous_fn1(void *arg)
{
    rendezvous *r = arg;

    gate_open(&r->here[1]);
    gate_wait(&r->here[0]);
}

/* Two streams run at the same time: each one's host function waits for the
 * other's to start, which only ends if two executors run them together. */
static void test_two_streams_run_in_parallel(void **state)
{
    weft__device *dev = device_new(2);
    weft__stream *a = lease(dev), *b = lease(dev);
    rendezvous r;

    (void)state;
    assert_ptr_not_equal(a, b);
    gate_init(&r.here[0]);
    gate_init(&r.here[1]);
    assert_int_equal(dev->ops->host_fn(a, rendezvous_fn0, &r), WEFT_OK);
    assert_int_equal(dev->ops->host_fn(b, rendezvous_fn1, &r), WEFT_OK);
    assert_int_equal(weft__stream_sync(dev->ops, a), WEFT_OK);
    assert_int_equal(weft__stream_sync(dev->ops, b), WEFT_OK);
    assert_false(gate_timed_out(&r.here[0]));
    assert_false(gate_timed_out(&r.here[1]));
    gate_fini(&r.here[0]);
    gate_fini(&r.here[1]);
    dev->ops->stream_return(dev, a);
    dev->ops->stream_return(dev, b);
    dev->ops->destroy(dev);
}

enum { CLIENTS = 4, STREAMS_PER_CLIENT = 16, CLIENT_STEPS = 400 };

typedef struct client {
    weft__device *dev;
    uint64_t seed;
    unsigned failures;
} client;

/* Drive STREAMS_PER_CLIENT programs at once, interleaving their steps. */
static void *client_main(void *arg)
{
    client *c = arg;
    prog p[STREAMS_PER_CLIENT];

    for (unsigned i = 0; i < STREAMS_PER_CLIENT; i++) {
        weft__stream *s = NULL;
        if (c->dev->ops->stream_lease(c->dev, WEFT_PRIO_NORMAL, &s) != WEFT_OK) {
            c->failures++;
            return NULL; /* leaks the programs started so far; the test fails */
        }
        prog_init(&p[i], c->dev, s, c->seed * 1000 + i, CLIENT_STEPS);
    }
    for (unsigned n = 0; n < CLIENT_STEPS; n++)
        for (unsigned i = 0; i < STREAMS_PER_CLIENT; i++) {
            prog_step(&p[i]);
            if (rng_below(&p[i].rng, 128) == 0)
                prog_sync_check(&p[i]);
        }
    for (unsigned i = 0; i < STREAMS_PER_CLIENT; i++) {
        prog_sync_check(&p[i]);
        c->failures += p[i].failures;
        c->dev->ops->stream_return(c->dev, p[i].s);
        prog_fini(&p[i]);
    }
    return NULL;
}

/* Many streams driven from several threads at once each keep their own
 * order and results. */
static void test_many_streams_from_many_threads(void **state)
{
    weft__device *dev = device_new(3);
    pthread_t th[CLIENTS];
    client c[CLIENTS];

    (void)state;
    for (unsigned i = 0; i < CLIENTS; i++) {
        c[i] = (client){dev, i + 1, 0};
        assert_int_equal(pthread_create(&th[i], NULL, client_main, &c[i]), 0);
    }
    for (unsigned i = 0; i < CLIENTS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(c[i].failures, 0);
    }
    dev->ops->destroy(dev);
}

static void slow_set_flag_fn(void *arg)
{
    sleep_ms(20);
    *(int *)arg = 1;
}

/* A sync returns only after everything enqueued before it has run, also
 * when that takes a while; on an idle stream it returns at once. */
static void test_sync_waits_for_everything_before_it(void **state)
{
    weft__device *dev = device_new(2);
    weft__stream *s = lease(dev);
    int flag = 0;
    char src[64], dst[64];

    (void)state;
    assert_int_equal(weft__stream_sync(dev->ops, s), WEFT_OK); /* nothing enqueued yet */
    memset(src, 'x', sizeof src);
    memset(dst, 0, sizeof dst);
    for (int round = 0; round < 5; round++) {
        flag = 0;
        src[0] = (char)('a' + round);
        assert_int_equal(dev->ops->host_fn(s, slow_set_flag_fn, &flag), WEFT_OK);
        assert_int_equal(dev->ops->copy(s, dst, src, sizeof src), WEFT_OK);
        assert_int_equal(weft__stream_sync(dev->ops, s), WEFT_OK);
        assert_int_equal(flag, 1);
        assert_memory_equal(dst, src, sizeof src);
        assert_int_equal(weft__stream_sync(dev->ops, s), WEFT_OK); /* again: nothing new */
    }
    dev->ops->stream_return(dev, s);
    dev->ops->destroy(dev);
}

enum { SHARERS = 4, SHARER_OPS = 2000 };

typedef struct sharer {
    weft__device *dev;
    weft__stream *s;
    int done[SHARER_OPS]; /* set by this sharer's host functions */
    unsigned failures;
} sharer;

/* Enqueue and sync, over and over, on a stream other threads use too; each
 * sync must cover this thread's own earlier operations. */
static void *sharer_main(void *arg)
{
    sharer *sh = arg;

    for (unsigned i = 0; i < SHARER_OPS; i++) {
        if (sh->dev->ops->host_fn(sh->s, set_flag_fn, &sh->done[i]) != WEFT_OK)
            sh->failures++;
        if (i % 7 == 6 || i == SHARER_OPS - 1) {
            if (weft__stream_sync(sh->dev->ops, sh->s) != WEFT_OK)
                sh->failures++;
            for (unsigned j = 0; j <= i; j++)
                if (sh->done[j] != 1)
                    sh->failures++;
        }
    }
    return NULL;
}

/* Several threads enqueueing on and syncing one stream at once: every sync
 * waits for its caller's work; markers on one stream complete in order. */
static void test_concurrent_syncs_on_one_stream(void **state)
{
    weft__device *dev = device_new(2);
    weft__stream *s = lease(dev);
    pthread_t th[SHARERS];
    sharer *sh = calloc(SHARERS, sizeof *sh);

    (void)state;
    assert_non_null(sh);
    for (unsigned i = 0; i < SHARERS; i++) {
        sh[i].dev = dev;
        sh[i].s = s;
        assert_int_equal(pthread_create(&th[i], NULL, sharer_main, &sh[i]), 0);
    }
    for (unsigned i = 0; i < SHARERS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(sh[i].failures, 0);
    }
    free(sh);
    dev->ops->stream_return(dev, s);
    dev->ops->destroy(dev);
}

static int ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;

    return (x > y) - (x < y);
}

static bool all_distinct(weft__stream **v, size_t n)
{
    weft__stream **sorted = xmalloc(n * sizeof *sorted);
    bool ok = true;

    memcpy(sorted, v, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, ptr_cmp);
    for (size_t i = 1; i < n; i++)
        if (sorted[i] == sorted[i - 1])
            ok = false;
    free(sorted);
    return ok;
}

static bool same_set(weft__stream **a, weft__stream **b, size_t n)
{
    weft__stream **x = xmalloc(n * sizeof *x), **y = xmalloc(n * sizeof *y);
    bool same;

    memcpy(x, a, n * sizeof *x);
    memcpy(y, b, n * sizeof *y);
    qsort(x, n, sizeof *x, ptr_cmp);
    qsort(y, n, sizeof *y, ptr_cmp);
    same = memcmp(x, y, n * sizeof *x) == 0;
    free(x);
    free(y);
    return same;
}

/* Leases are exclusive while the pool lasts; returned streams are reused
 * rather than new ones made, and still work. */
static void test_lease_return_reuses_streams(void **state)
{
    enum { N = 8 };
    weft__device *dev = device_new(2);
    weft__stream *first[N], *again[N];
    char buf[N][32], src[32];

    (void)state;
    memset(src, 'q', sizeof src);
    for (unsigned i = 0; i < N; i++)
        first[i] = lease(dev);
    assert_true(all_distinct(first, N));
    for (unsigned i = 0; i < N; i++)
        dev->ops->stream_return(dev, first[i]);
    for (unsigned i = 0; i < N; i++)
        again[i] = lease(dev);
    assert_true(same_set(first, again, N));
    for (unsigned i = 0; i < N; i++) {
        memset(buf[i], 0, sizeof buf[i]);
        assert_int_equal(dev->ops->copy(again[i], buf[i], src, sizeof src), WEFT_OK);
    }
    for (unsigned i = 0; i < N; i++) {
        assert_int_equal(weft__stream_sync(dev->ops, again[i]), WEFT_OK);
        assert_memory_equal(buf[i], src, sizeof src);
        dev->ops->stream_return(dev, again[i]);
    }
    dev->ops->destroy(dev);
}

/* Past WEFT__HOST_STREAMS_MAX, a lease shares the stream with the fewest
 * leases: a second round of leases covers every stream exactly once more, a
 * stream given back is the next one leased, and a shared stream works for
 * each of its lessees. (Concurrent lessees of one stream: see
 * test_concurrent_syncs_on_one_stream.) */
static void test_exhausted_pool_shares_least_loaded(void **state)
{
    enum { MAX = WEFT__HOST_STREAMS_MAX };
    weft__device *dev = device_new(2);
    weft__stream **first = xmalloc(MAX * sizeof *first);
    weft__stream **second = xmalloc(MAX * sizeof *second);
    weft__stream *x;
    char src[32], dst[2][32];

    (void)state;
    for (unsigned i = 0; i < MAX; i++)
        first[i] = lease(dev);
    assert_true(all_distinct(first, MAX));
    for (unsigned i = 0; i < MAX; i++)
        second[i] = lease(dev);
    assert_true(same_set(first, second, MAX)); /* every stream leased twice */

    dev->ops->stream_return(dev, first[5]); /* first[5] now has one lease */
    x = lease(dev);
    assert_ptr_equal(x, first[5]);

    memset(src, 'z', sizeof src);
    memset(dst, 0, sizeof dst);
    assert_int_equal(dev->ops->copy(second[0], dst[0], src, sizeof src), WEFT_OK);
    for (unsigned i = 0; i < MAX; i++)
        if (first[i] == second[0])
            assert_int_equal(dev->ops->copy(first[i], dst[1], dst[0], sizeof src), WEFT_OK);
    assert_int_equal(weft__stream_sync(dev->ops, second[0]), WEFT_OK);
    assert_memory_equal(dst[1], src, sizeof src);

    dev->ops->stream_return(dev, x);
    for (unsigned i = 0; i < MAX; i++) {
        if (i != 5)
            dev->ops->stream_return(dev, first[i]);
        dev->ops->stream_return(dev, second[i]);
    }
    free(first);
    free(second);
    dev->ops->destroy(dev);
}

/* NULL pointers with bytes to move, or a NULL function, are refused with a
 * message; zero-byte operations with NULL pointers are fine. */
static void test_bad_arguments_are_refused(void **state)
{
    weft__device *dev = device_new(1);
    weft__stream *s = lease(dev);
    char buf[16];

    (void)state;
    assert_int_equal(dev->ops->copy(s, NULL, buf, sizeof buf), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "dst"));
    assert_int_equal(dev->ops->copy(s, buf, NULL, sizeof buf), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "src"));
    assert_int_equal(dev->ops->fill(s, NULL, 0, sizeof buf), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "dst"));
    assert_int_equal(dev->ops->host_fn(s, NULL, buf), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "fn"));
    assert_int_equal(dev->ops->copy(s, NULL, NULL, 0), WEFT_OK);
    assert_int_equal(dev->ops->fill(s, NULL, 0, 0), WEFT_OK);
    assert_int_equal(weft__stream_sync(dev->ops, s), WEFT_OK);
    dev->ops->stream_return(dev, s);
    dev->ops->destroy(dev);
}

static void count_fn(void *arg)
{
    unsigned sum = 0; /* a little work per call */

    for (unsigned i = 0; i < 200; i++) {
        sum += i;
        __asm__ __volatile__("" : "+r"(sum));
    }
    atomic_fetch_add_explicit((atomic_uint *)arg, 1, memory_order_relaxed);
}

/* destroy runs everything still queued before it returns. */
static void test_destroy_drains_queued_work(void **state)
{
    enum { STREAMS = 32, OPS = 200 };
    weft__device *dev = device_new(2);
    atomic_uint count;

    (void)state;
    atomic_init(&count, 0);
    for (unsigned i = 0; i < STREAMS; i++) {
        weft__stream *s = lease(dev);
        for (unsigned j = 0; j < OPS; j++)
            assert_int_equal(dev->ops->host_fn(s, count_fn, &count), WEFT_OK);
    }
    dev->ops->destroy(dev);
    assert_int_equal(atomic_load(&count), STREAMS * OPS);
}

/* After its work is done, a device with several executors uses (almost) no
 * CPU: executors sleep rather than spin. */
static void test_idle_device_uses_no_cpu(void **state)
{
    weft__device *dev = device_new(4);
    weft__stream *s = lease(dev);
    atomic_uint count;
    double cpu0, cpu1;

    (void)state;
    atomic_init(&count, 0);
    for (unsigned j = 0; j < 100; j++)
        assert_int_equal(dev->ops->host_fn(s, count_fn, &count), WEFT_OK);
    assert_int_equal(weft__stream_sync(dev->ops, s), WEFT_OK);
    sleep_ms(50); /* let every executor reach its sleep */
    cpu0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    sleep_ms(400);
    cpu1 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    /* a single spinning executor would burn about 0.4 s here */
    assert_true(cpu1 - cpu0 < 0.1);
    dev->ops->stream_return(dev, s);
    dev->ops->destroy(dev);
}

/* ---- through the public API, from tasks -------------------------------- */

static weft_runtime *runtime_new(unsigned workers)
{
    weft_config cfg = {.workers = workers, .backend = WEFT_BACKEND_HOST, .host_threads = 2};
    weft_runtime *rt = NULL;

    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    assert_non_null(rt);
    return rt;
}

enum { JOB_WORDS = 256, JOB_TAIL = 16 };

typedef struct job {
    unsigned id;
    const uint32_t *in; /* JOB_WORDS of input */
    uint32_t *dev;      /* JOB_WORDS of "device" memory */
} job;

typedef struct job_kernel {
    uint32_t *dev;
    uint32_t id;
} job_kernel;

static void job_kernel_fn(void *arg)
{
    job_kernel *k = arg;

    for (unsigned i = 0; i < JOB_WORDS; i++)
        k->dev[i] = k->dev[i] * 2654435761u + k->id;
}

static bool job_check(const job *jb, const uint32_t *out)
{
    for (unsigned i = 0; i < JOB_WORDS - JOB_TAIL; i++)
        if (out[i] != jb->in[i] * 2654435761u + jb->id)
            return false;
    for (unsigned i = JOB_WORDS - JOB_TAIL; i < JOB_WORDS; i++)
        if (out[i] != 0xa5a5a5a5u)
            return false;
    return true;
}

/* Copy in, run a host "kernel", overwrite the tail, copy out into a buffer
 * on this task's stack, await, verify. Odd jobs also await in between (the
 * stream goes back and a new one is leased). Returns NULL on success. */
static void *job_main(void *arg)
{
    job *jb = arg;
    uint32_t out[JOB_WORDS];          /* target of an asynchronous copy */
    job_kernel k = {jb->dev, jb->id}; /* read by the executor */

    memset(out, 0, sizeof out);
    if (weft_memcpy_async(jb->dev, jb->in, sizeof out) != WEFT_OK ||
        weft_host_async(job_kernel_fn, &k) != WEFT_OK)
        return "enqueue failed";
    if (jb->id % 2 && (weft_await() != WEFT_OK || jb->dev[0] != jb->in[0] * 2654435761u + jb->id))
        return "intermediate await";
    if (weft_memset_async(jb->dev + JOB_WORDS - JOB_TAIL, 0x1a5, JOB_TAIL * sizeof *out) !=
            WEFT_OK ||
        weft_memcpy_async(out, jb->dev, sizeof out) != WEFT_OK)
        return "enqueue failed";
    if (weft_await() != WEFT_OK)
        return "await failed";
    return job_check(jb, out) ? NULL : "wrong data";
}

/* Thousands of concurrent tasks, each copy-in, kernel, copy-out, await. */
static void test_tasks_copy_kernel_copy_out(void **state)
{
    weft_runtime *rt = runtime_new(4);
    weft_task_opts opts = {.stack_size = 64 * 1024};
    weft_task **t = xmalloc(JOBS * sizeof *t);
    job *jobs = xmalloc(JOBS * sizeof *jobs);
    uint32_t *in = xmalloc((size_t)JOBS * JOB_WORDS * sizeof *in);
    uint32_t *devmem = xmalloc((size_t)JOBS * JOB_WORDS * sizeof *devmem);
    uint64_t rng = 42;
    unsigned failed = 0;

    (void)state;
    rng_fill(&rng, in, (size_t)JOBS * JOB_WORDS * sizeof *in);
    for (unsigned i = 0; i < JOBS; i++) {
        jobs[i] = (job){i, in + (size_t)i * JOB_WORDS, devmem + (size_t)i * JOB_WORDS};
        assert_int_equal(weft_spawn(rt, &t[i], job_main, &jobs[i], &opts), WEFT_OK);
    }
    for (unsigned i = 0; i < JOBS; i++) {
        void *res = (void *)"not joined";
        assert_int_equal(weft_join(t[i], &res), WEFT_OK);
        if (res != NULL) {
            if (failed++ == 0)
                print_error("job %u: %s\n", i, (const char *)res);
        }
    }
    assert_int_equal(failed, 0);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    free(t);
    free(jobs);
    free(in);
    free(devmem);
}

/*
 * 100,000 tasks suspended in weft_await at once. Every task enqueues a host
 * function that waits at a shared gate, counts itself as arrived, and awaits.
 * The first host functions to run hold the executors at the gate, so no
 * task's work can complete (and no await can return) until the gate opens.
 * The gate is opened by one more task, which can only run on a worker that
 * is free while all the others are in weft_await, and only once every task
 * has arrived: at that moment arrived == N and returned == 0, with N tasks
 * inside weft_await on 4 worker threads. Every await must then return after
 * the gate opened. (N is SUSPENDED: 100,000, fewer under TSan.)
 */

static struct {
    gate g;
    atomic_uint arrived, returned, early, failed;
} susp;

static void *suspend_main(void *arg)
{
    (void)arg;
    if (weft_host_async(gate_wait_fn, &susp.g) != WEFT_OK)
        atomic_fetch_add(&susp.failed, 1);
    atomic_fetch_add(&susp.arrived, 1);
    if (weft_await() != WEFT_OK)
        atomic_fetch_add(&susp.failed, 1);
    if (!gate_is_open(&susp.g))
        atomic_fetch_add(&susp.early, 1);
    atomic_fetch_add(&susp.returned, 1);
    return NULL;
}

typedef struct opener_seen {
    unsigned arrived, returned;
} opener_seen;

static void *opener_main(void *arg)
{
    opener_seen *seen = arg;

    seen->arrived = atomic_load(&susp.arrived);
    seen->returned = atomic_load(&susp.returned);
    gate_open(&susp.g);
    return NULL;
}

static void test_100k_tasks_suspended_in_await(void **state)
{
    weft_runtime *rt = runtime_new(4);
    weft_task_opts opts = {.stack_size = 32 * 1024};
    weft_task **t = xmalloc(SUSPENDED * sizeof *t);
    weft_task *opener;
    opener_seen seen = {0, 0};
    double until = now_s(CLOCK_MONOTONIC) + GATE_DEADLINE_S;

    (void)state;
    gate_init(&susp.g);
    atomic_init(&susp.arrived, 0);
    atomic_init(&susp.returned, 0);
    atomic_init(&susp.early, 0);
    atomic_init(&susp.failed, 0);
    for (unsigned i = 0; i < SUSPENDED; i++)
        assert_int_equal(weft_spawn(rt, &t[i], suspend_main, NULL, &opts), WEFT_OK);
    while (atomic_load(&susp.arrived) < SUSPENDED && now_s(CLOCK_MONOTONIC) < until)
        sleep_ms(1);
    assert_int_equal(atomic_load(&susp.arrived), SUSPENDED);

    assert_int_equal(weft_spawn(rt, &opener, opener_main, &seen, NULL), WEFT_OK);
    assert_int_equal(weft_join(opener, NULL), WEFT_OK);
    for (unsigned i = 0; i < SUSPENDED; i++)
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);

    assert_int_equal(seen.arrived, SUSPENDED);
    assert_int_equal(seen.returned, 0);
    assert_int_equal(atomic_load(&susp.returned), SUSPENDED);
    assert_int_equal(atomic_load(&susp.early), 0);
    assert_int_equal(atomic_load(&susp.failed), 0);
    assert_false(gate_timed_out(&susp.g));
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    gate_fini(&susp.g);
    free(t);
}

/*
 * A marker fires as soon as the work before it is done, even when later
 * work on the stream is already taken in the same batch and cannot finish.
 * One worker makes the order deterministic: T1 enqueues A and syncs (its
 * marker waits for A only); T1's sync suspends it, and only then does the
 * worker run T2, which enqueues B (waits at gate `b_gate`) and releases the
 * single executor, parked meanwhile on another stream. The executor then
 * takes A and B together; T1 must wake after A, while B still waits for T1
 * to open b_gate.
 */
static struct {
    weft__device *dev;
    weft__stream *s;
    gate hold, b_gate;
    int a_ran, b_ran;
    int t1_saw_a, t1_saw_b, t1_status, t2_status;
} mb;

static void *mb_t2(void *arg)
{
    (void)arg;
    mb.t2_status = mb.dev->ops->host_fn(mb.s, gate_wait_fn, &mb.b_gate);
    if (mb.t2_status == WEFT_OK)
        mb.t2_status = mb.dev->ops->host_fn(mb.s, set_flag_fn, &mb.b_ran);
    gate_open(&mb.hold);
    return NULL;
}

static void *mb_t1(void *arg)
{
    weft_task *t2;

    (void)arg;
    mb.t1_status = mb.dev->ops->host_fn(mb.s, set_flag_fn, &mb.a_ran);
    if (mb.t1_status == WEFT_OK)
        mb.t1_status = weft_spawn(weft_runtime_current(), &t2, mb_t2, NULL, NULL);
    if (mb.t1_status != WEFT_OK) {
        gate_open(&mb.hold);
        gate_open(&mb.b_gate);
        return NULL;
    }
    mb.t1_status = weft__stream_sync(mb.dev->ops, mb.s);
    mb.t1_saw_a = mb.a_ran;
    mb.t1_saw_b = mb.b_ran;
    gate_open(&mb.b_gate);
    weft_join(t2, NULL);
    return NULL;
}

static void test_marker_fires_before_later_work_in_batch(void **state)
{
    weft_runtime *rt = runtime_new(1);
    weft__stream *blocker;
    weft_task *t1;

    (void)state;
    memset(&mb, 0, sizeof mb);
    mb.dev = device_new(1);
    gate_init(&mb.hold);
    gate_init(&mb.b_gate);
    blocker = lease(mb.dev);
    mb.s = lease(mb.dev);
    /* park the only executor until T2 has enqueued B */
    assert_int_equal(mb.dev->ops->host_fn(blocker, gate_wait_fn, &mb.hold), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &t1, mb_t1, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_join(t1, NULL), WEFT_OK);
    assert_int_equal(mb.t1_status, WEFT_OK);
    assert_int_equal(mb.t2_status, WEFT_OK);
    assert_int_equal(mb.t1_saw_a, 1);
    assert_int_equal(mb.t1_saw_b, 0);
    assert_int_equal(weft__stream_sync(mb.dev->ops, mb.s), WEFT_OK);
    assert_int_equal(mb.b_ran, 1);
    assert_false(gate_timed_out(&mb.hold));
    assert_false(gate_timed_out(&mb.b_gate));
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    mb.dev->ops->stream_return(mb.dev, blocker);
    mb.dev->ops->stream_return(mb.dev, mb.s);
    mb.dev->ops->destroy(mb.dev);
    gate_fini(&mb.hold);
    gate_fini(&mb.b_gate);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_stream_runs_ops_in_order),
        cmocka_unit_test(test_two_streams_run_in_parallel),
        cmocka_unit_test(test_many_streams_from_many_threads),
        cmocka_unit_test(test_sync_waits_for_everything_before_it),
        cmocka_unit_test(test_concurrent_syncs_on_one_stream),
        cmocka_unit_test(test_lease_return_reuses_streams),
        cmocka_unit_test(test_exhausted_pool_shares_least_loaded),
        cmocka_unit_test(test_bad_arguments_are_refused),
        cmocka_unit_test(test_destroy_drains_queued_work),
        cmocka_unit_test(test_idle_device_uses_no_cpu),
        cmocka_unit_test(test_tasks_copy_kernel_copy_out),
        cmocka_unit_test(test_100k_tasks_suspended_in_await),
        cmocka_unit_test(test_marker_fires_before_later_work_in_batch),
    };
    const char *filter = getenv("WEFT_TEST_FILTER");

    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
