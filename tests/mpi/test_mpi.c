/*
 * test_mpi.c - MPI requests awaited by tasks, run as every rank of a job
 * under mpiexec (CTest: mpi.requests, mpi.killed_peer).
 *
 * Each rank checks, and reports every failed check with its rank and line:
 *  - rings: 64 tasks per rank each send random data to the next rank and
 *    receive the previous rank's, over several rounds with their own tags
 *    and lengths (some past the eager limit), awaiting with weft_mpi_await
 *    and weft_mpi_await_all; the data, sources, tags and counts are exact;
 *  - the same ring from a plain thread, which blocks;
 *  - a worker stays free: on a 1-worker runtime a task awaits a reply
 *    that the next rank sends only after another task of this rank, run
 *    while the first waits, sent to it (a blocked worker would hang);
 *  - cancellation: a task cancelled while awaiting a receive that never
 *    comes gets WEFT_ECANCELED, its request cancelled and completed;
 *  - timeouts: a timed await of a receive that never comes ends with
 *    WEFT_ETIMEDOUT, not before its deadline, the request still active,
 *    from a task and from a thread; a past deadline is a try;
 *  - an error MPI reports on a request (a truncated receive) is
 *    WEFT_EDEVICE naming it;
 *  - bad arguments are WEFT_EINVAL, and so is a task's await on a runtime
 *    without weft_mpi_init.
 * Then every rank finalises. With --kill-rank R, rank R kills itself once
 * the others await a message from it: mpiexec must end the job, and no
 * rank may hang (tests/mpi/killed_peer.sh times it); the survivors leave
 * without MPI_Finalize, which may wait for the dead rank.
 *
 * The data are random from a seed rank 0 takes from the clock and prints;
 * WEFT_MPI_TEST_SEED sets it.
 */
#include <mpi.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"
#include "weft/mpi.h"

enum {
    TASKS = 64,
    ROUNDS = 6,
    MAX_LEN = 20000, /* doubles: 160 KB, past Open MPI's eager limits */
    TAG_RING = 1000, /* + task * ROUNDS + round */
    TAG_FREE = 1,
    TAG_FREE_REPLY = 6,
    TAG_NEVER = 2, /* no rank ever sends it */
    TAG_TRUNC = 3,
    TAG_THREAD = 500,
    TAG_KILL = 5,
};

#define MS 1000000ull

static int rank, size;
static uint64_t seed;
static MPI_Comm comm;
static atomic_int failures;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s (%s)\n", rank, __FILE__, __LINE__,   \
                    #c, weft_last_error());                                                        \
            atomic_fetch_add(&failures, 1);                                                        \
        }                                                                                          \
    } while (0)

/* ---- deterministic random data: any rank computes any rank's ---------- */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The message rank src's task k sends in round r: its length, its data. */
static int ring_len(int src, int k, int r)
{
    uint64_t h = mix(seed ^ mix((uint64_t)src << 40 | (uint64_t)k << 20 | (uint64_t)r));
    return (h & 3) == 0 ? MAX_LEN - (int)((h >> 8) % 1000) : 1 + (int)((h >> 8) % 2000);
}

static void ring_fill(double *buf, int src, int k, int r)
{
    int n = ring_len(src, k, r);
    uint64_t h = mix(seed ^ (uint64_t)src * 7919 ^ (uint64_t)k * 104729 ^ (uint64_t)r * 1299709);
    for (int i = 0; i < n; i++) {
        h = mix(h);
        buf[i] = (double)(int64_t)h / 9.2233720368547758e18;
    }
}

