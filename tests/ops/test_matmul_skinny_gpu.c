/*
 * test_matmul_skinny_gpu.c - weft_matmul's skinny kernel (decode: m <= 32
 * rows times a Linear weight) against the float64 loop of matmul_ref.h,
 * on fresh random data: m 1, 2, 3, 7, 16, 17, 32 and 33 (which cuBLASLt
 * takes), k 1, 7, 64, 4096 and 4100, n 1, 13, 256 and 14336, bf16 and fp16 operands,
 * D in their type or fp32; every epilogue (alpha, bias, beta C, ReLU, both
 * GELUs, aux); the residual in place; strided and shared batches; padded
 * rows whose padding holds NaN (never read); pointers, leading dimensions
 * and batch strides that break 16-byte loads, which must go to cuBLASLt
 * and still be right; calls captured into a CUDA graph and replayed;
 * products launched while the RMSNorm that writes their A still runs
 * (b_constant on, and off for half the decode shapes). A
 * small n with a long k (k >= 2048 over fewer tiles than SMs) runs as
 * clusters of blocks sharing a tile's k: the n = 1, 13 and 256 cases at
 * k = 4096 and 4100, the in-place ones, a batched one and a captured one.
 * Each call's path is asserted (weft__matmul_cuda_skinny_calls), so a
 * case meant for the kernel cannot pass on cuBLASLt.
 *
 * Bound, element by element (D and aux poisoned first: every element
 * written, the padding kept; the operands' row padding NaN where the
 * kernel is meant to run): the sum's error for fp32 sums of k terms
 * in any order, 4 (k + 4) 2^-24 times the size of the terms (the tensor
 * cores' accumulation rounds less carefully than the host's), plus half
 * a unit of D's type at the result, plus the activation's own error on
 * the GPU (activations.cuh: 1e-5 relative, and for the erf GELU the fit
 * of D's type, 3e-5 for fp16 and 7.4e-4 for bf16). A call that went to
 * cuBLASLt is allowed what that path does differently (test_matmul_gpu.c
 * holds it to its own bounds): 1e-3 for its GELU, and the rounding of
 * alpha AB + beta C to D's type before its epilogue adds the bias and
 * applies the activation (half a unit of the terms' size, times GELU's
 * slope of at most 1.13).
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/matmul.h"
#include "ops/matmul_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static const weft_dtype TYPES[] = {WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

static const char *type_name(weft_dtype t)
{
    return t == WEFT_DTYPE_BF16 ? "bf16" : t == WEFT_DTYPE_F16 ? "fp16" : "fp32";
}

static size_t round8(size_t x)
{
    return (x + 7) / 8 * 8;
}

/* ---- the check ------------------------------------------------------------ */

static double act_error(const weft_matmul_desc *d, int via_cublaslt)
{
    int gelu = d->act == WEFT_MATMUL_ACT_GELU_TANH || d->act == WEFT_MATMUL_ACT_GELU_ERF;
    if (via_cublaslt && gelu)
        return 1e-3;
    if (d->act != WEFT_MATMUL_ACT_GELU_ERF)
        return 1e-5;
    return d->type == WEFT_DTYPE_BF16 ? 7.4e-4 + 1e-5 : d->type == WEFT_DTYPE_F16 ? 4e-5 : 1e-5;
}

/* D (and aux) of a call against float64; d holds the host's bias. Returns
 * the number of bad elements, the first few printed. */
