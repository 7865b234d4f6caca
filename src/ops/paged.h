/*
 * paged.h - the paged KV cache's calls between their checks (paged.c),
 * the host reference (paged_host.c) and the kernels (paged.cu): the
 * checked arguments, and the rule that sizes a decode's split, which the
 * workspace query and the launch must share.
 *
 * C and C++: the kernels' file includes it too.
 */
#ifndef WEFT_OPS_PAGED_H
#define WEFT_OPS_PAGED_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/rope_freq.h"
#include "weft/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- FP8 E4M3 pools ---------------------------------------------------- */

/* The value of an E4M3 byte: sign, 4 exponent bits (bias 7), 3 mantissa
 * bits; exponent 0 is subnormal (m 2^-9); S.1111.111 is NaN. Exact in
 * fp32. */
static inline float weft__e4m3_to_f32(uint8_t b)
{
    int e = (b >> 3) & 0xf, m = b & 7;
    float v;

    if (e == 15 && m == 7)
        return NAN;
    v = e == 0 ? (float)m * 0x1p-9f : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return b & 0x80 ? -v : v;
}

/* x rounded to E4M3, to nearest even, saturating: magnitudes past 448
 * (infinities too) give +-448; NaN gives 0x7f (the kernels' conversion
 * keeps no NaN sign). */
static inline uint8_t weft__f32_to_e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    int e;

    if (isnan(x))
        return 0x7f;
    if (a >= 448.0)
        return (uint8_t)(sign | 0x7e);
    if (a < 0x1p-6) { /* subnormal: steps of 2^-9; 8 steps is the smallest normal */
        double q = nearbyint(a * 0x1p9);
        return (uint8_t)(sign | (uint8_t)q);
    }
    frexp(a, &e);                              /* a = f 2^e, f in [0.5, 1): exponent e - 1 */
    double q = nearbyint(ldexp(a, 4 - e)) - 8; /* mantissa steps of 1/8 above 1 */
    int be = e - 1 + 7;
    if (q >= 8) /* rounded up to the next power of two */
        q -= 8, be++;
    if (be > 15 || (be == 15 && q > 6))
        return (uint8_t)(sign | 0x7e);
    return (uint8_t)(sign | (be << 3) | (int)q);
}

/* Bytes of one pool element. */
static inline size_t weft__kv_esize(const weft_kv_cache *c)
{
    return c->format == WEFT_KV_FP8_E4M3 ? 1 : 2;
}

/* The most parts a sequence's keys are split into, and the fewest keys a
 * part the call's own choice gives one (a part has a fixed cost: its
 * query load, its partial result's write and merge). */
enum { WEFT__DECODE_MAX_SPLITS = 64, WEFT__DECODE_SPLIT_KEYS = 256 };

typedef struct weft__kv_append_args {
    weft_kv_cache c;
    const void *k, *v;
    size_t k_stride, v_stride, tokens;
    const int32_t *seq_ids, *positions;
    int rope; /* rotate K by layout and freq */
    weft_rope_layout layout;
    weft__rope_freq freq;
} weft__kv_append_args;

typedef struct weft__decode_args {
    weft_kv_cache c;
    size_t q_len, heads, window, max_seq_len;
    size_t q_stride; /* resolved: elements between q's rows */
    float scale;     /* resolved: 0 replaced by 1 / sqrt(head_dim) */
    /* the split: 1 = none; else the most parts (the workspace's size),
     * and whether the caller fixed the count */
    size_t max_splits;
    int forced;
    void *out;
    float *lse;
    const void *q;
    const int32_t *seq_lens;
    void *workspace;
    int q_rope; /* rotate each query row by layout and freq as it is read */
    weft_rope_layout q_layout;
    weft__rope_freq q_freq;
} weft__decode_args;

/* What every call over the cache asks of it (any format): WEFT_EINVAL with
 * op's name and the reason, before anything is read through it. */
int weft__kv_check_cache(const char *op, const weft_kv_cache *c);

/* The most parts a call of this shape splits into (1: never splits). */
size_t weft__decode_max_splits(const weft_kv_cache *c, const weft_attention_decode_desc *d,
                               size_t max_seq_len);

/* The workspace's layout for rows = seqs * q_len * heads query rows and
 * parts splits: each row's parts' fp32 outputs [rows][parts][head_dim],
 * then their log-sum-exps [rows][parts]. */
static inline size_t weft__decode_lse_offset(size_t rows, size_t parts, size_t head_dim)
{
    return rows * parts * head_dim * sizeof(float);
}

/* The host references (paged_host.c); refuse = 1 on the NULL stream
 * (tables checked, WEFT_EINVAL before any write), 0 where they are read
 * too late to refuse (clamped, as the kernels do). */
int weft__kv_append_host(const weft__kv_append_args *a, int refuse);
int weft__decode_host(const weft__decode_args *a, int refuse);

#ifdef WEFT_HAVE_CUDA
int weft__kv_append_cuda(void *stream, const weft__kv_append_args *a);
int weft__decode_cuda(void *stream, const weft__decode_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif
