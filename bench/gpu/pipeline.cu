/*
 * pipeline.cu - the GPU pipeline written with weft: each job is one task of
 * plain sequential code, and thousands of them overlap on the GPU and the
 * CPU. Measured against its raw-CUDA peers (bench/peers/pipeline_peers.cu)
 * in the same run of scripts/gpu-bench, with the same calibration and the
 * same kernels (gpu_common.cuh).
 *
 * One job (job_main below is the whole of it): take a free slot, host work
 * (a checksum of the input, calibrated to H us), weft_memcpy_async 1 MiB in,
 * weft_launch k_mix twice (about 10 us each on the device),
 * weft_memcpy_async 1 MiB out, weft_await, host work again (a checksum of
 * the output), give the slot back. A root task spawns JOBS such tasks and
 * joins them; INFLIGHT slots (pinned buffers from weft_host_alloc, device
 * buffers from weft_malloc_async, all allocated before the clock starts)
 * bound how many are between taking a slot and giving it back, through a
 * weft_chan of free slot numbers.
 *
 * For each worker count (weft_config.workers) and each host work length:
 * one warm-up run, then REPS runs; reported: the median jobs/s and the
 * median process CPU (getrusage, every thread) over wall time, both
 * measured around the run only (from spawning the root task to joining it).
 *
 * Usage: gpu_pipeline [--quick] [--jobs N] [--reps N] [--host-us LIST]
 *          [--workers LIST] [--inflight N] [--kiters N]
 *          [--host-rate WORDS_PER_US] [--only NAME] [--phases] [--graph]
 *          [--trace FILE]
 *   --kiters, --host-rate  the calibration from `pipeline_peers
 *                          --calibrate` (measured here when not given)
 *   --trace FILE           what recording weft's timeline costs: each rep
 *                          runs the pipeline twice, once recording a trace
 *                          (weft_trace_start .. weft_trace_stop around the
 *                          run, to FILE with the worker count before its
 *                          extension: pipeline.w2.json) and once not, which
 *                          goes first alternating; reported: the traced
 *                          runs' figures, and the median over reps of the
 *                          jobs/s lost against the untraced run beside it
 *                          (cost_pct). Pairs in one process see the same
 *                          machine state; separate processes differ by more
 *                          than the cost.
 */
#include "weft.h"

#include "gpu_common.cuh"
#include "weft_check.cuh"

#define MAX_INFLIGHT 256
#define JOB_STACK (64u * 1024u)

static struct {
    int quick;
    unsigned jobs, reps, inflight;
    unsigned host_us[MAX_LIST], nhost;
    unsigned workers[MAX_LIST], nworkers;
    uint32_t kiters;
    double host_rate;
    const char *only;
    int graph; /* each job's GPU steps in a graph region, one key per slot */
    const char *trace; /* record a timeline of every run here (--trace FILE) */
} opt;

/* One runtime's state for a series of runs. */
struct wrun {
    weft_runtime *rt;
    weft_chan *free; /* slot numbers not in use */
    struct slot slots[MAX_INFLIGHT];
    uint64_t words; /* host work per step, this run */
    struct wjob *jobs;
    char trace_path[4096]; /* --trace: this worker count's file */
};

static double *phase_log; /* per job: host, enqueue, await, host (ns) */

struct wjob {
    struct wrun *run;
    unsigned id;
    weft_task *task;
};

/* ---- a job ------------------------------------------------------------- */

