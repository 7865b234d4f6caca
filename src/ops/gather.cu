/*
 * gather.cu - weft_gather_rows on the GPU: a block a row, copying in the
 * widest unit (16, 8, 4 or 2 bytes) that the pointers, the row's bytes and
 * both strides allow; an id outside the table writes zeros.
 */
#include "ops/gather.h"
#include "ops/ops_cuda.cuh"

namespace weft_ops
{
namespace
{

template <typename U>
__global__ void gather_kernel(U *out, const U *table, const int32_t *ids, size_t table_rows,
                              size_t units, size_t table_stride, size_t out_stride)
{
    const int32_t id = ids[blockIdx.x];
    U *dst = out + (size_t)blockIdx.x * out_stride;
    if (id < 0 || (size_t)id >= table_rows) {
        for (size_t c = threadIdx.x; c < units; c += blockDim.x)
            dst[c] = U{};
        return;
    }
    const U *src = table + (size_t)id * table_stride;
    for (size_t c = threadIdx.x; c < units; c += blockDim.x)
        dst[c] = src[c];
}

template <typename U> static int launch(cudaStream_t s, const weft__gather_args *a, size_t unit)
{
    const size_t es = weft__dtype_size(a->dtype), units = a->cols * es / unit;
    const unsigned threads = units >= 256 ? 256u : units >= 64 ? 64u : 32u;
    gather_kernel<U><<<(unsigned)a->rows, threads, 0, s>>>(
        (U *)a->out, (const U *)a->table, a->ids, a->table_rows, units, a->table_stride * es / unit,
        a->out_stride * es / unit);
    return launched("weft_gather_rows");
}

} // namespace
} // namespace weft_ops

using namespace weft_ops;

extern "C" int weft__gather_rows_cuda(void *stream, const weft__gather_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t es = weft__dtype_size(a->dtype);
    const uintptr_t all = (uintptr_t)a->out | (uintptr_t)a->table | a->cols * es |
                          a->table_stride * es | a->out_stride * es;
    if (all % 16 == 0)
        return launch<uint4>(s, a, 16);
    if (all % 8 == 0)
        return launch<uint2>(s, a, 8);
    if (all % 4 == 0)
        return launch<uint32_t>(s, a, 4);
    return launch<uint16_t>(s, a, 2);
}
