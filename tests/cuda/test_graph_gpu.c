/*
 * test_graph.c - graph mode on the GPU: a region replays bit-identical to
 * eager execution, honours new pointers and scalars, replays as it stands
 * without recording (weft_region_replay), re-instantiates when
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

#include "gpu_support/gpu_kernels.h"
#include "gpu_support/gpu_test.h"
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

static void reference(const uint32_t *in, uint32_t *out, uint32_t a, uint32_t b, unsigned scrambles)
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
    weft_stats all;
    assert_ok(weft_stats_get(rt, &all));
    assert_memory_equal(&all.graph, &st, sizeof st); /* the same counters, there too */
    gt_runtime_destroy(rt);
}

/* Recorded once, then replayed as it stands on new contents of the same
 * buffers: each launch computes from what the input holds now, with the
 * recorded scalars; nothing is recorded or updated. A key never recorded
 * replays nothing, and an open region refuses a replay. */
static void *replay_as_is_main(void *arg)
{
    (void)arg;
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(77);
    uint32_t *in, *out, *ref = gt_xmalloc(N * sizeof *ref), *dev = NULL;
    const uint32_t a = gt_u32(&rng) | 1, b = gt_u32(&rng);
    int replayed = -1;
    if (!GT_OK(weft_host_alloc(rt, (void **)&in, N * sizeof *in)) ||
        !GT_OK(weft_host_alloc(rt, (void **)&out, N * sizeof *out)) ||
        !GT_OK(weft_malloc_async((void **)&dev, N * sizeof *dev)))
        return NULL;
    if (GT_OK(weft_region_replay(0x5eed, &replayed)))
        GT_CHECK(replayed == 0, "a key never recorded replayed");
    gt_fill(&rng, in, N * sizeof *in);
    if (!step(0x5eed, dev, in, out, a, b, 2) || !GT_OK(weft_await()))
        return NULL;
    for (unsigned r = 0; r < 10; r++) {
        gt_fill(&rng, in, N * sizeof *in);
        memset(out, GT_POISON, N * sizeof *out);
        if (!GT_OK(weft_region_replay(0x5eed, &replayed)) ||
            !GT_CHECK(replayed == 1, "round %u: no replay", r) || !GT_OK(weft_await()))
            break;
        reference(in, ref, a, b, 2);
        if (!GT_CHECK(memcmp(out, ref, N * sizeof *out) == 0,
                      "round %u: the replay differs from the host", r))
            break;
    }
    if (GT_OK(weft_region_begin(0x5eed))) {
        GT_RC(weft_region_replay(0x5eed, &replayed), WEFT_ESTATE);
        GT_OK(weft_region_end());
    }
    GT_OK(weft_free_async(dev));
    GT_OK(weft_await());
    weft_host_free(rt, in);
    weft_host_free(rt, out);
    free(ref);
    return NULL;
}

