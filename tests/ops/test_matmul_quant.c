/*
 * test_matmul_quant.c - weft_matmul's FP8 and INT8 products on the host
 * reference (NULL stream) against the float64 loop of matmul_quant_ref.h,
 * on fresh random data each run (the seed is printed): every FP8 pair and
 * D type, both scale modes, every activation with bias and residual, fp8
 * D with scale_d, saturation and amax_d; INT8 exact into int32 and
 * dequantized by every scale-mode pair with the epilogues and aux; awkward
 * shapes, padded leading dimensions and batches with a shared B. Then the
 * FP8 codec itself (every pattern, ties, saturation), every bad argument
 * refused with its reason before anything is written, and the other ops
 * refusing the quantized dtypes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <time.h>

#include "weft.h"
#include "weft/ops.h"
#include "ops/matmul_quant_ref.h"

#ifdef WEFT_HAVE_HOST_BLAS /* the cases that need the host reference to run */

static const weft_dtype F8[] = {WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2};
static const char *const NAME[] = {"f32", "bf16", "f16", "e4m3", "e5m2", "i8", "i32"};

static size_t round_up(size_t x, size_t q)
{
    return (x + q - 1) / q * q;
}

/* A TN descriptor for m x n x k, with lda/ldb padded to q plus pad. */
static weft_matmul_desc tn(size_t m, size_t n, size_t k, size_t q, size_t pad)
{
    weft_matmul_desc d = {.m = m, .n = n, .k = k, .trans_b = 1};
    d.lda = round_up(k, q) + pad, d.ldb = round_up(k, q) + pad;
    return d;
}

/* Runs q's call on the host into poisoned D (and aux) and checks it. */
static void run_case(const char *name, qm_case *q, int with_aux, int with_amax)
{
    size_t es = weft__dtype_size(q->desc.type);
    void *d = mm_poisoned(q->desc.type, q->nd);
    void *aux = with_aux ? mm_poisoned(q->desc.type, q->naux) : NULL;
    float amax = -1.0f;
    weft_matmul_desc desc = q->desc;
    desc.aux = aux;
    desc.amax_d = with_amax ? &amax : NULL;
    (void)es;
    int rc = weft_matmul(NULL, &desc, d, q->a, q->b, q->c);
    if (rc != WEFT_OK)
        fail_msg("%s: weft_matmul returned %d: %s", name, rc, weft_last_error());
    size_t bad = qm_check(name, q, d, aux, with_amax ? &amax : NULL, 0.0, 0.0);
    if (bad)
        fail_msg("%s: %zu elements out of bounds (%zu x %zu x %zu, batch %zu)", name, bad,
                 q->desc.m, q->desc.n, q->desc.k, q->g.batch);
    free(d), free(aux);
}

static void test_fp8_every_pair_output_scale_mode_and_epilogue_matches_float64(void **state)
{
    (void)state;
    static const weft_dtype OUT[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16,
                                     WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2};
    char name[160];
    for (int pa = 0; pa < 2; pa++)
        for (int pb = 0; pb < 2; pb++) {
            if (pa && pb)
                continue; /* E5M2 x E5M2: refused, tested below */
            for (int o = 0; o < 5; o++) {
                if (OUT[o] == WEFT_DTYPE_F8_E5M2 && !pa && !pb)
                    continue;
                int d8 = qm_is_f8(OUT[o]);
                for (int mode = 1; mode <= 2; mode++) {
                    if (d8 && mode == WEFT_MATMUL_SCALE_OUTER)
                        continue;
                    for (int act = 0; act <= WEFT_MATMUL_ACT_GELU_ERF; act++)
                        for (int extra = 0; extra < 4; extra++) {
                            if (d8 && act == WEFT_MATMUL_ACT_GELU_ERF)
                                continue;
                            weft_matmul_desc desc = tn(7, 16, 48, 16, 0);
                            desc.type = OUT[o], desc.in_type = F8[pa], desc.in_type_b = F8[pb];
                            desc.scale_a_mode = desc.scale_b_mode = (weft_matmul_scale)mode;
                            desc.act = (weft_matmul_act)act;
                            desc.alpha = extra == 3 ? -0.5f : 0.0f;
                            if (extra >> 1)
                                desc.beta = 0.75f;
                            if (d8 && (extra & 1))
                                desc.c_type = WEFT_DTYPE_F16;
                            if (d8)
                                desc.ldd = 16;
                            qm_case q;
                            qm_make(&q, desc, extra >> 1, extra & 1, 200.0);
                            snprintf(name, sizeof name,
                                     "%s x %s -> %s scales %d act %d bias %d residual %d",
                                     NAME[F8[pa]], NAME[F8[pb]], NAME[OUT[o]], mode, act, extra & 1,
                                     extra >> 1);
                            run_case(name, &q, 0, d8);
                            qm_free(&q);
                        }
                }
            }
        }
}

