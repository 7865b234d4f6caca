/*
 * test_moe_gpu.c - the mixture-of-experts calls on the GPU against the host
 * reference and the float64 loops of moe_ref.h, on fresh random data: the
 * router for every score function, renormalised or not, k of 1, 2 and 8, 8
 * to 256 experts, 1 to 8192 tokens, with exact ties and NaN logits, its ids
 * and tables equal to the host's bit for bit and its weights within 1e-5 of
 * them (relative; the softmax's sum runs in another order); permute and
 * combine equal to the host's bit for bit; the grouped matmul (both load
 * paths) against float64 with groups of no rows, one row and many, and a
 * table out of range clamped without a fault; a whole layer (router,
 * permute, grouped matmul, combine) captured into a CUDA graph and replayed
 * on new inputs; bad arguments refused before anything is enqueued. Outputs
 * are poisoned first and must be completely written. The router's time at
 * 8192 tokens x 64 experts, k 8 is printed (not asserted: bench/moe/
 * measures it).
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>
#include <math.h>

#include "ops/moe_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

#define assert_weft(expr)                                                                          \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != WEFT_OK)                                                                        \
            fail_msg("%s: %d %s", #expr, rc_, weft_last_error());                                  \
    } while (0)

static void *poisoned_dev(size_t bytes)
{
    void *p = NULL;
    assert_cuda(cudaMalloc(&p, bytes ? bytes : 1));
    assert_cuda(gt_memset(p, 0xa7, bytes));
    return p;
}

typedef struct dev_routing {
    moe_host_routing d; /* device pointers */
} dev_routing;

static dev_routing routing_dev(size_t tokens, size_t experts, size_t k)
{
    dev_routing r;
    r.d.weights = poisoned_dev(tokens * k * 4);
    r.d.ids = poisoned_dev(tokens * k * 4);
    r.d.offsets = poisoned_dev((experts + 1) * 4);
    r.d.perm = poisoned_dev(tokens * k * 4);
    r.d.inverse = poisoned_dev(tokens * k * 4);
    return r;
}

static moe_host_routing routing_down(const dev_routing *r, size_t tokens, size_t experts, size_t k)
{
    moe_host_routing h;
    h.weights = gt_download(r->d.weights, tokens * k * 4);
    h.ids = gt_download(r->d.ids, tokens * k * 4);
    h.offsets = gt_download(r->d.offsets, (experts + 1) * 4);
    h.perm = gt_download(r->d.perm, tokens * k * 4);
    h.inverse = gt_download(r->d.inverse, tokens * k * 4);
    return h;
}

static void routing_dev_free(dev_routing *r)
{
    cudaFree(r->d.weights), cudaFree(r->d.ids), cudaFree(r->d.offsets);
    cudaFree(r->d.perm), cudaFree(r->d.inverse);
}

/* The first difference of two int32 tables, printed; 1 if any. */
static int same_table(const char *name, const char *what, const int32_t *gpu, const int32_t *host,
                      size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (gpu[i] != host[i]) {
            printf("  %s: %s[%zu] is %d on the GPU, %d on the host\n", name, what, i, (int)gpu[i],
                   (int)host[i]);
            return 0;
        }
    return 1;
}

static unsigned cases_failed;

