/*
 * glu.cu - SwiGLU and GeGLU on the GPU (glu.c holds the checks and the
 * host reference).
 *
 * Design: elementwise over the output, like gelu.cu. A thread takes a
 * 16-byte chunk j of the output row and reads the matching chunks of both
 * halves of the input row (a at j, b at cols + j), so each input byte is
 * read once and the activated half never leaves registers. The grid has a
 * thread a chunk (chunk_once), faster than one wave of blocks walking the
 * tensor; tensors past chunk_once's 32-bit offsets
 * keep the wave, whose walk keeps the output's and the input's offsets
 * (tensor_walk). The
 * activation is a template parameter, so the loop holds nothing but loads,
 * the arithmetic and a store. Vector access needs cols, both strides and
 * both pointers to keep every chunk 16-byte aligned; otherwise one element
 * per access.
 */
#include "ops/glu.cuh"

namespace weft_ops
{
namespace
{

template <typename T, int V, typename Walk> auto pick_kernel(weft_glu_kind kind)
{
    switch (kind) {
    case WEFT_GLU_GEGLU:
        return glu_kernel<T, V, WEFT_GLU_GEGLU, Walk>;
    case WEFT_GLU_GEGLU_TANH:
        return glu_kernel<T, V, WEFT_GLU_GEGLU_TANH, Walk>;
    default:
        return glu_kernel<T, V, WEFT_GLU_SWIGLU, Walk>;
    }
}

template <typename T, int V>
int launch_v(cudaStream_t stream, const glu_params<T> &p, weft_glu_kind kind)
{
    const unsigned threads = 256;
    const size_t stride = p.in_stride > p.out_stride ? p.in_stride : p.out_stride;
    if (chunk_once::fits(p.rows, p.cols, stride, V, threads)) {
        auto kernel = pick_kernel<T, V, chunk_once>(kind);
        return launch_dependent("weft_glu", stream, chunk_once::grid(p.rows, p.cols, V, threads),
                                dim3(threads), 0, kernel, p);
    }
    const size_t work = p.rows * (p.cols / V);
    auto kernel = pick_kernel<T, V, tensor_walk<uint32_t>>(kind);
    unsigned blocks = grid_for(kernel, work, threads);
    if (!tensor_walk<uint32_t>::fits32(p.rows, p.cols, stride, V, (size_t)blocks * threads)) {
        kernel = pick_kernel<T, V, tensor_walk<size_t>>(kind);
        blocks = grid_for(kernel, work, threads);
    }
    return launch_dependent("weft_glu", stream, dim3(blocks), dim3(threads), 0, kernel, p);
}

template <typename T> int launch(cudaStream_t stream, const weft__glu_args *a)
{
    glu_params<T> p = {(T *)a->out, (const T *)a->in, a->rows,
                       a->cols,     a->in_stride,     a->out_stride};
    constexpr int V = vec16<T>();
    bool vec = aligned16(a->out) && aligned16(a->in) && a->cols % V == 0 && a->in_stride % V == 0 &&
               a->out_stride % V == 0;

    return vec ? launch_v<T, V>(stream, p, a->kind) : launch_v<T, 1>(stream, p, a->kind);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__glu_cuda(void *stream, const weft__glu_args *a)
{
    return weft_ops::by_dtype(
        a->dtype, [&](auto t) { return weft_ops::launch<decltype(t)>((cudaStream_t)stream, a); });
}
