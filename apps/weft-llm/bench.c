/*
 * bench.c - `weft-llm bench MODEL_DIR`: the engine's prefill and decode
 * throughput and latency, against the rooflines measured in the same run.
 *
 * One task on the chosen backend measures, in order:
 *  - the copy rate: a weft_memcpy_async of a large buffer on the backend
 *    (bytes read plus bytes written, per second), the bandwidth that bounds
 *    a decode step, which reads every weight once;
 *  - prefill: a fresh sequence's wl_forward over L random tokens, for each
 *    prompt length (median of the repeats, after one untimed run that
 *    makes the length's plans: a first call's cost is not prefill's); and
 *    for lengths up to a batcher's chunk (WL_PREFILL_CHUNK) 8 fresh prompts
 *    of L tokens in one mixed step (wl_forward_mixed), as the batcher runs
 *    prompts that arrive together;
 *  - decode: B sequences prefilled with a short prompt, then wl_forward_batch
 *    steps of all of them (the batcher's step without its task handoffs),
 *    each step's ids drawn on the backend (greedy, or at --temperature with
 *    --top-p: weft_sample), no logits copied back, for each batch size: the median step, tokens per
 * second, the step's roofline (its weight and KV bytes at the copy rate) and the host CPU time per
 * step: the process's (getrusage over the timed steps, every thread, the runtime's waiting ones
 * too; on the host backend it is the computation itself) and the step's own (its thread's time
 * before and after the await: wl_batch_own_cpu_ns). A table on stdout, then one `BENCH <name>
 * <value> <unit>` line a figure. With
 * --sparse-2-4 1 the dense projections run sparse (wl_model.sparse_2_4),
 * and the roofline counts the bytes their products read (compressed on a
 * GPU). With --tensor-parallel N the model is split over N GPUs
 * (tensor_parallel.c) and only decode is measured: the sequences are
 * prefilled through one batch whose steps every rank runs (a rank's own
 * wl_forward is not split), and the roofline is rank 0's share of the
 * weights at one GPU's copy rate.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "llm.h"

#define MAX_POINTS 16

typedef struct bench {
    const char *dir, *backend;
    int lens[MAX_POINTS], n_lens;
    int batches[MAX_POINTS], n_batches;
    int steps, repeats, decode_prompt;
    float temperature, top_p; /* the decode steps' draws */
    int sparse_2_4;           /* the dense projections multiplied sparse */
    int ranks;                /* tensor parallel over this many (1: off) */
    wl_model model, **models; /* models: each rank's (wl_open_ranks: the first is model) */
    wl_tp *tp;
    wl_batch *tp_batch; /* rank 0's, the decode steps' of every batch size */
    wl_kv kv;
    /* results */
    double copy_gbs;
    double prefill_ms[MAX_POINTS], mixed_ms[MAX_POINTS]; /* mixed: 0 when not measured */
    double step_ms[MAX_POINTS], roofline_ms[MAX_POINTS], cpu_us[MAX_POINTS];
    double own_us[MAX_POINTS]; /* the step's own host work (wl_batch_own_cpu_ns) */
    weft_graph_stats graph;    /* graph mode over the decode steps */
    int failed;
    char message[512];
} bench;

static int usage(void)
{
    fprintf(stderr, "usage: weft-llm bench MODEL_DIR [--backend host|cuda|auto] "
                    "[--prompt-lens 128,512,2048]\n"
                    "                [--batches 1,8,32,128] [--steps 32] [--repeats 3] "
                    "[--decode-prompt 128]\n"
                    "                [--temperature 0] [--top-p 1] [--sparse-2-4 0|1] "
                    "[--tensor-parallel N]\n");
    return 2;
}

static int parse_list(const char *s, int *out, int *n)
{
    *n = 0;
    while (*s && *n < MAX_POINTS) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 1 || v > 1 << 20 || (*end && *end != ','))
            return -1;
        out[(*n)++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return *s || !*n ? -1 : 0;
}

