/*
 * test_conv.c - weft_conv2d's host reference (NULL stream) and
 * weft_conv2d_fold_bn against the float64 loops of conv_ref.h, on fresh
 * random data each run (the seed is printed): every case of CV_CASES (1x1,
 * strided, dilated, depthwise, grouped, odd sizes, n 1 and 3, channels not
 * multiples of 8) in every dtype with and without ReLU; the BatchNorm fold
 * against the convolution followed by an explicit BatchNorm in float64,
 * its documented fp32 formula bit for bit, in place, and its NaN for a
 * variance below -eps; and every bad argument refused with its reason
 * before anything is written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <time.h>

#include "ops/conv_ref.h"
#include "weft.h"
#include "weft/ops.h"

static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
#define NCASES (sizeof CV_CASES / sizeof CV_CASES[0])

static void test_every_case_type_and_activation_matches_float64(void **state)
{
    (void)state;
    char name[160];
    for (size_t ci = 0; ci < NCASES; ci++)
        for (int t = 0; t < 3; t++)
            for (int act = 0; act <= WEFT_CONV_ACT_RELU; act++) {
                weft_conv2d_desc d = cv_desc(&CV_CASES[ci], TYPES[t], (weft_conv_act)act);
                cv_geom g = cv_geometry(&d);
                size_t oh = 0, ow = 0;
                assert_int_equal(weft_conv2d_output_size(&d, &oh, &ow), WEFT_OK);
                assert_int_equal(oh, g.oh);
                assert_int_equal(ow, g.ow);
                void *in = cv_random(d.dtype, g.nin, -1, 1), *w = cv_random(d.dtype, g.nw, -1, 1);
                void *bias = cv_random(d.dtype, d.k, -1, 1), *out = cv_poisoned(d.dtype, g.nout);
                snprintf(name, sizeof name, "%s %s act %d", CV_CASES[ci].name,
                         cv_type_name(d.dtype), act);
                int rc = weft_conv2d(NULL, &d, out, in, w, bias);
                if (rc != WEFT_OK)
                    fail_msg("%s: weft_conv2d returned %d: %s", name, rc, weft_last_error());
                size_t bad = cv_check(name, &d, in, w, bias, NULL, out, 0);
                if (bad)
                    fail_msg("%s: %zu elements out of bounds", name, bad);
                free(in), free(w), free(bias), free(out);
            }
}

/* The BatchNorm's tensors, k each, of bn_dtype: gamma of either sign. */
typedef struct bn_set {
    void *gamma, *beta, *mean, *var, *conv_bias;
} bn_set;

static bn_set bn_random(weft_dtype bn_dtype, weft_dtype dtype, size_t k, int with_conv_bias)
{
    bn_set b;
    b.gamma = cv_random(bn_dtype, k, 0.25, 1.5);
    for (size_t o = 0; o < k; o++)
        if (cv_rng() & 1)
            weft__store(bn_dtype, b.gamma, o, -weft__load(bn_dtype, b.gamma, o));
    b.beta = cv_random(bn_dtype, k, -1, 1);
    b.mean = cv_random(bn_dtype, k, -0.5, 0.5);
    b.var = cv_random(bn_dtype, k, 0.05, 3);
    b.conv_bias = with_conv_bias ? cv_random(dtype, k, -1, 1) : NULL;
    return b;
}

static void bn_free(bn_set *b)
{
    free(b->gamma), free(b->beta), free(b->mean), free(b->var), free(b->conv_bias);
}

