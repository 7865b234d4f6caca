/*
 * quantize_ref.h - what weft_quantize_fp8's host and GPU tests share: rows
 * of fresh random values whose magnitudes span the types' range (a row of
 * zeros, of subnormal fp32 values, with NaN, with an infinity planted
 * among them), padding that must never be read (a huge value, which would
 * change the row's scale), and a reference of its own: the scale worked
 * out from the row as read, and each element's FP8 code found by trying
 * every code (the nearest value, a tie to the even code, saturating at the
 * largest), not by the library's conversion.
 */
#ifndef WEFT_TEST_QUANTIZE_REF_H
#define WEFT_TEST_QUANTIZE_REF_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/argmax_ref.h" /* am_next, am_setup: the seed */
#include "ops/ops_internal.h"
#include "weft.h"
#include "weft/ops.h"

typedef enum qz_kind {
    QZ_RANDOM, /* normal values times 10^e, e per row, within the input type's range */
    QZ_ZEROS,  /* +0 and -0 only */
    QZ_TINY,   /* fp32 subnormals: amax / F under FLT_MIN */
    QZ_NAN,    /* random, a few NaN */
    QZ_INF,    /* random, one infinity */
    QZ_KINDS
} qz_kind;

static const char *const qz_kind_names[QZ_KINDS] = {"random", "zeros", "tiny", "nan", "inf"};

/* A uniform double in [0, 1) and a normal one (Box-Muller). */
static inline double qz_uniform(void)
{
    return (double)(am_next() >> 11) * 0x1p-53;
}

