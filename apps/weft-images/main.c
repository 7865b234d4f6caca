/*
 * weft-images - perceptual hashes, colour histograms and near-duplicate
 * groups for a folder of images, one weft task per image.
 *
 * Each task reads and decodes its file on the host, uploads the pixels,
 * runs five stages on the device (luminance and histogram, a Gaussian blur
 * in two passes, a 32x32 area shrink, a DCT and its 64-bit hash: see
 * stages.h), downloads the result and writes one JSON line. While one
 * task waits for the device, its worker decodes the next image. With a GPU
 * the stages are CUDA kernels; on the host backend their host versions run
 * in stream order instead, with bit-identical results.
 *
 * At the end, images whose hashes differ in at most --threshold bits are
 * grouped, the groups are written after the image lines, and a summary
 * goes to stderr. Only weft's public API is used here.
 *
 * Exit status: 0 when every file was looked at (files that are not
 * readable images are reported and counted, and do not stop the run); 1
 * when the device or the output failed; 2 for a bad command line or a
 * missing folder.
 */
#include <errno.h>
#include <getopt.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <weft.h>

#include "images.h"
#include "report.h"

enum { EXIT_RUN = 1, EXIT_USAGE = 2, DEFAULT_THRESHOLD = 10, SHOWN_GROUPS = 5 };

typedef struct options {
    const char *output, *truth, *trace, *bench;
    unsigned threshold, workers, inflight;
    weft_backend backend;
    bool quiet;
} options;

/* What one file gave. */
typedef struct outcome {
    bool ok;
    uint64_t hash;
} outcome;

typedef struct run {
    options opt;
    weft_runtime *rt;
    wi_files files;
    wi_basis basis;
    bool kernels; /* the device runs CUDA kernels (else the host versions) */
    FILE *out;
    outcome *outcomes;
    weft_sem *slots; /* images in flight */
    wi_activity activity;
    atomic_size_t done, failed, device_failed;
    atomic_ullong pixel_bytes; /* decoded RGB bytes */
    atomic_bool write_failed;
} run;

typedef struct job {
    run *run;
    size_t index;
} job;

/* ---- one image ------------------------------------------------------------ */

/* Upload img, run the stages on the device, download the result. */
static int device_pass(run *r, const wi_image *img, wi_result *result)
{
    size_t n = (size_t)img->width * img->height * 3, result_at = (n + 63) / 64 * 64;
    uint8_t *staging; /* pinned with a GPU: the copies run at full speed */
    int rc = weft_host_alloc(r->rt, (void **)&staging, result_at + sizeof *result);
    if (rc)
        return rc;
    memcpy(staging, img->rgb, n);

    void *mem = NULL;
    wi_frame f;
    wi_launch launches[WI_STAGES];
    wi_activity_add(&r->activity, 0, +1);
    rc = weft_malloc_async(&mem, wi_frame_bytes(img->width, img->height));
    if (rc == WEFT_OK) {
        wi_frame_carve(&f, mem, img->width, img->height);
        f.basis = &r->basis;
        rc = weft_memcpy_async((void *)f.rgb, staging, n);
    }
    if (rc == WEFT_OK)
        rc = weft_memset_async(f.result, 0, sizeof *f.result);
    if (rc == WEFT_OK && r->kernels) {
        wi_cuda_plan(&f, &r->basis, launches);
        for (unsigned i = 0; i < WI_STAGES && rc == WEFT_OK; i++) {
            wi_launch *l = &launches[i];
            rc = weft_launch(l->kernel, (weft_dim3){l->grid[0], l->grid[1], l->grid[2]},
                             (weft_dim3){l->block[0], l->block[1], l->block[2]}, l->shared_bytes,
                             l->args);
        }
    } else if (rc == WEFT_OK) {
        void (*const host[WI_STAGES])(void *) = {wi_host_luma_hist, wi_host_blur_rows,
                                                 wi_host_blur_cols, wi_host_shrink,
                                                 wi_host_dct_hash};
        for (unsigned i = 0; i < WI_STAGES && rc == WEFT_OK; i++)
            rc = weft_host_async(host[i], &f);
    }
    if (rc == WEFT_OK)
        rc = weft_memcpy_async(staging + result_at, f.result, sizeof *result);
    if (mem)
        weft_free_async(mem);
    int waited = weft_await(); /* also after a failed enqueue: f and staging are in use */
    wi_activity_add(&r->activity, 0, -1);
    if (rc == WEFT_OK)
        rc = waited;
    if (rc == WEFT_OK)
        memcpy(result, staging + result_at, sizeof *result);
    weft_host_free(r->rt, staging);
    return rc;
}