static double *alloc_doubles(size_t n)
{
    double *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

static weft_runtime *runtime(unsigned workers)
{
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = workers;
    cfg.backend = WEFT_BACKEND_HOST;
    weft_runtime *rt = NULL;
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK || weft_mpi_init(rt) != WEFT_OK) {
        fprintf(stderr, "rank %d: runtime: %s\n", rank, weft_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return rt;
}

static weft_task *spawn(weft_runtime *rt, void *(*fn)(void *), void *arg)
{
    weft_task *t = NULL;
    if (weft_spawn(rt, &t, fn, arg, NULL) != WEFT_OK) {
        fprintf(stderr, "rank %d: spawn: %s\n", rank, weft_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return t;
}

/* ---- rings ------------------------------------------------------------- */

/* Task (or thread) k's rounds: send to the next rank, receive from the
 * previous one; even rounds await both at once, odd ones one by one. */
static void ring_rounds(int k, int tag_base, int rounds)
{
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    double *out = alloc_doubles(MAX_LEN), *in = alloc_doubles(MAX_LEN + 1),
           *want = alloc_doubles(MAX_LEN);
    for (int r = 0; r < rounds; r++) {
        int tag = tag_base + k * ROUNDS + r, n_out = ring_len(rank, k, r),
            n_in = ring_len(prev, k, r);
        ring_fill(out, rank, k, r);
        ring_fill(want, prev, k, r);
        for (int i = 0; i <= MAX_LEN; i++)
            in[i] = -7.0; /* poison */
        MPI_Request reqs[2];
        MPI_Status st[2];
        CHECK(MPI_Irecv(in, MAX_LEN + 1, MPI_DOUBLE, prev, tag, comm, &reqs[0]) == MPI_SUCCESS);
        CHECK(MPI_Isend(out, n_out, MPI_DOUBLE, next, tag, comm, &reqs[1]) == MPI_SUCCESS);
        if (r % 2 == 0) {
            CHECK(weft_mpi_await_all(2, reqs, st) == WEFT_OK);
        } else {
            CHECK(weft_mpi_await(&reqs[0], &st[0]) == WEFT_OK);
            CHECK(weft_mpi_await(&reqs[1], MPI_STATUS_IGNORE) == WEFT_OK);
        }
        CHECK(reqs[0] == MPI_REQUEST_NULL && reqs[1] == MPI_REQUEST_NULL);
        int count = -1;
        MPI_Get_count(&st[0], MPI_DOUBLE, &count);
        CHECK(count == n_in);
        CHECK(st[0].MPI_SOURCE == prev && st[0].MPI_TAG == tag);
        CHECK(memcmp(in, want, (size_t)n_in * sizeof *in) == 0);
        CHECK(in[n_in] == -7.0); /* nothing past the message */
    }
    free(out);
    free(in);
    free(want);
}

static void *ring_task(void *arg)
{
    ring_rounds((int)(intptr_t)arg, TAG_RING, ROUNDS);
    return NULL;
}

static void test_rings(void)
{
    weft_runtime *rt = runtime(2);
    weft_task *t[TASKS];
    for (int k = 0; k < TASKS; k++)
        t[k] = spawn(rt, ring_task, (void *)(intptr_t)k);
    for (int k = 0; k < TASKS; k++)
        CHECK(weft_join(t[k], NULL) == WEFT_OK);
    weft_runtime_destroy(rt);
    ring_rounds(0, TAG_THREAD, 2); /* from this thread */
}

/* ---- a worker stays free ----------------------------------------------- */

/* On a 1-worker runtime: the waiter awaits a reply that the next rank's
 * echo sends only once this rank's sender has sent to it, and the sender
 * sends only once the waiter waits. A wait that held the worker would
 * leave the sender (and the echo) unrun, and the job hung. */
typedef struct free_case {
    atomic_int waiting, other_ran_while_waiting, done;
    int rc;
} free_case;

static void *free_waiter(void *arg)
{
    free_case *c = arg;
    int next = (rank + 1) % size, got = -1;
    MPI_Request req;
    MPI_Irecv(&got, 1, MPI_INT, next, TAG_FREE_REPLY, comm, &req);
    atomic_store(&c->waiting, 1);
    c->rc = weft_mpi_await_until(&req, MPI_STATUS_IGNORE, weft_deadline_in_ns(20000 * MS));
    if (c->rc != WEFT_OK) {
        MPI_Cancel(&req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
    CHECK(c->rc != WEFT_OK || got == rank * 1000 + 8);
    atomic_store(&c->done, 1);
    return NULL;
}

static void *free_sender(void *arg)
{
    free_case *c = arg;
    while (!atomic_load(&c->waiting))
        weft_yield();
    if (!atomic_load(&c->done))
        atomic_store(&c->other_ran_while_waiting, 1);
    int next = (rank + 1) % size, value = rank * 1000 + 7;
    MPI_Request req;
    MPI_Isend(&value, 1, MPI_INT, next, TAG_FREE, comm, &req);
    CHECK(weft_mpi_await(&req, MPI_STATUS_IGNORE) == WEFT_OK);
    return NULL;
}

/* The previous rank's sender's value, back to it plus one. */
static void *free_echo(void *arg)
{
    (void)arg;
    int prev = (rank + size - 1) % size, value = -1;
    MPI_Request req;
    MPI_Irecv(&value, 1, MPI_INT, prev, TAG_FREE, comm, &req);
    CHECK(weft_mpi_await(&req, MPI_STATUS_IGNORE) == WEFT_OK);
    CHECK(value == prev * 1000 + 7);
    value++;
    MPI_Isend(&value, 1, MPI_INT, prev, TAG_FREE_REPLY, comm, &req);
    CHECK(weft_mpi_await(&req, MPI_STATUS_IGNORE) == WEFT_OK);
    return NULL;
}

static void test_worker_free(void)
{
    weft_runtime *rt = runtime(1);
    free_case c = {0};
    weft_task *a = spawn(rt, free_waiter, &c);
    weft_task *b = spawn(rt, free_sender, &c);
    weft_task *e = spawn(rt, free_echo, NULL);
    CHECK(weft_join(a, NULL) == WEFT_OK);
    CHECK(weft_join(b, NULL) == WEFT_OK);
    CHECK(weft_join(e, NULL) == WEFT_OK);
    CHECK(c.rc == WEFT_OK);
    CHECK(atomic_load(&c.other_ran_while_waiting));
    weft_runtime_destroy(rt);
}

/* ---- cancellation, timeouts, errors, arguments ------------------------- */

typedef struct never_case {
    atomic_int waiting;
    int rc, cancelled;
    MPI_Request req;
    uint64_t waited_ns;
} never_case;

static void *never_task(void *arg)
{
    never_case *c = arg;
    int buf;
    MPI_Irecv(&buf, 1, MPI_INT, (rank + 1) % size, TAG_NEVER, comm, &c->req);
    MPI_Status st;
    atomic_store(&c->waiting, 1);
    c->rc = weft_mpi_await(&c->req, &st);
    MPI_Test_cancelled(&st, &c->cancelled);
    return NULL;
}

static void test_cancel(void)
{
    weft_runtime *rt = runtime(2);
    never_case c = {0};
    weft_task *t = spawn(rt, never_task, &c);
    while (!atomic_load(&c.waiting))
        usleep(1000);
    usleep(50000); /* parked by now, most likely; either way it must end */
    CHECK(weft_cancel(t) == WEFT_OK);
    int rc = weft_join(t, NULL);
    CHECK(rc == WEFT_OK || rc == WEFT_ETASKCANCELED);
    CHECK(c.rc == WEFT_ECANCELED);
    CHECK(c.req == MPI_REQUEST_NULL); /* cancelled and completed */
    CHECK(c.cancelled);
    weft_runtime_destroy(rt);
}

/* A timed await of a receive that never comes, from a task or a thread. */
static void timed_out(never_case *c)
{
    int buf;
    MPI_Request req;
    MPI_Irecv(&buf, 1, MPI_INT, (rank + 1) % size, TAG_NEVER, comm, &req);
    uint64_t start = weft_now_ns(), deadline = start + 30 * MS;
    c->rc = weft_mpi_await_until(&req, MPI_STATUS_IGNORE, deadline);
    c->waited_ns = weft_now_ns() - start;
    CHECK(c->rc == WEFT_ETIMEDOUT);
    CHECK(weft_now_ns() >= deadline);
    CHECK(req != MPI_REQUEST_NULL);                                            /* still active */
    CHECK(weft_mpi_await_until(&req, MPI_STATUS_IGNORE, 0) == WEFT_ETIMEDOUT); /* a try */
    CHECK(req != MPI_REQUEST_NULL);
    MPI_Cancel(&req);
    MPI_Status st;
    CHECK(weft_mpi_await(&req, &st) == WEFT_OK);
    int cancelled = 0;
    MPI_Test_cancelled(&st, &cancelled);
    CHECK(cancelled && req == MPI_REQUEST_NULL);
}

static void *timed_task(void *arg)
{
    timed_out(arg);
    return NULL;
}

/* A receive shorter than the message: MPI fails it (MPI_ERR_TRUNCATE). */
static void *truncated_task(void *arg)
{
    (void)arg;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int out[8] = {1, 2, 3, 4, 5, 6, 7, 8}, in[4];
    MPI_Request reqs[2];
    MPI_Irecv(in, 4, MPI_INT, prev, TAG_TRUNC, comm, &reqs[0]);
    MPI_Isend(out, 8, MPI_INT, next, TAG_TRUNC, comm, &reqs[1]);
    MPI_Status st[2];
    int rc = weft_mpi_await_all(2, reqs, st);
    CHECK(rc == WEFT_EDEVICE);
    CHECK(strstr(weft_last_error(), "weft_mpi_await_all: MPI failed request 0") != NULL);
    CHECK(reqs[1] == MPI_REQUEST_NULL); /* the send still completed */
    return NULL;
}

static void *unset_task(void *arg)
{
    (void)arg;
    MPI_Request req = MPI_REQUEST_NULL;
    CHECK(weft_mpi_await(&req, MPI_STATUS_IGNORE) == WEFT_EINVAL);
    CHECK(strstr(weft_last_error(), "weft_mpi_init") != NULL);
    return NULL;
}

static void *null_task(void *arg)
{
    (void)arg;
    MPI_Request reqs[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Status st[3];
    CHECK(weft_mpi_await_all(3, reqs, st) == WEFT_OK);
    CHECK(weft_mpi_await_all(0, NULL, MPI_STATUSES_IGNORE) == WEFT_OK);
    return NULL;
}

static void test_timeouts_errors_arguments(void)
{
    weft_runtime *rt = runtime(2);
    never_case c = {0};
    weft_task *t = spawn(rt, timed_task, &c);
    CHECK(weft_join(t, NULL) == WEFT_OK);
    never_case thread_case = {0};
    timed_out(&thread_case); /* from this thread */
    t = spawn(rt, truncated_task, NULL);
    CHECK(weft_join(t, NULL) == WEFT_OK);
    t = spawn(rt, null_task, NULL);
    CHECK(weft_join(t, NULL) == WEFT_OK);
    weft_runtime_destroy(rt);

    CHECK(weft_mpi_await(NULL, MPI_STATUS_IGNORE) == WEFT_EINVAL);
    CHECK(strstr(weft_last_error(), "req is NULL") != NULL);
    CHECK(weft_mpi_await_all(-1, NULL, MPI_STATUSES_IGNORE) == WEFT_EINVAL);
    CHECK(weft_mpi_await_all(2, NULL, MPI_STATUSES_IGNORE) == WEFT_EINVAL);
    CHECK(weft_mpi_init(NULL) == WEFT_EINVAL);

    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 1;
    cfg.backend = WEFT_BACKEND_HOST;
    weft_runtime *plain = NULL;
    CHECK(weft_runtime_create(&plain, &cfg) == WEFT_OK);
    t = spawn(plain, unset_task, NULL);
    CHECK(weft_join(t, NULL) == WEFT_OK);
    weft_runtime_destroy(plain);
}

/* ---- a rank that dies -------------------------------------------------- */

static uint64_t kill_wait_ns = 60000 * MS;

static void *await_killed(void *arg)
{
    int victim = (int)(intptr_t)arg, buf;
    MPI_Request req;
    MPI_Irecv(&buf, 1, MPI_INT, victim, TAG_KILL, comm, &req);
    uint64_t start = weft_now_ns();
    int rc = weft_mpi_await_until(&req, MPI_STATUS_IGNORE, weft_deadline_in_ns(kill_wait_ns));
    printf("rank %d: the await of killed rank %d ended after %.1f s: %s (%s)\n", rank, victim,
           (double)(weft_now_ns() - start) / 1e9, weft_strerror(rc), rc ? weft_last_error() : "");
    if (rc == WEFT_ETIMEDOUT) { /* the receive is still ours: cancel it, then finalise */
        MPI_Cancel(&req);
        MPI_Status st;
        int cancelled = 0;
        rc = weft_mpi_await(&req, &st);
        MPI_Test_cancelled(&st, &cancelled);
        printf("rank %d: the receive from killed rank %d: %s\n", rank, victim,
               rc == WEFT_OK && cancelled ? "cancelled" : weft_strerror(rc));
    }
    fflush(stdout);
    return NULL;
}

static int kill_rank(int victim)
{
    MPI_Barrier(comm);
    if (rank == victim) {
        usleep(200000); /* the others are awaiting by now */
        printf("rank %d: killing myself\n", rank);
        fflush(stdout);
        raise(SIGKILL);
    }
    weft_runtime *rt = runtime(2);
    weft_task *t = spawn(rt, await_killed, (void *)(intptr_t)victim);
    weft_join(t, NULL);
    weft_runtime_destroy(rt);
    /* A peer's death leaves the job erroneous (MPI 3.1 defines nothing after
     * a failure), and Open MPI's MPI_Finalize may then wait for the dead
     * rank for good: the survivors leave without it. */
    fflush(stdout);
    _exit(0);
}

int main(int argc, char **argv)
{
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (provided != MPI_THREAD_MULTIPLE) {
        weft_runtime *rt = NULL;
        weft_runtime_create(&rt, NULL);
        CHECK(weft_mpi_init(rt) == WEFT_EINVAL);
        fprintf(stderr, "rank %d: MPI gives no MPI_THREAD_MULTIPLE: %s\n", rank, weft_last_error());
        MPI_Abort(MPI_COMM_WORLD, 77);
    }

    const char *given = getenv("WEFT_MPI_TEST_SEED");
    unsigned long long s = given ? strtoull(given, NULL, 0) : (unsigned long long)time(NULL);
    MPI_Bcast(&s, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    seed = s;
    if (rank == 0)
        printf("test_mpi: %d ranks, seed %llu (WEFT_MPI_TEST_SEED)\n", size, s);
    if (argc >= 3 && strcmp(argv[1], "--kill-rank") == 0) {
        if (argc == 4) /* the survivors' deadline, in seconds */
            kill_wait_ns = strtoull(argv[3], NULL, 0) * 1000 * MS;
        return kill_rank(atoi(argv[2]));
    }

    test_rings();
    test_worker_free();
    test_cancel();
    test_timeouts_errors_arguments();

    int mine = atomic_load(&failures), all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm_free(&comm);
    MPI_Finalize();
    if (rank == 0)
        printf("test_mpi: %s (%d failed checks over all ranks)\n", all ? "FAILED" : "passed", all);
    return all ? 1 : 0;
}
