/*
 * weft-images-threads - weft-images' pipeline on a thread pool, for the
 * benchmark: what the same program looks like without weft.
 *
 * Each of N threads owns a CUDA stream, a pinned staging buffer and a
 * device buffer (both grown as needed), takes the next file, decodes it,
 * uploads it, launches the same five kernels (stages.cu), downloads the
 * result and waits for it with cudaStreamSynchronize, then writes the JSON
 * line. The host work, the kernels and the output are those of
 * weft-images (the same code), so the two differ only in how they wait.
 *
 *   weft-images-threads [-j THREADS] [--sync spin|block] [-o FILE]
 *                       [-t BITS] [--bench NAME] FOLDER...
 *
 * --sync: how cudaStreamSynchronize waits: spin (CUDA's choice for a
 * process with fewer GPUs than cores, the default) or block (sleep in the
 * driver). Needs a GPU: exits 77 without one.
 */
#include <errno.h>
#include <getopt.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "images.h"
#include "report.h"

typedef struct peer {
    wi_files files;
    wi_basis basis;
    FILE *out;
    wi_features *features;
    bool *ok;
    atomic_size_t next, images, failed;
    atomic_ullong pixel_bytes;
    atomic_int cuda_failed;
} peer;

typedef struct worker {
    peer *p;
    cudaStream_t stream;
    uint8_t *staging;
    size_t staging_cap;
    void *device;
    size_t device_cap;
} worker;

static int check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "weft-images-threads: %s: %s\n", what, cudaGetErrorString(e));
    return -1;
}

static int grow(worker *w, size_t staging, size_t device)
{
    if (staging > w->staging_cap) {
        cudaFreeHost(w->staging);
        w->staging = NULL;
        w->staging_cap = 0;
        if (check(cudaHostAlloc((void **)&w->staging, staging, cudaHostAllocDefault),
                  "cudaHostAlloc"))
            return -1;
        w->staging_cap = staging;
    }
    if (device > w->device_cap) {
        cudaFree(w->device);
        w->device = NULL;
        w->device_cap = 0;
        if (check(cudaMalloc(&w->device, device), "cudaMalloc"))
            return -1;
        w->device_cap = device;
    }
    return 0;
}

/* The device part of one image, waited for with a blocking sync. */
static int device_pass(worker *w, const wi_image *img, wi_result *result)
{
    size_t n = (size_t)img->width * img->height * 3, result_at = (n + 63) / 64 * 64;
    if (grow(w, result_at + sizeof *result, wi_frame_bytes(img->width, img->height)))
        return -1;
    memcpy(w->staging, img->rgb, n);
    wi_frame f;
    wi_launch l[WI_STAGES];
    wi_frame_carve(&f, w->device, img->width, img->height);
    wi_cuda_plan(&f, &w->p->basis, l);
    int rc = check(cudaMemcpyAsync((void *)f.rgb, w->staging, n, cudaMemcpyHostToDevice, w->stream),
                   "cudaMemcpyAsync") ||
             check(cudaMemsetAsync(f.result, 0, sizeof *f.result, w->stream), "cudaMemsetAsync");
    for (unsigned i = 0; i < WI_STAGES && rc == 0; i++)
        rc = check(cudaLaunchKernel(l[i].kernel, (dim3){l[i].grid[0], l[i].grid[1], l[i].grid[2]},
                                    (dim3){l[i].block[0], l[i].block[1], l[i].block[2]}, l[i].args,
                                    l[i].shared_bytes, w->stream),
                   "cudaLaunchKernel");
    if (rc == 0)
        rc = check(cudaMemcpyAsync(w->staging + result_at, f.result, sizeof *result,
                                   cudaMemcpyDeviceToHost, w->stream),
                   "cudaMemcpyAsync");
    if (check(cudaStreamSynchronize(w->stream), "cudaStreamSynchronize") || rc)
        return -1;
    memcpy(result, w->staging + result_at, sizeof *result);
    return 0;
}

