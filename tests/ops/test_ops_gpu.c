/*
 * test_ops.c - the operator kernels against their host references.
 *
 * Every op, dtype and awkward shape (rows of 1, 7, 4095, 4097 elements up
 * to 262144; strides with padding; pointers one element off 16-byte
 * alignment, which takes the element-by-element path) runs on fresh random
 * data on the GPU and, on the same inputs, through the host reference (a
 * NULL stream). Device outputs are poisoned before each launch (all-ones
 * bytes, a NaN in every dtype), and afterwards every row element must have
 * been written, the stride padding must be what was uploaded, and the
 * poisoned bytes before and after the tensor untouched.
 *
 * Bounds against the host: fp32 within 1e-5 relative to the magnitude of
 * the terms (times the condition of GELU's tail where it applies); bf16
 * and fp16 additionally one unit in the last place of the result (2^-7 and
 * 2^-10 relative, and fp16's subnormal step 2^-24): the two sides round
 * fp32 values that agree to ~1e-6 and may land on either side of a
 * rounding boundary. Row sums that involve no transcendental (LayerNorm's
 * sum_out) must match bit for bit, and so must dropout masks.
 *
 * Besides: NaN and Inf where the host puts them, in-place calls, bad
 * arguments refused before any launch, the ops on a weft task's stream,
 * and a launch refused after a fault (in a child process) reported with
 * CUDA's error name.
 */
#include <math.h>

#include <cuda_runtime_api.h>

#include "gpu_support/gpu_stream.h"
#include "ops/ops_internal.h"
#include "weft/ops.h"

static const weft_dtype DTYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
static const char *const DTYPE_NAMES[] = {"f32", "bf16", "f16"};

enum { GUARD = 64 }; /* poisoned elements before and after each device tensor */

static cudaStream_t stream;
static weft_runtime *runtime; /* for the test on a task's stream */
static uint64_t rng;

static double dabs(double x)
{
    return x < 0 ? -x : x;
}

static double uniform(double lo, double hi)
{
    return lo + (hi - lo) * (double)(gt_rng_next(&rng) >> 11) * 0x1p-53;
}

/* ---- tensors on both sides ---------------------------------------------- */

/* rows x cols with a stride, on the host (h) and the device (d). The
 * device copy sits GUARD elements into its allocation, plus `skew`
 * elements that knock it off 16-byte alignment. */
typedef struct tens {
    weft_dtype dt;
    size_t rows, cols, stride, n, skew, esize;
    void *h;    /* n elements */
    void *base; /* device allocation: GUARD + skew + n + GUARD elements */
    void *d;    /* base + GUARD + skew elements */
} tens;

static tens tens_new(weft_dtype dt, size_t rows, size_t cols, size_t stride, size_t skew)
{
    tens t = {dt,   rows, cols, stride, (rows - 1) * stride + cols, skew, weft__dtype_size(dt),
              NULL, NULL, NULL};
    t.h = gt_xmalloc(t.n * t.esize);
    assert_cuda(cudaMalloc(&t.base, (2 * GUARD + skew + t.n) * t.esize));
    t.d = (char *)t.base + (GUARD + skew) * t.esize;
    return t;
}

static void tens_free(tens *t)
{
    free(t->h);
    cudaFree(t->base);
    t->h = t->base = t->d = NULL;
}

static int in_row(const tens *t, size_t i)
{
    return i % t->stride < t->cols;
}

static double get(const tens *t, const void *p, size_t r, size_t j)
{
    return weft__load(t->dt, p, r * t->stride + j);
}

/* Random row elements in [lo, hi), rounded to the dtype; the padding gets
 * a NaN so that a kernel reading it would show. */
static void tens_random(tens *t, double lo, double hi)
{
    for (size_t i = 0; i < t->n; i++)
        weft__store(t->dt, t->h, i, in_row(t, i) ? (float)uniform(lo, hi) : NAN);
}

/* cudaMemcpy from pageable memory may return before its DMA reaches the
 * device, and the ops run on non-blocking streams that do not wait for
 * it: a late poison would look like an element the kernel never wrote. */
static void settle(void)
{
    assert_cuda(cudaDeviceSynchronize());
}

/* The device copy := the host's, its guards poisoned. */
static void tens_upload(const tens *t)
{
    assert_cuda(gt_memset(t->base, 0xff, (2 * GUARD + t->skew + t->n) * t->esize));
    assert_cuda(gt_copy_in(t->d, t->h, t->n * t->esize));
    settle();
}

/* The device copy := the host's padding, rows poisoned (an output). */
static void tens_poison(tens *t)
{
    void *img = gt_xmalloc(t->n * t->esize);
    memcpy(img, t->h, t->n * t->esize);
    for (size_t i = 0; i < t->n; i++)
        if (in_row(t, i))
            memset((char *)img + i * t->esize, 0xff, t->esize);
    assert_cuda(gt_memset(t->base, 0xff, (2 * GUARD + t->skew + t->n) * t->esize));
    assert_cuda(gt_copy_in(t->d, img, t->n * t->esize));
    settle();
    free(img);
}

static int is_poison(const tens *t, const void *p, size_t i)
{
    if (t->dt == WEFT_DTYPE_F32)
        return ((const uint32_t *)p)[i] == 0xffffffffu;
    return ((const uint16_t *)p)[i] == 0xffffu;
}

/* The device copy, after checking what lies around the rows: every row
 * element written (if `written`), the padding as the host copy has it, the
 * guards still poisoned. Returns a malloc'd array of n elements. */
static void *tens_download(const tens *t, const char *what, int written)
{
    size_t total = 2 * GUARD + t->skew + t->n;
    unsigned char *all = gt_xmalloc(total * t->esize);
    assert_cuda(cudaMemcpy(all, t->base, total * t->esize, cudaMemcpyDeviceToHost));
    void *got = gt_xmalloc(t->n * t->esize);
    memcpy(got, all + (GUARD + t->skew) * t->esize, t->n * t->esize);

    size_t before = (GUARD + t->skew) * t->esize, after = GUARD * t->esize;
    if (gt_first_not(all, 0xff, before) != before ||
        gt_first_not(all + before + t->n * t->esize, 0xff, after) != after)
        fail_msg("%s: written outside the tensor", what);
    size_t unwritten = 0, padding = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (in_row(t, i))
            unwritten += written && is_poison(t, got, i);
        else
            padding +=
                memcmp((char *)got + i * t->esize, (char *)t->h + i * t->esize, t->esize) != 0;
    }
    free(all);
    if (unwritten || padding)
        fail_msg("%s %s %zux%zu stride %zu: %zu row elements not written, %zu padding elements "
                 "changed",
                 what, DTYPE_NAMES[t->dt], t->rows, t->cols, t->stride, unwritten, padding);
    return got;
}

/* ---- comparing with the host ---------------------------------------------- */

typedef struct cmp {
    const char *what;
    const tens *t;
    size_t bad;
    double worst;
} cmp;

/* got against ref, whose terms have magnitude `scale`, amplified by `cond`. */
static void cmp_one(cmp *c, double got, double ref, double scale, double cond, size_t r, size_t j)
{
    weft_dtype dt = c->t->dt;
    double ulp = dt == WEFT_DTYPE_BF16 ? 0x1p-7 : dt == WEFT_DTYPE_F16 ? 0x1p-10 : 0;
    double floor = dt == WEFT_DTYPE_F16 ? 0x1p-24 : 1e-37;
    double tol = ulp * dabs(ref) + 1e-5 * cond * (dabs(ref) > scale ? dabs(ref) : scale) + floor;

    if (isnan(ref) || isinf(ref)) {
        int ok = isnan(ref) ? isnan(got) : got == ref;
        if (!ok && c->bad++ < 5)
            print_error("%s %s: [%zu][%zu] got %.9g want %.9g\n", c->what, DTYPE_NAMES[dt], r, j,
                        got, ref);
        return;
    }
    double err = dabs(got - ref);
    if (!(err <= tol)) {
        if (c->bad++ < 5)
            print_error("%s %s %zux%zu: [%zu][%zu] got %.9g want %.9g (tol %.3g)\n", c->what,
                        DTYPE_NAMES[dt], c->t->rows, c->t->cols, r, j, got, ref, tol);
    } else if (err / tol > c->worst) {
        c->worst = err / tol;
    }
}

static void cmp_done(const cmp *c)
{
    if (getenv("WEFT_TEST_VERBOSE"))
        printf("  %-18s %-4s %6zux%-6zu worst error %.2f of the bound\n", c->what,
               DTYPE_NAMES[c->t->dt], c->t->rows, c->t->cols, c->worst);
    if (c->bad)
        fail_msg("%s %s %zux%zu: %zu elements out of bounds", c->what, DTYPE_NAMES[c->t->dt],
                 c->t->rows, c->t->cols, c->bad);
}

/* Every element bit for bit (NaNs only as NaNs). */
static void assert_same_bits(const tens *t, const void *got, const void *ref, const char *what)
{
    for (size_t r = 0; r < t->rows; r++)
        for (size_t j = 0; j < t->cols; j++) {
            double g = get(t, got, r, j), w = get(t, ref, r, j);
            if (!(g == w || (isnan(g) && isnan(w))) ||
                (g == 0 && w == 0 && signbit(g) != signbit(w)))
                fail_msg("%s %s: [%zu][%zu] got %a want %a", what, DTYPE_NAMES[t->dt], r, j, g, w);
        }
}

static void sync_ok(void)
{
    assert_cuda(cudaStreamSynchronize(stream));
}

/* How much GELU's fp32 evaluation may be off relative to its value, in
 * units of 1e-5: erfc's argument rounded to fp32 moves erfc by ~x^2 of it,
 * and the tanh form's exp argument is magnified as much in the negative
 * tail. For bf16 results the erf form is a shorter fit, within 7.3e-4 of
 * the GELU: alone it rounds at most one unit off, but a sum with it (the
 * residual add) may be off by that fraction of the GELU's magnitude. */
static double gelu_cond(weft_dtype dt, weft_gelu_form form, double h)
{
    return 4.0 + h * h + (dt == WEFT_DTYPE_BF16 && form == WEFT_GELU_ERF ? 73.0 : 0.0);
}

/* ---- shapes ---------------------------------------------------------------- */

typedef struct shape {
    size_t rows, cols, stride, skew;
} shape;

/* Every layout of rows.cuh and both access paths: a warp per row (with
 * idle warps), blocks per row, clusters of 2 and 8, looping clusters,
 * vectors and single elements. */
static const shape ROW_SHAPES[] = {
    {1, 1, 1, 0},
    {5, 1, 3, 0},
    {3, 7, 7, 0},
    {2, 7, 12, 0},
    {70, 256, 264, 0},
    {64, 1024, 1024, 0},
    {3, 4095, 4095, 0},
    {3, 4097, 4100, 0},
    {4, 4096, 4096, 0},
    {3, 4096, 4096, 1},
    {2, 16384, 16384, 0},
    {2, 65536, 65536, 0},
    {1, 262144, 262144, 0},
    {2, 100000, 100003, 0},
    {2, 65536, 65536, 1},
    {2, 65537, 65544, 0}, /* a cluster of 8 holding a partial vector, threads past the end */
    /* many rows: held at 32 values a thread (the plain norms of half
     * types), and more rows of a block and of a cluster of 2 than the GPU
     * holds at once */
    {270, 256, 256, 0},
    {300, 1024, 1032, 0},
    {300, 4096, 4104, 0},
    {270, 16384, 16392, 0},
    {280, 32768, 32768, 0},
};
enum { NROW_SHAPES = sizeof ROW_SHAPES / sizeof *ROW_SHAPES };

/* A few rows of whole vectors: the held kernels with the call's inputs
 * fixed at compile time. A warp per row, a block per row whose threads'
 * vectors fill the row or run past its end (5120; 12288, packed in half
 * types, and in fp32 at 32 values a thread), and a cluster of 2. */
static const shape HELD_SHAPES[] = {
    {9, 1024, 1032, 0},   {5, 4096, 4096, 0},   {3, 5120, 5128, 0},
    {3, 12288, 12296, 0}, {2, 32768, 32768, 0},
};
enum { NHELD_SHAPES = sizeof HELD_SHAPES / sizeof *HELD_SHAPES };

/* Elementwise ops: the same awkward rows, and enough elements for every
 * thread of the grid to take several chunks. */
static const shape EW_SHAPES[] = {
    {1, 1, 1, 0},         {5, 1, 3, 0},         {3, 7, 7, 0},       {2, 7, 12, 0},
    {3, 4095, 4095, 0},   {3, 4097, 4100, 0},   {4, 4096, 4096, 1}, {1, 262144, 262144, 0},
    {2, 65536, 65544, 0}, {600, 4096, 4104, 0},
};
enum { NEW_SHAPES = sizeof EW_SHAPES / sizeof *EW_SHAPES };

/* Under compute-sanitizer every access is checked in software: the
 * largest shapes would take many minutes and add no path. */
static int skipped_here(shape s)
{
    return gt_sanitizer() && s.rows * s.cols > ((size_t)1 << 17);
}

/* ---- bias + GELU + residual ------------------------------------------------ */

static void run_gelu(weft_dtype dt, weft_gelu_form form, shape s, int with_bias, int with_res)
{
    tens in = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    tens res = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    tens out = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    tens bias = tens_new(dt, 1, s.cols, s.cols, s.skew);
    cmp c = {form == WEFT_GELU_TANH ? "gelu_tanh" : "gelu_erf", &out, 0, 0};

    tens_random(&in, -6, 6);
    tens_random(&res, -2, 2);
    tens_random(&bias, -1, 1);
    tens_random(&out, 0, 1); /* padding */
    tens_upload(&in), tens_upload(&res), tens_upload(&bias), tens_poison(&out);
    const void *bp = with_bias ? bias.d : NULL, *rp = with_res ? res.d : NULL;
    assert_ok(
        weft_bias_gelu_residual(stream, dt, form, out.d, in.d, bp, rp, s.rows, s.cols, s.stride));
    sync_ok();
    void *got = tens_download(&out, c.what, 1);
    assert_ok(weft_bias_gelu_residual(NULL, dt, form, out.h, in.h, with_bias ? bias.h : NULL,
                                      with_res ? res.h : NULL, s.rows, s.cols, s.stride));
    for (size_t r = 0; r < s.rows; r++)
        for (size_t j = 0; j < s.cols; j++) {
            double h = get(&in, in.h, r, j) + (with_bias ? get(&bias, bias.h, 0, j) : 0);
            double rr = with_res ? dabs(get(&res, res.h, r, j)) : 0;
            double ref = get(&out, out.h, r, j);
            cmp_one(&c, get(&out, got, r, j), ref, dabs(ref) + rr, gelu_cond(dt, form, h), r, j);
        }
    cmp_done(&c);
    free(got);
    tens_free(&in), tens_free(&res), tens_free(&out), tens_free(&bias);
}

static void test_bias_gelu_residual_matches_host(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NEW_SHAPES; k++)
            for (int form = 0; form < 2 && !skipped_here(EW_SHAPES[k]); form++)
                run_gelu(DTYPES[d], (weft_gelu_form)form, EW_SHAPES[k], k != 1, k != 2);
}

/* ---- LayerNorm, RMSNorm, and the fused GELU + LayerNorm ----------------- */

enum norm_kind { LAYERNORM, RMSNORM, GELU_LAYERNORM };
static const char *const NORM_NAMES[] = {"layernorm", "rmsnorm", "gelu_layernorm"};

/* form: the fused op's GELU (the others have none) */
static int call_norm(enum norm_kind kind, weft_gelu_form form, void *st, weft_dtype dt, void *out,
                     void *sum_out, const void *in, const void *gb, const void *res, const void *w,
                     const void *b, shape s)
{
    const float eps = 1e-5f;
    switch (kind) {
    case LAYERNORM:
        return weft_layernorm(st, dt, out, sum_out, in, res, w, b, eps, s.rows, s.cols, s.stride);
    case RMSNORM:
        return weft_rmsnorm(st, dt, out, sum_out, in, res, w, eps, s.rows, s.cols, s.stride);
    default:
        return weft_bias_gelu_residual_layernorm(st, dt, form, out, sum_out, in, gb, res, w, b, eps,
                                                 s.rows, s.cols, s.stride);
    }
}

/* What a norm is given besides in, as bits: the weight, the bias, the
 * residual, sum_out (the plain norms' only with the residual), and the
 * fused op's GELU bias. */
enum norm_inputs {
    NORM_WEIGHT = 1,
    NORM_BIAS = 2,
    NORM_ADDED = 4,
    NORM_SUM = 8,
    NORM_INPUTS = 16, /* the combinations of the bits above */
    NORM_GELU_BIAS = 16,
    NORM_BARE = 0,
    NORM_AFFINE = NORM_WEIGHT | NORM_BIAS,
    NORM_NO_SUM = NORM_AFFINE | NORM_ADDED,
    NORM_FULL = NORM_NO_SUM | NORM_SUM,
};

/* inputs: bits of enum norm_inputs. offset moves the
 * rows away from zero. The fused op's GELU form changes
 * with the shape and the dtype, so each shape sees both. */
static void run_norm(enum norm_kind kind, weft_dtype dt, shape s, int inputs, double offset)
{
    weft_gelu_form form = (s.rows + s.cols + (size_t)dt) % 2 ? WEFT_GELU_ERF : WEFT_GELU_TANH;
    tens in = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    tens res = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    tens out = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    tens sum = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    tens gb = tens_new(dt, 1, s.cols, s.cols, s.skew), w = tens_new(dt, 1, s.cols, s.cols, s.skew);
    tens b = tens_new(dt, 1, s.cols, s.cols, s.skew);
    cmp c = {NORM_NAMES[kind], &out, 0, 0}, cs = {"gelu_layernorm x", &sum, 0, 0};
    int fused = kind == GELU_LAYERNORM, with_res = (inputs & NORM_ADDED) != 0;
    int no_sum = !(inputs & NORM_SUM);
    int has_w = (inputs & NORM_WEIGHT) != 0, has_b = (inputs & NORM_BIAS) != 0;
    int has_gb = (inputs & NORM_GELU_BIAS) != 0;
    /* the fused op's reference is the LayerNorm of the x the device
     * formed: without sum_out, a call with it comes first to get x */
    int with_sum = (with_res && !no_sum) || fused;

    assert_true(!(inputs & NORM_SUM) || with_res || fused);
    assert_true(!has_gb || fused);

    tens_random(&in, offset - 2, offset + 2);
    tens_random(&res, -1, 1);
    tens_random(&gb, -1, 1);
    tens_random(&w, -2, 2);
    tens_random(&b, -1, 1);
    tens_random(&out, 0, 1);
    tens_random(&sum, 0, 1);
    tens_upload(&in), tens_upload(&res), tens_upload(&gb), tens_upload(&w), tens_upload(&b);
    tens_poison(&out), tens_poison(&sum);
    assert_ok(call_norm(kind, form, stream, dt, out.d, with_sum ? sum.d : NULL, in.d,
                        has_gb ? gb.d : NULL, with_res ? res.d : NULL, has_w ? w.d : NULL,
                        has_b ? b.d : NULL, s));
    if (fused && no_sum) {
        tens_poison(&out);
        assert_ok(call_norm(kind, form, stream, dt, out.d, NULL, in.d, has_gb ? gb.d : NULL,
                            with_res ? res.d : NULL, has_w ? w.d : NULL, has_b ? b.d : NULL, s));
    }
    sync_ok();
    void *got = tens_download(&out, c.what, 1);
    void *got_sum = tens_download(&sum, "sum_out", with_sum);
    if (!with_sum)
        for (size_t r = 0; r < s.rows; r++)
            for (size_t j = 0; j < s.cols; j++)
                if (!is_poison(&sum, got_sum, r * s.stride + j))
                    fail_msg("%s: sum_out written though NULL", c.what);

    if (fused) {
        /* x against the host's GELU chain; out against the host's
         * LayerNorm of the x the kernel wrote (x may differ in its last
         * place, and LayerNorm would magnify that). */
        assert_ok(weft_bias_gelu_residual(NULL, dt, form, sum.h, in.h, has_gb ? gb.h : NULL,
                                          with_res ? res.h : NULL, s.rows, s.cols, s.stride));
        for (size_t r = 0; r < s.rows; r++)
            for (size_t j = 0; j < s.cols; j++) {
                double h = get(&in, in.h, r, j) + (has_gb ? get(&gb, gb.h, 0, j) : 0);
                double ref = get(&sum, sum.h, r, j);
                double rr = with_res ? dabs(get(&res, res.h, r, j)) : 0;
                cmp_one(&cs, get(&sum, got_sum, r, j), ref, dabs(ref) + rr, gelu_cond(dt, form, h),
                        r, j);
            }
        cmp_done(&cs);
        assert_ok(weft_layernorm(NULL, dt, out.h, NULL, got_sum, NULL, has_w ? w.h : NULL,
                                 has_b ? b.h : NULL, 1e-5f, s.rows, s.cols, s.stride));
    } else {
        assert_ok(call_norm(kind, form, NULL, dt, out.h, with_sum ? sum.h : NULL, in.h, NULL,
                            with_res ? res.h : NULL, has_w ? w.h : NULL, has_b ? b.h : NULL, s));
        if (with_sum) /* fp32 add and one rounding: the same bits */
            assert_same_bits(&sum, got_sum, sum.h, "sum_out");
    }
    for (size_t r = 0; r < s.rows; r++)
        for (size_t j = 0; j < s.cols; j++) {
            double wj = has_w ? dabs(get(&w, w.h, 0, j)) : 1;
            double bj = has_b && kind != RMSNORM ? dabs(get(&b, b.h, 0, j)) : 0;
            double ref = get(&out, out.h, r, j);
            /* an error in the mean moves the result by |w| absolutely */
            cmp_one(&c, get(&out, got, r, j), ref, dabs(ref) + wj + bj, 1, r, j);
        }
    cmp_done(&c);
    free(got), free(got_sum);
    tens_free(&in), tens_free(&res), tens_free(&out), tens_free(&sum);
    tens_free(&gb), tens_free(&w), tens_free(&b);
}

static void test_layernorm_matches_host(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NROW_SHAPES; k++)
            if (!skipped_here(ROW_SHAPES[k]))
                run_norm(LAYERNORM, DTYPES[d], ROW_SHAPES[k], k % 2 == 0 ? NORM_FULL : NORM_BARE,
                         0);
    /* many rows with a weight and bias, under compute-sanitizer too: rows
     * of a block (half types) and of a cluster pushing its statistics
     * (all); the held kernels with them and with a residual but no sum, on
     * rows that fill their threads and on rows that leave some past the end */
    for (int d = 1; d < 3; d++)
        run_norm(LAYERNORM, DTYPES[d], (shape){270, 16384, 16392, 0}, NORM_AFFINE, 0);
    for (int d = 0; d < 3; d++)
        run_norm(LAYERNORM, DTYPES[d], (shape){280, 32768, 32768, 0}, NORM_AFFINE, 0);
    /* the held kernels, fixed at compile time for each call: every
     * combination of weight, bias, residual and sum_out */
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NHELD_SHAPES; k++)
            for (int in = 0; in < NORM_INPUTS; in++)
                if (!(in & NORM_SUM) || (in & NORM_ADDED))
                    run_norm(LAYERNORM, DTYPES[d], HELD_SHAPES[k], in, 0);
    /* far from zero: the corrected two-pass variance on the device too */
    run_norm(LAYERNORM, WEFT_DTYPE_F32, (shape){3, 4097, 4097, 0}, NORM_BARE, 100);
    run_norm(LAYERNORM, WEFT_DTYPE_BF16, (shape){300, 1024, 1024, 0}, NORM_AFFINE, 100);
    run_norm(LAYERNORM, WEFT_DTYPE_F32, (shape){2, 65536, 65536, 0}, NORM_FULL, 30);
}

static void test_rmsnorm_matches_host(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NROW_SHAPES; k++)
            if (!skipped_here(ROW_SHAPES[k]))
                run_norm(RMSNORM, DTYPES[d], ROW_SHAPES[k], k % 2 == 1 ? NORM_FULL : NORM_BARE, 0);
    for (int d = 0; d < 3; d++)
        run_norm(RMSNORM, DTYPES[d], (shape){280, 32768, 32768, 0}, NORM_AFFINE, 0);
    /* calls of more rows than SMs, where half types take the tensor cores'
     * squares at up to 16 values a thread (norm_launch.cuh): rows of whole
     * vectors, with the residual and the sum, with a partial last vector,
     * and a warp each */
    for (int d = 0; d < 3; d++) {
        run_norm(RMSNORM, DTYPES[d], (shape){300, 4096, 4096, 0}, NORM_WEIGHT, 0);
        run_norm(RMSNORM, DTYPES[d], (shape){300, 8192, 8200, 0},
                 NORM_WEIGHT | NORM_ADDED | NORM_SUM, 0);
        run_norm(RMSNORM, DTYPES[d], (shape){300, 4100, 4104, 0}, NORM_WEIGHT, 0);
        run_norm(RMSNORM, DTYPES[d], (shape){300, 512, 512, 0}, NORM_BARE, 0);
    }
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NHELD_SHAPES; k++)
            for (int in = 0; in < NORM_INPUTS; in++)
                if (!(in & NORM_BIAS) && (!(in & NORM_SUM) || (in & NORM_ADDED)))
                    run_norm(RMSNORM, DTYPES[d], HELD_SHAPES[k], in, 0);
}

static void test_bias_gelu_residual_layernorm_matches_host(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NROW_SHAPES; k++)
            if (!skipped_here(ROW_SHAPES[k]))
                run_norm(GELU_LAYERNORM, DTYPES[d], ROW_SHAPES[k],
                         k != 2 ? NORM_FULL | NORM_GELU_BIAS : NORM_BARE, 0);
    /* the held kernels with weight and bias: the GELU bias, the residual
     * and x_out each given or not (those with the residual fixed at
     * compile time, the others checked at run time) */
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NHELD_SHAPES; k++)
            for (int in = NORM_AFFINE; in < NORM_INPUTS + NORM_GELU_BIAS; in++)
                if ((in & NORM_AFFINE) == NORM_AFFINE)
                    run_norm(GELU_LAYERNORM, DTYPES[d], HELD_SHAPES[k], in, 0);
}

/* Calls of more rows than the GPU holds at once, where the held kernels
 * ask L2 for rows ahead of those they hold (norm_held.cuh's held_ahead;
 * on rows under 4096, a warp or two each, short_rows_ahead: past 8448
 * rows), with row strides past the row: a hint, which must leave every
 * output as the host's. */
