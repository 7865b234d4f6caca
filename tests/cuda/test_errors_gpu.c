/*
 * test_errors.c - what the CUDA backend does with bad requests.
 *
 * Device memory beyond what the GPU has: WEFT_ENOMEM, and the task and the
 * device go on working. Bad arguments (NULL kernel, NULL out-parameters,
 * zero dimensions): WEFT_EINVAL with a message naming the call, and the
 * task is not failed by them. Launch configurations CUDA refuses (too many
 * threads, too much shared memory): an error at the call that leaves the
 * device healthy. Task-only calls from plain threads: WEFT_ENOTASK. A
 * device index beyond weft_device_count in the spawn options: WEFT_EINVAL
 * at spawn; each index below it places the task's stream on that GPU.
 */
#include <limits.h>

#include "gpu_support/gpu_test.h"

static weft_dim3 dim(unsigned x, unsigned y, unsigned z)
{
    weft_dim3 d = {x, y, z};
    return d;
}

/* The last error names the call that failed. */
static bool message_names(const char *call)
{
    const char *msg = weft_last_error();

    return GT_CHECK(msg != NULL && strstr(msg, call) != NULL, "the message \"%s\" does not name %s",
                    msg ? msg : "(null)", call);
}

/* expr must fail with WEFT_EINVAL and a message naming call. */
#define EXPECT_EINVAL(expr, call)                                                                  \
    do {                                                                                           \
        if (GT_RC(expr, WEFT_EINVAL))                                                              \
            message_names(call);                                                                   \
    } while (0)

/* In a task: a small pipeline on the device works (copy, kernel, copy). */
static bool device_works(uint64_t seed)
{
    uint64_t rng = gt_rng(seed);
    uint32_t in[512], out[512 + 16], *dev = NULL;
    uint32_t a = gt_u32(&rng) | 1, b = gt_u32(&rng);
    unsigned n = 512;
    void *args[] = {&dev, &dev, &n, &a, &b};
    bool ok;

    gt_fill(&rng, in, sizeof in);
    memset(out, GT_POISON, sizeof out);
    ok = GT_OK(weft_malloc_async((void **)&dev, sizeof in)) &&
         GT_OK(weft_memcpy_async(dev, in, sizeof in)) &&
         GT_OK(weft_launch(gk_affine(), dim(2, 1, 1), dim(256, 1, 1), 0, args)) &&
         GT_OK(weft_memcpy_async(out, dev, sizeof in)) && GT_OK(weft_free_async(dev)) &&
         GT_OK(weft_await());
    for (unsigned i = 0; ok && i < n; i++)
        ok = GT_CHECK(out[i] == gk_affine_ref(in[i], a, b), "word %u wrong after an error", i);
    return ok && GT_CHECK(gt_first_not(out + n, GT_POISON, 64) == 64, "written past the end");
}

/* ---- out of memory ----------------------------------------------------- */

static void *oom_main(void *arg)
{
    void *p = NULL, *big = NULL;

    (void)arg;
    for (unsigned i = 0; i < 4; i++) {
        if (!GT_RC(weft_malloc_async(&p, (size_t)1 << 40), WEFT_ENOMEM)) /* 1 TiB */
            return NULL;
        GT_CHECK(weft_last_error()[0] != '\0', "no message for WEFT_ENOMEM");
    }
    /* the task goes on: a big block that fits, then real work */
    if (GT_OK(weft_malloc_async(&big, (size_t)1 << 30)) &&
        GT_OK(weft_memset_async(big, 1, (size_t)1 << 30)))
        GT_OK(weft_free_async(big));
    GT_OK(weft_await());
    device_works(1);
    return NULL;
}

/* 1 TiB of device memory: WEFT_ENOMEM, and neither the task nor the device
 * is failed by it (its join is WEFT_OK). */
static void test_malloc_async_beyond_the_device_is_enomem(void **state)
{
    weft_runtime *rt = gt_runtime(0);

    (void)state;
    gt_run(rt, oom_main, NULL);
    gt_runtime_destroy(rt);
}

