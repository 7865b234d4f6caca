/*
 * bench_core.c - what weft's core costs on the CPU, beside peers measured in
 * the same run.
 *
 *   fiber switch       one weft__fiber_switch, against a plain function call
 *                      through a volatile pointer and a pthread cond-var
 *                      hand-off between two threads
 *   spawn + join       empty tasks in batches of BATCH, from one root task,
 *                      from one spawner task per worker, from a plain thread
 *   fib by tasks       fib(25) with a task for every call (per-task cost) and
 *                      fib(30) with plain recursion below FIB_CUTOFF (speed-up)
 *   channel ping-pong  two tasks bouncing an item over two weft_chans
 *   memory             resident bytes per suspended task, 100 000 suspended
 *
 * Every figure is measured on a warmed-up run, repeated, and reported as the
 * median with min and max. Output: a table, one `BENCH <name> <value> <unit>`
 * line per figure, a line per target saying what it was compared against and
 * the figure it needed, and the run's rows (JSON lines, one per figure, with
 * the peer measured in the same run: bench/results.py) written to a file in
 * the build tree. Recording them in bench/results.jsonl, from which
 * bench/RESULTS.md is made, is a separate choice: `make bench RECORD=1`.
 *
 * Usage: bench_core [--quick] [--no-rows] [--rows PATH] [--only TEXT]
 *   --quick      a short smoke run: fewer repetitions, shorter ones (its rows
 *                are marked quick, and results.py refuses to record them)
 *   --no-rows    write no rows
 *   --rows       write the rows to PATH (default bench_core.rows.jsonl beside
 *                the executable)
 *   --only       run only the figures whose BENCH name contains TEXT (for
 *                profiling one of them); implies --no-rows
 *
 * The memory figure is taken first, in a forked child, so that no earlier
 * benchmark has already made pages resident that the tasks would reuse.
 */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"
#include "fiber/fiber.h"

#define BATCH 1000u   /* tasks spawned before joining them */
#define FIB_FULL_N 25 /* fib with a task per call */
#define FIB_CUT_N 30  /* fib with plain recursion below FIB_CUTOFF */
#define FIB_CUTOFF 12
#define MEM_TASKS 100000u
#define MAX_RESULTS 64

static struct {
    bool quick, write_rows;
    const char *rows;
    const char *only;
    int reps;        /* measured repetitions (odd: the median is a sample) */
    uint64_t rep_ns; /* aimed duration of one repetition */
    unsigned mem_tasks;
    int mem_runs;
    unsigned ncpu;
    char loadavg[32]; /* other work on the machine skews every figure */
} opt;

/* ---- helpers ----------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static _Noreturn void die(const char *what, int status)
{
    fprintf(stderr, "bench_core: %s: %s (%s)\n", what, weft_strerror(status), weft_last_error());
    exit(1);
}

static void check(int status, const char *what)
{
    if (status != WEFT_OK)
        die(what, status);
}

/* A hang in the library must not hang `make bench`: each benchmark arms an
 * alarm, and the handler names the one that hung. */
static const char *volatile running = "start";

static void on_alarm(int sig)
{
    (void)sig;
    const char *s = running;
    static const char pre[] = "\nbench_core: timed out in ";
    ssize_t r = write(2, pre, sizeof pre - 1);
    r = write(2, s, strlen(s));
    r = write(2, "\n", 1);
    (void)r;
    _exit(3);
}

/* Start the benchmark called name, unless --only filters it out. */
static bool begin(const char *name)
{
    if (opt.only && !strstr(name, opt.only))
        return false;
    running = name;
    alarm(120);
    return true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static weft_runtime *rt_start(unsigned workers)
{
    weft_config cfg = {0};
    cfg.workers = workers;
    cfg.backend = WEFT_BACKEND_HOST; /* a CPU benchmark: leave GPUs alone */
    cfg.host_threads = 1;
    weft_runtime *rt;
    check(weft_runtime_create(&rt, &cfg), "weft_runtime_create");
    return rt;
}

static void rt_stop(weft_runtime *rt)
{
    check(weft_runtime_destroy(rt), "weft_runtime_destroy");
}

/* Run fn(arg) as a task of rt and wait for it from this thread. */
static void run_root(weft_runtime *rt, void *(*fn)(void *), void *arg)
{
    weft_task *t;
    check(weft_spawn(rt, &t, fn, arg, NULL), "weft_spawn (root)");
    check(weft_join(t, NULL), "weft_join (root)");
}

/* ---- results ----------------------------------------------------------- */

typedef struct result {
    char name[64]; /* the BENCH name */
    char what[64]; /* the table's first column */
    char config[48];
    char unit[16];
    char target[16]; /* "<= 10" or ">= 4"; "" for none */
    double med, min, max;
    bool failed;
} result;

static result results[MAX_RESULTS];
static int nresults;

static void fmt_value(char *buf, size_t n, double v)
{
    if (v >= 100 || v <= -100)
        snprintf(buf, n, "%.0f", v);
    else if (v >= 10 || v <= -10)
        snprintf(buf, n, "%.1f", v);
    else
        snprintf(buf, n, "%.2f", v);
}

static bool meets(const result *r)
{
    double goal = atof(r->target + 3);
    return r->target[0] == '<' ? r->med <= goal : r->med >= goal;
}

/* Record a figure from its samples (sorted here) and print its BENCH line. */
static result *add(const char *name, const char *what, const char *config, const char *unit,
                   const char *target, double *v, int n)
{
    if (nresults == MAX_RESULTS) {
        fprintf(stderr, "bench_core: too many results\n");
        exit(1);
    }
    result *r = &results[nresults++];
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->what, sizeof r->what, "%s", what);
    snprintf(r->config, sizeof r->config, "%s", config);
    snprintf(r->unit, sizeof r->unit, "%s", unit);
    snprintf(r->target, sizeof r->target, "%s", target ? target : "");
    if (n == 0) {
        r->failed = true;
        printf("BENCH %s failed %s\n", name, unit);
    } else {
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        r->min = v[0];
        r->med = v[n / 2];
        r->max = v[n - 1];
        char buf[32];
        fmt_value(buf, sizeof buf, r->med);
        printf("BENCH %s %s %s\n", name, buf, unit);
    }
    fflush(stdout);
    return r;
}

