/*
 * op_timing.cu - what timing every GPU operation costs a job, by the way
 * it is timed: not at all; with CUDA events recorded between the
 * operations, as weft's trace does (chained: a job's four operations take
 * five records, read back after the job); or with CUPTI's activity
 * records (the GPU's own timestamps, each operation tagged with an
 * external correlation id pushed and popped around it, or untagged:
 * a trace could not tell which task enqueued them). It answers
 * whether a trace built on CUPTI would cost the pipeline less than one
 * built on events, where threads contend for the driver.
 *
 * One job: the pipeline's GPU work (copy 1 MiB in, two k_mix of about
 * 10 us, copy 1 MiB out) without host work, on one of N threads, each with
 * a stream and a slot of its own, synchronizing after each job (the
 * thread-pool peer of pipeline_peers). For each thread count, the ways
 * take turns, REPS rounds of each after a warm-up; reported: jobs/s and
 * the enqueue time a job (the calls that issue its operations and their
 * timing), medians over the rounds. Every round checks its slots'
 * outputs; a CUPTI round also checks that a record came back for each of
 * its operations, and an events round that every duration was read.
 *
 * Usage: op_timing [--quick] [--jobs N] [--reps N] [--threads LIST] [--kiters N]
 */
#include <cupti.h>
#include <pthread.h>

#include <atomic>

#include "gpu_common.cuh"

enum way { WAY_NONE, WAY_EVENTS, WAY_CUPTI_UNTAGGED, WAY_CUPTI, WAYS };
static const char *const way_names[WAYS] = {"untimed", "events", "cupti_untagged", "cupti"};

enum { OPS = 4, MAX_THREADS = 64 };

static struct {
    int quick;
    unsigned jobs, reps;
    unsigned threads[MAX_LIST], nthreads;
    uint32_t kiters;
} opt = {0, 4000, 5, {1, 2, 4, 8}, 4, 0};

static struct slot slots[MAX_THREADS];
static cudaStream_t streams[MAX_THREADS];
static cudaEvent_t marks[MAX_THREADS][OPS + 1];

/* ---- CUPTI ------------------------------------------------------------- */

#define CUPTI_CK(call) cupti_ck((call), #call, __LINE__)

static void cupti_ck(CUptiResult r, const char *what, int line)
{
    if (r == CUPTI_SUCCESS)
        return;
    const char *msg = "?";
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "%s: line %d: %s: %s\n", bench_prog, line, what, msg);
    bench_die();
}

static std::atomic<long> operation_records, correlation_records;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *size = 8u << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                      size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            r->kind == CUPTI_ACTIVITY_KIND_MEMCPY)
            operation_records++;
        else if (r->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION)
            correlation_records++;
    }
    free(buf);
}

/* The operations' records; tagging them with an id also takes the
 * runtime API's records, which carry the correlation. */
static const CUpti_ActivityKind cupti_kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};

static size_t cupti_kinds_for(enum way way)
{
    return way == WAY_CUPTI ? 4 : 2;
}

static void cupti_begin(enum way way)
{
    operation_records = 0;
    correlation_records = 0;
    for (size_t i = 0; i < cupti_kinds_for(way); i++)
        CUPTI_CK(cuptiActivityEnable(cupti_kinds[i]));
}

/* Flush, stop, and check that every operation came back (tagged, with
 * its tag). */
static int cupti_end(enum way way, long operations)
{
    CUPTI_CK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    for (size_t i = 0; i < cupti_kinds_for(way); i++)
        CUPTI_CK(cuptiActivityDisable(cupti_kinds[i]));
    long ops = operation_records, tags = correlation_records;
    if (ops == operations && tags == (way == WAY_CUPTI ? operations : 0))
        return 1;
    fprintf(stderr,
            "%s: %s: CUPTI returned %ld operation and %ld correlation records for %ld "
            "operations\n",
            bench_prog, way_names[way], ops, tags, operations);
    return 0;
}

