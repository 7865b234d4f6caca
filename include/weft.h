/*
 * weft.h - write each GPU job as plain sequential code; run thousands at once.
 *
 * A task is a function running on its own stack. When it waits - for another
 * task, a channel, a timer or work it enqueued on a device - it suspends and
 * its worker thread runs other tasks. Nothing here blocks a worker thread.
 *
 * Conventions:
 *  - Every call that can fail returns an int status: WEFT_OK (0) or a
 *    negative WEFT_E* code. weft_strerror() names a code; weft_last_error()
 *    gives the detailed message of the caller's last failed call.
 *  - Calls marked "task only" must be made from inside a task; elsewhere they
 *    return WEFT_ENOTASK. Every other call works from tasks and plain threads.
 *  - Zero-initialized option structs mean "defaults".
 *  - Suspension points (join, when_all, when_any, yield, sleep, await, and the
 *    waits of the synchronization objects) return WEFT_ECANCELED once the
 *    calling task has been cancelled.
 *  - Timed waits are the _until forms of join, event await and the waits of
 *    the synchronization objects. They take an absolute deadline in
 *    nanoseconds of CLOCK_MONOTONIC, the clock of weft_now_ns(). When the
 *    deadline passes first the call returns WEFT_ETIMEDOUT having done
 *    nothing: no item sent or received, no permit taken, no lock held (a
 *    cond wait holds its mutex again, as always). A deadline already past
 *    makes the call a try: it succeeds if it can without waiting, else
 *    returns WEFT_ETIMEDOUT. WEFT_FOREVER never passes: the plain call is
 *    the _until form with WEFT_FOREVER. Inside a task the wait suspends
 *    (the runtime's timer thread ends it); in a plain thread it blocks. A
 *    timed wait may end a little after its deadline, never before it.
 *    Cancellation still ends a timed wait with WEFT_ECANCELED, except
 *    weft_event_await_until's, which (like weft_await) is not cut short.
 */
#ifndef WEFT_H
#define WEFT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version ----------------------------------------------------------- */

/* The version of this header; CMake's project(VERSION) must say the same
 * (the configure step refuses a mismatch). weft_version() is the version of
 * the library the program runs with, "MAJOR.MINOR.PATCH", which differs from
 * the header's when a program built against one libweft.so runs with
 * another. */
#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0

const char *weft_version(void);

/* ---- status codes ------------------------------------------------------ */

enum {
    WEFT_OK = 0,
    WEFT_EINVAL = -1,     /* an argument is NULL, out of range or malformed */
    WEFT_ENOMEM = -2,     /* out of memory (host or device) */
    WEFT_ECANCELED = -3,  /* the calling task was cancelled */
    WEFT_ENOTASK = -4,    /* a task-only call made outside a task */
    WEFT_ESTATE = -5,     /* wrong state: joined twice, runtime destroyed, ... */
    WEFT_ECLOSED = -6,    /* the channel is closed */
    WEFT_EAGAIN = -7,     /* a try-call would have had to wait */
    WEFT_EDEADLK = -8,    /* the wait could never end (a task joining itself) */
    WEFT_EDEVICE = -9,    /* the device failed or reported an error */
    WEFT_ETIMEDOUT = -10, /* an _until wait's deadline passed first: join, event await, mutex
                             lock, cond wait, sem wait, chan send and recv */
    WEFT_EPERM = -11,     /* not the owner (unlocking a mutex held by another) */
    WEFT_ESYS = -12,      /* the operating system refused (threads, memory maps) */
    /* weft_join: the task joined was cancelled (its handle is released) */
    WEFT_ETASKCANCELED = -13
};

/* ---- time -------------------------------------------------------------- */

/* A deadline that never passes. */
#define WEFT_FOREVER UINT64_MAX

/* Now, in nanoseconds of CLOCK_MONOTONIC: the clock deadlines are on. */
uint64_t weft_now_ns(void);

/* The deadline ns nanoseconds from now; WEFT_FOREVER if that does not fit. */
uint64_t weft_deadline_in_ns(uint64_t ns);

/* A short constant description of a status code ("invalid argument"). */
const char *weft_strerror(int status);

/* The detailed message of the last call that failed in the calling task (or
 * thread, outside tasks), e.g. "weft_join: task handle was already joined or
 * detached, or its runtime destroyed". Valid until
 * the next failing call from the same task or thread. Never NULL. */
const char *weft_last_error(void);

