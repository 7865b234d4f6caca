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

#endif