static inline double qz_normal(void)
{
    double u = qz_uniform() + 0x1p-60, v = qz_uniform();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* rows x cols values of type t, rows stride apart, padding 1e30 (fp32) or
 * the type's largest: read, it would move the scale. */
static inline void *qz_rows(weft_dtype t, size_t rows, size_t cols, size_t stride, qz_kind kind)
{
    size_t n = (rows - 1) * stride + cols + 16;
    void *p = malloc(n * weft__dtype_size(t));
    if (!p)
        return NULL;
    float pad = t == WEFT_DTYPE_F32 ? 1e30f : t == WEFT_DTYPE_F16 ? 65504.0f : 1e30f;
    for (size_t i = 0; i < n; i++)
        weft__store(t, p, i, pad);
    int top = t == WEFT_DTYPE_F16 ? 3 : 30; /* fp16 holds 6 x 10^4, bf16 and fp32 10^38 */
    for (size_t r = 0; r < rows; r++) {
        double mag = pow(10.0, (double)((int)(am_next() % (uint64_t)(2 * top + 1)) - top));
        size_t special = (size_t)(am_next() % cols);
        for (size_t j = 0; j < cols; j++) {
            double v = qz_normal() * mag;
            if (kind == QZ_ZEROS)
                v = am_next() & 1 ? 0.0 : -0.0;
            else if (kind == QZ_TINY)
                v = (double)((int)(am_next() % 201) - 100) * 0x1p-140;
            else if (kind == QZ_NAN && (j == special || am_next() % 10 == 0))
                v = NAN;
            else if (kind == QZ_INF && j == special)
                v = am_next() & 1 ? INFINITY : -INFINITY;
            weft__store(t, p, r * stride + j, (float)v);
        }
    }
    return p;
}

/* The FP8 value of a code of type t, decoded here. */
static inline double qz_decode(weft_dtype t, unsigned code)
{
    int e4 = t == WEFT_DTYPE_F8_E4M3, mb = e4 ? 3 : 2, bias = e4 ? 7 : 15;
    int e = (int)(code & 0x7f) >> mb, m = (int)code & ((1 << mb) - 1);
    double v = e ? ldexp(1.0 + m / (double)(1 << mb), e - bias) : ldexp(m, 1 - bias - mb);
    return code & 0x80 ? -v : v;
}

/* The code fp8(x): the finite code nearest |x| (a tie to the even code),
 * the largest past it, x's sign; NaN: any NaN code (-1 here). The
 * positive codes' values rise with the code, so a bisection finds the two
 * around |x|. */
static inline int qz_code(weft_dtype t, float x)
{
    int e4 = t == WEFT_DTYPE_F8_E4M3;
    unsigned largest = e4 ? 0x7e : 0x7b, best;
    if (isnan(x))
        return -1;
    double a = fabs((double)x);
    if (a >= qz_decode(t, largest)) {
        best = largest;
    } else {
        unsigned lo = 0, hi = largest; /* decode(lo) <= a < decode(hi) */
        while (hi - lo > 1) {
            unsigned mid = (lo + hi) / 2;
            *(qz_decode(t, mid) <= a ? &lo : &hi) = mid;
        }
        double dl = a - qz_decode(t, lo), dh = qz_decode(t, hi) - a;
        best = dl < dh || (dl == dh && (lo & 1) == 0) ? lo : hi;
    }
    return (int)(best | (signbit(x) ? 0x80u : 0u));
}

/* Whether the code is a NaN of type t. */
static inline int qz_is_nan(weft_dtype t, uint8_t b)
{
    return t == WEFT_DTYPE_F8_E4M3 ? (b & 0x7f) == 0x7f : (b & 0x7f) > 0x7c;
}

/* Row r's scale as the op defines it, from the row as stored. */
static inline float qz_scale(weft_dtype out_type, weft_dtype in_type, const void *in, size_t r,
                             size_t cols, size_t stride)
{
    float amax = 0.0f;
    for (size_t j = 0; j < cols; j++) {
        float v = fabsf(weft__load(in_type, in, r * stride + j));
        if (v > amax) /* NaN never is */
            amax = v;
    }
    float q = amax / (out_type == WEFT_DTYPE_F8_E4M3 ? 448.0f : 57344.0f);
    return q > FLT_MIN ? q : FLT_MIN;
}

/* Checks rows' output and scales against the reference; prints the first
 * difference and returns 1 when there is one. */
static inline int qz_check(const char *what, weft_dtype out_type, weft_dtype in_type,
                           const void *in, const uint8_t *out, const float *scales, size_t rows,
                           size_t cols, size_t in_stride, size_t out_stride)
{
    for (size_t r = 0; r < rows; r++) {
        float s = qz_scale(out_type, in_type, in, r, cols, in_stride);
        if (memcmp(&s, &scales[r], sizeof s)) {
            printf("  %s: row %zu: scale %g, not %g\n", what, r, scales[r], s);
            return 1;
        }
        for (size_t j = 0; j < cols; j++) {
            float x = weft__load(in_type, in, r * in_stride + j) / s;
            int want = qz_code(out_type, x);
            uint8_t got = out[r * out_stride + j];
            if (want < 0 ? !qz_is_nan(out_type, got) : got != (uint8_t)want) {
                printf("  %s: row %zu col %zu: %g / %g = %g gave code 0x%02x, not 0x%02x\n", what,
                       r, j, weft__load(in_type, in, r * in_stride + j), s, x, got, want);
                return 1;
            }
        }
    }
    return 0;
}

/* On a task's stream: a softmax writes in (4 rows of 100 fp32), the
 * quantization reads it after it in stream order. */
typedef struct qz_chain {
    float *in, *scales;
    uint8_t *out;
    int rc;
} qz_chain;

static inline void *qz_chain_task(void *arg)
{
    qz_chain *c = (qz_chain *)arg;
    c->rc = weft_softmax(WEFT_TASK_STREAM, WEFT_DTYPE_F32, c->in, c->in, 4, 100, 100, NULL);
    if (c->rc == WEFT_OK)
        c->rc = weft_quantize_fp8(WEFT_TASK_STREAM, WEFT_DTYPE_F8_E4M3, c->out, c->scales,
                                  WEFT_DTYPE_F32, c->in, 4, 100, 100, 100);
    if (c->rc == WEFT_OK)
        c->rc = weft_await();
    return NULL;
}

#endif