static void test_fp8_awkward_shapes_padding_and_batches(void **state)
{
    (void)state;
    /* m is free; k a multiple of 16, n of 8 (16-byte rows of a bf16 D) */
    static const size_t SHAPES[][3] = {{1, 8, 16},    {1, 16, 32},   {17, 8, 16},
                                       {33, 24, 128}, {128, 40, 16}, {300, 264, 608}};
    char name[160];
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
        for (int mode = 1; mode <= 2; mode++)
            for (int shared = 0; shared < 2; shared++) {
                size_t m = SHAPES[s][0], n = SHAPES[s][1], k = SHAPES[s][2];
                weft_matmul_desc desc = tn(m, n, k, 16, 16 * (s & 1));
                desc.type = mode == 1 ? WEFT_DTYPE_BF16 : WEFT_DTYPE_F32;
                desc.in_type = WEFT_DTYPE_F8_E4M3;
                desc.in_type_b = s & 1 ? WEFT_DTYPE_F8_E5M2 : 0;
                desc.scale_a_mode = desc.scale_b_mode = (weft_matmul_scale)mode;
                desc.act = WEFT_MATMUL_ACT_GELU_TANH;
                desc.batch = 3;
                desc.ldd = n + 8, desc.ldc = n + 16;
                desc.stride_a = round_up(m * desc.lda, 16) + 16;
                desc.stride_b = shared ? 0 : n * desc.ldb;
                desc.stride_c = m * desc.ldc + 8, desc.stride_d = m * desc.ldd + 8;
                qm_case q;
                qm_make(&q, desc, 1, 1, 0);
                snprintf(name, sizeof name, "fp8 %zu x %zu x %zu scales %d B %s", m, n, k, mode,
                         shared ? "shared" : "strided");
                run_case(name, &q, 0, 0);
                qm_free(&q);
            }
}

static void test_fp8_d_saturates_and_amax_is_taken_before_the_scale(void **state)
{
    (void)state;
    char name[160];
    for (int o = 0; o < 2; o++)
        for (int batch = 1; batch <= 2; batch++) {
            weft_matmul_desc desc = tn(19, 32, 48, 16, 0);
            desc.type = F8[o], desc.in_type = WEFT_DTYPE_F8_E4M3;
            desc.in_type_b = F8[o]; /* an E5M2 D needs an E5M2 operand */
            desc.scale_a_mode = desc.scale_b_mode = WEFT_MATMUL_SCALE_TENSOR;
            desc.act = WEFT_MATMUL_ACT_RELU;
            desc.batch = (size_t)batch, desc.ldd = 32, desc.stride_d = 19 * 32 + 16;
            desc.stride_a = 19 * 48;
            qm_case q;
            /* the largest |y| at 4x the type's maximum: a quarter saturate */
            qm_make(&q, desc, 1, 1, 4 * qm_max_finite(F8[o]));
            snprintf(name, sizeof name, "%s D saturating, batch %d", NAME[F8[o]], batch);
            run_case(name, &q, 0, 1);
            qm_free(&q);
        }
}

