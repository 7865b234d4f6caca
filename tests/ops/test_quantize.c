/*
 * test_quantize.c - weft_quantize_fp8's host reference (NULL stream)
 * against quantize_ref.h's own reference on fresh random data (the seed is
 * printed; WEFT_TEST_SEED replays it): fp32, bf16 and fp16 rows into E4M3
 * and E5M2, 1 to 4099 columns, padded strides whose padding would change a
 * scale if read; rows of zeros, of fp32 subnormals, with NaN and with an
 * infinity. Then what it is for: bf16 activations and a Linear weight,
 * each quantized by rows, through weft_matmul's FP8 product with those
 * scales, against the bf16 product (within FP8's precision, and far from a
 * product that ignored the scales); the call in a task's stream order; and
 * every bad argument refused with its reason before anything is written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "ops/quantize_ref.h"
#include "weft.h"
#include "weft/ops.h"

static const weft_dtype IN_TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
static const weft_dtype OUT_TYPES[] = {WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2};

static void check_case(weft_dtype ot, weft_dtype it, size_t rows, size_t cols, size_t in_stride,
                       size_t out_stride, qz_kind kind)
{
    void *in = qz_rows(it, rows, cols, in_stride, kind);
    size_t n_out = (rows - 1) * out_stride + cols;
    uint8_t *out = malloc(n_out + 16);
    float *scales = malloc(rows * sizeof *scales);
    assert_non_null(in);
    assert_non_null(out);
    assert_non_null(scales);
    memset(out, 0xa7, n_out + 16);
    int rc = weft_quantize_fp8(NULL, ot, out, scales, it, in, rows, cols, in_stride, out_stride);
    if (rc != WEFT_OK)
        fail_msg("%d %s", rc, weft_last_error());
    char what[160];
    snprintf(what, sizeof what, "in %d out %d %s %zu x %zu strides %zu/%zu", (int)it, (int)ot,
             qz_kind_names[kind], rows, cols, in_stride, out_stride);
    if (qz_check(what, ot, it, in, out, scales, rows, cols, in_stride, out_stride))
        fail_msg("%s: differs from the reference", what);
    for (size_t r = 0; r + 1 < rows; r++) /* the padding between output rows untouched */
        for (size_t j = cols; j < out_stride; j++)
            assert_int_equal(out[r * out_stride + j], 0xa7);
    for (size_t i = n_out; i < n_out + 16; i++)
        assert_int_equal(out[i], 0xa7);
    free(in), free(out), free(scales);
}

static void test_every_type_kind_and_size(void **state)
{
    (void)state;
    static const size_t COLS[] = {1, 5, 64, 4099};
    for (size_t oi = 0; oi < 2; oi++)
        for (size_t ii = 0; ii < 3; ii++)
            for (int kind = 0; kind < QZ_KINDS; kind++)
                for (size_t ci = 0; ci < 4; ci++) {
                    size_t cols = COLS[ci];
                    check_case(OUT_TYPES[oi], IN_TYPES[ii], 37, cols, cols + 3, cols + 5,
                               (qz_kind)kind);
                    check_case(OUT_TYPES[oi], IN_TYPES[ii], 1, cols, cols, cols, (qz_kind)kind);
                }
    /* the largest element maps to the type's largest value, its sign kept */
    float row[3] = {-3.0f, 1.5f, 0.25f}, scale;
    uint8_t q[3];
    assert_int_equal(
        weft_quantize_fp8(NULL, WEFT_DTYPE_F8_E4M3, q, &scale, WEFT_DTYPE_F32, row, 1, 3, 3, 3),
        WEFT_OK);
    assert_true(scale == 3.0f / 448.0f);
    assert_int_equal(q[0], 0xfe); /* -448 */
    assert_true(qz_decode(WEFT_DTYPE_F8_E4M3, q[1]) == 224.0);
}

/* x (m x k) and w (n x k, a Linear weight) in bf16, each quantized by rows:
 * the FP8 product with the scales as weft_matmul's outer vectors is x w^T
 * to FP8's precision. */