static size_t check(const char *name, const weft_matmul_desc *d, const void *a, const void *b,
                    const void *c, const void *out, const void *aux, int check_padding,
                    int via_cublaslt)
{
    mm_geom g = mm_geometry(d);
    double tol = 4.0 * ((double)d->k + 4) * 0x1p-24, half = mm_half_ulp(d->type);
    double sub = d->type == WEFT_DTYPE_F16 ? 0x1p-25 : 1e-30; /* half fp16's subnormal step */
    unsigned char *written = calloc(g.nd + g.naux + 2, 1);
    size_t bad = 0;
    assert_non_null(written);

    for (size_t bt = 0; bt < g.batch; bt++)
        for (size_t i = 0; i < d->m; i++)
            for (size_t j = 0; j < d->n; j++) {
                mm_ref r = mm_reference(d, &g, a, b, c, bt, i, j);
                size_t id = bt * d->stride_d + i * g.ldd + j;
                double got = weft__load(d->type, out, id);
                double lim =
                    1.2 * tol * r.s + (half + act_error(d, via_cublaslt)) * fabs(r.y) + sub;
                if (via_cublaslt) /* alpha AB + beta C rounded to D's type before the
                                   * epilogue's bias and activation (slope at most 1.13) */
                    lim += 1.13 * half * r.s + sub;
                written[id] = 1;
                if (!(fabs(got - r.y) <= lim) && bad++ < 5)
                    printf("  %s: D[%zu][%zu][%zu] = %.9g, want %.9g (+-%.3g)\n", name, bt, i, j,
                           got, r.y, lim);
                if (aux) {
                    size_t ix = bt * d->stride_aux + i * g.ldaux + j;
                    double gp = weft__load(d->type, aux, ix);
                    double lp = 1.2 * tol * r.s + (half + 1e-6) * fabs(r.p) + sub;
                    if (via_cublaslt) /* the same rounding before the bias */
                        lp += half * r.s + sub;
                    written[g.nd + ix] = 1;
                    if (!(fabs(gp - r.p) <= lp) && bad++ < 5)
                        printf("  %s: aux[%zu][%zu][%zu] = %.9g, want %.9g (+-%.3g)\n", name, bt, i,
                               j, gp, r.p, lp);
                }
            }
    for (size_t x = 0; check_padding && x < g.nd; x++)
        if (!written[x] && !mm_poison_kept(d->type, out, x) && bad++ < 5)
            printf("  %s: D's padding element %zu was written\n", name, x);
    for (size_t x = 0; aux && x < g.naux; x++)
        if (!written[g.nd + x] && !mm_poison_kept(d->type, aux, x) && bad++ < 5)
            printf("  %s: aux's padding element %zu was written\n", name, x);
    free(written);
    return bad;
}

/* ---- one case ------------------------------------------------------------- */

/* Device copies: each buffer's start is `offset` bytes past an aligned
 * allocation (to break 16-byte loads on purpose). */
static void *upload(const void *h, size_t bytes, size_t offset, void **base)
{
    char *p = NULL;
    assert_cuda(cudaMalloc((void **)&p, bytes + offset + 16));
    assert_cuda(gt_copy_in(p + offset, h, bytes));
    *base = p;
    return p + offset;
}

/* Every element of a 16-bit operand outside its matrices (each row's
 * padding, the gaps between batches) made NaN: a kernel that reads past k
 * or across a batch would carry it into D. */
static void nan_padding(weft_dtype t, void *p, size_t n, size_t batch, size_t stride, size_t rows,
                        size_t ld, size_t cols)
{
    uint16_t nan = t == WEFT_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
    unsigned char *inside = calloc(n, 1);
    assert_non_null(inside);
    for (size_t bt = 0; bt < batch; bt++)
        for (size_t r = 0; r < rows; r++)
            memset(inside + bt * stride + r * ld, 1, cols);
    for (size_t x = 0; x < n; x++)
        if (!inside[x])
            ((uint16_t *)p)[x] = nan;
    free(inside);
}

typedef struct options {
    int with_c, in_place, with_bias, with_aux;
    size_t off_a, off_b; /* bytes past 16-byte alignment */
    int skinny;          /* the path the call must take */
} options;

static unsigned failed_cases;

/* Runs desc (A as stored, B transposed) on fresh operands and checks it;
 * a failing case is listed and counted, the test fails at its end. */
