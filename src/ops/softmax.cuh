/*
 * softmax.cuh - the softmax kernels: held in registers (the main path,
 * rows loaded straight from global memory), staged in shared memory, and
 * in register tiles
 * (unaligned tensors, rows too long to hold), with the register kernel's
 * launch by plan. Apart from the launcher (softmax.cu), which says what
 * they compute and why, so that bench/ops/ can time other plans of the
 * same kernels side by side.
 */
#ifndef WEFT_OPS_SOFTMAX_CUH
#define WEFT_OPS_SOFTMAX_CUH

#include <math.h>

#include "ops/rows.cuh"

namespace weft_ops
{

template <typename T> struct softmax_params {
    T *out;
    const T *in;
    size_t rows, cols, stride, causal_q;
    float scale, p, keep_scale;
    unsigned long long seed, offset;
};

/* Columns [0, n) of the row are visible. */
template <typename T>
__device__ __forceinline__ size_t visible(const softmax_params<T> &p, size_t row)
{
    return p.causal_q ? row % p.causal_q + p.cols - p.causal_q + 1 : p.cols;
}

/* Vector k of tile t, scaled, into x[k]; -Inf where not visible. */
template <typename T, int V>
__device__ __forceinline__ void load_scaled(const softmax_params<T> &p, const row_place &at,
                                            size_t t, int k, size_t n, float (&x)[V])
{
    size_t j = elem_at<V>(at, t, k);
    const T *src = p.in + at.row * p.stride + j;
    if (V > 1 && j + V <= n) {
        load_vec<T, V>(x, src);
#pragma unroll
        for (int e = 0; e < V; e++)
            x[e] = __fmul_rn(p.scale, x[e]);
        return;
    }
#pragma unroll
    for (int e = 0; e < V; e++)
        x[e] = j + e < n ? __fmul_rn(p.scale, to_f32(src[e])) : -INFINITY;
}

/* exp(v - max) where visible, 0 elsewhere; the row sum counts these. */
template <int V>
__device__ __forceinline__ void exponentiate(float (&x)[V], size_t j, size_t n, float max)
{
#pragma unroll
    for (int e = 0; e < V; e++)
        x[e] = j + e < n ? expf(x[e] - max) : 0.0f;
}

template <typename T, int V>
__device__ __forceinline__ void store_probs(const softmax_params<T> &p, const row_place &at,
                                            size_t t, int k, size_t n, const float (&x)[V],
                                            float sum)
{
    size_t j = elem_at<V>(at, t, k);
    if (j >= p.cols)
        return;
    T *dst = p.out + at.row * p.stride + j;
    float y[V];
#pragma unroll
    for (int e = 0; e < V; e++)
        y[e] = j + e < n ? x[e] / sum : 0.0f; /* masked: 0 even in a NaN row */
    if (p.p > 0.0f) {
        dropout_mask mask(p.seed, p.offset, p.p);
        unsigned long long first = (unsigned long long)at.row * p.cols + j;
#pragma unroll
        for (int e = 0; e < V; e++)
            y[e] = mask.keep(first + e) ? y[e] * p.keep_scale : 0.0f;
    }
    if (V > 1 && j + V <= p.cols) {
        store_vec<T, V>(dst, y);
        return;
    }
#pragma unroll
    for (int e = 0; e < V; e++)
        if (j + e < p.cols)
            dst[e] = from_f32<T>(y[e]);
}

/* The register kernel: VPT vectors of V elements a thread, in registers
 * as fp32; `tiles` > 1 makes it loop over tiles, reading each again per
 * pass. */
template <typename T, int V, int VPT>
__global__ void __launch_bounds__(512, 2)
    softmax_kernel(softmax_params<T> p, size_t row0, unsigned cluster, size_t tiles)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
    __shared__ reduce_scratch<float> scratch;
    const row_place at = place_row<V>(row0, cluster, tiles, VPT);
    if (at.row >= p.rows) /* only whole idle warps (a warp per row) */
        return;
    const bool once = tiles == 1; /* held, read once */
    const size_t n = visible(p, at.row);
    float x[VPT][V];

    float max = -INFINITY;
    for (size_t t = at.first; t < at.first + tiles; t++) {
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            load_scaled<T, V>(p, at, t, k, n, x[k]);
#pragma unroll
            for (int e = 0; e < V; e++)
                max = fmaxf(max, x[k][e]);
        }
    }
    max = row_reduce(max, op_max(), scratch, cluster);

    float sum = 0.0f;
    for (size_t t = at.first; t < at.first + tiles; t++) {
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            if (!once)
                load_scaled<T, V>(p, at, t, k, n, x[k]);
            exponentiate<V>(x[k], elem_at<V>(at, t, k), n, max);
#pragma unroll
            for (int e = 0; e < V; e++)
                sum += x[k][e];
        }
    }
    sum = row_reduce(sum, op_sum(), scratch, cluster);

    for (size_t t = at.first; t < at.first + tiles; t++) {
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            if (!once) {
                load_scaled<T, V>(p, at, t, k, n, x[k]);
                exponentiate<V>(x[k], elem_at<V>(at, t, k), n, max);
            }
            store_probs<T, V>(p, at, t, k, n, x[k], sum);
        }
    }
}

/*
 * The staged kernel (rows.cuh): the visible part of the block's segment is
 * copied to shared memory with cp.async; the max, the sum of exponentials
 * and the output are computed from there (the exponential twice: cheaper
 * than keeping fp32 copies). vpt vectors of V elements a thread. Dropout
 * is a template parameter: Philox's registers only where it runs.
 */
template <typename T, bool DROPOUT>
__global__ void __launch_bounds__(512)
    softmax_staged_kernel(softmax_params<T> p, size_t row0, unsigned cluster, size_t vpt)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
    constexpr int V = vec16<T>();
    __shared__ reduce_scratch<float> scratch;
    const row_place at = place_row<V>(row0, cluster, 1, (unsigned)vpt);
    if (at.row >= p.rows) /* only whole idle warps (a warp per row) */
        return;
    const size_t seg = at.tile, first = (size_t)at.rank * seg, step = (size_t)blockDim.x * V;
    const size_t mine = (size_t)threadIdx.x * V;
    const size_t n = visible(p, at.row);
    T *x_s = reinterpret_cast<T *>(staged_smem()) + threadIdx.y * seg;
    const T *x_g = p.in + at.row * p.stride;

    for (size_t l = mine; l < seg; l += step) {
        int m = part_of<V>(first + l, n);
        if (m == 0)
            break;
        stage_part<T, V>(x_s + l, x_g + first + l, m);
    }
    copies_landed();

    float max = -INFINITY;
    for (size_t l = mine; l < seg; l += step) {
        int m = part_of<V>(first + l, n);
        if (m == 0)
            break;
        float x[V];
        load_part<T, V>(x, x_s + l, m);
#pragma unroll
        for (int e = 0; e < V; e++)
            if (e < m)
                max = fmaxf(max, __fmul_rn(p.scale, x[e]));
    }
    max = row_reduce(max, op_max(), scratch, cluster);

    float sum = 0.0f;
    for (size_t l = mine; l < seg; l += step) {
        int m = part_of<V>(first + l, n);
        if (m == 0)
            break;
        float x[V];
        load_part<T, V>(x, x_s + l, m);
#pragma unroll
        for (int e = 0; e < V; e++)
            if (e < m)
                sum += expf(__fmul_rn(p.scale, x[e]) - max);
    }
    sum = row_reduce(sum, op_sum(), scratch, cluster);

    T *out_g = p.out + at.row * p.stride;
    for (size_t l = mine; l < seg; l += step) {
        size_t j = first + l;
        int m = part_of<V>(j, p.cols), vis = part_of<V>(j, n);
        if (m == 0)
            break;
        float x[V], y[V];
        if (vis > 0)
            load_part<T, V>(x, x_s + l, vis);
#pragma unroll
        for (int e = 0; e < V; e++) /* masked: 0, even in a NaN row */
            y[e] = e < vis ? expf(__fmul_rn(p.scale, x[e]) - max) / sum : 0.0f;
        if (DROPOUT) {
            dropout_mask mask(p.seed, p.offset, p.p);
            unsigned long long e0 = (unsigned long long)at.row * p.cols + j;
#pragma unroll
            for (int e = 0; e < V; e++)
                y[e] = mask.keep(e0 + e) ? y[e] * p.keep_scale : 0.0f;
        }
        store_part<T, V>(out_g + j, y, m);
    }
}

