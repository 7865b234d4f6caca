/*
 * bench_allreduce.c - an all-reduce from weft tasks against a raw NCCL loop,
 * in the same process on the same GPUs.
 *
 * For each size (bytes of each rank's buffer, 8 KiB to 1 GiB by factors of
 * 4) and each side, every rank all-reduces its buffer in place (a sum, bf16
 * by default) ITERS times, each result waited for before the next starts,
 * as a task that uses the result would:
 *  - weft: one task per GPU (on its device), weft_nccl_all_reduce then
 *    weft_await, on communicators of weft_nccl_comm_init_all;
 *  - raw: one thread, for each iteration ncclGroupStart, ncclAllReduce on
 *    every GPU's stream, ncclGroupEnd, then cudaStreamSynchronize of each,
 *    on communicators of ncclCommInitAll.
 * A round is the ITERS iterations of every rank, timed from its start to
 * the last rank's end; the two sides alternate, ROUNDS rounds each, and the
 * medians are compared. Bus bandwidth is NCCL's: size / time x 2 (n - 1) / n
 * (0 with one GPU, where the all-reduce is the rank's own data: then the
 * time alone compares the paths).
 *
 * Usage: bench_allreduce [--gpus N] [--max-mib M] [--iters K] [--rounds R]
 *                        [--dtype bf16|f32] [--quick]
 * Prints a table and BENCH lines (nccl.allreduce.<bytes>.{weft_us, raw_us,
 * weft_busbw, raw_busbw, weft_over_raw}); exits 77 without a GPU.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"
#include "weft/nccl.h"

enum { MAX_GPUS = 16, MAX_SIZES = 32 };

typedef struct run {
    int gpus, iters, rounds;
    weft_dtype dtype;
    size_t esize;
    weft_runtime *rt;
    weft_nccl_comm *comms[MAX_GPUS];
    ncclComm_t raw[MAX_GPUS];
    cudaStream_t streams[MAX_GPUS];
    void *raw_buf[MAX_GPUS];
} run;

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

/* ---- weft: a task a rank ---------------------------------------------------- */

typedef struct rank_task {
    run *r;
    int rank;
    size_t count;
    void *buf;
    uint64_t end_ns;
    int failed;
} rank_task;

static void *rank_body(void *arg)
{
    rank_task *t = arg;
    run *r = t->r;
    for (int i = 0; i < r->iters && !t->failed; i++)
        t->failed = weft_nccl_all_reduce(r->comms[t->rank], t->buf, t->buf, t->count, r->dtype,
                                         WEFT_NCCL_SUM) != WEFT_OK ||
                    weft_await() != WEFT_OK;
    t->end_ns = weft_now_ns();
    if (t->failed)
        fprintf(stderr, "bench_allreduce: rank %d: %s\n", t->rank, weft_last_error());
    return NULL;
}

typedef struct alloc_task {
    size_t bytes;
    void *buf;
    int free_it;
} alloc_task;

/* Allocates (or frees) a rank's buffer on its device, in a task there. */
static void *alloc_body(void *arg)
{
    alloc_task *a = arg;
    if (a->free_it) {
        weft_free_async(a->buf);
        weft_await();
        return NULL;
    }
    if (weft_malloc_async(&a->buf, a->bytes) != WEFT_OK ||
        weft_memset_async(a->buf, 0, a->bytes) != WEFT_OK || weft_await() != WEFT_OK)
        a->buf = NULL;
    return NULL;
}

static int on_devices(run *r, void *(*fn)(void *), void *args, size_t size)
{
    weft_task *t[MAX_GPUS];
    for (int g = 0; g < r->gpus; g++) {
        weft_task_opts o = WEFT_TASK_OPTS_INIT;
        o.device = WEFT_DEVICE(g);
        if (weft_spawn(r->rt, &t[g], fn, (char *)args + (size_t)g * size, &o) != WEFT_OK)
            return -1;
    }
    for (int g = 0; g < r->gpus; g++)
        weft_join(t[g], NULL);
    return 0;
}

