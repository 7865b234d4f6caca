/*
 * backend.c - the CUDA backend: one weft device per GPU.
 *
 * This half opens GPUs, pools streams and enqueues work; engine.c
 * decides when the work is complete. Streams are non-blocking CUDA streams
 * from a pool per priority class (high, and the rest); past
 * WEFT__CUDA_MAX_STREAMS a class's streams are shared in turn. Every
 * operation keeps its place in its stream, including copies from and to
 * pageable memory, which CUDA itself would read at enqueue time.
 *
 * The driver calls (stream memory operations) come through the runtime's
 * cudaGetDriverEntryPointByVersion, so the library links the CUDA runtime
 * only and loads on machines without a GPU driver (and then finds no GPU).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cuda/backend.h"
#include "cuda/status.h"

typedef weft__cuda_device cuda_device;

static cuda_device *cuda_of(weft__device *d)
{
    return (cuda_device *)d;
}

/* ---- errors ------------------------------------------------------------ */

/* Errors after which the context is unusable: the device has failed. */
static bool sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
        return true;
    default:
        return false;
    }
}

int weft__cuda_fail(weft__cuda_device *dev, const char *call, cudaError_t e)
{
    cudaGetLastError(); /* clear the thread's record of a non-sticky error */
    if (sticky(e)) {
        int healthy = 0;
        atomic_compare_exchange_strong(&dev->failed, &healthy, (int)e);
    }
    return weft__fail(weft__cuda_status(e), "%s: %s (%s) on GPU %d", call, cudaGetErrorName(e),
                      cudaGetErrorString(e), dev->ordinal);
}

int weft__cuda_launch_fail(weft__cuda_device *dev, cudaError_t e)
{
    /* A kernel this runtime does not know: most often the program's own,
     * registered with the CUDA runtime nvcc links statically by default
     * while libweft.so launches through the shared one. CUDA 13 calls it an
     * invalid resource handle (the stream is weft's own and valid, so the
     * handle is the function's), earlier runtimes an invalid device
     * function. The message has room for the cause or CUDA's wording, not
     * both (WEFT__ERRMSG_SIZE). */
    if (e != cudaErrorInvalidDeviceFunction && e != cudaErrorInvalidResourceHandle)
        return weft__cuda_fail(dev, "cudaLaunchKernel", e);
    cudaGetLastError(); /* neither is sticky: clear the thread's record */
    return weft__fail(WEFT_EINVAL,
                      "cudaLaunchKernel: %s on GPU %d: kernel unknown to weft's CUDA runtime; "
                      "build with nvcc -cudart shared, or link libweft.a",
                      cudaGetErrorName(e), dev->ordinal);
}

int weft__cuda_check_failed(weft__cuda_device *dev, const char *call)
{
    int e = atomic_load_explicit(&dev->failed, memory_order_relaxed);
    if (e == 0)
        return WEFT_OK;
    return weft__fail(WEFT_EDEVICE, "%s: GPU %d has failed: %s", call, dev->ordinal,
                      cudaGetErrorName((cudaError_t)e));
}

/* The calling thread's current device, set only when it changes. Never
 * inlined: tasks move between threads. */
static _Thread_local int current_ordinal = -1;

__attribute__((noinline)) int weft__cuda_use_device(weft__cuda_device *dev)
{
    if (current_ordinal == dev->ordinal)
        return WEFT_OK;
    cudaError_t e = cudaSetDevice(dev->ordinal);
    if (e != cudaSuccess)
        return weft__cuda_fail(dev, "cudaSetDevice", e);
    current_ordinal = dev->ordinal;
    return WEFT_OK;
}

int weft__cuda_enter(weft__stream *s, const char *call)
{
    s->timing.timing_chain = false; /* the newest timed end is no longer the stream's last */
    int rc = weft__cuda_check_failed(s->dev, call);
    return rc ? rc : weft__cuda_use_device(s->dev);
}

/* ---- operations -------------------------------------------------------- */

/* The memory at p: weft's own blocks without asking CUDA. */
typedef enum mem_kind { MEM_PAGEABLE, MEM_PINNED, MEM_DEVICE } mem_kind;

