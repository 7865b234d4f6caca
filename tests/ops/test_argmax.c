/*
 * test_argmax.c - weft_argmax's host reference (NULL stream) against the
 * plain loop of argmax_ref.h on fresh random data (the seed is printed;
 * WEFT_TEST_SEED replays it): fp32, bf16 and fp16 rows of 1 to 128256
 * values with padded strides whose padding would win if read, ties at the
 * maximum, NaN, rows of only NaN, -Inf and signed zeros; the call in a
 * task's stream order after the softmax that writes its input; and every
 * bad argument refused with its reason before an id is written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "ops/argmax_ref.h"
#include "weft.h"
#include "weft/ops.h"

static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

static void check_case(weft_dtype t, size_t rows, size_t cols, size_t stride, am_kind kind)
{
    void *in = am_rows(t, rows, cols, stride, kind);
    int32_t *ids = malloc(rows * sizeof *ids);
    assert_non_null(in);
    assert_non_null(ids);
    memset(ids, 0xa7, rows * sizeof *ids);
    int rc = weft_argmax(NULL, t, ids, in, rows, cols, stride);
    if (rc != WEFT_OK)
        fail_msg("dtype %d %zu x %zu: %d %s", (int)t, rows, cols, rc, weft_last_error());
    for (size_t r = 0; r < rows; r++) {
        int32_t want = am_ref(t, in, r, cols, stride);
        if (ids[r] != want)
            fail_msg("dtype %d %s rows %zu cols %zu stride %zu: row %zu gave %d, not %d", (int)t,
                     am_kind_names[kind], rows, cols, stride, r, ids[r], want);
    }
    free(in);
    free(ids);
}

static void test_every_type_kind_and_size_matches_the_loop(void **state)
{
    (void)state;
    static const size_t COLS[] = {1, 2, 7, 513, 4099};
    for (size_t ti = 0; ti < 3; ti++)
        for (int kind = 0; kind < AM_KINDS; kind++)
            for (size_t ci = 0; ci < sizeof COLS / sizeof *COLS; ci++) {
                size_t cols = COLS[ci];
                check_case(TYPES[ti], 5, cols, cols, (am_kind)kind);
                check_case(TYPES[ti], 3, cols, cols + 3, (am_kind)kind);
            }
    /* a vocabulary's row: Llama 3's */
    for (size_t ti = 0; ti < 3; ti++)
        check_case(TYPES[ti], 2, 128256, 128256, AM_RANDOM);
}

static void test_the_rules_on_small_rows(void **state)
{
    (void)state;
    const float a[] = {NAN, 1.0f, NAN, 3.0f, 3.0f, -INFINITY};
    const float zeros[] = {-0.0f, 0.0f}, zeros2[] = {0.0f, -0.0f};
    const float nans[] = {NAN, NAN, NAN}, low[] = {NAN, -INFINITY, -INFINITY};
    int32_t id = -1;
    assert_int_equal(weft_argmax(NULL, WEFT_DTYPE_F32, &id, a, 1, 6, 6), WEFT_OK);
    assert_int_equal(id, 3); /* the first of two maxima, past the NaN */
    assert_int_equal(weft_argmax(NULL, WEFT_DTYPE_F32, &id, zeros, 1, 2, 2), WEFT_OK);
    assert_int_equal(id, 0);
    assert_int_equal(weft_argmax(NULL, WEFT_DTYPE_F32, &id, zeros2, 1, 2, 2), WEFT_OK);
    assert_int_equal(id, 0);
    assert_int_equal(weft_argmax(NULL, WEFT_DTYPE_F32, &id, nans, 1, 3, 3), WEFT_OK);
    assert_int_equal(id, 0);
    assert_int_equal(weft_argmax(NULL, WEFT_DTYPE_F32, &id, low, 1, 3, 3), WEFT_OK);
    assert_int_equal(id, 1); /* -Inf is a number: above NaN */
}

/* ---- in a task's stream order (host backend) -------------------------- */

