/*
 * test_gather_gpu.c - weft_gather_rows on the GPU against the host
 * reference, bit for bit, on fresh random data: fp32, bf16 and fp16 tables
 * (up to 32000 rows of 4096 values: a vocabulary's embeddings), row bytes
 * and strides that allow 16-, 8-, 4- and 2-byte copies, ids repeated and
 * outside the table (rows of zeros); out's padding left alone (poisoned
 * first). Also: the call captured into a CUDA graph and replayed with new
 * ids written between launches, which the rows follow.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>

#include "ops/argmax_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

static unsigned failed_cases;

static void gpu_case(weft_dtype t, size_t table_rows, size_t cols, size_t ts, size_t os,
                     size_t rows)
{
    size_t es = weft__dtype_size(t), nt = (table_rows - 1) * ts + cols, no = rows * os;
    void *table = am_rows(t, table_rows, cols, ts, AM_RANDOM);
    int32_t *ids = malloc(rows * 4);
    void *host = malloc(no * es);
    assert_true(table && ids && host);
    for (size_t r = 0; r < rows; r++)
        ids[r] = (int32_t)(am_next() % table_rows);
    ids[rows - 1] = -7; /* outside: zeros */
    if (rows > 2)
        ids[1] = (int32_t)table_rows, ids[2] = ids[0];
    memset(host, 0xa7, no * es);
    assert_int_equal(weft_gather_rows(NULL, t, host, table, ids, rows, cols, table_rows, ts, os),
                     WEFT_OK);
    void *dt = gt_upload(table, nt * es), *dout = gt_upload(NULL, no * es);
    int32_t *dids = gt_upload(ids, rows * 4);
    assert_cuda(gt_memset(dout, 0xa7, no * es));
    int rc = weft_gather_rows(stream, t, dout, dt, dids, rows, cols, table_rows, ts, os);
    if (rc != WEFT_OK)
        fail_msg("weft_gather_rows: %d %s", rc, weft_last_error());
    assert_cuda(cudaStreamSynchronize(stream));
    unsigned char *got = gt_download(dout, no * es);
    size_t at = gt_first_diff(got, host, no * es);
    if (at != no * es) {
        printf("  FAILED dtype %d table %zu x %zu (stride %zu), %zu rows (stride %zu): byte %zu "
               "(row %zu) differs\n",
               (int)t, table_rows, cols, ts, rows, os, at, at / es / os);
        failed_cases++;
    }
    free(table), free(ids), free(host), free(got);
    cudaFree(dt), cudaFree(dout), cudaFree(dids);
}

static void test_every_type_and_copy_width_equals_the_host(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < 3; ti++) {
        weft_dtype t = TYPES[ti];
        gpu_case(t, 1000, 64, 64, 64, 17); /* 16-byte copies */
        gpu_case(t, 1000, 68, 68, 72, 9);  /* 8 (fp16/bf16) or 16 */
        gpu_case(t, 1000, 66, 70, 66, 5);  /* 4 bytes */
        gpu_case(t, 1000, 7, 9, 11, 3);    /* 2 bytes (4 for fp32) */
        gpu_case(t, 32000, 4096, 4096, 4096, 130);
        gpu_case(t, 1, 1, 1, 1, 1);
    }
    if (failed_cases)
        fail_msg("%u cases failed (each listed above)", failed_cases);
}

/* Captured once; new ids between replays change the rows copied. */
static void test_a_captured_call_follows_new_ids(void **state)
{
    (void)state;
    enum { TROWS = 300, COLS = 256, ROWS = 8 };
    uint16_t *table = am_rows(WEFT_DTYPE_BF16, TROWS, COLS, COLS, AM_RANDOM);
    assert_non_null(table);
    void *dt = gt_upload(table, TROWS * COLS * 2), *dout = gt_upload(NULL, ROWS * COLS * 2);
    int32_t *dids = gt_upload(NULL, ROWS * 4);
    cudaGraph_t g;
    cudaGraphExec_t x;
    assert_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc =
        weft_gather_rows(stream, WEFT_DTYPE_BF16, dout, dt, dids, ROWS, COLS, TROWS, COLS, COLS);
    assert_cuda(cudaStreamEndCapture(stream, &g));
    assert_int_equal(rc, WEFT_OK);
    assert_cuda(cudaGraphInstantiate(&x, g, 0));
    for (int rep = 0; rep < 3; rep++) {
        int32_t ids[ROWS];
        for (int r = 0; r < ROWS; r++)
            ids[r] = (int32_t)(am_next() % TROWS);
        assert_cuda(gt_copy_in(dids, ids, sizeof ids));
        assert_cuda(cudaGraphLaunch(x, stream));
        assert_cuda(cudaStreamSynchronize(stream));
        uint16_t *got = gt_download(dout, ROWS * COLS * 2);
        for (int r = 0; r < ROWS; r++)
            assert_memory_equal(got + r * COLS, table + (size_t)ids[r] * COLS, COLS * 2);
        free(got);
    }
    cudaGraphExecDestroy(x), cudaGraphDestroy(g);
    cudaFree(dt), cudaFree(dout), cudaFree(dids);
    free(table);
}

static int setup(void **state)
{
    (void)state;
    am_state = gt_rng(44);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.gather");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_and_copy_width_equals_the_host),
        cmocka_unit_test(test_a_captured_call_follows_new_ids),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