static void test_norms_asking_for_rows_ahead_match_host(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++) {
        run_norm(RMSNORM, DTYPES[d], (shape){600, 32768, 32776, 0}, NORM_WEIGHT, 0);
        run_norm(LAYERNORM, DTYPES[d], (shape){600, 16384, 16392, 0}, NORM_FULL, 0);
        run_norm(LAYERNORM, DTYPES[d], (shape){600, 32768, 32776, 0}, NORM_AFFINE, 0);
        run_norm(RMSNORM, DTYPES[d], (shape){9000, 1024, 1032, 0}, NORM_WEIGHT, 0);
        run_norm(LAYERNORM, DTYPES[d], (shape){9000, 512, 520, 0}, NORM_FULL, 0);
    }
    run_norm(RMSNORM, WEFT_DTYPE_BF16, (shape){2200, 4096, 4104, 0}, NORM_WEIGHT, 0);
    run_norm(RMSNORM, WEFT_DTYPE_F16, (shape){600, 16384, 16392, 0}, NORM_WEIGHT, 0);
    run_norm(LAYERNORM, WEFT_DTYPE_F32, (shape){9000, 1024, 1032, 0}, NORM_AFFINE, 0);
    run_norm(GELU_LAYERNORM, WEFT_DTYPE_F32, (shape){300, 16384, 16392, 0},
             NORM_FULL | NORM_GELU_BIAS, 0);
}

/* ---- softmax ---------------------------------------------------------------- */

/* Returns the device output (n elements, malloc'd) after checking it
 * against the host. */
static void *run_softmax(weft_dtype dt, shape s, const weft_softmax_opts *o, double range)
{
    tens in = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    tens out = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    cmp c = {o && o->dropout_p > 0 ? "softmax_dropout"
             : o && o->causal_q    ? "softmax_causal"
                                   : "softmax",
             &out, 0, 0};

    tens_random(&in, -range, range);
    tens_random(&out, 0, 1);
    tens_upload(&in), tens_poison(&out);
    assert_ok(weft_softmax(stream, dt, out.d, in.d, s.rows, s.cols, s.stride, o));
    sync_ok();
    void *got = tens_download(&out, c.what, 1);
    assert_ok(weft_softmax(NULL, dt, out.h, in.h, s.rows, s.cols, s.stride, o));
    for (size_t r = 0; r < s.rows; r++)
        for (size_t j = 0; j < s.cols; j++) {
            double ref = get(&out, out.h, r, j), g = get(&out, got, r, j);
            /* a dropped element is exactly 0 on both sides: same mask (the
             * dropout runs' inputs keep every probability far from 0) */
            if (o && o->dropout_p > 0 && (ref == 0) != (g == 0) && c.bad++ < 5)
                print_error("softmax %s: [%zu][%zu] got %.9g want %.9g (mask differs)\n",
                            DTYPE_NAMES[dt], r, j, g, ref);
            cmp_one(&c, g, ref, dabs(ref), 1, r, j);
        }
    cmp_done(&c);
    tens_free(&in), tens_free(&out);
    return got;
}

static void test_softmax_matches_host(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NROW_SHAPES; k++) {
            shape s = ROW_SHAPES[k];
            if (skipped_here(s))
                continue;
            weft_softmax_opts plain = {0}, scaled = {.scale = 0.125f};
            weft_softmax_opts causal = {.scale = 2.0f, .causal_q = s.cols < 5 ? s.cols : 5};
            free(run_softmax(DTYPES[d], s, &plain, 4));
            free(run_softmax(DTYPES[d], s, &scaled, 30));
            free(run_softmax(DTYPES[d], s, &causal, 4));
        }
    free(run_softmax(WEFT_DTYPE_F32, (shape){3, 4097, 4097, 0}, NULL, 4));
    /* many rows of a cluster pushing its statistics, unmasked (one
     * reduction in half types, two in fp32), under compute-sanitizer too */
    for (int d = 0; d < 3; d++) {
        weft_softmax_opts scaled = {.scale = 0.125f};
        free(run_softmax(DTYPES[d], (shape){266, 32768, 32776, 0}, NULL, 4));
        free(run_softmax(DTYPES[d], (shape){266, 32768, 32776, 0}, &scaled, 30));
    }
    /* rows of whole vectors that end before the threads holding them do
     * (a warp's 128 vectors for 125, a block's 1024 for 640): the plain
     * kernel's vectors past the end are -Inf as loaded */
    for (int d = 0; d < 3; d++) {
        weft_softmax_opts scaled = {.scale = 0.125f};
        free(run_softmax(DTYPES[d], (shape){9, 1000, 1000, 0}, NULL, 4));
        free(run_softmax(DTYPES[d], (shape){3, 5120, 5128, 0}, NULL, 4));
        free(run_softmax(DTYPES[d], (shape){3, 5120, 5128, 0}, &scaled, 30));
    }
    /* fp32 rows of 1024, a warp each, past a wave: asking L2 ahead */
    free(run_softmax(WEFT_DTYPE_F32, (shape){9000, 1024, 1032, 0}, NULL, 4));
    /* causal rows as in attention: queries aligned at the end of the keys */
    weft_softmax_opts causal = {.causal_q = 333};
    free(run_softmax(WEFT_DTYPE_BF16, (shape){666, 1000, 1000, 0}, &causal, 4));
    free(run_softmax(WEFT_DTYPE_F32, (shape){4, 65536, 65536, 0},
                     &(weft_softmax_opts){.causal_q = 4}, 4));
}

/* The mask is the host's (run_softmax checks), the same seed and offset
 * give the same bits, another offset another mask, and the keep rate is
 * 1 - p within 4 standard deviations. */
static void test_softmax_dropout_matches_host_and_replays(void **state)
{
    (void)state;
    const double p = 0.3;
    uint64_t seed = gt_rng_next(&rng), offset = gt_rng_next(&rng) >> 1;
    for (int d = 0; d < 3; d++) {
        weft_dtype dt = DTYPES[d];
        /* element by element, staged (a warp, a block, a cluster a row),
         * and in registers across a cluster */
        shape shapes[] = {{3, 7, 9, 0},        {40, 512, 512, 0},    {5, 4097, 4100, 0},
                          {4, 4096, 4096, 0},  {2, 65536, 65536, 0}, {2, 65536, 65536, 1},
                          {300, 4096, 4096, 0}};
        for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
            weft_softmax_opts o = {.dropout_p = (float)p, .seed = seed, .offset = offset};
            free(run_softmax(dt, shapes[k], &o, 2));
        }
    }

    shape s = {256, 4096, 4096, 0};
    weft_softmax_opts o = {.dropout_p = (float)p, .seed = seed, .offset = offset};
    weft_softmax_opts other = o;
    other.offset++;
    void *a = run_softmax(WEFT_DTYPE_F32, s, &o, 2);
    void *b = run_softmax(WEFT_DTYPE_F32, s, &o, 2);
    void *c = run_softmax(WEFT_DTYPE_F32, s, &other, 2);
    size_t n = s.rows * s.cols, kept = 0, same_mask = 0;
    const float *fa = a, *fb = b, *fc = c;
    for (size_t i = 0; i < n; i++) {
        kept += fa[i] != 0;
        same_mask += (fa[i] != 0) == (fc[i] != 0);
        /* new inputs each run: the mask must be what repeats */
        if ((fa[i] != 0) != (fb[i] != 0))
            fail_msg("dropout: element %zu kept in one run and not the other", i);
    }
    double mean = (double)n * (1 - p), sd = sqrt((double)n * p * (1 - p));
    printf("  dropout p %.2f: kept %zu of %zu (expected %.0f +- %.0f)\n", p, kept, n, mean, sd);
    assert_true(dabs((double)kept - mean) <= 4 * sd);
    /* independent masks agree on p^2 + (1-p)^2 of the elements */
    double agree = (double)n * (p * p + (1 - p) * (1 - p));
    assert_true(dabs((double)same_mask - agree) <= 4 * sqrt(agree));
    free(a), free(b), free(c);
}

/* ---- RoPE -------------------------------------------------------------------- */

typedef struct rope_case {
    size_t tokens, q_heads, k_heads, head_dim, q_pad, k_pad, skew;
} rope_case;

