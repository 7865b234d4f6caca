/*
 * paged_ref.h - what the host and GPU tests of the paged KV cache share:
 * a random case (sequences of given lengths whose pages are a shuffled
 * selection of a larger pool, so no sequence's pages are contiguous or in
 * order), its tokens' keys and values, the pools weft_rope's host result
 * predicts after an append (for FP8 pools, the same rotation in fp32 then
 * the scale and E4M3's rounding), and the float64 reference of the
 * decode.
 *
 * The decode's reference reads the keys and values as the pools hold them
 * (the stored bf16/fp16 values) and computes in double; the library's
 * results must be within the dtype's rounding of it: out within 2^-8
 * (bf16) or 2^-10 (fp16) of |ref| plus 1e-5 (the values are in [-1, 1],
 * so an output is too), lse within 1e-4 (1 + |ref|). Outputs are poisoned
 * with 0xff bytes (a NaN in every type), so an element never written
 * fails the comparison.
 */
#ifndef WEFT_TEST_PAGED_REF_H
#define WEFT_TEST_PAGED_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/ops_internal.h"
#include "ops/paged.h"
#include "weft/ops.h"

static uint64_t pg_rng_state;

static inline uint64_t pg_rng(void)
{
    uint64_t z = (pg_rng_state += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline double pg_uniform(void)
{
    return (double)(pg_rng() >> 11) * 0x1p-52 - 1.0;
}

/* The seed: WEFT_TEST_SEED when set, else the clock; printed by the caller. */
static inline uint64_t pg_seed(void)
{
    const char *s = getenv("WEFT_TEST_SEED");
    if (s && *s)
        return strtoull(s, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec;
}

enum { PG_POISON = 0xff };

static inline void *pg_alloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p)
        abort();
    return p;
}

/* A decode case: the shape, and the lengths of its sequences. */
typedef struct pg_shape {
    weft_dtype dtype;
    size_t seqs, kv_heads, heads, head_dim, page_size, q_len, window;
    const int32_t *lens;
    int rope;   /* 0 none, else 1 + weft_rope_layout */
    int llama3; /* the rope with Llama 3's scaled frequencies */
    int q_rope; /* the decode turns q as it reads it (the same rope) */
    float scale;
    size_t splits;
    int fp8; /* FP8 E4M3 pools with random per-head scales */
} pg_shape;

/* A row of a case table: a shape and how its keys are turned. */
typedef struct pg_row {
    weft_dtype t;
    size_t seqs, kv, heads, dim, page, q_len, window;
    const int32_t *lens;
    int rope;
    float scale;
    int fp8, llama3, q_rope;
} pg_row;

static const int32_t PG_MIXED[] = {1, 17, 1000, 4097}, PG_SHORT[] = {17, 0, 5, 33},
                     PG_ONE[] = {1, 2, 300}, PG_LONG[] = {4097};

/* The cases the host and the GPU test both run. */
static const pg_row PG_CASES[] = {
    /* GQA ratio 1, 4, 8, 32 over lengths 1 to 4097, pages of 16 and 256 */
    {WEFT_DTYPE_BF16, 4, 2, 2, 128, 16, 1, 0, PG_MIXED, 0, 0, 0, 0, 0},
    {WEFT_DTYPE_BF16, 4, 2, 8, 128, 256, 1, 0, PG_MIXED, 2, 0, 0, 0, 0},
    {WEFT_DTYPE_F16, 4, 1, 8, 64, 16, 4, 0, PG_MIXED, 1, 0, 0, 0, 0},
    {WEFT_DTYPE_BF16, 1, 1, 32, 128, 16, 4, 0, PG_LONG, 2, 0, 0, 0, 0},
    /* sliding windows, wider and narrower than a page, and of one key */
    {WEFT_DTYPE_BF16, 4, 2, 8, 64, 16, 4, 100, PG_MIXED, 1, 0, 0, 0, 0},
    {WEFT_DTYPE_F16, 4, 1, 4, 128, 256, 1, 7, PG_MIXED, 0, 0, 0, 0, 0},
    {WEFT_DTYPE_BF16, 3, 2, 4, 128, 16, 8, 1, PG_ONE, 0, 0, 0, 0, 0},
    /* empty and short sequences (queries before the first key), 8 queries, a scale */
    {WEFT_DTYPE_F16, 4, 2, 8, 128, 16, 8, 0, PG_SHORT, 2, 0.3f, 0, 0, 0},
    {WEFT_DTYPE_BF16, 3, 4, 4, 64, 256, 4, 0, PG_ONE, 1, 0, 0, 0, 0},
    /* FP8 E4M3 pools, with and without RoPE, windowed */
    {WEFT_DTYPE_BF16, 4, 2, 8, 128, 16, 1, 0, PG_MIXED, 2, 0, 1, 0, 0},
    {WEFT_DTYPE_F16, 4, 1, 4, 64, 256, 4, 50, PG_MIXED, 0, 0, 1, 0, 0},
    {WEFT_DTYPE_BF16, 4, 2, 8, 64, 16, 8, 0, PG_SHORT, 1, 0, 1, 0, 0},
    /* the decode turning q as it reads it, with and without Llama 3's
     * frequencies, on 16-bit and FP8 pools */
    {WEFT_DTYPE_BF16, 4, 2, 8, 128, 16, 1, 0, PG_MIXED, 2, 0, 0, 1, 1},
    {WEFT_DTYPE_F16, 4, 1, 4, 64, 256, 4, 50, PG_MIXED, 1, 0, 0, 0, 1},
    {WEFT_DTYPE_BF16, 4, 2, 8, 128, 16, 8, 0, PG_SHORT, 2, 0, 1, 1, 1},
};
enum { PG_NCASES = sizeof PG_CASES / sizeof PG_CASES[0] };

/* Row r as a shape, split as splits says. */
static inline pg_shape pg_shape_of(const pg_row *r, size_t splits)
{
    return (pg_shape){.dtype = r->t,
                      .seqs = r->seqs,
                      .kv_heads = r->kv,
                      .heads = r->heads,
                      .head_dim = r->dim,
                      .page_size = r->page,
                      .q_len = r->q_len,
                      .window = r->window,
                      .lens = r->lens,
                      .rope = r->rope,
                      .scale = r->scale,
                      .splits = splits,
                      .fp8 = r->fp8,
                      .llama3 = r->llama3,
                      .q_rope = r->q_rope};
}

/* A case's name for the messages: its number and shape. */
static inline void pg_name(char *name, size_t n, size_t i, const pg_shape *s)
{
    snprintf(name, n,
             "case %zu (dtype %d seqs %zu kv %zu heads %zu dim %zu page %zu q_len %zu window %zu "
             "rope %d llama3 %d q_rope %d fp8 %d)",
             i, (int)s->dtype, s->seqs, s->kv_heads, s->heads, s->head_dim, s->page_size, s->q_len,
             s->window, s->rope, s->llama3, s->q_rope, s->fp8);
}

/* A case's host memory: the pools, the table, the tokens appended, q. */
typedef struct pg_case {
    pg_shape s;
    weft_kv_cache cache; /* host pointers */
    size_t tokens, row, pool_elems, q_elems, rows, esize;
    void *kp, *vp;            /* the pools, poisoned before the append */
    float *k_scale, *v_scale; /* FP8: [kv_heads] */
    int32_t *table;           /* [seqs][max_pages], unused entries -1 */
    void *k, *v, *q;          /* k, v: [tokens][kv_heads][head_dim]; q as weft_attention_decode */
    void *q_turned;           /* with q_rope: q as weft_rope_scaled turns it (host) */
    int32_t *seq_ids, *positions, *lens;
    weft_kv_rope rope;
} pg_case;

/* Llama 3.1's scaling: at base 10000 and head_dim 64 or 128 it slows
 * most pairs, so a case that drops it differs at every position. */
static const weft_rope_llama3 PG_LLAMA3 = {
    .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 8192};

static inline size_t pg_esize(void)
{
    return 2;
}

static inline void pg_fill(weft_dtype t, void *p, size_t n, double amp)
{
    for (size_t i = 0; i < n; i++)
        weft__store(t, p, i, (float)(amp * pg_uniform()));
}

/* The case's tables and random data. Pages: the sequences need P pages in
 * all; the pool has P + P / 2 + 3 of them and each sequence's are drawn
 * from a shuffle of all. The tokens are appended in a shuffled order. */
static inline pg_case pg_make(const pg_shape *s)
{
    pg_case c = {.s = *s};
    size_t ps = s->page_size, need = 0, max_pages = 1;
    for (size_t b = 0; b < s->seqs; b++) {
        size_t np = ((size_t)s->lens[b] + ps - 1) / ps;
        need += np;
        c.tokens += (size_t)s->lens[b];
        if (np + 1 > max_pages)
            max_pages = np + 1; /* a spare entry a row: capacity past the length */
    }
    size_t pages = need + need / 2 + 3;
    c.row = s->kv_heads * s->head_dim;
    c.pool_elems = pages * ps * c.row;
    c.esize = s->fp8 ? 1 : 2;
    c.kp = pg_alloc(c.pool_elems * c.esize);
    c.vp = pg_alloc(c.pool_elems * c.esize);
    memset(c.kp, PG_POISON, c.pool_elems * c.esize);
    memset(c.vp, PG_POISON, c.pool_elems * c.esize);
    c.k_scale = pg_alloc(s->kv_heads * 4);
    c.v_scale = pg_alloc(s->kv_heads * 4);
    for (size_t h = 0; h < s->kv_heads; h++) { /* values in [-1, 1] stay within +-448 */
        c.k_scale[h] = (float)(0.006 + 0.003 * pg_uniform());
        c.v_scale[h] = (float)(0.006 + 0.003 * pg_uniform());
    }
    c.table = pg_alloc(s->seqs * max_pages * 4);
    int32_t *order = pg_alloc(pages * 4);
    for (size_t i = 0; i < pages; i++)
        order[i] = (int32_t)i;
    for (size_t i = pages - 1; i > 0; i--) {
        size_t j = pg_rng() % (i + 1);
        int32_t x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
    size_t next = 0;
    for (size_t b = 0; b < s->seqs; b++)
        for (size_t p = 0; p < max_pages; p++)
            c.table[b * max_pages + p] = p * ps < (size_t)s->lens[b] ? order[next++] : -1;
    free(order);
    c.cache = (weft_kv_cache){.dtype = s->dtype,
                              .k = c.kp,
                              .v = c.vp,
                              .pages = pages,
                              .page_size = ps,
                              .kv_heads = s->kv_heads,
                              .head_dim = s->head_dim,
                              .block_table = c.table,
                              .seqs = s->seqs,
                              .max_pages = max_pages,
                              .format = s->fp8 ? WEFT_KV_FP8_E4M3 : WEFT_KV_DTYPE,
                              .k_scale = s->fp8 ? c.k_scale : NULL,
                              .v_scale = s->fp8 ? c.v_scale : NULL};
    size_t nt = c.tokens ? c.tokens : 1;
    c.k = pg_alloc(nt * c.row * 2);
    c.v = pg_alloc(nt * c.row * 2);
    pg_fill(s->dtype, c.k, c.tokens * c.row, 1.0);
    pg_fill(s->dtype, c.v, c.tokens * c.row, 1.0);
    c.seq_ids = pg_alloc(nt * 4);
    c.positions = pg_alloc(nt * 4);
    size_t t = 0;
    for (size_t b = 0; b < s->seqs; b++)
        for (int32_t j = 0; j < s->lens[b]; j++, t++) {
            c.seq_ids[t] = (int32_t)b;
            c.positions[t] = j;
        }
    for (size_t i = c.tokens; i > 1; i--) { /* shuffled: several sequences interleaved */
        size_t j = pg_rng() % i;
        int32_t x = c.seq_ids[i - 1], y = c.positions[i - 1];
        c.seq_ids[i - 1] = c.seq_ids[j], c.positions[i - 1] = c.positions[j];
        c.seq_ids[j] = x, c.positions[j] = y;
    }
    c.lens = pg_alloc(s->seqs * 4);
    memcpy(c.lens, s->lens, s->seqs * 4);
    c.rows = s->seqs * s->q_len * s->heads;
    c.q_elems = c.rows * s->head_dim;
    c.q = pg_alloc(c.q_elems * 2);
    pg_fill(s->dtype, c.q, c.q_elems, 2.0); /* sharper than uniform attention */
    c.rope =
        (weft_kv_rope){.layout = s->rope ? (weft_rope_layout)(s->rope - 1) : WEFT_ROPE_INTERLEAVED,
                       .base = 10000.0f,
                       .scaling = s->llama3 ? &PG_LLAMA3 : NULL};
    if (s->q_rope) { /* query i of sequence b sits at lens[b] - q_len + i */
        size_t qrows = s->seqs * s->q_len;
        int32_t *pos = pg_alloc(qrows * 4);
        for (size_t r = 0; r < qrows; r++)
            pos[r] = s->lens[r / s->q_len] - (int32_t)s->q_len + (int32_t)(r % s->q_len);
        c.q_turned = pg_alloc(c.q_elems * 2);
        memcpy(c.q_turned, c.q, c.q_elems * 2);
        int rc = weft_rope_scaled(NULL, s->dtype, c.rope.layout, c.q_turned, s->heads,
                                  s->heads * s->head_dim, NULL, 0, 0, qrows, s->head_dim, pos,
                                  c.rope.base, c.rope.scaling);
        if (rc != WEFT_OK)
            printf("weft_rope_scaled: %s\n", weft_last_error());
        free(pos);
    }
    return c;
}

static inline void pg_free(pg_case *c)
{
    free(c->kp), free(c->vp), free(c->table), free(c->k), free(c->v), free(c->q);
    free(c->seq_ids), free(c->positions), free(c->lens), free(c->k_scale), free(c->v_scale);
    free(c->q_turned);
}

static inline weft_kv_rope pg_rope(const pg_case *c)
{
    return c->rope;
}

static inline weft_attention_decode_desc pg_desc(const pg_case *c)
{
    return (weft_attention_decode_desc){.q_len = c->s.q_len,
                                        .heads = c->s.heads,
                                        .scale = c->s.scale,
                                        .window = c->s.window,
                                        .splits = c->s.splits,
                                        .q_rope = c->s.q_rope ? &c->rope : NULL};
}

/* Pool row (elements) of token j of sequence b. */
static inline size_t pg_at(const pg_case *c, size_t b, size_t j)
{
    size_t ps = c->s.page_size;
    return ((size_t)c->table[b * c->cache.max_pages + j / ps] * ps + j % ps) * c->row;
}

/* Element i (of kv head h) of a pool, as a double: FP8 bytes times the
 * head's scale. */
static inline double pg_pool(const pg_case *c, const void *pool, const float *scale, size_t i,
                             size_t h)
{
    if (c->s.fp8)
        return (double)weft__e4m3_to_f32(((const uint8_t *)pool)[i]) * scale[h];
    return weft__load(c->s.dtype, pool, i);
}

/* What the append must write, as pool rows of the case's format (host
 * memory, freed by the caller): V converted, K as weft_rope's host call
 * turns it - in the dtype, or for FP8 in fp32 (weft_rope on fp32 copies:
 * the same rotation before any rounding) - then divided by the scale and
 * rounded. */
static inline void pg_expected_rows(const pg_case *c, void **kw, void **vw)
{
    size_t n = c->tokens ? c->tokens : 1, es = c->esize;
    weft_dtype t = c->s.fp8 ? WEFT_DTYPE_F32 : c->s.dtype;
    void *k = pg_alloc(n * c->row * 4);
    for (size_t i = 0; i < c->tokens * c->row; i++)
        weft__store(t, k, i, weft__load(c->s.dtype, c->k, i));
    if (c->s.rope && c->tokens) {
        weft_kv_rope r = pg_rope(c);
        int rc = weft_rope_scaled(NULL, t, r.layout, k, c->s.kv_heads, c->row, NULL, 0, 0,
                                  c->tokens, c->s.head_dim, c->positions, r.base, r.scaling);
        if (rc != WEFT_OK)
            printf("weft_rope: %s\n", weft_last_error());
    }
    *kw = pg_alloc(n * c->row * es);
    *vw = pg_alloc(n * c->row * es);
    for (size_t i = 0; i < c->tokens * c->row; i++) {
        size_t h = (i % c->row) / c->s.head_dim;
        if (c->s.fp8) {
            ((uint8_t *)*kw)[i] = weft__f32_to_e4m3(((float *)k)[i] / c->k_scale[h]);
            ((uint8_t *)*vw)[i] =
                weft__f32_to_e4m3(weft__load(c->s.dtype, c->v, i) / c->v_scale[h]);
        } else {
            ((uint16_t *)*kw)[i] = ((uint16_t *)k)[i];
            ((uint16_t *)*vw)[i] = ((const uint16_t *)c->v)[i];
        }
    }
    free(k);
}

/* Whether the pools (kp, vp: host copies) hold what the append must
 * write (pg_expected_rows), bit for bit; the pages' other slots still
 * poisoned. Returns the mismatches (the first printed). */
static inline size_t pg_check_pools(const pg_case *c, const void *kp, const void *vp)
{
    size_t bad = 0, es = c->esize, rb = c->row * es;
    void *kw, *vw;
    pg_expected_rows(c, &kw, &vw);
    unsigned char *written = calloc(c->pool_elems, 1);
    for (size_t t = 0; t < c->tokens; t++) {
        size_t at = pg_at(c, (size_t)c->seq_ids[t], (size_t)c->positions[t]);
        memset(written + at, 1, c->row);
        if (memcmp((const char *)kp + at * es, (const char *)kw + t * rb, rb) ||
            memcmp((const char *)vp + at * es, (const char *)vw + t * rb, rb)) {
            if (!bad++)
                printf("  token %zu (seq %d pos %d): pool row differs\n", t, c->seq_ids[t],
                       c->positions[t]);
        }
    }
    for (size_t i = 0; i < c->pool_elems; i++)
        for (size_t b = 0; !written[i] && b < es; b++)
            if (((const unsigned char *)kp)[i * es + b] != PG_POISON ||
                ((const unsigned char *)vp)[i * es + b] != PG_POISON) {
                if (!bad++)
                    printf("  pool element %zu written though no token goes there\n", i);
                break;
            }
    free(written);
    free(kw);
    free(vw);
    return bad;
}

/* The float64 decode of one query row into ref[head_dim] and *lse. */
static inline void pg_ref_row(const pg_case *c, size_t b, size_t i, size_t h, double *ref,
                              double *lse)
{
    const pg_shape *s = &c->s;
    size_t d = s->head_dim, kvh = h / (s->heads / s->kv_heads);
    size_t qr = ((b * s->q_len + i) * s->heads + h) * d;
    const void *q = s->q_rope ? c->q_turned : c->q;
    double scale = s->scale != 0 ? s->scale : 1.0 / sqrt((double)d);
    long hi = (long)s->lens[b] - (long)s->q_len + (long)i;
    long lo = s->window && hi - (long)s->window + 1 > 0 ? hi - (long)s->window + 1 : 0;
    double m = -INFINITY, l = 0;
    for (size_t e = 0; e < d; e++)
        ref[e] = 0;
    if (hi < lo) {
        *lse = -INFINITY;
        return;
    }
    double *sc = malloc((size_t)(hi - lo + 1) * sizeof *sc);
    for (long j = lo; j <= hi; j++) {
        size_t at = pg_at(c, b, (size_t)j) + kvh * d;
        double dot = 0;
        for (size_t e = 0; e < d; e++)
            dot += (double)weft__load(s->dtype, q, qr + e) *
                   pg_pool(c, c->kp, c->k_scale, at + e, kvh);
        sc[j - lo] = dot * scale;
        m = fmax(m, sc[j - lo]);
    }
    for (long j = lo; j <= hi; j++) {
        size_t at = pg_at(c, b, (size_t)j) + kvh * d;
        double p = exp(sc[j - lo] - m);
        l += p;
        for (size_t e = 0; e < d; e++)
            ref[e] += p * pg_pool(c, c->vp, c->v_scale, at + e, kvh);
    }
    for (size_t e = 0; e < d; e++)
        ref[e] /= l;
    *lse = m + log(l);
    free(sc);
}

/* Mismatches of out and lse (host copies; lse may be NULL) against the
 * float64 reference, the first few printed with their place. */
static inline size_t pg_check_decode(const char *name, const pg_case *c, const void *out,
                                     const float *lse)
{
    const pg_shape *s = &c->s;
    size_t d = s->head_dim, bad = 0;
    double tol = s->dtype == WEFT_DTYPE_BF16 ? 0x1p-8 : 0x1p-10, worst = 0;
    double ref[128], rl;
    for (size_t b = 0; b < s->seqs; b++)
        for (size_t i = 0; i < s->q_len; i++)
            for (size_t h = 0; h < s->heads; h++) {
                size_t row = (b * s->q_len + i) * s->heads + h;
                pg_ref_row(c, b, i, h, ref, &rl);
                for (size_t e = 0; e < d; e++) {
                    double got = weft__load(s->dtype, out, row * d + e);
                    double err = fabs(got - ref[e]);
                    if (!(err <= tol * fabs(ref[e]) + 1e-5)) {
                        if (bad++ < 4)
                            printf("  %s: seq %zu (len %d) query %zu head %zu [%zu]: %.8g, "
                                   "want %.8g\n",
                                   name, b, s->lens[b], i, h, e, got, ref[e]);
                    } else if (err > worst)
                        worst = err;
                }
                if (lse) {
                    double got = lse[row];
                    int ok = isinf(rl) ? (isinf(got) && got < 0)
                                       : fabs(got - rl) <= 1e-4 * (1 + fabs(rl));
                    if (!ok && bad++ < 4)
                        printf("  %s: seq %zu query %zu head %zu: lse %.8g, want %.8g\n", name, b,
                               i, h, got, rl);
                }
            }
    if (bad)
        printf("  %s: %zu mismatches\n", name, bad);
    (void)worst;
    return bad;
}

#endif
