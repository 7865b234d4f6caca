/*
 * test_attention.c - weft_attention's host reference (NULL stream, and a
 * task's stream on the host backend) against the float64 loops of
 * attention_ref.h, on fresh random data each run (the seed is printed;
 * WEFT_TEST_SEED=<n> replays it): both dtypes and every head size, causal or
 * not, queries fewer or more than keys (chunked prefill, rows that see
 * nothing), sliding windows, grouped-query ratios 1 to 32, varlen batches
 * mixing 1 and 3000 tokens, strided views into a fused QKV row, the LSE,
 * and RoPE in both layouts (also bit for bit against weft_rope followed by
 * attention); weft_attention_paged over keys in shuffled pages, bit for
 * bit what the same keys give densely; every bad argument refused with its
 * reason before anything is written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <time.h>

#include "weft.h"
#include "weft/ops.h"
#include "weft_test.h"
#include "ops/attention_ref.h"

static const weft_dtype TYPES[] = {WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

/* Runs a on the host (NULL stream) and checks it; fails the test on any
 * bad element. */
static void run(const char *name, at_data *a)
{
    double rel, lse_err;
    int rc = weft_attention(NULL, &a->d, a->o, a->q, a->k, a->v);
    if (rc != WEFT_OK)
        fail_msg("%s: weft_attention returned %d: %s", name, rc, weft_last_error());
    size_t bad = at_check(a, a->o, a->lse, 0, name, &rel, &lse_err);
    if (bad)
        fail_msg("%s: %zu elements out of bounds", name, bad);
}

static void dense_case(const char *name, weft_attention_desc d, int lse, int rope)
{
    at_data a = at_new(d, NULL, NULL, lse, rope, 4.0);
    run(name, &a);
    at_free(&a);
}

static void test_every_mode_at_small_shapes_matches_float64(void **state)
{
    (void)state;
    char name[160];
    for (int t = 0; t < 2; t++)
        for (size_t dim = 64; dim <= 256; dim *= 2)
            for (int causal = 0; causal < 2; causal++)
                for (int lse = 0; lse < 2; lse++) {
                    weft_attention_desc d = {.dtype = TYPES[t],
                                             .batch = 2,
                                             .heads = 4,
                                             .kv_heads = 2,
                                             .head_dim = dim,
                                             .seq_q = 17,
                                             .seq_k = 17,
                                             .causal = causal};
                    snprintf(name, sizeof name, "%s dim %zu causal %d lse %d", t ? "f16" : "bf16",
                             dim, causal, lse);
                    dense_case(name, d, lse, 0);
                }
}

static void test_queries_fewer_or_more_than_keys(void **state)
{
    (void)state;
    /* (seq_q, seq_k): chunked prefill (a prefix of cached keys), decode's
     * single query, cross-attention, and more queries than keys, where
     * causal leaves the first rows seeing nothing */
    static const size_t SHAPES[][2] = {{5, 40}, {1, 1000}, {64, 200}, {40, 5}, {1, 1}, {130, 67}};
    char name[160];
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++)
        for (int causal = 0; causal < 2; causal++) {
            weft_attention_desc d = {.dtype = TYPES[s % 2],
                                     .batch = 2,
                                     .heads = 2,
                                     .kv_heads = 1,
                                     .head_dim = s % 3 ? 64 : 128,
                                     .seq_q = SHAPES[s][0],
                                     .seq_k = SHAPES[s][1],
                                     .causal = causal};
            snprintf(name, sizeof name, "q %zu k %zu causal %d", d.seq_q, d.seq_k, causal);
            dense_case(name, d, 1, 0);
        }
}

static void test_long_sequences_with_few_heads(void **state)
{
    (void)state;
    weft_attention_desc d = {.dtype = WEFT_DTYPE_BF16,
                             .batch = 1,
                             .heads = 1,
                             .head_dim = 64,
                             .seq_q = 1000,
                             .seq_k = 1000,
                             .causal = 0};
    dense_case("1000 x 1000", d, 1, 0);
    d.seq_q = d.seq_k = 4097, d.causal = 1, d.dtype = WEFT_DTYPE_F16;
    dense_case("4097 causal", d, 1, 0);
}

