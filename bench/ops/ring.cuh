/*
 * ring.cuh - rows streamed through a ring in shared memory, the former
 * path of the library's long rows, kept for the variants that time it
 * (variants_rows.cuh).
 */
#ifndef WEFT_BENCH_OPS_RING_CUH
#define WEFT_BENCH_OPS_RING_CUH

#include "ops/rows.cuh"

namespace weft_ops
{

/*
 * The ring kernels (variants_rows.cuh: norm_ring_kernel,
 * softmax_ring_kernel) are the held kernels fed by the copy engine. A held
 * kernel's loads in flight are its registers: at 16 bf16 values a thread
 * an SM keeps ~32 KB of rows in flight, and only while its blocks are in
 * their load phase. A ring kernel's blocks stay resident and loop over
 * rows; each keeps a ring of `slots` rows in shared memory, filled by bulk
 * asynchronous copies (TMA) that one thread issues and an mbarrier per
 * slot counts in, so that while a block works on one row its next
 * slots - 1 rows are on their way. Each thread reads its vectors of the
 * slot into registers, in the held layout, and from there the row is the
 * held kernels' (held_lab.cuh's lab_held_row, softmax_lab.cuh's lab_softmax_row:
 * the library's held rows with a Row parameter); the
 * slot is refilled as soon as the row's first reduction shows that every
 * thread of the row has read it.
 *
 * Measured (bench/RESULTS.md): unmasked softmax in half types gained 7%
 * with 2 slots on rows that held take a cluster (more slots cost resident
 * blocks and lost), and the plain norms of half types +45% at 4096x16384
 * bf16. The library ran both through it until the held kernels - at 32
 * values a thread, packed, and with a cluster's statistics pushed - beat
 * it everywhere: RMSNorm by 7-22%, softmax by 13% at bf16 1024x65536.
 *
 * Bulk copies move whole 16-byte runs between 16-byte aligned addresses,
 * so the ring takes aligned tensors whose rows are whole vectors; a block
 * copies its segment of the row (a cluster's blocks each their own).
 */
struct ring_plan {
    row_plan held;      /* threads per row, cluster, vectors a thread; a block per row */
    unsigned slots;     /* rows in flight a block */
    unsigned seg_bytes; /* a slot: the block's segment of a row */
    unsigned grid;      /* resident blocks, a multiple of the cluster */
};

/* The dynamic shared memory of a ring kernel: the slots' mbarriers, then
 * the slots. */
__device__ __forceinline__ unsigned char *ring_smem()
{
    extern __shared__ __align__(128) unsigned char weft_ring[];
    return weft_ring;
}

/* room for the mbarriers (8 bytes each) ahead of the slots */
enum : unsigned { RING_BARRIER_BYTES = 128, RING_MAX_SLOTS = RING_BARRIER_BYTES / 8 };

static inline size_t ring_bytes(unsigned slots, unsigned seg_bytes)
{
    return RING_BARRIER_BYTES + (size_t)slots * seg_bytes;
}

/* Waits until the barrier's phase of this parity has completed. */
__device__ __forceinline__ void barrier_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* bytes (a multiple of 16) from global src to shared dst, counted in at bar. */
__device__ __forceinline__ void bulk_copy(unsigned dst, const void *src, unsigned bytes,
                                          unsigned bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* 16 bytes of shared memory; volatile, so that it is read where it stands
 * and never again after the slot is refilled. */
__device__ __forceinline__ uint4 load_shared(unsigned addr)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr));
    return v;
}

template <typename T, int V> struct slot_row {
    const T *seg;   /* the segment in the slot */
    unsigned first; /* the segment's first element in the row */
    __device__ __forceinline__ uint4 at(unsigned j, int part) const
    {
        return part == V  ? load_shared(shared_address(seg + (j - first)))
               : part > 0 ? load_partial<T, V>(seg + (j - first), part)
                          : make_uint4(0, 0, 0, 0);
    }
};

/*
 * The ring of a block: slot i % slots holds the block's i-th row. One
 * thread issues the copies; everyone waits on the slot's barrier, whose
 * phase flips once per use.
 */
