/*
 * test_load.c - many tasks on one GPU at once.
 *
 * 4000 tasks held at a start gate, then released together so that every
 * stream of the pool is busy and leases are shared: each copies its input
 * in, runs two kernels, copies out, awaits and checks every word. The same
 * spawned from inside a task. 20,000 lighter tasks sharing one device
 * buffer. And priorities: a high-priority task spawned behind a flood of
 * normal ones that fill the GPU gets its work done, exactly, before the
 * flood is over.
 *
 * The priority test checks an order of events with wide margins (the flood
 * lasts about a second, the high-priority task's work a few milliseconds),
 * not a speed; under compute-sanitizer only its correctness is checked.
 */
#include "gpu_support/gpu_test.h"

enum { GUARD = 16, MAX_WORDS = 4096 };

static weft_dim3 dim(unsigned x, unsigned y, unsigned z)
{
    weft_dim3 d = {x, y, z};
    return d;
}

/* ---- copy in, two kernels, copy out ------------------------------------ */

typedef struct pipeline {
    weft_sem *start;
    atomic_uint passed;
} pipeline;

typedef struct job {
    pipeline *p;
    unsigned id;
} job;

static void *job_main(void *arg)
{
    job *j = arg;
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(10000 + j->id);
    unsigned n = (unsigned)gt_between(&rng, 1, MAX_WORDS);
    unsigned blocks = (unsigned)gt_between(&rng, 1, (n + 127) / 128);
    uint32_t a = gt_u32(&rng) | 1, b = gt_u32(&rng), c = gt_u32(&rng);
    bool pinned = j->id % 2 == 0; /* half from weft's pinned pool, half pageable */
    size_t in_bytes = (size_t)n * 4, out_bytes = (size_t)(n + GUARD) * 4;
    uint32_t *in = NULL, *out = NULL, *dx = NULL, *dy = NULL;
    void *affine_args[] = {&dy, &dx, &n, &a, &b};
    void *scramble_args[] = {&dy, &dy, &n, &c};

    if (pinned) {
        if (!GT_OK(weft_host_alloc(rt, (void **)&in, in_bytes)) ||
            !GT_OK(weft_host_alloc(rt, (void **)&out, out_bytes)))
            goto out;
    } else if (!GT_CHECK((in = malloc(in_bytes)) && (out = malloc(out_bytes)), "malloc")) {
        goto out;
    }
    gt_fill(&rng, in, in_bytes);
    memset(out, GT_POISON, out_bytes);
    if (j->p->start && !GT_OK(weft_sem_wait(j->p->start)))
        goto out;

    if (!GT_OK(weft_malloc_async((void **)&dx, in_bytes)) ||
        !GT_OK(weft_malloc_async((void **)&dy, in_bytes)) ||
        !GT_OK(weft_memset_async(dy, GT_POISON, in_bytes)) ||
        !GT_OK(weft_memcpy_async(dx, in, in_bytes)) ||
        !GT_OK(weft_launch(gk_affine(), dim(blocks, 1, 1), dim(128, 1, 1), 0, affine_args)) ||
        !GT_OK(weft_launch(gk_scramble(), dim(blocks, 1, 1), dim(128, 1, 1), 0, scramble_args)) ||
        !GT_OK(weft_memcpy_async(out, dy, in_bytes)) || !GT_OK(weft_free_async(dx)) ||
        !GT_OK(weft_free_async(dy)))
        goto out;
    dx = dy = NULL;
    if (!GT_OK(weft_await()))
        goto out;
    for (unsigned i = 0; i < n; i++) {
        uint32_t want = gk_scramble_ref(gk_affine_ref(in[i], a, b), i, c);
        if (!GT_CHECK(out[i] == want, "job %u (%u words): word %u is %08x, expected %08x", j->id, n,
                      i, out[i], want))
            goto out;
    }
    if (GT_CHECK(gt_first_not(out + n, GT_POISON, GUARD * 4) == GUARD * 4,
                 "job %u: written past its %u words", j->id, n))
        atomic_fetch_add(&j->p->passed, 1);
out:
    if (dx)
        GT_OK(weft_free_async(dx));
    if (dy)
        GT_OK(weft_free_async(dy));
    GT_OK(weft_await());
    if (pinned) {
        if (in)
            GT_OK(weft_host_free(rt, in));
        if (out)
            GT_OK(weft_host_free(rt, out));
    } else {
        free(in);
        free(out);
    }
    return NULL;
}