static void run_case(const char *name, weft_matmul_desc desc, options o)
{
    mm_geom g = mm_geometry(&desc);
    size_t es = weft__dtype_size(desc.type), ei = weft__dtype_size(g.in_type);
    /* Pre-activations near 1, where the GELUs bend. */
    double scale = 1.7 / pow((double)desc.k, 0.25);
    void *a = mm_random(g.in_type, g.na, scale), *b = mm_random(g.in_type, g.nb, scale);
    if (o.skinny) { /* cuBLASLt's reads past a row are not this test's subject */
        nan_padding(g.in_type, a, g.na, g.batch, desc.stride_a, g.a_rows, g.lda, g.a_cols);
        nan_padding(g.in_type, b, g.nb, g.batch, desc.stride_b, g.b_rows, g.ldb, g.b_cols);
    }
    size_t nc = o.in_place ? g.nd : g.nc;
    void *c = o.with_c ? mm_random(desc.type, nc, 1.0) : NULL;
    void *bias = o.with_bias ? mm_random(desc.type, desc.n, 1.0) : NULL;
    void *pd = mm_poisoned(desc.type, g.nd), *paux = mm_poisoned(desc.type, g.naux);

    void *ba, *bb, *bc = NULL, *bd = NULL, *bbias = NULL, *baux = NULL;
    void *da = upload(a, g.na * ei, o.off_a, &ba), *db = upload(b, g.nb * ei, o.off_b, &bb);
    void *dc = c ? upload(c, nc * es, 0, &bc) : NULL;
    void *dd = o.in_place ? dc : upload(pd, g.nd * es, 0, &bd);
    void *dbias = bias ? upload(bias, desc.n * es, 0, &bbias) : NULL;
    void *daux = o.with_aux ? upload(paux, g.naux * es, 0, &baux) : NULL;

    weft_matmul_desc gd = desc;
    gd.bias = dbias, gd.aux = daux;
    unsigned long long before = weft__matmul_cuda_skinny_calls();
    int rc = weft_matmul(stream, &gd, dd, da, db, dc);
    if (rc != WEFT_OK)
        fail_msg("%s: weft_matmul returned %d: %s", name, rc, weft_last_error());
    int took = weft__matmul_cuda_skinny_calls() != before;
    assert_cuda(cudaStreamSynchronize(stream));
    void *got = gt_download(dd, g.nd * es);
    void *got_aux = o.with_aux ? gt_download(daux, g.naux * es) : NULL;

    weft_matmul_desc rd = desc;
    rd.bias = bias;
    size_t bad = check(name, &rd, a, b, c, got, got_aux, !o.in_place, !took);
    printf("  %-58s %s%s\n", name, took ? "skinny" : "cuBLASLt", bad ? "  FAILED" : "");
    if (took != o.skinny) {
        printf("  FAILED %s: went to %s, not %s\n", name, took ? "the skinny kernel" : "cuBLASLt",
               o.skinny ? "the skinny kernel" : "cuBLASLt");
        bad++;
    }
    if (bad) {
        printf("  FAILED %s: %zu bad (m %zu n %zu k %zu batch %zu, lda %zu ldb %zu ldd %zu)\n",
               name, bad, desc.m, desc.n, desc.k, g.batch, g.lda, g.ldb, g.ldd);
        failed_cases++;
    }
    cudaFree(ba), cudaFree(bb), cudaFree(bc), cudaFree(bd), cudaFree(bbias), cudaFree(baux);
    free(a), free(b), free(c), free(bias), free(pd), free(paux), free(got), free(got_aux);
}

static void no_case_failed(void)
{
    unsigned n = failed_cases;
    failed_cases = 0;
    if (n)
        fail_msg("%u cases failed (each listed above)", n);
}

/* ---- the tests ---------------------------------------------------------- */

/* Every m, k and n of decode's range, the epilogue varied from case to
 * case. Rows are padded to whole 16 bytes (padding NaN) so the kernel
 * takes every k; m = 33 goes to cuBLASLt. The float64 reference is k
 * multiply-adds an element, so the largest shapes run in one type. */
static void test_decode_shapes_match_float64(void **state)
{
    (void)state;
    static const size_t MS[] = {1, 2, 3, 7, 16, 17, 32, 33}, KS[] = {1, 7, 64, 4096, 4100},
                        NS[] = {1, 13, 256, 14336};
    unsigned idx = 0;
    char name[128];
    for (size_t mi = 0; mi < sizeof MS / sizeof *MS; mi++)
        for (size_t ki = 0; ki < 5; ki++)
            for (size_t ni = 0; ni < 4; ni++)
                for (int t = 0; t < 2; t++) {
                    size_t m = MS[mi], k = KS[ki], n = NS[ni];
                    double work = (double)m * (double)n * (double)k;
                    int big = m == 16 && k >= 4096 && n == 14336; /* the decode shape itself */
                    if (big ? (k == 4096) == t : work > (double)(1 << 26))
                        continue; /* 4096 in bf16, 4100 in fp16 */
                    unsigned v = idx++;
                    weft_matmul_desc d = {.m = m,
                                          .n = n,
                                          .k = k,
                                          .type = v % 6 == 5 ? WEFT_DTYPE_F32 : TYPES[t],
                                          .in_type = TYPES[t],
                                          .trans_b = 1,
                                          .lda = round8(k) + (v % 2) * 8,
                                          .ldb = round8(k),
                                          .alpha = v % 7 == 0 ? 0.5f : 0.0f,
                                          .beta = v % 5 == 3 ? -0.75f : 0.0f,
                                          .act = (weft_matmul_act)(v % 4),
                                          .b_constant = (int)(v % 2)};
                    options o = {.with_c = v % 5 == 1 || v % 5 == 3,
                                 .with_bias = v % 3 != 0,
                                 .skinny = m <= 32};
                    if (d.act >= WEFT_MATMUL_ACT_GELU_TANH && v % 8 >= 4) {
                        o.with_aux = 1;
                        d.ldaux = round8(n);
                    }
                    snprintf(name, sizeof name, "m %zu k %zu n %zu %s->%s act %d%s%s%s", m, k, n,
                             type_name(d.in_type), type_name(d.type), (int)d.act,
                             o.with_bias ? " bias" : "", o.with_c ? " C" : "",
                             o.with_aux ? " aux" : "");
                    run_case(name, d, o);
                }
    no_case_failed();
}

