/*
 * pipeline_peers.cu - the GPU pipeline without weft: the ways people write
 * it with the raw CUDA runtime API, which weft's version (bench/gpu/
 * pipeline.cu) is measured against in the same run of scripts/gpu-bench.
 *
 * One job: host work (a checksum of its input, calibrated to H us), copy
 * 1 MiB in (pinned host to device), two k_mix launches (each about 10 us on
 * the device), copy 1 MiB out, host work again (checksum of the output).
 * JOBS jobs per run. The ways:
 *
 *   sync          one thread, one stream, cudaStreamSynchronize after every
 *                 step: the usual first version
 *   statemachine  one thread, S streams, a hand-written state machine that
 *                 polls each in-flight job's event (cudaEventQuery)
 *   threadsN      N threads, a stream and a slot each, taking jobs from a
 *                 shared counter, cudaStreamSynchronize per job (a pool)
 *   floor         the GPU work alone: no host work, S streams, jobs issued
 *                 round-robin, one cudaDeviceSynchronize at the end
 *
 * Each configuration runs once to warm up, then REPS times; it reports the
 * median jobs/s and the median of the process CPU (getrusage, every thread)
 * over wall time, both measured around the run only. Allocation, thread
 * creation and stream creation happen before the clock starts.
 *
 * Usage: pipeline_peers [--quick] [--calibrate] [--jobs N] [--reps N]
 *          [--host-us LIST] [--threads LIST] [--streams N]
 *          [--kiters N] [--host-rate WORDS_PER_US] [--only NAME]
 *   --calibrate  print the calibration (CALIB lines) and stop; the script
 *                passes it to every program so that all do the same work
 *   --kiters, --host-rate  use this calibration instead of measuring one
 *   --only       run only the configurations whose name contains NAME
 */
#include <pthread.h>

#include "gpu_common.cuh"

#define MAX_SLOTS 64

static struct {
    int quick, calibrate_only;
    unsigned jobs, reps, streams;
    unsigned host_us[MAX_LIST], nhost;
    unsigned threads[MAX_LIST], nthreads;
    uint32_t kiters;
    double host_rate; /* host_work words per microsecond */
    const char *only;
} opt;

static struct slot slots[MAX_SLOTS];
static cudaStream_t streams[MAX_SLOTS];
static cudaEvent_t done_ev[MAX_SLOTS];
static unsigned nslots;

/* ---- setup ------------------------------------------------------------- */

static void slots_create(unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        struct slot *s = &slots[i];
        CK(cudaHostAlloc((void **)&s->in, BENCH_BYTES, cudaHostAllocDefault));
        CK(cudaHostAlloc((void **)&s->out, BENCH_BYTES, cudaHostAllocDefault));
        CK(cudaMalloc((void **)&s->dev, BENCH_BYTES));
        CK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&done_ev[i], cudaEventDisableTiming));
        slot_fill(s, i);
    }
    nslots = n;
}

static void slots_destroy(void)
{
    for (unsigned i = 0; i < nslots; i++) {
        CK(cudaEventDestroy(done_ev[i]));
        CK(cudaStreamDestroy(streams[i]));
        CK(cudaFree(slots[i].dev));
        CK(cudaFreeHost(slots[i].in));
        CK(cudaFreeHost(slots[i].out));
    }
    nslots = 0;
}

static void slots_reset(unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        memset(slots[i].out, 0, BENCH_BYTES);
        slots[i].last_job = -1;
    }
}

static void slots_verify(const char *name, unsigned n, int stamped)
{
    for (unsigned i = 0; i < n; i++) {
        if (slots[i].last_job < 0 && stamped)
            continue; /* never used (fewer jobs than slots) */
        if (!verify_slot(&slots[i], i, opt.kiters, stamped)) {
            fprintf(stderr, "%s: %s: wrong output\n", bench_prog, name);
            bench_die();
        }
    }
}

/* A job's GPU work, enqueued on st. */
static void enqueue_job(struct slot *s, cudaStream_t st)
{
    CK(cudaMemcpyAsync(s->dev, s->in, BENCH_BYTES, cudaMemcpyHostToDevice, st));
    CK(launch_mix(st, s->dev, opt.kiters, SALT1));
    CK(launch_mix(st, s->dev, opt.kiters, SALT2));
    CK(cudaMemcpyAsync(s->out, s->dev, BENCH_BYTES, cudaMemcpyDeviceToHost, st));
}

/* ---- the ways ---------------------------------------------------------- */