/* One router call on the GPU against the host's and float64. */
static void gate_case(weft_dtype t, weft_moe_score score, int renorm, size_t tokens, size_t experts,
                      size_t k, int ties, int nans)
{
    char name[160];
    snprintf(name, sizeof name, "gate dtype %d score %d renorm %d T %zu E %zu k %zu ties %d nan %d",
             (int)t, (int)score, renorm, tokens, experts, k, ties, nans);
    size_t stride = experts + (tokens % 3), es = weft__dtype_size(t);
    size_t n = (tokens - 1) * stride + experts;
    void *logits = moe_logits(t, tokens, experts, stride, ties);
    for (int i = 0; i < nans; i++)
        weft__store(t, logits, (moe_rng() % tokens) * stride + moe_rng() % experts, NAN);
    void *dlogits = gt_upload(logits, n * es);
    dev_routing dr = routing_dev(tokens, experts, k);
    weft_moe_routing o = moe_as_routing(&dr.d);
    assert_weft(weft_moe_gate(stream, t, score, renorm, dlogits, tokens, experts, stride, k, &o));
    assert_cuda(cudaStreamSynchronize(stream));
    moe_host_routing g = routing_down(&dr, tokens, experts, k);
    moe_host_routing h = moe_routing_poisoned(tokens, experts, k);
    weft_moe_routing ho = moe_as_routing(&h);
    assert_weft(weft_moe_gate(NULL, t, score, renorm, logits, tokens, experts, stride, k, &ho));

    size_t pairs = tokens * k;
    int ok = same_table(name, "ids", g.ids, h.ids, pairs) &&
             same_table(name, "offsets", g.offsets, h.offsets, experts + 1) &&
             same_table(name, "perm", g.perm, h.perm, pairs) &&
             same_table(name, "inverse", g.inverse, h.inverse, pairs);
    for (size_t i = 0; ok && i < pairs; i++) {
        float a = g.weights[i], b = h.weights[i];
        if (isnan(a) != isnan(b) || (!isnan(b) && !(fabsf(a - b) <= 1e-5f * fabsf(b) + 1e-30f))) {
            printf("  %s: weight %zu is %.9g on the GPU, %.9g on the host\n", name, i, a, b);
            ok = 0;
        }
    }
    if (ok && !nans &&
        moe_check_gate(name, t, score, renorm, logits, tokens, experts, stride, k, &g) != 0)
        ok = 0;
    if (!ok)
        cases_failed++;
    moe_routing_free(&g), moe_routing_free(&h);
    routing_dev_free(&dr);
    cudaFree(dlogits);
    free(logits);
}

static void no_case_failed(void)
{
    unsigned n = cases_failed;
    cases_failed = 0;
    if (n)
        fail_msg("%u cases failed (each listed above)", n);
}

static void test_gate_equals_the_host_for_every_score_k_and_size(void **state)
{
    (void)state;
    static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
    static const size_t EXPERTS[] = {8, 60, 64, 256}, TOKENS[] = {1, 17, 1000}, KS[] = {1, 2, 8};
    /* Under compute-sanitizer every launch is far slower: a quarter of the
     * cases, each size still met. */
    const unsigned every = gt_sanitizer() ? 4 : 1;
    unsigned n = 0;
    for (size_t ti = 0; ti < 3; ti++)
        for (int score = 0; score < 2; score++)
            for (int renorm = 0; renorm < 2; renorm++)
                for (size_t ei = 0; ei < 4; ei++)
                    for (size_t ki = 0; ki < 3; ki++)
                        for (size_t ni = 0; ni < 3; ni++)
                            if (n++ % every == 0)
                                gate_case(TYPES[ti], (weft_moe_score)score, renorm, TOKENS[ni],
                                          EXPERTS[ei], KS[ki], (int)(ni + ki) % 2, 0);
    /* NaN logits: the same ids and tables, NaN weights where the host has them. */
    for (int score = 0; score < 2; score++)
        gate_case(WEFT_DTYPE_F32, (weft_moe_score)score, 1, 200, 64, 8, 1, 50);
    /* The size the router is made for. */
    gate_case(WEFT_DTYPE_BF16, WEFT_MOE_SOFTMAX, 1, 8192, 64, 8, 0, 0);
    gate_case(WEFT_DTYPE_BF16, WEFT_MOE_SIGMOID, 1, 4096, 256, 8, 1, 0);
    no_case_failed();
}

/* Permute and combine on the tables of a GPU router, both load widths
 * (cols of 16-byte rows, and odd ones), with and without the residual:
 * bit for bit the host's. */
