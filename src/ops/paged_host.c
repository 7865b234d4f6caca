/*
 * paged_host.c - the host references of the paged KV cache's calls: plain
 * loops over the definitions in ops.h, fp32 arithmetic, transcendentals
 * computed in double and rounded once (ops_internal.h).
 *
 * On the NULL stream the tables are read before anything is written, and a
 * bad entry refuses the call; in a task's stream order (refuse = 0) they
 * are read too late for that and are clamped or skipped exactly as the
 * kernels do, so no table makes either backend touch memory outside the
 * pools. FP8 pools are read as their bytes' values times the head's scale
 * and written as the value divided by it, rounded once to E4M3. The decode
 * needs no scratch memory: it finds a query's largest
 * score in one pass over the keys and sums in a second.
 */
#include <math.h>

#include "core/error.h"
#include "ops/ops_internal.h"
#include "ops/paged.h"

static const char APPEND[] = "weft_kv_append", DECODE[] = "weft_attention_decode";

/* The pool row (in elements, before the head) of token t of sequence s,
 * or SIZE_MAX when its table entry is outside the pool. */
static size_t slot_row(const weft_kv_cache *c, size_t s, size_t t)
{
    int32_t page = c->block_table[s * c->max_pages + t / c->page_size];
    if (page < 0 || (size_t)page >= c->pages)
        return SIZE_MAX;
    return ((size_t)page * c->page_size + t % c->page_size) * c->kv_heads * c->head_dim;
}

/* As slot_row with an entry outside the pool clamped into it. */
static size_t slot_row_clamped(const weft_kv_cache *c, size_t s, size_t t)
{
    int32_t page = c->block_table[s * c->max_pages + t / c->page_size];
    size_t p = page < 0 ? 0 : (size_t)page >= c->pages ? c->pages - 1 : (size_t)page;
    return (p * c->page_size + t % c->page_size) * c->kv_heads * c->head_dim;
}

/* Element i (of kv head h) of a pool, as fp32: FP8 bytes times the head's
 * scale. */
static float pool_load(const weft_kv_cache *c, const void *pool, const float *scale, size_t i,
                       size_t h)
{
    if (c->format == WEFT_KV_FP8_E4M3)
        return weft__e4m3_to_f32(((const uint8_t *)pool)[i]) * scale[h];
    return weft__load(c->dtype, pool, i);
}

/* Element i (of kv head h) of a pool := x, rounded to the pool's format. */
static void pool_store(const weft_kv_cache *c, void *pool, const float *scale, size_t i, size_t h,
                       float x)
{
    if (c->format == WEFT_KV_FP8_E4M3)
        ((uint8_t *)pool)[i] = weft__f32_to_e4m3(x / scale[h]);
    else
        weft__store(c->dtype, pool, i, x);
}

/* ---- append ---------------------------------------------------------------- */

/* Where token t goes (its pool row), or SIZE_MAX for a token whose
 * sequence, position or page is out of range. */
static size_t append_row(const weft__kv_append_args *a, size_t t)
{
    const weft_kv_cache *c = &a->c;
    int32_t s = a->seq_ids[t], pos = a->positions[t];
    if (s < 0 || (size_t)s >= c->seqs || pos < 0 || (size_t)pos >= c->max_pages * c->page_size)
        return SIZE_MAX;
    return slot_row(c, (size_t)s, (size_t)pos);
}

/* Head h of token t's K into the pool row `at`, turned as weft_rope turns
 * it (rope.c): the same angle in double, the same fp32 rotation. */
static void put_key_head(const weft__kv_append_args *a, size_t t, size_t h, size_t at)
{
    const weft_kv_cache *c = &a->c;
    size_t d = c->head_dim, src = t * a->k_stride + h * d, dst = at + h * d;
    if (!a->rope) {
        for (size_t e = 0; e < d; e++)
            pool_store(c, c->k, c->k_scale, dst + e, h, weft__load(c->dtype, a->k, src + e));
        return;
    }
    for (size_t i = 0; i < d / 2; i++) {
        size_t lo = a->layout == WEFT_ROPE_INTERLEAVED ? 2 * i : i;
        size_t hi = a->layout == WEFT_ROPE_INTERLEAVED ? 2 * i + 1 : i + d / 2;
        float sn, cs;
        weft__sincos((double)a->positions[t] * weft__rope_inverse_frequency(&a->freq, i), &sn, &cs);
        float u = weft__load(c->dtype, a->k, src + lo), v = weft__load(c->dtype, a->k, src + hi);
        pool_store(c, c->k, c->k_scale, dst + lo, h, u * cs - v * sn);
        pool_store(c, c->k, c->k_scale, dst + hi, h, u * sn + v * cs);
    }
}

int weft__kv_append_host(const weft__kv_append_args *a, int refuse)
{
    const weft_kv_cache *c = &a->c;
    for (size_t t = 0; refuse && t < a->tokens; t++) {
        if (append_row(a, t) != SIZE_MAX)
            continue;
        int32_t s = a->seq_ids[t], pos = a->positions[t];
        if (s < 0 || (size_t)s >= c->seqs)
            return weft__fail(WEFT_EINVAL, "%s: token %zu's seq_id %d is outside [0, %zu)", APPEND,
                              t, (int)s, c->seqs);
        if (pos < 0 || (size_t)pos >= c->max_pages * c->page_size)
            return weft__fail(WEFT_EINVAL,
                              "%s: token %zu's position %d is outside the "
                              "sequence's capacity [0, %zu)",
                              APPEND, t, (int)pos, c->max_pages * c->page_size);
        return weft__fail(
            WEFT_EINVAL,
            "%s: token %zu's page, block_table[%d][%zu] = %d, is "
            "outside the pool of %zu pages",
            APPEND, t, (int)s, (size_t)pos / c->page_size,
            (int)c->block_table[(size_t)s * c->max_pages + (size_t)pos / c->page_size], c->pages);
    }
    for (size_t t = 0; t < a->tokens; t++) {
        size_t at = append_row(a, t);
        if (at == SIZE_MAX)
            continue;
        for (size_t h = 0; h < c->kv_heads; h++) {
            put_key_head(a, t, h, at);
            for (size_t e = h * c->head_dim; e < (h + 1) * c->head_dim; e++)
                pool_store(c, c->v, c->v_scale, at + e, h,
                           weft__load(c->dtype, a->v, t * a->v_stride + e));
        }
    }
    return WEFT_OK;
}

