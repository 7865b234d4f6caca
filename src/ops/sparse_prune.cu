/*
 * sparse_prune.cu - weft_prune_2_4 on the GPU: a thread a group of four,
 * through weft__prune_keep (sparse.h), the rule the host applies, so the
 * two agree bit for bit. A weight is pruned once, at load: the kernel is
 * plain.
 */
#include "ops/ops_cuda.cuh"
#include "ops/sparse.h"

namespace weft_ops
{
namespace
{

template <typename T>
__global__ void __launch_bounds__(256)
    prune_kernel(T *w, size_t rows, size_t groups_per_row, size_t ld)
{
    const size_t total = rows * groups_per_row;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        T *p = w + (i / groups_per_row) * ld + (i % groups_per_row) * 4;
        float x[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            x[j] = to_f32(p[j]);
        unsigned keep = weft__prune_keep(x);
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (!(keep >> j & 1u))
                p[j] = from_f32<T>(0.0f);
    }
}

} // namespace
} // namespace weft_ops

extern "C" int weft__prune_2_4_cuda(void *stream, const weft__prune_args *a)
{
    using namespace weft_ops;
    return by_dtype(a->dtype, [&](auto t) {
        using T = decltype(t);
        auto kernel = prune_kernel<T>;
        size_t groups = a->cols / 4;
        kernel<<<grid_for(kernel, a->rows * groups, 256), 256, 0, (cudaStream_t)stream>>>(
            (T *)a->w, a->rows, groups, a->ld);
        return launched("weft_prune_2_4");
    });
}
