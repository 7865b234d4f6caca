/*
 * test_stream.c - the task's stream: host functions, native handle, await.
 *
 * weft_host_async running in stream order between copies and kernels.
 * weft_stream handing out a cudaStream_t that the test launches on with
 * <<<>>>, covered by weft_await. And the await itself: implicit when a task
 * returns with work in flight, not cut short by cancellation, and never
 * blocking its worker.
 *
 * The work awaited is mostly a kernel that reads, spins, then writes into
 * mapped memory (gk_spin_affine): an await that returns early sees poison.
 */
#include "gpu_support/gpu_test.h"

enum { GUARD = 16 }; /* poisoned words past every output */

static weft_dim3 dim(unsigned x, unsigned y, unsigned z)
{
    weft_dim3 d = {x, y, z};
    return d;
}

/* ---- host functions in stream order ------------------------------------ */
/*
 * A loop of: copy pinned P to device, kernel, copy back to P, host
 * function. Each host function checks P holds the kernel's result of this
 * round (the copy before it has finished), logs its round, then writes the
 * next round's input into P (the copy after it must see that). Everything
 * is enqueued before the first await.
 */

enum { HF_ROUNDS = 64, HF_WORDS = 8192 };

typedef struct hf_ctx hf_ctx;

typedef struct hf_round {
    hf_ctx *ctx;
    unsigned round;
} hf_round;

struct hf_ctx {
    uint32_t *pinned;
    uint32_t (*expect)[HF_WORDS]; /* what P holds when round r's host function runs */
    uint32_t (*next)[HF_WORDS];   /* what that function writes for round r + 1 */
    hf_round rounds[HF_ROUNDS];
    unsigned log[HF_ROUNDS];
    atomic_uint nlog;
    atomic_uint wrong; /* first round + 1 whose function saw wrong data */
};

static void hf_fn(void *arg)
{
    hf_round *r = arg;
    hf_ctx *c = r->ctx;
    unsigned k = atomic_fetch_add(&c->nlog, 1);

    if (k < HF_ROUNDS)
        c->log[k] = r->round;
    if (memcmp(c->pinned, c->expect[r->round], HF_WORDS * 4) != 0) {
        unsigned none = 0;
        atomic_compare_exchange_strong(&c->wrong, &none, r->round + 1);
    }
    memcpy(c->pinned, c->next[r->round], HF_WORDS * 4);
}

static void *host_fn_main(void *arg)
{
    hf_ctx *c = arg;
    uint64_t rng = gt_rng(50);
    uint32_t *dev = NULL, *input = malloc(HF_WORDS * 4);
    unsigned n = HF_WORDS;
    weft_runtime *rt = weft_runtime_current();

    if (!GT_CHECK(input != NULL, "malloc") ||
        !GT_OK(weft_host_alloc(rt, (void **)&c->pinned, HF_WORDS * 4)) ||
        !GT_OK(weft_malloc_async((void **)&dev, HF_WORDS * 4)))
        goto out;
    gt_fill(&rng, input, HF_WORDS * 4);
    memcpy(c->pinned, input, HF_WORDS * 4);
    for (unsigned r = 0; r < HF_ROUNDS; r++) {
        uint32_t a = gt_u32(&rng) | 1, b = gt_u32(&rng);
        void *args[] = {&dev, &dev, &n, &a, &b};
        for (unsigned i = 0; i < HF_WORDS; i++)
            c->expect[r][i] = gk_affine_ref(input[i], a, b);
        gt_fill(&rng, c->next[r], HF_WORDS * 4);
        memcpy(input, c->next[r], HF_WORDS * 4);
        c->rounds[r] = (hf_round){c, r};
        if (!GT_OK(weft_memcpy_async(dev, c->pinned, HF_WORDS * 4)) ||
            !GT_OK(weft_launch(gk_affine(), dim(8, 1, 1), dim(256, 1, 1), 0, args)) ||
            !GT_OK(weft_memcpy_async(c->pinned, dev, HF_WORDS * 4)) ||
            !GT_OK(weft_host_async(hf_fn, &c->rounds[r])))
            goto out;
    }
    GT_OK(weft_await());
    unsigned logged = atomic_load(&c->nlog), wrong = atomic_load(&c->wrong);
    if (GT_CHECK(logged == HF_ROUNDS, "%u of %u host functions ran", logged, HF_ROUNDS) &&
        GT_CHECK(wrong == 0, "the host function of round %u saw P before its copy finished",
                 wrong - 1)) {
        for (unsigned r = 0; r < HF_ROUNDS; r++)
            if (!GT_CHECK(c->log[r] == r, "host functions ran out of order: #%u was round %u", r,
                          c->log[r]))
                break;
        GT_CHECK(memcmp(c->pinned, c->next[HF_ROUNDS - 1], HF_WORDS * 4) == 0,
                 "the last host function's write is not in P after the await");
    }
out:
    GT_OK(weft_free_async(dev));
    GT_OK(weft_await());
    if (c->pinned)
        GT_OK(weft_host_free(rt, c->pinned));
    free(input);
    return NULL;
}

