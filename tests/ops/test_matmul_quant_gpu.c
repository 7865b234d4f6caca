/*
 * test_matmul_quant_gpu.c - weft_matmul's FP8 and INT8 products on the GPU
 * (cuBLASLt, and weft's dequantizing epilogue) against the float64 loop of
 * matmul_quant_ref.h and against the host reference on the same operands,
 * on fresh random data: every FP8 pair and D type, per-tensor and outer
 * (row/column) scales, every activation with bias and residual, an fp8 D
 * with scale_d, saturation and amax_d; INT8 exact into int32 and
 * dequantized by every scale-mode pair with the epilogues and aux, in
 * place, and captured into a CUDA graph; awkward shapes and batches;
 * decode's rows (m <= 32) of FP8 into a 16/32-bit D on weft's skinny
 * kernel (every pair, D type, scale mode and activation, a tail of k, a
 * cluster sharing a long k, shared weights across batches),
 * every call's path asserted by the kernel's count of calls (INT8 and
 * an fp8 D never go there); and refusals before anything is enqueued.
 *
 * Bounds: those of matmul_quant_ref.h element by element, with a further
 * 2^-10 of the terms' magnitudes for FP8 (Hopper's FP8 matrix units keep
 * about 14 bits of their sums between promotions to fp32, and truncate:
 * the H200 showed errors up to 2.2 x 2^-12 of them) and none for INT8
 * (the int32 product is exact; the epilogue rounds as the host does).
 * Outputs and amax_d are poisoned first. Each case prints one line; every
 * failing case is listed before the test fails, with cuBLASLt's refusal
 * where it refused.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>
#include <math.h>

#include "ops/matmul.h"
#include "ops/matmul_quant_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static const double FP8_EXTRA = 0x1p-10;

/* The GPU's activations against the host's, relative to |P|: the GELU
 * fits (ops.h: erf within 7.3e-4 for bf16 results; the others within
 * 1e-5 (4 + x^2) of the value, which 1e-4 |P| covers where the value is
 * not already exact or negligible), cuBLASLt's own tanh GELU likewise,
 * and after FP8 products the erf GELU of P already rounded to D's type (a
 * second rounding, through a slope of at most 1.13). */
static double act_slack(const qm_case *q)
{
    weft_dtype t = q->desc.type;
    if (q->desc.act != WEFT_MATMUL_ACT_GELU_ERF && q->desc.act != WEFT_MATMUL_ACT_GELU_TANH)
        return 0.0;
    double fit = t == WEFT_DTYPE_BF16 ? 7.5e-4 : 1e-4;
    if (q->desc.act == WEFT_MATMUL_ACT_GELU_ERF && qm_is_f8(q->g.in_type))
        fit += 1.2 * qm_half_ulp(t);
    return fit;
}

static const weft_dtype F8[] = {WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2};
static const char *const NAME[] = {"f32", "bf16", "f16", "e4m3", "e5m2", "i8", "i32"};

static void *upload(const void *h, size_t bytes)
{
    if (!h)
        return NULL;
    void *p = NULL;
    assert_cuda(cudaMalloc(&p, bytes ? bytes : 1));
    assert_cuda(gt_copy_in(p, h, bytes));
    return p;
}

static size_t round_up(size_t x, size_t q)
{
    return (x + q - 1) / q * q;
}

static weft_matmul_desc tn(size_t m, size_t n, size_t k, size_t q, size_t pad)
{
    weft_matmul_desc d = {.m = m, .n = n, .k = k, .trans_b = 1};
    d.lda = round_up(k, q) + pad, d.ldb = round_up(k, q) + pad;
    return d;
}

static unsigned failed_cases;

static void case_failed(const char *name, const char *why)
{
    printf("  FAILED %s: %s\n", name, why);
    failed_cases++;
}

static void no_case_failed(void)
{
    unsigned n = failed_cases;
    failed_cases = 0;
    if (n)
        fail_msg("%u cases failed (each listed above)", n);
}

/* The device copies of one case's inputs. */
typedef struct dev_case {
    void *a, *b, *c, *bias, *sa, *sb, *sd;
} dev_case;

