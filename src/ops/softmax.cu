/*
 * softmax.cu - softmax with scale, causal mask and dropout on the GPU
 * (softmax.c holds the checks and the host reference).
 *
 * The row machinery of rows.cuh: the visible part of the row is read once
 * and kept on chip - in registers for 16-byte aligned tensors (staged in
 * shared memory for aligned rows too long to hold), else in register
 * tiles - and scaled as it is used (scale * x rounded before the maximum
 * is taken, as on the host). A max reduction, a sum of exp(v - max) and
 * its reduction - or, on held unmasked rows of half types, one reduction
 * of each thread's max and its sum, the sums rescaled to each group's max
 * (measured faster there, slower in fp32) - then every column is written:
 * e / sum where visible, 0 where masked, each kept or dropped by the same
 * Philox words as the host's. Masked columns are never read, and whole masked
 * vectors cost no load at all. A row held by a cluster has its blocks push
 * their statistics into each other's shared memory (reduce.cuh's
 * EXCHANGE_PUSH), faster than meeting at cluster barriers and than
 * streaming the rows through a ring in shared memory. Held whole rows ask
 * L2 for the
 * rows ahead, as the held norms do. Rows longer than 8 blocks hold read
 * their tiles again in each of the three passes.
 */
#include "ops/softmax.cuh"

namespace weft_ops
{
namespace
{

template <typename T> int launch(cudaStream_t stream, const weft__softmax_args *a)
{
    softmax_params<T> p = {(T *)a->out, (const T *)a->in, a->rows, a->cols, a->stride,
                           a->o.causal_q, a->o.scale, a->o.dropout_p,
                           /* computed as the host computes it */
                           1.0f / (1.0f - a->o.dropout_p), a->o.seed, a->o.offset};
    constexpr int V = vec16<T>();
    bool vec = aligned16(a->out) && aligned16(a->in) && a->stride % V == 0;

    row_plan staged, held;

    /* 32 values a thread; on calls of few rows 16, as a row's latency is
     * then the whole call */
    if (vec && plan_held(a->cols, V, few_rows(a->rows) ? 16 : 32, &held)) {
        const bool whole = !p.causal_q && a->cols % V == 0;
        /* the unmasked rows' statistics: one online reduction where the
         * row is of a half type, two in fp32 (softmax.cuh's softmax_stats) */
        constexpr softmax_stats STATS = sizeof(T) == 2 ? SOFTMAX_ONLINE : SOFTMAX_MAX_THEN_SUM;
        constexpr softmax_stats TWO = SOFTMAX_MAX_THEN_SUM;
        constexpr cluster_exchange X = EXCHANGE_PUSH;
        /* whole rows without dropout ask L2 for the rows 4 MiB on
         * (rows.cuh's held_lead; the other kernels ignore the lead), which
         * is faster on rows of 4096 and more, and in fp32 on shorter rows
         * too (half types gain nothing there) */
        auto kernel = p.p > 0.0f ? softmax_held_for<T, SOFTMAX_DROPOUT, TWO, X>(held.vpt)
                      : !whole   ? softmax_held_for<T, SOFTMAX_CHECKED, TWO, X>(held.vpt)
                      : p.scale == 1.0f
                          ? softmax_held_for<T, SOFTMAX_PLAIN, STATS, X, true>(held.vpt)
                          : softmax_held_for<T, SOFTMAX_SCALED, STATS, X, true>(held.vpt);
        const size_t shortest = sizeof(T) == 4 ? AHEAD_SHORT_BYTES / sizeof(T) : AHEAD_SHORTEST;
        const size_t lead =
            held_lead(held, p.rows, a->cols, a->cols * sizeof(T), AHEAD_WINDOW, shortest);
        if (kernel)
            return launch_rows("weft_softmax", stream, held, p.rows, kernel, p, lead);
    }
    if (vec && plan_staged(a->cols, V, 1, &staged)) {
        auto kernel = p.p > 0.0f ? softmax_staged_kernel<T, true> : softmax_staged_kernel<T, false>;
        return launch_rows("weft_softmax", stream, staged, p.rows, kernel, p, (size_t)staged.vpt);
    }
    if (vec)
        return launch_plan<T, V>(stream, plan_rows(a->cols, V), p);
    return launch_plan<T, 1>(stream, plan_rows(a->cols, 1), p);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__softmax_cuda(void *stream, const weft__softmax_args *a)
{
    return weft_ops::by_dtype(
        a->dtype, [&](auto t) { return weft_ops::launch<decltype(t)>((cudaStream_t)stream, a); });
}
