/*
 * test_conv_gpu.c - weft_conv2d and weft_conv2d_fold_bn on the GPU (cuDNN's
 * operation graph, its legacy fused convolution-bias-activation, the 1x1
 * convolutions' matrix products, and the fold's kernel) against the
 * float64 loops of conv_ref.h and the host reference, on fresh random data:
 * every case of CV_CASES in every dtype, with and without ReLU, through the
 * graph and again through the legacy call alone; the fold
 * bit for bit equal to the host's, and the folded convolution against a
 * convolution followed by a float64 BatchNorm; a plan made once and found
 * on repeat (and what the first call costs); a call captured into a CUDA
 * graph and replayed; many tasks calling at once on their own streams;
 * bad arguments refused before anything is enqueued.
 *
 * Shapes cuDNN refuses are reported as refusals ("REFUSED" and cuDNN's
 * reason), not failures: which ones is cuDNN's business, and the call must
 * only say so cleanly, before enqueueing anything (the output keeps its
 * poison). Shapes whose fused call cuDNN refuses but whose convolution it
 * runs take the split path (marked SPLIT; they must be right all the
 * same). The ResNet-like 16-bit shapes (channels multiples of 8, groups
 * 1) must run, and with ReLU must run fused; with the graph on, those
 * that are not 1x1 must run as the graph (its speed is the point).
 *
 * Bounds, as ||got - ref|| / ||ref|| over the whole output against the
 * float64 reference: fp32 1e-5, fp16 3e-3, bf16 1e-2 (the outputs'
 * rounding alone is ~1e-3 and ~4e-3 for 16-bit types). The host reference
 * must pass the same bound. Outputs are poisoned with NaN (all-ones
 * bytes), so an unwritten element fails, and so would cuDNN reading its z
 * operand (the output itself, at alpha2 = 0).
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>
#include <math.h>

#include "ops/conv.h"
#include "ops/conv_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

/* The tests of the convolution itself are skipped in a CUDA build without
 * cuDNN, where test_without_cudnn_the_call_says_so runs instead. */
#ifdef WEFT_HAVE_CUDNN
#define NEEDS_CUDNN() ((void)0)
#else
#define NEEDS_CUDNN() skip()
#endif

static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
#define NCASES (sizeof CV_CASES / sizeof CV_CASES[0])

static double bound(const weft_conv2d_desc *d)
{
    if (d->dtype == WEFT_DTYPE_F32)
        return d->allow_tf32 ? 2e-3 : 1e-5;
    return d->dtype == WEFT_DTYPE_BF16 ? 1e-2 : 3e-3;
}

/* Cases over their bound, counted so that one run lists every case that
 * fails before the test fails; refusals counted apart. */
static unsigned over_bound, refusals, splits, graphs;
static int graph_on = 1; /* what the cases ask of weft__conv_cuda_use_graph */

static void no_case_over(void)
{
    unsigned n = over_bound;
    over_bound = 0;
    if (n)
        fail_msg("%u cases over their bound or broken (each listed above)", n);
}

/* Whether rc and the last message are cuDNN's refusal of the shape. */
static int is_refusal(int rc)
{
    const char *m = weft_last_error();
    return rc == WEFT_EINVAL &&
           (strstr(m, "cuDNN does not support") || strstr(m, "cuDNN has no algorithm"));
}

/* A ResNet-like 16-bit shape: cuDNN's tensor-core kernels take it (ops.h
 * promises them), it must run. */
static int must_run(const weft_conv2d_desc *d)
{
    size_t g = d->groups ? d->groups : 1;
    return d->dtype != WEFT_DTYPE_F32 && g == 1 && d->c % 8 == 0 && d->k % 8 == 0 &&
           (d->dilation_h | d->dilation_w) <= 1;
}

/* A 1x1 convolution that weft runs as a matrix product (conv.c). */
static int is_pointwise(const weft_conv2d_desc *d)
{
    return d->r == 1 && d->s == 1 && d->stride_h <= 1 && d->stride_w <= 1 && !d->pad_h &&
           !d->pad_w && d->groups <= 1;
}

/* One case on the GPU: its output against float64, the host's against the
 * same bound. in, w and bias are the host's; returns 1 when it ran. */
