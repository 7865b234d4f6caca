/*
 * test_argmax_gpu.c - weft_argmax on the GPU against the host reference
 * and the plain loop of argmax_ref.h, on fresh random data: fp32, bf16 and
 * fp16; rows of 1 to 128256 values (a vocabulary), batches of 1 to 300
 * rows, padded strides whose padding would win if read; ties at the
 * maximum, NaN, rows of only NaN, -Inf and signed zeros: the same id as
 * the host's for every row, bit for bit. Ids are poisoned first. Also: the
 * call captured into a CUDA graph and replayed on new values, and on a
 * task's stream after the softmax that writes its input.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>

#include "ops/argmax_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

static unsigned failed_cases;

/* One call on the GPU against the host's ids and the loop's. */
static void gpu_case(weft_dtype t, size_t rows, size_t cols, size_t stride, am_kind kind)
{
    size_t n = (rows - 1) * stride + cols + 16, es = weft__dtype_size(t);
    void *in = am_rows(t, rows, cols, stride, kind);
    assert_non_null(in);
    void *din = gt_upload(in, n * es);
    int32_t *dids = gt_upload(NULL, rows * 4);
    assert_cuda(gt_memset(dids, 0xa7, rows * 4));
    int rc = weft_argmax(stream, t, dids, din, rows, cols, stride);
    if (rc != WEFT_OK)
        fail_msg("weft_argmax: %d %s", rc, weft_last_error());
    assert_cuda(cudaStreamSynchronize(stream));
    int32_t *got = gt_download(dids, rows * 4), *host = malloc(rows * 4);
    assert_non_null(host);
    assert_int_equal(weft_argmax(NULL, t, host, in, rows, cols, stride), WEFT_OK);
    for (size_t r = 0; r < rows; r++) {
        int32_t want = am_ref(t, in, r, cols, stride);
        if (got[r] != want || host[r] != want) {
            printf("  FAILED dtype %d %s rows %zu cols %zu stride %zu: row %zu: GPU %d, host "
                   "%d, loop %d\n",
                   (int)t, am_kind_names[kind], rows, cols, stride, r, got[r], host[r], want);
            failed_cases++;
            break;
        }
    }
    free(in), free(got), free(host);
    cudaFree(din), cudaFree(dids);
}

static void test_every_type_kind_and_size_equals_the_host(void **state)
{
    (void)state;
    static const size_t COLS[] = {1, 7, 513, 4099, 32000, 128256}, ROWS[] = {1, 3, 130};
    for (size_t ti = 0; ti < 3; ti++)
        for (int kind = 0; kind < AM_KINDS; kind++)
            for (size_t ci = 0; ci < sizeof COLS / sizeof *COLS; ci++)
                for (size_t ri = 0; ri < 3; ri++) {
                    size_t cols = COLS[ci], rows = ROWS[ri];
                    if (cols * rows > 4000000 && kind != AM_RANDOM)
                        continue; /* the big ones: random rows only */
                    gpu_case(TYPES[ti], rows, cols, cols + (ri == 1 ? 5 : 0), (am_kind)kind);
                }
    gpu_case(WEFT_DTYPE_F32, 300, 1000, 1000, AM_TIES);
    if (failed_cases)
        fail_msg("%u cases failed (each listed above)", failed_cases);
}

/* Captured once, replayed on new values: the ids follow them. */
static void test_a_captured_call_replays_on_new_values(void **state)
{
    (void)state;
    enum { ROWS = 8, COLS = 50000 };
    float *d = gt_upload(NULL, ROWS * COLS * 4);
    int32_t *dids = gt_upload(NULL, ROWS * 4);
    cudaGraph_t g;
    cudaGraphExec_t x;
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = weft_argmax(stream, WEFT_DTYPE_F32, dids, d, ROWS, COLS, COLS);
    assert_cuda(cudaStreamEndCapture(stream, &g));
    assert_int_equal(rc, WEFT_OK);
    assert_cuda(cudaGraphInstantiate(&x, g, 0));
    for (int rep = 0; rep < 2; rep++) {
        float *h = am_rows(WEFT_DTYPE_F32, ROWS, COLS, COLS, AM_RANDOM);
        assert_non_null(h);
        assert_cuda(gt_copy_in(d, h, ROWS * COLS * 4));
        assert_cuda(gt_memset(dids, 0xa7, ROWS * 4));
        assert_cuda(cudaGraphLaunch(x, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        int32_t *got = gt_download(dids, ROWS * 4);
        for (int r = 0; r < ROWS; r++)
            assert_int_equal(got[r], am_ref(WEFT_DTYPE_F32, h, (size_t)r, COLS, COLS));
        free(got), free(h);
    }
    cudaGraphExecDestroy(x), cudaGraphDestroy(g);
    cudaFree(d), cudaFree(dids);
}

/* ---- on a task's stream --------------------------------------------------- */

typedef struct chain {
    float *logits, *probs; /* device */
    int32_t *ids;          /* device */
    size_t rows, cols;
} chain;

static void *chain_task(void *arg)
{
    chain *c = arg;
    void *s = WEFT_TASK_STREAM;
    if (GT_OK(weft_softmax(s, WEFT_DTYPE_F32, c->probs, c->logits, c->rows, c->cols, c->cols,
                           NULL)) &&
        GT_OK(weft_argmax(s, WEFT_DTYPE_F32, c->ids, c->probs, c->rows, c->cols, c->cols)))
        GT_OK(weft_await());
    return NULL;
}

static void test_on_a_tasks_stream_after_its_softmax(void **state)
{
    (void)state;
    chain c = {.rows = 9, .cols = 30000};
    float *h = am_rows(WEFT_DTYPE_F32, c.rows, c.cols, c.cols, AM_RANDOM);
    assert_non_null(h);
    c.logits = gt_upload(h, c.rows * c.cols * 4);
    c.probs = gt_upload(NULL, c.rows * c.cols * 4);
    c.ids = gt_upload(NULL, c.rows * 4);
    assert_cuda(gt_memset(c.probs, 0, c.rows * c.cols * 4)); /* read early: every id 0 */
    assert_cuda(gt_memset(c.ids, 0xa7, c.rows * 4));
    gt_reset();
    gt_run(runtime, chain_task, &c);
    gt_assert_passed();
    int32_t *got = gt_download(c.ids, c.rows * 4);
    for (size_t r = 0; r < c.rows; r++)
        assert_int_equal(got[r], am_ref(WEFT_DTYPE_F32, h, r, c.cols, c.cols));
    free(got), free(h);
    cudaFree(c.logits), cudaFree(c.probs), cudaFree(c.ids);
}

static int setup(void **state)
{
    (void)state;
    am_state = gt_rng(43);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.argmax");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_kind_and_size_equals_the_host),
        cmocka_unit_test(test_a_captured_call_replays_on_new_values),
        cmocka_unit_test(test_on_a_tasks_stream_after_its_softmax),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