static void test_the_folded_conv_matches_conv_then_batchnorm_in_float64(void **state)
{
    (void)state;
    static const size_t PICK[] = {0, 2, 4, 5, 7};
    const float eps = 1e-5f;
    char name[160];
    for (size_t pi = 0; pi < sizeof PICK / sizeof PICK[0]; pi++)
        for (int t = 0; t < 3; t++)
            for (int v = 0; v < 4; v++) { /* bn in fp32 or the dtype; conv bias or not */
                const cv_case *cc = &CV_CASES[PICK[pi]];
                weft_conv_act act = (weft_conv_act)(cv_rng() & 1);
                weft_conv2d_desc d = cv_desc(cc, TYPES[t], act);
                weft_dtype bt = v & 1 ? d.dtype : WEFT_DTYPE_F32;
                cv_geom g = cv_geometry(&d);
                void *in = cv_random(d.dtype, g.nin, -1, 1), *w = cv_random(d.dtype, g.nw, -1, 1);
                bn_set b = bn_random(bt, d.dtype, d.k, v >> 1);
                void *wf = cv_poisoned(d.dtype, g.nw), *bf = cv_poisoned(d.dtype, d.k);
                void *out = cv_poisoned(d.dtype, g.nout);
                snprintf(name, sizeof name, "%s %s bn %s conv bias %d act %d", cc->name,
                         cv_type_name(d.dtype), cv_type_name(bt), v >> 1, (int)act);
                assert_int_equal(weft_conv2d_fold_bn(NULL, &d, bt, wf, bf, w, b.conv_bias, b.gamma,
                                                     b.beta, b.mean, b.var, eps),
                                 WEFT_OK);
                assert_int_equal(weft_conv2d(NULL, &d, out, in, wf, bf), WEFT_OK);
                cv_bn bn = {bt, b.conv_bias, b.gamma, b.beta, b.mean, b.var, eps};
                /* The folded weights and bias are rounded to the dtype once,
                 * after an fp32 scale of a few roundings. */
                double extra = cv_half_ulp(d.dtype) + 8 * 0x1p-24;
                size_t bad = cv_check(name, &d, in, w, NULL, &bn, out, extra);
                if (bad)
                    fail_msg("%s: %zu elements out of bounds", name, bad);
                free(in), free(w), free(wf), free(bf), free(out);
                bn_free(&b);
            }
}

/* The fold is the formula ops.h states, each step rounded to fp32, bit
 * for bit; in place it gives the same. */
static void test_the_fold_is_its_fp32_formula_bit_for_bit_and_in_place(void **state)
{
    (void)state;
    for (int t = 0; t < 3; t++)
        for (int bi = 0; bi < 3; bi++) {
            weft_conv2d_desc d = cv_desc(&CV_CASES[7], TYPES[t], WEFT_CONV_ACT_NONE);
            weft_dtype bt = TYPES[bi];
            cv_geom g = cv_geometry(&d);
            size_t es = weft__dtype_size(d.dtype), per_k = g.nw / d.k;
            const float eps = 1e-3f;
            void *w = cv_random(d.dtype, g.nw, -2, 2);
            bn_set b = bn_random(bt, d.dtype, d.k, 1);
            void *wf = cv_poisoned(d.dtype, g.nw), *bf = cv_poisoned(d.dtype, d.k);
            assert_int_equal(weft_conv2d_fold_bn(NULL, &d, bt, wf, bf, w, b.conv_bias, b.gamma,
                                                 b.beta, b.mean, b.var, eps),
                             WEFT_OK);
            for (size_t o = 0; o < d.k; o++) {
                float sc = weft__load(bt, b.gamma, o) / sqrtf(weft__load(bt, b.var, o) + eps);
                for (size_t e = 0; e < per_k; e++) {
                    size_t i = o * per_k + e;
                    float want = weft__round_to(d.dtype, weft__load(d.dtype, w, i) * sc);
                    assert_true(weft__load(d.dtype, wf, i) == want);
                }
                float sh = (weft__load(d.dtype, b.conv_bias, o) - weft__load(bt, b.mean, o)) * sc;
                float want = weft__round_to(d.dtype, weft__load(bt, b.beta, o) + sh);
                assert_true(weft__load(d.dtype, bf, o) == want);
            }
            /* In place: w_out = w, bias_out = conv_bias. */
            assert_int_equal(weft_conv2d_fold_bn(NULL, &d, bt, w, b.conv_bias, w, b.conv_bias,
                                                 b.gamma, b.beta, b.mean, b.var, eps),
                             WEFT_OK);
            assert_memory_equal(w, wf, g.nw * es);
            assert_memory_equal(b.conv_bias, bf, d.k * es);
            free(w), free(wf), free(bf);
            bn_free(&b);
        }
}

/* A variance below -eps (or NaN) makes its channel's weights and bias NaN,
 * and only its channel's. */
static void test_a_negative_variance_gives_its_channel_nan(void **state)
{
    (void)state;
    weft_conv2d_desc d = {.n = 1, .h = 3, .w = 3, .c = 4, .k = 3, .r = 1, .s = 1};
    float w[12], wf[12], bf[3];
    float gamma[3] = {1, 1, 1}, beta[3] = {0, 0, 0}, mean[3] = {0, 0, 0};
    float var[3] = {1.0f, -0.5f, -1e-3f}; /* var + eps: 1.001, < 0, exactly 0 */
    for (int i = 0; i < 12; i++)
        w[i] = (float)(i + 1);
    assert_int_equal(weft_conv2d_fold_bn(NULL, &d, WEFT_DTYPE_F32, wf, bf, w, NULL, gamma, beta,
                                         mean, var, 1e-3f),
                     WEFT_OK);
    for (int i = 0; i < 12; i++)
        assert_true(i < 4 ? isfinite(wf[i]) : isnan(wf[i]));
    assert_true(isfinite(bf[0]) && isnan(bf[1]) && isnan(bf[2]));
}

