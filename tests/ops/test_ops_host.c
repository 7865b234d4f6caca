/*
 * test_ops_host.c - the host reference of every fused operator against
 * float64 formulas written here, on fresh random data each run.
 *
 * The formulas are written here in float64 with libm; the two sides share
 * no code but the dtype conversions, which
 * test_conversions_round_to_nearest_even pins down on their own. Every
 * output buffer is poisoned (all-ones bytes, a NaN in each
 * dtype) before a call; afterwards every element of every row must have
 * been written and every element of the stride padding left alone.
 *
 * Bounds: fp32 within 1e-5 relative to the magnitude of the terms a result
 * is made of (a sum that cancels is judged against its terms); bf16 and
 * fp16 additionally half an ulp of the result (2^-8, 2^-11 relative, and
 * fp16's half subnormal step 2^-25 absolute).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"
#include "weft/ops.h"
#include "ops/ops_internal.h"

/* ---- float64 reference math -------------------------------------------- */

static double dabs(double x)
{
    return x < 0 ? -x : x;
}

static double ref_gelu(weft_gelu_form form, double x)
{
    if (form == WEFT_GELU_TANH) {
        /* 0.5 (1 + tanh u) cancels in float64 too, below x = -5; where
         * it does not, it must agree with the sigmoid form used there. */
        double u = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
        if (u > -2)
            return 0.5 * x * (1.0 + tanh(u));
        return x / (1.0 + exp(-2 * u));
    }
    return 0.5 * x * erfc(-x / 1.41421356237309504880);
}

/* How much the fp32 rounding of the library's intermediates is magnified in
 * GELU(x): the tanh form is x sigmoid(2u) with u ~ x^3, and a relative
 * error e in 2u becomes e |2u| (1 - sigmoid(2u)) in the result - up to ~36
 * in the far negative tail, where GELU is ~1e-15. The erf form is computed
 * from x exactly and needs no allowance. */
static double ref_gelu_cond(weft_gelu_form form, double x)
{
    if (form == WEFT_GELU_ERF)
        return 1.0;
    double z = 2 * 0.79788456080286535588 * (x + 0.044715 * x * x * x);
    return 1.0 + dabs(z) * (1.0 - 1.0 / (1.0 + exp(-z)));
}

static double ref_silu(double x)
{
    return x / (1.0 + exp(-x));
}

/* ---- random numbers: a fresh seed each run, printed -------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng_next() >> 11) * 0x1p-53;
}

/* ---- row buffers --------------------------------------------------------- */

static const weft_dtype DTYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
static const char *const DTYPE_NAMES[] = {"f32", "bf16", "f16"};

typedef struct buf {
    weft_dtype dtype;
    size_t rows, cols, stride, n;
    void *p;
} buf;

static buf buf_new(weft_dtype dtype, size_t rows, size_t cols, size_t stride)
{
    buf b = {dtype, rows, cols, stride, (rows - 1) * stride + cols, NULL};
    b.p = malloc(b.n * weft__dtype_size(dtype));
    assert_non_null(b.p);
    return b;
}

static void buf_free(buf *b)
{
    free(b->p);
    b->p = NULL;
}

static int in_row(const buf *b, size_t i)
{
    return i % b->stride < b->cols;
}

/* Random values in [lo, hi) rounded to the dtype; the stride padding gets
 * NaN so that a read of it would show in the results. */
static void buf_random(buf *b, double lo, double hi)
{
    for (size_t i = 0; i < b->n; i++)
        weft__store(b->dtype, b->p, i, in_row(b, i) ? (float)rng_uniform(lo, hi) : NAN);
}

static void buf_poison(buf *b)
{
    memset(b->p, 0xff, b->n * weft__dtype_size(b->dtype));
}

static double buf_get(const buf *b, size_t r, size_t j)
{
    return weft__load(b->dtype, b->p, r * b->stride + j);
}

static int is_poison(const buf *b, size_t i)
{
    if (b->dtype == WEFT_DTYPE_F32)
        return ((const uint32_t *)b->p)[i] == 0xffffffffu;
    return ((const uint16_t *)b->p)[i] == 0xffffu;
}

/* Every row element written, every padding element untouched. */
static void assert_fully_written(const buf *b, const char *what)
{
    size_t unwritten = 0, touched = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (in_row(b, i))
            unwritten += is_poison(b, i);
        else
            touched += !is_poison(b, i);
    }
    if (unwritten || touched)
        print_error("%s: %zu elements not written, %zu padding elements written\n", what, unwritten,
                    touched);
    assert_int_equal(unwritten, 0);
    assert_int_equal(touched, 0);
}

static void assert_all_poison(const buf *b)
{
    for (size_t i = 0; i < b->n; i++)
        assert_true(is_poison(b, i));
}

/* ---- comparing with the reference -------------------------------------- */

typedef struct cmp {
    const char *what;
    weft_dtype dtype;
    size_t bad;
    double worst; /* largest error / tolerance seen */
} cmp;

static void cmp_one(cmp *c, double got, double ref, double scale, size_t r, size_t j)
{
    double u = c->dtype == WEFT_DTYPE_BF16 ? 0x1p-8 : c->dtype == WEFT_DTYPE_F16 ? 0x1p-11 : 0;
    double floor = c->dtype == WEFT_DTYPE_F16 ? 0x1p-25 : 1e-37;
    double tol = u * dabs(ref) + 1e-5 * (dabs(ref) > scale ? dabs(ref) : scale) + floor;
    double err = dabs(got - ref);

    if (!(err <= tol)) {
        if (c->bad++ < 5)
            print_error("%s %s: [%zu][%zu] got %.9g want %.9g (tol %.3g)\n", c->what,
                        DTYPE_NAMES[c->dtype], r, j, got, ref, tol);
    } else if (err / tol > c->worst) {
        c->worst = err / tol;
    }
}

static void cmp_done(const cmp *c)
{
    if (getenv("WEFT_TEST_VERBOSE"))
        printf("  %-16s %-4s worst error %.2f of the bound\n", c->what, DTYPE_NAMES[c->dtype],
               c->worst);
    assert_int_equal(c->bad, 0);
}

/* The shapes every row op runs on: row lengths 1, 7, 4095, 4097, a few
 * rows, strides equal to and larger than the row. */
typedef struct shape {
    size_t rows, cols, stride;
} shape;

static const shape SHAPES[] = {
    {1, 1, 1}, {5, 1, 3}, {3, 7, 7}, {2, 7, 12}, {2, 4095, 4095}, {3, 4097, 4100},
};
enum { NSHAPES = sizeof SHAPES / sizeof *SHAPES };

/* ---- conversions and Philox ---------------------------------------------- */

