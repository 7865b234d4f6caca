/*
 * test_penalize.c - weft_penalize's host reference (NULL stream) against
 * the rule worked out here in double on small rows (repetition on positive
 * and negative logits, frequency and presence by count, bias last, tokens
 * outside the row skipped, rows with no adjustments untouched, padding
 * never written), in fp32, bf16 and fp16; in a task's stream order; every
 * bad argument refused before a logit is written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/ops_internal.h"
#include "weft.h"
#include "weft/ops.h"

enum { ROWS = 3, COLS = 8, STRIDE = 10 };

static const weft_penalties PARAMS[ROWS] = {
    {.repetition = 2, .frequency = 0.5f, .presence = 0.25f, .first = 0, .count = 4},
    {.repetition = 1, .first = 4, .count = 0}, /* untouched */
    {.repetition = 0.5f, .presence = 1, .first = 4, .count = 3}};
static const weft_logit_adjust ADJUST[7] = {
    {.token = 1, .seen = 1},              /* positive: halved */
    {.token = 2, .seen = 1, .count = 3},  /* negative: doubled, then 3 * 0.5 + 0.25 */
    {.token = 5, .bias = -4},             /* bias only */
    {.token = 9, .seen = 1, .bias = 100}, /* outside the row: skipped */
    {.token = 0, .seen = 1, .count = 1, .bias = 0.5f},
    {.token = 7, .count = 2},  /* not seen: no repetition; presence */
    {.token = -1, .seen = 1}}; /* outside: skipped */

static float value(size_t r, size_t j)
{
    return (float)((int)(r * 7 + j * 3) % 11 - 5) * 0.75f;
}

static double want(size_t r, size_t j)
{
    double x = value(r, j);
    const weft_penalties *p = &PARAMS[r];
    for (uint32_t i = 0; i < p->count; i++) {
        const weft_logit_adjust *a = &ADJUST[p->first + i];
        if (a->token != (int32_t)j)
            continue;
        if (a->seen && p->repetition != 0 && p->repetition != 1)
            x = x > 0 ? x / p->repetition : x * p->repetition;
        if (a->count > 0)
            x -= (double)p->frequency * a->count + p->presence;
        x += a->bias;
    }
    return x;
}

static void test_the_rule_on_small_rows(void **state)
{
    (void)state;
    static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
    for (size_t ti = 0; ti < 3; ti++) {
        weft_dtype t = TYPES[ti];
        float buf[ROWS * STRIDE];
        for (size_t i = 0; i < ROWS * STRIDE; i++)
            weft__store(t, buf, i, i % STRIDE < COLS ? value(i / STRIDE, i % STRIDE) : 42.0f);
        assert_int_equal(weft_penalize(NULL, t, buf, ROWS, COLS, STRIDE, PARAMS, ADJUST), WEFT_OK);
        for (size_t r = 0; r < ROWS; r++)
            for (size_t j = 0; j < STRIDE; j++) {
                double got = weft__load(t, buf, r * STRIDE + j);
                double w = j < COLS ? want(r, j) : 42.0;
                double tol = t == WEFT_DTYPE_F32 ? 1e-6 : t == WEFT_DTYPE_BF16 ? 0.04 : 0.005;
                if (fabs(got - w) > tol * fmax(1, fabs(w)))
                    fail_msg("dtype %d row %zu token %zu: %g, not %g", (int)t, r, j, got, w);
            }
    }
}

typedef struct chain {
    float *logits;
    int rc;
} chain;

static void *chain_task(void *arg)
{
    chain *c = arg;
    if ((c->rc = weft_penalize(WEFT_TASK_STREAM, WEFT_DTYPE_F32, c->logits, ROWS, COLS, STRIDE,
                               PARAMS, ADJUST)) == WEFT_OK)
        c->rc = weft_await();
    return NULL;
}

static void test_in_a_tasks_stream_order(void **state)
{
    (void)state;
    float buf[ROWS * STRIDE];
    chain c = {buf, -1};
    for (size_t i = 0; i < ROWS * STRIDE; i++)
        buf[i] = value(i / STRIDE, i % STRIDE);
    weft_runtime *rt;
    weft_config cfg = {.workers = 1};
    weft_task *task;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &task, chain_task, &c, NULL), WEFT_OK);
    assert_int_equal(weft_join(task, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    assert_int_equal(c.rc, WEFT_OK);
    for (size_t r = 0; r < ROWS; r++)
        for (size_t j = 0; j < COLS; j++)
            assert_true(fabs(buf[r * STRIDE + j] - want(r, j)) <= 1e-6 * fmax(1, fabs(want(r, j))));
}

static void refused(int rc, const float *logits, const char *says)
{
    assert_int_equal(rc, WEFT_EINVAL);
    printf("  %s\n", weft_last_error());
    assert_non_null(strstr(weft_last_error(), says));
    for (size_t i = 0; i < ROWS * STRIDE; i++)
        assert_true(logits[i] == 1.0f); /* nothing written */
}

static void test_bad_arguments_are_refused(void **state)
{
    (void)state;
    float l[ROWS * STRIDE];
    for (size_t i = 0; i < ROWS * STRIDE; i++)
        l[i] = 1.0f;
    weft_dtype f = WEFT_DTYPE_F32;
    refused(weft_penalize(NULL, f, NULL, ROWS, COLS, STRIDE, PARAMS, ADJUST), l, "logits");
    refused(weft_penalize(NULL, f, l, ROWS, COLS, STRIDE, NULL, ADJUST), l, "params");
    refused(weft_penalize(NULL, f, l, ROWS, COLS, STRIDE, PARAMS, NULL), l, "adjust");
    refused(weft_penalize(NULL, f, l, ROWS, COLS, STRIDE,
                          (const weft_penalties *)((const char *)PARAMS + 2), ADJUST),
            l, "aligned");
    refused(weft_penalize(NULL, f, l, ROWS, COLS, COLS - 1, PARAMS, ADJUST), l, "stride");
    refused(weft_penalize(NULL, f, l, 0, COLS, STRIDE, PARAMS, ADJUST), l, "rows");
    refused(weft_penalize(NULL, (weft_dtype)77, l, ROWS, COLS, STRIDE, PARAMS, ADJUST), l, "dtype");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_rule_on_small_rows),
        cmocka_unit_test(test_in_a_tasks_stream_order),
        cmocka_unit_test(test_bad_arguments_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
