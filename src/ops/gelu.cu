/*
 * gelu.cu - bias + GELU + residual on the GPU (gelu.c holds the checks and
 * the host reference).
 *
 * Design: purely elementwise, so the only goal is to move bytes at the
 * copy rate, and a bf16 op at that rate leaves a budget of about 50
 * instructions an element: the loop is kept lean to stay memory-bound.
 * Each thread takes 16-byte chunks (8 bf16/fp16 or 4 fp32 elements) in a
 * grid-stride walk (tensor_walk: adds only, 32-bit offsets where they fit);
 * the loads of in, residual and the bias are independent and issued
 * together, and a grid of a few resident waves keeps enough of them in
 * flight per SM to cover memory latency. Whether there is a bias and a
 * residual is decided once per thread, not per element. A row's last
 * partial chunk is done element by element after the chunks, so any row
 * length works; when a pointer or the stride is not 16-byte aligned the
 * whole op runs with one element per access (V = 1), which is correct
 * everywhere.
 */
#include "ops/ops_cuda.cuh"

namespace weft_ops
{
namespace
{

template <typename T> struct gelu_params {
    T *out;
    const T *in, *bias, *residual;
    size_t rows, cols, stride;
};

/* The whole chunks, with a bias and a residual or without. */
template <typename T, int V, weft_gelu_form FORM, typename I, bool BIAS, bool RESIDUAL>
__device__ __forceinline__ void gelu_chunks(const gelu_params<T> &p)
{
    for (tensor_walk<I> w(p.rows, p.cols / V * V, p.stride, p.stride, V); w.more(); w.next()) {
        float h[V], b[V], r[V];
        load_vec<T, V>(h, p.in + w.at);
        if (BIAS)
            load_vec<T, V>(b, p.bias + w.col);
        if (RESIDUAL)
            load_vec<T, V>(r, p.residual + w.at);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float y = gelu(FORM, BIAS ? h[k] + b[k] : h[k]);
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
            float y = gelu(FORM, h);
            if (p.residual)
                y += to_f32(p.residual[e]);
            p.out[e] = from_f32<T>(y);
        }
    }
}

/* The form is a template parameter: one GELU's registers per kernel. */
template <typename T, int V, weft_gelu_form FORM, typename I>
__global__ void __launch_bounds__(256) bias_gelu_residual_kernel(gelu_params<T> p)
{
    if (p.bias && p.residual)
        gelu_chunks<T, V, FORM, I, true, true>(p);
    else if (p.bias)
        gelu_chunks<T, V, FORM, I, true, false>(p);
    else if (p.residual)
        gelu_chunks<T, V, FORM, I, false, true>(p);
    else
        gelu_chunks<T, V, FORM, I, false, false>(p);
    if (V > 1 && p.cols % V != 0)
        gelu_row_ends<T, FORM>(p, V);
}

template <typename T, int V, typename I> auto pick_kernel(weft_gelu_form form)
{
    return form == WEFT_GELU_ERF ? bias_gelu_residual_kernel<T, V, WEFT_GELU_ERF, I>
                                 : bias_gelu_residual_kernel<T, V, WEFT_GELU_TANH, I>;
}

template <typename T, int V>
int launch_v(cudaStream_t stream, const gelu_params<T> &p, weft_gelu_form form)
{
    const unsigned threads = 256;
    /* chunks, and the rows' last partial ones */
    unsigned blocks = grid_for(p.rows * ((p.cols + V - 1) / V), threads, 8);
    auto kernel =
        tensor_walk<uint32_t>::fits32(p.rows, p.cols, p.stride, V, (size_t)blocks * threads)
            ? pick_kernel<T, V, uint32_t>(form)
            : pick_kernel<T, V, size_t>(form);
    kernel<<<blocks, threads, 0, stream>>>(p);
    return launched("weft_bias_gelu_residual");
}

template <typename T> int launch(cudaStream_t stream, const weft__gelu_args *a)
{
    gelu_params<T> p = {(T *)a->out, (const T *)a->in, (const T *)a->bias, (const T *)a->residual,
                        a->rows,     a->cols,          a->stride};
    constexpr int V = vec16<T>();
    bool vec = aligned16(a->out) && aligned16(a->in) && aligned16(a->bias) &&
               aligned16(a->residual) && a->stride % V == 0;

    return vec ? launch_v<T, V>(stream, p, a->form) : launch_v<T, 1>(stream, p, a->form);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__gelu_cuda(void *stream, const weft__gelu_args *a)
{
    return weft_ops::by_dtype(
        a->dtype, [&](auto t) { return weft_ops::launch<decltype(t)>((cudaStream_t)stream, a); });
}