static void test_conversions_round_to_nearest_even(void **state)
{
    (void)state;
    /* Every fp16 value survives the round trip; every non-NaN one exactly. */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = weft__f16_to_f32((uint16_t)h);
        if (isnan(f))
            assert_true(isnan(weft__f16_to_f32(weft__f32_to_f16(f))));
        else
            assert_int_equal(weft__f32_to_f16(f), h);
    }
    assert_true(weft__f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(weft__f16_to_f32(0x7bff) == 65504.0f);
    assert_int_equal(weft__f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(weft__f32_to_f16(65520.0f), 0x7c00);   /* the tie goes to Inf (even) */
    assert_int_equal(weft__f32_to_f16(0x1p-25f), 0x0000);   /* tie to even: 0 */
    assert_int_equal(weft__f32_to_f16(0x1.8p-24f), 0x0002); /* 1.5 steps: tie to 2 */
    assert_int_equal(weft__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(weft__f32_to_f16(1.0f + 0x3p-11f), 0x3c02);
    assert_int_equal(weft__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(weft__f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
    assert_int_equal(weft__f32_to_bf16(INFINITY), 0x7f80);
    assert_true(isnan(weft__bf16_to_f32(weft__f32_to_bf16(NAN))));
    assert_true(isnan(weft__f16_to_f32(weft__f32_to_f16(NAN))));

    /* Random floats: the result is a nearest neighbour, ties to even. */
    for (int i = 0; i < 200000; i++) {
        float f = (float)rng_uniform(-70000, 70000) * (float)pow(2.0, (double)(i % 40) - 30);
        for (int k = 1; k < 3; k++) {
            weft_dtype dt = DTYPES[k];
            float g = weft__round_to(dt, f);
            uint16_t bits = k == 1 ? weft__f32_to_bf16(f) : weft__f32_to_f16(f);
            if (isinf(g))
                continue;
            float up = k == 1 ? weft__bf16_to_f32((uint16_t)(bits + 1))
                              : weft__f16_to_f32((uint16_t)(bits + 1));
            float down = k == 1 ? weft__bf16_to_f32((uint16_t)(bits - 1))
                                : weft__f16_to_f32((uint16_t)(bits - 1));
            double e = dabs((double)f - g);
            if (!isnan(up) && !isinf(up) && bits != 0x8000 && bits != 0)
                assert_true(e <= dabs((double)f - up));
            if (!isnan(down) && !isinf(down) && bits != 0x8000 && bits != 0)
                assert_true(e <= dabs((double)f - down));
        }
    }
}

static void test_philox_matches_random123_known_answers(void **state)
{
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof *kat; i++) {
        uint32_t out[4];
        weft__philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int w = 0; w < 4; w++)
            assert_int_equal(out[w], kat[i].out[w]);
    }
}

/* ---- bias + GELU + residual ---------------------------------------------- */

static void run_gelu(weft_dtype dt, weft_gelu_form form, shape s, int with_bias, int with_res)
{
    buf in = buf_new(dt, s.rows, s.cols, s.stride), out = buf_new(dt, s.rows, s.cols, s.stride);
    buf bias = buf_new(dt, 1, s.cols, s.cols), res = buf_new(dt, s.rows, s.cols, s.stride);
    cmp c = {form == WEFT_GELU_TANH ? "gelu_tanh" : "gelu_erf", dt, 0, 0};

    buf_random(&in, -6, 6);
    buf_random(&bias, -1, 1);
    buf_random(&res, -2, 2);
    buf_poison(&out);
    assert_int_equal(weft_bias_gelu_residual(NULL, dt, form, out.p, in.p, with_bias ? bias.p : NULL,
                                             with_res ? res.p : NULL, s.rows, s.cols, s.stride),
                     WEFT_OK);
    assert_fully_written(&out, c.what);
    for (size_t r = 0; r < s.rows; r++)
        for (size_t j = 0; j < s.cols; j++) {
            double h = buf_get(&in, r, j) + (with_bias ? buf_get(&bias, 0, j) : 0);
            double g = ref_gelu(form, h), rr = with_res ? buf_get(&res, r, j) : 0;
            cmp_one(&c, buf_get(&out, r, j), g + rr, dabs(g) * ref_gelu_cond(form, h) + dabs(rr), r,
                    j);
        }
    cmp_done(&c);
    buf_free(&in), buf_free(&out), buf_free(&bias), buf_free(&res);
}

static void test_bias_gelu_residual_matches_float64(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int form = 0; form < 2; form++)
            for (int k = 0; k < NSHAPES; k++)
                run_gelu(DTYPES[d], (weft_gelu_form)form, SHAPES[k], k != 1, k != 2);
}

static void test_bias_gelu_residual_in_place(void **state)
{
    (void)state;
    buf x = buf_new(WEFT_DTYPE_F32, 2, 33, 40), res = buf_new(WEFT_DTYPE_F32, 2, 33, 40);
    buf want = buf_new(WEFT_DTYPE_F32, 2, 33, 40);
    buf_random(&x, -3, 3);
    buf_random(&res, -3, 3);
    buf_poison(&want);
    assert_int_equal(weft_bias_gelu_residual(NULL, WEFT_DTYPE_F32, WEFT_GELU_ERF, want.p, x.p, NULL,
                                             res.p, 2, 33, 40),
                     WEFT_OK);
    assert_int_equal(weft_bias_gelu_residual(NULL, WEFT_DTYPE_F32, WEFT_GELU_ERF, x.p, x.p, NULL,
                                             res.p, 2, 33, 40),
                     WEFT_OK);
    for (size_t r = 0; r < 2; r++)
        for (size_t j = 0; j < 33; j++)
            assert_true(buf_get(&x, r, j) == buf_get(&want, r, j));
    buf_free(&x), buf_free(&res), buf_free(&want);
}

/* ---- LayerNorm and RMSNorm ------------------------------------------------ */

static void run_norm(weft_dtype dt, int rms, shape s, int with_res, int affine, double offset)
{
    buf in = buf_new(dt, s.rows, s.cols, s.stride), res = buf_new(dt, s.rows, s.cols, s.stride);
    buf out = buf_new(dt, s.rows, s.cols, s.stride), sum = buf_new(dt, s.rows, s.cols, s.stride);
    buf w = buf_new(dt, 1, s.cols, s.cols), b = buf_new(dt, 1, s.cols, s.cols);
    cmp c = {rms ? "rmsnorm" : "layernorm", dt, 0, 0};
    const float eps = 1e-5f;
    double *row = malloc(s.cols * sizeof *row);

    assert_non_null(row);
    buf_random(&in, offset - 2, offset + 2);
    buf_random(&res, -1, 1);
    buf_random(&w, -2, 2);
    buf_random(&b, -1, 1);
    buf_poison(&out);
    buf_poison(&sum);
    void *rp = with_res ? res.p : NULL, *wp = affine ? w.p : NULL, *sp = with_res ? sum.p : NULL;
    int rc = rms ? weft_rmsnorm(NULL, dt, out.p, sp, in.p, rp, wp, eps, s.rows, s.cols, s.stride)
                 : weft_layernorm(NULL, dt, out.p, sp, in.p, rp, wp, affine ? b.p : NULL, eps,
                                  s.rows, s.cols, s.stride);
    assert_int_equal(rc, WEFT_OK);
    assert_fully_written(&out, c.what);
    if (with_res)
        assert_fully_written(&sum, "sum_out");
    else
        assert_all_poison(&sum);
    for (size_t r = 0; r < s.rows; r++) {
        double mean = 0, var = 0;
        for (size_t j = 0; j < s.cols; j++) {
            double v = buf_get(&in, r, j);
            if (with_res) { /* the sum as stored: fp32 add, rounded to the dtype */
                v = weft__round_to(dt, (float)(v + buf_get(&res, r, j)));
                assert_true(buf_get(&sum, r, j) == v);
            }
            row[j] = v;
            mean += v;
        }
        mean = rms ? 0 : mean / (double)s.cols;
        for (size_t j = 0; j < s.cols; j++)
            var += (row[j] - mean) * (row[j] - mean);
        double rstd = 1.0 / sqrt(var / (double)s.cols + eps);
        for (size_t j = 0; j < s.cols; j++) {
            double n = (row[j] - mean) * rstd, wj = affine ? buf_get(&w, 0, j) : 1;
            double bj = affine && !rms ? buf_get(&b, 0, j) : 0;
            /* An error in the mean moves n absolutely; judge it on 1 + |n|. */
            cmp_one(&c, buf_get(&out, r, j), n * wj + bj, (1 + dabs(n)) * dabs(wj) + dabs(bj), r,
                    j);
        }
    }
    cmp_done(&c);
    free(row);
    buf_free(&in), buf_free(&res), buf_free(&out), buf_free(&sum), buf_free(&w), buf_free(&b);
}

static void test_layernorm_matches_float64(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NSHAPES; k++) {
            run_norm(DTYPES[d], 0, SHAPES[k], 1, 1, 0);
            run_norm(DTYPES[d], 0, SHAPES[k], 0, k % 2, 0);
        }
}

