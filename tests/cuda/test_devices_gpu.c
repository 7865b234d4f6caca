/*
 * test_devices.c - several GPUs in one runtime: tasks run where their spawn
 * options put them, unpinned tasks spread over the least loaded GPUs, and
 * one GPU's task can wait for another GPU's work and copy its results.
 *
 * Needs two GPUs or more; with fewer it says so and exits 77 (skipped).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_support/gpu_kernels.h"
#include "gpu_support/gpu_test.h"
#include "weft.h"

enum { N = 1 << 16 };

static weft_dim3 dim(unsigned x, unsigned y, unsigned z)
{
    weft_dim3 d = {x, y, z};
    return d;
}

/* ---- pinned placement --------------------------------------------------- */

typedef struct pinned_job {
    unsigned device;
    unsigned seed;
} pinned_job;

/* affine on random data on the task's GPU; checks where it ran. */
static void *pinned_main(void *arg)
{
    pinned_job *j = arg;
    uint64_t rng = gt_rng(j->seed);
    uint32_t *in = gt_xmalloc(N * sizeof *in), *out = gt_xmalloc(N * sizeof *out);
    uint32_t *d = NULL, a = gt_u32(&rng) | 1, b = gt_u32(&rng);
    void *stream = NULL, *alias = NULL;
    unsigned n = N;

    gt_fill(&rng, in, N * sizeof *in);
    memset(out, GT_POISON, N * sizeof *out);
    if (!GT_OK(weft_stream(&stream)))
        goto out;
    GT_CHECK(gk_stream_device(stream) == (int)j->device, "task for GPU %u got a stream of GPU %d",
             j->device, gk_stream_device(stream));
    if (!GT_OK(weft_malloc_async((void **)&d, N * sizeof *d)))
        goto out;
    GT_CHECK(gk_pointer_kind(d, &alias) == GK_MEM_DEVICE, "weft_malloc_async gave no device memory");
    void *args[] = {&d, &d, &n, &a, &b};
    if (!GT_OK(weft_memcpy_async(d, in, N * sizeof *in)) ||
        !GT_OK(weft_launch(gk_affine(), dim(64, 1, 1), dim(256, 1, 1), 0, args)) ||
        !GT_OK(weft_memcpy_async(out, d, N * sizeof *out)) || !GT_OK(weft_await()))
        goto out;
    for (unsigned i = 0; i < N; i++)
        if (!GT_CHECK(out[i] == gk_affine_ref(in[i], a, b), "GPU %u: out[%u] wrong", j->device, i))
            break;
out:
    if (d)
        GT_OK(weft_free_async(d));
    GT_OK(weft_await());
    free(in);
    free(out);
    return NULL;
}

static void test_tasks_run_on_the_gpu_their_options_name(void **state)
{
    weft_runtime *rt = *state;
    unsigned ngpu = weft_device_count(rt);
    enum { PER = 8 };
    weft_task *t[16 * PER];
    pinned_job jobs[16 * PER];
    unsigned n = 0;

    for (unsigned g = 0; g < ngpu && g < 16; g++)
        for (unsigned k = 0; k < PER; k++, n++) {
            weft_task_opts o = {.device = WEFT_DEVICE(g)};
            jobs[n] = (pinned_job){g, (unsigned)gt_u32(&(uint64_t){gt_rng(n)})};
            assert_int_equal(weft_spawn(rt, &t[n], pinned_main, &jobs[n], &o), WEFT_OK);
        }
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
    gt_assert_passed();
}

/* ---- least-loaded placement --------------------------------------------- */

static atomic_uint leased, placed[16];
static weft_sem *release;

/* Lease a stream, note its GPU, and hold the lease until released. */
static void *hold_main(void *arg)
{
    void *stream = NULL;
    (void)arg;
    if (GT_OK(weft_stream(&stream))) {
        int g = gk_stream_device(stream);
        if (GT_CHECK(g >= 0 && g < 16, "stream of unknown GPU %d", g))
            atomic_fetch_add(&placed[g], 1);
    }
    atomic_fetch_add(&leased, 1);
    GT_OK(weft_sem_wait(release));
    return NULL;
}

