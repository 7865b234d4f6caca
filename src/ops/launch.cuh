/*
 * launch.cuh - what the operators' launchers share: the device's SMs, what
 * counts as a call of few rows, launch errors as weft statuses, the
 * answers CUDA gives the same every time kept per kernel (kept_answers,
 * wave_blocks), a grid-stride kernel's grid, programmatic dependent
 * launch, and the dispatch on dtype.
 */
#ifndef WEFT_OPS_LAUNCH_CUH
#define WEFT_OPS_LAUNCH_CUH

#include <string.h>

#include <atomic>
#include <mutex>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/status.h"
#include "ops/ops_internal.h"

extern "C" {
#include "core/error.h"
}

namespace weft_ops
{

/* An attribute of the calling thread's current device (zero or more: a
 * count, a version, a flag), asked of CUDA once per device and attribute
 * (launches inside graph capture ask nothing); fallback where CUDA cannot
 * say. */
template <cudaDeviceAttr ATTR> static inline int device_attribute(int fallback)
{
    static std::atomic<int> known[64]; /* the value plus one; 0: not asked yet */
    int dev = 0, n = 0;

    if (cudaGetDevice(&dev) != cudaSuccess)
        return fallback;
    if (dev >= 0 && dev < 64 && (n = known[dev].load(std::memory_order_relaxed)) > 0)
        return n - 1;
    if (cudaDeviceGetAttribute(&n, ATTR, dev) != cudaSuccess || n < 0)
        return fallback;
    if (dev >= 0 && dev < 64)
        known[dev].store(n + 1, std::memory_order_relaxed);
    return n;
}

/* The multiprocessors of the calling thread's current device. */
static inline int sm_count()
{
    return device_attribute<cudaDevAttrMultiProcessorCount>(1);
}

/* Whether a call's rows are few enough that a row's latency is the whole
 * call: no more than twice the SMs, which the row kernels then hold in one
 * wave while spreading each row over more threads than they would for
 * throughput (two blocks of 512 an SM). Up to twice the SMs that is
 * faster than the throughput plans; beyond, slower. */
static inline bool few_rows(size_t rows)
{
    return rows <= (size_t)2 * sm_count();
}

/*
 * Programmatic dependent launch (compute capability 9.0 on): a kernel
 * launched with the attribute dependent_launch() fills may start while the
 * kernel before it on the stream still runs - once every block of that one
 * has called let_dependents_start() or ended - and does what needs none of
 * that kernel's results (loading constant data) until it calls
 * wait_for_prerequisites(), which returns when the kernel before has ended
 * and its writes are visible. Before that call it must neither read what
 * earlier work writes nor write what earlier work reads. A kernel launched
 * so calls let_dependents_start() only after its wait, or a third kernel
 * could run beside the first. Both calls are no-ops in a kernel launched
 * plainly, and compile to nothing before sm_90.
 */
__device__ __forceinline__ void let_dependents_start()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisites()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* The start of a kernel launched as a dependent that has nothing to do
 * before the kernel ahead of it ends: wait for that one, then let the next
 * one start (its blocks then wait on this one beside it). */
__device__ __forceinline__ void start_as_dependent()
{
    wait_for_prerequisites();
    let_dependents_start();
}

/* Fills attr with the programmatic dependent launch attribute and says
 * true when the current device takes it (compute capability 9.0 on);
 * false leaves the launch plain. */
static inline bool dependent_launch(cudaLaunchAttribute *attr)
{
    if (device_attribute<cudaDevAttrComputeCapabilityMajor>(0) < 9)
        return false;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    return true;
}

/* WEFT_OK, or the launch's error as a weft status with CUDA's name for it. */
static inline int launch_status(const char *op, cudaError_t e)
{
    if (e == cudaSuccess)
        return WEFT_OK;
    cudaGetLastError(); /* a refused launch is not sticky: clear it */
    return weft__fail(weft__cuda_status(e), "%s: kernel launch failed: %s (%s)", op,
                      cudaGetErrorName(e), cudaGetErrorString(e));
}

/* After a <<<>>> launch. */
static inline int launched(const char *op)
{
    return launch_status(op, cudaGetLastError());
}

/* kernel<<<grid, block, smem, stream>>>(args...) launched as a dependent of
 * the kernel before it on the stream (see dependent_launch): the kernel
 * calls wait_for_prerequisites() before it touches memory. */
template <typename... Params, typename... Args>
static int launch_dependent(const char *op, cudaStream_t stream, dim3 grid, dim3 block, size_t smem,
                            void (*kernel)(Params...), Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    if (dependent_launch(&attr)) {
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
    }
    return launch_status(op, cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

/*
 * Answers CUDA gives the same every time - occupancy, what a kernel was
 * given - kept per key (a struct of plain fields, compared bytewise: zero
 * it before filling), so that a launch asks once per kernel and device.
 * Published entries never change, so finding one takes no lock; a full
 * table just stops keeping.
 */
template <typename Key, typename Value, unsigned N> struct kept_answers {
    struct entry {
        Key key;
        Value value;
    };
    entry entries[N];
    std::atomic<unsigned> published{0};
    std::mutex writer;

    bool find(const Key &key, Value *value)
    {
        const unsigned n = published.load(std::memory_order_acquire);
        for (unsigned i = 0; i < n; i++)
            if (memcmp(&entries[i].key, &key, sizeof key) == 0) {
                *value = entries[i].value;
                return true;
            }
        return false;
    }

    void keep(const Key &key, const Value &value)
    {
        std::lock_guard<std::mutex> hold(writer);
        const unsigned n = published.load(std::memory_order_relaxed);
        if (n < N) {
            entries[n] = {key, value};
            published.store(n + 1, std::memory_order_release);
        }
    }
};

/* Blocks of `threads` threads (no dynamic shared memory) that the current
 * device keeps resident for kernel at once, one wave: its SMs times what
 * an SM holds (1 an SM if CUDA cannot say). Kept per kernel, device and
 * block size: one lookup a launch. */
static inline unsigned wave_blocks(const void *kernel, unsigned threads)
{
    struct key {
        const void *kernel;
        int dev;
        unsigned threads;
    };
    static kept_answers<key, unsigned, 64> kept;
    key k;
    memset(&k, 0, sizeof k);
    k.kernel = kernel;
    k.threads = threads;
    unsigned blocks = 0;
    int n = 0;

    if (cudaGetDevice(&k.dev) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    if (kept.find(k, &blocks))
        return blocks;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, (int)threads, 0) != cudaSuccess ||
        n < 1) {
        cudaGetLastError();
        return (unsigned)sm_count();
    }
    blocks = (unsigned)n * (unsigned)sm_count();
    kept.keep(k, blocks);
    return blocks;
}

/* Blocks for `work` items of `threads` threads each of a grid-stride
 * kernel: at most the blocks the GPU keeps resident, one wave (the
 * kernels walk the rest). A fixed number of blocks an SM left kernels of
 * many registers a second, partial wave, whose SMs end the op with a
 * fraction of the loads in flight. */
template <typename K> static unsigned grid_for(K kernel, size_t work, unsigned threads)
{
    size_t want = (work + threads - 1) / threads;
    size_t cap = wave_blocks((const void *)kernel, threads);
    if (want > cap)
        want = cap;
    return want ? (unsigned)want : 1u;
}

/* launch_as(T{}) with T the element type of dtype: each operator's entry
 * point picks its kernels' instantiation this way. */
template <typename F> static inline int by_dtype(weft_dtype dtype, F launch_as)
{
    switch (dtype) {
    case WEFT_DTYPE_BF16:
        return launch_as(__nv_bfloat16{});
    case WEFT_DTYPE_F16:
        return launch_as(__half{});
    default:
        return launch_as(float{});
    }
}

} // namespace weft_ops

#endif
