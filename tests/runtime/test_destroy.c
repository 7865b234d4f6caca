/*
 * test_destroy.c - weft_runtime_destroy racing the other calls on the
 * runtime, and handles used after their runtime is gone.
 *
 * The rules pinned down: every call on a runtime either completes before
 * destroy proceeds or returns WEFT_ESTATE; a spawn that returned WEFT_OK runs
 * to its end before destroy returns; a handle of a destroyed runtime is
 * refused with WEFT_ESTATE, also once its runtime's record is reused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "weft.h"
#include "weft_test.h"

/* ---- destroy racing calls from many threads ------------------------------ */

enum { SPAWNERS = 12, OTHERS = 6, ROUNDS = 20, BACKLOG = 32 };

static weft_runtime *racing_rt;
static atomic_bool go;
static atomic_long ran;      /* tasks that ran to their end */
static atomic_long accepted; /* spawns that returned WEFT_OK */
static atomic_uint started;  /* threads that made their first call */
static bool with_joins;      /* spawners also join and detach */
static atomic_int wrong;     /* results the rules rule out (cmocka asserts
                                only on the test's own thread) */
#define EXPECT(cond) ((cond) ? (void)0 : (void)atomic_fetch_add(&wrong, 1))

/* Host memory whose free was refused (destroy began in between): kept
 * reachable, as a program would have to keep it. */
static void *stranded[1024];
static atomic_uint nstranded;

static void *leaf(void *arg)
{
    (void)arg;
    atomic_fetch_add(&ran, 1);
    return NULL;
}

/* From a task, a spawn is accepted even while the runtime is being
 * destroyed: destroy waits for the task, and so for its children. */
static void *parent(void *arg)
{
    (void)arg;
    int rc = weft_spawn(weft_runtime_current(), NULL, leaf, NULL, NULL);
    EXPECT(rc == WEFT_OK);
    if (rc == WEFT_OK)
        atomic_fetch_add(&accepted, 1);
    atomic_fetch_add(&ran, 1);
    return NULL;
}

/* Spawn (detached, joinable, from tasks) until the runtime refuses. */
static void *spawner(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg, n = 0;
    while (!atomic_load(&go))
        sched_yield(); /* two cores may be shared by all the threads */
    for (bool first = true;; first = false, n++) {
        /* spawns from 12 threads outpace 2 workers: keep the queue short */
        while (atomic_load(&accepted) - atomic_load(&ran) > BACKLOG)
            sched_yield();
        weft_task *t = NULL;
        bool joinable = with_joins && n % 4 == 1;
        void *(*fn)(void *) = (n + id) % 3 == 0 ? parent : leaf;
        int rc = weft_spawn(racing_rt, joinable ? &t : NULL, fn, NULL, NULL);
        if (first)
            atomic_fetch_add(&started, 1);
        if (rc == WEFT_ESTATE)
            break;
        EXPECT(rc == WEFT_OK);
        atomic_fetch_add(&accepted, 1);
        if (joinable) {
            /* each completes, or is refused because destroy began */
            bool released = false;
            if (n % 8 == 1) {
                rc = weft_join(t, NULL);
                released = rc == WEFT_OK;
            } else {
                rc = weft_when_all(&t, 1);
            }
            EXPECT(rc == WEFT_OK || rc == WEFT_ESTATE);
            if (!released) {
                rc = weft_detach(t);
                EXPECT(rc == WEFT_OK || rc == WEFT_ESTATE);
            }
        }
    }
    return NULL;
}

/* Every other call taking a runtime, until one says it was destroyed. */
static void *other_calls(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    while (!atomic_load(&go))
        sched_yield(); /* two cores may be shared by all the threads */
    for (bool first = true;; first = false) {
        int rc = WEFT_OK;
        switch (id % 6) {
        case 0: {
            weft_stats st;
            rc = weft_stats_get(racing_rt, &st);
            break;
        }
        case 1: {
            void *p = NULL;
            rc = weft_host_alloc(racing_rt, &p, 64);
            if (rc == WEFT_OK) {
                memset(p, 1, 64);
                rc = weft_host_free(racing_rt, p);
                EXPECT(rc == WEFT_OK || rc == WEFT_ESTATE);
                if (rc == WEFT_ESTATE && atomic_load(&nstranded) < 1024)
                    stranded[atomic_fetch_add(&nstranded, 1)] = p;
            }
            break;
        }
        case 2:
            if (strcmp(weft_backend_name(racing_rt), "none") == 0)
                rc = WEFT_ESTATE;
            break;
        case 3:
            if (weft_runtime_workers(racing_rt) == 0)
                rc = WEFT_ESTATE;
            break;
        case 4:
            if (weft_device_count(racing_rt) == 0)
                rc = WEFT_ESTATE;
            break;
        case 5: {
            weft_graph_stats gs;
            rc = weft_graph_stats_get(racing_rt, &gs);
            break;
        }
        }
        if (first)
            atomic_fetch_add(&started, 1);
        if (rc == WEFT_ESTATE)
            break;
        EXPECT(rc == WEFT_OK);
    }
    return NULL;
}