template <typename T> struct row_ring {
    unsigned char *smem;
    unsigned slots, seg_bytes; /* as the plan says */
    unsigned first;            /* the block's segment's first element */

    __device__ __forceinline__ unsigned bar(unsigned s) const
    {
        return shared_address(smem) + 8 * s;
    }
    __device__ __forceinline__ T *segment(unsigned s) const
    {
        return reinterpret_cast<T *>(smem + RING_BARRIER_BYTES + s * seg_bytes);
    }

    /* The mbarriers, before any copy (all threads of the block call it). */
    __device__ __forceinline__ void init() const
    {
        if (threadIdx.x == 0)
            for (unsigned s = 0; s < slots; s++)
                barrier_init(bar(s));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        __syncthreads();
    }

    /* Copies elements [first, first + n) of the row at `row` into slot s,
     * n a multiple of V, possibly 0; one thread only. */
    __device__ __forceinline__ void fill(unsigned s, const T *row, unsigned n) const
    {
        unsigned bytes = n * (unsigned)sizeof(T);
        barrier_expect(bar(s), bytes);
        if (bytes > 0)
            bulk_copy(shared_address(segment(s)), row + first, bytes, bar(s));
    }

    /* Waits for slot s's fill of this parity (it flips on every turn
     * round the ring). */
    __device__ __forceinline__ void wait(unsigned s, unsigned parity) const
    {
        barrier_wait(bar(s), parity);
    }
};

/*
 * A ring kernel's loop over its block's rows (its cluster's: row group
 * blockIdx.x / cluster of gridDim.x / cluster): fill(s, row) issues slot
 * s's copies of a row (thread 0 only); row(r, s, read) works on row r from
 * slot s and calls read() once every thread of the row has read the slot,
 * which refills it with the row `slots` turns on.
 */
template <typename T, typename Fill, typename Row>
__device__ __forceinline__ void ring_rows(const row_ring<T> &ring, size_t rows, unsigned cluster,
                                          Fill fill, Row row)
{
    const size_t group = blockIdx.x / cluster, groups = gridDim.x / cluster;
    ring.init();
    if (threadIdx.x == 0)
        for (unsigned s = 0; s < ring.slots && group + s * groups < rows; s++)
            fill(s, group + s * groups);

    unsigned s = 0, parity = 0; /* counted, not divided out of the turn */
    for (size_t r = group; r < rows; r += groups) {
        ring.wait(s, parity);
        row(r, s, [&] {
            size_t next = r + ring.slots * groups;
            if (threadIdx.x == 0 && next < rows)
                fill(s, next);
        });
        if (++s == ring.slots) {
            s = 0;
            parity ^= 1;
        }
    }
}

/* false, with CUDA's error for a refused query cleared (it is not sticky). */
static inline bool ring_refused()
{
    cudaGetLastError();
    return false;
}

/* What CUDA says of a ring kernel under a held plan: the slots a block
 * gets and the blocks then resident on the GPU (0 slots: no ring fits).
 * Found once per kernel and device (ring_fit_of) and kept. */
struct ring_fit {
    unsigned slots;
    int resident;
};

