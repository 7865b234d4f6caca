/*
 * nccl.c - NCCL collectives enqueued by tasks (include/weft/nccl.h).
 *
 * Every communicator is non-blocking: NCCL never waits inside a call, and
 * answers ncclInProgress while it sets something up in the background. The
 * calls here then poll ncclCommGetAsyncError, napping between polls (a task
 * through weft_sleep_ns, so its worker runs others; a thread on
 * nanosleep), until the state is no longer "in progress": only then is an
 * operation's work on the stream, so that weft_await covers it.
 *
 * Invariants:
 *  - Every NCCL call is made with the communicator's GPU current, and the
 *    calling thread's current device is restored afterwards: weft's CUDA
 *    backend keeps the thread's current device in a cache of its own, which
 *    a device left changed would make wrong.
 *  - Arguments are checked in a fixed order, all before NCCL is called:
 *    task only; the arguments that need no communicator (buffers, dtype,
 *    op); the runtime's backend; the communicator (NULL, aborted); the
 *    task's device; what depends on the communicator (root, peer, overlap,
 *    where the buffers live).
 *  - NCCL's group is per thread. A group's state here is per thread too,
 *    with the task that opened it: a task must not suspend inside a group,
 *    so no other task runs on the thread before the group ends (checked).
 *    Inside a group nothing is polled; the outermost end polls every
 *    communicator the group used.
 *  - Every operation on the stream is handed to the watcher (watch.c),
 *    which fails its task's await if the communicator is aborted before
 *    the operation ends; a communicator is polled through the watcher's
 *    lock (weft__nccl_state), never racing an abort.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "nccl/comm.h"

_Static_assert(sizeof(weft_nccl_id) == sizeof(ncclUniqueId), "weft_nccl_id is ncclUniqueId");

enum {
    NAP_MIN_NS = 20000,   /* first nap while NCCL is in progress */
    NAP_MAX_NS = 1000000, /* the nap grows to this */
};
#define ABORT_DRAIN_NS 10000000000ull /* how long an aborted collective may take to end */

/* The group open on this thread, if any. */
static _Thread_local struct {
    unsigned depth;
    weft_task *owner;
    weft_nccl_comm **comms; /* the communicators used inside, each once */
    size_t n, cap;
} group;

/* ---- errors and naps ---------------------------------------------------- */

static int code_of(ncclResult_t r)
{
    return r == ncclInvalidArgument || r == ncclInvalidUsage ? WEFT_EINVAL : WEFT_EDEVICE;
}

/* Fail fn with NCCL's result r (and its last error, which names the cause
 * where NCCL knows it). */
static int nccl_fail(const char *fn, const weft_nccl_comm *c, ncclResult_t r)
{
    const char *last = ncclGetLastError(c ? c->nc : NULL);
    return weft__fail(code_of(r), "%s: NCCL: %s%s%s", fn, ncclGetErrorString(r),
                      last && *last ? ": " : "", last ? last : "");
}

static int cuda_fail(const char *fn, const char *call, cudaError_t e)
{
    cudaGetLastError(); /* not sticky: clear it for the backend's checks */
    return weft__fail(WEFT_EDEVICE, "%s: %s: %s", fn, call, cudaGetErrorName(e));
}

/* Let time pass: a task suspends (a cancelled task, or one inside a graph
 * region, cannot: it sleeps on its worker, briefly). */
static void nap(uint64_t ns)
{
    if (weft_task_current() && weft_sleep_ns(ns) == WEFT_OK)
        return;
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    nanosleep(&ts, NULL);
}

static bool on_cuda(weft_runtime *rt)
{
    return rt && strcmp(weft_backend_name(rt), "cuda") == 0;
}

static int need_cuda(weft_runtime *rt, const char *fn)
{
    if (on_cuda(rt))
        return WEFT_OK;
    return weft__fail(WEFT_EINVAL, "%s: NCCL needs the CUDA backend; the runtime's is '%s'", fn,
                      rt ? weft_backend_name(rt) : "none");
}

/* Make device current; *saved receives the device to restore. */
static int use_device(int device, int *saved, const char *fn)
{
    cudaError_t e = cudaGetDevice(saved);
    if (e != cudaSuccess)
        return cuda_fail(fn, "cudaGetDevice", e);
    if (*saved != device && (e = cudaSetDevice(device)) != cudaSuccess)
        return cuda_fail(fn, "cudaSetDevice", e);
    return WEFT_OK;
}

static void restore_device(int saved)
{
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now == saved)
        return;
    cudaSetDevice(saved);
}

/* Poll c until NCCL is no longer setting it up, or until deadline
 * (WEFT_ETIMEDOUT, without a message: the caller says what timed out). */
static int settle(weft_nccl_comm *c, uint64_t deadline, const char *fn)
{
    uint64_t ns = NAP_MIN_NS;
    for (;;) {
        bool aborted = false;
        ncclResult_t state = weft__nccl_state(c, &aborted);
        if (aborted)
            return weft__fail(WEFT_EDEVICE, "%s: the communicator was aborted", fn);
        if (state == ncclSuccess)
            return WEFT_OK;
        if (state != ncclInProgress)
            return nccl_fail(fn, c, state);
        if (weft_now_ns() >= deadline)
            return WEFT_ETIMEDOUT;
        nap(ns);
        ns = ns * 2 < NAP_MAX_NS ? ns * 2 : NAP_MAX_NS;
    }
}

/* ---- communicators ------------------------------------------------------ */

static ncclConfig_t nonblocking_config(void)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return config;
}

static int group_idle(const char *fn)
{
    if (group.depth == 0)
        return WEFT_OK;
    return weft__fail(WEFT_ESTATE, "%s: not inside weft_nccl_group_begin/_end", fn);
}

int weft_nccl_unique_id(weft_nccl_id *id)
{
    if (!id)
        return weft__fail(WEFT_EINVAL, "weft_nccl_unique_id: id is NULL");
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return nccl_fail("weft_nccl_unique_id", NULL, r);
    memcpy(id->bytes, u.internal, sizeof id->bytes);
    return WEFT_OK;
}

static weft_nccl_comm *comm_new(int device, int rank, int nranks)
{
    weft_nccl_comm *c = calloc(1, sizeof *c);
    if (c) {
        c->device = device;
        c->rank = rank;
        c->nranks = nranks;
        atomic_init(&c->aborted, false);
    }
    return c;
}

/* Abort and free comms[0..n) that NCCL may have started to make. */
static void discard(weft_nccl_comm **cs, unsigned n)
{
    int saved = -1;
    cudaError_t e = cudaGetDevice(&saved);
    for (unsigned i = 0; i < n; i++) {
        if (cs[i] && cs[i]->nc)
            ncclCommAbort(cs[i]->nc);
        free(cs[i]);
    }
    if (e == cudaSuccess)
        restore_device(saved);
}

