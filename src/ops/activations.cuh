/*
 * activations.cuh - the activations of the operator kernels (activation.c's
 * forms, on the GPU): GELU exact and tanh, SiLU, built from the special
 * function unit's 2^x and 1/x.
 */
#ifndef WEFT_OPS_ACTIVATIONS_CUH
#define WEFT_OPS_ACTIVATIONS_CUH

#include "ops/elements.cuh"
#include "ops/ops_internal.h"

namespace weft_ops
{

/*
 * The activations are most of the arithmetic of the elementwise ops, and a
 * bf16 op at the copy rate leaves about 50 instructions an element for
 * everything, loads and index math included. So they are built from the
 * special function unit's 2^x and 1/x (one instruction each, about 2 ulp)
 * and a few fused multiply-adds, with no branch: an Inf needs none (see
 * each form), and a NaN propagates through the final multiply.
 *
 * The tests allow GELU an error of 1e-5 relative times 4 + x^2: the
 * argument of exp is itself rounded to fp32 on the host, which moves the
 * result by ~x^2 of an ulp in the tails. The forms below stay well inside
 * that: 1.5e-6 relative for |x| <= 3, 2e-7 x^2 beyond (at most 1/20 of
 * the bound), and for results in half types within 3e-5 relative (their
 * bound is a unit in the last place, 1e-3 for fp16); results whose
 * exponent falls below fp32's normal range are flushed to zero, i.e. off
 * by less than 1e-37.
 */

/* 2^x and 1/x, subnormal results flushed to zero. */
__device__ __forceinline__ float exp2_approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float rcp_approx(float x)
{
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* x times a factor in [0, 1] that vanishes at -Inf: the host's x / (1 +
 * Inf) and x Phi(x) give -0 there, which -Inf * 0 would make a NaN. So x
 * is clamped to the finite range first, by max.NaN, which keeps a NaN. */
__device__ __forceinline__ float times_gate(float x, float gate)
{
    float finite;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(finite) : "f"(x), "f"(-3.40282347e38f /* -FLT_MAX */));
    return finite * gate;
}

/*
 * The exact GELU, x Phi(x). PyTorch's 0.5 x (1 + erf(x / sqrt 2)) is
 * cheaper still but cancels in the negative tail (no correct digit left
 * below x = -5), where the host's erfc keeps relative accuracy; so:
 *
 *   x Phi(x) = max(x, 0) - a Phi(-a),  Phi(-a) = exp(-a^2/2) q(a),  a = |x|
 *
 * q(a) = 0.5 erfcx(a / sqrt 2) is smooth and tends to 0 slowly; it is a
 * polynomial in t = (a - k)/(a + k), which maps [0, Inf) onto [-1, 1): for
 * fp32 results of degree 7 at k = 3.75 (a minimax fit in relative error,
 * 8e-7, on [0, 16]); for fp16 results (GELU_FIT_HALF) of degree 5 at k = 4
 * (2.7e-5, under a thirtieth of fp16's unit in the last place), which
 * saves two multiply-adds an element where they are scarcest. bf16 results
 * (GELU_FIT_BF16) take a polynomial of degree 3 in r = 1/(a + k) itself at
 * k = 2.75 (7.3e-4, under half of bf16's unit in the last place), three
 * instructions fewer again, where the fused GELU+LayerNorm issues most of
 * its instructions in the GELU. It leaves 4% of bf16 GELU results
 * one unit off the correctly rounded value, where the degree 5 fit leaves
 * 0.15% (x in [-10, 10] by 5e-5, fp32 arithmetic simulated), and never
 * two; a sum with the GELU, as the residual add, is off by at most 7.3e-4
 * of the GELU, less than rounding the GELU to bf16 first would cost. |a|
 * is capped at 16, past which Phi(-a) is below fp32's range anyway.
 * normal_tail(a) is Phi(-a).
 */
enum gelu_fit { GELU_FIT_F32, GELU_FIT_HALF, GELU_FIT_BF16 };