/* A vector of -Inf in T's bits. */
template <typename T> __device__ __forceinline__ uint4 neg_inf_vector()
{
    const uint32_t w = sizeof(T) == 4                   ? 0xff800000u
                       : std::is_same<T, __half>::value ? 0xfc00fc00u
                                                        : 0xff80ff80u;
    return make_uint4(w, w, w, w);
}

/* What a held softmax row does besides exponentiate and normalize; a
 * template parameter. PLAIN (scale 1) and SCALED take rows of whole
 * vectors with no mask and no dropout, so that no vector pays for a mask
 * or keeps a partial-vector path; CHECKED takes every other row as p
 * says, DROPOUT that and dropout. */
enum softmax_form { SOFTMAX_PLAIN, SOFTMAX_SCALED, SOFTMAX_CHECKED, SOFTMAX_DROPOUT };

/* How a held row takes its max and sum: MAX_THEN_SUM, two reductions (the
 * library's in fp32 and on masked rows); ONLINE, one reduction of each
 * thread's max and its sum of exponents relative to that max, rescaled to
 * each group's max (the library's on unmasked rows of half types);
 * ONLINE_PAIRS, that with the sums merged pairwise at every step, which
 * issues more (bench/ops times it). */
enum softmax_stats { SOFTMAX_MAX_THEN_SUM, SOFTMAX_ONLINE, SOFTMAX_ONLINE_PAIRS };

/* A part of a row: its max, and the sum of 2^((v - max) log2 e) over it. */
struct max_sum {
    float max, sum;
};

__device__ __forceinline__ max_sum shfl_xor(max_sum v, int m)
{
    return {__shfl_xor_sync(0xffffffffu, v.max, m), __shfl_xor_sync(0xffffffffu, v.sum, m)};
}

/* 2^((from - to) log2 e), from <= to: what a sum relative to `from`
 * becomes relative to `to`; 1 when they are equal (two -Inf among them). */
__device__ __forceinline__ float rescale(float from, float to)
{
    return from == to ? 1.0f : exp2_approx(__fmul_rn(__fsub_rn(from, to), 1.4426950408889634f));
}

/* The merge, the same bits for merge(a, b) and merge(b, a) (both lanes of
 * a butterfly step): each sum is rescaled on its own, and the two
 * products are not contracted into an fma. A NaN never wins the max, as
 * in op_max; it reaches the result through its part's sum. */
struct op_online {
    __device__ __forceinline__ max_sum operator()(max_sum a, max_sum b) const
    {
        float max = fmaxf(a.max, b.max);
        return {max, __fadd_rn(__fmul_rn(a.sum, rescale(a.max, max)),
                               __fmul_rn(b.sum, rescale(b.max, max)))};
    }
};

/* op_online merged pairwise at every step of the butterflies and the
 * fold (ONLINE_PAIRS): no overloads of its own. */
struct op_online_pairs {
    __device__ __forceinline__ max_sum operator()(max_sum a, max_sum b) const
    {
        return op_online()(a, b);
    }
};

/* The online reduction's butterfly and fold in two passes (reduce.cuh
 * finds these by their argument types): the group's max first, which
 * every lane gets exactly, then each part's sum rescaled to it once, then
 * the sums. Merging pairs rescales both sums at every step - two ex2 and
 * some 20 instructions a step, where this takes four - and the pairwise
 * reductions are some 30% of the instructions softmax issues on bf16
 * rows of 65536. */
__device__ __forceinline__ max_sum butterfly(max_sum v, op_online, unsigned top)
{
    const float max = butterfly(v.max, op_max(), top);
    return {max, butterfly(__fmul_rn(v.sum, rescale(v.max, max)), op_sum(), top)};
}

template <typename Results>
__device__ __forceinline__ max_sum fold_blocks(op_online, Results results, unsigned cluster)
{
    float max = results(0u).max;
    for (unsigned b = 1; b < cluster; b++)
        max = fmaxf(max, results(b).max);
    float sum = 0.0f;
    for (unsigned b = 0; b < cluster; b++) {
        const max_sum part = results(b);
        sum = __fadd_rn(sum, __fmul_rn(part.sum, rescale(part.max, max)));
    }
    return {max, sum};
}