static void *work(void *arg)
{
    worker *w = arg;
    peer *p = w->p;
    char why[256];
    size_t i;
    if (check(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
        atomic_store(&p->cuda_failed, 1);
        return NULL;
    }
    while (!atomic_load(&p->cuda_failed) && (i = atomic_fetch_add(&p->next, 1)) < p->files.n) {
        const wi_file *file = &p->files.v[i];
        wi_image img;
        wi_result res;
        if (wi_image_load(file->path, &img, why, sizeof why)) {
            wi_report_msg("%s: %s", file->path, why);
            atomic_fetch_add(&p->failed, 1);
            continue;
        }
        if (device_pass(w, &img, &res)) {
            atomic_store(&p->cuda_failed, 1);
        } else {
            p->features[i] = (wi_features){res.hash, res.detail};
            p->ok[i] = true;
            atomic_fetch_add(&p->images, 1);
            atomic_fetch_add(&p->pixel_bytes, (unsigned long long)img.width * img.height * 3);
            wi_json_write(p->out, file->path, &img, &res);
        }
        wi_image_free(&img);
    }
    cudaStreamSynchronize(w->stream);
    cudaStreamDestroy(w->stream);
    cudaFreeHost(w->staging);
    cudaFree(w->device);
    return NULL;
}

static void usage(FILE *f)
{
    fputs("usage: weft-images-threads [-j THREADS] [--sync spin|block] [-o FILE] [-t BITS]\n"
          "                           [--bench NAME] FOLDER...\n",
          f);
}

int main(int argc, char **argv)
{
    static const struct option longs[] = {{"sync", required_argument, NULL, 's'},
                                          {"bench", required_argument, NULL, 'b'},
                                          {"help", no_argument, NULL, 'h'},
                                          {0}};
    static peer p;
    unsigned long threads = 0, threshold = 10;
    const char *output = NULL, *bench = NULL;
    bool block = false;
    char why[512];
    int c;
    while ((c = getopt_long(argc, argv, "j:o:t:h", longs, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'j':
            threads = strtoul(optarg, &end, 10);
            break;
        case 't':
            threshold = strtoul(optarg, &end, 10);
            break;
        case 'o':
            output = optarg;
            break;
        case 'b':
            bench = optarg;
            break;
        case 's':
            if (strcmp(optarg, "spin") && strcmp(optarg, "block")) {
                usage(stderr);
                return 2;
            }
            block = !strcmp(optarg, "block");
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (end && (*end || threshold > 64 || threads > 4096)) {
            usage(stderr);
            return 2;
        }
    }
    if (optind == argc) {
        usage(stderr);
        return 2;
    }
    for (int i = optind; i < argc; i++)
        if (wi_files_add(&p.files, argv[i], why, sizeof why)) {
            fprintf(stderr, "weft-images-threads: %s\n", why);
            return 2;
        }
    wi_files_sort(&p.files);
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
        fprintf(stderr, "weft-images-threads: no GPU\n");
        return 77;
    }
    if (block && check(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync), "cudaSetDeviceFlags"))
        return 1;
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned long)n : 1;
    }
    p.out = output ? fopen(output, "w") : stdout;
    p.features = calloc(p.files.n + 1, sizeof *p.features);
    p.ok = calloc(p.files.n + 1, sizeof *p.ok);
    worker *ws = calloc(threads, sizeof *ws);
    pthread_t *ts = calloc(threads, sizeof *ts);
    if (!p.out || !p.features || !p.ok || !ws || !ts) {
        fprintf(stderr, "weft-images-threads: %s\n", p.out ? "out of memory" : strerror(errno));
        return 1;
    }
    wi_basis_init(&p.basis);
    if (check(cudaFree(NULL), "creating the CUDA context")) /* not timed */
        return 1;
    wi_report_start(p.files.n, false);

    double cpu0 = wi_cpu_seconds();
    uint64_t t0 = wi_now_ns();
    for (unsigned long t = 0; t < threads; t++) {
        ws[t].p = &p;
        if (pthread_create(&ts[t], NULL, work, &ws[t]) != 0) {
            fprintf(stderr, "weft-images-threads: cannot start thread %lu\n", t);
            return 1;
        }
    }
    for (unsigned long t = 0; t < threads; t++)
        pthread_join(ts[t], NULL);
    double wall = (double)(wi_now_ns() - t0) / 1e9, cpu = wi_cpu_seconds() - cpu0;

    /* The same grouping as weft-images, on the images in file order. */
    size_t m = 0;
    long *group = calloc(p.files.n + 1, sizeof *group);
    wi_features *features = calloc(p.files.n + 1, sizeof *features);
    for (size_t i = 0; features && i < p.files.n; i++)
        if (p.ok[i])
            features[m++] = p.features[i];
    size_t groups =
        group && features ? wi_group(features, m, (unsigned)threshold, true, group, NULL, NULL) : 0;
    fflush(p.out);

    size_t images = atomic_load(&p.images);
    fprintf(stderr,
            "weft-images-threads: %zu images, %zu not readable; %lu threads, %s sync\n"
            "  %.2f s: %.1f images/s, %.1f MB/s decoded, %.2f cores used; %zu groups\n",
            images, atomic_load(&p.failed), threads, block ? "blocking" : "spinning", wall,
            (double)images / wall, (double)atomic_load(&p.pixel_bytes) / 1e6 / wall, cpu / wall,
            groups);
    if (bench) {
        printf("BENCH %s.images_per_s %.1f images/s\n", bench, (double)images / wall);
        printf("BENCH %s.cores %.2f cores\n", bench, cpu / wall);
    }
    return atomic_load(&p.cuda_failed) ? 1 : 0;
}
