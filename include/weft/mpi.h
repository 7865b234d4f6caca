/*
 * weft/mpi.h - MPI requests awaited by tasks: a rank's code reads as
 * sequential while MPI progresses in the background.
 *
 * One weft runtime per rank; MPI moves the data. A task starts a
 * nonblocking operation (MPI_Isend, MPI_Irecv, a nonblocking collective)
 * and awaits its request: the task suspends and its worker runs other
 * tasks. Idle workers test the awaited requests (MPI_Testsome over all of
 * them at once) and resume the tasks whose requests completed; while every
 * worker would otherwise sleep, one of them keeps testing on a timeout that
 * grows with the wait, a sixteenth of it (20 us to 1 ms).
 * With no request awaited nothing calls MPI and no core spins.
 *
 * The library is libweft_mpi (CMake: weft::weft_mpi; pkg-config: weft-mpi)
 * beside libweft, which itself never depends on MPI.
 *
 * Conventions, beyond weft.h's:
 *  - MPI must be initialised with MPI_THREAD_MULTIPLE: any worker may test
 *    the requests while tasks on other workers make MPI calls.
 *  - From a task, the runtime must have been set up with weft_mpi_init.
 *    From a plain thread (not a task) the awaits block the thread, testing
 *    the requests itself; no runtime is needed.
 *  - Requests are those of the MPI library the program runs with: active
 *    ones, persistent ones started or not, and MPI_REQUEST_NULL (which is
 *    complete at once, with an empty status). A request completes as
 *    MPI_Test would complete it: a nonpersistent one is freed and set to
 *    MPI_REQUEST_NULL, its status written unless MPI_STATUS(ES)_IGNORE.
 *    Another task or thread must not test, wait for or free a request
 *    while it is awaited.
 *  - Errors: WEFT_EINVAL for bad arguments (with a message saying which),
 *    before any request is touched. WEFT_EDEVICE when MPI reported an error
 *    for a request (the communicator's error handler must be
 *    MPI_ERRORS_RETURN for MPI to report one rather than abort): the
 *    message names the error (MPI_Error_string) and the request; the
 *    other requests still complete (an await waits for all of them),
 *    and the one that failed is as MPI left it.
 *  - Timed waits (the _until forms) take a deadline on weft_now_ns's clock,
 *    as weft.h says. On WEFT_ETIMEDOUT the requests that had not completed
 *    are left active, as they were: await them again, or cancel them; those
 *    that had completed are complete (MPI_REQUEST_NULL, status written).
 *  - Cancellation: a cancelled task's await returns WEFT_ECANCELED after
 *    cancelling (MPI_Cancel) each of its requests not yet complete and then
 *    waiting, not cancellably, for them to complete - most often as
 *    cancelled (MPI_Test_cancelled on the status says which), else
 *    normally. Then no request still points into the task's buffers when
 *    it unwinds. Open MPI cancels receives but not sends: a send still
 *    waits for its receiver then. The deadline of an _until form still
 *    bounds that wait; when it passes first the call returns
 *    WEFT_ETIMEDOUT with those requests left cancelled but active.
 */
#ifndef WEFT_MPI_H
#define WEFT_MPI_H

#include <mpi.h>
#include <stdint.h>

#include "weft.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Let rt's tasks await MPI requests: rt's idle workers become the progress
 * engine. MPI must have been initialised (MPI_Init_thread) with
 * MPI_THREAD_MULTIPLE: else WEFT_EINVAL, saying what MPI provides. Calling
 * it again is harmless. No MPI call is made while no request is awaited, so
 * MPI may be finalised before rt is destroyed once the awaits are over. */
int weft_mpi_init(weft_runtime *rt);

/* Wait until *req completes; status (or MPI_STATUS_IGNORE) receives its
 * status. A task suspends; a thread blocks. WEFT_OK, WEFT_EINVAL (req
 * NULL; from a task, a runtime without weft_mpi_init), WEFT_EDEVICE,
 * WEFT_ECANCELED (see the top of this file), WEFT_ESTATE (a task inside a
 * graph region, which may not suspend), WEFT_ENOMEM. */
int weft_mpi_await(MPI_Request *req, MPI_Status *status);

/* weft_mpi_await until deadline_ns: WEFT_ETIMEDOUT if the request has not
 * completed by then (it is then still active). */
int weft_mpi_await_until(MPI_Request *req, MPI_Status *status, uint64_t deadline_ns);

/* Wait until every one of the n requests reqs[0..n-1] completes, in any
 * order; statuses[i] (or MPI_STATUSES_IGNORE) receives request i's status.
 * n == 0 returns at once. WEFT_EINVAL: n < 0, or reqs NULL with n > 0. */
int weft_mpi_await_all(int n, MPI_Request reqs[], MPI_Status statuses[]);

/* weft_mpi_await_all until deadline_ns: WEFT_ETIMEDOUT if some request has
 * not completed by then. */
int weft_mpi_await_all_until(int n, MPI_Request reqs[], MPI_Status statuses[],
                             uint64_t deadline_ns);

#ifdef __cplusplus
}
#endif

#endif
