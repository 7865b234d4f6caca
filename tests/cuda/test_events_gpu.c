/*
 * test_events.c - waiting on other tasks' GPU work.
 *
 * Events recorded in one task and awaited in others (many at once), from a
 * plain thread, after the recording task has ended, and before any work was
 * enqueued. weft_stream_wait chaining kernels of several tasks on the GPU
 * without the tasks waiting. Joins and when_all over tasks doing GPU work.
 * And an event await that must suspend its task, not block its worker.
 *
 * The work waited for is a kernel that reads its input, spins for a while,
 * then writes (gk_spin_affine): anyone who looks too early sees poison, and
 * anyone who starts too early reads stale input. Results are in mapped
 * memory, so a waiter checks them with plain loads right after its wait.
 */
#include "gpu_support/gpu_test.h"

enum { WORDS = 40000 };
#define SPIN_NS 50000000ull /* 50 ms */

static weft_dim3 dim(unsigned x, unsigned y, unsigned z)
{
    weft_dim3 d = {x, y, z};
    return d;
}

/* Input, output (mapped) and the affine map between them. */
typedef struct work {
    uint32_t *in_h, *in_d, *out_h, *out_d;
    uint32_t a, b;
} work;

static void work_init(weft_runtime *rt, work *w, uint64_t stream)
{
    uint64_t rng = gt_rng(stream);

    assert_ok(weft_mapped_alloc(rt, (void **)&w->in_h, (void **)&w->in_d, WORDS * 4));
    assert_ok(weft_mapped_alloc(rt, (void **)&w->out_h, (void **)&w->out_d, WORDS * 4));
    gt_fill(&rng, w->in_h, WORDS * 4);
    memset(w->out_h, GT_POISON, WORDS * 4);
    w->a = gt_u32(&rng) | 1;
    w->b = gt_u32(&rng);
}

static void work_fini(weft_runtime *rt, work *w)
{
    assert_ok(weft_mapped_free(rt, w->in_h));
    assert_ok(weft_mapped_free(rt, w->out_h));
}

/* Index of the first output word that is not the result, or WORDS. */
static unsigned work_first_wrong(const work *w)
{
    for (unsigned i = 0; i < WORDS; i++)
        if (w->out_h[i] != gk_affine_ref(w->in_h[i], w->a, w->b))
            return i;
    return WORDS;
}

/* In a task: enqueue the slow kernel from in to out. */
static bool work_launch(work *w, uint64_t spin_ns)
{
    unsigned n = WORDS;
    void *args[] = {&w->out_d, &w->in_d, &n, &w->a, &w->b, &spin_ns};

    return GT_OK(
        weft_launch(gk_spin_affine(), dim((n + 255) / 256, 1, 1), dim(256, 1, 1), 0, args));
}

/* ---- one recorder, many waiters ---------------------------------------- */

enum { WAITERS = 64 };

typedef struct fanout {
    work w;
    weft_chan *events; /* the recorder sends the event once per waiter */
    atomic_uint early; /* waiters that saw the result incomplete */
    atomic_uint waited;
} fanout;

static void *recorder_main(void *arg)
{
    fanout *f = arg;
    weft_event *ev = NULL;

    if (!work_launch(&f->w, SPIN_NS) || !GT_OK(weft_event_record(&ev)))
        ev = NULL;
    for (unsigned i = 0; i < WAITERS; i++)
        GT_OK(weft_chan_send(f->events, &ev)); /* NULL tells the waiters it failed */
    GT_OK(weft_await());
    return ev; /* destroyed by the test once every waiter is done */
}

static void *event_waiter_main(void *arg)
{
    fanout *f = arg;
    weft_event *ev = NULL;

    if (!GT_OK(weft_chan_recv(f->events, &ev)) || !GT_CHECK(ev != NULL, "no event recorded"))
        return NULL;
    if (GT_OK(weft_event_await(ev))) {
        atomic_fetch_add(&f->waited, 1);
        if (work_first_wrong(&f->w) != WORDS)
            atomic_fetch_add(&f->early, 1);
    }
    return NULL;
}

/* An event recorded after a 50 ms kernel in one task is awaited by 64
 * other tasks: each wakes only once the kernel's results are all there. */
