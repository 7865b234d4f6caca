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
 * At the end, images whose hashes differ in at most --threshold bits, and
 * whose details (the magnitude of the frequencies the hash keeps only the
 * signs of) agree, are grouped; the groups are written after the image
 * lines, then the pairs the detail kept apart, and a summary goes to
 * stderr. Only weft's public API is used here.
 *
 * Exit status: 0 when every file was looked at (files that are not
 * readable images are reported and counted, and do not stop the run); 1
 * when the device or writing the output failed; 2 for a bad command line,
 * a missing folder, a --truth file that cannot be read or an -o that
 * cannot be opened or is one of the inputs; 130 or 143 when SIGINT or
 * SIGTERM stopped the run (the lines written are whole, the summary says
 * what was done).
 *
 * Memory: each task reserves what its image may take at the decoder's
 * peak (from the header, before decoding) against --memory, so that many
 * large images never decode at once; one image always may, alone.
 *
 * Signals: SIGINT and SIGTERM are blocked in every thread and taken by a
 * thread of ours in sigwait, which only records the signal and wakes the
 * main thread; the main thread stops spawning, cancels the tasks in flight
 * (weft_cancel: one that has not started never will, one decoding drops
 * its image) and waits for them before writing the summary.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <weft.h>

#include "images.h"
#include "report.h"

enum { EXIT_RUN = 1, EXIT_USAGE = 2, DEFAULT_THRESHOLD = 10, SHOWN_GROUPS = 5 };

typedef struct options {
    const char *output, *truth, *trace, *bench;
    unsigned threshold, workers, inflight;
    uint64_t max_pixels, memory; /* memory in bytes; 0: a quarter of the RAM */
    weft_backend backend;
    bool quiet, hash_only, stats;
} options;

/* Bytes of memory the images in flight may take, reserved before each
 * decodes: a task waits (suspended) until its image fits, or until no
 * other image holds any. */
typedef struct budget {
    weft_mutex *lock;
    weft_cond *freed;
    uint64_t limit, used;
    unsigned holders;
} budget;

/* What one file gave. */
typedef struct outcome {
    bool ok;
    wi_features features;
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
    budget memory;
    wi_activity activity;
    atomic_size_t done, failed, device_failed, dropped;
    atomic_ullong pixel_bytes; /* decoded RGB bytes */
    atomic_int write_errno;    /* the first failed write's errno, or 0 */
    atomic_int stop;           /* the signal that stops the run, or 0 */
} run;

typedef struct job {
    run *run;
    size_t index;
    weft_task *task;
} job;

static void write_failed(run *r)
{
    int none = 0;
    atomic_compare_exchange_strong(&r->write_errno, &none, errno ? errno : EIO);
}

/* ---- the memory budget ------------------------------------------------------ */

/* Reserve need bytes; WEFT_ECANCELED when the task was cancelled waiting. */
static int budget_take(budget *b, uint64_t need)
{
    int rc = weft_mutex_lock(b->lock);
    if (rc)
        return rc;
    while (rc == WEFT_OK && b->holders > 0 && b->used + need > b->limit)
        rc = weft_cond_wait(b->freed, b->lock); /* re-takes the lock, also when cancelled */
    if (rc == WEFT_OK) {
        b->used += need;
        b->holders++;
    }
    weft_mutex_unlock(b->lock);
    return rc;
}

static void budget_give(budget *b, uint64_t need)
{
    if (weft_mutex_lock(b->lock) != WEFT_OK)
        return; /* cancelled: so is every task, and none takes from it again */
    b->used -= need;
    b->holders--;
    weft_cond_broadcast(b->freed);
    weft_mutex_unlock(b->lock);
}

/* ---- one image ------------------------------------------------------------ */

/* Upload img's pixels, run the stages on the device, download the result.
 * The pixels are freed once copied to the staging block: a task waiting
 * on the device holds one copy of its image, not two. */
