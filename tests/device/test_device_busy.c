/*
 * test_device_busy.c - weft_stats reports how long each device had work.
 *
 * On the host backend a device is busy while any stream has queued or
 * running operations. The checks are bounds that hold whatever the machine's
 * speed: busy time is at least what a host function slept, never more than
 * the wall time that passed, does not grow while the device is idle, and is
 * a union over streams (two overlapping stretches count once).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <time.h>

#include "weft.h"
#include "weft_test.h"

enum { NAP_MS = 40 };

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void nap(void *arg)
{
    (void)arg;
    sleep_ms(NAP_MS);
}

static void *one_nap(void *arg)
{
    (void)arg;
    if (weft_host_async(nap, NULL) || weft_await())
        return (void *)1;
    return NULL;
}

static uint64_t busy_ns(weft_runtime *rt)
{
    weft_stats st;
    assert_int_equal(weft_stats_get(rt, &st), WEFT_OK);
    assert_int_equal(st.devices, 1);
    return st.device_busy_ns[0];
}

/* Run n tasks that each nap on the device at the same time; return the wall
 * time from before the spawns to after the joins. */
static uint64_t naps(weft_runtime *rt, int n)
{
    weft_task *ts[2];
    uint64_t start = now_ns();
    for (int i = 0; i < n; i++)
        assert_int_equal(weft_spawn(rt, &ts[i], one_nap, NULL, NULL), WEFT_OK);
    for (int i = 0; i < n; i++) {
        void *r;
        assert_int_equal(weft_join(ts[i], &r), WEFT_OK);
        assert_null(r);
    }
    return now_ns() - start;
}

static void test_device_busy_time_is_bounded_by_work_and_wall_time(void **state)
{
    weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST, .host_threads = 2};
    weft_runtime *rt;
    weft_stats st;
    (void)state;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    assert_int_equal(weft_stats_get(rt, &st), WEFT_OK);
    assert_int_equal(st.devices, 0); /* no device call yet */

    uint64_t wall = naps(rt, 1);
    uint64_t busy = busy_ns(rt);
    assert_true(busy >= (uint64_t)NAP_MS * 1000000u);
    assert_true(busy <= wall);

    sleep_ms(NAP_MS); /* idle: nothing accrues */
    assert_int_equal(busy_ns(rt), busy);

    /* Two streams napping at once on two executor threads: their stretches
     * overlap and count once, so busy time grows by no more than the wall
     * time that passed (counting each stream would give twice the nap). */
    wall = naps(rt, 2);
    uint64_t grown = busy_ns(rt) - busy;
    assert_true(grown >= (uint64_t)NAP_MS * 1000000u);
    assert_true(grown <= wall);

    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_busy_time_is_bounded_by_work_and_wall_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
