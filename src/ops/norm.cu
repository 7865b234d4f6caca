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
 * one reduction of each thread's count, mean and squared deviations
 * (norm.cuh); staged and in tiles, the host's corrected two-pass
 * algorithm, the mean, then the sums of the deviations and of their
 * squares, which correct the mean and the variance. Then s and the
 * normalized row are written: two or three reads an element (in,
 * residual; the biases once per column) and one or two writes, nothing
 * else. For the fused op that is 2 reads + 1 write where a framework's
 * GELU kernel, residual add and LayerNorm move 7 row-sized tensors.
 */
#include "ops/norm.cuh"

namespace weft_ops
{
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

/* f(std::integral_constant<unsigned, IO>) for what the args' call reads
 * and writes (norm.cuh's norm_io): fixed at compile time for the common
 * calls of MODE on rows of whole vectors - the plain op with its weight
 * (and bias), and the same with the residual added and the sum written;
 * the fused op with its GELU bias and residual, with or without the sum -
 * and checked at run time otherwise. (The fused op in fp32 once ran faster
 * checked; since LayerNorm's statistics became one reduction, fixed wins
 * there too: bench/RESULTS.md, the gelu_layernorm variants.) */
template <typename T, norm_mode MODE, typename F> int by_io(const weft__norm_args *a, F f)
{
    using std::integral_constant;
    constexpr int V = vec16<T>();
    constexpr bool GELU = norm_gelu(MODE);
    constexpr unsigned AFFINE =
        MODE == NORM_RMS ? NORM_IO_WEIGHT : (unsigned)NORM_IO_WEIGHT | NORM_IO_BIAS;
    constexpr unsigned PLAIN = GELU ? AFFINE | NORM_IO_GELU_BIAS | NORM_IO_RESIDUAL : AFFINE;
    constexpr unsigned ADDED = PLAIN | NORM_IO_RESIDUAL | NORM_IO_SUM_OUT;
    const unsigned io = (a->residual ? NORM_IO_RESIDUAL : 0u) |
                        (a->gelu && a->gelu_bias ? NORM_IO_GELU_BIAS : 0u) |
                        (a->weight ? NORM_IO_WEIGHT : 0u) | (a->bias ? NORM_IO_BIAS : 0u) |
                        (a->sum_out ? NORM_IO_SUM_OUT : 0u);

    if (a->cols % V == 0 && io == PLAIN)
        return f(integral_constant<unsigned, PLAIN>());
    if (a->cols % V == 0 && io == ADDED)
        return f(integral_constant<unsigned, ADDED>());
    return f(integral_constant<unsigned, NORM_IO_CHECKED>());
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

    if (vec && plan_held(a->cols, V, 16, &held)) { /* measured best: 16 values a thread */
        return by_mode(a, [&](auto mode) {
            constexpr norm_mode MODE = decltype(mode)::value;
            return by_io<T, MODE>(a, [&](auto io) {
                constexpr unsigned IO = decltype(io)::value;
                /* Half types kept packed where norm_packed_plan says */
                if constexpr (sizeof(T) == 2) {
                    constexpr unsigned FEWEST = norm_gelu(MODE) ? 1u : (unsigned)PACKED_MAX_VALUES;
                    row_plan packed;
                    if (norm_packed_plan<MODE>(a->rows, a->cols, V, held, &packed))
                        if (auto kernel =
                                norm_packed_for<T, MODE, IO, EXCHANGE_PUSH, FEWEST>(packed.vpt))
                            return launch_rows(op, stream, packed, p.rows, kernel, p, 0);
                }
                /* The plain norms with one input of half types, the
                 * fewest bytes an element: at 32 values a thread where
                 * that takes fewer than 512 threads a row, as measured
                 * fastest (bench/RESULTS.md). (RMSNorm went through a ring
                 * of rows in shared memory where a block would take 512
                 * threads a row or a cluster; held, with a cluster's
                 * statistics pushed, it runs 7-22% faster there.) */
                constexpr bool PLAIN = (MODE == NORM_LAYER || MODE == NORM_RMS) &&
                                       (IO == NORM_IO_CHECKED || !(IO & NORM_IO_RESIDUAL));
                row_plan plan = held;
                /* The fused op's GELU takes registers: rows a warp would
                 * hold at 32 values a thread run faster over more warps at
                 * 16, at twice the occupancy (bench/RESULTS.md). */
                if constexpr (norm_gelu(MODE))
                    plan_held_split_warp_rows(&plan, V, 16);
                row_plan wide;
                if (PLAIN && sizeof(T) == 2 && !a->residual && plan_held(a->cols, V, 32, &wide) &&
                    wide.tpr < 512)
                    plan = wide;
                auto kernel = norm_held_for<T, MODE, IO, EXCHANGE_PUSH>(plan.vpt);
                if (!kernel)
                    return weft__fail(WEFT_EINVAL, "%s: no kernel for %u vectors a thread", op,
                                      plan.vpt);
                return launch_rows(op, stream, plan, p.rows, kernel, p, 0);
            });
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
