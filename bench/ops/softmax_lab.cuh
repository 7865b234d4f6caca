/*
 * softmax_lab.cuh - the lab's copy of the library's held softmax kernel
 * (src/ops/softmax.cuh) with the knobs the library does not set, so that
 * bench/ops times them beside the library's own kernels:
 * - Row and Read: where the row's vectors come from (global memory, or a
 *   slot of ring.cuh's ring) and what runs once every thread has read
 *   them (the ring kernels free the slot);
 * - PACKED: rows of half types kept as loaded between the passes, in
 *   blocks of up to 1024 threads (held_packed).
 * With Row global_row and PACKED false, lab_softmax_kernel is the
 * library's softmax_held_kernel, the same code, kept in step by hand.
 */
#ifndef WEFT_BENCH_OPS_SOFTMAX_LAB_CUH
#define WEFT_BENCH_OPS_SOFTMAX_LAB_CUH

#include "ops/softmax.cuh"

namespace weft_ops::lab
{

/*
 * softmax.cuh's softmax_held_row, the row's vectors from `in` (Row:
 * global_row, or ring.cuh's slot_row), PACKED where set. Each thread
 * loads its VPT vectors of the visible row at once and keeps them in registers: scaled (rounded
 * as the host rounds scale * x), then exponentiated in place, then written
 * as e * (1 / sum). exp(v - max) is 2^(v log2 e - max log2 e), one fma and
 * one ex2 (relative error ~1e-6 over the range that matters, where expf
 * takes ~10 instructions; probabilities under 1e-38 of the row's largest
 * flush to 0). Invisible and past-the-end elements are -Inf, so they
 * neither win the max nor add to the sum (2^-Inf = 0). ONLINE: each
 * thread exponentiates from its own max, and its factor rescales to the
 * row's. read() runs once every thread of the row has read its vectors.
 * PACKED (half types) keeps the row as loaded and forms x again for each
 * pass, exponentiating from the row's max for the output.
 */
template <typename T, int VPT, softmax_form FORM, softmax_stats STATS, bool PACKED, typename Row,
          typename Read, cluster_exchange X>
__device__ __forceinline__ void
lab_softmax_row(const softmax_params<T> &p, const row_place &at, const Row &in, Read read,
                softmax_scratch<STATS, X> &scratch, unsigned cluster)
{
    constexpr int V = vec16<T>();
    constexpr float LOG2E = 1.4426950408889634f;
    constexpr bool CHECKED = FORM == SOFTMAX_CHECKED || FORM == SOFTMAX_DROPOUT;
    const unsigned cols = (unsigned)p.cols, n = CHECKED ? (unsigned)visible(p, at.row) : cols;
    unsigned j[VPT];
    int vis[VPT];
    uint4 raw[VPT];

#pragma unroll
    for (int k = 0; k < VPT; k++) {
        j[k] = held_at<V, VPT>(at, k);
        vis[k] = CHECKED ? part_of<V>(j[k], n) : j[k] < cols ? V : 0;
        /* PLAIN: past the row's end, -Inf as loaded, which no value needs
         * masking for (the other forms scale first, then mask) */
        raw[k] = FORM == SOFTMAX_PLAIN && vis[k] == 0 ? neg_inf_vector<T>() : in.at(j[k], vis[k]);
    }

    /* x: the scaled row, masked */
    float x[VPT][V], max = -INFINITY;
    auto form = [&](int k, uint4 r) {
        unpack<T, V>(x[k], r);
        if (FORM == SOFTMAX_PLAIN) /* scale 1, and -Inf past the end as loaded */
            return;
        if (vis[k] == V) {
#pragma unroll
            for (int e = 0; e < V; e++)
                x[k][e] = __fmul_rn(p.scale, x[k][e]);
        } else {
#pragma unroll
            for (int e = 0; e < V; e++)
                x[k][e] = e < vis[k] ? __fmul_rn(p.scale, x[k][e]) : -INFINITY;
        }
    };
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        form(k, raw[k]);
#pragma unroll
        for (int e = 0; e < V; e++)
            max = fmaxf(max, x[k][e]);
    }
    if constexpr (STATS == SOFTMAX_MAX_THEN_SUM) {
        max = row_reduce(max, op_max(), scratch.max, cluster, true); /* the sum's follows */
        read();
    }