static int gpu_case(const char *name, const weft_conv2d_desc *d, const void *in, const void *w,
                    const void *bias)
{
    cv_geom g = cv_geometry(d);
    size_t es = weft__dtype_size(d->dtype);
    void *poison = cv_poisoned(d->dtype, g.nout);
    void *din = gt_upload(in, g.nin * es), *dw = gt_upload(w, g.nw * es);
    void *dbias = gt_upload(bias, d->k * es), *dout = gt_upload(poison, g.nout * es);
    double lim = bound(d);
    int ran = 0;

    unsigned long long h0, m0, split0, split1, graph0, graph1, plans;
    weft__conv_cuda_plan_stats(&h0, &m0, &split0);
    weft__conv_cuda_graph_stats(&graph0, &plans);
    double t0 = gt_now();
    int rc = weft_conv2d(stream, d, dout, din, dw, dbias);
    double t1 = gt_now();
    weft__conv_cuda_plan_stats(&h0, &m0, &split1);
    weft__conv_cuda_graph_stats(&graph1, &plans);
    int split = split1 != split0, graph = graph1 != graph0;
    assert_cuda(cudaStreamSynchronize(stream));
    void *got = gt_download(dout, g.nout * es);
    if (rc != WEFT_OK) {
        if (!is_refusal(rc) || must_run(d)) {
            printf("  FAILED %s: weft_conv2d returned %d: %s\n", name, rc, weft_last_error());
            over_bound++;
        } else {
            printf("  REFUSED %s: %s\n", name, weft_last_error());
            refusals++;
        }
        if (memcmp(got, poison, g.nout * es) != 0) {
            printf("  FAILED %s: refused, but the output was written\n", name);
            over_bound++;
        }
    } else {
        ran = 1;
        size_t nan_at;
        double e = cv_rel_error(d, in, w, bias, got, &nan_at);
        printf("  %-44s error %.2e (bound %.0e), first call %.0f us, %s\n", name, e, lim,
               (t1 - t0) * 1e6,
               split             ? "SPLIT: cuDNN's fused call refused the shape"
               : graph           ? "graph"
               : is_pointwise(d) ? "matmul"
                                 : "legacy fused");
        if (split)
            printf("    (cuDNN: %s)\n", weft__conv_cuda_last_split_why());
        splits += (unsigned)split, graphs += (unsigned)graph;
        if (graph_on && !graph && !is_pointwise(d) && must_run(d)) {
            printf("  FAILED %s: a ResNet-like shape did not run as cuDNN's graph (%s)\n", name,
                   weft__conv_cuda_graph_why());
            over_bound++;
        }
        if ((graph && !graph_on) || (is_pointwise(d) && (graph || split))) {
            printf("  FAILED %s: ran on the wrong path\n", name);
            over_bound++;
        }
        if (split && must_run(d) && d->act == WEFT_CONV_ACT_RELU) {
            printf("  FAILED %s: a ResNet-like shape with ReLU did not run fused\n", name);
            over_bound++;
        }
        if (nan_at != (size_t)-1) {
            printf("  FAILED %s: element %zu is NaN (unwritten, or z read)\n", name, nan_at);
            over_bound++;
        } else if (!(e <= lim)) {
            printf("  FAILED %s: error %.3g is over %.3g\n", name, e, lim);
            over_bound++;
        }
    }
    /* The host reference, on the same inputs, within the same bound. */
    void *hout = cv_poisoned(d->dtype, g.nout);
    assert_ok(weft_conv2d(NULL, d, hout, in, w, bias));
    size_t nan_at;
    double eh = cv_rel_error(d, in, w, bias, hout, &nan_at);
    if (!(eh <= lim) || nan_at != (size_t)-1) {
        printf("  FAILED %s: the host's error %.3g\n", name, eh);
        over_bound++;
    }
    free(hout), free(got), free(poison);
    cudaFree(din), cudaFree(dw), cudaFree(dbias), cudaFree(dout);
    return ran;
}

/* Every case, through the path graph_on says. */
static void every_case(void)
{
    char name[160];
    unsigned ran = 0;
    refusals = 0, splits = 0, graphs = 0;
    weft__conv_cuda_use_graph(graph_on);
    for (size_t ci = 0; ci < NCASES; ci++)
        for (int t = 0; t < 3; t++)
            for (int act = 0; act <= WEFT_CONV_ACT_RELU; act++) {
                weft_conv2d_desc d = cv_desc(&CV_CASES[ci], TYPES[t], (weft_conv_act)act);
                cv_geom g = cv_geometry(&d);
                void *in = cv_random(d.dtype, g.nin, -1, 1), *w = cv_random(d.dtype, g.nw, -1, 1);
                void *bias = cv_random(d.dtype, d.k, -1, 1);
                snprintf(name, sizeof name, "%s %s%s", CV_CASES[ci].name, cv_type_name(d.dtype),
                         act ? " relu" : "");
                ran += (unsigned)gpu_case(name, &d, in, w, bias);
                free(in), free(w), free(bias);
            }
    printf("  %u cases ran (%u as the graph, %u split), %u refused by cuDNN; graph %s\n", ran,
           graphs, splits, refusals, graph_on ? "on" : "off");
    weft__conv_cuda_use_graph(1);
    no_case_over();
}

