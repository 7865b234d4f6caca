/*
 * rank.h - one order on the values of a row, compiled for the host and the
 * GPU from this one text, so that a choice by value (the MoE router's top
 * k, weft_argmax) is the same id on every backend whatever the arithmetic
 * before it rounded to.
 *
 * Values compare through an integer key of their fp32 bits: larger value,
 * larger key; NaN below everything (-Inf included); -0 equal to +0. The
 * 64-bit rank puts the key above the index reversed, so equal values go
 * to the lower index and every rank of a row is distinct: the largest
 * rank is the first maximum.
 */
#ifndef WEFT_OPS_RANK_H
#define WEFT_OPS_RANK_H

#include <stdint.h>

#ifdef __CUDACC__
#define WEFT__RANK_HD __host__ __device__
#else
#define WEFT__RANK_HD
#endif

/* The key of a value's fp32 bits. */
WEFT__RANK_HD static inline uint32_t weft__rank_key(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: below -Inf's key */
        return 0;
    if ((u & 0x7fffffffu) == 0) /* -0 is +0 */
        u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The rank of the value with fp32 bits `bits` at index i. */
WEFT__RANK_HD static inline uint64_t weft__rank(uint32_t bits, uint32_t i)
{
    return ((uint64_t)weft__rank_key(bits) << 32) | (uint32_t)(0xffffffffu - i);
}

/* The index a rank was made with. */
WEFT__RANK_HD static inline uint32_t weft__rank_index(uint64_t rank)
{
    return 0xffffffffu - (uint32_t)rank;
}

#endif