static void test_layernorm_rows_far_from_zero_keep_their_variance(void **state)
{
    (void)state;
    /* A one-pass E[x^2] - E[x]^2 loses everything at mean 100, std ~1. */
    run_norm(WEFT_DTYPE_F32, 0, (shape){3, 4097, 4097}, 0, 0, 100);
    run_norm(WEFT_DTYPE_F32, 0, (shape){2, 4095, 4096}, 1, 1, 30);
}

static void test_rmsnorm_matches_float64(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NSHAPES; k++) {
            run_norm(DTYPES[d], 1, SHAPES[k], 1, 1, 0);
            run_norm(DTYPES[d], 1, SHAPES[k], 0, k % 2, 0);
        }
}

/* ---- bias + GELU + residual + LayerNorm ---------------------------------- */

/* x against the float64 GELU chain; out against a float64 LayerNorm of the
 * x the call wrote (x is rounded to the dtype before it is normalized); out
 * without x_out bit for bit the same. */
static void run_gelu_layernorm(weft_dtype dt, weft_gelu_form form, shape s, int full)
{
    buf in = buf_new(dt, s.rows, s.cols, s.stride), res = buf_new(dt, s.rows, s.cols, s.stride);
    buf x = buf_new(dt, s.rows, s.cols, s.stride), out = buf_new(dt, s.rows, s.cols, s.stride);
    buf out2 = buf_new(dt, s.rows, s.cols, s.stride);
    buf gb = buf_new(dt, 1, s.cols, s.cols), w = buf_new(dt, 1, s.cols, s.cols);
    buf b = buf_new(dt, 1, s.cols, s.cols);
    cmp cx = {"gelu_ln x", dt, 0, 0}, cy = {"gelu_ln out", dt, 0, 0};
    const float eps = 1e-5f;
    double *row = malloc(s.cols * sizeof *row);

    assert_non_null(row);
    buf_random(&in, -4, 4);
    buf_random(&res, -2, 2);
    buf_random(&gb, -1, 1);
    buf_random(&w, -2, 2);
    buf_random(&b, -1, 1);
    buf_poison(&x);
    buf_poison(&out);
    buf_poison(&out2);
    const void *gbp = full ? gb.p : NULL, *rp = full ? res.p : NULL;
    const void *wp = full ? w.p : NULL, *bp = full ? b.p : NULL;
    assert_int_equal(weft_bias_gelu_residual_layernorm(NULL, dt, form, out.p, x.p, in.p, gbp, rp,
                                                       wp, bp, eps, s.rows, s.cols, s.stride),
                     WEFT_OK);
    assert_int_equal(weft_bias_gelu_residual_layernorm(NULL, dt, form, out2.p, NULL, in.p, gbp, rp,
                                                       wp, bp, eps, s.rows, s.cols, s.stride),
                     WEFT_OK);
    assert_fully_written(&x, cx.what);
    assert_fully_written(&out, cy.what);
    assert_int_equal(memcmp(out.p, out2.p, out.n * weft__dtype_size(dt)), 0);
    for (size_t r = 0; r < s.rows; r++) {
        double mean = 0, var = 0;
        for (size_t j = 0; j < s.cols; j++) {
            double h = buf_get(&in, r, j) + (full ? buf_get(&gb, 0, j) : 0);
            double g = ref_gelu(form, h), rr = full ? buf_get(&res, r, j) : 0;
            cmp_one(&cx, buf_get(&x, r, j), g + rr, dabs(g) * ref_gelu_cond(form, h) + dabs(rr), r,
                    j);
            row[j] = buf_get(&x, r, j);
            mean += row[j];
        }
        mean /= (double)s.cols;
        for (size_t j = 0; j < s.cols; j++)
            var += (row[j] - mean) * (row[j] - mean);
        double rstd = 1.0 / sqrt(var / (double)s.cols + eps);
        for (size_t j = 0; j < s.cols; j++) {
            double n = (row[j] - mean) * rstd, wj = full ? buf_get(&w, 0, j) : 1;
            double bj = full ? buf_get(&b, 0, j) : 0;
            cmp_one(&cy, buf_get(&out, r, j), n * wj + bj, (1 + dabs(n)) * dabs(wj) + dabs(bj), r,
                    j);
        }
    }
    cmp_done(&cx);
    cmp_done(&cy);
    free(row);
    buf_free(&in), buf_free(&res), buf_free(&x), buf_free(&out), buf_free(&out2);
    buf_free(&gb), buf_free(&w), buf_free(&b);
}

static void test_bias_gelu_residual_layernorm_matches_float64(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NSHAPES; k++)
            run_gelu_layernorm(DTYPES[d], (weft_gelu_form)(k % 2), SHAPES[k], k != 2);
}

/* ---- softmax ------------------------------------------------------------- */

/* Row r's unmasked columns, from the rule in ops.h, restated. */
static size_t ref_visible(size_t r, size_t cols, size_t causal_q)
{
    return causal_q ? r % causal_q + cols - causal_q + 1 : cols;
}

/* Runs softmax with opts and checks it against float64; dropped elements
 * must be 0 and kept ones the reference divided by 1 - p. Inputs are in
 * [-range, range]; a small range keeps fp16 probabilities above 0, so a 0
 * means dropped. Returns the
 * number kept among the unmasked elements in *kept (of *total). */