/* The library's fit for results of type T. */
template <typename T> __host__ __device__ constexpr gelu_fit gelu_fit_for()
{
    return std::is_same_v<T, __nv_bfloat16> ? GELU_FIT_BF16
           : std::is_same_v<T, __half>      ? GELU_FIT_HALF
                                            : GELU_FIT_F32;
}

template <gelu_fit FIT> __device__ __forceinline__ float normal_tail(float a)
{
    float q;
    if constexpr (FIT == GELU_FIT_BF16) {
        const float r = rcp_approx(a + 2.75f);
        q = 5.507182598f;
        q = fmaf(q, r, 5.957481861e-01f);
        q = fmaf(q, r, 4.333246946e-01f);
        q = fmaf(q, r, -7.924587117e-04f);
    } else {
        const float k = FIT == GELU_FIT_HALF ? 4.0f : 3.75f;
        const float t = fmaf(-2.0f * k, rcp_approx(a + k), 1.0f);
        if constexpr (FIT == GELU_FIT_HALF) {
            q = -7.784745656e-03f;
            q = fmaf(q, t, 3.113643639e-02f);
            q = fmaf(q, t, -7.195649296e-02f);
            q = fmaf(q, t, 1.243495792e-01f);
            q = fmaf(q, t, -1.703756750e-01f);
            q = fmaf(q, t, 9.441050142e-02f);
        } else {
            q = 5.080080591e-04f;
            q = fmaf(q, t, -7.307599299e-04f);
            q = fmaf(q, t, -4.770565312e-03f);
            q = fmaf(q, t, 2.520528808e-02f);
            q = fmaf(q, t, -6.727581471e-02f);
            q = fmaf(q, t, 1.254839897e-01f);
            q = fmaf(q, t, -1.784635335e-01f);
            q = fmaf(q, t, 1.000391841e-01f);
        }
    }
    return exp2_approx(a * a * -0.72134752044448170f) * q;
}

/* The GELU from the tail, for either sign: two instructions where taking
 * Phi(x) as the tail or 1 - tail by the sign and multiplying takes five.
 * max.NaN keeps a NaN, and the max
 * with -0 gives -0 for negative x, as the host's x Phi(x) does at -Inf;
 * past the cap on a the tail is 0. */
template <gelu_fit FIT> __device__ __forceinline__ float gelu_erf_fit(float x)
{
    const float a = fminf(fabsf(x), 16.0f);
    float relu;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(relu) : "f"(x), "f"(-0.0f));
    return fmaf(-a, normal_tail<FIT>(a), relu);
}

/* The exact GELU for results of type T. */
template <typename T, gelu_fit FIT = gelu_fit_for<T>()>
__device__ __forceinline__ float gelu_erf(float x)
{
    return gelu_erf_fit<FIT>(x);
}

/* The tanh form, x / (1 + exp(-2u)) with u = k0 (x + k1 x^3), as
 * 2^(x (c0 + c1 x^2)) with log2(e) folded into the constants. */
__device__ __forceinline__ float gelu_tanh(float x)
{
    const float k0 = 0.7978845608028654f, k1 = 0.044715f, log2e = 1.4426950408889634f;
    const float c0 = -2.0f * k0 * log2e, c1 = c0 * k1;
    const float e = exp2_approx(x * fmaf(x * x, c1, c0));
    return times_gate(x, rcp_approx(1.0f + e));
}

/* GELU in the given form, for results of type T. */
template <typename T, gelu_fit FIT = gelu_fit_for<T>()>
__device__ __forceinline__ float gelu(weft_gelu_form form, float x)
{
    return form == WEFT_GELU_ERF ? gelu_erf<T, FIT>(x) : gelu_tanh(x);
}

__device__ __forceinline__ float silu(float x)
{
    return times_gate(x, rcp_approx(1.0f + exp2_approx(x * -1.4426950408889634f)));
}

} // namespace weft_ops

#endif
