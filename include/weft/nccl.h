/*
 * weft/nccl.h - NCCL collectives enqueued by tasks on their own streams.
 *
 * A task calls a collective on a communicator of its GPU; the call enqueues
 * NCCL's work on the task's stream (weft_stream) and returns. The result is
 * ready after weft_await, as with any of the task's work, so a task reads as
 * sequential code while its collective overlaps other tasks' compute:
 *
 *     weft_nccl_all_reduce(comm, grad, grad, n, WEFT_DTYPE_F32, WEFT_NCCL_SUM);
 *     weft_await();   // grad now holds the sum over the ranks
 *
 * The library is libweft_nccl (CMake target weft_nccl) beside libweft, which
 * itself never depends on NCCL. It is built with the CUDA backend where NCCL
 * is found.
 *
 * Conventions, beyond weft.h's:
 *  - Communicators are NCCL's non-blocking ones (ncclConfig_t.blocking = 0):
 *    no call here waits inside NCCL. Where NCCL answers "in progress" (a
 *    communicator's creation, an operation's first connection to a peer, a
 *    group's end), the call polls the communicator's state, napping in
 *    between (a task suspends; a thread sleeps), until NCCL has finished
 *    setting it up: when a collective returns WEFT_OK its work is on the
 *    task's stream.
 *  - One rank per communicator handle, on one GPU: device i is rt's device
 *    i, the CUDA ordinal i (WEFT_DEVICE(i) in weft_task_opts).
 *  - The collectives, send/recv and the group calls are task only: outside
 *    a task they return WEFT_ENOTASK. The task's stream must be on the
 *    communicator's GPU (spawn it with .device = WEFT_DEVICE(device)),
 *    else WEFT_EINVAL before anything is enqueued.
 *  - NCCL needs the CUDA backend. On a runtime of the host backend, every
 *    call whose arguments are otherwise valid returns WEFT_EINVAL saying
 *    so; nothing is enqueued.
 *  - Bad arguments return WEFT_EINVAL, saying which, before anything is
 *    enqueued: a NULL buffer, a dtype or op out of range, a root or peer
 *    outside [0, nranks), a count whose bytes do not fit a size_t, buffers
 *    that overlap other than as the call's in-place form, a buffer that is
 *    not GPU memory (pageable host memory) or is another GPU's. A count of
 *    0 is valid and moves nothing. A communicator aborted is refused with
 *    WEFT_ESTATE.
 *  - dtypes: every weft_dtype: F32, BF16, F16, F8_E4M3, F8_E5M2, I8, I32.
 *    NCCL reduces FP8 only on GPUs from Hopper on (and refuses it on older
 *    ones: WEFT_EINVAL with NCCL's message).
 *  - Errors NCCL reports become weft codes with NCCL's own text in the
 *    message (weft_last_error): invalid argument or usage WEFT_EINVAL,
 *    anything else (CUDA, system, internal, a remote peer) WEFT_EDEVICE.
 *  - Order: as with NCCL, every rank must issue the same collectives on a
 *    communicator in the same order, and one communicator must not be used
 *    by two tasks at once.
 *  - A dead peer fails tasks; it does not hang them. A watcher thread
 *    (running while any communicator exists) follows each collective until
 *    it ends, polling the busy communicators' asynchronous errors every
 *    0.1 to 2 ms. On an error (a peer that died, a network failure) or
 *    when an operation has been in flight longer than the communicator's
 *    timeout (weft_nccl_comm_set_timeout; none by default), it aborts the
 *    communicator, which ends its collectives' work on the GPU, and every
 *    task whose collective had not ended gets the cause from its next
 *    weft_await (and its join): WEFT_EDEVICE with NCCL's text, or
 *    WEFT_ETIMEDOUT. Their buffers' contents are then undefined, and the
 *    communicator takes no more work (WEFT_ESTATE) but its destroy.
 *    Collectives recorded inside a graph region are not followed (they run
 *    at the graph's launch); weft_nccl_await bounds those too.
 */
#ifndef WEFT_NCCL_H
#define WEFT_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "weft.h"
#include "weft/ops.h" /* weft_dtype */

