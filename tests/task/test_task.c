/*
 * test_task.c - spawn, join, when_all, when_any, yield, sleep, detach, and
 * the runtime's life cycle, through the public API.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "weft.h"
#include "weft_test.h"

static weft_runtime *start(unsigned workers)
{
    weft_config cfg = {.workers = workers};
    weft_runtime *rt = NULL;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    assert_non_null(rt);
    return rt;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- many empty tasks -------------------------------------------------- */

static void *identity(void *arg)
{
    return arg;
}

enum { EMPTY_TASKS = 1000000, BATCH = 1000 };

static void *spawn_and_join_batches(void *arg)
{
    weft_runtime *rt = weft_runtime_current();
    size_t count = (size_t)(uintptr_t)arg;
    weft_task *batch[BATCH];
    uintptr_t sum = 0;
    for (size_t done = 0; done < count; done += BATCH) {
        for (size_t i = 0; i < BATCH; i++)
            if (weft_spawn(rt, &batch[i], identity, (void *)(uintptr_t)(done + i + 1), NULL))
                return NULL;
        for (size_t i = 0; i < BATCH; i++) {
            void *r;
            if (weft_join(batch[i], &r))
                return NULL;
            sum += (uintptr_t)r;
        }
    }
    return (void *)sum;
}

static void test_million_empty_tasks_each_return_their_argument(void **state)
{
    (void)state;
    weft_runtime *rt = start(2);
    enum { SPAWNERS = 4 };
    weft_task *roots[SPAWNERS];
    for (int i = 0; i < SPAWNERS; i++)
        assert_int_equal(weft_spawn(rt, &roots[i], spawn_and_join_batches,
                                    (void *)(uintptr_t)(EMPTY_TASKS / SPAWNERS), NULL),
                         WEFT_OK);
    uintptr_t n = EMPTY_TASKS / SPAWNERS, expect = n * (n + 1) / 2;
    for (int i = 0; i < SPAWNERS; i++) {
        void *sum;
        assert_int_equal(weft_join(roots[i], &sum), WEFT_OK);
        assert_int_equal((uintptr_t)sum, expect);
    }
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- recursive fib ----------------------------------------------------- */

static void *fib(void *arg)
{
    uintptr_t n = (uintptr_t)arg;
    if (n < 2)
        return (void *)n;
    weft_task *child;
    if (weft_spawn(weft_runtime_current(), &child, fib, (void *)(n - 1), NULL))
        return (void *)UINTPTR_MAX;
    uintptr_t b = (uintptr_t)fib((void *)(n - 2));
    void *a;
    if (weft_join(child, &a))
        return (void *)UINTPTR_MAX;
    return (void *)((uintptr_t)a + b);
}

static void test_fib27_by_spawn_and_join(void **state)
{
    (void)state;
    weft_runtime *rt = start(0);
    weft_task *t;
    void *r;
    assert_int_equal(weft_spawn(rt, &t, fib, (void *)27, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, &r), WEFT_OK);
    assert_int_equal((uintptr_t)r, 196418);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- groups ------------------------------------------------------------ */

static atomic_int finished;

static void *count_after_yields(void *arg)
{
    for (uintptr_t i = 0; i < (uintptr_t)arg % 4; i++)
        weft_yield();
    atomic_fetch_add(&finished, 1);
    return arg;
}

static void test_when_all_over_10000_tasks_waits_for_every_one(void **state)
{
    (void)state;
    const size_t N = weft_test_live(10000);
    weft_runtime *rt = start(2);
    weft_task **ts = malloc(N * sizeof *ts);
    atomic_store(&finished, 0);
    for (uintptr_t i = 0; i < N; i++)
        assert_int_equal(weft_spawn(rt, &ts[i], count_after_yields, (void *)i, NULL), WEFT_OK);
    assert_int_equal(weft_when_all(ts, N), WEFT_OK);
    assert_int_equal(atomic_load(&finished), (int)N);
    for (uintptr_t i = 0; i < N; i++) {
        void *r;
        assert_int_equal(weft_join(ts[i], &r), WEFT_OK);
        assert_int_equal((uintptr_t)r, i);
    }
    free(ts);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void *sleep_task(void *arg)
{
    return (void *)(intptr_t)weft_sleep_ns((uint64_t)(uintptr_t)arg * 1000000u);
}

static void *when_any_in_task(void *arg)
{
    (void)arg;
    weft_runtime *rt = weft_runtime_current();
    weft_task *ts[3];
    weft_spawn(rt, &ts[0], sleep_task, (void *)(uintptr_t)400, NULL);
    weft_spawn(rt, &ts[1], sleep_task, (void *)(uintptr_t)5, NULL);
    weft_spawn(rt, &ts[2], sleep_task, (void *)(uintptr_t)300, NULL);
    size_t first = 99;
    int rc = weft_when_any(ts, 3, &first);
    for (int i = 0; i < 3; i++) {
        weft_cancel(ts[i]);
        weft_join(ts[i], NULL);
    }
    return (void *)(uintptr_t)(rc == WEFT_OK ? first : 100);
}

static void test_when_any_returns_the_first_task_to_finish(void **state)
{
    (void)state;
    weft_runtime *rt = start(2);
    weft_task *t;
    void *r;
    assert_int_equal(weft_spawn(rt, &t, when_any_in_task, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, &r), WEFT_OK);
    assert_int_equal((uintptr_t)r, 1);

    /* From a plain thread, with one task already finished. */
    weft_task *ts[2];
    assert_int_equal(weft_spawn(rt, &ts[0], sleep_task, (void *)(uintptr_t)1000, NULL), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &ts[1], identity, NULL, NULL), WEFT_OK);
    size_t first = 99;
    assert_int_equal(weft_when_any(ts, 2, &first), WEFT_OK);
    assert_int_equal(first, 1);
    assert_int_equal(weft_cancel(ts[0]), WEFT_OK);
    assert_int_equal(weft_join(ts[0], NULL), WEFT_ETASKCANCELED);
    assert_int_equal(weft_join(ts[1], NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- sleeping and yielding --------------------------------------------- */

static void test_sleep_waits_at_least_the_time_asked_without_blocking_workers(void **state)
{
    (void)state;
    /* One worker, 200 sleepers of 50 ms each: if sleeping blocked the worker
     * this would take 10 s; suspended, all sleep at once. */
    enum { N = 200 };
    weft_runtime *rt = start(1);
    weft_task *ts[N];
    uint64_t t0 = now_ns();
    for (int i = 0; i < N; i++)
        assert_int_equal(weft_spawn(rt, &ts[i], sleep_task, (void *)(uintptr_t)50, NULL), WEFT_OK);
    for (int i = 0; i < N; i++) {
        void *r;
        assert_int_equal(weft_join(ts[i], &r), WEFT_OK);
        assert_int_equal((intptr_t)r, WEFT_OK);
    }
    uint64_t elapsed = now_ns() - t0;
    assert_true(elapsed >= 50000000u);
    assert_true(elapsed < 5000000000u);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static atomic_int turn;

static void *take_turns(void *arg)
{
    int me = (int)(uintptr_t)arg, bad = 0;
    for (int round = 0; round < 100; round++) {
        while (atomic_load(&turn) % 2 != me)
            weft_yield(); /* with one worker, only yielding lets the other run */
        atomic_fetch_add(&turn, 1);
    }
    return (void *)(uintptr_t)bad;
}

static void test_yield_lets_other_tasks_run_on_one_worker(void **state)
{
    (void)state;
    weft_runtime *rt = start(1);
    weft_task *a, *b;
    atomic_store(&turn, 0);
    assert_int_equal(weft_spawn(rt, &a, take_turns, (void *)0, NULL), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &b, take_turns, (void *)1, NULL), WEFT_OK);
    assert_int_equal(weft_join(a, NULL), WEFT_OK);
    assert_int_equal(weft_join(b, NULL), WEFT_OK);
    assert_int_equal(atomic_load(&turn), 200);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- detach and destroy ------------------------------------------------ */

static atomic_int detached_done;

static void *detached_body(void *arg)
{
    weft_sleep_ns((uint64_t)(uintptr_t)arg * 100000u);
    atomic_fetch_add(&detached_done, 1);
    return NULL;
}

static void test_destroy_waits_for_detached_and_unjoined_tasks(void **state)
{
    (void)state;
    weft_runtime *rt = start(2);
    atomic_store(&detached_done, 0);
    for (uintptr_t i = 0; i < 100; i++)
        assert_int_equal(weft_spawn(rt, NULL, detached_body, (void *)(i % 10), NULL), WEFT_OK);
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, detached_body, (void *)5, NULL), WEFT_OK);
    assert_int_equal(weft_detach(t), WEFT_OK);
    assert_int_equal(weft_detach(t), WEFT_ESTATE);
    weft_task *unjoined;
    assert_int_equal(weft_spawn(rt, &unjoined, detached_body, (void *)3, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    assert_int_equal(atomic_load(&detached_done), 102);
    /* The record stays recognizable: calls on it fail cleanly. */
    assert_int_equal(weft_runtime_destroy(rt), WEFT_ESTATE);
    assert_int_equal(weft_spawn(rt, NULL, identity, NULL, NULL), WEFT_ESTATE);
    assert_int_equal(weft_runtime_workers(rt), 0);
}

static void *destroy_own_runtime(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)weft_runtime_destroy(weft_runtime_current());
}

static void *spawn_more_while_dying(void *arg)
{
    weft_sleep_ns(20000000); /* until destroy has begun */
    weft_task *t;
    int rc = weft_spawn(weft_runtime_current(), &t, identity, arg, NULL);
    void *r = NULL;
    if (rc == WEFT_OK)
        rc = weft_join(t, &r);
    return rc == WEFT_OK ? r : NULL;
}

static void test_runtime_life_cycle_errors(void **state)
{
    (void)state;
    weft_runtime *rt = start(1);
    weft_task *t;
    void *r;
    assert_int_equal(weft_spawn(rt, &t, destroy_own_runtime, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, &r), WEFT_OK);
    assert_int_equal((intptr_t)r, WEFT_EDEADLK);

    /* A task of a dying runtime may still spawn (it is part of finishing). */
    assert_int_equal(weft_spawn(rt, NULL, spawn_more_while_dying, (void *)7, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);

    assert_int_equal(weft_runtime_create(NULL, NULL), WEFT_EINVAL);
    weft_config bad = {.stack_size = 100};
    assert_int_equal(weft_runtime_create(&rt, &bad), WEFT_EINVAL);
    bad = (weft_config){.backend = 42};
    assert_int_equal(weft_runtime_create(&rt, &bad), WEFT_EINVAL);
    bad = (weft_config){.workers = 1u << 30};
    assert_int_equal(weft_runtime_create(&rt, &bad), WEFT_EINVAL);
    assert_int_equal(weft_runtime_destroy(NULL), WEFT_EINVAL);
    assert_string_not_equal(weft_last_error(), "no error");
}

/* ---- bad arguments ----------------------------------------------------- */

static void test_bad_arguments_are_refused_with_a_message(void **state)
{
    (void)state;
    weft_runtime *rt = start(1);
    weft_task *t;

    assert_int_equal(weft_spawn(NULL, &t, identity, NULL, NULL), WEFT_EINVAL);
    assert_int_equal(weft_spawn(rt, &t, NULL, NULL, NULL), WEFT_EINVAL);
    assert_string_equal(weft_last_error(), "weft_spawn: fn is NULL");
    weft_task_opts opts = {.priority = 7};
    assert_int_equal(weft_spawn(rt, &t, identity, NULL, &opts), WEFT_EINVAL);
    opts = (weft_task_opts){.stack_size = 1};
    assert_int_equal(weft_spawn(rt, &t, identity, NULL, &opts), WEFT_EINVAL);

    assert_int_equal(weft_join(NULL, NULL), WEFT_EINVAL);
    assert_int_equal(weft_join((weft_task *)(uintptr_t)3, NULL), WEFT_EINVAL);
    assert_int_equal(weft_detach(NULL), WEFT_EINVAL);
    assert_int_equal(weft_cancel(NULL), WEFT_EINVAL);
    assert_int_equal(weft_when_all(NULL, 1), WEFT_EINVAL);
    assert_int_equal(weft_when_all(NULL, 0), WEFT_OK);
    size_t first;
    assert_int_equal(weft_when_any(NULL, 0, &first), WEFT_EINVAL);

    /* joining twice */
    assert_int_equal(weft_spawn(rt, &t, identity, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_ESTATE);
    /* the message weft.h and docs/guide.md quote */
    assert_string_equal(weft_last_error(), "weft_join: task handle was already joined or detached, "
                                           "or its runtime destroyed");
    assert_int_equal(weft_cancel(t), WEFT_ESTATE);
    weft_task *stale[1] = {t};
    assert_int_equal(weft_when_all(stale, 1), WEFT_ESTATE);

    /* task-only calls from a thread */
    assert_int_equal(weft_yield(), WEFT_ENOTASK);
    assert_int_equal(weft_sleep_ns(1), WEFT_ENOTASK);
    assert_int_equal(weft_await(), WEFT_ENOTASK);
    assert_int_equal(weft_memcpy_async(&t, &t, sizeof t), WEFT_ENOTASK);
    assert_int_equal(weft_memset_async(&t, 0, sizeof t), WEFT_ENOTASK);
    assert_int_equal(weft_host_async(free, NULL), WEFT_ENOTASK);
    assert_int_equal(weft_cancelled(), 0);
    assert_null(weft_task_current());
    assert_null(weft_runtime_current());
    assert_int_equal(weft_runtime_workers(rt), 1);

    assert_string_equal(weft_strerror(WEFT_OK), "success");
    assert_string_equal(weft_strerror(WEFT_ECANCELED), "task cancelled");
    assert_string_equal(weft_strerror(12345), "unknown status");
    assert_string_equal(weft_strerror(-12345), "unknown status");
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void *join_self(void *arg)
{
    (void)arg;
    weft_task *me = weft_task_current();
    weft_task *group[1] = {me};
    size_t first;
    int a = weft_join(me, NULL), b = weft_when_all(group, 1), c = weft_when_any(group, 1, &first);
    return (void *)(uintptr_t)(a == WEFT_EDEADLK && b == WEFT_EDEADLK && c == WEFT_EDEADLK);
}

static void test_a_task_waiting_for_itself_gets_edeadlk(void **state)
{
    (void)state;
    weft_runtime *rt = start(1);
    weft_task *t;
    void *ok;
    assert_int_equal(weft_spawn(rt, &t, join_self, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, &ok), WEFT_OK);
    assert_int_equal((uintptr_t)ok, 1);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- 100,000 suspended tasks ------------------------------------------- */

static size_t suspended; /* 100,000; fewer under TSan (weft_test.h) */
static atomic_size_t arrived;

static void *wait_for_gate(void *arg)
{
    weft_task *gate = arg;
    atomic_fetch_add(&arrived, 1);
    size_t first;
    return (void *)(intptr_t)weft_when_any(&gate, 1, &first);
}

static void *gate_body(void *arg)
{
    (void)arg;
    /* Open only once every waiter is suspended on us. */
    while (atomic_load(&arrived) < suspended)
        weft_sleep_ns(1000000);
    return NULL;
}

static void test_100000_tasks_suspended_at_once(void **state)
{
    (void)state;
    weft_config cfg = {.workers = 2, .stack_size = 64 * 1024};
    weft_runtime *rt;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    suspended = weft_test_live(100000);
    weft_task *gate, **ts = malloc(suspended * sizeof *ts);
    atomic_store(&arrived, 0);
    assert_int_equal(weft_spawn(rt, &gate, gate_body, NULL, NULL), WEFT_OK);
    for (size_t i = 0; i < suspended; i++)
        assert_int_equal(weft_spawn(rt, &ts[i], wait_for_gate, gate, NULL), WEFT_OK);
    for (size_t i = 0; i < suspended; i++) {
        void *r;
        assert_int_equal(weft_join(ts[i], &r), WEFT_OK);
        assert_int_equal((intptr_t)r, WEFT_OK);
    }
    assert_int_equal(weft_join(gate, NULL), WEFT_OK);
    free(ts);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- several runtimes -------------------------------------------------- */

static void *in_which_runtime(void *arg)
{
    return weft_runtime_current() == arg ? arg : NULL;
}

static void test_runtimes_coexist_and_tasks_know_theirs(void **state)
{
    (void)state;
    weft_runtime *a = start(1), *b = start(2);
    weft_task *ta, *tb;
    void *ra, *rb;
    assert_int_equal(weft_spawn(a, &ta, in_which_runtime, a, NULL), WEFT_OK);
    assert_int_equal(weft_spawn(b, &tb, in_which_runtime, b, NULL), WEFT_OK);
    assert_int_equal(weft_join(ta, &ra), WEFT_OK);
    assert_int_equal(weft_join(tb, &rb), WEFT_OK);
    assert_ptr_equal(ra, a);
    assert_ptr_equal(rb, b);
    assert_int_equal(weft_runtime_destroy(a), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(b), WEFT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_million_empty_tasks_each_return_their_argument),
        cmocka_unit_test(test_fib27_by_spawn_and_join),
        cmocka_unit_test(test_when_all_over_10000_tasks_waits_for_every_one),
        cmocka_unit_test(test_when_any_returns_the_first_task_to_finish),
        cmocka_unit_test(test_sleep_waits_at_least_the_time_asked_without_blocking_workers),
        cmocka_unit_test(test_yield_lets_other_tasks_run_on_one_worker),
        cmocka_unit_test(test_destroy_waits_for_detached_and_unjoined_tasks),
        cmocka_unit_test(test_runtime_life_cycle_errors),
        cmocka_unit_test(test_bad_arguments_are_refused_with_a_message),
        cmocka_unit_test(test_a_task_waiting_for_itself_gets_edeadlk),
        cmocka_unit_test(test_100000_tasks_suspended_at_once),
        cmocka_unit_test(test_runtimes_coexist_and_tasks_know_theirs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
