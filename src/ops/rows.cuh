/*
 * rows.cuh - the row machinery of the reducing kernels (norm.cu,
 * softmax.cu): how a row is spread over threads, kept on chip, and
 * launched.
 *
 * Why this design: LayerNorm, RMSNorm and softmax need statistics of the
 * whole row before they can write any of it. Reading the row once means
 * keeping it on chip between the statistics and the writes; reaching the
 * copy rate then depends mostly on what each element costs in
 * instructions (the H200 issues ~36 per element of a bf16 op at the copy
 * rate, reductions and bookkeeping included). Three ways of keeping the
 * row, all with the same layout (vector k of thread t of a row's TPR
 * threads at (k * TPR + t) * V, so each load of a warp is one contiguous
 * 512-byte run):
 *
 *  - held (below): each thread loads all of its VPT vectors at once, VPT a
 *    template parameter, and keeps them as fp32 (up to 32 values) or, in
 *    half types, packed as T (up to 64 values, blocks of up to 1024
 *    threads; unpacked again for each pass). The main path, for 16-byte
 *    aligned tensors and rows up to 131072 elements.
 *  - staged: the row goes to shared memory with cp.async. Loads in flight
 *    cost no registers, but every pass re-reads and converts shared memory
 *    in run-time loops, and it is slower than held; it takes the aligned
 *    rows too long to hold that still fit 8 blocks of STAGED_BLOCK_BYTES
 *    (half types to 262144 elements).
 *  - register tiles: each thread holds VPT vectors as fp32 (at most 16
 *    values). For unaligned tensors (one element a vector) and rows too
 *    long to hold; there a row's blocks loop over tiles of their segment
 *    and read them again for each pass (from L2 mostly: a cluster's
 *    segment is small next to the 50 MB L2).
 *
 * The row size picks the layout, for all three:
 *
 *   short rows                 a warp per row, 8 rows a block, shuffles
 *                              only, no barriers
 *   medium rows (to ~16K)      a block per row (64..512 threads), warps
 *                              combined in shared memory
 *   long rows                  a cluster of C <= 8 blocks per row
 *                              (Hopper), each block keeping its segment;
 *                              block results meet through distributed
 *                              shared memory, the row still read once
 *
 * Elements past the row's end are not read and count as nothing.
 */
#ifndef WEFT_OPS_ROWS_CUH
#define WEFT_OPS_ROWS_CUH

#include "ops/reduce.cuh"