/* ---- runtime ----------------------------------------------------------- */

typedef struct weft_runtime weft_runtime;

typedef enum weft_backend {
    WEFT_BACKEND_AUTO = 0, /* a GPU when one is present, else the host */
    WEFT_BACKEND_HOST = 1, /* streams executed by host threads */
    WEFT_BACKEND_CUDA = 2  /* NVIDIA GPUs through CUDA */
} weft_backend;

/* weft_config and weft_task_opts open with size, the sizeof the caller's
 * header gave: start each from its WEFT_*_INIT, which sets it, and then set
 * the fields wanted:
 *     weft_config cfg = WEFT_CONFIG_INIT;
 *     cfg.workers = 4;
 * The library reads only the fields size covers and takes the others as
 * their defaults (zero), so a program built against this header keeps
 * working with a later weft whose structs have grown (weft_stats_get passes
 * the caller's sizeof itself: a weft_stats needs no initializing). size 0 means the layout of weft
 * 0.1 (the first with a size field), so a zeroed struct is all defaults and
 * {.workers = 4} still means what it says. A size beyond what the library
 * knows (a program built against a later header) is accepted when the
 * fields the library does not know are zero, and refused with WEFT_EINVAL
 * otherwise; a size smaller than the size field itself is WEFT_EINVAL. */
/* clang-format off */
#define WEFT_CONFIG_INIT {.size = sizeof(weft_config)}
#define WEFT_TASK_OPTS_INIT {.size = sizeof(weft_task_opts)}
/* clang-format on */

typedef struct weft_config {
    size_t size;               /* sizeof(weft_config): WEFT_CONFIG_INIT sets it */
    unsigned workers;          /* worker threads; 0: one per online CPU */
    size_t stack_size;         /* default task stack; 0: 256 KiB */
    weft_backend backend;      /* which devices back weft streams */
    unsigned host_threads;     /* host backend executor threads; 0: 2 */
    unsigned graph_cache;      /* executable graphs kept per GPU (graph mode); 0: 256 */
    unsigned blocking_threads; /* bound on weft_blocking's threads; 0: 16 */
} weft_config;

/* Start a runtime: worker threads, stack pool, devices. cfg NULL: defaults. */
int weft_runtime_create(weft_runtime **rt, const weft_config *cfg);

/* Wait until every task (joined, unjoined or detached) has finished, then
 * stop the workers and free everything. Safe against calls on rt from other
 * threads at the same time: each such call either completes before destroy
 * goes on or returns WEFT_ESTATE, and a spawn that returned WEFT_OK runs to
 * its end before destroy returns. rt's own tasks keep working (they may
 * spawn, join, allocate) until they end. Handles of unjoined tasks become
 * stale: calls with them return WEFT_ESTATE. Must not be called from one of
 * rt's own tasks (WEFT_EDEADLK); a second destroy returns WEFT_ESTATE.
 * Later calls with rt return WEFT_ESTATE until the address is reused by
 * another weft_runtime_create. */
int weft_runtime_destroy(weft_runtime *rt);

/* The runtime running the calling task, or NULL outside tasks. */
weft_runtime *weft_runtime_current(void);

#define WEFT_STATS_DEVICES 16

/* The memory on either side of a copy. */
typedef enum weft_copy_kind {
    WEFT_COPY_PAGEABLE = 0, /* plain (pageable) host memory and the device: staged */
    WEFT_COPY_PINNED = 1,   /* pinned or mapped host memory and the device */
    WEFT_COPY_DEVICE = 2,   /* device to device */
    WEFT_COPY_HOST = 3,     /* host to host: every copy of the host backend */
    WEFT_COPY_KINDS = 4
} weft_copy_kind;

/* What graph mode did so far, summed over a runtime's GPUs (see the graph
 * calls below). */
typedef struct weft_graph_stats {
    uint64_t launches;       /* regions launched as graphs */
    uint64_t hits;           /* ... replayed from a recording of the same operations */
    uint64_t updates;        /* ... after changing a cached executable graph's parameters */
    uint64_t instantiations; /* ... by instantiating one (first time, new shape) */
    uint64_t evictions;      /* executable graphs dropped for the cache bound */
} weft_graph_stats;

/* What a runtime has done so far. Counters are kept per worker and summed
 * when read, so reading costs nothing on the hot paths; the sum is a
 * snapshot, not taken at a single instant. */