static void test_every_case_type_and_activation_matches_the_reference(void **state)
{
    (void)state;
    NEEDS_CUDNN();
    graph_on = 1;
    every_case();
}

/* The same through the legacy fused call (and its split path) alone: the
 * shapes the graph declines take it. */
static void test_every_case_matches_through_the_legacy_call(void **state)
{
    (void)state;
    NEEDS_CUDNN();
    graph_on = 0;
    every_case();
    graph_on = 1;
}

/* ResNet-50's shapes at a small batch, and TF32. */
static void test_resnet_shapes_and_tf32_match(void **state)
{
    (void)state;
    NEEDS_CUDNN();
    static const size_t SHAPES[][7] = {
        /* n, hw, c, k, r, stride, pad (n 1: the float64 reference runs on the host) */
        {1, 56, 64, 64, 3, 1, 1},   {1, 56, 64, 256, 1, 1, 0},   {1, 28, 128, 128, 3, 1, 1},
        {1, 56, 128, 128, 3, 2, 1}, {1, 14, 256, 1024, 1, 1, 0}, {1, 7, 512, 2048, 1, 1, 0},
    };
    char name[160];
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        for (int t = 0; t < 4; t++) {
            weft_conv2d_desc d = {.n = SHAPES[i][0],
                                  .h = SHAPES[i][1],
                                  .w = SHAPES[i][1],
                                  .c = SHAPES[i][2],
                                  .k = SHAPES[i][3],
                                  .r = SHAPES[i][4],
                                  .s = SHAPES[i][4],
                                  .stride_h = SHAPES[i][5],
                                  .stride_w = SHAPES[i][5],
                                  .pad_h = SHAPES[i][6],
                                  .pad_w = SHAPES[i][6],
                                  .dtype = TYPES[t % 3],
                                  .act = WEFT_CONV_ACT_RELU,
                                  .allow_tf32 = t == 3};
            if (t == 3 && i > 1)
                continue;
            cv_geom g = cv_geometry(&d);
            void *in = cv_random(d.dtype, g.nin, -1, 1), *w = cv_random(d.dtype, g.nw, -1, 1);
            void *bias = cv_random(d.dtype, d.k, -1, 1);
            snprintf(name, sizeof name, "resnet n%zu %zux%zu c%zu k%zu %zux%zu/%zu %s%s", d.n, d.h,
                     d.w, d.c, d.k, d.r, d.s, SHAPES[i][5], cv_type_name(d.dtype),
                     t == 3 ? " tf32" : "");
            gpu_case(name, &d, in, w, bias);
            free(in), free(w), free(bias);
        }
    no_case_over();
}

/* ---- the BatchNorm fold ---------------------------------------------------- */

/* The first of n elements whose bits differ (a NaN against any NaN is
 * equal: the GPU's arithmetic makes its own NaN's bits), or n. */
static size_t first_unequal(weft_dtype t, const void *a, const void *b, size_t n)
{
    size_t es = weft__dtype_size(t);
    for (size_t i = 0; i < n; i++) {
        if (isnan(weft__load(t, a, i)) && isnan(weft__load(t, b, i)))
            continue;
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es) != 0)
            return i;
    }
    return n;
}