static void *image_task(void *arg)
{
    job *j = arg;
    run *r = j->run;
    const wi_file *file = &r->files.v[j->index];
    char why[256];
    wi_image img;
    wi_result res;

    wi_activity_add(&r->activity, +1, 0);
    int rc = wi_image_load(file->path, &img, why, sizeof why);
    wi_activity_add(&r->activity, -1, 0);
    if (rc) {
        wi_report_msg("%s: %s", file->path, why);
        atomic_fetch_add(&r->failed, 1);
    } else if ((rc = device_pass(r, &img, &res)) != WEFT_OK) {
        wi_report_msg("%s: device work failed: %s", file->path, weft_last_error());
        atomic_fetch_add(&r->device_failed, 1);
    } else {
        wi_activity_add(&r->activity, +1, 0);
        r->outcomes[j->index] = (outcome){true, res.hash};
        atomic_fetch_add(&r->pixel_bytes, (unsigned long long)img.width * img.height * 3);
        if (wi_json_write(r->out, file->path, &img, &res))
            atomic_store(&r->write_failed, true);
        wi_activity_add(&r->activity, -1, 0);
    }
    wi_image_free(&img);
    atomic_fetch_add(&r->done, 1);
    weft_sem_post(r->slots);
    return NULL;
}

/* Spawn a task per file, never more than inflight at once, drawing the
 * progress bar meanwhile. */
static int run_all(run *r, job *jobs)
{
    for (size_t i = 0; i < r->files.n; i++) {
        int rc = weft_sem_wait(r->slots); /* a plain thread: blocks */
        jobs[i] = (job){r, i};
        if (rc == WEFT_OK && (rc = weft_spawn(r->rt, NULL, image_task, &jobs[i], NULL)))
            weft_sem_post(r->slots); /* the slot it would have given back */
        if (rc) {                    /* those started still finish; the rest are not looked at */
            wi_report_msg("cannot start a task: %s", weft_last_error());
            return rc;
        }
        wi_report_progress(atomic_load(&r->done));
    }
    return WEFT_OK;
}

/* Wait until every task has given its slot back. */
static void wait_all(run *r)
{
    for (unsigned held = 0; held < r->opt.inflight;) {
        if (weft_sem_trywait(r->slots) == WEFT_OK) {
            held++;
            continue;
        }
        wi_report_progress(atomic_load(&r->done));
        usleep(10000);
    }
    wi_report_progress(atomic_load(&r->done));
    wi_report_end();
}

/* ---- groups ----------------------------------------------------------------- */

/* Group the hashes, write one JSON line per group, show the first few on
 * stderr. group[] receives each file's group (or -1). */