typedef struct weft_stats {
    /* Set by weft_stats_get: the bytes it filled (what both the caller's
     * header and this weft know). */
    size_t size;
    uint64_t spawned;     /* tasks spawned */
    uint64_t finished;    /* tasks that ended (ran to the end or were dropped) */
    uint64_t switches;    /* times a worker switched into a task */
    uint64_t steals;      /* tasks taken from another worker's queue */
    uint64_t parks;       /* times a worker went to sleep for want of work */
    uint64_t awaits;      /* weft_await calls that had device work to wait for */
    double await_mean_us; /* their mean time from the call to the return */
    /* Per device (the first WEFT_STATS_DEVICES), the time it had work
     * outstanding: from work enqueued while it was idle until the last
     * pending work is seen complete. A GPU counts time its work waits in
     * CUDA's queues as busy; the host backend counts queued and running
     * operations. devices is 0 until the first device call creates them. */
    unsigned devices;
    uint64_t device_busy_ns[WEFT_STATS_DEVICES];
    weft_graph_stats graph; /* graph mode, as weft_graph_stats_get gives it */
    /* What weft_stats_report diagnoses from (docs/guide.md, "Reading a
     * run"). */
    uint64_t elapsed_ns; /* since weft_runtime_create */
    /* Worker time (summed over workers) asleep while some task was alive
     * and no device had work outstanding from the sleep's start to its
     * end: neither the CPU nor the device had anything to do. */
    uint64_t stalled_ns;
    unsigned streams_max; /* most stream leases held at once on one device */
    uint64_t launches;    /* kernels launched outside graph regions */
    /* Bytes weft_memcpy_async copied outside graph regions, by the memory
     * on either side. */
    uint64_t copy_bytes[WEFT_COPY_KINDS];
    /* Time the device spent running copies, where the backend times them
     * (the host backend does); 0 otherwise. */
    uint64_t copy_ns;
} weft_stats;
/* Fill *stats, size bytes of it: the macro passes the caller's
 * sizeof(weft_stats), so a struct needs no initializing, a program built
 * against an older header gets the fields it knows and no byte more, and
 * one built against a newer header gets zeros in the fields this weft does
 * not know. Other languages call weft_stats_get_sized with their size. */
int weft_stats_get_sized(weft_runtime *rt, weft_stats *stats, size_t size);
#define weft_stats_get(rt, stats) weft_stats_get_sized((rt), (stats), sizeof *(stats))

/* Diagnose the run so far from rt's counters: one paragraph per symptom
 * found - GPU and CPU idle together, device work that never overlapped,
 * copies that dominate, kernels too short for their launch cost - each
 * with the figure that shows it and the remedy; nothing at all for a
 * healthy run. Written to buf as snprintf does (NUL-terminated, cut to
 * size; buf may be NULL when size is 0). Returns the length of the whole
 * report (0: healthy), or a negative status. WEFT_REPORT=1 in the
 * environment prints the report of every runtime to stderr as it is
 * destroyed (WEFT_REPORT=FILE: appended to FILE), together with what was
 * left behind: tasks never joined, events never destroyed, memory never
 * freed. */
int weft_stats_report(weft_runtime *rt, char *buf, size_t size);

/* Number of worker threads of rt (0 if rt is not a live runtime). */
unsigned weft_runtime_workers(const weft_runtime *rt);

/* ---- tracing ----------------------------------------------------------- */
/*
 * A timeline of what rt does, written to a file as Chrome trace event JSON
 * (open it in https://ui.perfetto.dev or chrome://tracing): each task's runs
 * on the worker threads, named by weft_task_opts.name; each wait (join,
 * mutex, channel, sleep, GPU, ...) and the time the task then waited for a
 * worker, on a track of the task's own; and device operations (copies,
 * memsets, host functions, kernels, graph launches) on a track per stream,
 * each with the id of the task that enqueued it. A GPU's operations are
 * timed on the GPU: by CUPTI's activity records (host functions, which
 * leave none, by CUDA events), or by CUDA events with WEFT_TRACE_GPU=events
 * (also when libcupti cannot be used); WEFT_TRACE_GPU=off leaves them out.
 * The host backend's are timed by the thread that runs them. A program need
 * not call anything: WEFT_TRACE=FILE in the environment traces every runtime
 * from its creation to its destruction (the second runtime of a process
 * writes trace.2.json for trace.json - the number goes before the extension
 * - the third trace.3.json, and so on). Recording costs a few percent; not
 * recording costs one branch.
 * With CUDA and a profiler attached (Nsight Systems), tasks, waits and
 * operations also appear as NVTX ranges in the domain "weft".
 */

