/*
 * test_rmsnorm_fp8_gpu.c - weft_rmsnorm_fp8 on the GPU, on fresh random
 * data (rmsnorm_fp8_ref.h): byte for byte against the two calls it stands
 * for on the same stream, weft_rmsnorm into an aligned buffer then
 * weft_quantize_fp8 of it (out with its padding, the scales, sum_out with
 * its padding); and against the host reference, sum_out bit for bit, the
 * scales to the dtype's rounding and each code within one step (the GPU's
 * statistics are not the host's to the last bit). fp32, bf16 and fp16
 * rows into E4M3 and E5M2, at the host test's shapes - rows of 1, 7, 4096
 * and 5000, 1, 3 and 64 of them, every combination of weight, residual
 * and sum_out - and at shapes that take each of the norms' paths: held
 * rows checked at run time, many rows (the tensor cores' squares), rows
 * kept packed, rows over a cluster, staged rows, unaligned rows in tiles,
 * codes stored a byte at a time. Rows of zeros, with a NaN and with an
 * infinity among them. Also on a task's stream.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>

#include "ops/rmsnorm_fp8_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static const weft_dtype DTYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};
static const weft_dtype OUT_TYPES[] = {WEFT_DTYPE_F8_E4M3, WEFT_DTYPE_F8_E5M2};

static unsigned failed_cases, cases_run;

/* A case's buffers on the device: the inputs, and each call's outputs
 * poisoned as rf_outputs_new poisons them; out `skew` bytes into its
 * allocation. */
typedef struct dev_outputs {
    uint8_t *base, *out;
    float *scales;
    void *sum, *tmp;
} dev_outputs;

static dev_outputs dev_outputs_new(const rf_outputs *poisoned, size_t skew)
{
    dev_outputs d;
    d.base = gt_upload(NULL, poisoned->out_bytes + skew);
    assert_cuda(gt_memset(d.base, RF_POISON, poisoned->out_bytes + skew));
    d.out = d.base + skew;
    d.scales = gt_upload(poisoned->scales, poisoned->scale_bytes);
    d.sum = gt_upload(poisoned->sum, poisoned->sum_bytes);
    d.tmp = gt_upload(poisoned->tmp, poisoned->sum_bytes);
    return d;
}

static void dev_outputs_download(const dev_outputs *d, rf_outputs *o)
{
    assert_cuda(cudaMemcpy(o->out, d->out, o->out_bytes, cudaMemcpyDeviceToHost));
    assert_cuda(cudaMemcpy(o->scales, d->scales, o->scale_bytes, cudaMemcpyDeviceToHost));
    assert_cuda(cudaMemcpy(o->sum, d->sum, o->sum_bytes, cudaMemcpyDeviceToHost));
}

static void dev_outputs_free(dev_outputs *d)
{
    cudaFree(d->base), cudaFree(d->scales), cudaFree(d->sum), cudaFree(d->tmp);
}

/* An FP8 code as an integer in the codes' order: -127..127, signed
 * zeros alike. */
static int code_order(uint8_t b)
{
    return b & 0x80 ? -(int)(b & 0x7f) : (int)(b & 0x7f);
}

/* got (the GPU's) against host's: sum_out and the padding bit for bit
 * (NaN only as NaN: the GPU's arithmetic gives its own), the scales to the
 * dtype's rounding, codes within a step. */
static int near_host(const char *what, const rf_case *c, const rf_outputs *got,
                     const rf_outputs *host)
{
    double rel = c->dt == WEFT_DTYPE_BF16 ? 0x1p-7 : c->dt == WEFT_DTYPE_F16 ? 0x1p-10 : 0;
    rel = 2 * rel + 1e-5;
    size_t es = weft__dtype_size(c->dt);
    for (size_t i = 0; i < got->sum_bytes / es; i++) {
        const char *g = (const char *)got->sum + i * es, *h = (const char *)host->sum + i * es;
        int in_row = i / c->stride < c->rows && i % c->stride < c->cols;
        if (in_row && isnan(weft__load(c->dt, g, 0)) && isnan(weft__load(c->dt, h, 0)))
            continue;
        if (memcmp(g, h, es)) {
            printf("  %s: sum_out element %zu is not the host's\n", what, i);
            return 0;
        }
    }
    for (size_t r = 0; r < c->rows; r++) {
        double g = got->scales[r], h = host->scales[r];
        int ok = isinf(h) || h == FLT_MIN ? g == h : fabs(g - h) <= rel * h;
        if (!ok) {
            printf("  %s: row %zu: scale %g, host %g\n", what, r, g, h);
            return 0;
        }
    }
    for (size_t i = 0; i < got->out_bytes; i++) {
        size_t r = i / c->out_stride, j = i % c->out_stride;
        uint8_t g = got->out[i], h = host->out[i];
        int ok;
        if (r >= c->rows || j >= c->cols) /* padding and tail */
            ok = g == RF_POISON && h == RF_POISON;
        else if (qz_is_nan(c->ot, h))
            ok = qz_is_nan(c->ot, g);
        else
            ok = !qz_is_nan(c->ot, g) && abs(code_order(g) - code_order(h)) <= 1;
        if (!ok) {
            printf("  %s: row %zu col %zu: code 0x%02x, host 0x%02x\n", what, r, j, g, h);
            return 0;
        }
    }
    return 1;
}