/* ---- decode --------------------------------------------------------------- */

/* fp32 dot product of the query q (head_dim values) with head kvh of the
 * key at pool row `at`, times scale. */
static float score(const weft__decode_args *a, const float *q, size_t at, size_t kvh)
{
    const weft_kv_cache *c = &a->c;
    size_t d = c->head_dim;
    float sum = 0.0f;
    for (size_t e = 0; e < d; e++)
        sum += q[e] * pool_load(c, c->k, c->k_scale, at + kvh * d + e, kvh);
    return sum * a->scale;
}

/* Query row qr into q as the scores take it: as stored, or turned at
 * position pos as weft_rope_scaled turns it (rope.c: the angle in double,
 * the fp32 rotation) and rounded to the dtype. */
static void read_query(const weft__decode_args *a, size_t qr, long pos, float *q)
{
    const weft_kv_cache *c = &a->c;
    size_t d = c->head_dim;
    for (size_t e = 0; e < d; e++)
        q[e] = weft__load(c->dtype, a->q, qr + e);
    if (!a->q_rope)
        return;
    for (size_t i = 0; i < d / 2; i++) {
        size_t lo = a->q_layout == WEFT_ROPE_INTERLEAVED ? 2 * i : i;
        size_t hi = a->q_layout == WEFT_ROPE_INTERLEAVED ? 2 * i + 1 : i + d / 2;
        float sn, cs, u = q[lo], v = q[hi];
        weft__sincos((double)pos * weft__rope_inverse_frequency(&a->q_freq, i), &sn, &cs);
        q[lo] = weft__round_to(c->dtype, u * cs - v * sn);
        q[hi] = weft__round_to(c->dtype, u * sn + v * cs);
    }
}

/* One query row (sequence b, query i, head h) over keys [lo, hi]. */
static void attend(const weft__decode_args *a, size_t b, size_t i, size_t h, long lo, long hi,
                   int refuse)
{
    const weft_kv_cache *c = &a->c;
    size_t d = c->head_dim, kvh = h / (a->heads / c->kv_heads);
    size_t row = (b * a->q_len + i) * a->heads + h, out_at = row * d;
    size_t qr = (b * a->q_len + i) * a->q_stride + h * d;
    float acc[128] = {0}, q[128], m = -INFINITY;
    weft__sum total = {0};

    read_query(a, qr, hi, q); /* the query's position is its last key's */
    for (long j = lo; j <= hi; j++) {
        size_t at = refuse ? slot_row(c, b, (size_t)j) : slot_row_clamped(c, b, (size_t)j);
        m = fmaxf(m, score(a, q, at, kvh));
    }
    for (long j = lo; j <= hi; j++) {
        size_t at = refuse ? slot_row(c, b, (size_t)j) : slot_row_clamped(c, b, (size_t)j);
        float p = weft__expf(score(a, q, at, kvh) - m);
        weft__sum_add(&total, p);
        for (size_t e = 0; e < d; e++)
            acc[e] += p * pool_load(c, c->v, c->v_scale, at + kvh * d + e, kvh);
    }
    float l = weft__sum_get(&total);
    int none = hi < lo;
    for (size_t e = 0; e < d; e++)
        weft__store(c->dtype, a->out, out_at + e, none ? 0.0f : acc[e] / l);
    if (a->lse)
        a->lse[row] = none ? -INFINITY : m + (float)log((double)l);
}

int weft__decode_host(const weft__decode_args *a, int refuse)
{
    const weft_kv_cache *c = &a->c;

    for (size_t b = 0; refuse && b < c->seqs; b++) {
        int32_t len = a->seq_lens[b];
        if (len < 0 || (size_t)len > a->max_seq_len)
            return weft__fail(WEFT_EINVAL, "%s: seq_lens[%zu] = %d is outside [0, %zu]", DECODE, b,
                              (int)len, a->max_seq_len);
        for (size_t p = 0; p * c->page_size < (size_t)len; p++) {
            int32_t page = c->block_table[b * c->max_pages + p];
            if (page < 0 || (size_t)page >= c->pages)
                return weft__fail(WEFT_EINVAL,
                                  "%s: block_table[%zu][%zu] = %d is outside the "
                                  "pool of %zu pages",
                                  DECODE, b, p, (int)page, c->pages);
        }
    }
    for (size_t b = 0; b < c->seqs; b++) {
        long len = a->seq_lens[b];
        len = len < 0 ? 0 : (size_t)len > a->max_seq_len ? (long)a->max_seq_len : len;
        for (size_t i = 0; i < a->q_len; i++) {
            long hi = len - (long)a->q_len + (long)i;
            long lo = a->window && hi - (long)a->window + 1 > 0 ? hi - (long)a->window + 1 : 0;
            for (size_t h = 0; h < a->heads; h++)
                attend(a, b, i, h, lo, hi, refuse);
        }
    }
    return WEFT_OK;
}