/* One thread, one stream, wait after every step. */
static void run_sync(uint64_t words)
{
    struct slot *s = &slots[0];
    cudaStream_t st = streams[0];
    for (unsigned j = 0; j < opt.jobs; j++) {
        job_pre(s, j, words);
        CK(cudaMemcpyAsync(s->dev, s->in, BENCH_BYTES, cudaMemcpyHostToDevice, st));
        CK(cudaStreamSynchronize(st));
        CK(launch_mix(st, s->dev, opt.kiters, SALT1));
        CK(cudaStreamSynchronize(st));
        CK(launch_mix(st, s->dev, opt.kiters, SALT2));
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpyAsync(s->out, s->dev, BENCH_BYTES, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        job_post(s, j, words);
    }
}

/* One thread, opt.streams streams: a slot is free or has a job in flight.
 * Each sweep finishes the jobs whose event has fired and starts new ones in
 * the free slots. */
static void run_statemachine(uint64_t words)
{
    long inflight[MAX_SLOTS]; /* the job in slot i, -1: free */
    unsigned n = opt.streams, next = 0, done = 0;
    for (unsigned i = 0; i < n; i++)
        inflight[i] = -1;
    while (done < opt.jobs) {
        for (unsigned i = 0; i < n; i++) {
            if (inflight[i] >= 0) {
                cudaError_t e = cudaEventQuery(done_ev[i]);
                if (e == cudaErrorNotReady)
                    continue;
                CK(e);
                job_post(&slots[i], inflight[i], words);
                inflight[i] = -1;
                done++;
            }
            if (next < opt.jobs) {
                job_pre(&slots[i], next, words);
                enqueue_job(&slots[i], streams[i]);
                CK(cudaEventRecord(done_ev[i], streams[i]));
                inflight[i] = next++;
            }
        }
    }
}

/* The thread pool: each thread its slot and stream. */
struct pool {
    unsigned next; /* the next job to take (atomic) */
    uint64_t words;
    pthread_barrier_t start, end;
};

struct pool_thread {
    struct pool *pool;
    unsigned index;
    pthread_t th;
};

static void *pool_main(void *arg)
{
    struct pool_thread *pt = (struct pool_thread *)arg;
    struct pool *p = pt->pool;
    struct slot *s = &slots[pt->index];
    cudaStream_t st = streams[pt->index];
    CK(cudaSetDevice(0)); /* the context, before the clock starts */
    pthread_barrier_wait(&p->start);
    for (;;) {
        unsigned j = __atomic_fetch_add(&p->next, 1u, __ATOMIC_RELAXED);
        if (j >= opt.jobs)
            break;
        job_pre(s, j, p->words);
        enqueue_job(s, st);
        CK(cudaStreamSynchronize(st));
        job_post(s, j, p->words);
    }
    pthread_barrier_wait(&p->end);
    return NULL;
}

/* One timed run of the pool: threads are started before the span begins
 * and joined after it ends. */
static void run_pool(unsigned nthreads, uint64_t words, struct span *sp)
{
    struct pool p;
    struct pool_thread pts[MAX_SLOTS];
    p.next = 0;
    p.words = words;
    if (pthread_barrier_init(&p.start, NULL, nthreads + 1) ||
        pthread_barrier_init(&p.end, NULL, nthreads + 1)) {
        fprintf(stderr, "%s: pthread_barrier_init failed\n", bench_prog);
        bench_die();
    }
    for (unsigned i = 0; i < nthreads; i++) {
        pts[i].pool = &p;
        pts[i].index = i;
        if (pthread_create(&pts[i].th, NULL, pool_main, &pts[i]) != 0) {
            fprintf(stderr, "%s: pthread_create failed\n", bench_prog);
            bench_die();
        }
    }
    usleep(2000); /* let every thread reach the start barrier */
    span_begin(sp);
    pthread_barrier_wait(&p.start);
    pthread_barrier_wait(&p.end);
    span_end(sp);
    for (unsigned i = 0; i < nthreads; i++)
        pthread_join(pts[i].th, NULL);
    pthread_barrier_destroy(&p.start);
    pthread_barrier_destroy(&p.end);
}

/* The GPU work alone, round-robin over opt.streams streams. */
static void run_floor(void)
{
    for (unsigned j = 0; j < opt.jobs; j++) {
        unsigned i = j % opt.streams;
        enqueue_job(&slots[i], streams[i]);
    }
    CK(cudaDeviceSynchronize());
}

/* ---- measuring --------------------------------------------------------- */

enum way { SYNC, STATEMACHINE, POOL, FLOOR };

static void run_once(enum way w, unsigned threads, uint64_t words, struct span *sp)
{
    if (w == POOL) {
        run_pool(threads, words, sp);
        return;
    }
    span_begin(sp);
    if (w == SYNC)
        run_sync(words);
    else if (w == STATEMACHINE)
        run_statemachine(words);
    else
        run_floor();
    span_end(sp);
}

/* Warm up, run opt.reps times, verify, print. name: the BENCH name stem. */
static void measure(const char *name, enum way w, unsigned threads, unsigned host_us)
{
    if (opt.only && !strstr(name, opt.only))
        return;
    uint64_t words = (uint64_t)(host_us * opt.host_rate + 0.5);
    unsigned used = w == SYNC ? 1 : w == POOL ? threads : opt.streams;
    if (used > opt.jobs)
        used = opt.jobs;
    double rate[64], cores[64];
    struct span sp;
    watchdog(name, 300);
    slots_reset(used);
    run_once(w, threads, words, &sp); /* warm-up */
    for (unsigned r = 0; r < opt.reps; r++) {
        slots_reset(used);
        run_once(w, threads, words, &sp);
        slots_verify(name, used, w != FLOOR);
        rate[r] = opt.jobs / sp.wall;
        cores[r] = sp.cpu / sp.wall;
    }
    alarm(0);
    report_jobs(name, rate, cores, (int)opt.reps);
}

/* ---- main -------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: pipeline_peers [--quick] [--calibrate] [--jobs N] [--reps N]\n"
                    "         [--host-us LIST] [--threads LIST] [--streams N] [--kiters N]\n"
                    "         [--host-rate WORDS_PER_US] [--only NAME]\n");
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    opt.jobs = 2000;
    opt.reps = 5;
    opt.streams = 16;
    opt.nhost = (unsigned)parse_list("5,20,100", opt.host_us);
    opt.nthreads = (unsigned)parse_list("4,8,16", opt.threads);
    int jobs_set = 0, reps_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick"))
            opt.quick = 1;
        else if (!strcmp(a, "--calibrate"))
            opt.calibrate_only = 1;
        else if (!strcmp(a, "--jobs"))
            opt.jobs = (unsigned)parse_num(a, v), i++, jobs_set = 1;
        else if (!strcmp(a, "--reps"))
            opt.reps = (unsigned)parse_num(a, v), i++, reps_set = 1;
        else if (!strcmp(a, "--streams"))
            opt.streams = (unsigned)parse_num(a, v), i++;
        else if (!strcmp(a, "--kiters"))
            opt.kiters = (uint32_t)parse_num(a, v), i++;
        else if (!strcmp(a, "--host-rate"))
            opt.host_rate = parse_real(a, v), i++;
        else if (!strcmp(a, "--only") && v)
            opt.only = v, i++;
        else if (!strcmp(a, "--host-us") && v) {
            if (!(opt.nhost = (unsigned)parse_list(v, opt.host_us)))
                usage();
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            if (!(opt.nthreads = (unsigned)parse_list(v, opt.threads)))
                usage();
            i++;
        } else
            usage();
    }
    if (opt.quick) {
        if (!jobs_set)
            opt.jobs = 200;
        if (!reps_set)
            opt.reps = 1;
    }
    if (opt.reps > 63)
        opt.reps = 63;
    if (opt.streams > MAX_SLOTS)
        opt.streams = MAX_SLOTS;
    for (unsigned i = 0; i < opt.nthreads; i++)
        if (opt.threads[i] > MAX_SLOTS)
            opt.threads[i] = MAX_SLOTS;
}

int main(int argc, char **argv)
{
    bench_prog = "pipeline_peers";
    parse_args(argc, argv);
    require_gpu();
    CK(cudaSetDevice(0));

    unsigned need = opt.streams;
    for (unsigned i = 0; i < opt.nthreads; i++)
        if (opt.threads[i] > need)
            need = opt.threads[i];
    slots_create(need);

    if (!opt.kiters)
        opt.kiters = calibrate_kernel(streams[0], slots[0].dev);
    if (!(opt.host_rate > 0))
        opt.host_rate = calibrate_host(slots[0].in);
    if (opt.calibrate_only) {
        printf("CALIB kiters %u\n", opt.kiters);
        printf("CALIB host_rate %.3f\n", opt.host_rate);
        double t = time_mix_us(streams[0], slots[0].dev, opt.kiters);
        printf("CALIB kernel_us %.3f\n", t);
        slots_destroy();
        return 0;
    }
    fprintf(stderr, "%s: %u jobs, %u reps, k_mix %u rounds, host work %.1f words/us\n", bench_prog,
            opt.jobs, opt.reps, opt.kiters, opt.host_rate);

    measure("gpu.pipeline.floor", FLOOR, 0, 0);
    for (unsigned h = 0; h < opt.nhost; h++) {
        char name[96];
        unsigned us = opt.host_us[h];
        snprintf(name, sizeof name, "gpu.pipeline.h%u.sync", us);
        measure(name, SYNC, 0, us);
        snprintf(name, sizeof name, "gpu.pipeline.h%u.statemachine%u", us, opt.streams);
        measure(name, STATEMACHINE, 0, us);
        for (unsigned t = 0; t < opt.nthreads; t++) {
            snprintf(name, sizeof name, "gpu.pipeline.h%u.threads%u", us, opt.threads[t]);
            measure(name, POOL, opt.threads[t], us);
        }
    }
    slots_destroy();
    return 0;
}
