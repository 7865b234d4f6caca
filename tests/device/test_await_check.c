/*
 * test_await_check.c - a sibling library's checks on a task's await
 * (device/await_check.h), on the host backend: a check runs once the
 * task's work has drained and its failure is the await's result (a later
 * check of the same drain is released unrun); checks are consumed by the
 * drain that runs them; a task that ends without awaiting reports the
 * failure at its join; a check is refused, and released, outside a task
 * and without device work to ride on.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "core/error.h"
#include "device/await_check.h"
#include "weft.h"

typedef struct probe {
    int verdict;         /* what the check returns */
    atomic_int checked;  /* times the check ran */
    atomic_int released; /* times release ran */
    int work_seen;       /* the check saw the stream's work done */
    const int *word;
} probe;

static int check(void *arg)
{
    probe *p = arg;
    atomic_fetch_add(&p->checked, 1);
    p->work_seen = p->word && *p->word == 0x5a5a5a5a;
    if (p->verdict == WEFT_OK)
        return WEFT_OK;
    return weft__fail(p->verdict, "the watched operation failed");
}

static void release(void *arg)
{
    probe *p = arg;
    atomic_fetch_add(&p->released, 1);
}

static void slow_fill(void *arg)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    memset(arg, 0x5a, sizeof(int));
}

typedef struct run {
    probe ok, bad, late;
    int word;
    int first, second, refused_idle;
    char message[256];
} run;

static void *awaiting(void *arg)
{
    run *r = arg;
    probe idle = {.verdict = WEFT_OK};
    r->refused_idle = weft__await_check_add(check, release, &idle); /* no device work yet */
    if (atomic_load(&idle.released) != 1 || atomic_load(&idle.checked) != 0)
        r->refused_idle = -1000;
    if (weft_host_async(slow_fill, &r->word) != WEFT_OK ||
        weft__await_check_add(check, release, &r->ok) != WEFT_OK ||
        weft__await_check_add(check, release, &r->bad) != WEFT_OK ||
        weft__await_check_add(check, release, &r->late) != WEFT_OK)
        return NULL;
    r->first = weft_await();
    snprintf(r->message, sizeof r->message, "%s", weft_last_error());
    r->second = weft_await(); /* the checks were consumed */
    return NULL;
}

static weft_runtime *host_runtime(void)
{
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.workers = 2;
    weft_runtime *rt = NULL;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    return rt;
}

static void test_a_failed_check_is_the_awaits_result(void **state)
{
    (void)state;
    weft_runtime *rt = host_runtime();
    /* checks run newest first: late (added last) passes, bad fails, ok is left unrun */
    run r = {
        .ok = {.verdict = WEFT_OK}, .bad = {.verdict = WEFT_EDEVICE}, .late = {.verdict = WEFT_OK}};
    r.ok.word = r.bad.word = r.late.word = &r.word;
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, awaiting, &r, NULL), WEFT_OK);
    /* the await reported it, and the task's join does too, as for any device failure */
    assert_int_equal(weft_join(t, NULL), WEFT_EDEVICE);
    assert_int_equal(r.refused_idle, WEFT_ESTATE);
    assert_int_equal(r.first, WEFT_EDEVICE);
    assert_non_null(strstr(r.message, "the watched operation failed"));
    assert_int_equal(r.second, WEFT_OK);
    assert_int_equal(atomic_load(&r.late.checked), 1);
    assert_true(r.late.work_seen); /* after the drain, not before */
    assert_int_equal(atomic_load(&r.bad.checked), 1);
    assert_true(r.bad.work_seen);
    assert_int_equal(atomic_load(&r.ok.checked), 0); /* the drain had failed already */
    assert_int_equal(atomic_load(&r.ok.released), 1);
    assert_int_equal(atomic_load(&r.bad.released), 1);
    assert_int_equal(atomic_load(&r.late.released), 1);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void *leaving(void *arg)
{
    probe *p = arg;
    static int word;
    if (weft_host_async(slow_fill, &word) == WEFT_OK)
        weft__await_check_add(check, release, p);
    return NULL; /* no await: the task's end drains */
}

static void test_a_task_that_does_not_await_reports_at_its_join(void **state)
{
    (void)state;
    weft_runtime *rt = host_runtime();
    probe p = {.verdict = WEFT_ETIMEDOUT};
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, leaving, &p, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_ETIMEDOUT);
    assert_int_equal(atomic_load(&p.checked), 1);
    assert_int_equal(atomic_load(&p.released), 1);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void test_outside_a_task_the_check_is_refused_and_released(void **state)
{
    (void)state;
    probe p = {.verdict = WEFT_OK};
    assert_int_equal(weft__await_check_add(check, release, &p), WEFT_ENOTASK);
    assert_int_equal(atomic_load(&p.released), 1);
    assert_int_equal(atomic_load(&p.checked), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_failed_check_is_the_awaits_result),
        cmocka_unit_test(test_a_task_that_does_not_await_reports_at_its_join),
        cmocka_unit_test(test_outside_a_task_the_check_is_refused_and_released),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
