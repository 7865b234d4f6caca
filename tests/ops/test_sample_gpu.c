/*
 * test_sample_gpu.c - weft_sample on the GPU against the host reference on
 * fresh random data: fp32, bf16 and fp16 rows of 1 to 151936 logits (a
 * Qwen vocabulary), batches of 1 to 64 rows each with params of its own
 * (greedy, top_k, top_p, temperatures), padded strides, argmax_ref.h's
 * hard rows (ties, NaN, -Inf): the host's ids (exp's last bit may move a
 * boundary: one row in a thousand at most, none in practice). Also: the
 * same ids on a second call (the histograms' atomics add integers); many
 * draws of one row follow sample_ref.h's distribution; the call captured
 * into a CUDA graph and replayed on new params in pinned memory; on a
 * task's stream.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>

#include "ops/sample_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

static size_t rows_run, rows_differing;
static unsigned failed_cases;

static weft_sampling random_params(void)
{
    static const float P[] = {1, 0.5f, 0.9f, 0.99f, 0};
    static const int32_t K[] = {0, 1, 2, 50, 0, 1000};
    weft_sampling p = {.seed = am_next(), .offset = am_next() % 1000};
    if (am_next() % 8 == 0)
        return p; /* greedy */
    p.temperature = 0.3f + (float)(am_next() % 1000) * 0.0017f;
    p.top_p = P[am_next() % 5];
    p.top_k = K[am_next() % 6];
    return p;
}

/* One call on the GPU against the host's ids; twice, the same ids. */
static void gpu_case(weft_dtype t, size_t rows, size_t cols, size_t stride, am_kind kind)
{
    size_t n = (rows - 1) * stride + cols + 16, es = weft__dtype_size(t);
    void *in = am_rows(t, rows, cols, stride, kind);
    weft_sampling *params = malloc(rows * sizeof *params);
    int32_t *host = malloc(rows * 4);
    assert_true(in && params && host);
    for (size_t r = 0; r < rows; r++)
        params[r] = random_params();
    void *din = gt_upload(in, n * es);
    weft_sampling *dparams = gt_upload(params, rows * sizeof *params);
    int32_t *dids = gt_upload(NULL, rows * 4);
    int32_t *got[2];
    for (int call = 0; call < 2; call++) {
        assert_cuda(gt_memset(dids, 0xa7, rows * 4));
        int rc = weft_sample(stream, t, dids, din, rows, cols, stride, dparams);
        if (rc != WEFT_OK)
            fail_msg("weft_sample: %d %s", rc, weft_last_error());
        assert_cuda(cudaStreamSynchronize(stream));
        got[call] = gt_download(dids, rows * 4);
    }
    assert_int_equal(weft_sample(NULL, t, host, in, rows, cols, stride, params), WEFT_OK);
    if (memcmp(got[0], got[1], rows * 4) != 0) {
        printf("  FAILED dtype %d %s rows %zu cols %zu: two calls, two answers\n", (int)t,
               am_kind_names[kind], rows, cols);
        failed_cases++;
    }
    for (size_t r = 0; r < rows; r++)
        if (got[0][r] != host[r]) {
            printf("  dtype %d %s rows %zu cols %zu: row %zu (T %g k %d p %g): GPU %d, host %d\n",
                   (int)t, am_kind_names[kind], rows, cols, r, params[r].temperature,
                   params[r].top_k, params[r].top_p, got[0][r], host[r]);
            rows_differing++;
        }
    rows_run += rows;
    free(in), free(params), free(host), free(got[0]), free(got[1]);
    cudaFree(din), cudaFree(dparams), cudaFree(dids);
}

static void test_every_type_kind_and_size_equals_the_host(void **state)
{
    (void)state;
    static const size_t COLS[] = {1, 7, 513, 4099, 32000, 128256, 151936}, ROWS[] = {1, 3, 64};
    for (size_t ti = 0; ti < 3; ti++)
        for (int kind = 0; kind < AM_KINDS; kind++)
            for (size_t ci = 0; ci < sizeof COLS / sizeof *COLS; ci++)
                for (size_t ri = 0; ri < 3; ri++) {
                    size_t cols = COLS[ci], rows = ROWS[ri];
                    if (cols * rows > 400000 && kind != AM_RANDOM)
                        continue; /* the big ones: random rows only */
                    gpu_case(TYPES[ti], rows, cols, cols + (ri == 1 ? 5 : 0), (am_kind)kind);
                }
    printf("  %zu rows, %zu differ from the host's\n", rows_run, rows_differing);
    if (failed_cases)
        fail_msg("%u cases failed (each listed above)", failed_cases);
    if (rows_differing * 1000 > rows_run)
        fail_msg("%zu of %zu rows differ from the host's", rows_differing, rows_run);
}

