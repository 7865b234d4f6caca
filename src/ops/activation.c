/*
 * activation.c - the activations the fused operators share: GELU (tanh and
 * erf forms) and SiLU, in fp32 on the host, written so that their tails keep
 * relative accuracy (the GPU kernels must match these forms).
 */
#include <math.h>

#include "ops/ops_internal.h"

float weft__gelu(weft_gelu_form form, float x)
{
    if (isinf(x))
        return x > 0 ? x : -0.0f;
    if (form == WEFT_GELU_TANH) {
        const float k0 = 0.7978845608028654f, k1 = 0.044715f; /* sqrt(2/pi) */
        float u = k0 * (x + k1 * x * x * x);
        /* 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)): the same function, but
         * without 1 + tanh u cancelling to nothing for negative x. */
        return x / (1.0f + weft__expf(-2.0f * u));
    }
    /* x Phi(x) = 0.5 x erfc(-x/sqrt 2): erfc keeps Phi's relative accuracy
     * in the far negative tail, where 1 + erf would cancel to nothing. */
    return 0.5f * x * (float)erfc(-(double)x * 0.70710678118654752440);
}

float weft__silu(float x)
{
    if (isinf(x))
        return x > 0 ? x : -0.0f;
    return x / (1.0f + weft__expf(-x));
}
