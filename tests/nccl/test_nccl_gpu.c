/*
 * test_nccl_gpu.c - libweft_nccl on GPUs: collectives enqueued by tasks and
 * awaited, against a host computation, and every refusal.
 *
 * One GPU: communicators of one rank (weft_nccl_comm_init_all over device
 * 0), where every collective's result is its input - all-reduce with each
 * op, all-gather, reduce-scatter, broadcast, send/recv to self in a group -
 * on fresh random data of several dtypes, outputs poisoned first; the error
 * paths; weft_nccl_await; abort; the watcher failing the awaits of
 * collectives whose communicator timed out or was aborted before they
 * ended (queued behind a host function that holds the stream). Two GPUs or more: one communicator
 * over all of them, one task per rank on its device, an all-reduce sum (int32 exact, float32 within
 * rounding) against the host's sum; and a peer killed mid-collective: rank 1 in a second process
 * (this program run with --peer), killed after one sum, rank 0's next all-reduce failing within a
 * bounded time; else each says "skipped: one GPU".
 */
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <sys/wait.h>

#include "gpu_support/gpu_test.h"
#include "weft/nccl.h"

static const size_t esize[] = {4, 2, 2, 1, 1, 1, 4}; /* by weft_dtype */

/* ---- one rank ----------------------------------------------------------- */

typedef struct one_rank {
    weft_nccl_comm *comm;
    uint64_t rng;
} one_rank;

/* Copy n bytes of device memory d into a fresh host buffer and compare it
 * with want; name the call on a difference. */
static bool same(const void *d, const void *want, size_t n, const char *what)
{
    unsigned char *h = malloc(n);
    if (!GT_CHECK(h != NULL, "malloc"))
        return false;
    bool ok = GT_OK(weft_memcpy_async(h, d, n)) && GT_OK(weft_await());
    size_t at = ok ? gt_first_diff(h, want, n) : 0;
    ok = ok && GT_CHECK(at == n, "%s: byte %zu of %zu differs: 0x%02x, want 0x%02x", what, at, n,
                        h[at < n ? at : 0], ((const unsigned char *)want)[at < n ? at : 0]);
    free(h);
    return ok;
}

static void *one_rank_task(void *arg)
{
    one_rank *o = arg;
    static const weft_dtype dtypes[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16,
                                        WEFT_DTYPE_I8, WEFT_DTYPE_I32};
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        weft_dtype dt = dtypes[d];
        size_t count = gt_between(&o->rng, 1, 300000), n = count * esize[dt];
        unsigned char *host = malloc(n);
        if (!GT_CHECK(host != NULL, "malloc"))
            return NULL;
        if (dt == WEFT_DTYPE_F32) /* finite values: a NaN's bits need not survive MAX */
            for (size_t i = 0; i < count; i++)
                ((float *)host)[i] = gt_float(&o->rng);
        else if (dt == WEFT_DTYPE_I8 || dt == WEFT_DTYPE_I32)
            gt_fill(&o->rng, host, n);
        else /* 16-bit floats: random finite halves and bfloat16s */
            for (size_t i = 0; i < count; i++) {
                uint16_t v = (uint16_t)(gt_u32(&o->rng) & 0xbbff); /* exponent never all ones */
                memcpy(host + 2 * i, &v, 2);
            }
        void *in = NULL, *out = NULL;
        if (!GT_OK(weft_malloc_async(&in, n)) || !GT_OK(weft_malloc_async(&out, n)) ||
            !GT_OK(weft_memcpy_async(in, host, n)))
            return NULL;
        char what[96];
        for (int op = WEFT_NCCL_SUM; op <= WEFT_NCCL_AVG; op++) {
            snprintf(what, sizeof what, "all_reduce dtype %d op %d count %zu", dt, op, count);
            if (!GT_OK(weft_memset_async(out, GT_POISON, n)) ||
                !GT_OK(weft_nccl_all_reduce(o->comm, in, out, count, dt, (weft_nccl_op)op)) ||
                !GT_OK(weft_await()) || !same(out, host, n, what))
                return NULL;
        }
        snprintf(what, sizeof what, "all_gather dtype %d count %zu", dt, count);
        if (!GT_OK(weft_memset_async(out, GT_POISON, n)) ||
            !GT_OK(weft_nccl_all_gather(o->comm, in, out, count, dt)) || !GT_OK(weft_await()) ||
            !same(out, host, n, what))
            return NULL;
        snprintf(what, sizeof what, "reduce_scatter dtype %d count %zu", dt, count);
        if (!GT_OK(weft_memset_async(out, GT_POISON, n)) ||
            !GT_OK(weft_nccl_reduce_scatter(o->comm, in, out, count, dt, WEFT_NCCL_SUM)) ||
            !GT_OK(weft_await()) || !same(out, host, n, what))
            return NULL;
        snprintf(what, sizeof what, "broadcast dtype %d count %zu", dt, count);
        if (!GT_OK(weft_memset_async(out, GT_POISON, n)) ||
            !GT_OK(weft_nccl_broadcast(o->comm, in, out, count, dt, 0)) || !GT_OK(weft_await()) ||
            !same(out, host, n, what))
            return NULL;
        snprintf(what, sizeof what, "send/recv to self dtype %d count %zu", dt, count);
        if (!GT_OK(weft_memset_async(out, GT_POISON, n)) || !GT_OK(weft_nccl_group_begin()) ||
            !GT_OK(weft_nccl_send(o->comm, in, count, dt, 0)) ||
            !GT_OK(weft_nccl_recv(o->comm, out, count, dt, 0)) || !GT_OK(weft_nccl_group_end()) ||
            !GT_OK(weft_await()) || !same(out, host, n, what))
            return NULL;
        /* in place, awaited with a deadline */
        snprintf(what, sizeof what, "in-place all_reduce dtype %d count %zu", dt, count);
        if (!GT_OK(weft_memcpy_async(out, in, n)) ||
            !GT_OK(weft_nccl_all_reduce(o->comm, out, out, count, dt, WEFT_NCCL_MAX)) ||
            !GT_OK(weft_nccl_await(o->comm, weft_deadline_in_ns(30000000000ull))) ||
            !same(out, host, n, what))
            return NULL;
        GT_OK(weft_free_async(in));
        GT_OK(weft_free_async(out));
        GT_OK(weft_await());
        free(host);
    }
    GT_OK(weft_nccl_comm_check(o->comm));
    return NULL;
}

static weft_nccl_comm *one_comm(weft_runtime *rt)
{
    unsigned dev0 = 0;
    weft_nccl_comm *comm = NULL;
    assert_ok(weft_nccl_comm_init_all(rt, 1, &dev0, &comm));
    int rank = -1, nranks = -1;
    unsigned device = 99;
    assert_ok(weft_nccl_comm_info(comm, &rank, &nranks, &device));
    assert_int_equal(rank, 0);
    assert_int_equal(nranks, 1);
    assert_int_equal(device, 0);
    return comm;
}

static void test_one_rank(void **state)
{
    (void)state;
    weft_runtime *rt = gt_runtime(4);
    one_rank o = {one_comm(rt), gt_rng(1)};
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.device = WEFT_DEVICE(0);
    weft_task *t = NULL;
    assert_ok(weft_spawn(rt, &t, one_rank_task, &o, &opts));
    assert_ok(weft_join(t, NULL));
    gt_assert_passed();
    assert_ok(weft_nccl_comm_destroy(o.comm));
    gt_runtime_destroy(rt);
}

/* ---- refusals ------------------------------------------------------------ */

static void *errors_task(void *arg)
{
    weft_nccl_comm *comm = arg;
    size_t count = 1024, n = count * 4;
    float host[1024];
    void *a = NULL, *b = NULL;
    if (!GT_OK(weft_malloc_async(&a, n)) || !GT_OK(weft_malloc_async(&b, 2 * n)))
        return NULL;
    GT_RC(weft_nccl_all_reduce(comm, NULL, b, count, WEFT_DTYPE_F32, WEFT_NCCL_SUM), WEFT_EINVAL);
    GT_RC(weft_nccl_all_reduce(comm, a, NULL, count, WEFT_DTYPE_F32, WEFT_NCCL_SUM), WEFT_EINVAL);
    GT_RC(weft_nccl_all_reduce(comm, a, b, count, (weft_dtype)42, WEFT_NCCL_SUM), WEFT_EINVAL);
    GT_RC(weft_nccl_all_reduce(comm, a, b, count, WEFT_DTYPE_F32, (weft_nccl_op)9), WEFT_EINVAL);
    /* partial overlap (not the in-place form) */
    GT_RC(weft_nccl_all_reduce(comm, b, (char *)b + 4, count, WEFT_DTYPE_F32, WEFT_NCCL_SUM),
          WEFT_EINVAL);
    GT_RC(weft_nccl_all_gather(comm, (char *)b + 4, b, count, WEFT_DTYPE_F32), WEFT_EINVAL);
    /* pageable host memory */
    GT_RC(weft_nccl_all_reduce(comm, host, b, count, WEFT_DTYPE_F32, WEFT_NCCL_SUM), WEFT_EINVAL);
    GT_CHECK(strstr(weft_last_error(), "not GPU memory") != NULL, "message: %s", weft_last_error());
    GT_RC(weft_nccl_recv(comm, host, count, WEFT_DTYPE_F32, 0), WEFT_EINVAL);
    /* a count whose bytes do not fit */
    GT_RC(weft_nccl_all_reduce(comm, a, b, SIZE_MAX / 2, WEFT_DTYPE_F32, WEFT_NCCL_SUM),
          WEFT_EINVAL);
    /* ranks out of range (one rank) */
    GT_RC(weft_nccl_broadcast(comm, a, b, count, WEFT_DTYPE_F32, 1), WEFT_EINVAL);
    GT_RC(weft_nccl_broadcast(comm, a, b, count, WEFT_DTYPE_F32, -1), WEFT_EINVAL);
    GT_RC(weft_nccl_send(comm, a, count, WEFT_DTYPE_F32, 1), WEFT_EINVAL);
    GT_CHECK(strstr(weft_last_error(), "peer 1 is outside [0, 1)") != NULL, "message: %s",
             weft_last_error());
    GT_RC(weft_nccl_recv(comm, b, count, WEFT_DTYPE_F32, -3), WEFT_EINVAL);
    GT_RC(weft_nccl_group_end(), WEFT_ESTATE);
    GT_OK(weft_free_async(a));
    GT_OK(weft_free_async(b));
    return NULL;
}