/* ReLU keeps a NaN a NaN and clamps -Inf to zero. */
static void test_relu_keeps_nan_and_clamps_negatives(void **state)
{
    (void)state;
    weft_conv2d_desc d = {
        .n = 1, .h = 1, .w = 3, .c = 1, .k = 1, .r = 1, .s = 1, .act = WEFT_CONV_ACT_RELU};
    float in[3] = {NAN, -INFINITY, 2.0f}, w[1] = {1.0f}, bias[1] = {0.5f}, out[3];
    assert_int_equal(weft_conv2d(NULL, &d, out, in, w, bias), WEFT_OK);
    assert_true(isnan(out[0]));
    assert_true(out[1] == 0.0f);
    assert_true(out[2] == 2.5f);
}

/* ---- bad arguments ----------------------------------------------------- */

static float IN[256], W[256], B[16], OUT[256], G[16], V[16];

/* The call must fail with WEFT_EINVAL naming why, and leave OUT alone. */
static void refused(int rc, const char *why)
{
    if (rc != WEFT_EINVAL)
        fail_msg("%s: returned %d, not WEFT_EINVAL", why, rc);
    if (!strstr(weft_last_error(), why))
        fail_msg("the message \"%s\" does not say \"%s\"", weft_last_error(), why);
    for (size_t i = 0; i < sizeof OUT; i++)
        assert_int_equal(((unsigned char *)OUT)[i], 0x5a);
}

static int conv(const weft_conv2d_desc *d)
{
    return weft_conv2d(NULL, d, OUT, IN, W, B);
}