typedef struct chain {
    float *logits, *probs;
    int32_t *ids;
    size_t rows, cols;
    int rc;
} chain;

static void *chain_task(void *arg)
{
    chain *c = arg;
    void *s = WEFT_TASK_STREAM;
    if ((c->rc = weft_softmax(s, WEFT_DTYPE_F32, c->probs, c->logits, c->rows, c->cols, c->cols,
                              NULL)) != WEFT_OK ||
        (c->rc = weft_argmax(s, WEFT_DTYPE_F32, c->ids, c->probs, c->rows, c->cols, c->cols)) !=
            WEFT_OK)
        return NULL;
    c->rc = weft_await();
    return NULL;
}

static void test_in_a_tasks_stream_order(void **state)
{
    (void)state;
    chain c = {.rows = 9, .cols = 1000};
    c.logits = am_rows(WEFT_DTYPE_F32, c.rows, c.cols, c.cols, AM_RANDOM);
    c.probs = malloc(c.rows * c.cols * sizeof *c.probs);
    c.ids = malloc(c.rows * sizeof *c.ids);
    assert_true(c.logits && c.probs && c.ids);
    memset(c.probs, 0, c.rows * c.cols * sizeof *c.probs); /* read early, every id would be 0 */
    memset(c.ids, 0xa7, c.rows * sizeof *c.ids);
    weft_runtime *rt;
    weft_config cfg = {.workers = 1};
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    weft_task *task;
    assert_int_equal(weft_spawn(rt, &task, chain_task, &c, NULL), WEFT_OK);
    assert_int_equal(weft_join(task, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    assert_int_equal(c.rc, WEFT_OK);
    for (size_t r = 0; r < c.rows; r++) /* softmax keeps the order of a row's values */
        assert_int_equal(c.ids[r], am_ref(WEFT_DTYPE_F32, c.logits, r, c.cols, c.cols));
    free(c.logits);
    free(c.probs);
    free(c.ids);
}

/* ---- bad arguments ---------------------------------------------------- */

static void refused(int rc, int32_t *ids, const char *says)
{
    assert_int_equal(rc, WEFT_EINVAL);
    printf("  %s\n", weft_last_error());
    assert_non_null(strstr(weft_last_error(), says));
    assert_int_equal((uint32_t)ids[1], 0xa7a7a7a7u); /* nothing written */
}

static void test_bad_arguments_are_refused(void **state)
{
    (void)state;
    float in[64] = {0};
    int32_t ids[4];
    memset(ids, 0xa7, sizeof ids);
    refused(weft_argmax(NULL, WEFT_DTYPE_F32, NULL, in, 2, 8, 8), ids, "ids");
    refused(weft_argmax(NULL, WEFT_DTYPE_F32, (int32_t *)((char *)ids + 2), in, 2, 8, 8), ids,
            "ids");
    refused(weft_argmax(NULL, WEFT_DTYPE_F32, ids, NULL, 2, 8, 8), ids, "in");
    refused(weft_argmax(NULL, WEFT_DTYPE_F32, ids, in, 2, 8, 7), ids, "stride");
    refused(weft_argmax(NULL, WEFT_DTYPE_F32, ids, in, 0, 8, 8), ids, "rows");
    refused(weft_argmax(NULL, WEFT_DTYPE_F32, ids, in, 2, 0, 8), ids, "zero-length");
    refused(weft_argmax(NULL, (weft_dtype)77, ids, in, 2, 8, 8), ids, "dtype");
    size_t wide = (size_t)INT32_MAX + 1;
    refused(weft_argmax(NULL, WEFT_DTYPE_F32, ids, in, 1, wide, wide), ids, "int32");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_kind_and_size_matches_the_loop),
        cmocka_unit_test(test_the_rules_on_small_rows),
        cmocka_unit_test(test_in_a_tasks_stream_order),
        cmocka_unit_test(test_bad_arguments_are_refused),
    };
    return cmocka_run_group_tests(tests, am_setup, NULL);
}
