/*
 * glu.cuh - the SwiGLU/GeGLU kernel, apart from its launcher (glu.cu),
 * which says what it computes and why, so that it can be timed on
 * other walks side by side.
 */
#ifndef WEFT_OPS_GLU_CUH
#define WEFT_OPS_GLU_CUH

#include "ops/ops_cuda.cuh"

namespace weft_ops
{

template <typename T> struct glu_params {
    T *out;
    const T *in;
    size_t rows, cols, in_stride, out_stride;
};

/* The activation of a, for results of type T. */
template <typename T, weft_glu_kind KIND> __device__ __forceinline__ float activate(float a)
{
    switch (KIND) {
    case WEFT_GLU_GEGLU:
        return gelu_erf<T>(a);
    case WEFT_GLU_GEGLU_TANH:
        return gelu_tanh(a);
    default:
        return silu(a);
    }
}

/* cols is a multiple of V; Walk is tensor_walk<offset type> or row_walk. */
template <typename T, int V, weft_glu_kind KIND, typename Walk>
__global__ void __launch_bounds__(256) glu_kernel(glu_params<T> p)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
    const T *gate = p.in, *up = p.in + p.cols;
    for (Walk w(p.rows, p.cols, p.out_stride, p.in_stride, V); w.more(); w.next()) {
        float x[V], y[V];
        load_vec<T, V>(x, gate + w.at2);
        load_vec<T, V>(y, up + w.at2);
#pragma unroll
        for (int k = 0; k < V; k++)
            x[k] = activate<T, KIND>(x[k]) * y[k];
        store_vec<T, V>(p.out + w.at, x);
    }
}

} // namespace weft_ops

#endif