static void test_grouped_query_ratios(void **state)
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
                                 .seq_q = 19,
                                 .seq_k = 33,
                                 .causal = (int)(r & 1)};
        snprintf(name, sizeof name, "heads 32 kv %zu", d.kv_heads);
        dense_case(name, d, 1, 0);
    }
}

static void test_sliding_windows(void **state)
{
    (void)state;
    /* (seq_q, seq_k, window): a window of the query alone, windows shorter
     * and longer than the sequence, and more queries than keys, where the
     * first rows see nothing at all */
    static const size_t CASES[][3] = {{17, 17, 1}, {100, 100, 7}, {33, 80, 16},
                                      {50, 20, 3}, {9, 9, 1000},  {200, 200, 64}};
    char name[160];
    for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
        weft_attention_desc d = {.dtype = TYPES[c % 2],
                                 .batch = 2,
                                 .heads = 2,
                                 .head_dim = c == 4  ? 256
                                             : c % 3 ? 64
                                                     : 128,
                                 .seq_q = CASES[c][0],
                                 .seq_k = CASES[c][1],
                                 .causal = 1,
                                 .window = CASES[c][2]};
        snprintf(name, sizeof name, "q %zu k %zu window %zu", d.seq_q, d.seq_k, d.window);
        dense_case(name, d, 1, 0);
    }
}

static void test_varlen_batches_mix_one_and_three_thousand_tokens(void **state)
{
    (void)state;
    static const int32_t LQ[] = {1, 3000, 17, 1, 0};
    static const int32_t LK[] = {1, 3000, 40, 300, 5};
    for (int causal = 0; causal < 2; causal++) {
        weft_attention_desc d = {.dtype = TYPES[causal],
                                 .batch = 5,
                                 .heads = 2,
                                 .kv_heads = 1,
                                 .head_dim = 64,
                                 .seq_q = 3000,
                                 .seq_k = 3000,
                                 .causal = causal,
                                 .window = causal ? 700 : 0};
        at_data a = at_new(d, LQ, LK, 1, 0, 4.0);
        run(causal ? "varlen causal window 700" : "varlen", &a);
        at_free(&a);
    }
}

static void test_strided_views_into_a_fused_projection(void **state)
{
    (void)state;
    /* One buffer of rows [Q | K | V | pad]: Q, K and V are views into it,
     * as a fused QKV projection leaves them; O has padded rows too. */
    for (int t = 0; t < 2; t++) {
        size_t dim = 64, heads = 4, kvh = 2, seq = 37;
        size_t row = (heads + 2 * kvh) * dim + 16;
        weft_attention_desc d = {.dtype = TYPES[t],
                                 .batch = 3,
                                 .heads = heads,
                                 .kv_heads = kvh,
                                 .head_dim = dim,
                                 .seq_q = seq,
                                 .seq_k = seq,
                                 .causal = 1,
                                 .q_stride = row,
                                 .k_stride = row,
                                 .v_stride = row,
                                 .o_stride = heads * dim + 8};
        at_data a = at_new(d, NULL, NULL, 1, 0, 4.0);
        /* fuse: K and V into Q's buffer, past its heads */
        uint16_t *qkv = a.q, *k = a.k, *v = a.v;
        for (size_t r = 0; r < 3 * seq; r++)
            for (size_t e = 0; e < kvh * dim; e++) {
                qkv[r * row + heads * dim + e] = k[r * row + e];
                qkv[r * row + (heads + kvh) * dim + e] = v[r * row + e];
            }
        int rc = weft_attention(NULL, &a.d, a.o, qkv, qkv + heads * dim, qkv + (heads + kvh) * dim);
        if (rc != WEFT_OK)
            fail_msg("fused QKV: %s", weft_last_error());
        double rel, le;
        if (at_check(&a, a.o, a.lse, 0, "fused QKV", &rel, &le))
            fail_msg("fused QKV: elements out of bounds");
        at_free(&a);
    }
}