namespace weft_ops
{

/* How a launch spreads rows over threads. */
struct row_plan {
    unsigned tpr;     /* threads per row: 32 (a warp) to 512 */
    unsigned rpb;     /* rows per block: 8 with a warp per row, else 1 */
    unsigned cluster; /* blocks per row (a thread block cluster when > 1) */
    unsigned vpt;     /* vectors each thread holds: 1, 2, 4 or 8 (any, staged) */
    size_t tiles;     /* tiles each block goes through; 1 = held, read once */
    size_t smem;      /* dynamic shared memory a block (staged kernels) */
};

/* Where a block's part of the row lies; filled by the kernel. */
struct row_place {
    size_t row;    /* the row, or >= rows for an idle warp */
    size_t first;  /* the block's first tile */
    size_t tile;   /* elements per tile */
    unsigned tid;  /* thread within the row's threads */
    unsigned rank; /* block within the cluster */
};

/* Where this thread's block and row lie: a row a block, a cluster of
 * blocks (along x), or a warp (blockDim.y rows a block). */
template <int V>
__device__ __forceinline__ row_place place_row(size_t row0, unsigned cluster, size_t tiles,
                                               unsigned vpt)
{
    row_place p;
    /* no division (tens of instructions a thread): a row over a cluster
     * (launch_rows launches `cluster` blocks a cluster along x) reads its
     * place from the cluster's registers */
    const unsigned group = cluster == 1 ? blockIdx.x : __clusterIdx().x;
    p.tid = threadIdx.x;
    p.rank = cluster == 1 ? 0 : __clusterRelativeBlockRank();
    p.row = row0 + (size_t)group * blockDim.y + threadIdx.y;
    p.tile = (size_t)blockDim.x * vpt * V;
    p.first = (size_t)p.rank * tiles;
    return p;
}

/* Element index (in the row) of vector k of this thread in tile t. */
template <int V> __device__ __forceinline__ size_t elem_at(const row_place &p, size_t t, int k)
{
    return t * p.tile + ((size_t)k * blockDim.x + p.tid) * V;
}

/* Elements of the V at j before end: V, 0, or the row's one partial
 * vector. Index is the row offsets' type: unsigned in the held kernels
 * (32-bit offsets, fewer instructions an element), size_t elsewhere. */
template <int V, typename Index> __device__ __forceinline__ int part_of(Index j, Index end)
{
    return j + V <= end ? V : j >= end ? 0 : (int)(end - j);
}

/* Largest vectors per thread for V-element vectors: 16 values a thread
 * (8 with V = 1). More spills at the 64 registers that two resident
 * 512-thread blocks leave a thread. */
static constexpr unsigned vpt_max(int V)
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
    row_plan p = {32, 8, 1, 1, 1, 0};

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
 * From a plan's vectors a thread to a kernel's: pick(std::integral_constant<
 * int, VPT>()) for VPT = vpt (1, 2, 4 or 8) up to MAX_VPT, else none().
 * Only the VPT up to MAX_VPT are instantiated, so that each launcher builds
 * the kernels its plans can ask for and no more.
 */
template <unsigned MAX_VPT, typename Pick, typename None>
static auto by_vpt(unsigned vpt, Pick pick, None none)
    -> decltype(pick(std::integral_constant<int, 1>()))
{
    switch (vpt) {
    case 1:
        return pick(std::integral_constant<int, 1>());
    case 2:
        if constexpr (2 <= MAX_VPT)
            return pick(std::integral_constant<int, 2>());
        break;
    case 4:
        if constexpr (4 <= MAX_VPT)
            return pick(std::integral_constant<int, 4>());
        break;
    case 8:
        if constexpr (8 <= MAX_VPT)
            return pick(std::integral_constant<int, 8>());
        break;
    }
    return none();
}

/* Makes cfg launch (or ask about) clusters of `cluster` blocks, a thread
 * block cluster each, through attr, which must last as long as cfg; a
 * cluster of 1 needs no attribute. */
static inline void set_cluster(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr, unsigned cluster)
{
    if (cluster <= 1)
        return;
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = cluster;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg->attrs = attr;
    cfg->numAttrs = 1;
}

/* ---- holding the row in registers ------------------------------------- */

/*
 * The held kernels (norm_held_kernel, softmax_held_kernel) are the main
 * path for 16-byte aligned tensors: each thread loads all of its vectors of
 * the row at once (VPT, a template parameter, so every loop over them is
 * unrolled and the loads are issued back to back), keeps them in registers
 * as fp32, and every later pass is arithmetic on registers. The ops are
 * bound by the instructions they issue per element long before the bytes
 * in flight run out, so what matters is what each element costs: no
 * per-element bounds checks (vectors are whole, or beyond the end and
 * zero, or the row's one partial vector), 32-bit offsets within the row,
 * half types converted in pairs. Row data is streamed (evict-first loads
 * and stores); per-column parameters (weights, biases) go through the
 * read-only path, so that the SM's next rows find them in L1.
 *
 * The launcher asks for 16 values a thread (the norms) or 32 (softmax,
 * the plain norms of half types), whichever measured faster; rows in one
 * warp, and rows too long for 512 threads, take up to 32; more would
 * spill. Longer rows (beyond 131072 elements, 8 blocks of 512 threads) go
 * to the register kernels' tile loop.
 */
enum : unsigned { HELD_MAX_VALUES = 32, PACKED_MAX_VALUES = 64 };

/* The held plan for `values` a thread (16 or 32); false when the row is too
 * long to hold. Rows that a warp holds take a warp each. `most` values a
 * thread and `max_tpr` threads a block bound it: HELD_MAX_VALUES and 512
 * for rows held as fp32, PACKED_MAX_VALUES and 1024 packed. */
static inline bool plan_held(size_t cols, int V, unsigned values, row_plan *p,
                             unsigned most_values = HELD_MAX_VALUES, unsigned max_tpr = 512)
{
    const size_t nvec = (cols + V - 1) / V;
    const size_t want = values / V; /* vectors a thread, as asked */
    const size_t most = most_values / V;

    *p = {32, 8, 1, 1, 1, 0};
    if (nvec <= 32 * most) { /* a warp per row */
        p->rpb = 8;
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

/* The held plan of a packed row (norm_held_row's PACKED, half types):
 * up to 64 values a thread, blocks of up to 1024 threads. */
static inline bool plan_packed(size_t cols, int V, unsigned values, row_plan *p)
{
    return plan_held(cols, V, values, p, PACKED_MAX_VALUES, 1024);
}

/* A plan of a warp a row holding more than `values` a thread, made to hold
 * `values` with a block of as many warps a row: for kernels whose
 * registers at the larger count would cost occupancy (the fused
 * GELU+LayerNorm). */
static inline void plan_held_split_warp_rows(row_plan *p, int V, unsigned values)
{
    if (p->tpr != 32)
        return; /* not a warp a row */
    while (p->vpt > 1 && p->vpt * (unsigned)V > values) {
        p->tpr *= 2;
        p->vpt /= 2;
    }
    if (p->tpr > 32)
        p->rpb = 1;
}

/* How many bytes of its inputs a call of the held kernels asks L2 for
 * ahead of the rows it holds: a few MiB; asking for more (a wave of
 * resident rows) evicts the rows being held and is slower than asking for
 * none. */
static constexpr size_t AHEAD_WINDOW = (size_t)4 << 20;

/* Rows shorter than AHEAD_SHORTEST elements ask L2 for nothing ahead but
 * where that measured faster, and then from AHEAD_SHORT_BYTES of their
 * inputs a row (norm_held.cuh's short_rows_ahead, softmax.cu). */
static constexpr size_t AHEAD_SHORTEST = 4096;
static constexpr size_t AHEAD_SHORT_BYTES = 1024;

/* The lead of a held kernel that asks L2 for rows ahead (how many rows
 * on: prefetch_held_share): as many rows as fill `window` bytes of the
 * inputs, row_bytes a row; none on calls with no rows beyond what the GPU
 * holds at once (2048 threads an SM), nor on rows under `shortest`. */
static inline size_t held_lead(const row_plan &plan, size_t rows, size_t cols, size_t row_bytes,
                               size_t window, size_t shortest = AHEAD_SHORTEST)
{
    const size_t resident = (size_t)sm_count() * 2048 / ((size_t)plan.tpr * plan.cluster);
    if (cols < shortest || rows <= resident)
        return 0;
    return window / row_bytes < resident ? window / row_bytes : resident;
}

/* pick(std::integral_constant<int, VPT>()) - a held (or ring) kernel of VPT
 * vectors a thread - for vpt, or NULL where VPT * V would exceed
 * HELD_MAX_VALUES. */
template <int V, typename Pick>
static auto held_vpt(unsigned vpt, Pick pick) -> decltype(pick(std::integral_constant<int, 1>()))
{
    return by_vpt<HELD_MAX_VALUES / V>(vpt, pick, [] { return nullptr; });
}

/* The 16 bytes at p: streamed row data (evict first) or per-column
 * parameters (read-only path, kept in L1). */
__device__ __forceinline__ uint4 load_streamed(const void *p)
{
    return __ldcs(reinterpret_cast<const uint4 *>(p));
}
__device__ __forceinline__ uint4 load_param(const void *p)
{
    return __ldg(reinterpret_cast<const uint4 *>(p));
}
__device__ __forceinline__ void store_streamed(void *p, uint4 v)
{
    __stcs(reinterpret_cast<uint4 *>(p), v);
}

/* The first n of the V elements at p as a 16-byte vector, zeros after. */
template <typename T, int V> __device__ __forceinline__ uint4 load_partial(const T *p, int n)
{
    vec<T, V> v;
#pragma unroll
    for (int e = 0; e < V; e++)
        v.e[e] = e < n ? p[e] : from_f32<T>(0.0f);
    return *reinterpret_cast<const uint4 *>(&v);
}

/* The first n of V values to p. */
template <typename T, int V>
__device__ __forceinline__ void store_partial(T *p, const float (&x)[V], int n)
{
#pragma unroll
    for (int e = 0; e < V; e++)
        if (e < n)
            p[e] = from_f32<T>(x[e]);
}

/* raw, as a value the compiler cannot trace: for the packed held rows
 * (PACKED), whose every pass unpacks the row again, so that the compiler
 * cannot keep an earlier pass's fp32 values alive instead, which would
 * undo the saving in registers. */
__device__ __forceinline__ uint4 opaque(uint4 raw)
{
    asm volatile("" : "+r"(raw.x), "+r"(raw.y), "+r"(raw.z), "+r"(raw.w));
    return raw;
}

/* A packed held row's values again from the T they were kept as. */
template <typename T, int V, int VPT>
__device__ __forceinline__ void unpack_kept(float (&x)[VPT][V], const uint4 (&kept)[VPT])
{
#pragma unroll
    for (int k = 0; k < VPT; k++)
        unpack<T, V>(x[k], opaque(kept[k]));
}

/* The first n of V elements at p into x, the rest 0; one 16-byte access
 * when n == V. p is shared or global memory. For the kernels that convert
 * as they load (staged): a partial vector converts element by element,
 * where unpack(load_partial()) would round its zeros through T and convert
 * in pairs, more instructions. */
template <typename T, int V>
__device__ __forceinline__ void load_part(float (&x)[V], const T *p, int n)
{
    if (n == V) {
        load_vec<T, V>(x, p);
        return;
    }
#pragma unroll
    for (int e = 0; e < V; e++)
        x[e] = e < n ? to_f32(p[e]) : 0.0f;
}

/* The first n of V values to p, rounded to T: one 16-byte store when
 * n == V, streamed (evict first) when STREAMED, the held kernels' row
 * data. */
template <typename T, int V, bool STREAMED = false>
__device__ __forceinline__ void store_part(T *p, const float (&x)[V], int n)
{
    if (n == V) {
        if (STREAMED)
            store_streamed(p, pack<T, V>(x));
        else
            store_vec<T, V>(p, x);
        return;
    }
    store_partial<T, V>(p, x, n);
}

/* Where this thread's vector k lies in its row (elements), for the held
 * layout: vector k of thread t of block `rank` at ((rank * VPT + k) * blockDim.x + t) * V. */
template <int V, int VPT> __device__ __forceinline__ auto held_at(const row_place &at, int k)
{
    return ((at.rank * VPT + k) * blockDim.x + at.tid) * V;
}

/* Asks L2 for this warp's share of the elements its block holds of a
 * held row (row: the row's first element), in one bulk prefetch by the
 * warp's first lane: the held kernels issue it for a row some rows on, so
 * that the block which holds that row later finds it in L2. Only whole
 * 16-byte granules inside the row are asked for. */
template <typename T, int V, int VPT>
__device__ __forceinline__ void prefetch_held_share(const T *row, unsigned rank, size_t cols)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x % 32 != 0)
        return;
    const size_t share = (size_t)32 * VPT * V;
    const size_t first = ((size_t)rank * VPT * blockDim.x + (size_t)threadIdx.x * VPT) * V;
    if (first >= cols)
        return;
    const size_t end = first + share < cols ? first + share : cols;
    const size_t from = (__cvta_generic_to_global(row + first) + 15) & ~(size_t)15;
    const size_t to = __cvta_generic_to_global(row + end) & ~(size_t)15;
    if (to > from)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(from),
                     "r"((unsigned)(to - from))
                     : "memory");
#endif
}