static void test_int8_exact_into_int32(void **state)
{
    (void)state;
    static const size_t SHAPES[][3] = {{1, 4, 4},     {1, 20, 36},   {17, 4, 4},
                                       {33, 16, 128}, {128, 36, 20}, {260, 300, 1028}};
    char name[160];
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
        for (int shared = 0; shared < 2; shared++) {
            size_t m = SHAPES[s][0], n = SHAPES[s][1], k = SHAPES[s][2];
            weft_matmul_desc desc = tn(m, n, k, 4, 4 * (s & 1));
            desc.type = WEFT_DTYPE_I32, desc.in_type = WEFT_DTYPE_I8;
            desc.batch = 2, desc.ldd = round_up(n, 4) + 4 * (s & 1);
            desc.stride_a = m * desc.lda + 4, desc.stride_b = shared ? 0 : n * desc.ldb;
            desc.stride_d = m * desc.ldd + 8;
            qm_case q;
            qm_make(&q, desc, 0, 0, 0);
            snprintf(name, sizeof name, "int8 -> int32 %zu x %zu x %zu B %s", m, n, k,
                     shared ? "shared" : "strided");
            run_case(name, &q, 0, 0);
            qm_free(&q);
        }
}

static void test_int8_extremes_sum_exactly(void **state)
{
    (void)state;
    /* k = 131068 terms of (-128)(-128): 2^31 - 2^16, past fp32's and any
     * float accumulator's exact range, within int32's. */
    weft_matmul_desc desc = tn(2, 4, 131068, 4, 0);
    desc.type = WEFT_DTYPE_I32, desc.in_type = WEFT_DTYPE_I8, desc.ldd = 4;
    qm_case q;
    qm_make(&q, desc, 0, 0, 0);
    memset(q.a, 0x80, q.na);
    memset(q.b, 0x80, q.nb);
    ((int8_t *)q.b)[5] = 127; /* one term of another sign in row 0 of B */
    run_case("int8 extremes", &q, 0, 0);
    qm_free(&q);
}