    /* a row of -Inf has max -Inf: a finite offset keeps its exponents 0
     * (and its output NaN, 0 / 0, as on the host); ONLINE: the thread's
     * own max, its part of the row likewise */
    const float shift = max == -INFINITY ? 0.0f : max * LOG2E;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        if (PACKED)
            form(k, opaque(raw[k]));
#pragma unroll
        for (int e = 0; e < V; e++) {
            x[k][e] = exp2_approx(fmaf(x[k][e], LOG2E, -shift));
            sum += x[k][e];
        }
    }
    float inv;
    if constexpr (STATS == SOFTMAX_MAX_THEN_SUM) {
        inv = 1.0f / row_reduce(sum, op_sum(), scratch.sum, cluster);
    } else {
        using merge = std::conditional_t<STATS == SOFTMAX_ONLINE, op_online, op_online_pairs>;
        max_sum row = row_reduce(max_sum{max, sum}, merge(), scratch.both, cluster);
        read();
        inv = (PACKED ? 1.0f : rescale(max, row.max)) / row.sum;
        max = row.max;
    }
    if constexpr (PACKED) { /* the exponents again, from the row's max */
        const float row_shift = max == -INFINITY ? 0.0f : max * LOG2E;
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            form(k, opaque(raw[k]));
#pragma unroll
            for (int e = 0; e < V; e++)
                x[k][e] = exp2_approx(fmaf(x[k][e], LOG2E, -row_shift));
        }
    }

    T *out = p.out + at.row * p.stride;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const int part = CHECKED ? part_of<V>(j[k], cols) : vis[k];
        if (part == 0)
            continue;
        float y[V];
        if (vis[k] == V) {
#pragma unroll
            for (int e = 0; e < V; e++)
                y[e] = x[k][e] * inv;
        } else {
#pragma unroll
            for (int e = 0; e < V; e++) /* masked: 0, even in a NaN row */
                y[e] = e < vis[k] ? x[k][e] * inv : 0.0f;
        }
        if (FORM == SOFTMAX_DROPOUT) {
            dropout_mask mask(p.seed, p.offset, p.p);
            unsigned long long e0 = (unsigned long long)at.row * p.cols + j[k];
#pragma unroll
            for (int e = 0; e < V; e++)
                y[e] = mask.keep(e0 + e) ? y[e] * p.keep_scale : 0.0f;
        }
        store_part<T, V, true>(out + j[k], y, part);
    }
}

/* The held kernel: a row a block (or a cluster, or a warp), straight from
 * global memory. PACKED (half types): up to 64 values a thread in blocks
 * of up to 1024 threads, as norm_held_kernel. X: how a cluster's blocks
 * share their statistics (reduce.cuh). AHEAD has each warp ask L2 for its
 * share of the row `lead` rows on, as norm_held_kernel's. */
template <typename T, int VPT, softmax_form FORM, softmax_stats STATS = SOFTMAX_MAX_THEN_SUM,
          bool PACKED = false, cluster_exchange X = EXCHANGE_BARRIERS, bool AHEAD = false>
__global__ void __launch_bounds__(PACKED ? 1024 : 512)
    lab_softmax_kernel(softmax_params<T> p, size_t row0, unsigned cluster, size_t lead)
{
    constexpr int V = vec16<T>();
    __shared__ softmax_scratch<STATS, X> scratch;
    if constexpr (pushes(X))
        scratch.push_setup(cluster);
    const row_place at = place_row<V>(row0, cluster, 1, VPT);
    if (at.row >= p.rows) /* only whole idle warps (a warp per row) */
        return;
    if (AHEAD && lead != 0 && at.row + lead < p.rows)
        prefetch_held_share<T, V, VPT>(p.in + (at.row + lead) * p.stride, at.rank, p.cols);
    const global_row<T, V> in = {p.in + at.row * p.stride};
    lab_softmax_row<T, VPT, FORM, STATS, PACKED>(
        p, at, in, [] {}, scratch, cluster);
}

/* The packed held kernel (half types) for plan.vpt, or NULL when there is
 * none. */
template <typename T, softmax_form FORM, softmax_stats STATS = SOFTMAX_MAX_THEN_SUM,
          cluster_exchange X = EXCHANGE_BARRIERS>
static void (*lab_softmax_packed_for(unsigned vpt))(softmax_params<T>, size_t, unsigned, size_t)
{
    static_assert(sizeof(T) == 2, "a packed row is of a half type");
    return by_vpt<PACKED_MAX_VALUES / vec16<T>()>(
        vpt, [](auto k) { return lab_softmax_kernel<T, decltype(k)::value, FORM, STATS, true, X>; },
        [] { return nullptr; });
}

} // namespace weft_ops::lab

#endif
