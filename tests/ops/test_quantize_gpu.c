/*
 * test_quantize_gpu.c - weft_quantize_fp8 on the GPU against the host
 * reference and quantize_ref.h's own, on fresh random data: fp32, bf16 and
 * fp16 rows into E4M3 and E5M2, 1 to 151936 columns (a vocabulary), 1 to
 * 300 rows, padded strides whose padding would change a scale if read;
 * rows of zeros, of fp32 subnormals, with NaN and with an infinity: the
 * same bytes and scales as the host's (a NaN's sign aside), the padding
 * between output rows untouched. Also on a task's stream after the softmax
 * that writes its input.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>

#include "ops/quantize_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static const weft_dtype IN_TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
static const weft_dtype OUT_TYPES[] = {WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2};

static unsigned failed_cases;

static void gpu_case(weft_dtype ot, weft_dtype it, size_t rows, size_t cols, size_t in_stride,
                     size_t out_stride, qz_kind kind)
{
    size_t n_in = (rows - 1) * in_stride + cols + 16, n_out = (rows - 1) * out_stride + cols;
    void *in = qz_rows(it, rows, cols, in_stride, kind);
    assert_non_null(in);
    void *din = gt_upload(in, n_in * weft__dtype_size(it));
    uint8_t *dout = gt_upload(NULL, n_out + 16);
    float *dscales = gt_upload(NULL, rows * 4);
    assert_cuda(gt_memset(dout, 0xa7, n_out + 16));
    int rc =
        weft_quantize_fp8(stream, ot, dout, dscales, it, din, rows, cols, in_stride, out_stride);
    if (rc != WEFT_OK)
        fail_msg("weft_quantize_fp8: %d %s", rc, weft_last_error());
    assert_cuda(cudaStreamSynchronize(stream));
    uint8_t *got = gt_download(dout, n_out + 16), *host = malloc(n_out);
    float *scales = gt_download(dscales, rows * 4), *host_scales = malloc(rows * 4);
    assert_int_equal(
        weft_quantize_fp8(NULL, ot, host, host_scales, it, in, rows, cols, in_stride, out_stride),
        WEFT_OK);
    char what[160];
    snprintf(what, sizeof what, "in %d out %d %s %zu x %zu strides %zu/%zu", (int)it, (int)ot,
             qz_kind_names[kind], rows, cols, in_stride, out_stride);
    /* Every row against the host's bytes, and against quantize_ref.h's
     * own decoding all but a large case's later rows, which would take
     * minutes (the host's bytes are held to it in the host test). */
    size_t ref_rows = rows * cols > 1000000 ? 2 : rows;
    int bad = qz_check(what, ot, it, in, got, scales, ref_rows, cols, in_stride, out_stride);
    for (size_t r = 0; r < rows && !bad; r++) {
        bad |= memcmp(&scales[r], &host_scales[r], 4) != 0;
        for (size_t j = 0; j < out_stride && !bad; j++) {
            size_t at = r * out_stride + j;
            if (j >= cols) /* the padding between rows, and past the last */
                bad |= at < n_out + 16 && got[at] != 0xa7;
            else if (qz_is_nan(ot, host[at]))
                bad |= !qz_is_nan(ot, got[at]);
            else
                bad |= got[at] != host[at];
            if (bad)
                printf("  %s: row %zu col %zu: GPU 0x%02x, host 0x%02x\n", what, r, j, got[at],
                       j < cols ? host[at] : 0xa7);
        }
    }
    if (bad) {
        printf("  FAILED %s\n", what);
        failed_cases++;
    }
    free(in), free(got), free(host), free(scales), free(host_scales);
    cudaFree(din), cudaFree(dout), cudaFree(dscales);
}

static void test_every_type_kind_and_size_equals_the_host(void **state)
{
    (void)state;
    static const size_t COLS[] = {1, 5, 64, 4099, 151936}, ROWS[] = {1, 3, 300};
    for (size_t oi = 0; oi < 2; oi++)
        for (size_t ii = 0; ii < 3; ii++)
            for (int kind = 0; kind < QZ_KINDS; kind++)
                for (size_t ci = 0; ci < sizeof COLS / sizeof *COLS; ci++)
                    for (size_t ri = 0; ri < 3; ri++) {
                        size_t cols = COLS[ci], rows = ROWS[ri];
                        if (cols * rows > 5000000 && kind != QZ_RANDOM)
                            continue; /* the big ones: random rows only */
                        gpu_case(OUT_TYPES[oi], IN_TYPES[ii], rows, cols, cols + (ri == 1 ? 3 : 0),
                                 cols + (ri == 1 ? 5 : 0), (qz_kind)kind);
                    }
    if (failed_cases)
        fail_msg("%u cases failed (each listed above)", failed_cases);
}

/* On a task's stream, after the softmax that writes its input: every
 * row's largest (its last) is 448 and its scale that value over 448. */
static void test_on_a_tasks_stream_after_its_softmax(void **state)
{
    (void)state;
    float host[400];
    for (int i = 0; i < 400; i++)
        host[i] = (float)(i % 100) * 0.05f;
    qz_chain c = {gt_upload(host, sizeof host), gt_upload(NULL, 16), gt_upload(NULL, 400), 0};
    weft_task *t;
    assert_int_equal(weft_spawn(runtime, &t, qz_chain_task, &c, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(c.rc, WEFT_OK);
    float *probs = gt_download(c.in, sizeof host), *scales = gt_download(c.scales, 16);
    uint8_t *out = gt_download(c.out, 400);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(out[r * 100 + 99], 0x7e);
        assert_true(scales[r] == probs[r * 100 + 99] / 448.0f);
    }
    free(probs), free(scales), free(out);
    cudaFree(c.in), cudaFree(c.scales), cudaFree(c.out);
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
    int skip = gt_start("gpu.quantize");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_kind_and_size_equals_the_host),
        cmocka_unit_test(test_on_a_tasks_stream_after_its_softmax),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