static void test_int8_dequantized_every_scale_mode_and_epilogue(void **state)
{
    (void)state;
    static const weft_dtype OUT[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
    char name[160];
    for (int o = 0; o < 3; o++)
        for (int ma = 1; ma <= 2; ma++)
            for (int mb = 1; mb <= 2; mb++)
                for (int act = 0; act <= WEFT_MATMUL_ACT_GELU_ERF; act++)
                    for (int extra = 0; extra < 4; extra++) {
                        weft_matmul_desc desc = tn(9, 20, 36, 4, 4);
                        desc.type = OUT[o], desc.in_type = WEFT_DTYPE_I8;
                        desc.scale_a_mode = (weft_matmul_scale)ma;
                        desc.scale_b_mode = (weft_matmul_scale)mb;
                        desc.act = (weft_matmul_act)act;
                        desc.alpha = extra == 1 ? 0.25f : 0.0f;
                        if (extra >> 1)
                            desc.beta = -1.5f;
                        int with_aux = act >= WEFT_MATMUL_ACT_GELU_TANH && extra == 3;
                        if (with_aux)
                            desc.ldaux = 24;
                        qm_case q;
                        /* scales near 2^-9 keep the dequantized values near 1 */
                        qm_make(&q, desc, extra >> 1, extra & 1, 0);
                        size_t ns = ma == 2 ? desc.m : 1;
                        for (size_t i = 0; i < ns; i++)
                            q.sa[i] *= 0x1p-9f;
                        snprintf(name, sizeof name,
                                 "int8 -> %s scales %d/%d act %d bias %d residual %d aux %d",
                                 NAME[OUT[o]], ma, mb, act, extra & 1, extra >> 1, with_aux);
                        run_case(name, &q, with_aux, 0);
                        qm_free(&q);
                    }
}

static void test_int8_dequantized_batches_and_in_place_residual(void **state)
{
    (void)state;
    weft_matmul_desc desc = tn(33, 20, 132, 4, 0);
    desc.type = WEFT_DTYPE_BF16, desc.in_type = WEFT_DTYPE_I8;
    desc.scale_a_mode = WEFT_MATMUL_SCALE_OUTER, desc.scale_b_mode = WEFT_MATMUL_SCALE_OUTER;
    desc.batch = 3, desc.stride_a = 33 * 132, desc.stride_b = 0;
    desc.ldd = desc.ldc = 24, desc.stride_d = desc.stride_c = 33 * 24;
    desc.act = WEFT_MATMUL_ACT_GELU_ERF;
    qm_case q;
    qm_make(&q, desc, 1, 1, 0);
    /* in place: D is C, checked against C as it was */
    void *d = malloc(q.nc * 2);
    memcpy(d, q.c, q.nc * 2);
    assert_int_equal(weft_matmul(NULL, &q.desc, d, q.a, q.b, d), WEFT_OK);
    /* the padding holds C's values: compare the written elements only */
    void *poison = mm_poisoned(WEFT_DTYPE_BF16, q.nd);
    for (size_t bt = 0; bt < 3; bt++)
        for (size_t i = 0; i < 33; i++)
            memcpy((uint16_t *)poison + bt * 33 * 24 + i * 24,
                   (uint16_t *)d + bt * 33 * 24 + i * 24, 20 * 2);
    assert_int_equal(qm_check("int8 in place", &q, poison, NULL, NULL, 0.0, 0.0), 0);
    free(d), free(poison);
    qm_free(&q);
}

#endif

/* ---- the FP8 codec ------------------------------------------------------ */

static void test_fp8_codec_round_trips_ties_to_even_and_saturates(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++) {
        weft_dtype ty = t ? WEFT_DTYPE_F8_E5M2 : WEFT_DTYPE_F8_E4M3;
        double max = qm_max_finite(ty);
        for (int v = 0; v < 256; v++) {
            float f = weft__f8_to_f32(ty, (uint8_t)v);
            if (isnan(f)) {
                assert_true(isnan(weft__f8_to_f32(ty, weft__f32_to_f8(ty, f))));
                continue;
            }
            if (isinf(f)) { /* E5M2's Inf saturates */
                assert_true(fabs(weft__f8_to_f32(ty, weft__f32_to_f8(ty, f))) == max);
                continue;
            }
            assert_int_equal(weft__f32_to_f8(ty, f), v);
            /* the midpoint to the next pattern up goes to the even one */
            if ((v & 0x7f) < (t ? 0x7b : 0x7e)) {
                float g = weft__f8_to_f32(ty, (uint8_t)(v + 1));
                float mid = (f + g) / 2;
                if (v & 0x80)
                    continue; /* negative: the next pattern is further from zero too */
                int even = (v & 1) ? v + 1 : v;
                assert_int_equal(weft__f32_to_f8(ty, mid), even);
            }
        }
        assert_true(weft__f8_to_f32(ty, weft__f32_to_f8(ty, 1e6f)) == max);
        assert_true(weft__f8_to_f32(ty, weft__f32_to_f8(ty, -1e6f)) == -max);
        assert_true(weft__f8_to_f32(ty, weft__f32_to_f8(ty, (float)max * 1.06f)) == max);
    }
    /* a few values by hand */
    assert_true(weft__f8_to_f32(WEFT_DTYPE_F8_E4M3, 0x01) == 0x1p-9f);
    assert_true(weft__f8_to_f32(WEFT_DTYPE_F8_E4M3, 0x7e) == 448.0f);
    assert_true(weft__f8_to_f32(WEFT_DTYPE_F8_E5M2, 0x01) == 0x1p-16f);
    assert_true(weft__f8_to_f32(WEFT_DTYPE_F8_E5M2, 0x7b) == 57344.0f);
    assert_int_equal(weft__f32_to_f8(WEFT_DTYPE_F8_E4M3, 0x1p-10f), 0);  /* tie to 0 */
    assert_int_equal(weft__f32_to_f8(WEFT_DTYPE_F8_E4M3, 0x1.8p-9f), 2); /* tie to even */
    assert_int_equal(weft__f32_to_f8(WEFT_DTYPE_F8_E4M3, -0.0f), 0x80);
}