static void run_softmax(weft_dtype dt, shape s, const weft_softmax_opts *o, double range,
                        size_t *kept, size_t *total, buf *keep_out)
{
    buf in = buf_new(dt, s.rows, s.cols, s.stride), out = buf_new(dt, s.rows, s.cols, s.stride);
    cmp c = {"softmax", dt, 0, 0};
    double scale = o && o->scale != 0 ? o->scale : 1, p = o ? o->dropout_p : 0;
    size_t causal_q = o ? o->causal_q : 0;

    buf_random(&in, -range, range);
    buf_poison(&out);
    assert_int_equal(weft_softmax(NULL, dt, out.p, in.p, s.rows, s.cols, s.stride, o), WEFT_OK);
    assert_fully_written(&out, "softmax");
    *kept = *total = 0;
    for (size_t r = 0; r < s.rows; r++) {
        size_t n = ref_visible(r, s.cols, causal_q);
        double max = -INFINITY, sum = 0;
        for (size_t j = 0; j < n; j++)
            if (scale * buf_get(&in, r, j) > max)
                max = scale * buf_get(&in, r, j);
        for (size_t j = 0; j < n; j++)
            sum += exp(scale * buf_get(&in, r, j) - max);
        for (size_t j = 0; j < s.cols; j++) {
            double got = buf_get(&out, r, j);
            if (j >= n) {
                assert_true(got == 0.0);
                continue;
            }
            double ref = exp(scale * buf_get(&in, r, j) - max) / sum / (1 - p);
            (*total)++;
            if (p > 0 && got == 0.0)
                continue; /* dropped */
            (*kept)++;
            cmp_one(&c, got, ref, dabs(ref), r, j);
        }
    }
    cmp_done(&c);
    if (keep_out) {
        *keep_out = out;
    } else {
        buf_free(&out);
    }
    buf_free(&in);
}

static void test_softmax_matches_float64(void **state)
{
    (void)state;
    weft_softmax_opts scaled = {.scale = 0.125f};
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NSHAPES; k++) {
            size_t kept, total;
            run_softmax(DTYPES[d], SHAPES[k], NULL, 8, &kept, &total, NULL);
            assert_int_equal(kept, total);
            run_softmax(DTYPES[d], SHAPES[k], &scaled, 8, &kept, &total, NULL);
            weft_softmax_opts causal = {.scale = 0.5f, .causal_q = SHAPES[k].rows};
            if (causal.causal_q <= SHAPES[k].cols)
                run_softmax(DTYPES[d], SHAPES[k], &causal, 8, &kept, &total, NULL);
        }
}

static void test_softmax_causal_mask_hides_future_keys(void **state)
{
    (void)state;
    /* 2 heads of 3 queries against 7 keys: query i sees keys 0..i+4. */
    weft_softmax_opts o = {.causal_q = 3};
    size_t kept, total;
    run_softmax(WEFT_DTYPE_F32, (shape){6, 7, 9}, &o, 8, &kept, &total, NULL);
    assert_int_equal(total, 2 * (5 + 6 + 7));
}

static double sqrt_n(size_t n, double p)
{
    return sqrt((double)n * p * (1 - p));
}

static int bufs_equal(const buf *a, const buf *b)
{
    return memcmp(a->p, b->p, a->n * weft__dtype_size(a->dtype)) == 0;
}

static void test_softmax_dropout_is_replayable_and_keeps_1_minus_p(void **state)
{
    (void)state;
    const shape s = {32, 4097, 4100};
    for (int d = 0; d < 3; d++) {
        for (int pi = 0; pi < 2; pi++) {
            weft_softmax_opts o = {.dropout_p = pi ? 0.5f : 0.1f,
                                   .seed = rng_next(),
                                   .offset = rng_next() >> 1,
                                   .causal_q = pi ? 0 : 32};
            size_t kept, total;
            uint64_t saved = rng_state;
            buf first, again, other_seed, other_offset;

            run_softmax(DTYPES[d], s, &o, 1, &kept, &total, &first);
            double p = o.dropout_p, sd = sqrt_n(total, p);
            double expect = (1 - p) * (double)total;
            if (dabs((double)kept - expect) > 4 * sd)
                print_error("kept %zu of %zu, expected %.0f +- %.0f\n", kept, total, expect, sd);
            assert_true(dabs((double)kept - expect) <= 4 * sd);

            /* The same inputs (same random stream) and the same seed and
             * offset give the same bytes; another seed or offset does not. */
            rng_state = saved;
            run_softmax(DTYPES[d], s, &o, 1, &kept, &total, &again);
            assert_true(bufs_equal(&first, &again));
            rng_state = saved;
            o.seed ^= 1;
            run_softmax(DTYPES[d], s, &o, 1, &kept, &total, &other_seed);
            assert_false(bufs_equal(&first, &other_seed));
            rng_state = saved;
            o.seed ^= 1;
            o.offset += 1;
            run_softmax(DTYPES[d], s, &o, 1, &kept, &total, &other_offset);
            assert_false(bufs_equal(&first, &other_offset));

            /* Which elements survive is the documented Philox rule. */
            for (size_t r = 0; r < s.rows; r++)
                for (size_t j = 0; j < ref_visible(r, s.cols, o.causal_q); j++)
                    assert_int_equal(buf_get(&first, r, j) != 0.0,
                                     weft__dropout_keep(o.seed, o.offset - 1,
                                                        (uint64_t)r * s.cols + j, o.dropout_p));
            buf_free(&first), buf_free(&again), buf_free(&other_seed), buf_free(&other_offset);
        }
    }
}

/* ---- RoPE ------------------------------------------------------------------ */

typedef struct rope_case {
    size_t tokens, q_heads, k_heads, head_dim, q_pad, k_pad;
} rope_case;

/* Pair i's inverse frequency, Llama 3's scaling applied where sc says
 * (ops.h's definition, written out here for the reference). */
static double ref_inverse_frequency(double base, size_t i, size_t head_dim,
                                    const weft_rope_llama3 *sc)
{
    double f = pow(base, -2.0 * (double)i / (double)head_dim);
    if (!sc)
        return f;
    double w = 2 * M_PI / f;
    double short_w = sc->original_max_positions / sc->high_freq_factor;
    double long_w = sc->original_max_positions / sc->low_freq_factor;
    if (w < short_w)
        return f;
    if (w > long_w)
        return f / sc->factor;
    double s = (sc->original_max_positions / w - sc->low_freq_factor) /
               (sc->high_freq_factor - sc->low_freq_factor);
    return s * f + (1 - s) * f / sc->factor;
}