/* GPU against host, both through weft_rope_scaled (sc NULL: plain RoPE). */
static void run_rope_scaled(weft_dtype dt, weft_rope_layout layout, rope_case rc, float base,
                            const weft_rope_llama3 *sc)
{
    size_t qs = rc.q_heads * rc.head_dim + rc.q_pad, ks = rc.k_heads * rc.head_dim + rc.k_pad;
    tens q = tens_new(dt, rc.tokens, rc.q_heads * rc.head_dim, qs, rc.skew);
    tens k =
        tens_new(dt, rc.tokens, rc.k_heads ? rc.k_heads * rc.head_dim : 1, ks ? ks : 1, rc.skew);
    int32_t *pos = gt_xmalloc(rc.tokens * sizeof *pos), *dpos = NULL;
    cmp cq = {layout == WEFT_ROPE_HALVES ? "rope_halves q" : "rope_interleaved q", &q, 0, 0};
    cmp ck = {layout == WEFT_ROPE_HALVES ? "rope_halves k" : "rope_interleaved k", &k, 0, 0};

    for (size_t t = 0; t < rc.tokens; t++)
        pos[t] = t % 3 == 0 ? (int32_t)t : (int32_t)gt_between(&rng, 0, 200000);
    tens_random(&q, -3, 3);
    tens_random(&k, -3, 3);
    tens_upload(&q), tens_upload(&k);
    assert_cuda(cudaMalloc((void **)&dpos, rc.tokens * sizeof *dpos));
    assert_cuda(gt_copy_in(dpos, pos, rc.tokens * sizeof *pos));
    void *kd = rc.k_heads ? k.d : NULL, *kh = rc.k_heads ? k.h : NULL;
    assert_ok(weft_rope_scaled(stream, dt, layout, q.d, rc.q_heads, qs, kd, rc.k_heads, ks,
                               rc.tokens, rc.head_dim, dpos, base, sc));
    sync_ok();
    /* in place: nothing to poison, but everything must have changed as the
     * host changes it, padding and guards untouched */
    void *gq = tens_download(&q, cq.what, 0), *gk = tens_download(&k, ck.what, 0);
    void *q0 = gt_xmalloc(q.n * q.esize);
    memcpy(q0, q.h, q.n * q.esize);
    assert_ok(weft_rope_scaled(NULL, dt, layout, q.h, rc.q_heads, qs, kh, rc.k_heads, ks, rc.tokens,
                               rc.head_dim, pos, base, sc));
    for (size_t t = 0; t < rc.tokens; t++) {
        double m = 0;
        for (size_t j = 0; j < q.cols; j++)
            m = fmax(m, dabs(get(&q, q0, t, j)));
        for (size_t j = 0; j < q.cols; j++)
            cmp_one(&cq, get(&q, gq, t, j), get(&q, q.h, t, j), 2 * m, 1, t, j);
        if (rc.k_heads)
            for (size_t j = 0; j < k.cols; j++)
                cmp_one(&ck, get(&k, gk, t, j), get(&k, k.h, t, j), 6.0, 1, t, j);
    }
    cmp_done(&cq);
    cmp_done(&ck);
    if (!rc.k_heads)
        assert_same_bits(&k, gk, k.h, "rope: k untouched");
    cudaFree(dpos);
    free(pos), free(gq), free(gk), free(q0);
    tens_free(&q), tens_free(&k);
}

static void run_rope(weft_dtype dt, weft_rope_layout layout, rope_case rc)
{
    run_rope_scaled(dt, layout, rc, 10000.0f, NULL);
}

/* Llama 3.1's scaled frequencies (the kernels' inverse frequencies, in
 * their table and beyond it) against the host's. */
static void test_rope_llama3_matches_host(void **state)
{
    (void)state;
    const weft_rope_llama3 sc = {8.0, 1.0, 4.0, 8192.0};
    static const rope_case cases[] = {
        {300, 32, 8, 128, 0, 0, 0}, {17, 4, 2, 64, 8, 24, 0}, {3, 2, 1, 1040, 8, 0, 0}};
    for (int d = 0; d < 3; d++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
            for (int l = 0; l < 2; l++)
                run_rope_scaled(DTYPES[d], (weft_rope_layout)l, cases[c], 500000.0f, &sc);
}

static void test_rope_matches_host(void **state)
{
    (void)state;
    static const rope_case cases[] = {
        {1, 1, 0, 2, 0, 0, 0},
        {5, 3, 1, 64, 0, 0, 0},
        {17, 4, 2, 128, 8, 24, 0},
        {3, 2, 2, 6, 2, 0, 0},
        {7, 2, 1, 128, 0, 0, 1},
        {300, 8, 8, 128, 0, 0, 0},
        {2048, 4, 1, 64, 0, 0, 0},
        {9, 5, 3, 80, 16, 0, 0},
        /* tokens enough that a slice takes several heads and the last
         * fewer, on GPUs of up to ~190 SMs */
        {10000, 8, 3, 64, 0, 0, 0},
        /* the last head whose inverse frequencies fit the table, and one past it */
        {3, 2, 1, 1024, 0, 0, 0},
        {3, 2, 1, 1040, 8, 0, 0},
    };
    for (int d = 0; d < 3; d++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
            for (int l = 0; l < 2; l++)
                run_rope(DTYPES[d], (weft_rope_layout)l, cases[c]);
}

/* ---- GLU -------------------------------------------------------------------- */

static void run_glu(weft_dtype dt, weft_glu_kind kind, shape s)
{
    size_t in_stride = 2 * s.cols + (s.stride - s.cols);
    tens in = tens_new(dt, s.rows, 2 * s.cols, in_stride, s.skew);
    tens out = tens_new(dt, s.rows, s.cols, s.stride, s.skew);
    static const char *const names[] = {"swiglu", "geglu", "geglu_tanh"};
    cmp c = {names[kind], &out, 0, 0};

    tens_random(&in, -6, 6);
    tens_random(&out, 0, 1);
    tens_upload(&in), tens_poison(&out);
    assert_ok(weft_glu(stream, dt, kind, out.d, in.d, s.rows, s.cols, in_stride, s.stride));
    sync_ok();
    void *got = tens_download(&out, c.what, 1);
    assert_ok(weft_glu(NULL, dt, kind, out.h, in.h, s.rows, s.cols, in_stride, s.stride));
    /* SiLU's bound is the tanh form's: its exp argument is magnified alike */
    weft_gelu_form form = kind == WEFT_GLU_GEGLU ? WEFT_GELU_ERF : WEFT_GELU_TANH;
    for (size_t r = 0; r < s.rows; r++)
        for (size_t j = 0; j < s.cols; j++) {
            double a = get(&in, in.h, r, j), ref = get(&out, out.h, r, j);
            cmp_one(&c, get(&out, got, r, j), ref, dabs(ref), gelu_cond(dt, form, a), r, j);
        }
    cmp_done(&c);
    free(got);
    tens_free(&in), tens_free(&out);
}

static void test_glu_matches_host(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < NEW_SHAPES; k++)
            for (int kind = 0; kind < 3 && !skipped_here(EW_SHAPES[k]); kind++)
                run_glu(DTYPES[d], (weft_glu_kind)kind, EW_SHAPES[k]);
}

/* ---- NaN and Inf -------------------------------------------------------------- */

/* Rows seeded with NaN, +Inf and -Inf in chosen places: the kernels must
 * give NaN, Inf and finite values exactly where the host does. */
static void test_nan_and_inf_match_host(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++) {
        weft_dtype dt = DTYPES[d];
        shape s = {8, 1000, 1000, 0};
        tens in = tens_new(dt, s.rows, s.cols, s.stride, 0);
        tens res = tens_new(dt, s.rows, s.cols, s.stride, 0);
        tens out = tens_new(dt, s.rows, s.cols, s.stride, 0);
        tens_random(&in, -3, 3);
        tens_random(&res, -1, 1);
        tens_random(&out, 0, 1);
        /* row 0 clean, 1 a NaN, 2 +Inf, 3 -Inf, 4 all -Inf, 5 +Inf and -Inf,
         * 6 a NaN at the end, 7 -Inf at the start */
        weft__store(dt, in.h, 1 * s.stride + 17, NAN);
        weft__store(dt, in.h, 2 * s.stride + 500, INFINITY);
        weft__store(dt, in.h, 3 * s.stride + 3, -INFINITY);
        for (size_t j = 0; j < s.cols; j++)
            weft__store(dt, in.h, 4 * s.stride + j, -INFINITY);
        weft__store(dt, in.h, 5 * s.stride + 1, INFINITY);
        weft__store(dt, in.h, 5 * s.stride + 2, -INFINITY);
        weft__store(dt, in.h, 6 * s.stride + 999, NAN);
        weft__store(dt, in.h, 7 * s.stride, -INFINITY);
        tens_upload(&in), tens_upload(&res);

        for (int op = 0; op < 6; op++) {
            static const char *const names[] = {"gelu NaN/Inf",    "layernorm NaN/Inf",
                                                "rmsnorm NaN/Inf", "gelu_layernorm NaN/Inf",
                                                "softmax NaN/Inf", "swiglu NaN/Inf"};
            cmp c = {names[op], &out, 0, 0};
            tens_poison(&out);
            void *gpu_in = in.d, *host_in = in.h;
            int rc_dev, rc_host;
            size_t cols = op == 5 ? s.cols / 2 : s.cols;
            switch (op) {
            case 0:
                rc_dev = weft_bias_gelu_residual(stream, dt, WEFT_GELU_ERF, out.d, gpu_in, NULL,
                                                 res.d, s.rows, s.cols, s.stride);
                rc_host = weft_bias_gelu_residual(NULL, dt, WEFT_GELU_ERF, out.h, host_in, NULL,
                                                  res.h, s.rows, s.cols, s.stride);
                break;
            case 1:
            case 2:
            case 3:
                rc_dev = call_norm((enum norm_kind)(op - 1), WEFT_GELU_ERF, stream, dt, out.d, NULL,
                                   gpu_in, NULL, res.d, NULL, NULL, s);
                rc_host = call_norm((enum norm_kind)(op - 1), WEFT_GELU_ERF, NULL, dt, out.h, NULL,
                                    host_in, NULL, res.h, NULL, NULL, s);
                break;
            case 4:
                rc_dev = weft_softmax(stream, dt, out.d, gpu_in, s.rows, s.cols, s.stride, NULL);
                rc_host = weft_softmax(NULL, dt, out.h, host_in, s.rows, s.cols, s.stride, NULL);
                break;
            default:
                rc_dev = weft_glu(stream, dt, WEFT_GLU_SWIGLU, out.d, gpu_in, s.rows, cols,
                                  s.stride, s.stride);
                rc_host = weft_glu(NULL, dt, WEFT_GLU_SWIGLU, out.h, host_in, s.rows, cols,
                                   s.stride, s.stride);
                break;
            }
            assert_int_equal(rc_dev, WEFT_OK);
            assert_int_equal(rc_host, WEFT_OK);
            sync_ok();
            void *got = tens_download(&out, names[op], op != 5);
            /* What counts here is where NaN and Inf land; the finite values
             * get loose bounds (the fused op's x may round the other way in
             * its last place, which LayerNorm magnifies). */
            double cond = op == 3 ? 3000 : 40;
            for (size_t r = 0; r < s.rows; r++)
                for (size_t j = 0; j < cols; j++) {
                    double ref = get(&out, out.h, r, j);
                    cmp_one(&c, get(&out, got, r, j), ref, dabs(ref) + 3, cond, r, j);
                }
            cmp_done(&c);
            free(got);
        }
        tens_free(&in), tens_free(&res), tens_free(&out);
    }
}

