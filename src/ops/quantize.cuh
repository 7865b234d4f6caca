/*
 * quantize.cuh - the FP8 quantization on the GPU, shared by
 * weft_quantize_fp8's kernel (quantize.cu) and weft_rmsnorm_fp8's (the
 * norm kernels' FP8 output): a row's scale from its largest magnitude and
 * an element's code, with IEEE division and the saturating conversion, as
 * quantize.h's host helpers compute them, so that every path writes the
 * same bytes.
 */
#ifndef WEFT_OPS_QUANTIZE_CUH
#define WEFT_OPS_QUANTIZE_CUH

#include <cuda_fp8.h>
#include <float.h>

#include "ops/quantize.h"

namespace weft_ops
{

/* An FP8 type as a kernel takes it: the conversion's interpretation and F,
 * its largest finite value. */
struct fp8_type {
    __nv_fp8_interpretation_t kind;
    float top;
};

static inline fp8_type fp8_type_of(weft_dtype t)
{
    return {t == WEFT_DTYPE_F8_E4M3 ? __NV_E4M3 : __NV_E5M2, weft__fp8_top(t)};
}

/* A row's scale from its largest magnitude: amax / F, at least FLT_MIN. */
__device__ __forceinline__ float fp8_scale(float amax, fp8_type t)
{
    return fmaxf(__fdiv_rn(amax, t.top), FLT_MIN);
}

/* An element's code: v / scale, rounded to nearest even and saturated. */
__device__ __forceinline__ __nv_fp8_storage_t fp8_code(float v, float scale, fp8_type t)
{
    return __nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, t.kind);
}

} // namespace weft_ops

#endif
