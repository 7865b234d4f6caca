/*
 * norm_held.cuh - the LayerNorm/RMSNorm kernels that hold a row in
 * registers, the main path: what they form and how (norm_mode), their
 * statistics (norm_stats), what a call reads and writes (norm_io), the
 * held row itself, the kernels by values a thread, and the plans of rows
 * kept packed in half types. Rows come straight from global memory.
 * norm_launch.cuh launches them. RMSNorm into FP8 (weft_rmsnorm_fp8) is
 * RMSNorm in every choice that shapes its statistics - plan, packing,
 * sums of squares - so that its normalized row is weft_rmsnorm's bit for
 * bit; only its output differs (held_fp8_out).
 */
#ifndef WEFT_OPS_NORM_HELD_CUH
#define WEFT_OPS_NORM_HELD_CUH

#include "ops/norm.cuh"

namespace weft_ops
{

/* What a held kernel forms and how it normalizes; a template parameter,
 * so that no element pays for a choice made once per launch. NORM_RMS_FP8
 * is NORM_RMS writing its row as FP8 with a scale (weft_rmsnorm_fp8). */
enum norm_mode { NORM_LAYER, NORM_RMS, NORM_GELU_ERF_LAYER, NORM_GELU_TANH_LAYER, NORM_RMS_FP8 };

/* Whether mode is RMSNorm's, as every choice of its statistics sees it. */
__host__ __device__ static constexpr bool norm_rms(norm_mode mode)
{
    return mode == NORM_RMS || mode == NORM_RMS_FP8;
}

/* Whether mode writes FP8 with a scale a row. */
__host__ __device__ static constexpr bool norm_fp8(norm_mode mode)
{
    return mode == NORM_RMS_FP8;
}

/* Whether mode forms the row with a GELU: the fused op. */
__host__ __device__ static constexpr bool norm_gelu(norm_mode mode)
{
    return mode == NORM_GELU_ERF_LAYER || mode == NORM_GELU_TANH_LAYER;
}

/* What a held row reduces: the sum of squares (RMSNorm), or moments. */
template <norm_mode MODE>
using norm_stat = typename std::conditional<norm_rms(MODE), float, moments>::type;

/* A held kernel's parameters: norm_fp8_params for the FP8 output. */
template <typename T, norm_mode MODE>
using held_params =
    typename std::conditional<norm_fp8(MODE), norm_fp8_params<T>, norm_params<T>>::type;

/* A held row's scratch: its statistics', and for the FP8 output that of its
 * largest magnitude (a pushed scratch serves one reduction). */
template <norm_mode MODE, cluster_exchange X> struct held_scratch {
    reduce_scratch<norm_stat<MODE>, X> stats;
};
template <cluster_exchange X> struct held_scratch<NORM_RMS_FP8, X> {
    reduce_scratch<float, X> stats, amax;
};

/* How the held kernels take their statistics. LayerNorm's:
 * - STATS_WARP_PASSES: each warp's in two passes over its registers, each
 *   a butterfly of plain sums - of s, giving the warp's mean; then of the
 *   squared deviations from that mean - and the warps' moments merged
 *   (op_merge) over the row;
 * - STATS_THREAD_MOMENTS: each thread's moments, merged from the first
 *   butterfly step on (five merges a warp, each about 10 instructions and
 *   3 shuffles where a plain sum's step takes 2).
 * The two are as exact as a two-pass variance over the row (to 2e-6 of it
 * on rows of 65536, bench/ops/norm_stats_accuracy.c). RMSNorm's
 * sum of squares:
 * - STATS_TENSOR_SQUARES (half types): by the tensor cores, from the row
 *   as kept (reduce.cuh's tensor_squares);
 * - STATS_WARP_PASSES: by the FMA pipe, in the pass that forms s (the
 *   only other form RMSNorm has: held_stats_as names it so).
 * STATS_TUNED is whichever held_stats picks for the kernel; the library
 * names another only for calls of few rows (norm_launch.cuh). */
enum norm_stats { STATS_TUNED, STATS_WARP_PASSES, STATS_THREAD_MOMENTS, STATS_TENSOR_SQUARES };

/* The statistics of the library's held kernels. The warps' passes issue
 * fewer instructions but put a warp's sum on the critical path before the
 * squared deviations: they win where the kernel is bound by what it
 * issues, and lose where the row's reduction is its latency or where
 * their registers spill. So:
 * - the fused op in half types, its GELU issuing most: passes at 32
 *   values a thread; but fp16's kernel at 64 values, whose GELU fit is
 *   longer, spills with them: moments;
 * - the fused op in fp32: moments (passes lose on rows a block of 1024
 *   holds alone);
 * - LayerNorm's packed rows: moments (passes lose on long rows); its
 *   other rows: passes;
 * - RMSNorm in half types at up to 16 values a thread, unpacked: the
 *   tensor cores' squares, the more so the longer the row (on rows of 512,
 *   a warp each, they are slightly behind). Their mma chain, two a
 *   vector, is the longest on the row's critical path: packed rows keep
 *   the FMA pipe, and so do calls of few rows, bound by that path
 *   (norm_launch.cuh's launch_held_io).
 * LayerNorm's variance as E[s^2] - E[s]^2 (checked for cancellation) is
 * no form here: its registers spill. */
template <typename T, int VPT, norm_mode MODE, bool PACKED>
__host__ __device__ constexpr norm_stats held_stats()
{
    if constexpr (norm_rms(MODE)) {
        return sizeof(T) == 2 && !PACKED && VPT * vec16<T>() <= 16 ? STATS_TENSOR_SQUARES
                                                                   : STATS_WARP_PASSES;
    } else if constexpr (norm_gelu(MODE)) {
        constexpr bool fp16 = std::is_same<T, __half>::value;
        return sizeof(T) == 4 || (fp16 && VPT * vec16<T>() > 32) ? STATS_THREAD_MOMENTS
                                                                 : STATS_WARP_PASSES;
    } else {
        return PACKED ? STATS_THREAD_MOMENTS : STATS_WARP_PASSES;
    }
}

/* The statistics STATS stands for in a held kernel, one name for each
 * form (RMSNorm's FMA pipe is STATS_WARP_PASSES): the kernels are
 * instantiated with it, so that a form asked for by name and the same
 * form tuned are one kernel. */
template <typename T, int VPT, norm_mode MODE, bool PACKED, norm_stats STATS>
__host__ __device__ constexpr norm_stats held_stats_as()
{
    static_assert(STATS != STATS_TENSOR_SQUARES || (sizeof(T) == 2 && norm_rms(MODE)),
                  "the tensor cores' squares are RMSNorm's, in half types");
    constexpr norm_stats S = STATS == STATS_TUNED ? held_stats<T, VPT, MODE, PACKED>() : STATS;
    return norm_rms(MODE) && S != STATS_TENSOR_SQUARES ? STATS_WARP_PASSES : S;
}

/* What a held row reads and writes besides in and out. The common calls
 * (norm_launch.cuh's by_io) have it fixed at compile time, on rows of whole
 * vectors (cols a multiple of V), so that no vector pays for a test of a
 * pointer or keeps a partial-vector path; NORM_IO_CHECKED takes every
 * other call: what p holds, tested at run time, rows of any length. */
enum norm_io : unsigned {
    NORM_IO_RESIDUAL = 1,
    NORM_IO_GELU_BIAS = 2,
    NORM_IO_WEIGHT = 4,
    NORM_IO_BIAS = 8,
    NORM_IO_SUM_OUT = 16,
    NORM_IO_CHECKED = 32,
};

/* Whether a row of IO has the tensor at ptr (its bit in norm_io). */
template <unsigned IO> __device__ __forceinline__ bool io_has(const void *ptr, unsigned bit)
{
    return IO & NORM_IO_CHECKED ? ptr != nullptr : (IO & bit) != 0;
}

/* Whether a held kernel asks L2 for a row ahead of the one it holds
 * (norm_held_kernel's AHEAD; norm_launch.cuh's launch_held_rows says how
 * far): AHEAD_TUNED where that is faster (held_ahead), AHEAD_OFF and
 * AHEAD_ON for the calls that norm_launch.cuh decides apart. */
enum norm_ahead { AHEAD_TUNED, AHEAD_OFF, AHEAD_ON };

/* Which held kernels ask L2 ahead (rows of 4096 and more, 4 MiB of their
 * inputs ahead): a kernel bound by its loads gains, one bound by what it
 * issues (the fused op's GELU in half types) loses, and a packed row,
 * whose kernel holds more of the row a thread, loses. So:
 * - RMSNorm: on, but fp16's packed rows;
 * - add+LayerNorm: on in fp32 and where the row is not packed;
 * - LayerNorm of one input: on in bf16; off in fp32 (one kernel takes
 *   rows a block holds, where it gains, and rows over a cluster, where it
 *   loses more) and in fp16 (level);
 * - the fused op: on in fp32 only.
 * Calls whose inputs are tested at run time (NORM_IO_CHECKED): off, as
 * nothing shows they gain. */
template <typename T, norm_mode MODE, unsigned IO, bool PACKED, norm_ahead A>
__host__ __device__ constexpr bool held_ahead()
{
    constexpr bool F32 = sizeof(T) == 4, RESIDUAL = (IO & NORM_IO_RESIDUAL) != 0;
    constexpr bool F16 = std::is_same<T, __half>::value;
    constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
    if constexpr (A != AHEAD_TUNED)
        return A == AHEAD_ON;
    else if constexpr ((IO & NORM_IO_CHECKED) != 0)
        return false;
    else if constexpr (norm_rms(MODE))
        return !(F16 && PACKED);
    else if constexpr (norm_gelu(MODE))
        return F32;
    else
        return RESIDUAL ? F32 || !PACKED : BF16;
}

/* Whether rows shorter than AHEAD_SHORTEST ask L2 ahead too, where their
 * inputs fill AHEAD_SHORT_BYTES a row (norm_launch.cuh's launch_held_io),
 * which is faster for the norms in fp32 and for RMSNorm and add+LayerNorm
 * in half types (rows of 512 bytes lose); not LayerNorm of one input in
 * half types, nor the fused op, which gain nothing. */
template <typename T, norm_mode MODE, unsigned IO> constexpr bool short_rows_ahead()
{
    if constexpr ((IO & NORM_IO_CHECKED) != 0 || norm_gelu(MODE))
        return false;
    else
        return sizeof(T) == 4 || norm_rms(MODE) || (IO & NORM_IO_RESIDUAL) != 0;
}

/* How many of a held row's elements this thread holds (part: of each
 * vector), and their squared deviations from mean. Past the row's end s
 * is 0 but its deviation is not, so those elements are left out by index:
 * the row's one partial vector is masked, vectors past the end skipped. */
template <int VPT> __device__ __forceinline__ int part_count(const int (&part)[VPT])
{
    int count = 0;
#pragma unroll
    for (int k = 0; k < VPT; k++)
        count += part[k];
    return count;
}
template <int V, int VPT>
__device__ __forceinline__ float squared_deviations(const float (&x)[VPT][V],
                                                    const int (&part)[VPT], float mean)
{
    float m2 = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
#pragma unroll
        for (int e = 0; e < V; e++) {
            if (part[k] == V || e < part[k]) {
                float d = x[k][e] - mean;
                m2 += d * d;
            }
        }
    }
    return m2;
}