/* A communicator on GPU 1 used from a task on GPU 0 (two GPUs). */
static void *wrong_device_task(void *arg)
{
    weft_nccl_comm *comm = arg;
    void *a = NULL;
    if (!GT_OK(weft_malloc_async(&a, 64)))
        return NULL;
    GT_RC(weft_nccl_all_reduce(comm, a, a, 16, WEFT_DTYPE_F32, WEFT_NCCL_SUM), WEFT_EINVAL);
    GT_CHECK(strstr(weft_last_error(), "the communicator is on GPU 1") != NULL, "message: %s",
             weft_last_error());
    GT_OK(weft_free_async(a));
    return NULL;
}

static void *aborted_task(void *arg)
{
    weft_nccl_comm *comm = arg;
    void *a = NULL;
    if (!GT_OK(weft_malloc_async(&a, 64)))
        return NULL;
    GT_OK(weft_nccl_all_reduce(comm, a, a, 16, WEFT_DTYPE_F32, WEFT_NCCL_SUM));
    GT_OK(weft_nccl_await(comm, weft_deadline_in_ns(30000000000ull)));
    GT_OK(weft_nccl_comm_abort(comm));
    GT_RC(weft_nccl_comm_abort(comm), WEFT_ESTATE);
    GT_RC(weft_nccl_all_reduce(comm, a, a, 16, WEFT_DTYPE_F32, WEFT_NCCL_SUM), WEFT_ESTATE);
    GT_RC(weft_nccl_comm_check(comm), WEFT_ESTATE);
    GT_RC(weft_nccl_await(comm, WEFT_FOREVER), WEFT_ESTATE);
    GT_OK(weft_free_async(a));
    return NULL;
}

