/*
 * test_attention_gpu.c - weft_attention's kernel against the float64
 * loops of attention_ref.h and against the host reference on the same
 * inputs, on fresh random data: every mode of the host test (both dtypes
 * and every head size, causal or not, queries fewer or more than keys, sliding
 * windows that leave rows seeing nothing, grouped-query ratios 1 to 32,
 * varlen batches mixing 1 and 3000 tokens and one of 100,000, strided
 * views, RoPE in both layouts), the LSE, and tiles that cross every
 * boundary (lengths around multiples of the 128-row and 64-key blocks);
 * a task's own stream (WEFT_TASK_STREAM) gives the bits a stream gives;
 * weft_attention_paged over keys in shuffled pages (a chunk continuing a
 * prefix, a mixed step of decode rows and chunks), bit for bit the dense
 * call's.
 * Outputs are poisoned before each launch (NaN bytes) and must be written
 * completely, their padding left alone; bad arguments are refused before
 * anything is enqueued.
 *
 * Bounds (attention_ref.h): element-wise, half a unit of the dtype at the
 * result plus the terms' size times what fp32 sums lose and, for the GPU,
 * the rounding of the probabilities to the dtype (one more half unit);
 * the LSE within 1e-5 relative plus the scores' fp32 error; with RoPE,
 * plus what the rotated values the GPU may round the other way (exact
 * values within a millionth of a rounding midpoint: at_ambiguity) can
 * move a score. Each case
 * prints its relative error (||got - ref|| / ||ref||), its largest LSE
 * error and the largest difference from the host reference, so one run
 * shows every failing case.
 */
#include "gpu_support/gpu_stream.h"

#include <cuda_runtime_api.h>
#include <math.h>

#include "ops/attention.h"
#include "ops/attention_ref.h"
#include "weft/ops.h"

static weft_runtime *runtime;
static cudaStream_t stream;

static void *download(const void *dev, size_t bytes)
{
    void *h = at_alloc(bytes);
    assert_cuda(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static unsigned failed_cases;

/* One case on the GPU: a's inputs uploaded, O and the LSE poisoned, the
 * kernel's output checked against float64 and (with_host) against the
 * host reference's, which must pass its own bound too. */
static void gpu_case(const char *name, at_data *a, int with_host)
{
    const weft_attention_desc *d = &a->d;
    size_t qr = a->q_rows ? a->q_rows : 1, kr = a->k_rows ? a->k_rows : 1;
    size_t on = qr * d->o_stride * 2, ln = d->lse ? d->heads * d->lse_stride * sizeof(float) : 0;
    void *dq = gt_upload(a->q, qr * d->q_stride * 2), *dk = gt_upload(a->k, kr * d->k_stride * 2);
    void *dv = gt_upload(a->v, kr * d->v_stride * 2), *dout = gt_upload(a->o, on);
    float *dlse = d->lse ? gt_upload(a->lse, ln) : NULL;
    size_t tb = (d->batch + 1) * sizeof(int32_t);
    int32_t *dcq = a->cu_q ? gt_upload(a->cu_q, tb) : NULL,
            *dck = a->cu_k ? gt_upload(a->cu_k, tb) : NULL;
    int32_t *dpq = a->pos_q ? gt_upload(a->pos_q, qr * 4) : NULL;
    int32_t *dpk = a->pos_k ? gt_upload(a->pos_k, kr * 4) : NULL;

    weft_attention_desc g = *d;
    g.lse = dlse, g.cu_seqlens_q = dcq, g.cu_seqlens_k = dck;
    g.q_positions = dpq, g.k_positions = dpk;
    int rc = weft_attention(stream, &g, dout, dq, dk, dv);
    if (rc != WEFT_OK)
        fail_msg("%s: weft_attention returned %d: %s", name, rc, weft_last_error());
    cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess)
        fail_msg("%s: the kernel failed: %s (%s)", name, cudaGetErrorName(e),
                 cudaGetErrorString(e));
    void *o = download(dout, on);
    float *lse = d->lse ? download(dlse, ln) : NULL;
    double rel, lse_err, host_diff = 0;
    size_t bad = at_check(a, o, lse, 1, name, &rel, &lse_err);
    if (with_host) {
        /* the host reference into a's own (poisoned) outputs */
        if (weft_attention(NULL, d, a->o, a->q, a->k, a->v) != WEFT_OK)
            fail_msg("%s: the host call failed: %s", name, weft_last_error());
        double hrel, hlse;
        size_t hbad = at_check(a, a->o, a->lse, 0, name, &hrel, &hlse);
        if (hbad) {
            printf("  FAILED %s: the host reference has %zu elements out of bounds\n", name, hbad);
            bad += hbad;
        }
        for (size_t b = 0; b < d->batch; b++) {
            size_t q0, lq, k0, lk;
            at_sequence(a, b, &q0, &lq, &k0, &lk);
            for (size_t r = q0; r < q0 + lq; r++)
                for (size_t x = 0; x < a->q_width; x++) {
                    size_t at = r * d->o_stride + x;
                    double df = fabs((double)weft__load(d->dtype, o, at) -
                                     (double)weft__load(d->dtype, a->o, at));
                    host_diff = df > host_diff ? df : host_diff;
                }
        }
    }
    printf("  %-46s rel %.2e  lse %.2e  vs host %.2e%s\n", name, rel, lse_err, host_diff,
           bad ? "  FAILED" : "");
    if (bad)
        failed_cases++;
    free(o), free(lse);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse);
    cudaFree(dcq), cudaFree(dck), cudaFree(dpq), cudaFree(dpk);
}