/* ---- measuring loops --------------------------------------------------- */

/* A measured loop: run n iterations, return the nanoseconds they took. */
typedef uint64_t (*loop_fn)(void *ctx, uint64_t n);

/* Find an iteration count (a multiple of quantum) that takes about
 * opt.rep_ns; the runs this takes are the warm-up. */
static uint64_t calibrate(loop_fn fn, void *ctx, uint64_t quantum)
{
    uint64_t n = quantum, t;
    for (;;) {
        t = fn(ctx, n);
        if (t >= opt.rep_ns / 4 || n >= (UINT64_C(1) << 40))
            break;
        n *= t < opt.rep_ns / 64 ? 8 : 2;
    }
    t = fn(ctx, n); /* once more at the found size: warm */
    double want = (double)n * (double)opt.rep_ns / (double)(t ? t : 1);
    uint64_t q = (uint64_t)(want / (double)quantum);
    return (q ? q : 1) * quantum;
}

/* Fill ns[opt.reps] with nanoseconds per op, ops_per_iter ops an iteration. */
static void measure(loop_fn fn, void *ctx, uint64_t quantum, double ops_per_iter, double *ns)
{
    uint64_t n = calibrate(fn, ctx, quantum);
    for (int i = 0; i < opt.reps; i++)
        ns[i] = (double)fn(ctx, n) / ((double)n * ops_per_iter);
}

/* ---- peers: plain call, pthread cond-var hand-off ----------------------- */

static __attribute__((noinline)) void *call_target(void *p)
{
    return p;
}

static void *(*volatile call_ptr)(void *) = call_target;
static void *volatile sink;

static uint64_t loop_call(void *ctx, uint64_t n)
{
    void *p = ctx;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < n; i++)
        p = call_ptr(p);
    uint64_t t = now_ns() - t0;
    sink = p;
    return t;
}

typedef struct handoff {
    pthread_mutex_t m;
    pthread_cond_t cv[2]; /* cv[k]: turn became k */
    int turn;             /* 1: the partner's move, 0: ours */
    bool ready;
    uint64_t n;
} handoff;

static void *handoff_partner(void *arg)
{
    handoff *h = arg;
    pthread_mutex_lock(&h->m);
    h->ready = true;
    pthread_cond_signal(&h->cv[0]);
    for (uint64_t i = 0; i < h->n; i++) {
        while (h->turn != 1)
            pthread_cond_wait(&h->cv[1], &h->m);
        h->turn = 0;
        pthread_cond_signal(&h->cv[0]);
    }
    pthread_mutex_unlock(&h->m);
    return NULL;
}

/* n round trips: two hand-offs each. */
static uint64_t loop_handoff(void *ctx, uint64_t n)
{
    (void)ctx;
    handoff h = {.m = PTHREAD_MUTEX_INITIALIZER,
                 .cv = {PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER},
                 .n = n};
    pthread_t th;
    if (pthread_create(&th, NULL, handoff_partner, &h) != 0) {
        fprintf(stderr, "bench_core: pthread_create failed\n");
        exit(1);
    }
    pthread_mutex_lock(&h.m);
    while (!h.ready)
        pthread_cond_wait(&h.cv[0], &h.m);
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        h.turn = 1;
        pthread_cond_signal(&h.cv[1]);
        while (h.turn != 0)
            pthread_cond_wait(&h.cv[0], &h.m);
    }
    uint64_t t = now_ns() - t0;
    pthread_mutex_unlock(&h.m);
    pthread_join(th, NULL);
    return t;
}

/* ---- fiber switch ------------------------------------------------------ */