static void test_feeds_an_fp8_matmul(void **state)
{
    (void)state;
    enum { M = 24, N = 48, K = 256 };
    uint16_t *x = malloc(M * K * 2), *w = malloc(N * K * 2);
    /* rows of magnitudes 10^-2 to 10^2: each row its own scale */
    for (int i = 0; i < M * K; i++)
        weft__store(WEFT_DTYPE_BF16, x, i, (float)(qz_normal() * pow(10, i / K % 5 - 2)));
    for (int i = 0; i < N * K; i++)
        weft__store(WEFT_DTYPE_BF16, w, i, (float)(qz_normal() * pow(10, i / K % 5 - 2)));
    uint8_t *xq = malloc(M * K), *wq = malloc(N * K);
    float sx[M], sw[N], *d = malloc(M * N * sizeof *d), *d_raw = malloc(M * N * sizeof *d);
    assert_int_equal(
        weft_quantize_fp8(NULL, WEFT_DTYPE_F8_E4M3, xq, sx, WEFT_DTYPE_BF16, x, M, K, K, K),
        WEFT_OK);
    assert_int_equal(
        weft_quantize_fp8(NULL, WEFT_DTYPE_F8_E4M3, wq, sw, WEFT_DTYPE_BF16, w, N, K, K, K),
        WEFT_OK);
    weft_matmul_desc desc = {.m = M,
                             .n = N,
                             .k = K,
                             .type = WEFT_DTYPE_F32,
                             .in_type = WEFT_DTYPE_F8_E4M3,
                             .trans_b = 1,
                             .scale_a_mode = WEFT_MATMUL_SCALE_OUTER,
                             .scale_b_mode = WEFT_MATMUL_SCALE_OUTER,
                             .scale_a = sx,
                             .scale_b = sw};
    if (weft_matmul(NULL, &desc, d, xq, wq, NULL) != WEFT_OK)
        fail_msg("weft_matmul: %s", weft_last_error());
    float one = 1.0f;
    desc.scale_a_mode = desc.scale_b_mode = WEFT_MATMUL_SCALE_TENSOR;
    desc.scale_a = desc.scale_b = &one;
    assert_int_equal(weft_matmul(NULL, &desc, d_raw, xq, wq, NULL), WEFT_OK);
    double worst = 0, worst_raw = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = 0, bound = 0;
            for (int p = 0; p < K; p++) {
                double a = weft__load(WEFT_DTYPE_BF16, x, (size_t)i * K + p);
                double b = weft__load(WEFT_DTYPE_BF16, w, (size_t)j * K + p);
                want += a * b;
                bound += fabs(a * b);
            }
            /* each factor within half an E4M3 step (2^-4 relative) */
            double err = fabs(d[i * N + j] - want) / (bound + 1e-300);
            worst = fmax(worst, err);
            worst_raw = fmax(worst_raw, fabs(d_raw[i * N + j] - want) / (bound + 1e-300));
        }
    printf("  FP8 product against bf16's: largest error %.4f of the sum of |products| (scales "
           "left out: %.3g)\n",
           worst, worst_raw);
    assert_true(worst < 0.13);
    assert_true(worst_raw > 1);
    free(x), free(w), free(xq), free(wq), free(d), free(d_raw);
}

/* qz_chain_task on the host backend: the softmax ran first, so every
 * row's largest, its last, became 448. */
static void test_on_a_tasks_stream(void **state)
{
    (void)state;
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.backend = WEFT_BACKEND_HOST;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    qz_chain c = {malloc(400 * 4), malloc(4 * 4), malloc(400), 0};
    for (int i = 0; i < 400; i++)
        c.in[i] = (float)(i % 100) * 0.05f;
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, qz_chain_task, &c, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(c.rc, WEFT_OK);
    /* the softmax ran first: every row's largest is its last, e^4.95 / sum */
    for (int r = 0; r < 4; r++) {
        assert_int_equal(c.out[r * 100 + 99], 0x7e);
        assert_true(c.scales[r] == c.in[r * 100 + 99] / 448.0f);
    }
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    free(c.in), free(c.scales), free(c.out);
}

static void expect_refused(int rc, const char *says)
{
    assert_int_equal(rc, WEFT_EINVAL);
    printf("  refused: %s\n", weft_last_error());
    assert_non_null(strstr(weft_last_error(), says));
}

static void test_bad_arguments(void **state)
{
    (void)state;
    float in[64] = {1}, scales[4] = {7, 7, 7, 7};
    uint8_t out[64];
    memset(out, 0xa7, sizeof out);
    const weft_dtype E4 = WEFT_DTYPE_F8_E4M3, F32 = WEFT_DTYPE_F32;
    expect_refused(weft_quantize_fp8(NULL, WEFT_DTYPE_BF16, out, scales, F32, in, 4, 8, 8, 8),
                   "not FP8");
    expect_refused(weft_quantize_fp8(NULL, E4, out, scales, E4, in, 4, 8, 8, 8), "quantized type");
    expect_refused(weft_quantize_fp8(NULL, E4, out, scales, F32, in, 0, 8, 8, 8), "zero rows");
    expect_refused(weft_quantize_fp8(NULL, E4, out, scales, F32, in, 4, 0, 8, 8), "zero-length");
    expect_refused(weft_quantize_fp8(NULL, E4, out, scales, F32, in, 4, 8, 7, 8), "stride 7");
    expect_refused(weft_quantize_fp8(NULL, E4, out, scales, F32, in, 4, 8, 8, 6), "stride 6");
    expect_refused(weft_quantize_fp8(NULL, E4, NULL, scales, F32, in, 4, 8, 8, 8), "out is NULL");
    expect_refused(weft_quantize_fp8(NULL, E4, out, NULL, F32, in, 4, 8, 8, 8), "scales is NULL");
    expect_refused(weft_quantize_fp8(NULL, E4, out, scales, F32, NULL, 4, 8, 8, 8), "in is NULL");
    expect_refused(weft_quantize_fp8(NULL, E4, out, (float *)(out + 1), F32, in, 4, 8, 8, 8),
                   "aligned");
    expect_refused(weft_quantize_fp8(NULL, E4, (uint8_t *)in + 8, scales, F32, in, 4, 8, 8, 8),
                   "out overlaps in");
    expect_refused(weft_quantize_fp8(NULL, E4, out, in + 20, F32, in, 4, 8, 8, 8),
                   "scales overlaps in");
    expect_refused(
        weft_quantize_fp8(NULL, E4, out, (float *)(void *)(out + 16), F32, in, 4, 8, 8, 8),
        "scales overlaps out");
    for (int i = 0; i < 4; i++) /* nothing written */
        assert_true(scales[i] == 7);
    for (int i = 0; i < 64; i++)
        assert_int_equal(out[i], 0xa7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_kind_and_size),
        cmocka_unit_test(test_feeds_an_fp8_matmul),
        cmocka_unit_test(test_on_a_tasks_stream),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, am_setup, NULL);
}
