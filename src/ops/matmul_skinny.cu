/*
 * matmul_skinny.cu - weft_matmul for decode: m <= 32 rows of activations
 * times a Linear layer's weight (trans_b: B is n x k, k contiguous), bf16
 * and fp16 operands or FP8 ones with their scales, fp32 sums, weft_matmul's
 * whole epilogue fused.
 *
 * Why a kernel of its own: with m this small every weight byte is used m
 * times at most, so the product is a stream over B and its speed is the
 * memory's. cuBLASLt's tiles are built to reuse each loaded element, which
 * decode has not to offer (bench/matmul compares the two paths).
 *
 * The plan (E, the elements a 16-byte load holds: 8 of 16 bits, 16 FP8):
 *  - A tile of 16 output columns (16 rows of B) belongs to one block, or to a
 *    cluster of 2 to 8 when the tiles alone would leave SMs without a block (n
 *    below 16 columns an SM) and k is long enough to share (two turns a
 *    block: 2048 and more for 16-bit operands, 4096 for FP8);
 *    its warps take the tile's k in turns of 16 E (warp w of block r the turns
 *    8r + w, 8r + w + 8 x blocks, ...), so one turn of a block reads 2 KiB of
 *    each of its 16 rows, contiguous. The decode shapes' 256 to 896 tiles fill
 *    132 SMs at two or three blocks an SM without clusters; a cluster spreads
 *    a small n's tiles over more SMs with no scratch in global memory (nothing
 *    to allocate, so a call captures into a graph like any other).
 *  - Weights are read once, 16 bytes a load (ld.global.nc, not kept in L1),
 *    8 loads in flight a thread: in a turn a thread loads E consecutive k of
 *    two rows (g and g + 8 of the tile) at 4 places 4 E apart. The
 *    activations, small, are read through L1 with the same 16-byte loads:
 *    every block of an SM reads the same ones.
 *  - The products go through the tensor cores (mma m16n8k16 for 16-bit
 *    operands, m16n8k32 for FP8; fp32 accumulators): at m = 16 sixteen fp32
 *    multiply-adds a weight element would be more than the SM's CUDA cores
 *    can issue at the copy rate. The weight tile is mma's A (16 rows), the
 *    activations its B (8 columns, one a part of 8 rows of m: 1, 2 or 4
 *    parts, each weight fragment used once a part). A dot product
 *    does not care in which order its k are summed, so the E consecutive k
 *    a thread loads are placed in the fragments' k slots by one bijection
 *    for A and B alike: of each 4 E k, thread (g, t) = (lane / 4, lane % 4)
 *    holds k E t .. E t + E - 1 of weight rows g and g + 8 and of activation
 *    row g, words 0-1 making mma step 0's slots (a 32-bit word each: k 2t,
 *    2t + 1 and 2t + 8, 2t + 9 of m16n8k16; 4t .. 4t + 3 and 16 + 4t ..
 *    19 + 4t of m16n8k32), words 2-3 step 1's. No shuffles and no shared
 *    memory on the way in.
 *  - k that ends within a turn is loaded with zeros past its end (weights and
 *    activations both, so nothing unwritten meets a NaN); rows past n or m
 *    read the last valid row, whose results are not stored.
 *  - The warps' partial sums meet in shared memory (a cluster's in its first
 *    block's, read across the cluster) and are added in block and warp order
 *    (the same result every run); then each thread finishes one element:
 *    FP8's scales (alpha (sa sb sum), the host's order), alpha, beta C (C may
 *    be D: read just before it is written by the same thread), the bias, aux,
 *    ReLU or GELU (activations.cuh's, the fit of D's type, as the other
 *    kernels), D in bf16, fp16 or fp32.
 *  - It is launched as a dependent of the kernel before it (launch.cuh):
 *    its blocks may be resident while that kernel ends, and with
 *    b_constant (a model's weights) they load their first turn of weights
 *    before waiting for it. The other kernels of a decode step (the row
 *    kernels' norms, SwiGLU, the KV append, decode attention) are launched
 *    as dependents too, and each lets the next start once it has waited.
 * Batches are the grid's second dimension. What the kernel needs - A and B
 * 16-byte aligned with rows and batch strides in whole 16 bytes, no
 * transposed A, m <= 32, D not fp8 - weft__matmul_skinny_fits (matmul.c)
 * decides.
 */