/* Every epilogue, operand type and D type on one shape, with a padded D;
 * the residual with alpha and beta. */
static void test_every_epilogue_matches_float64(void **state)
{
    (void)state;
    char name[128];
    for (int t = 0; t < 2; t++)
        for (int f32 = 0; f32 < 2; f32++)
            for (int act = 0; act < 4; act++)
                for (int parts = 0; parts < 4; parts++) {
                    weft_matmul_desc d = {.m = parts % 2 ? 12 : 5,
                                          .n = 200,
                                          .k = 520,
                                          .type = f32 ? WEFT_DTYPE_F32 : TYPES[t],
                                          .in_type = TYPES[t],
                                          .trans_b = 1,
                                          .ldd = 208,
                                          .ldc = 200,
                                          .alpha = 0.75f,
                                          .beta = -0.5f,
                                          .act = (weft_matmul_act)act};
                    options o = {.with_bias = parts & 1, .with_c = parts >> 1, .skinny = 1};
                    if (act >= WEFT_MATMUL_ACT_GELU_TANH && parts != 2) {
                        o.with_aux = 1;
                        d.ldaux = 216;
                    }
                    snprintf(name, sizeof name, "%s->%s act %d%s%s%s m %zu", type_name(TYPES[t]),
                             type_name(d.type), act, o.with_bias ? " bias" : "",
                             o.with_c ? " C" : "", o.with_aux ? " aux" : "", d.m);
                    run_case(name, d, o);
                }
    no_case_failed();
}

/* C is D: each element of C read before the same element of D is written. */
static void test_residual_in_place_and_aux(void **state)
{
    (void)state;
    char name[128];
    for (int t = 0; t < 2; t++)
        for (int act = 0; act < 4; act++) {
            weft_matmul_desc d = {.m = 16,
                                  .n = 256,
                                  .k = 4096,
                                  .type = TYPES[t],
                                  .trans_b = 1,
                                  .ldd = 264,
                                  .ldc = 264,
                                  .act = (weft_matmul_act)act};
            options o = {.with_c = 1, .in_place = 1, .with_bias = 1, .skinny = 1};
            if (act >= WEFT_MATMUL_ACT_GELU_TANH) {
                o.with_aux = 1;
                d.ldaux = 256;
            }
            snprintf(name, sizeof name, "%s in place act %d%s", type_name(TYPES[t]), act,
                     o.with_aux ? " aux" : "");
            run_case(name, d, o);
        }
    no_case_failed();
}

/* Strided batches: A, C, D and aux per batch, B per batch or shared
 * (stride 0). */
static void test_batches_match_float64(void **state)
{
    (void)state;
    char name[128];
    for (int t = 0; t < 2; t++)
        for (int shared = 0; shared < 3; shared++) {
            size_t k = shared == 2 ? 4096 : 264; /* 4096: clusters of 4 on 7 tiles x 3 */
            weft_matmul_desc d = {.m = 7,
                                  .n = 100,
                                  .k = k,
                                  .type = TYPES[t],
                                  .trans_b = 1,
                                  .batch = 3,
                                  .lda = k + 8,
                                  .stride_a = 7 * (k + 8) + 16,
                                  .stride_b = shared == 1 ? 0 : 100 * k + 8,
                                  .stride_c = 7 * 100,
                                  .stride_d = 7 * 104,
                                  .ldd = 104,
                                  .ldaux = 104,
                                  .stride_aux = 7 * 104 + 8,
                                  .act = WEFT_MATMUL_ACT_GELU_ERF};
            options o = {.with_c = 1, .with_bias = 1, .with_aux = 1, .skinny = 1};
            snprintf(name, sizeof name, "%s batch 3 k %zu%s", type_name(TYPES[t]), k,
                     shared == 1 ? " B shared" : "");
            run_case(name, d, o);
        }
    no_case_failed();
}