/* A held row's scratch: one for each reduction, each used once a row (so
 * once a launch where a block holds one row: PUSH's condition). */
template <softmax_stats STATS, cluster_exchange X = EXCHANGE_BARRIERS> struct softmax_scratch {
    reduce_scratch<max_sum, X> both;

    __device__ __forceinline__ void push_setup(unsigned cluster)
    {
        weft_ops::push_setup(cluster, both);
    }
};
template <cluster_exchange X> struct softmax_scratch<SOFTMAX_MAX_THEN_SUM, X> {
    reduce_scratch<float, X> max, sum;

    __device__ __forceinline__ void push_setup(unsigned cluster)
    {
        weft_ops::push_setup(cluster, max, sum);
    }
};

/*
 * One row of the held kernels (rows.cuh): each thread loads its VPT
 * vectors of the visible row at once and keeps them in registers: scaled (rounded
 * as the host rounds scale * x), then exponentiated in place, then written
 * as e * (1 / sum). exp(v - max) is 2^(v log2 e - max log2 e), one fma and
 * one ex2 (relative error ~1e-6 over the range that matters, where expf
 * takes ~10 instructions; probabilities under 1e-38 of the row's largest
 * flush to 0). Invisible and past-the-end elements are -Inf, so they
 * neither win the max nor add to the sum (2^-Inf = 0). ONLINE: each
 * thread exponentiates from its own max, and its factor rescales to the
 * row's.
 */
template <typename T, int VPT, softmax_form FORM, softmax_stats STATS, cluster_exchange X>
__device__ __forceinline__ void softmax_held_row(const softmax_params<T> &p, const row_place &at,
                                                 const global_row<T, vec16<T>()> &in,
                                                 softmax_scratch<STATS, X> &scratch,
                                                 unsigned cluster)
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
    }

    /* a row of -Inf has max -Inf: a finite offset keeps its exponents 0
     * (and its output NaN, 0 / 0, as on the host); ONLINE: the thread's
     * own max, its part of the row likewise */
    const float shift = max == -INFINITY ? 0.0f : max * LOG2E;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
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
        inv = rescale(max, row.max) / row.sum;
        max = row.max;
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
 * global memory. X: how a cluster's blocks
 * share their statistics (reduce.cuh). AHEAD has each warp ask L2 for its
 * share of the row `lead` rows on, as norm_held_kernel's. */
template <typename T, int VPT, softmax_form FORM, softmax_stats STATS = SOFTMAX_MAX_THEN_SUM,
          cluster_exchange X = EXCHANGE_BARRIERS, bool AHEAD = false>
__global__ void __launch_bounds__(512)
    softmax_held_kernel(softmax_params<T> p, size_t row0, unsigned cluster, size_t lead)
{
    start_as_dependent(); /* launched as one (launch.cuh) */
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
    softmax_held_row<T, VPT, FORM, STATS>(p, at, in, scratch, cluster);
}

/* The held kernel for plan.vpt, or NULL when there is none. */
template <typename T, softmax_form FORM, softmax_stats STATS = SOFTMAX_MAX_THEN_SUM,
          cluster_exchange X = EXCHANGE_BARRIERS, bool AHEAD = false>
static void (*softmax_held_for(unsigned vpt))(softmax_params<T>, size_t, unsigned, size_t)
{
    return held_vpt<vec16<T>()>(vpt, [](auto k) {
        return softmax_held_kernel<T, decltype(k)::value, FORM, STATS, X, AHEAD>;
    });
}

template <typename T, int V>
int launch_plan(cudaStream_t stream, const row_plan &plan, const softmax_params<T> &p)
{
    const char *op = "weft_softmax";

    /* the vectors a thread that plan_rows can ask for */
    return by_vpt<vpt_max(V)>(
        plan.vpt,
        [&](auto k) {
            return launch_rows(op, stream, plan, p.rows, softmax_kernel<T, V, decltype(k)::value>,
                               p, plan.tiles);
        },
        [&] {
            return weft__fail(WEFT_EINVAL, "%s: no kernel for %u vectors a thread", op, plan.vpt);
        });
}

} // namespace weft_ops

#endif