static size_t write_groups(run *r, long *group, size_t *grouped)
{
    size_t n = r->files.n, m = 0;
    uint64_t *hash = malloc((n ? n : 1) * sizeof *hash);
    size_t *index = malloc((n ? n : 1) * sizeof *index);
    long *g = malloc((n ? n : 1) * sizeof *g);
    size_t groups = 0;
    *grouped = 0;
    for (size_t i = 0; i < n; i++)
        group[i] = -1;
    if (!hash || !index || !g) {
        wi_report_msg("out of memory for grouping");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        if (r->outcomes[i].ok) {
            hash[m] = r->outcomes[i].hash;
            index[m++] = i;
        }
    groups = wi_group(hash, m, r->opt.threshold, g);
    for (size_t k = 0; k < m; k++)
        group[index[k]] = g[k];
    for (size_t id = 0; id < groups; id++) {
        fprintf(r->out, "{\"group\":%zu,\"images\":[", id + 1);
        bool first = true;
        if (id < SHOWN_GROUPS)
            fprintf(stderr, "group %zu:", id + 1);
        for (size_t i = 0; i < n; i++) /* files are sorted: members in path order */
            if (group[i] == (long)id) {
                if (!first)
                    fputc(',', r->out);
                if (wi_json_put_string(r->out, r->files.v[i].path))
                    atomic_store(&r->write_failed, true);
                if (id < SHOWN_GROUPS)
                    fprintf(stderr, " %s", r->files.v[i].path);
                first = false;
                ++*grouped;
            }
        fputs("]}\n", r->out);
        if (id < SHOWN_GROUPS)
            fputc('\n', stderr);
    }
    if (groups > SHOWN_GROUPS)
        fprintf(stderr, "... and %zu more groups (all in the output)\n", groups - SHOWN_GROUPS);
out:
    free(hash);
    free(index);
    free(g);
    return groups;
}

/* ---- the summary ------------------------------------------------------------ */

static void summary(run *r, const char *backend, double wall, double cpu, const weft_stats *st)
{
    size_t images =
        atomic_load(&r->done) - atomic_load(&r->failed) - atomic_load(&r->device_failed);
    double busy = 0;
    for (unsigned d = 0; d < st->devices && d < WEFT_STATS_DEVICES; d++)
        busy += (double)st->device_busy_ns[d] / 1e9;
    unsigned devices = st->devices ? st->devices : 1;
    double pct = wall > 0 ? 100.0 / wall : 0;
    fprintf(stderr, "weft-images: %zu files: %zu images, %zu not readable images", r->files.n,
            images, atomic_load(&r->failed));
    if (atomic_load(&r->device_failed))
        fprintf(stderr, ", %zu failed on the device", atomic_load(&r->device_failed));
    unsigned workers = weft_runtime_workers(r->rt);
    fprintf(stderr, "\n  backend %s (%u device%s, %s), %u worker%s\n", backend, devices,
            devices > 1 ? "s" : "", r->kernels ? "CUDA kernels" : "host versions of the kernels",
            workers, workers > 1 ? "s" : "");
    fprintf(stderr, "  %.2f s: %.1f images/s, %.1f MB/s decoded\n", wall,
            wall > 0 ? (double)images / wall : 0,
            wall > 0 ? (double)atomic_load(&r->pixel_bytes) / 1e6 / wall : 0);
    double device_pct = busy / devices * pct, host_pct = (double)r->activity.host_ns / 1e9 * pct;
    double cores = wall > 0 ? cpu / wall : 0, overlap_pct = (double)r->activity.both_ns / 1e9 * pct;
    fprintf(stderr,
            "  %s busy %.1f%%, host busy %.1f%% (%.2f cores used), overlap %.1f%% "
            "(host and device work at once)\n",
            r->kernels ? "GPU" : "device", device_pct, host_pct, cores, overlap_pct);
    if (r->opt.bench) {
        const char *b = r->opt.bench;
        printf("BENCH %s.images_per_s %.1f images/s\n", b, wall > 0 ? (double)images / wall : 0);
        printf("BENCH %s.cores %.2f cores\n", b, cores);
        printf("BENCH %s.device_busy %.1f %%\n", b, device_pct);
        printf("BENCH %s.overlap %.1f %%\n", b, overlap_pct);
    }
}

/* ---- the command line ----------------------------------------------------- */

static void usage(FILE *f)
{
    fputs("usage: weft-images [options] FOLDER...\n"
          "Hash every image under the folders, write one JSON line per image, then group\n"
          "near-duplicates. PNG, JPEG, BMP, GIF and PNM (through stb_image).\n"
          "\n"
          "  -o, --output FILE     JSON lines to FILE instead of stdout\n"
          "  -t, --threshold BITS  hashes at most BITS apart (0-64) are near-duplicates;\n"
          "                        default 10\n"
          "  -j, --workers N       worker threads (default: one per CPU)\n"
          "      --inflight N      images in flight at once (default: 8 per worker)\n"
          "      --backend NAME    auto (default), cuda or host\n"
          "      --truth FILE      score the groups against FILE: one line per true group,\n"
          "                        its paths relative to the folder, separated by tabs\n"
          "      --trace FILE      write a timeline of the run (as WEFT_TRACE=FILE)\n"
          "      --bench NAME      print BENCH lines (images/s, cores, busy shares) on\n"
          "                        stdout; needs -o\n"
          "  -q, --quiet           no progress bar\n"
          "  -h, --help            this text\n",
          f);
}

static int parse_uint(const char *arg, const char *what, unsigned lo, unsigned hi, unsigned *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] == '-' || v < lo || v > hi) {
        fprintf(stderr, "weft-images: %s must be a whole number from %u to %u, not '%s'\n", what,
                lo, hi, arg);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

static int parse_options(int argc, char **argv, options *o)
{
    enum { OPT_INFLIGHT = 256, OPT_BACKEND, OPT_TRUTH, OPT_TRACE, OPT_BENCH };
    static const struct option longs[] = {
        {"output", required_argument, NULL, 'o'},
        {"threshold", required_argument, NULL, 't'},
        {"workers", required_argument, NULL, 'j'},
        {"inflight", required_argument, NULL, OPT_INFLIGHT},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"truth", required_argument, NULL, OPT_TRUTH},
        {"trace", required_argument, NULL, OPT_TRACE},
        {"bench", required_argument, NULL, OPT_BENCH},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    *o = (options){.threshold = DEFAULT_THRESHOLD};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:t:j:qh", longs, NULL)) != -1) {
        switch (c) {
        case 'o':
            o->output = optarg;
            break;
        case 't':
            if (parse_uint(optarg, "--threshold", 0, 64, &o->threshold))
                return -1;
            break;
        case 'j':
            if (parse_uint(optarg, "--workers", 1, 4096, &o->workers))
                return -1;
            break;
        case OPT_INFLIGHT:
            if (parse_uint(optarg, "--inflight", 1, 1u << 20, &o->inflight))
                return -1;
            break;
        case OPT_BACKEND:
            if (!strcmp(optarg, "auto"))
                o->backend = WEFT_BACKEND_AUTO;
            else if (!strcmp(optarg, "cuda"))
                o->backend = WEFT_BACKEND_CUDA;
            else if (!strcmp(optarg, "host"))
                o->backend = WEFT_BACKEND_HOST;
            else {
                fprintf(stderr, "weft-images: --backend must be auto, cuda or host, not '%s'\n",
                        optarg);
                return -1;
            }
            break;
        case OPT_TRUTH:
            o->truth = optarg;
            break;
        case OPT_TRACE:
            o->trace = optarg;
            break;
        case OPT_BENCH:
            o->bench = optarg;
            break;
        case 'q':
            o->quiet = true;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case ':':
            fprintf(stderr, "weft-images: %s needs a value\n", argv[optind - 1]);
            return -1;
        default:
            fprintf(stderr, "weft-images: unknown option '%s'\n", argv[optind - 1]);
            return -1;
        }
    }
    if (optind == argc) {
        fprintf(stderr, "weft-images: no folder given\n");
        return -1;
    }
    if (o->bench && !o->output) {
        fprintf(stderr, "weft-images: --bench needs -o: stdout carries the BENCH lines\n");
        return -1;
    }
    return 0;
}

