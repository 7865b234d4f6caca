/*
 * grouped_matmul.cu - weft_grouped_matmul on the GPU: each group's rows of
 * X times its own W_g^T on the tensor cores (WMMA, bf16/fp16 in, fp32
 * accumulate), with the group sizes read from the device's offsets table
 * by the kernel itself (grouped_matmul.c holds the checks and the host
 * reference).
 *
 * Design. The output is cut into tiles of BM x BN; a group of m_g rows
 * has ceil(m_g / BM) row tiles, and the groups' row tiles are numbered one
 * after the other. The host knows only rows and G, so the grid is sized
 * for the most there can be, ceil(rows / BM) + G row tiles; a block finds
 * its group with one warp-wide prefix sum over the table (32 groups a
 * step) and a block past the last tile returns at once. Blocks go through
 * the tiles in columns of SWIZZLE tiles of n: the blocks resident at once
 * share a few X row tiles and a few W tiles, which then come from L2.
 *
 * A block (8 warps, 2 x 4, each 64 x 32 of the tile) steps through k by BK,
 * staging X's and W's slices in shared memory with two buffers: with
 * cp.async (16-byte copies, zero-filled past the group's rows, n and k) the
 * next slice loads while the tensor cores work on this one; without the
 * alignment cp.async needs, plain loads fill the same buffers. Rows are
 * padded by 8 elements so that the fragments' rows fall on different
 * banks. The epilogue goes through a 16 x 16 fp32 scratch a warp (the
 * staging memory, free by then): bias, activation, rounding once, and only
 * the rows and columns inside the group and n are written. The table is
 * clamped into [0, rows], so no table makes the kernel touch memory
 * outside X, W and Y.
 */
#include <mma.h>

#include "ops/moe.h"
#include "ops/ops_cuda.cuh"

