/*
 * test_rmsnorm_fp8.c - weft_rmsnorm_fp8's host reference against the two
 * calls it stands for, weft_rmsnorm into a buffer then weft_quantize_fp8
 * of that buffer, byte for byte (out with the padding between its rows,
 * the scales, sum_out with its padding), on fresh random data (the seed is
 * printed; WEFT_TEST_SEED replays it): fp32, bf16 and fp16 rows into E4M3
 * and E5M2; rows of 1, 7, 4096 and 5000 elements, 1, 3 and 64 of them,
 * padded strides whose padding would change a row if read; every
 * combination of weight, residual and sum_out; rows of zeros, with a NaN
 * and with an infinity. Each case runs with a NULL stream and on a task's
 * stream on the host backend, each call against the pair run the same
 * way. The pair's buffer is also quantized by quantize_ref.h's own
 * reference, which the op's output must equal. Then the NaN and Inf rules
 * as ops.h states them, and every bad argument refused with its reason
 * before anything is written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "ops/rmsnorm_fp8_ref.h"
#include "weft.h"
#include "weft/ops.h"

static const weft_dtype DTYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
static const weft_dtype OUT_TYPES[] = {WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2};
static const size_t COLS[] = {1, 7, 4096, 5000}, ROWS[] = {1, 3, 64};

static weft_runtime *runtime; /* host backend, for the calls on a task's stream */

/* ---- on a task's stream ----------------------------------------------- */

typedef struct rf_job {
    const rf_case *c;
    const rf_inputs *x;
    rf_outputs *o;
    int pair; /* the two calls, not the op */
    int rc;
} rf_job;

static void *rf_task(void *arg)
{
    rf_job *j = arg;
    j->rc = j->pair ? rf_pair(WEFT_TASK_STREAM, j->c, j->o->out, j->o->scales, j->o->sum, j->o->tmp,
                              j->x->in, j->x->residual, j->x->weight)
                    : rf_call(WEFT_TASK_STREAM, j->c, j->o->out, j->o->scales, j->o->sum, j->x->in,
                              j->x->residual, j->x->weight);
    if (j->rc == WEFT_OK)
        j->rc = weft_await();
    return NULL;
}

