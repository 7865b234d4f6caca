/*
 * gelu.cu - bias + GELU + residual on the GPU (gelu.c holds the checks and
 * the host reference).
 *
 * Design: purely elementwise, so the only goal is to move bytes at the
 * copy rate, and a bf16 op at that rate leaves a budget of about 50
 * instructions an element: the loop is kept lean to stay memory-bound.
 * Each thread takes a 16-byte chunk (8 bf16/fp16 or 4 fp32 elements) of a
 * grid that covers the tensor (chunk_once), faster in every dtype than one
 * wave of resident blocks walking it. Tensors past chunk_once's 32-bit
 * offsets keep the wave (row_walk, faster here than the adds-only
 * tensor_walk). The loads of in, residual and the bias are independent and
 * issued together. Whether there is a bias and a residual is decided once
 * per thread, not per element. A row's last partial chunk is done element
 * by element after the chunks, so any row length works; when a pointer or
 * the stride is not 16-byte aligned the whole op runs with one element per
 * access (V = 1), which is correct everywhere.
 */
#include "ops/gelu.cuh"

namespace weft_ops
{
namespace
{

template <typename T, int V, typename Walk> auto pick_kernel(weft_gelu_form form)
{
    return form == WEFT_GELU_ERF ? bias_gelu_residual_kernel<T, V, WEFT_GELU_ERF, Walk>
                                 : bias_gelu_residual_kernel<T, V, WEFT_GELU_TANH, Walk>;
}

template <typename T, int V>
int launch_v(cudaStream_t stream, const gelu_params<T> &p, weft_gelu_form form)
{
    const unsigned threads = 256;
    if (chunk_once::fits(p.rows, p.cols, p.stride, V, threads)) {
        auto kernel = pick_kernel<T, V, chunk_once>(form);
        kernel<<<chunk_once::grid(p.rows, p.cols, V, threads), threads, 0, stream>>>(p);
    } else {
        const size_t work = p.rows * ((p.cols + V - 1) / V); /* chunks, and rows' partial ends */
        auto kernel = pick_kernel<T, V, row_walk>(form);
        kernel<<<grid_for(kernel, work, threads), threads, 0, stream>>>(p);
    }
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