/* 4000 tasks wait at a gate, then all at once: copy in, two kernels, copy
 * out, await, verify. */
static void test_4000_tasks_copy_in_two_kernels_copy_out(void **state)
{
    unsigned n = gt_scale(4000);
    weft_runtime *rt = gt_runtime(0);
    weft_task_opts opts = {.stack_size = 64 << 10};
    weft_task **t = gt_xmalloc(n * sizeof *t);
    job *jobs = gt_xmalloc(n * sizeof *jobs);
    pipeline p;

    (void)state;
    atomic_init(&p.passed, 0);
    assert_ok(weft_sem_create(&p.start, 0));
    for (unsigned i = 0; i < n; i++) {
        jobs[i] = (job){&p, i};
        assert_ok(weft_spawn(rt, &t[i], job_main, &jobs[i], &opts));
    }
    for (unsigned i = 0; i < n; i++) /* go */
        assert_ok(weft_sem_post(p.start));
    for (unsigned i = 0; i < n; i++)
        assert_ok(weft_join(t[i], NULL));
    gt_assert_passed();
    assert_int_equal(atomic_load(&p.passed), n);
    assert_ok(weft_sem_destroy(p.start));
    gt_runtime_destroy(rt);
    free(t);
    free(jobs);
}

typedef struct spawner {
    unsigned n;
    job *jobs;
} spawner;

static void *spawner_main(void *arg)
{
    spawner *s = arg;
    weft_runtime *rt = weft_runtime_current();
    weft_task_opts opts = {.stack_size = 64 << 10};
    weft_task **t = malloc(s->n * sizeof *t);
    unsigned spawned = 0;

    if (!GT_CHECK(t != NULL, "malloc"))
        return NULL;
    for (; spawned < s->n; spawned++)
        if (!GT_OK(weft_spawn(rt, &t[spawned], job_main, &s->jobs[spawned], &opts)))
            break;
    GT_OK(weft_when_all(t, spawned));
    for (unsigned i = 0; i < spawned; i++)
        GT_OK(weft_join(t[i], NULL));
    free(t);
    return NULL;
}

/* The same jobs spawned from inside a task (into its worker's queue, from
 * which the others steal), without a gate. */
static void test_4000_tasks_spawned_from_a_task(void **state)
{
    unsigned n = gt_scale(4000);
    weft_runtime *rt = gt_runtime(0);
    job *jobs = gt_xmalloc(n * sizeof *jobs);
    pipeline p = {NULL, 0};
    spawner s = {n, jobs};

    (void)state;
    atomic_init(&p.passed, 0);
    for (unsigned i = 0; i < n; i++)
        jobs[i] = (job){&p, 100000 + i};
    gt_run(rt, spawner_main, &s);
    assert_int_equal(atomic_load(&p.passed), n);
    gt_runtime_destroy(rt);
    free(jobs);
}

/* ---- 20,000 light tasks ------------------------------------------------- */

enum { SLOT_WORDS = 64 };

typedef struct light {
    unsigned n;
    uint32_t *dev;     /* SLOT_WORDS words per task */
    uint32_t *results; /* the same, on the host */
    atomic_uint passed;
} light;

typedef struct light_job {
    light *l;
    unsigned id;
} light_job;

static void *light_main(void *arg)
{
    light_job *j = arg;
    uint32_t *slot = j->l->dev + (size_t)j->id * SLOT_WORDS;
    uint32_t *res = j->l->results + (size_t)j->id * SLOT_WORDS;
    uint32_t a = j->id * 2 + 1, b = ~j->id;
    unsigned n = SLOT_WORDS;
    void *args[] = {&slot, &slot, &n, &a, &b};
    unsigned char byte = (unsigned char)(j->id * 13 + 5);

    if (!GT_OK(weft_memset_async(slot, byte, SLOT_WORDS * 4)) ||
        !GT_OK(weft_launch(gk_affine(), dim(1, 1, 1), dim(SLOT_WORDS, 1, 1), 0, args)) ||
        !GT_OK(weft_memcpy_async(res, slot, SLOT_WORDS * 4)) || !GT_OK(weft_await()))
        return NULL;
    uint32_t word = byte * 0x01010101u, want = gk_affine_ref(word, a, b);
    for (unsigned i = 0; i < SLOT_WORDS; i++)
        if (!GT_CHECK(res[i] == want, "light task %u: word %u is %08x, expected %08x", j->id, i,
                      res[i], want))
            return NULL;
    atomic_fetch_add(&j->l->passed, 1);
    return NULL;
}