/* One weft round: its seconds an iteration, or -1. */
static double weft_round(run *r, void *const *bufs, size_t count)
{
    rank_task t[MAX_GPUS];
    for (int g = 0; g < r->gpus; g++)
        t[g] = (rank_task){r, g, count, bufs[g], 0, 0};
    uint64_t t0 = weft_now_ns(), end = 0;
    if (on_devices(r, rank_body, t, sizeof *t))
        return -1;
    for (int g = 0; g < r->gpus; g++) {
        if (t[g].failed)
            return -1;
        end = t[g].end_ns > end ? t[g].end_ns : end;
    }
    return (double)(end - t0) * 1e-9 / r->iters;
}

/* ---- raw NCCL: one thread ---------------------------------------------------- */

static int nccl_ok(ncclResult_t rc, const char *what)
{
    if (rc == ncclSuccess)
        return 1;
    fprintf(stderr, "bench_allreduce: %s: %s\n", what, ncclGetErrorString(rc));
    return 0;
}

static int cuda_ok(cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return 1;
    fprintf(stderr, "bench_allreduce: %s: %s\n", what, cudaGetErrorString(rc));
    return 0;
}

static double raw_round(run *r, size_t count)
{
    ncclDataType_t type = r->dtype == WEFT_DTYPE_BF16 ? ncclBfloat16 : ncclFloat32;
    uint64_t t0 = weft_now_ns();
    for (int i = 0; i < r->iters; i++) {
        int ok = nccl_ok(ncclGroupStart(), "ncclGroupStart");
        for (int g = 0; ok && g < r->gpus; g++)
            ok = nccl_ok(ncclAllReduce(r->raw_buf[g], r->raw_buf[g], count, type, ncclSum,
                                       r->raw[g], r->streams[g]),
                         "ncclAllReduce");
        ok = ok && nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
        for (int g = 0; ok && g < r->gpus; g++)
            ok = cuda_ok(cudaSetDevice(g), "cudaSetDevice") &&
                 cuda_ok(cudaStreamSynchronize(r->streams[g]), "cudaStreamSynchronize");
        if (!ok)
            return -1;
    }
    return (double)(weft_now_ns() - t0) * 1e-9 / r->iters;
}

/* ---- the run -------------------------------------------------------------------- */

static int usage(void)
{
    fprintf(stderr, "usage: bench_allreduce [--gpus N] [--max-mib M] [--iters K] [--rounds R] "
                    "[--dtype bf16|f32] [--quick]\n");
    return 2;
}