static dev_case to_device(const qm_case *q)
{
    const weft_matmul_desc *d = &q->desc;
    dev_case x;
    x.a = upload(q->a, q->na * weft__dtype_size(q->g.in_type));
    x.b = upload(q->b, q->nb * weft__dtype_size(q->tb));
    x.c = upload(q->c, q->nc * weft__dtype_size(q->tc));
    x.bias = upload(q->bias, d->n * weft__dtype_size(q->tbias));
    x.sa = upload(q->sa, (d->scale_a_mode == WEFT_MATMUL_SCALE_OUTER ? d->m : 1) * sizeof(float));
    x.sb = upload(q->sb, (d->scale_b_mode == WEFT_MATMUL_SCALE_OUTER ? d->n : 1) * sizeof(float));
    x.sd = qm_is_f8(d->type) ? upload(&q->sd, sizeof(float)) : NULL;
    return x;
}

static void free_device(dev_case *x)
{
    cudaFree(x->a), cudaFree(x->b), cudaFree(x->c), cudaFree(x->bias);
    cudaFree(x->sa), cudaFree(x->sb), cudaFree(x->sd);
}

static weft_matmul_desc device_desc(const qm_case *q, const dev_case *x)
{
    weft_matmul_desc d = q->desc;
    d.bias = x->bias, d.scale_a = x->sa, d.scale_b = x->sb;
    d.scale_d = x->sd;
    return d;
}

/* Where a call must go: cuBLASLt, or weft's decode kernel. */
enum path { CUBLASLT, SKINNY };

/* One case on the GPU into poisoned D (aux, amax), checked against float64
 * and against the host reference on the same operands. */
static void gpu_case(const char *name, qm_case *q, int with_aux, int with_amax, enum path path)
{
    const weft_matmul_desc *desc = &q->desc;
    size_t es = weft__dtype_size(desc->type);
    double extra = qm_is_f8(q->g.in_type) ? FP8_EXTRA : 0.0;
    void *pd = mm_poisoned(desc->type, q->nd);
    void *paux = with_aux ? mm_poisoned(desc->type, q->naux) : NULL;
    dev_case x = to_device(q);
    void *dd = upload(pd, q->nd * es);
    void *daux = with_aux ? upload(paux, q->naux * es) : NULL;
    float amax_poison;
    memset(&amax_poison, 0xff, sizeof amax_poison);
    float *damax = with_amax ? upload(&amax_poison, sizeof(float)) : NULL;

    weft_matmul_desc gd = device_desc(q, &x);
    gd.aux = daux, gd.amax_d = damax;
    unsigned long long skinny_before = weft__matmul_cuda_skinny_calls();
    int rc = weft_matmul(stream, &gd, dd, x.a, x.b, x.c);
    if (rc != WEFT_OK) {
        char why[512];
        snprintf(why, sizeof why, "weft_matmul returned %d: %s", rc, weft_last_error());
        case_failed(name, why);
        goto done;
    }
    if (weft__matmul_cuda_skinny_calls() - skinny_before != (path == SKINNY)) {
        case_failed(name, path == SKINNY ? "went to cuBLASLt, not the decode kernel"
                                         : "went to the decode kernel, not cuBLASLt");
        goto done;
    }
    assert_cuda(cudaStreamSynchronize(stream));
    void *got = gt_download(dd, q->nd * es);
    void *got_aux = with_aux ? gt_download(daux, q->naux * es) : NULL;
    float got_amax = 0;
    if (with_amax)
        assert_cuda(cudaMemcpy(&got_amax, damax, sizeof got_amax, cudaMemcpyDeviceToHost));
    size_t bad = qm_check(name, q, got, got_aux, with_amax ? &got_amax : NULL, extra, act_slack(q));

#ifdef WEFT_HAVE_HOST_BLAS
    /* The host reference on the same operands, and the two side by side. */
    void *hd = mm_poisoned(desc->type, q->nd);
    float host_amax = 0;
    weft_matmul_desc hdesc = q->desc;
    hdesc.amax_d = with_amax ? &host_amax : NULL;
    hdesc.aux = NULL;
    assert_int_equal(weft_matmul(NULL, &hdesc, hd, q->a, q->b, q->c), WEFT_OK);
    size_t hbad = qm_agree(name, q, got, hd, extra, act_slack(q));
    free(hd);
#else
    size_t hbad = 0;
    float host_amax = got_amax;
#endif
    printf("  %-64s %s%s amax %.6g (host %.6g)\n", name, bad ? "REFERENCE MISMATCH " : "ok",
           hbad ? " HOST MISMATCH" : "", (double)got_amax, (double)host_amax);
    if (bad || hbad)
        case_failed(name, bad ? "differs from the float64 reference" : "differs from the host");
    free(got), free(got_aux);
done:
    free_device(&x);
    cudaFree(dd), cudaFree(daux), cudaFree(damax);
    free(pd), free(paux);
}

