/*
 * rmsnorm_fp8_ref.h - what weft_rmsnorm_fp8's host and GPU tests share:
 * the calls' inputs as fresh random rows (magnitudes from 10^-3 to 10^3 a
 * row; rows of zeros, with a NaN, with an infinity), padding that must
 * never be read (a huge value, which would change a row's sum of squares
 * and its scale), the buffers each call writes poisoned beforehand, and
 * the comparison of two calls' bytes: out with its padding, the scales,
 * sum_out with its padding.
 */
#ifndef WEFT_TEST_RMSNORM_FP8_REF_H
#define WEFT_TEST_RMSNORM_FP8_REF_H

#include "ops/quantize_ref.h" /* am_next, qz_normal, qz_check: the seed, a quantizer */

/* What a row holds. */
typedef enum rf_kind {
    RF_RANDOM, /* normal values times 10^e, e per row in [-3, 3] */
    RF_ZEROS,  /* s = 0: in and the residual +0 and -0 */
    RF_NAN,    /* random, one NaN in in */
    RF_INF,    /* random, one infinity in in */
    RF_MIXED,  /* row r as kind r % 4 of the four above */
    RF_KINDS
} rf_kind;

static const char *const rf_kind_names[RF_KINDS] = {"random", "zeros", "nan", "inf", "mixed"};

/* The optional inputs a case gives. */
enum { RF_WEIGHT = 1, RF_RESIDUAL = 2, RF_SUM = 4, RF_WITH = 8 };

typedef struct rf_case {
    weft_dtype dt, ot;
    size_t rows, cols, stride, out_stride;
    unsigned with; /* RF_WEIGHT | RF_RESIDUAL | RF_SUM */
    rf_kind kind;
} rf_case;

/* A case's host inputs: in and residual rows x stride, weight cols, each
 * with RF_TAIL elements after it, every element outside the rows the
 * padding value. */
typedef struct rf_inputs {
    void *in, *residual, *weight;
    size_t n;  /* elements of in and residual, tail included */
    size_t es; /* bytes an element */
} rf_inputs;

enum { RF_TAIL = 16 };

static inline const char *rf_dtype_name(weft_dtype t)
{
    return t == WEFT_DTYPE_F32 ? "f32" : t == WEFT_DTYPE_BF16 ? "bf16" : "f16";
}

static inline void rf_describe(const rf_case *c, char *buf, size_t size)
{
    snprintf(buf, size, "%s -> %s %zux%zu strides %zu/%zu%s%s%s %s", rf_dtype_name(c->dt),
             c->ot == WEFT_DTYPE_F8_E4M3 ? "e4m3" : "e5m2", c->rows, c->cols, c->stride,
             c->out_stride, c->with & RF_WEIGHT ? " weight" : "",
             c->with & RF_RESIDUAL ? " residual" : "", c->with & RF_SUM ? " sum_out" : "",
             rf_kind_names[c->kind]);
}

/* Read, it would move a row's statistics: fp16's largest, else 1e30. */
static inline float rf_pad(weft_dtype t)
{
    return t == WEFT_DTYPE_F16 ? 65504.0f : 1e30f;
}

static inline void *rf_alloc_padded(weft_dtype t, size_t n)
{
    void *p = malloc(n * weft__dtype_size(t));
    if (p)
        for (size_t i = 0; i < n; i++)
            weft__store(t, p, i, rf_pad(t));
    return p;
}

/* Fresh inputs for case c (free with rf_free). */
static inline rf_inputs rf_make(const rf_case *c)
{
    rf_inputs x = {NULL, NULL, NULL, (c->rows - 1) * c->stride + c->cols + RF_TAIL,
                   weft__dtype_size(c->dt)};
    x.in = rf_alloc_padded(c->dt, x.n);
    x.residual = rf_alloc_padded(c->dt, x.n);
    x.weight = rf_alloc_padded(c->dt, c->cols + RF_TAIL);
    if (!x.in || !x.residual || !x.weight)
        return x;
    for (size_t j = 0; j < c->cols; j++) /* around 1, either sign */
        weft__store(c->dt, x.weight, j, (float)(qz_normal() * 0.5 + (am_next() & 1 ? 1 : -1)));
    for (size_t r = 0; r < c->rows; r++) {
        rf_kind kind = c->kind == RF_MIXED ? (rf_kind)(r % 4) : c->kind;
        double mag = pow(10.0, (double)((int)(am_next() % 7) - 3));
        size_t special = (size_t)(am_next() % c->cols);
        for (size_t j = 0; j < c->cols; j++) {
            size_t i = r * c->stride + j;
            double v = qz_normal() * mag, res = qz_normal() * mag * 0.25;
            if (kind == RF_ZEROS)
                v = am_next() & 1 ? 0.0 : -0.0, res = am_next() & 1 ? 0.0 : -0.0;
            else if (kind == RF_NAN && j == special)
                v = NAN;
            else if (kind == RF_INF && j == special)
                v = am_next() & 1 ? INFINITY : -INFINITY;
            weft__store(c->dt, x.in, i, (float)v);
            weft__store(c->dt, x.residual, i, (float)res);
        }
    }
    return x;
}