int weft_nccl_comm_init_all(weft_runtime *rt, unsigned ndev, const unsigned *devices,
                            weft_nccl_comm **comms)
{
    static const char fn[] = "weft_nccl_comm_init_all";
    if (ndev == 0 || !devices || !comms)
        return weft__fail(WEFT_EINVAL, "%s: %s", fn,
                          ndev == 0  ? "ndev is 0"
                          : !devices ? "devices is NULL"
                                     : "comms is NULL");
    int rc = need_cuda(rt, fn);
    if (rc || (rc = group_idle(fn)))
        return rc;
    unsigned count = weft_device_count(rt);
    for (unsigned i = 0; i < ndev; i++) {
        if (devices[i] >= count)
            return weft__fail(WEFT_EINVAL, "%s: devices[%u] is %u; the runtime has %u GPU(s)", fn,
                              i, devices[i], count);
        for (unsigned j = 0; j < i; j++)
            if (devices[j] == devices[i])
                return weft__fail(WEFT_EINVAL, "%s: devices[%u] and devices[%u] are both %u", fn, j,
                                  i, devices[i]);
    }
    weft_nccl_comm **cs = calloc(ndev, sizeof *cs);
    if (!cs)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory", fn);
    for (unsigned i = 0; i < ndev; i++)
        if (!(cs[i] = comm_new((int)devices[i], (int)i, (int)ndev))) {
            discard(cs, ndev);
            free(cs);
            return weft__fail(WEFT_ENOMEM, "%s: out of memory", fn);
        }
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        rc = nccl_fail(fn, NULL, r);
        goto fail;
    }
    int saved;
    if ((rc = use_device(cs[0]->device, &saved, fn)))
        goto fail;
    /* One group over the ranks: each rank's init waits for the others. */
    r = ncclGroupStart();
    for (unsigned i = 0; i < ndev && (r == ncclSuccess || r == ncclInProgress); i++) {
        ncclConfig_t config = nonblocking_config();
        cudaError_t e = cudaSetDevice(cs[i]->device);
        if (e != cudaSuccess) {
            ncclGroupEnd();
            restore_device(saved);
            rc = cuda_fail(fn, "cudaSetDevice", e);
            goto fail;
        }
        r = ncclCommInitRankConfig(&cs[i]->nc, (int)ndev, id, (int)i, &config);
    }
    ncclResult_t end = ncclGroupEnd();
    restore_device(saved);
    if (r == ncclSuccess || r == ncclInProgress)
        r = end;
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_fail(fn, NULL, r);
        goto fail;
    }
    for (unsigned i = 0; i < ndev; i++)
        if ((rc = settle(cs[i], WEFT_FOREVER, fn)))
            goto fail;
    for (unsigned i = 0; i < ndev; i++)
        if ((rc = weft__nccl_watch_comm(fn))) {
            while (i-- > 0)
                weft__nccl_unwatch_comm(cs[i]);
            goto fail;
        }
    memcpy(comms, cs, ndev * sizeof *cs);
    free(cs);
    return WEFT_OK;
fail:
    discard(cs, ndev);
    free(cs);
    return rc;
}

int weft_nccl_comm_init_rank(weft_runtime *rt, unsigned device, int nranks, const weft_nccl_id *id,
                             int rank, uint64_t deadline_ns, weft_nccl_comm **comm)
{
    static const char fn[] = "weft_nccl_comm_init_rank";
    if (!id || !comm)
        return weft__fail(WEFT_EINVAL, "%s: %s is NULL", fn, id ? "comm" : "id");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return weft__fail(WEFT_EINVAL, "%s: rank %d of %d ranks is out of range", fn, rank, nranks);
    int rc = need_cuda(rt, fn);
    if (rc || (rc = group_idle(fn)))
        return rc;
    unsigned count = weft_device_count(rt);
    if (device >= count)
        return weft__fail(WEFT_EINVAL, "%s: device %u; the runtime has %u GPU(s)", fn, device,
                          count);
    weft_nccl_comm *c = comm_new((int)device, rank, nranks);
    if (!c)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory", fn);
    ncclUniqueId u;
    memcpy(u.internal, id->bytes, sizeof u.internal);
    int saved;
    if ((rc = use_device(c->device, &saved, fn))) {
        free(c);
        return rc;
    }
    ncclConfig_t config = nonblocking_config();
    ncclResult_t r = ncclCommInitRankConfig(&c->nc, nranks, u, rank, &config);
    restore_device(saved);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_fail(fn, NULL, r);
        discard(&c, 1);
        return rc;
    }
    /* Poll by hand rather than with settle: cancellation ends this wait. */
    uint64_t ns = NAP_MIN_NS;
    for (;;) {
        ncclResult_t state = ncclSuccess;
        if ((r = ncclCommGetAsyncError(c->nc, &state)) != ncclSuccess || state != ncclInProgress) {
            if (r == ncclSuccess && state == ncclSuccess)
                break;
            rc = nccl_fail(fn, c, r != ncclSuccess ? r : state);
        } else if (weft_cancelled()) {
            rc = weft__fail(WEFT_ECANCELED, "%s: the task was cancelled", fn);
        } else if (weft_now_ns() >= deadline_ns) {
            rc = weft__fail(WEFT_ETIMEDOUT,
                            "%s: rank %d of %d: not every rank joined by the deadline", fn, rank,
                            nranks);
        } else {
            nap(ns);
            ns = ns * 2 < NAP_MAX_NS ? ns * 2 : NAP_MAX_NS;
            continue;
        }
        discard(&c, 1);
        return rc;
    }
    if ((rc = weft__nccl_watch_comm(fn))) {
        discard(&c, 1);
        return rc;
    }
    *comm = c;
    return WEFT_OK;
}

