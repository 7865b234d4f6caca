/*
 * bench_wake.c - how late a task learns that its wait is over, against a
 * thread blocked in MPI_Wait. Two ranks on one machine: for each wait
 * length T, rank 1 sleeps T past a barrier and then sends rank 0 a message
 * stamped with weft_now_ns (CLOCK_MONOTONIC: one clock for the ranks of a
 * machine); rank 0 awaits it in a task (weft_mpi_await, every worker
 * otherwise idle) or in a plain thread (MPI_Wait, which spins a core), and
 * the lateness is when it resumes minus the stamp.
 *
 * A task's lateness is the watcher's (src/task/sched.c): with every worker
 * parked, one of them polls the awaited sources - MPI's requests, and the
 * GPU's completions alike - on a timeout, so the figure is also what a
 * task awaiting a GPU graph of length T loses (a decode step of weft-llm).
 *
 * What the lateness costs is CPU: rank 0's (the process's, every thread)
 * over each wait length's waits, divided by their number. MPI_Wait spins
 * a core the whole wait; the watcher sleeps between its polls.
 *
 * Usage: mpiexec -n 2 bench_wake [--reps N]
 * Prints a table and BENCH lines: for each wait length, the median
 * lateness in microseconds and the CPU time a wait, a task's and MPI_Wait's.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "weft.h"
#include "weft/mpi.h"

static const double WAIT_US[] = {50, 200, 1000, 3000, 10000};
enum { WAITS = sizeof WAIT_US / sizeof *WAIT_US, TAG = 7 };

static int rank, reps = 40;
static double cpu_task[WAITS], cpu_thread[WAITS]; /* CPU us a wait */

/* The process's CPU time so far, user and system, in microseconds. */
static double cpu_us(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 + u.ru_utime.tv_usec + u.ru_stime.tv_usec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void sleep_us(double us)
{
    struct timespec ts = {(time_t)(us / 1e6), (long)(us * 1e3) % 1000000000L};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) != 0)
        ;
}

/* Rank 1's side of one wait: the barrier, T, the stamped message. */
static void send_after(double us)
{
    MPI_Barrier(MPI_COMM_WORLD);
    sleep_us(us);
    uint64_t stamp = weft_now_ns();
    MPI_Send(&stamp, 1, MPI_UINT64_T, 0, TAG, MPI_COMM_WORLD);
}

/* Rank 0's side: the receive posted, the barrier, then the await (in a
 * task) or MPI_Wait; returns the lateness in microseconds, or -1. */
static double receive(int in_task)
{
    uint64_t stamp = 0;
    MPI_Request req;
    MPI_Irecv(&stamp, 1, MPI_UINT64_T, 1, TAG, MPI_COMM_WORLD, &req);
    MPI_Barrier(MPI_COMM_WORLD);
    int ok = in_task ? weft_mpi_await(&req, MPI_STATUS_IGNORE) == WEFT_OK
                     : MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    uint64_t now = weft_now_ns();
    return ok ? (double)(now - stamp) / 1e3 : -1;
}

/* Each wait length's lateness from a task, [WAITS][reps]. */
static void *await_all(void *arg)
{
    double *late = arg;
    for (int w = 0; w < WAITS; w++) {
        double c0 = cpu_us();
        for (int r = 0; r < reps; r++)
            late[w * reps + r] = receive(1);
        cpu_task[w] = (cpu_us() - c0) / reps;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int provided, size;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS ||
        provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "bench_wake: MPI without MPI_THREAD_MULTIPLE\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--reps") && i + 1 < argc && atoi(argv[i + 1]) > 0)
            reps = atoi(argv[++i]);
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "bench_wake: run as 2 ranks (mpiexec -n 2), not %d\n", size);
        MPI_Finalize();
        return 2;
    }

    if (rank == 1) {
        for (int mode = 0; mode < 2; mode++) /* the task's waits, then the thread's */
            for (int w = 0; w < WAITS; w++)
                for (int r = 0; r < reps; r++)
                    send_after(WAIT_US[w]);
        MPI_Finalize();
        return 0;
    }

    double *task = malloc(sizeof(double) * WAITS * reps);
    double *thread = malloc(sizeof(double) * WAITS * reps);
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    weft_task *t;
    int failed = !task || !thread || weft_runtime_create(&rt, &cfg) != WEFT_OK;
    if (!failed) {
        failed = weft_mpi_init(rt) != WEFT_OK || weft_spawn(rt, &t, await_all, task, NULL) ||
                 weft_join(t, NULL);
        weft_runtime_destroy(rt);
    }
    if (failed) {
        fprintf(stderr, "bench_wake: %s\n", weft_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int w = 0; w < WAITS; w++) {
        double c0 = cpu_us();
        for (int r = 0; r < reps; r++)
            thread[w * reps + r] = receive(0);
        cpu_thread[w] = (cpu_us() - c0) / reps;
    }

    printf("| wait | lateness: a task (weft_mpi_await) | a thread (MPI_Wait) | CPU a wait: the "
           "task | the thread |\n|---:|---:|---:|---:|---:|\n");
    for (int w = 0; w < WAITS; w++) {
        for (int r = 0; r < reps; r++)
            failed |= task[w * reps + r] < 0 || thread[w * reps + r] < 0;
        double a = median(task + w * reps, reps), b = median(thread + w * reps, reps);
        printf("| %.0f us | %.1f us | %.1f us | %.1f us | %.1f us |\n", WAIT_US[w], a, b,
               cpu_task[w], cpu_thread[w]);
        printf("BENCH wake.T%.0fus.task_late_us %.1f us\n", WAIT_US[w], a);
        printf("BENCH wake.T%.0fus.thread_late_us %.1f us\n", WAIT_US[w], b);
        printf("BENCH wake.T%.0fus.task_cpu_us %.1f us\n", WAIT_US[w], cpu_task[w]);
        printf("BENCH wake.T%.0fus.thread_cpu_us %.1f us\n", WAIT_US[w], cpu_thread[w]);
    }
    free(task);
    free(thread);
    MPI_Finalize();
    return failed;
}
