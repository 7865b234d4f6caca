/*
 * test_report_gpu.c - the diagnoses of weft_stats_report that need a GPU:
 * kernels dominated by launch cost, copies from pageable memory; copies
 * counted by the memory on either side; and a healthy GPU run that gets
 * no report. The host backend's diagnoses are in test_report.c.
 */
#include "gpu_support/gpu_test.h"

enum { REPORT_MAX = 8192 };

static weft_dim3 dim(unsigned x)
{
    weft_dim3 d = {x, 1, 1};
    return d;
}

static char *report_of(weft_runtime *rt)
{
    static char text[REPORT_MAX];
    int len = weft_stats_report(rt, text, sizeof text);
    assert_true(len >= 0 && len < REPORT_MAX);
    return text;
}

/* ---- tiny kernels, many per await ------------------------------------------- */

enum { TINY_TASKS = 4, TINY_ROUNDS = 100, TINY_PER_AWAIT = 16, TINY_WORDS = 64 };

static void *tiny_kernels(void *arg)
{
    uint32_t *buf;
    unsigned n = TINY_WORDS;
    uint32_t a = 3, b = 7;
    (void)arg;
    if (!GT_OK(weft_malloc_async((void **)&buf, TINY_WORDS * 4)) ||
        !GT_OK(weft_memset_async(buf, 0, TINY_WORDS * 4)))
        return NULL;
    void *args[] = {&buf, &buf, &n, &a, &b};
    for (int r = 0; r < TINY_ROUNDS; r++) {
        for (int k = 0; k < TINY_PER_AWAIT; k++)
            if (!GT_OK(weft_launch(gk_affine(), dim(1), dim(TINY_WORDS), 0, args)))
                return NULL;
        if (!GT_OK(weft_await()))
            return NULL;
    }
    GT_OK(weft_free_async(buf));
    return NULL;
}

static void test_gpu_report_names_kernels_dominated_by_launch_cost(void **state)
{
    weft_task *ts[TINY_TASKS];
    char figure[64];
    weft_stats st;
    (void)state;
    weft_runtime *rt = gt_runtime(4);
    for (int i = 0; i < TINY_TASKS; i++)
        assert_ok(weft_spawn(rt, &ts[i], tiny_kernels, NULL, NULL));
    for (int i = 0; i < TINY_TASKS; i++)
        assert_ok(weft_join(ts[i], NULL));
    gt_assert_passed();
    assert_ok(weft_stats_get(rt, &st));
    assert_int_equal(st.launches, TINY_TASKS * TINY_ROUNDS * TINY_PER_AWAIT);
    const char *text = report_of(rt);
    if (gt_sanitizer()) { /* its kernels take far over the 10 us that makes them tiny */
        gt_runtime_destroy(rt);
        return;
    }
    assert_non_null(strstr(text, "launch cost"));
    snprintf(figure, sizeof figure, "%d kernels launched one by one",
             TINY_TASKS * TINY_ROUNDS * TINY_PER_AWAIT);
    assert_non_null(strstr(text, figure));
    assert_non_null(strstr(text, "weft_region_begin"));
    gt_runtime_destroy(rt);
}

/* ---- copies by the memory on either side ----------------------------------- */

#define COPY_BYTES ((size_t)32 << 20)
enum { COPY_ROUNDS = 4 };

typedef struct copies {
    void *host; /* pageable or pinned */
} copies;

static void *copy_rounds(void *arg)
{
    copies *c = arg;
    void *dev, *dev2;
    if (!GT_OK(weft_malloc_async(&dev, COPY_BYTES)) || !GT_OK(weft_malloc_async(&dev2, COPY_BYTES)))
        return NULL;
    for (int r = 0; r < COPY_ROUNDS; r++)
        if (!GT_OK(weft_memcpy_async(dev, c->host, COPY_BYTES)) ||
            !GT_OK(weft_memcpy_async(c->host, dev, COPY_BYTES)) || !GT_OK(weft_await()))
            return NULL;
    GT_OK(weft_memcpy_async(dev2, dev, COPY_BYTES));
    GT_OK(weft_free_async(dev));
    GT_OK(weft_free_async(dev2));
    GT_OK(weft_await());
    return NULL;
}