int weft_nccl_comm_info(const weft_nccl_comm *comm, int *rank, int *nranks, unsigned *device)
{
    if (!comm)
        return weft__fail(WEFT_EINVAL, "weft_nccl_comm_info: comm is NULL");
    if (rank)
        *rank = comm->rank;
    if (nranks)
        *nranks = comm->nranks;
    if (device)
        *device = (unsigned)comm->device;
    return WEFT_OK;
}

static int live(const weft_nccl_comm *c, const char *fn)
{
    if (!c)
        return weft__fail(WEFT_EINVAL, "%s: comm is NULL", fn);
    if (atomic_load(&c->aborted))
        return weft__fail(WEFT_ESTATE, "%s: the communicator was aborted", fn);
    return WEFT_OK;
}

int weft_nccl_comm_check(weft_nccl_comm *comm)
{
    static const char fn[] = "weft_nccl_comm_check";
    int rc = live(comm, fn);
    if (rc)
        return rc;
    bool aborted = false;
    ncclResult_t r = weft__nccl_state(comm, &aborted);
    if (aborted)
        return live(comm, fn);
    return r == ncclSuccess || r == ncclInProgress ? WEFT_OK : nccl_fail(fn, comm, r);
}

int weft_nccl_comm_set_timeout(weft_nccl_comm *comm, uint64_t ns)
{
    int rc = live(comm, "weft_nccl_comm_set_timeout");
    if (rc == WEFT_OK)
        weft__nccl_set_timeout(comm, ns);
    return rc;
}

int weft_nccl_comm_abort(weft_nccl_comm *comm)
{
    if (!comm)
        return weft__fail(WEFT_EINVAL, "weft_nccl_comm_abort: comm is NULL");
    ncclResult_t r = ncclSuccess;
    if (!weft__nccl_abort(comm, WEFT_EDEVICE, "weft_nccl_comm_abort was called", &r))
        return weft__fail(WEFT_ESTATE, "weft_nccl_comm_abort: the communicator was aborted");
    return r == ncclSuccess ? WEFT_OK : nccl_fail("weft_nccl_comm_abort", NULL, r);
}

int weft_nccl_comm_destroy(weft_nccl_comm *comm)
{
    static const char fn[] = "weft_nccl_comm_destroy";
    if (!comm)
        return WEFT_OK;
    int rc = WEFT_OK, saved = -1;
    if (!weft__nccl_close(comm) && (rc = use_device(comm->device, &saved, fn)) == WEFT_OK) {
        ncclResult_t r = ncclCommFinalize(comm->nc);
        if (r == ncclSuccess || r == ncclInProgress)
            rc = settle(comm, WEFT_FOREVER, fn);
        else
            rc = nccl_fail(fn, comm, r);
        r = rc == WEFT_OK ? ncclCommDestroy(comm->nc) : ncclCommAbort(comm->nc);
        if (rc == WEFT_OK && r != ncclSuccess)
            rc = nccl_fail(fn, NULL, r);
        restore_device(saved);
    }
    weft__nccl_unwatch_comm(comm);
    free(comm);
    return rc;
}

/* ---- argument checks ---------------------------------------------------- */

static bool dtype_of(weft_dtype dtype, ncclDataType_t *type, size_t *size)
{
    switch (dtype) {
    case WEFT_DTYPE_F32:
        *type = ncclFloat32, *size = 4;
        return true;
    case WEFT_DTYPE_BF16:
        *type = ncclBfloat16, *size = 2;
        return true;
    case WEFT_DTYPE_F16:
        *type = ncclFloat16, *size = 2;
        return true;
    case WEFT_DTYPE_F8_E4M3:
        *type = ncclFloat8e4m3, *size = 1;
        return true;
    case WEFT_DTYPE_F8_E5M2:
        *type = ncclFloat8e5m2, *size = 1;
        return true;
    case WEFT_DTYPE_I8:
        *type = ncclInt8, *size = 1;
        return true;
    case WEFT_DTYPE_I32:
        *type = ncclInt32, *size = 4;
        return true;
    }
    return false;
}

