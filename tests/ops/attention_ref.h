/*
 * attention_ref.h - what the host and GPU tests of weft_attention share:
 * a case's random inputs, a float64 reference written as the plain loops
 * of the definition, and the check of a result against it.
 *
 * Inputs are uniform in [-1, 1) (Q times a case's scale, so the softmax is
 * peaked rather than flat); the padding of every row (stride > row) holds
 * NaN, so a kernel that read it would spread NaNs. With RoPE the
 * reference reads Q and K turned by weft_rope on the host (the definition:
 * weft_rope, then attention). The outputs are poisoned with all-ones
 * bytes (NaN in bf16, fp16 and fp32) first: every element of every row a
 * sequence owns must be written, everything else must keep the poison.
 *
 * An output element passes when |got - ref| is within
 *   u |ref| + slack S + 2 max|v| dS
 * where u is half the dtype's unit in the last place (O's rounding), S =
 * sum_j p_j |v_j| the size of the terms of the weighted sum, slack what
 * the backend's sums lose (fp32 sums of blocks on the host; the GPU also
 * rounds the probabilities to the dtype: u more), and dS bounds the fp32
 * scores' error, (dim + 8) 2^-24 times the largest scale * sum |q k|. A
 * query that sees no key must give exactly 0 and LSE -Inf.
 */
#ifndef WEFT_TEST_ATTENTION_REF_H
#define WEFT_TEST_ATTENTION_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_internal.h"
#include "weft/ops.h"

static uint64_t at_rng_state;

