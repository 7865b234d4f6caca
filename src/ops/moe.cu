/*
 * moe.cu - the mixture-of-experts router, permute and combine on the GPU
 * (moe.c holds the checks and the host references, which define what is
 * computed).
 *
 * The router is a memset and three kernels, all on the stream, so that no
 * size ever goes back to the host and the sequence captures into a graph:
 *  1. select: a warp a token. Each lane holds up to 8 of the token's
 *     logits; k rounds of a warp-wide maximum of the 64-bit rank (rank.h)
 *     pick the experts in slot order, the softmax's max and sum are warp
 *     reductions, lanes j < k write slot j. A block's choices are counted
 *     in shared memory and added to the global counts, kept in
 *     offsets[1..E] (zeroed by the memset).
 *  2. scatter: a block an expert. It sums the counts below its expert (its
 *     first row), then walks the tokens in order, 4 consecutive tokens a
 *     thread and a block's worth at a time; the tokens that chose it get
 *     their rows by a block-wide prefix sum of the threads' hits, which is
 *     the stable (token-order) placement the host makes, whatever the
 *     blocks' timing. It stops at its count.
 *  3. offsets: one block turns the counts into their exclusive prefix
 *     sums, in place, once every scatter block has read them.
 * For 8192 tokens, 64 experts and k = 8 the scatter reads the ids (256 KB)
 * once per expert, from L2.
 *
 * Permute is a row copy (16 bytes at a time where everything is aligned);
 * combine a block a token, its k products each rounded on its own
 * (__fmul_rn, __fadd_rn), in slot order, as the host sums them.
 */
#include "ops/moe.h"
#include "ops/ops_cuda.cuh"

namespace weft_ops
{
namespace
{

constexpr int SELECT_THREADS = 256, SCATTER_THREADS = 512, TOKENS_A_THREAD = 4;
constexpr int PER_LANE = WEFT__MOE_MAX_EXPERTS / 32;

struct gate_params {
    const void *logits;
    size_t tokens, experts, stride, k;
    int softmax, renormalize;
    float *weights;
    int32_t *ids, *offsets, *perm, *inverse;
};

__device__ __forceinline__ float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

template <typename T> __global__ void __launch_bounds__(SELECT_THREADS) select_kernel(gate_params p)
{
    __shared__ int counts[WEFT__MOE_MAX_EXPERTS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const size_t t = (size_t)blockIdx.x * (SELECT_THREADS / 32) + warp;
    const T *row = (const T *)p.logits + t * p.stride;

    for (int e = threadIdx.x; e < WEFT__MOE_MAX_EXPERTS; e += SELECT_THREADS)
        counts[e] = 0;
    __syncthreads();

    if (t < p.tokens) {
        float v[PER_LANE];
        uint64_t rank[PER_LANE];
        float m = -INFINITY;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            const unsigned e = lane + 32u * i;
            v[i] = e < p.experts ? to_f32(row[e]) : -INFINITY;
            rank[i] = e < p.experts ? weft__rank(__float_as_uint(v[i]), e) : 0;
            if (e < p.experts)
                m = fmaxf(m, v[i]);
        }
        for (int o = 16; o > 0; o /= 2)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float sum = 0.0f;
        if (p.softmax) {
#pragma unroll
            for (int i = 0; i < PER_LANE; i++)
                if (lane + 32u * i < p.experts)
                    sum += expf(v[i] - m);
            for (int o = 16; o > 0; o /= 2)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
        }

        int mine = 0; /* the expert of slot lane, for lanes < k */
        for (size_t j = 0; j < p.k; j++) {
            uint64_t best = 0;
#pragma unroll
            for (int i = 0; i < PER_LANE; i++)
                best = rank[i] > best ? rank[i] : best;
            for (int o = 16; o > 0; o /= 2) {
                uint64_t other = __shfl_xor_sync(0xffffffffu, best, o);
                best = other > best ? other : best;
            }
            const int e = (int)weft__rank_index(best);
#pragma unroll
            for (int i = 0; i < PER_LANE; i++)
                if (rank[i] == best)
                    rank[i] = 0; /* taken: ranks are unique, one lane owns it */
            if ((size_t)lane == j)
                mine = e;
        }

        float w = 0.0f;
        if ((size_t)lane < p.k) {
            const float x = to_f32(row[mine]);
            w = p.softmax ? expf(x - m) / sum : sigmoid(x);
        }
        if (p.renormalize) {
            float total = 0.0f; /* in slot order, as the host adds them */
            for (size_t j = 0; j < p.k; j++)
                total += __shfl_sync(0xffffffffu, w, (int)j);
            w /= total;
        }
        if ((size_t)lane < p.k) {
            p.weights[t * p.k + lane] = w;
            p.ids[t * p.k + lane] = mine;
            atomicAdd(&counts[mine], 1);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < (int)p.experts; e += SELECT_THREADS)
        if (counts[e])
            atomicAdd(&p.offsets[e + 1], counts[e]);
}

/* The exclusive prefix sum over the block's threads (in thread order) of
 * v, and the block's total. */
__device__ __forceinline__ int block_exclusive_sum(int v, int *total, int *warp_sums)
{
    constexpr int WARPS = SCATTER_THREADS / 32;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int incl = v;
    for (int o = 1; o < 32; o *= 2) {
        const int up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += up;
    }
    if (lane == 31)
        warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int s = lane < WARPS ? warp_sums[lane] : 0;
        int x = s;
        for (int o = 1; o < 32; o *= 2) {
            const int up = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o)
                x += up;
        }
        if (lane < WARPS)
            warp_sums[lane] = x - s;
        if (lane == 31)
            warp_sums[32] = x;
    }
    __syncthreads();
    const int before = warp_sums[warp] + incl - v;
    *total = warp_sums[32];
    __syncthreads(); /* warp_sums is reused by the next call */
    return before;
}

/* A block an expert. Thread i of a step takes TOKENS_A_THREAD consecutive
 * tokens after those of threads < i, so the prefix sum over the threads
 * of their hits is the token order. */
__global__ void __launch_bounds__(SCATTER_THREADS) scatter_kernel(gate_params p)
{
    __shared__ int warp_sums[33];
    __shared__ int first;
    const int expert = blockIdx.x;
    const int count = p.offsets[expert + 1];
    if (count == 0)
        return;
    if (threadIdx.x < 32) {
        int s = 0;
        for (int e = threadIdx.x; e < expert; e += 32)
            s += p.offsets[e + 1];
        for (int o = 16; o > 0; o /= 2)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0)
            first = s;
    }
    __syncthreads();