static bool op_of(weft_nccl_op op, ncclRedOp_t *red)
{
    switch (op) {
    case WEFT_NCCL_SUM:
        *red = ncclSum;
        return true;
    case WEFT_NCCL_PROD:
        *red = ncclProd;
        return true;
    case WEFT_NCCL_MAX:
        *red = ncclMax;
        return true;
    case WEFT_NCCL_MIN:
        *red = ncclMin;
        return true;
    case WEFT_NCCL_AVG:
        *red = ncclAvg;
        return true;
    }
    return false;
}

/* One call's checked arguments and the stream to enqueue on. */
typedef struct call {
    const char *fn;
    ncclDataType_t type;
    size_t esize;
    ncclRedOp_t red;
    cudaStream_t stream;
} call;

/* The checks that need no communicator: task only, then the arguments. */
static int check_args(call *k, const void *a, const char *a_name, const void *b, const char *b_name,
                      weft_dtype dtype, const weft_nccl_op *op)
{
    if (!weft_task_current())
        return weft__fail(WEFT_ENOTASK, "%s: task only", k->fn);
    if ((a_name && !a) || (b_name && !b))
        return weft__fail(WEFT_EINVAL, "%s: %s is NULL", k->fn, a_name && !a ? a_name : b_name);
    if (!dtype_of(dtype, &k->type, &k->esize))
        return weft__fail(WEFT_EINVAL, "%s: dtype %d is not a weft_dtype", k->fn, (int)dtype);
    if (op && !op_of(*op, &k->red))
        return weft__fail(WEFT_EINVAL, "%s: op %d is not a weft_nccl_op", k->fn, (int)*op);
    return WEFT_OK;
}

/* The checks against the communicator and the task's stream. */
static int check_comm(call *k, weft_nccl_comm *c)
{
    int rc = need_cuda(weft_runtime_current(), k->fn);
    if (rc || (rc = live(c, k->fn)))
        return rc;
    if (group.depth > 0 && group.owner != weft_task_current())
        return weft__fail(WEFT_ESTATE, "%s: another task's NCCL group is open on this thread",
                          k->fn);
    void *s = NULL;
    if ((rc = weft_stream(&s)))
        return rc;
    if (!s)
        return need_cuda(NULL, k->fn);
    int dev = -1;
    cudaError_t e = cudaStreamGetDevice((cudaStream_t)s, &dev);
    if (e != cudaSuccess)
        return cuda_fail(k->fn, "cudaStreamGetDevice", e);
    if (dev != c->device)
        return weft__fail(WEFT_EINVAL,
                          "%s: the communicator is on GPU %d, the task's stream on GPU %d "
                          "(spawn with WEFT_DEVICE(%d))",
                          k->fn, c->device, dev, c->device);
    k->stream = (cudaStream_t)s;
    /* One rank's average is its sum, and NCCL before 2.29.7 leaves the
     * last count % blocks elements of a one-rank average unwritten (its
     * issue 1950): ask for the sum, which takes another path. */
    if (c->nranks == 1 && k->red == ncclAvg)
        k->red = ncclSum;
    return WEFT_OK;
}

/* count * mult elements of k's dtype in bytes, if that fits. */
static int bytes_of(const call *k, size_t count, size_t mult, size_t *bytes)
{
    if (mult != 0 && count > SIZE_MAX / mult / k->esize)
        return weft__fail(WEFT_EINVAL, "%s: count %zu does not fit in memory", k->fn, count);
    *bytes = count * mult * k->esize;
    return WEFT_OK;
}

/* [a, a + na) and [b, b + nb) must not overlap, unless a == same_a_at
 * (the call's in-place form). */
static int check_overlap(const call *k, const void *a, size_t na, const void *b, size_t nb,
                         const void *in_place_a)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (na == 0 || nb == 0 || a == in_place_a || x + na <= y || y + nb <= x)
        return WEFT_OK;
    return weft__fail(WEFT_EINVAL, "%s: send and recv overlap, and not as the call's in-place form",
                      k->fn);
}

/* p (n bytes) must be memory the communicator's GPU reaches: its own
 * device memory, managed or registered host memory. */
