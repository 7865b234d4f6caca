/*
 * moe_ref.h - what the host and GPU tests of the mixture-of-experts calls
 * share: random logits (with exact ties on demand), float64 references
 * written as the plain loops of the definitions, and the checks.
 *
 * The router's check is independent of the library's ranking code: it
 * sorts each token's experts by value in double (NaN last, -0 = +0, ties
 * by index) and takes the first k; the weights are computed in double and
 * must be within 1e-5 relative; the tables must be consistent (every
 * (token, slot) pair once, offsets equal to the counts, each expert's run
 * in token order, inverse the inverse). The grouped matmul's check is
 * matmul_ref.h's rule: within (k + 4) 2^-24 of the terms' size (times a
 * slack) plus an ulp of the type at the reference.
 */
#ifndef WEFT_TEST_MOE_REF_H
#define WEFT_TEST_MOE_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/ops_internal.h"
#include "weft/ops.h"

static uint64_t moe_rng_state;

static inline uint64_t moe_rng(void)
{
    uint64_t z = (moe_rng_state += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline double moe_uniform(void)
{
    return (double)(moe_rng() >> 11) * 0x1p-52 - 1.0;
}

/* The seed: WEFT_TEST_SEED when set, else the clock; printed by the caller. */
static inline uint64_t moe_seed(void)
{
    const char *s = getenv("WEFT_TEST_SEED");
    if (s && *s)
        return strtoull(s, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec;
}

/* n elements of dtype, poisoned: bytes 0xa7 (a negative fp32, a negative
 * int32, a NaN-free 16-bit pattern) that a complete write replaces. */
static inline void *moe_poisoned(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    memset(p, 0xa7, bytes);
    return p;
}

/* tokens x experts logits of dtype, rows stride apart, in [-4, 4); with
 * ties, on a grid of 1/4 so that many rows hold equal values, and some
 * zeros of either sign. */
static inline void *moe_logits(weft_dtype t, size_t tokens, size_t experts, size_t stride, int ties)
{
    size_t n = (tokens - 1) * stride + experts;
    void *p = moe_poisoned(n * weft__dtype_size(t));
    for (size_t r = 0; r < tokens; r++)
        for (size_t e = 0; e < experts; e++) {
            float v = (float)(4.0 * moe_uniform());
            if (ties) {
                v = floorf(v * 4.0f) / 4.0f;
                if (v == 0.0f && (moe_rng() & 1))
                    v = -0.0f;
            }
            weft__store(t, p, r * stride + e, v);
        }
    return p;
}

typedef struct moe_host_routing {
    float *weights;
    int32_t *ids, *offsets, *perm, *inverse;
} moe_host_routing;

static inline moe_host_routing moe_routing_poisoned(size_t tokens, size_t experts, size_t k)
{
    moe_host_routing r;
    r.weights = moe_poisoned(tokens * k * 4);
    r.ids = moe_poisoned(tokens * k * 4);
    r.offsets = moe_poisoned((experts + 1) * 4);
    r.perm = moe_poisoned(tokens * k * 4);
    r.inverse = moe_poisoned(tokens * k * 4);
    return r;
}

static inline weft_moe_routing moe_as_routing(const moe_host_routing *r)
{
    weft_moe_routing o = {r->weights, r->ids, r->offsets, r->perm, r->inverse};
    return o;
}

static inline void moe_routing_free(moe_host_routing *r)
{
    free(r->weights), free(r->ids), free(r->offsets), free(r->perm), free(r->inverse);
}

/* Whether expert a goes before expert b by value va, vb: larger first, NaN
 * last, -0 = +0, ties by the lower index. */
static inline int moe_before(double va, size_t a, double vb, size_t b)
{
    if (isnan(va) || isnan(vb))
        return isnan(va) && isnan(vb) ? a < b : !isnan(va);
    if (va != vb)
        return va > vb;
    return a < b;
}

/* The number of mistakes in one gate's result against float64, printed
 * (the first few) with name. */
static inline size_t moe_check_gate(const char *name, weft_dtype dtype, weft_moe_score score,
                                    int renorm, const void *logits, size_t tokens, size_t experts,
                                    size_t stride, size_t k, const moe_host_routing *r)
{
    size_t bad = 0, pairs = tokens * k;
    double x[256];
    size_t order[256];
#define MOE_BAD(...)                                                                               \
    do {                                                                                           \
        if (bad++ < 8) {                                                                           \
            printf("  %s: ", name);                                                                \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)
    for (size_t t = 0; t < tokens; t++) {
        for (size_t e = 0; e < experts; e++)
            x[e] = weft__load(dtype, logits, t * stride + e), order[e] = e;
        for (size_t i = 1; i < experts; i++) /* insertion sort by moe_before */
            for (size_t j = i;
                 j > 0 && moe_before(x[order[j]], order[j], x[order[j - 1]], order[j - 1]); j--) {
                size_t s = order[j];
                order[j] = order[j - 1], order[j - 1] = s;
            }
        double m = -INFINITY, sum = 0, p[8], psum = 0;
        for (size_t e = 0; e < experts; e++)
            m = fmax(m, x[e]);
        for (size_t e = 0; e < experts; e++)
            sum += exp(x[e] - m);
        for (size_t j = 0; j < k; j++) {
            double v = x[order[j]];
            p[j] = score == WEFT_MOE_SOFTMAX ? exp(v - m) / sum : 1.0 / (1.0 + exp(-v));
            psum += p[j];
        }
        for (size_t j = 0; j < k; j++) {
            size_t i = t * k + j;
            if (r->ids[i] != (int32_t)order[j])
                MOE_BAD("token %zu slot %zu: id %d, want %zu", t, j, (int)r->ids[i], order[j]);
            double want = renorm ? p[j] / psum : p[j];
            double got = r->weights[i];
            if (!(fabs(got - want) <= 1e-5 * fabs(want) + 1e-30) || !(got >= 0))
                MOE_BAD("token %zu slot %zu: weight %.9g, want %.9g", t, j, got, want);
        }
    }
    /* The tables. */
    if (r->offsets[0] != 0 || r->offsets[experts] != (int32_t)pairs)
        MOE_BAD("offsets run from %d to %d, not 0 to %zu", (int)r->offsets[0],
                (int)r->offsets[experts], pairs);
    int32_t *count = calloc(experts + 1, sizeof *count);
    unsigned char *seen = calloc(pairs, 1);
    for (size_t i = 0; i < pairs; i++)
        if (r->ids[i] >= 0 && (size_t)r->ids[i] < experts)
            count[r->ids[i]]++;
    for (size_t e = 0; e < experts; e++) {
        if (r->offsets[e + 1] - r->offsets[e] != count[e])
            MOE_BAD("expert %zu: offsets give %d rows, the ids %d", e,
                    (int)(r->offsets[e + 1] - r->offsets[e]), (int)count[e]);
        int32_t lo = r->offsets[e], hi = r->offsets[e + 1];
        if (lo < 0 || hi > (int32_t)pairs || lo > hi)
            continue;
        for (int32_t q = lo; q < hi; q++) {
            int32_t pr = r->perm[q];
            if (pr < 0 || (size_t)pr >= pairs) {
                MOE_BAD("perm[%d] = %d is out of range", (int)q, (int)pr);
                continue;
            }
            if (seen[pr]++)
                MOE_BAD("pair %d appears twice in perm", (int)pr);
            if (r->ids[pr] != (int32_t)e)
                MOE_BAD("perm[%d] = pair %d of expert %d sits in expert %zu's rows", (int)q,
                        (int)pr, (int)r->ids[pr], e);
            if (q > lo && r->perm[q - 1] >= pr)
                MOE_BAD("expert %zu's rows are not in token order at %d", e, (int)q);
            if (r->inverse[pr] != q)
                MOE_BAD("inverse[%d] = %d, want %d", (int)pr, (int)r->inverse[pr], (int)q);
        }
    }
    for (size_t i = 0; i < pairs; i++)
        if (!seen[i])
            MOE_BAD("pair %zu is missing from perm", i);
    free(count), free(seen);
#undef MOE_BAD
    return bad;
}

/* ---- the grouped matmul ------------------------------------------------ */

static inline double moe_act(weft_matmul_act act, double v)
{
    switch (act) {
    case WEFT_MATMUL_ACT_RELU:
        return v > 0 ? v : 0;
    case WEFT_MATMUL_ACT_GELU_TANH:
        return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case WEFT_MATMUL_ACT_GELU_ERF:
        return 0.5 * v * erfc(-v / sqrt(2.0));
    default:
        return v;
    }
}

/* n random elements of dtype in [-scale, scale). */
static inline void *moe_random(weft_dtype t, size_t n, double scale)
{
    void *p = malloc(n * weft__dtype_size(t) + 1);
    for (size_t i = 0; i < n; i++)
        weft__store(t, p, i, (float)(scale * moe_uniform()));
    return p;
}

/* Mistakes in Y (poisoned before the call) against float64: rows of the
 * groups computed, rows outside them (and the padding past n) still
 * poisoned. slack multiplies the sums' bound. */
static inline size_t moe_check_grouped(const char *name, const weft_grouped_matmul_desc *d,
                                       const void *y, const void *x, const void *w,
                                       const int32_t *offsets, double slack)
{
    size_t ldx = d->ldx ? d->ldx : d->k, ldy = d->ldy ? d->ldy : d->n, bad = 0;
    double ulp = d->type == WEFT_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    double tol = ((double)d->k + 4) * 0x1p-24 * slack;
    uint16_t poison = 0xa7a7;
    for (size_t r = 0; r < d->rows; r++) {
        size_t g = d->groups;
        for (size_t i = 0; i < d->groups; i++)
            if ((int32_t)r >= offsets[i] && (int32_t)r < offsets[i + 1])
                g = i;
        for (size_t j = 0; j < ldy && (r + 1 < d->rows || j < d->n); j++) {
            uint16_t raw = ((const uint16_t *)y)[r * ldy + j];
            if (g == d->groups || j >= d->n) {
                if (raw != poison && bad++ < 8)
                    printf("  %s: Y[%zu][%zu] outside the groups was written\n", name, r, j);
                continue;
            }
            double p = 0, s = 0;
            for (size_t q = 0; q < d->k; q++) {
                double t = (double)weft__load(d->type, x, r * ldx + q) *
                           weft__load(d->type, w, (g * d->n + j) * d->k + q);
                p += t, s += fabs(t);
            }
            if (d->bias) {
                double b = weft__load(d->type, d->bias, g * d->n + j);
                p += b, s += fabs(b);
            }
            double want = moe_act(d->act, p), got = weft__load(d->type, y, r * ldy + j);
            /* bf16 results take GELU's cheapest fit (activations.cuh): its
             * tail a Phi(-a) to 7.3e-4, a unit off the rounded value at times */
            double fit = d->type == WEFT_DTYPE_BF16 && d->act == WEFT_MATMUL_ACT_GELU_ERF
                             ? 7.4e-4 * fabs(p) * 0.5 * erfc(fabs(p) / sqrt(2.0))
                             : 0;
            double lim = 1.2 * tol * s + ulp * fabs(want) + fit + 0x1p-24;
            if (!(fabs(got - want) <= lim) && bad++ < 8)
                printf("  %s: Y[%zu][%zu] (group %zu) = %.6g, want %.6g (bound %.3g)\n", name, r, j,
                       g, got, want, lim);
        }
    }
    return bad;
}

#endif