/* weft_host_async runs in stream order with copies and kernels: after what
 * was enqueued before it, before what was enqueued after it, and host
 * functions in the order enqueued. */
static void test_host_async_runs_in_stream_order(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    hf_ctx *c = gt_xmalloc(sizeof *c);

    (void)state;
    memset(c, 0, sizeof *c);
    c->expect = gt_xmalloc(sizeof *c->expect * HF_ROUNDS);
    c->next = gt_xmalloc(sizeof *c->next * HF_ROUNDS);
    atomic_init(&c->nlog, 0);
    atomic_init(&c->wrong, 0);
    gt_run(rt, host_fn_main, c);
    gt_runtime_destroy(rt);
    free(c->expect);
    free(c->next);
    free(c);
}

/* ---- the task's own stream --------------------------------------------- */

enum { OWN_WORDS = 50000 };
#define OWN_SPIN_NS 20000000ull /* 20 ms */

typedef struct own_ctx {
    uint32_t *in_h, *in_d;   /* mapped */
    uint32_t *out_h, *out_d; /* mapped */
} own_ctx;

static void *own_stream_main(void *arg)
{
    own_ctx *c = arg;
    uint64_t rng = gt_rng(60);
    uint32_t a = gt_u32(&rng) | 1, b = gt_u32(&rng), a2 = gt_u32(&rng) | 1, b2 = gt_u32(&rng);
    void *s = NULL, *s2 = NULL;
    uint32_t *dev = NULL, *back = malloc((OWN_WORDS + GUARD) * 4);
    int e, ordinal;

    if (!GT_CHECK(back != NULL, "malloc"))
        return NULL;
    gt_fill(&rng, c->in_h, OWN_WORDS * 4);
    memset(c->out_h, GT_POISON, (OWN_WORDS + GUARD) * 4);
    memset(back, GT_POISON, (OWN_WORDS + GUARD) * 4);

    /* first call leases the stream; the next returns the same one */
    if (!GT_OK(weft_stream(&s)) || !GT_CHECK(s != NULL, "weft_stream gave NULL") ||
        !GT_OK(weft_stream(&s2)) || !GT_CHECK(s == s2, "two streams in one lease"))
        goto out;
    ordinal = gk_stream_device(s);
    if (!GT_CHECK(ordinal >= 0 && ordinal < (int)weft_device_count(weft_runtime_current()),
                  "the stream's device is %d", ordinal))
        goto out;

    /* 1: only our own <<<>>> launch is on the stream; weft_await covers it */
    e = gk_launch_spin_affine_on(s, c->out_d, c->in_d, OWN_WORDS, a, b, OWN_SPIN_NS);
    if (!GT_CHECK(e == 0, "<<<>>> on the weft stream: %s", gk_error_name(e)) ||
        !GT_OK(weft_await()))
        goto out;
    for (unsigned i = 0; i < OWN_WORDS; i++)
        if (!GT_CHECK(c->out_h[i] == gk_affine_ref(c->in_h[i], a, b),
                      "weft_await returned before our own kernel finished: word %u is %08x", i,
                      c->out_h[i]))
            goto out;
    GT_CHECK(gt_first_not(c->out_h + OWN_WORDS, GT_POISON, GUARD * 4) == GUARD * 4,
             "own kernel wrote past n");

    /* 2: weft's copies order with our launch: malloc, our kernel into
     * device memory, weft copy out, all on the stream of a new lease */
    if (!GT_OK(weft_malloc_async((void **)&dev, OWN_WORDS * 4)) || !GT_OK(weft_stream(&s)))
        goto out;
    e = gk_launch_spin_affine_on(s, dev, c->in_d, OWN_WORDS, a2, b2, OWN_SPIN_NS);
    if (!GT_CHECK(e == 0, "<<<>>> on the weft stream: %s", gk_error_name(e)) ||
        !GT_OK(weft_memcpy_async(back, dev, OWN_WORDS * 4)) || !GT_OK(weft_await()))
        goto out;
    for (unsigned i = 0; i < OWN_WORDS; i++)
        if (!GT_CHECK(back[i] == gk_affine_ref(c->in_h[i], a2, b2),
                      "a weft copy overtook our own kernel: word %u is %08x", i, back[i]))
            goto out;
out:
    GT_OK(weft_free_async(dev));
    GT_OK(weft_await());
    free(back);
    return NULL;
}

