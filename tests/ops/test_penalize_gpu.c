/*
 * test_penalize_gpu.c - weft_penalize on the GPU against the host
 * reference, bit for bit (both adjust a logit by penalize.h's one
 * function): fp32, bf16 and fp16 rows of 1 to 151936 logits, 1 to 64 rows
 * with padded strides, each row with its own penalties and up to 3000
 * adjustments of distinct tokens (some outside the row), params and
 * adjustments in device memory and in pinned host memory read as the
 * kernel runs; then a chain on a task's stream: penalize, then sample.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>

#include "ops/argmax_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

/* Each row's penalties and distinct tokens (malloc'd); *total adjustments. */
static weft_logit_adjust *random_adjust(size_t rows, size_t cols, weft_penalties *params,
                                        size_t *total)
{
    size_t cap = rows * 3000, n = 0;
    weft_logit_adjust *a = malloc(cap * sizeof *a);
    assert_non_null(a);
    for (size_t r = 0; r < rows; r++) {
        size_t count = am_next() % (cols < 3000 ? cols + 1 : 3000);
        size_t start = am_next() % cols;
        params[r] = (weft_penalties){.repetition = r % 3 ? 1.3f : 0.7f,
                                     .frequency = (float)(am_next() % 100) * 0.01f,
                                     .presence = (float)(am_next() % 100) * 0.02f - 1,
                                     .first = (uint32_t)n,
                                     .count = (uint32_t)count};
        for (size_t i = 0; i < count; i++) { /* distinct: a run of tokens, 13 past the row */
            int32_t token = (int32_t)((start + i) % (cols + 13));
            a[n++] = (weft_logit_adjust){.token = i == 3 ? -5 : token,
                                         .count = (int32_t)(am_next() % 4),
                                         .seen = (uint32_t)(am_next() % 2),
                                         .bias = am_next() % 5 ? 0 : -2.5f};
        }
    }
    *total = n;
    return a;
}

static void gpu_case(weft_dtype t, size_t rows, size_t cols, size_t stride, int pinned)
{
    size_t n = (rows - 1) * stride + cols, es = weft__dtype_size(t), total;
    void *in = am_rows(t, rows, cols, stride, AM_RANDOM), *host = malloc((n + 16) * es);
    weft_penalties *params = malloc(rows * sizeof *params);
    assert_true(in && host && params);
    weft_logit_adjust *adj = random_adjust(rows, cols, params, &total);
    memcpy(host, in, (n + 16) * es);
    assert_int_equal(weft_penalize(NULL, t, host, rows, cols, stride, params, adj), WEFT_OK);
    void *din = gt_upload(in, (n + 16) * es);
    const weft_penalties *dparams = params;
    const weft_logit_adjust *dadj = adj;
    weft_penalties *pp = NULL;
    weft_logit_adjust *pa = NULL;
    if (pinned) {
        assert_cuda(cudaHostAlloc((void **)&pp, rows * sizeof *pp, cudaHostAllocDefault));
        assert_cuda(cudaHostAlloc((void **)&pa, (total + 1) * sizeof *pa, cudaHostAllocDefault));
        memcpy(pp, params, rows * sizeof *pp), memcpy(pa, adj, total * sizeof *pa);
        dparams = pp, dadj = pa;
    } else {
        dparams = gt_upload(params, rows * sizeof *params);
        dadj = gt_upload(adj, (total + 1) * sizeof *adj);
    }
    int rc = weft_penalize(stream, t, din, rows, cols, stride, dparams, dadj);
    if (rc != WEFT_OK)
        fail_msg("weft_penalize: %d %s", rc, weft_last_error());
    assert_cuda(cudaStreamSynchronize(stream));
    void *got = gt_download(din, (n + 16) * es);
    if (memcmp(got, host, (n + 16) * es) != 0)
        fail_msg("dtype %d rows %zu cols %zu stride %zu%s: not the host's logits", (int)t, rows,
                 cols, stride, pinned ? " (pinned)" : "");
    free(in), free(host), free(params), free(adj), free(got);
    cudaFree(din);
    if (pinned)
        cudaFreeHost(pp), cudaFreeHost(pa);
    else
        cudaFree((void *)dparams), cudaFree((void *)dadj);
}