static void no_case_failed(void)
{
    unsigned n = failed_cases;
    failed_cases = 0;
    if (n)
        fail_msg("%u cases failed (each listed above with its first elements)", n);
}

static void dense(const char *name, weft_attention_desc d, int rope)
{
    at_data a = at_new(d, NULL, NULL, 1, rope, 4.0);
    gpu_case(name, &a, 1);
    at_free(&a);
}

static const weft_dtype TYPES[] = {WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

static void test_every_mode_matches_float64_and_the_host(void **state)
{
    (void)state;
    char name[160];
    for (int t = 0; t < 2; t++)
        for (size_t dim = 64; dim <= 256; dim *= 2)
            for (int causal = 0; causal < 2; causal++) {
                weft_attention_desc d = {.dtype = TYPES[t],
                                         .batch = 2,
                                         .heads = 4,
                                         .kv_heads = 2,
                                         .head_dim = dim,
                                         .seq_q = 17,
                                         .seq_k = 17,
                                         .causal = causal};
                snprintf(name, sizeof name, "%s dim %zu causal %d seq 17", t ? "f16" : "bf16", dim,
                         causal);
                dense(name, d, 0);
                d.seq_q = d.seq_k = 300, d.batch = 1;
                snprintf(name, sizeof name, "%s dim %zu causal %d seq 300", t ? "f16" : "bf16", dim,
                         causal);
                dense(name, d, 0);
            }
    no_case_failed();
}

static void test_block_edges_and_unequal_lengths(void **state)
{
    (void)state;
    /* lengths around the 128-query and 64-key blocks; fewer queries than
     * keys (chunked prefill, decode's one query), more (rows that see
     * nothing under causal) */
    static const size_t SHAPES[][2] = {{1, 1},     {127, 129}, {128, 128}, {129, 63},
                                       {64, 65},   {5, 40},    {1, 1000},  {200, 1000},
                                       {300, 100}, {40, 5},    {257, 513}, {1000, 1}};
    char name[160];
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
        for (int causal = 0; causal < 2; causal++) {
            weft_attention_desc d = {.dtype = TYPES[s % 2],
                                     .batch = 2,
                                     .heads = 2,
                                     .kv_heads = 1,
                                     .head_dim = s % 4 == 3 ? 256
                                                 : s % 3    ? 64
                                                            : 128,
                                     .seq_q = SHAPES[s][0],
                                     .seq_k = SHAPES[s][1],
                                     .causal = causal};
            snprintf(name, sizeof name, "q %zu k %zu dim %zu causal %d", d.seq_q, d.seq_k,
                     d.head_dim, causal);
            dense(name, d, 0);
        }
    no_case_failed();
}

static void test_grouped_query_ratios_and_windows(void **state)
{
    (void)state;
    static const size_t RATIOS[] = {1, 4, 8, 32};
    char name[160];
    for (size_t r = 0; r < 4; r++) {
        weft_attention_desc d = {.dtype = TYPES[r % 2],
                                 .batch = 1,
                                 .heads = 32,
                                 .kv_heads = 32 / RATIOS[r],
                                 .head_dim = r % 2 ? 128 : 64,
                                 .seq_q = 70,
                                 .seq_k = 150,
                                 .causal = (int)(r & 1)};
        snprintf(name, sizeof name, "heads 32 kv %zu", d.kv_heads);
        dense(name, d, 0);
    }
    static const size_t WINDOWS[][3] = {{17, 17, 1},  {300, 300, 7},   {100, 260, 64}, {300, 40, 3},
                                        {9, 9, 1000}, {500, 500, 128}, {700, 700, 65}};
    for (size_t c = 0; c < sizeof WINDOWS / sizeof *WINDOWS; c++) {
        weft_attention_desc d = {.dtype = TYPES[c % 2],
                                 .batch = 2,
                                 .heads = 2,
                                 .head_dim = c == 5  ? 256
                                             : c % 3 ? 64
                                                     : 128,
                                 .seq_q = WINDOWS[c][0],
                                 .seq_k = WINDOWS[c][1],
                                 .causal = 1,
                                 .window = WINDOWS[c][2]};
        snprintf(name, sizeof name, "q %zu k %zu window %zu", d.seq_q, d.seq_k, d.window);
        dense(name, d, 0);
    }
    no_case_failed();
}

static void test_long_sequences(void **state)
{
    (void)state;
    weft_attention_desc d = {.dtype = WEFT_DTYPE_BF16,
                             .batch = 1,
                             .heads = 2,
                             .kv_heads = 1,
                             .head_dim = 128,
                             .seq_q = 4097,
                             .seq_k = 4097,
                             .causal = 1};
    at_data a = at_new(d, NULL, NULL, 1, 0, 4.0);
    a.sample = 7;
    gpu_case("4097 causal dim 128", &a, 0);
    at_free(&a);
    d.causal = 0, d.head_dim = 64, d.dtype = WEFT_DTYPE_F16;
    a = at_new(d, NULL, NULL, 1, 0, 4.0);
    a.sample = 7;
    gpu_case("4097 dim 64", &a, 0);
    at_free(&a);
    no_case_failed();
}

static void test_varlen_batches_mixing_1_to_100000_tokens(void **state)
{
    (void)state;
    static const int32_t LQ[] = {1, 3000, 17, 1, 0, 129};
    static const int32_t LK[] = {1, 3000, 40, 300, 5, 129};
    for (int causal = 0; causal < 2; causal++) {
        weft_attention_desc d = {.dtype = TYPES[causal],
                                 .batch = 6,
                                 .heads = 4,
                                 .kv_heads = 1,
                                 .head_dim = causal ? 128 : 64,
                                 .seq_q = 3000,
                                 .seq_k = 3000,
                                 .causal = causal,
                                 .window = causal ? 700 : 0};
        at_data a = at_new(d, LQ, LK, 1, 0, 4.0);
        a.sample = 5;
        gpu_case(causal ? "varlen causal window 700" : "varlen", &a, 1);
        at_free(&a);
    }
    /* a sequence of 100,000 tokens beside short ones; rows sampled, no
     * host reference (its loops would take many minutes) */
    static const int32_t LQL[] = {1, 100000, 33}, LKL[] = {1, 100000, 33};
    weft_attention_desc d = {.dtype = WEFT_DTYPE_BF16,
                             .batch = 3,
                             .heads = 1,
                             .head_dim = 64,
                             .seq_q = 100000,
                             .seq_k = 100000,
                             .causal = 1};
    at_data a = at_new(d, LQL, LKL, 1, 0, 4.0);
    a.sample = 4999;
    gpu_case("varlen with 100000 tokens, causal", &a, 0);
    at_free(&a);
    no_case_failed();
}

static void test_strided_views_and_rope(void **state)
{
    (void)state;
    char name[160];
    for (int t = 0; t < 2; t++) {
        size_t dim = t ? 128 : 64, heads = 4, kvh = 2;
        weft_attention_desc d = {.dtype = TYPES[t],
                                 .batch = 3,
                                 .heads = heads,
                                 .kv_heads = kvh,
                                 .head_dim = dim,
                                 .seq_q = 150,
                                 .seq_k = 150,
                                 .causal = 1,
                                 .q_stride = heads * dim + 24,
                                 .k_stride = kvh * dim + 8,
                                 .v_stride = kvh * dim + 40,
                                 .o_stride = heads * dim + 8};
        snprintf(name, sizeof name, "%s padded strides", t ? "f16" : "bf16");
        dense(name, d, 0);
    }
    for (int layout = 0; layout < 2; layout++)
        for (int t = 0; t < 2; t++) {
            weft_attention_desc d = {.dtype = TYPES[t],
                                     .batch = 2,
                                     .heads = 4,
                                     .kv_heads = 1,
                                     .head_dim = layout ? (t ? 128 : 64) : (t ? 256 : 64),
                                     .seq_q = 100,
                                     .seq_k = 300,
                                     .causal = 1,
                                     .rope_layout = (weft_rope_layout)layout,
                                     .rope_base = layout ? 500000.0f : 0.0f};
            snprintf(name, sizeof name, "rope layout %d %s", layout, t ? "f16" : "bf16");
            dense(name, d, 1);
        }
    static const int32_t LQ[] = {1, 260, 17}, LK[] = {50, 260, 17};
    weft_attention_desc d = {.dtype = WEFT_DTYPE_BF16,
                             .batch = 3,
                             .heads = 8,
                             .kv_heads = 2,
                             .head_dim = 128,
                             .seq_q = 260,
                             .seq_k = 260,
                             .causal = 1,
                             .window = 100,
                             .rope_layout = WEFT_ROPE_HALVES};
    at_data a = at_new(d, LQ, LK, 1, 1, 4.0);
    gpu_case("varlen rope window", &a, 1);
    at_free(&a);
    no_case_failed();
}

/* ---- a task's own stream ------------------------------------------------ */

typedef struct task_job {
    weft_attention_desc d;
    void *o, *q, *k, *v;
} task_job;

/* ---- paged keys ----------------------------------------------------------- */

/* The case's keys in shuffled pages (NaN wherever no key is): the kernel's
 * paged output checked against float64 and, without RoPE (where the dense
 * call rotates K itself), bit for bit against the dense call on the GPU. */
static void paged_case(const char *name, weft_attention_desc d, const int32_t *lq,
                       const int32_t *lk, size_t page_size, int rope)
{
    at_data a = at_new(d, lq, lk, 1, rope, 4.0);
    at_pages p = at_paginate(&a, page_size);
    const weft_attention_desc *ad = &a.d;
    size_t qr = a.q_rows ? a.q_rows : 1, kr = a.k_rows ? a.k_rows : 1;
    size_t on = qr * ad->o_stride * 2, ln = ad->heads * ad->lse_stride * sizeof(float);
    size_t pool = p.cache.pages * page_size * a.k_width * 2, tb = (ad->batch + 1) * 4;
    void *dq = gt_upload(a.q, qr * ad->q_stride * 2), *dout = gt_upload(a.o, on);
    float *dlse = gt_upload(a.lse, ln);
    int32_t *dcq = a.cu_q ? gt_upload(a.cu_q, tb) : NULL;
    int32_t *dpq = a.pos_q ? gt_upload(a.pos_q, qr * 4) : NULL;
    weft_kv_cache c = p.cache;
    c.k = gt_upload(p.kp, pool), c.v = gt_upload(p.vp, pool);
    c.block_table = gt_upload(p.table, ad->batch * c.max_pages * 4);
    int32_t *dlens = gt_upload(p.lens, ad->batch * 4);
    weft_attention_desc g = p.d;
    g.lse = dlse, g.cu_seqlens_q = dcq, g.q_positions = dpq;
    int rc = weft_attention_paged(stream, &c, &g, dlens, dout, dq);
    if (rc != WEFT_OK)
        fail_msg("%s: weft_attention_paged returned %d: %s", name, rc, weft_last_error());
    assert_cuda(cudaStreamSynchronize(stream));
    void *o = download(dout, on);
    float *lse = download(dlse, ln);
    double rel, lse_err;
    size_t bad = at_check(&a, o, lse, 1, name, &rel, &lse_err);
    const char *same = "";
    if (!rope) { /* the dense call over the same keys, into fresh poisoned outputs */
        void *dk = gt_upload(a.k, kr * ad->k_stride * 2),
             *dv = gt_upload(a.v, kr * ad->v_stride * 2);
        int32_t *dck = a.cu_k ? gt_upload(a.cu_k, tb) : NULL;
        void *dout2 = gt_upload(a.o, on);
        float *dlse2 = gt_upload(a.lse, ln);
        weft_attention_desc e = *ad;
        e.lse = dlse2, e.cu_seqlens_q = dcq, e.cu_seqlens_k = dck;
        assert_ok(weft_attention(stream, &e, dout2, dq, dk, dv));
        assert_cuda(cudaStreamSynchronize(stream));
        void *o2 = download(dout2, on);
        float *lse2 = download(dlse2, ln);
        if (memcmp(o, o2, on) != 0 || memcmp(lse, lse2, ln) != 0) {
            printf("  %s: paged and dense keys give different bits\n", name);
            bad++;
        }
        same = "  = dense";
        free(o2), free(lse2);
        cudaFree(dk), cudaFree(dv), cudaFree(dck), cudaFree(dout2), cudaFree(dlse2);
    }
    printf("  %-46s rel %.2e  lse %.2e%s%s\n", name, rel, lse_err, same, bad ? "  FAILED" : "");
    if (bad)
        failed_cases++;
    free(o), free(lse);
    cudaFree(dq), cudaFree(dout), cudaFree(dlse), cudaFree(dcq), cudaFree(dpq), cudaFree(dlens);
    cudaFree(c.k), cudaFree(c.v), cudaFree((void *)c.block_table);
    at_pages_free(&p);
    at_free(&a);
}

static void test_paged_keys_match_float64_and_the_dense_call(void **state)
{
    (void)state;
    char name[128];
    for (int t = 0; t < 2; t++)
        for (size_t dim = 64; dim <= 128; dim *= 2) {
            weft_attention_desc d = {.dtype = TYPES[t],
                                     .batch = 2,
                                     .heads = 8,
                                     .kv_heads = 2,
                                     .head_dim = dim,
                                     .seq_q = 17,
                                     .seq_k = 100,
                                     .causal = 1};
            snprintf(name, sizeof name, "paged %s dim %zu chunk 17 of 100", t ? "f16" : "bf16",
                     dim);
            paged_case(name, d, NULL, NULL, 16, 0);
            d.rope_layout = t ? WEFT_ROPE_HALVES : WEFT_ROPE_INTERLEAVED;
            snprintf(name, sizeof name, "paged %s dim %zu rope, pages of 256", t ? "f16" : "bf16",
                     dim);
            paged_case(name, d, NULL, NULL, 256, 1);
        }
    /* a mixed step: decode rows, chunks, an empty sequence; GQA 4; a window */
    static const int32_t LQ[] = {1, 512, 17, 0, 1, 300}, LK[] = {1, 3512, 40, 5, 700, 300};
    for (int w = 0; w < 2; w++) {
        weft_attention_desc d = {.dtype = TYPES[w],
                                 .batch = 6,
                                 .heads = 32,
                                 .kv_heads = 8,
                                 .head_dim = 128,
                                 .seq_q = 512,
                                 .seq_k = 3512,
                                 .causal = 1,
                                 .window = w ? 1000 : 0};
        paged_case(w ? "paged varlen mixed step, window 1000" : "paged varlen mixed step", d, LQ,
                   LK, w ? 128 : 16, 0);
    }
    weft_attention_desc d = {
        .dtype = WEFT_DTYPE_BF16, .batch = 3, .heads = 4, .head_dim = 64, .seq_q = 33, .seq_k = 47};
    paged_case("paged not causal", d, NULL, NULL, 32, 0);
    no_case_failed();
}

static void *task_main(void *arg)
{
    task_job *j = arg;
    weft_attention_desc d = j->d; /* lives on this frame only */
    GT_OK(weft_attention(WEFT_TASK_STREAM, &d, j->o, j->q, j->k, j->v));
    GT_OK(weft_await());
    return NULL;
}

static void test_a_tasks_stream_computes_what_a_stream_does(void **state)
{
    (void)state;
    weft_attention_desc d = {.dtype = WEFT_DTYPE_F16,
                             .batch = 2,
                             .heads = 8,
                             .kv_heads = 2,
                             .head_dim = 128,
                             .seq_q = 333,
                             .seq_k = 333,
                             .causal = 1};
    at_data a = at_new(d, NULL, NULL, 0, 0, 4.0);
    size_t qn = a.q_rows * a.d.q_stride * 2, kn = a.k_rows * a.d.k_stride * 2;
    task_job j = {.d = a.d};
    j.q = gt_upload(a.q, qn), j.k = gt_upload(a.k, kn), j.v = gt_upload(a.v, kn);
    j.o = gt_upload(a.o, qn);
    void *o_stream = gt_upload(a.o, qn);
    assert_int_equal(weft_attention(stream, &a.d, o_stream, j.q, j.k, j.v), WEFT_OK);
    assert_cuda(cudaStreamSynchronize(stream));
    weft_task *t = NULL;
    gt_reset();
    assert_int_equal(weft_spawn(runtime, &t, task_main, &j, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    gt_assert_passed();
    void *got = download(j.o, qn), *want = download(o_stream, qn);
    if (memcmp(got, want, qn) != 0)
        fail_msg("the task's stream gave other bits than a stream");
    double rel, le;
    if (at_check(&a, got, NULL, 1, "task stream", &rel, &le))
        fail_msg("task stream: elements out of bounds");
    free(got), free(want);
    cudaFree(j.q), cudaFree(j.k), cudaFree(j.v), cudaFree(j.o), cudaFree(o_stream);
    at_free(&a);
}

static void test_bad_arguments_are_refused_before_launch(void **state)
{
    (void)state;
    size_t bytes = 4 * 64 * 2 * 4 + 64;
    char *buf = NULL;
    assert_cuda(cudaMalloc((void **)&buf, bytes));
    assert_cuda(gt_memset(buf, 0x5a, bytes));
    weft_attention_desc d = {
        .dtype = WEFT_DTYPE_BF16, .batch = 1, .heads = 1, .head_dim = 64, .seq_q = 4, .seq_k = 4};
    char *q = buf, *k = buf + 512, *v = buf + 1024, *o = buf + 1536;
    assert_int_equal(weft_attention(stream, &d, o, q + 2, k, v), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "Q is not 16-byte aligned"));
    d.kv_heads = 3;
    assert_int_equal(weft_attention(stream, &d, o, q, k, v), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "does not divide"));
    d.kv_heads = 0, d.head_dim = 96;
    assert_int_equal(weft_attention(stream, &d, o, q, k, v), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "head_dim 96"));
    assert_cuda(cudaStreamSynchronize(stream));
    unsigned char *h = download(o, 512);
    for (size_t i = 0; i < 512; i++)
        assert_int_equal(h[i], 0x5a);
    free(h);
    cudaFree(buf);
}

