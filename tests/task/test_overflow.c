/*
 * test_overflow.c - a task that runs off the end of its stack is reported
 * by name, through the public API, in a child process that dies of it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <string.h>

#include "fiber/child.h"
#include "weft.h"

/* Each frame keeps a page of its own alive, so the recursion cannot be
 * turned into a loop. */
static unsigned recurse(unsigned depth)
{
    volatile unsigned char page[4096];
    page[0] = (unsigned char)depth;
    page[sizeof page - 1] = (unsigned char)(depth >> 8);
    return depth > 1000000 ? page[0] : recurse(depth + 1) + page[sizeof page - 1];
}

static void *deep(void *arg)
{
    (void)arg;
    return (void *)(uintptr_t)recurse(0);
}

static void overflow_in_a_named_task(void)
{
    weft_config cfg = {.workers = 2};
    weft_runtime *rt;
    weft_task *t;
    weft_task_opts opts = {.stack_size = 64 * 1024, .name = "deep-recursion"};
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK ||
        weft_spawn(rt, &t, deep, NULL, &opts) != WEFT_OK)
        _exit(3);
    weft_join(t, NULL);
    _exit(4); /* not reached: the overflow kills the process */
}

static void test_stack_overflow_is_reported_with_the_task_name(void **state)
{
    child_result r;
    (void)state;
    assert_true(child_run(overflow_in_a_named_task, &r));
    if (!WIFSIGNALED(r.status) || WTERMSIG(r.status) != SIGSEGV)
        fail_msg("the child did not die of SIGSEGV (status %#x); stderr: %s", r.status, r.err);
    if (!strstr(r.err, "weft: task stack overflow") || !strstr(r.err, "deep-recursion"))
        fail_msg("no overflow report naming the task; stderr: %s", r.err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stack_overflow_is_reported_with_the_task_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
