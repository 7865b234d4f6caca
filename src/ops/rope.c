/*
 * rope.c - rotary position embedding on Q and K in one pass.
 *
 * The fusion: frameworks rotate Q and K in separate kernels, each building
 * (or reading) the cos/sin of every (position, frequency) pair. Here one
 * pass over a token computes each angle's sine and cosine once and applies
 * them to every head of Q and of K, in place, so Q and K are each read and
 * written exactly once and the tables never exist in memory.
 *
 * Both layouts pair element i of a head with a partner: i^1 for the
 * interleaved (GPT-J) layout, i + head_dim/2 for the split-halves
 * (GPT-NeoX) one. Angles are formed and reduced in double (see ops.h):
 * fp32 would lose 1e-2 radians at position 1e5. Llama 3's scaled
 * frequencies (weft_rope_scaled) change only each pair's inverse
 * frequency, which rope_freq.h computes for the host and the kernels
 * alike.
 */
#include <math.h>

#include "core/error.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_rope";

/* Turns pair i of every head of one token's row of x (q or k of a) by
 * (sn, cs); the row starts at element `row`. */
static void rotate_heads(const weft__rope_args *a, void *x, size_t row, size_t heads, size_t i,
                         float sn, float cs)
{
    size_t lo = a->layout == WEFT_ROPE_INTERLEAVED ? 2 * i : i;
    size_t hi = a->layout == WEFT_ROPE_INTERLEAVED ? 2 * i + 1 : i + a->head_dim / 2;

    for (size_t h = 0; h < heads; h++) {
        size_t at = row + h * a->head_dim;
        float u = weft__load(a->dtype, x, at + lo), v = weft__load(a->dtype, x, at + hi);
        weft__store(a->dtype, x, at + lo, u * cs - v * sn);
        weft__store(a->dtype, x, at + hi, u * sn + v * cs);
    }
}

static void host_rope(const weft__rope_args *a)
{
    size_t pairs = a->head_dim / 2;

    for (size_t i = 0; i < pairs; i++) {
        double inv_freq = weft__rope_inverse_frequency(&a->freq, i);
        for (size_t t = 0; t < a->tokens; t++) {
            float sn, cs;
            weft__sincos((double)a->positions[t] * inv_freq, &sn, &cs);
            rotate_heads(a, a->q, t * a->q_stride, a->q_heads, i, sn, cs);
            if (a->k)
                rotate_heads(a, a->k, t * a->k_stride, a->k_heads, i, sn, cs);
        }
    }
}

/* The host reference, as a host function in a task's stream order. */
static void run_host(const void *args)
{
    host_rope(args);
}

int weft_rope(void *stream, weft_dtype dtype, weft_rope_layout layout, void *q, size_t q_heads,
              size_t q_stride, void *k, size_t k_heads, size_t k_stride, size_t tokens,
              size_t head_dim, const int32_t *positions, float base)
{
    return weft_rope_scaled(stream, dtype, layout, q, q_heads, q_stride, k, k_heads, k_stride,
                            tokens, head_dim, positions, base, NULL);
}

static int finite_above(double v, double floor)
{
    return !isnan(v) && !isinf(v) && v > floor;
}

int weft__rope_freq_resolve(const char *op, float base, const weft_rope_llama3 *scaling,
                            size_t head_dim, weft__rope_freq *freq)
{
    if (isnan(base) || isinf(base) || base <= 0)
        return weft__fail(WEFT_EINVAL, "%s: RoPE base %g is not finite and > 0", op, (double)base);
    if (scaling &&
        (!finite_above(scaling->factor, 1 - 1e-12) || !finite_above(scaling->low_freq_factor, 0) ||
         !finite_above(scaling->high_freq_factor, scaling->low_freq_factor) ||
         !finite_above(scaling->original_max_positions, 0)))
        return weft__fail(WEFT_EINVAL,
                          "%s: Llama 3 scaling factor %g, low_freq_factor %g, high_freq_factor "
                          "%g, original_max_positions %g: each finite, factor >= 1 and 0 < low < "
                          "high, positions > 0",
                          op, scaling->factor, scaling->low_freq_factor, scaling->high_freq_factor,
                          scaling->original_max_positions);
    *freq = (weft__rope_freq){.base = base, .head_dim = head_dim, .llama3 = scaling != NULL};
    if (scaling) {
        freq->factor = scaling->factor;
        freq->low_freq_factor = scaling->low_freq_factor;
        freq->high_freq_factor = scaling->high_freq_factor;
        freq->original_max_positions = scaling->original_max_positions;
    }
    return WEFT_OK;
}

int weft_rope_scaled(void *stream, weft_dtype dtype, weft_rope_layout layout, void *q,
                     size_t q_heads, size_t q_stride, void *k, size_t k_heads, size_t k_stride,
                     size_t tokens, size_t head_dim, const int32_t *positions, float base,
                     const weft_rope_llama3 *scaling)
{
    int rc;

    if ((rc = weft__check_dtype(OP, dtype)) != WEFT_OK)
        return rc;
    if (layout != WEFT_ROPE_INTERLEAVED && layout != WEFT_ROPE_HALVES)
        return weft__fail(WEFT_EINVAL, "%s: unknown layout %d", OP, (int)layout);
    if (head_dim == 0 || head_dim % 2 != 0)
        return weft__fail(WEFT_EINVAL, "%s: head_dim %zu is not a positive even number", OP,
                          head_dim);
    weft__rope_freq freq;
    if ((rc = weft__rope_freq_resolve(OP, base, scaling, head_dim, &freq)) != WEFT_OK)
        return rc;
    if (q_heads == 0)
        return weft__fail(WEFT_EINVAL, "%s: q_heads is 0", OP);
    if (q_heads > SIZE_MAX / head_dim)
        return weft__fail(WEFT_EINVAL, "%s: q_heads * head_dim overflows", OP);
    if ((rc = weft__check_rows(OP, "q", tokens, q_heads * head_dim, q_stride, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "q", q, 0, dtype)) != WEFT_OK)
        return rc;
    if ((k == NULL) != (k_heads == 0))
        return weft__fail(WEFT_EINVAL, "%s: k is %s but k_heads is %zu", OP, k ? "given" : "NULL",
                          k_heads);
    if (k) {
        if (k_heads > SIZE_MAX / head_dim)
            return weft__fail(WEFT_EINVAL, "%s: k_heads * head_dim overflows", OP);
        if ((rc = weft__check_rows(OP, "k", tokens, k_heads * head_dim, k_stride, dtype)) !=
                WEFT_OK ||
            (rc = weft__check_ptr(OP, "k", k, 0, dtype)) != WEFT_OK)
            return rc;
    }
    if (positions == NULL)
        return weft__fail(WEFT_EINVAL, "%s: positions is NULL", OP);
    if ((uintptr_t)positions % sizeof *positions != 0)
        return weft__fail(WEFT_EINVAL, "%s: positions is not aligned", OP);
    if ((rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    weft__rope_args a = {.dtype = dtype,
                         .layout = layout,
                         .q = q,
                         .k = k,
                         .q_heads = q_heads,
                         .q_stride = q_stride,
                         .k_heads = k_heads,
                         .k_stride = k_stride,
                         .tokens = tokens,
                         .head_dim = head_dim,
                         .positions = positions,
                         .freq = freq};
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(OP, &stream, run_host, &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__rope_cuda(stream, &a);
#endif
    host_rope(&a);
    return WEFT_OK;
}