static mem_kind memory_kind(const void *p)
{
    int known = weft__cuda_known_kind(p);
    if (known)
        return known == WEFT__CUDA_KNOWN_HOST ? MEM_PINNED : MEM_DEVICE;
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();
        return MEM_PAGEABLE;
    }
    switch (attr.type) {
    case cudaMemoryTypeUnregistered:
        return MEM_PAGEABLE;
    case cudaMemoryTypeHost:
        return MEM_PINNED;
    default:
        return MEM_DEVICE;
    }
}

bool weft__cuda_pageable(const void *p)
{
    return memory_kind(p) == MEM_PAGEABLE;
}

/* What a copy between the two kinds counts as (weft_stats.copy_bytes). */
static weft_copy_kind copy_kind(mem_kind from, mem_kind to)
{
    if (from == MEM_PAGEABLE && to == MEM_PAGEABLE)
        return WEFT_COPY_HOST;
    if (from == MEM_PAGEABLE || to == MEM_PAGEABLE)
        return WEFT_COPY_PAGEABLE;
    if (from == MEM_DEVICE && to == MEM_DEVICE)
        return WEFT_COPY_DEVICE;
    return WEFT_COPY_PINNED;
}

/* A host-side copy run in stream order by a host function; when stage is
 * set, it goes back to the pool afterwards. */
typedef struct host_copy {
    void *dst;
    const void *src;
    size_t n;
    void *stage;
    weft__cuda_host_pool *pool;
} host_copy;

static void CUDART_CB run_host_copy(void *arg)
{
    host_copy *c = arg;
    memcpy(c->dst, c->src, c->n);
    if (c->stage)
        weft__cuda_host_pool_put_cached(c->pool, c->stage);
    free(c);
}

static int enqueue_host_copy(weft__stream *s, void *dst, const void *src, size_t n, void *stage)
{
    host_copy *c = malloc(sizeof *c);
    if (!c)
        return weft__fail(WEFT_ENOMEM, "weft_memcpy_async: out of memory");
    *c = (host_copy){dst, src, n, stage, &s->dev->host_pool};
    cudaError_t e = cudaLaunchHostFunc(s->handle, run_host_copy, c);
    if (e != cudaSuccess) {
        free(c);
        return weft__cuda_fail(s->dev, "cudaLaunchHostFunc", e);
    }
    return WEFT_OK;
}

/* Copies touching pageable memory go through a pinned staging buffer, with
 * the host side done by host functions, so that every copy keeps its place
 * in the stream. */
static int cuda_copy(weft__stream *s, void *dst, const void *src, size_t n)
{
    int rc = weft__cuda_enter(s, "weft_memcpy_async");
    if (rc)
        return rc;
    weft__cuda_note_work(s);
    mem_kind from = memory_kind(src), to = memory_kind(dst);
    bool from_pageable = from == MEM_PAGEABLE, to_pageable = to == MEM_PAGEABLE;
    weft__tally(&s->counts.copy_bytes[copy_kind(from, to)], n);
    if (s->graph.recording) { /* graph mode: record what a graph node can copy */
        if (!from_pageable && !to_pageable)
            return weft__cuda_record_copy(s->graph.record, dst, src, n);
        if ((rc = weft__cuda_region_capture(s)))
            return rc;
    }
    if (from_pageable && to_pageable)
        return enqueue_host_copy(s, dst, src, n, NULL);
    void *stage = NULL;
    if ((from_pageable || to_pageable) &&
        (rc = weft__cuda_host_pool_get(&s->dev->host_pool, n, &stage)))
        return rc;
    if (from_pageable && (rc = enqueue_host_copy(s, stage, src, n, NULL))) {
        weft__cuda_host_pool_put_cached(&s->dev->host_pool, stage); /* nothing uses it */
        return rc;
    }
    cudaError_t e = cudaMemcpyAsync(to_pageable ? stage : dst, from_pageable ? stage : src, n,
                                    cudaMemcpyDefault, s->handle);
    if (e != cudaSuccess) /* a host copy may be queued into stage: leave it be */
        return weft__cuda_fail(s->dev, "cudaMemcpyAsync", e);
    if (!stage)
        return WEFT_OK;
    /* the last step gives the staging buffer back */
    if (to_pageable)
        return enqueue_host_copy(s, dst, stage, n, stage);
    return enqueue_host_copy(s, stage, stage, 0, stage);
}

