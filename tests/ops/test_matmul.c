/*
 * test_matmul.c - weft_matmul's host reference (NULL stream) against the
 * float64 loop of matmul_ref.h, on fresh random data each run (the seed is
 * printed): every type pair, activation, bias and residual, the four
 * transposes, the awkward shapes, batches with shared and strided
 * operands, leading dimensions larger than the row, the residual in place,
 * the pre-activation kept in aux; and every bad argument refused with its
 * reason before anything is written. In a build without a BLAS the host
 * call must say so instead. Also the rule that sends a GPU call to the
 * skinny kernel or to cuBLASLt (weft__matmul_skinny_fits), which is plain
 * C on the checked arguments.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <time.h>

#include "weft.h"
#include "weft/ops.h"
#include "ops/matmul.h"
#include "ops/matmul_ref.h"

#ifdef WEFT_HAVE_HOST_BLAS /* the cases that need the host reference to run */

/* Runs desc on fresh operands (with C when with_c, in place when
 * in_place) and checks D and aux; fails the test on any bad element. */
static void run_case(const char *name, weft_matmul_desc desc, int with_c, int in_place,
                     int with_bias, int with_aux)
{
    mm_geom g = mm_geometry(&desc);
    void *a = mm_random(g.in_type, g.na, 1.0);
    void *b = mm_random(g.in_type, g.nb, 1.0);
    void *c = with_c ? mm_random(desc.type, in_place ? g.nd : g.nc, 1.0) : NULL;
    void *c_before = NULL;
    void *bias = with_bias ? mm_random(desc.type, desc.n, 1.0) : NULL;
    void *aux = with_aux ? mm_poisoned(desc.type, g.naux) : NULL;
    void *d;
    size_t es = weft__dtype_size(desc.type);

    if (in_place) {
        d = c;
        c_before = malloc(g.nd * es);
        memcpy(c_before, c, g.nd * es);
    } else {
        d = mm_poisoned(desc.type, g.nd);
    }
    desc.bias = bias;
    desc.aux = aux;
    int rc = weft_matmul(NULL, &desc, d, a, b, c);
    if (rc != WEFT_OK)
        fail_msg("%s: weft_matmul returned %d: %s", name, rc, weft_last_error());
    size_t bad = mm_check(name, &desc, a, b, in_place ? c_before : c, d, aux, 1.0, !in_place);
    if (bad)
        fail_msg("%s: %zu elements out of bounds (%zu x %zu x %zu, batch %zu)", name, bad, desc.m,
                 desc.n, desc.k, g.batch);
    free(a), free(b), free(bias), free(aux), free(c_before);
    if (!in_place)
        free(d);
    free(c);
}

static const weft_dtype OUT_T[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16, WEFT_DTYPE_F32,
                                   WEFT_DTYPE_F32};
static const weft_dtype IN_T[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16, WEFT_DTYPE_BF16,
                                  WEFT_DTYPE_F16};
static const char *const TYPE_NAME[] = {"f32", "bf16", "f16", "bf16->f32", "f16->f32"};

static void test_every_type_activation_bias_and_residual_matches_float64(void **state)
{
    (void)state;
    char name[128];
    for (int t = 0; t < 5; t++)
        for (int act = 0; act <= WEFT_MATMUL_ACT_GELU_ERF; act++)
            for (int extra = 0; extra < 4; extra++) {
                weft_matmul_desc desc = {.m = 7,
                                         .n = 13,
                                         .k = 5,
                                         .type = OUT_T[t],
                                         .in_type = IN_T[t],
                                         .act = (weft_matmul_act)act};
                desc.trans_b = (int)(mm_rng() & 1);
                snprintf(name, sizeof name, "%s act %d bias %d residual %d", TYPE_NAME[t], act,
                         extra & 1, extra >> 1);
                if (extra >> 1)
                    desc.beta = 0.5f;
                run_case(name, desc, extra >> 1, 0, extra & 1, 0);
            }
}