/* What breaks a 16-byte load goes to cuBLASLt and is right there: A or B
 * 2 or 8 bytes off, rows of an odd length, a batch stride off. */
static void test_unaligned_calls_fall_back_and_match(void **state)
{
    (void)state;
    const weft_matmul_desc base = {
        .m = 3, .n = 256, .k = 4096, .type = WEFT_DTYPE_BF16, .trans_b = 1};
    weft_matmul_desc d = base;
    run_case("aligned (the kernel)", d, (options){.with_bias = 1, .skinny = 1});
    run_case("A 2 bytes off", d, (options){.with_bias = 1, .off_a = 2});
    run_case("B 8 bytes off", d, (options){.with_bias = 1, .off_b = 8});
    d.k = 4100;
    run_case("k 4100 packed rows", d, (options){.with_bias = 1});
    d.lda = 4104;
    run_case("k 4100 packed B", d, (options){.with_bias = 1});
    d = base, d.ldb = 4100;
    run_case("ldb 4100", d, (options){.with_bias = 1});
    d = base, d.m = 1, d.k = 4100, d.ldb = 4104;
    run_case("m 1 with a packed A of 4100", d, (options){.with_bias = 1, .skinny = 1});
    d = base, d.batch = 2, d.stride_a = 3 * 4096 + 4, d.stride_d = 3 * 256;
    run_case("A's batch stride off", d, (options){.with_c = 1});
    d = base, d.type = WEFT_DTYPE_F16, d.trans_b = 0;
    run_case("B not transposed", d, (options){.with_bias = 1});
    no_case_failed();
}

/* The kernel captured into a CUDA graph (nothing allocated at capture)
 * computes the same when the graph is launched, twice: n = 14336 as one
 * block a tile, n = 256 as clusters. */
