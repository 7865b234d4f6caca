/*
 * latency.cu - what one await and one launch cost through weft, and what
 * waiting costs when there is nothing to do. The raw CUDA peers
 * (bench/peers/raw_latency.cuh) run in this same process, interleaved with
 * the weft side, so both see the same GPU, clocks and driver state.
 *
 *   await    from a task: launch an empty kernel, weft_await it; the round
 *            trip's median and p99 over ITERS, against launch +
 *            cudaEventRecord + spin on cudaEventQuery on a plain thread.
 *            Ten rounds alternate between the two. Target: weft median
 *            <= raw median + 1 us.
 *   launch   N empty-kernel launches from one task with weft_launch, against
 *            a plain loop of cudaLaunchKernel on one stream; the enqueue
 *            loop's wall time per launch (the GPU drains the queue after).
 *            REPS alternating repetitions, medians. Target: <= +0.3 us.
 *   idle     TASKS tasks, each awaiting its own k_spin kernel of IDLE_MS
 *            (one thread); once every kernel is launched, the process CPU
 *            (getrusage) over the wall time until all tasks are joined.
 *            Target: <= 5% of one core.
 *
 * Usage: gpu_latency [--quick] [--only await|launch|idle] [--iters N]
 *          [--await-workers LIST] [--launches N] [--reps N]
 *          [--idle-tasks N] [--idle-ms N] [--idle-workers N]
 */
#include "weft.h"

#include "gpu_common.cuh"
#include "weft_check.cuh"
#include "raw_latency.cuh"

#define ROUNDS 10 /* await: alternations between raw and weft */

static struct {
    int quick;
    const char *only;
    unsigned iters;
    unsigned await_workers[MAX_LIST], nawait;
    unsigned launches, reps;
    unsigned idle_tasks, idle_ms, idle_workers;
} opt;

static weft_runtime *rt_start(unsigned workers)
{
    weft_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.workers = workers;
    cfg.backend = WEFT_BACKEND_CUDA;
    weft_runtime *rt;
    WCK(weft_runtime_create(&rt, &cfg));
    if (strcmp(weft_backend_name(rt), "cuda") != 0) {
        fprintf(stderr, "%s: the runtime's backend is %s, not cuda\n", bench_prog,
                weft_backend_name(rt));
        bench_die();
    }
    return rt;
}

static void run_task(weft_runtime *rt, void *(*fn)(void *), void *arg)
{
    weft_task *t;
    WCK(weft_spawn(rt, &t, fn, arg, NULL));
    WCK(weft_join(t, NULL));
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "%s: out of memory\n", bench_prog);
        bench_die();
    }
    return p;
}

/* ---- await round trip -------------------------------------------------- */

struct await_ctx {
    double *ns;
    unsigned n;
};

static void *await_task(void *arg)
{
    struct await_ctx *c = (struct await_ctx *)arg;
    void *noargs[1] = {NULL};
    weft_dim3 one = {1, 1, 1};
    for (unsigned i = 0; i < c->n; i++) {
        uint64_t t0 = now_ns();
        WCK(weft_launch((const void *)k_empty, one, one, 0, noargs));
        WCK(weft_await());
        c->ns[i] = (double)(now_ns() - t0);
    }
    return NULL;
}

