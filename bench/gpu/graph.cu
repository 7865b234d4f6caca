/*
 * graph.cu - graph mode against eager launches and a hand-written CUDA
 * graph: a task body of KERNELS small dependent kernels, repeated STEPS
 * times on one stream, all in this one process, the five ways alternating
 * over REPS rounds (medians).
 *
 *   raw.eager    a plain loop of cudaLaunchKernel on one stream
 *   raw.graph    the KERNELS launches captured once by hand, then
 *                cudaGraphLaunch STEPS times (the peer to beat)
 *   weft.eager   one task, weft_launch KERNELS x STEPS times, one await
 *   weft.graph   one task, each step's launches in a region with one key:
 *                recorded, and replayed from the cached graph
 *   weft.graph_scalars  the same, but every kernel's scalar changes each
 *                step, so each replay sets KERNELS nodes anew
 *
 * The figure is the wall time per kernel, enqueue through completion. Every
 * way ends with the device buffer checked against the host's reference, so
 * a way that skips work cannot post a figure. Targets: weft.graph <= 1.1 x
 * raw.graph, and >= 3 x faster than weft.eager.
 *
 * Usage: gpu_graph [--quick] [--steps N] [--kernels N] [--reps N]
 */
#include "weft.h"

#include "gpu_common.cuh"
#include "weft_check.cuh"

#define WORDS 256u /* one block: the kernels are small on purpose */
#define MAX_KERNELS 64u

static struct {
    unsigned steps, kernels, reps;
} opt = {10000, 20, 5};

/* One small step of the chain: every word through a multiply-add. */
__global__ void k_step(uint32_t *buf, unsigned n, uint32_t salt)
{
    unsigned i = threadIdx.x;
    if (i < n)
        buf[i] = buf[i] * 2654435761u + salt;
}

static uint32_t salt_of(unsigned step, unsigned k, int vary)
{
    return (vary ? step * 31u : 0u) + k * 0x9e37u + 1u;
}

/* What the buffer holds after steps x kernels, from zeros. */
static void reference(uint32_t *want, int vary)
{
    memset(want, 0, WORDS * sizeof *want);
    for (unsigned s = 0; s < opt.steps; s++)
        for (unsigned k = 0; k < opt.kernels; k++) {
            uint32_t salt = salt_of(s, k, vary);
            for (unsigned i = 0; i < WORDS; i++)
                want[i] = want[i] * 2654435761u + salt;
        }
}

static void check(const char *way, const uint32_t *dev, const uint32_t *want)
{
    uint32_t got[WORDS];
    CK(cudaMemcpy(got, dev, sizeof got, cudaMemcpyDeviceToHost));
    if (memcmp(got, want, sizeof got) != 0) {
        fprintf(stderr, "%s: %s computed something else than the host\n", bench_prog, way);
        bench_die();
    }
}

/* ---- raw CUDA ------------------------------------------------------------ */

static void launch_step(cudaStream_t st, uint32_t *buf, unsigned step, unsigned k, int vary)
{
    unsigned n = WORDS;
    uint32_t salt = salt_of(step, k, vary);
    void *args[] = {&buf, &n, &salt};
    CK(cudaLaunchKernel((const void *)k_step, dim3(1), dim3(WORDS), args, 0, st));
}

static double raw_eager(cudaStream_t st, uint32_t *buf)
{
    CK(cudaMemsetAsync(buf, 0, WORDS * 4, st));
    CK(cudaStreamSynchronize(st));
    double t0 = now_s();
    for (unsigned s = 0; s < opt.steps; s++)
        for (unsigned k = 0; k < opt.kernels; k++)
            launch_step(st, buf, s, k, 0);
    CK(cudaStreamSynchronize(st));
    return now_s() - t0;
}

static double raw_graph(cudaStream_t st, cudaGraphExec_t exec, uint32_t *buf)
{
    CK(cudaMemsetAsync(buf, 0, WORDS * 4, st));
    CK(cudaStreamSynchronize(st));
    double t0 = now_s();
    for (unsigned s = 0; s < opt.steps; s++)
        CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    return now_s() - t0;
}

static cudaGraphExec_t raw_graph_build(cudaStream_t st, uint32_t *buf)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (unsigned k = 0; k < opt.kernels; k++)
        launch_step(st, buf, 0, k, 0);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphDestroy(graph));
    return exec;
}

/* ---- weft ---------------------------------------------------------------- */

typedef struct weft_way {
    int region, vary;
    uint32_t *buf;
    double seconds;
} weft_way;

static void *weft_way_main(void *arg)
{
    weft_way *w = (weft_way *)arg;
    unsigned n = WORDS;
    WCK(weft_memset_async(w->buf, 0, WORDS * 4));
    WCK(weft_await());
    double t0 = now_s();
    for (unsigned s = 0; s < opt.steps; s++) {
        if (w->region)
            WCK(weft_region_begin(1));
        for (unsigned k = 0; k < opt.kernels; k++) {
            uint32_t salt = salt_of(s, k, w->vary);
            void *args[] = {&w->buf, &n, &salt};
            WCK(weft_launch((const void *)k_step, weft_dim3{1, 1, 1}, weft_dim3{WORDS, 1, 1}, 0,
                            args));
        }
        if (w->region)
            WCK(weft_region_end());
    }
    WCK(weft_await());
    w->seconds = now_s() - t0;
    return NULL;
}