/* GELU's values that are exact on either side - zeros of both signs,
 * infinities, NaN, and negative inputs whose result underflows to -0 - bit
 * for bit as the host gives them (ops.h: GELU(-Inf) = -0), in both forms,
 * on the vector path and element by element. */
static void test_gelu_signed_zeros_match_host(void **state)
{
    (void)state;
    static const float X[] = {0.0f,    -0.0f,  -INFINITY, INFINITY, NAN,   -20.0f,
                              -200.0f, -1e30f, 1e30f,     -0.0f,    0.0f,  -INFINITY,
                              -16.5f,  -50.0f, NAN,       INFINITY, -0.0f, 0.0f};
    for (int d = 0; d < 3; d++)
        for (int form = 0; form < 2; form++)
            for (size_t cols = 16; cols <= 18; cols += 2) { /* 18: a partial chunk too */
                weft_dtype dt = DTYPES[d];
                tens in = tens_new(dt, 1, cols, cols, 0), out = tens_new(dt, 1, cols, cols, 0);
                for (size_t j = 0; j < cols; j++)
                    weft__store(dt, in.h, j, X[j]);
                tens_upload(&in), tens_poison(&out);
                assert_ok(weft_bias_gelu_residual(stream, dt, (weft_gelu_form)form, out.d, in.d,
                                                  NULL, NULL, 1, cols, cols));
                sync_ok();
                void *got = tens_download(&out, "gelu signed zeros", 1);
                assert_ok(weft_bias_gelu_residual(NULL, dt, (weft_gelu_form)form, out.h, in.h, NULL,
                                                  NULL, 1, cols, cols));
                assert_same_bits(&out, got, out.h, "gelu signed zeros");
                free(got);
                tens_free(&in), tens_free(&out);
            }
}

/* ---- in place ------------------------------------------------------------------ */

/* out = in (and sum_out = residual) give what separate buffers give. */
static void test_in_place_calls_match_separate_buffers(void **state)
{
    (void)state;
    for (int d = 0; d < 3; d++) {
        weft_dtype dt = DTYPES[d];
        shape s = {4, 65536, 65536, 0};
        tens x = tens_new(dt, s.rows, s.cols, s.stride, 0);
        tens r = tens_new(dt, s.rows, s.cols, s.stride, 0);
        tens out = tens_new(dt, s.rows, s.cols, s.stride, 0);
        tens sum = tens_new(dt, s.rows, s.cols, s.stride, 0);
        tens_random(&x, -3, 3);
        tens_random(&r, -3, 3);
        tens_random(&out, 0, 1);
        memcpy(sum.h, out.h, out.n * out.esize);

        /* softmax, gelu, layernorm with sum into the residual */
        for (int op = 0; op < 3; op++) {
            tens_upload(&x), tens_upload(&r), tens_poison(&out), tens_poison(&sum);
            switch (op) {
            case 0:
                assert_ok(weft_softmax(stream, dt, out.d, x.d, s.rows, s.cols, s.stride, NULL));
                assert_ok(weft_softmax(stream, dt, x.d, x.d, s.rows, s.cols, s.stride, NULL));
                break;
            case 1:
                assert_ok(weft_bias_gelu_residual(stream, dt, WEFT_GELU_TANH, out.d, x.d, NULL, r.d,
                                                  s.rows, s.cols, s.stride));
                assert_ok(weft_bias_gelu_residual(stream, dt, WEFT_GELU_TANH, x.d, x.d, NULL, r.d,
                                                  s.rows, s.cols, s.stride));
                break;
            default:
                assert_ok(weft_layernorm(stream, dt, out.d, sum.d, x.d, r.d, NULL, NULL, 1e-5f,
                                         s.rows, s.cols, s.stride));
                assert_ok(weft_layernorm(stream, dt, x.d, r.d, x.d, r.d, NULL, NULL, 1e-5f, s.rows,
                                         s.cols, s.stride));
                break;
            }
            sync_ok();
            void *want = tens_download(&out, "in place: separate", 1);
            void *got = tens_download(&x, "in place", 1);
            assert_same_bits(&x, got, want, "in place");
            if (op == 2) {
                void *want_sum = tens_download(&sum, "in place: sum", 1);
                void *got_sum = tens_download(&r, "in place: sum into residual", 1);
                assert_same_bits(&r, got_sum, want_sum, "in place: sum");
                free(want_sum), free(got_sum);
            }
            free(want), free(got);
        }
        tens_free(&x), tens_free(&r), tens_free(&out), tens_free(&sum);
    }
}

/* ---- offsets past 32 bits -------------------------------------------------- */

/* Three rows 2^31 + 8 elements apart reach past 2^32 elements, where the
 * elementwise ops leave the grid of a thread a chunk (chunk_once's 32-bit
 * offsets) for a walk with 64-bit ones. Only the rows travel, and the
 * elements after each row are poisoned: they must stay so. SwiGLU takes
 * rows of FAR_COLS, in vectors; bias + GELU + residual rows of
 * FAR_COLS - 4, in vectors and each row's partial end. */
enum { FAR_ROWS = 3, FAR_COLS = 48, FAR_AFTER = 8 };
static const size_t FAR_STRIDE = ((size_t)1 << 31) + 8;

/* width elements of each row of host rows (width apart) to or from the
 * device's rows, FAR_STRIDE apart; to the device, the FAR_AFTER elements
 * after each row are poisoned. Returns whether those are still poisoned. */
static int far_rows(void *dev, void *host, size_t width, size_t esize, int upload)
{
    unsigned char after[FAR_AFTER * 4], poison[FAR_AFTER * 4];
    int kept = 1;
    memset(poison, 0xff, sizeof poison);
    for (size_t r = 0; r < FAR_ROWS; r++) {
        unsigned char *d = (unsigned char *)dev + r * FAR_STRIDE * esize;
        unsigned char *h = (unsigned char *)host + r * width * esize;
        if (upload) {
            assert_cuda(gt_copy_in(d, h, width * esize));
            assert_cuda(gt_copy_in(d + width * esize, poison, FAR_AFTER * esize));
        } else {
            assert_cuda(cudaMemcpy(h, d, width * esize, cudaMemcpyDeviceToHost));
            assert_cuda(
                cudaMemcpy(after, d + width * esize, FAR_AFTER * esize, cudaMemcpyDeviceToHost));
            kept &= memcmp(after, poison, FAR_AFTER * esize) == 0;
        }
    }
    settle();
    return kept;
}