/* This thread's part of a held row (sum: of its s), as
 * STATS_THREAD_MOMENTS takes it: how many elements, their mean, their
 * squared deviations from it. */
template <int V, int VPT>
__device__ __forceinline__ moments part_moments(const float (&x)[VPT][V], const int (&part)[VPT],
                                                float sum)
{
    const int count = part_count(part);
    /* an approximate quotient: the parts' rounding errors average out in
     * the merge, and to first order leave m2 as it is */
    const float mean = count ? __fdividef(sum, (float)count) : 0.0f;
    return {(float)count, mean, squared_deviations(x, part, mean)};
}

/* This warp's part of a held row (sum: this thread's of its s), as
 * STATS_WARP_PASSES takes it: how many elements, their mean, their
 * squared deviations from it, the same in every lane. */
template <int V, int VPT>
__device__ __forceinline__ moments warp_moments(const float (&x)[VPT][V], const int (&part)[VPT],
                                                float sum)
{
    const float n = (float)__reduce_add_sync(0xffffffffu, (unsigned)part_count(part));
    sum = warp_reduce(sum, op_sum());
    const float mean = n > 0.0f ? __fdiv_rn(sum, n) : 0.0f;
    return {n, mean, warp_reduce(squared_deviations(x, part, mean), op_sum())};
}

