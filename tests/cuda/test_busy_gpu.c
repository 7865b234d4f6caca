/*
 * test_busy.c - weft_stats' busy time of a GPU.
 *
 * A GPU is busy from work enqueued while it was idle until its last pending
 * work is seen complete. Bounds that hold on any machine: busy time is at
 * least the GPU time a kernel spun, at most the wall time that passed; it
 * stops growing once the work is done (also when the task never awaited,
 * and when the completion was found on the wait's fast path); overlapping
 * streams count once.
 */
#include "gpu_support/gpu_test.h"

#define SPIN_NS 30000000ull /* 30 ms */

enum { WORDS = 256 };

static weft_dim3 dim(unsigned x)
{
    weft_dim3 d = {x, 1, 1};
    return d;
}

/* In a task: spin a kernel for SPIN_NS over a small buffer, then await
 * (or, with arg set, return and leave the await to the task's end). */
static void *spin(void *arg)
{
    uint32_t *buf;
    unsigned n = WORDS;
    uint32_t a = 3, b = 7;
    uint64_t ns = SPIN_NS;
    if (!GT_OK(weft_malloc_async((void **)&buf, WORDS * 4)) ||
        !GT_OK(weft_memset_async(buf, 0, WORDS * 4)))
        return NULL;
    void *args[] = {&buf, &buf, &n, &a, &b, &ns};
    GT_OK(weft_launch(gk_spin_affine(), dim(1), dim(WORDS), 0, args));
    GT_OK(weft_free_async(buf));
    if (!arg)
        GT_OK(weft_await());
    return NULL;
}

static uint64_t busy_ns(weft_runtime *rt)
{
    weft_stats st;
    assert_ok(weft_stats_get(rt, &st));
    assert_true(st.devices >= 1);
    return st.device_busy_ns[0];
}

/* Run n spinning tasks at once; return the wall time they took. */
static uint64_t spins(weft_runtime *rt, unsigned n, bool await)
{
    weft_task *ts[4];
    weft_task_opts opts = {.device = WEFT_DEVICE(0)};
    double start = gt_now();
    for (unsigned i = 0; i < n; i++)
        assert_ok(weft_spawn(rt, &ts[i], spin, await ? NULL : (void *)1, &opts));
    for (unsigned i = 0; i < n; i++)
        assert_ok(weft_join(ts[i], NULL));
    return (uint64_t)((gt_now() - start) * 1e9);
}

static void test_gpu_busy_time_is_bounded_by_work_and_wall_time(void **state)
{
    (void)state;
    weft_runtime *rt = gt_runtime(2);

    uint64_t wall = spins(rt, 1, true), busy = busy_ns(rt);
    assert_true(busy >= SPIN_NS);
    assert_true(busy <= wall);

    gt_sleep_ms(30); /* idle: nothing accrues */
    assert_int_equal(busy_ns(rt), busy);

    /* A task that returns without awaiting is drained at its end. */
    wall = spins(rt, 1, false);
    uint64_t grown = busy_ns(rt) - busy;
    assert_true(grown >= SPIN_NS && grown <= wall);
    busy += grown;
    gt_sleep_ms(30);
    assert_int_equal(busy_ns(rt), busy);

    /* Four streams spinning at once count once. */
    wall = spins(rt, 4, true);
    grown = busy_ns(rt) - busy;
    assert_true(grown >= SPIN_NS && grown <= wall);
    gt_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_busy_time_is_bounded_by_work_and_wall_time),
    };
    int skip = gt_start("gpu.busy");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