/* ---- FP8 --------------------------------------------------------------- */

static void test_fp8_every_pair_output_scale_mode_and_epilogue(void **state)
{
    (void)state;
    static const weft_dtype OUT[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16,
                                     WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2};
    char name[160];
    for (int pa = 0; pa < 2; pa++)
        for (int pb = 0; pb < 2; pb++) {
            if (pa && pb)
                continue;
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
                            weft_matmul_desc desc = tn(64, 48, 96, 16, 0);
                            desc.type = OUT[o], desc.in_type = F8[pa], desc.in_type_b = F8[pb];
                            desc.scale_a_mode = desc.scale_b_mode = (weft_matmul_scale)mode;
                            desc.act = (weft_matmul_act)act;
                            desc.alpha = extra == 3 ? -0.5f : 0.0f;
                            if (extra >> 1)
                                desc.beta = 0.75f;
                            if (d8 && (extra & 1))
                                desc.c_type = WEFT_DTYPE_F16;
                            qm_case q;
                            qm_make(&q, desc, extra >> 1, extra & 1, 200.0);
                            snprintf(name, sizeof name,
                                     "%s x %s -> %s scales %d act %d bias %d C %d", NAME[F8[pa]],
                                     NAME[F8[pb]], NAME[OUT[o]], mode, act, extra & 1, extra >> 1);
                            gpu_case(name, &q, 0, d8, CUBLASLT);
                            qm_free(&q);
                        }
                }
            }
        }
    no_case_failed();
}

static void test_fp8_awkward_shapes_and_batches(void **state)
{
    (void)state;
    /* m is free; k a multiple of 16, n of 8 (16-byte rows of a bf16 D) */
    static const size_t SHAPES[][3] = {{1, 8, 16},     {1, 16, 32},   {17, 8, 16},
                                       {33, 24, 128},  {128, 40, 16}, {128, 128, 128},
                                       {300, 264, 608}};
    char name[160];
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
        for (int mode = 1; mode <= 2; mode++)
            for (int batch = 1; batch <= 3; batch += 2) {
                size_t m = SHAPES[s][0], n = SHAPES[s][1], k = SHAPES[s][2];
                weft_matmul_desc desc = tn(m, n, k, 16, 16 * (s & 1));
                desc.type = mode == 1 ? WEFT_DTYPE_BF16 : WEFT_DTYPE_F32;
                desc.in_type = WEFT_DTYPE_F8_E4M3;
                desc.in_type_b = s & 1 ? WEFT_DTYPE_F8_E5M2 : 0;
                desc.scale_a_mode = desc.scale_b_mode = (weft_matmul_scale)mode;
                desc.act = WEFT_MATMUL_ACT_GELU_TANH;
                desc.batch = (size_t)batch;
                desc.ldd = round_up(n, 8) + 8, desc.ldc = round_up(n, 8);
                desc.stride_a = m * desc.lda + 16;
                desc.stride_b = s & 1 ? 0 : n * desc.ldb;
                desc.stride_c = m * desc.ldc + 8, desc.stride_d = m * desc.ldd + 8;
                qm_case q;
                qm_make(&q, desc, 1, 1, 0);
                snprintf(name, sizeof name, "fp8 %zu x %zu x %zu scales %d batch %d", m, n, k, mode,
                         batch);
                /* a few rows into bf16 are decode's; an fp32 D's bf16 bias is not */
                gpu_case(name, &q, 0, 0, m <= 32 && mode == 1 ? SKINNY : CUBLASLT);
                qm_free(&q);
            }
    no_case_failed();
}

/* Decode's rows: m <= 32 of FP8 into bf16, fp16 or fp32 on the skinny
 * kernel. The shapes reach its paths: one row and one tile; a k that ends
 * within a turn (256 FP8 k a warp); 8, 9 and 32 rows (one, two and four
 * parts of the mma tiles); a single tile over a long k (a cluster of
 * blocks sharing it); Llama-like projections, a down projection's k of
 * 14336 over 256 tiles among them (56 mma steps a warp: its sums must not
 * drift); three batches sharing one weight. */