/* The FP8 output of a held row (NORM_RMS_FP8), weft_quantize_fp8's on the
 * row norm_held_row has normalized and rounded to T in y (packed in kept,
 * when PACKED), amax this thread's largest magnitude of it: the row's
 * largest (a maximum, the same in any order), its scale, each value's
 * code. */
template <typename T, int VPT, bool PACKED, typename Index, cluster_exchange X>
__device__ __forceinline__ void
held_fp8_out(const norm_fp8_params<T> &p, const row_place &at, const Index (&j)[VPT],
             const int (&part)[VPT], float (&y)[VPT][vec16<T>()], const uint4 (&kept)[VPT],
             float amax, reduce_scratch<float, X> &scratch, unsigned cluster)
{
    constexpr int V = vec16<T>();
    const float scale = fp8_scale(row_reduce(amax, op_max(), scratch, cluster), p.q_type);
    if (at.tid == 0 && at.rank == 0)
        p.scales[at.row] = scale;
    if constexpr (PACKED)
        unpack_kept<T, V, VPT>(y, kept);
    __nv_fp8_storage_t *q = p.q + at.row * p.q_stride;
#pragma unroll
    for (int k = 0; k < VPT; k++)
        if (part[k] != 0)
            store_codes<V>(q + j[k], y[k], part[k], scale, p.q_type, p.q_whole);
}