/* weft_stream gives a usable cudaStream_t: a kernel the test launches on
 * it with <<<>>> is ordered with weft's own operations and covered by
 * weft_await. */
static void test_own_launches_on_weft_stream_are_awaited(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    own_ctx c;

    (void)state;
    assert_ok(weft_mapped_alloc(rt, (void **)&c.in_h, (void **)&c.in_d, OWN_WORDS * 4));
    assert_ok(weft_mapped_alloc(rt, (void **)&c.out_h, (void **)&c.out_d, (OWN_WORDS + GUARD) * 4));
    gt_run(rt, own_stream_main, &c);
    assert_ok(weft_mapped_free(rt, c.in_h));
    assert_ok(weft_mapped_free(rt, c.out_h));
    gt_runtime_destroy(rt);
}

/* ---- the await --------------------------------------------------------- */

typedef struct slow_ctx {
    uint32_t *in_h, *in_d, *out_h, *out_d; /* mapped */
    uint32_t a, b;
    atomic_uint awaiting;
    int await_rc;
    bool complete_at_return;
} slow_ctx;

static void slow_ctx_init(weft_runtime *rt, slow_ctx *c, uint64_t stream)
{
    uint64_t rng = gt_rng(stream);

    memset(c, 0, sizeof *c);
    assert_ok(weft_mapped_alloc(rt, (void **)&c->in_h, (void **)&c->in_d, OWN_WORDS * 4));
    assert_ok(weft_mapped_alloc(rt, (void **)&c->out_h, (void **)&c->out_d, OWN_WORDS * 4));
    gt_fill(&rng, c->in_h, OWN_WORDS * 4);
    memset(c->out_h, GT_POISON, OWN_WORDS * 4);
    c->a = gt_u32(&rng) | 1;
    c->b = gt_u32(&rng);
    atomic_init(&c->awaiting, 0);
}

static bool slow_ctx_done(const slow_ctx *c)
{
    for (unsigned i = 0; i < OWN_WORDS; i++)
        if (c->out_h[i] != gk_affine_ref(c->in_h[i], c->a, c->b))
            return false;
    return true;
}

static void slow_ctx_fini(weft_runtime *rt, slow_ctx *c)
{
    assert_ok(weft_mapped_free(rt, c->in_h));
    assert_ok(weft_mapped_free(rt, c->out_h));
}

static bool launch_slow(slow_ctx *c, uint64_t spin_ns)
{
    unsigned n = OWN_WORDS;
    void *args[] = {&c->out_d, &c->in_d, &n, &c->a, &c->b, &spin_ns};

    return GT_OK(
        weft_launch(gk_spin_affine(), dim((n + 255) / 256, 1, 1), dim(256, 1, 1), 0, args));
}

static void *return_in_flight_main(void *arg)
{
    launch_slow(arg, 100000000ull); /* 100 ms, and no await */
    return NULL;
}

/* A task that returns with work in flight is awaited before it ends: right
 * after its join, the work's results are complete. */
static void test_task_returning_with_work_in_flight_is_awaited(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    slow_ctx c;

    (void)state;
    slow_ctx_init(rt, &c, 70);
    gt_run(rt, return_in_flight_main, &c);
    assert_true(slow_ctx_done(&c));
    slow_ctx_fini(rt, &c);
    gt_runtime_destroy(rt);
}