static weft__fiber sw_main, sw_peer;
static volatile bool sw_stop; /* volatile: the peer's loop must reload it */

static void sw_entry(void *arg)
{
    (void)arg;
    while (!sw_stop)
        weft__fiber_switch(&sw_peer, &sw_main);
    weft__fiber_exit(&sw_peer, &sw_main);
}

/* n resume + suspend pairs: two switches each. */
static uint64_t loop_switch(void *ctx, uint64_t n)
{
    (void)ctx;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < n; i++)
        weft__fiber_switch(&sw_main, &sw_peer);
    return now_ns() - t0;
}

static void bench_switch(void)
{
    double ns[opt.reps], v[opt.reps];
    weft__stack_pool *pool;
    weft__stack *stack;
    if (weft__stack_pool_create(&pool, 64 * 1024) != 0 ||
        weft__stack_get(pool, NULL, 0, &stack) != 0) {
        fprintf(stderr, "bench_core: cannot get a fiber stack\n");
        exit(1);
    }
    weft__fiber_init_thread(&sw_main);
    weft__fiber_init(&sw_peer, stack, sw_entry, NULL);
    measure(loop_switch, NULL, 1024, 2, ns);
    for (int i = 0; i < opt.reps; i++)
        v[i] = 2 * ns[i];
    add("fiber_switch_ns", "fiber switch (one way)", "1 thread", "ns", "<= 10", ns, opt.reps);
    add("fiber_resume_suspend_ns", "fiber resume + suspend", "1 thread", "ns", NULL, v, opt.reps);
    sw_stop = true;
    weft__fiber_switch(&sw_main, &sw_peer); /* the peer exits back here */
    weft__fiber_release(&sw_peer);
    weft__stack_put(pool, NULL, stack);
    weft__stack_pool_destroy(pool);
}

static void bench_peers_and_switch(void)
{
    double ns[opt.reps];

    if (begin("func_call_ns")) {
        measure(loop_call, &ns, 1024, 1, ns);
        add("func_call_ns", "plain call (volatile fn ptr)", "1 thread", "ns", NULL, ns, opt.reps);
    }
    if (begin("fiber_switch_ns"))
        bench_switch();
    if (begin("condvar_handoff_ns")) {
        measure(loop_handoff, NULL, 64, 2, ns);
        add("condvar_handoff_ns", "pthread cond-var hand-off (one way)", "2 threads", "ns", NULL,
            ns, opt.reps);
    }
}

/* ---- spawn + run + join of empty tasks --------------------------------- */

typedef enum spawn_from { FROM_ROOT, FROM_SPAWNERS, FROM_THREAD } spawn_from;

typedef struct spawn_ctx {
    weft_runtime *rt;
    spawn_from from;
    unsigned spawners; /* FROM_SPAWNERS: tasks spawning in parallel */
    uint64_t n;        /* tasks to spawn in all (or per spawner) */
    uint64_t elapsed;
} spawn_ctx;

static void *empty_task(void *arg)
{
    return arg;
}

/* Spawn n empty tasks BATCH at a time, joining each batch in spawn order. */
static void spawn_batches(weft_runtime *rt, uint64_t n)
{
    weft_task *t[BATCH];
    for (uint64_t done = 0; done < n;) {
        unsigned k = n - done < BATCH ? (unsigned)(n - done) : BATCH;
        for (unsigned i = 0; i < k; i++)
            check(weft_spawn(rt, &t[i], empty_task, NULL, NULL), "weft_spawn");
        for (unsigned i = 0; i < k; i++)
            check(weft_join(t[i], NULL), "weft_join");
        done += k;
    }
}

static void *spawner_task(void *arg)
{
    spawn_ctx *c = arg;
    spawn_batches(c->rt, c->n);
    return NULL;
}

static void *spawn_root_task(void *arg)
{
    spawn_ctx *c = arg;
    uint64_t t0 = now_ns();
    if (c->from == FROM_ROOT) {
        spawn_batches(c->rt, c->n);
    } else {
        spawn_ctx sub = *c;
        sub.n = c->n / c->spawners;
        weft_task *t[c->spawners];
        for (unsigned i = 0; i < c->spawners; i++)
            check(weft_spawn(c->rt, &t[i], spawner_task, &sub, NULL), "weft_spawn (spawner)");
        for (unsigned i = 0; i < c->spawners; i++)
            check(weft_join(t[i], NULL), "weft_join (spawner)");
    }
    c->elapsed = now_ns() - t0;
    return NULL;
}

static uint64_t loop_spawn(void *ctx, uint64_t n)
{
    spawn_ctx *c = ctx;
    c->n = n;
    if (c->from == FROM_THREAD) {
        uint64_t t0 = now_ns();
        spawn_batches(c->rt, n);
        return now_ns() - t0;
    }
    run_root(c->rt, spawn_root_task, c);
    return c->elapsed;
}