/* ---- a round ----------------------------------------------------------- */

static struct {
    enum way way;
    std::atomic<long> next_job;
    long jobs;
} round_of;

struct worker {
    unsigned index;
    double enqueue_s; /* issuing the round's operations and their timing */
    long jobs, durations_read;
};

/* Before operation k of a job on thread w (k = OPS: after the last). */
static inline void mark(const struct worker *w, int k, long job)
{
    if (round_of.way == WAY_EVENTS)
        CK(cudaEventRecord(marks[w->index][k], streams[w->index]));
    else if (round_of.way == WAY_CUPTI && k < OPS)
        CUPTI_CK(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                                                        (uint64_t)job * OPS + (uint64_t)k));
}

/* After operation k. */
static inline void unmark(void)
{
    uint64_t id;
    if (round_of.way == WAY_CUPTI)
        CUPTI_CK(
            cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id));
}

static void *worker_main(void *arg)
{
    struct worker *w = (struct worker *)arg;
    struct slot *s = &slots[w->index];
    cudaStream_t st = streams[w->index];
    long job;
    while ((job = round_of.next_job++) < round_of.jobs) {
        double t0 = now_s();
        mark(w, 0, job);
        CK(cudaMemcpyAsync(s->dev, s->in, BENCH_BYTES, cudaMemcpyHostToDevice, st));
        unmark();
        mark(w, 1, job);
        CK(launch_mix(st, s->dev, opt.kiters, SALT1));
        unmark();
        mark(w, 2, job);
        CK(launch_mix(st, s->dev, opt.kiters, SALT2));
        unmark();
        mark(w, 3, job);
        CK(cudaMemcpyAsync(s->out, s->dev, BENCH_BYTES, cudaMemcpyDeviceToHost, st));
        unmark();
        mark(w, OPS, job);
        w->enqueue_s += now_s() - t0;
        CK(cudaStreamSynchronize(st));
        if (round_of.way == WAY_EVENTS)
            for (int k = 0; k < OPS; k++) {
                float ms;
                CK(cudaEventElapsedTime(&ms, marks[w->index][k], marks[w->index][k + 1]));
                w->durations_read += ms >= 0;
            }
        w->jobs++;
    }
    return NULL;
}

/* One round of `jobs` jobs on `threads` threads the given way: jobs/s and
 * the enqueue time a job (us). Returns 0 when the work went wrong. */
static int run_round(enum way way, unsigned threads, long jobs, double *rate, double *enqueue_us)
{
    pthread_t tid[MAX_THREADS];
    struct worker w[MAX_THREADS];
    round_of.way = way;
    round_of.jobs = jobs;
    round_of.next_job = 0;
    for (unsigned i = 0; i < threads; i++)
        slots[i].last_job = -1;
    bool cupti = way == WAY_CUPTI || way == WAY_CUPTI_UNTAGGED;
    if (cupti)
        cupti_begin(way);
    double t0 = now_s();
    for (unsigned i = 0; i < threads; i++) {
        w[i] = (struct worker){i, 0, 0, 0};
        if (pthread_create(&tid[i], NULL, worker_main, &w[i]) != 0) {
            perror("pthread_create");
            bench_die();
        }
    }
    double enqueue = 0;
    long done = 0, read = 0;
    for (unsigned i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        enqueue += w[i].enqueue_s;
        done += w[i].jobs;
        read += w[i].durations_read;
    }
    double wall = now_s() - t0;
    int ok = done == jobs;
    if (cupti)
        ok &= cupti_end(way, jobs * OPS);
    if (way == WAY_EVENTS && read != jobs * OPS) {
        fprintf(stderr, "%s: %ld of %ld durations read back\n", bench_prog, read, jobs * OPS);
        ok = 0;
    }
    for (unsigned i = 0; i < threads; i++)
        ok &= verify_slot(&slots[i], i, opt.kiters, 0);
    *rate = (double)jobs / wall;
    *enqueue_us = enqueue / (double)jobs * 1e6;
    return ok;
}