/* Start writing rt's timeline to path (created or truncated). WEFT_ESTATE
 * if rt is recording already, WEFT_ESYS if path cannot be opened. */
int weft_trace_start(weft_runtime *rt, const char *path);

/* Stop and complete the file (it is valid JSON from then on). Stopped by
 * weft_runtime_destroy, and at exit, if still open. WEFT_ESTATE if rt is
 * not recording; WEFT_ESYS if writing failed. */
int weft_trace_stop(weft_runtime *rt);

/* ---- tasks ------------------------------------------------------------- */

typedef struct weft_task weft_task;

typedef enum weft_priority {
    WEFT_PRIO_NORMAL = 0,
    WEFT_PRIO_HIGH = 1, /* runs before any ready normal task */
    WEFT_PRIO_LOW = 2   /* runs when nothing else is ready, and never starves */
} weft_priority;

typedef struct weft_task_opts {
    size_t size; /* sizeof(weft_task_opts): WEFT_TASK_OPTS_INIT sets it */
    weft_priority priority;
    size_t stack_size; /* 0: the runtime's default */
    const char *name;  /* shown in traces and a stack overflow's report; must outlive the task */
    unsigned device;   /* 0: the least loaded device; WEFT_DEVICE(i): device i */
} weft_task_opts;

#define WEFT_DEVICE(i) ((unsigned)(i) + 1u)

/* Start fn(arg) as a new task. t receives a handle to join (exactly once);
 * t NULL starts a detached task. opts NULL: defaults. Spawned from a task,
 * the new task goes to the local worker's queue; from a thread, to the
 * shared injection queue. The stack is allocated when the task first runs. */
int weft_spawn(weft_runtime *rt, weft_task **t, void *(*fn)(void *), void *arg,
               const weft_task_opts *opts);

/* Wait for t to finish, store fn's return value in *result (if result is not
 * NULL; NULL when the task never ran) and release the handle. In a task it
 * suspends; in a thread it blocks. Returns WEFT_OK, or the task's own
 * failure: WEFT_ETASKCANCELED if t was cancelled, WEFT_EDEVICE if its device
 * work failed; each of these releases the handle. A second join of the same
 * handle returns WEFT_ESTATE; a task joining itself WEFT_EDEADLK. A handle
 * whose runtime is being destroyed or was destroyed returns WEFT_ESTATE (so
 * do the other calls taking handles); a join that began before the destroy
 * completes first. A join made by a cancelled task returns WEFT_ECANCELED,
 * as every wait of a cancelled task does, at once or when the cancellation
 * ends its wait, and t stays joinable (weft_detach lets it go): so
 * WEFT_ECANCELED always speaks of the caller, WEFT_ETASKCANCELED of t. */
int weft_join(weft_task *t, void **result);

/* weft_join until deadline_ns: WEFT_ETIMEDOUT if t has not finished by then
 * (t then stays joinable and runs on). The other results are weft_join's:
 * WEFT_ETASKCANCELED for a cancelled t, WEFT_ECANCELED for a cancelled
 * caller. */
int weft_join_until(weft_task *t, void **result, uint64_t deadline_ns);

/* Let t run to completion on its own: its handle is released when it ends.
 * A detached handle must not be used again. */
int weft_detach(weft_task *t);

/* Wait until every task in ts has finished. Handles stay joinable, and a
 * task's own outcome (cancelled or failed) is left to its join:
 * WEFT_ECANCELED here means the caller was cancelled. */
int weft_when_all(weft_task *const *ts, size_t n);

/* Wait until at least one task in ts has finished; *first receives the
 * lowest index among those finished when it returns. Handles stay
 * joinable. */
int weft_when_any(weft_task *const *ts, size_t n, size_t *first);

/* Ask t to stop. Cooperative: from now on every suspension point in t
 * returns WEFT_ECANCELED (and a wait it is suspended in ends with it); if t
 * has not started it never will. weft_join still waits for t to end and then
 * returns WEFT_ETASKCANCELED. Cancelling a finished task is a no-op. */
int weft_cancel(weft_task *t);

/* Has the calling task been cancelled? 0 outside tasks. */
int weft_cancelled(void);