static void test_fp8_decode_rows_take_the_skinny_kernel(void **state)
{
    (void)state;
    static const size_t SHAPES[][4] = {/* m, n, k, batch */
                                       {1, 8, 16, 1},      {2, 24, 48, 1},     {8, 40, 272, 1},
                                       {9, 136, 4112, 1},  {16, 8, 8192, 1},   {1, 2048, 2048, 1},
                                       {4, 3072, 1024, 1}, {3, 264, 608, 3},   {32, 520, 1040, 1},
                                       {20, 16, 8192, 2},  {1, 4096, 14336, 1}};
    static const weft_dtype OUT[] = {WEFT_DTYPE_BF16, WEFT_DTYPE_F16, WEFT_DTYPE_F32};
    static const weft_dtype PAIRS[][2] = {{WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E4M3},
                                          {WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2},
                                          {WEFT_DTYPE_F8_E5M2, WEFT_DTYPE_F8_E4M3}};
    char name[160];
    unsigned n_case = 0;
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
        for (int pr = 0; pr < 3; pr++)
            for (int o = 0; o < 3; o++)
                for (int mode = 1; mode <= 2; mode++, n_case++) {
                    size_t m = SHAPES[s][0], n = SHAPES[s][1], k = SHAPES[s][2];
                    size_t batch = SHAPES[s][3];
                    /* the longest k (Llama 3 8B's down projection) in the
                     * model's pair, each D type once: its references are
                     * most of the test's time */
                    if (k > 8192 && (pr > 0 || mode != 1 + o % 2))
                        continue;
                    weft_matmul_desc desc = tn(m, n, k, 16, 16 * (n_case & 1));
                    desc.type = OUT[o], desc.in_type = PAIRS[pr][0];
                    desc.in_type_b = PAIRS[pr][1];
                    desc.scale_a_mode = desc.scale_b_mode = (weft_matmul_scale)mode;
                    desc.act = (weft_matmul_act)(n_case % 4);
                    desc.alpha = n_case % 3 == 2 ? -0.5f : 0.0f;
                    /* a half D ends at 65504: sums of thousands of codes up
                     * to 16, scaled by up to 64, reach 1e5; alpha keeps
                     * them inside */
                    if (OUT[o] == WEFT_DTYPE_F16)
                        desc.alpha = n_case % 3 == 2 ? -1.0f / 32 : 1.0f / 16;
                    int with_c = n_case % 3 != 0;
                    if (with_c)
                        desc.beta = 0.75f;
                    /* an fp32 D takes a bf16 bias, which is cuBLASLt's */
                    int with_bias = OUT[o] != WEFT_DTYPE_F32 && n_case % 2 == 0;
                    desc.batch = batch;
                    if (batch > 1) {
                        desc.stride_a = m * desc.lda + 16, desc.stride_b = 0;
                        desc.ldd = desc.ldc = n + 8;
                        desc.stride_c = desc.stride_d = m * desc.ldd + 8;
                    }
                    qm_case q;
                    qm_make(&q, desc, with_c, with_bias, 0);
                    snprintf(name, sizeof name,
                             "decode %s x %s -> %s %zu x %zu x %zu batch %zu scales %d act %d "
                             "bias %d C %d",
                             NAME[PAIRS[pr][0]], NAME[PAIRS[pr][1]], NAME[OUT[o]], m, n, k, batch,
                             mode, (int)desc.act, with_bias, with_c);
                    gpu_case(name, &q, 0, 0, SKINNY);
                    qm_free(&q);
                }
    no_case_failed();
}

static void test_fp8_d_saturates_and_amax_is_taken_before_the_scale(void **state)
{
    (void)state;
    char name[160];
    for (int o = 0; o < 2; o++)
        for (int batch = 1; batch <= 2; batch++) {
            weft_matmul_desc desc = tn(80, 64, 256, 16, 0);
            desc.type = F8[o], desc.in_type = WEFT_DTYPE_F8_E4M3, desc.in_type_b = F8[o];
            desc.scale_a_mode = desc.scale_b_mode = WEFT_MATMUL_SCALE_TENSOR;
            desc.act = WEFT_MATMUL_ACT_RELU;
            desc.batch = (size_t)batch, desc.ldd = 80, desc.stride_d = 80 * 80 + 16;
            desc.stride_a = 80 * 256;
            qm_case q;
            qm_make(&q, desc, 1, 1, 4 * qm_max_finite(F8[o]));
            snprintf(name, sizeof name, "%s D saturating, batch %d", NAME[F8[o]], batch);
            gpu_case(name, &q, 0, 1, CUBLASLT);
            qm_free(&q);
        }
    no_case_failed();
}