static void test_bad_arguments_are_refused_with_the_reason(void **state)
{
    (void)state;
    /* 1 x 4 x 4 x 4 -> 4, 3x3 pad 1: 64 outputs. */
    const weft_conv2d_desc ok = {
        .n = 1, .h = 4, .w = 4, .c = 4, .k = 4, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1};
    weft_conv2d_desc x;
    size_t oh, ow;
    memset(OUT, 0x5a, sizeof OUT);

    refused(weft_conv2d(NULL, NULL, OUT, IN, W, B), "desc is NULL");
    x = ok, x.n = 0;
    refused(conv(&x), "must be >= 1");
    x = ok, x.c = 0;
    refused(conv(&x), "must be >= 1");
    x = ok, x.k = 0;
    refused(conv(&x), "must be >= 1");
    x = ok, x.r = 0;
    refused(conv(&x), "must be >= 1");
    x = ok, x.pad_h = 0, x.r = 5;
    refused(conv(&x), "the output size is <= 0");
    x = ok, x.pad_w = 0, x.dilation_w = 3;
    refused(conv(&x), "the output size is <= 0");
    refused(weft_conv2d_output_size(&x, &oh, &ow), "the output size is <= 0");
    x = ok, x.groups = 3;
    refused(conv(&x), "groups (3) must divide c (4) and k (4)");
    x = ok, x.groups = 2, x.k = 5;
    refused(conv(&x), "groups (2) must divide c (4) and k (5)");
    x = ok, x.dtype = (weft_dtype)7;
    refused(conv(&x), "unsupported dtype 7");
    x = ok, x.act = (weft_conv_act)2;
    refused(conv(&x), "unknown activation 2");
    x = ok, x.dtype = WEFT_DTYPE_BF16, x.allow_tf32 = 1;
    refused(conv(&x), "allow_tf32 is for fp32");
    x = ok, x.reserved[2] = 1;
    refused(conv(&x), "reserved[2] is not zero");
    x = ok, x.n = SIZE_MAX / 4;
    refused(conv(&x), "too large");
    x = ok, x.n = (size_t)1 << 40, x.h = (size_t)1 << 20;
    refused(conv(&x), "overflow");
    refused(weft_conv2d(NULL, &ok, NULL, IN, W, B), "out is NULL");
    refused(weft_conv2d(NULL, &ok, OUT, NULL, W, B), "in is NULL");
    refused(weft_conv2d(NULL, &ok, OUT, IN, NULL, B), "w is NULL");
    refused(weft_conv2d(NULL, &ok, OUT, IN, W, NULL), "bias is NULL");
    refused(weft_conv2d(NULL, &ok, OUT, (const char *)IN + 2, W, B), "in is not aligned");
    refused(weft_conv2d(NULL, &ok, OUT, IN, (const char *)W + 1, B), "w is not aligned");
    x = ok, x.dtype = WEFT_DTYPE_BF16;
    refused(weft_conv2d(NULL, &x, (char *)OUT + 1, IN, W, B), "out is not aligned");
    refused(weft_conv2d(NULL, &ok, OUT, OUT + 8, W, B), "out overlaps in, w or bias");
    refused(weft_conv2d(NULL, &ok, OUT, IN, W, OUT + 63), "out overlaps in, w or bias");
    refused(weft_conv2d_output_size(&ok, NULL, &ow), "oh or ow is NULL");

    /* The fold. */
    float *WF = OUT; /* refused calls must leave it alone too */
    refused(weft_conv2d_fold_bn(NULL, &ok, WEFT_DTYPE_F32, WF, B, W, NULL, G, G, G, V, 0.0f),
            "eps must be > 0 and finite");
    refused(weft_conv2d_fold_bn(NULL, &ok, WEFT_DTYPE_F32, WF, B, W, NULL, G, G, G, V, -1e-5f),
            "eps must be > 0 and finite");
    refused(weft_conv2d_fold_bn(NULL, &ok, WEFT_DTYPE_F32, WF, B, W, NULL, G, G, G, V, NAN),
            "eps must be > 0 and finite");
    refused(weft_conv2d_fold_bn(NULL, &ok, WEFT_DTYPE_F32, WF, B, W, NULL, G, G, G, V, INFINITY),
            "eps must be > 0 and finite");
    refused(weft_conv2d_fold_bn(NULL, &ok, (weft_dtype)7, WF, B, W, NULL, G, G, G, V, 1e-5f),
            "unsupported dtype 7");
    refused(weft_conv2d_fold_bn(NULL, &ok, WEFT_DTYPE_F32, WF, B, W, NULL, NULL, G, G, V, 1e-5f),
            "gamma is NULL");
    refused(weft_conv2d_fold_bn(NULL, &ok, WEFT_DTYPE_F32, WF, B, W, NULL, G, G, G, NULL, 1e-5f),
            "var is NULL");
    refused(weft_conv2d_fold_bn(NULL, &ok, WEFT_DTYPE_F32, WF, NULL, W, NULL, G, G, G, V, 1e-5f),
            "bias_out is NULL");
    refused(weft_conv2d_fold_bn(NULL, &ok, WEFT_DTYPE_BF16, WF, B, W, NULL, G, G,
                                (const char *)G + 1, V, 1e-5f),
            "mean is not aligned");
    refused(weft_conv2d_fold_bn(NULL, &ok, WEFT_DTYPE_F32, WF, B, W, (const char *)B + 2, G, G, G,
                                V, 1e-5f),
            "conv_bias is not aligned");
    x = ok, x.groups = 3;
    refused(weft_conv2d_fold_bn(NULL, &x, WEFT_DTYPE_F32, WF, B, W, NULL, G, G, G, V, 1e-5f),
            "weft_conv2d_fold_bn: groups (3) must divide");
}

static void test_a_valid_call_is_not_refused(void **state)
{
    (void)state;
    /* A 1x1 identity filter with a zero bias copies the input. */
    const weft_conv2d_desc d = {.n = 2, .h = 3, .w = 5, .c = 4, .k = 4, .r = 1, .s = 1};
    for (int i = 0; i < 120; i++)
        IN[i] = (float)i - 60.0f;
    memset(W, 0, sizeof W);
    memset(B, 0, sizeof B);
    for (int o = 0; o < 4; o++)
        W[o * 4 + o] = 1.0f;
    assert_int_equal(weft_conv2d(NULL, &d, OUT, IN, W, B), WEFT_OK);
    assert_memory_equal(OUT, IN, 120 * sizeof *OUT);
}

int main(void)
{
    cv_rng_state = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("test_conv: seed %llu\n", (unsigned long long)cv_rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments_are_refused_with_the_reason),
        cmocka_unit_test(test_a_valid_call_is_not_refused),
        cmocka_unit_test(test_every_case_type_and_activation_matches_float64),
        cmocka_unit_test(test_the_folded_conv_matches_conv_then_batchnorm_in_float64),
        cmocka_unit_test(test_the_fold_is_its_fp32_formula_bit_for_bit_and_in_place),
        cmocka_unit_test(test_a_negative_variance_gives_its_channel_nan),
        cmocka_unit_test(test_relu_keeps_nan_and_clamps_negatives),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