/* Let other ready tasks run, then continue. Task only. */
int weft_yield(void);

/* Suspend the calling task for at least ns nanoseconds without blocking its
 * worker. Task only. A deadline past the clock's range (UINT64_MAX, say) is
 * never reached: such a sleep ends only when the task is cancelled
 * (WEFT_ECANCELED). */
int weft_sleep_ns(uint64_t ns);

/* The calling task's handle, or NULL outside tasks. */
weft_task *weft_task_current(void);

/* ---- blocking work ------------------------------------------------------ */
/*
 * A task must not block its worker: no blocking system calls (read, write,
 * fread on a slow disk, waitpid, connect), no sleep/usleep/nanosleep, no
 * pthread_mutex_lock or pthread_cond_wait that may wait long, no lock of
 * any kind held across a weft wait. Such calls go through weft_blocking.
 */

/* Run fn(arg) on one of the runtime's threads that may block, suspend the
 * calling task meanwhile, then store fn's return value in *result (if
 * result is not NULL). The runtime keeps at most weft_config's
 * blocking_threads such threads, started as needed and kept until it is
 * destroyed; calls beyond the bound wait in arrival order. fn runs on a
 * plain thread: weft calls it makes behave as from a thread (they block).
 * Cancellation: a call of a cancelled task, or one cancelled before fn
 * started, returns WEFT_ECANCELED and fn never runs; once fn runs it is not
 * interrupted - the task waits for it (arg may point into its stack) and
 * the call returns WEFT_OK with the result. From a plain thread it simply
 * calls fn. */
int weft_blocking(void *(*fn)(void *arg), void *arg, void **result);

/* ---- device work from a task ------------------------------------------- */
/*
 * A task's device work goes to a stream that the task leases on its first
 * enqueue: an in-order queue on one of the runtime's devices (a GPU with the
 * CUDA backend, host threads with the host backend). Operations run in the
 * order they were enqueued; weft_await suspends the task until all of them
 * have completed, then the stream goes back to the pool. A task that returns
 * with work in flight is awaited implicitly. A device failure fails the task:
 * weft_await returns WEFT_EDEVICE with the error's name in the message, and
 * so does weft_join. Calls marked "task only" return WEFT_ENOTASK elsewhere.
 */

typedef struct weft_dim3 {
    unsigned x, y, z;
} weft_dim3;

/* Copy n bytes from src to dst in stream order; the direction (host or
 * device memory on either side) is inferred. Task only. */
int weft_memcpy_async(void *dst, const void *src, size_t n);

/* Set n bytes at dst to (unsigned char)value in stream order. Task only. */
int weft_memset_async(void *dst, int value, size_t n);

/* Run fn(arg) in stream order, on a thread of the device backend (with CUDA:
 * a host function in the stream). fn must not call weft functions that wait.
 * Task only. */
int weft_host_async(void (*fn)(void *arg), void *arg);

/* Launch kernel - the address of a __global__ function, as for
 * cudaLaunchKernel - with args[i] pointing at its i-th argument. Task only.
 * The host backend has no kernels: WEFT_EINVAL. */
int weft_launch(const void *kernel, weft_dim3 grid, weft_dim3 block, size_t shared_bytes,
                void **args);

/* Suspend until everything the calling task enqueued has completed. Task
 * only. Not cut short by cancellation (work in flight may point into the
 * task's stack): a cancelled task gets WEFT_ECANCELED once it is done. */
int weft_await(void);

/* The calling task's stream as the backend's own handle (a cudaStream_t),
 * leasing one now if needed, so that libraries (cuBLAS, cuFFT, your own
 * launches) can enqueue on it; weft_await covers their work too. NULL with
 * the host backend. Task only. */
int weft_stream(void **stream);

/* The device of the calling task's stream as WEFT_DEVICE(i) (placing the
 * task now if it has none yet, as weft_stream does): what a task passes to
 * weft_task_opts.device so that the tasks it spawns work on its device.
 * Task only. */
int weft_task_device(unsigned *device);

/* Device memory from the stream-ordered allocator (cudaMallocAsync on the
 * calling task's stream): usable by work enqueued after it. Task only.
 * WEFT_ENOMEM when the device is full. The host backend hands out host
 * memory. */
int weft_malloc_async(void **ptr, size_t n);
/* Give ptr back once the work enqueued before this call is done. NULL is a
 * no-op; a pointer weft_malloc_async did not return, or one given back
 * already, is refused with WEFT_EINVAL and nothing is freed. */