/* ---- main -------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: op_timing [--quick] [--jobs N] [--reps N] [--threads LIST] "
                    "[--kiters N]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    bench_prog = "op_timing";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0)
            opt.quick = 1;
        else if (strcmp(a, "--jobs") == 0)
            opt.jobs = (unsigned)parse_num(a, v), i++;
        else if (strcmp(a, "--reps") == 0)
            opt.reps = (unsigned)parse_num(a, v), i++;
        else if (strcmp(a, "--kiters") == 0)
            opt.kiters = (uint32_t)parse_num(a, v), i++;
        else if (strcmp(a, "--threads") == 0) {
            int n = v ? parse_list(v, opt.threads) : 0;
            if (n == 0)
                usage();
            opt.nthreads = (unsigned)n, i++;
        } else
            usage();
    }
    if (opt.quick)
        opt.jobs = 500, opt.reps = 2;
    if (opt.reps > 64)
        opt.reps = 64;
    unsigned most = 0;
    for (unsigned i = 0; i < opt.nthreads; i++) {
        if (opt.threads[i] > MAX_THREADS) {
            fprintf(stderr, "op_timing: at most %d threads\n", MAX_THREADS);
            return 2;
        }
        most = opt.threads[i] > most ? opt.threads[i] : most;
    }
    require_gpu();

    for (unsigned i = 0; i < most; i++) {
        struct slot *s = &slots[i];
        CK(cudaHostAlloc((void **)&s->in, BENCH_BYTES, cudaHostAllocDefault));
        CK(cudaHostAlloc((void **)&s->out, BENCH_BYTES, cudaHostAllocDefault));
        CK(cudaMalloc((void **)&s->dev, BENCH_BYTES));
        CK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
        for (int k = 0; k <= OPS; k++)
            CK(cudaEventCreate(&marks[i][k]));
        slot_fill(s, i);
    }
    if (opt.kiters == 0)
        opt.kiters = calibrate_kernel(streams[0], slots[0].dev);
    CUPTI_CK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));

    fprintf(stderr, "%-8s %-15s %12s %14s %10s\n", "threads", "timing", "jobs/s", "enqueue us/job",
            "lost");
    int failed = 0;
    for (unsigned t = 0; t < opt.nthreads; t++) {
        unsigned threads = opt.threads[t];
        double rate[WAYS][64], enqueue[WAYS][64], r, e;
        watchdog("a thread count", 120);
        for (int way = 0; way < WAYS; way++) /* warm-up */
            failed |= !run_round((enum way)way, threads, opt.jobs / 4, &r, &e);
        for (unsigned rep = 0; rep < opt.reps; rep++)
            for (int way = 0; way < WAYS; way++)
                failed |= !run_round((enum way)way, threads, opt.jobs, &rate[way][rep],
                                     &enqueue[way][rep]);
        double untimed = 0;
        for (int way = 0; way < WAYS; way++) {
            struct stats sr = stats_of(rate[way], (int)opt.reps);
            struct stats se = stats_of(enqueue[way], (int)opt.reps);
            if (way == WAY_NONE)
                untimed = sr.med;
            double lost = 100.0 * (1.0 - sr.med / untimed);
            fprintf(stderr, "%-8u %-15s %12.0f %14.2f %9.1f%%\n", threads, way_names[way], sr.med,
                    se.med, lost);
            char name[96];
            snprintf(name, sizeof name, "op_timing.%s.threads%u.jobs_per_s", way_names[way],
                     threads);
            bench_line(name, sr.med, "jobs/s");
            snprintf(name, sizeof name, "op_timing.%s.threads%u.enqueue_us", way_names[way],
                     threads);
            bench_line(name, se.med, "us");
        }
        alarm(0);
    }
    if (failed)
        fprintf(stderr, "op_timing: some rounds went wrong (above)\n");
    return failed ? 1 : 0;
}
