/*
 * ring.c - the guide's MPI example (docs/guide.md, "MPI from tasks"): one
 * weft runtime per rank, many tasks a rank, each passing a block round a
 * ring of ranks with its own tag. A task reads as sequential code - post
 * the receive and the send, await both - and while it waits its worker
 * runs the other tasks, so no thread sits in MPI_Wait. Run it with mpiexec
 * (mpiexec -n 4 ./ring), or alone as a ring of one rank.
 */
#include <stdint.h>
#include <stdio.h>

#include <weft/mpi.h>

enum { TASKS = 16, LEN = 1024 };

static int rank, size;

/* Task k: send LEN numbers to the next rank, receive the previous rank's,
 * and check them. Returns NULL when they are what that rank sent. */
static void *exchange(void *arg)
{
    int k = (int)(intptr_t)arg, next = (rank + 1) % size, prev = (rank + size - 1) % size;
    double out[LEN], in[LEN];
    for (int i = 0; i < LEN; i++)
        out[i] = rank * 1e6 + k * 1e3 + i;

    MPI_Request reqs[2];
    MPI_Irecv(in, LEN, MPI_DOUBLE, prev, k, MPI_COMM_WORLD, &reqs[0]);
    MPI_Isend(out, LEN, MPI_DOUBLE, next, k, MPI_COMM_WORLD, &reqs[1]);
    if (weft_mpi_await_all(2, reqs, MPI_STATUSES_IGNORE) != WEFT_OK)
        return (void *)1; /* weft_last_error() says why */

    for (int i = 0; i < LEN; i++)
        if (in[i] != prev * 1e6 + k * 1e3 + i)
            return (void *)1;
    return NULL;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    weft_runtime *rt;
    weft_task *tasks[TASKS];
    if (weft_runtime_create(&rt, NULL) || weft_mpi_init(rt)) {
        fprintf(stderr, "ring: rank %d: %s\n", rank, weft_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int k = 0; k < TASKS; k++)
        if (weft_spawn(rt, &tasks[k], exchange, (void *)(intptr_t)k, NULL))
            MPI_Abort(MPI_COMM_WORLD, 1);
    int wrong = 0;
    for (int k = 0; k < TASKS; k++) {
        void *failed = (void *)1;
        weft_join(tasks[k], &failed);
        wrong += failed != NULL;
    }
    weft_runtime_destroy(rt);

    int all_wrong = 0;
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0)
        printf("ring: %d ranks, %d tasks each passed a block: %s\n", size, TASKS,
               all_wrong ? "WRONG" : "all as sent");
    return all_wrong != 0;
}