static int device_pass(run *r, wi_image *img, wi_result *result)
{
    size_t n = (size_t)img->width * img->height * 3, result_at = (n + 63) / 64 * 64;
    uint8_t *staging; /* pinned with a GPU: the copies run at full speed */
    int rc = weft_host_alloc(r->rt, (void **)&staging, result_at + sizeof *result);
    if (rc)
        return rc;
    memcpy(staging, img->rgb, n);
    wi_image_free(img);

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
    char why[256], shown[1024];
    wi_image img = {0};
    wi_probe pr;
    wi_result res;

    wi_activity_add(&r->activity, +1, 0);
    int rc = wi_image_probe(file->path, r->opt.max_pixels, &pr, why, sizeof why);
    wi_activity_add(&r->activity, -1, 0);
    bool held = false;
    if (rc == 0) { /* reserve before decoding: the decoder's peak is the big one */
        if (budget_take(&r->memory, pr.need) == WEFT_OK)
            held = true;
        else
            wi_probe_close(&pr), rc = WEFT_ECANCELED;
    }
    if (rc == 0) {
        wi_activity_add(&r->activity, +1, 0);
        rc = wi_image_decode(&pr, &img, why, sizeof why);
        wi_activity_add(&r->activity, -1, 0);
    }
    if (rc == WEFT_ECANCELED || (rc == 0 && weft_cancelled())) {
        atomic_fetch_add(&r->dropped, 1);
    } else if (rc) {
        wi_report_msg("%s: %s", wi_shown(file->path, shown, sizeof shown), why);
        atomic_fetch_add(&r->failed, 1);
    } else if ((rc = device_pass(r, &img, &res)) != WEFT_OK) {
        if (rc == WEFT_ECANCELED) {
            atomic_fetch_add(&r->dropped, 1);
        } else {
            wi_report_msg("%s: device work failed: %s", wi_shown(file->path, shown, sizeof shown),
                          weft_last_error());
            atomic_fetch_add(&r->device_failed, 1);
        }
    } else {
        wi_activity_add(&r->activity, +1, 0);
        r->outcomes[j->index] = (outcome){true, {res.hash, res.detail}};
        atomic_fetch_add(&r->pixel_bytes, (unsigned long long)img.width * img.height * 3);
        if (wi_json_write(r->out, file->path, &img, &res))
            write_failed(r);
        wi_activity_add(&r->activity, -1, 0);
    }
    wi_image_free(&img);
    if (held)
        budget_give(&r->memory, pr.need);
    atomic_fetch_add(&r->done, 1);
    weft_sem_post(r->slots);
    return NULL;
}

/* Spawn a task per file, never more than inflight at once, drawing the
 * progress bar meanwhile; stop early on a signal. *spawned receives the
 * number of tasks started. */
static int run_all(run *r, job *jobs, size_t *spawned)
{
    static const weft_task_opts opts = {.name = "image"};
    for (size_t i = 0; i < r->files.n && !atomic_load(&r->stop); i++) {
        int rc = weft_sem_wait(r->slots); /* a plain thread: blocks; a signal posts too */
        if (rc == WEFT_OK && atomic_load(&r->stop)) {
            weft_sem_post(r->slots);
            break;
        }
        jobs[i] = (job){r, i, NULL};
        if (rc == WEFT_OK && (rc = weft_spawn(r->rt, &jobs[i].task, image_task, &jobs[i], &opts)))
            weft_sem_post(r->slots); /* the slot it would have given back */
        if (rc) {                    /* those started still finish; the rest are not looked at */
            wi_report_msg("cannot start a task: %s", weft_last_error());
            return rc;
        }
        *spawned = i + 1;
        wi_report_progress(atomic_load(&r->done));
    }
    return WEFT_OK;
}

/* Wait until every task spawned has ended; on a signal, cancel those still
 * running or waiting to start first (one that never started never counts
 * as done, so the joins are what wait for it). */
static void wait_all(run *r, job *jobs, size_t spawned)
{
    while (atomic_load(&r->done) < spawned && !atomic_load(&r->stop)) {
        wi_report_progress(atomic_load(&r->done));
        usleep(10000);
    }
    if (atomic_load(&r->stop))
        for (size_t i = 0; i < spawned; i++)
            weft_cancel(jobs[i].task);
    for (size_t i = 0; i < spawned; i++)
        weft_join(jobs[i].task, NULL); /* waits for the end; ETASKCANCELED if cancelled */
    wi_report_progress(atomic_load(&r->done));
    wi_report_end();
}

/* ---- signals ---------------------------------------------------------------- */

static sigset_t stop_signals;

/* Takes SIGINT and SIGTERM (blocked everywhere else): records the first
 * and wakes the main thread, wherever it waits. */
static void *signal_thread(void *arg)
{
    run *r = arg;
    for (;;) {
        int sig;
        if (sigwait(&stop_signals, &sig) != 0)
            continue;
        int none = 0;
        if (atomic_compare_exchange_strong(&r->stop, &none, sig))
            weft_sem_post(r->slots);
    }
    return NULL;
}