/* ---- INT8 -------------------------------------------------------------- */

static void test_int8_exact_into_int32(void **state)
{
    (void)state;
    static const size_t SHAPES[][3] = {{1, 4, 4},       {1, 20, 36},   {17, 4, 4},
                                       {33, 16, 128},   {128, 36, 20}, {128, 128, 128},
                                       {260, 300, 1028}};
    char name[160];
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
        for (int batch = 1; batch <= 2; batch++) {
            size_t m = SHAPES[s][0], n = SHAPES[s][1], k = SHAPES[s][2];
            weft_matmul_desc desc = tn(m, n, k, 4, 4 * (s & 1));
            desc.type = WEFT_DTYPE_I32, desc.in_type = WEFT_DTYPE_I8;
            desc.batch = (size_t)batch, desc.ldd = round_up(n, 4) + 4 * (s & 1);
            desc.stride_a = m * desc.lda + 4, desc.stride_b = s & 1 ? 0 : n * desc.ldb;
            desc.stride_d = m * desc.ldd + 8;
            qm_case q;
            qm_make(&q, desc, 0, 0, 0);
            snprintf(name, sizeof name, "int8 -> int32 %zu x %zu x %zu batch %d", m, n, k, batch);
            gpu_case(name, &q, 0, 0, CUBLASLT);
            qm_free(&q);
        }
    /* the extremes: sums of (-128)(-128) up to 2^31 - 2^16 */
    weft_matmul_desc desc = tn(8, 8, 131068, 4, 0);
    desc.type = WEFT_DTYPE_I32, desc.in_type = WEFT_DTYPE_I8;
    qm_case q;
    qm_make(&q, desc, 0, 0, 0);
    memset(q.a, 0x80, q.na);
    memset(q.b, 0x80, q.nb);
    ((int8_t *)q.b)[5] = 127;
    gpu_case("int8 extremes", &q, 0, 0, CUBLASLT);
    qm_free(&q);
    no_case_failed();
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
                        weft_matmul_desc desc = tn(65, 36, 132, 4, 4);
                        desc.type = OUT[o], desc.in_type = WEFT_DTYPE_I8;
                        desc.scale_a_mode = (weft_matmul_scale)ma;
                        desc.scale_b_mode = (weft_matmul_scale)mb;
                        desc.act = (weft_matmul_act)act;
                        desc.alpha = extra == 1 ? 0.25f : 0.0f;
                        if (extra >> 1)
                            desc.beta = -1.5f;
                        int with_aux = act >= WEFT_MATMUL_ACT_GELU_TANH && extra == 3;
                        if (with_aux)
                            desc.ldaux = 40;
                        desc.batch = 2, desc.stride_a = 65 * desc.lda, desc.stride_b = 0;
                        desc.ldd = 44, desc.stride_d = 65 * 44 + 4;
                        desc.stride_c = 65 * 36, desc.stride_aux = 65 * 40 + 8;
                        qm_case q;
                        qm_make(&q, desc, extra >> 1, extra & 1, 0);
                        size_t ns = ma == 2 ? desc.m : 1;
                        for (size_t i = 0; i < ns; i++)
                            q.sa[i] *= 0x1p-9f;
                        snprintf(name, sizeof name,
                                 "int8 -> %s scales %d/%d act %d bias %d C %d aux %d", NAME[OUT[o]],
                                 ma, mb, act, extra & 1, extra >> 1, with_aux);
                        gpu_case(name, &q, with_aux, 0, CUBLASLT);
                        qm_free(&q);
                    }
    no_case_failed();
}

/* In place (C = D), and captured into a graph (the pooled int32 buffer
 * becomes graph memory nodes) then replayed twice. */