static void test_unpinned_tasks_spread_over_the_gpus(void **state)
{
    weft_runtime *rt = *state;
    unsigned ngpu = weft_device_count(rt), n = 8 * ngpu;
    weft_task **t = gt_xmalloc(n * sizeof *t);

    atomic_store(&leased, 0);
    for (unsigned g = 0; g < 16; g++)
        atomic_store(&placed[g], 0);
    assert_int_equal(weft_sem_create(&release, 0), WEFT_OK);
    /* one at a time, so each sees the loads the previous ones left */
    for (unsigned i = 0; i < n; i++) {
        assert_int_equal(weft_spawn(rt, &t[i], hold_main, NULL, NULL), WEFT_OK);
        assert_true(gt_wait_for(&leased, i + 1, 10));
    }
    for (unsigned g = 0; g < ngpu && g < 16; g++)
        assert_int_equal(atomic_load(&placed[g]), 8); /* least loaded: even */
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(weft_sem_post(release), WEFT_OK);
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
    assert_int_equal(weft_sem_destroy(release), WEFT_OK);
    free(t);
    gt_assert_passed();
}

/* ---- work across GPUs --------------------------------------------------- */

static struct {
    uint32_t *made;      /* on GPU 0 */
    weft_event *ready;   /* after made is written */
    weft_chan *handoff;  /* carries ready from producer to consumer */
    uint32_t a, b;
} across;

static void *producer_main(void *arg)
{
    uint32_t *in = arg;
    unsigned n = N;
    void *args[] = {&across.made, &across.made, &n, &across.a, &across.b};
    if (GT_OK(weft_malloc_async((void **)&across.made, N * sizeof *in)) &&
        GT_OK(weft_memcpy_async(across.made, in, N * sizeof *in)) &&
        GT_OK(weft_launch(gk_affine(), dim(64, 1, 1), dim(256, 1, 1), 0, args)) &&
        GT_OK(weft_event_record(&across.ready)))
        GT_OK(weft_chan_send(across.handoff, &across.ready));
    return NULL; /* returning awaits the work */
}

static void *consumer_main(void *arg)
{
    uint32_t *out = arg, *mine = NULL;
    weft_event *ready;
    if (!GT_OK(weft_chan_recv(across.handoff, &ready)) || !GT_OK(weft_stream_wait(ready)) ||
        !GT_OK(weft_malloc_async((void **)&mine, N * sizeof *out)) ||
        !GT_OK(weft_memcpy_async(mine, across.made, N * sizeof *out)) || /* GPU 0 to GPU 1 */
        !GT_OK(weft_memcpy_async(out, mine, N * sizeof *out)))
        return NULL;
    GT_OK(weft_free_async(mine));
    GT_OK(weft_await());
    return NULL;
}

static void test_a_gpu_waits_for_and_copies_another_gpus_work(void **state)
{
    weft_runtime *rt = *state;
    uint64_t rng = gt_rng(7);
    uint32_t *in = gt_xmalloc(N * sizeof *in), *out = gt_xmalloc(N * sizeof *out);
    weft_task_opts on0 = {.device = WEFT_DEVICE(0)}, on1 = {.device = WEFT_DEVICE(1)};
    weft_task *p, *c;

    gt_fill(&rng, in, N * sizeof *in);
    memset(out, GT_POISON, N * sizeof *out);
    across.a = gt_u32(&rng) | 1;
    across.b = gt_u32(&rng);
    assert_int_equal(weft_chan_create(&across.handoff, sizeof(weft_event *), 1), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &c, consumer_main, out, &on1), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &p, producer_main, in, &on0), WEFT_OK);
    assert_int_equal(weft_join(c, NULL), WEFT_OK);
    assert_int_equal(weft_join(p, NULL), WEFT_OK);
    gt_assert_passed();
    for (unsigned i = 0; i < N; i++)
        if (out[i] != gk_affine_ref(in[i], across.a, across.b))
            fail_msg("out[%u] = %u, expected %u", i, out[i], gk_affine_ref(in[i], across.a, across.b));
    assert_int_equal(weft_event_destroy(across.ready), WEFT_OK);
    assert_int_equal(weft_chan_destroy(across.handoff), WEFT_OK);
    free(in);
    free(out);
}

static int setup(void **state)
{
    *state = gt_runtime(4);
    return 0;
}

static int teardown(void **state)
{
    gt_runtime_destroy(*state);
    return 0;
}

int main(void)
{
    int skip = gt_start("gpu.devices");
    if (skip)
        return skip;
    /* Count through weft, so that weft sets up CUDA first. */
    weft_config cfg = {.backend = WEFT_BACKEND_CUDA};
    weft_runtime *rt;
    unsigned ngpu = 0;
    if (weft_runtime_create(&rt, &cfg) == WEFT_OK) {
        ngpu = weft_device_count(rt);
        weft_runtime_destroy(rt);
    }
    if (ngpu < 2) {
        printf("SKIPPED: %u GPU, this test needs two or more\n", ngpu);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tasks_run_on_the_gpu_their_options_name),
        cmocka_unit_test(test_unpinned_tasks_spread_over_the_gpus),
        cmocka_unit_test(test_a_gpu_waits_for_and_copies_another_gpus_work),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