typedef struct host_fill {
    void *dst;
    int value;
    size_t n;
} host_fill;

static void CUDART_CB run_host_fill(void *arg)
{
    host_fill *f = arg;
    memset(f->dst, f->value, f->n);
    free(f);
}

/* cudaMemsetAsync needs memory the device can address; pageable host
 * memory is filled by a host function in stream order instead. */
static int cuda_fill(weft__stream *s, void *dst, int value, size_t n)
{
    int rc = weft__cuda_enter(s, "weft_memset_async");
    if (rc)
        return rc;
    weft__cuda_note_work(s);
    cudaError_t e;
    bool host_side = weft__cuda_pageable(dst);
    if (s->graph.recording) {
        if (!host_side)
            return weft__cuda_record_fill(s->graph.record, dst, value, n);
        if ((rc = weft__cuda_region_capture(s)))
            return rc;
    }
    if (host_side) {
        host_fill *f = malloc(sizeof *f);
        if (!f)
            return weft__fail(WEFT_ENOMEM, "weft_memset_async: out of memory");
        *f = (host_fill){dst, value, n};
        if ((e = cudaLaunchHostFunc(s->handle, run_host_fill, f)) != cudaSuccess) {
            free(f);
            return weft__cuda_fail(s->dev, "cudaLaunchHostFunc", e);
        }
        return WEFT_OK;
    }
    e = cudaMemsetAsync(dst, value, n, s->handle);
    return e == cudaSuccess ? WEFT_OK : weft__cuda_fail(s->dev, "cudaMemsetAsync", e);
}

static int cuda_host_fn(weft__stream *s, void (*fn)(void *arg), void *arg)
{
    int rc = weft__cuda_enter(s, "weft_host_async");
    if (rc || (s->graph.recording && (rc = weft__cuda_region_capture(s))))
        return rc;
    weft__cuda_note_work(s);
    cudaError_t e = cudaLaunchHostFunc(s->handle, fn, arg);
    return e == cudaSuccess ? WEFT_OK : weft__cuda_fail(s->dev, "cudaLaunchHostFunc", e);
}

static int cuda_launch(weft__stream *s, const void *kernel, weft_dim3 grid, weft_dim3 block,
                       size_t shared_bytes, void **args)
{
    int rc = weft__cuda_enter(s, "weft_launch");
    if (rc)
        return rc;
    weft__cuda_note_work(s);
    if (s->graph.recording) {
        rc = weft__cuda_record_launch(s->graph.record, kernel, grid, block, shared_bytes, args);
        if (rc != WEFT__CUDA_NOT_RECORDED || (rc = weft__cuda_region_capture(s)))
            return rc;
    }
    dim3 g = {grid.x, grid.y, grid.z}, b = {block.x, block.y, block.z};
    cudaError_t e = cudaLaunchKernel(kernel, g, b, args, shared_bytes, s->handle);
    if (e != cudaSuccess)
        return weft__cuda_launch_fail(s->dev, e);
    weft__tally(&s->counts.launches, 1); /* a capture stream's counts are never summed */
    return WEFT_OK;
}

/* Whoever asks for the handle enqueues on it behind weft's back: count the
 * stream busy from now on, until its next marker completes. Inside a region
 * that work cannot be recorded: capture it (should the capture fail to
 * start, the region's end reports it). */
static void *cuda_native(weft__stream *s)
{
    s->timing.timing_chain = false; /* its work comes after the newest timed end */
    s->handle_out = true;
    weft__cuda_note_work(s);
    if (s->graph.recording)
        weft__cuda_region_capture(s);
    return s->handle;
}

/* ---- the stream pool ---------------------------------------------------- */