static double weft_run(weft_runtime *rt, uint32_t *buf, int region, int vary)
{
    weft_way w = {region, vary, buf, 0};
    weft_task *t;
    WCK(weft_spawn(rt, &t, weft_way_main, &w, NULL));
    WCK(weft_join(t, NULL));
    return w.seconds;
}

/* ---- main ---------------------------------------------------------------- */

enum { RAW_EAGER, RAW_GRAPH, WEFT_EAGER, WEFT_GRAPH, WEFT_GRAPH_SCALARS, WAYS };
static const char *const way_name[WAYS] = {"raw.eager", "raw.graph", "weft.eager", "weft.graph",
                                           "weft.graph_scalars"};

static void usage(void)
{
    fprintf(stderr, "usage: gpu_graph [--quick] [--steps N] [--kernels N] [--reps N]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    bench_prog = "gpu_graph";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick"))
            opt.steps = 1000, opt.reps = 3;
        else if (!strcmp(a, "--steps"))
            opt.steps = (unsigned)parse_num(a, v), i++;
        else if (!strcmp(a, "--kernels"))
            opt.kernels = (unsigned)parse_num(a, v), i++;
        else if (!strcmp(a, "--reps"))
            opt.reps = (unsigned)parse_num(a, v), i++;
        else
            usage();
    }
    if (!opt.steps || !opt.kernels || opt.kernels > MAX_KERNELS || !opt.reps || opt.reps > 63)
        usage();
    require_gpu();
    watchdog("graph", 300);

    weft_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.workers = 1;
    cfg.backend = WEFT_BACKEND_CUDA;
    weft_runtime *rt;
    WCK(weft_runtime_create(&rt, &cfg));

    cudaStream_t st;
    uint32_t *buf;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&buf, WORDS * 4));
    cudaGraphExec_t exec = raw_graph_build(st, buf);
    static uint32_t want[WORDS], want_vary[WORDS];
    reference(want, 0);
    reference(want_vary, 1);

    double t[WAYS][64];
    for (unsigned r = 0; r <= opt.reps; r++) { /* round 0 warms up */
        double *row[WAYS];
        double sink[WAYS];
        for (int w = 0; w < WAYS; w++)
            row[w] = r ? &t[w][r - 1] : &sink[w];
        *row[RAW_EAGER] = raw_eager(st, buf);
        check("raw.eager", buf, want);
        *row[RAW_GRAPH] = raw_graph(st, exec, buf);
        check("raw.graph", buf, want);
        *row[WEFT_EAGER] = weft_run(rt, buf, 0, 0);
        check("weft.eager", buf, want);
        *row[WEFT_GRAPH] = weft_run(rt, buf, 1, 0);
        check("weft.graph", buf, want);
        *row[WEFT_GRAPH_SCALARS] = weft_run(rt, buf, 1, 1);
        check("weft.graph_scalars", buf, want_vary);
    }

    double per_kernel[WAYS];
    fprintf(stderr, "%s: %u steps of %u dependent kernels, %u rounds\n", bench_prog, opt.steps,
            opt.kernels, opt.reps);
    for (int w = 0; w < WAYS; w++) {
        struct stats s = stats_of(t[w], (int)opt.reps);
        per_kernel[w] = s.med * 1e6 / ((double)opt.steps * opt.kernels);
        char name[96];
        snprintf(name, sizeof name, "gpu.graph.%s.us_per_kernel", way_name[w]);
        bench_line(name, per_kernel[w], "us");
        fprintf(stderr, "  %-20s %.3f us per kernel (min %.3f, max %.3f)\n", way_name[w],
                per_kernel[w], s.min * 1e6 / ((double)opt.steps * opt.kernels),
                s.max * 1e6 / ((double)opt.steps * opt.kernels));
    }
    bench_line("gpu.graph.weft_vs_raw_graph", per_kernel[WEFT_GRAPH] / per_kernel[RAW_GRAPH], "x");
    bench_line("gpu.graph.eager_vs_weft_graph", per_kernel[WEFT_EAGER] / per_kernel[WEFT_GRAPH],
               "x");

    weft_graph_stats gs;
    WCK(weft_graph_stats_get(rt, &gs));
    fprintf(stderr,
            "%s: graph mode: %llu launches, %llu hits, %llu updates, %llu instantiations\n",
            bench_prog, (unsigned long long)gs.launches, (unsigned long long)gs.hits,
            (unsigned long long)gs.updates, (unsigned long long)gs.instantiations);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaFree(buf));
    CK(cudaStreamDestroy(st));
    WCK(weft_runtime_destroy(rt));
    return 0;
}