/* ---- groups ----------------------------------------------------------------- */

/* Pairs within the threshold that the detail refused, as file indices. */
typedef struct refusals {
    size_t (*v)[2];
    size_t n, cap;
    const size_t *file; /* feature index -> file index */
    bool short_of_memory;
} refusals;

static void note_refused(void *arg, size_t a, size_t b)
{
    refusals *rf = arg;
    if (rf->n == rf->cap) {
        size_t cap = rf->cap ? 2 * rf->cap : 64;
        void *v = realloc(rf->v, cap * sizeof *rf->v);
        if (!v) {
            rf->short_of_memory = true;
            return;
        }
        rf->v = v;
        rf->cap = cap;
    }
    rf->v[rf->n][0] = rf->file[a];
    rf->v[rf->n++][1] = rf->file[b];
}

/* Group the images that were read, with or without the confirmation by
 * detail: group[] receives each file's group (or -1); refusals, when not
 * NULL, the pairs it refused. Returns the number of groups, or -1 when
 * out of memory. */
static long group_files(const run *r, bool confirm, long *group, refusals *rf)
{
    size_t n = r->files.n, m = 0;
    wi_features *f = calloc(n ? n : 1, sizeof *f); /* calloc: gcc cannot tell only m are read */
    size_t *index = malloc((n ? n : 1) * sizeof *index);
    long *g = malloc((n ? n : 1) * sizeof *g);
    long groups = -1;
    for (size_t i = 0; i < n; i++)
        group[i] = -1;
    if (f && index && g) {
        for (size_t i = 0; i < n; i++)
            if (r->outcomes[i].ok) {
                f[m] = r->outcomes[i].features;
                index[m++] = i;
            }
        if (rf)
            rf->file = index;
        groups = (long)wi_group(f, m, r->opt.threshold, confirm, g, rf ? note_refused : NULL, rf);
        for (size_t k = 0; k < m; k++)
            group[index[k]] = g[k];
    }
    if (rf)
        rf->file = NULL;
    free(f);
    free(index);
    free(g);
    return groups;
}

/* One line per refused pair whose images the groups keep apart: where the
 * second signal changed the answer. Returns how many. */
static size_t write_refused(run *r, const refusals *rf, const long *group)
{
    size_t shown = 0;
    for (size_t k = 0; k < rf->n; k++) {
        size_t a = rf->v[k][0], b = rf->v[k][1];
        if (group[a] >= 0 && group[a] == group[b])
            continue; /* joined through others all the same */
        const wi_features *fa = &r->outcomes[a].features, *fb = &r->outcomes[b].features;
        int bad = fputs("{\"unconfirmed\":[", r->out) == EOF;
        bad |= wi_json_put_string(r->out, r->files.v[a].path);
        bad |= fputc(',', r->out) == EOF;
        bad |= wi_json_put_string(r->out, r->files.v[b].path);
        bad |= fprintf(r->out, "],\"bits\":%d,\"detail\":[%.3f,%.3f]}\n",
                       __builtin_popcountll(fa->hash ^ fb->hash), wi_detail_levels(fa->detail),
                       wi_detail_levels(fb->detail)) < 0;
        if (bad)
            write_failed(r);
        shown++;
    }
    return shown;
}

/* Group the images, write one JSON line per group and per pair the
 * detail kept apart, show the first few groups on stderr. group[]
 * receives each file's group (or -1); *refused the number of pairs kept
 * apart. */
static size_t write_groups(run *r, long *group, size_t *grouped, size_t *refused)
{
    size_t n = r->files.n;
    refusals rf = {0};
    char shown[1024];
    *grouped = *refused = 0;
    long found = group_files(r, !r->opt.hash_only, group, &rf);
    if (found < 0 || rf.short_of_memory) {
        wi_report_msg("out of memory for grouping");
        free(rf.v);
        return found < 0 ? 0 : (size_t)found;
    }
    size_t groups = (size_t)found;
    for (size_t id = 0; id < groups; id++) {
        if (fprintf(r->out, "{\"group\":%zu,\"images\":[", id + 1) < 0)
            write_failed(r);
        bool first = true;
        if (id < SHOWN_GROUPS)
            fprintf(stderr, "group %zu:", id + 1);
        for (size_t i = 0; i < n; i++) /* files are sorted: members in path order */
            if (group[i] == (long)id) {
                if (!first)
                    fputc(',', r->out);
                if (wi_json_put_string(r->out, r->files.v[i].path))
                    write_failed(r);
                if (id < SHOWN_GROUPS)
                    fprintf(stderr, " %s", wi_shown(r->files.v[i].path, shown, sizeof shown));
                first = false;
                ++*grouped;
            }
        if (fputs("]}\n", r->out) == EOF)
            write_failed(r);
        if (id < SHOWN_GROUPS)
            fputc('\n', stderr);
    }
    if (groups > SHOWN_GROUPS)
        fprintf(stderr, "... and %zu more groups (all in the output)\n", groups - SHOWN_GROUPS);
    *refused = write_refused(r, &rf, group);
    free(rf.v);
    return groups;
}