static void test_permute_and_combine_equal_the_host(void **state)
{
    (void)state;
    static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
    static const size_t COLS[] = {64, 37};
    for (int ti = 0; ti < 3; ti++)
        for (int ci = 0; ci < 2; ci++)
            for (int with_res = 0; with_res < 2; with_res++) {
                weft_dtype t = TYPES[ti];
                size_t tokens = 333, experts = 60, k = 4, cols = COLS[ci], es = weft__dtype_size(t);
                size_t in_stride = cols + (ci ? 3 : 8), out_stride = cols + (ci ? 1 : 0);
                void *logits = moe_logits(WEFT_DTYPE_F32, tokens, experts, experts, 1);
                void *dlogits = gt_upload(logits, tokens * experts * 4);
                dev_routing dr = routing_dev(tokens, experts, k);
                weft_moe_routing o = moe_as_routing(&dr.d);
                assert_weft(weft_moe_gate(stream, WEFT_DTYPE_F32, WEFT_MOE_SOFTMAX, 1, dlogits,
                                          tokens, experts, experts, k, &o));
                size_t nx = (tokens - 1) * in_stride + cols;
                size_t ny = (tokens * k - 1) * out_stride + cols,
                       nout = (tokens - 1) * out_stride + cols;
                void *x = moe_random(t, nx, 2.0), *res = with_res ? moe_random(t, nout, 1.0) : NULL;
                void *dx = gt_upload(x, nx * es), *dres = res ? gt_upload(res, nout * es) : NULL;
                void *dy = poisoned_dev(ny * es), *dout = poisoned_dev(nout * es);
                assert_weft(weft_moe_permute(stream, t, dy, dx, dr.d.perm, tokens, k, cols,
                                             in_stride, out_stride));
                assert_weft(weft_moe_unpermute(stream, t, dout, dy, dr.d.weights, dr.d.inverse,
                                               dres, tokens, k, cols, out_stride, out_stride));
                assert_cuda(cudaStreamSynchronize(stream));
                moe_host_routing g = routing_down(&dr, tokens, experts, k);
                void *gy = gt_download(dy, ny * es), *gout = gt_download(dout, nout * es);
                void *hy = moe_poisoned(ny * es), *hout = moe_poisoned(nout * es);
                assert_weft(weft_moe_permute(NULL, t, hy, x, g.perm, tokens, k, cols, in_stride,
                                             out_stride));
                assert_weft(weft_moe_unpermute(NULL, t, hout, hy, g.weights, g.inverse, res, tokens,
                                               k, cols, out_stride, out_stride));
                if (memcmp(gy, hy, ny * es) != 0)
                    fail_msg("dtype %d cols %zu: the GPU's permuted rows differ from the host's",
                             (int)t, cols);
                for (size_t i = 0; i < nout * es; i++)
                    if (((unsigned char *)gout)[i] != ((unsigned char *)hout)[i])
                        fail_msg("dtype %d cols %zu residual %d: combined byte %zu differs "
                                 "(element %zu: GPU %.9g, host %.9g)",
                                 (int)t, cols, with_res, i, i / es, weft__load(t, gout, i / es),
                                 weft__load(t, hout, i / es));
                moe_routing_free(&g);
                routing_dev_free(&dr);
                free(logits), free(x), free(res), free(gy), free(gout), free(hy), free(hout);
                cudaFree(dlogits), cudaFree(dx), cudaFree(dres), cudaFree(dy), cudaFree(dout);
            }
}

/* One grouped matmul on the GPU against float64; offsets on the device.
 * d.bias non-NULL asks for a random bias. */
static void grouped_case(const char *name, weft_grouped_matmul_desc d, const int32_t *offsets,
                         int misalign)
{
    size_t ldx = d.ldx ? d.ldx : d.k, ldy = d.ldy ? d.ldy : d.n;
    size_t nx = (d.rows - 1) * ldx + d.k, ny = (d.rows - 1) * ldy + d.n, nw = d.groups * d.n * d.k;
    void *x = moe_random(d.type, nx, 1.0), *w = moe_random(d.type, nw, 1.0);
    void *bias = d.bias ? moe_random(d.type, d.groups * d.n, 1.0) : NULL;
    /* misalign: X one element into its buffer, which takes the plain loads. */
    char *dxbuf = poisoned_dev(nx * 2 + 2);
    assert_cuda(gt_copy_in(dxbuf + (misalign ? 2 : 0), x, nx * 2));
    void *dw = gt_upload(w, nw * 2), *dbias = bias ? gt_upload(bias, d.groups * d.n * 2) : NULL;
    void *dy = poisoned_dev(ny * 2), *doff = gt_upload(offsets, (d.groups + 1) * 4);
    weft_grouped_matmul_desc gd = d;
    gd.bias = dbias;
    assert_weft(weft_grouped_matmul(stream, &gd, dy, dxbuf + (misalign ? 2 : 0), dw, doff));
    assert_cuda(cudaStreamSynchronize(stream));
    void *y = gt_download(dy, ny * 2);
    d.bias = bias;
    size_t bad = moe_check_grouped(name, &d, y, x, w, offsets, 1.0);
    if (bad) {
        printf("  %s: %zu mistakes\n", name, bad);
        cases_failed++;
    }
    free(x), free(w), free(bias), free(y);
    cudaFree(dxbuf), cudaFree(dw), cudaFree(dbias), cudaFree(dy), cudaFree(doff);
}

