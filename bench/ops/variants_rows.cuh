/*
 * variants_rows.cuh - what the row operators' tuning variants share
 * (variants_softmax.cu, variants_norms.cu, variants_fused.cu: softmax,
 * LayerNorm, RMSNorm, add+LayerNorm, the fused GELU+LayerNorm), which
 * bench_ops.py times beside the library's own kernels. Built into
 * libweft_ops_bench.so with variants_elementwise.cu and all of weft, in
 * files of their own so that a parallel build compiles them at once.
 *
 * The library holds aligned rows in registers, loaded straight from
 * global memory (the held kernels). These run them streamed through a
 * ring in shared memory instead (ring.cuh), with 2 and 4 slots (ring2,
 * ring4) and with 2 at twice the values a thread (ring2_wide), the held
 * kernels under the library's plan (held) and others
 * (held_narrow, held_wide, and long rows over more blocks, held_spread and
 * held_spread8: see held_variant_plan), LayerNorm's and the fused op's held
 * kernels with a cluster's blocks pushing their statistics to each other
 * (held_push: reduce.cuh's cluster_exchange; held meets at cluster
 * barriers), RMSNorm held, packed and through the ring (rmsnorm_variant),
 * add+LayerNorm held and packed (add_layernorm_variant), the held kernels
 * with rows of half types kept packed between their passes
 * (held_packed, held_packed16, held_packed64, held_packed_pairs,
 * held_packed_quads, held_packed_eights and held_packed32: see
 * packed_plan), the kernels
 * that test at run time for what the library fixes at compile time on
 * these rows - LayerNorm's inputs, softmax's mask and scale, partial
 * vectors - (ring2_checked, held_checked), softmax's max and sum in one
 * reduction (held_online, ring2_online: SOFTMAX_ONLINE, the library's for
 * half types; held and ring2 take two), softmax's held kernels with a
 * cluster's statistics pushed (held_push, held_online_push, that at 16
 * values a thread held_online_push16: held and held_online meet at
 * cluster barriers), the shared-memory staged kernels (staged), and the
 * register-tile row kernels (softmax, LayerNorm) on the same shapes,
 * under rows.cuh's plan_rows and changes of it:
 *   regs         plan_rows: 16 values a thread
 *   regs_half    8 values a thread: twice the threads per row
 *   regs_double  32 values a thread: half the threads (the compiler spills)
 *   regs_flat    a row spread over one block that loops over its tiles
 *                instead of a cluster (the later passes re-read from L2)
 * and the fused bias+GELU+residual+LayerNorm held with its inputs fixed or
 * checked, with rows of 1024 in one warp (held_warp), packed in smaller
 * blocks (packed_b6, packed_b5), and packed as the library packs it with
 * fp16's longer GELU fit (half_fit).
 *
 * Each entry point returns a weft status; WEFT_EINVAL means the variant
 * does not apply to that shape (the script leaves it out).
 */
#ifndef WEFT_BENCH_OPS_VARIANTS_ROWS_CUH
#define WEFT_BENCH_OPS_VARIANTS_ROWS_CUH

#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "ops/norm_launch.cuh"
#include "held_lab.cuh"
#include "ring.cuh"
#include "softmax_lab.cuh"