/* Score groups against the truth and say so on stderr; how is what
 * grouped them. Returns 0, or -1 with a message. */
static int score(const run *r, const wi_truth *truth, const long *group, const char *how)
{
    const char **rel = malloc((r->files.n ? r->files.n : 1) * sizeof *rel);
    char why[256];
    wi_score sc;
    for (size_t i = 0; rel && i < r->files.n; i++)
        rel[i] = r->files.v[i].rel;
    if (!rel || wi_score_truth(truth, rel, group, r->files.n, &sc, why, sizeof why)) {
        fprintf(stderr, "weft-images: --truth: %s\n", rel ? why : "out of memory");
        free(rel);
        return -1;
    }
    fprintf(stderr,
            "  against the truth, %-16s precision %.3f, recall %.3f (pairs: %llu found, %llu "
            "true, %llu both)\n",
            how, sc.precision, sc.recall, (unsigned long long)sc.predicted,
            (unsigned long long)sc.truth, (unsigned long long)sc.both);
    free(rel);
    return 0;
}

/* Both ways of grouping, the one written first. */
static int score_both(const run *r, const wi_truth *truth, const long *group)
{
    long *other = malloc((r->files.n ? r->files.n : 1) * sizeof *other);
    bool confirm = !r->opt.hash_only;
    if (!other || group_files(r, !confirm, other, NULL) < 0) {
        fprintf(stderr, "weft-images: --truth: out of memory\n");
        free(other);
        return -1;
    }
    int rc = score(r, truth, group, confirm ? "hash and detail:" : "hash alone:");
    if (rc == 0)
        rc = score(r, truth, other, confirm ? "hash alone:" : "hash and detail:");
    free(other);
    return rc;
}

/* ---- the summary ------------------------------------------------------------ */