int weft_free_async(void *ptr);

/* Page-locked host memory (fast copies), from a pool of rt's. The frees
 * (of either kind) take back only blocks rt handed out and not yet taken
 * back: anything else is WEFT_EINVAL, with nothing freed. NULL: no-op. */
int weft_host_alloc(weft_runtime *rt, void **ptr, size_t n);
int weft_host_free(weft_runtime *rt, void *ptr);

/* Host memory the device reads and writes directly (zero-copy): *host for
 * the CPU, *device for kernels. */
int weft_mapped_alloc(weft_runtime *rt, void **host, void **device, size_t n);
int weft_mapped_free(weft_runtime *rt, void *host);

/* Graph mode. The device work a task enqueues between weft_region_begin
 * and weft_region_end is recorded and launched as one CUDA graph; each key
 * keeps its executable graphs, so a region that repeats costs one graph
 * launch instead of one launch per operation. Kernel launches, and memsets
 * and copies of device or pinned memory, are recorded as they are called
 * (arguments copied, like an eager launch): a repeat with the same
 * operations replays the cached graph, setting only the nodes whose
 * pointers or scalars changed. Other work (host functions, allocation,
 * pageable memory, your own work on the stream weft_stream gives) makes the
 * region a stream capture from there on, which costs a graph update per
 * repeat. When the work's shape changed, the graph is instantiated again.
 * Tasks running the same key at the same time get separate instances. The
 * host backend runs regions eagerly.
 *
 * Inside a region a task must not suspend: weft_await, joins, sleeps and
 * the waits of the synchronization objects return WEFT_ESTATE there and
 * abandon the region (its recorded work is dropped; weft_region_end then
 * returns WEFT_ESTATE too). Calls CUDA forbids during capture (cudaMalloc,
 * synchronizing calls) make weft_region_end fail with the CUDA error's name;
 * the stream stays usable. Allocate inside a region with weft_malloc_async.
 * Regions do not nest, and weft_event_record inside one returns
 * WEFT_ESTATE (the recorded work has no point in time yet). Task only. */
int weft_region_begin(uint64_t key);
int weft_region_end(void);
/* Launch the graph a region of key left, as it stands, recording nothing:
 * for work that repeats exactly (the same operations on the same buffers
 * with the same arguments, only the buffers' contents new), where
 * recording it again would cost the host more than the launch. The caller
 * promises the region would record the same; a graph's nodes hold the
 * arguments of its last recording. *replayed is 1 when it launched (as
 * weft_region_end would have, awaited the same way), 0 when there is no
 * idle graph of key (none recorded yet, evicted, in use by another task,
 * or the host backend, which keeps none): then run the region as usual.
 * WEFT_ESTATE inside an open region. Task only. */
int weft_region_replay(uint64_t key, int *replayed);

/* What graph mode did so far (also in weft_stats). */
int weft_graph_stats_get(weft_runtime *rt, weft_graph_stats *stats);

/* Explicit graphs: device work built by hand, node by node with its
 * dependencies, then launched from a task like any other work (on the
 * task's stream, covered by weft_await). CUDA backend only: with the host
 * backend weft_graph_create returns WEFT_EINVAL.
 *
 * Each add call appends a node that runs after the nodes in deps (ndeps of
 * them, NULL when 0) and gives its number in *node (node may be NULL).
 * Copies and fills take device, pinned or mapped memory; pageable host
 * memory is refused with WEFT_EINVAL. Events are cudaEvent_t, passed as
 * void *. A child graph is copied in as it is at the call.
 *
 * Conditional nodes let the GPU decide: a condition (weft_graph_cond_create)
 * is a cudaGraphConditionalHandle that kernels receive as an argument and
 * set with CUDA's device call cudaGraphSetConditional(cond, value); it
 * starts each launch at `initial`. An IF node runs its body once when the
 * condition is non-zero; a WHILE node runs its body as long as the
 * condition is non-zero, testing it first. Bodies are graphs to fill with
 * add calls (kernels, copies, fills, children and conditionals only); they
 * belong to their node and are not destroyed on their own.
 *
 * The first weft_graph_launch instantiates the graph on the launching
 * task's GPU, and seals it: later add calls return WEFT_ESTATE, and tasks
 * on another GPU get WEFT_EINVAL. Launches of one graph run one after the
 * other on the GPU, also when several tasks launch it. Building a graph is
 * not thread-safe; launching is. Destroy a graph once nothing will launch
 * it again; launches in flight finish first. */
