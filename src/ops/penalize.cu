/*
 * penalize.cu - weft_penalize on the GPU: a block a row, its threads
 * striding over the row's adjustments. A token has one adjustment a row,
 * so no two threads write one logit.
 */
#include "ops/ops_cuda.cuh"
#include "ops/penalize.h"

namespace weft_ops
{
namespace
{

constexpr int PENALIZE_THREADS = 128;

template <typename T>
__global__ void __launch_bounds__(PENALIZE_THREADS)
    penalize_kernel(T *logits, size_t cols, size_t stride, const weft_penalties *params,
                    const weft_logit_adjust *adjust)
{
    const weft_penalties p = params[blockIdx.x];
    T *row = logits + (size_t)blockIdx.x * stride;
    for (uint32_t i = threadIdx.x; i < p.count; i += PENALIZE_THREADS) {
        const weft_logit_adjust a = adjust[(size_t)p.first + i];
        if (a.token >= 0 && (size_t)a.token < cols)
            row[a.token] = from_f32<T>(weft__penalized(to_f32(row[a.token]), &p, &a));
    }
}

} // namespace
} // namespace weft_ops

using namespace weft_ops;

extern "C" int weft__penalize_cuda(void *stream, const weft__penalize_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;
    return by_dtype(a->dtype, [&](auto t) {
        using T = decltype(t);
        penalize_kernel<T><<<(unsigned)a->rows, PENALIZE_THREADS, 0, s>>>(
            (T *)a->logits, a->cols, a->stride, a->params, a->adjust);
        return launched("weft_penalize");
    });
}