    constexpr size_t STEP = (size_t)SCATTER_THREADS * TOKENS_A_THREAD;
    int placed = 0;
    for (size_t t0 = 0; t0 < p.tokens && placed < count; t0 += STEP) {
        const size_t mine = t0 + (size_t)threadIdx.x * TOKENS_A_THREAD;
        int slot[TOKENS_A_THREAD], hits = 0;
#pragma unroll
        for (int q = 0; q < TOKENS_A_THREAD; q++) {
            slot[q] = -1;
            if (mine + q < p.tokens)
                for (size_t j = 0; j < p.k; j++)
                    if (p.ids[(mine + q) * p.k + j] == expert)
                        slot[q] = (int)j;
            hits += slot[q] >= 0;
        }
        int total;
        int row = first + placed + block_exclusive_sum(hits, &total, warp_sums);
#pragma unroll
        for (int q = 0; q < TOKENS_A_THREAD; q++)
            if (slot[q] >= 0) {
                const int32_t pair = (int32_t)((mine + q) * p.k + (size_t)slot[q]);
                p.perm[row] = pair;
                p.inverse[pair] = row;
                row++;
            }
        placed += total;
    }
}

__global__ void offsets_kernel(int32_t *offsets, int experts)
{
    __shared__ int32_t counts[WEFT__MOE_MAX_EXPERTS + 1];
    for (int e = threadIdx.x; e <= experts; e += blockDim.x)
        counts[e] = offsets[e];
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t s = 0;
        for (int e = 0; e <= experts; e++) {
            s += e ? counts[e] : 0;
            counts[e] = s;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= experts; e += blockDim.x)
        offsets[e] = counts[e];
}

/* ---- permute and combine ---------------------------------------------- */

/* Row p of out := row perm[p] / k of in, in units of U (16, 8, 4 or 2
 * bytes), units elements a row. */
template <typename U>
__global__ void permute_kernel(U *out, const U *in, const int32_t *perm, int k, size_t units,
                               size_t in_stride, size_t out_stride)
{
    const size_t p = blockIdx.x;
    const size_t t = (size_t)perm[p] / (size_t)k;
    const U *src = in + t * in_stride;
    U *dst = out + p * out_stride;
    for (size_t c = threadIdx.x; c < units; c += blockDim.x)
        dst[c] = src[c];
}