static void test_grouped_matmul_matches_float64(void **state)
{
    (void)state;
    char name[128];
    /* Groups of 0, 1, many rows, a last one empty; rows past the table. */
    int32_t small[] = {0, 0, 1, 38, 38, 290, 290};
    for (int t = 0; t < 2; t++)
        for (int act = 0; act <= WEFT_MATMUL_ACT_GELU_ERF; act++)
            for (int path = 0; path < 3; path++) {
                weft_grouped_matmul_desc d = {.groups = 6,
                                              .rows = 300,
                                              .n = path == 2 ? 200 : 136,
                                              .k = path == 1 ? 70 : 96,
                                              .type = t ? WEFT_DTYPE_F16 : WEFT_DTYPE_BF16,
                                              .ldx = path == 2 ? 104 : 0,
                                              .ldy = path == 2 ? 203 : 0,
                                              .act = (weft_matmul_act)act,
                                              /* a flag here: grouped_case makes the bias */
                                              .bias = act % 2 ? (void *)1 : NULL};
                snprintf(name, sizeof name, "grouped type %d act %d path %d", (int)d.type, act,
                         path);
                grouped_case(name, d, small, path == 1);
            }
    /* Mixtral-like proportions, smaller: 8 groups from a real router. */
    size_t tokens = 512, experts = 8, k = 2;
    void *logits = moe_logits(WEFT_DTYPE_F32, tokens, experts, experts, 0);
    moe_host_routing h = moe_routing_poisoned(tokens, experts, k);
    weft_moe_routing ho = moe_as_routing(&h);
    assert_weft(weft_moe_gate(NULL, WEFT_DTYPE_F32, WEFT_MOE_SOFTMAX, 1, logits, tokens, experts,
                              experts, k, &ho));
    weft_grouped_matmul_desc d = {
        .groups = experts, .rows = tokens * k, .n = 384, .k = 512, .type = WEFT_DTYPE_BF16};
    grouped_case("grouped 8 experts", d, h.offsets, 0);
    moe_routing_free(&h);
    free(logits);
    no_case_failed();
}

/* A table out of range runs without a fault and writes only Y's rows. */
static void test_grouped_matmul_clamps_a_bad_table(void **state)
{
    (void)state;
    weft_grouped_matmul_desc d = {
        .groups = 3, .rows = 40, .n = 64, .k = 64, .type = WEFT_DTYPE_BF16};
    int32_t bad[] = {-100, 30, 10, 1000};
    size_t guard = 4096;
    void *dx = poisoned_dev(40 * 64 * 2), *dw = poisoned_dev(3 * 64 * 64 * 2);
    char *dy = poisoned_dev(40 * 64 * 2 + 2 * guard);
    void *doff = gt_upload(bad, sizeof bad);
    assert_cuda(gt_memset(dx, 0, 40 * 64 * 2));
    assert_weft(weft_grouped_matmul(stream, &d, dy + guard, dx, dw, doff));
    assert_cuda(cudaStreamSynchronize(stream));
    unsigned char *y = gt_download(dy, 40 * 64 * 2 + 2 * guard);
    for (size_t i = 0; i < guard; i++)
        if (y[i] != 0xa7 || y[guard + 40 * 64 * 2 + i] != 0xa7)
            fail_msg("byte %zu of the guards around Y was written", i);
    free(y);
    cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(doff);
}

/* ---- a whole layer, captured ------------------------------------------ */

typedef struct layer {
    size_t tokens, experts, k, hidden, n;
    void *logits, *x, *w, *xp, *yp, *out; /* device */
    dev_routing r;
} layer;

static void layer_enqueue(layer *L)
{
    weft_moe_routing o = moe_as_routing(&L->r.d);
    weft_grouped_matmul_desc d = {.groups = L->experts,
                                  .rows = L->tokens * L->k,
                                  .n = L->n,
                                  .k = L->hidden,
                                  .type = WEFT_DTYPE_BF16,
                                  .act = WEFT_MATMUL_ACT_GELU_TANH};
    assert_weft(weft_moe_gate(stream, WEFT_DTYPE_BF16, WEFT_MOE_SOFTMAX, 1, L->logits, L->tokens,
                              L->experts, L->experts, L->k, &o));
    assert_weft(weft_moe_permute(stream, WEFT_DTYPE_BF16, L->xp, L->x, L->r.d.perm, L->tokens, L->k,
                                 L->hidden, L->hidden, L->hidden));
    assert_weft(weft_grouped_matmul(stream, &d, L->yp, L->xp, L->w, L->r.d.offsets));
    assert_weft(weft_moe_unpermute(stream, WEFT_DTYPE_BF16, L->out, L->yp, L->r.d.weights,
                                   L->r.d.inverse, NULL, L->tokens, L->k, L->n, L->n, L->n));
}

