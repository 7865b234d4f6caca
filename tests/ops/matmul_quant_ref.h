/*
 * matmul_quant_ref.h - what the host and GPU tests of weft_matmul's FP8 and
 * INT8 products share: random quantized operands, their scales and
 * epilogue tensors (host memory), a float64 reference written as the loop
 * of the definition in weft/ops.h, and the check of a result against it.
 *
 * FP8 operands are random bit patterns, redrawn until finite and below 16
 * in magnitude (so that sums fit an fp16 D), so every exponent from the
 * subnormals up appears; INT8 operands are uniform over
 * [-128, 127]. The reference computes, per element,
 *   P = alpha sa_i sb_j sum_p a_ip b_pj + beta c + bias,  y = act(P)
 * in float64 (the INT8 sum exactly), then D = y, or fp8(scale_d y) with
 * saturation, or the exact int32 sum. A result element passes when within
 *   1.2 tol S + half an ulp of D's type at |want| (+ the types' subnormal
 *   half step)
 * with S the sum of the magnitudes of P's terms and tol the fp32 sums'
 * bound (k + 8) 2^-24; int32 results must be exact. Outputs are poisoned
 * (all-ones bytes) first: every element must be written and padding keep
 * the poison.
 */
#ifndef WEFT_TEST_MATMUL_QUANT_REF_H
#define WEFT_TEST_MATMUL_QUANT_REF_H

#include "ops/matmul_ref.h"

/* One call's operands, all in host memory. */
typedef struct qm_case {
    weft_matmul_desc desc; /* scale_* and bias/aux point into this struct's buffers */
    mm_geom g;
    weft_dtype tb, tc, tbias; /* B's, C's and the bias's types, resolved */
    void *a, *b, *c, *bias;
    float *sa, *sb, sd;
    size_t na, nb, nc, nd, naux;
    double value_a[256], value_b[256]; /* each byte's value as A's and B's type */
} qm_case;

static inline int qm_is_f8(weft_dtype t)
{
    return t == WEFT_DTYPE_F8_E4M3 || t == WEFT_DTYPE_F8_E5M2;
}

/* n random finite fp8 values (as bit patterns), or int8 values. */
static inline void *qm_random_q(weft_dtype t, size_t n)
{
    uint8_t *p = (uint8_t *)malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t v = (uint8_t)mm_rng();
        while (qm_is_f8(t) && !(fabsf(weft__f8_to_f32(t, v)) < 16.0f))
            v = (uint8_t)mm_rng();
        p[i] = v;
    }
    return p;
}

/* n scales, positive or negative, of magnitude in [2^-3, 2^3). */
static inline float *qm_scales(size_t n)
{
    float *s = (float *)malloc(n * sizeof *s);
    for (size_t i = 0; i < n; i++)
        s[i] = (float)((mm_rng() & 1 ? -1 : 1) * exp2(6.0 * (mm_uniform() + 1) / 2 - 3));
    return s;
}

static inline double qm_scale_of(weft_matmul_scale mode, const float *s, size_t i)
{
    return mode == WEFT_MATMUL_SCALE_OUTER ? s[i] : mode == WEFT_MATMUL_SCALE_TENSOR ? s[0] : 1.0;
}

/* The reference P, y and S of batch bt, element (i, j). */
static inline mm_ref qm_reference(const qm_case *q, size_t bt, size_t i, size_t j)
{
    const weft_matmul_desc *d = &q->desc;
    const mm_geom *g = &q->g;
    double alpha = d->alpha != 0.0f ? d->alpha : 1.0;
    double beta = d->beta != 0.0f ? d->beta : 1.0;
    double sum = 0, mag = 0;
    const uint8_t *a = (const uint8_t *)q->a + bt * d->stride_a + i * g->lda;
    const uint8_t *b = (const uint8_t *)q->b + bt * d->stride_b + j * g->ldb;
    for (size_t p = 0; p < d->k; p++) { /* TN: A is m x k, B n x k */
        double x = q->value_a[a[p]], y = q->value_b[b[p]];
        sum += x * y;
        mag += fabs(x * y);
    }
    double s =
        alpha * qm_scale_of(d->scale_a_mode, q->sa, i) * qm_scale_of(d->scale_b_mode, q->sb, j);
    mm_ref r = {s * sum, 0, fabs(s) * mag};
    if (q->c) {
        double t = beta * weft__load(q->tc, q->c, bt * d->stride_c + i * g->ldc + j);
        r.p += t, r.s += fabs(t);
    }
    if (q->bias) {
        double t = weft__load(q->tbias, q->bias, j);
        r.p += t, r.s += fabs(t);
    }
    r.y = mm_act(d->act, r.p);
    return r;
}

/* The exact int32 sum of element (i, j) of batch bt (INT8). */
static inline int64_t qm_exact(const qm_case *q, size_t bt, size_t i, size_t j)
{
    const weft_matmul_desc *d = &q->desc;
    int64_t sum = 0;
    for (size_t p = 0; p < d->k; p++)
        sum += (int64_t)((const int8_t *)q->a)[bt * d->stride_a + i * q->g.lda + p] *
               ((const int8_t *)q->b)[bt * d->stride_b + j * q->g.ldb + p];
    return sum;
}

