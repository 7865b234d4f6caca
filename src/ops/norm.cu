/*
 * norm.cu - LayerNorm, RMSNorm and bias+GELU+residual+LayerNorm on the GPU
 * (norm.c holds the checks and the host reference).
 *
 * The three share their kernels: they differ only in how the row sum s is
 * formed (in + residual, or GELU(in + gelu_bias) + residual) and whether
 * it is centred. The row is read once and kept on chip (rows.cuh says
 * how: for 16-byte aligned tensors in registers, loaded straight from
 * global memory, or for aligned rows too long to hold staged in shared
 * memory; otherwise in register tiles), s is formed and rounded to the
 * dtype there, and the statistics are taken on the kept row: in registers,
 * one reduction of moments - each thread's or each warp's count, mean and
 * squared deviations - or of RMSNorm's sum of squares (norm_held.cuh);
 * staged and in tiles, the host's corrected two-pass algorithm, the mean,
 * then the sums of the deviations and of their squares, which correct the
 * mean and the variance. Then s and the normalized row are written: two
 * or three reads an element (in, residual; the biases once per column)
 * and one or two writes, nothing else. For the fused op that is 2 reads
 * + 1 write where a framework's GELU kernel, residual add and LayerNorm
 * move 7 row-sized tensors.
 */
#include "ops/norm_launch.cuh"

namespace weft_ops
{

/* the held path, each mode compiled in a file of its own (norm_launch.cuh) */
WEFT_NORM_HELD(extern, NORM_LAYER)
WEFT_NORM_HELD(extern, NORM_RMS)
WEFT_NORM_HELD(extern, NORM_GELU_ERF_LAYER)
WEFT_NORM_HELD(extern, NORM_GELU_TANH_LAYER)

namespace
{

/* f(std::integral_constant<norm_mode, M>) for the args' mode M. */
template <typename F> int by_mode(const weft__norm_args *a, F f)
{
    using std::integral_constant;
    if (a->gelu && a->form == WEFT_GELU_TANH)
        return f(integral_constant<norm_mode, NORM_GELU_TANH_LAYER>());
    if (a->gelu)
        return f(integral_constant<norm_mode, NORM_GELU_ERF_LAYER>());
    if (a->rms)
        return f(integral_constant<norm_mode, NORM_RMS>());
    return f(integral_constant<norm_mode, NORM_LAYER>());
}

template <typename T> int launch(cudaStream_t stream, const char *op, const weft__norm_args *a)
{
    norm_params<T> p = {(T *)a->out,
                        (T *)a->sum_out,
                        (const T *)a->in,
                        (const T *)a->gelu_bias,
                        (const T *)a->residual,
                        (const T *)a->weight,
                        (const T *)a->bias,
                        a->rows,
                        a->cols,
                        a->stride,
                        a->eps,
                        a->rms != 0,
                        a->gelu != 0,
                        a->form};
    constexpr int V = vec16<T>();
    bool vec = aligned16(a->out) && aligned16(a->sum_out) && aligned16(a->in) &&
               aligned16(a->gelu_bias) && aligned16(a->residual) && aligned16(a->weight) &&
               aligned16(a->bias) && a->stride % V == 0;

    row_plan staged, held;

    /* 16 values a thread; on calls of few rows (few_rows) 8, in twice the
     * threads, as a row's latency is then the whole call. */
    const unsigned values = few_rows(a->rows) ? 8 : 16;
    if (vec && plan_held(a->cols, V, values, &held)) {
        return by_mode(a, [&](auto mode) {
            return launch_held<T, decltype(mode)::value>(stream, op, a, p, held);
        });
    }
    if (vec && plan_staged(a->cols, V, a->residual ? 2 : 1, &staged)) {
        auto kernel = a->gelu ? norm_staged_kernel<T, true> : norm_staged_kernel<T, false>;
        return launch_rows(op, stream, staged, p.rows, kernel, p, (size_t)staged.vpt);
    }
    if (vec)
        return launch_plan<T, V>(op, stream, plan_rows(a->cols, V), p);
    return launch_plan<T, 1>(op, stream, plan_rows(a->cols, 1), p);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__norm_cuda(void *stream, const char *op, const weft__norm_args *a)
{
    return weft_ops::by_dtype(a->dtype, [&](auto t) {
        return weft_ops::launch<decltype(t)>((cudaStream_t)stream, op, a);
    });
}