static void bench_spawn(const unsigned *wlist, int nw)
{
    static const struct {
        spawn_from from;
        const char *key, *what;
    } patterns[] = {
        {FROM_ROOT, "root", "spawn+join, 1 root task"},
        {FROM_SPAWNERS, "par", "spawn+join, 1 spawner task/worker"},
        {FROM_THREAD, "thread", "spawn+join, from a plain thread"},
    };
    double ns[opt.reps];
    for (size_t p = 0; p < sizeof patterns / sizeof patterns[0]; p++) {
        for (int i = 0; i < nw; i++) {
            char name[64], config[48];
            snprintf(name, sizeof name, "spawn_join_%s_w%u", patterns[p].key, wlist[i]);
            snprintf(config, sizeof config, "workers=%u, batch %u", wlist[i], BATCH);
            if (!begin(name))
                continue;
            spawn_ctx c = {
                .rt = rt_start(wlist[i]), .from = patterns[p].from, .spawners = wlist[i]};
            uint64_t quantum = patterns[p].from == FROM_SPAWNERS ? BATCH * wlist[i] : BATCH;
            measure(loop_spawn, &c, quantum, 1, ns);
            rt_stop(c.rt);
            for (int k = 0; k < opt.reps; k++)
                ns[k] = 1e3 / ns[k]; /* million tasks per second */
            add(name, patterns[p].what, config, "Mtasks/s", wlist[i] == 2 ? ">= 4" : NULL, ns,
                opt.reps);
        }
    }
}

/* ---- fib by tasks ------------------------------------------------------ */

static weft_runtime *fib_rt;
static int fib_cutoff; /* below it: plain recursion (2: a task for every call) */

static __attribute__((noinline)) long fib_seq(long n)
{
    return n < 2 ? n : fib_seq(n - 1) + fib_seq(n - 2);
}

static long fib_par(long n);

static void *fib_task(void *arg)
{
    return (void *)(intptr_t)fib_par((long)(intptr_t)arg);
}

/* Spawn fib(n-1) as a task, compute fib(n-2) here, join. */
static long fib_par(long n)
{
    if (n < fib_cutoff)
        return fib_seq(n);
    weft_task *t;
    check(weft_spawn(fib_rt, &t, fib_task, (void *)(intptr_t)(n - 1), NULL), "weft_spawn (fib)");
    long b = fib_par(n - 2);
    void *a;
    check(weft_join(t, &a), "weft_join (fib)");
    return (long)(intptr_t)a + b;
}

/* Tasks fib_par(n) spawns with the current cutoff. */
static uint64_t fib_spawns(int n)
{
    uint64_t s[64] = {0};
    for (int k = 2; k <= n; k++)
        s[k] = k < fib_cutoff ? 0 : 1 + s[k - 1] + s[k - 2];
    return s[n];
}

static long fib_exact(int n)
{
    long a = 0, b = 1;
    for (int k = 0; k < n; k++) {
        long c = a + b;
        a = b;
        b = c;
    }
    return a;
}

typedef struct fib_ctx {
    long n, result;
    uint64_t elapsed;
} fib_ctx;

static void *fib_root_task(void *arg)
{
    fib_ctx *c = arg;
    uint64_t t0 = now_ns();
    c->result = fib_par(c->n);
    c->elapsed = now_ns() - t0;
    return NULL;
}

/* Time fib_par(n) on workers, opt.reps times after a warm-up run: ns[]. */
static void time_fib(unsigned workers, int n, int cutoff, double *ns)
{
    fib_rt = rt_start(workers);
    fib_cutoff = cutoff;
    for (int i = -1; i < opt.reps; i++) {
        fib_ctx c = {.n = n};
        run_root(fib_rt, fib_root_task, &c);
        if (c.result != fib_exact(n)) {
            fprintf(stderr, "bench_core: fib(%d) = %ld, expected %ld\n", n, c.result, fib_exact(n));
            exit(1);
        }
        if (i >= 0)
            ns[i] = (double)c.elapsed;
    }
    rt_stop(fib_rt);
    fib_rt = NULL;
}