static inline double qm_max_finite(weft_dtype t)
{
    return t == WEFT_DTYPE_F8_E4M3 ? 448.0 : 57344.0;
}

/* Half an ulp of t, relative, and half its subnormal step. */
static inline double qm_half_ulp(weft_dtype t)
{
    return t == WEFT_DTYPE_F8_E4M3 ? 0x1p-4 : t == WEFT_DTYPE_F8_E5M2 ? 0x1p-3 : mm_half_ulp(t);
}

static inline double qm_half_sub(weft_dtype t)
{
    return t == WEFT_DTYPE_F8_E4M3   ? 0x1p-10
           : t == WEFT_DTYPE_F8_E5M2 ? 0x1p-17
           : t == WEFT_DTYPE_F16     ? 0x1p-25
                                     : 1e-30;
}

/* Fresh operands for desc (whose types, shape, layout, modes and act are
 * set): A, B, C when with_c, bias when with_bias, scales as the modes say.
 * An fp8 D's scale_d is chosen from the reference so that the largest
 * |y| lands at target (above the type's maximum to test saturation). */
static inline void qm_make(qm_case *q, weft_matmul_desc desc, int with_c, int with_bias,
                           double target)
{
    memset(q, 0, sizeof *q);
    q->g = mm_geometry(&desc);
    mm_geom *g = &q->g;
    q->tb = desc.in_type_b ? desc.in_type_b : g->in_type;
    int d8 = qm_is_f8(desc.type);
    q->tc = d8 ? (desc.c_type ? desc.c_type : WEFT_DTYPE_BF16) : desc.type;
    q->tbias = d8                                                    ? q->tc
               : qm_is_f8(g->in_type) && desc.type == WEFT_DTYPE_F32 ? WEFT_DTYPE_BF16
                                                                     : desc.type;
    q->na = g->na, q->nb = mm_span(g->batch, desc.stride_b, g->b_rows, g->ldb, g->b_cols);
    q->nc = g->nc, q->nd = g->nd, q->naux = g->naux;
    q->a = qm_random_q(g->in_type, q->na);
    q->b = qm_random_q(q->tb, q->nb);
    /* the operands are bytes: their values looked up, not decoded k times */
    for (unsigned v = 0; v < 256; v++) {
        q->value_a[v] = qm_is_f8(g->in_type) ? weft__f8_to_f32(g->in_type, (uint8_t)v) : (int8_t)v;
        q->value_b[v] = qm_is_f8(q->tb) ? weft__f8_to_f32(q->tb, (uint8_t)v) : (int8_t)v;
    }
    /* C and bias about as large as the product's terms (~1 for FP8 with
     * scales near 1, ~1e4 k^0.5 for INT8). */
    double big = g->in_type == WEFT_DTYPE_I8 ? 100.0 * sqrt((double)desc.k) : 1.0;
    if (with_c)
        q->c = mm_random(q->tc, q->nc, big);
    if (with_bias)
        q->bias = mm_random(q->tbias, desc.n, big);
    if (desc.scale_a_mode)
        q->sa = qm_scales(desc.scale_a_mode == WEFT_MATMUL_SCALE_OUTER ? desc.m : 1);
    if (desc.scale_b_mode)
        q->sb = qm_scales(desc.scale_b_mode == WEFT_MATMUL_SCALE_OUTER ? desc.n : 1);
    desc.scale_a = q->sa, desc.scale_b = q->sb;
    desc.bias = q->bias;
    q->desc = desc;
    if (d8) {
        double amax = 0;
        for (size_t bt = 0; bt < g->batch; bt++)
            for (size_t i = 0; i < desc.m; i++)
                for (size_t j = 0; j < desc.n; j++)
                    amax = fmax(amax, fabs(qm_reference(q, bt, i, j).y));
        q->sd = (float)(amax > 0 ? target / amax : 1.0);
        q->desc.scale_d = &q->sd;
    }
}

static inline void qm_free(qm_case *q)
{
    free(q->a), free(q->b), free(q->c), free(q->bias), free(q->sa), free(q->sb);
}

/* Checks D (and aux, and amax_d when got_amax is not NULL) against the
 * reference; returns the number of failures, printing the first few.
 * extra: a further bound relative to S, for sums less exact than fp32's
 * (the GPU's FP8 accumulators); extra_p one relative to |P|, for
 * activations computed otherwise than the host's (the GPU's GELU fits, and
 * its erf GELU applied to P already rounded to D's type); 0 on the host. */