static int check_memory(const call *k, const weft_nccl_comm *c, const void *p, const char *name)
{
    struct cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, p);
    if (e != cudaSuccess)
        return cuda_fail(k->fn, "cudaPointerGetAttributes", e);
    if (at.type == cudaMemoryTypeUnregistered)
        return weft__fail(WEFT_EINVAL, "%s: %s is not GPU memory (pageable host memory)", k->fn,
                          name);
    if (at.type == cudaMemoryTypeDevice && at.device != c->device)
        return weft__fail(WEFT_EINVAL, "%s: %s is memory of GPU %d; the communicator's is %d",
                          k->fn, name, at.device, c->device);
    return WEFT_OK;
}

static int check_rank(const call *k, const weft_nccl_comm *c, int r, const char *name)
{
    if (r >= 0 && r < c->nranks)
        return WEFT_OK;
    return weft__fail(WEFT_EINVAL, "%s: %s %d is outside [0, %d)", k->fn, name, r, c->nranks);
}

/* ---- enqueueing --------------------------------------------------------- */

/* Remember c as used by the open group. */
static int group_note(const call *k, weft_nccl_comm *c)
{
    for (size_t i = 0; i < group.n; i++)
        if (group.comms[i] == c)
            return WEFT_OK;
    if (group.n == group.cap) {
        size_t cap = group.cap ? group.cap * 2 : 8;
        weft_nccl_comm **cs = realloc(group.comms, cap * sizeof *cs);
        if (!cs)
            return weft__fail(WEFT_ENOMEM, "%s: out of memory", k->fn);
        group.comms = cs;
        group.cap = cap;
    }
    group.comms[group.n++] = c;
    return WEFT_OK;
}

/* The NCCL call's result r (made with c's GPU current) into weft's: in a
 * group nothing is launched yet; outside, an operation in progress is
 * waited for until it is on the stream. */
static int enqueued(const call *k, weft_nccl_comm *c, ncclResult_t r)
{
    if (r != ncclSuccess && r != ncclInProgress)
        return nccl_fail(k->fn, c, r);
    if (group.depth > 0)
        return WEFT_OK; /* group_end follows what it launches */
    int rc = r == ncclInProgress ? settle(c, WEFT_FOREVER, k->fn) : WEFT_OK;
    return rc ? rc : weft__nccl_watch_op(c, k->stream, k->fn);
}

/* Make c's GPU current around an NCCL call; note c in an open group. */
static int begin_call(const call *k, weft_nccl_comm *c, int *saved)
{
    int rc = group.depth > 0 ? group_note(k, c) : WEFT_OK;
    return rc ? rc : use_device(c->device, saved, k->fn);
}

int weft_nccl_all_reduce(weft_nccl_comm *comm, const void *send, void *recv, size_t count,
                         weft_dtype dtype, weft_nccl_op op)
{
    call k = {.fn = "weft_nccl_all_reduce"};
    size_t n = 0;
    int saved, rc = check_args(&k, send, "send", recv, "recv", dtype, &op);
    if (rc || (rc = check_comm(&k, comm)) || (rc = bytes_of(&k, count, 1, &n)) ||
        (rc = check_overlap(&k, send, n, recv, n, recv)) ||
        (rc = check_memory(&k, comm, send, "send")) ||
        (rc = check_memory(&k, comm, recv, "recv")) || (rc = begin_call(&k, comm, &saved)))
        return rc;
    ncclResult_t r = ncclAllReduce(send, recv, count, k.type, k.red, comm->nc, k.stream);
    restore_device(saved);
    return enqueued(&k, comm, r);
}

int weft_nccl_all_gather(weft_nccl_comm *comm, const void *send, void *recv, size_t count,
                         weft_dtype dtype)
{
    call k = {.fn = "weft_nccl_all_gather"};
    size_t n = 0, all = 0;
    int saved, rc = check_args(&k, send, "send", recv, "recv", dtype, NULL);
    if (rc || (rc = check_comm(&k, comm)) || (rc = bytes_of(&k, count, 1, &n)) ||
        (rc = bytes_of(&k, count, (size_t)comm->nranks, &all)) ||
        (rc = check_overlap(&k, send, n, recv, all, (const char *)recv + (size_t)comm->rank * n)) ||
        (rc = check_memory(&k, comm, send, "send")) ||
        (rc = check_memory(&k, comm, recv, "recv")) || (rc = begin_call(&k, comm, &saved)))
        return rc;
    ncclResult_t r = ncclAllGather(send, recv, count, k.type, comm->nc, k.stream);
    restore_device(saved);
    return enqueued(&k, comm, r);
}

