/*
 * philox.cuh - Philox4x32-10 on the GPU, the same stream as common.c's, and
 * the dropout keep decisions drawn from it: a kernel and the host
 * reference drop the same elements for the same seed and offset.
 */
#ifndef WEFT_OPS_PHILOX_CUH
#define WEFT_OPS_PHILOX_CUH

#include "ops/elements.cuh"

namespace weft_ops
{

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k)
{
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;

#pragma unroll
    for (int round = 0; round < 10; round++) {
        uint32_t hi0 = __umulhi(M0, c.x), lo0 = M0 * c.x;
        uint32_t hi1 = __umulhi(M1, c.z), lo1 = M1 * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += W0;
        k.y += W1;
    }
    return c;
}

/* The keep decisions of consecutive logical elements, one Philox block (4
 * elements) at a time: next(e) for increasing e calls Philox once per
 * block it enters. */
struct dropout_mask {
    uint2 key;
    uint32_t off_lo, off_hi;
    float p;
    unsigned long long block;
    uint4 words;

    __device__ dropout_mask(unsigned long long seed, unsigned long long offset, float p_)
        : key(make_uint2((uint32_t)seed, (uint32_t)(seed >> 32))), off_lo((uint32_t)offset),
          off_hi((uint32_t)(offset >> 32)), p(p_), block(~0ull), words()
    {
    }

    __device__ __forceinline__ bool keep(unsigned long long e)
    {
        unsigned long long b = e / 4;
        if (b != block) {
            block = b;
            words =
                philox4x32_10(make_uint4((uint32_t)b, (uint32_t)(b >> 32), off_lo, off_hi), key);
        }
        uint32_t lane = (uint32_t)(e % 4);
        uint32_t w = lane == 0 ? words.x : lane == 1 ? words.y : lane == 2 ? words.z : words.w;
        return (float)(w >> 8) * 0x1p-24f >= p;
    }
};

} // namespace weft_ops

#endif