static void test_rope_matches_float64_and_weft_rope_then_attention(void **state)
{
    (void)state;
    char name[160];
    for (int layout = 0; layout < 2; layout++)
        for (int t = 0; t < 2; t++) {
            weft_attention_desc d = {.dtype = TYPES[t],
                                     .batch = 2,
                                     .heads = 4,
                                     .kv_heads = 1,
                                     .head_dim = layout ? (t ? 128 : 64) : (t ? 256 : 64),
                                     .seq_q = 21,
                                     .seq_k = 70,
                                     .causal = 1,
                                     .rope_layout = (weft_rope_layout)layout,
                                     .rope_base = layout ? 500000.0f : 0.0f};
            snprintf(name, sizeof name, "rope layout %d %s", layout, t ? "f16" : "bf16");
            at_data a = at_new(d, NULL, NULL, 1, 1, 4.0);
            run(name, &a);

            /* weft_rope on copies, then attention without the rotation:
             * the same bits */
            size_t qn = a.q_rows * a.d.q_stride, kn = a.k_rows * a.d.k_stride;
            void *q = at_alloc(qn * 2), *k = at_alloc(kn * 2), *o = at_alloc(qn * 2);
            memcpy(q, a.q, qn * 2), memcpy(k, a.k, kn * 2);
            float base = d.rope_base != 0.0f ? d.rope_base : 10000.0f;
            assert_int_equal(weft_rope(NULL, d.dtype, d.rope_layout, q, d.heads, a.d.q_stride, NULL,
                                       0, 0, a.q_rows, d.head_dim, a.pos_q, base),
                             WEFT_OK);
            assert_int_equal(weft_rope(NULL, d.dtype, d.rope_layout, k, d.kv_heads, a.d.k_stride,
                                       NULL, 0, 0, a.k_rows, d.head_dim, a.pos_k, base),
                             WEFT_OK);
            weft_attention_desc plain = a.d;
            plain.q_positions = plain.k_positions = NULL, plain.lse = NULL;
            assert_int_equal(weft_attention(NULL, &plain, o, q, k, a.v), WEFT_OK);
            if (memcmp(o, a.o, qn * 2) != 0)
                fail_msg("%s: fused RoPE differs from weft_rope then attention", name);
            free(q), free(k), free(o);
            at_free(&a);
        }
}

/* ---- the task's stream on the host backend ------------------------------ */

/* ---- paged keys ----------------------------------------------------------- */

/* The case with its keys in shuffled pages: weft_attention_paged gives
 * what weft_attention gives over the same keys laid out densely, bit for
 * bit, and both pass the float64 reference. */
static void paged_case(const char *name, weft_attention_desc d, const int32_t *lq,
                       const int32_t *lk, size_t page_size, int rope)
{
    at_data a = at_new(d, lq, lk, 1, rope, 4.0);
    at_pages p = at_paginate(&a, page_size);
    run(name, &a); /* dense, into a.o and a.lse */
    size_t qr = a.q_rows ? a.q_rows : 1, lse_n = a.d.heads * a.d.lse_stride;
    void *dense_o = at_alloc(qr * a.d.o_stride * 2);
    float *dense_lse = at_alloc(lse_n * sizeof(float));
    memcpy(dense_o, a.o, qr * a.d.o_stride * 2);
    memcpy(dense_lse, a.lse, lse_n * sizeof(float));
    memset(a.o, 0xff, qr * a.d.o_stride * 2);
    memset(a.lse, 0xff, lse_n * sizeof(float));
    int rc = weft_attention_paged(NULL, &p.cache, &p.d, p.lens, a.o, a.q);
    if (rc != WEFT_OK)
        fail_msg("%s: weft_attention_paged returned %d: %s", name, rc, weft_last_error());
    double rel, lse_err;
    if (at_check(&a, a.o, a.lse, 0, name, &rel, &lse_err))
        fail_msg("%s: paged: elements out of bounds", name);
    if (memcmp(dense_o, a.o, qr * a.d.o_stride * 2) != 0 ||
        memcmp(dense_lse, a.lse, lse_n * sizeof(float)) != 0)
        fail_msg("%s: paged and dense keys give different results", name);
    free(dense_o), free(dense_lse);
    at_pages_free(&p);
    at_free(&a);
}

