/*
 * test_free_checks.c - giving back what weft did not hand out, on the host
 * backend.
 *
 * weft_host_free, weft_mapped_free and weft_free_async of a pointer weft
 * did not hand out (a foreign heap block, the middle of one of weft's, a
 * stack address, an unmapped address) or handed out and took back already
 * return WEFT_EINVAL with a message naming the call, free nothing, and
 * leave the process able to carry on; weft_event_destroy of a destroyed
 * event, and waits on one, return WEFT_ESTATE, as a stale task handle does,
 * and a pointer that never was an event WEFT_EINVAL. Each test then shows
 * that genuine frees still work. Under ASan a wrong free would be reported
 * as such; before the checks, each of these mistakes aborted in glibc.
 *
 * WEFT_TEST_FILTER=<glob> runs only the matching tests.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"
#include "weft_test.h"

/* An address no allocator hands out and nothing maps on Linux x86-64 or
 * aarch64 user space (the top of the 47-bit range, page aligned). */
#define UNMAPPED ((void *)(uintptr_t)0x7ffffffff000u)

/* rc is status and the message names call. */
static void assert_refused(int rc, int status, const char *call)
{
    assert_int_equal(rc, status);
    assert_non_null(strstr(weft_last_error(), call));
}

static void test_host_free_refuses_foreign_pointers(void **state)
{
    weft_runtime *rt = *state;
    char stack[64];
    char *foreign = malloc(64);
    void *p = NULL;

    assert_non_null(foreign);
    assert_refused(weft_host_free(rt, foreign), WEFT_EINVAL, "weft_host_free");
    assert_refused(weft_host_free(rt, stack), WEFT_EINVAL, "weft_host_free");
    assert_refused(weft_host_free(rt, UNMAPPED), WEFT_EINVAL, "weft_host_free");
    foreign[0] = 1; /* still ours: weft freed nothing */
    free(foreign);

    assert_int_equal(weft_host_alloc(rt, &p, 4096), WEFT_OK);
    assert_refused(weft_host_free(rt, (char *)p + 16), WEFT_EINVAL, "weft_host_free");
    memset(p, 0xab, 4096); /* the whole block is still live */
    assert_int_equal(weft_host_free(rt, p), WEFT_OK);
}

static void test_host_free_twice_is_refused(void **state)
{
    weft_runtime *rt = *state;
    void *p = NULL, *q = NULL;

    assert_int_equal(weft_host_alloc(rt, &p, 100), WEFT_OK);
    assert_int_equal(weft_host_free(rt, p), WEFT_OK);
    assert_refused(weft_host_free(rt, p), WEFT_EINVAL, "weft_host_free");
    /* the allocator still works after the refusal */
    assert_int_equal(weft_host_alloc(rt, &q, 100), WEFT_OK);
    assert_int_equal(weft_host_free(rt, q), WEFT_OK);
    assert_int_equal(weft_host_free(rt, NULL), WEFT_OK);
}

static void test_mapped_free_names_itself(void **state)
{
    weft_runtime *rt = *state;
    void *host = NULL, *dev = NULL;
    char *foreign = malloc(32);

    assert_non_null(foreign);
    assert_refused(weft_mapped_free(rt, foreign), WEFT_EINVAL, "weft_mapped_free");
    free(foreign);
    assert_int_equal(weft_mapped_alloc(rt, &host, &dev, 256), WEFT_OK);
    assert_ptr_equal(host, dev); /* host memory is the host backend's device memory */
    assert_refused(weft_mapped_free(rt, (char *)host + 8), WEFT_EINVAL, "weft_mapped_free");
    assert_int_equal(weft_mapped_free(rt, host), WEFT_OK);
    assert_refused(weft_mapped_free(rt, host), WEFT_EINVAL, "weft_mapped_free");
}

/* A block of one runtime is not another's to free. */
static void test_host_free_of_another_runtime_is_refused(void **state)
{
    weft_runtime *rt = *state, *other;
    weft_config cfg = {.workers = 1, .backend = WEFT_BACKEND_HOST};
    void *p = NULL;

    assert_int_equal(weft_runtime_create(&other, &cfg), WEFT_OK);
    assert_int_equal(weft_host_alloc(other, &p, 64), WEFT_OK);
    assert_refused(weft_host_free(rt, p), WEFT_EINVAL, "weft_host_free");
    assert_int_equal(weft_host_free(other, p), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(other), WEFT_OK);
}

typedef struct free_async_case {
    int rc[6];
    char msg[6][160];
    unsigned char seen[64];
} free_async_case;

static void note(free_async_case *c, int i, int rc)
{
    c->rc[i] = rc;
    strncpy(c->msg[i], weft_last_error(), sizeof c->msg[i] - 1);
}

static void *free_async_main(void *arg)
{
    free_async_case *c = arg;
    char stack[64];
    char *foreign = malloc(64);
    void *p = NULL, *host = NULL;

    if (!foreign)
        return NULL;
    note(c, 0, weft_free_async(foreign));
    note(c, 1, weft_free_async(stack));
    note(c, 2, weft_free_async(UNMAPPED));
    free(foreign);
    if (weft_malloc_async(&p, 64) != WEFT_OK)
        return NULL;
    note(c, 3, weft_free_async((char *)p + 1));
    /* host memory is not weft_malloc_async's, though both are malloc here */
    if (weft_host_alloc(weft_runtime_current(), &host, 64) == WEFT_OK) {
        note(c, 4, weft_free_async(host));
        weft_host_free(weft_runtime_current(), host);
    }
    weft_memset_async(p, 7, 64);
    weft_memcpy_async(c->seen, p, 64);
    if (weft_free_async(p) == WEFT_OK) /* after the copy, in stream order */
        note(c, 5, weft_free_async(p));
    weft_await();
    return NULL;
}

static void test_free_async_refuses_foreign_and_twice(void **state)
{
    weft_runtime *rt = *state;
    free_async_case c;

    memset(&c, 0, sizeof c);
    for (int i = 0; i < 6; i++)
        c.rc[i] = 1;
    assert_int_equal(weft_join(spawn(rt, free_async_main, &c), NULL), WEFT_OK);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(c.rc[i], WEFT_EINVAL);
        assert_non_null(strstr(c.msg[i], "weft_free_async"));
    }
    for (int i = 0; i < 64; i++)
        assert_int_equal(c.seen[i], 7);
}

typedef struct event_case {
    int destroy_again, await_destroyed, wait_destroyed, destroy_fake, await_fake;
    int await_new;
} event_case;

static void *event_main(void *arg)
{
    event_case *c = arg;
    weft_event *ev = NULL, *next = NULL;
    int fake[4] = {0};

    if (weft_event_record(&ev) != WEFT_OK || weft_event_destroy(ev) != WEFT_OK)
        return NULL;
    c->destroy_again = weft_event_destroy(ev);
    c->await_destroyed = weft_event_await(ev);
    c->wait_destroyed = weft_stream_wait(ev);
    /* a new event may take the old one's place; the old handle stays dead */
    if (weft_event_record(&next) != WEFT_OK)
        return NULL;
    if (weft_event_destroy(ev) == WEFT_OK)
        c->destroy_again = WEFT_OK;
    c->await_new = weft_event_await(next);
    weft_event_destroy(next);
    c->destroy_fake = weft_event_destroy((weft_event *)fake);
    c->await_fake = weft_event_await((weft_event *)UNMAPPED);
    return NULL;
}

static void test_event_destroy_twice_is_refused(void **state)
{
    weft_runtime *rt = *state;
    event_case c = {1, 1, 1, 1, 1, 1};

    assert_int_equal(weft_join(spawn(rt, event_main, &c), NULL), WEFT_OK);
    assert_int_equal(c.destroy_again, WEFT_ESTATE);
    assert_int_equal(c.await_destroyed, WEFT_ESTATE);
    assert_int_equal(c.wait_destroyed, WEFT_ESTATE);
    assert_int_equal(c.await_new, WEFT_OK);
    assert_int_equal(c.destroy_fake, WEFT_EINVAL);
    assert_int_equal(c.await_fake, WEFT_EINVAL);
    assert_int_equal(weft_event_destroy(NULL), WEFT_OK);
}

/* Genuine frees from several threads at once, with bad ones refused in
 * between: the bookkeeping holds under contention (TSan). (A second free of
 * a block is not among them: another thread may have been handed the same
 * address meanwhile, and then the second free is a genuine one.) */
enum { THREADS = 4, ROUNDS = 2000, HELD = 16 };

static void *alloc_free_thread(void *arg)
{
    weft_runtime *rt = arg;
    void *held[HELD] = {0};
    char stack[16];
    long bad = 0;

    for (unsigned r = 0; r < ROUNDS; r++) {
        unsigned i = r % HELD;
        if (held[i]) {
            if (weft_host_free(rt, held[i]) != WEFT_OK)
                return (void *)1;
            if (r % 97 == 0 && weft_host_free(rt, stack) != WEFT_EINVAL)
                bad++;
        }
        if (weft_host_alloc(rt, &held[i], 16 + r % 300) != WEFT_OK)
            return (void *)1;
        memset(held[i], (int)r, 16);
    }
    for (unsigned i = 0; i < HELD; i++)
        if (weft_host_free(rt, held[i]) != WEFT_OK)
            return (void *)1;
    return (void *)bad;
}

static void test_genuine_frees_from_many_threads(void **state)
{
    pthread_t th[THREADS];
    void *res;

    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, alloc_free_thread, *state), 0);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(th[i], &res), 0);
        assert_null(res);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_free_refuses_foreign_pointers),
        cmocka_unit_test(test_host_free_twice_is_refused),
        cmocka_unit_test(test_mapped_free_names_itself),
        cmocka_unit_test(test_host_free_of_another_runtime_is_refused),
        cmocka_unit_test(test_free_async_refuses_foreign_and_twice),
        cmocka_unit_test(test_event_destroy_twice_is_refused),
        cmocka_unit_test(test_genuine_frees_from_many_threads),
    };
    const char *filter = getenv("WEFT_TEST_FILTER");

    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup_host_rt, teardown_rt);
}