static void *job_main(void *arg)
{
    struct wjob *jb = (struct wjob *)arg;
    struct wrun *r = jb->run;
    unsigned si;
    WCK(weft_chan_recv(r->free, &si));
    struct slot *s = &r->slots[si];
    uint64_t t0 = now_ns();

    job_pre(s, jb->id, r->words);
    uint64_t t1 = now_ns();
    uint32_t n = BENCH_WORDS, iters = opt.kiters, salt1 = SALT1, salt2 = SALT2;
    void *args1[] = {&s->dev, &n, &iters, &salt1};
    void *args2[] = {&s->dev, &n, &iters, &salt2};
    weft_dim3 grid = {MIX_GRID, 1, 1}, block = {MIX_BLOCK, 1, 1};
    if (opt.graph) /* graph mode: one graph per slot, replayed */
        WCK(weft_region_begin(si + 1));
    WCK(weft_memcpy_async(s->dev, s->in, BENCH_BYTES));
    WCK(weft_launch((const void *)k_mix, grid, block, 0, args1));
    WCK(weft_launch((const void *)k_mix, grid, block, 0, args2));
    WCK(weft_memcpy_async(s->out, s->dev, BENCH_BYTES));
    if (opt.graph)
        WCK(weft_region_end());
    uint64_t t2 = now_ns();
    WCK(weft_await());
    uint64_t t3 = now_ns();
    job_post(s, jb->id, r->words);
    if (phase_log) { /* --phases: where a job's time goes */
        phase_log[jb->id * 4 + 0] = (double)(t1 - t0);
        phase_log[jb->id * 4 + 1] = (double)(t2 - t1);
        phase_log[jb->id * 4 + 2] = (double)(t3 - t2);
        phase_log[jb->id * 4 + 3] = (double)(now_ns() - t3);
    }

    WCK(weft_chan_send(r->free, &si));
    return NULL;
}

static void *root_main(void *arg)
{
    struct wrun *r = (struct wrun *)arg;
    weft_task_opts o;
    memset(&o, 0, sizeof o);
    o.stack_size = JOB_STACK;
    o.name = "job";
    for (unsigned j = 0; j < opt.jobs; j++) {
        r->jobs[j].run = r;
        r->jobs[j].id = j;
        WCK(weft_spawn(r->rt, &r->jobs[j].task, job_main, &r->jobs[j], &o));
    }
    for (unsigned j = 0; j < opt.jobs; j++)
        WCK(weft_join(r->jobs[j].task, NULL));
    return NULL;
}

/* ---- setup and teardown (tasks, so that device memory comes from weft) -- */

static void *setup_main(void *arg)
{
    struct wrun *r = (struct wrun *)arg;
    for (unsigned i = 0; i < opt.inflight; i++)
        WCK(weft_malloc_async((void **)&r->slots[i].dev, BENCH_BYTES));
    WCK(weft_await());
    if (!opt.kiters) {
        /* Raw events on the task's own stream: allowed (weft_stream). */
        void *st;
        WCK(weft_stream(&st));
        opt.kiters = calibrate_kernel((cudaStream_t)st, r->slots[0].dev);
    }
    /* Load the kernel and touch every buffer once. */
    uint32_t n = BENCH_WORDS, iters = 1, salt = SALT1;
    weft_dim3 grid = {MIX_GRID, 1, 1}, block = {MIX_BLOCK, 1, 1};
    for (unsigned i = 0; i < opt.inflight; i++) {
        void *args[] = {&r->slots[i].dev, &n, &iters, &salt};
        WCK(weft_memcpy_async(r->slots[i].dev, r->slots[i].in, BENCH_BYTES));
        WCK(weft_launch((const void *)k_mix, grid, block, 0, args));
    }
    WCK(weft_await());
    return NULL;
}

static void *teardown_main(void *arg)
{
    struct wrun *r = (struct wrun *)arg;
    for (unsigned i = 0; i < opt.inflight; i++)
        WCK(weft_free_async(r->slots[i].dev));
    WCK(weft_await());
    return NULL;
}

static void run_task(weft_runtime *rt, void *(*fn)(void *), void *arg)
{
    weft_task *t;
    WCK(weft_spawn(rt, &t, fn, arg, NULL));
    WCK(weft_join(t, NULL));
}