static void bench_fib(const unsigned *wlist, int nw)
{
    double ns[opt.reps];
    char name[64], config[48];

    fib_cutoff = 2;
    uint64_t tasks = fib_spawns(FIB_FULL_N);
    for (int i = 0; i < nw; i++) {
        snprintf(name, sizeof name, "fib%d_task_ns_per_task_w%u", FIB_FULL_N, wlist[i]);
        snprintf(config, sizeof config, "workers=%u, %llu tasks", wlist[i],
                 (unsigned long long)tasks);
        if (!begin(name))
            continue;
        time_fib(wlist[i], FIB_FULL_N, 2, ns);
        for (int k = 0; k < opt.reps; k++)
            ns[k] /= (double)tasks;
        add(name, "fib(25), a task per call", config, "ns/task", NULL, ns, opt.reps);
    }

    /* fib(30): plain recursion on one thread, then tasks above the cutoff. */
    volatile long n30 = FIB_CUT_N;
    for (int i = -1; i < opt.reps && begin("fib30_seq_ms"); i++) {
        uint64_t t0 = now_ns();
        long r = fib_seq(n30);
        uint64_t t = now_ns() - t0;
        if (r != fib_exact(FIB_CUT_N))
            exit(1);
        if (i >= 0)
            ns[i] = (double)t / 1e6;
    }
    if (begin("fib30_seq_ms"))
        add("fib30_seq_ms", "fib(30), plain recursion", "1 thread, no runtime", "ms", NULL, ns,
            opt.reps);

    fib_cutoff = FIB_CUTOFF;
    tasks = fib_spawns(FIB_CUT_N);
    result *base = NULL;
    for (int i = 0; i < nw; i++) {
        snprintf(name, sizeof name, "fib%d_cut%d_ms_w%u", FIB_CUT_N, FIB_CUTOFF, wlist[i]);
        snprintf(config, sizeof config, "workers=%u, %llu tasks", wlist[i],
                 (unsigned long long)tasks);
        if (!begin(name))
            continue;
        time_fib(wlist[i], FIB_CUT_N, FIB_CUTOFF, ns);
        for (int k = 0; k < opt.reps; k++)
            ns[k] /= 1e6;
        result *r = add(name, "fib(30), tasks for n >= 12", config, "ms", NULL, ns, opt.reps);
        if (wlist[i] == 1) {
            base = r;
        } else if (base) {
            double s[3] = {base->med / r->med, base->min / r->max, base->max / r->min};
            snprintf(name, sizeof name, "fib%d_cut%d_speedup_w%u", FIB_CUT_N, FIB_CUTOFF, wlist[i]);
            snprintf(config, sizeof config, "workers=%u vs 1", wlist[i]);
            add(name, "fib(30) cutoff, speed-up", config, "x", NULL, s, 3);
        }
    }
}

/* ---- channel ping-pong ------------------------------------------------- */

typedef struct pingpong {
    weft_runtime *rt;
    size_t capacity;
    weft_chan *ping, *pong;
    uint64_t n, elapsed;
} pingpong;

static void *pinger(void *arg)
{
    pingpong *p = arg;
    for (uint64_t i = 0, v; i < p->n; i++) {
        check(weft_chan_send(p->ping, &i), "weft_chan_send");
        check(weft_chan_recv(p->pong, &v), "weft_chan_recv");
    }
    return NULL;
}

static void *ponger(void *arg)
{
    pingpong *p = arg;
    for (uint64_t i = 0, v; i < p->n; i++) {
        check(weft_chan_recv(p->ping, &v), "weft_chan_recv");
        check(weft_chan_send(p->pong, &v), "weft_chan_send");
    }
    return NULL;
}

static void *pingpong_root(void *arg)
{
    pingpong *p = arg;
    weft_task *a, *b;
    uint64_t t0 = now_ns();
    check(weft_spawn(p->rt, &a, pinger, p, NULL), "weft_spawn (pinger)");
    check(weft_spawn(p->rt, &b, ponger, p, NULL), "weft_spawn (ponger)");
    check(weft_join(a, NULL), "weft_join (pinger)");
    check(weft_join(b, NULL), "weft_join (ponger)");
    p->elapsed = now_ns() - t0;
    return NULL;
}

static uint64_t loop_pingpong(void *ctx, uint64_t n)
{
    pingpong *p = ctx;
    p->n = n;
    check(weft_chan_create(&p->ping, sizeof(uint64_t), p->capacity), "weft_chan_create");
    check(weft_chan_create(&p->pong, sizeof(uint64_t), p->capacity), "weft_chan_create");
    run_root(p->rt, pingpong_root, p);
    check(weft_chan_destroy(p->ping), "weft_chan_destroy");
    check(weft_chan_destroy(p->pong), "weft_chan_destroy");
    return p->elapsed;
}

static void bench_chan(void)
{
    double ns[opt.reps];
    char name[64], config[48];
    for (size_t cap = 0; cap <= 1; cap++) {
        for (unsigned w = 1; w <= 2; w++) {
            snprintf(name, sizeof name, "chan_rtt_ns_cap%zu_w%u", cap, w);
            snprintf(config, sizeof config, "workers=%u, capacity %zu", w, cap);
            if (!begin(name))
                continue;
            pingpong p = {.rt = rt_start(w), .capacity = cap};
            measure(loop_pingpong, &p, 256, 1, ns);
            rt_stop(p.rt);
            add(name, "channel ping-pong, round trip", config, "ns", NULL, ns, opt.reps);
            for (int k = 0; k < opt.reps; k++)
                ns[k] = 1e3 / ns[k];
            snprintf(name, sizeof name, "chan_rt_per_s_cap%zu_w%u", cap, w);
            add(name, "channel ping-pong, round trips/s", config, "M/s", NULL, ns, opt.reps);
        }
    }
}