static void test_paged_keys_give_what_dense_keys_give(void **state)
{
    (void)state;
    /* a chunk continuing a cached prefix: 17 queries, the last of 100 keys */
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
            char name[96];
            snprintf(name, sizeof name, "paged chunk dtype %d dim %zu", (int)d.dtype, dim);
            paged_case(name, d, NULL, NULL, 16, 0);
            snprintf(name, sizeof name, "paged chunk dtype %d dim %zu rope", (int)d.dtype, dim);
            d.rope_layout = t ? WEFT_ROPE_HALVES : WEFT_ROPE_INTERLEAVED;
            paged_case(name, d, NULL, NULL, 256, 1);
        }
    /* a step mixing decode rows, chunks and an empty sequence; GQA 4; windows */
    static const int32_t LQ[] = {1, 300, 17, 0, 1}, LK[] = {1, 1000, 40, 5, 700};
    for (int w = 0; w < 2; w++) {
        weft_attention_desc d = {.dtype = TYPES[w],
                                 .batch = 5,
                                 .heads = 8,
                                 .kv_heads = 2,
                                 .head_dim = 128,
                                 .seq_q = 300,
                                 .seq_k = 1000,
                                 .causal = 1,
                                 .window = w ? 129 : 0};
        paged_case(w ? "paged varlen window 129" : "paged varlen", d, LQ, LK, w ? 256 : 16, w);
    }
    /* not causal: every query sees every key of its sequence */
    weft_attention_desc d = {
        .dtype = WEFT_DTYPE_BF16, .batch = 3, .heads = 4, .head_dim = 64, .seq_q = 33, .seq_k = 47};
    paged_case("paged not causal", d, NULL, NULL, 32, 0);
}

typedef struct task_job {
    at_data *a;
    void *o;
    float *lse;
} task_job;

static void *in_task(void *arg)
{
    task_job *j = arg;
    weft_attention_desc d = j->a->d; /* lives on this frame only */
    d.lse = j->lse;
    if (weft_attention(WEFT_TASK_STREAM, &d, j->o, j->a->q, j->a->k, j->a->v) != WEFT_OK)
        return (void *)"the call failed";
    if (weft_await() != WEFT_OK)
        return (void *)"the await failed";
    return NULL;
}

static void test_the_task_stream_computes_what_the_host_call_does(void **state)
{
    (void)state;
    weft_runtime *rt = NULL;
    assert_int_equal(setup_host_rt((void **)&rt), 0);
    static const int32_t LQ[] = {7, 1, 40}, LK[] = {7, 65, 40};
    weft_attention_desc d = {.dtype = WEFT_DTYPE_BF16,
                             .batch = 3,
                             .heads = 4,
                             .kv_heads = 2,
                             .head_dim = 64,
                             .seq_q = 40,
                             .seq_k = 65,
                             .causal = 1,
                             .window = 9};
    at_data a = at_new(d, LQ, LK, 1, 1, 4.0);
    size_t on = a.q_rows * a.d.o_stride, ln = d.heads * a.d.lse_stride;
    void *o = at_alloc(on * 2);
    float *lse = at_alloc(ln * sizeof(float));
    memset(o, 0xff, on * 2), memset(lse, 0xff, ln * sizeof(float));
    task_job j = {&a, o, lse};
    void *failure = (void *)"not joined";
    assert_int_equal(weft_join(spawn(rt, in_task, &j), &failure), WEFT_OK);
    if (failure)
        fail_msg("%s", (const char *)failure);
    run("task stream's reference", &a);
    if (memcmp(o, a.o, on * 2) != 0 || memcmp(lse, a.lse, ln * sizeof(float)) != 0)
        fail_msg("the task's stream gave other bits than the NULL stream");
    free(o), free(lse);
    at_free(&a);
    assert_int_equal(teardown_rt((void **)&rt), 0);
}