static void test_the_fold_kernel_equals_the_host_bit_for_bit(void **state)
{
    (void)state;
    for (int t = 0; t < 3; t++)
        for (int bi = 0; bi < 3; bi++) {
            weft_conv2d_desc d = cv_desc(&CV_CASES[8], TYPES[t], WEFT_CONV_ACT_RELU);
            weft_dtype bt = TYPES[bi];
            cv_geom g = cv_geometry(&d);
            size_t es = weft__dtype_size(d.dtype), eb = weft__dtype_size(bt);
            const float eps = 1e-5f;
            void *w = cv_random(d.dtype, g.nw, -2, 2), *cb = cv_random(d.dtype, d.k, -1, 1);
            void *gamma = cv_random(bt, d.k, -1.5, 1.5), *beta = cv_random(bt, d.k, -1, 1);
            void *mean = cv_random(bt, d.k, -1, 1), *var = cv_random(bt, d.k, 0, 2);
            weft__store(bt, var, 3, -0.5f); /* a broken statistic: NaN on both */
            void *hw = cv_poisoned(d.dtype, g.nw), *hb = cv_poisoned(d.dtype, d.k);
            assert_ok(
                weft_conv2d_fold_bn(NULL, &d, bt, hw, hb, w, cb, gamma, beta, mean, var, eps));
            void *dw = gt_upload(w, g.nw * es), *dcb = gt_upload(cb, d.k * es);
            void *dg = gt_upload(gamma, d.k * eb), *dbt = gt_upload(beta, d.k * eb);
            void *dm = gt_upload(mean, d.k * eb), *dv = gt_upload(var, d.k * eb);
            void *dwf = gt_upload(hw, g.nw * es), *dbf = gt_upload(hb, d.k * es);
            assert_cuda(gt_memset(dwf, 0xff, g.nw * es));
            assert_cuda(gt_memset(dbf, 0xff, d.k * es));
            assert_ok(weft_conv2d_fold_bn(stream, &d, bt, dwf, dbf, dw, t == bi ? NULL : dcb, dg,
                                          dbt, dm, dv, eps));
            if (t == bi) /* without the conv bias: the host's again, without it */
                assert_ok(weft_conv2d_fold_bn(NULL, &d, bt, hw, hb, w, NULL, gamma, beta, mean, var,
                                              eps));
            assert_cuda(cudaStreamSynchronize(stream));
            void *gw = gt_download(dwf, g.nw * es), *gb = gt_download(dbf, d.k * es);
            size_t at = first_unequal(d.dtype, gw, hw, g.nw),
                   bt_at = first_unequal(d.dtype, gb, hb, d.k);
            if (at != g.nw || bt_at != d.k)
                fail_msg("fold %s weights, %s statistics: the GPU differs from the host at "
                         "weight %zu (%.9g against %.9g), bias %zu",
                         cv_type_name(d.dtype), cv_type_name(bt), at,
                         at < g.nw ? weft__load(d.dtype, gw, at) : 0.0,
                         at < g.nw ? weft__load(d.dtype, hw, at) : 0.0, bt_at);
            size_t per_k = g.nw / d.k;
            assert_true(isnan(weft__load(d.dtype, gw, 3 * per_k)));
            assert_true(isnan(weft__load(d.dtype, gb, 3)));
            free(w), free(cb), free(gamma), free(beta), free(mean), free(var), free(hw), free(hb);
            free(gw), free(gb);
            cudaFree(dw), cudaFree(dcb), cudaFree(dg), cudaFree(dbt), cudaFree(dm), cudaFree(dv);
            cudaFree(dwf), cudaFree(dbf);
        }
}

/* Fold on the GPU, convolve on the GPU, compare with the convolution
 * followed by a BatchNorm in float64. */