static void test_tasks_await_another_tasks_event(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    weft_task *rec, *t[WAITERS];
    fanout f;
    void *ev = NULL;

    (void)state;
    work_init(rt, &f.w, 1);
    atomic_init(&f.early, 0);
    atomic_init(&f.waited, 0);
    assert_ok(weft_chan_create(&f.events, sizeof(weft_event *), WAITERS));
    for (unsigned i = 0; i < WAITERS; i++)
        assert_ok(weft_spawn(rt, &t[i], event_waiter_main, &f, NULL));
    assert_ok(weft_spawn(rt, &rec, recorder_main, &f, NULL));
    for (unsigned i = 0; i < WAITERS; i++)
        assert_ok(weft_join(t[i], NULL));
    assert_ok(weft_join(rec, &ev));
    gt_assert_passed();
    assert_int_equal(atomic_load(&f.waited), WAITERS);
    assert_int_equal(atomic_load(&f.early), 0);
    assert_non_null(ev);
    assert_ok(weft_event_destroy(ev));
    assert_ok(weft_chan_destroy(f.events));
    work_fini(rt, &f.w);
    gt_runtime_destroy(rt);
}

/* ---- from a plain thread, and after the task is gone -------------------- */

typedef struct published {
    work w;
    _Atomic(weft_event *) ev;
    atomic_uint failed;
    uint64_t spin_ns;
} published;

static void *publisher_main(void *arg)
{
    published *p = arg;
    weft_event *ev = NULL;

    if (!work_launch(&p->w, p->spin_ns) || !GT_OK(weft_event_record(&ev))) {
        atomic_store(&p->failed, 1);
        return NULL;
    }
    atomic_store(&p->ev, ev); /* and return: the implicit await follows */
    return NULL;
}

static weft_event *wait_published(published *p)
{
    double until = gt_now() + gt_deadline(10);
    weft_event *ev;

    while (!(ev = atomic_load(&p->ev)) && !atomic_load(&p->failed) && gt_now() < until)
        gt_sleep_ms(1);
    return ev;
}

/* A plain thread's weft_event_await blocks until the recorded work is
 * done. The recording task does not wait for anything before it ends. */
static void test_thread_awaits_a_tasks_event(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    weft_task *t;
    published p = {.spin_ns = SPIN_NS * 4};
    weft_event *ev;

    (void)state;
    work_init(rt, &p.w, 2);
    atomic_init(&p.ev, NULL);
    atomic_init(&p.failed, 0);
    assert_ok(weft_spawn(rt, &t, publisher_main, &p, NULL));
    ev = wait_published(&p);
    gt_assert_passed();
    assert_non_null(ev);
    assert_ok(weft_event_await(ev)); /* the kernel spins for 200 ms */
    assert_int_equal(work_first_wrong(&p.w), WORDS);
    assert_ok(weft_join(t, NULL));
    assert_ok(weft_event_await(ev)); /* done events stay done */
    assert_ok(weft_event_destroy(ev));
    work_fini(rt, &p.w);
    gt_runtime_destroy(rt);
}

static void *late_waiter_main(void *arg)
{
    weft_event *ev = arg;

    GT_OK(weft_event_await(ev));
    GT_OK(weft_stream_wait(ev)); /* on the device too: nothing to wait for */
    GT_OK(weft_await());
    return NULL;
}

/* An event outlives the task that recorded it: once that task has been
 * joined, tasks and threads still await it (it is complete). */
static void test_event_outlives_its_task(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    weft_task *t;
    published p = {.spin_ns = SPIN_NS};
    weft_event *ev;

    (void)state;
    work_init(rt, &p.w, 3);
    atomic_init(&p.ev, NULL);
    atomic_init(&p.failed, 0);
    assert_ok(weft_spawn(rt, &t, publisher_main, &p, NULL));
    assert_ok(weft_join(t, NULL));
    ev = atomic_load(&p.ev);
    assert_non_null(ev);
    assert_int_equal(work_first_wrong(&p.w), WORDS); /* the join covered it */
    gt_run(rt, late_waiter_main, ev);
    assert_ok(weft_event_await(ev));
    assert_ok(weft_event_destroy(ev));
    work_fini(rt, &p.w);
    gt_runtime_destroy(rt);
}