static struct wrun *wrun_create(unsigned workers)
{
    struct wrun *r = (struct wrun *)calloc(1, sizeof *r);
    if (r)
        r->jobs = (struct wjob *)calloc(opt.jobs, sizeof *r->jobs);
    if (!r || !r->jobs) {
        fprintf(stderr, "%s: out of memory\n", bench_prog);
        bench_die();
    }
    weft_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.workers = workers;
    cfg.backend = WEFT_BACKEND_CUDA;
    WCK(weft_runtime_create(&r->rt, &cfg));
    if (strcmp(weft_backend_name(r->rt), "cuda") != 0) {
        fprintf(stderr, "%s: the runtime's backend is %s, not cuda\n", bench_prog,
                weft_backend_name(r->rt));
        bench_die();
    }
    WCK(weft_chan_create(&r->free, sizeof(unsigned), opt.inflight));
    for (unsigned i = 0; i < opt.inflight; i++) {
        struct slot *s = &r->slots[i];
        WCK(weft_host_alloc(r->rt, (void **)&s->in, BENCH_BYTES));
        WCK(weft_host_alloc(r->rt, (void **)&s->out, BENCH_BYTES));
        slot_fill(s, i);
        WCK(weft_chan_send(r->free, &i)); /* never waits: capacity inflight */
    }
    run_task(r->rt, setup_main, r);
    if (!(opt.host_rate > 0))
        opt.host_rate = calibrate_host(r->slots[0].in);
    if (opt.trace) {
        const char *dot = strrchr(opt.trace, '.'), *slash = strrchr(opt.trace, '/');
        int stem = dot && dot > (slash ? slash : opt.trace) ? (int)(dot - opt.trace)
                                                            : (int)strlen(opt.trace);
        snprintf(r->trace_path, sizeof r->trace_path, "%.*s.w%u%s", stem, opt.trace, workers,
                 opt.trace + stem);
        fprintf(stderr, "%s: recording traces to %s\n", bench_prog, r->trace_path);
    }
    return r;
}

static void wrun_destroy(struct wrun *r)
{
    run_task(r->rt, teardown_main, r);
    for (unsigned i = 0; i < opt.inflight; i++) {
        WCK(weft_host_free(r->rt, r->slots[i].in));
        WCK(weft_host_free(r->rt, r->slots[i].out));
    }
    WCK(weft_chan_destroy(r->free));
    WCK(weft_runtime_destroy(r->rt));
    free(r->jobs);
    free(r);
}

/* ---- measuring --------------------------------------------------------- */

/* One run of the pipeline, recording a trace around it when traced (the
 * stop, which writes the rest of the file, outside the span). */
static void run_once(struct wrun *r, struct span *sp, bool traced)
{
    for (unsigned i = 0; i < opt.inflight; i++) {
        memset(r->slots[i].out, 0, BENCH_BYTES);
        r->slots[i].last_job = -1;
    }
    if (traced)
        WCK(weft_trace_start(r->rt, r->trace_path));
    span_begin(sp);
    run_task(r->rt, root_main, r);
    span_end(sp);
    if (traced)
        WCK(weft_trace_stop(r->rt));
    unsigned used = opt.inflight < opt.jobs ? opt.inflight : opt.jobs;
    for (unsigned i = 0; i < opt.inflight; i++) {
        if (r->slots[i].last_job < 0 && used < opt.inflight)
            continue; /* fewer jobs than slots: some never used */
        if (!verify_slot(&r->slots[i], i, opt.kiters, 1)) {
            fprintf(stderr, "%s: %s: wrong output\n", bench_prog, bench_section);
            bench_die();
        }
    }
}

static void measure(struct wrun *r, unsigned workers, unsigned host_us)
{
    char name[96];
    snprintf(name, sizeof name, "gpu.pipeline.h%u.weft.%s%sw%u", host_us,
             opt.graph ? "graph." : "", opt.trace ? "trace." : "", workers);
    if (opt.only && !strstr(name, opt.only))
        return;
    r->words = (uint64_t)(host_us * opt.host_rate + 0.5);
    double rate[64], cores[64], lost[64];
    struct span sp;
    watchdog(name, 300);
    run_once(r, &sp, false); /* warm-up: streams leased, pools filled */
    if (opt.trace)
        run_once(r, &sp, true); /* ... and the trace's buffers, GPU timing started */
    for (unsigned k = 0; k < opt.reps; k++) {
        /* --trace: the untraced run of the pair goes first on even reps */
        const bool pair = opt.trace != NULL, untraced_first = k % 2 == 0;
        struct span untraced;
        if (pair && untraced_first)
            run_once(r, &untraced, false);
        run_once(r, &sp, pair);
        if (pair && !untraced_first)
            run_once(r, &untraced, false);
        rate[k] = opt.jobs / sp.wall;
        cores[k] = sp.cpu / sp.wall;
        if (pair)
            lost[k] = 100.0 * (1.0 - rate[k] / (opt.jobs / untraced.wall));
    }
    alarm(0);
    if (phase_log) {
        static const char *what[4] = {"host before", "enqueue", "await", "host after"};
        double *col = (double *)malloc(opt.jobs * sizeof *col);
        for (int k = 0; k < 4; k++) {
            for (unsigned j = 0; j < opt.jobs; j++)
                col[j] = phase_log[j * 4 + k];
            struct stats st = stats_of(col, (int)opt.jobs);
            fprintf(stderr, "  %-12s median %7.1f us  min %7.1f  max %8.1f\n", what[k],
                    st.med / 1e3, st.min / 1e3, st.max / 1e3);
        }
        free(col);
    }
    report_jobs(name, rate, cores, (int)opt.reps);
    if (opt.trace) {
        struct stats sl = stats_of(lost, (int)opt.reps);
        char buf[128];
        fprintf(stderr, "%-34s %9.1f %% jobs/s lost to the trace (%.1f..%.1f)\n", name, sl.med,
                sl.min, sl.max);
        snprintf(buf, sizeof buf, "%s.cost_pct", name);
        bench_line(buf, sl.med, "%");
    }
}