/* ---- bad arguments ----------------------------------------------------- */

static void noop_fn(void *arg)
{
    (void)arg;
}

static void *bad_args_main(void *arg)
{
    weft_runtime *rt = weft_runtime_current();
    uint32_t host[16], *dev = NULL;
    unsigned n = 16;
    uint32_t a = 3, b = 4;
    void *args[] = {&dev, &dev, &n, &a, &b};
    void *h = NULL, *d = NULL;
    weft_event *ev = NULL;
    static const weft_dim3 zero_dims[] = {{0, 1, 1}, {1, 0, 1}, {1, 1, 0}};

    (void)arg;
    if (!GT_OK(weft_malloc_async((void **)&dev, sizeof host)))
        return NULL;

    EXPECT_EINVAL(weft_launch(NULL, dim(1, 1, 1), dim(16, 1, 1), 0, args), "weft_launch");
    for (unsigned i = 0; i < 3; i++) {
        EXPECT_EINVAL(weft_launch(gk_affine(), zero_dims[i], dim(16, 1, 1), 0, args),
                      "weft_launch");
        EXPECT_EINVAL(weft_launch(gk_affine(), dim(1, 1, 1), zero_dims[i], 0, args), "weft_launch");
    }
    EXPECT_EINVAL(weft_malloc_async(NULL, 64), "weft_malloc_async");
    EXPECT_EINVAL(weft_stream(NULL), "weft_stream");
    EXPECT_EINVAL(weft_event_record(NULL), "weft_event_record");
    EXPECT_EINVAL(weft_event_await(NULL), "weft_event_await");
    EXPECT_EINVAL(weft_stream_wait(NULL), "weft_stream_wait");
    EXPECT_EINVAL(weft_host_async(NULL, NULL), "weft_host_async");
    EXPECT_EINVAL(weft_memcpy_async(NULL, host, sizeof host), "weft_memcpy_async");
    EXPECT_EINVAL(weft_memcpy_async(dev, NULL, sizeof host), "weft_memcpy_async");
    EXPECT_EINVAL(weft_memset_async(NULL, 0, sizeof host), "weft_memset_async");
    EXPECT_EINVAL(weft_host_alloc(rt, NULL, 64), "weft_host_alloc");
    EXPECT_EINVAL(weft_host_alloc(NULL, &h, 64), "weft_host_alloc");
    EXPECT_EINVAL(weft_mapped_alloc(rt, NULL, &d, 64), "weft_mapped_alloc");
    EXPECT_EINVAL(weft_mapped_alloc(rt, &h, NULL, 64), "weft_mapped_alloc");
    EXPECT_EINVAL(weft_mapped_alloc(NULL, &h, &d, 64), "weft_mapped_alloc");

    /* none of that failed the task: its stream still works */
    if (GT_OK(weft_event_record(&ev)) && GT_OK(weft_free_async(dev)) && GT_OK(weft_await()))
        GT_OK(weft_event_await(ev));
    if (ev)
        GT_OK(weft_event_destroy(ev));
    device_works(2);
    return NULL;
}

/* Every NULL out-parameter, NULL kernel or function, zero dimension:
 * WEFT_EINVAL naming the call, and the task's join is still WEFT_OK. */
static void test_bad_arguments_are_einval(void **state)
{
    weft_runtime *rt = gt_runtime(2);

    (void)state;
    gt_run(rt, bad_args_main, NULL);
    gt_runtime_destroy(rt);
}

/* ---- launches CUDA refuses ---------------------------------------------- */

