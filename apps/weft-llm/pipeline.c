/*
 * pipeline.c - a process's place in a pipeline of the model's layers over
 * the ranks of MPI_COMM_WORLD (pipeline parallelism across processes): a
 * communicator of its own, the rank's share of the layers, and the
 * transfers of a step's parts from rank to rank, each a nonblocking MPI
 * operation that the calling task awaits (weft_mpi_await_all), so a rank's
 * other tasks run meanwhile. What a step sends is batch.c's.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>

#include "llm.h"
#include "weft/mpi.h"

struct wl_link {
    MPI_Comm comm; /* the pipeline's own: its messages never meet the program's */
    int rank, ranks;
};

enum { STEP_TAG = 0x776c };

int wl_link_job(const char *cmd, int (*run)(void *), void *arg)
{
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "%s: MPI_Init_thread failed\n", cmd);
        return 1;
    }
    int rc = run(arg);
    if (rc)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    return rc;
}

int wl_link_open(wl_link **out, weft_runtime *rt)
{
    int inited = 0, level = 0;
    *out = NULL;
    MPI_Initialized(&inited);
    if (!inited)
        return wl_fail("pipeline: MPI is not initialised (run under mpiexec)");
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return wl_fail("pipeline: MPI was initialised below MPI_THREAD_MULTIPLE");
    if (weft_mpi_init(rt) != WEFT_OK)
        return wl_fail("pipeline: %s", weft_last_error());
    wl_link *l = calloc(1, sizeof *l);
    if (!l)
        return wl_fail("out of memory");
    if (MPI_Comm_dup(MPI_COMM_WORLD, &l->comm) != MPI_SUCCESS) {
        free(l);
        return wl_fail("pipeline: MPI_Comm_dup failed");
    }
    MPI_Comm_set_errhandler(l->comm, MPI_ERRORS_RETURN); /* errors as results, not aborts */
    MPI_Comm_rank(l->comm, &l->rank);
    MPI_Comm_size(l->comm, &l->ranks);
    *out = l;
    return 0;
}

void wl_link_close(wl_link *l)
{
    if (!l)
        return;
    MPI_Comm_free(&l->comm);
    free(l);
}

int wl_link_rank(const wl_link *l)
{
    return l->rank;
}

int wl_link_ranks(const wl_link *l)
{
    return l->ranks;
}

int wl_link_stage(const wl_link *l, int layers, int *first, int *end)
{
    if (l->ranks > layers)
        return wl_fail("pipeline: %d ranks for a model of %d layers (a stage a rank, at least a "
                       "layer each)",
                       l->ranks, layers);
    /* contiguous shares in rank order, their sizes at most a layer apart */
    *first = (int)((long long)layers * l->rank / l->ranks);
    *end = (int)((long long)layers * (l->rank + 1) / l->ranks);
    return 0;
}

int wl_link_gather(wl_link *l, const int32_t *mine, int n, int32_t *all)
{
    MPI_Request req;
    if (MPI_Iallgather(mine, n, MPI_INT32_T, all, n, MPI_INT32_T, l->comm, &req) != MPI_SUCCESS)
        return wl_fail("pipeline: MPI refused an allgather");
    if (weft_mpi_await(&req, MPI_STATUS_IGNORE) != WEFT_OK)
        return wl_fail("pipeline: allgather: %s", weft_last_error());
    return 0;
}

int wl_link_move(wl_link *l, int peer, int sending, const wl_part *parts, int n)
{
    MPI_Request reqs[WL_MAX_PARTS];
    int posted = 0, rc = 0;
    if (n > WL_MAX_PARTS || peer < 0 || peer >= l->ranks || peer == l->rank)
        return wl_fail("pipeline: %d parts to or from rank %d of %d", n, peer, l->ranks);
    for (int i = 0; i < n; i++) {
        if (parts[i].bytes > INT_MAX) {
            rc = wl_fail("pipeline: a part of %zu bytes (MPI counts to %d)", parts[i].bytes,
                         INT_MAX);
            break;
        }
        int e = sending ? MPI_Isend(parts[i].at, (int)parts[i].bytes, MPI_BYTE, peer, STEP_TAG,
                                    l->comm, &reqs[posted])
                        : MPI_Irecv(parts[i].at, (int)parts[i].bytes, MPI_BYTE, peer, STEP_TAG,
                                    l->comm, &reqs[posted]);
        if (e != MPI_SUCCESS) {
            rc = wl_fail("pipeline: MPI refused a %s of %zu bytes %s rank %d",
                         sending ? "send" : "receive", parts[i].bytes, sending ? "to" : "from",
                         peer);
            break;
        }
        posted++;
    }
    /* what was posted completes before the buffers may go, even after an error */
    if (posted && weft_mpi_await_all(posted, reqs, MPI_STATUSES_IGNORE) != WEFT_OK && !rc)
        rc = wl_fail("pipeline: %s %s rank %d: %s", sending ? "sending" : "receiving",
                     sending ? "to" : "from", peer, weft_last_error());
    return rc;
}