static void test_elementwise_offsets_past_32_bits_match_host(void **state)
{
    (void)state;
    const weft_dtype dt = WEFT_DTYPE_BF16;
    const size_t esize = weft__dtype_size(dt), n = (FAR_ROWS - 1) * FAR_STRIDE + 2 * FAR_COLS;
    const size_t gc = FAR_COLS - 4; /* bias + GELU + residual's row */
    void *far = NULL, *bias_d = NULL, *out_d = NULL;
    if (cudaMalloc(&far, (n + FAR_AFTER) * esize) != cudaSuccess) {
        cudaGetLastError();
        print_message("offsets past 32 bits: no room for %zu GiB on this GPU\n", (n * esize) >> 30);
        skip();
    }
    assert_cuda(cudaMalloc(&bias_d, gc * esize));
    assert_cuda(cudaMalloc(&out_d, FAR_ROWS * FAR_COLS * esize));
    /* the compact host rows' shapes, for get() and cmp */
    const tens gelu_rows = {.dt = dt, .rows = FAR_ROWS, .cols = gc, .stride = gc, .esize = esize};
    const tens glu_rows = {
        .dt = dt, .rows = FAR_ROWS, .cols = FAR_COLS, .stride = FAR_COLS, .esize = esize};
    void *in = gt_xmalloc(FAR_ROWS * 2 * FAR_COLS * esize), *bias = gt_xmalloc(gc * esize);
    void *got = gt_xmalloc(FAR_ROWS * FAR_COLS * esize);
    void *ref = gt_xmalloc(FAR_ROWS * FAR_COLS * esize);
    for (size_t i = 0; i < FAR_ROWS * 2 * FAR_COLS; i++)
        weft__store(dt, in, i, (float)uniform(-6, 6));
    for (size_t j = 0; j < gc; j++)
        weft__store(dt, bias, j, (float)uniform(-1, 1));
    assert_cuda(gt_copy_in(bias_d, bias, gc * esize));

    /* bias + GELU in place on the far rows */
    cmp c = {"gelu_erf far", &gelu_rows, 0, 0};
    far_rows(far, in, gc, esize, 1);
    assert_ok(weft_bias_gelu_residual(stream, dt, WEFT_GELU_ERF, far, far, bias_d, NULL, FAR_ROWS,
                                      gc, FAR_STRIDE));
    sync_ok();
    if (!far_rows(far, got, gc, esize, 0))
        fail_msg("gelu far: written past a row");
    assert_ok(
        weft_bias_gelu_residual(NULL, dt, WEFT_GELU_ERF, ref, in, bias, NULL, FAR_ROWS, gc, gc));
    for (size_t r = 0; r < FAR_ROWS; r++)
        for (size_t j = 0; j < gc; j++) {
            double h = get(&gelu_rows, in, r, j) + get(&gelu_rows, bias, 0, j);
            double want = get(&gelu_rows, ref, r, j);
            cmp_one(&c, get(&gelu_rows, got, r, j), want, dabs(want),
                    gelu_cond(dt, WEFT_GELU_ERF, h), r, j);
        }
    cmp_done(&c);

    /* SwiGLU from the far rows, gate then up, into rows side by side */
    cmp g = {"swiglu far", &glu_rows, 0, 0};
    far_rows(far, in, 2 * FAR_COLS, esize, 1);
    assert_cuda(gt_memset(out_d, 0xff, FAR_ROWS * FAR_COLS * esize));
    assert_ok(weft_glu(stream, dt, WEFT_GLU_SWIGLU, out_d, far, FAR_ROWS, FAR_COLS, FAR_STRIDE,
                       FAR_COLS));
    sync_ok();
    assert_cuda(cudaMemcpy(got, out_d, FAR_ROWS * FAR_COLS * esize, cudaMemcpyDeviceToHost));
    assert_ok(
        weft_glu(NULL, dt, WEFT_GLU_SWIGLU, ref, in, FAR_ROWS, FAR_COLS, 2 * FAR_COLS, FAR_COLS));
    for (size_t r = 0; r < FAR_ROWS; r++)
        for (size_t j = 0; j < FAR_COLS; j++) {
            double a = weft__load(dt, in, r * 2 * FAR_COLS + j), want = get(&glu_rows, ref, r, j);
            cmp_one(&g, get(&glu_rows, got, r, j), want, dabs(want),
                    gelu_cond(dt, WEFT_GELU_TANH, a), r, j);
        }
    cmp_done(&g);
    free(in), free(bias), free(got), free(ref);
    cudaFree(far), cudaFree(bias_d), cudaFree(out_d);
}

/* ---- bad arguments, tasks ------------------------------------------------------- */

/* With a real stream, bad arguments are refused before any launch: the
 * output stays poisoned. */
static void test_bad_arguments_are_refused_before_launch(void **state)
{
    (void)state;
    const weft_dtype F = WEFT_DTYPE_F32;
    tens in = tens_new(F, 4, 64, 64, 0), out = tens_new(F, 4, 64, 64, 0);
    tens_random(&in, -1, 1);
    tens_random(&out, 0, 1);
    tens_upload(&in), tens_poison(&out);
    char *mis = (char *)in.d + 2;
    int32_t *pos = NULL;
    assert_cuda(cudaMalloc((void **)&pos, 4 * sizeof *pos));
    assert_cuda(gt_memset(pos, 0, 4 * sizeof *pos));

    assert_rc(
        weft_bias_gelu_residual(stream, F, WEFT_GELU_TANH, out.d, in.d, NULL, NULL, 4, 64, 32),
        WEFT_EINVAL);
    assert_rc(weft_layernorm(stream, F, out.d, NULL, mis, NULL, NULL, NULL, 1e-5f, 4, 64, 64),
              WEFT_EINVAL);
    assert_rc(weft_rmsnorm(stream, F, out.d, NULL, in.d, NULL, NULL, -1.0f, 4, 64, 64),
              WEFT_EINVAL);
    assert_rc(weft_bias_gelu_residual_layernorm(stream, F, (weft_gelu_form)3, out.d, NULL, in.d,
                                                NULL, NULL, NULL, NULL, 1e-5f, 4, 64, 64),
              WEFT_EINVAL);
    assert_rc(
        weft_softmax(stream, F, out.d, in.d, 4, 64, 64, &(weft_softmax_opts){.dropout_p = 1.0f}),
        WEFT_EINVAL);
    assert_rc(weft_rope(stream, F, WEFT_ROPE_HALVES, out.d, 1, 64, NULL, 0, 0, 4, 63, pos, 1e4f),
              WEFT_EINVAL);
    assert_rc(weft_glu(stream, F, WEFT_GLU_SWIGLU, out.d, in.d, 4, 32, 63, 64), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "weft_glu"));
    sync_ok();
    void *got = tens_download(&out, "refused calls", 0);
    for (size_t i = 0; i < out.n; i++)
        if (!is_poison(&out, got, i))
            fail_msg("a refused call wrote element %zu", i);
    free(got);
    cudaFree(pos);
    tens_free(&in), tens_free(&out);
}

/* add+LayerNorm in fp32 at 1056x4096 with a weight, a bias and the sum
 * written: the call that ended in an illegal memory access when the ops
 * benchmark captured it into a CUDA graph and replayed it, while the same
 * call outside a graph was right. The explanation given is the benchmark's:
 * it handed weft the sum tensor's pointer and freed the tensor, whose
 * memory the capture then unmapped under the kernel. If that is all, the
 * call with every tensor alive is right eagerly, inside a plain stream
 * capture replayed as often as the benchmark did, and inside a region of
 * weft's graph mode replayed as often; a kernel of weft's that strayed
 * would fault there, or write past its tensors (their guards), or write a
 * wrong value. */
enum { ADDNORM_ROWS = 1056, ADDNORM_COLS = 4096, ADDNORM_REPLAYS = 200 };

typedef struct addnorm {
    tens in, res, out, sum, w, b;
} addnorm;

static addnorm addnorm_new(void)
{
    weft_dtype dt = WEFT_DTYPE_F32;
    size_t r = ADDNORM_ROWS, c = ADDNORM_COLS;
    addnorm a = {tens_new(dt, r, c, c, 0), tens_new(dt, r, c, c, 0), tens_new(dt, r, c, c, 0),
                 tens_new(dt, r, c, c, 0), tens_new(dt, 1, c, c, 0), tens_new(dt, 1, c, c, 0)};
    tens_random(&a.in, -2, 2);
    tens_random(&a.res, -1, 1);
    tens_random(&a.w, -2, 2);
    tens_random(&a.b, -1, 1);
    tens_upload(&a.in), tens_upload(&a.res), tens_upload(&a.w), tens_upload(&a.b);
    return a;
}

static void addnorm_free(addnorm *a)
{
    tens_free(&a->in), tens_free(&a->res), tens_free(&a->out), tens_free(&a->sum);
    tens_free(&a->w), tens_free(&a->b);
}

static int addnorm_call(const addnorm *a, void *st)
{
    return weft_layernorm(st, WEFT_DTYPE_F32, a->out.d, a->sum.d, a->in.d, a->res.d, a->w.d, a->b.d,
                          1e-5f, ADDNORM_ROWS, ADDNORM_COLS, ADDNORM_COLS);
}