static void *refused_launch_main(void *arg)
{
    uint32_t *dev = NULL;
    unsigned n = 16;
    uint32_t a = 3, b = 4;
    void *args[] = {&dev, &dev, &n, &a, &b};
    struct {
        weft_dim3 grid, block;
        size_t shared;
        const char *what;
    } bad[] = {
        {{1, 1, 1}, {2048, 1, 1}, 0, "2048 threads per block"},
        {{1, 1, 1}, {1, 1, 65}, 0, "block.z of 65"},
        {{1, 65536, 1}, {1, 1, 1}, 0, "grid.y of 65536"},
        {{1, 1, 1}, {32, 1, 1}, (size_t)1 << 30, "1 GiB of shared memory"},
    };

    (void)arg;
    if (!GT_OK(weft_malloc_async((void **)&dev, 64)))
        return NULL;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = weft_launch(gk_affine(), bad[i].grid, bad[i].block, bad[i].shared, args);
        GT_CHECK(rc == WEFT_EINVAL || rc == WEFT_EDEVICE,
                 "a launch with %s returned %d (%s), expected an error", bad[i].what, rc,
                 weft_strerror(rc));
        GT_CHECK(weft_last_error()[0] != '\0', "no message for a refused launch");
    }
    GT_OK(weft_free_async(dev));
    GT_OK(weft_await());
    return NULL;
}

static void *healthy_main(void *arg)
{
    device_works((uint64_t)(uintptr_t)arg);
    return NULL;
}

/* Launch configurations CUDA refuses fail the call, not the device: tasks
 * after it use the GPU as before. */
static void test_refused_launches_leave_the_device_healthy(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    weft_task *t;

    (void)state;
    assert_ok(weft_spawn(rt, &t, refused_launch_main, NULL, NULL));
    weft_join(t, NULL); /* may be WEFT_OK or the launch errors: not the point */
    gt_assert_passed();
    for (uintptr_t i = 0; i < 8; i++)
        gt_run(rt, healthy_main, (void *)(10 + i));
    gt_runtime_destroy(rt);
}

/* ---- calls outside tasks ----------------------------------------------- */

static void *record_main(void *arg)
{
    GT_OK(weft_event_record((weft_event **)arg));
    GT_OK(weft_await());
    return NULL;
}

typedef struct outside {
    weft_event *ev;
    unsigned wrong; /* calls that did not return WEFT_ENOTASK */
    char first[256];
} outside;

static void expect_enotask(outside *o, int rc, const char *call)
{
    if (rc == WEFT_ENOTASK)
        return;
    if (o->wrong++ == 0)
        snprintf(o->first, sizeof o->first, "%s returned %d (%s) outside a task", call, rc,
                 weft_strerror(rc));
}

static void *outside_calls(void *arg)
{
    outside *o = arg;
    unsigned char host[64] = {0}, other[64] = {0};
    uint32_t *dev = (uint32_t *)host;
    unsigned n = 16;
    uint32_t a = 3, b = 4;
    void *args[] = {&dev, &dev, &n, &a, &b};
    void *p = NULL, *s = NULL;
    weft_event *ev = NULL;
    weft_dim3 one = {1, 1, 1};

    expect_enotask(o, weft_memcpy_async(host, other, sizeof host), "weft_memcpy_async");
    expect_enotask(o, weft_memset_async(host, 0, sizeof host), "weft_memset_async");
    expect_enotask(o, weft_host_async(noop_fn, NULL), "weft_host_async");
    expect_enotask(o, weft_launch(gk_affine(), one, one, 0, args), "weft_launch");
    expect_enotask(o, weft_await(), "weft_await");
    expect_enotask(o, weft_stream(&s), "weft_stream");
    expect_enotask(o, weft_malloc_async(&p, 64), "weft_malloc_async");
    expect_enotask(o, weft_event_record(&ev), "weft_event_record");
    expect_enotask(o, weft_stream_wait(o->ev), "weft_stream_wait");
    return NULL;
}

/* The task-only calls return WEFT_ENOTASK from the main thread and from
 * another plain thread, with valid arguments. */