namespace weft_ops
{
namespace
{

constexpr int BM = 128, BN = 128, BK = 32, PAD = 8, LDS = BK + PAD, THREADS = 256;
constexpr int WARP_M = 64, WARP_N = 32, FM = WARP_M / 16, FN = WARP_N / 16, SWIZZLE = 8;

template <typename T> struct grouped_params {
    T *y;
    const T *x, *w, *bias;
    const int32_t *offsets;
    int groups, rows, n, k;
    size_t ldx, ldy;
    unsigned row_tiles, n_tiles; /* the grid: row_tiles (the most) x n_tiles */
    weft_matmul_act act;
};

__device__ __forceinline__ int clamp_row(int v, int rows)
{
    return v < 0 ? 0 : v > rows ? rows : v;
}

/* Which group row tile `tile` belongs to: its group, first row and the
 * group's end, or group -1 past the last tile. One warp. */
__device__ void find_tile(const int32_t *offsets, int groups, int rows, unsigned tile, int *group,
                          int *row0, int *row_end)
{
    const int lane = threadIdx.x % 32;
    unsigned before = 0; /* tiles of the groups already passed */
    for (int g0 = 0; g0 < groups; g0 += 32) {
        const int g = g0 + lane;
        int lo = 0, hi = 0;
        if (g < groups) {
            lo = clamp_row(offsets[g], rows);
            hi = clamp_row(offsets[g + 1], rows);
        }
        const unsigned mine = hi > lo ? ((unsigned)(hi - lo) + BM - 1) / BM : 0u;
        unsigned incl = mine;
        for (int o = 1; o < 32; o *= 2) {
            unsigned up = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o)
                incl += up;
        }
        const bool here = tile < before + incl && tile >= before + incl - mine;
        const unsigned hit = __ballot_sync(0xffffffffu, here && mine > 0);
        if (hit) {
            if (lane == __ffs(hit) - 1) {
                *group = g;
                *row0 = lo + (int)(tile - (before + incl - mine)) * BM;
                *row_end = hi;
            }
            return;
        }
        before += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0)
        *group = -1;
}

template <typename T> __device__ __forceinline__ float activate(weft_matmul_act act, float v)
{
    switch (act) {
    case WEFT_MATMUL_ACT_RELU:
        return v > 0.0f || isnan(v) ? v : 0.0f;
    case WEFT_MATMUL_ACT_GELU_TANH:
        return gelu_tanh(v);
    case WEFT_MATMUL_ACT_GELU_ERF:
        return gelu_erf<T>(v);
    default:
        return v;
    }
}

/* One BK slice of X (rows row0.., below row_end) and W_g (rows n0.., below
 * n) into buffers sa, sb; zeros past the ends. */
template <typename T, bool ASYNC>
__device__ __forceinline__ void load_slice(const grouped_params<T> &p, const T *wg, int row0,
                                           int row_end, int n0, int k0, T *sa, T *sb)
{
    constexpr int CHUNK = 8, PER_ROW = BK / CHUNK; /* 16-byte chunks */
    if (ASYNC) {
        for (int c = threadIdx.x; c < BM * PER_ROW; c += THREADS) {
            const int r = c / PER_ROW, kk = (c % PER_ROW) * CHUNK;
            const bool ok = row0 + r < row_end && k0 + kk < p.k;
            const T *src = ok ? p.x + (size_t)(row0 + r) * p.ldx + k0 + kk : p.x;
            cp_async16(sa + r * LDS + kk, src, ok ? 16 : 0);
        }
        for (int c = threadIdx.x; c < BN * PER_ROW; c += THREADS) {
            const int r = c / PER_ROW, kk = (c % PER_ROW) * CHUNK;
            const bool ok = n0 + r < p.n && k0 + kk < p.k;
            const T *src = ok ? wg + (size_t)(n0 + r) * p.k + k0 + kk : p.w;
            cp_async16(sb + r * LDS + kk, src, ok ? 16 : 0);
        }
    } else {
        const T zero = from_f32<T>(0.0f);
        for (int c = threadIdx.x; c < BM * BK; c += THREADS) {
            const int r = c / BK, kk = c % BK;
            const bool ok = row0 + r < row_end && k0 + kk < p.k;
            sa[r * LDS + kk] = ok ? p.x[(size_t)(row0 + r) * p.ldx + k0 + kk] : zero;
        }
        for (int c = threadIdx.x; c < BN * BK; c += THREADS) {
            const int r = c / BK, kk = c % BK;
            const bool ok = n0 + r < p.n && k0 + kk < p.k;
            sb[r * LDS + kk] = ok ? wg[(size_t)(n0 + r) * p.k + k0 + kk] : zero;
        }
    }
}

template <typename T, bool ASYNC>
__global__ void __launch_bounds__(THREADS) grouped_kernel(grouped_params<T> p)
{
    using namespace nvcuda;
    constexpr int STAGE = (BM + BN) * LDS; /* elements a buffer */
    __shared__ __align__(128) T smem[2 * STAGE];
    __shared__ int tile_group, tile_row0, tile_end;

    /* Swizzled order: columns of SWIZZLE n tiles, row tiles inside. */
    const unsigned id = blockIdx.x, per_column = p.row_tiles * SWIZZLE;
    const unsigned column = id / per_column, in_column = id % per_column;
    const unsigned first_n = column * SWIZZLE;
    const unsigned width = p.n_tiles - first_n < SWIZZLE ? p.n_tiles - first_n : SWIZZLE;
    const unsigned row_tile = in_column / width, n_tile = first_n + in_column % width;

    if (threadIdx.x < 32)
        find_tile(p.offsets, p.groups, p.rows, row_tile, &tile_group, &tile_row0, &tile_end);
    __syncthreads();
    const int group = tile_group, row0 = tile_row0, row_end = tile_end;
    if (group < 0)
        return;
    const int n0 = (int)n_tile * BN;
    const T *wg = p.w + (size_t)group * p.n * p.k;

    const int warp = threadIdx.x / 32, wm = warp / (BN / WARP_N), wn = warp % (BN / WARP_N);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);