static void test_the_folded_conv_matches_conv_then_batchnorm(void **state)
{
    (void)state;
    NEEDS_CUDNN();
    static const size_t PICK[] = {1, 2, 3, 5, 8};
    char name[160];
    for (size_t pi = 0; pi < sizeof PICK / sizeof PICK[0]; pi++)
        for (int t = 0; t < 3; t++) {
            weft_conv2d_desc d = cv_desc(&CV_CASES[PICK[pi]], TYPES[t], WEFT_CONV_ACT_RELU);
            cv_geom g = cv_geometry(&d);
            size_t es = weft__dtype_size(d.dtype);
            const float eps = 1e-5f;
            void *in = cv_random(d.dtype, g.nin, -1, 1), *w = cv_random(d.dtype, g.nw, -1, 1);
            void *cb = cv_random(d.dtype, d.k, -1, 1);
            void *gamma = cv_random(WEFT_DTYPE_F32, d.k, 0.25, 1.5);
            void *beta = cv_random(WEFT_DTYPE_F32, d.k, -1, 1);
            void *mean = cv_random(WEFT_DTYPE_F32, d.k, -0.5, 0.5);
            void *var = cv_random(WEFT_DTYPE_F32, d.k, 0.05, 3);
            void *din = gt_upload(in, g.nin * es), *dw = gt_upload(w, g.nw * es);
            void *dcb = gt_upload(cb, d.k * es), *dg = gt_upload(gamma, d.k * 4);
            void *dbt = gt_upload(beta, d.k * 4), *dm = gt_upload(mean, d.k * 4);
            void *dv = gt_upload(var, d.k * 4), *dout = NULL;
            assert_cuda(cudaMalloc(&dout, g.nout * es));
            assert_cuda(gt_memset(dout, 0xff, g.nout * es));
            /* In place: the weights and the conv bias become the folded ones. */
            assert_ok(weft_conv2d_fold_bn(stream, &d, WEFT_DTYPE_F32, dw, dcb, dw, dcb, dg, dbt, dm,
                                          dv, eps));
            int rc = weft_conv2d(stream, &d, dout, din, dw, dcb);
            snprintf(name, sizeof name, "folded %s %s", CV_CASES[PICK[pi]].name,
                     cv_type_name(d.dtype));
            if (rc != WEFT_OK && is_refusal(rc) && !must_run(&d)) {
                printf("  REFUSED %s: %s\n", name, weft_last_error());
            } else {
                assert_ok(rc);
                assert_cuda(cudaStreamSynchronize(stream));
                void *got = gt_download(dout, g.nout * es);
                /* The float64 BN reference, as a relative norm: the conv
                 * with its folded weights rounded to the dtype. */
                double num = 0, den = 0;
                for (size_t b = 0; b < d.n; b++)
                    for (size_t y = 0; y < g.oh; y++)
                        for (size_t x = 0; x < g.ow; x++)
                            for (size_t o = 0; o < d.k; o++) {
                                double mag, v = cv_conv_at(&d, &g, in, w, b, y, x, o, &mag);
                                double sc = weft__load(WEFT_DTYPE_F32, gamma, o) /
                                            sqrt(weft__load(WEFT_DTYPE_F32, var, o) + eps);
                                double cbv = weft__load(d.dtype, cb, o);
                                v = v * sc + weft__load(WEFT_DTYPE_F32, beta, o) +
                                    (cbv - weft__load(WEFT_DTYPE_F32, mean, o)) * sc;
                                double want = v > 0 ? v : 0;
                                double gv =
                                    weft__load(d.dtype, got, ((b * g.oh + y) * g.ow + x) * d.k + o);
                                if (isnan(gv))
                                    fail_msg("%s: NaN at %zu %zu %zu %zu", name, b, y, x, o);
                                num += (gv - want) * (gv - want), den += want * want;
                            }
                double e = sqrt(num / (den > 0 ? den : 1));
                /* the folded weights' rounding adds about one more rounding */
                double lim = 2 * bound(&d);
                printf("  %-44s error %.2e (bound %.0e)\n", name, e, lim);
                if (!(e <= lim))
                    fail_msg("%s: error %.3g over %.3g", name, e, lim);
                free(got);
            }
            free(in), free(w), free(cb), free(gamma), free(beta), free(mean), free(var);
            cudaFree(din), cudaFree(dw), cudaFree(dcb), cudaFree(dg), cudaFree(dbt), cudaFree(dm);
            cudaFree(dv), cudaFree(dout);
        }
}

/* ---- plans, capture, tasks ------------------------------------------------ */

static void test_a_plan_is_made_once_and_found_on_repeat(void **state)
{
    (void)state;
    NEEDS_CUDNN();
    weft_conv2d_desc d = {.n = 4,
                          .h = 20,
                          .w = 20,
                          .c = 48,
                          .k = 80,
                          .r = 3,
                          .s = 3,
                          .stride_h = 1,
                          .stride_w = 1,
                          .pad_h = 1,
                          .pad_w = 1,
                          .dtype = WEFT_DTYPE_BF16,
                          .act = WEFT_CONV_ACT_RELU};
    cv_geom g = cv_geometry(&d);
    void *in = cv_random(d.dtype, g.nin, -1, 1), *w = cv_random(d.dtype, g.nw, -1, 1);
    void *bias = cv_random(d.dtype, d.k, -1, 1);
    void *din = gt_upload(in, g.nin * 2), *dw = gt_upload(w, g.nw * 2),
         *dbias = gt_upload(bias, d.k * 2);
    void *dout = NULL;
    assert_cuda(cudaMalloc(&dout, g.nout * 2));
    /* Through the graph: its plan (this thread's) made by the first call. */
    unsigned long long c0, p0, c1, p1, c2, p2;
    weft__conv_cuda_graph_stats(&c0, &p0);
    double t0 = gt_now();
    assert_ok(weft_conv2d(stream, &d, dout, din, dw, dbias));
    double t1 = gt_now();
    weft__conv_cuda_graph_stats(&c1, &p1);
    assert_ok(weft_conv2d(stream, &d, dout, din, dw, dbias));
    double t2 = gt_now();
    weft__conv_cuda_graph_stats(&c2, &p2);
    assert_cuda(cudaStreamSynchronize(stream));
    printf("  graph: first call %.1f us (plan made), second %.1f us (plan found)\n",
           (t1 - t0) * 1e6, (t2 - t1) * 1e6);
    assert_int_equal(p1 - p0, 1);
    assert_int_equal(p2 - p1, 0);
    assert_int_equal(c2 - c0, 2); /* bf16, channels of 8, ReLU: the graph takes it */

    /* Through the legacy call: its plan (the process's) likewise. */
    weft__conv_cuda_use_graph(0);
    unsigned long long h0, m0, s0, h1, m1, s1, h2, m2, s2;
    weft__conv_cuda_plan_stats(&h0, &m0, &s0);
    t0 = gt_now();
    assert_ok(weft_conv2d(stream, &d, dout, din, dw, dbias));
    t1 = gt_now();
    weft__conv_cuda_plan_stats(&h1, &m1, &s1);
    assert_ok(weft_conv2d(stream, &d, dout, din, dw, dbias));
    t2 = gt_now();
    weft__conv_cuda_plan_stats(&h2, &m2, &s2);
    weft__conv_cuda_use_graph(1);
    assert_cuda(cudaStreamSynchronize(stream));
    printf("  legacy: first call %.1f us (plan made), second %.1f us (plan found)\n",
           (t1 - t0) * 1e6, (t2 - t1) * 1e6);
    assert_int_equal(m1 - m0, 1);
    assert_int_equal(h1 - h0, 0);
    assert_int_equal(m2 - m1, 0);
    assert_int_equal(h2 - h1, 1);
    assert_int_equal(s2 - s0, 0); /* bf16, channels of 8, ReLU: the fused call */
    free(in), free(w), free(bias);
    cudaFree(din), cudaFree(dw), cudaFree(dbias), cudaFree(dout);
}

