/*
 * sample_ref.h - what weft_sample's host and GPU tests share: rows of
 * random logits (argmax_ref.h's generator), the distribution a row's
 * params define, worked out independently in double (sort by value, lower
 * index first on ties, NaN last; top_k; then the fewest whose mass
 * reaches top_p), and the check that many draws follow it.
 */
#ifndef WEFT_TEST_SAMPLE_REF_H
#define WEFT_TEST_SAMPLE_REF_H

#include "ops/argmax_ref.h"

typedef struct sr_dist {
    size_t n;       /* tokens kept */
    int32_t *id;    /* in order */
    double *p;      /* their probabilities */
    double *cum;    /* the mass of the first i + 1 before top_p's cut (for margins) */
    double *weight; /* scratch: every token's */
} sr_dist;

static const float *sr_sort_row;

static int sr_by_value(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    float va = sr_sort_row[a], vb = sr_sort_row[b];
    if (isnan(va) != isnan(vb))
        return isnan(va) ? 1 : -1;
    if (!isnan(va) && va != vb)
        return va < vb ? 1 : -1;
    return a < b ? -1 : 1;
}

/* The distribution of a row (cols values as fp32) under p; returns the
 * distance of top_p from the nearest cumulative mass (a margin: a case
 * nearer than rounding is not a fair test). */
static inline double sr_distribution(const float *row, size_t cols, const weft_sampling *p,
                                     sr_dist *d)
{
    d->id = malloc(cols * sizeof *d->id), d->p = malloc(cols * sizeof *d->p);
    d->cum = malloc(cols * sizeof *d->cum), d->weight = malloc(cols * sizeof *d->weight);
    if (!d->id || !d->p || !d->cum || !d->weight)
        abort();
    for (size_t j = 0; j < cols; j++)
        d->id[j] = (int32_t)j;
    sr_sort_row = row;
    qsort(d->id, cols, sizeof *d->id, sr_by_value);
    size_t n = p->top_k > 0 && (size_t)p->top_k < cols ? (size_t)p->top_k : cols;
    double top = row[d->id[0]], sum = 0, margin = 1;
    for (size_t i = 0; i < n; i++) {
        float v = row[d->id[i]];
        sum += d->weight[i] = isnan(v) ? 0 : exp(((double)v - top) / p->temperature);
    }
    double acc = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; i++) {
        d->cum[i] = (acc += d->weight[i]) / sum;
        if (p->top_p > 0 && p->top_p < 1) {
            margin = fmin(margin, fabs(d->cum[i] - p->top_p));
            if (keep == n && d->cum[i] >= p->top_p)
                keep = i + 1;
        }
    }
    double kept = 0;
    for (size_t i = 0; i < keep; i++)
        kept += d->weight[i];
    for (size_t i = 0; i < keep; i++)
        d->p[i] = d->weight[i] / kept;
    d->n = keep;
    return margin;
}

static inline void sr_free(sr_dist *d)
{
    free(d->id), free(d->p), free(d->cum), free(d->weight);
}

/* Whether draws (count of them) follow d: every one a kept token, and each
 * kept token's count within five standard deviations (and 3) of its
 * expectation. The first disagreement in *why. */
static inline int sr_follows(const sr_dist *d, const int32_t *draws, size_t count, size_t cols,
                             char *why, size_t why_size)
{
    size_t *seen = calloc(cols, sizeof *seen);
    double *p = calloc(cols, sizeof *p);
    int ok = 1;
    if (!seen || !p)
        abort();
    for (size_t i = 0; i < d->n; i++)
        p[d->id[i]] = d->p[i] > 0 ? d->p[i] : -1; /* -1: kept, never drawn */
    for (size_t i = 0; i < count && ok; i++) {
        if (draws[i] < 0 || (size_t)draws[i] >= cols || p[draws[i]] == 0) {
            snprintf(why, why_size, "draw %zu is %d, not a kept token", i, draws[i]);
            ok = 0;
        } else {
            seen[draws[i]]++;
        }
    }
    for (size_t j = 0; j < cols && ok; j++) {
        double q = p[j] > 0 ? p[j] : 0, want = q * (double)count;
        double slack = 5 * sqrt(want * (1 - q)) + 3;
        if (fabs((double)seen[j] - want) > slack) {
            snprintf(why, why_size, "token %zu drawn %zu times of %zu, expected %.1f (p %.4g)", j,
                     seen[j], count, want, q);
            ok = 0;
        }
    }
    free(seen), free(p);
    return ok;
}

#endif