/* The device's out and sum, once its work is done, against the host's. */
static void addnorm_check(addnorm *a, const char *what)
{
    void *got = tens_download(&a->out, what, 1);
    void *got_sum = tens_download(&a->sum, what, 1);
    assert_ok(weft_layernorm(NULL, WEFT_DTYPE_F32, a->out.h, a->sum.h, a->in.h, a->res.h, a->w.h,
                             a->b.h, 1e-5f, ADDNORM_ROWS, ADDNORM_COLS, ADDNORM_COLS));
    assert_same_bits(&a->sum, got_sum, a->sum.h, what); /* fp32 add: the same bits */
    cmp c = {what, &a->out, 0, 0};
    for (size_t r = 0; r < ADDNORM_ROWS; r++)
        for (size_t j = 0; j < ADDNORM_COLS; j++) {
            double ref = get(&a->out, a->out.h, r, j);
            double scale =
                dabs(ref) + dabs(get(&a->w, a->w.h, 0, j)) + dabs(get(&a->b, a->b.h, 0, j));
            cmp_one(&c, get(&a->out, got, r, j), ref, scale, 1, r, j);
        }
    cmp_done(&c);
    free(got), free(got_sum);
}

/* Outputs poisoned anew, so that each way must write every element. */
static void addnorm_poison(addnorm *a)
{
    tens_random(&a->out, 0, 1), tens_random(&a->sum, 0, 1);
    tens_poison(&a->out), tens_poison(&a->sum);
}

static void test_add_layernorm_1056x4096_f32_is_right_in_and_out_of_a_stream_capture(void **state)
{
    (void)state;
    addnorm a = addnorm_new();

    addnorm_poison(&a);
    assert_ok(addnorm_call(&a, stream));
    sync_ok();
    addnorm_check(&a, "add+layernorm eager");

    addnorm_poison(&a);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = addnorm_call(&a, stream);
    assert_cuda(cudaStreamEndCapture(stream, &graph));
    assert_ok(rc);
    assert_cuda(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < ADDNORM_REPLAYS; i++)
        assert_cuda(cudaGraphLaunch(exec, stream));
    sync_ok();
    addnorm_check(&a, "add+layernorm captured");
    assert_cuda(cudaGraphExecDestroy(exec));
    assert_cuda(cudaGraphDestroy(graph));
    addnorm_free(&a);
}

static void *addnorm_regions(void *arg)
{
    const addnorm *a = arg;
    for (int i = 0; i < ADDNORM_REPLAYS; i++)
        if (!GT_OK(weft_region_begin(1056)) || !GT_OK(addnorm_call(a, WEFT_TASK_STREAM)) ||
            !GT_OK(weft_region_end()) || !GT_OK(weft_await()))
            break;
    return NULL;
}

static void test_add_layernorm_1056x4096_f32_is_right_in_graph_mode(void **state)
{
    (void)state;
    addnorm a = addnorm_new();
    addnorm_poison(&a);
    weft_graph_stats before, after;
    assert_ok(weft_graph_stats_get(runtime, &before));
    gt_reset();
    gt_run(runtime, addnorm_regions, &a);
    assert_ok(weft_graph_stats_get(runtime, &after));
    /* every region ran as a graph, not as plain stream work */
    assert_int_equal(after.launches - before.launches, ADDNORM_REPLAYS);
    addnorm_check(&a, "add+layernorm graph mode");
    addnorm_free(&a);
}

/* The ops from a weft task, on the task's own stream, awaited like any
 * other stream work: the first given the stream weft_stream leases, the
 * second WEFT_TASK_STREAM, which must be the same stream (the second reads
 * what the first wrote). */
typedef struct task_job {
    weft_dtype dt;
    size_t rows, cols;
    void *in, *out;
} task_job;

static void *task_main(void *arg)
{
    task_job *j = arg;
    void *st = NULL;
    if (GT_OK(weft_stream(&st)) &&
        GT_OK(weft_softmax(st, j->dt, j->out, j->in, j->rows, j->cols, j->cols, NULL)) &&
        GT_OK(weft_rmsnorm(WEFT_TASK_STREAM, j->dt, j->out, NULL, j->out, NULL, NULL, 1e-6f,
                           j->rows, j->cols, j->cols)))
        GT_OK(weft_await());
    return NULL;
}

static void test_ops_run_on_a_task_stream(void **state)
{
    (void)state;
    weft_dtype dt = WEFT_DTYPE_BF16;
    shape s = {32, 4096, 4096, 0};
    tens in = tens_new(dt, s.rows, s.cols, s.stride, 0),
         out = tens_new(dt, s.rows, s.cols, s.stride, 0);
    tens_random(&in, -4, 4);
    tens_random(&out, 0, 1);
    tens_upload(&in), tens_poison(&out);
    task_job job = {dt, s.rows, s.cols, in.d, out.d};
    gt_reset();
    gt_run(runtime, task_main, &job);
    void *got = tens_download(&out, "task stream", 1);

    void *probs = gt_xmalloc(out.n * out.esize);
    assert_ok(weft_softmax(NULL, dt, probs, in.h, s.rows, s.cols, s.stride, NULL));
    assert_ok(
        weft_rmsnorm(NULL, dt, out.h, NULL, probs, NULL, NULL, 1e-6f, s.rows, s.cols, s.stride));
    cmp c = {"task softmax+rmsnorm", &out, 0, 0};
    for (size_t r = 0; r < s.rows; r++)
        for (size_t j = 0; j < s.cols; j++) {
            double ref = get(&out, out.h, r, j);
            /* bf16 probabilities that differ in their last place move the
             * normalized row by as much again: allow a few ulps */
            cmp_one(&c, get(&out, got, r, j), ref, 2 * dabs(ref) + 1e-3, 1000, r, j);
        }
    cmp_done(&c);
    free(got), free(probs);
    tens_free(&in), tens_free(&out);
}

/* ---- launch errors ---------------------------------------------------------- */

/* In a process of its own (the program again, with WEFT_TEST_OPS_FAULT set):
 * a softmax reading an unmapped address faults the context, and the next
 * op's launch is refused with CUDA's error name in weft's message. */
static int fault_child(void)
{
    cudaStream_t st;
    float *out = NULL;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&out, 1024 * sizeof *out) != cudaSuccess)
        return 10;
    const void *unmapped = (const void *)(uintptr_t)0x1000;
    if (weft_softmax(st, WEFT_DTYPE_F32, out, unmapped, 1, 1024, 1024, NULL) != WEFT_OK)
        return 11; /* the launch itself is fine; the kernel faults */
    if (cudaStreamSynchronize(st) == cudaSuccess)
        return 12;
    int rc = weft_softmax(st, WEFT_DTYPE_F32, out, out, 1, 1024, 1024, NULL);
    printf("after the fault: status %d, \"%s\"\n", rc, weft_last_error());
    if (rc != WEFT_EDEVICE || strstr(weft_last_error(), "weft_softmax") == NULL ||
        strstr(weft_last_error(), "cudaError") == NULL)
        return 13;
    return 0;
}

static void test_a_refused_launch_names_the_cuda_error(void **state)
{
    (void)state;
    if (gt_sanitizer())
        skip(); /* the fault is deliberate; the sanitizer would report it */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("WEFT_TEST_OPS_FAULT", "1", 1);
        execl("/proc/self/exe", "test_gpu_ops", (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        assert_int_equal(errno, EINTR);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- main ---------------------------------------------------------------------- */

/* weft's runtime first, so that it is what starts CUDA (as in the other
 * GPU tests: it sets the device flags and CUDA_DEVICE_MAX_CONNECTIONS). */
static int setup(void **state)
{
    (void)state;
    rng = gt_rng(5);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    if (getenv("WEFT_TEST_OPS_FAULT"))
        return fault_child();
    int skip = gt_start("gpu.ops");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bias_gelu_residual_matches_host),
        cmocka_unit_test(test_layernorm_matches_host),
        cmocka_unit_test(test_rmsnorm_matches_host),
        cmocka_unit_test(test_bias_gelu_residual_layernorm_matches_host),
        cmocka_unit_test(test_norms_asking_for_rows_ahead_match_host),
        cmocka_unit_test(test_softmax_matches_host),
        cmocka_unit_test(test_softmax_dropout_matches_host_and_replays),
        cmocka_unit_test(test_rope_matches_host),
        cmocka_unit_test(test_rope_llama3_matches_host),
        cmocka_unit_test(test_glu_matches_host),
        cmocka_unit_test(test_nan_and_inf_match_host),
        cmocka_unit_test(test_gelu_signed_zeros_match_host),
        cmocka_unit_test(test_in_place_calls_match_separate_buffers),
        cmocka_unit_test(test_elementwise_offsets_past_32_bits_match_host),
        cmocka_unit_test(test_bad_arguments_are_refused_before_launch),
        cmocka_unit_test(test_ops_run_on_a_task_stream),
        cmocka_unit_test(test_add_layernorm_1056x4096_f32_is_right_in_and_out_of_a_stream_capture),
        cmocka_unit_test(test_add_layernorm_1056x4096_f32_is_right_in_graph_mode),
        cmocka_unit_test(test_a_refused_launch_names_the_cuda_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
