/*
 * argmax.cu - weft_argmax on the GPU: a block a row. Each thread keeps the
 * largest rank.h rank of the elements it strides over, the warps take the
 * largest of theirs by shuffles and the block the largest of its warps';
 * the index comes back out of the rank. Ranks are distinct within a row,
 * so the order of the reduction cannot change the answer.
 *
 * A row of a 128k vocabulary in fp32 is 512 KB; 512 threads with four
 * loads in flight each keep a block's share of the bandwidth, and a batch
 * of rows runs on as many SMs.
 */
#include "ops/argmax.h"
#include "ops/ops_cuda.cuh"
#include "ops/rank.h"

namespace weft_ops
{
namespace
{

constexpr int ARGMAX_THREADS = 512;

template <typename T>
__global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(int32_t *ids, const T *in, size_t cols, size_t stride)
{
    __shared__ unsigned long long warp_best[ARGMAX_THREADS / 32];
    const T *row = in + (size_t)blockIdx.x * stride;
    unsigned long long best = 0;
#pragma unroll 4
    for (size_t j = threadIdx.x; j < cols; j += ARGMAX_THREADS) {
        const unsigned long long k = weft__rank(__float_as_uint(to_f32(row[j])), (uint32_t)j);
        best = k > best ? k : best;
    }
    for (int o = 16; o > 0; o /= 2) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0)
        warp_best[warp] = best;
    __syncthreads();
    if (warp == 0) {
        best = lane < ARGMAX_THREADS / 32 ? warp_best[lane] : 0;
        for (int o = 16; o > 0; o /= 2) {
            const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
            best = other > best ? other : best;
        }
        if (lane == 0)
            ids[blockIdx.x] = (int32_t)weft__rank_index(best);
    }
}

} // namespace
} // namespace weft_ops

using namespace weft_ops;

extern "C" int weft__argmax_cuda(void *stream, const weft__argmax_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;
    return by_dtype(a->dtype, [&](auto t) {
        using T = decltype(t);
        argmax_kernel<T><<<(unsigned)a->rows, ARGMAX_THREADS, 0, s>>>(a->ids, (const T *)a->in,
                                                                      a->cols, a->stride);
        return launched("weft_argmax");
    });
}
