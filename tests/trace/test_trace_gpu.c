/*
 * test_trace.c - the timeline on a GPU: copies, kernels, memsets, host
 * functions and graph launches appear on their streams' tracks, timed by
 * CUPTI's records, a graph launch appearing as its nodes - or, with
 * WEFT_TRACE_GPU=events (gpu.trace_events), by CUDA events; with
 * WEFT_TRACE_GPU=off (gpu.trace_off), no operation appears, and the tasks'
 * GPU waits still do.
 *
 * Each task copies in, runs a kernel that spins SPIN_NS of GPU time, clears
 * a buffer, copies out and runs a host function, then awaits. In the trace
 * every task's operations must appear in stream order without overlap, the
 * kernel lasting about SPIN_NS by the GPU's clock (a host-side timing of
 * the launch would last microseconds), inside the session, and ending
 * before the task's GPU wait ends (the conversion to host time holds).
 */
#include "gpu_support/gpu_test.h"
#include "trace_check.h" /* after cmocka: trace_load_checked */

enum { TASKS = 8, WORDS = 4096 };
#define SPIN_NS 200000ull

typedef struct job {
    uint32_t *in, *out; /* pinned */
    int ran_host_fn;
} job;

static void host_fn(void *arg)
{
    ((job *)arg)->ran_host_fn = 1;
}

static void *job_main(void *arg)
{
    job *j = arg;
    uint32_t *dev = NULL, *scratch = NULL, a = 3, b = 7;
    unsigned n = WORDS;
    uint64_t spin = SPIN_NS;
    void *args[] = {&dev, &dev, &n, &a, &b, &spin};
    weft_dim3 grid = {WORDS / 256, 1, 1}, block = {256, 1, 1};
    if (!GT_OK(weft_malloc_async((void **)&dev, WORDS * 4)) ||
        !GT_OK(weft_malloc_async((void **)&scratch, WORDS * 4)) ||
        !GT_OK(weft_memcpy_async(dev, j->in, WORDS * 4)) ||
        !GT_OK(weft_launch(gk_spin_affine(), grid, block, 0, args)) ||
        !GT_OK(weft_memset_async(scratch, 0, WORDS * 4)) ||
        !GT_OK(weft_memcpy_async(j->out, dev, WORDS * 4)) || !GT_OK(weft_host_async(host_fn, j)) ||
        !GT_OK(weft_free_async(dev)) || !GT_OK(weft_free_async(scratch)) || !GT_OK(weft_await()))
        return NULL;
    for (unsigned i = 0; i < WORDS; i++)
        if (!GT_CHECK(j->out[i] == gk_affine_ref(j->in[i], a, b), "word %u", i))
            break;
    GT_CHECK(j->ran_host_fn, "the host function ran");
    return NULL;
}

static void *graph_main(void *arg)
{
    job *j = arg;
    uint32_t *dev = NULL, a = 5, b = 1;
    unsigned n = WORDS;
    void *args[] = {&dev, &dev, &n, &a, &b};
    weft_dim3 grid = {WORDS / 256, 1, 1}, block = {256, 1, 1};
    if (!GT_OK(weft_malloc_async((void **)&dev, WORDS * 4)) || !GT_OK(weft_await()))
        return NULL;
    for (int k = 0; k < 3; k++) {
        if (!GT_OK(weft_region_begin(42)) || !GT_OK(weft_memcpy_async(dev, j->in, WORDS * 4)) ||
            !GT_OK(weft_launch(gk_affine(), grid, block, 0, args)) ||
            !GT_OK(weft_memcpy_async(j->out, dev, WORDS * 4)) || !GT_OK(weft_region_end()) ||
            !GT_OK(weft_await()))
            break;
    }
    GT_OK(weft_free_async(dev));
    GT_OK(weft_await());
    return NULL;
}

/* ---- reading the trace back ------------------------------------------------ */

typedef struct op {
    const char *name, *kind, *task;
    double ts, dur;
} op;

static size_t device_ops(const json *doc, op *ops, size_t max)
{
    const json *events = trace_events(doc);
    size_t n = 0;
    for (size_t i = 0; i < events->n && n < max; i++) {
        const json *e = events->items[i], *args = json_get(e, "args");
        const char *cat = json_str(e, "cat");
        if (strcmp(json_str(e, "ph"), "X") || !cat || strcmp(cat, "device"))
            continue;
        op o = {json_str(e, "name"), json_str(args, "op"), json_str(args, "task"), 0, 0};
        assert_true(json_num(e, "ts", &o.ts) && json_num(e, "dur", &o.dur));
        assert_non_null(o.kind);
        ops[n++] = o;
    }
    return n;
}

/* When the GPU wait of task ended (its "e" event), or -1. */
static double gpu_wait_end(const json *doc, const char *task)
{
    const json *events = trace_events(doc);
    double end = -1, ts;
    char id[64] = "";
    for (size_t i = 0; i < events->n; i++) {
        const json *e = events->items[i];
        const char *ph = json_str(e, "ph"), *name = json_str(e, "name");
        if (!strcmp(ph, "b") && !strcmp(name, "wait: GPU") &&
            !strcmp(json_str(json_get(e, "args"), "task"), task))
            snprintf(id, sizeof id, "%s", json_str(e, "id"));
        else if (!strcmp(ph, "e") && !strcmp(name, "wait: GPU") && id[0] &&
                 !strcmp(json_str(e, "id"), id) && json_num(e, "ts", &ts) && ts > end)
            end = ts;
    }
    return end;
}