static void test_int8_dequantized_in_place_and_captured(void **state)
{
    (void)state;
    weft_matmul_desc desc = tn(96, 40, 256, 4, 0);
    desc.type = WEFT_DTYPE_BF16, desc.in_type = WEFT_DTYPE_I8;
    desc.scale_a_mode = desc.scale_b_mode = WEFT_MATMUL_SCALE_OUTER;
    desc.act = WEFT_MATMUL_ACT_GELU_ERF;
    qm_case q;
    qm_make(&q, desc, 1, 1, 0);
    dev_case x = to_device(&q);
    weft_matmul_desc gd = device_desc(&q, &x);

    /* in place: D is a copy of C */
    void *dd = upload(q.c, q.nc * 2);
    assert_int_equal(weft_matmul(stream, &gd, dd, x.a, x.b, dd), WEFT_OK);
    assert_cuda(cudaStreamSynchronize(stream));
    void *got = gt_download(dd, q.nd * 2);
    size_t bad = qm_check("int8 in place", &q, got, NULL, NULL, 0.0, act_slack(&q));
    free(got);
    if (bad)
        fail_msg("in place: %zu elements out of bounds", bad);

    /* captured, replayed twice into a poisoned D */
    void *pd = mm_poisoned(WEFT_DTYPE_BF16, q.nd);
    void *dd2 = upload(pd, q.nd * 2);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = weft_matmul(stream, &gd, dd2, x.a, x.b, x.c);
    assert_cuda(cudaStreamEndCapture(stream, &graph));
    if (rc != WEFT_OK)
        fail_msg("captured: weft_matmul returned %d: %s", rc, weft_last_error());
    assert_cuda(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; rep++) {
        assert_cuda(gt_copy_in(dd2, pd, q.nd * 2));
        assert_cuda(cudaGraphLaunch(exec, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        got = gt_download(dd2, q.nd * 2);
        bad = qm_check("int8 captured", &q, got, NULL, NULL, 0.0, act_slack(&q));
        free(got);
        if (bad)
            fail_msg("captured, replay %d: %zu elements out of bounds", rep, bad);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(dd), cudaFree(dd2);
    free(pd);
    free_device(&x);
    qm_free(&q);
}

/* ---- refusals -------------------------------------------------------------- */

static void test_bad_layouts_are_refused_before_launch(void **state)
{
    (void)state;
    char *buf = NULL;
    float *scales = NULL;
    assert_cuda(cudaMalloc((void **)&buf, 3 * 4096));
    assert_cuda(cudaMalloc((void **)&scales, 64 * sizeof(float)));
    assert_cuda(gt_memset(buf, 0x5a, 3 * 4096));
    char *a = buf, *b = buf + 4096, *dd = buf + 8192;
    weft_matmul_desc f8 = tn(16, 16, 32, 16, 0);
    f8.type = WEFT_DTYPE_BF16, f8.in_type = WEFT_DTYPE_F8_E4M3;
    f8.scale_a_mode = f8.scale_b_mode = WEFT_MATMUL_SCALE_TENSOR;
    f8.scale_a = scales, f8.scale_b = scales;
    weft_matmul_desc x = f8;
    x.trans_b = 0;
    assert_rc(weft_matmul(stream, &x, dd, a, b, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "TN layout"));
    x = f8, x.in_type = x.in_type_b = WEFT_DTYPE_F8_E5M2;
    assert_rc(weft_matmul(stream, &x, dd, a, b, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "E5M2 x E5M2"));
    x = f8, x.lda = 40;
    assert_rc(weft_matmul(stream, &x, dd, a, b, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "multiples of 16"));
    x = f8, x.in_type = WEFT_DTYPE_I8, x.scale_a_mode = WEFT_MATMUL_SCALE_NONE;
    assert_rc(weft_matmul(stream, &x, dd, a, b, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "need scale_a and scale_b"));
    x = f8, x.in_type = WEFT_DTYPE_I8, x.k = 30;
    assert_rc(weft_matmul(stream, &x, dd, a, b, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "n and k multiples of 4"));
    assert_cuda(cudaStreamSynchronize(stream));
    unsigned char *h = gt_download(dd, 4096);
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(h[i], 0x5a);
    free(h);
    cudaFree(buf), cudaFree(scales);
}

/* ---- main ------------------------------------------------------------------ */

static int setup(void **state)
{
    (void)state;
    mm_rng_state = gt_rng(41);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.matmul_quant");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_layouts_are_refused_before_launch),
        cmocka_unit_test(test_fp8_every_pair_output_scale_mode_and_epilogue),
        cmocka_unit_test(test_fp8_awkward_shapes_and_batches),
        cmocka_unit_test(test_fp8_decode_rows_take_the_skinny_kernel),
        cmocka_unit_test(test_fp8_d_saturates_and_amax_is_taken_before_the_scale),
        cmocka_unit_test(test_int8_exact_into_int32),
        cmocka_unit_test(test_int8_dequantized_every_scale_mode_and_epilogue),
        cmocka_unit_test(test_int8_dequantized_in_place_and_captured),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
