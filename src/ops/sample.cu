/*
 * sample.cu - weft_sample on the GPU: a block a row, and no sort. The
 * host reference walks the row sorted by rank.h's order; every place it
 * stops at (the top_k-th token, the one where top_p's weight is reached,
 * the one the draw lands on) is "the first token in that order at which a
 * running total reaches a goal", and the block finds it by a radix walk
 * down the 64-bit rank, a byte a pass: a histogram of the candidates'
 * next byte (their count and weight) says which bin the goal falls in;
 * once that bin holds one token, one more pass finds it. Counts and
 * weights are integers, so the histograms' sums do not depend on the
 * order of the atomics, and the token is the host's.
 *
 * A pass reads the row (a 128k vocabulary of fp32 is 512 KB: L2 holds it
 * after the first). One block reads it at the rate of the bytes it keeps
 * in flight, so a pass (each_logit) loads 16 bytes at a time, all of a
 * thread's loads issued before any is used: 64 KB of fp32 in flight (16 KB
 * of half types, whose 32 values a thread spilled), where a load an
 * element kept 8 KB and a greedy row of 128k fp32 took ~60 us. Lanes of a
 * warp that fall in one bin add to it once (a warp reduction over the
 * bin's lanes), so the first passes, where most tokens share a few bins,
 * do not queue on one shared-memory address.
 */
#include "ops/ops_cuda.cuh"
#include "ops/rank.h"
#include "ops/sample.h"