/* The same layer on the host from the same inputs; the relative error of
 * the GPU's output in the 2-norm, and the tables compared exactly. */
static double layer_check(layer *L, const void *logits, const void *x, const void *w)
{
    size_t T = L->tokens, E = L->experts, k = L->k, H = L->hidden, n = L->n;
    moe_host_routing h = moe_routing_poisoned(T, E, k);
    weft_moe_routing ho = moe_as_routing(&h);
    void *xp = malloc(T * k * H * 2), *yp = malloc(T * k * n * 2), *out = malloc(T * n * 2);
    weft_grouped_matmul_desc d = {.groups = E,
                                  .rows = T * k,
                                  .n = n,
                                  .k = H,
                                  .type = WEFT_DTYPE_BF16,
                                  .act = WEFT_MATMUL_ACT_GELU_TANH};
    assert_weft(weft_moe_gate(NULL, WEFT_DTYPE_BF16, WEFT_MOE_SOFTMAX, 1, logits, T, E, E, k, &ho));
    assert_weft(weft_moe_permute(NULL, WEFT_DTYPE_BF16, xp, x, h.perm, T, k, H, H, H));
    assert_weft(weft_grouped_matmul(NULL, &d, yp, xp, w, h.offsets));
    assert_weft(weft_moe_unpermute(NULL, WEFT_DTYPE_BF16, out, yp, h.weights, h.inverse, NULL, T, k,
                                   n, n, n));
    moe_host_routing g = routing_down(&L->r, T, E, k);
    if (!same_table("layer", "perm", g.perm, h.perm, T * k) ||
        !same_table("layer", "offsets", g.offsets, h.offsets, E + 1))
        fail_msg("the replayed router's tables differ from the host's");
    void *got = gt_download(L->out, T * n * 2);
    double num = 0, den = 0;
    for (size_t i = 0; i < T * n; i++) {
        double a = weft__load(WEFT_DTYPE_BF16, got, i), b = weft__load(WEFT_DTYPE_BF16, out, i);
        num += (a - b) * (a - b), den += b * b;
    }
    moe_routing_free(&g), moe_routing_free(&h);
    free(xp), free(yp), free(out), free(got);
    return sqrt(num / (den > 0 ? den : 1));
}

