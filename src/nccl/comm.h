/*
 * comm.h - libweft_nccl's communicator, shared by nccl.c (the calls) and
 * watch.c (the watcher that fails tasks whose collectives cannot end).
 */
#ifndef WEFT_NCCL_COMM_H
#define WEFT_NCCL_COMM_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weft/nccl.h"

struct weft_nccl_comm {
    ncclComm_t nc;
    int device, rank, nranks;
    atomic_bool aborted; /* nc is gone: only destroy may follow */
    /* the watcher's, under its lock (watch.c) */
    uint64_t timeout_ns; /* an operation in flight longer aborts it; 0: never */
    unsigned polled;     /* the watcher's pass that last polled it */
    bool aborting;       /* ncclCommAbort is running: keep the memory */
    bool closing;        /* being destroyed: no longer polled or aborted here */
};

/* ---- the watcher (watch.c) ---------------------------------------------- */
/*
 * A thread of libweft_nccl's own, running while any communicator exists,
 * follows every collective a task enqueues (an event recorded after it)
 * until it ends. Meanwhile it polls each busy communicator's asynchronous
 * error and the age of its oldest operation: on an error, or past the
 * communicator's timeout, it aborts the communicator, which ends the
 * collectives' work on the GPU, and each task whose collective had not
 * ended gets the cause from its next weft_await (device/await_check.h):
 * WEFT_EDEVICE with NCCL's text, or WEFT_ETIMEDOUT.
 */

/* One more communicator exists (the first starts the thread). fn names
 * the caller in an error. */
int weft__nccl_watch_comm(const char *fn);

/* c is about to be finalized: from now on the watcher neither polls nor
 * aborts it. Returns whether it was aborted already (that abort has then
 * returned). */
bool weft__nccl_close(weft_nccl_comm *c);

/* c is going (finalized, or aborted): its operations are no longer
 * followed (one that has not ended fails at its task's await); the last
 * communicator stops the thread. */
void weft__nccl_unwatch_comm(weft_nccl_comm *c);

/* The calling task has just enqueued an operation of c on stream (with
 * c's GPU current): follow it. Nothing is followed on a stream being
 * captured (a graph region's), whose work has not yet run. */
int weft__nccl_watch_op(weft_nccl_comm *c, cudaStream_t stream, const char *fn);

/* Abort c (ncclCommAbort) if nobody has yet: its operations in flight fail
 * with code and the text "cause" at their tasks' awaits; *result (may be
 * NULL) receives ncclCommAbort's. Returns false if c was aborted already. */
bool weft__nccl_abort(weft_nccl_comm *c, int code, const char *cause, ncclResult_t *result);

/* c's timeout (0: none), as the watcher reads it. */
void weft__nccl_set_timeout(weft_nccl_comm *c, uint64_t ns);

/* ncclCommGetAsyncError of c, never racing its abort: ncclSuccess, or
 * NCCL's error (ncclInProgress while NCCL sets something up);
 * ncclInvalidUsage once c was aborted (*aborted then true). */
ncclResult_t weft__nccl_state(weft_nccl_comm *c, bool *aborted);

#endif