template <typename K>
static bool ring_fit_of(K kernel, const row_plan &held, unsigned seg_bytes, unsigned max_slots,
                        ring_fit *fit)
{
    int dev = 0, smem_sm = 0, smem_block = 0, blocks = 0;
    cudaFuncAttributes fa;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess ||
        cudaFuncGetAttributes(&fa, kernel) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, (int)held.tpr, 0) !=
            cudaSuccess)
        return ring_refused();

    /* as many resident blocks an SM as the registers allow that still
     * leave each two slots */
    for (fit->slots = 0; blocks >= 1 && fit->slots < 2; blocks--) {
        /* each block also keeps its static shared memory and 1 KB for CUDA */
        long share = smem_sm / blocks - 1024;
        if (share > smem_block)
            share = smem_block;
        long slots = (share - (long)fa.sharedSizeBytes - RING_BARRIER_BYTES) / (long)seg_bytes;
        fit->slots = slots < 0 ? 0 : slots < (long)max_slots ? (unsigned)slots : max_slots;
    }
    fit->resident = 0;
    if (fit->slots < 2)
        return true;

    const size_t smem = ring_bytes(fit->slots, seg_bytes);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess)
        return ring_refused();
    if (held.cluster == 1) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit->resident, kernel, (int)held.tpr,
                                                          smem) != cudaSuccess)
            return ring_refused();
        fit->resident *= sm_count();
    } else {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr;
        cfg.gridDim = dim3(held.cluster * (unsigned)sm_count(), 1, 1);
        cfg.blockDim = dim3(held.tpr, 1, 1);
        cfg.dynamicSmemBytes = smem;
        set_cluster(&cfg, &attr, held.cluster);
        if (cudaOccupancyMaxActiveClusters(&fit->resident, kernel, &cfg) != cudaSuccess)
            return ring_refused();
        fit->resident *= (int)held.cluster;
    }
    return true;
}

/*
 * The ring plan for the held plan `held` (a block or a cluster per row)
 * of one row-sized input: as many resident blocks an SM as the
 * kernel's registers allow that still leave each at least two slots, up
 * to `max_slots` slots each, and as many blocks as CUDA says are then
 * resident (whole clusters, as the GPCs fit them) or as leave each
 * cluster two rows. false when no ring fits, or there are fewer rows than
 * two an SM. What CUDA says is asked once per kernel, device and plan.
 */
template <typename K>
static bool plan_ring(K kernel, const row_plan &held, size_t cols, size_t rows, int V,
                      size_t elem_size, unsigned max_slots, ring_plan *r)
{
    struct key {
        const void *kernel;
        int dev;
        unsigned tpr, cluster, vpt, seg_bytes, max_slots;
    };
    static kept_answers<key, ring_fit, 64> kept;

    /* few rows (small inputs) are the held kernels', which start with no
     * setup: refused before any question to CUDA */
    if (held.rpb != 1 || cols % V != 0 || cols / V < 32 || rows < 2 * (size_t)sm_count())
        return false;
    if (max_slots > RING_MAX_SLOTS)
        max_slots = RING_MAX_SLOTS;
    r->held = held;
    r->seg_bytes = (unsigned)((size_t)held.tpr * held.vpt * V * elem_size);

    key k;
    memset(&k, 0, sizeof k);
    k.kernel = (const void *)kernel;
    k.tpr = held.tpr;
    k.cluster = held.cluster;
    k.vpt = held.vpt;
    k.seg_bytes = r->seg_bytes;
    k.max_slots = max_slots;
    ring_fit fit;
    if (cudaGetDevice(&k.dev) != cudaSuccess)
        return ring_refused();
    if (!kept.find(k, &fit)) {
        if (!ring_fit_of(kernel, held, r->seg_bytes, max_slots, &fit))
            return false;
        kept.keep(k, fit);
    }
    if (fit.slots < 2)
        return false;
    r->slots = fit.slots;

    /* every cluster loops over two rows or more */
    size_t clusters = (size_t)fit.resident / held.cluster;
    if (clusters > rows / 2)
        clusters = rows / 2;
    if (clusters == 0)
        return false;
    r->grid = (unsigned)(clusters * held.cluster);
    return true;
}

/* Launches a ring kernel(params, plan) with plan r (plan_ring has set the
 * kernel's shared memory). */
template <typename Params>
static int launch_ring(const char *op, cudaStream_t stream, const ring_plan &r,
                       void (*kernel)(Params, ring_plan), const Params &params)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    cfg.gridDim = dim3(r.grid, 1, 1);
    cfg.blockDim = dim3(r.held.tpr, 1, 1);
    cfg.dynamicSmemBytes = ring_bytes(r.slots, r.seg_bytes);
    cfg.stream = stream;
    set_cluster(&cfg, &attr, r.held.cluster);
    return launch_status(op, cudaLaunchKernelEx(&cfg, kernel, params, r));
}

} // namespace weft_ops

#endif
