/*
 * test_graph.c - graph mode on the GPU: a region replays bit-identical to
 * eager execution, honours new pointers and scalars, re-instantiates when
 * its shape changes, evicts under a small cache bound, serves 1000 tasks
 * sharing one key, and turns every misuse into an error that leaves the
 * runtime working.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "gpu_kernels.h"
#include "gpu_test.h"
#include "weft.h"

enum { N = 1 << 14 };

static weft_dim3 dim(unsigned x, unsigned y, unsigned z)
{
    weft_dim3 d = {x, y, z};
    return d;
}

/* The work of one step: upload, affine, scramble (steps times), download.
 * In a region when key != 0, eagerly otherwise. */
static bool step(uint64_t key, uint32_t *dev, uint32_t *host_in, uint32_t *host_out, uint32_t a,
                 uint32_t b, unsigned scrambles)
{
    unsigned n = N;
    void *affine_args[] = {&dev, &dev, &n, &a, &b};
    void *scramble_args[] = {&dev, &dev, &n, &a};
    if (key && !GT_OK(weft_region_begin(key)))
        return false;
    if (!GT_OK(weft_memcpy_async(dev, host_in, N * sizeof *dev)) ||
        !GT_OK(weft_launch(gk_affine(), dim(32, 1, 1), dim(256, 1, 1), 0, affine_args)))
        return false;
    for (unsigned i = 0; i < scrambles; i++)
        if (!GT_OK(weft_launch(gk_scramble(), dim(32, 1, 1), dim(256, 1, 1), 0, scramble_args)))
            return false;
    if (!GT_OK(weft_memcpy_async(host_out, dev, N * sizeof *dev)))
        return false;
    return !key || GT_OK(weft_region_end());
}

static void reference(const uint32_t *in, uint32_t *out, uint32_t a, uint32_t b,
                      unsigned scrambles)
{
    for (unsigned i = 0; i < N; i++) {
        uint32_t x = gk_affine_ref(in[i], a, b);
        for (unsigned k = 0; k < scrambles; k++)
            x = gk_scramble_ref(x, i, a);
        out[i] = x;
    }
}

typedef struct replay_job {
    unsigned id, rounds;
    uint64_t key;
    bool vary_shape;
} replay_job;

/* Rounds of the region with fresh data, buffers swapped between rounds (so
 * the pointers change), checked against the host and against eager runs. */
static void *replay_main(void *arg)
{
    replay_job *j = arg;
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(j->id);
    uint32_t *in, *out, *eager, *ref = gt_xmalloc(N * sizeof *ref), *dev[2] = {NULL, NULL};
    if (!GT_OK(weft_host_alloc(rt, (void **)&in, N * sizeof *in)) ||
        !GT_OK(weft_host_alloc(rt, (void **)&out, N * sizeof *out)) ||
        !GT_OK(weft_host_alloc(rt, (void **)&eager, N * sizeof *eager)) ||
        !GT_OK(weft_malloc_async((void **)&dev[0], N * sizeof *in)) ||
        !GT_OK(weft_malloc_async((void **)&dev[1], N * sizeof *in)))
        return NULL;
    for (unsigned r = 0; r < j->rounds; r++) {
        uint32_t a = gt_u32(&rng) | 1, b = gt_u32(&rng);
        unsigned scrambles = j->vary_shape ? 1 + r % 3 : 2;
        gt_fill(&rng, in, N * sizeof *in);
        memset(out, GT_POISON, N * sizeof *out);
        memset(eager, GT_POISON, N * sizeof *eager);
        if (!step(j->key, dev[r % 2], in, out, a, b, scrambles) ||
            !step(0, dev[(r + 1) % 2], in, eager, a, b, scrambles) || !GT_OK(weft_await()))
            break;
        reference(in, ref, a, b, scrambles);
        if (!GT_CHECK(memcmp(out, eager, N * sizeof *out) == 0,
                      "task %u round %u: the replay differs from eager execution", j->id, r) ||
            !GT_CHECK(memcmp(out, ref, N * sizeof *out) == 0,
                      "task %u round %u: the replay differs from the host", j->id, r))
            break;
    }
    GT_OK(weft_free_async(dev[0]));
    GT_OK(weft_free_async(dev[1]));
    GT_OK(weft_await());
    weft_host_free(rt, in);
    weft_host_free(rt, out);
    weft_host_free(rt, eager);
    free(ref);
    return NULL;
}

static void run_jobs(weft_runtime *rt, replay_job *jobs, unsigned n)
{
    weft_task **t = gt_xmalloc(n * sizeof *t);
    for (unsigned i = 0; i < n; i++)
        assert_ok(weft_spawn(rt, &t[i], replay_main, &jobs[i], NULL));
    for (unsigned i = 0; i < n; i++)
        assert_ok(weft_join(t[i], NULL));
    free(t);
    gt_assert_passed();
}

static void test_replay_matches_eager_and_follows_new_pointers(void **state)
{
    weft_runtime *rt = gt_runtime(4);
    replay_job job = {.id = 1, .rounds = 20, .key = 42};
    weft_graph_stats st;
    (void)state;
    run_jobs(rt, &job, 1);
    assert_ok(weft_graph_stats_get(rt, &st));
    assert_int_equal(st.launches, 20);
    assert_int_equal(st.instantiations, 1); /* once; then updated in place */
    assert_int_equal(st.updates, 19);
    gt_runtime_destroy(rt);
}

