/*
 * matmul_ref.h - what the host and GPU tests of weft_matmul share: random
 * operands, a float64 reference written as the plain loop of the
 * definition, and the check of a result against it.
 *
 * The reference reads the operands as stored (rounded to their dtype) and
 * computes P = alpha op(A) op(B) + beta C + bias and act(P) in float64. A
 * result element passes when it is within
 *   tol * S + half an ulp of the dtype at |ref| (+ 1e-6 |ref| for fp32 math)
 * where S = sum |alpha a b| + |beta c| + |bias| is the size of the terms
 * the sum was made of (a cancelling sum is judged against its terms) and
 * tol covers fp32 sums of k terms in any order, (k + 4) 2^-24, times the
 * caller's slack (the GPU's TF32 needs more). Outputs are poisoned
 * (all-ones bytes) first: every element must be written, and the padding
 * of each row (ld > n) and between batches must keep the poison.
 */
#ifndef WEFT_TEST_MATMUL_REF_H
#define WEFT_TEST_MATMUL_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_internal.h"
#include "weft/ops.h"

static uint64_t mm_rng_state;

static inline uint64_t mm_rng(void)
{
    uint64_t z = (mm_rng_state += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline double mm_uniform(void)
{
    return (double)(mm_rng() >> 11) * 0x1p-52 - 1.0;
}

/* The resolved geometry of a descriptor, as weft_matmul resolves it. */
typedef struct mm_geom {
    size_t batch, a_rows, a_cols, b_rows, b_cols, lda, ldb, ldc, ldd, ldaux;
    size_t na, nb, nc, nd, naux; /* elements each buffer spans */
    weft_dtype in_type;
} mm_geom;

static inline size_t mm_span(size_t batch, size_t stride, size_t rows, size_t ld, size_t cols)
{
    return (batch - 1) * stride + (rows - 1) * ld + cols;
}

static inline mm_geom mm_geometry(const weft_matmul_desc *d)
{
    mm_geom g;
    g.batch = d->batch ? d->batch : 1;
    g.in_type = d->in_type == WEFT_DTYPE_F32 ? d->type : d->in_type;
    g.a_rows = d->trans_a ? d->k : d->m, g.a_cols = d->trans_a ? d->m : d->k;
    g.b_rows = d->trans_b ? d->n : d->k, g.b_cols = d->trans_b ? d->k : d->n;
    g.lda = d->lda ? d->lda : g.a_cols, g.ldb = d->ldb ? d->ldb : g.b_cols;
    g.ldd = d->ldd ? d->ldd : d->n;
    g.ldc = d->ldc ? d->ldc : d->n, g.ldaux = d->ldaux ? d->ldaux : d->n;
    size_t bt = g.batch;
    g.na = mm_span(bt, d->stride_a, g.a_rows, g.lda, g.a_cols);
    g.nb = mm_span(bt, d->stride_b, g.b_rows, g.ldb, g.b_cols);
    g.nc = mm_span(bt, d->stride_c, d->m, g.ldc, d->n);
    g.nd = mm_span(bt, d->stride_d, d->m, g.ldd, d->n);
    g.naux = mm_span(bt, d->stride_aux, d->m, g.ldaux, d->n);
    return g;
}

/* n random elements of dtype in [-scale, scale). */
static inline void *mm_random(weft_dtype t, size_t n, double scale)
{
    void *p = malloc(n * weft__dtype_size(t) + 1);
    for (size_t i = 0; i < n; i++)
        weft__store(t, p, i, (float)(scale * mm_uniform()));
    return p;
}

static inline void *mm_poisoned(weft_dtype t, size_t n)
{
    void *p = malloc(n * weft__dtype_size(t) + 1);
    memset(p, 0xff, n * weft__dtype_size(t));
    return p;
}

static inline double mm_act(weft_matmul_act act, double x)
{
    switch (act) {
    case WEFT_MATMUL_ACT_RELU:
        return x > 0 ? x : 0;
    case WEFT_MATMUL_ACT_GELU_TANH: {
        double u = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
        return 0.5 * x * (1.0 + tanh(u));
    }
    case WEFT_MATMUL_ACT_GELU_ERF:
        return 0.5 * x * erfc(-x / 1.41421356237309504880);
    default:
        return x;
    }
}

/* The reference of batch bt, element (i, j): P, act(P) and S. */
typedef struct mm_ref {
    double p, y, s;
} mm_ref;

static inline mm_ref mm_reference(const weft_matmul_desc *d, const mm_geom *g, const void *a,
                                  const void *b, const void *c, size_t bt, size_t i, size_t j)
{
    double alpha = d->alpha != 0.0f ? d->alpha : 1.0;
    double beta = d->beta != 0.0f ? d->beta : 1.0;
    mm_ref r = {0, 0, 0};
    for (size_t p = 0; p < d->k; p++) {
        size_t ia = bt * d->stride_a + (d->trans_a ? p * g->lda + i : i * g->lda + p);
        size_t ib = bt * d->stride_b + (d->trans_b ? j * g->ldb + p : p * g->ldb + j);
        double t = alpha * weft__load(g->in_type, a, ia) * weft__load(g->in_type, b, ib);
        r.p += t;
        r.s += fabs(t);
    }
    if (c) {
        double t = beta * weft__load(d->type, c, bt * d->stride_c + i * g->ldc + j);
        r.p += t;
        r.s += fabs(t);
    }
    if (d->bias) {
        double t = weft__load(d->type, d->bias, j);
        r.p += t;
        r.s += fabs(t);
    }
    r.y = mm_act(d->act, r.p);
    return r;
}

static inline double mm_half_ulp(weft_dtype t)
{
    return t == WEFT_DTYPE_BF16 ? 0x1p-8 : t == WEFT_DTYPE_F16 ? 0x1p-11 : 0x1p-24;
}

static inline int mm_poison_kept(weft_dtype t, const void *p, size_t i)
{
    size_t es = weft__dtype_size(t);
    const unsigned char *q = (const unsigned char *)p + i * es;
    for (size_t x = 0; x < es; x++)
        if (q[x] != 0xff)
            return 0;
    return 1;
}

/* Checks D (and aux when given) against the reference computed from a, b
 * and c (c the residual as it was before an in-place call). Returns the
 * number of failing elements, printing the first few under name.
 * check_padding: D was poisoned before the call (not so in place). */
static inline size_t mm_check(const char *name, const weft_matmul_desc *d, const void *a,
                              const void *b, const void *c, const void *out, const void *aux,
                              double slack, int check_padding)
{
    mm_geom g = mm_geometry(d);
    size_t bad = 0;
    double tol = slack * ((double)d->k + 4) * 0x1p-24;
    unsigned char *written = calloc(g.nd + g.naux + 2, 1);

    for (size_t bt = 0; bt < g.batch; bt++)
        for (size_t i = 0; i < d->m; i++)
            for (size_t j = 0; j < d->n; j++) {
                mm_ref r = mm_reference(d, &g, a, b, c, bt, i, j);
                size_t id = bt * d->stride_d + i * g.ldd + j;
                double got = weft__load(d->type, out, id);
                /* GELU's slope is within 1.13; the sum's error passes
                 * through it, its own fp32 math adds 1e-6. */
                double lim = 1.2 * tol * r.s + (mm_half_ulp(d->type) + 1e-6) * fabs(r.y) + 1e-30;
                if (d->type == WEFT_DTYPE_F16)
                    lim += 0x1p-25; /* half of fp16's subnormal step */
                written[id] = 1;
                if (!(fabs(got - r.y) <= lim) && bad++ < 5)
                    fprintf(stderr, "%s: D[%zu][%zu][%zu] = %.9g, want %.9g (+-%.3g)\n", name, bt,
                            i, j, got, r.y, lim);
                if (aux) {
                    size_t ix = bt * d->stride_aux + i * g.ldaux + j;
                    double gp = weft__load(d->type, aux, ix);
                    double lp = tol * r.s + (mm_half_ulp(d->type) + 1e-6) * fabs(r.p) + 1e-30;
                    written[g.nd + ix] = 1;
                    if (!(fabs(gp - r.p) <= lp) && bad++ < 5)
                        fprintf(stderr, "%s: aux[%zu][%zu][%zu] = %.9g, want %.9g\n", name, bt, i,
                                j, gp, r.p);
                }
            }
    /* What the op should not have written. (In place, D's padding holds
     * C's values, not the poison: the caller says not to look.) */
    for (size_t x = 0; check_padding && x < g.nd; x++)
        if (!written[x] && !mm_poison_kept(d->type, out, x) && bad++ < 5)
            fprintf(stderr, "%s: D's padding element %zu was written\n", name, x);
    for (size_t x = 0; aux && x < g.naux; x++)
        if (!written[g.nd + x] && !mm_poison_kept(d->type, aux, x) && bad++ < 5)
            fprintf(stderr, "%s: aux's padding element %zu was written\n", name, x);
    free(written);
    return bad;
}

#endif