static void test_device_calls_outside_a_task_are_enotask(void **state)
{
    weft_runtime *rt = gt_runtime(2);
    outside o;
    pthread_t th;

    (void)state;
    memset(&o, 0, sizeof o);
    gt_run(rt, record_main, &o.ev);
    assert_non_null(o.ev);
    outside_calls(&o);
    if (o.wrong)
        fail_msg("main thread: %s", o.first);
    assert_int_equal(pthread_create(&th, NULL, outside_calls, &o), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    if (o.wrong)
        fail_msg("other thread: %s", o.first);
    /* the thread may wait for the event, though */
    assert_ok(weft_event_await(o.ev));
    assert_ok(weft_event_destroy(o.ev));
    gt_runtime_destroy(rt);
}

/* ---- device placement --------------------------------------------------- */

static void *placed_main(void *arg)
{
    int want = (int)(uintptr_t)arg;
    void *s = NULL;

    if (GT_OK(weft_stream(&s)))
        GT_CHECK(gk_stream_device(s) == want, "asked for GPU %d, the stream is on GPU %d", want,
                 gk_stream_device(s));
    GT_OK(weft_await());
    device_works(100 + (uint64_t)want);
    return NULL;
}

static void *never_runs(void *arg)
{
    (void)arg;
    return NULL;
}

/* WEFT_DEVICE(i) for i < weft_device_count places the task's stream on GPU
 * i; beyond it, weft_spawn returns WEFT_EINVAL and starts nothing. */
static void test_spawn_on_a_device_beyond_the_count_is_einval(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    unsigned count = weft_device_count(rt);
    unsigned beyond[] = {WEFT_DEVICE(count), WEFT_DEVICE(count + 7), UINT_MAX};

    (void)state;
    assert_int_equal(count, (unsigned)gk_gpu_count());
    for (unsigned i = 0; i < sizeof beyond / sizeof beyond[0]; i++) {
        weft_task_opts opts = {.device = beyond[i]};
        weft_task *t = NULL;
        assert_rc(weft_spawn(rt, &t, never_runs, NULL, &opts), WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "weft_spawn"));
        assert_rc(weft_spawn(rt, NULL, never_runs, NULL, &opts), WEFT_EINVAL); /* detached */
    }
    for (unsigned i = 0; i < count; i++) {
        weft_task_opts opts = {.device = WEFT_DEVICE(i)};
        weft_task *t = NULL;
        assert_ok(weft_spawn(rt, &t, placed_main, (void *)(uintptr_t)i, &opts));
        assert_ok(weft_join(t, NULL));
    }
    gt_assert_passed();
    gt_runtime_destroy(rt);
}

/* ---- the host backend has no kernels ------------------------------------ */

static void *host_backend_main(void *arg)
{
    unsigned n = 1;
    uint32_t a = 1, b = 1, *p = NULL;
    void *args[] = {&p, &p, &n, &a, &b};
    void *s = (void *)&n;

    (void)arg;
    GT_RC(weft_launch(gk_affine(), dim(1, 1, 1), dim(1, 1, 1), 0, args), WEFT_EINVAL);
    if (GT_OK(weft_stream(&s)))
        GT_CHECK(s == NULL, "the host backend gave a stream handle");
    GT_OK(weft_await());
    return NULL;
}

/* In the same process, a host-backend runtime refuses kernels and has no
 * native stream handle. */
static void test_host_backend_refuses_kernels(void **state)
{
    weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST};
    weft_runtime *rt = NULL;

    (void)state;
    gt_reset();
    assert_ok(weft_runtime_create(&rt, &cfg));
    assert_string_equal(weft_backend_name(rt), "host");
    gt_run(rt, host_backend_main, NULL);
    assert_ok(weft_runtime_destroy(rt));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malloc_async_beyond_the_device_is_enomem),
        cmocka_unit_test(test_bad_arguments_are_einval),
        cmocka_unit_test(test_refused_launches_leave_the_device_healthy),
        cmocka_unit_test(test_device_calls_outside_a_task_are_enotask),
        cmocka_unit_test(test_spawn_on_a_device_beyond_the_count_is_einval),
        cmocka_unit_test(test_host_backend_refuses_kernels),
    };
    int skip = gt_start("gpu.errors");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
