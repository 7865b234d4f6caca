/*
 * test_sample.c - weft_sample's host reference (NULL stream): greedy rows
 * are weft_argmax's ids; many draws of one row follow the distribution
 * sample_ref.h works out in double, at several temperatures, top_k and
 * top_p (cut through ties included), on fp32, bf16 and fp16 rows; one seed
 * and offset give one token; NaN and -Inf are never drawn; the call in a
 * task's stream order; every bad argument refused before an id is
 * written. Fresh random data (the seed is printed; WEFT_TEST_SEED replays
 * it).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "ops/sample_ref.h"
#include "weft.h"
#include "weft/ops.h"

static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

/* count rows of one row's values in dtype t (each row a copy), drawn with
 * params p at offsets 0, 1, ...; the ids (malloc'd). */
static int32_t *draws_of(weft_dtype t, const float *row, size_t cols, weft_sampling p, size_t count)
{
    void *rows = malloc(count * cols * weft__dtype_size(t));
    weft_sampling *params = malloc(count * sizeof *params);
    int32_t *ids = malloc(count * sizeof *ids);
    assert_true(rows && params && ids);
    for (size_t r = 0; r < count; r++) {
        for (size_t j = 0; j < cols; j++)
            weft__store(t, rows, r * cols + j, row[j]);
        params[r] = p;
        params[r].offset = p.offset + r;
    }
    memset(ids, 0xa7, count * sizeof *ids);
    int rc = weft_sample(NULL, t, ids, rows, count, cols, cols, params);
    if (rc != WEFT_OK)
        fail_msg("weft_sample: %d %s", rc, weft_last_error());
    free(rows), free(params);
    return ids;
}

/* The row as the op reads it: rounded to t. */
static float *rounded(weft_dtype t, const float *row, size_t cols)
{
    float *r = malloc(cols * sizeof *r);
    uint32_t one[1];
    assert_non_null(r);
    for (size_t j = 0; j < cols; j++) {
        weft__store(t, one, 0, row[j]);
        r[j] = weft__load(t, one, 0);
    }
    return r;
}

static void check_follows(weft_dtype t, const float *row, size_t cols, weft_sampling p,
                          size_t count)
{
    float *as_read = rounded(t, row, cols);
    sr_dist d;
    double margin = sr_distribution(as_read, cols, &p, &d);
    if (margin < 1e-6) { /* top_p on a boundary: not a fair case */
        sr_free(&d), free(as_read);
        return;
    }
    int32_t *ids = draws_of(t, row, cols, p, count);
    char why[160];
    if (!sr_follows(&d, ids, count, cols, why, sizeof why))
        fail_msg("dtype %d cols %zu T %g top_k %d top_p %g: %s", (int)t, cols, p.temperature,
                 p.top_k, p.top_p, why);
    sr_free(&d), free(ids), free(as_read);
}

static float *random_row(size_t cols, double spread)
{
    float *row = malloc(cols * sizeof *row);
    assert_non_null(row);
    for (size_t j = 0; j < cols; j++)
        row[j] = (float)(((double)(am_next() >> 11) * 0x1p-53 - 0.5) * spread);
    return row;
}

static void test_draws_follow_the_distribution(void **state)
{
    (void)state;
    static const struct {
        float temperature, top_p;
        int32_t top_k;
    } CASES[] = {{1, 1, 0},    {0.7f, 1, 0},    {1.5f, 0, 0},  {1, 1, 5},
                 {1, 0.8f, 0}, {0.9f, 0.5f, 8}, {2, 0.95f, 3}, {1, 0.3f, 0}};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
            size_t cols = c % 2 ? 12 : 40;
            float *row = random_row(cols, 6);
            weft_sampling p = {.temperature = CASES[c].temperature,
                               .top_p = CASES[c].top_p,
                               .top_k = CASES[c].top_k,
                               .seed = am_next()};
            check_follows(TYPES[ti], row, cols, p, 20000);
            free(row);
        }
}