/* ---- memory per suspended task ----------------------------------------- */

typedef struct mem_report {
    long rss_before, rss_after, vsz_before, vsz_after; /* bytes */
    unsigned long suspended;
    unsigned join_failures;
} mem_report;

static atomic_ulong mem_parked;

static void *mem_task(void *arg)
{
    atomic_fetch_add(&mem_parked, 1);
    check(weft_sem_wait(arg), "weft_sem_wait");
    return NULL;
}

static void read_statm(long *vsz, long *rss)
{
    long page = sysconf(_SC_PAGESIZE), s = 0, r = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &s, &r) != 2)
        s = r = 0;
    if (f)
        fclose(f);
    *vsz = s * page;
    *rss = r * page;
}

/* In a fresh child: suspend opt.mem_tasks tasks on one semaphore, compare
 * RSS before and after, release and join them. */
static _Noreturn void mem_child(int fd)
{
    mem_report m = {0};
    unsigned n = opt.mem_tasks;
    weft_runtime *rt = rt_start(0);
    weft_sem *sem;
    check(weft_sem_create(&sem, 0), "weft_sem_create");
    weft_task **t = calloc(n, sizeof *t);
    if (!t)
        _exit(1);
    memset(t, 0xff, n * sizeof *t); /* resident before the first reading */
    usleep(20000);
    read_statm(&m.vsz_before, &m.rss_before);

    for (unsigned i = 0; i < n; i++)
        check(weft_spawn(rt, &t[i], mem_task, sem, NULL), "weft_spawn");
    /* Wait until every task has reached its wait, or progress stops. */
    unsigned long last = 0;
    uint64_t since = now_ns();
    while ((m.suspended = atomic_load(&mem_parked)) < n) {
        if (m.suspended != last) {
            last = m.suspended;
            since = now_ns();
        } else if (now_ns() - since > 5000000000u) {
            break;
        }
        usleep(1000);
    }
    usleep(50000); /* the last ones: from the counter into the wait */
    read_statm(&m.vsz_after, &m.rss_after);

    for (unsigned i = 0; i < n; i++)
        check(weft_sem_post(sem), "weft_sem_post");
    for (unsigned i = 0; i < n; i++)
        m.join_failures += weft_join(t[i], NULL) != WEFT_OK;
    check(weft_sem_destroy(sem), "weft_sem_destroy");
    rt_stop(rt);
    if (write(fd, &m, sizeof m) != (ssize_t)sizeof m)
        _exit(1);
    _exit(0);
}

static void bench_memory(void)
{
    double rss[opt.mem_runs], vsz[opt.mem_runs];
    int ok = 0;
    char config[48];
    snprintf(config, sizeof config, "workers=%u, %u suspended", opt.ncpu, opt.mem_tasks);
    if (!begin("mem_rss_per_suspended_task_kib"))
        return;
    for (int i = 0; i < opt.mem_runs; i++) {
        int fds[2];
        if (pipe(fds) != 0)
            break;
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            alarm(120);
            mem_child(fds[1]);
        }
        close(fds[1]);
        mem_report m;
        ssize_t got = pid > 0 ? read(fds[0], &m, sizeof m) : -1;
        close(fds[0]);
        int st = 0;
        if (pid > 0)
            waitpid(pid, &st, 0);
        if (got != (ssize_t)sizeof m || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "bench_core: memory run %d failed (status 0x%x)\n", i, st);
            continue;
        }
        if (m.suspended < opt.mem_tasks || m.join_failures) {
            fprintf(stderr,
                    "bench_core: memory run %d: %lu of %u tasks suspended, %u joins failed\n", i,
                    m.suspended, opt.mem_tasks, m.join_failures);
            continue;
        }
        rss[ok] = (double)(m.rss_after - m.rss_before) / opt.mem_tasks / 1024;
        vsz[ok] = (double)(m.vsz_after - m.vsz_before) / opt.mem_tasks / 1024;
        ok++;
    }
    add("mem_rss_per_suspended_task_kib", "memory: RSS per suspended task", config, "KiB", "<= 16",
        rss, ok);
    add("mem_vsz_per_suspended_task_kib", "memory: VSZ per suspended task", config, "KiB", NULL,
        vsz, ok);
}

/* ---- report ------------------------------------------------------------ */

/* What each target is against: every one is a goal of the design, not a
 * peer's figure, so the line says which. */
static const char *goal_of(const result *r)
{
    if (!strncmp(r->name, "fiber_switch", 12))
        return "the design's goal for one switch";
    if (!strncmp(r->name, "spawn_join_", 11))
        return "the design's goal with 2 workers (Taskflow publishes 2.2-2.8 M/s on 2 vCPUs)";
    if (!strncmp(r->name, "mem_rss", 7))
        return "the design's goal for a suspended task";
    return "a goal";
}

static const result *find(const char *name)
{
    for (int i = 0; i < nresults; i++)
        if (!strcmp(results[i].name, name) && !results[i].failed)
            return &results[i];
    return NULL;
}