/* ---- bad arguments ----------------------------------------------------- */

static _Alignas(64) uint8_t QA[4096], QB[4096];
static _Alignas(64) float QD[1024], QC[1024], SA[64], SB[64], SD[1], AMAX[1];

static void refused(weft_matmul_desc desc, void *d, const void *a, const void *b, const void *c,
                    const char *why)
{
    memset(QD, 0x5a, sizeof QD);
    int rc = weft_matmul(NULL, &desc, d, a, b, c);
    if (rc != WEFT_EINVAL)
        fail_msg("%s: returned %d, not WEFT_EINVAL", why, rc);
    if (!strstr(weft_last_error(), why))
        fail_msg("the message \"%s\" does not say \"%s\"", weft_last_error(), why);
    for (size_t i = 0; i < sizeof QD; i++)
        assert_int_equal(((unsigned char *)QD)[i], 0x5a);
}

static void test_bad_quantized_arguments_are_refused_with_the_reason(void **state)
{
    (void)state;
    const weft_matmul_desc f8 = {.m = 16,
                                 .n = 16,
                                 .k = 32,
                                 .type = WEFT_DTYPE_BF16,
                                 .in_type = WEFT_DTYPE_F8_E4M3,
                                 .trans_b = 1,
                                 .scale_a_mode = WEFT_MATMUL_SCALE_TENSOR,
                                 .scale_b_mode = WEFT_MATMUL_SCALE_TENSOR,
                                 .scale_a = SA,
                                 .scale_b = SB};
    weft_matmul_desc i8 = f8;
    i8.in_type = WEFT_DTYPE_I8, i8.type = WEFT_DTYPE_I32;
    i8.scale_a_mode = i8.scale_b_mode = 0, i8.scale_a = i8.scale_b = NULL;
    weft_matmul_desc x;

    /* FP8 */
    x = f8, x.trans_b = 0;
    refused(x, QD, QA, QB, NULL, "FP8 needs cuBLASLt's TN layout");
    x = f8, x.trans_a = 1;
    refused(x, QD, QA, QB, NULL, "FP8 needs cuBLASLt's TN layout");
    x = f8, x.lda = 40;
    refused(x, QD, QA, QB, NULL, "multiples of 16 (lda 40");
    x = f8, x.k = 17; /* packed rows of 17: ld 17 */
    refused(x, QD, QA, QB, NULL, "multiples of 16 (lda 17, ldb 17");
    x = f8, x.batch = 2, x.stride_a = 16 * 32 + 8;
    x.stride_d = 256;
    refused(x, QD, QA, QB, NULL, "multiples of 16");
    refused(f8, QD, QA + 8, QB, NULL, "FP8 needs A and B aligned to 16 bytes");
    x = f8, x.in_type = x.in_type_b = WEFT_DTYPE_F8_E5M2;
    refused(x, QD, QA, QB, NULL, "E5M2 x E5M2 is not an FP8 pair");
    x = f8, x.in_type_b = WEFT_DTYPE_BF16;
    refused(x, QD, QA, QB, NULL, "FP8 A needs an FP8 B");
    x = f8, x.type = WEFT_DTYPE_I32;
    refused(x, QD, QA, QB, NULL, "FP8 operands give a bf16, fp16, fp32 or fp8 D");
    x = f8, x.type = WEFT_DTYPE_F8_E5M2, x.scale_d = SD;
    refused(x, QD, QA, QB, NULL, "an E5M2 D needs an E5M2 operand");
    x = f8, x.scale_a = NULL;
    refused(x, QD, QA, QB, NULL, "FP8 operands need scale_a and scale_b");
    x = f8, x.scale_b_mode = WEFT_MATMUL_SCALE_NONE;
    refused(x, QD, QA, QB, NULL, "FP8 operands need scale_a and scale_b");
    x = f8, x.scale_b_mode = WEFT_MATMUL_SCALE_OUTER;
    refused(x, QD, QA, QB, NULL, "both per tensor or both outer");
    x = f8, x.scale_a_mode = (weft_matmul_scale)5;
    refused(x, QD, QA, QB, NULL, "unknown scale mode");
    x = f8, x.scale_a = (const float *)(QA + 2);
    refused(x, QD, QA, QB, NULL, "scale_a is not aligned");
    x = f8, x.type = WEFT_DTYPE_F8_E4M3;
    refused(x, QD, QA, QB, NULL, "an fp8 D needs scale_d");
    x = f8, x.type = WEFT_DTYPE_F8_E4M3, x.scale_d = SD;
    x.scale_a_mode = x.scale_b_mode = WEFT_MATMUL_SCALE_OUTER;
    refused(x, QD, QA, QB, NULL, "not an fp8 one");
    x = f8, x.scale_d = SD;
    refused(x, QD, QA, QB, NULL, "scale_d and amax_d are for an fp8 D only");
    x = f8, x.amax_d = AMAX;
    refused(x, QD, QA, QB, NULL, "scale_d and amax_d are for an fp8 D only");
    x = f8, x.c_type = WEFT_DTYPE_F16;
    refused(x, QD, QA, QB, NULL, "c_type is for an fp8 D only");
    x = f8, x.type = WEFT_DTYPE_F8_E4M3, x.scale_d = SD, x.c_type = WEFT_DTYPE_I8;
    refused(x, QD, QA, QB, NULL, "c_type is bf16 or fp16");
    x = f8, x.type = WEFT_DTYPE_F8_E4M3, x.scale_d = SD, x.ldd = 24;
    refused(x, QD, QA, QB, NULL, "FP8 needs D's rows, ldd and stride_d multiples of 16 bytes");
    x = f8, x.ldd = 20;
    refused(x, QD, QA, QB, NULL, "FP8 needs D's rows, ldd and stride_d multiples of 16 bytes");
    x = f8, x.n = 12, x.ldd = 16;
    refused(x, QD, QA, QB, NULL, "FP8 needs D's rows, ldd and stride_d multiples of 16 bytes");
    refused(f8, (char *)QD + 4, QA, QB, NULL, "D 16-byte aligned");
    x = f8, x.ldc = 20;
    refused(x, QD, QA, QB, QC, "FP8 needs C's rows, ldc and stride_c multiples of 16 bytes");
    x = f8, x.k = 24, x.lda = x.ldb = 32;
    refused(x, QD, QA, QB, NULL, "FP8 needs k a multiple of 16, not 24");
    x = f8, x.type = WEFT_DTYPE_F8_E4M3, x.scale_d = SD, x.act = WEFT_MATMUL_ACT_GELU_ERF;
    refused(x, QD, QA, QB, NULL, "the erf GELU with an fp8 D is refused");
    x = f8, x.act = WEFT_MATMUL_ACT_GELU_TANH, x.aux = QC, x.ldaux = 16;
    refused(x, QD, QA, QB, NULL, "aux is not kept with FP8 operands");
    x = f8, x.type = WEFT_DTYPE_F8_E4M3, x.scale_d = SD;
    refused(x, QD, QA, QB, QD, "C is D (in place) but their types differ");

    /* INT8 */
    x = i8, x.trans_b = 0;
    refused(x, QD, QA, QB, NULL, "INT8 needs cuBLASLt's TN layout");
    x = i8, x.k = 30, x.lda = x.ldb = 32;
    refused(x, QD, QA, QB, NULL, "INT8 needs n and k multiples of 4");
    x = i8, x.n = 18, x.ldd = 20;
    refused(x, QD, QA, QB, NULL, "INT8 needs n and k multiples of 4");
    x = i8, x.k = 131072, x.m = 1, x.n = 4;
    refused(x, QD, QA, QB, NULL, "at most 131071");
    x = i8, x.ldb = 34;
    refused(x, QD, QA, QB, NULL, "multiples of 4 (lda 32, ldb 34");
    refused(i8, QD, QA + 2, QB, NULL, "INT8 needs A and B aligned to 4 bytes");
    x = i8, x.ldd = 18;
    refused(x, QD, QA, QB, NULL, "an int32 D needs ldd and stride_d multiples of 4");
    x = i8, x.in_type_b = WEFT_DTYPE_F8_E4M3;
    refused(x, QD, QA, QB, NULL, "INT8 A needs an INT8 B");
    refused(i8, QD, QA, QB, QC, "an int32 D is the exact product");
    x = i8, x.alpha = 2.0f;
    refused(x, QD, QA, QB, NULL, "an int32 D is the exact product");
    x = i8, x.act = WEFT_MATMUL_ACT_RELU;
    refused(x, QD, QA, QB, NULL, "an int32 D is the exact product");
    x = i8, x.scale_a = SA, x.scale_a_mode = WEFT_MATMUL_SCALE_TENSOR;
    refused(x, QD, QA, QB, NULL, "an int32 D is the exact product");
    x = i8, x.type = WEFT_DTYPE_F32;
    refused(x, QD, QA, QB, NULL, "dequantized INT8 operands need scale_a and scale_b");
    x = i8, x.type = WEFT_DTYPE_F8_E4M3, x.scale_d = SD;
    refused(x, QD, QA, QB, NULL, "c_type, scale_d and amax_d are for an fp8 D only");
    x = i8, x.type = WEFT_DTYPE_F8_E4M3;
    refused(x, QD, QA, QB, NULL, "INT8 operands give an int32, bf16, fp16 or fp32 D");
    x = i8, x.in_type = WEFT_DTYPE_I32;
    refused(x, QD, QA, QB, NULL, "int32 is D's type for INT8 operands");

    /* 16/32-bit operands with the quantized fields */
    x = (weft_matmul_desc){.m = 4, .n = 4, .k = 4, .type = WEFT_DTYPE_F32, .scale_a = SA};
    refused(x, QD, QA, QB, NULL, "are for FP8 and INT8 operands only");
    x = (weft_matmul_desc){.m = 4, .n = 4, .k = 4, .type = WEFT_DTYPE_I32};
    x.in_type = WEFT_DTYPE_BF16;
    refused(x, QD, QA, QB, NULL, "a D of dtype 6 needs FP8 or INT8 operands");
    x = (weft_matmul_desc){.m = 4, .n = 4, .k = 4, .type = WEFT_DTYPE_F32};
    x.reserved[8] = 1;
    refused(x, QD, QA, QB, NULL, "reserved[8] is not zero");
}