static void test_transposes_and_leading_dimensions_larger_than_the_row(void **state)
{
    (void)state;
    char name[128];
    for (int t = 0; t < 3; t++)
        for (int tr = 0; tr < 4; tr++) {
            weft_matmul_desc desc = {.m = 37,
                                     .n = 29,
                                     .k = 600,
                                     .type = OUT_T[t],
                                     .trans_a = tr & 1,
                                     .trans_b = tr >> 1,
                                     .alpha = -0.75f};
            mm_geom g = mm_geometry(&desc);
            desc.lda = g.a_cols + 3, desc.ldb = g.b_cols + 5, desc.ldd = desc.n + 7;
            desc.ldc = desc.n + 1;
            snprintf(name, sizeof name, "%s trans_a %d trans_b %d", TYPE_NAME[t], tr & 1, tr >> 1);
            run_case(name, desc, 1, 0, 1, 0);
        }
}

static void test_awkward_shapes(void **state)
{
    (void)state;
    static const size_t SHAPES[][3] = {
        {1, 1, 1}, {7, 13, 5}, {9, 11, 1}, {1, 300, 257}, {1000, 3, 1000}, {300, 513, 1},
    };
    char name[128];
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
        for (int t = 0; t < 3; t++) {
            weft_matmul_desc desc = {.m = SHAPES[s][0],
                                     .n = SHAPES[s][1],
                                     .k = SHAPES[s][2],
                                     .type = OUT_T[t],
                                     .act = WEFT_MATMUL_ACT_GELU_TANH};
            snprintf(name, sizeof name, "%s %zu x %zu x %zu", TYPE_NAME[t], desc.m, desc.n, desc.k);
            run_case(name, desc, 0, 0, 1, 0);
        }
}

static void test_strided_batches_with_shared_and_padded_operands(void **state)
{
    (void)state;
    char name[128];
    for (int t = 0; t < 3; t++)
        for (int shared = 0; shared < 2; shared++) {
            weft_matmul_desc desc = {.m = 19,
                                     .n = 24,
                                     .k = 33,
                                     .type = OUT_T[t],
                                     .batch = 3,
                                     .trans_b = 1,
                                     .ldd = 30,
                                     .act = WEFT_MATMUL_ACT_RELU};
            desc.stride_a = 19 * 33 + 4;
            desc.stride_b = shared ? 0 : 24 * 33 + 1; /* one weight for every batch */
            desc.stride_c = 19 * 24 + 2;
            desc.stride_d = 19 * 30 + 6;
            snprintf(name, sizeof name, "%s batches, B %s", TYPE_NAME[t],
                     shared ? "shared" : "strided");
            run_case(name, desc, 1, 0, 1, 0);
        }
}

static void test_residual_in_place(void **state)
{
    (void)state;
    char name[128];
    for (int t = 0; t < 3; t++) {
        weft_matmul_desc desc = {.m = 45,
                                 .n = 17,
                                 .k = 70,
                                 .type = OUT_T[t],
                                 .batch = 2,
                                 .ldd = 20,
                                 .ldc = 20,
                                 .stride_d = 45 * 20,
                                 .stride_c = 45 * 20,
                                 .stride_b = 70 * 17,
                                 .beta = -1.5f,
                                 .act = WEFT_MATMUL_ACT_GELU_ERF};
        snprintf(name, sizeof name, "%s in place", TYPE_NAME[t]);
        run_case(name, desc, 1, 1, 1, 0);
    }
}

static void test_aux_keeps_the_pre_activation(void **state)
{
    (void)state;
    char name[128];
    for (int t = 0; t < 5; t++)
        for (int act = WEFT_MATMUL_ACT_GELU_TANH; act <= WEFT_MATMUL_ACT_GELU_ERF; act++) {
            weft_matmul_desc desc = {.m = 21,
                                     .n = 10,
                                     .k = 40,
                                     .type = OUT_T[t],
                                     .in_type = IN_T[t],
                                     .act = (weft_matmul_act)act,
                                     .ldaux = 16,
                                     .batch = 2,
                                     .stride_aux = 21 * 16 + 8,
                                     .stride_d = 21 * 10,
                                     .stride_a = 21 * 40};
            snprintf(name, sizeof name, "%s aux act %d", TYPE_NAME[t], act);
            run_case(name, desc, 1, 0, 1, 1);
        }
}

#endif

/* ---- bad arguments ----------------------------------------------------- */

static float A[64], B[64], D[64], AUX[64];