/* The peer measured in the same run, where one does the same work another
 * way: its label and its figure in r's unit; false where there is none. */
static bool peer_of(const result *r, const char **label, double *value)
{
    static const struct {
        const char *prefix, *peer, *label;
        double factor; /* peer's figure times this: the same unit of work */
    } peers[] = {
        {"fiber_switch_ns", "condvar_handoff_ns", "pthread cond-var hand-off (one way)", 1},
        {"chan_rtt_ns", "condvar_handoff_ns", "pthread cond-var round trip (2 hand-offs)", 2},
        {"fib30_cut12_ms", "fib30_seq_ms", "fib(30), plain recursion", 1},
    };
    for (size_t i = 0; i < sizeof peers / sizeof peers[0]; i++) {
        const result *p = find(peers[i].peer);
        if (p && !strncmp(r->name, peers[i].prefix, strlen(peers[i].prefix))) {
            *label = peers[i].label;
            *value = p->med * peers[i].factor;
            return true;
        }
    }
    return false;
}

static void print_targets(FILE *f)
{
    for (int i = 0; i < nresults; i++) {
        const result *r = &results[i];
        if (!r->target[0])
            continue;
        char med[32] = "failed";
        if (!r->failed)
            fmt_value(med, sizeof med, r->med);
        fprintf(f, "target: %s, %s: %s %s against %s %s, %s: %s\n", r->what, r->config, med,
                r->unit, r->target, r->unit, goal_of(r),
                r->failed  ? "not measured"
                : meets(r) ? "met"
                           : "MISSED");
    }
}

static void print_table(FILE *f, bool markdown)
{
    const char *fmt = markdown ? "| %s | %s | %s | %s | %s | %s | %s |\n"
                               : "%-38s %-28s %10s %10s %10s  %-9s %s\n";
    fprintf(f, fmt, "benchmark", "config", "median", "min", "max", "unit", "target");
    if (markdown)
        fprintf(f, "| --- | --- | ---: | ---: | ---: | --- | --- |\n");
    for (int i = 0; i < nresults; i++) {
        const result *r = &results[i];
        char med[32] = "failed", lo[32] = "-", hi[32] = "-", target[48] = "";
        if (!r->failed) {
            fmt_value(med, sizeof med, r->med);
            fmt_value(lo, sizeof lo, r->min);
            fmt_value(hi, sizeof hi, r->max);
        }
        if (r->target[0])
            snprintf(target, sizeof target, "%s %s: %s", r->target, r->unit,
                     r->failed  ? "not measured"
                     : meets(r) ? "met"
                                : "MISSED");
        fprintf(f, fmt, r->what, r->config, med, lo, hi, r->unit, target);
    }
}

static void cpu_model(char *buf, size_t n)
{
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon || (strncmp(line, "model name", 10) && strncmp(line, "Model", 5) &&
                       strncmp(line, "CPU part", 8)))
            continue;
        char *v = colon + 1;
        v += strspn(v, " \t");
        v[strcspn(v, "\n")] = 0;
        snprintf(buf, n, "%s%s", strncmp(line, "CPU part", 8) ? "" : "CPU part ", v);
        if (strncmp(line, "CPU part", 8))
            break; /* a model name beats a part number */
    }
    fclose(f);
}

static void git_describe(char *buf, size_t n)
{
    /* Under CMake __FILE__ is absolute: ask git about this checkout. */
    char cmd[PATH_MAX + 64], dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    snprintf(buf, n, "unknown");
    if (!slash)
        return;
    *slash = 0;
    snprintf(cmd, sizeof cmd, "git -C '%s' describe --always --dirty 2>/dev/null", dir);
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    if (fgets(buf, (int)n, p))
        buf[strcspn(buf, "\n")] = 0;
    else
        snprintf(buf, n, "unknown");
    pclose(p);
}

/* s as a JSON string (quotes, backslashes and control characters escaped). */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* One JSON line per figure, in bench/results.py's form; the file holds this
 * run alone (recording appends it elsewhere). */
