/*
 * conv_fold.cu - weft_conv2d_fold_bn on the GPU: one elementwise kernel
 * over the folded weights and, after them, the folded biases (conv.c holds
 * the checks, conv_host.c the host reference).
 *
 * A thread computes its channel's scale itself (a division and a square
 * root per element is nothing beside the memory traffic of a fold that
 * runs once per model load) with explicitly rounded intrinsics, so the
 * compiler cannot fuse a multiply and an add the host rounds twice: the
 * result is the host's bit for bit.
 */
#include "ops/conv.h"
#include "ops/elements.cuh"
#include "ops/launch.cuh"

namespace weft_ops
{
namespace
{

template <typename T, typename P> struct fold_params {
    T *w_out, *bias_out;
    const T *w, *conv_bias;
    const P *gamma, *beta, *mean, *var;
    size_t k, per_k;
    float eps;
};

/* gamma / sqrt(var + eps), or NaN where var + eps is not > 0. */
template <typename T, typename P>
__device__ __forceinline__ float scale_of(const fold_params<T, P> &p, size_t o)
{
    float d = __fadd_rn(to_f32(p.var[o]), p.eps);
    return d > 0.0f ? __fdiv_rn(to_f32(p.gamma[o]), __fsqrt_rn(d)) : __int_as_float(0x7fc00000);
}

template <typename T, typename P> __global__ void fold_kernel(const fold_params<T, P> p)
{
    const size_t nw = p.k * p.per_k, total = nw + p.k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        if (i < nw) {
            p.w_out[i] = from_f32<T>(__fmul_rn(to_f32(p.w[i]), scale_of(p, i / p.per_k)));
        } else {
            size_t o = i - nw;
            float b = p.conv_bias ? to_f32(p.conv_bias[o]) : 0.0f;
            float shift = __fmul_rn(__fsub_rn(b, to_f32(p.mean[o])), scale_of(p, o));
            p.bias_out[o] = from_f32<T>(__fadd_rn(to_f32(p.beta[o]), shift));
        }
    }
}

template <typename T, typename P> int launch(cudaStream_t stream, const weft__conv_fold_args *a)
{
    fold_params<T, P> p = {(T *)a->w_out,
                           (T *)a->bias_out,
                           (const T *)a->w,
                           (const T *)a->conv_bias,
                           (const P *)a->gamma,
                           (const P *)a->beta,
                           (const P *)a->mean,
                           (const P *)a->var,
                           a->k,
                           a->per_k,
                           a->eps};
    const unsigned threads = 256;
    unsigned blocks = grid_for(fold_kernel<T, P>, a->k * a->per_k + a->k, threads);
    fold_kernel<T, P><<<blocks, threads, 0, stream>>>(p);
    return launched("weft_conv2d_fold_bn");
}

} // namespace
} // namespace weft_ops

extern "C" int weft__conv_fold_cuda(void *stream, const weft__conv_fold_args *a)
{
    return weft_ops::by_dtype(a->dtype, [&](auto t) {
        return weft_ops::by_dtype(a->bn_dtype, [&](auto p) {
            return weft_ops::launch<decltype(t), decltype(p)>((cudaStream_t)stream, a);
        });
    });
}