static int stream_create(cuda_device *dev, int class_, weft__stream **out)
{
    weft__stream *s;
    if (posix_memalign((void **)&s, 64, sizeof *s))
        return weft__fail(WEFT_ENOMEM, "weft: out of memory for a stream");
    memset(s, 0, sizeof *s);
    int rc = weft__cuda_use_device(dev);
    cudaError_t e = cudaSuccess;
    if (rc == WEFT_OK && (e = cudaStreamCreateWithPriority(&s->handle, cudaStreamNonBlocking,
                                                           dev->priority[class_])) != cudaSuccess)
        rc = weft__cuda_fail(dev, "cudaStreamCreateWithPriority", e);
    if (rc) {
        free(s);
        return rc;
    }
    s->dev = dev;
    s->class_ = class_;
    weft__cuda_engine_stream_init(s, (unsigned)class_ * WEFT__CUDA_MAX_STREAMS +
                                         dev->nstreams[class_]);
    *out = s;
    return WEFT_OK;
}

int weft__cuda_stream_create_bare(weft__cuda_device *dev, weft__stream **out)
{
    weft__stream *s;
    if (posix_memalign((void **)&s, 64, sizeof *s))
        return weft__fail(WEFT_ENOMEM, "weft: out of memory for a stream");
    memset(s, 0, sizeof *s);
    cudaError_t e;
    int rc = weft__cuda_use_device(dev);
    if (rc == WEFT_OK &&
        (e = cudaStreamCreateWithFlags(&s->handle, cudaStreamNonBlocking)) != cudaSuccess)
        rc = weft__cuda_fail(dev, "cudaStreamCreateWithFlags", e);
    if (rc) {
        free(s);
        return rc;
    }
    s->dev = dev;
    s->graph.capture = true;
    *out = s;
    return WEFT_OK;
}

void weft__cuda_stream_destroy_bare(weft__stream *s)
{
    cudaStreamDestroy(s->handle);
    free(s);
}

static int cuda_stream_lease(weft__device *d, int priority, weft__stream **out)
{
    cuda_device *dev = cuda_of(d);
    int class_ = priority == WEFT_PRIO_HIGH;
    int rc = weft__cuda_check_failed(dev, "weft: stream lease");
    if (rc)
        return rc;

    weft__lock_acquire(&dev->pool_lock);
    weft__stream **pool = dev->streams[class_];
    unsigned n = dev->nstreams[class_];
    weft__stream *s = NULL;
    for (unsigned i = 0; i < n && !s; i++) /* a free stream */
        if (pool[i]->leases == 0)
            s = pool[i];
    if (!s && n < WEFT__CUDA_MAX_STREAMS && (rc = stream_create(dev, class_, &s)) == WEFT_OK)
        pool[dev->nstreams[class_]++] = s;
    if (!s && n == WEFT__CUDA_MAX_STREAMS) /* exhausted: share, in turn */
        s = pool[dev->next_shared[class_]++ % WEFT__CUDA_MAX_STREAMS];
    if (s)
        s->leases++;
    weft__lock_release(&dev->pool_lock);
    if (!s)
        return rc;
    unsigned now = atomic_fetch_add_explicit(&dev->leased, 1, memory_order_relaxed) + 1;
    weft__leases_note(&dev->leased_max, now);
    *out = s;
    return WEFT_OK;
}

static void cuda_stream_return(weft__device *d, weft__stream *s)
{
    cuda_device *dev = cuda_of(d);
    weft__lock_acquire(&dev->pool_lock);
    s->leases--;
    weft__lock_release(&dev->pool_lock);
    atomic_fetch_sub_explicit(&dev->leased, 1, memory_order_relaxed);
}

static unsigned cuda_load(weft__device *d)
{
    return atomic_load_explicit(&cuda_of(d)->leased, memory_order_relaxed);
}

/* The diagnosis counters (device.h): copies are not timed here (that takes
 * events, which the timeline pays for only while recording). */
static void cuda_stats(weft__device *d, weft__device_stats *sum)
{
    cuda_device *dev = cuda_of(d);
    weft__lock_acquire(&dev->pool_lock);
    for (int c = 0; c < 2; c++)
        for (unsigned i = 0; i < dev->nstreams[c]; i++)
            weft__stream_counts_add(&dev->streams[c][i]->counts, sum);
    weft__lock_release(&dev->pool_lock);
    unsigned max = atomic_load_explicit(&dev->leased_max, memory_order_relaxed);
    if (max > sum->leases_max)
        sum->leases_max = max;
    weft__lock_acquire(&dev->host_pool.live.lock);
    sum->host_blocks += dev->host_pool.live.count;
    weft__lock_release(&dev->host_pool.live.lock);
}