static void test_errors(void **state)
{
    (void)state;
    weft_runtime *rt = gt_runtime(4);
    unsigned ndev = weft_device_count(rt);
    weft_nccl_comm *comm = one_comm(rt), *comms[2] = {NULL, NULL};
    unsigned bad[2] = {0, 0}, far = ndev;
    assert_rc(weft_nccl_comm_init_all(rt, 2, bad, comms), WEFT_EINVAL);
    assert_rc(weft_nccl_comm_init_all(rt, 1, &far, comms), WEFT_EINVAL);
    assert_null(comms[0]);
    weft_nccl_id id;
    assert_ok(weft_nccl_unique_id(&id));
    assert_rc(weft_nccl_comm_init_rank(rt, far, 1, &id, 0, WEFT_FOREVER, comms), WEFT_EINVAL);
    /* a rank waiting for a second rank that never comes: the deadline */
    double t0 = gt_now();
    assert_rc(weft_nccl_comm_init_rank(rt, 0, 2, &id, 0, weft_deadline_in_ns(2000000000ull), comms),
              WEFT_ETIMEDOUT);
    assert_true(gt_now() - t0 < gt_deadline(30));
    assert_null(comms[0]);
    /* outside a task */
    float x;
    assert_rc(weft_nccl_all_reduce(comm, &x, &x, 1, WEFT_DTYPE_F32, WEFT_NCCL_SUM), WEFT_ENOTASK);

    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.device = WEFT_DEVICE(0);
    weft_task *t = NULL;
    assert_ok(weft_spawn(rt, &t, errors_task, comm, &opts));
    assert_ok(weft_join(t, NULL));
    gt_assert_passed();

    if (ndev >= 2) {
        unsigned dev1 = 1;
        weft_nccl_comm *c1 = NULL;
        assert_ok(weft_nccl_comm_init_all(rt, 1, &dev1, &c1));
        assert_ok(weft_spawn(rt, &t, wrong_device_task, c1, &opts));
        assert_ok(weft_join(t, NULL));
        gt_assert_passed();
        assert_ok(weft_nccl_comm_destroy(c1));
    } else {
        printf("wrong device: skipped: one GPU\n");
    }

    weft_nccl_comm *doomed = one_comm(rt);
    assert_ok(weft_spawn(rt, &t, aborted_task, doomed, &opts));
    assert_ok(weft_join(t, NULL));
    gt_assert_passed();
    assert_ok(weft_nccl_comm_destroy(doomed));
    assert_ok(weft_nccl_comm_destroy(comm));
    gt_runtime_destroy(rt);
}

/* ---- the watcher ---------------------------------------------------------- */

enum { HOLD_MS = 300 };

/* Keeps the task's stream busy, so that a collective queued after it
 * cannot end before its communicator goes. */