static void test_a_replay_runs_the_graph_as_it_stands(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    weft_graph_stats st;
    (void)state;
    gt_run(rt, replay_as_is_main, NULL);
    assert_ok(weft_graph_stats_get(rt, &st));
    assert_int_equal(st.instantiations, 1);
    assert_int_equal(st.launches, 11); /* the recording's and ten replays */
    assert_int_equal(st.updates, 0);
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

/* ---- recording --------------------------------------------------------- */

enum { MIXED_N = 5000, MIXED_ROUNDS = 4 };

typedef struct mixed_sent {
    int8_t a;
    double f;
    uint16_t b;
    int32_t c;
    gk_mixed m;
    int64_t d;
    float e;
} mixed_sent;

/* A region of one launch with arguments of every size and a padded struct,
 * replayed with new scalars each round: the recorded copies of the
 * arguments must reach the kernel intact. */
static void *mixed_main(void *arg)
{
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(77);
    unsigned n = MIXED_N;
    uint32_t *in, *in_d = NULL;
    uint64_t *out, *out_d = NULL;
    gk_echo *echo_d = NULL;
    (void)arg;
    if (!GT_OK(weft_host_alloc(rt, (void **)&in, n * 4)) ||
        !GT_OK(weft_host_alloc(rt, (void **)&out, n * 8)) ||
        !GT_OK(weft_malloc_async((void **)&in_d, n * 4)) ||
        !GT_OK(weft_malloc_async((void **)&out_d, n * 8)) ||
        !GT_OK(weft_malloc_async((void **)&echo_d, sizeof *echo_d)))
        return NULL;
    for (unsigned r = 0; r < MIXED_ROUNDS; r++) {
        int8_t a = (int8_t)gt_u32(&rng);
        double f = gt_double(&rng);
        uint16_t b = (uint16_t)gt_u32(&rng);
        int32_t c = (int32_t)gt_u32(&rng);
        gk_mixed m = {(int8_t)gt_u32(&rng), gt_double(&rng), (int16_t)gt_u32(&rng)};
        int64_t d = (int64_t)gt_rng_next(&rng);
        float e = gt_float(&rng);
        void *args[] = {&a, &f, &b, &in_d, &c, &m, &d, &e, &out_d, &n, &echo_d};
        gt_fill(&rng, in, n * 4);
        memset(out, GT_POISON, n * 8);
        if (!GT_OK(weft_region_begin(500)) || !GT_OK(weft_memcpy_async(in_d, in, n * 4)) ||
            !GT_OK(
                weft_launch(gk_mixed_args(), dim((n + 127) / 128, 1, 1), dim(128, 1, 1), 0, args)))
            return NULL;
        /* the caller's variables change at once: the record holds copies */
        mixed_sent sent = {a, f, b, c, m, d, e};
        a = 0, f = 0, b = 0, c = 0, d = 0, e = 0;
        memset(&m, 0, sizeof m);
        if (!GT_OK(weft_memcpy_async(out, out_d, n * 8)) || !GT_OK(weft_region_end()) ||
            !GT_OK(weft_await()))
            return NULL;
        for (unsigned i = 0; i < n; i++)
            if (!GT_CHECK(out[i] == gk_mixed_ref(in[i], i, sent.a, sent.f, sent.b, sent.c, sent.m,
                                                 sent.d, sent.e),
                          "round %u: out[%u] = %016llx is not what the arguments give", r, i,
                          (unsigned long long)out[i]))
                return NULL;
    }
    GT_OK(weft_free_async(in_d));
    GT_OK(weft_free_async(out_d));
    GT_OK(weft_free_async(echo_d));
    GT_OK(weft_await());
    weft_host_free(rt, in);
    weft_host_free(rt, out);
    return NULL;
}

static void test_recorded_arguments_arrive_intact(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    weft_graph_stats st;
    (void)state;
    gt_run(rt, mixed_main, NULL);
    assert_ok(weft_graph_stats_get(rt, &st));
    assert_int_equal(st.launches, MIXED_ROUNDS);
    assert_int_equal(st.instantiations, 1);
    assert_int_equal(st.hits, MIXED_ROUNDS - 1); /* replayed, never captured again */
    assert_int_equal(st.updates, MIXED_ROUNDS - 1);
    gt_runtime_destroy(rt);
}

/* A region that starts recorded and goes on with the caller's own kernel on
 * the raw stream: what was recorded runs first, in order. */
static void *raw_main(void *arg)
{
    weft_runtime *rt = weft_runtime_current();
    uint64_t rng = gt_rng(78);
    uint32_t *in, *out, *dev = NULL, *tmp = NULL;
    unsigned n = N;
    (void)arg;
    if (!GT_OK(weft_host_alloc(rt, (void **)&in, N * 4)) ||
        !GT_OK(weft_host_alloc(rt, (void **)&out, N * 4)) ||
        !GT_OK(weft_malloc_async((void **)&dev, N * 4)) ||
        !GT_OK(weft_malloc_async((void **)&tmp, N * 4)))
        return NULL;
    for (unsigned r = 0; r < 3; r++) {
        uint32_t a = gt_u32(&rng) | 1, b = gt_u32(&rng);
        void *affine_args[] = {&tmp, &dev, &n, &a, &b};
        void *raw = NULL;
        int err = 0;
        gt_fill(&rng, in, N * 4);
        memset(out, GT_POISON, N * 4);
        if (!GT_OK(weft_region_begin(501)) || !GT_OK(weft_memcpy_async(dev, in, N * 4)) ||
            !GT_OK(weft_launch(gk_affine(), dim(N / 256, 1, 1), dim(256, 1, 1), 0, affine_args)) ||
            !GT_OK(weft_stream(&raw)) ||
            !GT_CHECK((err = gk_launch_affine_on(raw, dev, tmp, n, b, a)) == 0,
                      "a launch on the raw stream failed: %s", gk_error_name(err)) ||
            !GT_OK(weft_memcpy_async(out, dev, N * 4)) || !GT_OK(weft_region_end()) ||
            !GT_OK(weft_await()))
            return NULL;
        for (unsigned i = 0; i < N; i++)
            if (!GT_CHECK(out[i] == gk_affine_ref(gk_affine_ref(in[i], a, b), b, a),
                          "round %u: out[%u] = %#x: the raw launch did not follow the recorded "
                          "work",
                          r, i, out[i]))
                return NULL;
    }
    GT_OK(weft_free_async(dev));
    GT_OK(weft_free_async(tmp));
    GT_OK(weft_await());
    weft_host_free(rt, in);
    weft_host_free(rt, out);
    return NULL;
}

static void test_raw_stream_work_joins_a_recorded_region(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    weft_graph_stats st;
    (void)state;
    gt_run(rt, raw_main, NULL);
    assert_ok(weft_graph_stats_get(rt, &st));
    assert_int_equal(st.launches, 3);
    assert_int_equal(st.hits, 0); /* captured, not replayed from records */
    assert_int_equal(st.instantiations, 1);
    assert_int_equal(st.updates, 2);
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
    /* a forbidden call breaks the capture (the raw stream makes the region
     * a capture): region_end fails, the stream goes on */
    void *raw = NULL;
    GT_OK(weft_region_begin(12));
    GT_OK(weft_stream(&raw));
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
        cmocka_unit_test(test_a_replay_runs_the_graph_as_it_stands),
        cmocka_unit_test(test_a_new_shape_instantiates_again),
        cmocka_unit_test(test_a_small_cache_evicts_the_least_recently_used),
        cmocka_unit_test(test_1000_tasks_share_one_key),
        cmocka_unit_test(test_recorded_arguments_arrive_intact),
        cmocka_unit_test(test_raw_stream_work_joins_a_recorded_region),
        cmocka_unit_test(test_misuse_gets_errors_and_the_runtime_goes_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
