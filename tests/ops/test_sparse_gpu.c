/*
 * test_sparse_gpu.c - 2:4 sparsity on the GPU: weft_prune_2_4's kernel bit
 * for bit the host's (three types, padded rows); with cuSPARSELt, weights
 * made on the GPU (a group of three nonzeros refused and named, nothing
 * kept) and weft_matmul_sparse against the float64 product with the pruned
 * weight at decode's and prefill's m, with bias, ReLU, both GELUs,
 * alpha and C, the padding of D left alone; a plan made on the first call
 * and what that costs; m that cuSPARSELt does not take (1, 1000: padded);
 * a product captured into a CUDA graph and replayed;
 * a host weight on a GPU stream refused. Without cuSPARSELt, making a
 * GPU's weight says the build lacks it.
 *
 * Bounds, as ||got - ref|| / ||ref|| over the output against the float64
 * loop of matmul_ref.h: fp16 3e-3, bf16 1e-2 (as weft_matmul's GPU test).
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>
#include <math.h>

#include "ops/matmul_ref.h"
#include "ops/sparse.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

#ifdef WEFT_HAVE_CUSPARSELT
#define NEEDS_CUSPARSELT() ((void)0)
#else
#define NEEDS_CUSPARSELT() skip()
#endif

/* ---- pruning ------------------------------------------------------------- */