static void *light_alloc_main(void *arg)
{
    light *l = arg;

    GT_OK(weft_malloc_async((void **)&l->dev, (size_t)l->n * SLOT_WORDS * 4));
    GT_OK(weft_await());
    return NULL;
}

static void *light_free_main(void *arg)
{
    light *l = arg;

    GT_OK(weft_free_async(l->dev));
    GT_OK(weft_await());
    return NULL;
}

/* 20,000 tasks each fill their slot of one shared device buffer, run a
 * one-block kernel on it and copy it back: far more tasks than streams. */
static void test_20000_light_tasks_share_the_streams(void **state)
{
    unsigned n = gt_scale(20000);
    weft_runtime *rt = gt_runtime(0);
    weft_task_opts opts = {.stack_size = 32 << 10};
    weft_task **t = gt_xmalloc(n * sizeof *t);
    light_job *jobs = gt_xmalloc(n * sizeof *jobs);
    light l;

    (void)state;
    atomic_init(&l.passed, 0);
    l.n = n;
    gt_run(rt, light_alloc_main, &l);
    l.results = gt_xmalloc((size_t)n * SLOT_WORDS * 4);
    memset(l.results, GT_POISON, (size_t)n * SLOT_WORDS * 4);
    for (unsigned i = 0; i < n; i++) {
        jobs[i] = (light_job){&l, i};
        assert_ok(weft_spawn(rt, &t[i], light_main, &jobs[i], &opts));
    }
    for (unsigned i = 0; i < n; i++)
        assert_ok(weft_join(t[i], NULL));
    gt_assert_passed();
    assert_int_equal(atomic_load(&l.passed), n);
    gt_run(rt, light_free_main, &l);
    gt_runtime_destroy(rt);
    free(l.results);
    free(t);
    free(jobs);
}

/* ---- priorities -------------------------------------------------------- */
/*
 * Two workers. Flood A: normal tasks each launch a kernel that fills every
 * SM for FLOOD_SPIN_NS and await it; once all of A is enqueued the GPU has
 * FLOOD_A * FLOOD_SPIN_NS of work queued. Then flood B (normal tasks that
 * first spend FLOOD_B_CPU_NS of CPU, then do the same) and, right behind
 * it, one high-priority task with a copy-in, two kernels, copy-out
 * pipeline. Checked: the high task's results are exact; it ran before most
 * of flood B (it was ready later but ranks first); and its await returned
 * before the flood's last kernel finished (its GPU work did not queue
 * behind the whole flood).
 */

enum { FLOOD_A = 200, FLOOD_B = 300, FLOOD_THREADS = 256 };
#define FLOOD_SPIN_NS 2000000ull /* 2 ms per kernel, every SM busy */
#define FLOOD_B_CPU_NS 300000ull /* 0.3 ms of host work first */

typedef struct flood {
    unsigned blocks;
    atomic_uint enqueued, started_b, done;
    unsigned started_b_at_high, done_at_high, total;
} flood;

typedef struct flood_job {
    flood *f;
    bool phase_b;
} flood_job;

static void spin_cpu_ns(uint64_t ns)
{
    double until = gt_now() + (double)ns * 1e-9;

    while (gt_now() < until)
        ;
}

static void *flood_main(void *arg)
{
    flood_job *fj = arg;
    flood *f = fj->f;
    uint64_t spin = FLOOD_SPIN_NS;
    uint32_t *none = NULL;
    void *args[] = {&spin, &none};

    if (fj->phase_b) {
        atomic_fetch_add(&f->started_b, 1);
        spin_cpu_ns(FLOOD_B_CPU_NS);
    }
    if (GT_OK(weft_launch(gk_busy(), dim(f->blocks, 1, 1), dim(FLOOD_THREADS, 1, 1), 0, args)))
        atomic_fetch_add(&f->enqueued, 1);
    GT_OK(weft_await());
    atomic_fetch_add(&f->done, 1);
    return NULL;
}

static void *flood_setup_main(void *arg)
{
    flood *f = arg;
    void *s;

    /* the context exists once weft has a stream */
    if (GT_OK(weft_stream(&s)))
        f->blocks = gk_busy_blocks_to_fill(FLOOD_THREADS);
    GT_CHECK(f->blocks > 0, "cannot size the flood kernel");
    GT_OK(weft_await());
    return NULL;
}