#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include "ops/matmul.h"
#include "ops/ops_cuda.cuh"

namespace weft_ops
{
namespace
{

enum {
    WARPS = 8,
    THREADS = WARPS * 32,
    COLS = 16, /* output columns (rows of B) a block owns */
    PLACES = 4 /* 16-byte loads a thread makes per row and turn */
};

/* An operand type's reach: E elements a 16-byte load, a turn's k. */
template <typename T> struct operand {
    static constexpr size_t BYTES = sizeof(T); /* 2, or 1 for FP8 */
    static constexpr size_t E = 16 / BYTES;
    static constexpr size_t TURN = 4 * E * PLACES; /* k a warp takes per turn */
};

template <typename O> struct skinny_params {
    const void *a, *b; /* A m x k, B n x k */
    O *d, *aux;
    const O *c, *bias;
    const float *scale_a, *scale_b; /* FP8's (NULL for 16-bit operands) */
    bool outer_a, outer_b;          /* a scale a row of A / column of B */
    size_t m, n, k, lda, ldb, ldc, ldd, ldaux;
    size_t stride_a, stride_b, stride_c, stride_d, stride_aux;
    float alpha, beta;
    weft_matmul_act act;
    unsigned split;  /* blocks of a cluster on one tile (1: no cluster) */
    bool b_constant; /* B may be read before the kernel before has ended */
};

/* 16 bytes of weights: read once, so kept out of L1, where the
 * activations are reread. */
__device__ __forceinline__ uint4 load_weights(const uint8_t *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ uint4 load_cached(const uint8_t *p)
{
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

/* Elements kc .. kc + E - 1 of a row of k elements of BYTES each, zeros
 * past k. */
template <size_t BYTES>
__device__ __forceinline__ uint4 load_end(const uint8_t *row, size_t kc, size_t k)
{
    if (kc + 16 / BYTES <= k)
        return load_cached(row + kc * BYTES);
    uint8_t e[16];
#pragma unroll
    for (size_t i = 0; i < 16; i++)
        e[i] = kc + i / BYTES < k ? row[kc * BYTES + i] : (uint8_t)0;
    uint4 v;
    memcpy(&v, e, sizeof v);
    return v;
}

#define WEFT_SKINNY_MMA(shape_and_types)                                                           \
    asm("mma.sync.aligned." shape_and_types " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "      \
        "{%0, %1, %2, %3};"                                                                        \
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                           \
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

/* c += A B for one mma step: a the weight tile's fragment (W), b0 b1 the
 * activations' (X). */
template <typename W, typename X>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1)
{
    using e4m3 = __nv_fp8_e4m3;
    using e5m2 = __nv_fp8_e5m2;
    if constexpr (std::is_same_v<W, __nv_bfloat16>)
        WEFT_SKINNY_MMA("m16n8k16.row.col.f32.bf16.bf16.f32");
    else if constexpr (std::is_same_v<W, __half>)
        WEFT_SKINNY_MMA("m16n8k16.row.col.f32.f16.f16.f32");
    else if constexpr (std::is_same_v<W, e4m3> && std::is_same_v<X, e4m3>)
        WEFT_SKINNY_MMA("m16n8k32.row.col.f32.e4m3.e4m3.f32");
    else if constexpr (std::is_same_v<W, e4m3> && std::is_same_v<X, e5m2>)
        WEFT_SKINNY_MMA("m16n8k32.row.col.f32.e4m3.e5m2.f32");
    else if constexpr (std::is_same_v<W, e5m2> && std::is_same_v<X, e4m3>)
        WEFT_SKINNY_MMA("m16n8k32.row.col.f32.e5m2.e4m3.f32");
    else
        static_assert(sizeof(W) == 0, "no mma for this pair of operand types");
}

#undef WEFT_SKINNY_MMA

/* One turn's products: w[r][p] the weights of rows g (r 0) and g + 8
 * (r 1) at place p, load_x(h, p) activation row g + 8h's, loaded just
 * before its place's products (from L1, close) so that a thread holds one
 * place's activations, not four. Words 0-1 of a load
 * are mma step 0's k slots, words 2-3 step 1's (the bijection above).
 * FP8 steps start from zero each turn and their sum is added to acc in
 * fp32: matrix units that keep FP8 sums in narrower accumulators (as
 * Hopper's do between promotions) then never carry a long k's sum in one. */
template <typename W, typename X, int H, typename LoadX>
__device__ __forceinline__ void multiply(float (&acc)[H][4], const uint4 (&w)[2][PLACES],
                                         LoadX load_x)
{
    constexpr bool FP8 = sizeof(W) == 1;
    float turn[H][4] = {};
    float(&c)[H][4] = FP8 ? turn : acc;
#pragma unroll
    for (int p = 0; p < PLACES; p++) {
        uint4 x[H];
#pragma unroll
        for (int h = 0; h < H; h++)
            x[h] = load_x(h, p);
#pragma unroll
        for (int h = 0; h < H; h++) {
            mma<W, X>(c[h], w[0][p].x, w[1][p].x, w[0][p].y, w[1][p].y, x[h].x, x[h].y);
            mma<W, X>(c[h], w[0][p].z, w[1][p].z, w[0][p].w, w[1][p].w, x[h].z, x[h].w);
        }
    }
    if constexpr (FP8)
#pragma unroll
        for (int h = 0; h < H; h++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[h][e] += turn[h][e];
}

__device__ __forceinline__ float relu(float x)
{
    return x > 0.0f || x != x ? x : 0.0f; /* the host's: ReLU(NaN) = NaN */
}

/* Element (i, j) of batch bt from its sum s: the epilogue. */
template <typename O>
__device__ __forceinline__ void finish(const skinny_params<O> &p, size_t bt, size_t i, size_t j,
                                       float s)
{
    float v = p.alpha * s;
    if (p.scale_a) { /* FP8: alpha (sa sb sum), as the host scales it */
        float sa = p.scale_a[p.outer_a ? i : 0], sb = p.scale_b[p.outer_b ? j : 0];
        v = p.alpha * (sa * sb * s);
    }
    if (p.c)
        v += p.beta * to_f32(p.c[bt * p.stride_c + i * p.ldc + j]);
    if (p.bias)
        v += to_f32(p.bias[j]);
    if (p.aux)
        p.aux[bt * p.stride_aux + i * p.ldaux + j] = from_f32<O>(v);
    float y = v;
    if (p.act == WEFT_MATMUL_ACT_RELU)
        y = relu(v);
    else if (p.act == WEFT_MATMUL_ACT_GELU_TANH)
        y = gelu_tanh(v);
    else if (p.act == WEFT_MATMUL_ACT_GELU_ERF)
        y = gelu_erf<O>(v);
    p.d[bt * p.stride_d + i * p.ldd + j] = from_f32<O>(y);
}

/* Blocks an SM an instantiation is built for: 3 for H = 1 (80 registers);
 * 2 for H = 2 and 16-bit H = 4 (at most 128: at one block an SM, 32 KiB of
 * weights in flight, m 17-32 left a quarter of the copy rate unused); 1 for
 * FP8's H = 4, which keeps a turn's sums beside the running ones and would
 * spill at 128. */
template <typename X, int H> constexpr int blocks_an_sm()
{
    return H == 1 ? 3 : H == 2 || sizeof(X) == 2 ? 2 : 1;
}

/* X the activations' type (A's), W the weights' (B's), O D's, H the 8-row
 * parts of m (1, 2 or 4). */
template <typename X, typename W, typename O, int H>
__global__ void __launch_bounds__(THREADS, blocks_an_sm<X, H>()) skinny_kernel(skinny_params<O> p)
{
    constexpr size_t BYTES = operand<X>::BYTES, E = operand<X>::E, TURN = operand<X>::TURN;
    static_assert(sizeof(W) == sizeof(X), "both operands 16-bit or both FP8");
    __shared__ float partial[WARPS][H * 8][COLS];
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const unsigned g = lane / 4, t = lane % 4;
    /* A 1-dimensional cluster's blocks are consecutive: x % split is the
     * block's rank in it. */
    const unsigned split = p.split, rank = blockIdx.x % split;
    const size_t bt = blockIdx.y, n0 = (size_t)(blockIdx.x / split) * COLS;

    /* Bytes from here on: element offsets times BYTES. */
    const uint8_t *a = static_cast<const uint8_t *>(p.a) + bt * p.stride_a * BYTES;
    const uint8_t *b = static_cast<const uint8_t *>(p.b) + bt * p.stride_b * BYTES;
    const uint8_t *wrow[2], *xrow[H];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        size_t row = n0 + g + 8 * r;
        wrow[r] = b + ((row < p.n ? row : p.n - 1) * p.ldb + E * t) * BYTES;
    }
#pragma unroll
    for (int h = 0; h < H; h++) {
        size_t row = g + 8 * h;
        xrow[h] = a + ((row < p.m ? row : p.m - 1) * p.lda + E * t) * BYTES;
    }

    float acc[H][4] = {};
    uint4 w[2][PLACES];
    size_t kb = ((size_t)rank * WARPS + warp) * TURN;
    const size_t step = (size_t)split * WARPS * TURN;
    auto load_turn = [&] {
#pragma unroll
        for (int q = 0; q < PLACES; q++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                w[r][q] = load_weights(wrow[r] + (kb + 4 * E * q) * BYTES);
    };
    /* Launched as a dependent (launch.cuh): constant weights' first turn
     * is on its way while the kernel before ends; the rest waits for it. */
    const bool whole = kb + TURN <= p.k;
    if (p.b_constant && whole)
        load_turn();
    wait_for_prerequisites();
    let_dependents_start(); /* the norm, SwiGLU or append after it (launch.cuh) */
    if (!p.b_constant && whole)
        load_turn();
    while (kb + TURN <= p.k) {
        multiply<W, X, H>(
            acc, w, [&](int h, int q) { return load_cached(xrow[h] + (kb + 4 * E * q) * BYTES); });
        kb += step;
        if (kb + TURN <= p.k)
            load_turn();
    }
    if (kb < p.k) {                           /* the turn k ends in: its warp loads what is left */
        const size_t left = p.k - kb - E * t; /* may wrap: then nothing is left */
        const bool any = kb + E * t < p.k;
        const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int q = 0; q < PLACES; q++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                w[r][q] = any ? load_end<BYTES>(wrow[r] + kb * BYTES, 4 * E * q, left) : zero;
        multiply<W, X, H>(acc, w, [&](int h, int q) {
            return any ? load_end<BYTES>(xrow[h] + kb * BYTES, 4 * E * q, left) : zero;
        });
    }

    /* The accumulators: (column g, row 2t and 2t+1) in 0-1, column g + 8
     * in 2-3, of m-half h. */
#pragma unroll
    for (int h = 0; h < H; h++) {
        unsigned i = 8 * h + 2 * t;
        partial[warp][i][g] = acc[h][0];
        partial[warp][i + 1][g] = acc[h][1];
        partial[warp][i][g + 8] = acc[h][2];
        partial[warp][i + 1][g + 8] = acc[h][3];
    }
    /* Thread x finishes rows x / 16 + 16 e, column x % 16 (16 threads a
     * row's columns): one element a thread up to 16 rows, two at 32. */
    constexpr int EACH = (H * 8 + 15) / 16;
    const unsigned i0 = threadIdx.x / COLS, jj = threadIdx.x % COLS;
    bool mine[EACH];
#pragma unroll
    for (int e = 0; e < EACH; e++) {
        const unsigned i = i0 + 16 * e;
        mine[e] = i < H * 8 && i < p.m && n0 + jj < p.n;
    }
    float s[EACH] = {};
    if (split == 1) {
        __syncthreads();
#pragma unroll
        for (int e = 0; e < EACH; e++) {
            if (!mine[e])
                continue;
#pragma unroll
            for (int v = 0; v < WARPS; v++)
                s[e] += partial[v][i0 + 16 * e][jj];
            finish<O>(p, bt, i0 + 16 * e, n0 + jj, s[e]);
        }
        return;
    }
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync(); /* every block's partials written */
    if (rank == 0)
        for (unsigned r = 0; r < split; r++) {
            const float(*theirs)[H * 8][COLS] = cl.map_shared_rank(partial, r);
#pragma unroll
            for (int e = 0; e < EACH; e++)
                if (mine[e])
#pragma unroll
                    for (int v = 0; v < WARPS; v++)
                        s[e] += theirs[v][i0 + 16 * e][jj];
        }
    cl.sync(); /* no block leaves while the first reads its partials */
    if (rank == 0)
#pragma unroll
        for (int e = 0; e < EACH; e++)
            if (mine[e])
                finish<O>(p, bt, i0 + 16 * e, n0 + jj, s[e]);
}

/* Blocks a tile gets: 1 while the tiles give every SM a block; else
 * enough for two an SM, a power of two up to 8 (the portable cluster),
 * and no more than leave each warp a whole turn of k (turn of them). */
static unsigned split_for(size_t blocks, size_t k, size_t turn)
{
    const size_t sms = (size_t)sm_count();
    unsigned s = 1;
    if (blocks >= sms)
        return 1;
    while (s < 8 && blocks * s < 2 * sms && (size_t)2 * s * WARPS * turn <= k)
        s *= 2;
    return s;
}

template <typename X, typename W, typename O>
int launch(cudaStream_t stream, const weft__matmul_args *a)
{
    skinny_params<O> p;
    p.a = a->a, p.b = a->b;
    p.d = static_cast<O *>(a->d), p.aux = static_cast<O *>(a->aux);
    p.c = static_cast<const O *>(a->c), p.bias = static_cast<const O *>(a->bias);
    p.scale_a = a->scale_a, p.scale_b = a->scale_b;
    p.outer_a = a->scale_a_mode == WEFT_MATMUL_SCALE_OUTER;
    p.outer_b = a->scale_b_mode == WEFT_MATMUL_SCALE_OUTER;
    p.m = a->m, p.n = a->n, p.k = a->k;
    p.lda = a->lda, p.ldb = a->ldb, p.ldc = a->ldc, p.ldd = a->ldd, p.ldaux = a->ldaux;
    p.stride_a = a->stride_a, p.stride_b = a->stride_b, p.stride_c = a->stride_c;
    p.stride_d = a->stride_d, p.stride_aux = a->stride_aux;
    p.alpha = a->alpha, p.beta = a->beta, p.act = a->act;
    const size_t tiles = (a->n + COLS - 1) / COLS;
    p.split = split_for(tiles * a->batch, a->k, operand<X>::TURN);
    p.b_constant = a->b_constant;

    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attrs[2];
    cfg.gridDim = dim3((unsigned)(tiles * p.split), (unsigned)a->batch, 1);
    cfg.blockDim = dim3(THREADS, 1, 1);
    cfg.stream = stream;
    cfg.attrs = attrs;
    if (p.split > 1) {
        cudaLaunchAttribute &cluster = attrs[cfg.numAttrs++];
        cluster.id = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = p.split;
        cluster.val.clusterDim.y = 1;
        cluster.val.clusterDim.z = 1;
    }
    if (dependent_launch(&attrs[cfg.numAttrs]))
        cfg.numAttrs++;
    auto kernel = a->m <= 8    ? skinny_kernel<X, W, O, 1>
                  : a->m <= 16 ? skinny_kernel<X, W, O, 2>
                               : skinny_kernel<X, W, O, 4>;
    return launch_status("weft_matmul", cudaLaunchKernelEx(&cfg, kernel, p));
}

/* 16-bit operands: D of their type or fp32. */
template <typename T> int launch_16(cudaStream_t stream, const weft__matmul_args *a)
{
    return a->type == WEFT_DTYPE_F32 ? launch<T, T, float>(stream, a) : launch<T, T, T>(stream, a);
}

/* FP8 operands: D bf16, fp16 or fp32. */
template <typename X, typename W> int launch_8(cudaStream_t stream, const weft__matmul_args *a)
{
    return a->type == WEFT_DTYPE_BF16  ? launch<X, W, __nv_bfloat16>(stream, a)
           : a->type == WEFT_DTYPE_F16 ? launch<X, W, __half>(stream, a)
                                       : launch<X, W, float>(stream, a);
}

} // namespace
} // namespace weft_ops

extern "C" int weft__matmul_skinny_cuda(void *stream, const weft__matmul_args *a)
{
    using namespace weft_ops;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const bool b_e5m2 = a->in_type_b == WEFT_DTYPE_F8_E5M2;
    switch (a->in_type) {
    case WEFT_DTYPE_BF16:
        return launch_16<__nv_bfloat16>(s, a);
    case WEFT_DTYPE_F16:
        return launch_16<__half>(s, a);
    case WEFT_DTYPE_F8_E4M3:
        return b_e5m2 ? launch_8<__nv_fp8_e4m3, __nv_fp8_e5m2>(s, a)
                      : launch_8<__nv_fp8_e4m3, __nv_fp8_e4m3>(s, a);
    default: /* E5M2 A: B is E4M3 (two E5M2 operands are refused) */
        return launch_8<__nv_fp8_e5m2, __nv_fp8_e4m3>(s, a);
    }
}