static void on_task(const rf_case *c, const rf_inputs *x, rf_outputs *o, int pair)
{
    rf_job j = {c, x, o, pair, -1};
    weft_task *t;
    assert_int_equal(weft_spawn(runtime, &t, rf_task, &j, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    if (j.rc != WEFT_OK)
        fail_msg("on a task's stream: %d %s", j.rc, weft_last_error());
}

/* ---- the cases ------------------------------------------------------------ */

static unsigned cases_run;

/* Case c: the op and the pair, each with a NULL stream and on a task's
 * stream; all four the same bytes. */
static void check_case(const rf_case *c)
{
    char what[200];
    rf_describe(c, what, sizeof what);
    rf_inputs x = rf_make(c);
    rf_outputs op = rf_outputs_new(c), pair = rf_outputs_new(c);
    rf_outputs op_task = rf_outputs_new(c), pair_task = rf_outputs_new(c);
    assert_non_null(x.in);
    assert_non_null(op.tmp);
    assert_non_null(pair.tmp);
    assert_non_null(op_task.tmp);
    assert_non_null(pair_task.tmp);

    int rc = rf_call(NULL, c, op.out, op.scales, op.sum, x.in, x.residual, x.weight);
    if (rc != WEFT_OK)
        fail_msg("%s: %d %s", what, rc, weft_last_error());
    rc = rf_pair(NULL, c, pair.out, pair.scales, pair.sum, pair.tmp, x.in, x.residual, x.weight);
    if (rc != WEFT_OK)
        fail_msg("%s: the pair: %d %s", what, rc, weft_last_error());
    if (!rf_same_bytes(what, c, &op, &pair))
        fail_msg("%s: not the bytes of weft_rmsnorm + weft_quantize_fp8", what);
    /* the pair quantized by a reference that is not the library's */
    if (c->rows * c->cols <= 20000 && qz_check(what, c->ot, c->dt, pair.tmp, op.out, op.scales,
                                               c->rows, c->cols, c->stride, c->out_stride))
        fail_msg("%s: not the quantization of weft_rmsnorm's row", what);

    on_task(c, &x, &op_task, 0);
    on_task(c, &x, &pair_task, 1);
    if (!rf_same_bytes(what, c, &op_task, &pair))
        fail_msg("%s: on a task's stream, not the pair's bytes", what);
    if (!rf_same_bytes(what, c, &pair_task, &pair))
        fail_msg("%s: the pair on a task's stream differs from the pair", what);
    cases_run++;

    rf_free(&x);
    rf_outputs_free(&op), rf_outputs_free(&pair);
    rf_outputs_free(&op_task), rf_outputs_free(&pair_task);
}

/* The shapes: one row unpadded; three with strides past the row; 64 with
 * strides past it by whole 16-byte vectors. */
static rf_case shape_case(weft_dtype dt, weft_dtype ot, size_t rows, size_t cols, unsigned with,
                          rf_kind kind)
{
    size_t pad = rows == 1 ? 0 : rows == 3 ? 3 : 8, out_pad = rows == 1 ? 0 : rows == 3 ? 5 : 16;
    rf_case c = {dt, ot, rows, cols, cols + pad, cols + out_pad, with, kind};
    return c;
}

static void test_equals_rmsnorm_then_quantize_fp8(void **state)
{
    (void)state;
    for (size_t d = 0; d < 3; d++)
        for (size_t o = 0; o < 2; o++)
            for (size_t ci = 0; ci < sizeof COLS / sizeof *COLS; ci++)
                for (size_t ri = 0; ri < sizeof ROWS / sizeof *ROWS; ri++)
                    for (unsigned with = 0; with < RF_WITH; with++) {
                        rf_case c = shape_case(DTYPES[d], OUT_TYPES[o], ROWS[ri], COLS[ci], with,
                                               ROWS[ri] == 1 ? RF_RANDOM : RF_MIXED);
                        check_case(&c);
                    }
    printf("  %u cases, each the op and the pair with a NULL stream and on a task's stream\n",
           cases_run);
}

/* One row of each kind that is not random, alone. */
static void test_rows_of_zeros_nan_and_inf_alone(void **state)
{
    (void)state;
    for (size_t d = 0; d < 3; d++)
        for (size_t o = 0; o < 2; o++)
            for (int kind = RF_ZEROS; kind <= RF_INF; kind++)
                for (size_t ci = 0; ci < sizeof COLS / sizeof *COLS; ci++) {
                    rf_case c = shape_case(DTYPES[d], OUT_TYPES[o], 1, COLS[ci],
                                           RF_WEIGHT | RF_RESIDUAL | RF_SUM, (rf_kind)kind);
                    check_case(&c);
                }
}

/* sum_out may be in or the residual, as weft_rmsnorm's may: s written
 * over the input it was formed from, and the output still the pair's
 * (run on copies aliased the same way). */
static void test_sum_out_over_in_or_the_residual(void **state)
{
    (void)state;
    for (size_t d = 0; d < 3; d++)
        for (int over_residual = 0; over_residual < 2; over_residual++)
            for (size_t ci = 0; ci < sizeof COLS / sizeof *COLS; ci++) {
                rf_case c = shape_case(DTYPES[d], WEFT_DTYPE_F8_E4M3, 3, COLS[ci],
                                       RF_WEIGHT | RF_RESIDUAL | RF_SUM, RF_MIXED);
                char what[200];
                rf_describe(&c, what, sizeof what);
                rf_inputs x = rf_make(&c);
                size_t bytes = x.n * x.es;
                void *in2 = malloc(bytes), *res2 = malloc(bytes);
                assert_non_null(in2);
                assert_non_null(res2);
                memcpy(in2, x.in, bytes);
                memcpy(res2, x.residual, bytes);
                rf_outputs op = rf_outputs_new(&c), pair = rf_outputs_new(&c);
                void *sum = over_residual ? x.residual : x.in;
                void *sum2 = over_residual ? res2 : in2;
                assert_int_equal(
                    rf_call(NULL, &c, op.out, op.scales, sum, x.in, x.residual, x.weight), WEFT_OK);
                assert_int_equal(
                    rf_pair(NULL, &c, pair.out, pair.scales, sum2, pair.tmp, in2, res2, x.weight),
                    WEFT_OK);
                memcpy(op.sum, sum, bytes); /* the sums, where each call wrote them */
                memcpy(pair.sum, sum2, bytes);
                op.sum_bytes = pair.sum_bytes = bytes;
                if (!rf_same_bytes(what, &c, &op, &pair))
                    fail_msg("%s: sum_out over %s: not the pair's bytes", what,
                             over_residual ? "the residual" : "in");
                rf_free(&x);
                free(in2), free(res2);
                rf_outputs_free(&op), rf_outputs_free(&pair);
            }
}

/* ---- NaN and Inf, as ops.h states them ------------------------------------ */

static int is_nan_code(weft_dtype t, uint8_t b)
{
    return qz_is_nan(t, b);
}

static void test_nan_and_inf_follow_the_two_calls(void **state)
{
    (void)state;
    const weft_dtype E4 = WEFT_DTYPE_F8_E4M3, F32 = WEFT_DTYPE_F32;
    /* row 0: a NaN; row 1: an Inf; row 2: zeros; row 3: plain */
    float in[4 * 4] = {1, NAN, 2, 3, 1, -INFINITY, 2, 3, 0, -0.0f, 0, 0, 3, -4, 0, 0};
    float scales[4];
    uint8_t out[16];
    assert_int_equal(
        weft_rmsnorm_fp8(NULL, F32, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 4, 4, 4),
        WEFT_OK);
    for (int j = 0; j < 4; j++) /* a NaN: the row's out NaN */
        assert_true(is_nan_code(E4, out[j]));
    assert_true(scales[0] == FLT_MIN);
    assert_true(is_nan_code(E4, out[5])); /* an Inf: NaN there, 0 elsewhere */
    assert_int_equal(out[4], 0x00);
    assert_int_equal(out[6], 0x00);
    assert_true(scales[1] == FLT_MIN);
    for (int j = 8; j < 12; j++) /* zeros stay zeros, signs kept */
        assert_int_equal(out[j], j == 9 ? 0x80 : 0x00);
    assert_true(scales[2] == FLT_MIN);
    assert_int_equal(out[13], 0xfe); /* the largest magnitude maps to -448 */

    /* fp16 past its range after the weight: Inf, so the scale is Inf, that
     * element NaN and the finite ones 0 */
    uint16_t h_in[2], h_w[2];
    weft__store(WEFT_DTYPE_F16, h_in, 0, 1.0f);
    weft__store(WEFT_DTYPE_F16, h_in, 1, 0.5f);
    weft__store(WEFT_DTYPE_F16, h_w, 0, 65504.0f);
    weft__store(WEFT_DTYPE_F16, h_w, 1, 1.0f);
    assert_int_equal(weft_rmsnorm_fp8(NULL, WEFT_DTYPE_F16, E4, out, scales, NULL, h_in, NULL, h_w,
                                      0.0f, 1, 2, 2, 2),
                     WEFT_OK);
    assert_true(isinf(scales[0]));
    assert_true(is_nan_code(E4, out[0]));
    assert_int_equal(out[1], 0x00);

    /* eps = 0 on a row of zeros: 0 / 0 */
    float zeros[3] = {0, 0, 0};
    assert_int_equal(weft_rmsnorm_fp8(NULL, F32, WEFT_DTYPE_F8_E5M2, out, scales, NULL, zeros, NULL,
                                      NULL, 0.0f, 1, 3, 3, 3),
                     WEFT_OK);
    for (int j = 0; j < 3; j++)
        assert_true(is_nan_code(WEFT_DTYPE_F8_E5M2, out[j]));
}

/* The row is rounded to the dtype before its amax and the division, as
 * weft_rmsnorm's output holds it: {1, 2} normalizes to 0.63245553 and
 * 1.26491106, which bf16 holds as 0.6328125 and 1.265625, so the scale
 * is 1.265625 / 448 and the codes 224 and 448. */
static void test_scale_is_taken_after_rounding_to_the_dtype(void **state)
{
    (void)state;
    uint16_t in[2];
    float scale;
    uint8_t out[2];
    weft__store(WEFT_DTYPE_BF16, in, 0, 1.0f);
    weft__store(WEFT_DTYPE_BF16, in, 1, 2.0f);
    assert_int_equal(weft_rmsnorm_fp8(NULL, WEFT_DTYPE_BF16, WEFT_DTYPE_F8_E4M3, out, &scale, NULL,
                                      in, NULL, NULL, 0.0f, 1, 2, 2, 2),
                     WEFT_OK);
    assert_true(scale == 1.265625f / 448.0f);
    assert_int_equal(out[0], 0x76); /* 224 */
    assert_int_equal(out[1], 0x7e); /* 448 */
}

/* ---- bad arguments ------------------------------------------------------ */

static void expect_refused(int rc, const char *says)
{
    assert_int_equal(rc, WEFT_EINVAL);
    printf("  refused: %s\n", weft_last_error());
    assert_non_null(strstr(weft_last_error(), "weft_rmsnorm_fp8: "));
    assert_non_null(strstr(weft_last_error(), says));
}

#ifdef WEFT_HAVE_CUDA
#define expect_no_kernels(call, says) ((void)sizeof(call), (void)(says))
#else
#define expect_no_kernels(call, says) expect_refused(call, says)
#endif

static void test_bad_arguments_are_refused_before_anything_is_written(void **state)
{
    (void)state;
    static float in[64], res[64], w[16], sum[64], scales[4];
    static uint8_t out[64];
    const weft_dtype E4 = WEFT_DTYPE_F8_E4M3, F = WEFT_DTYPE_F32;
    int dummy_stream;
    void *stream = &dummy_stream;
    for (int i = 0; i < 64; i++)
        in[i] = res[i] = 1, sum[i] = 7;
    for (int i = 0; i < 16; i++)
        w[i] = 1;
    for (int i = 0; i < 4; i++)
        scales[i] = 7;
    memset(out, 0xa7, sizeof out);
    float *mis = (float *)(void *)((char *)in + 2);

#define CALL(st, dt, ot, o, sc, sm, i, r, wt, eps, rows, cols, stride, ostride)                    \
    weft_rmsnorm_fp8(st, dt, ot, o, sc, sm, i, r, wt, eps, rows, cols, stride, ostride)
    expect_refused(
        CALL(NULL, F, WEFT_DTYPE_BF16, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
        "out_type 1 is not FP8");
    expect_refused(
        CALL(NULL, F, WEFT_DTYPE_I8, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
        "not FP8");
    expect_refused(CALL(NULL, E4, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                   "quantized type");
    expect_refused(
        CALL(NULL, (weft_dtype)9, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
        "unsupported dtype 9");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, NULL, NULL, -1.0f, 4, 8, 8, 8), "eps");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, NULL, NULL, NAN, 4, 8, 8, 8), "eps");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 0, 8, 8, 8),
                   "the input has zero rows");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 0, 8, 8),
                   "zero-length rows");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 7, 8),
                   "the input stride 7 is smaller than its row (8)");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 6),
                   "the output stride 6 is smaller than its row (8)");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, SIZE_MAX, 8),
                   "too large");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, SIZE_MAX),
                   "the output of 4 rows by stride");
    expect_refused(CALL(NULL, F, E4, NULL, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                   "out is NULL");
    expect_refused(CALL(NULL, F, E4, out, NULL, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                   "scales is NULL");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, NULL, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                   "in is NULL");
    expect_refused(
        CALL(NULL, F, E4, out, (float *)(void *)(out + 1), NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
        "scales is not aligned");
    expect_refused(CALL(NULL, F, E4, out, scales, mis, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                   "sum_out is not aligned");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, mis, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                   "in is not aligned");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, mis, NULL, 1e-5f, 4, 8, 8, 8),
                   "residual is not aligned");
    expect_refused(CALL(NULL, F, E4, out, scales, NULL, in, NULL, mis, 1e-5f, 4, 8, 8, 8),
                   "weight is not aligned");
    /* overlaps: out and scales with each input, sum_out and each other */
    expect_refused(
        CALL(NULL, F, E4, (uint8_t *)(in + 31), scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
        "out overlaps in");
    expect_refused(
        CALL(NULL, F, E4, (uint8_t *)res, scales, NULL, in, res, NULL, 1e-5f, 4, 8, 8, 8),
        "out overlaps residual");
    expect_refused(
        CALL(NULL, F, E4, (uint8_t *)(w + 7), scales, NULL, in, NULL, w, 1e-5f, 4, 8, 8, 8),
        "out overlaps weight");
    expect_refused(
        CALL(NULL, F, E4, (uint8_t *)(sum + 16), scales, sum, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
        "out overlaps sum_out");
    expect_refused(CALL(NULL, F, E4, out, in + 28, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                   "scales overlaps in");
    expect_refused(CALL(NULL, F, E4, out, res + 2, NULL, in, res, NULL, 1e-5f, 4, 8, 8, 8),
                   "scales overlaps residual");
    expect_refused(CALL(NULL, F, E4, out, w + 6, NULL, in, NULL, w, 1e-5f, 4, 8, 8, 8),
                   "scales overlaps weight");
    expect_refused(CALL(NULL, F, E4, out, sum + 20, sum, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                   "scales overlaps sum_out");
    expect_refused(CALL(NULL, F, E4, out, (float *)(void *)(out + 28), NULL, in, NULL, NULL, 1e-5f,
                        4, 8, 8, 8),
                   "scales overlaps out");
    /* just past each other is no overlap */
    float ok_scales[4];
    assert_int_equal(
        CALL(NULL, F, E4, (uint8_t *)(in + 32), ok_scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
        WEFT_OK);
    for (int i = 0; i < 32; i++)
        in[32 + i] = 1;
    expect_no_kernels(CALL(stream, F, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                      "built without CUDA");
    expect_refused(CALL(stream, F, E4, NULL, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
                   "out is NULL");
    /* outside a task, the task's stream is refused */
    assert_int_equal(
        CALL(WEFT_TASK_STREAM, F, E4, out, scales, NULL, in, NULL, NULL, 1e-5f, 4, 8, 8, 8),
        WEFT_ENOTASK);
    assert_non_null(strstr(weft_last_error(), "weft_rmsnorm_fp8: WEFT_TASK_STREAM outside a task"));
#undef CALL
    /* nothing written by any refused call */
    for (int i = 0; i < 4; i++)
        assert_true(scales[i] == 7);
    for (int i = 0; i < 64; i++) {
        assert_int_equal(out[i], 0xa7);
        assert_true(sum[i] == 7);
    }
}

static int setup(void **state)
{
    am_setup(state);
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.backend = WEFT_BACKEND_HOST;
    return weft_runtime_create(&runtime, &cfg) == WEFT_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return weft_runtime_destroy(runtime) == WEFT_OK ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_rmsnorm_then_quantize_fp8),
        cmocka_unit_test(test_rows_of_zeros_nan_and_inf_alone),
        cmocka_unit_test(test_sum_out_over_in_or_the_residual),
        cmocka_unit_test(test_nan_and_inf_follow_the_two_calls),
        cmocka_unit_test(test_scale_is_taken_after_rounding_to_the_dtype),
        cmocka_unit_test(test_bad_arguments_are_refused_before_anything_is_written),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
