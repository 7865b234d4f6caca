/*
 * test_paged.c - the paged KV cache's host references (NULL stream) on
 * fresh random data each run (the seed is printed; WEFT_TEST_SEED replays
 * it): weft_kv_append of several sequences' tokens at once, in shuffled
 * order, into shuffled pages, with and without RoPE in both layouts,
 * checked bit for bit against weft_rope's host result; then
 * weft_attention_decode against paged_ref.h's float64 loops: lengths 0, 1,
 * 17, 1000 and 4097 (partly filled last pages), GQA ratios 1, 4, 8 and 32,
 * pages of 16 and 256, q_len 1, 4 and 8 (causal among the queries),
 * sliding windows, head dims 64 and 128, bf16 and fp16, FP8 E4M3 pools
 * with per-head scales (the append checked against weft_rope's fp32
 * rotation, scaled and rounded), the LSE; the calls in a task's stream
 * order on the host backend (and a bad table there clamped, not refused);
 * and every bad argument refused with its reason before anything is
 * written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "ops/paged_ref.h"
#include "weft.h"
#include "weft/ops.h"

/* Appends the case's tokens and checks the pools; then decodes and checks
 * against float64. */
static void run_case(const char *name, const pg_shape *s)
{
    pg_case c = pg_make(s);
    weft_kv_rope rope = pg_rope(&c);
    int rc = weft_kv_append(NULL, &c.cache, c.k, 0, c.v, 0, c.tokens, c.seq_ids, c.positions,
                            s->rope ? &rope : NULL);
    if (rc != WEFT_OK)
        fail_msg("%s: append: %s", name, weft_last_error());
    if (pg_check_pools(&c, c.kp, c.vp))
        fail_msg("%s: the append's pools differ", name);

    weft_attention_decode_desc d = pg_desc(&c);
    size_t ws = 0;
    assert_int_equal(weft_attention_decode_workspace(&c.cache, &d, &ws), WEFT_OK);
    void *work = ws ? pg_alloc(ws) : NULL;
    void *out = pg_alloc(c.q_elems * 2);
    float *lse = pg_alloc(c.rows * 4);
    memset(out, PG_POISON, c.q_elems * 2);
    memset(lse, PG_POISON, c.rows * 4);
    rc = weft_attention_decode(NULL, &c.cache, &d, out, lse, c.q, c.lens, work, ws);
    if (rc != WEFT_OK)
        fail_msg("%s: decode: %s", name, weft_last_error());
    if (pg_check_decode(name, &c, out, lse))
        fail_msg("%s: decode differs from float64", name);
    if (s->q_rope) { /* the same as weft_rope_scaled's q decoded as it is, bit for bit */
        weft_attention_decode_desc plain = d;
        plain.q_rope = NULL;
        void *out_plain = pg_alloc(c.q_elems * 2);
        rc = weft_attention_decode(NULL, &c.cache, &plain, out_plain, NULL, c.q_turned, c.lens,
                                   work, ws);
        if (rc != WEFT_OK)
            fail_msg("%s: decode of the turned q: %s", name, weft_last_error());
        if (memcmp(out, out_plain, c.q_elems * 2) != 0)
            fail_msg("%s: decode turning q differs from weft_rope_scaled's q decoded", name);
        free(out_plain);
    }

    /* q as a view into wider rows (a fused projection's), NaN between:
     * the same output, bit for bit */
    size_t width = s->heads * s->head_dim, stride = width + 24;
    uint16_t *wide = pg_alloc(c.q_elems / width * stride * 2);
    void *out2 = pg_alloc(c.q_elems * 2);
    for (size_t r = 0; r < c.q_elems / width; r++) {
        memcpy(wide + r * stride, (const uint16_t *)c.q + r * width, width * 2);
        for (size_t e = width; e < stride; e++)
            wide[r * stride + e] = 0x7fc1; /* NaN in bf16 and fp16 */
    }
    d.q_stride = stride;
    rc = weft_attention_decode(NULL, &c.cache, &d, out2, NULL, wide, c.lens, work, ws);
    if (rc != WEFT_OK)
        fail_msg("%s: decode with q_stride: %s", name, weft_last_error());
    if (memcmp(out, out2, c.q_elems * 2) != 0)
        fail_msg("%s: decode with q_stride %zu differs from packed q", name, stride);
    free(wide), free(out2);
    free(work), free(out), free(lse);
    pg_free(&c);
}

static void test_append_then_decode_match_float64(void **state)
{
    (void)state;
    for (size_t i = 0; i < PG_NCASES; i++) {
        pg_shape s = pg_shape_of(&PG_CASES[i], i % 3 == 1 ? 4 : 0);
        char name[200];
        pg_name(name, sizeof name, i, &s);
        run_case(name, &s);
    }
}

/* ---- a task's stream order ---------------------------------------------- */

typedef struct chain {
    pg_case *c;
    void *out;
    float *lse;
    int32_t *bad_lens;
    void *out2;
    int rc;
} chain;

static void *chain_task(void *arg)
{
    chain *j = arg;
    pg_case *c = j->c;
    weft_kv_rope rope = pg_rope(c);
    weft_attention_decode_desc d = pg_desc(c);
    if ((j->rc = weft_kv_append(WEFT_TASK_STREAM, &c->cache, c->k, 0, c->v, 0, c->tokens,
                                c->seq_ids, c->positions, &rope)) != WEFT_OK ||
        (j->rc = weft_attention_decode(WEFT_TASK_STREAM, &c->cache, &d, j->out, j->lse, c->q,
                                       c->lens, NULL, 0)) != WEFT_OK ||
        /* lengths past max_seq_len and below 0, read too late to refuse: clamped */
        (j->rc = weft_attention_decode(WEFT_TASK_STREAM, &c->cache, &d, j->out2, NULL, c->q,
                                       j->bad_lens, NULL, 0)) != WEFT_OK)
        return NULL;
    j->rc = weft_await();
    return NULL;
}