/* Rounds of threads calling while the main thread destroys the runtime:
 * spawners, and `others` threads making the other calls. */
static void race_destroy(unsigned others, bool joins, int rounds)
{
    with_joins = joins;
    for (int round = 0; round < rounds; round++) {
        weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST};
        assert_int_equal(weft_runtime_create(&racing_rt, &cfg), WEFT_OK);
        atomic_store(&go, false);
        atomic_store(&ran, 0);
        atomic_store(&accepted, 0);
        atomic_store(&started, 0);
        atomic_store(&wrong, 0);
        pthread_t th[SPAWNERS + others];
        for (unsigned i = 0; i < SPAWNERS + others; i++)
            assert_int_equal(pthread_create(&th[i], NULL, i < SPAWNERS ? spawner : other_calls,
                                            (void *)(uintptr_t)i),
                             0);
        atomic_store(&go, true);
        while (atomic_load(&started) < SPAWNERS + others)
            sched_yield();
        if (round % 2)
            sleep_ms(1);

        assert_int_equal(weft_runtime_destroy(racing_rt), WEFT_OK);
        long ran_by_destroy = atomic_load(&ran);
        for (unsigned i = 0; i < SPAWNERS + others; i++)
            pthread_join(th[i], NULL);
        /* every accepted spawn ran to its end before destroy returned */
        assert_int_equal(ran_by_destroy, atomic_load(&accepted));
        assert_int_equal(atomic_load(&wrong), 0);
        assert_int_equal(weft_spawn(racing_rt, NULL, leaf, NULL, NULL), WEFT_ESTATE);
    }
}

static void test_spawns_racing_destroy_run_or_are_refused(void **state)
{
    (void)state;
    race_destroy(0, false, 2 * ROUNDS);
}

static void test_calls_racing_destroy_complete_or_are_refused(void **state)
{
    (void)state;
    race_destroy(OTHERS, true, ROUNDS);
}

/* Several threads destroying one runtime: one succeeds, the others are
 * refused, and none touches what the winner freed. */
static atomic_int destroyed_ok, destroy_refused;

static void *destroyer(void *arg)
{
    (void)arg;
    while (!atomic_load(&go))
        sched_yield(); /* two cores may be shared by all the threads */
    int rc = weft_runtime_destroy(racing_rt);
    atomic_fetch_add(rc == WEFT_OK ? &destroyed_ok : &destroy_refused, 1);
    EXPECT(rc == WEFT_OK || rc == WEFT_ESTATE);
    return NULL;
}

static void test_concurrent_destroys_one_wins(void **state)
{
    (void)state;
    enum { N = 4 };
    for (int round = 0; round < ROUNDS; round++) {
        weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST};
        assert_int_equal(weft_runtime_create(&racing_rt, &cfg), WEFT_OK);
        atomic_store(&go, false);
        atomic_store(&destroyed_ok, 0);
        atomic_store(&destroy_refused, 0);
        atomic_store(&wrong, 0);
        pthread_t th[N];
        for (int i = 0; i < N; i++)
            assert_int_equal(pthread_create(&th[i], NULL, destroyer, NULL), 0);
        atomic_store(&go, true);
        for (int i = 0; i < N; i++)
            pthread_join(th[i], NULL);
        assert_int_equal(atomic_load(&destroyed_ok), 1);
        assert_int_equal(atomic_load(&destroy_refused), N - 1);
        assert_int_equal(atomic_load(&wrong), 0);
    }
}

/* ---- handles of a destroyed runtime ----------------------------------------- */

static void *answer(void *arg)
{
    return arg;
}

