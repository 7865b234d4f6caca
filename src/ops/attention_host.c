/*
 * attention_host.c - weft_attention's host reference: plain loops.
 *
 * For each sequence and kv head, the keys and values are converted to fp32
 * once (the keys rotated first, when RoPE is asked, and rounded to the
 * dtype as weft_rope would store them); then each query head of the group
 * and each query takes its visible keys (weft__attention_keys): the scores
 * scale * dot(q, k) in fp32, their maximum, exp(s - max) correctly rounded
 * as the other ops compute it, and the weighted sum of the value rows in
 * blocks (weft__sum's blocks), so a sum over 10^5 keys keeps a tree's
 * accuracy. A query that sees nothing gets zeros and LSE -Inf.
 *
 * A paged call (weft_attention_paged) reads sequence b's key j from the
 * pool row its block table names, already rotated.
 *
 * The scratch (the group's keys and values, one row of scores) is taken at
 * the call (weft__attention_host_prepare), so a call either fails there
 * with WEFT_ENOMEM or runs to the end.
 */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/ops_internal.h"

enum { MAX_DIM = 256 };

static size_t ws_floats(const weft__attention_args *a)
{
    return 2 * a->seq_k * a->head_dim + a->seq_k;
}

int weft__attention_host_prepare(const char *op, weft__attention_args *a)
{
    size_t n = ws_floats(a);
    if (n > SIZE_MAX / sizeof(float) || !(a->host_ws = malloc(n * sizeof(float))))
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for the host's scratch (%zu floats)", op,
                          n);
    return WEFT_OK;
}

/* Row `row`, head `head` of x (dim elements) as fp32 in out, turned by
 * RoPE at position pos when inv_freq is given (weft_rope's definition)
 * and rounded to the dtype as weft_rope stores it. */
static void load_head(const weft__attention_args *a, const void *x, size_t stride, size_t row,
                      size_t head, const double *inv_freq, int32_t pos, float *out)
{
    size_t dim = a->head_dim, at = row * stride + head * dim;
    for (size_t e = 0; e < dim; e++)
        out[e] = weft__load(a->dtype, x, at + e);
    if (!inv_freq)
        return;
    for (size_t i = 0; i < dim / 2; i++) {
        size_t lo = a->rope_layout == WEFT_ROPE_INTERLEAVED ? 2 * i : i;
        size_t hi = a->rope_layout == WEFT_ROPE_INTERLEAVED ? 2 * i + 1 : i + dim / 2;
        float sn, cs, u = out[lo], v = out[hi];
        weft__sincos((double)pos * inv_freq[i], &sn, &cs);
        out[lo] = weft__round_to(a->dtype, u * cs - v * sn);
        out[hi] = weft__round_to(a->dtype, u * sn + v * cs);
    }
}

/* dot(x, y) over dim elements, in four interleaved fp32 partial sums. */
static float dot(const float *x, const float *y, size_t dim)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t e = 0; e < dim; e += 4) {
        s0 += x[e] * y[e];
        s1 += x[e + 1] * y[e + 1];
        s2 += x[e + 2] * y[e + 2];
        s3 += x[e + 3] * y[e + 3];
    }
    return (s0 + s1) + (s2 + s3);
}

/* One query row: o (dim elements of the dtype at out) and *lse, over keys
 * [lo, hi) of the group's fp32 keys and values. */
static void one_query(const weft__attention_args *a, const float *q, const float *keys,
                      const float *values, size_t lo, size_t hi, float *scores, void *out,
                      size_t out_at, float *lse)
{
    size_t dim = a->head_dim;
    float acc[MAX_DIM], block[MAX_DIM];
    if (lo >= hi) {
        for (size_t e = 0; e < dim; e++)
            weft__store(a->dtype, out, out_at + e, 0.0f);
        *lse = -INFINITY;
        return;
    }
    float m = -INFINITY;
    for (size_t j = lo; j < hi; j++) {
        float s = a->scale * dot(q, keys + j * dim, dim);
        scores[j] = s;
        m = isnan(s) || s > m ? s : m; /* a NaN score makes the row NaN */
    }
    weft__sum l = {0};
    for (size_t e = 0; e < dim; e++)
        acc[e] = block[e] = 0.0f;
    for (size_t j = lo; j < hi; j++) {
        float p = weft__expf(scores[j] - m);
        const float *vj = values + j * dim;
        weft__sum_add(&l, p);
        for (size_t e = 0; e < dim; e++)
            block[e] += p * vj[e];
        if ((j - lo + 1) % WEFT__SUM_BLOCK == 0)
            for (size_t e = 0; e < dim; e++) {
                acc[e] += block[e];
                block[e] = 0.0f;
            }
    }
    float sum = weft__sum_get(&l);
    for (size_t e = 0; e < dim; e++)
        weft__store(a->dtype, out, out_at + e, (acc[e] + block[e]) / sum);
    *lse = (float)((double)m + log((double)sum));
}

void weft__attention_host_run(weft__attention_args *a)
{
    size_t dim = a->head_dim, group = a->heads / a->kv_heads;
    float *keys = a->host_ws, *values = keys + a->seq_k * dim, *scores = values + a->seq_k * dim;
    double inv_freq[MAX_DIM / 2];
    const double *rope = NULL;
    float q[MAX_DIM], lse_scratch;

    if (a->q_positions) {
        for (size_t i = 0; i < dim / 2; i++)
            inv_freq[i] = pow((double)a->rope_base, -2.0 * (double)i / (double)dim);
        rope = inv_freq;
    }
    for (size_t b = 0; b < a->batch; b++) {
        size_t q0, lq, k0, lk;
        weft__attention_sequence(a, b, &q0, &lq, &k0, &lk);
        for (size_t g = 0; g < a->kv_heads; g++) {
            for (size_t j = 0; j < lk; j++) {
                if (a->paged) { /* stored rotated */
                    size_t row = weft__attention_page_row(a, b, j);
                    load_head(a, a->k, a->k_stride, row, g, NULL, 0, keys + j * dim);
                    load_head(a, a->v, a->v_stride, row, g, NULL, 0, values + j * dim);
                    continue;
                }
                int32_t pos = rope ? a->k_positions[k0 + j] : 0;
                load_head(a, a->k, a->k_stride, k0 + j, g, rope, pos, keys + j * dim);
                load_head(a, a->v, a->v_stride, k0 + j, g, NULL, 0, values + j * dim);
            }
            for (size_t h = g * group; h < (g + 1) * group; h++)
                for (size_t i = 0; i < lq; i++) {
                    size_t row = q0 + i, lo, hi;
                    int32_t pos = rope ? a->q_positions[row] : 0;
                    load_head(a, a->q, a->q_stride, row, h, rope, pos, q);
                    weft__attention_keys(a, i, lq, lk, &lo, &hi);
                    float *lse = a->lse ? a->lse + h * a->lse_stride + row : &lse_scratch;
                    one_query(a, q, keys, values, lo, hi, scores, a->o, row * a->o_stride + h * dim,
                              lse);
                }
        }
    }
    free(a->host_ws);
    a->host_ws = NULL;
}