static void test_the_prune_kernel_is_the_hosts(void **state)
{
    (void)state;
    const size_t rows = 301, cols = 256, ld = 264;
    const weft_dtype types[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
    for (size_t t = 0; t < 3; t++) {
        size_t bytes = rows * ld * weft__dtype_size(types[t]);
        void *host = mm_random(types[t], rows * ld, 3.0);
        /* ties and NaNs among the random values */
        for (size_t i = 0; i + 3 < rows * ld; i += 97) {
            weft__store(types[t], host, i, 1.0f);
            weft__store(types[t], host, i + 1, -1.0f);
            weft__store(types[t], host, i + 3, i % 5 ? 1.0f : NAN);
        }
        void *dev = gt_upload(host, bytes);
        assert_int_equal(weft_prune_2_4(NULL, types[t], host, rows, cols, ld), WEFT_OK);
        assert_int_equal(weft_prune_2_4(stream, types[t], dev, rows, cols, ld), WEFT_OK);
        assert_cuda(cudaStreamSynchronize(stream));
        void *got = gt_download(dev, bytes);
        assert_memory_equal(got, host, bytes);
        free(host), free(got);
        cudaFree(dev);
    }
}

/* ---- weights and products ---------------------------------------------- */

static double bound(weft_dtype t)
{
    return t == WEFT_DTYPE_BF16 ? 1e-2 : 3e-3;
}

/* ||got - ref|| / ||ref||, failing on a NaN or a written padding element. */
static double rel_error(const weft_matmul_desc *d, const void *a, const void *w, const void *c,
                        const void *out, const char *name)
{
    mm_geom g = mm_geometry(d);
    unsigned char *written = calloc(g.nd, 1);
    double num = 0, den = 0;
    for (size_t i = 0; i < d->m; i++)
        for (size_t j = 0; j < d->n; j++) {
            mm_ref r = mm_reference(d, &g, a, w, c, 0, i, j);
            double got = weft__load(d->type, out, i * g.ldd + j);
            written[i * g.ldd + j] = 1;
            if (isnan(got))
                fail_msg("%s: element [%zu][%zu] is NaN (unwritten?)", name, i, j);
            num += (got - r.y) * (got - r.y);
            den += r.y * r.y;
        }
    for (size_t x = 0; x < g.nd; x++)
        if (!written[x] && !mm_poison_kept(d->type, out, x))
            fail_msg("%s: padding element %zu was written", name, x);
    free(written);
    return sqrt(num / (den > 0 ? den : 1));
}

/* A pruned n x k weight, on the host. */
static void *pruned_weight(weft_dtype t, size_t n, size_t k)
{
    void *w = mm_random(t, n * k, 1.0);
    assert_int_equal(weft_prune_2_4(NULL, t, w, n, k, k), WEFT_OK);
    return w;
}

static void sparse_case(weft_dtype t, size_t m, size_t n, size_t k, weft_matmul_act act, int with_c,
                        int with_bias, size_t ldd)
{
    weft_matmul_desc desc = {.m = m,
                             .n = n,
                             .k = k,
                             .type = t,
                             .trans_b = 1,
                             .ldd = ldd,
                             .ldc = ldd,
                             .alpha = with_c ? 0.75f : 0.0f,
                             .beta = with_c ? 0.5f : 0.0f,
                             .act = act};
    mm_geom g = mm_geometry(&desc);
    size_t es = weft__dtype_size(t);
    void *a = mm_random(t, g.na, 1.0), *w = pruned_weight(t, n, k);
    void *c = with_c ? mm_random(t, g.nd, 1.0) : NULL, *bias = mm_random(t, n, 1.0);
    void *poison = mm_poisoned(t, g.nd);
    void *da = gt_upload(a, g.na * es), *dw = gt_upload(w, n * k * es);
    void *dc = c ? gt_upload(c, g.nd * es) : NULL, *dbias = gt_upload(bias, n * es);
    void *dd = gt_upload(poison, g.nd * es);
    desc.bias = with_bias ? dbias : NULL;

    weft_sparse_weight *sw = NULL;
    double t0 = gt_now();
    assert_int_equal(weft_sparse_weight_create(stream, t, dw, n, k, 0, &sw), WEFT_OK);
    double t1 = gt_now();
    /* compressed: half the values and their positions, well under dense */
    size_t bytes = weft_sparse_weight_bytes(sw);
    if (!(bytes >= n * k && bytes < n * k * 2 * 3 / 4))
        fail_msg("%zu x %zu: %zu compressed bytes of %zu dense", n, k, bytes, n * k * 2);
    int rc = weft_matmul_sparse(stream, &desc, dd, da, sw, dc);
    if (rc != WEFT_OK)
        fail_msg("%zu x %zu x %zu: %s", m, n, k, weft_last_error());
    double t2 = gt_now();
    assert_int_equal(weft_matmul_sparse(stream, &desc, dd, da, sw, dc), WEFT_OK);
    double t3 = gt_now();
    assert_cuda(cudaStreamSynchronize(stream));
    void *got = gt_download(dd, g.nd * es);
    desc.bias = with_bias ? bias : NULL;
    char name[96];
    snprintf(name, sizeof name, "%s m %zu n %zu k %zu act %d%s%s",
             t == WEFT_DTYPE_BF16 ? "bf16" : "fp16", m, n, k, (int)act, with_c ? " C" : "",
             with_bias ? " bias" : "");
    double e = rel_error(&desc, a, w, c, got, name);
    printf("  %-40s error %.2e (bound %.0e); made in %.0f us, first product %.0f us (its plan), "
           "then %.0f us\n",
           name, e, bound(t), (t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6);
    if (!(e <= bound(t)))
        fail_msg("%s: error %.3g is over %.3g", name, e, bound(t));
    weft_sparse_weight_destroy(sw);
    free(a), free(w), free(c), free(bias), free(poison), free(got);
    cudaFree(da), cudaFree(dw), cudaFree(dc), cudaFree(dbias), cudaFree(dd);
}

static void test_sparse_products_match_the_reference(void **state)
{
    (void)state;
    NEEDS_CUSPARSELT();
    const weft_dtype types[] = {WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
    for (size_t t = 0; t < 2; t++) {
        sparse_case(types[t], 1, 256, 256, WEFT_MATMUL_ACT_NONE, 0, 0, 0);
        sparse_case(types[t], 16, 512, 256, WEFT_MATMUL_ACT_RELU, 0, 1, 0);
        sparse_case(types[t], 128, 256, 512, WEFT_MATMUL_ACT_GELU_TANH, 1, 1, 264);
        sparse_case(types[t], 1000, 128, 256, WEFT_MATMUL_ACT_NONE, 1, 0, 0);
        sparse_case(types[t], 64, 128, 128, WEFT_MATMUL_ACT_GELU_ERF, 0, 1, 0);
    }
}

static void test_a_dense_group_is_refused_on_the_gpu(void **state)
{
    (void)state;
    NEEDS_CUSPARSELT();
    const size_t n = 64, k = 128;
    uint16_t *w = pruned_weight(WEFT_DTYPE_BF16, n, k);
    w[9 * k + 16] = w[9 * k + 17] = w[9 * k + 18] = weft__f32_to_bf16(2.0f);
    void *dw = gt_upload(w, n * k * 2);
    weft_sparse_weight *sw = (weft_sparse_weight *)1;
    assert_int_equal(weft_sparse_weight_create(stream, WEFT_DTYPE_BF16, dw, n, k, 0, &sw),
                     WEFT_EINVAL);
    assert_null(sw);
    printf("  %s\n", weft_last_error());
    assert_non_null(strstr(weft_last_error(), "row 9 has 3 nonzeros in columns 16-19"));
    free(w);
    cudaFree(dw);
}

static void test_a_weight_is_used_on_its_own_backend(void **state)
{
    (void)state;
    NEEDS_CUSPARSELT();
    const size_t m = 16, n = 64, k = 64;
    void *w = pruned_weight(WEFT_DTYPE_BF16, n, k), *a = mm_random(WEFT_DTYPE_BF16, m * k, 1.0);
    void *dw = gt_upload(w, n * k * 2), *da = gt_upload(a, m * k * 2), *dd = NULL;
    assert_cuda(cudaMalloc(&dd, m * n * 2));
    weft_sparse_weight *host = NULL, *gpu = NULL;
    assert_int_equal(weft_sparse_weight_create(NULL, WEFT_DTYPE_BF16, w, n, k, 0, &host), WEFT_OK);
    assert_int_equal(weft_sparse_weight_create(stream, WEFT_DTYPE_BF16, dw, n, k, 0, &gpu),
                     WEFT_OK);
    weft_matmul_desc desc = {.m = m, .n = n, .k = k, .type = WEFT_DTYPE_BF16, .trans_b = 1};
    assert_int_equal(weft_matmul_sparse(stream, &desc, dd, da, host, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "made for the host"));
    void *hd = malloc(m * n * 2);
    assert_int_equal(weft_matmul_sparse(NULL, &desc, hd, a, gpu, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "made for GPU"));
    weft_sparse_weight_destroy(host), weft_sparse_weight_destroy(gpu);
    free(w), free(a), free(hd);
    cudaFree(dw), cudaFree(da), cudaFree(dd);
}

/* A product captured into a CUDA graph (its workspace the graph's own),
 * after a first call of its shape outside, computes the same when
 * replayed; so does one of 3 rows (padded) captured the same way. */
static void captured_case(size_t m)
{
    const size_t n = 256, k = 256;
    weft_matmul_desc desc = {
        .m = m, .n = n, .k = k, .type = WEFT_DTYPE_F16, .trans_b = 1, .act = WEFT_MATMUL_ACT_RELU};
    void *w = pruned_weight(WEFT_DTYPE_F16, n, k), *a = mm_random(WEFT_DTYPE_F16, m * k, 1.0);
    void *poison = mm_poisoned(WEFT_DTYPE_F16, m * n);
    void *dw = gt_upload(w, n * k * 2), *da = gt_upload(a, m * k * 2);
    void *dd = gt_upload(poison, m * n * 2);
    weft_sparse_weight *sw = NULL;
    assert_int_equal(weft_sparse_weight_create(stream, WEFT_DTYPE_F16, dw, n, k, 0, &sw), WEFT_OK);
    assert_int_equal(weft_matmul_sparse(stream, &desc, dd, da, sw, NULL), WEFT_OK);
    assert_cuda(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = weft_matmul_sparse(stream, &desc, dd, da, sw, NULL);
    char why[512];
    snprintf(why, sizeof why, "%s", rc == WEFT_OK ? "" : weft_last_error());
    cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (rc != WEFT_OK)
        fail_msg("weft_matmul_sparse inside the capture: %s", why);
    assert_cuda(end);
    assert_cuda(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 2; i++) {
        assert_cuda(gt_copy_in(dd, poison, m * n * 2));
        assert_cuda(cudaGraphLaunch(exec, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        void *got = gt_download(dd, m * n * 2);
        double e = rel_error(&desc, a, w, NULL, got, "captured");
        printf("  m %zu, replay %d: error %.2e\n", m, i, e);
        assert_true(e <= bound(WEFT_DTYPE_F16));
        free(got);
    }
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    weft_sparse_weight_destroy(sw);
    free(w), free(a), free(poison);
    cudaFree(dw), cudaFree(da), cudaFree(dd);
}

static void test_a_captured_product_replays(void **state)
{
    (void)state;
    NEEDS_CUSPARSELT();
    captured_case(32);
    captured_case(3);
}

static void test_without_cusparselt_the_weight_says_so(void **state)
{
    (void)state;
#ifdef WEFT_HAVE_CUSPARSELT
    skip();
#endif
    const size_t n = 16, k = 32;
    void *w = pruned_weight(WEFT_DTYPE_BF16, n, k), *dw = gt_upload(w, n * k * 2);
    weft_sparse_weight *sw = NULL;
    assert_int_equal(weft_sparse_weight_create(stream, WEFT_DTYPE_BF16, dw, n, k, 0, &sw),
                     WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "built without cuSPARSELt"));
    free(w);
    cudaFree(dw);
}

/* ---- main ------------------------------------------------------------------ */

static int setup(void **state)
{
    (void)state;
    mm_rng_state = gt_rng(43);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.sparse");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_prune_kernel_is_the_hosts),
        cmocka_unit_test(test_sparse_products_match_the_reference),
        cmocka_unit_test(test_a_dense_group_is_refused_on_the_gpu),
        cmocka_unit_test(test_a_weight_is_used_on_its_own_backend),
        cmocka_unit_test(test_a_captured_product_replays),
        cmocka_unit_test(test_without_cusparselt_the_weight_says_so),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