static void test_a_captured_layer_replays_on_new_inputs(void **state)
{
    (void)state;
    layer L = {.tokens = 300, .experts = 8, .k = 2, .hidden = 256, .n = 192};
    size_t T = L.tokens, E = L.experts, k = L.k, H = L.hidden, n = L.n;
    L.logits = poisoned_dev(T * E * 2), L.x = poisoned_dev(T * H * 2);
    void *w = moe_random(WEFT_DTYPE_BF16, E * n * H, 0.1);
    L.w = gt_upload(w, E * n * H * 2);
    L.xp = poisoned_dev(T * k * H * 2), L.yp = poisoned_dev(T * k * n * 2);
    L.out = poisoned_dev(T * n * 2);
    L.r = routing_dev(T, E, k);

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    layer_enqueue(&L);
    assert_cuda(cudaStreamEndCapture(stream, &graph));
    assert_cuda(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 0; round < 2; round++) {
        void *logits = moe_logits(WEFT_DTYPE_BF16, T, E, E, round);
        void *x = moe_random(WEFT_DTYPE_BF16, T * H, 1.0);
        assert_cuda(gt_copy_in(L.logits, logits, T * E * 2));
        assert_cuda(gt_copy_in(L.x, x, T * H * 2));
        assert_cuda(gt_memset(L.out, 0xa7, T * n * 2));
        assert_cuda(cudaGraphLaunch(exec, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        double e = layer_check(&L, logits, x, w);
        printf("  replay %d: relative error %.3g against the host\n", round, e);
        if (!(e <= 1e-2))
            fail_msg("replay %d: relative error %.3g over 1e-2", round, e);
        free(logits), free(x);
    }
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    free(w);
    cudaFree(L.logits), cudaFree(L.x), cudaFree(L.w), cudaFree(L.xp), cudaFree(L.yp);
    cudaFree(L.out);
    routing_dev_free(&L.r);
}

/* ---- bad arguments, and the router's time ------------------------------ */

static void test_bad_arguments_are_refused_before_launch(void **state)
{
    (void)state;
    dev_routing r = routing_dev(16, 8, 2);
    weft_moe_routing o = moe_as_routing(&r.d);
    void *logits = poisoned_dev(16 * 8 * 4);
    assert_int_equal(
        weft_moe_gate(stream, WEFT_DTYPE_F32, WEFT_MOE_SOFTMAX, 1, logits, 16, 8, 8, 9, &o),
        WEFT_EINVAL);
    assert_int_equal(
        weft_moe_gate(stream, WEFT_DTYPE_F32, WEFT_MOE_SOFTMAX, 1, logits, 16, 300, 300, 2, &o),
        WEFT_EINVAL);
    o.offsets = NULL;
    assert_int_equal(
        weft_moe_gate(stream, WEFT_DTYPE_F32, WEFT_MOE_SOFTMAX, 1, logits, 16, 8, 8, 2, &o),
        WEFT_EINVAL);
    weft_grouped_matmul_desc d = {.groups = 8, .rows = 32, .n = 8, .k = 8, .type = WEFT_DTYPE_F32};
    assert_int_equal(weft_grouped_matmul(stream, &d, r.d.weights, logits, logits, r.d.offsets),
                     WEFT_EINVAL);
    assert_cuda(cudaStreamSynchronize(stream));
    uint32_t *ids = gt_download(r.d.ids, 16 * 2 * 4), *off = gt_download(r.d.offsets, 9 * 4);
    for (size_t i = 0; i < 32; i++)
        assert_int_equal(ids[i], 0xa7a7a7a7u);
    for (size_t i = 0; i < 9; i++)
        assert_int_equal(off[i], 0xa7a7a7a7u);
    free(ids), free(off);
    routing_dev_free(&r);
    cudaFree(logits);
}

static void test_router_time_at_8192_tokens_64_experts_k8(void **state)
{
    (void)state;
    size_t T = 8192, E = 64, k = 8;
    void *logits = moe_logits(WEFT_DTYPE_BF16, T, E, E, 0);
    void *dl = gt_upload(logits, T * E * 2);
    dev_routing r = routing_dev(T, E, k);
    weft_moe_routing o = moe_as_routing(&r.d);
    cudaEvent_t a, b;
    assert_cuda(cudaEventCreate(&a));
    assert_cuda(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++)
        assert_weft(
            weft_moe_gate(stream, WEFT_DTYPE_BF16, WEFT_MOE_SOFTMAX, 1, dl, T, E, E, k, &o));
    assert_cuda(cudaEventRecord(a, stream));
    for (int i = 0; i < 20; i++)
        assert_weft(
            weft_moe_gate(stream, WEFT_DTYPE_BF16, WEFT_MOE_SOFTMAX, 1, dl, T, E, E, k, &o));
    assert_cuda(cudaEventRecord(b, stream));
    assert_cuda(cudaEventSynchronize(b));
    float ms = 0;
    assert_cuda(cudaEventElapsedTime(&ms, a, b));
    printf("  weft_moe_gate 8192 x 64, k 8, bf16: %.1f us a call\n", ms * 1000 / 20);
    cudaEventDestroy(a), cudaEventDestroy(b);
    routing_dev_free(&r);
    cudaFree(dl);
    free(logits);
}

/* ---- main ------------------------------------------------------------------ */

static int setup(void **state)
{
    (void)state;
    moe_rng_state = gt_rng(41);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.moe");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_equals_the_host_for_every_score_k_and_size),
        cmocka_unit_test(test_permute_and_combine_equal_the_host),
        cmocka_unit_test(test_grouped_matmul_matches_float64),
        cmocka_unit_test(test_grouped_matmul_clamps_a_bad_table),
        cmocka_unit_test(test_a_captured_layer_replays_on_new_inputs),
        cmocka_unit_test(test_bad_arguments_are_refused_before_launch),
        cmocka_unit_test(test_router_time_at_8192_tokens_64_experts_k8),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