static void run_rope_scaled(weft_dtype dt, weft_rope_layout layout, rope_case rc, float base,
                            const weft_rope_llama3 *sc)
{
    size_t qw = rc.q_heads * rc.head_dim, kw = rc.k_heads * rc.head_dim, half = rc.head_dim / 2;
    buf q = buf_new(dt, rc.tokens, qw, qw + rc.q_pad),
        q0 = buf_new(dt, rc.tokens, qw, qw + rc.q_pad);
    buf k = buf_new(dt, rc.tokens, kw ? kw : 1, kw + rc.k_pad + 1);
    buf k0 = buf_new(dt, rc.tokens, kw ? kw : 1, kw + rc.k_pad + 1);
    int32_t *pos = malloc(rc.tokens * sizeof *pos);
    cmp c = {sc                                ? "rope_llama3"
             : layout == WEFT_ROPE_INTERLEAVED ? "rope_interleaved"
                                               : "rope_halves",
             dt, 0, 0};

    assert_non_null(pos);
    buf_random(&q0, -2, 2);
    buf_random(&k0, -2, 2);
    memcpy(q.p, q0.p, q.n * weft__dtype_size(dt));
    memcpy(k.p, k0.p, k.n * weft__dtype_size(dt));
    for (size_t t = 0; t < rc.tokens; t++)
        pos[t] = t == 0 ? 0 : (int32_t)(rng_next() % 200000) - 1000;
    if (sc)
        assert_int_equal(weft_rope_scaled(NULL, dt, layout, q.p, rc.q_heads, q.stride,
                                          kw ? k.p : NULL, rc.k_heads, k.stride, rc.tokens,
                                          rc.head_dim, pos, base, sc),
                         WEFT_OK);
    else
        assert_int_equal(weft_rope(NULL, dt, layout, q.p, rc.q_heads, q.stride, kw ? k.p : NULL,
                                   rc.k_heads, k.stride, rc.tokens, rc.head_dim, pos, base),
                         WEFT_OK);
    for (int which = 0; which < (kw ? 2 : 1); which++) {
        buf *x = which ? &k : &q, *x0 = which ? &k0 : &q0;
        size_t heads = which ? rc.k_heads : rc.q_heads;
        for (size_t t = 0; t < rc.tokens; t++)
            for (size_t h = 0; h < heads; h++)
                for (size_t i = 0; i < half; i++) {
                    size_t lo = h * rc.head_dim + (layout == WEFT_ROPE_INTERLEAVED ? 2 * i : i);
                    size_t hi = lo + (layout == WEFT_ROPE_INTERLEAVED ? 1 : half);
                    double ang = pos[t] * ref_inverse_frequency(base, i, rc.head_dim, sc);
                    double a = buf_get(x0, t, lo), b = buf_get(x0, t, hi);
                    double sn = sin(ang), cs = cos(ang);
                    cmp_one(&c, buf_get(x, t, lo), a * cs - b * sn, dabs(a) + dabs(b), t, lo);
                    cmp_one(&c, buf_get(x, t, hi), a * sn + b * cs, dabs(a) + dabs(b), t, hi);
                }
        /* The padding of each row is left as it was. */
        for (size_t i = 0; i < x->n; i++)
            if (!in_row(x, i))
                assert_true(isnan(weft__load(dt, x->p, i)));
    }
    if (!kw) /* Q alone: K untouched */
        assert_memory_equal(k.p, k0.p, k.n * weft__dtype_size(dt));
    cmp_done(&c);
    free(pos);
    buf_free(&q), buf_free(&q0), buf_free(&k), buf_free(&k0);
}

static void run_rope(weft_dtype dt, weft_rope_layout layout, rope_case rc)
{
    run_rope_scaled(dt, layout, rc, 10000.0f, NULL);
}

static void expect_einval(int rc, const char *op, const char *what);

/* Llama 3.1's scaling (factor 8, 1 and 4, 8192 positions, base 500000):
 * at head_dim 128 its pairs fall in all three bands (kept, slowed by the
 * factor, blended), which the reference checks before it is trusted. */
static void test_rope_llama3_scaling(void **state)
{
    (void)state;
    const weft_rope_llama3 sc = {8.0, 1.0, 4.0, 8192.0};
    int bands[3] = {0};
    for (size_t i = 0; i < 64; i++) {
        double f = pow(500000.0, -2.0 * (double)i / 128),
               g = ref_inverse_frequency(500000.0, i, 128, &sc);
        bands[g == f ? 0 : fabs(g - f / 8) < 1e-15 * f ? 1 : 2]++;
    }
    printf("  llama3 bands at head_dim 128: %d kept, %d slowed, %d blended\n", bands[0], bands[1],
           bands[2]);
    assert_true(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);
    static const rope_case cases[] = {
        {5, 3, 1, 128, 0, 3}, {3, 2, 2, 64, 2, 0}, {2, 1, 0, 16, 0, 0}};
    for (int d = 0; d < 3; d++)
        for (int layout = 0; layout < 2; layout++)
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
                run_rope_scaled(DTYPES[d], (weft_rope_layout)layout, cases[i], 500000.0f, &sc);
    /* the scaling's own checks */
    float x[16] = {0};
    int32_t pos[1] = {3};
    const weft_rope_llama3 bad[] = {{0.5, 1, 4, 8192}, {8, 0, 4, 8192},   {8, 4, 4, 8192},
                                    {8, 1, 4, 0},      {NAN, 1, 4, 8192}, {8, 1, INFINITY, 8192}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_einval(weft_rope_scaled(NULL, WEFT_DTYPE_F32, WEFT_ROPE_HALVES, x, 1, 16, NULL, 0, 0,
                                       1, 16, pos, 500000.0f, &bad[i]),
                      "weft_rope", "Llama 3 scaling");
}

static void test_rope_rotates_q_and_k_in_both_layouts(void **state)
{
    (void)state;
    static const rope_case cases[] = {
        {1, 1, 1, 2, 0, 0}, {5, 3, 1, 64, 0, 3}, {4, 4, 2, 128, 8, 0},
        {3, 2, 2, 6, 1, 2}, {7, 1, 0, 32, 2, 0}, {2, 32, 8, 128, 0, 0},
    };
    for (int d = 0; d < 3; d++)
        for (int layout = 0; layout < 2; layout++)
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
                run_rope(DTYPES[d], (weft_rope_layout)layout, cases[i]);
}

/* ---- SwiGLU and GeGLU --------------------------------------------------- */

static void run_glu(weft_dtype dt, weft_glu_kind kind, shape s)
{
    buf in = buf_new(dt, s.rows, 2 * s.cols, 2 * s.stride + 1);
    buf out = buf_new(dt, s.rows, s.cols, s.stride);
    static const char *const names[] = {"swiglu", "geglu", "geglu_tanh"};
    cmp c = {names[kind], dt, 0, 0};

    buf_random(&in, -6, 6);
    buf_poison(&out);
    assert_int_equal(weft_glu(NULL, dt, kind, out.p, in.p, s.rows, s.cols, in.stride, out.stride),
                     WEFT_OK);
    assert_fully_written(&out, c.what);
    for (size_t r = 0; r < s.rows; r++)
        for (size_t j = 0; j < s.cols; j++) {
            double a = buf_get(&in, r, j), b = buf_get(&in, r, s.cols + j);
            double act = kind == WEFT_GLU_SWIGLU  ? ref_silu(a)
                         : kind == WEFT_GLU_GEGLU ? ref_gelu(WEFT_GELU_ERF, a)
                                                  : ref_gelu(WEFT_GELU_TANH, a);
            double cond = kind == WEFT_GLU_GEGLU_TANH ? ref_gelu_cond(WEFT_GELU_TANH, a) : 1;
            cmp_one(&c, buf_get(&out, r, j), act * b, dabs(act * b) * cond, r, j);
        }
    cmp_done(&c);
    buf_free(&in), buf_free(&out);
}

static void test_glu_matches_float64(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int kind = 0; kind < 3; kind++)
            for (int k = 0; k < NSHAPES; k++)
                run_glu(DTYPES[d], (weft_glu_kind)kind, SHAPES[k]);
}

