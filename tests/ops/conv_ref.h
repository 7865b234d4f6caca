/*
 * conv_ref.h - what the host and GPU tests of weft_conv2d share: random
 * tensors, the cases (shapes a ResNet and a MobileNet hold, and awkward
 * ones), a float64 reference written as the plain loop of the definition,
 * a float64 BatchNorm after it, and the check of a result against them.
 *
 * The reference reads the tensors as stored (rounded to their dtype). An
 * output element passes when it is within
 *   tol * S + half an ulp of the dtype at |ref| (+ 1e-6 |ref|)
 * where S = sum |in w| + |bias| is the size of the terms the sum was made
 * of, and tol covers fp32 sums of that many terms in any order,
 * 1.2 (terms + 4) 2^-24, plus what the caller adds (the folded weights'
 * rounding, the GPU's looser sums). Outputs are poisoned (all-ones bytes:
 * NaN in every dtype) first, so an element never written fails.
 */
#ifndef WEFT_TEST_CONV_REF_H
#define WEFT_TEST_CONV_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops_internal.h"
#include "weft/ops.h"

static uint64_t cv_rng_state;

static inline uint64_t cv_rng(void)
{
    uint64_t z = (cv_rng_state += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline double cv_uniform(double lo, double hi)
{
    return lo + (hi - lo) * ((double)(cv_rng() >> 11) * 0x1p-53);
}

static inline void *cv_random(weft_dtype t, size_t n, double lo, double hi)
{
    void *p = malloc(n * weft__dtype_size(t) + 1);
    for (size_t i = 0; i < n; i++)
        weft__store(t, p, i, (float)cv_uniform(lo, hi));
    return p;
}

static inline void *cv_poisoned(weft_dtype t, size_t n)
{
    void *p = malloc(n * weft__dtype_size(t) + 1);
    memset(p, 0xff, n * weft__dtype_size(t));
    return p;
}

/* The resolved geometry of a descriptor, as weft_conv2d resolves it. */
typedef struct cv_geom {
    size_t sh, sw, dh, dw, groups, cg, kg, oh, ow;
    size_t nin, nw, nout; /* elements */
} cv_geom;

static inline cv_geom cv_geometry(const weft_conv2d_desc *d)
{
    cv_geom g;
    g.sh = d->stride_h ? d->stride_h : 1, g.sw = d->stride_w ? d->stride_w : 1;
    g.dh = d->dilation_h ? d->dilation_h : 1, g.dw = d->dilation_w ? d->dilation_w : 1;
    g.groups = d->groups ? d->groups : 1;
    g.cg = d->c / g.groups, g.kg = d->k / g.groups;
    g.oh = (d->h + 2 * d->pad_h - g.dh * (d->r - 1) - 1) / g.sh + 1;
    g.ow = (d->w + 2 * d->pad_w - g.dw * (d->s - 1) - 1) / g.sw + 1;
    g.nin = d->n * d->h * d->w * d->c;
    g.nw = d->k * d->r * d->s * g.cg;
    g.nout = d->n * g.oh * g.ow * d->k;
    return g;
}

/* The float64 convolution at output element (b, y, x, o), before the bias:
 * the sum, and the sum of its terms' magnitudes in *mag. */
static inline double cv_conv_at(const weft_conv2d_desc *d, const cv_geom *g, const void *in,
                                const void *w, size_t b, size_t y, size_t x, size_t o, double *mag)
{
    double sum = 0, m = 0;
    size_t grp = o / g->kg;
    for (size_t i = 0; i < d->r; i++) {
        long iy = (long)(y * g->sh + i * g->dh) - (long)d->pad_h;
        if (iy < 0 || iy >= (long)d->h)
            continue;
        for (size_t j = 0; j < d->s; j++) {
            long ix = (long)(x * g->sw + j * g->dw) - (long)d->pad_w;
            if (ix < 0 || ix >= (long)d->w)
                continue;
            for (size_t ci = 0; ci < g->cg; ci++) {
                size_t at_in =
                    (((b * d->h + (size_t)iy) * d->w + (size_t)ix) * d->c) + grp * g->cg + ci;
                size_t at_w = ((o * d->r + i) * d->s + j) * g->cg + ci;
                double t =
                    (double)weft__load(d->dtype, in, at_in) * (double)weft__load(d->dtype, w, at_w);
                sum += t;
                m += fabs(t);
            }
        }
    }
    *mag = m;
    return sum;
}

static inline double cv_half_ulp(weft_dtype t)
{
    return t == WEFT_DTYPE_BF16 ? 0x1p-8 : t == WEFT_DTYPE_F16 ? 0x1p-11 : 0x1p-24;
}

static inline double cv_act(weft_conv_act act, double v)
{
    return act == WEFT_CONV_ACT_RELU && v < 0 ? 0 : v;
}

/* A BatchNorm after the convolution, in float64 (NULL: none). Its tensors
 * are k elements of dtype; conv_bias (k of the conv's dtype) may be NULL. */
typedef struct cv_bn {
    weft_dtype dtype;
    const void *conv_bias, *gamma, *beta, *mean, *var;
    double eps;
} cv_bn;

/* Checks out against the float64 reference of (in, w, bias), or, with bn,
 * of (in, w_orig) followed by bn (bias then unused). extra_tol is added to
 * tol (per unit of S). Returns the number of bad elements, printing the
 * first few under name. Every element must be written. */
static inline size_t cv_check(const char *name, const weft_conv2d_desc *d, const void *in,
                              const void *w, const void *bias, const cv_bn *bn, const void *out,
                              double extra_tol)
{
    cv_geom g = cv_geometry(d);
    size_t bad = 0, terms = d->r * d->s * g.cg;
    double tol = 1.2 * ((double)terms + 4) * 0x1p-24 + extra_tol;
    for (size_t b = 0; b < d->n; b++)
        for (size_t y = 0; y < g.oh; y++)
            for (size_t x = 0; x < g.ow; x++)
                for (size_t o = 0; o < d->k; o++) {
                    double mag, v = cv_conv_at(d, &g, in, w, b, y, x, o, &mag);
                    if (bn) {
                        double cb = bn->conv_bias ? weft__load(d->dtype, bn->conv_bias, o) : 0;
                        double sc = weft__load(bn->dtype, bn->gamma, o) /
                                    sqrt(weft__load(bn->dtype, bn->var, o) + bn->eps);
                        double sh = weft__load(bn->dtype, bn->beta, o) +
                                    (cb - weft__load(bn->dtype, bn->mean, o)) * sc;
                        v = v * sc + sh;
                        mag = mag * fabs(sc) + fabs(sh);
                    } else {
                        double bv = weft__load(d->dtype, bias, o);
                        v += bv;
                        mag += fabs(bv);
                    }
                    double want = cv_act(d->act, v);
                    double lim = tol * mag + (cv_half_ulp(d->dtype) + 1e-6) * fabs(want) + 1e-30;
                    if (d->dtype == WEFT_DTYPE_F16)
                        lim += 0x1p-25; /* half of fp16's subnormal step */
                    size_t at = ((b * g.oh + y) * g.ow + x) * d->k + o;
                    double got = weft__load(d->dtype, out, at);
                    if (!(fabs(got - want) <= lim) && bad++ < 5)
                        fprintf(stderr, "%s: out[%zu][%zu][%zu][%zu] = %.9g, want %.9g (+-%.3g)\n",
                                name, b, y, x, o, got, want, lim);
                }
    return bad;
}

/* ||out - ref|| / ||ref|| over the whole output against float64 (no BN). */
static inline double cv_rel_error(const weft_conv2d_desc *d, const void *in, const void *w,
                                  const void *bias, const void *out, size_t *nan_at)
{
    cv_geom g = cv_geometry(d);
    double num = 0, den = 0;
    *nan_at = (size_t)-1;
    for (size_t b = 0; b < d->n; b++)
        for (size_t y = 0; y < g.oh; y++)
            for (size_t x = 0; x < g.ow; x++)
                for (size_t o = 0; o < d->k; o++) {
                    double mag, v = cv_conv_at(d, &g, in, w, b, y, x, o, &mag);
                    double want = cv_act(d->act, v + weft__load(d->dtype, bias, o));
                    size_t at = ((b * g.oh + y) * g.ow + x) * d->k + o;
                    double got = weft__load(d->dtype, out, at);
                    if (isnan(got) && *nan_at == (size_t)-1)
                        *nan_at = at;
                    num += (got - want) * (got - want);
                    den += want * want;
                }
    return sqrt(num / (den > 0 ? den : 1));
}

/* The cases both suites run: 1x1, 3x3 stride 2 padding 1, dilation 2,
 * depthwise, grouped with rectangular filters and strides, a 7x7 stem,
 * long windows, odd sizes, c not a multiple of 8, n of 1 and 3. */
typedef struct cv_case {
    const char *name;
    size_t n, h, w, c, k, r, s, sh, sw, ph, pw, dh, dw, groups;
} cv_case;

static const cv_case CV_CASES[] = {
    {"1x1", 1, 7, 7, 13, 9, 1, 1, 0, 0, 0, 0, 0, 0, 0},
    {"1x1 stride 2", 3, 9, 8, 16, 24, 1, 1, 2, 2, 0, 0, 0, 0, 0},
    {"3x3 stride 2 pad 1", 3, 9, 11, 12, 10, 3, 3, 2, 2, 1, 1, 0, 0, 0},
    {"3x3 pad 1 c 64", 1, 8, 8, 64, 32, 3, 3, 0, 0, 1, 1, 0, 0, 0},
    {"3x3 dilation 2 pad 2", 2, 13, 13, 5, 7, 3, 3, 0, 0, 2, 2, 2, 2, 0},
    {"depthwise 3x3", 2, 10, 9, 12, 12, 3, 3, 0, 0, 1, 1, 0, 0, 12},
    {"depthwise 5x5 stride 2", 1, 11, 11, 16, 16, 5, 5, 2, 2, 2, 2, 0, 0, 16},
    {"groups 2, 5x3 stride 1x2", 3, 11, 12, 6, 4, 5, 3, 1, 2, 2, 1, 0, 0, 2},
    {"groups 4 of 8 channels", 1, 6, 7, 32, 32, 3, 3, 0, 0, 1, 1, 0, 0, 4},
    {"7x7 stride 2 pad 3 stem", 1, 15, 15, 3, 8, 7, 7, 2, 2, 3, 3, 0, 0, 0},
    {"3x3 long window c 130", 1, 6, 5, 130, 5, 3, 3, 0, 0, 1, 1, 0, 0, 0},
    {"no padding, filter = input", 3, 4, 5, 7, 6, 4, 5, 0, 0, 0, 0, 0, 0, 0},
};

static inline weft_conv2d_desc cv_desc(const cv_case *c, weft_dtype t, weft_conv_act act)
{
    weft_conv2d_desc d = {.n = c->n,
                          .h = c->h,
                          .w = c->w,
                          .c = c->c,
                          .k = c->k,
                          .r = c->r,
                          .s = c->s,
                          .stride_h = c->sh,
                          .stride_w = c->sw,
                          .pad_h = c->ph,
                          .pad_w = c->pw,
                          .dilation_h = c->dh,
                          .dilation_w = c->dw,
                          .groups = c->groups,
                          .dtype = t,
                          .act = act};
    return d;
}

static inline const char *cv_type_name(weft_dtype t)
{
    return t == WEFT_DTYPE_BF16 ? "bf16" : t == WEFT_DTYPE_F16 ? "fp16" : "fp32";
}

#endif
