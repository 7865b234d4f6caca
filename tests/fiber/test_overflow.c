/*
 * test_overflow.c - a fiber that runs into its guard page is named in a
 * "weft: task stack overflow" report and the process still dies of
 * SIGSEGV; a fault anywhere else reaches the handler that was installed
 * before weft's; each thread gets an alternate signal stack to report on.
 *
 * The faulting code runs in a forked child; the parent checks how it died
 * and what it wrote to stderr.
 *
 * Sanitizers: ASan and TSan install SIGSEGV handlers of their own at
 * startup, but they let the program replace them (ASan's
 * allow_user_segv_handler defaults to on), and weft__overflow_install runs
 * later, so weft's report comes first under them too and nothing special is
 * needed. Should a sanitizer's handler win anyway (allow_user_segv_handler=0
 * in ASAN_OPTIONS), its own "stack-overflow" report is accepted instead.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fiber/fiber.h"
#include "fiber/internal.h"

#include "child.h"

#define STACK_SIZE (256u * 1024)

#if defined(__clang__)
#define OPAQUE __attribute__((noinline))
#else
#define OPAQUE __attribute__((noinline, noipa))
#endif

typedef struct child_fiber {
    weft__fiber main, fiber;
    weft__stack_pool *pool;
    weft__stack *stack;
} child_fiber;

static child_fiber cf;

/* Start body on a fresh default stack, with the overflow handler and an
 * alternate signal stack in place. Only returns if body switches back. */
static void run_in_fiber(void (*body)(void *), const char *label)
{
    if (weft__overflow_install() != 0 || weft__overflow_thread_init() != 0)
        _exit(10);
    if (weft__stack_pool_create(&cf.pool, STACK_SIZE) != 0 ||
        weft__stack_get(cf.pool, NULL, 0, &cf.stack) != 0)
        _exit(11);
    weft__fiber_init_thread(&cf.main);
    weft__fiber_init(&cf.fiber, cf.stack, body, NULL);
    cf.fiber.label = label;
    weft__fiber_switch(&cf.main, &cf.fiber);
}

/* ---- a real overflow ---------------------------------------------------- */

static volatile unsigned depth_limit = UINT_MAX;

OPAQUE static unsigned recurse(unsigned n)
{
    volatile char frame[256];

    frame[0] = (char)n;
    if (n >= depth_limit)
        return n;
    return recurse(n + 1) + (unsigned)frame[0];
}

static void recurse_body(void *arg)
{
    (void)arg;
    recurse(0);
    weft__fiber_exit(&cf.fiber, &cf.main);
}

static void overflow_child(void)
{
    run_in_fiber(recurse_body, "deep-recursion");
    if (!cf.stack->guarded)
        _exit(12);
    _exit(13); /* not reached */
}

static void test_guard_page_hit_is_reported_and_kills_with_sigsegv(void **state)
{
    child_result r;

    (void)state;
    assert_true(child_run(overflow_child, &r));
    if (strstr(r.err, "AddressSanitizer: stack-overflow") != NULL ||
        strstr(r.err, "ThreadSanitizer: stack-overflow") != NULL)
        return; /* a sanitizer kept SIGSEGV to itself: its report will do */
    if (!child_killed_by(&r, SIGSEGV))
        fail_msg("child status 0x%x, stderr:\n%s", r.status, r.err);
    assert_non_null(strstr(r.err, "weft: task stack overflow in task \"deep-recursion\": "
                                  "stack of 256 KiB at 0x"));
    assert_non_null(strstr(r.err, "exhausted (fault at 0x"));
    assert_non_null(strstr(r.err, "; raise weft_config.stack_size or weft_task_opts.stack_size\n"));
}

/* One frame of 160 KiB below 128 KiB of frames: its far end is 32 KiB
 * past the 256 KiB stack, where a guard of one page would let it write
 * into whatever is mapped below; the guard takes the fault. */
static volatile size_t lowest; /* 0, unknown to the compiler: the whole arrays stay */

OPAQUE static unsigned big_frame(void)
{
    volatile char frame[160 * 1024];

    frame[lowest] = 1; /* the lowest address: past the stack's end */
    return frame[lowest];
}

OPAQUE static unsigned deep_then_big(unsigned n)
{
    volatile char frame[16 * 1024];

    frame[lowest] = (char)n;
    return (n == 0 ? big_frame() : deep_then_big(n - 1)) + (unsigned)frame[lowest];
}

static void big_frame_body(void *arg)
{
    (void)arg;
    deep_then_big(7); /* 8 frames of 16 KiB */
    weft__fiber_exit(&cf.fiber, &cf.main);
}

static void big_frame_child(void)
{
    run_in_fiber(big_frame_body, "big-frame");
    _exit(14); /* not reached */
}

static void test_a_frame_larger_than_a_page_faults_in_the_guard(void **state)
{
    child_result r;

    (void)state;
    assert_true(child_run(big_frame_child, &r));
    if (strstr(r.err, "AddressSanitizer: stack-overflow") != NULL ||
        strstr(r.err, "ThreadSanitizer: stack-overflow") != NULL)
        return;
    if (!child_killed_by(&r, SIGSEGV))
        fail_msg("child status 0x%x, stderr:\n%s", r.status, r.err);
    assert_non_null(strstr(r.err, "weft: task stack overflow in task \"big-frame\""));
    assert_non_null(strstr(r.err, "exhausted (fault at 0x"));
}