/* Case c on the GPU, out `skew` bytes off its allocation's alignment. */
static void gpu_case(const rf_case *c, size_t skew)
{
    char what[240];
    rf_describe(c, what, sizeof what);
    if (skew)
        snprintf(what + strlen(what), sizeof what - strlen(what), " out +%zu", skew);
    rf_inputs x = rf_make(c);
    assert_non_null(x.in);
    void *din = gt_upload(x.in, x.n * x.es), *dres = gt_upload(x.residual, x.n * x.es);
    void *dw = gt_upload(x.weight, (c->cols + RF_TAIL) * x.es);
    rf_outputs got = rf_outputs_new(c), pair = rf_outputs_new(c), host = rf_outputs_new(c);
    assert_non_null(host.tmp);
    dev_outputs dop = dev_outputs_new(&got, skew), dpair = dev_outputs_new(&pair, 0);

    int rc = rf_call(stream, c, dop.out, dop.scales, dop.sum, din, dres, dw);
    if (rc != WEFT_OK)
        fail_msg("%s: %d %s", what, rc, weft_last_error());
    rc = rf_pair(stream, c, dpair.out, dpair.scales, dpair.sum, dpair.tmp, din, dres, dw);
    if (rc != WEFT_OK)
        fail_msg("%s: the pair: %d %s", what, rc, weft_last_error());
    assert_cuda(cudaStreamSynchronize(stream));
    dev_outputs_download(&dop, &got);
    dev_outputs_download(&dpair, &pair);
    assert_int_equal(rf_call(NULL, c, host.out, host.scales, host.sum, x.in, x.residual, x.weight),
                     WEFT_OK);

    int bad = !rf_same_bytes(what, c, &got, &pair);
    if (bad)
        printf("  FAILED %s: not the bytes of weft_rmsnorm + weft_quantize_fp8 on the GPU\n", what);
    else if (!near_host(what, c, &got, &host))
        printf("  FAILED %s: against the host reference\n", what), bad = 1;
    /* the bytes before a skewed out untouched */
    if (skew) {
        uint8_t *before = gt_download(dop.base, skew);
        for (size_t i = 0; i < skew && !bad; i++)
            if (before[i] != RF_POISON)
                printf("  FAILED %s: a byte before out written\n", what), bad = 1;
        free(before);
    }
    failed_cases += bad;
    cases_run++;

    dev_outputs_free(&dop), dev_outputs_free(&dpair);
    cudaFree(din), cudaFree(dres), cudaFree(dw);
    rf_outputs_free(&got), rf_outputs_free(&pair), rf_outputs_free(&host);
    rf_free(&x);
}

/* The host test's shapes: one row unpadded; three with strides past the
 * row (unaligned: the register tiles); 64 with strides past it by whole
 * 16-byte vectors (the held rows, where the row is whole vectors). */
static rf_case shape_case(weft_dtype dt, weft_dtype ot, size_t rows, size_t cols, unsigned with)
{
    size_t pad = rows == 1 ? 0 : rows == 3 ? 3 : 8, out_pad = rows == 1 ? 0 : rows == 3 ? 5 : 16;
    rf_case c = {
        dt, ot, rows, cols, cols + pad, cols + out_pad, with, rows == 1 ? RF_RANDOM : RF_MIXED};
    return c;
}

static void test_equals_the_pair_and_the_host_at_the_host_tests_shapes(void **state)
{
    (void)state;
    static const size_t COLS[] = {1, 7, 4096, 5000}, ROWS[] = {1, 3, 64};
    for (size_t d = 0; d < 3; d++)
        for (size_t o = 0; o < 2; o++)
            for (size_t ci = 0; ci < 4; ci++)
                for (size_t ri = 0; ri < 3; ri++)
                    for (unsigned with = 0; with < RF_WITH; with++) {
                        rf_case c = shape_case(DTYPES[d], OUT_TYPES[o], ROWS[ri], COLS[ci], with);
                        gpu_case(&c, 0);
                    }
    printf("  %u cases\n", cases_run);
    if (failed_cases)
        fail_msg("%u cases failed (each listed above)", failed_cases);
}

/* Shapes that take each path of the norms (norm.cu), with their stride,
 * and whether the compute-sanitizer run skips them (large). */
