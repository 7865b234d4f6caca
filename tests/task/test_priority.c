/*
 * test_priority.c - high before normal, and low never starved.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdbool.h>

#include "weft.h"

enum { EACH = 100 };

static atomic_bool gate_open;
static atomic_int log_len;
static int run_log[3 * EACH];

static void *hold_worker(void *arg)
{
    (void)arg;
    while (!atomic_load(&gate_open))
        ;
    return NULL;
}

static void *record_priority(void *arg)
{
    run_log[atomic_fetch_add(&log_len, 1)] = (int)(intptr_t)arg;
    return NULL;
}

static void test_ready_high_priority_tasks_run_before_normal_ones(void **state)
{
    (void)state;
    weft_config cfg = {.workers = 1};
    weft_runtime *rt;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    atomic_store(&gate_open, false);
    atomic_store(&log_len, 0);
    weft_task *gate, *ts[2 * EACH];
    assert_int_equal(weft_spawn(rt, &gate, hold_worker, NULL, NULL), WEFT_OK);
    /* Interleave the spawns so that arrival order says nothing. */
    for (int i = 0; i < 2 * EACH; i++) {
        weft_task_opts opts = {.priority = i % 2 ? WEFT_PRIO_HIGH : WEFT_PRIO_NORMAL};
        assert_int_equal(weft_spawn(rt, &ts[i], record_priority, (void *)(intptr_t)opts.priority,
                                    &opts),
                         WEFT_OK);
    }
    atomic_store(&gate_open, true);
    for (int i = 0; i < 2 * EACH; i++)
        assert_int_equal(weft_join(ts[i], NULL), WEFT_OK);
    assert_int_equal(weft_join(gate, NULL), WEFT_OK);
    assert_int_equal(atomic_load(&log_len), 2 * EACH);
    for (int i = 0; i < EACH; i++)
        assert_int_equal(run_log[i], WEFT_PRIO_HIGH);
    for (int i = EACH; i < 2 * EACH; i++)
        assert_int_equal(run_log[i], WEFT_PRIO_NORMAL);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* A chain of normal tasks that never lets the worker go idle: each spawns
 * its successor before finishing, until the low task has run. */
static atomic_bool low_ran;
static atomic_long chain_links;

static void *chain(void *arg)
{
    (void)arg;
    atomic_fetch_add(&chain_links, 1);
    if (!atomic_load(&low_ran) && atomic_load(&chain_links) < 10000000)
        weft_spawn(weft_runtime_current(), NULL, chain, NULL, NULL);
    return NULL;
}

static void *low_body(void *arg)
{
    (void)arg;
    atomic_store(&low_ran, true);
    return NULL;
}

static void test_low_priority_runs_even_while_normal_work_never_ends(void **state)
{
    (void)state;
    weft_config cfg = {.workers = 1};
    weft_runtime *rt;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    atomic_store(&low_ran, false);
    atomic_store(&chain_links, 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(weft_spawn(rt, NULL, chain, NULL, NULL), WEFT_OK);
    weft_task_opts low = {.priority = WEFT_PRIO_LOW};
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, low_body, NULL, &low), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_true(atomic_load(&low_ran));
    /* it ran while the chain was still going, not after it gave up */
    assert_true(atomic_load(&chain_links) < 10000000);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_high_priority_tasks_run_before_normal_ones),
        cmocka_unit_test(test_low_priority_runs_even_while_normal_work_never_ends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