typedef struct weft_graph weft_graph;
typedef uint32_t weft_graph_node;
typedef uint64_t weft_graph_cond;

int weft_graph_create(weft_runtime *rt, weft_graph **g);
int weft_graph_destroy(weft_graph *g);
int weft_graph_add_kernel(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                          size_t ndeps, const void *kernel, weft_dim3 grid, weft_dim3 block,
                          size_t shared_bytes, void **args);
int weft_graph_add_copy(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                        size_t ndeps, void *dst, const void *src, size_t n);
int weft_graph_add_fill(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                        size_t ndeps, void *dst, int value, size_t n);
int weft_graph_add_host(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                        size_t ndeps, void (*fn)(void *arg), void *arg);
int weft_graph_add_event_record(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                                size_t ndeps, void *cuda_event);
int weft_graph_add_event_wait(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                              size_t ndeps, void *cuda_event);
int weft_graph_add_child(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                         size_t ndeps, const weft_graph *child);
int weft_graph_cond_create(weft_graph *g, weft_graph_cond *cond, unsigned initial);
int weft_graph_add_if(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                      size_t ndeps, weft_graph_cond cond, weft_graph **body);
int weft_graph_add_while(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                         size_t ndeps, weft_graph_cond cond, weft_graph **body);
/* Enqueue one run of g on the calling task's stream. Task only. */
int weft_graph_launch(weft_graph *g);

/* Events: a point in a task's stream that others can wait for. */
typedef struct weft_event weft_event;

/* Mark everything the calling task has enqueued so far. Task only. */
int weft_event_record(weft_event **ev);
/* Suspend until ev's work has completed (from a thread: block). Not cut
 * short by cancellation, like weft_await. */
int weft_event_await(weft_event *ev);
/* weft_event_await until deadline_ns: WEFT_ETIMEDOUT if ev's work is not
 * complete by then (the work itself goes on; ev may be awaited again). */
int weft_event_await_until(weft_event *ev, uint64_t deadline_ns);
/* Make the calling task's later work wait for ev on the device, without
 * suspending the task. An event of another device than the task's is
 * waited for by the task itself: it suspends until ev completes. Task
 * only. */
int weft_stream_wait(weft_event *ev);
/* Release ev (NULL: a no-op). A destroyed event is refused by every call
 * with WEFT_ESTATE, as a joined task's handle is; a pointer that never was
 * an event with WEFT_EINVAL. */
int weft_event_destroy(weft_event *ev);

/* Devices of rt and the backend behind them ("cuda" or "host"); 0 and
 * "none" when rt is not a live runtime or its devices cannot start. */
unsigned weft_device_count(weft_runtime *rt);
const char *weft_backend_name(weft_runtime *rt);

/* ---- task-aware synchronization ---------------------------------------- */
/*
 * These suspend the calling task instead of blocking its worker. Called from
 * a plain thread they block that thread. Every call returns WEFT_EINVAL for
 * a NULL object or item pointer.
 *
 * Waiting and cancellation. The calls that may wait (mutex_lock, cond_wait,
 * sem_wait, chan_send, chan_recv, and their _until forms, which also end
 * with WEFT_ETIMEDOUT as the conventions at the top say) return
 * WEFT_ECANCELED once the calling task has been cancelled, also when they
 * would not have had to wait; the operation then did not happen (no lock
 * taken, no permit, no item sent or received). A call that returns WEFT_OK
 * did all of it, even if the task was cancelled meanwhile: an item is never
 * lost or delivered twice, a lock or a permit never leaks. The try-calls and
 * the calls that never wait (unlock, signal, broadcast, post, close) keep
 * working in a cancelled task, so that it can clean up.
 *
 * Fairness. Waiters are served in arrival order, and unlock, post and send
 * hand the lock, the permit or the item straight to the longest-waiting live
 * waiter: a newcomer (or a try-call) cannot overtake it.
 *
 * Destroy. While anyone waits on the object (for a mutex: also while it is
 * held) destroy returns WEFT_ESTATE and frees nothing. Otherwise it frees at
 * once: no call on the object may be in progress or follow, and a task
 * still returning from a wait on it (say, one just cancelled) counts as in
 * progress - join it first.
 */

typedef struct weft_mutex weft_mutex;
typedef struct weft_cond weft_cond;
typedef struct weft_sem weft_sem;
typedef struct weft_chan weft_chan;