static int by_ts(const void *a, const void *b)
{
    const op *x = a, *y = b;
    return x->ts < y->ts ? -1 : x->ts > y->ts;
}

/* Is WEFT_TRACE_GPU set to `timing`? */
static bool timed_by(const char *timing)
{
    const char *v = getenv("WEFT_TRACE_GPU");
    return v && !strcmp(v, timing);
}

static void test_trace_times_gpu_operations_on_their_streams(void **state)
{
    static const char *order[] = {"copy", "kernel", "memset", "copy", "host function"};
    /* CUPTI times by default; compute-sanitizer is CUPTI's one subscriber,
     * and then weft times with events instead */
    const bool cupti = !timed_by("events") && !timed_by("off") && !gt_sanitizer();
    char path[256];
    job jobs[TASKS + 1];
    weft_task *ts[TASKS + 1];
    (void)state;
    trace_temp_path(path, sizeof path, "gpu");
    weft_runtime *rt = gt_runtime(2);
    uint64_t rng = gt_rng(1);
    for (int i = 0; i <= TASKS; i++) {
        assert_ok(weft_host_alloc(rt, (void **)&jobs[i].in, WORDS * 4));
        assert_ok(weft_host_alloc(rt, (void **)&jobs[i].out, WORDS * 4));
        gt_fill(&rng, jobs[i].in, WORDS * 4);
        jobs[i].ran_host_fn = 0;
    }
    double started = gt_now();
    assert_ok(weft_trace_start(rt, path));
    for (int i = 0; i <= TASKS; i++) {
        weft_task_opts o = {.name = i < TASKS ? "job" : "graph"};
        assert_ok(weft_spawn(rt, &ts[i], i < TASKS ? job_main : graph_main, &jobs[i], &o));
    }
    for (int i = 0; i <= TASKS; i++)
        assert_ok(weft_join(ts[i], NULL));
    assert_ok(weft_trace_stop(rt));
    double session_us = (gt_now() - started) * 1e6;
    for (int i = 0; i <= TASKS; i++) {
        assert_ok(weft_host_free(rt, jobs[i].in));
        assert_ok(weft_host_free(rt, jobs[i].out));
    }
    gt_runtime_destroy(rt);

    json *doc = trace_load_checked(path);
    /* the process, and the GPU's tracks where they hold operations */
    assert_true(trace_count(doc, "M", "process_name", NULL) >= (timed_by("off") ? 1u : 2u));

    static op ops[4096];
    size_t n = device_ops(doc, ops, 4096);
    assert_true(trace_count(doc, "b", "wait: GPU", "wait") >= 1);
    if (timed_by("off")) {
        assert_int_equal(n, 0);
        assert_true(trace_count(doc, "X", "job", "task") >= TASKS);
        json_free(doc);
        remove(path);
        return;
    }
    qsort(ops, n, sizeof *ops, by_ts);
    size_t graphs = 0, tasks_checked = 0;
    for (size_t i = 0; i < n; i++)
        graphs += !strcmp(ops[i].kind, "graph");
    assert_int_equal(graphs, cupti ? 3 * 3 : 3); /* CUPTI: copy, kernel, copy a launch */

    /* each job's operations: in stream order, back to back, GPU-timed */
    for (size_t i = 0; i < n; i++) {
        if (strcmp(ops[i].kind, "kernel") || !ops[i].task)
            continue;
        const char *task = ops[i].task;
        op mine[8];
        size_t k = 0;
        for (size_t m = 0; m < n && k < 8; m++)
            if (ops[m].task && !strcmp(ops[m].task, task))
                mine[k++] = ops[m];
        assert_int_equal(k, 5);
        for (size_t m = 0; m < k; m++) {
            if (strcmp(mine[m].kind, order[m]))
                fail_msg("task %s: operation %zu is %s, expected %s", task, m, mine[m].kind,
                         order[m]);
            /* (host times of GPU work are good to a few microseconds) */
            assert_true(mine[m].ts >= -50.0 && mine[m].ts + mine[m].dur <= session_us + 50.0);
            /* with CUPTI, events still time the host function: two
             * conversions of the GPU's clock meet there */
            double slack = cupti && m == 4 ? 20.0 : 1.0;
            if (m > 0 && mine[m].ts < mine[m - 1].ts + mine[m - 1].dur - slack)
                fail_msg("task %s: %s starts %.3f us before %s ends", task, mine[m].kind,
                         mine[m - 1].ts + mine[m - 1].dur - mine[m].ts, mine[m - 1].kind);
        }
        assert_non_null(strstr(mine[1].name, "spin_affine"));
        if (mine[1].dur < 0.75 * SPIN_NS / 1e3 || (!gt_sanitizer() && mine[1].dur > 100000))
            fail_msg("task %s: the kernel lasted %.1f us, it spins %.0f us", task, mine[1].dur,
                     SPIN_NS / 1e3);
        double wait_end = gpu_wait_end(doc, task);
        if (wait_end >= 0 && mine[4].ts + mine[4].dur > wait_end + 100.0)
            fail_msg("task %s: its work ends %.1f us after its await did", task,
                     mine[4].ts + mine[4].dur - wait_end);
        tasks_checked++;
    }
    assert_int_equal(tasks_checked, TASKS);
    json_free(doc);
    remove(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_times_gpu_operations_on_their_streams),
    };
    int skip = gt_start("gpu.trace");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