static inline uint64_t at_rng(void)
{
    uint64_t z = (at_rng_state += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline double at_uniform(void)
{
    return (double)(at_rng() >> 11) * 0x1p-52 - 1.0;
}

/* One case: the descriptor (host pointers), its inputs and outputs. */
typedef struct at_data {
    weft_attention_desc d; /* strides and kv_heads resolved */
    size_t q_rows, k_rows, q_width, k_width;
    void *q, *k, *v, *o;
    float *lse; /* NULL when the case asks for none */
    int32_t *cu_q, *cu_k, *pos_q, *pos_k;
    double *rq, *rk, *rv; /* as the reference reads them: [rows][width] */
    /* With RoPE, per element of rq and rk: one unit of the dtype where the
     * exact rotated value lies within a millionth of a rounding midpoint
     * (the GPU's sine and cosine, ~2.5e-7 from the host's, may round it
     * the other way), else 0 (at_ambiguity). */
    double *aq, *ak;
    /* > 1: check every sample-th query of a sequence (and its last two)
     * against the reference, the others only for being written and finite
     * (sequences too long for the float64 loops at every row) */
    size_t sample;
} at_data;

static inline void *at_alloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

/* rows x width elements of dtype, stride apart, each * scale; NaN padding. */
static inline void *at_random(weft_dtype t, size_t rows, size_t width, size_t stride, double scale)
{
    size_t n = rows * stride;
    void *p = at_alloc(n * 2);
    for (size_t r = 0; r < rows; r++)
        for (size_t e = 0; e < stride; e++)
            weft__store(t, p, r * stride + e, e < width ? (float)(at_uniform() * scale) : NAN);
    return p;
}

static inline double *at_as_double(weft_dtype t, const void *x, size_t rows, size_t width,
                                   size_t stride)
{
    double *out = at_alloc(rows * width * sizeof *out);
    for (size_t r = 0; r < rows; r++)
        for (size_t e = 0; e < width; e++)
            out[r * width + e] = weft__load(t, x, r * stride + e);
    return out;
}

/* Sequence b's first rows and lengths, from the host's tables. */
static inline void at_sequence(const at_data *a, size_t b, size_t *q0, size_t *lq, size_t *k0,
                               size_t *lk)
{
    if (!a->cu_q) {
        *q0 = b * a->d.seq_q, *lq = a->d.seq_q, *k0 = b * a->d.seq_k, *lk = a->d.seq_k;
        return;
    }
    *q0 = (size_t)a->cu_q[b], *lq = (size_t)(a->cu_q[b + 1] - a->cu_q[b]);
    *k0 = (size_t)a->cu_k[b], *lk = (size_t)(a->cu_k[b + 1] - a->cu_k[b]);
}

/* Whether query i (of lq) sees key j (of lk): the definition in ops.h. */
static inline int at_sees(const weft_attention_desc *d, int64_t i, int64_t j, int64_t lq,
                          int64_t lk)
{
    int64_t p = i + lk - lq;
    if (j < 0 || j >= lk)
        return 0;
    if (d->causal && j > p)
        return 0;
    if (d->window && j <= p - (int64_t)d->window)
        return 0;
    return 1;
}

/* For rows of width elements (heads of dim, stride apart) turned by RoPE
 * at positions pos with base: at_data's aq or ak. */
static inline double *at_ambiguity(weft_dtype t, weft_rope_layout layout, const void *x,
                                   size_t rows, size_t width, size_t stride, size_t dim,
                                   const int32_t *pos, double base)
{
    double *amb = at_alloc(rows * width * sizeof(double));
    size_t half = dim / 2;
    for (size_t r = 0; r < rows; r++)
        for (size_t h = 0; h < width / dim; h++)
            for (size_t i = 0; i < half; i++) {
                size_t e0 = layout == WEFT_ROPE_HALVES ? i : 2 * i;
                size_t e1 = layout == WEFT_ROPE_HALVES ? i + half : 2 * i + 1;
                double a = weft__load(t, x, r * stride + h * dim + e0);
                double b = weft__load(t, x, r * stride + h * dim + e1);
                double angle = (double)pos[r] * pow(base, -2.0 * (double)i / (double)dim);
                double v[2] = {a * cos(angle) - b * sin(angle), a * sin(angle) + b * cos(angle)};
                double delta = 1e-6 * (fabs(a) + fabs(b));
                for (int k = 0; k < 2; k++) {
                    double lo = weft__round_to(t, (float)(v[k] - delta));
                    double hi = weft__round_to(t, (float)(v[k] + delta));
                    amb[r * width + h * dim + (k ? e1 : e0)] = hi - lo;
                }
            }
    return amb;
}

/* A case: desc with dtype, batch, heads, head_dim, seq_q/seq_k (the
 * longest, for varlen), causal, window, strides and kv_heads as wanted;
 * lens_q/lens_k (batch each) make it varlen. */
static inline at_data at_new(weft_attention_desc d, const int32_t *lens_q, const int32_t *lens_k,
                             int with_lse, int with_rope, double q_scale)
{
    at_data a;
    memset(&a, 0, sizeof a);
    d.kv_heads = d.kv_heads ? d.kv_heads : d.heads;
    a.q_width = d.heads * d.head_dim, a.k_width = d.kv_heads * d.head_dim;
    d.q_stride = d.q_stride ? d.q_stride : a.q_width;
    d.k_stride = d.k_stride ? d.k_stride : a.k_width;
    d.v_stride = d.v_stride ? d.v_stride : a.k_width;
    d.o_stride = d.o_stride ? d.o_stride : a.q_width;
    if (lens_q) {
        a.cu_q = at_alloc((d.batch + 1) * sizeof(int32_t));
        a.cu_k = at_alloc((d.batch + 1) * sizeof(int32_t));
        a.cu_q[0] = a.cu_k[0] = 0;
        for (size_t b = 0; b < d.batch; b++) {
            a.cu_q[b + 1] = a.cu_q[b] + lens_q[b];
            a.cu_k[b + 1] = a.cu_k[b] + lens_k[b];
        }
        a.q_rows = (size_t)a.cu_q[d.batch], a.k_rows = (size_t)a.cu_k[d.batch];
        d.cu_seqlens_q = a.cu_q, d.cu_seqlens_k = a.cu_k;
    } else {
        a.q_rows = d.batch * d.seq_q, a.k_rows = d.batch * d.seq_k;
    }
    size_t qr = a.q_rows ? a.q_rows : 1, kr = a.k_rows ? a.k_rows : 1;
    a.q = at_random(d.dtype, qr, a.q_width, d.q_stride, q_scale);
    a.k = at_random(d.dtype, kr, a.k_width, d.k_stride, 1.0);
    a.v = at_random(d.dtype, kr, a.k_width, d.v_stride, 1.0);
    a.o = at_alloc(qr * d.o_stride * 2);
    memset(a.o, 0xff, qr * d.o_stride * 2);
    if (with_lse) {
        d.lse_stride = qr + 3; /* a gap between heads, which must stay poisoned */
        a.lse = at_alloc(d.heads * d.lse_stride * sizeof(float));
        memset(a.lse, 0xff, d.heads * d.lse_stride * sizeof(float));
        d.lse = a.lse;
    }
    void *rq = a.q, *rk = a.k;
    if (with_rope) {
        a.pos_q = at_alloc(qr * sizeof(int32_t));
        a.pos_k = at_alloc(kr * sizeof(int32_t));
        for (size_t b = 0; b < d.batch; b++) {
            size_t q0, lq, k0, lk;
            at_data t = a;
            t.d = d;
            at_sequence(&t, b, &q0, &lq, &k0, &lk);
            int32_t base = (int32_t)(at_rng() % 100000); /* the cached prefix starts here */
            for (size_t j = 0; j < lk; j++)
                a.pos_k[k0 + j] = base + (int32_t)j;
            for (size_t i = 0; i < lq; i++)
                a.pos_q[q0 + i] = base + (int32_t)(lk + i) - (int32_t)lq;
        }
        d.q_positions = a.pos_q, d.k_positions = a.pos_k;
        rq = at_alloc(qr * d.q_stride * 2);
        rk = at_alloc(kr * d.k_stride * 2);
        memcpy(rq, a.q, qr * d.q_stride * 2);
        memcpy(rk, a.k, kr * d.k_stride * 2);
        float base = d.rope_base != 0.0f ? d.rope_base : 10000.0f;
        if (weft_rope(NULL, d.dtype, d.rope_layout, rq, d.heads, d.q_stride, NULL, 0, 0, qr,
                      d.head_dim, a.pos_q, base) != WEFT_OK ||
            weft_rope(NULL, d.dtype, d.rope_layout, rk, d.kv_heads, d.k_stride, NULL, 0, 0, kr,
                      d.head_dim, a.pos_k, base) != WEFT_OK) {
            fprintf(stderr, "weft_rope failed: %s\n", weft_last_error());
            abort();
        }
    }
    a.rq = at_as_double(d.dtype, rq, qr, a.q_width, d.q_stride);
    a.rk = at_as_double(d.dtype, rk, kr, a.k_width, d.k_stride);
    a.rv = at_as_double(d.dtype, a.v, kr, a.k_width, d.v_stride);
    if (with_rope) {
        double base = d.rope_base != 0.0f ? d.rope_base : 10000.0;
        a.aq = at_ambiguity(d.dtype, d.rope_layout, a.q, qr, a.q_width, d.q_stride, d.head_dim,
                            a.pos_q, base);
        a.ak = at_ambiguity(d.dtype, d.rope_layout, a.k, kr, a.k_width, d.k_stride, d.head_dim,
                            a.pos_k, base);
        free(rq), free(rk);
    }
    a.d = d;
    return a;
}

static inline void at_free(at_data *a)
{
    free(a->q), free(a->k), free(a->v), free(a->o), free(a->lse);
    free(a->cu_q), free(a->cu_k), free(a->pos_q), free(a->pos_k);
    free(a->rq), free(a->rk), free(a->rv), free(a->aq), free(a->ak);
    memset(a, 0, sizeof *a);
}

/* A case's keys and values (rotated, as the reference reads them) in a
 * paged cache for weft_attention_paged: pages of page_size tokens in
 * shuffled order, sequence b's keys at positions 0 .. of table row b;
 * every slot no key fills, and every page no sequence takes, NaN. */
typedef struct at_pages {
    weft_kv_cache cache; /* host pointers */
    weft_attention_desc d;
    int32_t *lens, *table;
    void *kp, *vp;
} at_pages;

static inline at_pages at_paginate(const at_data *a, size_t page_size)
{
    const weft_attention_desc *d = &a->d;
    at_pages p;
    memset(&p, 0, sizeof p);
    size_t ps = page_size, kw = a->k_width, max_pages = (d->seq_k + ps - 1) / ps, pages = 1;
    p.lens = at_alloc(d->batch * sizeof(int32_t));
    for (size_t b = 0; b < d->batch; b++) {
        size_t q0, lq, k0, lk;
        at_sequence(a, b, &q0, &lq, &k0, &lk);
        p.lens[b] = (int32_t)lk;
        pages += (lk + ps - 1) / ps;
    }
    size_t *order = at_alloc(pages * sizeof *order);
    for (size_t i = 0; i < pages; i++)
        order[i] = i;
    for (size_t i = pages - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = at_rng() % (i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    p.kp = at_alloc(pages * ps * kw * 2), p.vp = at_alloc(pages * ps * kw * 2);
    for (size_t i = 0; i < pages * ps * kw; i++) {
        weft__store(d->dtype, p.kp, i, NAN);
        weft__store(d->dtype, p.vp, i, NAN);
    }
    p.table = at_alloc(d->batch * max_pages * sizeof(int32_t));
    for (size_t i = 0; i < d->batch * max_pages; i++)
        p.table[i] = -1;
    size_t next = 0;
    for (size_t b = 0; b < d->batch; b++) {
        size_t q0, lq, k0, lk;
        at_sequence(a, b, &q0, &lq, &k0, &lk);
        for (size_t j = 0; j < lk; j++) {
            if (j % ps == 0)
                p.table[b * max_pages + j / ps] = (int32_t)order[next++];
            size_t row = (size_t)p.table[b * max_pages + j / ps] * ps + j % ps;
            for (size_t e = 0; e < kw; e++) {
                weft__store(d->dtype, p.kp, row * kw + e, (float)a->rk[(k0 + j) * kw + e]);
                weft__store(d->dtype, p.vp, row * kw + e, (float)a->rv[(k0 + j) * kw + e]);
            }
        }
    }
    free(order);
    p.cache = (weft_kv_cache){.dtype = d->dtype,
                              .k = p.kp,
                              .v = p.vp,
                              .pages = pages,
                              .page_size = ps,
                              .kv_heads = d->kv_heads,
                              .head_dim = d->head_dim,
                              .block_table = p.table,
                              .seqs = d->batch,
                              .max_pages = max_pages};
    p.d = *d;
    p.d.cu_seqlens_k = NULL, p.d.k_positions = NULL;
    p.d.k_stride = p.d.v_stride = 0;
    return p;
}

static inline void at_pages_free(at_pages *p)
{
    free(p->lens), free(p->table), free(p->kp), free(p->vp);
    memset(p, 0, sizeof *p);
}

/* The reference's row: out[dim], *lse, the terms' sizes S[dim], the
 * largest scale * sum |q k| (*t) and, with RoPE, the most a score may move
 * by the rotated values' ambiguous roundings (*amb). Returns the keys
 * seen. */
static inline size_t at_row(const at_data *a, size_t q0, size_t lq, size_t k0, size_t lk, size_t h,
                            size_t i, double *scores, double *out, double *S, double *lse,
                            double *t, double *amb)
{
    const weft_attention_desc *d = &a->d;
    size_t dim = d->head_dim, g = h / (d->heads / d->kv_heads), seen = 0;
    double scale = d->scale != 0.0f ? d->scale : 1.0 / sqrt((double)dim);
    const double *q = a->rq + (q0 + i) * a->q_width + h * dim;
    const double *aq = a->aq ? a->aq + (q0 + i) * a->q_width + h * dim : NULL;
    double m = -INFINITY;
    *t = *amb = 0;
    for (size_t j = 0; j < lk; j++) {
        if (!at_sees(d, (int64_t)i, (int64_t)j, (int64_t)lq, (int64_t)lk))
            continue;
        const double *kj = a->rk + (k0 + j) * a->k_width + g * dim;
        double s = 0, sa = 0, sr = 0;
        for (size_t e = 0; e < dim; e++)
            s += q[e] * kj[e], sa += fabs(q[e] * kj[e]);
        if (aq) {
            const double *akj = a->ak + (k0 + j) * a->k_width + g * dim;
            for (size_t e = 0; e < dim; e++)
                sr += fabs(q[e]) * akj[e] + aq[e] * (fabs(kj[e]) + akj[e]);
        }
        scores[j] = s * scale;
        m = fmax(m, scores[j]);
        *t = fmax(*t, sa * fabs(scale));
        *amb = fmax(*amb, sr * fabs(scale));
        seen++;
    }
    for (size_t e = 0; e < dim; e++)
        out[e] = S[e] = 0;
    if (!seen) {
        *lse = -INFINITY;
        return 0;
    }
    double l = 0;
    for (size_t j = 0; j < lk; j++)
        if (at_sees(d, (int64_t)i, (int64_t)j, (int64_t)lq, (int64_t)lk)) {
            double p = exp(scores[j] - m);
            const double *vj = a->rv + (k0 + j) * a->k_width + g * dim;
            l += p;
            for (size_t e = 0; e < dim; e++)
                out[e] += p * vj[e], S[e] += p * fabs(vj[e]);
        }
    for (size_t e = 0; e < dim; e++)
        out[e] /= l, S[e] /= l;
    *lse = m + log(l);
    return seen;
}

static inline int at_poisoned16(const void *p, size_t i)
{
    return ((const uint16_t *)p)[i] == 0xffffu;
}

/* Checks o and lse (host memory, laid out as a's) against the reference;
 * gpu adds the GPU's rounding of the probabilities. Prints the first
 * failures; returns how many elements failed. *rel gets ||o - ref|| /
 * ||ref|| and *max_lse the largest LSE error. */
static inline size_t at_check(const at_data *a, const void *o, const float *lse, int gpu,
                              const char *name, double *rel, double *max_lse)
{
    const weft_attention_desc *d = &a->d;
    size_t dim = d->head_dim, bad = 0, qr = a->q_rows ? a->q_rows : 1;
    double u = d->dtype == WEFT_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    unsigned char *written = calloc(qr * d->o_stride, 1);
    unsigned char *lse_written = calloc(d->heads * (d->lse_stride ? d->lse_stride : 1), 1);
    double *scores = at_alloc((d->seq_k + 1) * sizeof(double));
    double want[256], S[256], num = 0, den = 0;
    *max_lse = 0;

#define AT_BAD(...)                                                                                \
    do {                                                                                           \
        if (bad++ < 8)                                                                             \
            printf("  %s: " __VA_ARGS__);                                                          \
    } while (0)

    for (size_t b = 0; b < d->batch; b++) {
        size_t q0, lq, k0, lk;
        at_sequence(a, b, &q0, &lq, &k0, &lk);
        double vmax = 0;
        for (size_t j = 0; j < lk * a->k_width; j++)
            vmax = fmax(vmax, fabs(a->rv[k0 * a->k_width + j]));
        double slack = (264.0 + (double)lk / 256.0) * 0x1p-24 + (gpu ? u : 0);
        for (size_t h = 0; h < d->heads; h++)
            for (size_t i = 0; i < lq; i++) {
                if (a->sample > 1 && i % a->sample != 0 && i + 2 < lq) {
                    for (size_t e = 0; e < dim; e++) {
                        size_t at = (q0 + i) * d->o_stride + h * dim + e;
                        written[at] = 1;
                        if (!isfinite(weft__load(d->dtype, o, at)))
                            AT_BAD("seq %zu head %zu query %zu elem %zu is not finite "
                                   "(unwritten?)\n",
                                   name, b, h, i, e);
                    }
                    if (lse)
                        lse_written[h * d->lse_stride + q0 + i] = 1;
                    continue;
                }
                double wl, t, amb;
                size_t seen = at_row(a, q0, lq, k0, lk, h, i, scores, want, S, &wl, &t, &amb);
                double ds = (double)(dim + 8) * 0x1p-24 * t * (gpu ? 4 : 1) + (gpu ? amb : 0);
                size_t row = q0 + i;
                for (size_t e = 0; e < dim; e++) {
                    size_t at = row * d->o_stride + h * dim + e;
                    double got = weft__load(d->dtype, o, at);
                    written[at] = 1;
                    double lim = u * fabs(want[e]) + slack * S[e] + 2 * vmax * ds + 1e-30;
                    if (!seen ? got != 0.0 : !(fabs(got - want[e]) <= lim))
                        AT_BAD("seq %zu head %zu query %zu (of %zu, keys %zu) elem %zu: %.8g, "
                               "want %.8g (bound %.3g)\n",
                               name, b, h, i, lq, lk, e, got, want[e], lim);
                    if (seen)
                        num += (got - want[e]) * (got - want[e]), den += want[e] * want[e];
                }
                if (!lse)
                    continue;
                size_t la = h * d->lse_stride + row;
                double gl = lse[la];
                lse_written[la] = 1;
                double llim = (gpu ? 1e-5 : 2e-6) * (1 + fabs(wl)) + ds;
                if (!seen ? !(isinf(gl) && gl < 0) : !(fabs(gl - wl) <= llim))
                    AT_BAD("seq %zu head %zu query %zu: LSE %.9g, want %.9g (bound %.3g)\n", name,
                           b, h, i, gl, wl, llim);
                if (seen)
                    *max_lse = fmax(*max_lse, fabs(gl - wl));
            }
    }
    for (size_t x = 0; x < qr * d->o_stride; x++)
        if (!written[x] && !at_poisoned16(o, x))
            AT_BAD("O element %zu (row %zu) is outside every row and was written\n", name, x,
                   x / d->o_stride);
    for (size_t x = 0; lse && x < d->heads * d->lse_stride; x++) {
        uint32_t bits;
        memcpy(&bits, lse + x, sizeof bits);
        if (!lse_written[x] && bits != 0xffffffffu)
            AT_BAD("LSE element %zu is outside every row and was written\n", name, x);
    }
#undef AT_BAD
    *rel = sqrt(num / (den > 0 ? den : 1));
    free(written), free(lse_written), free(scores);
    return bad;
}

#endif