/* The call must fail with WEFT_EINVAL naming why, and leave D alone. */
static void refused(weft_matmul_desc desc, void *d, const void *a, const void *b, const void *c,
                    const char *why)
{
    memset(D, 0x5a, sizeof D);
    int rc = weft_matmul(NULL, &desc, d, a, b, c);
    if (rc != WEFT_EINVAL)
        fail_msg("%s: returned %d, not WEFT_EINVAL", why, rc);
    if (!strstr(weft_last_error(), why))
        fail_msg("the message \"%s\" does not say \"%s\"", weft_last_error(), why);
    for (size_t i = 0; i < sizeof D; i++)
        assert_int_equal(((unsigned char *)D)[i], 0x5a);
}

static void test_bad_arguments_are_refused_with_the_reason(void **state)
{
    (void)state;
    const weft_matmul_desc ok = {.m = 4, .n = 4, .k = 4, .type = WEFT_DTYPE_F32};
    weft_matmul_desc x;

    assert_int_equal(weft_matmul(NULL, NULL, D, A, B, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "desc is NULL"));
    x = ok, x.m = 0;
    refused(x, D, A, B, NULL, "must be >= 1");
    x = ok, x.k = 0;
    refused(x, D, A, B, NULL, "must be >= 1");
    x = ok, x.lda = 3;
    refused(x, D, A, B, NULL, "A's leading dimension 3 is smaller than its row (4)");
    x = ok, x.trans_b = 1, x.n = 2, x.ldb = 3;
    refused(x, D, A, B, NULL, "B's leading dimension 3 is smaller than its row (4)");
    x = ok, x.ldd = 2;
    refused(x, D, A, B, NULL, "D's leading dimension 2");
    x = ok, x.ldc = 1;
    refused(x, D, A, B, D + 32, "C's leading dimension 1");
    refused(ok, D, NULL, B, NULL, "A is NULL");
    refused(ok, D, A, NULL, NULL, "B is NULL");
    refused(ok, NULL, A, B, NULL, "D is NULL");
    refused(ok, D, (const char *)A + 2, B, NULL, "A is not aligned");
    x = ok, x.type = (weft_dtype)9;
    refused(x, D, A, B, NULL, "unsupported dtype 9");
    x = ok, x.in_type = WEFT_DTYPE_BF16, x.type = WEFT_DTYPE_F16;
    refused(x, D, A, B, NULL, "need a D of their dtype or fp32");
    x = ok, x.act = (weft_matmul_act)7;
    refused(x, D, A, B, NULL, "unknown activation 7");
    x = ok, x.aux = AUX, x.act = WEFT_MATMUL_ACT_RELU;
    refused(x, D, A, B, NULL, "aux (the pre-activation) is kept for a GELU only");
    x = ok, x.aux = AUX, x.ldaux = 12, x.act = WEFT_MATMUL_ACT_GELU_TANH;
    refused(x, D, A, B, NULL, "multiples of 8");
    x = ok, x.batch = 2, x.stride_d = 0;
    refused(x, D, A, B, NULL, "D's batch stride is 0");
    x = ok, x.batch = 2, x.stride_d = 10;
    refused(x, D, A, B, NULL, "D's batch stride 10 is smaller than its matrix (16)");
    x = ok, x.reserved[3] = 1;
    refused(x, D, A, B, NULL, "reserved[3] is not zero");
    x = ok, x.reserved_int = 1;
    refused(x, D, A, B, NULL, "reserved_int is not zero");
    x = ok, x.alpha = NAN;
    refused(x, D, A, B, NULL, "alpha and beta must be finite");
    x = ok, x.ldc = 5;
    refused(x, D, A, B, D, "C is D (in place) but their leading dimensions");
    x = ok, x.m = SIZE_MAX / 2, x.k = 1;
    refused(x, D, A, B, NULL, "too large");
}

static void test_a_valid_call_is_not_refused(void **state)
{
    (void)state;
    const weft_matmul_desc ok = {.m = 4, .n = 4, .k = 4, .type = WEFT_DTYPE_F32};
    for (int i = 0; i < 16; i++)
        A[i] = (float)i, B[i] = i % 5 == 0 ? 1.0f : 0.0f; /* B = I */
#ifdef WEFT_HAVE_HOST_BLAS
    assert_int_equal(weft_matmul(NULL, &ok, D, A, B, NULL), WEFT_OK);
    assert_memory_equal(D, A, 16 * sizeof *D);
#else
    assert_int_equal(weft_matmul(NULL, &ok, D, A, B, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "built without a host BLAS"));
#endif
}