/* 20000 draws of one row, offsets 0 to 19999, follow the distribution. */
static void test_draws_follow_the_distribution(void **state)
{
    (void)state;
    enum { COLS = 3000, COUNT = 20000 };
    float *row = malloc(COLS * 4), *rows = malloc((size_t)COLS * COUNT * 4);
    weft_sampling *params = malloc(COUNT * sizeof *params);
    assert_true(row && rows && params);
    for (size_t j = 0; j < COLS; j++)
        row[j] = (float)(((double)(am_next() >> 11) * 0x1p-53 - 0.5) * 12);
    for (size_t r = 0; r < COUNT; r++)
        memcpy(rows + r * COLS, row, COLS * 4);
    const weft_sampling cases[] = {{.temperature = 1},
                                   {.temperature = 0.8f, .top_k = 20},
                                   {.temperature = 1.2f, .top_p = 0.9f},
                                   {.temperature = 1, .top_k = 200, .top_p = 0.6f}};
    float *drows = gt_upload(rows, (size_t)COLS * COUNT * 4);
    int32_t *dids = gt_upload(NULL, COUNT * 4);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        sr_dist d;
        weft_sampling p = cases[c];
        p.seed = am_next();
        if (sr_distribution(row, COLS, &p, &d) < 1e-6) { /* top_p on a boundary */
            sr_free(&d);
            continue;
        }
        for (size_t r = 0; r < COUNT; r++)
            params[r] = p, params[r].offset = r;
        weft_sampling *dparams = gt_upload(params, COUNT * sizeof *params);
        assert_int_equal(
            weft_sample(stream, WEFT_DTYPE_F32, dids, drows, COUNT, COLS, COLS, dparams), WEFT_OK);
        assert_cuda(cudaStreamSynchronize(stream));
        int32_t *got = gt_download(dids, COUNT * 4);
        char why[160];
        if (!sr_follows(&d, got, COUNT, COLS, why, sizeof why))
            fail_msg("case %zu: %s", c, why);
        free(got), sr_free(&d);
        cudaFree(dparams);
    }
    free(row), free(rows), free(params);
    cudaFree(drows), cudaFree(dids);
}

/* Captured once, replayed on new params in pinned memory: the ids follow. */
static void test_a_captured_call_replays_on_new_params(void **state)
{
    (void)state;
    enum { ROWS = 8, COLS = 50000 };
    float *h = am_rows(WEFT_DTYPE_F32, ROWS, COLS, COLS, AM_RANDOM);
    weft_sampling *params;
    assert_non_null(h);
    assert_cuda(cudaHostAlloc((void **)&params, ROWS * sizeof *params, cudaHostAllocDefault));
    float *d = gt_upload(h, ROWS * COLS * 4);
    int32_t *dids = gt_upload(NULL, ROWS * 4), want[ROWS];
    cudaGraph_t g;
    cudaGraphExec_t x;
    for (int r = 0; r < ROWS; r++)
        params[r] = random_params();
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = weft_sample(stream, WEFT_DTYPE_F32, dids, d, ROWS, COLS, COLS, params);
    assert_cuda(cudaStreamEndCapture(stream, &g));
    assert_int_equal(rc, WEFT_OK);
    assert_cuda(cudaGraphInstantiate(&x, g, 0));
    for (int rep = 0; rep < 3; rep++) {
        for (int r = 0; r < ROWS; r++)
            params[r] = random_params();
        assert_int_equal(weft_sample(NULL, WEFT_DTYPE_F32, want, h, ROWS, COLS, COLS, params),
                         WEFT_OK);
        assert_cuda(gt_memset(dids, 0xa7, ROWS * 4));
        assert_cuda(cudaGraphLaunch(x, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        int32_t *got = gt_download(dids, ROWS * 4);
        assert_memory_equal(got, want, sizeof want);
        free(got);
    }
    cudaGraphExecDestroy(x), cudaGraphDestroy(g);
    cudaFreeHost(params), free(h);
    cudaFree(d), cudaFree(dids);
}

/* ---- on a task's stream --------------------------------------------------- */

typedef struct chain {
    float *logits;         /* device */
    weft_sampling *params; /* device */
    int32_t *ids;          /* device */
    size_t rows, cols;
} chain;

static void *chain_task(void *arg)
{
    chain *c = arg;
    if (GT_OK(weft_sample(WEFT_TASK_STREAM, WEFT_DTYPE_F32, c->ids, c->logits, c->rows, c->cols,
                          c->cols, c->params)))
        GT_OK(weft_await());
    return NULL;
}

static void test_on_a_tasks_stream(void **state)
{
    (void)state;
    chain c = {.rows = 9, .cols = 30000};
    float *h = am_rows(WEFT_DTYPE_F32, c.rows, c.cols, c.cols, AM_RANDOM);
    weft_sampling params[9];
    int32_t want[9];
    assert_non_null(h);
    for (int r = 0; r < 9; r++)
        params[r] = random_params();
    assert_int_equal(weft_sample(NULL, WEFT_DTYPE_F32, want, h, c.rows, c.cols, c.cols, params),
                     WEFT_OK);
    c.logits = gt_upload(h, c.rows * c.cols * 4);
    c.params = gt_upload(params, sizeof params);
    c.ids = gt_upload(NULL, c.rows * 4);
    assert_cuda(gt_memset(c.ids, 0xa7, c.rows * 4));
    gt_reset();
    gt_run(runtime, chain_task, &c);
    gt_assert_passed();
    int32_t *got = gt_download(c.ids, c.rows * 4);
    assert_memory_equal(got, want, sizeof want);
    free(got), free(h);
    cudaFree(c.logits), cudaFree(c.params), cudaFree(c.ids);
}

static int setup(void **state)
{
    (void)state;
    am_state = gt_rng(47);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.sample");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_kind_and_size_equals_the_host),
        cmocka_unit_test(test_draws_follow_the_distribution),
        cmocka_unit_test(test_a_captured_call_replays_on_new_params),
        cmocka_unit_test(test_on_a_tasks_stream),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