static inline void rf_free(rf_inputs *x)
{
    free(x->in), free(x->residual), free(x->weight);
    x->in = x->residual = x->weight = NULL;
}

/* The outputs of one call: out (rows x out_stride codes and RF_TAIL
 * more), scales, sum_out (as in), and the pair's tmp (as in). */
typedef struct rf_outputs {
    uint8_t *out;
    float *scales;
    void *sum, *tmp;
    size_t out_bytes, scale_bytes, sum_bytes;
} rf_outputs;

enum { RF_POISON = 0xa7 };

/* Host buffers for case c's outputs, poisoned: every byte RF_POISON. */
static inline rf_outputs rf_outputs_new(const rf_case *c)
{
    rf_outputs o;
    o.out_bytes = (c->rows - 1) * c->out_stride + c->cols + RF_TAIL;
    o.scale_bytes = c->rows * sizeof(float);
    o.sum_bytes = ((c->rows - 1) * c->stride + c->cols + RF_TAIL) * weft__dtype_size(c->dt);
    o.out = malloc(o.out_bytes);
    o.scales = malloc(o.scale_bytes);
    o.sum = malloc(o.sum_bytes);
    o.tmp = malloc(o.sum_bytes);
    if (o.out && o.scales && o.sum && o.tmp) {
        memset(o.out, RF_POISON, o.out_bytes);
        memset(o.scales, RF_POISON, o.scale_bytes);
        memset(o.sum, RF_POISON, o.sum_bytes);
        memset(o.tmp, RF_POISON, o.sum_bytes);
    }
    return o;
}

static inline void rf_outputs_free(rf_outputs *o)
{
    free(o->out), free(o->scales), free(o->sum), free(o->tmp);
    o->out = NULL, o->scales = NULL, o->sum = o->tmp = NULL;
}

/* Case c's call of the op on stream with the given buffers (host or
 * device alike). */
static inline int rf_call(void *stream, const rf_case *c, uint8_t *out, float *scales, void *sum,
                          const void *in, const void *residual, const void *weight)
{
    return weft_rmsnorm_fp8(stream, c->dt, c->ot, out, scales, c->with & RF_SUM ? sum : NULL, in,
                            c->with & RF_RESIDUAL ? residual : NULL,
                            c->with & RF_WEIGHT ? weight : NULL, 1e-5f, c->rows, c->cols, c->stride,
                            c->out_stride);
}

/* The two calls it stands for: weft_rmsnorm into tmp, then
 * weft_quantize_fp8 of tmp. */
static inline int rf_pair(void *stream, const rf_case *c, uint8_t *out, float *scales, void *sum,
                          void *tmp, const void *in, const void *residual, const void *weight)
{
    int rc = weft_rmsnorm(stream, c->dt, tmp, c->with & RF_SUM ? sum : NULL, in,
                          c->with & RF_RESIDUAL ? residual : NULL,
                          c->with & RF_WEIGHT ? weight : NULL, 1e-5f, c->rows, c->cols, c->stride);
    if (rc == WEFT_OK)
        rc = weft_quantize_fp8(stream, c->ot, out, scales, c->dt, tmp, c->rows, c->cols, c->stride,
                               c->out_stride);
    return rc;
}

/* Whether got's bytes are want's (out with its padding and tail, scales,
 * sum_out with its padding and tail); prints the first difference. */
static inline int rf_same_bytes(const char *what, const rf_case *c, const rf_outputs *got,
                                const rf_outputs *want)
{
    for (size_t i = 0; i < got->out_bytes; i++) {
        if (got->out[i] != want->out[i]) {
            size_t r = i / c->out_stride, j = i % c->out_stride;
            printf("  %s: out byte %zu (row %zu col %zu%s): 0x%02x, not 0x%02x\n", what, i, r, j,
                   j >= c->cols || r >= c->rows ? ", padding" : "", got->out[i], want->out[i]);
            return 0;
        }
    }
    for (size_t r = 0; r < c->rows; r++) {
        if (memcmp(&got->scales[r], &want->scales[r], sizeof(float))) {
            printf("  %s: row %zu: scale %a, not %a\n", what, r, got->scales[r], want->scales[r]);
            return 0;
        }
    }
    if (memcmp(got->sum, want->sum, got->sum_bytes)) {
        printf("  %s: sum_out differs\n", what);
        return 0;
    }
    return 1;
}

#endif