static void *high_main(void *arg)
{
    flood *f = arg;
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(777);
    unsigned n = 100000;
    uint32_t a = gt_u32(&rng) | 1, b = gt_u32(&rng), c = gt_u32(&rng);
    uint32_t *in = NULL, *out = NULL, *dx = NULL, *dy = NULL;
    void *affine_args[] = {&dy, &dx, &n, &a, &b};
    void *scramble_args[] = {&dy, &dy, &n, &c};

    f->started_b_at_high = atomic_load(&f->started_b);
    /* pinned memory: a pageable copy could hold up the worker */
    if (!GT_OK(weft_host_alloc(rt, (void **)&in, n * 4)) ||
        !GT_OK(weft_host_alloc(rt, (void **)&out, n * 4)))
        goto out;
    gt_fill(&rng, in, n * 4);
    memset(out, GT_POISON, n * 4);
    if (!GT_OK(weft_malloc_async((void **)&dx, n * 4)) ||
        !GT_OK(weft_malloc_async((void **)&dy, n * 4)) ||
        !GT_OK(weft_memcpy_async(dx, in, n * 4)) ||
        !GT_OK(weft_launch(gk_affine(), dim(64, 1, 1), dim(256, 1, 1), 0, affine_args)) ||
        !GT_OK(weft_launch(gk_scramble(), dim(64, 1, 1), dim(256, 1, 1), 0, scramble_args)) ||
        !GT_OK(weft_memcpy_async(out, dy, n * 4)) || !GT_OK(weft_await()))
        goto out;
    f->done_at_high = atomic_load(&f->done);
    for (unsigned i = 0; i < n; i++)
        if (!GT_CHECK(out[i] == gk_scramble_ref(gk_affine_ref(in[i], a, b), i, c),
                      "high-priority task: word %u is %08x", i, out[i]))
            break;
out:
    GT_OK(weft_free_async(dx));
    GT_OK(weft_free_async(dy));
    GT_OK(weft_await());
    if (in)
        GT_OK(weft_host_free(rt, in));
    if (out)
        GT_OK(weft_host_free(rt, out));
    return NULL;
}

static void test_high_priority_task_is_not_stuck_behind_a_flood(void **state)
{
    unsigned na = gt_scale(FLOOD_A), nb = gt_scale(FLOOD_B);
    weft_runtime *rt = gt_runtime(2);
    weft_task_opts high_opts = {.priority = WEFT_PRIO_HIGH, .name = "high"};
    weft_task **t = gt_xmalloc((na + nb) * sizeof *t), *high;
    flood_job *jobs = gt_xmalloc((na + nb) * sizeof *jobs);
    flood f;

    (void)state;
    memset(&f, 0, sizeof f);
    atomic_init(&f.enqueued, 0);
    atomic_init(&f.started_b, 0);
    atomic_init(&f.done, 0);
    f.total = na + nb;
    f.done_at_high = f.total + 1;
    gt_run(rt, flood_setup_main, &f);

    for (unsigned i = 0; i < na; i++) {
        jobs[i] = (flood_job){&f, false};
        assert_ok(weft_spawn(rt, &t[i], flood_main, &jobs[i], NULL));
    }
    assert_true(gt_wait_for(&f.enqueued, na, 30));
    for (unsigned i = na; i < na + nb; i++) {
        jobs[i] = (flood_job){&f, true};
        assert_ok(weft_spawn(rt, &t[i], flood_main, &jobs[i], NULL));
    }
    assert_ok(weft_spawn(rt, &high, high_main, &f, &high_opts));

    assert_ok(weft_join(high, NULL));
    for (unsigned i = 0; i < na + nb; i++)
        assert_ok(weft_join(t[i], NULL));
    gt_assert_passed();
    print_message("priority: the high task started after %u of %u ready normal tasks, and its "
                  "GPU work was done after %u of %u flood kernels\n",
                  f.started_b_at_high, nb, f.done_at_high, f.total);
    if (!gt_sanitizer()) {
        assert_true(f.started_b_at_high < nb / 2);
        assert_true(f.done_at_high < f.total);
    }
    gt_runtime_destroy(rt);
    free(t);
    free(jobs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_4000_tasks_copy_in_two_kernels_copy_out),
        cmocka_unit_test(test_4000_tasks_spawned_from_a_task),
        cmocka_unit_test(test_20000_light_tasks_share_the_streams),
        cmocka_unit_test(test_high_priority_task_is_not_stuck_behind_a_flood),
    };
    int skip = gt_start("gpu.load");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