static void test_the_descriptor_keeps_its_size_and_zero_is_off(void **state)
{
    (void)state;
    /* 16 reserved words once followed allow_tf32 */
    assert_int_equal(sizeof(weft_matmul_desc),
                     offsetof(weft_matmul_desc, allow_tf32) + 8 + 16 * sizeof(uint64_t));
    weft_matmul_desc zero;
    memset(&zero, 0, sizeof zero);
    assert_int_equal(zero.scale_a_mode, WEFT_MATMUL_SCALE_NONE);
    assert_int_equal(zero.in_type_b, 0);
}

/* Every op but weft_matmul refuses the quantized dtypes, saying which op
 * takes them, and writes nothing: the fused operators, the MoE calls (the
 * grouped matmul's type too) and the convolution (its dtype and the fold's
 * BatchNorm dtype). */
static void test_other_ops_refuse_the_quantized_dtypes(void **state)
{
    (void)state;
    float buf[64];
    int32_t table[64] = {0};
    memset(buf, 0x5a, sizeof buf);
    weft_moe_routing routing = {buf, table, table, table, table};
    weft_conv2d_desc conv = {.n = 1, .h = 2, .w = 2, .c = 1, .k = 1, .r = 1, .s = 1};
    static const weft_dtype Q[] = {WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2, WEFT_DTYPE_I8,
                                   WEFT_DTYPE_I32};
    for (int t = 0; t < 4; t++) {
        weft_grouped_matmul_desc g = {.groups = 2, .rows = 4, .n = 8, .k = 8, .type = Q[t]};
        assert_int_equal(weft_grouped_matmul(NULL, &g, buf, buf + 32, buf + 48, table),
                         WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
        assert_int_equal(weft_moe_gate(NULL, Q[t], WEFT_MOE_SOFTMAX, 0, buf, 2, 8, 8, 2, &routing),
                         WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
        assert_int_equal(weft_moe_permute(NULL, Q[t], buf, buf + 32, table, 2, 2, 8, 8, 8),
                         WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
        assert_int_equal(
            weft_moe_unpermute(NULL, Q[t], buf, buf + 32, buf + 48, table, NULL, 2, 2, 8, 8, 8),
            WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
        weft_conv2d_desc qc = conv;
        qc.dtype = Q[t];
        assert_int_equal(weft_conv2d(NULL, &qc, buf, buf + 16, buf + 32, buf + 48), WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
        assert_int_equal(weft_conv2d_fold_bn(NULL, &qc, WEFT_DTYPE_F32, buf, buf + 8, buf + 16,
                                             NULL, buf + 24, buf + 32, buf + 40, buf + 48, 1e-5f),
                         WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
        assert_int_equal(weft_conv2d_fold_bn(NULL, &conv, Q[t], buf, buf + 8, buf + 16, NULL,
                                             buf + 24, buf + 32, buf + 40, buf + 48, 1e-5f),
                         WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
        assert_int_equal(weft_softmax(NULL, Q[t], buf, buf, 2, 8, 8, NULL), WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
        assert_int_equal(
            weft_layernorm(NULL, Q[t], buf, NULL, buf, NULL, NULL, NULL, 1e-5f, 2, 8, 8),
            WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
        assert_int_equal(
            weft_bias_gelu_residual(NULL, Q[t], WEFT_GELU_TANH, buf, buf, NULL, NULL, 2, 8, 8),
            WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "only weft_matmul takes"));
    }
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(((unsigned char *)buf)[i], 0x5a);
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        assert_int_equal(table[i], 0);
}

int main(void)
{
    mm_rng_state = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    const char *seed = getenv("WEFT_TEST_SEED");
    if (seed && *seed)
        mm_rng_state = strtoull(seed, NULL, 0);
    printf("test_matmul_quant: seed %llu\n", (unsigned long long)mm_rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_codec_round_trips_ties_to_even_and_saturates),
        cmocka_unit_test(test_bad_quantized_arguments_are_refused_with_the_reason),
        cmocka_unit_test(test_the_descriptor_keeps_its_size_and_zero_is_off),
        cmocka_unit_test(test_other_ops_refuse_the_quantized_dtypes),
#ifdef WEFT_HAVE_HOST_BLAS
        cmocka_unit_test(test_fp8_every_pair_output_scale_mode_and_epilogue_matches_float64),
        cmocka_unit_test(test_fp8_awkward_shapes_padding_and_batches),
        cmocka_unit_test(test_fp8_d_saturates_and_amax_is_taken_before_the_scale),
        cmocka_unit_test(test_int8_exact_into_int32),
        cmocka_unit_test(test_int8_extremes_sum_exactly),
        cmocka_unit_test(test_int8_dequantized_every_scale_mode_and_epilogue),
        cmocka_unit_test(test_int8_dequantized_batches_and_in_place_residual),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