static int setup(void **state)
{
    (void)state;
    at_rng_state = gt_rng(53);
    return gt_stream_setup(&runtime, &stream);
}

static int teardown(void **state)
{
    (void)state;
    return gt_stream_teardown(runtime, stream);
}

int main(void)
{
    int skip = gt_start("gpu.attention");
    if (skip)
        return skip;
    /* gpu.attention.wgmma: the same tests on Hopper's kernel, which must
     * then be the one that runs */
    const char *wgmma = getenv("WEFT_ATTENTION_WGMMA");
    if (wgmma && strcmp(wgmma, "1") == 0) {
        if (!weft__attention_wgmma_on()) {
            printf("SKIPPED: WEFT_ATTENTION_WGMMA=1, but this GPU cannot run the wgmma kernel "
                   "(it needs compute capability 9.0)\n");
            return 77;
        }
        printf("gpu.attention: head_dim 64 and 128 on the wgmma kernel\n");
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments_are_refused_before_launch),
        cmocka_unit_test(test_every_mode_matches_float64_and_the_host),
        cmocka_unit_test(test_block_edges_and_unequal_lengths),
        cmocka_unit_test(test_grouped_query_ratios_and_windows),
        cmocka_unit_test(test_strided_views_and_rope),
        cmocka_unit_test(test_varlen_batches_mixing_1_to_100000_tokens),
        cmocka_unit_test(test_long_sequences),
        cmocka_unit_test(test_paged_keys_match_float64_and_the_dense_call),
        cmocka_unit_test(test_a_tasks_stream_computes_what_a_stream_does),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
