/*
 * rope_freq.h - a RoPE pair's inverse frequency, plain or with Llama 3's
 * scaling, shared by the host reference (rope.c) and the kernels
 * (rope.cuh) so that both turn each pair by the same double.
 */
#ifndef WEFT_OPS_ROPE_FREQ_H
#define WEFT_OPS_ROPE_FREQ_H

#include <math.h>
#include <stddef.h>

#ifdef __CUDACC__
#define WEFT_ROPE_FREQ_FN __host__ __device__ static inline
#else
#define WEFT_ROPE_FREQ_FN static inline
#endif

/* Llama 3's scaling as the kernels and the host take it; llama3 0: none. */
typedef struct weft__rope_freq {
    double base;
    size_t head_dim;
    int llama3;
    double factor, low_freq_factor, high_freq_factor, original_max_positions;
} weft__rope_freq;

/* base^(-2i/head_dim), then (with llama3) long wavelengths slowed by
 * factor, short ones kept and a smooth blend between (ops.h says how). */
WEFT_ROPE_FREQ_FN double weft__rope_inverse_frequency(const weft__rope_freq *r, size_t i)
{
    double f = pow(r->base, -2.0 * (double)i / (double)r->head_dim);
    if (!r->llama3)
        return f;
    double wavelength = 2 * 3.141592653589793 / f, old = r->original_max_positions;
    if (wavelength < old / r->high_freq_factor)
        return f;
    if (wavelength > old / r->low_freq_factor)
        return f / r->factor;
    double smooth =
        (old / wavelength - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
    return (1 - smooth) * f / r->factor + smooth * f;
}

#endif
