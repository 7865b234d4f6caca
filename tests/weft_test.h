/*
 * weft_test.h - what the test programs share.
 *
 * ThreadSanitizer gives every fiber state of its own in separate memory
 * mappings: gcc's dies with more than 8,128 fibers alive, clang's runs out
 * of mappings (vm.max_map_count) long before 100,000. Under TSan, tests
 * that keep more tasks alive at once keep WEFT_TEST_MAX_LIVE instead; every
 * other build runs them at full size.
 */
#ifndef WEFT_TEST_H
#define WEFT_TEST_H

#include <stddef.h>

#if defined(__SANITIZE_THREAD__)
#define WEFT_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WEFT_TEST_TSAN 1
#endif
#endif

#ifdef WEFT_TEST_TSAN
#define WEFT_TEST_MAX_LIVE 4000
#else
#define WEFT_TEST_MAX_LIVE ((size_t)-1)
#endif

/* n, or fewer under ThreadSanitizer. */
static inline size_t weft_test_live(size_t n)
{
    return n < WEFT_TEST_MAX_LIVE ? n : WEFT_TEST_MAX_LIVE;
}

/* ---- for cmocka test programs (include cmocka.h first) ------------------ */
#ifdef cmocka_unit_test

#include <stdatomic.h>
#include <time.h>

#include "weft.h"

static inline void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Poll flag until it is set, a millisecond at a time. */
static inline void wait_flag(atomic_int *flag)
{
    while (!atomic_load(flag))
        sleep_ms(1);
}

/* Group fixtures: a 4-worker runtime in *state. */
static inline int setup_rt(void **state)
{
    weft_config cfg = {.workers = 4};
    weft_runtime *rt;

    if (weft_runtime_create(&rt, &cfg) != WEFT_OK)
        return -1;
    *state = rt;
    return 0;
}

/* Group fixtures: a 2-worker runtime of the host backend in *state. */
static inline int setup_host_rt(void **state)
{
    weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST};
    weft_runtime *rt;

    if (weft_runtime_create(&rt, &cfg) != WEFT_OK)
        return -1;
    *state = rt;
    return 0;
}

static inline int teardown_rt(void **state)
{
    return weft_runtime_destroy(*state) == WEFT_OK ? 0 : -1;
}

static inline weft_task *spawn(weft_runtime *rt, void *(*fn)(void *), void *arg)
{
    weft_task *t = NULL;

    assert_int_equal(weft_spawn(rt, &t, fn, arg, NULL), WEFT_OK);
    return t;
}

#endif

#endif
