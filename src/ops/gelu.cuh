/*
 * gelu.cuh - the bias + GELU + residual kernel, apart from its launcher
 * (gelu.cu), which says what it computes and why, so that the kernel can
 * be launched on other grids (bench/ops times them).
 */
#ifndef WEFT_OPS_GELU_CUH
#define WEFT_OPS_GELU_CUH

#include "ops/ops_cuda.cuh"

namespace weft_ops
{

template <typename T> struct gelu_params {
    T *out;
    const T *in, *bias, *residual;
    size_t rows, cols, stride;
};

/* The whole chunks, with a bias and a residual or without, in the order
 * of Walk (walks.cuh). */
template <typename T, int V, weft_gelu_form FORM, typename Walk, bool BIAS, bool RESIDUAL>
__device__ __forceinline__ void gelu_chunks(const gelu_params<T> &p)
{
    for (Walk w(p.rows, p.cols / V * V, p.stride, p.stride, V); w.more(); w.next()) {
        float h[V], b[V], r[V];
        load_vec<T, V>(h, p.in + w.at);
        if (BIAS)
            load_vec<T, V>(b, p.bias + w.col);
        if (RESIDUAL)
            load_vec<T, V>(r, p.residual + w.at);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float y = gelu<T>(FORM, BIAS ? h[k] + b[k] : h[k]);
            h[k] = RESIDUAL ? y + r[k] : y;
        }
        store_vec<T, V>(p.out + w.at, h);
    }
}

/* The last cols % V elements of every row, one thread a row. */
template <typename T, weft_gelu_form FORM>
__device__ void gelu_row_ends(const gelu_params<T> &p, int v)
{
    size_t first = p.cols / v * v;
    for (size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x; row < p.rows;
         row += (size_t)gridDim.x * blockDim.x) {
        for (size_t j = first; j < p.cols; j++) {
            size_t e = row * p.stride + j;
            float h = to_f32(p.in[e]);
            if (p.bias)
                h += to_f32(p.bias[j]);
            float y = gelu<T>(FORM, h);
            if (p.residual)
                y += to_f32(p.residual[e]);
            p.out[e] = from_f32<T>(y);
        }
    }
}

/* The form is a template parameter: one GELU's registers per kernel.
 * The registers are left to ptxas: more resident blocks than its choice
 * leaves room for are no faster. */
template <typename T, int V, weft_gelu_form FORM, typename Walk>
__global__ void __launch_bounds__(256) bias_gelu_residual_kernel(gelu_params<T> p)
{
    if (p.bias && p.residual)
        gelu_chunks<T, V, FORM, Walk, true, true>(p);
    else if (p.bias)
        gelu_chunks<T, V, FORM, Walk, true, false>(p);
    else if (p.residual)
        gelu_chunks<T, V, FORM, Walk, false, true>(p);
    else
        gelu_chunks<T, V, FORM, Walk, false, false>(p);
    if (V > 1 && p.cols % V != 0)
        gelu_row_ends<T, FORM>(p, V);
}

} // namespace weft_ops

#endif