/*
 * One row of the held kernels (rows.cuh): each thread loads its VPT
 * vectors of in and the residual when there is one, and of the per-column
 * biases and weights, at once, forms s in registers, and takes the
 * statistics and writes the output from there. Elements past the row's
 * end load as 0 and form s = 0 (GELU(0) = 0), so the sums need no mask.
 * LayerNorm's statistics are one reduction of moments over the row,
 * RMSNorm's of its sum of squares (STATS says whose: norm_stats).
 */
template <typename T, int VPT, norm_mode MODE, unsigned IO, bool PACKED, norm_stats STATS,
          cluster_exchange X>
__device__ __forceinline__ void norm_held_row(const held_params<T, MODE> &p, const row_place &at,
                                              const global_row<T, vec16<T>()> &in,
                                              const global_row<T, vec16<T>()> &res,
                                              held_scratch<MODE, X> &scratch, unsigned cluster)
{
    constexpr int V = vec16<T>();
    constexpr norm_stats S = held_stats_as<T, VPT, MODE, PACKED, STATS>();
    constexpr bool GELU = norm_gelu(MODE);
    constexpr weft_gelu_form FORM = MODE == NORM_GELU_TANH_LAYER ? WEFT_GELU_TANH : WEFT_GELU_ERF;
    const bool has_res = io_has<IO>(p.residual, NORM_IO_RESIDUAL);
    const bool has_gb = GELU && io_has<IO>(p.gelu_bias, NORM_IO_GELU_BIAS);
    const bool has_w = io_has<IO>(p.weight, NORM_IO_WEIGHT);
    const bool has_b = io_has<IO>(p.bias, NORM_IO_BIAS);
    const bool has_sum = io_has<IO>(p.sum_out, NORM_IO_SUM_OUT);
    using Index = decltype(held_at<V, VPT>(at, 0));
    const Index cols = (Index)p.cols;
    Index j[VPT];
    int part[VPT];
    uint4 raw_in[VPT], raw_res[VPT], raw_gb[VPT];

#pragma unroll
    for (int k = 0; k < VPT; k++) {
        j[k] = held_at<V, VPT>(at, k);
        part[k] = IO & NORM_IO_CHECKED ? part_of<V>(j[k], cols) : j[k] < cols ? V : 0;
        raw_in[k] = raw_res[k] = raw_gb[k] = make_uint4(0, 0, 0, 0);
        if (part[k] == 0)
            continue;
        raw_in[k] = in.at(j[k], part[k]);
        if (has_res)
            raw_res[k] = res.at(j[k], part[k]);
        if (has_gb)
            raw_gb[k] = part[k] == V ? load_param(p.gelu_bias + j[k])
                                     : load_partial<T, V>(p.gelu_bias + j[k], part[k]);
    }

    /* s, as the host forms and rounds it; the sum (of squares, RMS).
     * PACKED keeps s as T between the passes (it is rounded to T, or is
     * in), and unpacks it again for each; the tensor cores take it so.
     * KEEPS: kept holds s (where s is not in, packed for one of them). */
    constexpr bool KEEPS = PACKED || S == STATS_TENSOR_SQUARES;
    float x[VPT][V], acc = 0.0f;
    uint4 kept[VPT];
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        unpack<T, V>(x[k], raw_in[k]);
        kept[k] = raw_in[k];
        if (GELU || has_res) {
            float r[V], g[V];
            unpack<T, V>(r, raw_res[k]);
            unpack<T, V>(g, raw_gb[k]);
#pragma unroll
            for (int e = 0; e < V; e++) {
                float h = x[k][e];
                if (GELU)
                    h = gelu<T>(FORM, has_gb ? h + g[e] : h);
                /* the host's rounding of the add: never fused into GELU's
                 * last multiply; then to T, as the host rounds s */
                x[k][e] = round_to<T>(has_res ? __fadd_rn(h, r[e]) : h);
            }
            /* s rounded element by element (round_to), which is faster
             * than packing and unpacking s to round it */
            if (KEEPS)
                kept[k] = pack<T, V>(x[k]);
        }
#pragma unroll
        for (int e = 0; e < V; e++)
            acc = accumulate(acc, x[k][e], norm_rms(MODE));
    }
    const float inv_n = 1.0f / (float)p.cols;
    float mean, rstd;
    if constexpr (norm_rms(MODE)) {
        float squares = acc;
        if constexpr (S == STATS_TENSOR_SQUARES) {
            tensor_squares<T> tc;
#pragma unroll
            for (int k = 0; k < VPT; k++)
                tc.add(kept[k]);
            squares = tc.lane_part();
        }
        rstd = rms_rstd(row_reduce(squares, op_sum(), scratch.stats, cluster) * inv_n, p.eps);
        mean = 0.0f;
    } else {
        if constexpr (PACKED)
            unpack_kept<T, V, VPT>(x, kept);
        moments m = S == STATS_WARP_PASSES ? warps_reduce(warp_moments<V, VPT>(x, part, acc),
                                                          op_merge(), scratch.stats, cluster)
                                           : row_reduce(part_moments<V, VPT>(x, part, acc),
                                                        op_merge(), scratch.stats, cluster);
        mean = m.mean;
        rstd = rsqrtf(m.m2 * inv_n + p.eps);
    }

    T *out = norm_fp8(MODE) ? nullptr : p.out + at.row * p.stride;
    T *sum_out = has_sum ? p.sum_out + at.row * p.stride : nullptr;
    if constexpr (PACKED)
        unpack_kept<T, V, VPT>(x, kept);
    /* the FP8 output's largest magnitude (held_fp8_out); x becomes its row */
    [[maybe_unused]] float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        if (part[k] == 0)
            continue;
        float w[V], b[V], y[V];
        if (has_w)
            unpack<T, V>(w, part[k] == V ? load_param(p.weight + j[k])
                                         : load_partial<T, V>(p.weight + j[k], part[k]));
        if (has_b)
            unpack<T, V>(b, part[k] == V ? load_param(p.bias + j[k])
                                         : load_partial<T, V>(p.bias + j[k], part[k]));