/* ---- main -------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: gpu_pipeline [--quick] [--jobs N] [--reps N] [--host-us LIST]\n"
                    "         [--workers LIST] [--inflight N] [--kiters N]\n"
                    "         [--host-rate WORDS_PER_US] [--only NAME] [--phases] [--graph]\n"
                    "         [--trace FILE]\n");
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    opt.jobs = 2000;
    opt.reps = 5;
    opt.inflight = 16;
    opt.nhost = (unsigned)parse_list("5,20,100", opt.host_us);
    opt.nworkers = (unsigned)parse_list("1,2,4,8", opt.workers);
    int jobs_set = 0, reps_set = 0, phases = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick"))
            opt.quick = 1;
        else if (!strcmp(a, "--jobs"))
            opt.jobs = (unsigned)parse_num(a, v), i++, jobs_set = 1;
        else if (!strcmp(a, "--reps"))
            opt.reps = (unsigned)parse_num(a, v), i++, reps_set = 1;
        else if (!strcmp(a, "--inflight"))
            opt.inflight = (unsigned)parse_num(a, v), i++;
        else if (!strcmp(a, "--kiters"))
            opt.kiters = (uint32_t)parse_num(a, v), i++;
        else if (!strcmp(a, "--host-rate"))
            opt.host_rate = parse_real(a, v), i++;
        else if (!strcmp(a, "--only") && v)
            opt.only = v, i++;
        else if (!strcmp(a, "--phases"))
            phases = 1;
        else if (!strcmp(a, "--graph"))
            opt.graph = 1;
        else if (!strcmp(a, "--trace") && v)
            opt.trace = v, i++;
        else if (!strcmp(a, "--host-us") && v) {
            if (!(opt.nhost = (unsigned)parse_list(v, opt.host_us)))
                usage();
            i++;
        } else if (!strcmp(a, "--workers") && v) {
            if (!(opt.nworkers = (unsigned)parse_list(v, opt.workers)))
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
    if (opt.inflight > MAX_INFLIGHT)
        opt.inflight = MAX_INFLIGHT;
    if (phases)
        phase_log = (double *)calloc(opt.jobs * 4, sizeof *phase_log);
}

int main(int argc, char **argv)
{
    bench_prog = "gpu_pipeline";
    parse_args(argc, argv);
    require_gpu();
    for (unsigned w = 0; w < opt.nworkers; w++) {
        char section[48];
        snprintf(section, sizeof section, "setup, %u workers", opt.workers[w]);
        watchdog(section, 120);
        struct wrun *r = wrun_create(opt.workers[w]);
        alarm(0);
        if (w == 0)
            fprintf(stderr,
                    "%s: %u jobs, %u reps, %u in flight, k_mix %u rounds, "
                    "host work %.1f words/us\n",
                    bench_prog, opt.jobs, opt.reps, opt.inflight, opt.kiters, opt.host_rate);
        for (unsigned h = 0; h < opt.nhost; h++)
            measure(r, opt.workers[w], opt.host_us[h]);
        snprintf(section, sizeof section, "teardown, %u workers", opt.workers[w]);
        watchdog(section, 120);
        wrun_destroy(r);
        alarm(0);
    }
    return 0;
}
