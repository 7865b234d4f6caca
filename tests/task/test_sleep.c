/*
 * test_sleep.c - weft_sleep_ns at the ends of its range: a sleep whose
 * deadline lies past the clock's range lasts until the task is cancelled.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <time.h>

#include "weft.h"
#include "weft_test.h"

static atomic_int woke;

static void *sleep_for(void *arg)
{
    uint64_t ns = *(const uint64_t *)arg;
    int rc = weft_sleep_ns(ns);
    atomic_store(&woke, 1);
    return (void *)(intptr_t)rc;
}

/* Sleep ns in a task: still asleep 50 ms later, and cancelled it returns
 * WEFT_ECANCELED. */
static void check_sleeps_until_cancelled(weft_runtime *rt, uint64_t ns)
{
    weft_task *t;
    void *rc = NULL;
    atomic_store(&woke, 0);
    assert_int_equal(weft_spawn(rt, &t, sleep_for, &ns, NULL), WEFT_OK);
    sleep_ms(50);
    assert_int_equal(atomic_load(&woke), 0);
    assert_int_equal(weft_cancel(t), WEFT_OK);
    assert_int_equal(weft_join(t, &rc), WEFT_ETASKCANCELED);
    assert_int_equal(atomic_load(&woke), 1);
    assert_int_equal((int)(intptr_t)rc, WEFT_ECANCELED);
}

static void test_sleep_of_uint64_max_lasts_until_cancelled(void **state)
{
    check_sleeps_until_cancelled(*state, UINT64_MAX);
}

static void test_sleep_of_uint64_max_minus_one_does_not_return_early(void **state)
{
    check_sleeps_until_cancelled(*state, UINT64_MAX - 1);
}

/* Just past where now + ns would wrap (weft's clock is CLOCK_MONOTONIC). */
static void test_sleep_past_the_clock_range_does_not_return_early(void **state)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    check_sleeps_until_cancelled(*state, UINT64_MAX - now + 1000);
}

/* A long sleep beside a short one: the short one still ends on time. */
static void test_short_sleep_ends_beside_an_endless_one(void **state)
{
    weft_runtime *rt = *state;
    uint64_t forever = UINT64_MAX, short_ns = 1000000;
    weft_task *endless, *brief;
    void *rc = (void *)1;
    assert_int_equal(weft_spawn(rt, &endless, sleep_for, &forever, NULL), WEFT_OK);
    sleep_ms(5);
    assert_int_equal(weft_spawn(rt, &brief, sleep_for, &short_ns, NULL), WEFT_OK);
    assert_int_equal(weft_join(brief, &rc), WEFT_OK);
    assert_int_equal((int)(intptr_t)rc, WEFT_OK);
    assert_int_equal(weft_cancel(endless), WEFT_OK);
    assert_int_equal(weft_join(endless, NULL), WEFT_ETASKCANCELED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sleep_of_uint64_max_lasts_until_cancelled),
        cmocka_unit_test(test_sleep_of_uint64_max_minus_one_does_not_return_early),
        cmocka_unit_test(test_sleep_past_the_clock_range_does_not_return_early),
        cmocka_unit_test(test_short_sleep_ends_beside_an_endless_one),
    };
    return cmocka_run_group_tests(tests, setup_rt, teardown_rt);
}
