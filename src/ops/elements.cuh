/*
 * elements.cuh - the operator kernels' element types and vector access:
 * fp32 to and from each T, V elements as one 16-byte access, raw vectors
 * to and from fp32.
 *
 * Every kernel is a template over its element type T (float, bf16, fp16)
 * and its vector width V: V elements make one 16-byte access when every
 * pointer and the stride allow it (the launchers ask aligned16), else
 * V = 1 and each element is its own access. Arithmetic is fp32 throughout;
 * conversions round to nearest even, as the host's weft__store does.
 *
 * Where the host reference's order of rounding matters (the softmax
 * scale before the max is subtracted), the kernels round the same way
 * with __fmul_rn/__fadd_rn, which nvcc never contracts into fused
 * multiply-adds.
 */
#ifndef WEFT_OPS_ELEMENTS_CUH
#define WEFT_OPS_ELEMENTS_CUH

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace weft_ops
{

__device__ __forceinline__ float to_f32(float x)
{
    return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(__half x)
{
    return __half2float(x);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x)
{
    return __float2half_rn(x);
}

/* v rounded to T and back: what storing then loading gives. */
template <typename T> __device__ __forceinline__ float round_to(float v)
{
    return to_f32(from_f32<T>(v));
}

/* V elements as one aligned access. */
template <typename T, int V> struct alignas(sizeof(T) * V) vec {
    T e[V];
};

/* V elements as fp32 from one aligned access. Half types convert in pairs.
 * A bf16 is the top half of its fp32, so a pair's word gives the low one
 * shifted up and the high one masked, an instruction each (converting the
 * high one as a bf16 took two: a byte permute, then the shift). */
template <typename T, int V> __device__ __forceinline__ void load_vec(float (&dst)[V], const T *p)
{
    vec<T, V> v = *reinterpret_cast<const vec<T, V> *>(p);
    if constexpr (V % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
        uint32_t pairs[V / 2];
        memcpy(pairs, &v, sizeof pairs);
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            dst[k] = __uint_as_float(pairs[k / 2] << 16);
            dst[k + 1] = __uint_as_float(pairs[k / 2] & 0xffff0000u);
        }
    } else if constexpr (V % 2 == 0 && std::is_same_v<T, __half>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            float2 f = __half22float2(__half2(v.e[k], v.e[k + 1]));
            dst[k] = f.x;
            dst[k + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            dst[k] = to_f32(v.e[k]);
    }
}

/* V fp32 values rounded to T, stored as one aligned access. Half types
 * round in pairs: cvt.rn.bf16x2.f32 rounds two values in one instruction
 * where the single form takes one each plus the packing. */
template <typename T, int V> __device__ __forceinline__ void store_vec(T *p, const float (&src)[V])
{
    vec<T, V> v;
    if constexpr (V % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            __nv_bfloat162 h = __floats2bfloat162_rn(src[k], src[k + 1]);
            v.e[k] = h.x;
            v.e[k + 1] = h.y;
        }
    } else if constexpr (V % 2 == 0 && std::is_same_v<T, __half>) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
            __half2 h = __floats2half2_rn(src[k], src[k + 1]);
            v.e[k] = h.x;
            v.e[k + 1] = h.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            v.e[k] = from_f32<T>(src[k]);
    }
    *reinterpret_cast<vec<T, V> *>(p) = v;
}

/* Raw 16-byte vectors to and from fp32 values. */
template <typename T, int V> __device__ __forceinline__ void unpack(float (&x)[V], uint4 raw)
{
    load_vec<T, V>(x, reinterpret_cast<const T *>(&raw));
}
template <typename T, int V> __device__ __forceinline__ uint4 pack(const float (&x)[V])
{
    uint4 raw;
    store_vec<T, V>(reinterpret_cast<T *>(&raw), x);
    return raw;
}

/* Elements of a 16-byte access. */
template <typename T> __host__ __device__ constexpr int vec16()
{
    return int(16 / sizeof(T));
}

/* Whether p is aligned to a 16-byte access (NULL is: it is never read). */
static inline bool aligned16(const void *p)
{
    return (uintptr_t)p % 16 == 0;
}

} // namespace weft_ops

#endif