static void write_rows(void)
{
    FILE *f = fopen(opt.rows, "w");
    if (!f) {
        fprintf(stderr, "bench_core: cannot write %s; no rows written\n", opt.rows);
        return;
    }
    char date[64], cpu[256], commit[64], machine[1024], compiler[160], conditions[160];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
    cpu_model(cpu, sizeof cpu);
    git_describe(commit, sizeof commit);
    struct utsname u;
    if (uname(&u) != 0)
        memset(&u, 0, sizeof u);
#if defined(__clang__)
    snprintf(compiler, sizeof compiler, "clang %s", __clang_version__);
#elif defined(__GNUC__)
    snprintf(compiler, sizeof compiler, "gcc %s", __VERSION__);
#else
    snprintf(compiler, sizeof compiler, "unknown compiler");
#endif
#ifdef NDEBUG
    const char *asserts = "NDEBUG";
#else
    const char *asserts = "assertions on";
#endif
    snprintf(machine, sizeof machine, "%s, %u CPUs online, %s %s %s; %s, %s", cpu, opt.ncpu,
             u.sysname, u.release, u.machine, compiler, asserts);
    snprintf(conditions, sizeof conditions,
             "%d repetitions each after a warm-up; load average before the run %s", opt.reps,
             opt.loadavg);

    for (int i = 0; i < nresults; i++) {
        const result *r = &results[i];
        if (r->failed)
            continue; /* a figure not measured is no row */
        char v[32], lo[32], hi[32];
        fmt_value(lo, sizeof lo, r->min);
        fmt_value(hi, sizeof hi, r->max);
        snprintf(v, sizeof v, "%.6g", r->med);
        fputs("{\"benchmark\": \"cpu\", \"case\": ", f);
        json_str(f, r->what);
        fputs(", \"config\": ", f);
        json_str(f, r->config);
        fprintf(f, ", \"metric\": \"median\", \"value\": %s, \"unit\": ", v);
        json_str(f, r->unit);
        fprintf(f, ", \"detail\": \"min %s, max %s\"", lo, hi);
        const char *peer;
        double pv;
        if (peer_of(r, &peer, &pv)) {
            fputs(", \"peer\": ", f);
            json_str(f, peer);
            fprintf(f, ", \"peer_value\": %.6g", pv);
        }
        if (r->target[0]) {
            /* met from the value as written, so that the row agrees with
             * itself when read back */
            result w = *r;
            w.med = atof(v);
            fprintf(f, ", \"targets\": [{\"goal\": ");
            json_str(f, goal_of(r));
            fprintf(f, ", \"op\": \"%.2s\", \"needed\": %s, \"met\": %s}]", r->target,
                    r->target + 3, meets(&w) ? "true" : "false");
        }
        fputs(", \"machine\": ", f);
        json_str(f, machine);
        fprintf(f, ", \"date\": \"%s\", \"commit\": ", date);
        json_str(f, commit);
        fputs(", \"conditions\": ", f);
        json_str(f, conditions);
        fprintf(f, "%s}\n", opt.quick ? ", \"quick\": true" : "");
    }
    if (fclose(f) != 0)
        fprintf(stderr, "bench_core: writing %s failed\n", opt.rows);
    else
        printf("rows in %s (bench/results.py record %s: into the record)\n", opt.rows, opt.rows);
}

/* ---- main -------------------------------------------------------------- */

static void read_loadavg(char *buf, size_t n)
{
    double l[3];
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) == 3)
        snprintf(buf, n, "%.2f, %.2f, %.2f", l[0], l[1], l[2]);
    else
        snprintf(buf, n, "unknown");
    if (f)
        fclose(f);
}

/* bench_core.rows.jsonl beside the executable: in the build tree, which git
 * ignores, so that a run changes nothing tracked unless recorded. */
static const char *default_rows(void)
{
    static char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    path[n > 0 ? n : 0] = 0;
    char *slash = strrchr(path, '/');
    size_t at = slash ? (size_t)(slash + 1 - path) : 0;
    snprintf(path + at, sizeof path - at, "bench_core.rows.jsonl");
    return path;
}

int main(int argc, char **argv)
{
    opt.write_rows = true;
    opt.rows = default_rows();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            opt.quick = true;
        } else if (!strcmp(argv[i], "--no-rows")) {
            opt.write_rows = false;
        } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            opt.rows = argv[++i];
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            opt.only = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--quick] [--no-rows] [--rows PATH] [--only TEXT]\n",
                    argv[0]);
            return 2;
        }
    }
    opt.reps = opt.quick ? 3 : 7;
    opt.rep_ns = opt.quick ? 5000000u : 80000000u;
    opt.mem_tasks = opt.quick ? MEM_TASKS / 10 : MEM_TASKS;
    opt.mem_runs = opt.quick ? 1 : 3;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    opt.ncpu = ncpu > 0 ? (unsigned)ncpu : 1;
    signal(SIGALRM, on_alarm);
    read_loadavg(opt.loadavg, sizeof opt.loadavg);
    printf("bench_core: %u CPUs, load average %s\n", opt.ncpu, opt.loadavg);

    unsigned wlist[3] = {1, 2, opt.ncpu};
    int nw = opt.ncpu > 2 ? 3 : 2;

    uint64_t t0 = now_ns();
    bench_memory(); /* first: before any thread exists, into clean children */
    bench_peers_and_switch();
    bench_spawn(wlist, nw);
    bench_fib(wlist, nw);
    bench_chan();
    alarm(0);

    printf("\n");
    print_table(stdout, false);
    print_targets(stdout);
    printf("\nbench_core: %.1f s%s\n", (double)(now_ns() - t0) / 1e9,
           opt.quick ? " (--quick)" : "");
    if (opt.write_rows && !opt.only)
        write_rows();
    return 0;
}