/* ---- NaN and Inf, as ops.h documents them ------------------------------ */

static void test_nan_and_inf_follow_the_documented_rules(void **state)
{
    (void)state;
    float x[4] = {-INFINITY, INFINITY, NAN, 1.0f}, y[4];

    assert_int_equal(
        weft_bias_gelu_residual(NULL, WEFT_DTYPE_F32, WEFT_GELU_TANH, y, x, NULL, NULL, 1, 4, 4),
        WEFT_OK);
    assert_true(y[0] == 0.0f && signbit(y[0]) && isinf(y[1]) && y[1] > 0 && isnan(y[2]));
    assert_int_equal(
        weft_bias_gelu_residual(NULL, WEFT_DTYPE_F32, WEFT_GELU_ERF, y, x, NULL, NULL, 1, 4, 4),
        WEFT_OK);
    assert_true(y[0] == 0.0f && signbit(y[0]) && isinf(y[1]) && y[1] > 0 && isnan(y[2]));

    /* LayerNorm: an Inf makes the whole row NaN; the next row is unharmed. */
    float ln[2][3] = {{1, INFINITY, 2}, {1, 2, 3}}, lo[2][3];
    assert_int_equal(
        weft_layernorm(NULL, WEFT_DTYPE_F32, lo, NULL, ln, NULL, NULL, NULL, 0, 2, 3, 3), WEFT_OK);
    for (int j = 0; j < 3; j++)
        assert_true(isnan(lo[0][j]) && !isnan(lo[1][j]));
    /* RMSNorm: Inf gives NaN at its place and 0 elsewhere. */
    assert_int_equal(weft_rmsnorm(NULL, WEFT_DTYPE_F32, lo, NULL, ln, NULL, NULL, 0, 1, 3, 3),
                     WEFT_OK);
    assert_true(lo[0][0] == 0.0f && isnan(lo[0][1]) && lo[0][2] == 0.0f);

    /* Softmax: NaN or +Inf makes the row NaN; -Inf gets 0; all -Inf is NaN;
     * masked NaN is never read. */
    float sm[4][3] = {{0, NAN, 1},
                      {0, INFINITY, 1},
                      {-INFINITY, 0, 0},
                      {-INFINITY, -INFINITY, -INFINITY}},
          so[4][3];
    assert_int_equal(weft_softmax(NULL, WEFT_DTYPE_F32, so, sm, 4, 3, 3, NULL), WEFT_OK);
    for (int j = 0; j < 3; j++)
        assert_true(isnan(so[0][j]) && isnan(so[1][j]) && isnan(so[3][j]));
    assert_true(so[2][0] == 0.0f && so[2][1] == 0.5f && so[2][2] == 0.5f);
    float masked[1][3] = {{1, 1, NAN}};
    weft_softmax_opts causal = {.causal_q = 2};
    assert_int_equal(weft_softmax(NULL, WEFT_DTYPE_F32, so, masked, 1, 3, 3, &causal), WEFT_OK);
    assert_true(so[0][0] == 0.5f && so[0][1] == 0.5f && so[0][2] == 0.0f);

    /* GLU: act(-Inf) = -0, so act(-Inf) * Inf is NaN; act(+Inf) * 2 = Inf. */
    float g[1][4] = {{-INFINITY, INFINITY, INFINITY, 2}}, go[2];
    assert_int_equal(weft_glu(NULL, WEFT_DTYPE_F32, WEFT_GLU_SWIGLU, go, g, 1, 2, 4, 2), WEFT_OK);
    assert_true(isnan(go[0]) && isinf(go[1]));
}

/* ---- bad arguments ------------------------------------------------------ */

/* rc must be WEFT_EINVAL with a message that starts with op and mentions
 * what (when given). */
static void expect_einval(int rc, const char *op, const char *what)
{
    const char *msg = weft_last_error();
    if (rc != WEFT_EINVAL || strncmp(msg, op, strlen(op)) != 0 ||
        (what && strstr(msg, what) == NULL))
        print_error("want WEFT_EINVAL from %s about '%s'; got %d, '%s'\n", op, what ? what : "", rc,
                    msg);
    assert_int_equal(rc, WEFT_EINVAL);
    assert_true(strncmp(msg, op, strlen(op)) == 0);
    if (what)
        assert_non_null(strstr(msg, what));
}

/* A stream with otherwise good arguments: refused by a library built without
 * CUDA; with CUDA it would launch (tests/ops/test_ops_gpu.c covers that). */
#ifdef WEFT_HAVE_CUDA
#define expect_no_kernels(call, op, what) ((void)sizeof(call), (void)(op), (void)(what))
#else
#define expect_no_kernels(call, op, what) expect_einval(call, op, what)
#endif

enum { BAD_N = 64 };