static inline size_t qm_check(const char *name, const qm_case *q, const void *out, const void *aux,
                              const float *got_amax, double extra, double extra_p)
{
    const weft_matmul_desc *d = &q->desc;
    const mm_geom *g = &q->g;
    size_t bad = 0, es = weft__dtype_size(d->type);
    double tol = ((double)d->k + 8) * 0x1p-24, amax = 0, amax_lim = 0;
    int d8 = qm_is_f8(d->type);
    double sd = d8 ? q->sd : 1.0;
    unsigned char *written = (unsigned char *)calloc(q->nd + q->naux + 2, 1);

    for (size_t bt = 0; bt < g->batch; bt++)
        for (size_t i = 0; i < d->m; i++)
            for (size_t j = 0; j < d->n; j++) {
                size_t id = bt * d->stride_d + i * g->ldd + j;
                written[id] = 1;
                if (d->type == WEFT_DTYPE_I32) {
                    int64_t want = qm_exact(q, bt, i, j);
                    int32_t got = ((const int32_t *)out)[id];
                    if (got != want && bad++ < 5)
                        fprintf(stderr, "%s: D[%zu][%zu][%zu] = %d, want %lld\n", name, bt, i, j,
                                got, (long long)want);
                    continue;
                }
                mm_ref r = qm_reference(q, bt, i, j);
                double err = 1.2 * (tol + extra) * r.s + 1e-6 * fabs(r.y) + /* fp32 y's */
                             extra_p * fabs(r.p);
                amax = fmax(amax, fabs(r.y));
                amax_lim = fmax(amax_lim, err);
                double want = r.y * sd, got = weft__load(d->type, out, id);
                if (d8) /* saturating, which moves no value further from want */
                    want = fmax(-qm_max_finite(d->type), fmin(qm_max_finite(d->type), want));
                double lim = err * fabs(sd) + qm_half_ulp(d->type) * (fabs(want) + err * fabs(sd)) +
                             qm_half_sub(d->type) + 1e-30;
                if (!(fabs(got - want) <= lim) && bad++ < 5)
                    fprintf(stderr, "%s: D[%zu][%zu][%zu] = %.9g, want %.9g (+-%.3g)\n", name, bt,
                            i, j, got, want, lim);
                if (aux) {
                    size_t ix = bt * d->stride_aux + i * g->ldaux + j;
                    double gp = weft__load(d->type, aux, ix);
                    double lp = (tol + extra) * r.s + (mm_half_ulp(d->type) + 1e-6) * fabs(r.p) +
                                qm_half_sub(d->type);
                    written[q->nd + ix] = 1;
                    if (!(fabs(gp - r.p) <= lp) && bad++ < 5)
                        fprintf(stderr, "%s: aux[%zu][%zu][%zu] = %.9g, want %.9g\n", name, bt, i,
                                j, gp, r.p);
                }
            }
    if (got_amax && !(fabs(*got_amax - amax) <= amax_lim + 1e-6 * amax + 1e-30) && bad++ < 5)
        fprintf(stderr, "%s: amax_d = %.9g, want %.9g (+-%.3g)\n", name, *got_amax, amax, amax_lim);
    for (size_t x = 0; x < q->nd; x++) {
        const unsigned char *p = (const unsigned char *)out + x * es;
        int kept = 1;
        for (size_t y = 0; y < es; y++)
            kept &= p[y] == 0xff;
        if (!written[x] && !kept && bad++ < 5)
            fprintf(stderr, "%s: D's padding element %zu was written\n", name, x);
    }
    for (size_t x = 0; aux && x < q->naux; x++)
        if (!written[q->nd + x] && !mm_poison_kept(d->type, aux, x) && bad++ < 5)
            fprintf(stderr, "%s: aux's padding element %zu was written\n", name, x);
    free(written);
    return bad;
}

/* Two results of q's call (the GPU's and the host's) against each other:
 * within twice the bound each has against the reference (int32: equal).
 * Returns the number of elements apart, printing the first few. */
static inline size_t qm_agree(const char *name, const qm_case *q, const void *x, const void *y,
                              double extra, double extra_p)
{
    const weft_matmul_desc *d = &q->desc;
    double tol = ((double)d->k + 8) * 0x1p-24 + extra, sd = qm_is_f8(d->type) ? q->sd : 1.0;
    size_t bad = 0;
    for (size_t bt = 0; bt < q->g.batch; bt++)
        for (size_t i = 0; i < d->m; i++)
            for (size_t j = 0; j < d->n; j++) {
                size_t id = bt * d->stride_d + i * q->g.ldd + j;
                double u = weft__load(d->type, x, id), v = weft__load(d->type, y, id);
                double lim = 0;
                if (d->type != WEFT_DTYPE_I32) {
                    mm_ref r = qm_reference(q, bt, i, j);
                    double err =
                        (1.2 * tol * r.s + 1e-6 * fabs(r.y) + extra_p * fabs(r.p)) * fabs(sd);
                    lim = 2 * (err + qm_half_ulp(d->type) * (fabs(r.y * sd) + err) +
                               qm_half_sub(d->type));
                } else if (((const int32_t *)x)[id] != ((const int32_t *)y)[id]) {
                    lim = -1;
                }
                if (!(fabs(u - v) <= lim) && bad++ < 5)
                    fprintf(stderr, "%s: D[%zu][%zu][%zu]: %.9g here, %.9g there (+-%.3g)\n", name,
                            bt, i, j, u, v, lim);
            }
    return bad;
}

#endif