int weft_nccl_reduce_scatter(weft_nccl_comm *comm, const void *send, void *recv, size_t count,
                             weft_dtype dtype, weft_nccl_op op)
{
    call k = {.fn = "weft_nccl_reduce_scatter"};
    size_t n = 0, all = 0;
    int saved, rc = check_args(&k, send, "send", recv, "recv", dtype, &op);
    if (rc || (rc = check_comm(&k, comm)) || (rc = bytes_of(&k, count, 1, &n)) ||
        (rc = bytes_of(&k, count, (size_t)comm->nranks, &all)) ||
        (rc = check_overlap(&k, recv, n, send, all, (const char *)send + (size_t)comm->rank * n)) ||
        (rc = check_memory(&k, comm, send, "send")) ||
        (rc = check_memory(&k, comm, recv, "recv")) || (rc = begin_call(&k, comm, &saved)))
        return rc;
    ncclResult_t r = ncclReduceScatter(send, recv, count, k.type, k.red, comm->nc, k.stream);
    restore_device(saved);
    return enqueued(&k, comm, r);
}

int weft_nccl_broadcast(weft_nccl_comm *comm, const void *send, void *recv, size_t count,
                        weft_dtype dtype, int root)
{
    call k = {.fn = "weft_nccl_broadcast"};
    size_t n = 0;
    int saved, rc = check_args(&k, NULL, NULL, recv, "recv", dtype, NULL);
    if (rc || (rc = check_comm(&k, comm)) || (rc = check_rank(&k, comm, root, "root")) ||
        (rc = bytes_of(&k, count, 1, &n)))
        return rc;
    bool is_root = comm->rank == root;
    if (is_root && !send)
        return weft__fail(WEFT_EINVAL, "%s: send is NULL on the root", k.fn);
    if ((is_root && ((rc = check_overlap(&k, send, n, recv, n, recv)) ||
                     (rc = check_memory(&k, comm, send, "send")))) ||
        (rc = check_memory(&k, comm, recv, "recv")) || (rc = begin_call(&k, comm, &saved)))
        return rc;
    ncclResult_t r =
        ncclBroadcast(is_root ? send : recv, recv, count, k.type, root, comm->nc, k.stream);
    restore_device(saved);
    return enqueued(&k, comm, r);
}

int weft_nccl_send(weft_nccl_comm *comm, const void *buf, size_t count, weft_dtype dtype, int peer)
{
    call k = {.fn = "weft_nccl_send"};
    size_t n = 0;
    int saved, rc = check_args(&k, buf, "buf", NULL, NULL, dtype, NULL);
    if (rc || (rc = check_comm(&k, comm)) || (rc = check_rank(&k, comm, peer, "peer")) ||
        (rc = bytes_of(&k, count, 1, &n)) || (rc = check_memory(&k, comm, buf, "buf")) ||
        (rc = begin_call(&k, comm, &saved)))
        return rc;
    ncclResult_t r = ncclSend(buf, count, k.type, peer, comm->nc, k.stream);
    restore_device(saved);
    return enqueued(&k, comm, r);
}

int weft_nccl_recv(weft_nccl_comm *comm, void *buf, size_t count, weft_dtype dtype, int peer)
{
    call k = {.fn = "weft_nccl_recv"};
    size_t n = 0;
    int saved, rc = check_args(&k, buf, "buf", NULL, NULL, dtype, NULL);
    if (rc || (rc = check_comm(&k, comm)) || (rc = check_rank(&k, comm, peer, "peer")) ||
        (rc = bytes_of(&k, count, 1, &n)) || (rc = check_memory(&k, comm, buf, "buf")) ||
        (rc = begin_call(&k, comm, &saved)))
        return rc;
    ncclResult_t r = ncclRecv(buf, count, k.type, peer, comm->nc, k.stream);
    restore_device(saved);
    return enqueued(&k, comm, r);
}