/* top_k through equal values keeps the lower indexes; NaN and -Inf are
 * never drawn; top_k 1 and a tiny top_p are greedy. */
static void test_ties_nan_and_the_edges(void **state)
{
    (void)state;
    const float tied[] = {1, 3, 0, 3, 3, NAN, -INFINITY, 2};
    weft_sampling p = {.temperature = 1, .top_k = 2, .seed = 7};
    check_follows(WEFT_DTYPE_F32, tied, 8, p, 5000); /* ids 1 and 3 only */
    int32_t *ids = draws_of(WEFT_DTYPE_F32, tied, 8, p, 2000);
    int saw[8] = {0};
    for (size_t i = 0; i < 2000; i++)
        saw[ids[i]]++;
    assert_true(saw[1] > 0 && saw[3] > 0);
    assert_int_equal(saw[1] + saw[3], 2000);
    free(ids);

    p = (weft_sampling){.temperature = 50, .seed = 9}; /* near uniform, but never NaN or -Inf */
    ids = draws_of(WEFT_DTYPE_F32, tied, 8, p, 4000);
    for (size_t i = 0; i < 4000; i++)
        assert_true(ids[i] != 5 && ids[i] != 6);
    free(ids);

    const weft_sampling greedy[] = {{.temperature = 1, .top_k = 1},
                                    {.temperature = 1, .top_p = 1e-6f},
                                    {.temperature = 0},
                                    {.temperature = -1},
                                    {.temperature = NAN}};
    for (size_t g = 0; g < sizeof greedy / sizeof *greedy; g++) {
        ids = draws_of(WEFT_DTYPE_F32, tied, 8, greedy[g], 50);
        for (size_t i = 0; i < 50; i++)
            assert_int_equal(ids[i], 1); /* the first of the three 3s */
        free(ids);
    }
    const float inf[] = {0, INFINITY, 1, INFINITY}, nans[] = {NAN, NAN};
    ids = draws_of(WEFT_DTYPE_F32, inf, 4, (weft_sampling){.temperature = 1}, 20);
    for (size_t i = 0; i < 20; i++)
        assert_int_equal(ids[i], 1); /* +Inf: greedy */
    free(ids);
    ids = draws_of(WEFT_DTYPE_F32, nans, 2, (weft_sampling){.temperature = 1}, 20);
    for (size_t i = 0; i < 20; i++)
        assert_int_equal(ids[i], 0);
    free(ids);
}

/* Greedy rows are weft_argmax's, on argmax_ref.h's hard rows. */
static void test_greedy_rows_are_argmax(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < 3; ti++)
        for (int kind = 0; kind < AM_KINDS; kind++) {
            size_t rows = 6, cols = 700, stride = 703;
            void *in = am_rows(TYPES[ti], rows, cols, stride, (am_kind)kind);
            weft_sampling params[6] = {{0}};
            int32_t ids[6], want[6];
            assert_non_null(in);
            assert_int_equal(weft_sample(NULL, TYPES[ti], ids, in, rows, cols, stride, params),
                             WEFT_OK);
            assert_int_equal(weft_argmax(NULL, TYPES[ti], want, in, rows, cols, stride), WEFT_OK);
            assert_memory_equal(ids, want, sizeof ids);
            free(in);
        }
}

/* One seed and offset: one token, every call; the offsets move it; rows
 * of a batch draw by their own params only. */
static void test_a_seed_and_offset_give_one_token(void **state)
{
    (void)state;
    enum { COLS = 4096, ROWS = 64 };
    float *row = random_row(COLS, 2);
    weft_sampling p = {.temperature = 1, .top_p = 0.9f, .seed = am_next()};
    int32_t *a = draws_of(WEFT_DTYPE_F32, row, COLS, p, ROWS);
    int32_t *b = draws_of(WEFT_DTYPE_F32, row, COLS, p, ROWS);
    assert_memory_equal(a, b, ROWS * sizeof *a);
    int distinct = 0;
    for (int r = 1; r < ROWS; r++)
        distinct += a[r] != a[0];
    assert_true(distinct > 0); /* offsets 0 to 63 of a flat row: not one token */
    p.seed++;
    int32_t *c = draws_of(WEFT_DTYPE_F32, row, COLS, p, ROWS);
    assert_true(memcmp(a, c, ROWS * sizeof *a) != 0);
    free(a), free(b), free(c), free(row);
}