template <typename T>
__global__ void unpermute_kernel(T *out, const T *y, const float *weights, const int32_t *inverse,
                                 const T *residual, int k, size_t cols, size_t y_stride,
                                 size_t out_stride)
{
    const size_t t = blockIdx.x;
    /* Loops over the most slots with j < k inside keep w and rows in
     * registers. */
    float w[WEFT__MOE_MAX_K];
    size_t rows[WEFT__MOE_MAX_K];
#pragma unroll
    for (int j = 0; j < WEFT__MOE_MAX_K; j++) {
        w[j] = j < k ? weights[t * k + j] : 0.0f;
        rows[j] = j < k ? (size_t)inverse[t * k + j] * y_stride : 0;
    }
    for (size_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < WEFT__MOE_MAX_K; j++)
            if (j < k)
                acc = __fadd_rn(acc, __fmul_rn(w[j], to_f32(y[rows[j] + c])));
        if (residual)
            acc = __fadd_rn(acc, to_f32(residual[t * out_stride + c]));
        out[t * out_stride + c] = from_f32<T>(acc);
    }
}

static unsigned row_threads(size_t units)
{
    return units >= 256 ? 256u : units >= 128 ? 128u : units >= 64 ? 64u : 32u;
}

} // namespace
} // namespace weft_ops

using namespace weft_ops;

extern "C" int weft__moe_gate_cuda(void *stream, const weft__moe_gate_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;
    gate_params p = {a->logits,      a->tokens,      a->experts,
                     a->stride,      a->k,           a->score == WEFT_MOE_SOFTMAX,
                     a->renormalize, a->out.weights, a->out.ids,
                     a->out.offsets, a->out.perm,    a->out.inverse};
    const char *op = "weft_moe_gate";
    int rc;
    if ((rc = launch_status(
             op, cudaMemsetAsync(p.offsets, 0, (a->experts + 1) * sizeof(int32_t), s))) != WEFT_OK)
        return rc;
    const unsigned blocks =
        (unsigned)((a->tokens + SELECT_THREADS / 32 - 1) / (SELECT_THREADS / 32));
    rc = by_dtype(a->dtype, [&](auto t) {
        select_kernel<decltype(t)><<<blocks, SELECT_THREADS, 0, s>>>(p);
        return launched(op);
    });
    if (rc != WEFT_OK)
        return rc;
    scatter_kernel<<<(unsigned)a->experts, SCATTER_THREADS, 0, s>>>(p);
    if ((rc = launched(op)) != WEFT_OK)
        return rc;
    offsets_kernel<<<1, 256, 0, s>>>(p.offsets, (int)a->experts);
    return launched(op);
}

extern "C" int weft__moe_permute_cuda(void *stream, const weft__moe_permute_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t es = weft__dtype_size(a->dtype);
    const size_t bytes = a->cols * es, in_b = a->in_stride * es, out_b = a->out_stride * es;
    const uintptr_t all = (uintptr_t)a->out | (uintptr_t)a->in | bytes | in_b | out_b;
    const size_t unit = all % 16 == 0 ? 16 : all % 8 == 0 ? 8 : all % 4 == 0 ? 4 : 2;
    const unsigned rows = (unsigned)(a->tokens * a->k), threads = row_threads(bytes / unit);
    const int k = (int)a->k;
    switch (unit) {
    case 16:
        permute_kernel<<<rows, threads, 0, s>>>((uint4 *)a->out, (const uint4 *)a->in, a->perm, k,
                                                bytes / 16, in_b / 16, out_b / 16);
        break;
    case 8:
        permute_kernel<<<rows, threads, 0, s>>>((uint2 *)a->out, (const uint2 *)a->in, a->perm, k,
                                                bytes / 8, in_b / 8, out_b / 8);
        break;
    case 4:
        permute_kernel<<<rows, threads, 0, s>>>((uint32_t *)a->out, (const uint32_t *)a->in,
                                                a->perm, k, bytes / 4, in_b / 4, out_b / 4);
        break;
    default:
        permute_kernel<<<rows, threads, 0, s>>>((uint16_t *)a->out, (const uint16_t *)a->in,
                                                a->perm, k, bytes / 2, in_b / 2, out_b / 2);
        break;
    }
    return launched("weft_moe_permute");
}

extern "C" int weft__moe_unpermute_cuda(void *stream, const weft__moe_unpermute_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;
    const unsigned threads = row_threads(a->cols);
    return by_dtype(a->dtype, [&](auto t) {
        using T = decltype(t);
        unpermute_kernel<T><<<(unsigned)a->tokens, threads, 0, s>>>(
            (T *)a->out, (const T *)a->y, a->weights, a->inverse, (const T *)a->residual, (int)a->k,
            a->cols, a->y_stride, a->out_stride);
        return launched("weft_moe_unpermute");
    });
}