static void *cancelled_await_main(void *arg)
{
    slow_ctx *c = arg;

    if (!launch_slow(c, 300000000ull)) /* 300 ms */
        return NULL;
    atomic_store(&c->awaiting, 1);
    c->await_rc = weft_await();
    c->complete_at_return = slow_ctx_done(c);
    return NULL;
}

/* Cancelling a task inside weft_await does not cut the wait short (the
 * work may point into its stack): the await returns WEFT_ECANCELED only
 * once the work is complete, and the join reports the cancellation. */
static void test_cancel_does_not_cut_an_await_short(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    weft_task *t;
    slow_ctx c;

    (void)state;
    slow_ctx_init(rt, &c, 71);
    assert_ok(weft_spawn(rt, &t, cancelled_await_main, &c, NULL));
    assert_true(gt_wait_for(&c.awaiting, 1, 10));
    gt_sleep_ms(20); /* well inside the 300 ms kernel */
    assert_ok(weft_cancel(t));
    assert_rc(weft_join(t, NULL), WEFT_ETASKCANCELED);
    gt_assert_passed();
    assert_int_equal(c.await_rc, WEFT_ECANCELED);
    assert_true(c.complete_at_return);
    slow_ctx_fini(rt, &c);
    gt_runtime_destroy(rt);
}

/*
 * One worker. Task A launches a kernel that spins until a flag in mapped
 * memory is set (giving up after FLAG_CAP_NS), spawns task B - which sets
 * the flag - and awaits. B can run only on A's worker, so only if A's await
 * suspends A instead of blocking the thread; otherwise the kernel gives up
 * and says so.
 */
#define FLAG_CAP_NS 5000000000ull /* 5 s */

typedef struct flag_ctx {
    uint32_t *flag_h, *flag_d;     /* mapped */
    uint32_t *result_h, *result_d; /* mapped */
    int await_rc;
} flag_ctx;

static void *flag_setter_main(void *arg)
{
    flag_ctx *c = arg;

    __atomic_store_n(c->flag_h, 1u, __ATOMIC_SEQ_CST);
    return NULL;
}

static void *flag_waiter_main(void *arg)
{
    flag_ctx *c = arg;
    uint64_t cap = FLAG_CAP_NS;
    void *args[] = {&c->flag_d, &cap, &c->result_d};
    weft_task *setter;

    if (!GT_OK(weft_launch(gk_wait_flag(), dim(1, 1, 1), dim(1, 1, 1), 0, args)) ||
        !GT_OK(weft_spawn(weft_runtime_current(), &setter, flag_setter_main, c, NULL)))
        return NULL;
    c->await_rc = weft_await();
    GT_OK(weft_join(setter, NULL));
    return NULL;
}

static void test_await_suspends_instead_of_blocking_the_worker(void **state)
{
    weft_runtime *rt = gt_runtime(1);
    flag_ctx c;

    (void)state;
    assert_ok(weft_mapped_alloc(rt, (void **)&c.flag_h, (void **)&c.flag_d, 64));
    assert_ok(weft_mapped_alloc(rt, (void **)&c.result_h, (void **)&c.result_d, 64));
    *c.flag_h = 0;
    *c.result_h = 0;
    c.await_rc = -100;
    gt_run(rt, flag_waiter_main, &c);
    assert_int_equal(c.await_rc, WEFT_OK);
    /* 1: the kernel saw the flag; 2: it gave up, so the worker was blocked */
    assert_int_equal(*c.result_h, 1);
    assert_ok(weft_mapped_free(rt, c.flag_h));
    assert_ok(weft_mapped_free(rt, c.result_h));
    gt_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_async_runs_in_stream_order),
        cmocka_unit_test(test_own_launches_on_weft_stream_are_awaited),
        cmocka_unit_test(test_task_returning_with_work_in_flight_is_awaited),
        cmocka_unit_test(test_cancel_does_not_cut_an_await_short),
        cmocka_unit_test(test_await_suspends_instead_of_blocking_the_worker),
    };
    int skip = gt_start("gpu.stream");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