static void test_the_calls_run_in_a_tasks_stream_order(void **state)
{
    (void)state;
    static const int32_t LENS[] = {40, 3};
    pg_shape s = {.dtype = WEFT_DTYPE_BF16,
                  .seqs = 2,
                  .kv_heads = 2,
                  .heads = 4,
                  .head_dim = 64,
                  .page_size = 16,
                  .q_len = 2,
                  .lens = LENS,
                  .rope = 1,
                  .splits = 1};
    pg_case c = pg_make(&s);
    int32_t bad_lens[2] = {1 << 30, -5};
    chain j = {.c = &c, .bad_lens = bad_lens};
    j.out = pg_alloc(c.q_elems * 2);
    j.out2 = pg_alloc(c.q_elems * 2);
    j.lse = pg_alloc(c.rows * 4);
    memset(j.out, PG_POISON, c.q_elems * 2);
    memset(j.out2, PG_POISON, c.q_elems * 2);
    memset(j.lse, PG_POISON, c.rows * 4);
    weft_runtime *rt;
    weft_config cfg = {.workers = 1, .backend = WEFT_BACKEND_HOST};
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    weft_task *task;
    assert_int_equal(weft_spawn(rt, &task, chain_task, &j, NULL), WEFT_OK);
    assert_int_equal(weft_join(task, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    if (j.rc != WEFT_OK)
        fail_msg("task: %d %s", j.rc, weft_last_error());
    assert_int_equal(pg_check_pools(&c, c.kp, c.vp), 0);
    assert_int_equal(pg_check_decode("task", &c, j.out, j.lse), 0);
    /* the clamped lengths: sequence 0 at the capacity reads poisoned (NaN)
     * keys, so only sequence 1's (length 0: zeros) are pinned down */
    for (size_t e = c.q_elems / 2; e < c.q_elems; e++)
        assert_true(((uint16_t *)j.out2)[e] == 0);
    free(j.out), free(j.out2), free(j.lse);
    pg_free(&c);
}

/* ---- bad arguments ----------------------------------------------------- */

static void expect_einval(int rc, const char *what)
{
    if (rc != WEFT_EINVAL)
        fail_msg("%s: got %d, not WEFT_EINVAL", what, rc);
    const char *msg = weft_last_error();
    if (!msg || !*msg)
        fail_msg("%s: no message", what);
}

static void test_bad_arguments_are_refused_before_anything_is_written(void **state)
{
    (void)state;
    static const int32_t LENS[] = {20, 33};
    pg_shape s = {.dtype = WEFT_DTYPE_F16,
                  .seqs = 2,
                  .kv_heads = 2,
                  .heads = 8,
                  .head_dim = 64,
                  .page_size = 16,
                  .q_len = 2,
                  .lens = LENS,
                  .splits = 3};
    pg_case c = pg_make(&s);
    weft_kv_rope rope = pg_rope(&c);
    rope.layout = WEFT_ROPE_HALVES;
    weft_attention_decode_desc d = pg_desc(&c);
    size_t ws = 0;
    assert_int_equal(weft_attention_decode_workspace(&c.cache, &d, &ws), WEFT_OK);
    assert_true(ws > 0);
    void *work = pg_alloc(ws);
    void *out = pg_alloc(c.q_elems * 2 + 64);
    float *lse = pg_alloc(c.rows * 4 + 64);
    memset(out, PG_POISON, c.q_elems * 2 + 64);
    memset(lse, PG_POISON, c.rows * 4 + 64);
    void *kp0 = pg_alloc(c.pool_elems * 2);
    memcpy(kp0, c.kp, c.pool_elems * 2);

#define APPEND(cache, k, ks, v, vs, n, ids, pos, r)                                                \
    weft_kv_append(NULL, cache, k, ks, v, vs, n, ids, pos, r)
#define DECODE(cache, desc, o, l, q, lens, w, wn)                                                  \
    weft_attention_decode(NULL, cache, desc, o, l, q, lens, w, wn)
    /* the cache */
    weft_kv_cache bad;
    const weft_kv_cache *cc = &c.cache;
    expect_einval(APPEND(NULL, c.k, 0, c.v, 0, c.tokens, c.seq_ids, c.positions, NULL), "NULL");
#define BAD_CACHE(field, value, what)                                                              \
    do {                                                                                           \
        bad = c.cache;                                                                             \
        bad.field = value;                                                                         \
        expect_einval(APPEND(&bad, c.k, 0, c.v, 0, c.tokens, c.seq_ids, c.positions, NULL), what); \
        expect_einval(DECODE(&bad, &d, out, lse, c.q, c.lens, work, ws), what);                    \
        expect_einval(weft_attention_decode_workspace(&bad, &d, &ws), what);                       \
    } while (0)
    BAD_CACHE(dtype, WEFT_DTYPE_F32, "fp32 cache");
    BAD_CACHE(dtype, (weft_dtype)9, "unknown dtype");
    BAD_CACHE(head_dim, 96, "head_dim 96");
    BAD_CACHE(head_dim, 0, "head_dim 0");
    BAD_CACHE(page_size, 8, "page_size 8");
    BAD_CACHE(page_size, 24, "page_size 24");
    BAD_CACHE(page_size, 512, "page_size 512");
    BAD_CACHE(pages, 0, "no pages");
    BAD_CACHE(kv_heads, 0, "no kv heads");
    BAD_CACHE(seqs, 0, "no sequences");
    BAD_CACHE(max_pages, 0, "no table columns");
    BAD_CACHE(max_pages, (size_t)1 << 28, "capacity over int32");
    BAD_CACHE(pages, SIZE_MAX / 4, "pools overflow");
    BAD_CACHE(k, NULL, "NULL k pool");
    BAD_CACHE(v, (char *)c.vp + 2, "misaligned v pool");
    BAD_CACHE(v, c.kp, "k pool is v pool");
    BAD_CACHE(block_table, NULL, "NULL table");
    BAD_CACHE(block_table, (const int32_t *)((const char *)c.table + 2), "misaligned table");
    BAD_CACHE(reserved[2], 1, "cache reserved");
    BAD_CACHE(format, (weft_kv_format)7, "unknown format");
    BAD_CACHE(format, WEFT_KV_FP8_E4M3, "FP8 without scales");
    BAD_CACHE(k_scale, c.k_scale, "a scale without FP8");
    float scales[4] = {1, 1, 1, 1};
    bad = c.cache;
    bad.format = WEFT_KV_FP8_E4M3;
    bad.k_scale = scales, bad.v_scale = (const float *)((const char *)scales + 2);
    expect_einval(APPEND(&bad, c.k, 0, c.v, 0, c.tokens, c.seq_ids, c.positions, NULL),
                  "misaligned v_scale");
    expect_einval(DECODE(&bad, &d, out, lse, c.q, c.lens, work, ws), "misaligned v_scale");
    ws = 0;
    assert_int_equal(weft_attention_decode_workspace(cc, &d, &ws), WEFT_OK);

    /* the append */
    size_t n = c.tokens;
    expect_einval(APPEND(cc, NULL, 0, c.v, 0, n, c.seq_ids, c.positions, NULL), "NULL k");
    expect_einval(APPEND(cc, (char *)c.k + 1, 0, c.v, 0, n, c.seq_ids, c.positions, NULL),
                  "misaligned k");
    expect_einval(APPEND(cc, c.k, 0, NULL, 0, n, c.seq_ids, c.positions, NULL), "NULL v");
    expect_einval(APPEND(cc, c.k, 64, c.v, 0, n, c.seq_ids, c.positions, NULL), "short k_stride");
    expect_einval(APPEND(cc, c.k, 0, c.v, 127, n, c.seq_ids, c.positions, NULL), "short v_stride");
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, 0, c.seq_ids, c.positions, NULL), "no tokens");
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, NULL, c.positions, NULL), "NULL seq_ids");
    expect_einval(
        APPEND(cc, c.k, 0, c.v, 0, n, c.seq_ids, (int32_t *)((char *)c.positions + 1), NULL),
        "misaligned positions");
    weft_kv_rope r = rope;
    r.base = 0;
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, c.seq_ids, c.positions, &r), "RoPE base 0");
    r.base = INFINITY;
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, c.seq_ids, c.positions, &r), "RoPE base Inf");
    r = rope;
    r.layout = (weft_rope_layout)5;
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, c.seq_ids, c.positions, &r), "RoPE layout");
    weft_rope_llama3 bad_scaling = PG_LLAMA3;
    bad_scaling.high_freq_factor = bad_scaling.low_freq_factor;
    r = rope;
    r.scaling = &bad_scaling;
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, c.seq_ids, c.positions, &r),
                  "Llama 3 scaling with high_freq_factor = low_freq_factor");
    /* tables the host reads in time */
    int32_t *ids = pg_alloc(n * 4), *pos = pg_alloc(n * 4);
    memcpy(ids, c.seq_ids, n * 4);
    memcpy(pos, c.positions, n * 4);
    ids[n - 1] = 2;
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, ids, pos, &rope), "seq_id past seqs");
    ids[n - 1] = -1;
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, ids, pos, &rope), "negative seq_id");
    ids[n - 1] = c.seq_ids[n - 1];
    pos[n - 1] = (int32_t)(c.cache.max_pages * 16);
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, ids, pos, &rope), "position past capacity");
    pos[n - 1] = -3;
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, ids, pos, &rope), "negative position");
    pos[n - 1] = c.positions[n - 1];
    /* a position in the spare table column, whose entry is -1 */
    ids[0] = 0, pos[0] = 40;
    expect_einval(APPEND(cc, c.k, 0, c.v, 0, n, ids, pos, &rope), "page outside the pool");
    assert_memory_equal(c.kp, kp0, c.pool_elems * 2);

    /* the decode */
    weft_attention_decode_desc e = d;