#pragma unroll
        for (int e = 0; e < V; e++) {
            /* (s - mean) * rstd, times w, plus b: the host's order, with
             * the last two fused */
            float v = (x[k][e] - mean) * rstd;
            if (has_w && has_b)
                v = fmaf(v, w[e], b[e]);
            else if (has_w)
                v *= w[e];
            else if (has_b)
                v += b[e];
            y[e] = v;
        }
        if constexpr (norm_fp8(MODE)) {
            if (has_sum) {
                if (part[k] == V)
                    store_streamed(sum_out + j[k], KEEPS ? kept[k] : pack<T, V>(x[k]));
                else
                    store_partial<T, V>(sum_out + j[k], x[k], part[k]);
            }
            /* y as weft_rmsnorm stores it and weft_quantize_fp8 reads it;
             * past the row's end it is 0 (or NaN), which adds nothing */
#pragma unroll
            for (int e = 0; e < V; e++) {
                x[k][e] = round_to<T>(y[e]);
                amax = fmaxf(amax, fabsf(x[k][e]));
            }
            if constexpr (PACKED)
                kept[k] = pack<T, V>(x[k]);
        } else if (part[k] == V) {
            if (has_sum)
                store_streamed(sum_out + j[k], KEEPS ? kept[k] : pack<T, V>(x[k]));
            store_streamed(out + j[k], pack<T, V>(y));
        } else {
            if (has_sum)
                store_partial<T, V>(sum_out + j[k], x[k], part[k]);
            store_partial<T, V>(out + j[k], y, part[k]);
        }
    }
    if constexpr (norm_fp8(MODE))
        held_fp8_out<T, VPT, PACKED>(p, at, j, part, x, kept, amax, scratch.amax, cluster);
}