/* A convolution captured into a CUDA graph (no workspace then), after a
 * first call of its shape outside the capture, computes the same when the
 * graph is launched, twice. Returns 0 when the shape has no algorithm
 * that runs without a workspace (said, not a failure). */
static int captured_replay(const char *name, const weft_conv2d_desc *d)
{
    cv_geom g = cv_geometry(d);
    size_t es = weft__dtype_size(d->dtype);
    void *in = cv_random(d->dtype, g.nin, -1, 1), *w = cv_random(d->dtype, g.nw, -1, 1);
    void *bias = cv_random(d->dtype, d->k, -1, 1), *poison = cv_poisoned(d->dtype, g.nout);
    void *din = gt_upload(in, g.nin * es), *dw = gt_upload(w, g.nw * es);
    void *dbias = gt_upload(bias, d->k * es), *dout = gt_upload(poison, g.nout * es);
    assert_ok(weft_conv2d(stream, d, dout, din, dw, dbias)); /* the shape's first call */
    assert_cuda(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = weft_conv2d(stream, d, dout, din, dw, dbias);
    char why[512];
    snprintf(why, sizeof why, "%s", rc == WEFT_OK ? "" : weft_last_error());
    cudaError_t end = cudaStreamEndCapture(stream, &graph);
    int replayed = 0;
    if (rc == WEFT_EINVAL && strstr(why, "without a workspace")) {
        printf("  REFUSED %s inside the capture: %s\n", name, why);
        if (end == cudaSuccess)
            cudaGraphDestroy(graph);
        goto out;
    }
    if (rc != WEFT_OK)
        fail_msg("%s: weft_conv2d inside the capture returned %d: %s", name, rc, why);
    if (end != cudaSuccess)
        fail_msg("%s: cudaStreamEndCapture: %s (cuDNN did something a capture forbids)", name,
                 cudaGetErrorString(end));
    assert_cuda(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 2; i++) {
        assert_cuda(gt_copy_in(dout, poison, g.nout * es));
        assert_cuda(cudaGraphLaunch(exec, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        void *got = gt_download(dout, g.nout * es);
        size_t nan_at;
        double e = cv_rel_error(d, in, w, bias, got, &nan_at);
        printf("  %s replay %d: error %.2e\n", name, i, e);
        if (!(e <= bound(d)) || nan_at != (size_t)-1)
            fail_msg("%s replay %d: error %.3g, NaN at %zd", name, i, e, (ssize_t)nan_at);
        free(got);
    }
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    replayed = 1;
out:
    free(in), free(w), free(bias), free(poison);
    cudaFree(din), cudaFree(dw), cudaFree(dbias), cudaFree(dout);
    return replayed;
}

static void test_a_captured_conv_replays_right(void **state)
{
    (void)state;
    NEEDS_CUDNN();
    weft_conv2d_desc d3 = {.n = 2,
                           .h = 28,
                           .w = 28,
                           .c = 64,
                           .k = 64,
                           .r = 3,
                           .s = 3,
                           .pad_h = 1,
                           .pad_w = 1,
                           .dtype = WEFT_DTYPE_F16,
                           .act = WEFT_CONV_ACT_RELU};
    weft_conv2d_desc d1 = {.n = 2,
                           .h = 14,
                           .w = 14,
                           .c = 64,
                           .k = 256,
                           .r = 1,
                           .s = 1,
                           .dtype = WEFT_DTYPE_BF16,
                           .act = WEFT_CONV_ACT_RELU};
    int n = captured_replay("fp16 3x3 64->64", &d3) + captured_replay("bf16 1x1 64->256", &d1);
    if (n == 0)
        fail_msg("neither shape has an algorithm that runs without a workspace: no capture "
                 "was replayed");
}

enum { TASKS = 16, ROUNDS = 4 };

typedef struct job {
    weft_conv2d_desc d;
    void *in, *w, *bias, *out; /* device */
} job;

static void *job_main(void *arg)
{
    job *j = arg;
    for (int r = 0; r < ROUNDS; r++)
        if (!GT_OK(weft_conv2d(WEFT_TASK_STREAM, &j->d, j->out, j->in, j->w, j->bias)))
            return NULL;
    GT_OK(weft_await());
    return NULL;
}

/* Tasks on worker threads, each with its thread's cuDNN handle and its
 * stream's workspace, four shapes racing to publish their plans. Their
 * stacks are of 1 MiB, as weft_conv2d asks of a task (cuDNN 9's entry
 * points take ~64 KiB of stack and its heuristic frames of up to 122 KiB
 * more, unprobed: on the default 256 KiB they can step over the guard
 * page into the stack below, a fault that comes later and elsewhere). */
static void test_many_tasks_on_their_own_streams_at_once(void **state)
{
    (void)state;
    NEEDS_CUDNN();
    weft_config cfg = {.workers = 8, .backend = WEFT_BACKEND_CUDA, .stack_size = 1 << 20};
    weft_runtime *rt = NULL;
    assert_ok(weft_runtime_create(&rt, &cfg));
    static job jobs[TASKS];
    void *host[TASKS][3];
    weft_task *tasks[TASKS];
    gt_reset();
    for (int t = 0; t < TASKS; t++) {
        weft_conv2d_desc d = {.n = 2,
                              .h = 12 + 2 * (size_t)(t % 4),
                              .w = 14,
                              .c = 32,
                              .k = 40,
                              .r = 3,
                              .s = 3,
                              .pad_h = 1,
                              .pad_w = 1,
                              .dtype = WEFT_DTYPE_BF16,
                              .act = WEFT_CONV_ACT_RELU};
        cv_geom g = cv_geometry(&d);
        host[t][0] = cv_random(d.dtype, g.nin, -1, 1), host[t][1] = cv_random(d.dtype, g.nw, -1, 1);
        host[t][2] = cv_random(d.dtype, d.k, -1, 1);
        jobs[t].d = d;
        jobs[t].in = gt_upload(host[t][0], g.nin * 2), jobs[t].w = gt_upload(host[t][1], g.nw * 2);
        jobs[t].bias = gt_upload(host[t][2], d.k * 2);
        assert_cuda(cudaMalloc(&jobs[t].out, g.nout * 2));
        assert_cuda(gt_memset(jobs[t].out, 0xff, g.nout * 2));
    }
    for (int t = 0; t < TASKS; t++)
        assert_ok(weft_spawn(rt, &tasks[t], job_main, &jobs[t], NULL));
    for (int t = 0; t < TASKS; t++)
        assert_ok(weft_join(tasks[t], NULL));
    gt_assert_passed();
    for (int t = 0; t < TASKS; t++) {
        cv_geom g = cv_geometry(&jobs[t].d);
        void *got = gt_download(jobs[t].out, g.nout * 2);
        size_t nan_at;
        double e = cv_rel_error(&jobs[t].d, host[t][0], host[t][1], host[t][2], got, &nan_at);
        if (!(e <= bound(&jobs[t].d)) || nan_at != (size_t)-1)
            fail_msg("task %d: error %.3g, NaN at %zd", t, e, (ssize_t)nan_at);
        free(got);
        for (int i = 0; i < 3; i++)
            free(host[t][i]);
        cudaFree(jobs[t].in), cudaFree(jobs[t].w), cudaFree(jobs[t].bias), cudaFree(jobs[t].out);
    }
    assert_ok(weft_runtime_destroy(rt));
}

/* ---- bad arguments ---------------------------------------------------- */

static void test_bad_arguments_are_refused_before_launch(void **state)
{
    (void)state;
    NEEDS_CUDNN();
    weft_conv2d_desc d = {.n = 1,
                          .h = 8,
                          .w = 8,
                          .c = 8,
                          .k = 8,
                          .r = 3,
                          .s = 3,
                          .pad_h = 1,
                          .pad_w = 1,
                          .dtype = WEFT_DTYPE_BF16};
    size_t nio = 8 * 8 * 8;
    char *buf = NULL;
    assert_cuda(cudaMalloc((void **)&buf, 4 * nio * 2 + 256));
    assert_cuda(gt_memset(buf, 0x5a, 4 * nio * 2 + 256));
    char *in = buf, *w = buf + nio * 2 + 64, *bias = buf + 2 * nio * 2 + 128;
    char *out = buf + 3 * nio * 2 + 192;
    assert_rc(weft_conv2d(stream, &d, out, in + 1, w, bias), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "in is not aligned"));
    assert_rc(weft_conv2d(stream, &d, out, in, w, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "bias is NULL"));
    d.groups = 3;
    assert_rc(weft_conv2d(stream, &d, out, in, w, bias), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "must divide"));
    d.groups = 1;
    assert_rc(weft_conv2d(stream, &d, out, out + 2, w, bias), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "overlaps"));
    assert_rc(
        weft_conv2d_fold_bn(stream, &d, WEFT_DTYPE_F32, out, bias, w, NULL, in, in, in, in, 0.0f),
        WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "eps must be > 0"));
    /* Past cuDNN's int counts: refused by weft before cuDNN sees it (the
     * pointers are never read). */
    weft_conv2d_desc big = d; /* 3x3, padded */
    big.n = big.h = big.w = 1024;
    void *far_in = (void *)((uintptr_t)1 << 44), *far_out = (void *)((uintptr_t)1 << 45);
    assert_rc(weft_conv2d(stream, &big, far_out, far_in, w, bias), WEFT_EINVAL);
    printf("  %s\n", weft_last_error());
    assert_non_null(strstr(weft_last_error(), "in int"));
    assert_cuda(cudaStreamSynchronize(stream));
    unsigned char *h = gt_download(buf, 4 * nio * 2 + 256);
    for (size_t i = 0; i < 4 * nio * 2 + 256; i++)
        assert_int_equal(h[i], 0x5a);
    free(h);
    cudaFree(buf);
}