static void *empty_event_main(void *arg)
{
    weft_event **out = arg;

    if (GT_OK(weft_event_record(out)) && GT_CHECK(*out != NULL, "NULL event"))
        GT_OK(weft_event_await(*out));
    GT_OK(weft_await());
    return NULL;
}

/* An event recorded before any work marks nothing: it is complete at once,
 * for the task and for a thread. */
static void test_event_of_no_work_is_complete(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    weft_event *ev = NULL;

    (void)state;
    gt_run(rt, empty_event_main, &ev);
    assert_non_null(ev);
    assert_ok(weft_event_await(ev));
    assert_ok(weft_event_destroy(ev));
    gt_runtime_destroy(rt);
}

/* ---- weft_stream_wait --------------------------------------------------- */
/*
 * A chain of tasks over one device buffer: task k receives task k-1's
 * event, makes its stream wait for it, applies its own affine map in place
 * with a kernel that reads, spins, then writes, records its event and
 * passes it on, and awaits only at the end. If any kernel started before
 * its predecessor finished it would read the old words; the result is the
 * composition of all maps, in order, only if every wait held on the GPU.
 * A loader task uploads the input and starts the chain.
 */

enum { CHAIN = 12 };

typedef struct chain {
    uint32_t *dev;
    uint32_t a[CHAIN], b[CHAIN];
    weft_chan *link[CHAIN + 1]; /* link[k] carries the event task k waits for */
    uint32_t *result;           /* the last task copies the buffer here */
} chain;

typedef struct chain_step {
    chain *c;
    unsigned k;
} chain_step;

static void *chain_main(void *arg)
{
    chain_step *st = arg;
    chain *c = st->c;
    unsigned k = st->k, n = WORDS;
    uint64_t spin = 10000000ull; /* 10 ms */
    void *args[] = {&c->dev, &c->dev, &n, &c->a[k], &c->b[k], &spin};
    weft_event *before = NULL, *mine = NULL;

    if (!GT_OK(weft_chan_recv(c->link[k], &before)) || !GT_OK(weft_stream_wait(before)) ||
        !GT_OK(
            weft_launch(gk_spin_affine(), dim((n + 255) / 256, 1, 1), dim(256, 1, 1), 0, args)) ||
        !GT_OK(weft_event_record(&mine)) || !GT_OK(weft_chan_send(c->link[k + 1], &mine))) {
        weft_chan_close(c->link[k + 1]); /* the rest of the chain gives up too */
        return before;
    }
    if (k == CHAIN - 1)
        GT_OK(weft_memcpy_async(c->result, c->dev, WORDS * 4));
    GT_OK(weft_await());
    return before; /* destroyed by the test */
}

typedef struct chain_loader {
    chain *c;
    const uint32_t *in;
} chain_loader;

/* Allocate the buffer, upload the input, hand the event to step 0. */
static void *chain_loader_main(void *arg)
{
    chain_loader *l = arg;
    chain *c = l->c;
    weft_event *ev = NULL;

    if (GT_OK(weft_malloc_async((void **)&c->dev, WORDS * 4)) &&
        GT_OK(weft_memcpy_async(c->dev, l->in, WORDS * 4)) && GT_OK(weft_event_record(&ev)))
        GT_OK(weft_chan_send(c->link[0], &ev));
    else
        weft_chan_close(c->link[0]);
    GT_OK(weft_await());
    return NULL;
}

static void *chain_free_main(void *arg)
{
    chain *c = arg;

    GT_OK(weft_free_async(c->dev));
    GT_OK(weft_await());
    return NULL;
}