static void hold_stream(void *arg)
{
    (void)arg;
    struct timespec ts = {0, HOLD_MS * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct stuck {
    weft_nccl_comm *comm;
    atomic_int queued; /* the second collective is on the stream */
    int awaited;       /* weft_await's result */
    char cause[256];   /* and its message */
    double waited;     /* seconds in that await */
} stuck;

/* A collective that ends before anything goes wrong awaits WEFT_OK; then
 * one queued behind HOLD_MS of host work, whose fate the test decides. */
static void *stuck_task(void *arg)
{
    stuck *s = arg;
    void *a = NULL;
    if (!GT_OK(weft_malloc_async(&a, 64)) || !GT_OK(weft_memset_async(a, 0, 64)) ||
        !GT_OK(weft_nccl_all_reduce(s->comm, a, a, 16, WEFT_DTYPE_F32, WEFT_NCCL_SUM)) ||
        !GT_OK(weft_await()))
        return NULL;
    if (!GT_OK(weft_host_async(hold_stream, NULL)) ||
        !GT_OK(weft_nccl_all_reduce(s->comm, a, a, 16, WEFT_DTYPE_F32, WEFT_NCCL_SUM)))
        return NULL;
    atomic_store(&s->queued, 1);
    double t0 = gt_now();
    s->awaited = weft_await();
    s->waited = gt_now() - t0;
    snprintf(s->cause, sizeof s->cause, "%s", weft_last_error());
    GT_RC(weft_nccl_all_reduce(s->comm, a, a, 16, WEFT_DTYPE_F32, WEFT_NCCL_SUM), WEFT_ESTATE);
    GT_OK(weft_free_async(a));
    GT_OK(weft_await()); /* the verdict was given once */
    return NULL;
}

static void test_watcher(void **state)
{
    (void)state;
    weft_runtime *rt = gt_runtime(4);
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.device = WEFT_DEVICE(0);
    weft_task *t = NULL;

    /* the communicator's timeout passes while the collective waits */
    stuck s = {.comm = one_comm(rt)};
    assert_rc(weft_nccl_comm_set_timeout(NULL, 1), WEFT_EINVAL);
    assert_ok(weft_nccl_comm_set_timeout(s.comm, 50000000ull));
    assert_ok(weft_spawn(rt, &t, stuck_task, &s, &opts));
    assert_rc(weft_join(t, NULL), WEFT_ETIMEDOUT); /* the task's join reports it too */
    gt_assert_passed();
    assert_int_equal(s.awaited, WEFT_ETIMEDOUT);
    assert_non_null(strstr(s.cause, "weft_nccl_all_reduce: the communicator was aborted"));
    assert_non_null(strstr(s.cause, "timeout (50 ms)"));
    assert_true(s.waited < gt_deadline(10)); /* the hold's time, not forever */
    assert_rc(weft_nccl_comm_set_timeout(s.comm, 0), WEFT_ESTATE);
    assert_ok(weft_nccl_comm_destroy(s.comm));

    /* another thread aborts the communicator while the collective waits */
    stuck u = {.comm = one_comm(rt)};
    atomic_init(&u.queued, 0);
    assert_ok(weft_spawn(rt, &t, stuck_task, &u, &opts));
    double t0 = gt_now();
    while (!atomic_load(&u.queued) && gt_now() - t0 < gt_deadline(30)) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(atomic_load(&u.queued), 1);
    assert_ok(weft_nccl_comm_abort(u.comm));
    assert_rc(weft_join(t, NULL), WEFT_EDEVICE);
    gt_assert_passed();
    assert_int_equal(u.awaited, WEFT_EDEVICE);
    assert_non_null(strstr(u.cause, "weft_nccl_comm_abort was called"));
    assert_ok(weft_nccl_comm_destroy(u.comm));
    gt_runtime_destroy(rt);
}

/* ---- every GPU ------------------------------------------------------------ */

enum { MULTI_COUNT = 1 << 20 };

typedef struct rank_job {
    weft_nccl_comm *comm;
    const int32_t *ints; /* this rank's input */
    const float *floats;
    const int64_t *isum; /* the host's sums */
    const double *fsum, *fabs_sum;
} rank_job;

static void *rank_task(void *arg)
{
    rank_job *j = arg;
    size_t n = MULTI_COUNT * 4;
    void *di = NULL, *df = NULL;
    int32_t *hi = malloc(n);
    float *hf = malloc(n);
    if (!GT_CHECK(hi && hf, "malloc") || !GT_OK(weft_malloc_async(&di, n)) ||
        !GT_OK(weft_malloc_async(&df, n)) || !GT_OK(weft_memcpy_async(di, j->ints, n)) ||
        !GT_OK(weft_memcpy_async(df, j->floats, n)))
        return NULL;
    uint64_t deadline = weft_deadline_in_ns(60000000000ull);
    if (!GT_OK(weft_nccl_group_begin()) ||
        !GT_OK(weft_nccl_all_reduce(j->comm, di, di, MULTI_COUNT, WEFT_DTYPE_I32, WEFT_NCCL_SUM)) ||
        !GT_OK(weft_nccl_all_reduce(j->comm, df, df, MULTI_COUNT, WEFT_DTYPE_F32, WEFT_NCCL_SUM)) ||
        !GT_OK(weft_nccl_group_end()) || !GT_OK(weft_nccl_await(j->comm, deadline)) ||
        !GT_OK(weft_memcpy_async(hi, di, n)) || !GT_OK(weft_memcpy_async(hf, df, n)) ||
        !GT_OK(weft_await()))
        return NULL;
    int rank = -1;
    weft_nccl_comm_info(j->comm, &rank, NULL, NULL);
    for (size_t i = 0; i < MULTI_COUNT; i++) {
        if (!GT_CHECK(hi[i] == (int32_t)(uint32_t)j->isum[i], "rank %d int32 [%zu]: %d, want %d",
                      rank, i, hi[i], (int32_t)(uint32_t)j->isum[i]))
            break;
        double tol = 1e-6 * j->fabs_sum[i] + 1e-30;
        if (!GT_CHECK(fabs((double)hf[i] - j->fsum[i]) <= tol, "rank %d float [%zu]: %g, want %g",
                      rank, i, (double)hf[i], j->fsum[i]))
            break;
    }
    GT_OK(weft_free_async(di));
    GT_OK(weft_free_async(df));
    free(hi);
    free(hf);
    return NULL;
}

static void test_all_gpus(void **state)
{
    (void)state;
    weft_runtime *rt = gt_runtime(0);
    unsigned ndev = weft_device_count(rt);
    if (ndev < 2) {
        printf("all GPUs: skipped: one GPU\n");
        gt_runtime_destroy(rt);
        return;
    }
    if (weft_runtime_workers(rt) <= ndev)
        printf("note: %u workers for %u ranks\n", weft_runtime_workers(rt), ndev);
    unsigned devices[16];
    ndev = ndev < 16 ? ndev : 16;
    for (unsigned i = 0; i < ndev; i++)
        devices[i] = i;
    weft_nccl_comm *comms[16];
    assert_ok(weft_nccl_comm_init_all(rt, ndev, devices, comms));
    int32_t *ints = gt_xmalloc((size_t)ndev * MULTI_COUNT * 4);
    float *floats = gt_xmalloc((size_t)ndev * MULTI_COUNT * 4);
    int64_t *isum = calloc(MULTI_COUNT, 8);
    double *fsum = calloc(MULTI_COUNT, 8), *fabs_sum = calloc(MULTI_COUNT, 8);
    assert_true(isum && fsum && fabs_sum);
    uint64_t rng = gt_rng(7);
    for (size_t i = 0; i < (size_t)ndev * MULTI_COUNT; i++) {
        ints[i] = (int32_t)gt_u32(&rng);
        floats[i] = gt_float(&rng);
        isum[i % MULTI_COUNT] += ints[i]; /* wraps as int32 sums do, taken mod 2^32 below */
        fsum[i % MULTI_COUNT] += floats[i];
        fabs_sum[i % MULTI_COUNT] += fabs((double)floats[i]);
    }
    rank_job jobs[16];
    weft_task *ts[16];
    for (unsigned i = 0; i < ndev; i++) {
        jobs[i] = (rank_job){
            comms[i], ints + (size_t)i * MULTI_COUNT, floats + (size_t)i * MULTI_COUNT, isum, fsum,
            fabs_sum};
        weft_task_opts opts = WEFT_TASK_OPTS_INIT;
        opts.device = WEFT_DEVICE(i);
        assert_ok(weft_spawn(rt, &ts[i], rank_task, &jobs[i], &opts));
    }
    for (unsigned i = 0; i < ndev; i++)
        assert_ok(weft_join(ts[i], NULL));
    gt_assert_passed();
    printf("all GPUs: all-reduce over %u ranks checked\n", ndev);
    for (unsigned i = 0; i < ndev; i++)
        assert_ok(weft_nccl_comm_destroy(comms[i]));
    free(ints);
    free(floats);
    free(isum);
    free(fsum);
    free(fabs_sum);
    gt_runtime_destroy(rt);
}

/* ---- a peer killed mid-collective (two GPUs, two processes) ---------------- */

/* Rank 1, in a process of its own (this program run with --peer ID):
 * joins, sums one buffer with rank 0, then sleeps until rank 0 kills it. */
enum { PEER_COUNT = 1 << 16 };

typedef struct peer_job {
    weft_runtime *rt;
    weft_nccl_id id;
    int rank;
    pid_t peer;                     /* rank 0's: the process to kill */
    double before_kill, after_kill; /* rank 0's: the awaits' seconds */
    int rc_after;                   /* rank 0's second await */
    char message[512];              /* and its error */
} peer_job;

static int hex_id(const char *hex, weft_nccl_id *id)
{
    for (size_t i = 0; i < sizeof id->bytes; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        id->bytes[i] = (char)v;
    }
    return 0;
}

/* Both ranks: join, and one all-reduce of PEER_COUNT ones (2 each, after). */
static weft_nccl_comm *join_and_sum(peer_job *j, float **buf)
{
    weft_nccl_comm *comm = NULL;
    float *h = malloc(PEER_COUNT * sizeof *h);
    *buf = NULL;
    if (!GT_CHECK(h != NULL, "malloc") ||
        !GT_OK(weft_nccl_comm_init_rank(j->rt, (unsigned)j->rank, 2, &j->id, j->rank,
                                        weft_deadline_in_ns(60000000000ull), &comm)) ||
        !GT_OK(weft_malloc_async((void **)buf, PEER_COUNT * sizeof *h))) {
        free(h);
        return comm;
    }
    for (size_t i = 0; i < PEER_COUNT; i++)
        h[i] = 1.0f;
    if (GT_OK(weft_memcpy_async(*buf, h, PEER_COUNT * sizeof *h)) &&
        GT_OK(weft_nccl_all_reduce(comm, *buf, *buf, PEER_COUNT, WEFT_DTYPE_F32, WEFT_NCCL_SUM)) &&
        GT_OK(weft_memcpy_async(h, *buf, PEER_COUNT * sizeof *h)) && GT_OK(weft_await()))
        GT_CHECK(h[0] == 2.0f && h[PEER_COUNT - 1] == 2.0f, "rank %d: the sum is %g, want 2",
                 j->rank, (double)h[0]);
    free(h);
    return comm;
}

static void *peer_task(void *arg)
{
    peer_job *j = arg;
    float *buf;
    join_and_sum(j, &buf);
    weft_sleep_ns(120000000000ull); /* rank 0 kills this process long before */
    return NULL;
}

static int run_peer(const char *hex)
{
    peer_job j = {.rank = 1};
    weft_task *t = NULL;
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.device = WEFT_DEVICE(1);
    if (hex_id(hex, &j.id) || weft_runtime_create(&j.rt, NULL) != WEFT_OK ||
        weft_spawn(j.rt, &t, peer_task, &j, &opts) != WEFT_OK)
        return 1;
    weft_join(t, NULL);
    return 0;
}

/* Rank 0: the sum with the live peer, then the peer killed and a second
 * all-reduce: its await fails (the watcher sees NCCL's error, or the
 * communicator's 10 s timeout passes) within a bounded time, instead of
 * hanging the task. */
static void *killer_task(void *arg)
{
    peer_job *j = arg;
    float *buf;
    double t0 = gt_now();
    weft_nccl_comm *comm = join_and_sum(j, &buf);
    j->before_kill = gt_now() - t0;
    if (!comm || !buf || !GT_OK(weft_nccl_comm_set_timeout(comm, 10000000000ull)))
        return NULL;
    kill(j->peer, SIGKILL);
    waitpid(j->peer, NULL, 0);
    t0 = gt_now();
    int rc = weft_nccl_all_reduce(comm, buf, buf, PEER_COUNT, WEFT_DTYPE_F32, WEFT_NCCL_SUM);
    j->rc_after = rc == WEFT_OK ? weft_await() : rc;
    j->after_kill = gt_now() - t0;
    snprintf(j->message, sizeof j->message, "%s", weft_last_error());
    weft_free_async(buf);
    weft_await();
    GT_OK(weft_nccl_comm_destroy(comm));
    return NULL;
}

static void test_killed_peer(void **state)
{
    (void)state;
    weft_runtime *rt = gt_runtime(0);
    if (weft_device_count(rt) < 2) {
        printf("killed peer: skipped: one GPU\n");
        gt_runtime_destroy(rt);
        return;
    }
    peer_job j = {.rt = rt, .rank = 0};
    assert_ok(weft_nccl_unique_id(&j.id));
    char hex[2 * sizeof j.id.bytes + 1], self[4096];
    for (size_t i = 0; i < sizeof j.id.bytes; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)j.id.bytes[i]);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = 0;
    char *args[] = {self, "--peer", hex, NULL};
    extern char **environ;
    assert_int_equal(posix_spawn(&j.peer, self, NULL, NULL, args, environ), 0);
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.device = WEFT_DEVICE(0);
    weft_task *t = NULL;
    assert_ok(weft_spawn(rt, &t, killer_task, &j, &opts));
    assert_ok(weft_join(t, NULL));
    gt_assert_passed();
    printf("killed peer: the sum with it in %.2f s; killed, the next all-reduce failed in %.2f s: "
           "%s\n",
           j.before_kill, j.after_kill, j.message);
    assert_true(j.rc_after == WEFT_EDEVICE || j.rc_after == WEFT_ETIMEDOUT);
    assert_true(j.after_kill < gt_deadline(60));
    gt_runtime_destroy(rt);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--peer")) /* test_killed_peer's rank 1 */
        return run_peer(argv[2]);
    int rc = gt_start("test_nccl_gpu");
    if (rc)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank),    cmocka_unit_test(test_errors),
        cmocka_unit_test(test_watcher),     cmocka_unit_test(test_all_gpus),
        cmocka_unit_test(test_killed_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