/* ---- host memory ------------------------------------------------------- */

static int cuda_host_alloc(weft__device *d, void **ptr, size_t n, bool mapped, void **device_ptr)
{
    cuda_device *dev = cuda_of(d);
    int rc = weft__cuda_use_device(dev);
    if (rc == WEFT_OK)
        rc = weft__cuda_host_pool_get(&dev->host_pool, n, ptr);
    if (rc == WEFT_OK && mapped) {
        cudaError_t e = cudaHostGetDevicePointer(device_ptr, *ptr, 0);
        if (e != cudaSuccess) {
            weft__cuda_host_pool_put(&dev->host_pool, *ptr, "weft_mapped_alloc");
            return weft__cuda_fail(dev, "cudaHostGetDevicePointer", e);
        }
    }
    return rc;
}

static int cuda_host_free(weft__device *d, void *ptr, const char *call)
{
    return weft__cuda_host_pool_put(&cuda_of(d)->host_pool, ptr, call);
}

/* ---- life cycle -------------------------------------------------------- */

static void cuda_destroy(weft__device *d)
{
    cuda_device *dev = cuda_of(d);
    cudaSetDevice(dev->ordinal);
    for (int c = 0; c < 2; c++)
        for (unsigned i = 0; i < dev->nstreams[c]; i++) {
            weft__stream *s = dev->streams[c][i];
            weft__cuda_blocks_release(s);
            cudaStreamSynchronize(s->handle); /* errors: nothing to do */
            weft__cuda_trace_collect(s);      /* its last timed operations */
            weft__cuda_trace_stream_fini(s);
            weft__cuda_engine_stream_fini(s);
            cudaStreamDestroy(s->handle);
            free(s);
        }
    weft__cuda_graph_fini(dev);
    weft__cuda_trace_fini(dev);
    weft__cuda_host_pool_destroy(&dev->host_pool);
    if (dev->engine.flags)
        cudaFreeHost(dev->engine.flags);
    cudaGetLastError();
    free(dev);
}

static const weft__device_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .stream_lease = cuda_stream_lease,
    .stream_return = cuda_stream_return,
    .load = cuda_load,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .host_fn = cuda_host_fn,
    .launch = cuda_launch,
    .malloc_async = weft__cuda_block_alloc,
    .free_async = weft__cuda_block_free,
    .mark = weft__cuda_mark,
    .wait = weft__cuda_wait,
    .stream_wait = weft__cuda_stream_wait,
    .native = cuda_native,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .region_begin = weft__cuda_region_begin,
    .region_end = weft__cuda_region_end,
    .region_abandon = weft__cuda_region_abandon,
    .region_replay = weft__cuda_region_replay,
    .graph_stats = weft__cuda_graph_stats,
    .stats = cuda_stats,
    .poll = weft__cuda_poll,
    .pending = weft__cuda_pending,
    .trace_prepare = weft__cuda_trace_prepare,
    .trace_begin = weft__cuda_trace_begin,
    .trace_end = weft__cuda_trace_end,
    .trace_collect = weft__cuda_trace_collect,
    .trace_flush = weft__cuda_trace_flush,
};

/* WEFT_CUDA_COMPLETION=auto|flag|event picks how completions are noticed;
 * auto, the default, is flags or events as the load says, and flag and
 * event fix one of the two (docs/design.md says when a user would). A host
 * function per marker (callback) was slower in every measurement, so it is
 * only for measuring: a benchmark build (WEFT_MEASURE_MODES) accepts it. */
static weft__cuda_completion completion_mode(void)
{
    static const struct {
        const char *name;
        weft__cuda_completion mode;
    } modes[] = {
        {"auto", WEFT__CUDA_AUTO},
        {"flag", WEFT__CUDA_FLAG},
        {"event", WEFT__CUDA_EVENT},
#ifdef WEFT_MEASURE_MODES
        {"callback", WEFT__CUDA_CALLBACK},
#endif
    };
    const char *v = getenv("WEFT_CUDA_COMPLETION");
    if (!v || !*v)
        return WEFT__CUDA_AUTO;
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
        if (!strcmp(v, modes[i].name))
            return modes[i].mode;
    static atomic_bool warned; /* once, not once per device */
    if (!atomic_exchange(&warned, true))
        fprintf(stderr, "weft: WEFT_CUDA_COMPLETION=%s: not auto, flag or event; using auto\n", v);
    return WEFT__CUDA_AUTO;
}