/* Decode's shapes go to the skinny kernel, bf16/fp16 ones and FP8 ones
 * into a 16/32-bit D; a row more than 32, another layout or type, INT8
 * operands, an fp8 or int32 D, a quantized field on a 16-bit call, or
 * anything that breaks its 16-byte loads goes to cuBLASLt. The arguments are resolved ones, as
 * check_desc leaves them (B's, C's and the bias's types set); the pointers are never read. */
static void test_the_skinny_kernel_takes_decode_shapes_only(void **state)
{
    (void)state;
    static const float scale = 1.0f;
    static float amax;
    const weft__matmul_args up = {.m = 16,
                                  .n = 14336,
                                  .k = 4096,
                                  .batch = 1,
                                  .kind = WEFT__MM_FLOAT,
                                  .type = WEFT_DTYPE_BF16,
                                  .in_type = WEFT_DTYPE_BF16,
                                  .in_type_b = WEFT_DTYPE_BF16,
                                  .c_type = WEFT_DTYPE_BF16,
                                  .bias_type = WEFT_DTYPE_BF16,
                                  .trans_b = 1,
                                  .lda = 4096,
                                  .ldb = 4096,
                                  .ldd = 14336,
                                  .a = (const void *)(uintptr_t)0x10000,
                                  .b = (const void *)(uintptr_t)0x20000,
                                  .d = (void *)(uintptr_t)0x30002};
    weft__matmul_args x = up;
    assert_true(weft__matmul_skinny_fits(&x));
    x.m = 1, x.k = x.lda = 4100; /* one row: its stride is never used */
    assert_true(weft__matmul_skinny_fits(&x));
    x = up, x.in_type = x.in_type_b = WEFT_DTYPE_F16, x.m = 3;
    x.type = x.c_type = x.bias_type = WEFT_DTYPE_F32;
    assert_true(weft__matmul_skinny_fits(&x));
    x = up, x.batch = 7, x.stride_a = 16 * 4096, x.stride_b = 0, x.stride_d = 16 * 14336;
    assert_true(weft__matmul_skinny_fits(&x));
    x = up, x.k = 100000, x.lda = x.ldb = 100000; /* 896 blocks: enough for a long k */
    assert_true(weft__matmul_skinny_fits(&x));
    x = up, x.n = 1, x.ldb = 4100, x.k = 4100, x.lda = 4104; /* one column: ldb unused */
    assert_true(weft__matmul_skinny_fits(&x));

    x = up, x.m = 32; /* four parts of 8 rows */
    assert_true(weft__matmul_skinny_fits(&x));
    x = up, x.m = 33;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.trans_b = 0;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.trans_a = 1;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.in_type = x.type = WEFT_DTYPE_F32;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.a = (const char *)x.a + 2;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.b = (const char *)x.b + 8;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.m = 2, x.k = 4100, x.lda = 4100, x.ldb = 4104;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.k = 4100, x.lda = 4104, x.ldb = 4100;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.batch = 2, x.stride_b = 4096 * 14336 + 4;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.batch = 2, x.stride_a = 4;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.batch = 65536;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.n = 13, x.k = x.lda = x.ldb = 40000; /* one block for a long k */
    assert_false(weft__matmul_skinny_fits(&x));

    /* FP8 operands with their scales into a 16/32-bit D fit; an fp8 D, an
     * fp32 D's bf16 bias or a C of another type do not. */
    const weft__matmul_args fp8 = {.m = 4,
                                   .n = 4096,
                                   .k = 2048,
                                   .batch = 1,
                                   .kind = WEFT__MM_FP8,
                                   .type = WEFT_DTYPE_BF16,
                                   .in_type = WEFT_DTYPE_F8_E4M3,
                                   .in_type_b = WEFT_DTYPE_F8_E4M3,
                                   .c_type = WEFT_DTYPE_BF16,
                                   .bias_type = WEFT_DTYPE_BF16,
                                   .scale_a_mode = WEFT_MATMUL_SCALE_OUTER,
                                   .scale_b_mode = WEFT_MATMUL_SCALE_OUTER,
                                   .scale_a = &scale,
                                   .scale_b = &scale,
                                   .trans_b = 1,
                                   .lda = 2048,
                                   .ldb = 2048,
                                   .ldd = 4096,
                                   .bias = &scale,
                                   .a = (const void *)(uintptr_t)0x10000,
                                   .b = (const void *)(uintptr_t)0x20000,
                                   .d = (void *)(uintptr_t)0x30002};
    x = fp8;
    assert_true(weft__matmul_skinny_fits(&x));
    x = fp8, x.in_type_b = WEFT_DTYPE_F8_E5M2, x.m = 16,
    x.type = x.c_type = x.bias_type = WEFT_DTYPE_F16;
    x.scale_a_mode = x.scale_b_mode = WEFT_MATMUL_SCALE_TENSOR;
    assert_true(weft__matmul_skinny_fits(&x));
    x = fp8, x.type = x.c_type = WEFT_DTYPE_F32, x.bias = NULL; /* its bf16 bias unused */
    assert_true(weft__matmul_skinny_fits(&x));
    x = fp8, x.m = 33;
    assert_false(weft__matmul_skinny_fits(&x));
    x = fp8, x.type = x.c_type = WEFT_DTYPE_F32; /* a bf16 bias for an fp32 D */
    assert_false(weft__matmul_skinny_fits(&x));
    x = fp8, x.type = WEFT_DTYPE_F8_E4M3, x.scale_d = &scale, x.amax_d = &amax; /* an fp8 D */
    assert_false(weft__matmul_skinny_fits(&x));
    x = fp8, x.amax_d = &amax;
    assert_false(weft__matmul_skinny_fits(&x));
    x = fp8, x.c_type = WEFT_DTYPE_F16;
    assert_false(weft__matmul_skinny_fits(&x));
    x = fp8, x.stride_a = 8, x.batch = 2; /* 8 bytes: breaks the 16-byte loads */
    assert_false(weft__matmul_skinny_fits(&x));

    /* The other quantized products, each at a decode shape that would
     * otherwise fit, and each quantized field alone on a 16-bit call. */
    x = up, x.kind = WEFT__MM_INT8, x.in_type = x.in_type_b = WEFT_DTYPE_I8;
    x.type = x.c_type = x.bias_type = WEFT_DTYPE_I32;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.kind = WEFT__MM_INT8; /* the kind alone */
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.in_type_b = WEFT_DTYPE_F16;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.in_type_b = WEFT_DTYPE_F8_E4M3;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.type = x.c_type = x.bias_type = WEFT_DTYPE_F8_E4M3;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.type = x.c_type = x.bias_type = WEFT_DTYPE_I32;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.type = x.c_type = x.bias_type = WEFT_DTYPE_F16; /* D of neither A's type nor fp32 */
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.c_type = WEFT_DTYPE_F16;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.bias_type = WEFT_DTYPE_F32;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.scale_a_mode = WEFT_MATMUL_SCALE_OUTER;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.scale_b_mode = WEFT_MATMUL_SCALE_TENSOR;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.scale_a = &scale;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.scale_b = &scale;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.scale_d = &scale;
    assert_false(weft__matmul_skinny_fits(&x));
    x = up, x.amax_d = &amax;
    assert_false(weft__matmul_skinny_fits(&x));
}

int main(void)
{
    mm_rng_state = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    printf("test_matmul: seed %llu\n", (unsigned long long)mm_rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments_are_refused_with_the_reason),
        cmocka_unit_test(test_a_valid_call_is_not_refused),
        cmocka_unit_test(test_the_skinny_kernel_takes_decode_shapes_only),
#ifdef WEFT_HAVE_HOST_BLAS
        cmocka_unit_test(test_every_type_activation_bias_and_residual_matches_float64),
        cmocka_unit_test(test_transposes_and_leading_dimensions_larger_than_the_row),
        cmocka_unit_test(test_awkward_shapes),
        cmocka_unit_test(test_strided_batches_with_shared_and_padded_operands),
        cmocka_unit_test(test_residual_in_place),
        cmocka_unit_test(test_aux_keeps_the_pre_activation),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