static void test_stream_wait_orders_kernels_of_different_tasks(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    uint64_t rng = gt_rng(4);
    uint32_t *in = gt_xmalloc(WORDS * 4), *expect = gt_xmalloc(WORDS * 4);
    weft_task *t[CHAIN], *loader;
    chain_step st[CHAIN];
    chain_loader ld;
    weft_event *evs[CHAIN + 1];
    chain c;

    (void)state;
    c.result = gt_xmalloc(WORDS * 4);
    memset(c.result, GT_POISON, WORDS * 4);
    gt_fill(&rng, in, WORDS * 4);
    memcpy(expect, in, WORDS * 4);
    for (unsigned k = 0; k < CHAIN; k++) {
        c.a[k] = gt_u32(&rng) | 1;
        c.b[k] = gt_u32(&rng);
        for (unsigned i = 0; i < WORDS; i++)
            expect[i] = gk_affine_ref(expect[i], c.a[k], c.b[k]);
    }
    for (unsigned k = 0; k <= CHAIN; k++)
        assert_ok(weft_chan_create(&c.link[k], sizeof(weft_event *), 1));

    /* spawn the chain backwards, so that later steps are ready first */
    for (unsigned k = CHAIN; k-- > 0;) {
        st[k] = (chain_step){&c, k};
        assert_ok(weft_spawn(rt, &t[k], chain_main, &st[k], NULL));
    }
    ld = (chain_loader){&c, in};
    assert_ok(weft_spawn(rt, &loader, chain_loader_main, &ld, NULL));
    assert_ok(weft_join(loader, NULL));
    for (unsigned k = 0; k < CHAIN; k++) {
        void *before = NULL;
        assert_ok(weft_join(t[k], &before));
        evs[k] = before;
    }
    gt_assert_passed();
    assert_ok(weft_chan_recv(c.link[CHAIN], &evs[CHAIN]));
    assert_ok(weft_event_await(evs[CHAIN]));
    for (unsigned i = 0; i < WORDS; i++)
        if (c.result[i] != expect[i])
            fail_msg("word %u after the chain is %08x, expected %08x: a kernel did not wait for "
                     "its predecessor",
                     i, c.result[i], expect[i]);
    for (unsigned k = 0; k <= CHAIN; k++) {
        assert_non_null(evs[k]);
        assert_ok(weft_event_destroy(evs[k]));
        assert_ok(weft_chan_destroy(c.link[k]));
    }
    gt_run(rt, chain_free_main, &c);
    gt_runtime_destroy(rt);
    free(in);
    free(expect);
    free(c.result);
}

/* ---- joins and groups of GPU tasks -------------------------------------- */

enum { CHILDREN = 24 };

typedef struct child {
    unsigned id;
    uint32_t in[1024], out[1024 + 16];
    uint32_t a, b;
} child;

static void *child_main(void *arg)
{
    child *ch = arg;
    uint32_t *dev = NULL;
    unsigned n = 1024;
    void *args[] = {&dev, &dev, &n, &ch->a, &ch->b};

    if (GT_OK(weft_malloc_async((void **)&dev, sizeof ch->in)) &&
        GT_OK(weft_memcpy_async(dev, ch->in, sizeof ch->in)) &&
        GT_OK(weft_launch(gk_affine(), dim(4, 1, 1), dim(256, 1, 1), 0, args)) &&
        GT_OK(weft_memcpy_async(ch->out, dev, sizeof ch->in)))
        GT_OK(weft_free_async(dev));
    /* no await: the end of the task awaits, and the joiner relies on it */
    return ch;
}

static void *parent_main(void *arg)
{
    child *kids = arg;
    weft_task *t[CHILDREN];
    weft_runtime *rt = weft_runtime_current();

    for (unsigned i = 0; i < CHILDREN; i++)
        if (!GT_OK(weft_spawn(rt, &t[i], child_main, &kids[i], NULL)))
            return NULL;
    if (!GT_OK(weft_when_all(t, CHILDREN)))
        return NULL;
    /* when_all returned: every child's copy-out has landed */
    for (unsigned i = 0; i < CHILDREN; i++) {
        void *res = NULL;
        GT_OK(weft_join(t[i], &res));
        GT_CHECK(res == &kids[i], "join gave the wrong result");
        for (unsigned w = 0; w < 1024; w++)
            if (!GT_CHECK(kids[i].out[w] == gk_affine_ref(kids[i].in[w], kids[i].a, kids[i].b),
                          "child %u word %u not written when when_all returned", i, w))
                break;
        GT_CHECK(gt_first_not(kids[i].out + 1024, GT_POISON, 64) == 64,
                 "child %u wrote past its output", i);
    }
    return NULL;
}