static void test_gpu_report_names_copies_from_pageable_memory(void **state)
{
    weft_stats st;
    (void)state;
    weft_runtime *rt = gt_runtime(2);
    copies c = {gt_xmalloc(COPY_BYTES)};
    memset(c.host, 1, COPY_BYTES);
    gt_run(rt, copy_rounds, &c);
    assert_ok(weft_stats_get(rt, &st));
    assert_int_equal(st.copy_bytes[WEFT_COPY_PAGEABLE], 2 * COPY_ROUNDS * COPY_BYTES);
    assert_int_equal(st.copy_bytes[WEFT_COPY_DEVICE], COPY_BYTES);
    assert_int_equal(st.copy_bytes[WEFT_COPY_PINNED], 0);
    const char *text = report_of(rt);
    char figure[96];
    snprintf(figure, sizeof figure, "%.1f MiB of the %.1f MiB",
             (double)(2 * COPY_ROUNDS * COPY_BYTES) / (1 << 20),
             (double)(2 * COPY_ROUNDS * COPY_BYTES) / (1 << 20));
    assert_non_null(strstr(text, "pageable memory"));
    assert_non_null(strstr(text, figure));
    assert_non_null(strstr(text, "weft_host_alloc"));
    free(c.host);
    gt_runtime_destroy(rt);
}

static void test_gpu_report_is_silent_about_copies_from_pinned_memory(void **state)
{
    weft_stats st;
    (void)state;
    weft_runtime *rt = gt_runtime(2);
    copies c;
    assert_ok(weft_host_alloc(rt, &c.host, COPY_BYTES));
    memset(c.host, 1, COPY_BYTES);
    gt_run(rt, copy_rounds, &c);
    assert_ok(weft_stats_get(rt, &st));
    assert_int_equal(st.copy_bytes[WEFT_COPY_PINNED], 2 * COPY_ROUNDS * COPY_BYTES);
    assert_int_equal(st.copy_bytes[WEFT_COPY_PAGEABLE], 0);
    assert_null(strstr(report_of(rt), "pageable memory"));
    assert_ok(weft_host_free(rt, c.host));
    gt_runtime_destroy(rt);
}

/* ---- a healthy run ------------------------------------------------------------- */

enum { BUSY_TASKS = 8, BUSY_ROUNDS = 20, BUSY_WORDS = 256 };

static void *long_kernels(void *arg)
{
    uint32_t *buf;
    unsigned n = BUSY_WORDS;
    uint32_t a = 3, b = 7;
    uint64_t ns = 200000; /* 200 us: far longer than a launch */
    (void)arg;
    if (!GT_OK(weft_malloc_async((void **)&buf, BUSY_WORDS * 4)) ||
        !GT_OK(weft_memset_async(buf, 0, BUSY_WORDS * 4)))
        return NULL;
    void *args[] = {&buf, &buf, &n, &a, &b, &ns};
    for (int r = 0; r < BUSY_ROUNDS; r++)
        if (!GT_OK(weft_launch(gk_spin_affine(), dim(1), dim(BUSY_WORDS), 0, args)) ||
            !GT_OK(weft_await()))
            return NULL;
    GT_OK(weft_free_async(buf));
    GT_OK(weft_await());
    return NULL;
}

static void test_gpu_report_is_silent_for_a_healthy_run(void **state)
{
    weft_task *ts[BUSY_TASKS];
    weft_stats st;
    (void)state;
    weft_runtime *rt = gt_runtime(4);
    for (int i = 0; i < BUSY_TASKS; i++)
        assert_ok(weft_spawn(rt, &ts[i], long_kernels, NULL, NULL));
    for (int i = 0; i < BUSY_TASKS; i++)
        assert_ok(weft_join(ts[i], NULL));
    gt_assert_passed();
    assert_ok(weft_stats_get(rt, &st));
    assert_true(st.streams_max > 1);
    assert_int_equal(st.launches, BUSY_TASKS * BUSY_ROUNDS);
    assert_string_equal(report_of(rt), "");
    gt_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_report_names_kernels_dominated_by_launch_cost),
        cmocka_unit_test(test_gpu_report_names_copies_from_pageable_memory),
        cmocka_unit_test(test_gpu_report_is_silent_about_copies_from_pinned_memory),
        cmocka_unit_test(test_gpu_report_is_silent_for_a_healthy_run),
    };
    int skip = gt_start("gpu.report");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