static void summary(run *r, const char *backend, double wall, double cpu, const weft_stats *st)
{
    size_t images = atomic_load(&r->done) - atomic_load(&r->failed) -
                    atomic_load(&r->device_failed) - atomic_load(&r->dropped);
    double busy = 0;
    for (unsigned d = 0; d < st->devices && d < WEFT_STATS_DEVICES; d++)
        busy += (double)st->device_busy_ns[d] / 1e9;
    unsigned devices = st->devices ? st->devices : 1;
    double pct = wall > 0 ? 100.0 / wall : 0;
    fprintf(stderr, "weft-images: %zu files: %zu images, %zu not readable images", r->files.n,
            images, atomic_load(&r->failed));
    if (atomic_load(&r->device_failed))
        fprintf(stderr, ", %zu failed on the device", atomic_load(&r->device_failed));
    if (r->files.skipped)
        fprintf(stderr, ", %zu skipped (not regular files, unreadable folders, paths too long)",
                r->files.skipped);
    if (r->files.duplicates)
        fprintf(stderr, ", %zu second names of files already counted", r->files.duplicates);
    int sig = atomic_load(&r->stop);
    if (sig) {
        size_t looked = atomic_load(&r->done) - atomic_load(&r->dropped);
        fprintf(stderr, "\n  stopped by %s: %zu of %zu files looked at, %zu dropped in flight",
                sig == SIGINT ? "SIGINT" : "SIGTERM", looked, r->files.n, atomic_load(&r->dropped));
    }
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

/* --stats: weft's diagnosis of the run, which is empty when it found
 * nothing to say; say so, since the user asked. */
static void print_diagnosis(weft_runtime *rt)
{
    char text[8192];
    int len = weft_stats_report(rt, text, sizeof text);
    if (len < 0)
        fprintf(stderr, "weft-images: --stats: %s\n", weft_last_error());
    else if (len == 0)
        fputs("  weft: none of the symptoms it diagnoses in this run\n", stderr);
    else
        fputs(text, stderr);
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
          "      --hash-only       group on the hash alone, not confirming a pair by its\n"
          "                        detail (how strong the pattern the hash sees is)\n"
          "  -j, --workers N       worker threads (default: one per CPU)\n"
          "      --inflight N      images in flight at once (default: 8 per worker)\n"
          "      --memory MIB      memory the images in flight may take while decoding\n"
          "                        (default: a quarter of the RAM); one image always may\n"
          "      --max-pixels N    refuse images of more than N pixels (default 67108864,\n"
          "                        8192 x 8192; at most 268435456)\n"
          "      --backend NAME    auto (default), cuda or host\n"
          "      --truth FILE      score the groups against FILE: one line per true group,\n"
          "                        its paths relative to the folder, separated by tabs\n"
          "      --trace FILE      write a timeline of the run (as WEFT_TRACE=FILE)\n"
          "      --bench NAME      print BENCH lines (images/s, cores, busy shares) on\n"
          "                        stdout; needs -o\n"
          "      --stats           diagnose the run: what held it back, and the remedy\n"
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

static int parse_u64(const char *arg, const char *what, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] == '-' || v < lo || v > hi) {
        fprintf(stderr, "weft-images: %s must be a whole number from %llu to %llu, not '%s'\n",
                what, (unsigned long long)lo, (unsigned long long)hi, arg);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_options(int argc, char **argv, options *o)
{
    enum {
        OPT_INFLIGHT = 256,
        OPT_BACKEND,
        OPT_TRUTH,
        OPT_TRACE,
        OPT_BENCH,
        OPT_MEMORY,
        OPT_PIXELS,
        OPT_HASH_ONLY,
        OPT_STATS
    };
    static const struct option longs[] = {
        {"output", required_argument, NULL, 'o'},
        {"threshold", required_argument, NULL, 't'},
        {"hash-only", no_argument, NULL, OPT_HASH_ONLY},
        {"workers", required_argument, NULL, 'j'},
        {"inflight", required_argument, NULL, OPT_INFLIGHT},
        {"memory", required_argument, NULL, OPT_MEMORY},
        {"max-pixels", required_argument, NULL, OPT_PIXELS},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"truth", required_argument, NULL, OPT_TRUTH},
        {"trace", required_argument, NULL, OPT_TRACE},
        {"bench", required_argument, NULL, OPT_BENCH},
        {"stats", no_argument, NULL, OPT_STATS},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    *o = (options){.threshold = DEFAULT_THRESHOLD, .max_pixels = WI_DEFAULT_MAX_PIXELS};
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
        case OPT_HASH_ONLY:
            o->hash_only = true;
            break;
        case OPT_INFLIGHT:
            if (parse_uint(optarg, "--inflight", 1, 1u << 20, &o->inflight))
                return -1;
            break;
        case OPT_MEMORY:
            if (parse_u64(optarg, "--memory", 1, (uint64_t)1 << 40, &o->memory))
                return -1;
            o->memory <<= 20;
            break;
        case OPT_PIXELS:
            if (parse_u64(optarg, "--max-pixels", 1, WI_MAX_PIXELS, &o->max_pixels))
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
        case OPT_STATS:
            o->stats = true;
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
    if (!r->opt.memory) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        r->opt.memory = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 4 : 1u << 30;
    }
    r->memory.limit = r->opt.memory;
    if (weft_sem_create(&r->slots, r->opt.inflight) != WEFT_OK ||
        weft_mutex_create(&r->memory.lock) != WEFT_OK ||
        weft_cond_create(&r->memory.freed) != WEFT_OK) {
        fprintf(stderr, "weft-images: %s\n", weft_last_error());
        return -1;
    }
    return 0;
}

/* Open -o without truncating it, and refuse it when it is one of the
 * inputs (by device and inode: any spelling, any hard link), before a byte
 * of it changes. NULL with a message when it cannot be used. */
static FILE *open_output(const run *r)
{
    const char *path = r->opt.output;
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0666);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "weft-images: -o %s: cannot open for writing: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    for (size_t i = 0; i < r->files.n; i++)
        if (r->files.v[i].dev == (uint64_t)st.st_dev && r->files.v[i].ino == (uint64_t)st.st_ino) {
            char shown[1024];
            fprintf(stderr,
                    "weft-images: -o %s is the input file %s: refusing to overwrite it (left "
                    "as it was)\n",
                    path, wi_shown(r->files.v[i].path, shown, sizeof shown));
            close(fd);
            return NULL;
        }
    int flags = fcntl(fd, F_GETFL);
    if ((S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0) ||
        (flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)) {
        fprintf(stderr, "weft-images: -o %s: %s\n", path, strerror(errno));
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        fprintf(stderr, "weft-images: -o %s: %s\n", path, strerror(errno));
        close(fd);
    }
    return f;
}