#define BAD_DESC(field, value, what)                                                               \
    do {                                                                                           \
        e = d;                                                                                     \
        e.field = value;                                                                           \
        expect_einval(DECODE(cc, &e, out, lse, c.q, c.lens, work, ws), what);                      \
        expect_einval(weft_attention_decode_workspace(cc, &e, &ws), what);                         \
    } while (0)
    BAD_DESC(q_len, 0, "q_len 0");
    BAD_DESC(q_len, 9, "q_len 9");
    BAD_DESC(heads, 7, "heads not a multiple of kv_heads");
    BAD_DESC(heads, 0, "no heads");
    BAD_DESC(scale, -1.0f, "negative scale");
    BAD_DESC(scale, NAN, "NaN scale");
    BAD_DESC(max_seq_len, c.cache.max_pages * 16 + 1, "max_seq_len past the capacity");
    BAD_DESC(reserved[0], 7, "desc reserved");
    BAD_DESC(q_stride, d.heads * c.cache.head_dim - 8, "q_stride below a row");
    BAD_DESC(q_stride, d.heads * c.cache.head_dim + 4, "q_stride not a multiple of 8");
    weft_kv_rope bad_rope = rope;
    bad_rope.base = NAN;
    BAD_DESC(q_rope, &bad_rope, "q_rope base NaN");
    bad_rope = rope;
    bad_rope.layout = (weft_rope_layout)5;
    BAD_DESC(q_rope, &bad_rope, "q_rope layout");
    bad_rope = rope;
    bad_rope.scaling = &bad_scaling;
    BAD_DESC(q_rope, &bad_rope, "q_rope Llama 3 scaling");
    expect_einval(DECODE(cc, NULL, out, lse, c.q, c.lens, work, ws), "NULL desc");
    expect_einval(weft_attention_decode_workspace(cc, &d, NULL), "NULL bytes");
    expect_einval(DECODE(cc, &d, NULL, lse, c.q, c.lens, work, ws), "NULL out");
    expect_einval(DECODE(cc, &d, out, lse, NULL, c.lens, work, ws), "NULL q");
    expect_einval(DECODE(cc, &d, (char *)out + 2, lse, c.q, c.lens, work, ws), "misaligned out");
    expect_einval(DECODE(cc, &d, out, lse, (char *)c.q + 8, c.lens, work, ws), "misaligned q");
    expect_einval(DECODE(cc, &d, out, (float *)((char *)lse + 2), c.q, c.lens, work, ws),
                  "misaligned lse");
    expect_einval(DECODE(cc, &d, c.q, lse, c.q, c.lens, work, ws), "out is q");
    expect_einval(DECODE(cc, &d, (char *)c.q + 64, lse, c.q, c.lens, work, ws), "out overlaps q");
    expect_einval(DECODE(cc, &d, out, lse, c.q, NULL, work, ws), "NULL seq_lens");
    expect_einval(DECODE(cc, &d, out, lse, c.q, c.lens, work, ws - 1), "short workspace");
    expect_einval(DECODE(cc, &d, out, lse, c.q, c.lens, NULL, ws), "NULL workspace");
    expect_einval(DECODE(cc, &d, out, lse, c.q, c.lens, (char *)work + 4, ws), "misaligned ws");
    int32_t lens[2] = {20, 33};
    e = d;
    e.max_seq_len = 30;
    expect_einval(DECODE(cc, &e, out, lse, c.q, lens, work, ws), "length past max_seq_len");
    lens[1] = -1;
    expect_einval(DECODE(cc, &d, out, lse, c.q, lens, work, ws), "negative length");
    lens[1] = 33;
    int32_t saved = c.table[c.cache.max_pages + 2];
    c.table[c.cache.max_pages + 2] = (int32_t)c.cache.pages;
    expect_einval(DECODE(cc, &d, out, lse, c.q, lens, work, ws), "used page past the pool");
    c.table[c.cache.max_pages + 2] = saved;
    for (size_t i = 0; i < c.q_elems * 2 + 64; i++)
        assert_int_equal(((unsigned char *)out)[i], PG_POISON);
    for (size_t i = 0; i < c.rows * 4 + 64; i++)
        assert_int_equal(((unsigned char *)lse)[i], PG_POISON);
    /* the spare column's -1 is not among the pages a length uses: accepted */
    assert_int_equal(APPEND(cc, c.k, 0, c.v, 0, n, c.seq_ids, c.positions, NULL), WEFT_OK);
    assert_int_equal(DECODE(cc, &d, out, lse, c.q, lens, work, ws), WEFT_OK);
    assert_int_equal(pg_check_decode("after the refusals", &c, out, lse), 0);
#ifndef WEFT_HAVE_CUDA
    int dummy;
    expect_einval(weft_kv_append(&dummy, cc, c.k, 0, c.v, 0, n, c.seq_ids, c.positions, NULL),
                  "a stream without CUDA");
    expect_einval(weft_attention_decode(&dummy, cc, &d, out, lse, c.q, lens, work, ws),
                  "a stream without CUDA");
#endif
    free(ids), free(pos), free(kp0), free(work), free(out), free(lse);
    pg_free(&c);
}

int main(void)
{
    pg_rng_state = pg_seed();
    printf("test_paged: seed %llu\n", (unsigned long long)pg_rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_then_decode_match_float64),
        cmocka_unit_test(test_the_calls_run_in_a_tasks_stream_order),
        cmocka_unit_test(test_bad_arguments_are_refused_before_anything_is_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