/* ---- main ----------------------------------------------------------------- */

static int start_runtime(run *r, const char **backend)
{
    if (r->opt.trace && setenv("WEFT_TRACE", r->opt.trace, 1) != 0) {
        fprintf(stderr, "weft-images: --trace: %s\n", strerror(errno));
        return -1;
    }
    weft_config cfg = {.workers = r->opt.workers, .backend = r->opt.backend};
    cfg.host_threads = r->opt.workers; /* the host backend runs the stages: as many as workers */
    if (weft_runtime_create(&r->rt, &cfg) != WEFT_OK) {
        fprintf(stderr, "weft-images: cannot start: %s\n", weft_last_error());
        return -1;
    }
    *backend = weft_backend_name(r->rt); /* opens the devices */
    if (!strcmp(*backend, "none")) {
        fprintf(stderr, "weft-images: no device: %s\n", weft_last_error());
        return -1;
    }
    wi_frame probe = {.width = 1, .height = 1};
    wi_launch l[WI_STAGES];
    r->kernels = !strcmp(*backend, "cuda") && wi_cuda_plan(&probe, &r->basis, l) == WI_STAGES;
    if (!r->opt.workers)
        r->opt.workers = weft_runtime_workers(r->rt);
    if (!r->opt.inflight)
        r->opt.inflight = 8 * r->opt.workers;
    if (weft_sem_create(&r->slots, r->opt.inflight) != WEFT_OK) {
        fprintf(stderr, "weft-images: %s\n", weft_last_error());
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static run r; /* zeroed: atomics start at 0 */
    char why[512];
    if (parse_options(argc, argv, &r.opt)) {
        fputs("Try 'weft-images --help'.\n", stderr);
        return EXIT_USAGE;
    }
    for (int i = optind; i < argc; i++)
        if (wi_files_add(&r.files, argv[i], why, sizeof why)) {
            fprintf(stderr, "weft-images: %s\n", why);
            return EXIT_USAGE;
        }
    wi_files_sort(&r.files);
    r.out = stdout;
    if (r.opt.output && !(r.out = fopen(r.opt.output, "w"))) {
        fprintf(stderr, "weft-images: %s: %s\n", r.opt.output, strerror(errno));
        return EXIT_USAGE;
    }
    wi_basis_init(&r.basis);
    r.outcomes = calloc(r.files.n ? r.files.n : 1, sizeof *r.outcomes);
    job *jobs = calloc(r.files.n ? r.files.n : 1, sizeof *jobs);
    long *group = calloc(r.files.n ? r.files.n : 1, sizeof *group);
    const char *backend = "none";
    if (!r.outcomes || !jobs || !group) {
        fprintf(stderr, "weft-images: out of memory for %zu files\n", r.files.n);
        return EXIT_RUN;
    }
    if (start_runtime(&r, &backend))
        return EXIT_RUN;

    wi_activity_init(&r.activity);
    /* The bar only on a terminal, and not when the JSON lines scroll past on it */
    bool bar = !r.opt.quiet && isatty(STDERR_FILENO) && !(r.out == stdout && isatty(STDOUT_FILENO));
    wi_report_start(r.files.n, bar);
    double cpu0 = wi_cpu_seconds();
    uint64_t t0 = wi_now_ns();
    int started = run_all(&r, jobs);
    wait_all(&r);
    double wall = (double)(wi_now_ns() - t0) / 1e9, cpu = wi_cpu_seconds() - cpu0;
    wi_activity_settle(&r.activity);
    weft_stats st;
    weft_stats_get(r.rt, &st);

    size_t grouped, groups = write_groups(&r, group, &grouped);
    bool out_failed = atomic_load(&r.write_failed) || fflush(r.out) != 0 || ferror(r.out) ||
                      (r.out != stdout && fclose(r.out) != 0);
    summary(&r, backend, wall, cpu, &st);
    fprintf(stderr, "  %zu near-duplicate groups holding %zu images (threshold %u bits)\n", groups,
            grouped, r.opt.threshold);
    int status = 0;
    if (r.opt.truth) {
        const char **rel = malloc((r.files.n ? r.files.n : 1) * sizeof *rel);
        wi_score sc;
        for (size_t i = 0; rel && i < r.files.n; i++)
            rel[i] = r.files.v[i].rel;
        if (!rel || wi_score_truth(r.opt.truth, rel, group, r.files.n, &sc, why, sizeof why)) {
            fprintf(stderr, "weft-images: --truth: %s\n", rel ? why : "out of memory");
            status = EXIT_USAGE;
        } else {
            fprintf(stderr,
                    "  against the truth: precision %.3f, recall %.3f (pairs: %llu found, %llu "
                    "true, %llu both)\n",
                    sc.precision, sc.recall, (unsigned long long)sc.predicted,
                    (unsigned long long)sc.truth, (unsigned long long)sc.both);
        }
        free(rel);
    }
    if (out_failed) {
        fprintf(stderr, "weft-images: writing %s failed\n", r.opt.output ? r.opt.output : "stdout");
        status = EXIT_RUN;
    }
    if (atomic_load(&r.device_failed) || started != WEFT_OK)
        status = EXIT_RUN;

    weft_sem_destroy(r.slots);
    weft_runtime_destroy(r.rt);
    free(r.outcomes);
    free(jobs);
    free(group);
    wi_files_free(&r.files);
    return status;
}