/* norm_held_kernel's launch bounds: threads a block, blocks resident an SM. */
__host__ __device__ constexpr unsigned held_threads(bool packed)
{
    return packed ? 1024 : 512;
}
__host__ __device__ constexpr unsigned held_resident(bool packed, int vpt, int v)
{
    return !packed && vpt * v <= 16 ? 2 : 1;
}

/* The held kernel: a row a block (or a cluster, or a warp), straight from
 * global memory. At 16 values a thread or fewer, at most 64 registers:
 * four blocks of 256 threads stay resident (left to itself, ptxas gives
 * the fp32 GELU form more registers, two blocks, and the fused op runs a
 * quarter slower). PACKED (half types) keeps the row as T, up to 64 values
 * a thread in 64 registers, in blocks of up to 1024 threads: a row of
 * 65536 in one block, or twice the resident blocks of the fp32 form.
 * STATS is norm_held_row's. AHEAD (held_ahead) has each warp ask L2 for
 * its share of the row `lead` rows on, before it loads its own (lead 0:
 * none). */
template <typename T, int VPT, norm_mode MODE, unsigned IO, cluster_exchange X = EXCHANGE_BARRIERS,
          bool PACKED = false, norm_stats STATS = STATS_TUNED, bool AHEAD = false,
          typename P = held_params<T, MODE>>
__global__ void __launch_bounds__(held_threads(PACKED), held_resident(PACKED, VPT, vec16<T>()))
    norm_held_kernel(P p, size_t row0, unsigned cluster, size_t lead)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
    constexpr int V = vec16<T>();
    __shared__ held_scratch<MODE, X> scratch;
    if constexpr (pushes(X) && norm_fp8(MODE))
        push_setup(cluster, scratch.stats, scratch.amax);
    else if constexpr (pushes(X))
        push_setup(cluster, scratch.stats);
    const row_place at = place_row<V>(row0, cluster, 1, VPT);
    if (at.row >= p.rows) /* only whole idle warps (a warp per row) */
        return;
    if (AHEAD && lead != 0 && at.row + lead < p.rows) {
        const size_t ahead = (at.row + lead) * p.stride;
        prefetch_held_share<T, V, VPT>(p.in + ahead, at.rank, p.cols);
        if (p.residual)
            prefetch_held_share<T, V, VPT>(p.residual + ahead, at.rank, p.cols);
    }
    const global_row<T, V> in = {p.in + at.row * p.stride};
    const global_row<T, V> res = {p.residual ? p.residual + at.row * p.stride : nullptr};
    norm_held_row<T, VPT, MODE, IO, PACKED, STATS>(p, at, in, res, scratch, cluster);
}

/* The held kernel for plan.vpt, or NULL when there is none. */
template <typename T, norm_mode MODE, unsigned IO, cluster_exchange X = EXCHANGE_BARRIERS,
          norm_stats STATS = STATS_TUNED, norm_ahead A = AHEAD_TUNED>
static void (*norm_held_for(unsigned vpt))(held_params<T, MODE>, size_t, unsigned, size_t)
{
    return held_vpt<vec16<T>()>(vpt, [](auto k) {
        constexpr int VPT = decltype(k)::value;
        return norm_held_kernel<T, VPT, MODE, IO, X, false,
                                held_stats_as<T, VPT, MODE, false, STATS>(),
                                held_ahead<T, MODE, IO, false, A>()>;
    });
}

/* The packed held kernel (half types) for plan.vpt, or NULL when there is
 * none; instantiated from FEWEST values a thread up. */
