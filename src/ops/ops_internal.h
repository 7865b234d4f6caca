/*
 * ops_internal.h - what the operator families share: element conversion,
 * the dropout generator, fp32 math and argument checks.
 *
 * Conversions round to nearest, ties to even, and keep NaN a NaN (quiet)
 * and subnormals exact, so that a host result rounded here equals the
 * kernels' __float2bfloat16_rn / __float2half_rn of the same fp32 value.
 *
 * Transcendentals are computed in double with libm and rounded once to
 * fp32.
 *
 * Each family's arguments travel in one struct (weft__*_args) from its
 * checks to the host reference or, with a stream, to its CUDA launcher
 * (in the family's .cu file), so both sides read the same checked values.
 * This header is C and C++: the kernels' files include it too.
 */
#ifndef WEFT_OPS_INTERNAL_H
#define WEFT_OPS_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "weft/ops.h"

#include "ops/rope_freq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element conversion ---------------------------------------------- */

static inline uint32_t weft__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float weft__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float weft__bf16_to_f32(uint16_t h)
{
    return weft__f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t weft__f32_to_bf16(float f)
{
    uint32_t u = weft__f32_bits(f);

    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* carries into the exponent, up to Inf */
    return (uint16_t)(u >> 16);
}

static inline float weft__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;

    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return weft__f32_from_bits(sign | 0x7f800000u | (man << 13));
    return weft__f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t weft__f32_to_f16(float f)
{
    uint32_t u = weft__f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t ax = u & 0x7fffffffu;

    if (ax > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 (including Inf) rounds to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal: rebias, round off 13 bits */
        uint32_t h = (ax >> 13) - (112u << 10), rem = ax & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++; /* a mantissa carry moves into the exponent, as it should */
        return (uint16_t)(sign | h);
    }
    /* subnormal (or zero): value = m * 2^(e-150), in units of 2^-24 */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    if (shift > 24u)
        return sign;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

/* FP8 (OCP): E4M3 has 3 mantissa bits, bias 7, no Inf and NaN at
 * S.1111.111; E5M2 has 2, bias 15 and binary16's Inf and NaN. Decoding is
 * exact in fp32. */
static inline float weft__f8_to_f32(weft_dtype t, uint8_t b)
{
    int e4 = t == WEFT_DTYPE_F8_E4M3;
    int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15, emax = e4 ? 15 : 31;
    int e = (b & 0x7f) >> mbits, m = b & ((1 << mbits) - 1);
    float sign = b & 0x80 ? -1.0f : 1.0f;
    if (e4 && e == emax && m == (1 << mbits) - 1)
        return NAN;
    if (!e4 && e == emax)
        return m ? NAN : sign * INFINITY;
    if (e == 0) /* subnormal: m 2^(1 - bias - mbits) */
        return sign * ldexpf((float)m, 1 - bias - mbits);
    return sign * ldexpf((float)((1 << mbits) + m), e - bias - mbits);
}

/* f rounded to FP8, to nearest even, saturating to the largest finite
 * value (448 for E4M3, 57344 for E5M2, Inf too) as the GPU's .satfinite
 * conversion does; NaN stays NaN. */
static inline uint8_t weft__f32_to_f8(weft_dtype t, float f)
{
    int e4 = t == WEFT_DTYPE_F8_E4M3;
    int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15;
    uint8_t sign = signbit(f) ? 0x80 : 0, max_code = e4 ? 0x7e : 0x7b;
    if (isnan(f))
        return (uint8_t)(sign | 0x7f);
    float a = fabsf(f);
    if (a >= weft__f8_to_f32(t, max_code))
        return (uint8_t)(sign | max_code);
    int e = 0;     /* frexpf leaves it unset for infinities, which the max_code test has taken */
    frexpf(a, &e); /* a = frac 2^e, frac in [0.5, 1) */
    e -= 1;        /* a in [2^e, 2^(e+1)) */
    if (a == 0.0f || e < 1 - bias) /* subnormal steps reach the first normal: code = steps */
        return (uint8_t)(sign | (uint8_t)rintf(ldexpf(a, bias - 1 + mbits)));
    unsigned q = (unsigned)rintf(ldexpf(a, mbits - e)); /* in [2^mbits, 2^(mbits+1)] */
    unsigned code = ((unsigned)(e + bias) << mbits) + (q - (1u << mbits)); /* a carry bumps e */
    return (uint8_t)(sign | (code > max_code ? max_code : code));
}

static inline int weft__is_f8(weft_dtype dtype)
{
    return dtype == WEFT_DTYPE_F8_E4M3 || dtype == WEFT_DTYPE_F8_E5M2;
}

static inline size_t weft__dtype_size(weft_dtype dtype)
{
    switch (dtype) {
    case WEFT_DTYPE_BF16:
    case WEFT_DTYPE_F16:
        return 2;
    case WEFT_DTYPE_F8_E4M3:
    case WEFT_DTYPE_F8_E5M2:
    case WEFT_DTYPE_I8:
        return 1;
    default: /* fp32, int32 */
        return 4;
    }
}

/* Element i of a dtype array, as fp32. */
static inline float weft__load(weft_dtype dtype, const void *p, size_t i)
{
    switch (dtype) {
    case WEFT_DTYPE_BF16:
        return weft__bf16_to_f32(((const uint16_t *)p)[i]);
    case WEFT_DTYPE_F16:
        return weft__f16_to_f32(((const uint16_t *)p)[i]);
    case WEFT_DTYPE_F8_E4M3:
    case WEFT_DTYPE_F8_E5M2:
        return weft__f8_to_f32(dtype, ((const uint8_t *)p)[i]);
    case WEFT_DTYPE_I8:
        return (float)((const int8_t *)p)[i];
    case WEFT_DTYPE_I32:
        return (float)((const int32_t *)p)[i];
    default:
        return ((const float *)p)[i];
    }
}

/* Element i of a dtype array := v, rounded to the dtype. */
static inline void weft__store(weft_dtype dtype, void *p, size_t i, float v)
{
    switch (dtype) {
    case WEFT_DTYPE_BF16:
        ((uint16_t *)p)[i] = weft__f32_to_bf16(v);
        break;
    case WEFT_DTYPE_F16:
        ((uint16_t *)p)[i] = weft__f32_to_f16(v);
        break;
    case WEFT_DTYPE_F8_E4M3:
    case WEFT_DTYPE_F8_E5M2:
        ((uint8_t *)p)[i] = weft__f32_to_f8(dtype, v);
        break;
    default: /* fp32; the integer types are written as integers, never from here */
        ((float *)p)[i] = v;
        break;
    }
}

/* v rounded to the dtype and back: what storing then loading gives. */
static inline float weft__round_to(weft_dtype dtype, float v)
{
    switch (dtype) {
    case WEFT_DTYPE_BF16:
        return weft__bf16_to_f32(weft__f32_to_bf16(v));
    case WEFT_DTYPE_F16:
        return weft__f16_to_f32(weft__f32_to_f16(v));
    default:
        return v;
    }
}

/* ---- Philox4x32-10 (Salmon et al., SC'11) ---------------------------- */

/* The four 32-bit words for counter ctr under key key; the same inputs
 * always give the same words, which is what makes dropout replayable. */
void weft__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Whether dropout keeps logical element e (see weft_softmax_opts). */
int weft__dropout_keep(uint64_t seed, uint64_t offset, uint64_t e, float p);

/* ---- fp32 math ------------------------------------------------------------ */

/* Computed in double and rounded once to fp32, so the result does not
 * depend on the float variants of libm. */
static inline float weft__expf(float x)
{
    return (float)exp((double)x);
}

/* sin and cos of an angle given in double, each rounded to fp32. */
static inline void weft__sincos(double a, float *s, float *c)
{
    *s = (float)sin(a);
    *c = (float)cos(a);
}

/* GELU of the given form; GELU(-Inf) = -0, GELU(+Inf) = +Inf
 * (activation.c). */
float weft__gelu(weft_gelu_form form, float x);
/* SiLU(x) = x / (1 + exp(-x)); SiLU(-Inf) = -0. */
float weft__silu(float x);

/* ---- argument checks ------------------------------------------------- */
/* Each returns WEFT_OK, or WEFT_EINVAL with "op: ..." recorded. */

int weft__check_dtype(const char *op, weft_dtype dtype);
/* rows >= 1, cols >= 1, stride >= cols, and (rows-1)*stride + cols
 * elements addressable. */
int weft__check_rows(const char *op, const char *what, size_t rows, size_t cols, size_t stride,
                     weft_dtype dtype);
/* p non-NULL (unless optional) and aligned to the element size. */
int weft__check_ptr(const char *op, const char *name, const void *p, int optional,
                    weft_dtype dtype);
/* WEFT_OK when stream is NULL or WEFT_TASK_STREAM, or the library has its
 * kernels; without CUDA a stream is refused ("built without CUDA"). */
int weft__check_stream(const char *op, void *stream);

/* WEFT_TASK_STREAM for op, once its arguments are checked: with a CUDA
 * stream leased by the calling task, that stream in *stream and
 * WEFT__ON_STREAM (the caller launches on it); on the host backend,
 * host(args) enqueued in the task's stream order (args, size bytes, are
 * copied) and WEFT_OK; outside a task WEFT_ENOTASK. */
enum { WEFT__ON_STREAM = 1 };
int weft__task_stream_op(const char *op, void **stream, void (*host)(const void *args),
                         const void *args, size_t size);
/* Its two halves, for ops that take memory for the host reference at the
 * call: weft__op_task_stream gives WEFT__ON_STREAM with the task's CUDA
 * stream in *stream, or WEFT_OK with *stream NULL on the host backend (or
 * an error naming op); weft__op_enqueue_host enqueues host(args) in the
 * task's stream order on a copy of args. */
int weft__op_task_stream(const char *op, void **stream);
int weft__op_enqueue_host(const char *op, void (*host)(const void *args), const void *args,
                          size_t size);
/* weft__task_stream_op for an op whose host reference takes memory at the
 * call: on the host backend prepare(args) takes it (into *ws, a field of
 * args, which host frees once it has run) before host(args) is enqueued;
 * freed here when the enqueue fails. */
int weft__task_stream_op_ws(const char *op, void **stream, int (*prepare)(void *args),
                            void (*host)(const void *args), void *args, size_t size, void **ws);

/* Sums of many fp32 terms: terms go into blocks of WEFT__SUM_BLOCK, block
 * sums into a total, which keeps the rounding error near that of a tree
 * reduction (as the kernels do) instead of growing with the row length. */
enum { WEFT__SUM_BLOCK = 256 };

typedef struct weft__sum {
    float total, block;
    size_t n;
} weft__sum;

static inline void weft__sum_add(weft__sum *s, float v)
{
    s->block += v;
    if (++s->n % WEFT__SUM_BLOCK == 0) {
        s->total += s->block;
        s->block = 0.0f;
    }
}

static inline float weft__sum_get(const weft__sum *s)
{
    return s->total + s->block;
}

/* ---- arguments of each family, checked --------------------------------- */

typedef struct weft__gelu_args {
    weft_dtype dtype;
    weft_gelu_form form;
    void *out;
    const void *in, *bias, *residual;
    size_t rows, cols, stride;
} weft__gelu_args;

/* LayerNorm, RMSNorm and bias+GELU+residual+LayerNorm: the row sum s is
 *   gelu == 0:  in + residual
 *   gelu != 0:  GELU(in + gelu_bias) + residual
 * rounded to the dtype, then normalized (centred unless rms). With fp8
 * (RMSNorm only: weft_rmsnorm_fp8), out is out_type's, rows out_stride
 * apart: the normalized row rounded to the dtype, quantized with a scale
 * a row into scales. */
typedef struct weft__norm_args {
    weft_dtype dtype;
    int rms, gelu, fp8;
    weft_gelu_form form;
    void *out, *sum_out;
    const void *in, *gelu_bias, *residual, *weight, *bias;
    float eps;
    size_t rows, cols, stride;
    weft_dtype out_type;
    float *scales;
    size_t out_stride;
} weft__norm_args;

typedef struct weft__softmax_args {
    weft_dtype dtype;
    void *out;
    const void *in;
    size_t rows, cols, stride;
    weft_softmax_opts o; /* scale 0 already replaced by 1 */
} weft__softmax_args;

/* base and scaling checked as weft_rope_scaled checks them (WEFT_EINVAL
 * naming op) and resolved into *freq for head_dim (rope.c). */
int weft__rope_freq_resolve(const char *op, float base, const weft_rope_llama3 *scaling,
                            size_t head_dim, weft__rope_freq *freq);

typedef struct weft__rope_args {
    weft_dtype dtype;
    weft_rope_layout layout;
    void *q, *k;
    size_t q_heads, q_stride, k_heads, k_stride, tokens, head_dim;
    const int32_t *positions;
    weft__rope_freq freq; /* base, head_dim and the scaling (rope_freq.h) */
} weft__rope_args;

typedef struct weft__glu_args {
    weft_dtype dtype;
    weft_glu_kind kind;
    void *out;
    const void *in;
    size_t rows, cols, in_stride, out_stride;
} weft__glu_args;

#ifdef WEFT_HAVE_CUDA
/* The kernels (the src/ops .cu files): each enqueues its family's work on stream
 * (a cudaStream_t) and returns WEFT_OK, or the launch's error with CUDA's
 * error name in the message. The arguments have been checked. */
int weft__gelu_cuda(void *stream, const weft__gelu_args *a);
int weft__norm_cuda(void *stream, const char *op, const weft__norm_args *a);
int weft__softmax_cuda(void *stream, const weft__softmax_args *a);
int weft__rope_cuda(void *stream, const weft__rope_args *a);
int weft__glu_cuda(void *stream, const weft__glu_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif
