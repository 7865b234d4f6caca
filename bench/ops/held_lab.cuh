/*
 * held_lab.cuh - the lab's copy of the library's held norm kernel
 * (src/ops/norm_held.cuh) and its launch (norm_launch.cuh) with the knobs
 * the library does not set, so that bench/ops times them beside the
 * library's own kernels:
 * - RESIDENT: blocks of 256 threads bounded to that many resident an SM,
 *   in fewer registers (packed_quads_b2/b3, packed_b5/b6);
 * - FIT: another GELU fit than the library's for the dtype (half_fit);
 * - TPR: the threads of a row fixed at compile time, a row a block, so
 *   that the row's pointers are uniform (tpr_packed_*);
 * - Row and Read: where the row's vectors come from (global memory, or a
 *   slot of ring.cuh's ring) and what runs once every thread has read
 *   them (the ring kernels free the slot);
 * - block_rows in lab_plan_held: rows a warp holds given a block each
 *   (the ring kernels' plan);
 * - STATS, A and reach in lab_launch_held_io: the library's kernels with
 *   their statistics or asking L2 ahead forced (the lib_* variants).
 * With every knob at its default, lab_held_kernel is the library's
 * norm_held_kernel, the same code, kept in step by hand (sass_same.py
 * tells whether a change moved the kernels of either). The library keeps
 * only what it dispatches; a knob that wins moves there in plain form.
 */
#ifndef WEFT_BENCH_OPS_HELD_LAB_CUH
#define WEFT_BENCH_OPS_HELD_LAB_CUH

#include "ops/norm_launch.cuh"

namespace weft_ops::lab
{

/* TPR, where set, is the threads of a row fixed at compile time, a row a
 * block (blockDim (TPR, 1)): the row is then the same for every thread,
 * and what is computed from it alone (its pointers) lives in uniform
 * registers, not in each thread's. */
template <int V, unsigned TPR = 0>
__device__ __forceinline__ row_place lab_place_row(size_t row0, unsigned cluster, size_t tiles,
                                                   unsigned vpt)
{
    row_place p;
    /* no division (tens of instructions a thread): a row over a cluster
     * (launch_rows launches `cluster` blocks a cluster along x) reads its
     * place from the cluster's registers */
    const unsigned group = cluster == 1 ? blockIdx.x : __clusterIdx().x;
    p.tid = threadIdx.x;
    p.rank = cluster == 1 ? 0 : __clusterRelativeBlockRank();
    p.row = TPR ? row0 + group : row0 + (size_t)group * blockDim.y + threadIdx.y;
    p.tile = (size_t)blockDim.x * vpt * V;
    p.first = (size_t)p.rank * tiles;
    return p;
}

/* Where this thread's vector k lies in its row (elements), for the held
 * layout: vector k of thread t of block `rank` at ((rank * VPT + k) * TPR + t) * V. */
template <int V, int VPT, unsigned TPR = 0>
__device__ __forceinline__ auto lab_held_at(const row_place &at, int k)
{
    if constexpr (TPR != 0) {
        /* signed, so that the compiler may take k's part out of the sum
         * into each access's immediate offset */
        return (((int)at.rank * VPT + k) * (int)TPR + (int)at.tid) * V;
    } else {
        return ((at.rank * VPT + k) * blockDim.x + at.tid) * V;
    }
}

/* rows.cuh's plan_held with `block_rows`: rows that a warp holds take a
 * block each (the ring kernels' plan) where it is set, else a warp each. */
static inline bool lab_plan_held(size_t cols, int V, unsigned values, row_plan *p,
                                 bool block_rows = false, unsigned most_values = HELD_MAX_VALUES,
                                 unsigned max_tpr = 512)
{
    const size_t nvec = (cols + V - 1) / V;
    const size_t want = values / V; /* vectors a thread, as asked */
    const size_t most = most_values / V;

    *p = {32, 8, 1, 1, 1, 0};
    if (nvec <= 32 * (block_rows ? want : most)) { /* a warp per row */
        p->rpb = block_rows ? 1 : 8;
        p->vpt = (unsigned)pow2_at_least((nvec + 31) / 32);
        return true;
    }
    p->rpb = 1;
    size_t threads = pow2_at_least((nvec + want - 1) / want);
    if (threads <= max_tpr) {
        p->tpr = (unsigned)threads;
        p->vpt = (unsigned)pow2_at_least((nvec + threads - 1) / threads);
        return true;
    }
    /* long rows: the fewest blocks that hold the row with up to `most`
     * values a thread (measured: a cluster's synchronisation costs more
     * than the longer passes) */
    p->tpr = max_tpr;
    for (size_t c = 1; c <= 8; c *= 2) {
        size_t vpt = pow2_at_least((nvec + max_tpr * c - 1) / (max_tpr * c));
        if (vpt <= most) {
            p->cluster = (unsigned)c;
            p->vpt = (unsigned)vpt;
            return true;
        }
    }
    return false;
}

/* One row of the lab's held kernels: norm_held.cuh's norm_held_row, the
 * row's vectors from `in` and `res` (Row: global_row, or ring.cuh's
 * slot_row), read() run once every thread of the row has read its vectors,
 * the GELU's fit FIT, and TPR the threads of a row fixed at compile time
 * (lab_held_at). */
template <typename T, int VPT, norm_mode MODE, unsigned IO, bool PACKED,
          gelu_fit FIT = gelu_fit_for<T>(), unsigned TPR = 0, norm_stats STATS = STATS_TUNED,
          typename Row, typename Read, cluster_exchange X>
__device__ __forceinline__ void
lab_held_row(const norm_params<T> &p, const row_place &at, const Row &in, const Row &res, Read read,
             reduce_scratch<norm_stat<MODE>, X> &scratch, unsigned cluster)
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
    using Index = decltype(lab_held_at<V, VPT, TPR>(at, 0));
    const Index cols = (Index)p.cols;
    Index j[VPT];
    int part[VPT];
    uint4 raw_in[VPT], raw_res[VPT], raw_gb[VPT];

#pragma unroll
    for (int k = 0; k < VPT; k++) {
        j[k] = lab_held_at<V, VPT, TPR>(at, k);
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
                    h = gelu<T, FIT>(FORM, has_gb ? h + g[e] : h);
                /* the host's rounding of the add: never fused into GELU's
                 * last multiply; then to T, as the host rounds s */
                x[k][e] = round_to<T>(has_res ? __fadd_rn(h, r[e]) : h);
            }
            /* Rounding element by element ran 1-4% faster in bf16 than
             * packing and unpacking s to round it (bench/RESULTS.md,
             * 2026-12-01 00:02, the fused op's former variant round_each). */
            if (KEEPS)
                kept[k] = pack<T, V>(x[k]);
        }
#pragma unroll
        for (int e = 0; e < V; e++)
            acc += MODE == NORM_RMS ? x[k][e] * x[k][e] : x[k][e];
    }
    const float inv_n = 1.0f / (float)p.cols;
    float mean, rstd;
    if constexpr (MODE == NORM_RMS) {
        float squares = acc;
        if constexpr (S == STATS_TENSOR_SQUARES) {
            tensor_squares<T> tc;
#pragma unroll
            for (int k = 0; k < VPT; k++)
                tc.add(kept[k]);
            squares = tc.lane_part();
        }
        rstd = rms_rstd(row_reduce(squares, op_sum(), scratch, cluster) * inv_n, p.eps);
        mean = 0.0f;
        read();
    } else {
        if constexpr (PACKED)
            unpack_kept<T, V, VPT>(x, kept);
        moments m =
            S == STATS_WARP_PASSES
                ? warps_reduce(warp_moments<V, VPT>(x, part, acc), op_merge(), scratch, cluster)
                : row_reduce(part_moments<V, VPT>(x, part, acc), op_merge(), scratch, cluster);
        read();
        mean = m.mean;
        rstd = rsqrtf(m.m2 * inv_n + p.eps);
    }

    T *out = p.out + at.row * p.stride;
    T *sum_out = has_sum ? p.sum_out + at.row * p.stride : nullptr;
    if constexpr (PACKED)
        unpack_kept<T, V, VPT>(x, kept);
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
        if (part[k] == V) {
            if (has_sum)
                store_streamed(sum_out + j[k], KEEPS ? kept[k] : pack<T, V>(x[k]));
            store_streamed(out + j[k], pack<T, V>(y));
        } else {
            if (has_sum)
                store_partial<T, V>(sum_out + j[k], x[k], part[k]);
            store_partial<T, V>(out + j[k], y, part[k]);
        }
    }
}

/* lab_held_kernel's launch bounds: threads a block, blocks resident an SM. */
__host__ __device__ constexpr unsigned lab_held_threads(bool packed, unsigned resident)
{
    return resident ? 256 : packed ? 1024 : 512;
}
__host__ __device__ constexpr unsigned lab_held_resident(bool packed, int vpt, int v,
                                                         unsigned resident)
{
    return resident ? resident : !packed && vpt * v <= 16 ? 2 : 1;
}

/* The lab's held kernel: norm_held.cuh's norm_held_kernel, with RESIDENT,
 * where set, bounding blocks to 256 threads and asking for that many
 * resident an SM, in fewer registers; FIT, TPR and STATS are
 * lab_held_row's. */
template <typename T, int VPT, norm_mode MODE, unsigned IO, cluster_exchange X = EXCHANGE_BARRIERS,
          bool PACKED = false, unsigned RESIDENT = 0, gelu_fit FIT = gelu_fit_for<T>(),
          unsigned TPR = 0, norm_stats STATS = STATS_TUNED, bool AHEAD = false>
__global__ void __launch_bounds__(lab_held_threads(PACKED, RESIDENT),
                                  lab_held_resident(PACKED, VPT, vec16<T>(), RESIDENT))
    lab_held_kernel(norm_params<T> p, size_t row0, unsigned cluster, size_t lead)
{
    constexpr int V = vec16<T>();
    __shared__ reduce_scratch<norm_stat<MODE>, X> scratch;
    if constexpr (pushes(X))
        push_setup(cluster, scratch);
    const row_place at = lab_place_row<V, TPR>(row0, cluster, 1, VPT);
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
    lab_held_row<T, VPT, MODE, IO, PACKED, FIT, TPR, STATS>(
        p, at, in, res, [] {}, scratch, cluster);
}

/* The packed lab kernel (half types) for plan.vpt, or NULL when there is
 * none; instantiated from FEWEST values a thread up. */
template <typename T, norm_mode MODE, unsigned IO, cluster_exchange X = EXCHANGE_BARRIERS,
          unsigned FEWEST = 1, unsigned RESIDENT = 0, gelu_fit FIT = gelu_fit_for<T>(),
          norm_stats STATS = STATS_TUNED, norm_ahead A = AHEAD_TUNED>
static void (*lab_packed_for(unsigned vpt))(norm_params<T>, size_t, unsigned, size_t)
{
    static_assert(sizeof(T) == 2, "a packed row is of a half type");
    using kernel = void (*)(norm_params<T>, size_t, unsigned, size_t);
    return by_vpt<PACKED_MAX_VALUES / vec16<T>()>(
        vpt,
        [](auto k) -> kernel {
            constexpr int VPT = decltype(k)::value;
            if constexpr (VPT * vec16<T>() < FEWEST)
                return nullptr;
            else
                return lab_held_kernel<T, VPT, MODE, IO, X, true, RESIDENT, FIT, 0,
                                       held_stats_as<T, VPT, MODE, true, STATS>(),
                                       held_ahead<T, MODE, IO, true, A>()>;
        },
        [] { return (kernel) nullptr; });
}

/* How far a lab launch asks L2 ahead: rows.cuh's held_lead. */
struct ahead_reach {
    size_t window = AHEAD_WINDOW;     /* bytes of the inputs */
    size_t shortest = AHEAD_SHORTEST; /* rows under this ask for none */
};

/* launch_rows for the held kernel, with its lead where it asks L2 for
 * rows ahead (AHEAD). */
template <bool AHEAD, typename T, typename K>
static int lab_launch_held_rows(const char *op, cudaStream_t stream, const row_plan &plan, K kernel,
                                const norm_params<T> &p, ahead_reach reach)
{
    const size_t lead =
        AHEAD ? held_lead(plan, p.rows, p.cols, ahead_row_bytes(p), reach.window, reach.shortest)
              : 0;
    return launch_rows(op, stream, plan, p.rows, kernel, p, lead);
}