static void captured_case(size_t n)
{
    weft_matmul_desc d = {.m = 4,
                          .n = n,
                          .k = 4096,
                          .type = WEFT_DTYPE_BF16,
                          .trans_b = 1,
                          .act = WEFT_MATMUL_ACT_GELU_TANH};
    mm_geom g = mm_geometry(&d);
    double scale = 1.7 / pow((double)d.k, 0.25);
    void *a = mm_random(d.type, g.na, scale), *b = mm_random(d.type, g.nb, scale);
    void *bias = mm_random(d.type, d.n, 1), *pd = mm_poisoned(d.type, g.nd);
    void *ba, *bb, *bbias, *bd;
    void *da = upload(a, g.na * 2, 0, &ba), *db = upload(b, g.nb * 2, 0, &bb);
    void *dbias = upload(bias, d.n * 2, 0, &bbias), *dd = upload(pd, g.nd * 2, 0, &bd);
    weft_matmul_desc gd = d;
    gd.bias = dbias;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    unsigned long long before = weft__matmul_cuda_skinny_calls();
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = weft_matmul(stream, &gd, dd, da, db, NULL);
    assert_cuda(cudaStreamEndCapture(stream, &graph));
    assert_ok(rc);
    assert_int_equal(weft__matmul_cuda_skinny_calls() - before, 1);
    assert_cuda(cudaGraphInstantiate(&exec, graph, 0));
    d.bias = bias;
    for (int i = 0; i < 2; i++) {
        assert_cuda(gt_copy_in(dd, pd, g.nd * 2));
        assert_cuda(cudaGraphLaunch(exec, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        void *got = gt_download(dd, g.nd * 2);
        size_t bad = check("captured", &d, a, b, NULL, got, NULL, 1, 0);
        free(got);
        if (bad)
            fail_msg("n %zu, replay %d: %zu bad elements", n, i, bad);
    }
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    free(a), free(b), free(bias), free(pd);
    cudaFree(ba), cudaFree(bb), cudaFree(bbias), cudaFree(bd);
}

static void test_a_captured_call_replays_right(void **state)
{
    (void)state;
    captured_case(14336);
    captured_case(256);
}

/* The kernel starts before the kernel ahead of it on the stream has ended
 * (programmatic dependent launch; with b_constant it reads B at once): each
 * product here follows the RMSNorm that writes its A into a buffer holding
 * NaN, so a product that read A early has NaN or the wrong values. Run as
 * enqueued, then captured into a graph and replayed over fresh poison. */
enum { CHAIN = 6, CHAIN_K = 4096, CHAIN_N = 2048 };

static void norm_then_product(cudaStream_t s, const weft_matmul_desc *d, void *const *da,
                              void *const *dd, const void *dx, const void *dw, const void *db)
{
    for (int i = 0; i < CHAIN; i++) {
        const char *x = (const char *)dx + (size_t)i * d->m * CHAIN_K * 2;
        assert_ok(weft_rmsnorm(s, WEFT_DTYPE_BF16, da[i], NULL, x, NULL, dw, 1e-6f, d->m, CHAIN_K,
                               CHAIN_K));
        assert_ok(weft_matmul(s, d, dd[i], da[i], db, NULL));
    }
}

static size_t check_chain(const char *how, const weft_matmul_desc *d, void *const *da,
                          void *const *dd, const void *b)
{
    size_t bad = 0;
    for (int i = 0; i < CHAIN; i++) {
        void *a = gt_download(da[i], d->m * CHAIN_K * 2),
             *got = gt_download(dd[i], d->m * CHAIN_N * 2);
        char name[64];
        snprintf(name, sizeof name, "m %zu %s, product %d", d->m, how, i);
        bad += check(name, d, a, b, NULL, got, NULL, 1, 0);
        free(a), free(got);
    }
    return bad;
}

static void chain_case(size_t m)
{
    weft_matmul_desc d = {
        .m = m, .n = CHAIN_N, .k = CHAIN_K, .type = WEFT_DTYPE_BF16, .trans_b = 1, .b_constant = 1};
    size_t na = m * CHAIN_K, nd = m * CHAIN_N;
    void *x = mm_random(d.type, CHAIN * na, 1.0), *w = mm_random(d.type, CHAIN_K, 1.0);
    void *b = mm_random(d.type, (size_t)CHAIN_N * CHAIN_K, 1.0 / sqrt((double)CHAIN_K));
    void *pa = mm_poisoned(d.type, na), *pd = mm_poisoned(d.type, nd);
    void *bx, *bw, *bb, *ba[CHAIN], *bd[CHAIN], *da[CHAIN], *dd[CHAIN];
    void *dx = upload(x, CHAIN * na * 2, 0, &bx), *dw = upload(w, CHAIN_K * 2, 0, &bw);
    void *db = upload(b, (size_t)CHAIN_N * CHAIN_K * 2, 0, &bb);
    for (int i = 0; i < CHAIN; i++)
        da[i] = upload(pa, na * 2, 0, &ba[i]), dd[i] = upload(pd, nd * 2, 0, &bd[i]);

    unsigned long long before = weft__matmul_cuda_skinny_calls();
    norm_then_product(stream, &d, da, dd, dx, dw, db);
    assert_cuda(cudaStreamSynchronize(stream));
    assert_int_equal(weft__matmul_cuda_skinny_calls() - before, CHAIN);
    size_t bad = check_chain("enqueued", &d, da, dd, b);

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    norm_then_product(stream, &d, da, dd, dx, dw, db);
    assert_cuda(cudaStreamEndCapture(stream, &graph));
    assert_cuda(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < CHAIN; i++) {
            assert_cuda(gt_copy_in(da[i], pa, na * 2));
            assert_cuda(gt_copy_in(dd[i], pd, nd * 2));
        }
        assert_cuda(cudaGraphLaunch(exec, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        bad += check_chain(r ? "replayed again" : "replayed", &d, da, dd, b);
    }
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    for (int i = 0; i < CHAIN; i++)
        cudaFree(ba[i]), cudaFree(bd[i]);
    cudaFree(bx), cudaFree(bw), cudaFree(bb);
    free(x), free(w), free(b), free(pa), free(pd);
    if (bad)
        fail_msg("m %zu: %zu bad elements after the norm", m, bad);
}

static void test_a_product_waits_for_the_norm_before_it(void **state)
{
    (void)state;
    chain_case(1);
    chain_case(16);
    chain_case(32);
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
    int skip = gt_start("gpu.matmul_skinny");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_shapes_match_float64),
        cmocka_unit_test(test_every_epilogue_matches_float64),
        cmocka_unit_test(test_residual_in_place_and_aux),
        cmocka_unit_test(test_batches_match_float64),
        cmocka_unit_test(test_unaligned_calls_fall_back_and_match),
        cmocka_unit_test(test_a_captured_call_replays_right),
        cmocka_unit_test(test_a_product_waits_for_the_norm_before_it),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