static void assert_every_handle_call_refused(weft_task *t)
{
    size_t first = 99;
    void *result = (void *)7;
    assert_int_equal(weft_join(t, &result), WEFT_ESTATE);
    assert_ptr_equal(result, (void *)7);
    assert_int_equal(weft_cancel(t), WEFT_ESTATE);
    assert_int_equal(weft_when_all(&t, 1), WEFT_ESTATE);
    assert_int_equal(weft_when_any(&t, 1, &first), WEFT_ESTATE);
    assert_int_equal(first, 99);
    assert_int_equal(weft_detach(t), WEFT_ESTATE);
}

static void test_handles_of_a_destroyed_runtime_are_refused(void **state)
{
    (void)state;
    enum { N = 100 };
    weft_config cfg = {.workers = 2};
    weft_runtime *rt;
    weft_task *ts[N];
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(weft_spawn(rt, &ts[i], answer, (void *)(uintptr_t)i, NULL), WEFT_OK);
    assert_int_equal(weft_when_all(ts, N), WEFT_OK); /* done, never joined */
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    for (int i = 0; i < N; i++)
        assert_every_handle_call_refused(ts[i]);
}

/* A new runtime may reuse the destroyed one's records (and its address):
 * the old handles still name nothing, and its own tasks are untouched. */
static void test_stale_handles_stay_refused_when_records_are_reused(void **state)
{
    (void)state;
    enum { N = 100 };
    weft_config cfg = {.workers = 2};
    weft_runtime *rt;
    weft_task *old[N], *fresh[N];
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(weft_spawn(rt, &old[i], answer, (void *)(uintptr_t)i, NULL), WEFT_OK);
    assert_int_equal(weft_when_all(old, N), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);

    weft_runtime *again;
    assert_int_equal(weft_runtime_create(&again, &cfg), WEFT_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(weft_spawn(again, &fresh[i], answer, (void *)(uintptr_t)(i + N), NULL),
                         WEFT_OK);
    assert_int_equal(weft_when_all(fresh, N), WEFT_OK);
    for (int i = 0; i < N; i++)
        assert_every_handle_call_refused(old[i]);
    for (int i = 0; i < N; i++) {
        void *r = NULL;
        assert_int_equal(weft_join(fresh[i], &r), WEFT_OK);
        assert_ptr_equal(r, (void *)(uintptr_t)(i + N));
    }
    assert_int_equal(weft_runtime_destroy(again), WEFT_OK);
}

/* A thread blocked in weft_join while another destroys the runtime: the
 * join was accepted first, so it completes with the task's result. */
static atomic_int gate;
static weft_task *blocked_on;
static atomic_int join_rc;

static void *wait_gate(void *arg)
{
    while (!atomic_load(&gate))
        weft_sleep_ns(100000);
    return arg;
}

static void *join_blocked(void *arg)
{
    void *r = NULL;
    (void)arg;
    atomic_store(&join_rc, weft_join(blocked_on, &r) == WEFT_OK && r == (void *)5 ? 1 : -1);
    return NULL;
}

static void *destroy_racing(void *arg)
{
    EXPECT(weft_runtime_destroy(arg) == WEFT_OK);
    return NULL;
}

static void test_join_in_progress_completes_before_destroy(void **state)
{
    (void)state;
    weft_config cfg = {.workers = 1};
    weft_runtime *rt;
    atomic_store(&gate, 0);
    atomic_store(&join_rc, 0);
    atomic_store(&wrong, 0);
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &blocked_on, wait_gate, (void *)5, NULL), WEFT_OK);
    pthread_t joiner, killer;
    assert_int_equal(pthread_create(&joiner, NULL, join_blocked, NULL), 0);
    sleep_ms(20); /* the join is blocked */
    assert_int_equal(pthread_create(&killer, NULL, destroy_racing, rt), 0);
    sleep_ms(20); /* destroy waits for the task (and the join) */
    atomic_store(&gate, 1);
    pthread_join(killer, NULL);
    pthread_join(joiner, NULL);
    assert_int_equal(atomic_load(&join_rc), 1);
    assert_int_equal(atomic_load(&wrong), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spawns_racing_destroy_run_or_are_refused),
        cmocka_unit_test(test_calls_racing_destroy_complete_or_are_refused),
        cmocka_unit_test(test_concurrent_destroys_one_wins),
        cmocka_unit_test(test_handles_of_a_destroyed_runtime_are_refused),
        cmocka_unit_test(test_stale_handles_stay_refused_when_records_are_reused),
        cmocka_unit_test(test_join_in_progress_completes_before_destroy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