    const int slices = (p.k + BK - 1) / BK;
    load_slice<T, ASYNC>(p, wg, row0, row_end, n0, 0, smem, smem + BM * LDS);
    if (ASYNC)
        cp_async_commit();
    for (int s = 0; s < slices; s++) {
        T *sa = smem + (s % 2) * STAGE, *sb = sa + BM * LDS;
        if (s + 1 < slices) {
            T *na = smem + ((s + 1) % 2) * STAGE;
            load_slice<T, ASYNC>(p, wg, row0, row_end, n0, (s + 1) * BK, na, na + BM * LDS);
            if (ASYNC) {
                cp_async_commit();
                cp_async_wait<1>();
            }
        } else if (ASYNC) {
            cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[FN];
#pragma unroll
            for (int i = 0; i < FM; i++)
                wmma::load_matrix_sync(fa[i], sa + (wm * WARP_M + i * 16) * LDS + kk, LDS);
#pragma unroll
            for (int j = 0; j < FN; j++)
                wmma::load_matrix_sync(fb[j], sb + (wn * WARP_N + j * 16) * LDS + kk, LDS);
#pragma unroll
            for (int i = 0; i < FM; i++)
#pragma unroll
                for (int j = 0; j < FN; j++)
                    wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads(); /* the next load overwrites the buffer just read */
    }

    /* The epilogue, through a 16 x 16 fp32 scratch a warp. */
    float *scratch = reinterpret_cast<float *>(smem) + warp * 256;
    const int lane = threadIdx.x % 32;
    const T *bias = p.bias ? p.bias + (size_t)group * p.n : nullptr;
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) {
            wmma::store_matrix_sync(scratch, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                const int r = row0 + wm * WARP_M + i * 16 + e / 16;
                const int c = n0 + wn * WARP_N + j * 16 + e % 16;
                if (r < row_end && c < p.n) {
                    float v = scratch[e];
                    if (bias)
                        v += to_f32(bias[c]);
                    p.y[(size_t)r * p.ldy + c] = from_f32<T>(activate<T>(p.act, v));
                }
            }
            __syncwarp();
        }
}

template <typename T> int launch(cudaStream_t stream, const weft__grouped_matmul_args *a)
{
    grouped_params<T> p;
    p.y = (T *)a->y;
    p.x = (const T *)a->x, p.w = (const T *)a->w, p.bias = (const T *)a->bias;
    p.offsets = a->offsets;
    p.groups = (int)a->groups, p.rows = (int)a->rows, p.n = (int)a->n, p.k = (int)a->k;
    p.ldx = a->ldx, p.ldy = a->ldy;
    p.act = a->act;
    const size_t row_tiles = (a->rows + BM - 1) / BM + a->groups, n_tiles = (a->n + BN - 1) / BN;
    /* Rows and columns are int in the kernel, a tile past the last one too. */
    if (a->rows > (size_t)INT32_MAX - BM || a->n > (size_t)INT32_MAX - BN ||
        a->k > (size_t)INT32_MAX - BK || row_tiles * n_tiles > (size_t)INT32_MAX)
        return weft__fail(WEFT_EINVAL,
                          "weft_grouped_matmul: %zu x %zu tiles (rows %zu, groups %zu, n %zu) "
                          "are more than the GPU kernel's grid",
                          row_tiles, n_tiles, a->rows, a->groups, a->n);
    p.row_tiles = (unsigned)row_tiles, p.n_tiles = (unsigned)n_tiles;
    const bool async =
        (uintptr_t)a->x % 16 == 0 && (uintptr_t)a->w % 16 == 0 && a->k % 8 == 0 && a->ldx % 8 == 0;
    const unsigned blocks = (unsigned)(row_tiles * n_tiles);
    if (async)
        grouped_kernel<T, true><<<blocks, THREADS, 0, stream>>>(p);
    else
        grouped_kernel<T, false><<<blocks, THREADS, 0, stream>>>(p);
    return launched("weft_grouped_matmul");
}

} // namespace
} // namespace weft_ops

extern "C" int weft__grouped_matmul_cuda(void *stream, const weft__grouped_matmul_args *a)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (a->type == WEFT_DTYPE_BF16)
        return weft_ops::launch<__nv_bfloat16>(s, a);
    return weft_ops::launch<__half>(s, a);
}