int main(int argc, char **argv)
{
    static run r; /* zeroed: atomics start at 0 */
    char why[512];
    if (parse_options(argc, argv, &r.opt)) {
        fputs("Try 'weft-images --help'.\n", stderr);
        return EXIT_USAGE;
    }
    /* Before any thread exists, so that every thread inherits the mask and
     * only signal_thread takes them. */
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    wi_truth truth = {0};
    if (r.opt.truth && wi_truth_load(r.opt.truth, &truth, why, sizeof why)) {
        fprintf(stderr, "weft-images: --truth %s\n", why);
        return EXIT_USAGE;
    }
    for (int i = optind; i < argc; i++)
        if (wi_files_add(&r.files, argv[i], why, sizeof why)) {
            fprintf(stderr, "weft-images: %s\n", why);
            return EXIT_USAGE;
        }
    wi_files_sort(&r.files);
    r.out = stdout;
    if (r.opt.output && !(r.out = open_output(&r)))
        return EXIT_USAGE;
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
    pthread_t signals;
    if (pthread_create(&signals, NULL, signal_thread, &r) != 0) {
        fprintf(stderr, "weft-images: cannot start the signal thread\n");
        return EXIT_RUN;
    }

    wi_activity_init(&r.activity);
    /* The bar only on a terminal, and not when the JSON lines scroll past on it */
    bool bar = !r.opt.quiet && isatty(STDERR_FILENO) && !(r.out == stdout && isatty(STDOUT_FILENO));
    wi_report_start(r.files.n, bar);
    double cpu0 = wi_cpu_seconds();
    uint64_t t0 = wi_now_ns();
    size_t spawned = 0;
    int started = run_all(&r, jobs, &spawned);
    wait_all(&r, jobs, spawned);
    double wall = (double)(wi_now_ns() - t0) / 1e9, cpu = wi_cpu_seconds() - cpu0;
    wi_activity_settle(&r.activity);
    weft_stats st;
    weft_stats_get(r.rt, &st);

    size_t grouped, refused, groups = write_groups(&r, group, &grouped, &refused);
    if (fflush(r.out) != 0 || ferror(r.out))
        write_failed(&r);
    if (r.out != stdout && fclose(r.out) != 0)
        write_failed(&r);
    summary(&r, backend, wall, cpu, &st);
    fprintf(stderr, "  %zu near-duplicate groups holding %zu images (threshold %u bits, ", groups,
            grouped, r.opt.threshold);
    if (r.opt.hash_only)
        fprintf(stderr, "hash alone)\n");
    else
        fprintf(stderr,
                "details within %dx)\n  %zu pairs within the threshold kept apart by their "
                "detail (\"unconfirmed\" lines)\n",
                WI_DETAIL_RATIO, refused);
    if (r.opt.stats)
        print_diagnosis(r.rt);
    int status = 0;
    if (r.opt.truth && score_both(&r, &truth, group))
        status = EXIT_RUN;
    int werr = atomic_load(&r.write_errno);
    if (werr) {
        fprintf(stderr, "weft-images: writing %s failed: %s\n",
                r.opt.output ? r.opt.output : "stdout", strerror(werr));
        status = EXIT_RUN;
    }
    if (atomic_load(&r.device_failed) || started != WEFT_OK)
        status = EXIT_RUN;
    int sig = atomic_load(&r.stop);
    if (sig)
        status = 128 + sig;

    pthread_cancel(signals); /* sigwait is a cancellation point */
    pthread_join(signals, NULL);
    weft_sem_destroy(r.slots);
    weft_cond_destroy(r.memory.freed);
    weft_mutex_destroy(r.memory.lock);
    weft_runtime_destroy(r.rt);
    free(r.outcomes);
    free(jobs);
    free(group);
    wi_truth_free(&truth);
    wi_files_free(&r.files);
    return status;
}