int main(int argc, char **argv)
{
    run r = {.iters = 20, .rounds = 5, .dtype = WEFT_DTYPE_BF16, .esize = 2};
    int want_gpus = 0, quick = 0;
    size_t max_bytes = (size_t)1 << 30;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            quick = 1;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--gpus"))
            want_gpus = atoi(v);
        else if (!strcmp(a, "--max-mib"))
            max_bytes = (size_t)atol(v) << 20;
        else if (!strcmp(a, "--iters"))
            r.iters = atoi(v);
        else if (!strcmp(a, "--rounds"))
            r.rounds = atoi(v);
        else if (!strcmp(a, "--dtype") && (!strcmp(v, "bf16") || !strcmp(v, "f32"))) {
            r.dtype = !strcmp(v, "bf16") ? WEFT_DTYPE_BF16 : WEFT_DTYPE_F32;
            r.esize = !strcmp(v, "bf16") ? 2 : 4;
        } else
            return usage();
    }
    if (quick) { /* a smoke run: it works, every size small */
        max_bytes = (size_t)4 << 20;
        r.iters = 3;
        r.rounds = 1;
    }
    if (r.iters < 1 || r.rounds < 1 || r.rounds > 64 || max_bytes < 8192)
        return usage();
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.backend = WEFT_BACKEND_CUDA;
    if (weft_runtime_create(&r.rt, &cfg) != WEFT_OK || !weft_device_count(r.rt)) {
        printf("SKIPPED: no GPU (%s)\n", weft_last_error());
        if (r.rt)
            weft_runtime_destroy(r.rt);
        return 77;
    }
    r.gpus = (int)weft_device_count(r.rt);
    if (want_gpus > 0 && want_gpus < r.gpus)
        r.gpus = want_gpus;
    r.gpus = r.gpus > MAX_GPUS ? MAX_GPUS : r.gpus;
    unsigned devs[MAX_GPUS];
    int devlist[MAX_GPUS];
    for (int g = 0; g < r.gpus; g++)
        devs[g] = (unsigned)g, devlist[g] = g;
    int rc = 1;
    if (weft_nccl_comm_init_all(r.rt, (unsigned)r.gpus, devs, r.comms) != WEFT_OK) {
        fprintf(stderr, "bench_allreduce: weft's communicators: %s\n", weft_last_error());
        goto out;
    }
    if (!nccl_ok(ncclCommInitAll(r.raw, r.gpus, devlist), "ncclCommInitAll"))
        goto out;
    for (int g = 0; g < r.gpus; g++)
        if (!cuda_ok(cudaSetDevice(g), "cudaSetDevice") ||
            !cuda_ok(cudaStreamCreateWithFlags(&r.streams[g], cudaStreamNonBlocking),
                     "cudaStreamCreate") ||
            !cuda_ok(cudaMalloc(&r.raw_buf[g], max_bytes), "cudaMalloc") ||
            !cuda_ok(cudaMemset(r.raw_buf[g], 0, max_bytes), "cudaMemset"))
            goto out;
    alloc_task bufs[MAX_GPUS];
    void *weft_buf[MAX_GPUS];
    for (int g = 0; g < r.gpus; g++)
        bufs[g] = (alloc_task){max_bytes, NULL, 0};
    if (on_devices(&r, alloc_body, bufs, sizeof *bufs))
        goto out;
    for (int g = 0; g < r.gpus; g++)
        if (!(weft_buf[g] = bufs[g].buf)) {
            fprintf(stderr, "bench_allreduce: %zu bytes on GPU %d: %s\n", max_bytes, g,
                    weft_last_error());
            goto out;
        }
    printf("all-reduce (sum, %s, in place) over %d GPU%s, %d iterations a round, each awaited; "
           "median of %d rounds\n\n",
           r.dtype == WEFT_DTYPE_BF16 ? "bf16" : "f32", r.gpus, r.gpus > 1 ? "s" : "", r.iters,
           r.rounds);
    printf("| bytes | weft us | raw NCCL us | weft bus GB/s | raw bus GB/s | weft / raw "
           "throughput |\n|---:|---:|---:|---:|---:|---:|\n");
    double factor = 2.0 * (r.gpus - 1) / r.gpus;
    rc = 0;
    for (size_t bytes = 8192; bytes <= max_bytes && !rc; bytes *= 4) {
        size_t count = bytes / r.esize;
        double w[64], raw[64];
        for (int k = -1; k < r.rounds && !rc; k++) { /* round -1 warms both up */
            double a = weft_round(&r, weft_buf, count), b = raw_round(&r, count);
            if (a < 0 || b < 0)
                rc = 1;
            else if (k >= 0)
                w[k] = a, raw[k] = b;
        }
        if (rc)
            break;
        double tw = median(w, r.rounds), tr = median(raw, r.rounds);
        printf("| %zu | %.1f | %.1f | %.1f | %.1f | %.3f |\n", bytes, tw * 1e6, tr * 1e6,
               bytes / tw * factor * 1e-9, bytes / tr * factor * 1e-9, tr / tw);
        printf("BENCH nccl.allreduce.%zu.weft_us %.2f us\n", bytes, tw * 1e6);
        printf("BENCH nccl.allreduce.%zu.raw_us %.2f us\n", bytes, tr * 1e6);
        printf("BENCH nccl.allreduce.%zu.weft_busbw %.2f GB/s\n", bytes,
               bytes / tw * factor * 1e-9);
        printf("BENCH nccl.allreduce.%zu.raw_busbw %.2f GB/s\n", bytes, bytes / tr * factor * 1e-9);
        printf("BENCH nccl.allreduce.%zu.weft_over_raw %.3f fraction\n", bytes, tr / tw);
    }
    for (int g = 0; g < r.gpus; g++)
        bufs[g].free_it = 1;
    on_devices(&r, alloc_body, bufs, sizeof *bufs);
out:
    for (int g = 0; g < r.gpus; g++) {
        if (r.comms[g])
            weft_nccl_comm_destroy(r.comms[g]);
        if (r.raw[g])
            ncclCommDestroy(r.raw[g]);
        if (r.raw_buf[g])
            cudaFree(r.raw_buf[g]);
        if (r.streams[g])
            cudaStreamDestroy(r.streams[g]);
    }
    weft_runtime_destroy(r.rt);
    return rc;
}
