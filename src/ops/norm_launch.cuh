/*
 * norm_launch.cuh - norm.cu's held path for one mode (launch_held), apart
 * so that each mode's kernels compile in a translation unit of their own
 * (norm_layer.cu, norm_rms.cu, norm_fused_erf.cu, norm_fused_tanh.cu,
 * norm_rms_fp8.cu), in parallel: the held kernels are most of the
 * library's compile. And the choice of path and plan for a call
 * (launch_norm_rows), which RMSNorm into FP8 shares with the other norms
 * from its own translation unit (norm_rms_fp8.cu), so that it takes
 * RMSNorm's path and its kernels leave norm.cu's as they are.
 */
#ifndef WEFT_OPS_NORM_LAUNCH_CUH
#define WEFT_OPS_NORM_LAUNCH_CUH

#include "ops/norm_held.cuh"

namespace weft_ops
{

/* f(std::integral_constant<unsigned, IO>) for the first of FIXED equal to
 * io, else for NORM_IO_CHECKED. */
template <unsigned... FIXED, typename F> int pick_io(unsigned io, F f)
{
    int rc = 0;
    const bool fixed =
        ((io == FIXED && (rc = f(std::integral_constant<unsigned, FIXED>()), true)) || ...);
    return fixed ? rc : f(std::integral_constant<unsigned, NORM_IO_CHECKED>());
}

/* f(std::integral_constant<unsigned, IO>) for what the args' call reads
 * and writes (norm_held.cuh's norm_io): fixed at compile time on rows of whole
 * vectors for every call of LayerNorm and RMSNorm - weight and bias each
 * given or not, the residual not added, added, or added and the sum
 * written - and for the fused op's with its weight and bias: with the
 * residual, the GELU bias given or not (a GEMM's epilogue may have added
 * it); without it (BERT's prediction head: dense, GELU, LayerNorm), the
 * GELU bias given; x written or not. Checked at run time otherwise. The
 * checked kernels take more registers and their packed ones spill: a call
 * fixed at compile time runs faster, in every mode and dtype, the more so
 * in half types. */
template <typename T, norm_mode MODE, typename F> int by_io(const weft__norm_args *a, F f)
{
    constexpr unsigned W = NORM_IO_WEIGHT, B = NORM_IO_BIAS, WB = W | B;
    constexpr unsigned ADD = NORM_IO_RESIDUAL, SUM = ADD | NORM_IO_SUM_OUT, GB = NORM_IO_GELU_BIAS;
    const unsigned io = (a->residual ? NORM_IO_RESIDUAL : 0u) |
                        (a->gelu && a->gelu_bias ? NORM_IO_GELU_BIAS : 0u) |
                        (a->weight ? NORM_IO_WEIGHT : 0u) | (a->bias ? NORM_IO_BIAS : 0u) |
                        (a->sum_out ? NORM_IO_SUM_OUT : 0u);

    if (a->cols % vec16<T>() != 0)
        return f(std::integral_constant<unsigned, NORM_IO_CHECKED>());
    if constexpr (MODE == NORM_LAYER)
        return pick_io<WB, WB | ADD, WB | SUM, 0, ADD, SUM, W, W | ADD, W | SUM, B, B | ADD,
                       B | SUM>(io, f);
    else if constexpr (norm_rms(MODE))
        return pick_io<W, W | ADD, W | SUM, 0, ADD, SUM>(io, f);
    else
        return pick_io<WB | GB | ADD, WB | GB | SUM, WB | ADD, WB | SUM, WB | GB,
                       WB | GB | NORM_IO_SUM_OUT>(io, f);
}

/* The bytes of a row's inputs that a held kernel asks L2 for ahead. */
template <typename T> static size_t ahead_row_bytes(const norm_params<T> &p)
{
    return p.cols * sizeof(T) * (p.residual ? 2 : 1);
}

/* launch_rows for the held kernel, with its lead where it asks L2 for
 * rows ahead (AHEAD): AHEAD_WINDOW bytes of the inputs, on rows of at
 * least `shortest` elements (rows.cuh's held_lead). */
template <bool AHEAD, typename P, typename K>
static int launch_held_rows(const char *op, cudaStream_t stream, const row_plan &plan, K kernel,
                            const P &p, size_t shortest)
{
    const size_t lead =
        AHEAD ? held_lead(plan, p.rows, p.cols, ahead_row_bytes(p), AHEAD_WINDOW, shortest) : 0;
    return launch_rows(op, stream, plan, p.rows, kernel, p, lead);
}

/* Which of launch_held_io's paths a call takes: the tuned one; a call of
 * few rows of RMSNorm in half types (few_rows), whose squares stay on the
 * FMA pipe and which asks L2 for nothing ahead; short rows that ask L2
 * ahead (short_rows_ahead), which no packed plan takes. */
enum held_call { HELD_TUNED, HELD_FEW_ROWS, HELD_SHORT_ROWS };

/* The call's rows, held in registers under `held` (plan_held at 16 values
 * a thread) or the plans below, for mode MODE, in the kernels for IO. P is
 * the mode's parameters (held_params), a parameter of its own so that the
 * host code's signature names no alias. */
template <typename T, norm_mode MODE, unsigned IO, held_call CALL = HELD_TUNED, typename P>
int launch_held_io(cudaStream_t stream, const char *op, const P &p, const row_plan &held)
{
    static_assert(std::is_same<P, held_params<T, MODE>>::value, "the mode's parameters");
    constexpr int V = vec16<T>();
    constexpr norm_stats STATS = CALL == HELD_FEW_ROWS ? STATS_WARP_PASSES : STATS_TUNED;
    constexpr norm_ahead A = CALL == HELD_FEW_ROWS     ? AHEAD_OFF
                             : CALL == HELD_SHORT_ROWS ? AHEAD_ON
                                                       : AHEAD_TUNED;
    constexpr size_t SHORTEST = CALL == HELD_SHORT_ROWS ? 0 : AHEAD_SHORTEST;
    /* RMSNorm's squares by the tensor cores (norm_held.cuh's held_stats)
     * make a row's critical path longer: calls of few rows (few_rows),
     * where one row's latency is the whole time, keep the FMA pipe's, in
     * the kernels that ask L2 for nothing ahead, as those calls have no
     * rows to wait. */
    if constexpr (CALL == HELD_TUNED && norm_rms(MODE) && sizeof(T) == 2)
        if (few_rows(p.rows))
            return launch_held_io<T, MODE, IO, HELD_FEW_ROWS>(stream, op, p, held);
    /* Short rows ask L2 ahead where that is faster (short_rows_ahead) */
    if constexpr (CALL == HELD_TUNED && short_rows_ahead<T, MODE, IO>())
        if (p.cols < AHEAD_SHORTEST && ahead_row_bytes(p) >= AHEAD_SHORT_BYTES)
            return launch_held_io<T, MODE, IO, HELD_SHORT_ROWS>(stream, op, p, held);
    /* Half types kept packed where norm_packed_plan says (never rows as
     * short as HELD_SHORT_ROWS's) */
    if constexpr (CALL != HELD_SHORT_ROWS && norm_packs<T, MODE>(IO == NORM_IO_CHECKED)) {
        constexpr unsigned FEWEST = norm_gelu(MODE) ? 1u : (unsigned)PACKED_MAX_VALUES;
        row_plan packed;
        if (norm_packed_plan<T, MODE>(p.rows, p.cols, p.residual != nullptr, IO == NORM_IO_CHECKED,
                                      &packed))
            if (auto kernel =
                    norm_packed_for<T, MODE, IO, EXCHANGE_PUSH, FEWEST, STATS, A>(packed.vpt))
                return launch_held_rows<held_ahead<T, MODE, IO, true, A>()>(op, stream, packed,
                                                                            kernel, p, SHORTEST);
    }
    row_plan plan = held;
    /* The fused op's GELU takes registers: rows a warp would hold at 32
     * values a thread run faster over more warps at 16, at twice the
     * occupancy. */
    if constexpr (norm_gelu(MODE))
        plan_held_split_warp_rows(&plan, V, 16);
    /* LayerNorm with one input of half types, the fewest bytes an element:
     * at 32 values a thread where that takes fewer than 512 threads a row,
     * which is faster, but for calls of few rows, which norm.cu spreads
     * thinner. RMSNorm is faster at 16 values. */
    row_plan wide;
    if (MODE == NORM_LAYER && sizeof(T) == 2 && !p.residual && !few_rows(p.rows) &&
        plan_held(p.cols, V, 32, &wide) && wide.tpr < 512)
        plan = wide;
    auto kernel = norm_held_for<T, MODE, IO, EXCHANGE_PUSH, STATS, A>(plan.vpt);
    if (!kernel)
        return weft__fail(WEFT_EINVAL, "%s: no kernel for %u vectors a thread", op, plan.vpt);
    return launch_held_rows<held_ahead<T, MODE, IO, false, A>()>(op, stream, plan, kernel, p,
                                                                 SHORTEST);
}

/* launch_held_io for what the args' call reads and writes (by_io). */
template <typename T, norm_mode MODE, typename P>
int launch_held(cudaStream_t stream, const char *op, const weft__norm_args *a, const P &p,
                const row_plan &held)
{
    return by_io<T, MODE>(a, [&](auto io) {
        return launch_held_io<T, MODE, decltype(io)::value>(stream, op, p, held);
    });
}

/* f(std::integral_constant<norm_mode, M>) for the args' mode M, but
 * RMSNorm into FP8's (launch_norm_rows takes it apart: its parameters are
 * of their own type). */
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

/* The call's rows by the path and plan that their length and the tensors'
 * alignment pick (norm.cu says which), p norm_params or, for RMSNorm into
 * FP8, norm_fp8_params; out is the output as that test sees it: NULL for
 * FP8, which so plans as weft_rmsnorm does for an aligned out. */
template <typename T, typename P>
int launch_norm_rows(cudaStream_t stream, const char *op, const weft__norm_args *a, const P &p,
                     const void *out)
{
    constexpr int V = vec16<T>();
    constexpr bool FP8 = writes_fp8<P>::value;
    bool vec = aligned16(out) && aligned16(a->sum_out) && aligned16(a->in) &&
               aligned16(a->gelu_bias) && aligned16(a->residual) && aligned16(a->weight) &&
               aligned16(a->bias) && a->stride % V == 0;

    row_plan staged, held;

    /* 16 values a thread; on calls of few rows (few_rows) 8, in twice the
     * threads, as a row's latency is then the whole call. */
    const unsigned values = few_rows(a->rows) ? 8 : 16;
    if (vec && plan_held(a->cols, V, values, &held)) {
        if constexpr (FP8)
            return launch_held<T, NORM_RMS_FP8>(stream, op, a, p, held);
        else
            return by_mode(a, [&](auto mode) {
                return launch_held<T, decltype(mode)::value>(stream, op, a, p, held);
            });
    }
    if (vec && plan_staged(a->cols, V, a->residual ? 2 : 1, &staged)) {
        void (*kernel)(P, size_t, unsigned, size_t);
        if constexpr (FP8)
            kernel = norm_staged_kernel<T, false, P>;
        else
            kernel = a->gelu ? norm_staged_kernel<T, true> : norm_staged_kernel<T, false>;
        return launch_rows(op, stream, staged, p.rows, kernel, p, (size_t)staged.vpt);
    }
    if (vec)
        return launch_plan<T, V>(op, stream, plan_rows(a->cols, V), p);
    return launch_plan<T, 1>(op, stream, plan_rows(a->cols, 1), p);
}

/* launch_norm_rows for RMSNorm into FP8, one a dtype: defined with its
 * kernels in norm_rms_fp8.cu, declared in norm.cu. */
#define WEFT_NORM_FP8_ROWS(EXTERN)                                                                 \
    EXTERN template int launch_norm_rows<float>(cudaStream_t, const char *,                        \
                                                const weft__norm_args *,                           \
                                                const norm_fp8_params<float> &, const void *);     \
    EXTERN template int launch_norm_rows<__nv_bfloat16>(                                           \
        cudaStream_t, const char *, const weft__norm_args *,                                       \
        const norm_fp8_params<__nv_bfloat16> &, const void *);                                     \
    EXTERN template int launch_norm_rows<__half>(cudaStream_t, const char *,                       \
                                                 const weft__norm_args *,                          \
                                                 const norm_fp8_params<__half> &, const void *);

/* launch_held's instantiations for MODE, one a dtype: defined in the
 * mode's translation unit (WEFT_NORM_HELD(, MODE)), declared in norm.cu
 * (WEFT_NORM_HELD(extern, MODE)), which so compiles none of them. */
#define WEFT_NORM_HELD(EXTERN, MODE)                                                               \
    EXTERN template int launch_held<float, MODE>(                                                  \
        cudaStream_t, const char *, const weft__norm_args *, const held_params<float, MODE> &,     \
        const row_plan &);                                                                         \
    EXTERN template int launch_held<__nv_bfloat16, MODE>(                                          \
        cudaStream_t, const char *, const weft__norm_args *,                                       \
        const held_params<__nv_bfloat16, MODE> &, const row_plan &);                               \
    EXTERN template int launch_held<__half, MODE>(                                                 \
        cudaStream_t, const char *, const weft__norm_args *, const held_params<__half, MODE> &,    \
        const row_plan &);

} // namespace weft_ops

#endif