static void test_bad_arguments_are_refused_before_anything_runs(void **state)
{
    (void)state;
    static float in[BAD_N], in2[BAD_N], out[BAD_N], out2[BAD_N];
    const weft_dtype F = WEFT_DTYPE_F32, BAD = (weft_dtype)7;
    char *mis = (char *)in + 2; /* aligned for 16-bit types, not for fp32 */
    int dummy_stream;
    void *stream = &dummy_stream;
    const char *G = "weft_bias_gelu_residual", *L = "weft_layernorm", *R = "weft_rmsnorm",
               *S = "weft_softmax", *P = "weft_rope", *U = "weft_glu";

    for (int i = 0; i < BAD_N; i++)
        in[i] = in2[i] = 1.0f + (float)i;
    memset(out, 0xff, sizeof out);
    memset(out2, 0xff, sizeof out2);

    /* bias + GELU + residual */
    expect_einval(weft_bias_gelu_residual(NULL, F, WEFT_GELU_TANH, NULL, in, NULL, NULL, 2, 4, 4),
                  G, "out");
    expect_einval(weft_bias_gelu_residual(NULL, F, WEFT_GELU_TANH, out, NULL, NULL, NULL, 2, 4, 4),
                  G, "in");
    expect_einval(weft_bias_gelu_residual(NULL, F, WEFT_GELU_TANH, out, in, NULL, NULL, 0, 4, 4), G,
                  "rows");
    expect_einval(weft_bias_gelu_residual(NULL, F, WEFT_GELU_TANH, out, in, NULL, NULL, 2, 0, 4), G,
                  "zero");
    expect_einval(weft_bias_gelu_residual(NULL, F, WEFT_GELU_TANH, out, in, NULL, NULL, 2, 4, 3), G,
                  "stride");
    expect_einval(
        weft_bias_gelu_residual(NULL, F, WEFT_GELU_TANH, out, in, NULL, NULL, (size_t)-1, 4, 4), G,
        "too large");
    expect_einval(weft_bias_gelu_residual(NULL, BAD, WEFT_GELU_TANH, out, in, NULL, NULL, 2, 4, 4),
                  G, "dtype");
    expect_einval(weft_bias_gelu_residual(NULL, F, (weft_gelu_form)9, out, in, NULL, NULL, 2, 4, 4),
                  G, "form");
    expect_einval(weft_bias_gelu_residual(NULL, F, WEFT_GELU_TANH, out, in, mis, NULL, 2, 4, 4), G,
                  "bias");
    expect_einval(weft_bias_gelu_residual(NULL, F, WEFT_GELU_TANH, out, in, NULL, mis, 2, 4, 4), G,
                  "residual");
    expect_no_kernels(
        weft_bias_gelu_residual(stream, F, WEFT_GELU_TANH, out, in, NULL, NULL, 2, 4, 4), G,
        "built without CUDA");

    /* LayerNorm */
    expect_einval(weft_layernorm(NULL, F, NULL, NULL, in, NULL, NULL, NULL, 1e-5f, 2, 4, 4), L,
                  "out");
    expect_einval(weft_layernorm(NULL, F, out, NULL, NULL, NULL, NULL, NULL, 1e-5f, 2, 4, 4), L,
                  "in");
    expect_einval(weft_layernorm(NULL, F, out, NULL, in, NULL, NULL, NULL, 1e-5f, 0, 4, 4), L,
                  "rows");
    expect_einval(weft_layernorm(NULL, F, out, NULL, in, NULL, NULL, NULL, 1e-5f, 2, 0, 4), L,
                  "zero");
    expect_einval(weft_layernorm(NULL, F, out, NULL, in, NULL, NULL, NULL, 1e-5f, 2, 4, 2), L,
                  "stride");
    expect_einval(weft_layernorm(NULL, BAD, out, NULL, in, NULL, NULL, NULL, 1e-5f, 2, 4, 4), L,
                  "dtype");
    expect_einval(weft_layernorm(NULL, F, out, NULL, in, NULL, NULL, NULL, -1.0f, 2, 4, 4), L,
                  "eps");
    expect_einval(weft_layernorm(NULL, F, out, NULL, in, NULL, NULL, NULL, NAN, 2, 4, 4), L, "eps");
    expect_einval(weft_layernorm(NULL, F, out, (void *)mis, in, in2, NULL, NULL, 1e-5f, 2, 4, 4), L,
                  "sum_out");
    expect_einval(weft_layernorm(NULL, F, out, out2, in, mis, NULL, NULL, 1e-5f, 2, 4, 4), L,
                  "residual");
    expect_einval(weft_layernorm(NULL, F, out, NULL, in, NULL, mis, NULL, 1e-5f, 2, 4, 4), L,
                  "weight");
    expect_einval(weft_layernorm(NULL, F, out, NULL, in, NULL, NULL, mis, 1e-5f, 2, 4, 4), L,
                  "bias");
    expect_no_kernels(weft_layernorm(stream, F, out, NULL, in, NULL, NULL, NULL, 1e-5f, 2, 4, 4), L,
                      "built without CUDA");

    /* RMSNorm */
    expect_einval(weft_rmsnorm(NULL, F, NULL, NULL, in, NULL, NULL, 1e-5f, 2, 4, 4), R, "out");
    expect_einval(weft_rmsnorm(NULL, F, out, NULL, NULL, NULL, NULL, 1e-5f, 2, 4, 4), R, "in");
    expect_einval(weft_rmsnorm(NULL, F, out, NULL, in, NULL, NULL, 1e-5f, 0, 4, 4), R, "rows");
    expect_einval(weft_rmsnorm(NULL, F, out, NULL, in, NULL, NULL, 1e-5f, 2, 0, 4), R, "zero");
    expect_einval(weft_rmsnorm(NULL, F, out, NULL, in, NULL, NULL, 1e-5f, 2, 4, 3), R, "stride");
    expect_einval(weft_rmsnorm(NULL, BAD, out, NULL, in, NULL, NULL, 1e-5f, 2, 4, 4), R, "dtype");
    expect_einval(weft_rmsnorm(NULL, F, out, NULL, in, NULL, NULL, INFINITY, 2, 4, 4), R, "eps");
    expect_einval(weft_rmsnorm(NULL, F, out, NULL, in, NULL, mis, 1e-5f, 2, 4, 4), R, "weight");
    expect_no_kernels(weft_rmsnorm(stream, F, out, NULL, in, NULL, NULL, 1e-5f, 2, 4, 4), R,
                      "built without CUDA");

    /* bias + GELU + residual + LayerNorm */
    const char *GL = "weft_bias_gelu_residual_layernorm";
    const weft_gelu_form T = WEFT_GELU_TANH;
    expect_einval(weft_bias_gelu_residual_layernorm(NULL, F, T, NULL, NULL, in, NULL, NULL, NULL,
                                                    NULL, 1e-5f, 2, 4, 4),
                  GL, "out");
    expect_einval(weft_bias_gelu_residual_layernorm(NULL, F, T, out, NULL, NULL, NULL, NULL, NULL,
                                                    NULL, 1e-5f, 2, 4, 4),
                  GL, "in");
    expect_einval(weft_bias_gelu_residual_layernorm(NULL, F, (weft_gelu_form)4, out, NULL, in, NULL,
                                                    NULL, NULL, NULL, 1e-5f, 2, 4, 4),
                  GL, "form");
    expect_einval(weft_bias_gelu_residual_layernorm(NULL, F, T, out, (void *)mis, in, NULL, NULL,
                                                    NULL, NULL, 1e-5f, 2, 4, 4),
                  GL, "x_out");
    expect_einval(weft_bias_gelu_residual_layernorm(NULL, F, T, out, NULL, in, mis, NULL, NULL,
                                                    NULL, 1e-5f, 2, 4, 4),
                  GL, "gelu_bias");
    expect_einval(weft_bias_gelu_residual_layernorm(NULL, F, T, out, NULL, in, NULL, NULL, NULL,
                                                    NULL, 1e-5f, 2, 4, 1),
                  GL, "stride");
    expect_einval(weft_bias_gelu_residual_layernorm(NULL, F, T, out, NULL, in, NULL, NULL, NULL,
                                                    NULL, -1e-5f, 2, 4, 4),
                  GL, "eps");
    expect_no_kernels(weft_bias_gelu_residual_layernorm(stream, F, T, out, NULL, in, NULL, NULL,
                                                        NULL, NULL, 1e-5f, 2, 4, 4),
                      GL, "built without CUDA");

    /* softmax */
    weft_softmax_opts o_scale = {.scale = INFINITY}, o_p1 = {.dropout_p = 1.0f},
                      o_pneg = {.dropout_p = -0.1f}, o_pnan = {.dropout_p = NAN},
                      o_causal = {.causal_q = 5};
    expect_einval(weft_softmax(NULL, F, NULL, in, 2, 4, 4, NULL), S, "out");
    expect_einval(weft_softmax(NULL, F, out, NULL, 2, 4, 4, NULL), S, "in");
    expect_einval(weft_softmax(NULL, F, out, in, 0, 4, 4, NULL), S, "rows");
    expect_einval(weft_softmax(NULL, F, out, in, 2, 0, 4, NULL), S, "zero");
    expect_einval(weft_softmax(NULL, F, out, in, 2, 4, 3, NULL), S, "stride");
    expect_einval(weft_softmax(NULL, BAD, out, in, 2, 4, 4, NULL), S, "dtype");
    expect_einval(weft_softmax(NULL, F, out, in, 2, 4, 4, &o_scale), S, "scale");
    expect_einval(weft_softmax(NULL, F, out, in, 2, 4, 4, &o_p1), S, "dropout_p");
    expect_einval(weft_softmax(NULL, F, out, in, 2, 4, 4, &o_pneg), S, "dropout_p");
    expect_einval(weft_softmax(NULL, F, out, in, 2, 4, 4, &o_pnan), S, "dropout_p");
    expect_einval(weft_softmax(NULL, F, out, in, 2, 4, 4, &o_causal), S, "causal_q");
    expect_einval(weft_softmax(NULL, F, out, (void *)mis, 2, 4, 4, NULL), S, "aligned");
    expect_no_kernels(weft_softmax(stream, F, out, in, 2, 4, 4, NULL), S, "built without CUDA");

    /* RoPE: q is in2 (2 tokens, 2 heads of 4), k is out2 (1 head of 4). */
    const int32_t pos[2] = {0, 1};
    const weft_rope_layout I = WEFT_ROPE_INTERLEAVED;
    expect_einval(weft_rope(NULL, F, I, NULL, 2, 8, out2, 1, 4, 2, 4, pos, 1e4f), P, "q");
    expect_einval(weft_rope(NULL, F, I, in2, 0, 8, out2, 1, 4, 2, 4, pos, 1e4f), P, "q_heads");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 7, out2, 1, 4, 2, 4, pos, 1e4f), P, "stride");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 8, out2, 1, 3, 2, 4, pos, 1e4f), P, "stride");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 8, out2, 1, 4, 0, 4, pos, 1e4f), P, "rows");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 8, out2, 1, 4, 2, 3, pos, 1e4f), P, "head_dim");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 8, out2, 1, 4, 2, 0, pos, 1e4f), P, "head_dim");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 8, out2, 1, 4, 2, 4, NULL, 1e4f), P, "positions");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 8, out2, 1, 4, 2, 4, pos, 0.0f), P, "base");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 8, out2, 1, 4, 2, 4, pos, NAN), P, "base");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 8, NULL, 1, 4, 2, 4, pos, 1e4f), P, "k_heads");
    expect_einval(weft_rope(NULL, F, I, in2, 2, 8, out2, 0, 4, 2, 4, pos, 1e4f), P, "k_heads");
    expect_einval(weft_rope(NULL, F, I, (void *)mis, 2, 8, out2, 1, 4, 2, 4, pos, 1e4f), P,
                  "aligned");
    expect_einval(weft_rope(NULL, BAD, I, in2, 2, 8, out2, 1, 4, 2, 4, pos, 1e4f), P, "dtype");
    expect_einval(weft_rope(NULL, F, (weft_rope_layout)5, in2, 2, 8, out2, 1, 4, 2, 4, pos, 1e4f),
                  P, "layout");
    expect_einval(weft_rope(NULL, F, I, in2, (size_t)-1, 8, out2, 1, 4, 2, 4, pos, 1e4f), P,
                  "overflows");
    expect_no_kernels(weft_rope(stream, F, I, in2, 2, 8, out2, 1, 4, 2, 4, pos, 1e4f), P,
                      "built without CUDA");

    /* GLU */
    expect_einval(weft_glu(NULL, F, WEFT_GLU_SWIGLU, NULL, in, 2, 4, 8, 4), U, "out");
    expect_einval(weft_glu(NULL, F, WEFT_GLU_SWIGLU, out, NULL, 2, 4, 8, 4), U, "in");
    expect_einval(weft_glu(NULL, F, WEFT_GLU_SWIGLU, out, in, 0, 4, 8, 4), U, "rows");
    expect_einval(weft_glu(NULL, F, WEFT_GLU_SWIGLU, out, in, 2, 0, 8, 4), U, "zero");
    expect_einval(weft_glu(NULL, F, WEFT_GLU_SWIGLU, out, in, 2, 4, 7, 4), U, "stride");
    expect_einval(weft_glu(NULL, F, WEFT_GLU_SWIGLU, out, in, 2, 4, 8, 3), U, "stride");
    expect_einval(weft_glu(NULL, F, WEFT_GLU_SWIGLU, out, in, 2, (size_t)-1, 8, 4), U, "too many");
    expect_einval(weft_glu(NULL, BAD, WEFT_GLU_SWIGLU, out, in, 2, 4, 8, 4), U, "dtype");
    expect_einval(weft_glu(NULL, F, (weft_glu_kind)3, out, in, 2, 4, 8, 4), U, "kind");
    expect_no_kernels(weft_glu(stream, F, WEFT_GLU_SWIGLU, out, in, 2, 4, 8, 4), U,
                      "built without CUDA");

    /* Nothing was written by any refused call, and no input changed. */
    for (int i = 0; i < BAD_N; i++) {
        assert_true(in[i] == 1.0f + (float)i && in2[i] == 1.0f + (float)i);
        assert_true(isnan(out[i]) && isnan(out2[i]));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions_round_to_nearest_even),
        cmocka_unit_test(test_philox_matches_random123_known_answers),
        cmocka_unit_test(test_bias_gelu_residual_matches_float64),
        cmocka_unit_test(test_bias_gelu_residual_in_place),
        cmocka_unit_test(test_layernorm_matches_float64),
        cmocka_unit_test(test_layernorm_rows_far_from_zero_keep_their_variance),
        cmocka_unit_test(test_rmsnorm_matches_float64),
        cmocka_unit_test(test_bias_gelu_residual_layernorm_matches_float64),
        cmocka_unit_test(test_softmax_matches_float64),
        cmocka_unit_test(test_softmax_causal_mask_hides_future_keys),
        cmocka_unit_test(test_softmax_dropout_is_replayable_and_keeps_1_minus_p),
        cmocka_unit_test(test_rope_rotates_q_and_k_in_both_layouts),
        cmocka_unit_test(test_rope_llama3_scaling),
        cmocka_unit_test(test_glu_matches_float64),
        cmocka_unit_test(test_nan_and_inf_follow_the_documented_rules),
        cmocka_unit_test(test_bad_arguments_are_refused_before_anything_runs),
    };
    rng_state = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid() << 32;
    const char *env = getenv("WEFT_TEST_SEED"); /* to replay a failing run */
    if (env)
        rng_state = strtoull(env, NULL, 0);
    printf("ops_host: seed %llu (set WEFT_TEST_SEED to replay)\n", (unsigned long long)rng_state);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