/* ---- in a task's stream order (host backend) -------------------------- */

typedef struct chain {
    float *logits;
    weft_sampling *params;
    int32_t *ids;
    size_t rows, cols;
    int rc;
} chain;

static void *chain_task(void *arg)
{
    chain *c = arg;
    if ((c->rc = weft_sample(WEFT_TASK_STREAM, WEFT_DTYPE_F32, c->ids, c->logits, c->rows, c->cols,
                             c->cols, c->params)) == WEFT_OK)
        c->rc = weft_await();
    return NULL;
}

static void test_in_a_tasks_stream_order(void **state)
{
    (void)state;
    chain c = {.rows = 9, .cols = 1000};
    c.logits = random_row(c.rows * c.cols, 4);
    c.params = calloc(c.rows, sizeof *c.params);
    c.ids = malloc(c.rows * sizeof *c.ids);
    int32_t *want = malloc(c.rows * sizeof *want);
    assert_true(c.params && c.ids && want);
    for (size_t r = 0; r < c.rows; r++)
        c.params[r] =
            (weft_sampling){.temperature = 0.8f, .top_k = (int32_t)r * 3, .seed = 1, .offset = r};
    assert_int_equal(
        weft_sample(NULL, WEFT_DTYPE_F32, want, c.logits, c.rows, c.cols, c.cols, c.params),
        WEFT_OK);
    memset(c.ids, 0xa7, c.rows * sizeof *c.ids);
    weft_runtime *rt;
    weft_config cfg = {.workers = 1};
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    weft_task *task;
    assert_int_equal(weft_spawn(rt, &task, chain_task, &c, NULL), WEFT_OK);
    assert_int_equal(weft_join(task, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    assert_int_equal(c.rc, WEFT_OK);
    assert_memory_equal(c.ids, want, c.rows * sizeof *want);
    free(c.logits), free(c.params), free(c.ids), free(want);
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
    weft_sampling p[2] = {{.temperature = 1}, {.temperature = 1}};
    memset(ids, 0xa7, sizeof ids);
    refused(weft_sample(NULL, WEFT_DTYPE_F32, NULL, in, 2, 8, 8, p), ids, "ids");
    refused(weft_sample(NULL, WEFT_DTYPE_F32, ids, NULL, 2, 8, 8, p), ids, "logits");
    refused(weft_sample(NULL, WEFT_DTYPE_F32, ids, in, 2, 8, 8, NULL), ids, "params");
    refused(
        weft_sample(NULL, WEFT_DTYPE_F32, ids, in, 2, 8, 8, (const weft_sampling *)((char *)p + 4)),
        ids, "aligned");
    refused(weft_sample(NULL, WEFT_DTYPE_F32, ids, in, 2, 8, 7, p), ids, "stride");
    refused(weft_sample(NULL, WEFT_DTYPE_F32, ids, in, 0, 8, 8, p), ids, "rows");
    refused(weft_sample(NULL, (weft_dtype)77, ids, in, 2, 8, 8, p), ids, "dtype");
    size_t wide = ((size_t)1 << 23) + 1;
    refused(weft_sample(NULL, WEFT_DTYPE_F32, ids, in, 1, wide, wide, p), ids, "at most");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draws_follow_the_distribution),
        cmocka_unit_test(test_ties_nan_and_the_edges),
        cmocka_unit_test(test_greedy_rows_are_argmax),
        cmocka_unit_test(test_a_seed_and_offset_give_one_token),
        cmocka_unit_test(test_in_a_tasks_stream_order),
        cmocka_unit_test(test_bad_arguments_are_refused),
    };
    return cmocka_run_group_tests(tests, am_setup, NULL);
}