static void test_the_task_stream_outside_a_task_is_refused(void **state)
{
    (void)state;
    weft_attention_desc d = {
        .dtype = WEFT_DTYPE_BF16, .batch = 1, .heads = 1, .head_dim = 64, .seq_q = 1, .seq_k = 1};
    at_data a = at_new(d, NULL, NULL, 0, 0, 1.0);
    assert_int_equal(weft_attention(WEFT_TASK_STREAM, &a.d, a.o, a.q, a.k, a.v), WEFT_ENOTASK);
    at_free(&a);
}

/* ---- bad arguments ---------------------------------------------------- */

/* The call must fail with WEFT_EINVAL naming why, and leave O alone. */
static void refused(const weft_attention_desc *d, at_data *a, const void *o, const void *q,
                    const void *k, const void *v, const char *why)
{
    int rc = weft_attention(NULL, d, (void *)o, q, k, v);
    if (rc != WEFT_EINVAL)
        fail_msg("%s: returned %d, not WEFT_EINVAL", why, rc);
    if (!strstr(weft_last_error(), why))
        fail_msg("expected \"%s\" in \"%s\"", why, weft_last_error());
    size_t n = a->q_rows * a->d.o_stride * 2;
    unsigned char *b = a->o;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0xff)
            fail_msg("%s: O was written", why);
}

