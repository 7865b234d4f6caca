/*
 * test_gather.c - weft_gather_rows's host reference (NULL stream) on fresh
 * random data (the seed is printed; WEFT_TEST_SEED replays it): fp32,
 * bf16 and fp16 tables with padded strides, ids repeated and out of the
 * table (rows of zeros), out's padding left alone; the call in a task's
 * stream order after the argmax that writes its ids; bad arguments refused
 * before anything is written.
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

/* out (rows x out_stride, poisoned 0xa7) against the table and ids. */
static void check_gather(weft_dtype t, const void *out, const void *table, const int32_t *ids,
                         size_t rows, size_t cols, size_t table_rows, size_t table_stride,
                         size_t out_stride)
{
    size_t es = weft__dtype_size(t);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < out_stride; c++) {
            const unsigned char *got = (const unsigned char *)out + (r * out_stride + c) * es;
            unsigned char want[4] = {0xa7, 0xa7, 0xa7, 0xa7}; /* padding: left alone */
            if (c < cols) {
                memset(want, 0, sizeof want);
                if (ids[r] >= 0 && (size_t)ids[r] < table_rows)
                    memcpy(want, (const char *)table + ((size_t)ids[r] * table_stride + c) * es,
                           es);
            }
            if (memcmp(got, want, es) != 0)
                fail_msg("dtype %d: out[%zu][%zu] (id %d) differs", (int)t, r, c, ids[r]);
        }
}

static void test_rows_by_id_and_zeros_outside_the_table(void **state)
{
    (void)state;
    static const size_t COLS[] = {1, 7, 64, 130};
    enum { TABLE = 50, ROWS = 12 };
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ci = 0; ci < 4; ci++) {
            weft_dtype t = TYPES[ti];
            size_t cols = COLS[ci], ts = cols + ci, os = cols + 2, es = weft__dtype_size(t);
            void *table = am_rows(t, TABLE, cols, ts, AM_RANDOM);
            void *out = malloc(ROWS * os * es);
            int32_t ids[ROWS];
            assert_true(table && out);
            memset(out, 0xa7, ROWS * os * es);
            for (int r = 0; r < ROWS; r++)
                ids[r] = (int32_t)(am_next() % TABLE);
            ids[3] = ids[4];    /* a repeat */
            ids[5] = -1;        /* outside: zeros */
            ids[6] = TABLE;     /* just past the end */
            ids[7] = INT32_MAX; /* far past it */
            ids[8] = TABLE - 1; /* the last row */
            assert_int_equal(weft_gather_rows(NULL, t, out, table, ids, ROWS, cols, TABLE, ts, os),
                             WEFT_OK);
            check_gather(t, out, table, ids, ROWS, cols, TABLE, ts, os);
            free(table);
            free(out);
        }
}

/* ---- in a task's stream order (host backend) -------------------------- */

typedef struct chain {
    float *logits, *table, *out;
    int32_t *ids;
    int rc;
} chain;

enum { CH_ROWS = 6, CH_VOCAB = 40, CH_COLS = 9 };

static void *chain_task(void *arg)
{
    chain *c = arg;
    void *s = WEFT_TASK_STREAM;
    if ((c->rc = weft_argmax(s, WEFT_DTYPE_F32, c->ids, c->logits, CH_ROWS, CH_VOCAB, CH_VOCAB)) !=
            WEFT_OK ||
        (c->rc = weft_gather_rows(s, WEFT_DTYPE_F32, c->out, c->table, c->ids, CH_ROWS, CH_COLS,
                                  CH_VOCAB, CH_COLS, CH_COLS)) != WEFT_OK)
        return NULL;
    c->rc = weft_await();
    return NULL;
}

static void test_in_a_tasks_stream_order(void **state)
{
    (void)state;
    chain c;
    c.logits = am_rows(WEFT_DTYPE_F32, CH_ROWS, CH_VOCAB, CH_VOCAB, AM_RANDOM);
    c.table = am_rows(WEFT_DTYPE_F32, CH_VOCAB, CH_COLS, CH_COLS, AM_RANDOM);
    c.out = malloc(CH_ROWS * CH_COLS * sizeof *c.out);
    c.ids = malloc(CH_ROWS * sizeof *c.ids);
    assert_true(c.logits && c.table && c.out && c.ids);
    memset(c.out, 0xa7, CH_ROWS * CH_COLS * sizeof *c.out);
    memset(c.ids, 0xff, CH_ROWS * sizeof *c.ids); /* read early: -1, rows of zeros */
    weft_runtime *rt;
    weft_config cfg = {.workers = 1};
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    weft_task *task;
    assert_int_equal(weft_spawn(rt, &task, chain_task, &c, NULL), WEFT_OK);
    assert_int_equal(weft_join(task, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    assert_int_equal(c.rc, WEFT_OK);
    int32_t want[CH_ROWS];
    for (int r = 0; r < CH_ROWS; r++)
        want[r] = am_ref(WEFT_DTYPE_F32, c.logits, (size_t)r, CH_VOCAB, CH_VOCAB);
    check_gather(WEFT_DTYPE_F32, c.out, c.table, want, CH_ROWS, CH_COLS, CH_VOCAB, CH_COLS,
                 CH_COLS);
    free(c.logits), free(c.table), free(c.out), free(c.ids);
}

/* ---- bad arguments ---------------------------------------------------- */

static void refused(int rc, const float *out, const char *says)
{
    assert_int_equal(rc, WEFT_EINVAL);
    printf("  %s\n", weft_last_error());
    assert_non_null(strstr(weft_last_error(), says));
    for (int i = 0; i < 16; i++)
        assert_true(isnan(out[i])); /* nothing written */
}

static void test_bad_arguments_are_refused(void **state)
{
    (void)state;
    float table[64] = {0}, out[16];
    int32_t ids[2] = {0, 1};
    for (int i = 0; i < 16; i++)
        out[i] = NAN;
    const weft_dtype F = WEFT_DTYPE_F32;
    refused(weft_gather_rows(NULL, F, out, table, NULL, 2, 8, 8, 8, 8), out, "ids");
    refused(weft_gather_rows(NULL, F, out, table, (int32_t *)((char *)ids + 2), 2, 8, 8, 8, 8), out,
            "ids");
    refused(weft_gather_rows(NULL, F, NULL, table, ids, 2, 8, 8, 8, 8), out, "out");
    refused(weft_gather_rows(NULL, F, out, NULL, ids, 2, 8, 8, 8, 8), out, "table");
    refused(weft_gather_rows(NULL, F, out, table, ids, 2, 8, 8, 7, 8), out, "stride");
    refused(weft_gather_rows(NULL, F, out, table, ids, 2, 8, 0, 8, 8), out, "zero rows");
    refused(weft_gather_rows(NULL, F, out, table, ids, 0, 8, 8, 8, 8), out, "zero rows");
    refused(weft_gather_rows(NULL, F, table + 4, table, ids, 2, 8, 8, 8, 8), out, "overlaps");
    refused(weft_gather_rows(NULL, (weft_dtype)77, out, table, ids, 2, 8, 8, 8, 8), out, "dtype");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_by_id_and_zeros_outside_the_table),
        cmocka_unit_test(test_in_a_tasks_stream_order),
        cmocka_unit_test(test_bad_arguments_are_refused),
    };
    return cmocka_run_group_tests(tests, am_setup, NULL);
}