/* A held row's vectors in global memory: at(j, part) is the 16 bytes of
 * elements j.., the first `part` of them (0 to V), the rest 0. */
template <typename T, int V> struct global_row {
    const T *row;
    template <typename Index> __device__ __forceinline__ uint4 at(Index j, int part) const
    {
        return part == V  ? load_streamed(row + j)
               : part > 0 ? load_partial<T, V>(row + j, part)
                          : make_uint4(0, 0, 0, 0);
    }
};

/* ---- staging in shared memory ----------------------------------------- */

/*
 * The staged kernels (norm_staged_kernel, softmax_staged_kernel) hold the
 * row in shared memory instead of registers, copied there with cp.async:
 * every copy of a block is in flight at once without holding a register.
 * They lost to the held kernels by 1.5-2x (every pass re-reads and
 * converts shared memory in run-time loops) and now take only the aligned
 * rows too long to hold that 8 blocks still stage. ~8 vectors a thread.
 * Each thread copies and later reads only its own vectors (the same layout
 * as the register kernels, (k * TPR + t) * V), so its own
 * cp.async.wait_all is all the synchronisation the copies need; the
 * reductions' barriers do the rest. A block stages at most
 * STAGED_BLOCK_BYTES (at least three blocks an SM); longer rows spread
 * over a cluster of up to 8 blocks, and rows longer than that go to the
 * register kernels' tile loop.
 */