static void test_bad_arguments_are_refused_with_the_reason(void **state)
{
    (void)state;
    static const int32_t LQ[] = {4, 6}, LK[] = {5, 6};
    weft_attention_desc good = {.dtype = WEFT_DTYPE_BF16,
                                .batch = 2,
                                .heads = 4,
                                .kv_heads = 2,
                                .head_dim = 64,
                                .seq_q = 6,
                                .seq_k = 6,
                                .causal = 1};
    at_data a = at_new(good, LQ, LK, 1, 1, 1.0);
    const weft_attention_desc base = a.d;
    void *o = a.o;
    const char *q = a.q, *k = a.k, *v = a.v;
    weft_attention_desc d;

    assert_int_equal(weft_attention(NULL, NULL, o, q, k, v), WEFT_EINVAL);
#define BAD(field_change, why)                                                                     \
    do {                                                                                           \
        d = base;                                                                                  \
        field_change;                                                                              \
        refused(&d, &a, o, q, k, v, why);                                                          \
    } while (0)
    BAD(d.reserved[3] = 1, "reserved[3]");
    BAD(d.dtype = WEFT_DTYPE_F32, "not bf16 or fp16");
    BAD(d.dtype = (weft_dtype)7, "not bf16 or fp16");
    BAD(d.batch = 0, "must be >= 1");
    BAD(d.heads = 0, "must be >= 1");
    BAD(d.seq_q = 0, "must be >= 1");
    BAD(d.seq_k = 0, "must be >= 1");
    BAD(d.batch = 70000, "at most 65535");
    BAD(d.seq_k = (size_t)INT32_MAX, "below 2^31 - 256");
    BAD(d.head_dim = 96, "head_dim 96 is not supported");
    BAD(d.head_dim = 512, "head_dim 512 is not supported (64, 128 or 256)");
    BAD(d.kv_heads = 3, "kv_heads 3 does not divide heads 4");
    BAD(d.kv_heads = 8, "kv_heads 8 does not divide heads 4");
    BAD(d.causal = 0; d.window = 4, "a sliding window needs causal");
    BAD(d.scale = INFINITY, "not finite");
    BAD(d.scale = NAN, "not finite");
    BAD(d.cu_seqlens_k = NULL, "needs both cu_seqlens_q and cu_seqlens_k");
    BAD(d.k_positions = NULL, "needs both q_positions and k_positions");
    BAD(d.rope_layout = (weft_rope_layout)5, "unknown RoPE layout");
    BAD(d.rope_base = -1.0f, "rope_base");
    BAD(d.cu_seqlens_q = (const int32_t *)((const char *)a.cu_q + 2), "cu_seqlens_q is not 4-byte");
    BAD(d.q_positions = (const int32_t *)((const char *)a.pos_q + 1), "q_positions is not 4-byte");
    BAD(d.lse = (float *)((char *)a.lse + 2), "lse is not 4-byte aligned");
    BAD(d.lse_stride = 0, "must give lse_stride");
    BAD(d.lse_stride = 9, "lse_stride 9 is smaller than Q's rows (10)");
    BAD(d.seq_q = 5, "has 6 rows, more than the longest (5)");
    BAD(d.q_stride = 200, "Q stride 200 is smaller than its row (256)");
    BAD(d.k_stride = 132, "K's stride 132 is not a multiple of 8");
    BAD(d.o_stride = 260, "O's stride 260 is not a multiple of 8");
    {
        int32_t cu[3] = {0, 5, 4};
        BAD(d.cu_seqlens_q = cu, "cu_seqlens_q decreases at 1");
        cu[0] = -1;
        BAD(d.cu_seqlens_k = cu, "cu_seqlens_k[0] is -1");
    }
    refused(&base, &a, o, NULL, k, v, "Q is NULL");
    refused(&base, &a, o, q, NULL, v, "K is NULL");
    refused(&base, &a, o, q, k, NULL, "V is NULL");
    refused(&base, &a, NULL, q, k, v, "O is NULL");
    refused(&base, &a, o, q + 2, k, v, "Q is not 16-byte aligned");
    refused(&base, &a, o, q, k + 8, v, "K is not 16-byte aligned");
    refused(&base, &a, o, q, k, v + 1, "V is not aligned to its element size");
    refused(&base, &a, (char *)o + 4, q, k, v, "O is not 16-byte aligned");
    refused(&base, &a, (void *)q, q, k, v, "O must be a buffer of its own");
    d = base;
    d.cu_seqlens_q = d.cu_seqlens_k = NULL; /* dense: 2 x 6 rows */
    d.q_positions = d.k_positions = NULL;
    d.batch = SIZE_MAX / 2;
    refused(&d, &a, o, q, k, v, "at most 65535");
#undef BAD
    /* the valid call runs */
    assert_int_equal(weft_attention(NULL, &base, o, q, k, v), WEFT_OK);
    double rel, le;
    assert_int_equal(at_check(&a, a.o, a.lse, 0, "the valid call", &rel, &le), 0);
    at_free(&a);
}

/* A paged call must fail with WEFT_EINVAL naming why, and leave O alone. */
static void paged_refused(const weft_kv_cache *c, const weft_attention_desc *d, const int32_t *lens,
                          at_data *a, const char *why)
{
    size_t n = a->q_rows * a->d.o_stride * 2;
    memset(a->o, 0xff, n);
    int rc = weft_attention_paged(NULL, c, d, lens, a->o, a->q);
    if (rc != WEFT_EINVAL)
        fail_msg("%s: returned %d, not WEFT_EINVAL", why, rc);
    if (!strstr(weft_last_error(), why))
        fail_msg("expected \"%s\" in \"%s\"", why, weft_last_error());
    for (size_t i = 0; i < n / 2; i++)
        if (!at_poisoned16(a->o, i))
            fail_msg("%s: O was written", why);
}

