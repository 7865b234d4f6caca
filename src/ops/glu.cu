/*
 * glu.cu - SwiGLU and GeGLU on the GPU (glu.c holds the checks and the
 * host reference).
 *
 * Design: elementwise over the output, like gelu.cu. A thread takes a
 * 16-byte chunk j of the output row and reads the matching chunks of both
 * halves of the input row (a at j, b at cols + j), so each input byte is
 * read once and the activated half never leaves registers. Vector access
 * needs cols, both strides and both pointers to keep every chunk 16-byte
 * aligned; otherwise one element per access.
 */
#include "ops/ops_cuda.cuh"

namespace weft_ops
{
namespace
{

template <typename T> struct glu_params {
    T *out;
    const T *in;
    size_t rows, cols, in_stride, out_stride;
    weft_glu_kind kind;
};

__device__ __forceinline__ float activate(weft_glu_kind kind, float a)
{
    switch (kind) {
    case WEFT_GLU_GEGLU:
        return gelu(WEFT_GELU_ERF, a);
    case WEFT_GLU_GEGLU_TANH:
        return gelu(WEFT_GELU_TANH, a);
    default:
        return silu(a);
    }
}

template <typename T, int V> __global__ void glu_kernel(glu_params<T> p)
{
    for (chunk_walk w(p.rows, (p.cols + V - 1) / V); w.more(); w.next()) {
        size_t j = w.chunk * V;
        const T *a = p.in + w.row * p.in_stride, *b = a + p.cols;
        T *o = p.out + w.row * p.out_stride;
        if (V > 1 && j + V <= p.cols) {
            float x[V], y[V];
            load_vec<T, V>(x, a + j);
            load_vec<T, V>(y, b + j);
#pragma unroll
            for (int k = 0; k < V; k++)
                x[k] = activate(p.kind, x[k]) * y[k];
            store_vec<T, V>(o + j, x);
        } else {
            for (size_t k = j; k < p.cols && k < j + V; k++)
                o[k] = from_f32<T>(activate(p.kind, to_f32(a[k])) * to_f32(b[k]));
        }
    }
}

template <typename T> int launch(cudaStream_t stream, const weft__glu_args *a)
{
    glu_params<T> p = {(T *)a->out,  (const T *)a->in, a->rows, a->cols,
                       a->in_stride, a->out_stride,    a->kind};
    constexpr int V = vec16<T>();
    const unsigned threads = 256;
    bool vec = aligned16(a->out) && aligned16(a->in) && a->cols % V == 0 && a->in_stride % V == 0 &&
               a->out_stride % V == 0;

    if (vec)
        glu_kernel<T, V><<<grid_for(a->rows * (a->cols / V), threads, 8), threads, 0, stream>>>(p);
    else
        glu_kernel<T, 1><<<grid_for(a->rows * a->cols, threads, 8), threads, 0, stream>>>(p);
    return launched("weft_glu");
}

} // namespace
} // namespace weft_ops

extern "C" int weft__glu_cuda(void *stream, const weft__glu_args *a)
{
    return weft_ops::by_dtype(
        a->dtype, [&](auto t) { return weft_ops::launch<decltype(t)>((cudaStream_t)stream, a); });
}