enum : size_t { STAGED_BLOCK_BYTES = 64 * 1024 };

/* A staged plan for `buffers` row-sized tensors of V-element, 16-byte
 * vectors; false when the row is too long for 8 blocks. */
static inline bool plan_staged(size_t cols, int V, unsigned buffers, row_plan *p)
{
    const size_t nvec = (cols + V - 1) / V, row_bytes = nvec * 16 * buffers;

    *p = {32, 8, 1, 1, 1, 0};
    if (nvec <= 32 * 8) { /* a warp per row, 8 rows a block */
        p->vpt = (unsigned)((nvec + 31) / 32);
        p->smem = (size_t)8 * 32 * p->vpt * 16 * buffers;
        return true;
    }
    size_t tpr = pow2_at_least((nvec + 7) / 8); /* ~8 vectors a thread */
    p->tpr = (unsigned)(tpr < 64 ? 64 : tpr > 512 ? 512 : tpr);
    p->rpb = 1;
    size_t cluster = pow2_at_least((row_bytes + STAGED_BLOCK_BYTES - 1) / STAGED_BLOCK_BYTES);
    if (cluster > 8)
        return false;
    p->cluster = (unsigned)cluster;
    p->vpt = (unsigned)((nvec + cluster * p->tpr - 1) / (cluster * p->tpr));
    p->smem = (size_t)p->tpr * p->vpt * 16 * buffers;
    return p->smem <= STAGED_BLOCK_BYTES;
}