static void test_paged_bad_arguments_are_refused_with_the_reason(void **state)
{
    (void)state;
    weft_attention_desc d0 = {.dtype = WEFT_DTYPE_BF16,
                              .batch = 2,
                              .heads = 4,
                              .kv_heads = 2,
                              .head_dim = 64,
                              .seq_q = 5,
                              .seq_k = 40,
                              .causal = 1};
    at_data a = at_new(d0, NULL, NULL, 0, 0, 1.0);
    at_pages p = at_paginate(&a, 16);
    weft_kv_cache c = p.cache;
    weft_attention_desc d = p.d;
    int32_t lens[2] = {40, 40};
    assert_int_equal(weft_attention_paged(NULL, &c, &d, lens, a.o, a.q), WEFT_OK);
#define PAGED_DESC(field, value, why)                                                              \
    do {                                                                                           \
        d = p.d;                                                                                   \
        d.field = value;                                                                           \
        paged_refused(&c, &d, lens, &a, why);                                                      \
        d = p.d;                                                                                   \
    } while (0)
    PAGED_DESC(dtype, WEFT_DTYPE_F16, "not the cache's");
    PAGED_DESC(kv_heads, 4, "not the cache's");
    PAGED_DESC(head_dim, 128, "not the cache's");
    PAGED_DESC(batch, 3, "more than the cache's 2 sequences");
    PAGED_DESC(seq_k, 49, "over the table's capacity");
    PAGED_DESC(cu_seqlens_k, lens, "the keys are the cache's");
    PAGED_DESC(k_positions, lens, "the keys are the cache's");
    PAGED_DESC(k_stride, 128, "the keys are the cache's");
    d.causal = 0, d.window = 3;
    paged_refused(&c, &d, lens, &a, "sliding window needs causal");
    d = p.d;
    c.format = WEFT_KV_FP8_E4M3;
    c.k_scale = c.v_scale = (const float *)lens;
    paged_refused(&c, &d, lens, &a, "FP8 pages are read by weft_attention_decode only");
    c = p.cache;
    c.page_size = 24;
    paged_refused(&c, &d, lens, &a, "not a power of two");
    c = p.cache;
    paged_refused(NULL, &d, lens, &a, "cache is NULL");
    paged_refused(&c, &d, NULL, &a, "seq_lens is NULL");
    /* the tables, read in time on the NULL stream */
    lens[1] = 41;
    paged_refused(&c, &d, lens, &a, "seq_lens[1] is 41, outside [0, 40]");
    lens[1] = -1;
    paged_refused(&c, &d, lens, &a, "seq_lens[1] is -1");
    lens[1] = 40;
    p.table[c.max_pages + 2] = (int32_t)c.pages;
    paged_refused(&c, &d, lens, &a, "sequence 1's page 2");
    lens[1] = 32; /* its third page unused: not read, not refused */
    assert_int_equal(weft_attention_paged(NULL, &c, &d, lens, a.o, a.q), WEFT_OK);
#undef PAGED_DESC
    at_pages_free(&p);
    at_free(&a);
}

int main(void)
{
    const char *seed = getenv("WEFT_TEST_SEED");
    at_rng_state = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL);
    printf("seed %llu (WEFT_TEST_SEED=<n> replays it)\n", (unsigned long long)at_rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments_are_refused_with_the_reason),
        cmocka_unit_test(test_every_mode_at_small_shapes_matches_float64),
        cmocka_unit_test(test_queries_fewer_or_more_than_keys),
        cmocka_unit_test(test_grouped_query_ratios),
        cmocka_unit_test(test_sliding_windows),
        cmocka_unit_test(test_strided_views_into_a_fused_projection),
        cmocka_unit_test(test_paged_keys_give_what_dense_keys_give),
        cmocka_unit_test(test_paged_bad_arguments_are_refused_with_the_reason),
        cmocka_unit_test(test_rope_matches_float64_and_weft_rope_then_attention),
        cmocka_unit_test(test_varlen_batches_mix_one_and_three_thousand_tokens),
        cmocka_unit_test(test_long_sequences_with_few_heads),
        cmocka_unit_test(test_the_task_stream_computes_what_the_host_call_does),
        cmocka_unit_test(test_the_task_stream_outside_a_task_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
