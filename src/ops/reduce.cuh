/*
 * reduce.cuh - the row operators' reductions: of one row over a warp, a
 * block (a power of two of warps) or the blocks of a cluster, returned to
 * every thread of the row with the same bits (the order of combination is
 * fixed). Sums, maxima, softmax's max with its sum, and LayerNorm's
 * moments, with their merge. A cluster's blocks share their results at
 * cluster barriers or push them into each other's shared memory
 * (cluster_exchange).
 */
#ifndef WEFT_OPS_REDUCE_CUH
#define WEFT_OPS_REDUCE_CUH

#include <cooperative_groups.h>

#include "ops/ops_cuda.cuh"

namespace weft_ops
{

struct op_sum {
    __device__ __forceinline__ float operator()(float a, float b) const
    {
        return a + b;
    }
};
/* fmaxf returns the other operand for a NaN: a NaN is never the maximum,
 * as the host's "v > max" never picks one. */
struct op_max {
    __device__ __forceinline__ float operator()(float a, float b) const
    {
        return fmaxf(a, b);
    }
};

/* Two sums reduced together (one barrier for both). */
struct sum2 {
    float a, b;
};

__device__ __forceinline__ float shfl_xor(float v, int m)
{
    return __shfl_xor_sync(0xffffffffu, v, m);
}
__device__ __forceinline__ sum2 shfl_xor(sum2 v, int m)
{
    return {__shfl_xor_sync(0xffffffffu, v.a, m), __shfl_xor_sync(0xffffffffu, v.b, m)};
}
/* One step of a reduction: op on two partial results; two sums,
 * each reduced by op. */
template <typename Op, typename R> __device__ __forceinline__ R combine(Op op, R x, R y)
{
    return op(x, y);
}
template <typename Op> __device__ __forceinline__ sum2 combine(Op op, sum2 x, sum2 y)
{
    return {op(x.a, y.a), op(x.b, y.b)};
}

/* A part of a row as LayerNorm's statistics see it: how many elements,
 * their mean, and the sum of their squared deviations from it. Two parts
 * merge into their union exactly (Chan, Golub and LeVeque's pairwise
 * update), so the mean and the variance take one reduction, and the
 * variance keeps the two-pass accuracy: no E[s^2] - E[s]^2. */
struct moments {
    float n, mean, m2;
};

__device__ __forceinline__ moments shfl_xor(moments v, int m)
{
    return {__shfl_xor_sync(0xffffffffu, v.n, m), __shfl_xor_sync(0xffffffffu, v.mean, m),
            __shfl_xor_sync(0xffffffffu, v.m2, m)};
}

/* The merge, written so that merge(a, b) and merge(b, a) give the same bits
 * (each lane of a butterfly step computes one of them): the difference of
 * the means appears only squared or times the difference of the counts,
 * and no product of a's and b's terms is contracted into an fma. The mean
 * is the midpoint, corrected when the counts differ: one rounding at the
 * mean's magnitude a step, and the steps below average their errors
 * instead of adding them. Equal counts - every step but those at a row's
 * end - take no reciprocal: the merge is on each row's critical path. */
struct op_merge {
    __device__ __forceinline__ moments operator()(moments a, moments b) const
    {
        float d = __fsub_rn(b.mean, a.mean), d2 = __fmul_rn(d, d);
        float mid = __fmul_rn(__fadd_rn(a.mean, b.mean), 0.5f), m2 = __fadd_rn(a.m2, b.m2);
        if (a.n == b.n) /* n_a n_b / n = n_a / 2 */
            return {__fadd_rn(a.n, b.n), mid, __fmaf_rn(d2, __fmul_rn(a.n, 0.5f), m2)};
        if (a.n == 0.0f || b.n == 0.0f)
            return a.n == 0.0f ? b : a;
        float n = __fadd_rn(a.n, b.n), inv = __frcp_rn(n);
        float skew = __fmul_rn(__fmul_rn(d, __fsub_rn(b.n, a.n)), __fmul_rn(0.5f, inv));
        float spread = __fmul_rn(d2, __fmul_rn(__fmul_rn(a.n, b.n), inv));
        return {n, __fadd_rn(mid, skew), __fadd_rn(m2, spread)};
    }
};

/*
 * How the blocks of a cluster share their results in row_reduce:
 *  - BARRIERS (the staged and register-tile kernels): each
 *    block writes its result to its slot; a cluster barrier; every block
 *    reads every slot; a second barrier keeps the slots until all have
 *    read. A cluster barrier's arrive orders memory at the GPU's scope
 *    (MEMBAR.ALL.GPU in the SASS: a round trip through L2), twice a
 *    reduction.
 *  - PUSH: each block stores its result into its slot in every block of
 *    the cluster with asynchronous stores that the receiver's mbarrier
 *    counts in (st.async ... complete_tx), and waits on its own mbarrier
 *    alone: no fence, no second barrier. The mbarrier must be set up before
 *    any block stores to it: push_setup, at the kernel's start, with one
 *    relaxed cluster barrier. A PUSH scratch serves one reduction a launch
 *    (its mbarrier's first phase), so only kernels that reduce a row once
 *    per scratch take it: the held kernels, a row a block, where it is
 *    faster than BARRIERS on rows over a cluster. One warp polls the
 *    mbarrier while the others wait at the block's barrier, which issues
 *    nothing: the SM's other blocks keep its issue slots.
 *  - PUSH_POLLED: PUSH with every thread polling the mbarrier, which
 *    issues more instructions an element (bench/ops times it).
 */
enum cluster_exchange { EXCHANGE_BARRIERS, EXCHANGE_PUSH, EXCHANGE_PUSH_POLLED };

/* Whether x pushes the blocks' results. */
__host__ __device__ constexpr bool pushes(cluster_exchange x)
{
    return x != EXCHANGE_BARRIERS;
}

/* Scratch for one reduction: a slot per warp, one for the block's result
 * (read by the other blocks of a cluster). */
template <typename R, cluster_exchange X = EXCHANGE_BARRIERS, bool PUSHED = pushes(X)>
struct reduce_scratch {
    R warp[32];
    R block;
};

/* PUSH: a slot per block of the cluster, filled by that block, as 16 raw
 * bytes (one vector store), and the mbarrier that counts them in. */
template <typename R, cluster_exchange X> struct reduce_scratch<R, X, true> {
    static_assert(sizeof(R) <= 16, "a pushed result is one 16-byte store");
    R warp[32];
    alignas(16) uint32_t blocks[8][4];
    uint64_t arrived;
};

/* p's address in the shared window, as PTX's shared-memory operands take it. */
__device__ __forceinline__ unsigned shared_address(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

/* The mbarrier at shared address bar set up to expect one arrival a phase. */
__device__ __forceinline__ void barrier_init(unsigned bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}

/* The one arrival of the barrier's phase, which then completes when
 * `bytes` more have landed (asynchronous stores or copies that count
 * themselves in). */
__device__ __forceinline__ void barrier_expect(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

/* PUSH: the mbarriers of scratch s... set up, each expecting one arrival,
 * and published to the cluster (a fence for mbarrier set-up only, and one
 * relaxed cluster barrier: no GPU-wide fence). Every thread of every block
 * calls it once, before the reductions. */
template <typename... S> __device__ __forceinline__ void push_setup(unsigned cluster, S &...s)
{
    if (cluster == 1)
        return;
    if (threadIdx.x == 0) {
        (barrier_init(shared_address(&s.arrived)), ...);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\t"
                 "barrier.cluster.wait.aligned;" ::
                     : "memory");
}

/* PUSH: this block's result v into slot `rank` of every block of the
 * cluster, its own by a plain store, which the arrive on its own mbarrier
 * releases to the block's threads; that arrive also expects the other
 * blocks' results. One thread calls it. */
template <typename R, cluster_exchange X>
__device__ __forceinline__ void push_result(R v, reduce_scratch<R, X, true> &s, unsigned rank,
                                            unsigned cluster)
{
    uint32_t raw[4] = {0, 0, 0, 0};
    memcpy(raw, &v, sizeof v);
    memcpy(s.blocks[rank], raw, sizeof raw);
    barrier_expect(shared_address(&s.arrived), 16u * (cluster - 1));
    for (unsigned b = 0; b < cluster; b++) {
        if (b == rank)
            continue;
        unsigned slot, bar;
        asm("mapa.shared::cluster.u32 %0, %1, %2;"
            : "=r"(slot)
            : "r"(shared_address(s.blocks[rank])), "r"(b));
        asm("mapa.shared::cluster.u32 %0, %1, %2;"
            : "=r"(bar)
            : "r"(shared_address(&s.arrived)), "r"(b));
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, "
                     "%3, %4}, [%5];" ::"r"(slot),
                     "r"(raw[0]), "r"(raw[1]), "r"(raw[2]), "r"(raw[3]), "r"(bar)
                     : "memory");
    }
}

/* PUSH: wait until every block's result is in. The wait gives up after
 * about a second (2^31 clocks), so that an exchange that never completes
 * (a broken launch, never a correct one) shows as a wrong result, not as
 * a GPU hung for good. */
template <typename R, cluster_exchange X>
__device__ __forceinline__ void wait_pushed(reduce_scratch<R, X, true> &s)
{
    unsigned done = 0;
    const long long start = clock64();
    while (!done && clock64() - start < (1ll << 31))
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(shared_address(&s.arrived))
                     : "memory");
}

/* PUSH: block b's result, once in. */
template <typename R, cluster_exchange X>
__device__ __forceinline__ R pushed(const reduce_scratch<R, X, true> &s, unsigned b)
{
    R v;
    memcpy(&v, s.blocks[b], sizeof v);
    return v;
}

/* v reduced over each group of 2 * top lanes (top a power of two, up to
 * 16), returned to every lane of the group: the xor butterfly, each step
 * combining two equal partial results commutatively, so that every lane
 * gets the same bits. A result type may overload it, as softmax's max
 * with its sum does (the overload is found by its argument types). */
template <typename R, typename Op> __device__ __forceinline__ R butterfly(R v, Op op, unsigned top)
{
    for (unsigned m = top; m >= 1; m >>= 1)
        v = combine(op, v, shfl_xor(v, (int)m));
    return v;
}

/* The reduction of v over the calling warp, returned to every lane. */
template <typename R, typename Op> __device__ __forceinline__ R warp_reduce(R v, Op op)
{
    return butterfly(v, op, 16u);
}

/* The blocks' results of a cluster combined in rank order, results(b) the
 * one of block b: the same bits in every block. Overloadable as
 * butterfly is. */
template <typename Op, typename Results>
__device__ __forceinline__ auto fold_blocks(Op op, Results results, unsigned cluster)
{
    auto v = results(0u);
    for (unsigned b = 1; b < cluster; b++)
        v = combine(op, v, results(b));
    return v;
}

/*
 * The reduction over one row of its warps' results v (the same in every
 * lane of a warp), returned to every thread of the row. A row is one warp
 * (blockDim.x == 32, several rows per block), or one block (a power of
 * two of warps), or the blocks of one cluster. The order of the
 * combination is fixed, so every thread gets the same bits: a butterfly
 * over the warps' results, then the blocks' in rank order.
 *
 * Before returning it waits until every thread (every block) has read s,
 * so that the next reduction may write it - unless `then_other`: the
 * row's next reduction uses other scratch, and its first barrier, which
 * each thread reaches only after reading this one's result, already keeps
 * s from being written too early (a barrier a row saved, a cluster's
 * among them).
 */
template <typename R, typename Op, cluster_exchange X>
__device__ __forceinline__ R warps_reduce(R v, Op op, reduce_scratch<R, X> &s, unsigned cluster,
                                          bool then_other = false)
{
    if (blockDim.x == 32)
        return v;

    /* the warps' results: lane l of every warp takes warp l % warps's, so
     * that a butterfly within groups of `warps` lanes (a power of two)
     * leaves every lane the block's result, in log2(warps) steps */
    const unsigned warps = blockDim.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        s.warp[threadIdx.x / 32] = v;
    __syncthreads();
    v = butterfly(s.warp[lane & (warps - 1)], op, warps / 2);
    if (cluster == 1) {
        if (!then_other)
            __syncthreads(); /* the slots are reused by the next reduction */
        return v;
    }

    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    if constexpr (pushes(X)) {
        if (threadIdx.x == 0)
            push_result(v, s, cl.block_rank(), cluster);
        if (X == EXCHANGE_PUSH_POLLED || threadIdx.x < 32)
            wait_pushed(s);
        if constexpr (X == EXCHANGE_PUSH)
            __syncthreads(); /* the results the polling warp saw arrive */
        v = fold_blocks(
            op, [&](unsigned b) { return pushed(s, b); }, cluster);
    } else {
        if (threadIdx.x == 0)
            s.block = v;
        cl.sync();
        v = fold_blocks(
            op, [&](unsigned b) { return *cl.map_shared_rank(&s.block, b); }, cluster);
        if (!then_other)
            cl.sync(); /* no block rewrites or leaves its slot while others read it */
    }
    return v;
}

/*
 * A warp's sum of the squares of half-type values, taken by the tensor
 * cores from the values as loaded: two mma.sync m16n8k16 a vector of 8
 * values a lane, where the FMA pipe takes an unpack and an fma for each
 * value. Only the sum over all values is wanted, so a lane's vector may
 * stand anywhere in the operands. The first mma's A (16x16) is the lanes'
 * pairs x and z in rows 0-7, y and w in rows 8-15; its B (16x8) is A's
 * rows 0-7 transposed, the same registers. D = A B then holds in its rows
 * 0-7 the Gram matrix of each group of 4 lanes' x and z, whose diagonal
 * is their sums of squares; the second mma swaps the halves, for y and w
 * (D's rows 8-15 gather cross terms, unused). The products are exact in
 * fp32 (a half type's square fits); the tensor cores add them in fp32,
 * truncating where the FMA pipe rounds (within the tests' bounds). Every
 * lane of the warp calls each step, converged.
 */
template <typename T> struct tensor_squares {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    __device__ __forceinline__ void mma(unsigned a0, unsigned a1, unsigned a2, unsigned a3)
    {
        static_assert(sizeof(T) == 2, "the tensor cores' squares take a half type");
        if constexpr (std::is_same<T, __half>::value)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                         "{%4, %5, %6, %7}, {%4, %6}, {%0, %1, %2, %3};"
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3));
        else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                         "{%4, %5, %6, %7}, {%4, %6}, {%0, %1, %2, %3};"
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3));
    }

    /* this lane's vector of 8 values */
    __device__ __forceinline__ void add(uint4 v)
    {
        mma(v.x, v.y, v.z, v.w);
        mma(v.y, v.x, v.w, v.z);
    }

    /* This lane's part of the warp's sum: the diagonal element it holds, if
     * any (summed over the warp, they give the whole). */
    __device__ __forceinline__ float lane_part() const
    {
        const unsigned lane = threadIdx.x % 32, group = lane / 4;
        const float diagonal = group % 2 ? d[1] : d[0]; /* selected: no array in memory */
        return lane % 4 == group / 2 ? diagonal : 0.0f;
    }
};

/* The reduction of v over one row (warps_reduce's), returned to every
 * thread of the row: warp_reduce, then warps_reduce. */
template <typename R, typename Op, cluster_exchange X>
__device__ __forceinline__ R row_reduce(R v, Op op, reduce_scratch<R, X> &s, unsigned cluster,
                                        bool then_other = false)
{
    return warps_reduce(warp_reduce(v, op), op, s, cluster, then_other);
}

} // namespace weft_ops

#endif