static void test_every_type_and_size_equals_the_host(void **state)
{
    (void)state;
    static const size_t COLS[] = {1, 7, 4099, 151936}, ROWS[] = {1, 5, 64};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ci = 0; ci < 4; ci++)
            for (size_t ri = 0; ri < 3; ri++)
                gpu_case(TYPES[ti], ROWS[ri], COLS[ci], COLS[ci] + (ri == 1 ? 3 : 0),
                         (int)((ci + ri) % 2));
}

typedef struct chain {
    float *logits; /* device */
    weft_penalties *params;
    weft_logit_adjust *adjust;
    weft_sampling *sampling;
    int32_t *ids;
    size_t rows, cols;
} chain;

static void *chain_task(void *arg)
{
    chain *c = arg;
    void *s = WEFT_TASK_STREAM;
    if (GT_OK(weft_penalize(s, WEFT_DTYPE_F32, c->logits, c->rows, c->cols, c->cols, c->params,
                            c->adjust)) &&
        GT_OK(weft_sample(s, WEFT_DTYPE_F32, c->ids, c->logits, c->rows, c->cols, c->cols,
                          c->sampling)))
        GT_OK(weft_await());
    return NULL;
}

/* Greedy after a presence penalty that sinks each row's top token: the
 * ids are the host's after the same penalty, not the unpenalized argmax. */
static void test_on_a_tasks_stream_before_the_draw(void **state)
{
    (void)state;
    enum { ROWS = 6, COLS = 30000 };
    float *h = am_rows(WEFT_DTYPE_F32, ROWS, COLS, COLS, AM_RANDOM);
    weft_penalties params[ROWS];
    weft_logit_adjust adjust[ROWS];
    weft_sampling sampling[ROWS] = {{0}};
    int32_t top[ROWS], want[ROWS];
    assert_non_null(h);
    assert_int_equal(weft_argmax(NULL, WEFT_DTYPE_F32, top, h, ROWS, COLS, COLS), WEFT_OK);
    for (int r = 0; r < ROWS; r++) {
        params[r] = (weft_penalties){.presence = 100, .first = (uint32_t)r, .count = 1};
        adjust[r] = (weft_logit_adjust){.token = top[r], .count = 1};
    }
    chain c = {.rows = ROWS, .cols = COLS};
    c.logits = gt_upload(h, sizeof(float) * ROWS * COLS);
    c.params = gt_upload(params, sizeof params);
    c.adjust = gt_upload(adjust, sizeof adjust);
    c.sampling = gt_upload(sampling, sizeof sampling);
    c.ids = gt_upload(NULL, sizeof want);
    assert_int_equal(weft_penalize(NULL, WEFT_DTYPE_F32, h, ROWS, COLS, COLS, params, adjust),
                     WEFT_OK);
    assert_int_equal(weft_argmax(NULL, WEFT_DTYPE_F32, want, h, ROWS, COLS, COLS), WEFT_OK);
    gt_reset();
    gt_run(runtime, chain_task, &c);
    gt_assert_passed();
    int32_t *got = gt_download(c.ids, sizeof want);
    for (int r = 0; r < ROWS; r++) {
        assert_int_equal(got[r], want[r]);
        assert_true(got[r] != top[r]);
    }
    free(got), free(h);
    cudaFree(c.logits), cudaFree(c.params), cudaFree(c.adjust), cudaFree(c.sampling);
    cudaFree(c.ids);
}

static int setup(void **state)
{
    (void)state;
    am_state = gt_rng(53);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.penalize");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_and_size_equals_the_host),
        cmocka_unit_test(test_on_a_tasks_stream_before_the_draw),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
