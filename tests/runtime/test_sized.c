/*
 * test_sized.c - the structs that carry their size (weft_config,
 * weft_task_opts) and weft_stats, filled as far as the caller's sizeof: a
 * caller built against an older, smaller struct is read and filled only as
 * far as its size, a larger one is accepted only with its unknown fields
 * zero (its stats' unknown fields zeroed), size 0 is the 0.1 layout, and a
 * weft_stats left uninitialized is filled whole and no further. Callers' structs live in heap
 * blocks of exactly their size, so that AddressSanitizer sees any byte read or written past them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "weft.h"

/* Set, or read into *out, one field of a caller's struct that may end
 * before the type does: byte copies, so that no access of the whole type
 * reaches past the block. */
#define PUT(p, type, field, value)                                                                 \
    do {                                                                                           \
        __typeof__(((type *)0)->field) v_ = (value);                                               \
        memcpy((char *)(p) + offsetof(type, field), &v_, sizeof v_);                               \
    } while (0)
#define GET(p, type, field, out)                                                                   \
    memcpy((out), (const char *)(p) + offsetof(type, field), sizeof *(out))

/* A zeroed heap block of exactly size bytes that opens with size. */
static void *sized_block(size_t size)
{
    void *p = calloc(1, size);
    assert_non_null(p);
    memcpy(p, &size, sizeof size);
    return p;
}

static void test_config_older_size_reads_only_its_prefix(void **state)
{
    (void)state;
    /* A caller whose weft_config ended before graph_cache: the bad
     * blocking_threads of a full struct lies past its size, unread. */
    size_t old = offsetof(weft_config, graph_cache);
    weft_config *cfg = sized_block(old);
    PUT(cfg, weft_config, workers, 2);
    weft_runtime *rt = NULL;
    assert_int_equal(weft_runtime_create(&rt, cfg), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    free(cfg);

    weft_config full = WEFT_CONFIG_INIT;
    full.blocking_threads = 1u << 30; /* out of range: read when size covers it */
    assert_int_equal(weft_runtime_create(&rt, &full), WEFT_EINVAL);
    full.size = offsetof(weft_config, blocking_threads);
    assert_int_equal(weft_runtime_create(&rt, &full), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void test_config_size_zero_is_the_first_layout_and_tiny_sizes_are_refused(void **state)
{
    (void)state;
    weft_runtime *rt = NULL;
    weft_config zero = {0};
    assert_int_equal(weft_runtime_create(&rt, &zero), WEFT_OK); /* all defaults */
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    weft_config designated = {.blocking_threads = 1u << 30}; /* size 0: still read */
    assert_int_equal(weft_runtime_create(&rt, &designated), WEFT_EINVAL);
    weft_config tiny = {.size = sizeof(size_t) - 1};
    assert_int_equal(weft_runtime_create(&rt, &tiny), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "smaller than the size field"));
}

static void test_config_larger_size_needs_its_unknown_fields_zero(void **state)
{
    (void)state;
    size_t newer = sizeof(weft_config) + 16;
    unsigned char *block = sized_block(newer);
    weft_config *cfg = (weft_config *)(void *)block;
    cfg->workers = 1;
    weft_runtime *rt = NULL;
    assert_int_equal(weft_runtime_create(&rt, cfg), WEFT_OK); /* unknown fields at default */
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    block[newer - 1] = 1; /* a setting this library cannot honour */
    assert_int_equal(weft_runtime_create(&rt, cfg), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "newer weft.h"));
    free(block);
}

static void *nothing(void *arg)
{
    return arg;
}

static void test_task_opts_older_and_larger_sizes(void **state)
{
    (void)state;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 1;
    weft_runtime *rt = NULL;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    weft_task *t;

    weft_task_opts full = WEFT_TASK_OPTS_INIT;
    full.device = WEFT_DEVICE(1000); /* no such device: read when size covers it */
    assert_int_equal(weft_spawn(rt, &t, nothing, NULL, &full), WEFT_EINVAL);

    /* a caller whose opts ended before device */
    weft_task_opts *old = sized_block(offsetof(weft_task_opts, device));
    PUT(old, weft_task_opts, name, "old-layout");
    assert_int_equal(weft_spawn(rt, &t, nothing, (void *)7, old), WEFT_OK);
    void *r = NULL;
    assert_int_equal(weft_join(t, &r), WEFT_OK);
    assert_ptr_equal(r, (void *)7);
    free(old);

    size_t newer = sizeof(weft_task_opts) + 8;
    unsigned char *block = sized_block(newer);
    assert_int_equal(weft_spawn(rt, &t, nothing, NULL, (weft_task_opts *)(void *)block), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    block[sizeof(weft_task_opts)] = 1;
    assert_int_equal(weft_spawn(rt, &t, nothing, NULL, (weft_task_opts *)(void *)block),
                     WEFT_EINVAL);
    free(block);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void test_stats_fills_only_what_the_caller_holds(void **state)
{
    (void)state;
    weft_runtime *rt = NULL;
    assert_int_equal(weft_runtime_create(&rt, NULL), WEFT_OK);
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, nothing, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);

    /* an older, shorter struct: written up to its end, no further (ASan
     * sees a byte past the block) */
    size_t old = offsetof(weft_stats, finished);
    weft_stats *st = malloc(old);
    assert_non_null(st);
    assert_int_equal(weft_stats_get_sized(rt, st, old), WEFT_OK);
    size_t size;
    uint64_t spawned;
    GET(st, weft_stats, size, &size);
    GET(st, weft_stats, spawned, &spawned);
    assert_int_equal(size, old);
    assert_int_equal(spawned, 1);
    free(st);

    /* a newer, larger one: what this weft knows, then zeros */
    size_t newer = sizeof(weft_stats) + 24;
    unsigned char *block = malloc(newer);
    assert_non_null(block);
    memset(block, 0xa7, newer);
    assert_int_equal(weft_stats_get_sized(rt, (weft_stats *)(void *)block, newer), WEFT_OK);
    st = (weft_stats *)(void *)block;
    assert_int_equal(st->size, sizeof(weft_stats)); /* the bytes that carry values */
    assert_int_equal(st->spawned, 1);
    for (size_t i = sizeof(weft_stats); i < newer; i++)
        assert_int_equal(block[i], 0);
    free(block);

    /* left uninitialized, its size field garbage: the macro's sizeof
     * decides, so the whole struct is filled and nothing past it */
    weft_stats *garbage = malloc(sizeof *garbage);
    assert_non_null(garbage);
    memset(garbage, 0xff, sizeof *garbage);
    assert_int_equal(weft_stats_get(rt, garbage), WEFT_OK);
    assert_int_equal(garbage->size, sizeof(weft_stats));
    assert_int_equal(garbage->spawned, 1);
    assert_int_equal(garbage->finished, 1);
    free(garbage);

    weft_stats small;
    assert_int_equal(weft_stats_get_sized(rt, &small, sizeof(size_t) - 1), WEFT_EINVAL);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_older_size_reads_only_its_prefix),
        cmocka_unit_test(test_config_size_zero_is_the_first_layout_and_tiny_sizes_are_refused),
        cmocka_unit_test(test_config_larger_size_needs_its_unknown_fields_zero),
        cmocka_unit_test(test_task_opts_older_and_larger_sizes),
        cmocka_unit_test(test_stats_fills_only_what_the_caller_holds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