#ifdef __cplusplus
extern "C" {
#endif

/* One rank of a communicator, on one GPU. */
typedef struct weft_nccl_comm weft_nccl_comm;

/* A communicator's identity, as ncclUniqueId: made by one rank
 * (weft_nccl_unique_id) and carried to the others by any means (an
 * MPI_Bcast of its bytes, a file, a socket). */
typedef struct weft_nccl_id {
    char bytes[128];
} weft_nccl_id;

/* Reductions, as NCCL's ncclRedOp_t. AVG is the sum divided by the number
 * of ranks (for integers, rounded towards zero). */
typedef enum weft_nccl_op {
    WEFT_NCCL_SUM = 0,
    WEFT_NCCL_PROD = 1,
    WEFT_NCCL_MAX = 2,
    WEFT_NCCL_MIN = 3,
    WEFT_NCCL_AVG = 4
} weft_nccl_op;

/* ---- communicators ----------------------------------------------------- */

/* Make a new identity for a communicator (ncclGetUniqueId): one rank calls
 * it and gives the bytes to the others. Works from tasks and threads, with
 * no runtime. WEFT_EINVAL: id NULL; WEFT_EDEVICE: NCCL failed. */
int weft_nccl_unique_id(weft_nccl_id *id);

/* One communicator over ndev GPUs of rt, all in this process: comms[i] is
 * rank i, on rt's device devices[i]. The devices must be distinct and below
 * weft_device_count(rt); comms has room for ndev handles. On failure no
 * communicator is left (comms untouched). WEFT_EINVAL: ndev 0, NULL arrays,
 * a device out of range or repeated, rt not of the CUDA backend.
 * Waits (a task suspends) until NCCL has set every rank up. Must not be
 * called between weft_nccl_group_begin and _end (WEFT_ESTATE). */
int weft_nccl_comm_init_all(weft_runtime *rt, unsigned ndev, const unsigned *devices,
                            weft_nccl_comm **comms);

/* Rank `rank` of a communicator of nranks ranks across processes (or
 * threads), on rt's device `device`, joining the ranks that were given the
 * same id. Waits (a task suspends) until every rank has joined, or until
 * deadline_ns (weft_now_ns's clock; WEFT_FOREVER: no limit): then the
 * half-made communicator is aborted and the call returns WEFT_ETIMEDOUT.
 * A cancelled task's call aborts it too and returns WEFT_ECANCELED.
 * WEFT_EINVAL: id or comm NULL, nranks < 1, rank outside [0, nranks), a
 * device out of range, rt not of the CUDA backend. */
int weft_nccl_comm_init_rank(weft_runtime *rt, unsigned device, int nranks, const weft_nccl_id *id,
                             int rank, uint64_t deadline_ns, weft_nccl_comm **comm);

/* comm's rank, its number of ranks and its device (each pointer may be
 * NULL). WEFT_EINVAL: comm NULL. */
int weft_nccl_comm_info(const weft_nccl_comm *comm, int *rank, int *nranks, unsigned *device);

/* NCCL's asynchronous error of comm (ncclCommGetAsyncError), never waiting:
 * WEFT_OK when there is none (also while NCCL still sets something up),
 * else the error as a weft code with NCCL's text. WEFT_ESTATE once comm was
 * aborted. Does not abort comm. */
int weft_nccl_comm_check(weft_nccl_comm *comm);

/* Abort comm by itself when one of its operations has been in flight (from
 * its enqueue, so time queued behind the stream's earlier work counts) for
 * longer than ns; 0 (the default) never. The tasks whose collectives had
 * not ended get WEFT_ETIMEDOUT from their weft_await. Choose ns well above
 * the slowest collective: an abort cannot be undone. WEFT_ESTATE once comm
 * was aborted. */
int weft_nccl_comm_set_timeout(weft_nccl_comm *comm, uint64_t ns);

/* Abort comm (ncclCommAbort): its operations in flight end on the GPU
 * (their results are undefined; their tasks' weft_await returns
 * WEFT_EDEVICE) and NCCL frees it. Every later call with
 * comm returns WEFT_ESTATE, but weft_nccl_comm_destroy, which frees the
 * handle. Aborting twice returns WEFT_ESTATE. */
int weft_nccl_comm_abort(weft_nccl_comm *comm);

/* Free comm. A live one is finalized first (ncclCommFinalize: its
 * operations in flight complete), waiting (a task suspends) while NCCL
 * reports no error; on an error it is aborted instead. So a communicator
 * whose peer hangs without an error must be aborted first. NULL: no-op. */
int weft_nccl_comm_destroy(weft_nccl_comm *comm);

/* ---- collectives (task only) ------------------------------------------- */
/*
 * Each enqueues on the calling task's stream and returns; the buffers are
 * device memory of the communicator's GPU (or managed memory), count
 * elements of dtype, and must stay valid until the task has awaited.
 */

/* recv[i] = op over the ranks of send[i], for i < count. In place:
 * send == recv. */
int weft_nccl_all_reduce(weft_nccl_comm *comm, const void *send, void *recv, size_t count,
                         weft_dtype dtype, weft_nccl_op op);

/* recv (count * nranks elements) receives each rank's send (count
 * elements), rank r's at offset r * count. In place: send == recv + rank *
 * count elements. */
int weft_nccl_all_gather(weft_nccl_comm *comm, const void *send, void *recv, size_t count,
                         weft_dtype dtype);

/* send holds count * nranks elements; rank r's recv (count elements)
 * receives op over the ranks of their send's block r (elements r * count
 * to r * count + count - 1). In place: recv == send + rank * count
 * elements. */
int weft_nccl_reduce_scatter(weft_nccl_comm *comm, const void *send, void *recv, size_t count,
                             weft_dtype dtype, weft_nccl_op op);

/* recv on every rank receives root's send (count elements). send is read on
 * root only (elsewhere it may be NULL). In place: send == recv. */
int weft_nccl_broadcast(weft_nccl_comm *comm, const void *send, void *recv, size_t count,
                        weft_dtype dtype, int root);

/* Point to point: send count elements to rank peer, which receives them
 * with a matching weft_nccl_recv (same count and dtype). A rank may be its
 * own peer. A send and its receive must be enqueued together, between
 * weft_nccl_group_begin and _end, unless the peers' tasks run at once. */
int weft_nccl_send(weft_nccl_comm *comm, const void *buf, size_t count, weft_dtype dtype, int peer);
int weft_nccl_recv(weft_nccl_comm *comm, void *buf, size_t count, weft_dtype dtype, int peer);

/* Group the calls between begin and end into one NCCL launch
 * (ncclGroupStart/End): sends and receives that depend on each other,
 * several collectives, or the ranks of several communicators of one task.
 * Groups nest; the outermost end launches. Between begin and end the task
 * must not suspend (no weft_await, join, sleep or other wait: NCCL's group
 * belongs to the thread the task runs on) and the calls enqueue nothing
 * yet: their errors of argument still return at once. end returns
 * WEFT_OK when the group's work is on the stream. WEFT_ESTATE: end without
 * begin, or a group of another task open on this thread. */
int weft_nccl_group_begin(void);
int weft_nccl_group_end(void);

/* ---- waiting with a bound --------------------------------------------- */

/* Suspend until everything the calling task has enqueued has completed, as
 * weft_await does (with the watcher's verdicts: an error NCCL reports
 * aborts comm and returns WEFT_EDEVICE with NCCL's text); when deadline_ns
 * (weft_now_ns's clock) passes first, comm is aborted and the call returns
 * WEFT_ETIMEDOUT. Either way the aborted collective's work
 * ends on the GPU: the call then waits up to 10 s more for the task's
 * stream to drain, and says in the message if it did not (the buffers may
 * then still be in use). On WEFT_OK the task's work has completed, as after
 * weft_await. Task only; WEFT_EINVAL: comm NULL; WEFT_ESTATE: comm
 * aborted, or inside a graph region. */
int weft_nccl_await(weft_nccl_comm *comm, uint64_t deadline_ns);

#ifdef __cplusplus
}
#endif

#endif