/* ---- groups ------------------------------------------------------------- */

int weft_nccl_group_begin(void)
{
    static const char fn[] = "weft_nccl_group_begin";
    weft_task *self = weft_task_current();
    if (!self)
        return weft__fail(WEFT_ENOTASK, "%s: task only", fn);
    int rc = need_cuda(weft_runtime_current(), fn);
    if (rc)
        return rc;
    if (group.depth > 0 && group.owner != self)
        return weft__fail(WEFT_ESTATE, "%s: another task's NCCL group is open on this thread", fn);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
        return nccl_fail(fn, NULL, r);
    if (group.depth++ == 0)
        group.owner = self;
    return WEFT_OK;
}

int weft_nccl_group_end(void)
{
    static const char fn[] = "weft_nccl_group_end";
    weft_task *self = weft_task_current();
    if (!self)
        return weft__fail(WEFT_ENOTASK, "%s: task only", fn);
    if (group.depth == 0)
        return weft__fail(WEFT_ESTATE, "%s: no group is open (weft_nccl_group_begin)", fn);
    if (group.owner != self)
        return weft__fail(WEFT_ESTATE, "%s: another task's NCCL group is open on this thread", fn);
    int saved;
    cudaError_t e = cudaGetDevice(&saved);
    ncclResult_t r = ncclGroupEnd();
    if (e == cudaSuccess)
        restore_device(saved);
    if (--group.depth > 0)
        return r == ncclSuccess || r == ncclInProgress ? WEFT_OK : nccl_fail(fn, NULL, r);
    /* The outermost end launched the group: take its communicators (a
     * settle below may suspend, and the thread may then run another task's
     * group) and wait until NCCL has put every one's work on its stream. */
    weft_nccl_comm **cs = group.comms;
    size_t n = group.n;
    group.comms = NULL;
    group.n = group.cap = 0;
    group.owner = NULL;
    int rc = WEFT_OK;
    if (r != ncclSuccess && r != ncclInProgress)
        rc = nccl_fail(fn, n ? cs[0] : NULL, r);
    for (size_t i = 0; i < n && rc == WEFT_OK; i++)
        if (r == ncclInProgress)
            rc = settle(cs[i], WEFT_FOREVER, fn);
    void *stream = NULL;
    if (rc == WEFT_OK && n > 0)
        rc = weft_stream(&stream);
    for (size_t i = 0; i < n && rc == WEFT_OK; i++)
        rc = weft__nccl_watch_op(cs[i], (cudaStream_t)stream, fn);
    free(cs);
    return rc;
}

/* ---- waiting with a bound ----------------------------------------------- */

int weft_nccl_await(weft_nccl_comm *comm, uint64_t deadline_ns)
{
    static const char fn[] = "weft_nccl_await";
    if (!weft_task_current())
        return weft__fail(WEFT_ENOTASK, "%s: task only", fn);
    int rc = live(comm, fn);
    if (rc)
        return rc;
    weft_event *ev = NULL;
    if ((rc = weft_event_record(&ev)))
        return rc;
    /* The watcher aborts comm on NCCL's errors (the collectives then end,
     * and weft_await reports them); the deadline is this call's own. */
    rc = weft_event_await_until(ev, deadline_ns);
    if (rc != WEFT_ETIMEDOUT) {
        weft_event_destroy(ev);
        return rc == WEFT_OK ? weft_await() : rc;
    }
    weft__nccl_abort(comm, WEFT_ETIMEDOUT, "weft_nccl_await's deadline passed", NULL);
    int drained = weft_event_await_until(ev, weft_deadline_in_ns(ABORT_DRAIN_NS));
    weft_event_destroy(ev);
    if (drained != WEFT_OK)
        return weft__fail(WEFT_ETIMEDOUT,
                          "%s: the deadline passed; communicator aborted, the stream still busy",
                          fn);
    rc = weft_await(); /* the aborted collectives' verdicts, or the device's */
    return rc ? rc
              : weft__fail(WEFT_ETIMEDOUT, "%s: the deadline passed; communicator aborted", fn);
}