static void bench_await(unsigned workers)
{
    char name[64], buf[96];
    snprintf(name, sizeof name, "gpu.await.w%u", workers);
    watchdog(name, 300);
    weft_runtime *rt = rt_start(workers);
    struct raw_peer raw;
    raw_peer_create(&raw);
    unsigned chunk = opt.iters / ROUNDS ? opt.iters / ROUNDS : 1, n = chunk * ROUNDS;
    double *raw_ns = (double *)xmalloc(n * sizeof(double));
    double *weft_ns = (double *)xmalloc(n * sizeof(double));

    unsigned warm = chunk < 1000 ? chunk : 1000;
    raw_await_loop(&raw, raw_ns, warm);
    struct await_ctx c = {weft_ns, warm};
    run_task(rt, await_task, &c);
    for (unsigned r = 0; r < ROUNDS; r++) {
        raw_await_loop(&raw, raw_ns + r * chunk, chunk);
        c.ns = weft_ns + r * chunk;
        c.n = chunk;
        run_task(rt, await_task, &c);
    }
    struct stats sr = stats_of(raw_ns, (int)n), sw = stats_of(weft_ns, (int)n);
    double rp99 = quantile(raw_ns, (int)n, 0.99), wp99 = quantile(weft_ns, (int)n, 0.99);
    fprintf(stderr, "%-24s raw  median %6.2f us  p99 %6.2f us  (%u round trips)\n", name,
            sr.med / 1e3, rp99 / 1e3, n);
    fprintf(stderr, "%-24s weft median %6.2f us  p99 %6.2f us  (%+.2f us)\n", name, sw.med / 1e3,
            wp99 / 1e3, (sw.med - sr.med) / 1e3);
    snprintf(buf, sizeof buf, "%s.raw.median_us", name);
    bench_line(buf, sr.med / 1e3, "us");
    snprintf(buf, sizeof buf, "%s.raw.p99_us", name);
    bench_line(buf, rp99 / 1e3, "us");
    snprintf(buf, sizeof buf, "%s.weft.median_us", name);
    bench_line(buf, sw.med / 1e3, "us");
    snprintf(buf, sizeof buf, "%s.weft.p99_us", name);
    bench_line(buf, wp99 / 1e3, "us");

    free(raw_ns);
    free(weft_ns);
    raw_peer_destroy(&raw);
    WCK(weft_runtime_destroy(rt));
    alarm(0);
}

/* ---- launch overhead --------------------------------------------------- */

struct launch_ctx {
    unsigned n;
    double ns_per_launch;
};

static void *launch_task(void *arg)
{
    struct launch_ctx *c = (struct launch_ctx *)arg;
    void *noargs[1] = {NULL};
    weft_dim3 one = {1, 1, 1};
    uint64_t t = 0;
    for (unsigned done = 0; done < c->n; done += LAUNCH_BATCH) {
        uint64_t t0 = now_ns();
        for (unsigned i = 0; i < LAUNCH_BATCH; i++)
            WCK(weft_launch((const void *)k_empty, one, one, 0, noargs));
        t += now_ns() - t0;
        WCK(weft_await()); /* untimed: the queue drains between batches */
    }
    c->ns_per_launch = (double)t / ((c->n + LAUNCH_BATCH - 1) / LAUNCH_BATCH * LAUNCH_BATCH);
    return NULL;
}

static void bench_launch(void)
{
    watchdog("gpu.launch", 300);
    weft_runtime *rt = rt_start(1);
    struct raw_peer raw;
    raw_peer_create(&raw);
    double raw_ns[64], weft_ns[64];
    struct launch_ctx c = {opt.launches < 1000 ? opt.launches : 1000, 0};
    raw_launch_loop(&raw, c.n); /* warm-up */
    run_task(rt, launch_task, &c);
    c.n = opt.launches;
    for (unsigned r = 0; r < opt.reps; r++) {
        raw_ns[r] = raw_launch_loop(&raw, opt.launches);
        run_task(rt, launch_task, &c);
        weft_ns[r] = c.ns_per_launch;
    }
    struct stats sr = stats_of(raw_ns, (int)opt.reps), sw = stats_of(weft_ns, (int)opt.reps);
    fprintf(stderr, "%-24s raw  %6.3f us per launch (%.3f..%.3f)  (%u launches)\n", "gpu.launch",
            sr.med / 1e3, sr.min / 1e3, sr.max / 1e3, opt.launches);
    fprintf(stderr, "%-24s weft %6.3f us per launch (%.3f..%.3f)  (%+.3f us)\n", "gpu.launch",
            sw.med / 1e3, sw.min / 1e3, sw.max / 1e3, (sw.med - sr.med) / 1e3);
    bench_line("gpu.launch.raw.us_per_launch", sr.med / 1e3, "us");
    bench_line("gpu.launch.weft.us_per_launch", sw.med / 1e3, "us");
    raw_peer_destroy(&raw);
    WCK(weft_runtime_destroy(rt));
    alarm(0);
}

/* ---- idle cost --------------------------------------------------------- */

struct idle_ctx {
    uint64_t ns;       /* each kernel's duration */
    unsigned launched; /* tasks whose kernel is enqueued (atomic) */
};

static void *idle_task(void *arg)
{
    struct idle_ctx *c = (struct idle_ctx *)arg;
    uint64_t ns = c->ns;
    void *args[] = {&ns};
    weft_dim3 one = {1, 1, 1};
    WCK(weft_launch((const void *)k_spin, one, one, 0, args));
    __atomic_fetch_add(&c->launched, 1u, __ATOMIC_RELEASE);
    WCK(weft_await());
    return NULL;
}

