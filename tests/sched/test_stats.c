/*
 * test_stats.c - weft_stats_get counts what the runtime did.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>

#include "weft.h"
#include "weft_test.h"

enum { N = 200 };

static void nothing(void *arg)
{
    (void)arg;
}

static void *await_once(void *arg)
{
    (void)arg;
    if (weft_host_async(nothing, NULL) || weft_await())
        return (void *)1;
    return NULL;
}

static atomic_int ran;

static void *count(void *arg)
{
    atomic_fetch_add(&ran, 1);
    return arg;
}

/* Spawn onto this worker's deque, then hold the worker without yielding:
 * the only way the children can run is by being stolen. */
static void *spawn_and_hold(void *arg)
{
    weft_task *ts[64];
    (void)arg;
    for (int i = 0; i < 64; i++)
        if (weft_spawn(weft_runtime_current(), &ts[i], count, NULL, NULL))
            return (void *)1;
    while (atomic_load(&ran) < 64)
        ;
    for (int i = 0; i < 64; i++)
        weft_join(ts[i], NULL);
    return NULL;
}

static void test_stats_count_spawns_switches_awaits_steals_and_parks(void **state)
{
    weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST};
    weft_runtime *rt;
    weft_task *ts[N], *holder;
    weft_stats st;
    (void)state;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(weft_spawn(rt, &ts[i], await_once, NULL, NULL), WEFT_OK);
    for (int i = 0; i < N; i++) {
        void *r;
        assert_int_equal(weft_join(ts[i], &r), WEFT_OK);
        assert_null(r);
    }
    atomic_store(&ran, 0);
    assert_int_equal(weft_spawn(rt, &holder, spawn_and_hold, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_join(holder, NULL), WEFT_OK);
    sleep_ms(50); /* the workers run out of work and park */

    assert_int_equal(weft_stats_get(rt, &st), WEFT_OK);
    assert_int_equal(st.spawned, N + 1 + 64);
    assert_int_equal(st.finished, N + 1 + 64);
    assert_true(st.switches >= st.finished); /* every task ran (an await may not suspend) */
    assert_int_equal(st.awaits, N);
    assert_true(st.await_mean_us > 0.0);
    assert_true(st.steals >= 1);
    assert_true(st.parks >= 1);

    assert_int_equal(weft_stats_get(rt, NULL), WEFT_EINVAL);
    assert_int_equal(weft_stats_get(NULL, &st), WEFT_EINVAL);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    assert_int_equal(weft_stats_get(rt, &st), WEFT_ESTATE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_count_spawns_switches_awaits_steals_and_parks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
