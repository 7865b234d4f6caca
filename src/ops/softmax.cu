/*
 * softmax.cu - softmax with scale, causal mask and dropout on the GPU
 * (softmax.c holds the checks and the host reference).
 *
 * The row machinery of rows.cuh: the visible part of the row is read once
 * into registers and scaled there (scale * x rounded before the maximum is
 * taken, as on the host); a max reduction, then exp(v - max) kept in place
 * of v and a sum reduction, then every column written: e / sum where
 * visible, 0 where masked, each kept or dropped by the same Philox words
 * as the host's. Masked columns are never read, and whole masked vectors
 * cost no load at all. Rows far longer than the registers hold (beyond
 * 8 blocks' tiles) read their tiles again in each of the three passes.
 */
#include "ops/softmax.cuh"

namespace weft_ops
{
namespace
{

template <typename T> int launch(cudaStream_t stream, const weft__softmax_args *a)
{
    softmax_params<T> p = {(T *)a->out, (const T *)a->in, a->rows, a->cols, a->stride,
                           a->o.causal_q, a->o.scale, a->o.dropout_p,
                           /* computed as the host computes it */
                           1.0f / (1.0f - a->o.dropout_p), a->o.seed, a->o.offset};
    constexpr int V = vec16<T>();
    bool vec = aligned16(a->out) && aligned16(a->in) && a->stride % V == 0;

    if (vec)
        return launch_plan<T, V>(stream, plan_rows(a->cols, V), p);
    return launch_plan<T, 1>(stream, plan_rows(a->cols, 1), p);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__softmax_cuda(void *stream, const weft__softmax_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;

    switch (a->dtype) {
    case WEFT_DTYPE_BF16:
        return weft_ops::launch<__nv_bfloat16>(s, a);
    case WEFT_DTYPE_F16:
        return weft_ops::launch<__half>(s, a);
    default:
        return weft_ops::launch<float>(s, a);
    }
}
