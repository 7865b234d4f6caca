/*
 * test_region_host.c - graph regions on the host backend: they run eagerly,
 * keep nothing to replay, and the rules hold (no suspending inside, no
 * nesting, end needs begin, no replay inside a region).
 * Explicit graphs are for CUDA: the host backend refuses them clearly.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "weft.h"
#include "weft_test.h"

static void add_one(void *arg)
{
    int *v = arg;
    for (int i = 0; i < 64; i++)
        v[i] += 1;
}

/* The same region run many times with different buffers: every run does
 * its own work, in order with the work around it. */
static void *repeat_region(void *arg)
{
    (void)arg;
    int in[64], out[64];
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 64; i++)
            in[i] = round * 100 + i;
        memset(out, 0xa7, sizeof out);
        if (weft_region_begin(7) || weft_memcpy_async(out, in, sizeof in) ||
            weft_host_async(add_one, out) || weft_region_end() || weft_host_async(add_one, out) ||
            weft_await())
            return (void *)1;
        for (int i = 0; i < 64; i++)
            if (out[i] != round * 100 + i + 2)
                return (void *)2;
    }
    return NULL;
}

static void test_regions_run_eagerly_on_the_host(void **state)
{
    weft_task *t = spawn(*state, repeat_region, NULL);
    void *r = (void *)99;
    assert_int_equal(weft_join(t, &r), WEFT_OK);
    assert_null(r);
    weft_stats st;
    memset(&st, 0xa7, sizeof st);
    assert_int_equal(weft_stats_get(*state, &st), WEFT_OK);
    assert_int_equal(st.graph.launches, 0); /* eager: no graph was launched */
    assert_int_equal(st.graph.instantiations, 0);
    assert_int_equal(st.devices, 1);
}

static void *misuse(void *arg)
{
    (void)arg;
    intptr_t bad = 0;
    int v[64] = {0};
    bad |= (weft_region_end() != WEFT_ESTATE) << 0; /* end without begin */
    bad |= (weft_region_begin(1) != WEFT_OK) << 1;
    bad |= (weft_region_begin(2) != WEFT_ESTATE) << 2; /* no nesting */
    bad |= (weft_host_async(add_one, v) != WEFT_OK) << 3;
    bad |= (weft_await() != WEFT_ESTATE) << 4; /* no suspending inside */
    bad |= (weft_yield() != WEFT_ESTATE) << 5;
    bad |= (weft_sleep_ns(1000) != WEFT_ESTATE) << 6;
    bad |= (weft_region_end() != WEFT_ESTATE) << 7; /* the region was dropped */
    bad |= (weft_await() != WEFT_OK) << 8;          /* and the task goes on */
    bad |= (weft_region_begin(3) != WEFT_OK) << 9;  /* a new region works */
    weft_event *ev = NULL;
    bad |= (weft_event_record(&ev) != WEFT_ESTATE) << 11; /* no events inside */
    bad |= (weft_region_end() != WEFT_OK) << 10;
    int replayed = -1; /* the host backend keeps no graph to replay */
    bad |= (weft_region_replay(3, &replayed) != WEFT_OK || replayed != 0) << 12;
    bad |= (weft_region_replay(3, NULL) != WEFT_EINVAL) << 13;
    bad |= (weft_region_begin(4) != WEFT_OK) << 14;
    bad |= (weft_region_replay(4, &replayed) != WEFT_ESTATE) << 15; /* not inside a region */
    bad |= (weft_region_end() != WEFT_OK) << 16;
    return (void *)bad;
}

static void test_region_misuse_gets_clear_errors_and_the_task_goes_on(void **state)
{
    weft_task *t = spawn(*state, misuse, NULL);
    void *r = (void *)-1;
    assert_int_equal(weft_join(t, &r), WEFT_OK);
    assert_int_equal((intptr_t)r, 0);
    assert_int_equal(weft_region_begin(1), WEFT_ENOTASK);
    assert_int_equal(weft_region_end(), WEFT_ENOTASK);
    int replayed = -1;
    assert_int_equal(weft_region_replay(1, &replayed), WEFT_ENOTASK);
    weft_graph_stats st;
    assert_int_equal(weft_graph_stats_get(*state, &st), WEFT_OK);
    assert_int_equal(st.launches, 0); /* the host backend launches no graphs */
    assert_int_equal(weft_graph_stats_get(*state, NULL), WEFT_EINVAL);
}

static void *return_inside_region(void *arg)
{
    int *v = arg;
    weft_region_begin(5);
    weft_host_async(add_one, v);
    return NULL; /* the region is dropped; the work before it is awaited */
}

static void test_returning_inside_a_region_is_safe(void **state)
{
    int v[64] = {0};
    weft_task *t = spawn(*state, return_inside_region, v);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
}

static void test_explicit_graphs_are_refused_with_a_reason(void **state)
{
    weft_graph *g = (weft_graph *)&g; /* not NULL: the call must clear it */
    assert_int_equal(weft_graph_create(*state, &g), WEFT_EINVAL);
    assert_null(g);
    assert_non_null(strstr(weft_last_error(), "CUDA"));
    assert_int_equal(weft_graph_launch(NULL), WEFT_EINVAL);
    assert_int_equal(weft_graph_destroy(NULL), WEFT_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regions_run_eagerly_on_the_host),
        cmocka_unit_test(test_region_misuse_gets_clear_errors_and_the_task_goes_on),
        cmocka_unit_test(test_returning_inside_a_region_is_safe),
        cmocka_unit_test(test_explicit_graphs_are_refused_with_a_reason),
    };
    return cmocka_run_group_tests(tests, setup_host_rt, teardown_rt);
}
