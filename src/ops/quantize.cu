/*
 * quantize.cu - weft_quantize_fp8 on the GPU: a block a row. The threads
 * take the largest magnitude of the elements they stride over, the warps
 * and then the block the largest of theirs (fmaxf, which passes NaN by as
 * the host's does; a maximum does not depend on the order), one thread
 * writes the row's scale, and every thread converts its elements with
 * IEEE division and the saturating conversion, as the host reference does.
 */
#include "ops/ops_cuda.cuh"
#include "ops/quantize.cuh"

namespace weft_ops
{
namespace
{

constexpr int QUANTIZE_THREADS = 256;

template <typename T>
__global__ void __launch_bounds__(QUANTIZE_THREADS)
    quantize_kernel(__nv_fp8_storage_t *out, float *scales, const T *in, size_t cols,
                    size_t in_stride, size_t out_stride, fp8_type type)
{
    __shared__ float warp_max[QUANTIZE_THREADS / 32];
    __shared__ float row_scale;
    const T *row = in + (size_t)blockIdx.x * in_stride;
    __nv_fp8_storage_t *dst = out + (size_t)blockIdx.x * out_stride;
    float amax = 0.0f;
#pragma unroll 4
    for (size_t j = threadIdx.x; j < cols; j += QUANTIZE_THREADS)
        amax = fmaxf(amax, fabsf(to_f32(row[j])));
    for (int o = 16; o > 0; o /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0)
        warp_max[warp] = amax;
    __syncthreads();
    if (warp == 0) {
        amax = lane < QUANTIZE_THREADS / 32 ? warp_max[lane] : 0.0f;
        for (int o = 16; o > 0; o /= 2)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (lane == 0) {
            row_scale = fp8_scale(amax, type);
            scales[blockIdx.x] = row_scale;
        }
    }
    __syncthreads();
    const float scale = row_scale;
#pragma unroll 4
    for (size_t j = threadIdx.x; j < cols; j += QUANTIZE_THREADS)
        dst[j] = fp8_code(to_f32(row[j]), scale, type);
}

} // namespace
} // namespace weft_ops

using namespace weft_ops;

extern "C" int weft__quantize_cuda(void *stream, const weft__quantize_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;
    return by_dtype(a->in_type, [&](auto t) {
        using T = decltype(t);
        quantize_kernel<T><<<(unsigned)a->rows, QUANTIZE_THREADS, 0, s>>>(
            (__nv_fp8_storage_t *)a->out, a->scales, (const T *)a->in, a->cols, a->in_stride,
            a->out_stride, fp8_type_of(a->out_type));
        return launched("weft_quantize_fp8");
    });
}
