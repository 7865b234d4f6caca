/*
 * test_cancel.c - cooperative cancellation: before a task starts, while it
 * runs, while it is suspended, and in storms of all three at once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "weft.h"

static atomic_int ran;
static atomic_bool gate_open;

static void *count_run(void *arg)
{
    atomic_fetch_add(&ran, 1);
    return arg;
}

/* Occupies the only worker until gate_open, without suspending. */
static void *hold_worker(void *arg)
{
    (void)arg;
    while (!atomic_load(&gate_open))
        ;
    return NULL;
}

static weft_runtime *start(unsigned workers)
{
    weft_config cfg = {.workers = workers};
    weft_runtime *rt = NULL;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    return rt;
}

static void test_cancelled_before_start_never_runs_and_join_says_so(void **state)
{
    (void)state;
    enum { N = 1000 };
    weft_runtime *rt = start(1);
    weft_task *gate, *ts[N];
    atomic_store(&ran, 0);
    atomic_store(&gate_open, false);
    assert_int_equal(weft_spawn(rt, &gate, hold_worker, NULL, NULL), WEFT_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(weft_spawn(rt, &ts[i], count_run, (void *)1, NULL), WEFT_OK);
    for (int i = 0; i < N; i += 2)
        assert_int_equal(weft_cancel(ts[i]), WEFT_OK);
    atomic_store(&gate_open, true);
    for (int i = 0; i < N; i++) {
        void *r = (void *)99;
        int rc = weft_join(ts[i], &r);
        if (i % 2 == 0) {
            assert_int_equal(rc, WEFT_ETASKCANCELED);
            assert_null(r); /* never ran */
        } else {
            assert_int_equal(rc, WEFT_OK);
            assert_ptr_equal(r, (void *)1);
        }
    }
    assert_int_equal(atomic_load(&ran), N / 2);
    assert_int_equal(weft_join(gate, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void *spin_until_cancelled(void *arg)
{
    (void)arg;
    atomic_fetch_add(&ran, 1);
    uint64_t spins = 0;
    while (!weft_cancelled())
        if (++spins % 64 == 0 && weft_yield() == WEFT_ECANCELED)
            return (void *)(uintptr_t)1; /* yield reported it */
    return (void *)(uintptr_t)2;          /* the flag reported it */
}

static void test_cancelled_while_running_sees_the_flag_and_suspension_points_fail(void **state)
{
    (void)state;
    enum { N = 64 };
    weft_runtime *rt = start(2);
    weft_task *ts[N];
    atomic_store(&ran, 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(weft_spawn(rt, &ts[i], spin_until_cancelled, NULL, NULL), WEFT_OK);
    while (atomic_load(&ran) < N) /* all running (or suspended in yield) */
        ;
    for (int i = 0; i < N; i++)
        assert_int_equal(weft_cancel(ts[i]), WEFT_OK);
    for (int i = 0; i < N; i++) {
        void *r = NULL;
        assert_int_equal(weft_join(ts[i], &r), WEFT_ETASKCANCELED);
        assert_true(r == (void *)1 || r == (void *)2);
    }
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void *sleep_long(void *arg)
{
    (void)arg;
    atomic_fetch_add(&ran, 1);
    return (void *)(intptr_t)weft_sleep_ns(60ull * 1000000000u);
}

static void *wait_forever(void *arg)
{
    weft_task *target = arg; /* never finishes on its own */
    atomic_fetch_add(&ran, 1);
    return (void *)(intptr_t)weft_when_all(&target, 1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void test_cancelled_while_suspended_wakes_with_ecanceled(void **state)
{
    (void)state;
    enum { N = 500 };
    weft_runtime *rt = start(2);
    weft_task *sleepers[N], *joiners[N], *target;
    atomic_store(&ran, 0);
    assert_int_equal(weft_spawn(rt, &target, sleep_long, NULL, NULL), WEFT_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(weft_spawn(rt, &sleepers[i], sleep_long, NULL, NULL), WEFT_OK);
        assert_int_equal(weft_spawn(rt, &joiners[i], wait_forever, target, NULL), WEFT_OK);
    }
    while (atomic_load(&ran) < 2 * N + 1)
        ;
    uint64_t t0 = now_ns();
    for (int i = 0; i < N; i++) {
        assert_int_equal(weft_cancel(sleepers[i]), WEFT_OK);
        assert_int_equal(weft_cancel(joiners[i]), WEFT_OK);
    }
    for (int i = 0; i < N; i++) {
        void *r;
        assert_int_equal(weft_join(sleepers[i], &r), WEFT_ETASKCANCELED);
        assert_int_equal((intptr_t)r, WEFT_ECANCELED);
        assert_int_equal(weft_join(joiners[i], &r), WEFT_ETASKCANCELED);
        /* the cancelled joiner's wait ended, or it had not started waiting */
        assert_int_equal((intptr_t)r, WEFT_ECANCELED);
    }
    assert_true(now_ns() - t0 < 30ull * 1000000000u); /* not the 60 s sleep */
    /* target is still joinable by someone else after its joiners left */
    assert_int_equal(weft_cancel(target), WEFT_OK);
    assert_int_equal(weft_join(target, NULL), WEFT_ETASKCANCELED);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- whose cancellation a join reports ---------------------------------- */

/* Cancels itself when asked, then joins its target and returns what the
 * join said: the caller's own cancellation, whatever the target's state. */
typedef struct joiner {
    weft_task *target;
    bool cancel_self;
} joiner;

static void *join_target(void *arg)
{
    joiner *j = arg;
    atomic_fetch_add(&ran, 1);
    if (j->cancel_self)
        weft_cancel(weft_task_current());
    return (void *)(intptr_t)weft_join(j->target, NULL);
}

static void test_join_tells_a_cancelled_caller_from_a_cancelled_task(void **state)
{
    (void)state;
    weft_runtime *rt = start(2);
    atomic_store(&ran, 0);
    weft_task *target, *done_target, *t;
    void *r = NULL;

    /* the caller cancelled while it waits: ECANCELED, target still joinable */
    assert_int_equal(weft_spawn(rt, &target, sleep_long, NULL, NULL), WEFT_OK);
    joiner waiting = {.target = target};
    assert_int_equal(weft_spawn(rt, &t, join_target, &waiting, NULL), WEFT_OK);
    while (atomic_load(&ran) < 2)
        ;
    assert_int_equal(weft_cancel(t), WEFT_OK);
    assert_int_equal(weft_join(t, &r), WEFT_ETASKCANCELED); /* t itself was cancelled */
    assert_int_equal((intptr_t)r, WEFT_ECANCELED);          /* its join: the caller's */

    /* the target cancelled: ETASKCANCELED, and the handle is gone */
    assert_int_equal(weft_cancel(target), WEFT_OK);
    assert_int_equal(weft_join_until(target, NULL, UINT64_MAX - 1), WEFT_ETASKCANCELED);
    assert_string_equal(weft_strerror(WEFT_ETASKCANCELED), "joined task was cancelled");

    /* both cancelled, target finished: the caller's cancellation wins and
     * leaves the handle to a later join, which reports the target's */
    assert_int_equal(weft_spawn(rt, &done_target, sleep_long, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_cancel(done_target), WEFT_OK);
    assert_int_equal(weft_when_all(&done_target, 1), WEFT_OK);
    joiner cancelled = {.target = done_target, .cancel_self = true};
    assert_int_equal(weft_spawn(rt, &t, join_target, &cancelled, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, &r), WEFT_ETASKCANCELED);
    assert_int_equal((intptr_t)r, WEFT_ECANCELED);
    assert_int_equal(weft_join(done_target, NULL), WEFT_ETASKCANCELED);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- storm ------------------------------------------------------------- */

enum { STORM = 2000 };
static weft_task *storm_tasks[STORM];

static void *storm_body(void *arg)
{
    uintptr_t i = (uintptr_t)arg;
    int rc = WEFT_OK;
    for (int step = 0; step < 20 && rc == WEFT_OK; step++) {
        switch ((i + step) % 3) {
        case 0:
            rc = weft_yield();
            break;
        case 1:
            rc = weft_sleep_ns(100000 * ((i + step) % 7));
            break;
        case 2: {
            weft_task *child;
            rc = weft_spawn(weft_runtime_current(), &child, count_run, NULL, NULL);
            if (rc == WEFT_OK && (rc = weft_join(child, NULL)) == WEFT_ECANCELED)
                weft_detach(child); /* we may no longer wait: let it go */
            break;
        }
        }
    }
    return (void *)(intptr_t)rc;
}

static void *canceller(void *arg)
{
    (void)arg;
    for (int i = 0; i < STORM; i += 3) {
        weft_cancel(storm_tasks[(i * 7919) % STORM]);
        if (i % 64 == 0)
            weft_yield();
    }
    return NULL;
}

static void test_cancellation_storm_ends_every_task_and_loses_nothing(void **state)
{
    (void)state;
    weft_runtime *rt = start(0);
    for (uintptr_t i = 0; i < STORM; i++)
        assert_int_equal(weft_spawn(rt, &storm_tasks[i], storm_body, (void *)i, NULL), WEFT_OK);
    weft_task *c;
    assert_int_equal(weft_spawn(rt, &c, canceller, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_join(c, NULL), WEFT_OK);
    bool targeted[STORM] = {false};
    for (int i = 0; i < STORM; i += 3)
        targeted[(i * 7919) % STORM] = true;
    for (int i = 0; i < STORM; i++) {
        void *r;
        int rc = weft_join(storm_tasks[i], &r);
        if (!targeted[i]) {
            assert_int_equal(rc, WEFT_OK);
            assert_int_equal((intptr_t)r, WEFT_OK);
        } else {
            /* cancelled, unless it had already finished */
            assert_true(rc == WEFT_ETASKCANCELED || (rc == WEFT_OK && (intptr_t)r == WEFT_OK));
        }
    }
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cancelled_before_start_never_runs_and_join_says_so),
        cmocka_unit_test(test_cancelled_while_running_sees_the_flag_and_suspension_points_fail),
        cmocka_unit_test(test_cancelled_while_suspended_wakes_with_ecanceled),
        cmocka_unit_test(test_join_tells_a_cancelled_caller_from_a_cancelled_task),
        cmocka_unit_test(test_cancellation_storm_ends_every_task_and_loses_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
