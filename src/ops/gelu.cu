/*
 * gelu.cu - bias + GELU + residual on the GPU (gelu.c holds the checks and
 * the host reference).
 *
 * Design: purely elementwise, so the only goal is to move bytes at the
 * copy rate. Each thread takes 16-byte chunks of a row (8 bf16/fp16 or 4
 * fp32 elements) in a grid-stride walk: the loads of in, residual and the
 * bias are independent and issued together, and a grid of a few resident
 * waves keeps enough of them in flight per SM to cover memory latency. A
 * row's last partial chunk is done element by element, so any row length
 * works; when a pointer or the stride is not 16-byte aligned the whole op
 * runs with one element per access (V = 1), which is correct everywhere.
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
    weft_gelu_form form;
};

/* The form is a template parameter: one GELU's registers per kernel. */
template <typename T, int V, weft_gelu_form FORM>
__global__ void __launch_bounds__(256) bias_gelu_residual_kernel(gelu_params<T> p)
{
    for (chunk_walk w(p.rows, (p.cols + V - 1) / V); w.more(); w.next()) {
        size_t j = w.chunk * V, i = w.row * p.stride + j;
        if (V > 1 && j + V <= p.cols) {
            float h[V], r[V], b[V];
            load_vec<T, V>(h, p.in + i);
            if (p.bias)
                load_vec<T, V>(b, p.bias + j);
            if (p.residual)
                load_vec<T, V>(r, p.residual + i);
#pragma unroll
            for (int k = 0; k < V; k++) {
                float y = gelu(FORM, p.bias ? h[k] + b[k] : h[k]);
                h[k] = p.residual ? y + r[k] : y;
            }
            store_vec<T, V>(p.out + i, h);
        } else {
            for (size_t k = j; k < p.cols && k < j + V; k++) {
                size_t e = w.row * p.stride + k;
                float h = to_f32(p.in[e]);
                if (p.bias)
                    h += to_f32(p.bias[k]);
                float y = gelu(FORM, h);
                if (p.residual)
                    y += to_f32(p.residual[e]);
                p.out[e] = from_f32<T>(y);
            }
        }
    }
}

template <typename T> int launch(cudaStream_t stream, const weft__gelu_args *a)
{
    gelu_params<T> p = {(T *)a->out, (const T *)a->in, (const T *)a->bias, (const T *)a->residual,
                        a->rows,     a->cols,          a->stride,          a->form};
    constexpr int V = vec16<T>();
    const unsigned threads = 256;
    bool vec = aligned16(a->out) && aligned16(a->in) && aligned16(a->bias) &&
               aligned16(a->residual) && a->stride % V == 0;

    void (*kernel)(gelu_params<T>);
    size_t work = a->rows * a->cols;
    if (vec) {
        work = a->rows * ((a->cols + V - 1) / V);
        kernel = bias_gelu_residual_kernel<T, V, WEFT_GELU_TANH>;
        if (a->form == WEFT_GELU_ERF)
            kernel = bias_gelu_residual_kernel<T, V, WEFT_GELU_ERF>;
    } else {
        kernel = bias_gelu_residual_kernel<T, 1, WEFT_GELU_TANH>;
        if (a->form == WEFT_GELU_ERF)
            kernel = bias_gelu_residual_kernel<T, 1, WEFT_GELU_ERF>;
    }
    kernel<<<grid_for(work, threads, 8), threads, 0, stream>>>(p);
    return launched("weft_bias_gelu_residual");
}

} // namespace
} // namespace weft_ops

extern "C" int weft__gelu_cuda(void *stream, const weft__gelu_args *a)
{
    return weft_ops::by_dtype(
        a->dtype, [&](auto t) { return weft_ops::launch<decltype(t)>((cudaStream_t)stream, a); });
}