template <typename T, norm_mode MODE, unsigned IO, cluster_exchange X = EXCHANGE_BARRIERS,
          unsigned FEWEST = 1, norm_stats STATS = STATS_TUNED, norm_ahead A = AHEAD_TUNED>
static void (*norm_packed_for(unsigned vpt))(held_params<T, MODE>, size_t, unsigned, size_t)
{
    static_assert(sizeof(T) == 2, "a packed row is of a half type");
    using kernel = void (*)(held_params<T, MODE>, size_t, unsigned, size_t);
    return by_vpt<PACKED_MAX_VALUES / vec16<T>()>(
        vpt,
        [](auto k) -> kernel {
            constexpr int VPT = decltype(k)::value;
            if constexpr (VPT * vec16<T>() < FEWEST)
                return nullptr;
            else
                return norm_held_kernel<T, VPT, MODE, IO, X, true,
                                        held_stats_as<T, VPT, MODE, true, STATS>(),
                                        held_ahead<T, MODE, IO, true, A>()>;
        },
        [] { return (kernel) nullptr; });
}

/* Whether the library keeps a row of a half type packed
 * (norm_held_row's PACKED), and its plan:
 * - the fused op, whose GELU's registers cost occupancy as fp32: at 32
 *   values a thread, 64 on rows longer than 8192 (+43% at 4096x16384),
 *   unless the call's rows are few (few_rows), where the latency of a row
 *   is the whole time and more threads a row win (small inputs: 3.0 us a
 *   call as fp32, 3.8 packed);
 * - LayerNorm and RMSNorm on rows over 8192, or over 32768 with a
 *   residual: at 64 values a thread, in one block of up to 512 threads
 *   where that holds the row, else over a cluster of blocks of 256.
 *   Against the fp32 plans (bf16, 12288 to 131072), LayerNorm gains 3-34%
 *   and RMSNorm 5-26% (but is 1-2% behind at 16384), the longer the row
 *   the more; add+LayerNorm gains 3-6% beyond 32768 and is 2-3% behind at
 *   32768. Clusters of blocks of 256 beat one block of 1024 by 2-6% on
 *   rows of 65536 and 131072; on rows of 32768 one block of 512 beats a
 *   cluster of two of 256 by up to 6%.
 * The packed kernels of fp16, and those that test the call's inputs at run
 * time (`checked`: NORM_IO_CHECKED), spill (ptxas: 40-390 and 760-2140
 * bytes a thread, where bf16's with their inputs fixed spill 0-16). fp16's
 * LayerNorm never packs: its fp32 plan runs 17% faster at 1024x65536, 40%
 * with a residual, and 50-66% on rows of 12288 and 16384. fp16's RMSNorm
 * (13% faster packed at 1024x65536, 2-7% slower at 12288 and 16384) and
 * the checked LayerNorm pack only rows over 16384, where the fp32 plan
 * takes a cluster (there packing makes the checked LayerNorm 3-25% faster
 * in bf16). The checked RMSNorm never packs: packed it ran 1.2-1.7x slower
 * on rows of 32768 and 65536. norm_packs says which
 * never pack, whose packed kernels are so not compiled.
 */
template <typename T, norm_mode MODE> constexpr bool norm_packs(bool checked)
{
    return sizeof(T) == 2 && !(std::is_same<T, __half>::value && MODE == NORM_LAYER) &&
           !(checked && norm_rms(MODE));
}

template <typename T, norm_mode MODE>
static bool norm_packed_plan(size_t rows, size_t cols, bool residual, bool checked,
                             row_plan *packed)
{
    constexpr int V = vec16<T>();
    constexpr bool FP16 = std::is_same<T, __half>::value;
    if (!norm_packs<T, MODE>(checked))
        return false;
    if constexpr (norm_gelu(MODE)) {
        const unsigned values = cols <= 8192 ? 32u : (unsigned)PACKED_MAX_VALUES;
        return !few_rows(rows) && plan_packed(cols, V, values, packed);
    }
    constexpr unsigned VALUES = PACKED_MAX_VALUES;
    if (cols <= (checked || FP16 ? 16384u : residual ? 32768u : 8192u))
        return false;
    if (plan_held(cols, V, VALUES, packed, VALUES, 512) && packed->cluster == 1)
        return true;
    return plan_held(cols, V, VALUES, packed, VALUES, 256);
}

} // namespace weft_ops

#endif