static const struct {
    size_t rows, cols, stride;
    int large;
} PATHS[] = {
    {3, 4100, 4104, 0},     /* held, checked at run time: a partial vector */
    {300, 4096, 4096, 0},   /* many rows: the tensor cores' squares (half types) */
    {300, 512, 512, 0},     /* a warp a row, many rows */
    {600, 4096, 4104, 1},   /* asking L2 for rows ahead */
    {3, 16384, 16384, 0},   /* packed (bf16, without the residual) */
    {2, 32768, 32768, 0},   /* packed (fp16 too); fp32 over a cluster */
    {2, 65536, 65536, 0},   /* over a cluster: both reductions pushed */
    {2, 65537, 65544, 0},   /* a cluster's partial vector */
    {2, 200000, 200000, 1}, /* staged (half types, no residual); else tiles */
    {2, 100000, 100003, 1}, /* unaligned: tiles, each read again a pass */
};

static void test_equals_the_pair_and_the_host_on_every_path(void **state)
{
    (void)state;
    static const unsigned WITH[] = {RF_WEIGHT, RF_WEIGHT | RF_RESIDUAL | RF_SUM, 0};
    failed_cases = cases_run = 0;
    for (size_t d = 0; d < 3; d++)
        for (size_t k = 0; k < sizeof PATHS / sizeof *PATHS; k++)
            for (size_t w = 0; w < 3; w++) {
                if (PATHS[k].large && gt_sanitizer())
                    continue;
                rf_case c = {DTYPES[d],       OUT_TYPES[(k + w) % 2],
                             PATHS[k].rows,   PATHS[k].cols,
                             PATHS[k].stride, PATHS[k].cols + 16 * (w % 2),
                             WITH[w],         PATHS[k].rows >= 3 ? RF_MIXED : RF_RANDOM};
                gpu_case(&c, 0);
            }
    /* codes a byte at a time: out, or its stride, off 8-byte alignment */
    for (size_t d = 0; d < 3; d++) {
        rf_case c = {DTYPES[d], WEFT_DTYPE_F8_E4M3, 64, 4096, 4104, 4096, RF_WEIGHT, RF_MIXED};
        gpu_case(&c, 1);
        c.out_stride = 4099;
        gpu_case(&c, 0);
    }
    printf("  %u cases\n", cases_run);
    if (failed_cases)
        fail_msg("%u cases failed (each listed above)", failed_cases);
}

/* On a task's stream: the same bytes as on the test's own. */
typedef struct task_call {
    const rf_case *c;
    dev_outputs *o;
    const void *in, *res, *w;
    int rc;
} task_call;

static void *call_on_task(void *arg)
{
    task_call *t = arg;
    t->rc =
        rf_call(WEFT_TASK_STREAM, t->c, t->o->out, t->o->scales, t->o->sum, t->in, t->res, t->w);
    if (t->rc == WEFT_OK)
        t->rc = weft_await();
    return NULL;
}

static void test_on_a_tasks_stream(void **state)
{
    (void)state;
    rf_case c = {WEFT_DTYPE_BF16, WEFT_DTYPE_F8_E4M3, 64, 4096, 4104, 4112, RF_WEIGHT | RF_RESIDUAL,
                 RF_MIXED};
    rf_inputs x = rf_make(&c);
    assert_non_null(x.in);
    void *din = gt_upload(x.in, x.n * x.es), *dres = gt_upload(x.residual, x.n * x.es);
    void *dw = gt_upload(x.weight, (c.cols + RF_TAIL) * x.es);
    rf_outputs on_task = rf_outputs_new(&c), on_stream = rf_outputs_new(&c);
    dev_outputs dt = dev_outputs_new(&on_task, 0), ds = dev_outputs_new(&on_stream, 0);
    task_call t = {&c, &dt, din, dres, dw, -1};
    weft_task *task;
    assert_int_equal(weft_spawn(runtime, &task, call_on_task, &t, NULL), WEFT_OK);
    assert_int_equal(weft_join(task, NULL), WEFT_OK);
    if (t.rc != WEFT_OK)
        fail_msg("on a task's stream: %d %s", t.rc, weft_last_error());
    assert_int_equal(rf_call(stream, &c, ds.out, ds.scales, ds.sum, din, dres, dw), WEFT_OK);
    assert_cuda(cudaStreamSynchronize(stream));
    dev_outputs_download(&dt, &on_task);
    dev_outputs_download(&ds, &on_stream);
    if (!rf_same_bytes("on a task's stream", &c, &on_task, &on_stream))
        fail_msg("on a task's stream: not the bytes of the call on the test's stream");
    dev_outputs_free(&dt), dev_outputs_free(&ds);
    cudaFree(din), cudaFree(dres), cudaFree(dw);
    rf_outputs_free(&on_task), rf_outputs_free(&on_stream);
    rf_free(&x);
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
    int skip = gt_start("gpu.rmsnorm_fp8");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_the_pair_and_the_host_at_the_host_tests_shapes),
        cmocka_unit_test(test_equals_the_pair_and_the_host_on_every_path),
        cmocka_unit_test(test_on_a_tasks_stream),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