/* A non-recursive mutex. Its holder is the calling task (which may unlock it
 * after moving to another worker) or, outside tasks, the calling thread. */
int weft_mutex_create(weft_mutex **m);
int weft_mutex_destroy(weft_mutex *m); /* ESTATE when held or waited on */
/* ECANCELED: not acquired. EDEADLK: the caller holds it already. */
int weft_mutex_lock(weft_mutex *m);
/* ETIMEDOUT: not acquired by deadline_ns. */
int weft_mutex_lock_until(weft_mutex *m, uint64_t deadline_ns);
int weft_mutex_trylock(weft_mutex *m); /* EAGAIN when held (by anyone) */
int weft_mutex_unlock(weft_mutex *m);  /* EPERM when not the holder */

int weft_cond_create(weft_cond **c);
int weft_cond_destroy(weft_cond *c); /* ESTATE when waited on */
/* Atomically release m and wait for a signal; m is held again on return,
 * also when the result is WEFT_ECANCELED (re-taking m is not cancellable).
 * Wake-ups may be spurious. EPERM: the caller does not hold m (nothing
 * done). "Atomically": whoever takes m after the release and then signals
 * or broadcasts is sure to wake this waiter. */
int weft_cond_wait(weft_cond *c, weft_mutex *m);
/* ETIMEDOUT: no wake-up by deadline_ns; m is held again, as on any return.
 * A signal that came while the wait was timing out goes to another waiter. */
int weft_cond_wait_until(weft_cond *c, weft_mutex *m, uint64_t deadline_ns);
int weft_cond_signal(weft_cond *c);    /* wake the longest waiter, if any */
int weft_cond_broadcast(weft_cond *c); /* wake everyone waiting now */

/* A counting semaphore with a 64-bit count. */
int weft_sem_create(weft_sem **s, uint64_t initial);
int weft_sem_destroy(weft_sem *s); /* ESTATE when waited on */
int weft_sem_wait(weft_sem *s);    /* take one permit, waiting for it */
/* ETIMEDOUT: no permit by deadline_ns (none taken). */
int weft_sem_wait_until(weft_sem *s, uint64_t deadline_ns);
int weft_sem_trywait(weft_sem *s); /* EAGAIN when none is free */
/* Give one permit back. ESTATE (nothing done): the count is UINT64_MAX. */
int weft_sem_post(weft_sem *s);

/* A bounded FIFO of capacity items of item_size bytes each (capacity 0: an
 * unbuffered rendezvous). Items are copied in and out. EINVAL: item_size is
 * 0, or capacity * item_size does not fit in a ptrdiff_t. */
int weft_chan_create(weft_chan **ch, size_t item_size, size_t capacity);
/* ESTATE when waited on. Items still buffered are discarded. */
int weft_chan_destroy(weft_chan *ch);
/* Wait for room, then copy *item in; on an unbuffered channel, wait until a
 * receiver has taken it. ECLOSED if the channel is closed, before or while
 * waiting: the item was not sent. */
int weft_chan_send(weft_chan *ch, const void *item);
/* ETIMEDOUT: no room (no receiver took it) by deadline_ns; the item was not
 * sent. */
int weft_chan_send_until(weft_chan *ch, const void *item, uint64_t deadline_ns);
/* Wait for an item and copy it to *item. ECLOSED once the channel is closed
 * and drained. *item holds an item on WEFT_OK only; after any other result
 * its contents are unspecified. */
int weft_chan_recv(weft_chan *ch, void *item);
/* ETIMEDOUT: no item by deadline_ns; none was taken from the channel. */
int weft_chan_recv_until(weft_chan *ch, void *item, uint64_t deadline_ns);
/* EAGAIN: full (unbuffered: no receiver waiting). ECLOSED: closed. */
int weft_chan_trysend(weft_chan *ch, const void *item);
/* EAGAIN: empty (unbuffered: no sender waiting). ECLOSED: closed and
 * drained. *item as for weft_chan_recv. */
int weft_chan_tryrecv(weft_chan *ch, void *item);
/* No more sends: waiting senders get ECLOSED (their items are not sent),
 * receivers drain what is buffered, then get ECLOSED. Closing twice returns
 * WEFT_ECLOSED. */
int weft_chan_close(weft_chan *ch);

#ifdef __cplusplus
}
#endif

#endif