static void bench_idle(void)
{
    watchdog("gpu.idle", 300);
    weft_runtime *rt = rt_start(opt.idle_workers);
    unsigned n = opt.idle_tasks;
    weft_task **ts = (weft_task **)xmalloc(n * sizeof *ts);
    struct idle_ctx c = {(uint64_t)opt.idle_ms * 1000000u, 0};
    weft_task_opts o;
    memset(&o, 0, sizeof o);
    o.stack_size = 64u * 1024u;
    o.name = "idle";
    for (unsigned i = 0; i < n; i++)
        WCK(weft_spawn(rt, &ts[i], idle_task, &c, &o));
    /* Until every kernel is in a stream; then nothing is left but waiting. */
    const struct timespec ms = {0, 1000000};
    while (__atomic_load_n(&c.launched, __ATOMIC_ACQUIRE) < n)
        nanosleep(&ms, NULL);
    struct span sp;
    span_begin(&sp);
    for (unsigned i = 0; i < n; i++)
        WCK(weft_join(ts[i], NULL));
    span_end(&sp);
    double cores = sp.cpu / sp.wall;
    fprintf(stderr,
            "%-24s %u tasks awaiting %u ms kernels, %u workers: %.2f s waited, "
            "%.3f s CPU = %.2f%% of a core\n",
            "gpu.idle", n, opt.idle_ms, weft_runtime_workers(rt), sp.wall, sp.cpu, 100.0 * cores);
    bench_line("gpu.idle.cores", cores, "cores");
    bench_line("gpu.idle.wait_s", sp.wall, "s");
    free(ts);
    WCK(weft_runtime_destroy(rt));
    alarm(0);
}

/* ---- main -------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: gpu_latency [--quick] [--only await|launch|idle] [--iters N]\n"
                    "         [--await-workers LIST] [--launches N] [--reps N]\n"
                    "         [--idle-tasks N] [--idle-ms N] [--idle-workers N]\n");
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    int iters_set = 0, launches_set = 0, reps_set = 0, tasks_set = 0, ms_set = 0;
    opt.iters = 20000;
    opt.launches = 100000;
    opt.reps = 5;
    opt.idle_tasks = 1000;
    opt.idle_ms = 200;
    opt.nawait = (unsigned)parse_list("1,4", opt.await_workers);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick"))
            opt.quick = 1;
        else if (!strcmp(a, "--only") && v)
            opt.only = v, i++;
        else if (!strcmp(a, "--iters"))
            opt.iters = (unsigned)parse_num(a, v), i++, iters_set = 1;
        else if (!strcmp(a, "--launches"))
            opt.launches = (unsigned)parse_num(a, v), i++, launches_set = 1;
        else if (!strcmp(a, "--reps"))
            opt.reps = (unsigned)parse_num(a, v), i++, reps_set = 1;
        else if (!strcmp(a, "--idle-tasks"))
            opt.idle_tasks = (unsigned)parse_num(a, v), i++, tasks_set = 1;
        else if (!strcmp(a, "--idle-ms"))
            opt.idle_ms = (unsigned)parse_num(a, v), i++, ms_set = 1;
        else if (!strcmp(a, "--idle-workers"))
            opt.idle_workers = (unsigned)parse_num(a, v), i++;
        else if (!strcmp(a, "--await-workers") && v) {
            if (!(opt.nawait = (unsigned)parse_list(v, opt.await_workers)))
                usage();
            i++;
        } else
            usage();
    }
    if (opt.quick) {
        if (!iters_set)
            opt.iters = 2000;
        if (!launches_set)
            opt.launches = 10000;
        if (!reps_set)
            opt.reps = 3;
        if (!tasks_set)
            opt.idle_tasks = 100;
        if (!ms_set)
            opt.idle_ms = 50;
    }
    if (opt.reps > 63)
        opt.reps = 63;
}

static int wanted(const char *section)
{
    return !opt.only || strstr(section, opt.only);
}

int main(int argc, char **argv)
{
    bench_prog = "gpu_latency";
    parse_args(argc, argv);
    require_gpu();
    if (wanted("await"))
        for (unsigned i = 0; i < opt.nawait; i++)
            bench_await(opt.await_workers[i]);
    if (wanted("launch"))
        bench_launch();
    if (wanted("idle"))
        bench_idle();
    return 0;
}