static void test_a_new_shape_instantiates_again(void **state)
{
    weft_runtime *rt = gt_runtime(4);
    replay_job job = {.id = 2, .rounds = 12, .key = 43, .vary_shape = true};
    weft_graph_stats st;
    (void)state;
    run_jobs(rt, &job, 1);
    assert_ok(weft_graph_stats_get(rt, &st));
    assert_int_equal(st.launches, 12);
    assert_int_equal(st.instantiations, 12); /* the shape changes every round */
    assert_int_equal(st.updates, 0);
    gt_runtime_destroy(rt);
}

static void test_a_small_cache_evicts_the_least_recently_used(void **state)
{
    weft_config cfg = {.workers = 1, .backend = WEFT_BACKEND_CUDA, .graph_cache = 2};
    weft_runtime *rt;
    replay_job jobs[3];
    weft_graph_stats st;
    (void)state;
    gt_reset();
    assert_ok(weft_runtime_create(&rt, &cfg));
    for (unsigned i = 0; i < 3; i++) /* three keys, one after another */
        jobs[i] = (replay_job){.id = 10 + i, .rounds = 3, .key = 100 + i};
    for (unsigned i = 0; i < 3; i++)
        run_jobs(rt, &jobs[i], 1);
    assert_ok(weft_graph_stats_get(rt, &st));
    assert_int_equal(st.launches, 9);
    assert_int_equal(st.instantiations, 3);
    assert_int_equal(st.evictions, 1); /* the third key pushed out the first */
    gt_runtime_destroy(rt);
}

static void test_1000_tasks_share_one_key(void **state)
{
    unsigned n = gt_scale(1000);
    weft_runtime *rt = gt_runtime(8);
    replay_job *jobs = gt_xmalloc(n * sizeof *jobs);
    weft_graph_stats st;
    (void)state;
    for (unsigned i = 0; i < n; i++)
        jobs[i] = (replay_job){.id = 100 + i, .rounds = 2, .key = 7};
    run_jobs(rt, jobs, n);
    assert_ok(weft_graph_stats_get(rt, &st));
    assert_int_equal(st.launches, 2 * n);
    assert_true(st.instantiations >= 1 && st.instantiations <= st.launches);
    free(jobs);
    gt_runtime_destroy(rt);
}

/* ---- misuse ------------------------------------------------------------ */

static void *misuse_main(void *arg)
{
    uint32_t *dev = NULL, *cuda_dev = NULL, *host = NULL;
    (void)arg;
    if (!GT_OK(weft_host_alloc(weft_runtime_current(), (void **)&host, 16 * sizeof *host)))
        return NULL;
    /* suspending inside: the call fails, the region is dropped */
    GT_OK(weft_region_begin(9));
    GT_RC(weft_await(), WEFT_ESTATE);
    GT_RC(weft_region_end(), WEFT_ESTATE);
    GT_OK(weft_await());
    /* regions do not nest */
    GT_OK(weft_region_begin(9));
    GT_RC(weft_region_begin(10), WEFT_ESTATE);
    GT_OK(weft_region_end());
    /* allocating inside a region: the stream-ordered allocator works */
    GT_OK(weft_region_begin(11));
    GT_OK(weft_malloc_async((void **)&dev, 4096));
    GT_OK(weft_memset_async(dev, 1, 4096));
    GT_OK(weft_memcpy_async(host, dev, 16 * sizeof *host));
    GT_OK(weft_free_async(dev));
    GT_OK(weft_region_end());
    GT_OK(weft_await());
    GT_CHECK(host[0] == 0x01010101u, "the region's memset did not arrive: %#x", host[0]);
    /* a forbidden call breaks the capture: region_end fails, stream goes on */
    GT_OK(weft_region_begin(12));
    int err = gk_forbidden_during_capture((void **)&cuda_dev);
    GT_CHECK(err != 0, "a plain cudaMalloc was allowed during capture");
    GT_CHECK(weft_region_end() != WEFT_OK, "a broken capture was launched");
    GT_OK(weft_memset_async(host, 0, 16 * sizeof *host));
    GT_OK(weft_await());
    GT_CHECK(host[0] == 0, "the stream is unusable after a broken capture");
    weft_host_free(weft_runtime_current(), host);
    return NULL;
}

static void test_misuse_gets_errors_and_the_runtime_goes_on(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    (void)state;
    gt_run(rt, misuse_main, NULL);
    replay_job job = {.id = 3, .rounds = 3, .key = 44}; /* and graphs still work */
    run_jobs(rt, &job, 1);
    gt_runtime_destroy(rt);
}

int main(void)
{
    int skip = gt_start("gpu.graph");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_matches_eager_and_follows_new_pointers),
        cmocka_unit_test(test_a_new_shape_instantiates_again),
        cmocka_unit_test(test_a_small_cache_evicts_the_least_recently_used),
        cmocka_unit_test(test_1000_tasks_share_one_key),
        cmocka_unit_test(test_misuse_gets_errors_and_the_runtime_goes_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