static int device_create(int ordinal, unsigned graph_cache, weft__device **out)
{
    cuda_device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return weft__fail(WEFT_ENOMEM, "weft: out of memory for a device");
    dev->base.ops = &cuda_ops;
    dev->ordinal = ordinal;
    dev->engine.completion = completion_mode();
    cudaError_t e;
    size_t flags_bytes = 2 * WEFT__CUDA_MAX_STREAMS * WEFT__CUDA_FLAG_STRIDE * sizeof(uint32_t);
    int least, greatest;
    /* weft never waits in a synchronous CUDA call on its hot path; when the
     * driver must wait anyway (a launch into a full queue, the user's own
     * cudaMemcpy), it should sleep rather than spin a core. */
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess ||
        (e = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)) != cudaSuccess ||
        (e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess ||
        (e = cudaHostAlloc((void **)&dev->engine.flags, flags_bytes,
                           cudaHostAllocMapped | cudaHostAllocPortable)) != cudaSuccess ||
        (e = cudaHostGetDevicePointer((void **)&dev->engine.flags_device, dev->engine.flags, 0)) !=
            cudaSuccess) {
        int rc = weft__cuda_fail(dev, "weft: opening the GPU", e);
        cuda_destroy(&dev->base);
        return rc;
    }
    memset(dev->engine.flags, 0, flags_bytes);
    dev->priority[0] = least;
    dev->priority[1] = greatest;
    current_ordinal = ordinal;
    weft__cuda_host_pool_init(&dev->host_pool);
    int rc = weft__cuda_graph_init(dev, graph_cache);
    if (rc) {
        cuda_destroy(&dev->base);
        return rc;
    }
    *out = &dev->base;
    return WEFT_OK;
}

/* Unpinned tasks land on whichever GPU is least loaded, so one task's
 * device memory is often another GPU's kernel input: let every GPU reach
 * every other one's memory where the hardware allows, for plain
 * allocations (peer access) and for the stream-ordered pools that
 * weft_malloc_async draws from (pool access). Where it does not, such
 * accesses fail with the CUDA error's name. */
static void connect_peers(int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int can = 0;
            if (i == j || cudaDeviceCanAccessPeer(&can, i, j) != cudaSuccess || !can)
                continue;
            cudaMemPool_t pool;
            struct cudaMemAccessDesc access = {
                .location = {.type = cudaMemLocationTypeDevice, .id = i},
                .flags = cudaMemAccessFlagsProtReadWrite,
            };
            cudaSetDevice(i);
            cudaDeviceEnablePeerAccess(j, 0); /* already enabled is fine */
            if (cudaDeviceGetDefaultMemPool(&pool, j) == cudaSuccess)
                cudaMemPoolSetAccess(pool, &access, 1);
        }
    cudaGetLastError();
    current_ordinal = -1; /* we moved the calling thread around */
}

int weft__cuda_devices_create(weft__device ***out, unsigned *count, unsigned graph_cache)
{
    *out = NULL;
    *count = 0;
    /* More streams than hardware queues would serialize independent work;
     * this must be set before the CUDA context exists. The user's wins. */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        cudaGetLastError();
        return WEFT_OK; /* no GPU (or no driver): the host backend serves */
    }
    int rc = weft__cuda_engine_load();
    if (rc)
        return rc;
    weft__device **devs = calloc((size_t)n, sizeof *devs);
    if (!devs)
        return weft__fail(WEFT_ENOMEM, "weft: out of memory");
    for (int i = 0; i < n; i++)
        if ((rc = device_create(i, graph_cache, &devs[i]))) {
            while (i-- > 0)
                cuda_destroy(devs[i]);
            free(devs);
            return rc;
        }
    if (n > 1)
        connect_peers(n);
    *out = devs;
    *count = (unsigned)n;
    return WEFT_OK;
}