/* norm_launch.cuh's launch_held_io, the library's kernels under its
 * plans, with the knobs the library sets only on its own paths forced for
 * the whole call: the statistics (STATS), whether the kernels ask L2 for
 * rows ahead (A) and how far (reach). With STATS_TUNED, AHEAD_TUNED and
 * the default reach it is launch_held_io. */
template <typename T, norm_mode MODE, unsigned IO, norm_stats STATS = STATS_TUNED,
          norm_ahead A = AHEAD_TUNED>
int lab_launch_held_io(cudaStream_t stream, const char *op, const norm_params<T> &p,
                       const row_plan &held, ahead_reach reach = {})
{
    constexpr int V = vec16<T>();
    /* RMSNorm's squares by the tensor cores (norm_held.cuh's held_stats)
     * make a row's critical path longer: calls of few rows (few_rows),
     * where one row's latency is the whole time, keep the FMA pipe's,
     * 0.2 us a call faster (4 to 64 rows of 4096: bench/RESULTS.md,
     * 2026-12-02 01:05), and in the kernels that ask L2 for nothing ahead,
     * as those calls have no rows to wait. */
    if constexpr (MODE == NORM_RMS && STATS == STATS_TUNED && sizeof(T) == 2) {
        constexpr norm_ahead FEW = A == AHEAD_TUNED ? AHEAD_OFF : A;
        if (few_rows(p.rows))
            return lab_launch_held_io<T, MODE, IO, STATS_WARP_PASSES, FEW>(stream, op, p, held,
                                                                           reach);
    }
    /* Short rows ask L2 ahead where that measured faster (short_rows_ahead) */
    if constexpr (A == AHEAD_TUNED && short_rows_ahead<T, MODE, IO>())
        if (p.cols < AHEAD_SHORTEST && ahead_row_bytes(p) >= AHEAD_SHORT_BYTES)
            return lab_launch_held_io<T, MODE, IO, STATS, AHEAD_ON>(stream, op, p, held,
                                                                    ahead_reach{reach.window, 0});
    /* Half types kept packed where norm_packed_plan says */
    if constexpr (norm_packs<T, MODE>(IO == NORM_IO_CHECKED)) {
        constexpr unsigned FEWEST = norm_gelu(MODE) ? 1u : (unsigned)PACKED_MAX_VALUES;
        row_plan packed;
        if (norm_packed_plan<T, MODE>(p.rows, p.cols, p.residual != nullptr, IO == NORM_IO_CHECKED,
                                      &packed))
            if (auto kernel =
                    norm_packed_for<T, MODE, IO, EXCHANGE_PUSH, FEWEST, STATS, A>(packed.vpt))
                return lab_launch_held_rows<held_ahead<T, MODE, IO, true, A>()>(op, stream, packed,
                                                                                kernel, p, reach);
    }
    row_plan plan = held;
    /* The fused op's GELU takes registers: rows a warp would hold at 32
     * values a thread run faster over more warps at 16, at twice the
     * occupancy (bench/RESULTS.md). */
    if constexpr (norm_gelu(MODE))
        plan_held_split_warp_rows(&plan, V, 16);
    /* LayerNorm with one input of half types, the fewest bytes an element:
     * at 32 values a thread where that takes fewer than 512 threads a row,
     * as measured fastest (bench/RESULTS.md), but for calls of few rows,
     * which norm.cu spreads thinner. RMSNorm runs 3% faster at 16 values
     * (16384x4096). */
    row_plan wide;
    if (MODE == NORM_LAYER && sizeof(T) == 2 && !p.residual && !few_rows(p.rows) &&
        plan_held(p.cols, V, 32, &wide) && wide.tpr < 512)
        plan = wide;
    auto kernel = norm_held_for<T, MODE, IO, EXCHANGE_PUSH, STATS, A>(plan.vpt);
    if (!kernel)
        return weft__fail(WEFT_EINVAL, "%s: no kernel for %u vectors a thread", op, plan.vpt);
    return lab_launch_held_rows<held_ahead<T, MODE, IO, false, A>()>(op, stream, plan, kernel, p,
                                                                     reach);
}

} // namespace weft_ops::lab

#endif