static double cpu_seconds(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec +
           u.ru_stime.tv_usec * 1e-6;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The bytes a decode step reads of the weights: every matrix once (the
 * embedding table only where it is also the lm_head); an FP8 model's
 * projections a byte an element, and their scales; sparse projections
 * (--sparse-2-4, once made) their compressed bytes. */
static double weight_bytes(const wl_model *m)
{
    const wl_config *c = &m->cfg;
    double H = c->hidden, I = c->intermediate, q = (double)c->heads * c->head_dim,
           kv = (double)c->kv_heads * c->head_dim, es = (double)wl_dtype_size(m->dtype);
    double layer = (H * q + 2 * H * kv + q * H + 3 * H * I) * (c->fp8 ? 1 : es);
    if (c->fp8)
        layer += (q + 2 * kv + H + 2 * I + H) * 4;
    double total = (double)c->layers * layer + (double)c->vocab * H * es;
    for (int li = 0; m->layer && li < c->layers; li++) {
        const wl_layer *L = &m->layer[li];
        if (L->qkv_sparse) /* the attention's projections */
            total += (double)weft_sparse_weight_bytes(L->qkv_sparse) +
                     (double)weft_sparse_weight_bytes(L->o_sparse) - (2 * H * q + 2 * H * kv) * es;
        if (L->gu_sparse) /* the MLP's */
            total += (double)weft_sparse_weight_bytes(L->gu_sparse) +
                     (double)weft_sparse_weight_bytes(L->down_sparse) - 3 * H * I * es;
    }
    return total;
}

static double kv_bytes_per_token(const wl_model *m)
{
    const wl_config *c = &m->cfg;
    return 2.0 * c->layers * c->kv_heads * c->head_dim * (double)wl_dtype_size(m->dtype);
}

/* Bytes copied (read and written) per second by the backend's copy. */
static int measure_copy(bench *b)
{
    size_t n = (size_t)weight_bytes(&b->model); /* as much as a step reads, 1 to 256 MiB */
    n = n > (256u << 20) ? (256u << 20) : n < (1u << 20) ? (1u << 20) : n;
    void *src = NULL, *dst = NULL;
    double t[5];
    if (weft_malloc_async(&src, n) != WEFT_OK || weft_malloc_async(&dst, n) != WEFT_OK ||
        weft_memcpy_async(dst, src, n) != WEFT_OK || weft_await() != WEFT_OK)
        goto fail;
    for (int r = 0; r < 5; r++) {
        uint64_t t0 = weft_now_ns();
        if (weft_memcpy_async(dst, src, n) != WEFT_OK || weft_await() != WEFT_OK)
            goto fail;
        t[r] = (double)(weft_now_ns() - t0) * 1e-9;
    }
    b->copy_gbs = 2.0 * (double)n / median(t, 5) * 1e-9;
    weft_free_async(src);
    weft_free_async(dst);
    return 0;
fail:
    wl_fail("copy: %s", weft_last_error());
    if (src)
        weft_free_async(src);
    if (dst)
        weft_free_async(dst);
    weft_await();
    return -1;
}

static void random_ids(int32_t *ids, int n, int vocab, uint64_t *st)
{
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(wl_rand_next(st) % (uint64_t)vocab);
}

static int measure_prefill(bench *b, int li, uint64_t *st)
{
    int L = b->lens[li];
    double t[64];
    int32_t *ids = malloc((size_t)L * sizeof *ids);
    if (!ids)
        return wl_fail("out of memory");
    for (int r = -1; r < b->repeats; r++) { /* r -1: a warm-up, untimed */
        wl_seq *s = NULL;
        const float *logits;
        random_ids(ids, L, b->model.cfg.vocab, st);
        if (wl_seq_create(&s, &b->model, &b->kv, L, L)) {
            free(ids);
            return -1;
        }
        uint64_t t0 = weft_now_ns();
        int rc = wl_forward(s, ids, L, &logits);
        if (r >= 0)
            t[r] = (double)(weft_now_ns() - t0) * 1e-6;
        wl_seq_destroy(s);
        if (rc) {
            free(ids);
            return -1;
        }
    }
    free(ids);
    b->prefill_ms[li] = median(t, b->repeats);
    return 0;
}

enum { MIXED_PROMPTS = 8 };

/* MIXED_PROMPTS fresh prompts of L tokens in one mixed step. */
static int measure_mixed(bench *b, int li, uint64_t *st)
{
    int L = b->lens[li], P = MIXED_PROMPTS, rc = -1;
    double t[64];
    wl_batch *batch = NULL;
    wl_seq *seqs[MIXED_PROMPTS] = {0};
    int counts[MIXED_PROMPTS];
    int32_t picked[MIXED_PROMPTS], *ids;
    if (L > WL_PREFILL_CHUNK)
        return 0; /* longer prompts go in several steps: not this figure */
    if (!(ids = malloc((size_t)P * L * sizeof *ids)))
        return wl_fail("out of memory");
    /* rows for all the prompts at once: P + chunk of them */
    if (wl_batch_create(&batch, &b->model, &b->kv, P, P * L, P * L - P))
        goto out;
    for (int r = -1; r < b->repeats; r++) { /* r -1: a warm-up, untimed */
        random_ids(ids, P * L, b->model.cfg.vocab, st);
        for (int i = 0; i < P; i++) {
            counts[i] = L;
            if (wl_seq_create(&seqs[i], &b->model, &b->kv, L, 1))
                goto out;
        }
        uint64_t t0 = weft_now_ns();
        if (wl_forward_mixed(batch, seqs, ids, counts, P, NULL, NULL, picked))
            goto out;
        if (r >= 0)
            t[r] = (double)(weft_now_ns() - t0) * 1e-6;
        for (int i = 0; i < P; i++) {
            wl_seq_destroy(seqs[i]);
            seqs[i] = NULL;
        }
    }
    b->mixed_ms[li] = median(t, b->repeats);
    rc = 0;
out:
    for (int i = 0; i < P; i++)
        wl_seq_destroy(seqs[i]);
    if (batch)
        wl_batch_destroy(batch);
    free(ids);
    return rc;
}

static int measure_decode(bench *b, int bi, uint64_t *st)
{
    int B = b->batches[bi], P = b->decode_prompt, total = P + b->steps + 2;
    wl_seq **seqs = calloc((size_t)B, sizeof *seqs);
    int32_t *ids = malloc((size_t)(P > B ? P : B) * sizeof *ids);
    double *t = malloc((size_t)b->steps * sizeof *t);
    wl_batch *batch = NULL;
    int32_t *picked = calloc((size_t)B, sizeof *picked);
    wl_draw *draws = calloc((size_t)B, sizeof *draws);
    const float *logits;
    int rc = -1;
    if (!seqs || !ids || !t || !picked || !draws) {
        wl_fail("out of memory");
        goto out;
    }
    for (int i = 0; i < B; i++) {
        random_ids(ids, P, b->model.cfg.vocab, st);
        if (wl_seq_create(&seqs[i], &b->model, &b->kv, total, P) ||
            (b->tp_batch ? wl_forward_mixed(b->tp_batch, &seqs[i], ids, &P, 1, NULL, NULL, picked)
                         : wl_forward(seqs[i], ids, P, &logits)))
            goto out;
    }
    if (b->tp_batch)
        batch = b->tp_batch;
    else if (wl_batch_create(&batch, &b->model, &b->kv, B, total, 0))
        goto out;
    double kv_read = 0, cpu = 0;
    uint64_t own = 0;
    for (int step = -2; step < b->steps; step++) { /* two steps to warm up */
        random_ids(ids, B, b->model.cfg.vocab, st);
        for (int i = 0; i < B; i++)
            draws[i].how = (weft_sampling){.temperature = b->temperature,
                                           .top_p = b->top_p,
                                           .seed = (uint64_t)i,
                                           .offset = (uint64_t)(step + 2)};
        double c0 = cpu_seconds();
        uint64_t t0 = weft_now_ns(), o0 = wl_batch_own_cpu_ns(batch);
        if (wl_forward_batch(batch, seqs, ids, B, NULL, draws, picked))
            goto out;
        if (step >= 0) {
            t[step] = (double)(weft_now_ns() - t0) * 1e-6;
            cpu += cpu_seconds() - c0;
            own += wl_batch_own_cpu_ns(batch) - o0;
            kv_read += (double)B * (P + step + 3) * kv_bytes_per_token(&b->model);
        }
    }
    b->step_ms[bi] = median(t, b->steps);
    b->cpu_us[bi] = cpu / b->steps * 1e6;
    b->own_us[bi] = (double)own / b->steps * 1e-3;
    b->roofline_ms[bi] = (weight_bytes(&b->model) + kv_read / b->steps) / (b->copy_gbs * 1e9) * 1e3;
    rc = 0;
out:
    if (batch && batch != b->tp_batch)
        wl_batch_destroy(batch);
    for (int i = 0; seqs && i < B; i++)
        wl_seq_destroy(seqs[i]);
    free(seqs);
    free(ids);
    free(t);
    free(picked);
    free(draws);
    return rc;
}

/* Tensor parallel: the largest batch's shape on every rank (its steps
 * take any smaller batch too). */
static void batch_shape(const bench *b, int *seqs, int *tokens)
{
    *seqs = 1;
    for (int i = 0; i < b->n_batches; i++)
        *seqs = b->batches[i] > *seqs ? b->batches[i] : *seqs;
    *tokens = b->decode_prompt + b->steps + 2;
}

/* Tensor parallel: ranks 1 on started (the group's own tasks), rank 0's
 * model split before its upload. */
static int start_ranks(bench *b, int pages)
{
    int seqs, tokens;
    batch_shape(b, &seqs, &tokens);
    if (wl_model_set_shard(&b->model, 0, b->ranks)) {
        wl_tp_break(b->tp, 0, "%s", wl_error());
        return -1;
    }
    wl_tp_start_ranks(b->tp, weft_runtime_current(), b->models, pages, seqs, tokens,
                      b->decode_prompt);
    return 0;
}

/* Tensor parallel: rank 0's batch, ready with the other ranks. */
static int join_ranks(bench *b)
{
    int seqs, tokens;
    batch_shape(b, &seqs, &tokens);
    if (wl_batch_create(&b->tp_batch, &b->model, &b->kv, seqs, tokens, b->decode_prompt) ||
        wl_batch_tp(b->tp_batch, b->tp, 0)) {
        wl_tp_break(b->tp, 0, "%s", wl_error());
        return -1;
    }
    return wl_tp_barrier(b->tp);
}

static void *bench_task(void *arg)
{
    bench *b = arg;
    uint64_t st = 0x5eed;
    int longest = b->decode_prompt + b->steps + 2, pages = 0;
    for (int i = 0; i < b->n_lens; i++)
        longest = b->lens[i] > longest ? b->lens[i] : longest;
    for (int i = 0; i < b->n_batches; i++) { /* the largest batch's pages, or one prompt's */
        int need = b->batches[i] * ((b->decode_prompt + b->steps + 2) / WL_KV_PAGE + 1);
        pages = need > pages ? need : pages;
    }
    pages = pages > longest / WL_KV_PAGE + 1 ? pages : longest / WL_KV_PAGE + 1;
    for (int i = 0; i < b->n_lens; i++) { /* the mixed step's prompts */
        int need = MIXED_PROMPTS * (b->lens[i] / WL_KV_PAGE + 1);
        pages = b->lens[i] <= WL_PREFILL_CHUNK && need > pages ? need : pages;
    }
    b->failed = 1;
    if (longest > b->model.cfg.max_positions) {
        wl_fail("bench: %d tokens exceed the model's context (%d)", longest,
                b->model.cfg.max_positions);
        goto out;
    }
    if (b->tp && start_ranks(b, pages))
        goto out;
    if (wl_model_upload(&b->model) || wl_kv_create(&b->kv, &b->model, pages, WL_KV_PAGE) ||
        (b->tp && join_ranks(b)) || measure_copy(b))
        goto out;
    for (int i = 0; i < b->n_lens && !b->tp; i++)
        if (measure_prefill(b, i, &st) || measure_mixed(b, i, &st))
            goto out;
    weft_graph_stats before, after;
    weft_graph_stats_get(weft_runtime_current(), &before);
    for (int i = 0; i < b->n_batches; i++)
        if (measure_decode(b, i, &st))
            goto out;
    weft_graph_stats_get(weft_runtime_current(), &after);
    b->graph.launches = after.launches - before.launches;
    b->graph.instantiations = after.instantiations - before.instantiations;
    b->graph.updates = after.updates - before.updates;
    b->failed = 0;
out:
    if (b->failed)
        snprintf(b->message, sizeof b->message, "%s", wl_error());
    if (b->tp_batch) { /* the other ranks' steps end */
        wl_batch_unlink(b->tp_batch);
        wl_batch_destroy(b->tp_batch);
    } else if (b->tp) {
        wl_tp_break(b->tp, 0, "the benchmark failed");
    }
    if (b->kv.lock_made)
        wl_kv_destroy(&b->kv);
    wl_model_release(&b->model);
    return NULL;
}

static void report(const bench *b)
{
    const wl_config *c = &b->model.cfg;
    printf("%s: %s, %d layers, hidden %d, %s%s; %.4g GB of weights read a step; copy rate %.1f "
           "GB/s\n",
           b->dir, c->model_type, c->layers, c->hidden, wl_dtype_name(b->model.dtype),
           c->fp8 ? " with FP8 projections" : "", weight_bytes(&b->model) * 1e-9, b->copy_gbs);
    if (b->tp)
        printf("tensor parallel over %d ranks: the weights read a step are rank 0's share; "
               "prefill not measured\n",
               b->ranks);
    else
        printf("\n| prefill tokens | ms | tokens/s | %d prompts in one mixed step: ms | tokens/s "
               "|\n|---:|---:|---:|---:|---:|\n",
               MIXED_PROMPTS);
    for (int i = 0; i < b->n_lens && !b->tp; i++) {
        printf("| %d | %.3f | %.0f |", b->lens[i], b->prefill_ms[i],
               b->lens[i] / (b->prefill_ms[i] * 1e-3));
        if (b->mixed_ms[i] > 0)
            printf(" %.3f | %.0f |\n", b->mixed_ms[i],
                   MIXED_PROMPTS * b->lens[i] / (b->mixed_ms[i] * 1e-3));
        else
            printf(" | |\n");
    }
    if (b->temperature > 0)
        printf("\ndecode steps draw at temperature %g, top-p %g (weft_sample)\n", b->temperature,
               b->top_p);
    printf("\n| decode batch | ms a step | tokens/s | roofline ms | of roofline | host CPU us a "
           "step | the step's own |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < b->n_batches; i++)
        printf("| %d | %.3f | %.0f | %.3f | %.0f%% | %.0f | %.1f |\n", b->batches[i], b->step_ms[i],
               b->batches[i] / (b->step_ms[i] * 1e-3), b->roofline_ms[i],
               100 * b->roofline_ms[i] / b->step_ms[i], b->cpu_us[i], b->own_us[i]);
    printf("\ndecode steps as graphs: %llu launches, %llu instantiations, %llu updates (0 on the "
           "host backend, which runs them eagerly; WEFT_LLM_GRAPH=0 turns graph mode off)\n",
           (unsigned long long)b->graph.launches, (unsigned long long)b->graph.instantiations,
           (unsigned long long)b->graph.updates);
    printf("\nBENCH llm.copy_rate %.1f GB/s\n", b->copy_gbs);
    printf("BENCH llm.decode.graph_launches %llu launches\n",
           (unsigned long long)b->graph.launches);
    if (b->tp)
        printf("BENCH llm.tensor_parallel %d ranks\n", b->ranks);
    for (int i = 0; i < b->n_lens && !b->tp; i++) {
        printf("BENCH llm.prefill.L%d.tokens_per_s %.1f tokens/s\n", b->lens[i],
               b->lens[i] / (b->prefill_ms[i] * 1e-3));
        if (b->mixed_ms[i] > 0)
            printf("BENCH llm.prefill.mixed%d.L%d.tokens_per_s %.1f tokens/s\n", MIXED_PROMPTS,
                   b->lens[i], MIXED_PROMPTS * b->lens[i] / (b->mixed_ms[i] * 1e-3));
    }
    for (int i = 0; i < b->n_batches; i++) {
        printf("BENCH llm.decode.B%d.step_ms %.4f ms\n", b->batches[i], b->step_ms[i]);
        printf("BENCH llm.decode.B%d.tokens_per_s %.1f tokens/s\n", b->batches[i],
               b->batches[i] / (b->step_ms[i] * 1e-3));
        printf("BENCH llm.decode.B%d.of_roofline %.3f fraction\n", b->batches[i],
               b->roofline_ms[i] / b->step_ms[i]);
        printf("BENCH llm.decode.B%d.cpu_us_per_step %.1f us\n", b->batches[i], b->cpu_us[i]);
        printf("BENCH llm.decode.B%d.own_cpu_us_per_step %.1f us\n", b->batches[i], b->own_us[i]);
    }
}

int wl_bench_main(int argc, char **argv)
{
    bench b = {.backend = "auto",
               .lens = {128, 512, 2048},
               .n_lens = 3,
               .batches = {1, 8, 32, 128},
               .n_batches = 4,
               .steps = 32,
               .repeats = 3,
               .decode_prompt = 128,
               .ranks = 1,
               .top_p = 1};
    if (argc < 1 || argv[0][0] == '-')
        return usage();
    b.dir = argv[0];
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        int bad = i + 1 >= argc, n;
        char *end;
        if (!strcmp(a, "--backend"))
            bad |= strcmp(v, "host") && strcmp(v, "cuda") && strcmp(v, "auto");
        else if (!strcmp(a, "--prompt-lens"))
            bad |= parse_list(v, b.lens, &b.n_lens);
        else if (!strcmp(a, "--batches"))
            bad |= parse_list(v, b.batches, &b.n_batches);
        else if (!strcmp(a, "--steps") || !strcmp(a, "--repeats") ||
                 !strcmp(a, "--decode-prompt")) {
            long x = strtol(v, &end, 10);
            n = (int)x;
            bad |= !*v || *end || x < 1 || x > (strcmp(a, "--repeats") ? 1 << 20 : 64);
            if (!bad)
                *(!strcmp(a, "--steps")     ? &b.steps
                  : !strcmp(a, "--repeats") ? &b.repeats
                                            : &b.decode_prompt) = n;
        } else if (!strcmp(a, "--tensor-parallel")) {
            long x = strtol(v, &end, 10);
            bad |= !*v || *end || x < 1 || x > WL_MAX_RANKS;
            b.ranks = (int)x;
        } else if (!strcmp(a, "--sparse-2-4")) {
            bad |= strcmp(v, "0") && strcmp(v, "1");
            b.sparse_2_4 = !strcmp(v, "1");
        } else if (!strcmp(a, "--temperature") || !strcmp(a, "--top-p")) {
            float x = strtof(v, &end);
            bad |= !*v || *end || !(x >= 0 && x <= 100);
            if (!bad)
                *(!strcmp(a, "--temperature") ? &b.temperature : &b.top_p) = x;
        } else
            bad = 1;
        if (bad) {
            fprintf(stderr, "weft-llm bench: bad option or value: %s %s\n", a, v);
            return usage();
        }
        if (!strcmp(a, "--backend"))
            b.backend = v;
    }
    if (wl_model_open(&b.model, b.dir)) {
        fprintf(stderr, "weft-llm: %s\n", wl_error());
        return 1;
    }
    b.model.sparse_2_4 = b.sparse_2_4;
    wl_show_load_on(&b.model, "weights");
    int rc = 1;
    weft_runtime *rt = NULL;
    weft_task *t;
    if (wl_open_ranks(&b.models, &b.model, b.dir, b.ranks)) {
        fprintf(stderr, "weft-llm: %s\n", wl_error());
        goto out;
    }
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = (unsigned)b.ranks; /* a rank's host work beside the others' */
    cfg.stack_size = 1 << 20;
    cfg.backend = !strcmp(b.backend, "host")   ? WEFT_BACKEND_HOST
                  : !strcmp(b.backend, "cuda") ? WEFT_BACKEND_CUDA
                                               : WEFT_BACKEND_AUTO;
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK) {
        fprintf(stderr, "weft-llm: weft runtime: %s\n", weft_last_error());
        rt = NULL;
        goto out;
    }
    if (b.ranks > 1 && wl_tp_create(&b.tp, rt, b.ranks)) {
        fprintf(stderr, "weft-llm: %s\n", wl_error());
        goto out;
    }
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    if (b.tp)
        opts.device = wl_tp_device(b.tp, 0); /* rank 0's share on device 0 */
    if (weft_spawn(rt, &t, bench_task, &b, &opts) != WEFT_OK || weft_join(t, NULL) != WEFT_OK)
        fprintf(stderr, "weft-llm: the bench task: %s\n", weft_last_error());
    else if (b.failed)
        fprintf(stderr, "weft-llm: %s\n", b.message);
    else {
        report(&b);
        rc = 0;
    }
out:
    wl_tp_join_ranks(b.tp);
    wl_tp_destroy(b.tp);
    if (rt)
        weft_runtime_destroy(rt);
    wl_model_close(&b.model);
    wl_close_ranks(b.models, b.ranks);
    return rc;
}