namespace weft_ops::variants
{

/* The library's plan for the vector path, changed as `variant` says; false
 * when the variant does not apply. */
inline bool variant_plan(const char *variant, size_t cols, int V, row_plan *p)
{
    *p = plan_rows(cols, V);
    if (strcmp(variant, "regs") == 0)
        return true;
    if (strcmp(variant, "regs_half") == 0) {
        if (p->vpt < 2)
            return false;
        p->vpt /= 2;
        if (p->tpr < 512) {
            p->tpr *= 2;
        } else if (p->cluster < 8 && p->tiles == 1) {
            p->cluster *= 2;
        } else {
            return false;
        }
        p->rpb = p->tpr == 32 ? 8 : 1;
        return true;
    }
    if (strcmp(variant, "regs_double") == 0) {
        if (p->tiles != 1 || (p->cluster == 1 && p->tpr == 32))
            return false;
        p->vpt *= 2;
        if (p->cluster > 1)
            p->cluster /= 2;
        else
            p->tpr /= 2;
        p->rpb = p->tpr == 32 ? 8 : 1;
        return true;
    }
    if (strcmp(variant, "regs_flat") == 0) {
        if (p->cluster == 1)
            return false;
        p->tiles *= p->cluster;
        p->cluster = 1;
        return true;
    }
    return false;
}

/* Rows too long for a block of 512 threads at `values` a thread, which the
 * library holds in the fewest blocks at up to 32 values (one resident block
 * an SM), spread over a cluster of up to 8 blocks at `values` or fewer (two
 * resident at 16): false for other rows, or if 8 blocks cannot. */
inline bool spread_plan(size_t cols, int V, unsigned values, row_plan *p)
{
    const size_t nvec = (cols + V - 1) / V;
    if (!plan_held(cols, V, values, p) || p->tpr < 512 || p->vpt * (unsigned)V <= values)
        return false;
    for (size_t c = 1; c <= 8; c *= 2) {
        size_t vpt = pow2_at_least((nvec + 512 * c - 1) / (512 * c));
        if (vpt * (size_t)V <= values) {
            p->cluster = (unsigned)c;
            p->vpt = (unsigned)vpt;
            return true;
        }
    }
    return false;
}

/* The held kernels under the library's plan, from its `values` a thread
 * (held), and under others:
 *   held_narrow  half the values a thread, twice the threads
 *   held_wide    twice the values a thread (up to 32), half the threads
 *   held_spread  long rows at 16 values a thread over more blocks
 *                (spread_plan), held_spread8 at 8
 * false when the variant does not apply. */
inline bool held_variant_plan(const char *variant, size_t cols, int V, unsigned values, row_plan *p)
{
    if (strcmp(variant, "held") == 0)
        return plan_held(cols, V, values, p);
    if (strcmp(variant, "held_spread") == 0)
        return spread_plan(cols, V, 16, p);
    if (strcmp(variant, "held_spread8") == 0)
        return spread_plan(cols, V, 8, p);
    if (strcmp(variant, "held_narrow") == 0)
        return values / 2 >= (unsigned)V && plan_held(cols, V, values / 2, p);
    if (strcmp(variant, "held_wide") == 0)
        return values * 2 <= HELD_MAX_VALUES && plan_held(cols, V, values * 2, p);
    return false;
}

/* The norms' ring kernel (rows.cuh): resident blocks (or clusters) loop
 * over rows, each row's segment of in arriving in a slot of the block's
 * ring ahead of its turn, and the row from there norm_held.cuh's held
 * row. No residual: that would double the bytes a row, where the held
 * kernel measured faster. The library ran RMSNorm through it until the held
 * kernels, packed and pushing a cluster's statistics, beat it. */
template <typename T, int VPT, norm_mode MODE, unsigned IO, bool PACKED = false>
__global__ void __launch_bounds__(512) norm_ring_kernel(norm_params<T> p, ring_plan plan)
{
    constexpr int V = vec16<T>();
    __shared__ reduce_scratch<norm_stat<MODE>> scratch;
    const unsigned cluster = plan.held.cluster, seg = blockDim.x * VPT * V;
    row_place at = {0, 0, 0, threadIdx.x, blockIdx.x % cluster};
    const unsigned first = at.rank * seg, cols = (unsigned)p.cols;
    const unsigned mine = first >= cols ? 0 : cols - first < seg ? cols - first : seg;
    const row_ring<T> ring = {ring_smem(), plan.slots, plan.seg_bytes, first};

    auto fill = [&](unsigned s, size_t row) { ring.fill(s, p.in + row * p.stride, mine); };
    ring_rows(ring, p.rows, cluster, fill, [&](size_t row, unsigned s, auto read) {
        at.row = row;
        const slot_row<T, V> in = {ring.segment(s), first};
        lab::lab_held_row<T, VPT, MODE, IO, PACKED>(p, at, in, in, read, scratch, cluster);
    });
}

/* The ring kernel for plan.vpt, or NULL when there is none. */
template <typename T, norm_mode MODE, unsigned IO>
static void (*norm_ring_for(unsigned vpt))(norm_params<T>, ring_plan)
{
    return held_vpt<vec16<T>()>(
        vpt, [](auto k) { return norm_ring_kernel<T, decltype(k)::value, MODE, IO>; });
}

/* The packed ring kernel (half types) for plan.vpt, or NULL when there is
 * none. */
template <typename T, norm_mode MODE, unsigned IO>
static void (*norm_ring_packed_for(unsigned vpt))(norm_params<T>, ring_plan)
{
    using kernel = void (*)(norm_params<T>, ring_plan);
    return by_vpt<PACKED_MAX_VALUES / vec16<T>()>(
        vpt,
        [](auto k) -> kernel { return norm_ring_kernel<T, decltype(k)::value, MODE, IO, true>; },
        [] { return (kernel) nullptr; });
}

/* Softmax's ring kernel (ring.cuh): resident blocks (or clusters) loop
 * over rows, each row's visible part arriving in a slot of the block's
 * ring ahead of its turn, and the row from there softmax.cuh's held row.
 * The library ran unmasked rows of half types that take a cluster through
 * it until its held kernel, pushing the cluster's statistics, beat it. */
template <typename T, int VPT, softmax_form FORM, softmax_stats STATS = SOFTMAX_MAX_THEN_SUM>
__global__ void __launch_bounds__(512) softmax_ring_kernel(softmax_params<T> p, ring_plan plan)
{
    constexpr int V = vec16<T>();
    __shared__ softmax_scratch<STATS> scratch;
    const unsigned cluster = plan.held.cluster, seg = blockDim.x * VPT * V;
    row_place at = {0, 0, 0, threadIdx.x, blockIdx.x % cluster};
    const unsigned first = at.rank * seg;
    const row_ring<T> ring = {ring_smem(), plan.slots, plan.seg_bytes, first};

    /* the row's visible vectors in this block's segment */
    auto fill = [&](unsigned s, size_t row) {
        unsigned end = ((unsigned)visible(p, row) + V - 1) / V * V;
        unsigned mine = first >= end ? 0 : end - first < seg ? end - first : seg;
        ring.fill(s, p.in + row * p.stride, mine);
    };
    ring_rows(ring, p.rows, cluster, fill, [&](size_t row, unsigned s, auto read) {
        at.row = row;
        const slot_row<T, V> in = {ring.segment(s), first};
        lab::lab_softmax_row<T, VPT, FORM, STATS, false>(p, at, in, read, scratch, cluster);
    });
}

/* The ring kernel for plan.vpt, or NULL when there is none. */
template <typename T, softmax_form FORM, softmax_stats STATS = SOFTMAX_MAX_THEN_SUM>
static void (*softmax_ring_for(unsigned vpt))(softmax_params<T>, ring_plan)
{
    return held_vpt<vec16<T>()>(
        vpt, [](auto k) { return softmax_ring_kernel<T, decltype(k)::value, FORM, STATS>; });
}

/* The ring kernels: ring2 and ring4 with at most 2 or 4 slots a block at
 * the library's values a thread, ring2_wide with 2 slots at twice the
 * values (up to 32). false when the variant is no ring or does not apply. */
inline bool ring_variant(const char *variant, unsigned values, unsigned *slots, unsigned *vals)
{
    *vals = values;
    if (strcmp(variant, "ring2") == 0 || strcmp(variant, "ring4") == 0) {
        *slots = variant[4] - '0';
        return true;
    }
    *slots = 2;
    *vals = values * 2;
    return strcmp(variant, "ring2_wide") == 0 && *vals <= HELD_MAX_VALUES;
}

template <typename Params, typename K>
int run_ring(const char *op, cudaStream_t s, size_t cols, int V, size_t elem_size, unsigned values,
             unsigned slots, const Params &p, K kernel_for)
{
    row_plan blocks;
    ring_plan ring;
    if (!lab::lab_plan_held(cols, V, values, &blocks, true))
        return WEFT_EINVAL;
    auto kernel = kernel_for(blocks.vpt);
    if (!kernel || !plan_ring(kernel, blocks, cols, p.rows, V, elem_size, slots, &ring))
        return WEFT_EINVAL;
    return launch_ring(op, s, ring, kernel, p);
}

/* The ring under held_packed_quads' plan (ring2_packed_quads: rows kept
 * packed at 64 values a thread in blocks of up to 256, a row of 65536 over
 * a cluster of four), with as many slots as leave the most blocks
 * resident, at least two. Rows copied ahead did not help the packed
 * kernels: LayerNorm bf16 ran 2.30 TB/s against 3.13 held at 1024x65536,
 * 3.08 against 3.58 at 4096x16384 (bench/RESULTS.md). */
template <typename Params, typename K>
int run_ring_packed(const char *op, cudaStream_t s, size_t cols, int V, size_t elem_size,
                    const Params &p, K kernel_for)
{
    row_plan blocks;
    ring_plan ring;
    if (!lab::lab_plan_held(cols, V, PACKED_MAX_VALUES, &blocks, true, PACKED_MAX_VALUES, 256))
        return WEFT_EINVAL;
    auto kernel = kernel_for(blocks.vpt);
    if (!kernel || !plan_ring(kernel, blocks, cols, p.rows, V, elem_size, 2, &ring))
        return WEFT_EINVAL;
    return launch_ring(op, s, ring, kernel, p);
}

template <typename Params, typename K>
int run_held(const char *op, cudaStream_t s, const row_plan &plan, const Params &p, K kernel)
{
    return kernel ? launch_rows(op, s, plan, p.rows, kernel, p, 0) : WEFT_EINVAL;
}

/* The plans of the held kernels with the row packed (half types), in
 * blocks of up to 1024 threads: 32 values a thread (held_packed), 16
 * (held_packed16) or 64 (held_packed64), up to 64 on rows longer than
 * that holds; and 64 in blocks of up to 512, 256 or 128 threads
 * (held_packed_pairs, held_packed_quads, held_packed_eights: a row of
 * 65536 over a cluster of two, four or eight blocks, as many resident an
 * SM, each of another row, so that one's loads may overlap another's
 * arithmetic); and never more than 32, longer rows over a cluster of
 * blocks of up to 512 (held_packed32: the fused op's GELU spills at 64,
 * bench/RESULTS.md). false for other variants. */
inline bool packed_plan(const char *variant, size_t cols, int V, row_plan *p)
{
    if (strcmp(variant, "held_packed32") == 0)
        return plan_held(cols, V, 32, p, 32, 512);
    if (strcmp(variant, "held_packed_pairs") == 0)
        return plan_held(cols, V, PACKED_MAX_VALUES, p, PACKED_MAX_VALUES, 512);
    if (strcmp(variant, "held_packed_quads") == 0)
        return plan_held(cols, V, PACKED_MAX_VALUES, p, PACKED_MAX_VALUES, 256);
    if (strcmp(variant, "held_packed_eights") == 0)
        return plan_held(cols, V, PACKED_MAX_VALUES, p, PACKED_MAX_VALUES, 128);
    unsigned values = strcmp(variant, "held_packed") == 0     ? 32
                      : strcmp(variant, "held_packed16") == 0 ? 16
                      : strcmp(variant, "held_packed64") == 0 ? 64
                                                              : 0;
    return values && plan_packed(cols, V, values, p);
}

/* A packed held kernel (kernel_for(vpt)) under the variant's packed_plan. */
template <typename T, typename Params, typename KernelFor>
int run_packed(const char *op, cudaStream_t s, const char *variant, const Params &p,
               KernelFor kernel_for)
{
    row_plan plan;
    if (!packed_plan(variant, p.cols, vec16<T>(), &plan))
        return WEFT_EINVAL;
    return run_held(op, s, plan, p, kernel_for(plan.vpt));
}

/* packed_quads_b3, packed_quads_b2: held_packed_quads' plan in kernels
 * bounded to 3 or 2 resident blocks of 256 (up to 80 or 128 registers a
 * thread, where the library's packed kernels take 64, and fp16's spill).
 * Neither beat the library's kernels: bf16 is level, fp16's LayerNorm
 * (109 registers unbounded) stays behind its fp32 plan (bench/RESULTS.md).
 * WEFT_EINVAL when the variant is neither or does not apply. */
template <typename T, norm_mode MODE, unsigned IO>
int run_packed_resident(const char *op, cudaStream_t s, const char *variant,
                        const norm_params<T> &p)
{
    const bool b3 = strcmp(variant, "packed_quads_b3") == 0;
    row_plan plan;
    if (!b3 && strcmp(variant, "packed_quads_b2") != 0)
        return WEFT_EINVAL;
    if constexpr (sizeof(T) == 2) {
        if (!packed_plan("held_packed_quads", p.cols, vec16<T>(), &plan))
            return WEFT_EINVAL;
        constexpr unsigned FEWEST = PACKED_MAX_VALUES;
        auto kernel = b3 ? lab::lab_packed_for<T, MODE, IO, EXCHANGE_PUSH, FEWEST, 3>(plan.vpt)
                         : lab::lab_packed_for<T, MODE, IO, EXCHANGE_PUSH, FEWEST, 2>(plan.vpt);
        return run_held(op, s, plan, p, kernel);
    }
    return WEFT_EINVAL;
}

/* tpr_packed_pairs, tpr_packed_quads: held_packed_pairs' or
 * held_packed_quads' plan in kernels whose threads a row are fixed at
 * compile time (norm_held_kernel's TPR: 128, 256 or 512, a row a block),
 * so that the row's pointers are uniform and each vector's offset an
 * immediate. WEFT_EINVAL when the variant is neither or does not apply.
 * (shifted_packed_quads and tpr_shifted_packed_quads, LayerNorm's moments
 * taken in the pass that forms s, ran no faster and lose fp32's accuracy
 * where a thread's first value is far out - norm_stats_accuracy.c -
 * and are gone.) */
template <typename T, norm_mode MODE, unsigned IO>
int run_packed_tpr(const char *op, cudaStream_t s, const char *variant, const norm_params<T> &p)
{
    const char *plan_name = strcmp(variant, "tpr_packed_pairs") == 0   ? "held_packed_pairs"
                            : strcmp(variant, "tpr_packed_quads") == 0 ? "held_packed_quads"
                                                                       : nullptr;
    if (!plan_name)
        return WEFT_EINVAL;
    if constexpr (sizeof(T) == 2) {
        constexpr int V = vec16<T>();
        constexpr unsigned VPT = PACKED_MAX_VALUES / V;
        row_plan plan;
        if (!packed_plan(plan_name, p.cols, V, &plan) || plan.vpt != VPT || plan.rpb != 1)
            return WEFT_EINVAL;
        auto run = [&](auto tpr) {
            return run_held(op, s, plan, p,
                            lab::lab_held_kernel<T, VPT, MODE, IO, EXCHANGE_PUSH, true, 0,
                                                 gelu_fit_for<T>(), decltype(tpr)::value>);
        };
        switch (plan.tpr) {
        case 128:
            return run(std::integral_constant<unsigned, 128>());
        case 256:
            return run(std::integral_constant<unsigned, 256>());
        case 512:
            return run(std::integral_constant<unsigned, 512>());
        }
    }
    return WEFT_EINVAL;
}

/* Whether variant is a name followed by suffix. */
inline bool ends_with(const char *variant, const char *suffix)
{
    const size_t n = strlen(variant), k = strlen(suffix);
    return n > k && strcmp(variant + n - k, suffix) == 0;
}

/* Whether the variant is one of the `*_polled` kernels: every thread
 * polls the mbarrier of a cluster's exchange (EXCHANGE_PUSH_POLLED), as
 * the library's kernels did before one warp polled for the block. */
inline bool polled_variant(const char *variant)
{
    return ends_with(variant, "_polled");
}

/* The norms' polled kernels: held_push_polled (held_push's plan, where it
 * takes a cluster) and held_packed_quads_polled. WEFT_EINVAL otherwise. */
template <typename T, norm_mode MODE, unsigned IO>
int run_polled(const char *op, cudaStream_t s, const char *variant, const norm_params<T> &p)
{
    constexpr int V = vec16<T>();
    constexpr cluster_exchange X = EXCHANGE_PUSH_POLLED;
    row_plan plan;
    if (strcmp(variant, "held_push_polled") == 0)
        return plan_held(p.cols, V, 16, &plan) && plan.cluster > 1
                   ? run_held(op, s, plan, p, norm_held_for<T, MODE, IO, X>(plan.vpt))
                   : WEFT_EINVAL;
    if constexpr (sizeof(T) == 2)
        if (strcmp(variant, "held_packed_quads_polled") == 0)
            return run_packed<T>(op, s, "held_packed_quads", p,
                                 norm_packed_for<T, MODE, IO, X, PACKED_MAX_VALUES>);
    return WEFT_EINVAL;
}

/* The statistics a variant forces on the norms' kernels (norm_held.cuh's
 * norm_stats): `*_moments` each thread's moments merged
 * (STATS_THREAD_MOMENTS), `*_passes` each warp's two passes
 * (STATS_WARP_PASSES; RMSNorm's sum of squares on the FMA pipe),
 * `*_tensor` RMSNorm's by the tensor cores (STATS_TENSOR_SQUARES);
 * STATS_TUNED, the library's choice, for any other variant. stats_suffix
 * names the suffix. */
constexpr const char *stats_suffix(norm_stats stats)
{
    return stats == STATS_THREAD_MOMENTS   ? "_moments"
           : stats == STATS_TENSOR_SQUARES ? "_tensor"
                                           : "_passes";
}
inline norm_stats stats_variant(const char *variant)
{
    for (norm_stats stats : {STATS_THREAD_MOMENTS, STATS_WARP_PASSES, STATS_TENSOR_SQUARES})
        if (ends_with(variant, stats_suffix(stats)))
            return stats;
    return STATS_TUNED;
}

/* Whether variant is lib_aheadN (N MiB of rows asked of L2 ahead), and
 * its window in bytes. */
inline bool ahead_variant(const char *variant, size_t *window)
{
    if (strncmp(variant, "lib_ahead", 9) != 0)
        return false;
    const long mib = strtol(variant + 9, NULL, 10);
    *window = mib > 0 ? (size_t)mib << 20 : 0;
    return true;
}

/* Whether variant is lib_splitN, and N: rows a warp holds spread over a
 * block of as many warps as hold them at N values a thread
 * (plan_held_split_warp_rows); lib_splitN_ahead asks L2 for rows ahead
 * as lib_short_ahead does (*ahead). */
inline bool split_variant(const char *variant, unsigned *values, bool *ahead)
{
    if (strncmp(variant, "lib_split", 9) != 0)
        return false;
    char *end;
    *values = (unsigned)strtoul(variant + 9, &end, 10);
    *ahead = strcmp(end, "_ahead") == 0;
    return *ahead || *end == '\0';
}

/* `held` with its rows spread at `values` a thread, or false where it is
 * not a warp a row or would not change. */
inline bool split_plan(unsigned values, const row_plan &held, int V, row_plan *p)
{
    if (values < (unsigned)V || held.tpr != 32)
        return false;
    *p = held;
    plan_held_split_warp_rows(p, V, values);
    return p->tpr != held.tpr;
}

/* The library's launch of a call of IO (norm_launch.cuh's launch_held_io:
 * its plans and kernels, held_lab.cuh's copy) with the statistics the variant forces:
 * lib_moments (LayerNorm's modes), lib_passes, lib_tensor (RMSNorm in
 * half types); or with rows asked of L2 ahead, never (lib_no_ahead),
 * always, as many as fill N MiB of the inputs (lib_aheadN), or 4 MiB on
 * short rows too (lib_short_ahead); or with rows a warp holds spread over
 * more warps (lib_splitN: split_plan), asking so (lib_splitN_ahead).
 * WEFT_EINVAL for other variants, or where they do not apply. */
template <typename T, norm_mode MODE, unsigned IO>
int run_lib(const char *op, cudaStream_t s, const char *variant, const norm_params<T> &p)
{
    row_plan held, split;
    if (strncmp(variant, "lib_", 4) != 0 || !plan_held(p.cols, vec16<T>(), 16, &held))
        return WEFT_EINVAL;
    if (strcmp(variant, "lib_no_ahead") == 0)
        return lab::lab_launch_held_io<T, MODE, IO, STATS_TUNED, AHEAD_OFF>(s, op, p, held);
    if (strcmp(variant, "lib_short_ahead") == 0)
        return p.cols < AHEAD_SHORTEST
                   ? lab::lab_launch_held_io<T, MODE, IO, STATS_TUNED, AHEAD_ON>(
                         s, op, p, held, lab::ahead_reach{AHEAD_WINDOW, 0})
                   : WEFT_EINVAL;
    unsigned values;
    bool ahead;
    if (split_variant(variant, &values, &ahead)) {
        /* where launch_held_io keeps its own plan (one-input LayerNorm of
         * half types at 32 values) or splits as far (the fused op, at 16)
         * the variant would be the library's */
        const bool own = MODE == NORM_LAYER && sizeof(T) == 2 && !p.residual;
        if (own || (norm_gelu(MODE) && values >= 16) ||
            !split_plan(values, held, vec16<T>(), &split))
            return WEFT_EINVAL;
        return ahead ? lab::lab_launch_held_io<T, MODE, IO, STATS_TUNED, AHEAD_ON>(
                           s, op, p, split, lab::ahead_reach{AHEAD_WINDOW, 0})
                     : launch_held_io<T, MODE, IO>(s, op, p, split);
    }
    size_t window;
    if (ahead_variant(variant, &window))
        return window ? lab::lab_launch_held_io<T, MODE, IO, STATS_TUNED, AHEAD_ON>(
                            s, op, p, held, lab::ahead_reach{window, AHEAD_SHORTEST})
                      : WEFT_EINVAL;
    switch (stats_variant(variant)) {
    case STATS_THREAD_MOMENTS:
        if constexpr (MODE != NORM_RMS)
            return lab::lab_launch_held_io<T, MODE, IO, STATS_THREAD_MOMENTS>(s, op, p, held);
        return WEFT_EINVAL;
    case STATS_WARP_PASSES:
        return lab::lab_launch_held_io<T, MODE, IO, STATS_WARP_PASSES>(s, op, p, held);
    case STATS_TENSOR_SQUARES:
        if constexpr (sizeof(T) == 2 && MODE == NORM_RMS)
            return lab::lab_launch_held_io<T, MODE, IO, STATS_TENSOR_SQUARES>(s, op, p, held);
        return WEFT_EINVAL;
    default:
        return WEFT_EINVAL;
    }
}

/* The LayerNorm modes' kernels under the plans of held_push (16 values a
 * thread, a cluster's statistics pushed), held_wide (32),
 * held_packed_pairs and held_packed_quads, with S's statistics:
 * held_push_moments, held_wide_moments and so on, or *_passes. WEFT_EINVAL
 * for RMSNorm, other variants, or where the plan does not apply. */
template <typename T, norm_mode MODE, unsigned IO, norm_stats S>
int run_stats(const char *op, cudaStream_t s, const char *variant, const norm_params<T> &p)
{
    constexpr int V = vec16<T>();
    constexpr cluster_exchange X = EXCHANGE_PUSH;
    const size_t base = strlen(variant) - strlen(stats_suffix(S));
    auto is = [&](const char *name) {
        return strlen(name) == base && strncmp(variant, name, base) == 0;
    };
    row_plan plan;
    if constexpr (MODE != NORM_RMS) {
        if (is("held_wide") || is("held_push"))
            return held_variant_plan(is("held_wide") ? "held_wide" : "held", p.cols, V, 16, &plan)
                       ? run_held(op, s, plan, p, norm_held_for<T, MODE, IO, X, S>(plan.vpt))
                       : WEFT_EINVAL;
        if constexpr (sizeof(T) == 2) {
            if (is("held_packed_pairs") || is("held_packed_quads"))
                return run_packed<T>(
                    op, s, is("held_packed_pairs") ? "held_packed_pairs" : "held_packed_quads", p,
                    norm_packed_for<T, MODE, IO, X, PACKED_MAX_VALUES, S>);
        }
    }
    return WEFT_EINVAL;
}

/* Whether the variant is one of packed_plan's. */
inline bool packed_variant(const char *variant)
{
    return strncmp(variant, "held_packed", 11) == 0;
}

/* The norms' kernels that test for each input at run time, as calls the
 * library does not fix at compile time take them (rows not a multiple of
 * 8; and the norms without weight or bias, LayerNorm with the weight alone
 * and add+LayerNorm without the sum, until those were fixed too): held at
 * 16 values a thread with a cluster's statistics pushed
 * (held_push_checked: the library's on rows up to 16384, and RMSNorm's on
 * all), and packed under held_packed_pairs' or held_packed_quads' plan
 * (held_packed_pairs_checked, held_packed_quads_checked: LayerNorm's in
 * bf16 beyond; ptxas has them spill 0.8-2.1 KB a thread). The bench times
 * them on those calls (CHECKED_VARIANTS). */
inline bool checked_variant(const char *variant)
{
    return strcmp(variant, "held_push_checked") == 0 ||
           strcmp(variant, "held_packed_pairs_checked") == 0 ||
           strcmp(variant, "held_packed_quads_checked") == 0;
}

template <typename T, norm_mode MODE>
int run_checked(const char *op, cudaStream_t s, const char *variant, const norm_params<T> &p)
{
    constexpr int V = vec16<T>();
    row_plan plan;
    if (strcmp(variant, "held_push_checked") == 0)
        return plan_held(p.cols, V, 16, &plan)
                   ? run_held(op, s, plan, p,
                              norm_held_for<T, MODE, NORM_IO_CHECKED, EXCHANGE_PUSH>(plan.vpt))
                   : WEFT_EINVAL;
    if constexpr (sizeof(T) == 2) {
        const bool pairs = strcmp(variant, "held_packed_pairs_checked") == 0;
        return run_packed<T>(
            op, s, pairs ? "held_packed_pairs" : "held_packed_quads", p,
            norm_packed_for<T, MODE, NORM_IO_CHECKED, EXCHANGE_PUSH, PACKED_MAX_VALUES>);
    }
    return WEFT_EINVAL;
}

/* The variants every norm's dispatcher shares (run_checked's, run_lib's,
 * run_packed_resident's, run_polled's, run_packed_tpr's, run_stats'):
 * true, with the launch's result in *rc, when the variant is one of them. */
template <typename T, norm_mode MODE, unsigned IO>
bool run_norm_shared(const char *op, cudaStream_t s, const char *variant, const norm_params<T> &p,
                     int *rc)
{
    if (checked_variant(variant))
        *rc = run_checked<T, MODE>(op, s, variant, p);
    else if (strncmp(variant, "lib_", 4) == 0)
        *rc = run_lib<T, MODE, IO>(op, s, variant, p);
    else if (strncmp(variant, "packed_quads_b", 14) == 0)
        *rc = run_packed_resident<T, MODE, IO>(op, s, variant, p);
    else if (polled_variant(variant))
        *rc = run_polled<T, MODE, IO>(op, s, variant, p);
    else if (strncmp(variant, "tpr_", 4) == 0)
        *rc = run_packed_tpr<T, MODE, IO>(op, s, variant, p);
    else if (stats_variant(variant) == STATS_THREAD_MOMENTS)
        *rc = run_stats<T, MODE, IO, STATS_THREAD_MOMENTS>(op, s, variant, p);
    else if (stats_variant(variant) == STATS_WARP_PASSES)
        *rc = run_stats<T, MODE, IO, STATS_WARP_PASSES>(op, s, variant, p);
    else
        return false;
    return true;
}

/* The kernels by vectors a thread, for run_plan. */
template <typename T, int V, int VPT> struct softmax_k {
    static auto fn()
    {
        return softmax_kernel<T, V, VPT>;
    }
};
template <typename T, int V, int VPT> struct norm_k {
    static auto fn()
    {
        return norm_kernel<T, V, VPT>;
    }
};

/* Up to 32 values a thread (regs_double), beyond what the library
 * instantiates. */
template <typename T, int V, typename Params, template <typename, int, int> class K>
int run_plan(const char *op, cudaStream_t s, const row_plan &plan, const Params &p)
{
    return by_vpt<32 / V>(
        plan.vpt,
        [&](auto k) {
            return launch_rows(op, s, plan, p.rows, K<T, V, decltype(k)::value>::fn(), p,
                               plan.tiles);
        },
        [] { return (int)WEFT_EINVAL; });
}

/* A norm's parameters on the bench's rows: contiguous, eps 1e-5, no
 * residual or sum, the erf form should the caller add a GELU. */
template <typename T>
norm_params<T> bench_norm(void *out, const void *in, const void *weight, const void *bias,
                          size_t rows, size_t cols)
{
    norm_params<T> p = {};
    p.out = (T *)out;
    p.in = (const T *)in;
    p.weight = (const T *)weight;
    p.bias = (const T *)bias;
    p.rows = rows;
    p.cols = p.stride = cols;
    p.eps = 1e-5f;
    p.form = WEFT_GELU_ERF;
    return p;
}

} // namespace weft_ops::variants

#endif