/* 16 bytes from global memory to shared memory, asynchronously. */
__device__ __forceinline__ void copy_async16(void *smem, const void *global)
{
    unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global) : "memory");
}

/* The dynamic shared memory of a staged kernel, 16-byte aligned. */
__device__ __forceinline__ unsigned char *staged_smem()
{
    extern __shared__ uint4 weft_staged[];
    return reinterpret_cast<unsigned char *>(weft_staged);
}

/* Copies the first n of V elements at global g to shared s: one 16-byte
 * cp.async when n == V, else plain loads and stores. */
template <typename T, int V> __device__ __forceinline__ void stage_part(T *s, const T *g, int n)
{
    if (n == V) {
        copy_async16(s, g);
        return;
    }
    for (int e = 0; e < n; e++)
        s[e] = g[e];
}

/* This thread's copies have landed (and are visible to it). */
__device__ __forceinline__ void copies_landed()
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

/* ---- launching ------------------------------------------------------------ */

/*
 * Launches kernel(params, row0, cluster, arg) over all rows with plan p
 * and p.smem bytes of dynamic shared memory, in pieces when the rows would
 * need more blocks than a grid may have. A plan with cluster > 1 is
 * launched as clusters of that many blocks. arg is the plan's tiles for
 * the register kernels, its vectors a thread for the staged ones.
 */
template <typename Params>
static int launch_rows(const char *op, cudaStream_t stream, const row_plan &p, size_t rows,
                       void (*kernel)(Params, size_t, unsigned, size_t), const Params &params,
                       size_t arg)
{
    const size_t max_blocks = (size_t)1 << 30;
    size_t rows_per_launch = max_blocks / p.cluster * p.rpb;

    /* CUDA gives a kernel 48 KB of dynamic shared memory unless told */
    if (p.smem > 48 * 1024) {
        cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p.smem);
        if (e != cudaSuccess)
            return launch_status(op, e);
    }
    for (size_t row0 = 0; row0 < rows; row0 += rows_per_launch) {
        size_t n = rows - row0 < rows_per_launch ? rows - row0 : rows_per_launch;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attrs[2];
        cfg.gridDim = dim3((unsigned)((n + p.rpb - 1) / p.rpb * p.cluster), 1, 1);
        cfg.blockDim = dim3(p.tpr, p.rpb, 1);
        cfg.dynamicSmemBytes = p.smem;
        cfg.stream = stream;
        set_cluster(&cfg, &attrs[0], p.cluster);
        if (dependent_launch(&attrs[cfg.numAttrs])) { /* the kernels start_as_dependent */
            cfg.attrs = attrs;
            cfg.numAttrs++;
        }
        int rc = launch_status(op, cudaLaunchKernelEx(&cfg, kernel, params, row0, p.cluster, arg));
        if (rc != WEFT_OK)
            return rc;
    }
    return WEFT_OK;
}

} // namespace weft_ops

#endif