/* The top slot of a slab: an overflow runs through the slots below it
 * (no guard pages there) and faults below the slab, far from its own stack
 * but with its canary long broken. */
static void slab_overflow_child(void)
{
    weft__stack *below[7];

    weft__stack_guard_budget_set(0);
    if (weft__stack_pool_create(&cf.pool, STACK_SIZE) != 0)
        _exit(16);
    for (size_t i = 0; i < 7; i++)
        if (weft__stack_get(cf.pool, NULL, 0, &below[i]) != 0 || below[i]->guarded)
            _exit(17);
    if (weft__overflow_install() != 0 || weft__overflow_thread_init() != 0 ||
        weft__stack_get(cf.pool, NULL, 0, &cf.stack) != 0 || cf.stack->guarded ||
        cf.stack->map != below[0]->map)
        _exit(18);
    weft__fiber_init_thread(&cf.main);
    weft__fiber_init(&cf.fiber, cf.stack, recurse_body, NULL);
    cf.fiber.label = "slab-top";
    weft__fiber_switch(&cf.main, &cf.fiber);
    _exit(19); /* not reached */
}

static void test_unguarded_overflow_past_slab_is_reported(void **state)
{
    child_result r;

    (void)state;
    assert_true(child_run(slab_overflow_child, &r));
    if (strstr(r.err, "AddressSanitizer: stack-overflow") != NULL ||
        strstr(r.err, "ThreadSanitizer: stack-overflow") != NULL)
        return;
    if (!child_killed_by(&r, SIGSEGV))
        fail_msg("child status 0x%x, stderr:\n%s", r.status, r.err);
    assert_non_null(strstr(r.err, "weft: task stack overflow in task \"slab-top\""));
}

/* ---- a fault that is not an overflow ------------------------------------ */

static void previous_handler(int sig, siginfo_t *info, void *uctx)
{
    static const char msg[] = "previous handler ran\n";

    (void)sig;
    (void)info;
    (void)uctx;
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0)
        _exit(43);
    _exit(42);
}

static int *volatile wild_pointer = (int *)(uintptr_t)16; /* far from any stack */

static void wild_write_body(void *arg)
{
    (void)arg;
    *wild_pointer = 1;
    weft__fiber_exit(&cf.fiber, &cf.main);
}

static void wild_write_child(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = previous_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, NULL) != 0)
        _exit(14);
    run_in_fiber(wild_write_body, "wild");
    _exit(15); /* not reached */
}

static void test_other_faults_go_to_previous_handler(void **state)
{
    child_result r;

    (void)state;
    assert_true(child_run(wild_write_child, &r));
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 42)
        fail_msg("child status 0x%x, stderr:\n%s", r.status, r.err);
    assert_non_null(strstr(r.err, "previous handler ran"));
    assert_null(strstr(r.err, "weft: task stack overflow"));
}

/* ---- installation ------------------------------------------------------- */

static void test_install_is_idempotent(void **state)
{
    struct sigaction first, second;

    (void)state;
    assert_int_equal(weft__overflow_install(), 0);
    assert_int_equal(sigaction(SIGSEGV, NULL, &first), 0);
    assert_int_equal(weft__overflow_install(), 0);
    assert_int_equal(sigaction(SIGSEGV, NULL, &second), 0);
    assert_true(first.sa_flags & SA_ONSTACK);
    assert_true(first.sa_flags & SA_SIGINFO);
    assert_ptr_equal((void *)first.sa_sigaction, (void *)second.sa_sigaction);
}

typedef struct altstack_seen {
    stack_t before, during, after;
    int rc;
} altstack_seen;

static void *altstack_thread(void *arg)
{
    altstack_seen *a = arg;

    sigaltstack(NULL, &a->before);
    a->rc = weft__overflow_thread_init();
    sigaltstack(NULL, &a->during);
    weft__overflow_thread_fini();
    sigaltstack(NULL, &a->after);
    return NULL;
}

static void test_thread_gets_alternate_signal_stack(void **state)
{
    altstack_seen a;
    pthread_t t;

    (void)state;
    memset(&a, 0, sizeof a);
    assert_int_equal(pthread_create(&t, NULL, altstack_thread, &a), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.rc, 0);
    assert_false(a.during.ss_flags & SS_DISABLE);
    assert_true(a.during.ss_size >= 32 * 1024);
    if (a.before.ss_flags & SS_DISABLE) {
        /* Ours: gone again after fini. */
        assert_true(a.after.ss_flags & SS_DISABLE);
    } else {
        /* Someone else's (a sanitizer's): left as it was. */
        assert_ptr_equal(a.during.ss_sp, a.before.ss_sp);
        assert_ptr_equal(a.after.ss_sp, a.before.ss_sp);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guard_page_hit_is_reported_and_kills_with_sigsegv),
        cmocka_unit_test(test_a_frame_larger_than_a_page_faults_in_the_guard),
        cmocka_unit_test(test_unguarded_overflow_past_slab_is_reported),
        cmocka_unit_test(test_other_faults_go_to_previous_handler),
        cmocka_unit_test(test_install_is_idempotent),
        cmocka_unit_test(test_thread_gets_alternate_signal_stack),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
