/*
 * rows.cuh - the row machinery of the reducing kernels (norm.cu,
 * softmax.cu): how a row is spread over threads, held in registers, and
 * launched.
 *
 * Why this design: LayerNorm, RMSNorm and softmax need statistics of the
 * whole row before they can write any of it. Reading the row once means
 * holding it on chip between the statistics and the writes, so a row is
 * staged in registers - each thread holds VPT vectors of V elements, as
 * fp32 (at most 16 values a thread, so that 64 registers hold them with
 * no spills and two 512-thread blocks stay resident per SM: while one
 * block reduces, the other's loads keep memory busy). The row size picks
 * the layout:
 *
 *   short rows (<= 32 * VPT * V elements)   a warp per row, 8 rows a block,
 *                                           shuffles only, no barriers
 *   rows up to 512 * VPT * V                a block per row (64..512
 *                                           threads), warps combined in
 *                                           shared memory
 *   longer rows (65536 and up)              a cluster of C <= 8 blocks per
 *                                           row (Hopper), each block holding
 *                                           its segment; block results are
 *                                           combined through distributed
 *                                           shared memory, still reading the
 *                                           row from memory once
 *   rows beyond 8 * 512 * VPT * V           the cluster's blocks loop over
 *                                           tiles of their segment and read
 *                                           them again for each pass (from
 *                                           L2 mostly: a cluster's segment
 *                                           is small next to the 50 MB L2)
 *
 * A tile is what the threads of one block hold at once: TPR threads x VPT
 * vectors x V elements; vector k of thread t sits at (k * TPR + t) * V in
 * the tile, so each of the VPT loads of a warp is one contiguous 512-byte
 * run. Elements past the row's end are not read and count as nothing.
 */
#ifndef WEFT_OPS_ROWS_CUH
#define WEFT_OPS_ROWS_CUH

#include "ops/ops_cuda.cuh"

namespace weft_ops
{

/* How a launch spreads rows over threads. */
struct row_plan {
    unsigned tpr;     /* threads per row: 32 (a warp) to 512 */
    unsigned rpb;     /* rows per block: 8 with a warp per row, else 1 */
    unsigned cluster; /* blocks per row (a thread block cluster when > 1) */
    unsigned vpt;     /* vectors each thread holds: 1, 2, 4 or 8 */
    size_t tiles;     /* tiles each block goes through; 1 = staged, read once */
};

/* Where a block's part of the row lies; filled by the kernel. */
struct row_place {
    size_t row;    /* the row, or >= rows for an idle warp */
    size_t first;  /* the block's first tile */
    size_t tile;   /* elements per tile */
    unsigned tid;  /* thread within the row's threads */
    unsigned rank; /* block within the cluster */
};

template <int V>
__device__ __forceinline__ row_place place_row(size_t row0, unsigned cluster, size_t tiles,
                                               unsigned vpt)
{
    row_place p;
    p.tid = threadIdx.x;
    p.rank = blockIdx.x % cluster;
    p.row = row0 + (size_t)(blockIdx.x / cluster) * blockDim.y + threadIdx.y;
    p.tile = (size_t)blockDim.x * vpt * V;
    p.first = (size_t)p.rank * tiles;
    return p;
}

/* Element index (in the row) of vector k of this thread in tile t. */
template <int V> __device__ __forceinline__ size_t elem_at(const row_place &p, size_t t, int k)
{
    return t * p.tile + ((size_t)k * blockDim.x + p.tid) * V;
}

/* Largest vectors per thread for V-element vectors: 16 values a thread
 * (8 with V = 1). More spills at the 64 registers that two resident
 * 512-thread blocks leave a thread. */
static inline unsigned vpt_max(int V)
{
    return V >= 16 ? 1u : V >= 2 ? 16u / (unsigned)V : 8u;
}

static inline size_t pow2_at_least(size_t n)
{
    size_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

static inline row_plan plan_rows(size_t cols, int V)
{
    const size_t vmax = vpt_max(V), nvec = (cols + V - 1) / V;
    row_plan p = {32, 8, 1, 1, 1};

    if (nvec <= 32 * vmax) {
        p.vpt = (unsigned)pow2_at_least((nvec + 31) / 32);
        return p;
    }
    p.rpb = 1;
    size_t tpr = pow2_at_least((nvec + vmax - 1) / vmax);
    if (tpr <= 512) {
        p.tpr = (unsigned)tpr;
        p.vpt = (unsigned)pow2_at_least((nvec + tpr - 1) / tpr);
        return p;
    }
    p.tpr = 512;
    p.vpt = (unsigned)vmax;
    size_t tile = 512 * vmax * (size_t)V, tiles = (cols + tile - 1) / tile;
    if (tiles <= 8) {
        p.cluster = (unsigned)pow2_at_least(tiles);
    } else {
        p.cluster = 8;
        p.tiles = (tiles + 7) / 8;
    }
    return p;
}

/*
 * Launches kernel(params, row0, cluster, tiles) over all rows with plan p,
 * in pieces when the rows would need more blocks than a grid may have.
 * A plan with cluster > 1 is launched as clusters of that many blocks.
 */
template <typename Params>
static int launch_rows(const char *op, cudaStream_t stream, const row_plan &p, size_t rows,
                       void (*kernel)(Params, size_t, unsigned, size_t), const Params &params)
{
    const size_t max_blocks = (size_t)1 << 30;
    size_t rows_per_launch = max_blocks / p.cluster * p.rpb;

    for (size_t row0 = 0; row0 < rows; row0 += rows_per_launch) {
        size_t n = rows - row0 < rows_per_launch ? rows - row0 : rows_per_launch;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        cfg.gridDim = dim3((unsigned)((n + p.rpb - 1) / p.rpb * p.cluster), 1, 1);
        cfg.blockDim = dim3(p.tpr, p.rpb, 1);
        cfg.stream = stream;
        if (p.cluster > 1) {
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim.x = p.cluster;
            attr[0].val.clusterDim.y = 1;
            attr[0].val.clusterDim.z = 1;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
        }
        int rc =
            launch_status(op, cudaLaunchKernelEx(&cfg, kernel, params, row0, p.cluster, p.tiles));
        if (rc != WEFT_OK)
            return rc;
    }
    return WEFT_OK;
}

} // namespace weft_ops

#endif