namespace weft_ops
{
namespace
{

constexpr int SAMPLE_THREADS = 512;
constexpr int SAMPLE_WARPS = SAMPLE_THREADS / 32;
constexpr int BINS = 256;
constexpr int LOADS = 8; /* a pass's loads in flight per thread: L2's latency is long */
constexpr unsigned FULL = 0xffffffffu;

typedef unsigned long long u64;

struct bins {
    u64 weight[BINS];
    unsigned count[BINS];
    u64 hit; /* the token found, once its bin holds it alone */
};

/* What warp 0 tells the block after a pass. */
struct choice {
    unsigned bin;
    u64 goal, above; /* the goal left within the bin; the weight of the bins above it */
};

/* A place found: the token's rank and the weight up to and including it. */
struct found {
    u64 rank, upto;
};

__device__ __forceinline__ u64 warp_sum(u64 v)
{
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ u64 warp_max(u64 v)
{
    for (int o = 16; o > 0; o /= 2) {
        const u64 other = __shfl_xor_sync(FULL, v, o);
        v = other > v ? other : v;
    }
    return v;
}

/* f(j, logit, valid) for each element j of the row, in no particular
 * order: 16 bytes a load where the row is 16-byte aligned (its tail an
 * element a load), else an element a load, LOADS loads a thread in flight.
 * Every lane of a warp makes the same calls, those past the row's end with
 * valid false (find's bins add warp-wide). */
template <typename T, typename F>
__device__ __forceinline__ void each_logit(const T *row, size_t cols, F f)
{
    constexpr int V = 16 / sizeof(T);
    constexpr int VLOADS = V == 4 ? LOADS : 2; /* fp32: 32 values a thread; halves: 16 */
    constexpr size_t STEP = (size_t)SAMPLE_THREADS * LOADS, VSTEP = (size_t)SAMPLE_THREADS * VLOADS;
    size_t done = 0;
    if ((uintptr_t)row % 16 == 0) {
        const size_t whole = cols / V;
        for (size_t base = 0; base < whole; base += VSTEP) {
            vec<T, V> raw[VLOADS];
#pragma unroll
            for (int u = 0; u < VLOADS; u++) {
                const size_t i = base + u * SAMPLE_THREADS + threadIdx.x;
                raw[u] = i < whole ? reinterpret_cast<const vec<T, V> *>(row)[i] : vec<T, V>{};
            }
#pragma unroll
            for (int u = 0; u < VLOADS; u++) {
                const size_t i = base + u * SAMPLE_THREADS + threadIdx.x;
#pragma unroll
                for (int e = 0; e < V; e++)
                    f(i * V + e, i < whole ? to_f32(raw[u].e[e]) : 0.0f, i < whole);
            }
        }
        done = whole * V;
    }
    for (size_t base = done; base < cols; base += STEP) {
        float l[LOADS];
#pragma unroll
        for (int u = 0; u < LOADS; u++) {
            const size_t j = base + u * SAMPLE_THREADS + threadIdx.x;
            l[u] = j < cols ? to_f32(row[j]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < LOADS; u++) {
            const size_t j = base + u * SAMPLE_THREADS + threadIdx.x;
            f(j, l[u], j < cols);
        }
    }
}

/* The block's sum (or largest), in every thread. */
template <bool largest> __device__ u64 block_reduce(u64 v, u64 *warps)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = largest ? warp_max(v) : warp_sum(v);
    __syncthreads(); /* warps[] may still be read from the last call */
    if (lane == 0)
        warps[warp] = v;
    __syncthreads();
    v = lane < SAMPLE_WARPS ? warps[lane] : 0;
    return largest ? warp_max(v) : warp_sum(v);
}

/* A warp's candidates into the bins: the lanes of one bin as one add. */
__device__ __forceinline__ void add_to_bins(bins &h, bool candidate, unsigned bin, u64 weight)
{
    unsigned todo = __ballot_sync(FULL, candidate);
    while (todo) {
        const int leader = __ffs(todo) - 1;
        const unsigned b = __shfl_sync(FULL, bin, leader);
        const bool mine = candidate && bin == b;
        const unsigned group = __ballot_sync(FULL, mine);
#if __CUDA_ARCH__ >= 800
        if (mine) { /* a weight is at most 2^32: 32 of its halves fit 32 bits */
            const u64 hi = __reduce_add_sync(group, (unsigned)(weight >> 16));
            const u64 lo = __reduce_add_sync(group, (unsigned)(weight & 0xffffu));
            if ((int)(threadIdx.x % 32) == leader) {
                atomicAdd(&h.count[b], (unsigned)__popc(group));
                atomicAdd(&h.weight[b], (hi << 16) + lo);
            }
        }
#else
        const u64 w = warp_sum(mine ? weight : 0);
        if ((int)(threadIdx.x % 32) == leader) {
            atomicAdd(&h.count[b], (unsigned)__popc(group));
            atomicAdd(&h.weight[b], w);
        }
#endif
        todo &= ~group;
    }
}

/* Warp 0: the bin, from the largest down, in which the running count (or
 * weight) reaches goal. Lane L holds bins 255 - 8L down to 248 - 8L. */
__device__ void choose_bin(const bins &h, u64 goal, bool by_count, choice *out)
{
    const int lane = threadIdx.x % 32, hi = BINS - 1 - 8 * lane;
    u64 mine = 0;
    for (int b = hi; b > hi - 8; b--)
        mine += by_count ? h.count[b] : h.weight[b];
    u64 upto = mine; /* inclusive scan over the lanes, in descending bins */
    for (int o = 1; o < 32; o *= 2) {
        const u64 v = __shfl_up_sync(FULL, upto, o);
        if (lane >= o)
            upto += v;
    }
    const u64 before = upto - mine;
    const unsigned crossing = __ballot_sync(FULL, before < goal && goal <= upto);
    const int at = crossing ? __ffs(crossing) - 1 : 31; /* none: rounding cannot, but stay inside */
    unsigned bin = 0;
    u64 left = 0;
    if (lane == at) {
        u64 sum = before;
        for (bin = hi; bin > (unsigned)(hi - 7); bin--) {
            const u64 m = by_count ? h.count[bin] : h.weight[bin];
            if (sum + m >= goal)
                break;
            sum += m;
        }
        left = goal - sum;
    }
    bin = __shfl_sync(FULL, bin, at);
    left = __shfl_sync(FULL, left, at);
    u64 above = 0;
    for (int b = hi; b > hi - 8; b--)
        above += b > (int)bin ? h.weight[b] : 0;
    above = warp_sum(above);
    if (lane == 0)
        *out = choice{bin, left, above};
}

/* The token of the row ranked at least floor whose rank's top 64 - shift
 * bits are prefix, there being one. */
template <typename T>
__device__ u64 the_one(const T *row, size_t cols, u64 floor, u64 prefix, int shift, bins &h)
{
    each_logit(row, cols, [&](size_t j, float l, bool valid) {
        const u64 rank = weft__rank(__float_as_uint(l), (uint32_t)j);
        if (valid && rank >= floor && rank >> shift == prefix)
            h.hit = rank;
    });
    __syncthreads();
    return h.hit;
}

/* The first token (in rank order, of those ranked at least floor) at which
 * the running count (by_count) or weight reaches goal; goal is at least 1
 * and at most the candidates' total. */
template <typename T>
__device__ found find(const T *row, size_t cols, float l_max, float t, u64 floor, u64 goal,
                      bool by_count, bins &h, choice &c)
{
    u64 prefix = 0, above = 0;
    for (int shift = 56;; shift -= 8) {
        __syncthreads(); /* the last pass's (or call's) readers are done with h */
        for (int b = threadIdx.x; b < BINS; b += SAMPLE_THREADS)
            h.weight[b] = 0, h.count[b] = 0;
        __syncthreads();
        each_logit(row, cols, [&](size_t j, float l, bool valid) {
            const u64 rank = weft__rank(__float_as_uint(l), (uint32_t)j);
            const bool candidate =
                valid && rank >= floor && (shift == 56 || rank >> (shift + 8) == prefix);
            const unsigned bin = (unsigned)(rank >> shift) & (BINS - 1);
            add_to_bins(h, candidate, bin, candidate ? weft__sample_weight(l, l_max, t) : 0);
        });
        __syncthreads();
        if (threadIdx.x < 32)
            choose_bin(h, goal, by_count, &c);
        __syncthreads();
        const unsigned b = c.bin;
        prefix = prefix << 8 | b;
        goal = c.goal;
        above += c.above;
        if (shift == 0)
            return found{prefix, above + h.weight[b]};
        if (h.count[b] <= 1) {
            const u64 upto = above + h.weight[b];
            return found{the_one(row, cols, floor, prefix, shift, h), upto};
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(int32_t *ids, const T *in, size_t cols, size_t stride,
                  const weft_sampling *params)
{
    __shared__ bins h;
    __shared__ choice c;
    __shared__ u64 warps[SAMPLE_WARPS];
    const T *row = in + (size_t)blockIdx.x * stride;
    const weft_sampling p = params[blockIdx.x];

    u64 best = 0;
    each_logit(row, cols, [&](size_t j, float l, bool valid) {
        const u64 k = weft__rank(__float_as_uint(l), (uint32_t)j);
        best = valid && k > best ? k : best;
    });
    best = block_reduce<true>(best, warps);
    const uint32_t top = weft__rank_index(best);
    const float l_max = to_f32(row[top]), t = p.temperature;
    if (!weft__sample_draws(t, l_max)) {
        if (threadIdx.x == 0)
            ids[blockIdx.x] = (int32_t)top;
        return;
    }

    u64 floor = 0, total = 0;
    if (p.top_k > 0 && (size_t)p.top_k < cols) {
        const found k = find(row, cols, l_max, t, 0, (u64)p.top_k, true, h, c);
        floor = k.rank, total = k.upto;
    } else {
        each_logit(row, cols, [&](size_t j, float l, bool valid) {
            (void)j;
            total += valid ? weft__sample_weight(l, l_max, t) : 0;
        });
        total = block_reduce<false>(total, warps);
    }
    const u64 goal = weft__sample_goal(total, p.top_p);
    if (goal < total) {
        const found q = find(row, cols, l_max, t, floor, goal, false, h, c);
        floor = q.rank, total = q.upto;
    }
    const uint4 w = philox4x32_10(
        make_uint4(WEFT__SAMPLE_SALT, 0, (uint32_t)p.offset, (uint32_t)(p.offset >> 32)),
        make_uint2((uint32_t)p.seed, (uint32_t)(p.seed >> 32)));
    const u64 at = weft__sample_scale((u64)w.y << 32 | w.x, total);
    const found d = find(row, cols, l_max, t, floor, at + 1, false, h, c);
    if (threadIdx.x == 0)
        ids[blockIdx.x] = (int32_t)weft__rank_index(d.rank);
}

} // namespace
} // namespace weft_ops

using namespace weft_ops;

extern "C" int weft__sample_cuda(void *stream, const weft__sample_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;
    return by_dtype(a->dtype, [&](auto t) {
        using T = decltype(t);
        sample_kernel<T><<<(unsigned)a->rows, SAMPLE_THREADS, 0, s>>>(
            a->ids, (const T *)a->logits, a->cols, a->stride, a->params);
        return launched("weft_sample");
    });
}