/* A task waits for child tasks that did GPU work with weft_when_all and
 * weft_join: the children's results are complete when those return. */
static void test_when_all_and_join_cover_childrens_gpu_work(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    child *kids = gt_xmalloc(CHILDREN * sizeof *kids);
    uint64_t rng = gt_rng(5);

    (void)state;
    for (unsigned i = 0; i < CHILDREN; i++) {
        kids[i].id = i;
        gt_fill(&rng, kids[i].in, sizeof kids[i].in);
        memset(kids[i].out, GT_POISON, sizeof kids[i].out);
        kids[i].a = gt_u32(&rng) | 1;
        kids[i].b = gt_u32(&rng);
    }
    gt_run(rt, parent_main, kids);
    gt_runtime_destroy(rt);
    free(kids);
}

/* ---- an event await suspends ------------------------------------------- */
/*
 * One worker. Task A launches a kernel that spins until a flag in mapped
 * memory is set (or gives up after 5 s), records an event, spawns W and
 * awaits. W spawns S - which sets the flag - and awaits A's event. S can
 * only run if W's event await suspended W and freed the worker.
 */

typedef struct suspend_ctx {
    uint32_t *flag_h, *flag_d, *result_h, *result_d; /* mapped */
    weft_event *ev;
    int event_rc;
} suspend_ctx;

static void *setter_main(void *arg)
{
    suspend_ctx *c = arg;

    __atomic_store_n(c->flag_h, 1u, __ATOMIC_SEQ_CST);
    return NULL;
}

static void *event_awaiter_main(void *arg)
{
    suspend_ctx *c = arg;
    weft_task *s;

    if (!GT_OK(weft_spawn(weft_runtime_current(), &s, setter_main, c, NULL)))
        return NULL;
    c->event_rc = weft_event_await(c->ev);
    GT_OK(weft_join(s, NULL));
    return NULL;
}

static void *flag_kernel_main(void *arg)
{
    suspend_ctx *c = arg;
    uint64_t cap = 5000000000ull;
    void *args[] = {&c->flag_d, &cap, &c->result_d};
    weft_task *w;

    if (!GT_OK(weft_launch(gk_wait_flag(), dim(1, 1, 1), dim(1, 1, 1), 0, args)) ||
        !GT_OK(weft_event_record(&c->ev)) ||
        !GT_OK(weft_spawn(weft_runtime_current(), &w, event_awaiter_main, c, NULL)))
        return NULL;
    GT_OK(weft_await());
    GT_OK(weft_join(w, NULL));
    return NULL;
}

static void test_event_await_suspends_instead_of_blocking_the_worker(void **state)
{
    weft_runtime *rt = gt_runtime(1);
    suspend_ctx c;

    (void)state;
    memset(&c, 0, sizeof c);
    c.event_rc = -100;
    assert_ok(weft_mapped_alloc(rt, (void **)&c.flag_h, (void **)&c.flag_d, 64));
    assert_ok(weft_mapped_alloc(rt, (void **)&c.result_h, (void **)&c.result_d, 64));
    *c.flag_h = 0;
    *c.result_h = 0;
    gt_run(rt, flag_kernel_main, &c);
    assert_int_equal(c.event_rc, WEFT_OK);
    assert_int_equal(*c.result_h, 1); /* 2: the kernel gave up waiting */
    assert_ok(weft_event_destroy(c.ev));
    assert_ok(weft_mapped_free(rt, c.flag_h));
    assert_ok(weft_mapped_free(rt, c.result_h));
    gt_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tasks_await_another_tasks_event),
        cmocka_unit_test(test_thread_awaits_a_tasks_event),
        cmocka_unit_test(test_event_outlives_its_task),
        cmocka_unit_test(test_event_of_no_work_is_complete),
        cmocka_unit_test(test_stream_wait_orders_kernels_of_different_tasks),
        cmocka_unit_test(test_when_all_and_join_cover_childrens_gpu_work),
        cmocka_unit_test(test_event_await_suspends_instead_of_blocking_the_worker),
    };
    int skip = gt_start("gpu.events");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