/* A CUDA build without cuDNN: the stream call says so, before anything is
 * enqueued, and the fold (a kernel of weft's) still runs. */
static void test_without_cudnn_the_call_says_so(void **state)
{
    (void)state;
#ifdef WEFT_HAVE_CUDNN
    skip();
#endif
    /* A 3x3 convolution: a 1x1 one runs as a matrix product, without cuDNN. */
    weft_conv2d_desc d3 = {
        .n = 1, .h = 4, .w = 4, .c = 8, .k = 8, .r = 3, .s = 3, .dtype = WEFT_DTYPE_F32};
    weft_conv2d_desc d = {
        .n = 1, .h = 4, .w = 4, .c = 8, .k = 8, .r = 1, .s = 1, .dtype = WEFT_DTYPE_F32};
    float *buf = NULL;
    assert_cuda(cudaMalloc((void **)&buf, 4 * 1024 * sizeof *buf));
    assert_rc(weft_conv2d(stream, &d3, buf, buf + 1024, buf + 2048, buf + 3072), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "built without cuDNN"));
    assert_cuda(gt_memset(buf, 0, 4 * 128 * sizeof *buf));
    assert_ok(weft_conv2d_fold_bn(stream, &d, WEFT_DTYPE_F32, buf, buf + 64, buf + 128, NULL,
                                  buf + 256, buf + 264, buf + 272, buf + 280, 1.0f));
    assert_cuda(cudaStreamSynchronize(stream));
    cudaFree(buf);
}

/* ---- main ------------------------------------------------------------------ */

static int setup(void **state)
{
    (void)state;
    cv_rng_state = gt_rng(41);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.conv");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_case_type_and_activation_matches_the_reference),
        cmocka_unit_test(test_every_case_matches_through_the_legacy_call),
        cmocka_unit_test(test_resnet_shapes_and_tf32_match),
        cmocka_unit_test(test_the_fold_kernel_equals_the_host_bit_for_bit),
        cmocka_unit_test(test_the_folded_conv_matches_conv_then_batchnorm),
        cmocka_unit_test(test_a_plan_is_made_once_and_found_on_repeat),
        cmocka_unit_test(test_a_captured_conv_replays_right),
        cmocka_unit_test(test_many_tasks_on_their_own_streams_at_once),
        cmocka_unit_test(test_bad_arguments_are_refused_before_launch),
        cmocka_unit_test(test_without_cudnn_the_call_says_so),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
