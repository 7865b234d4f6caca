/*
 * main.c - the weft-llm command line:
 *   weft-llm random-model DIR --preset tiny|1b|8b|moe|qwen2moe [--seed N]
 *            [--config-only] [--shard-mb N] [--fp32 | --fp8] [--prune-2-4]
 *   weft-llm generate MODEL_DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]
 *            [--seed N] [--temperature T] [--top-k K] [--top-p P] [--backend host|cuda|auto]
 *            [--print-ids] [--print-top] [--kv-pages N] [--parallel N]
 *            [--speculate K [--ngram N | --draft DIR]] [--stats] [--repetition-penalty R]
 *            [--frequency-penalty F] [--presence-penalty P] [--ignore-eos] [--pipeline]
 *            [--sparse-2-4] [--tensor-parallel N]
 *   weft-llm tokenize MODEL_DIR|tokenizer.json TEXT [--no-special]
 *   weft-llm check MODEL_DIR
 *   weft-llm loadgen URL [options]   (loadgen.c; --help lists them)
 *   weft-llm bench MODEL_DIR [--backend B] [--prompt-lens L,..] [--batches B,..] ... (bench.c)
 *   weft-llm serve MODEL_DIR [--host H] [--port N] ...   (serve.c)
 * generate streams the decoded text to stdout as it is sampled; with
 * --print-ids the prompt's and the generated ids follow on stderr, with
 * --print-top each step's two largest logits as they come. Every
 * sequence is a weft task that prefills its prompt alone and then decodes
 * through the batcher task (batch.c), one batched forward a step for all
 * the sequences waiting. --parallel N runs N copies of the prompt, copy i
 * sampling with seed + i; each copy's text is printed once all are done,
 * on a line of its own that opens with its index ("[i] "). --speculate K
 * decodes the one sequence speculatively (alone, not batched): up to K
 * draft tokens a round from n-grams (up to N long) of the text so far, or
 * from the draft model in DIR (a smaller model with the same tokenizer),
 * verified in one forward pass; with --print-ids or --stats the
 * acceptance counts follow on stderr, and --stats adds the time to the
 * first token and the decode rate. --pipeline, run as every rank of an MPI
 * job (mpiexec -n R weft-llm generate ... --pipeline), splits the layers
 * into R stages, a rank each (wl_link_stage): rank 0 runs the engine and
 * prints, the others serve its steps; prompts then go through the
 * batcher's steps, and --speculate is refused. Each rank takes its
 * runtime's first GPU: on a host of several, give each rank its own
 * (CUDA_VISIBLE_DEVICES). --sparse-2-4 prunes each dense layer's
 * projections to the 2:4 pattern at load and multiplies them sparse
 * (weft_matmul_sparse; wl_model.sparse_2_4 says what it costs);
 * random-model --prune-2-4 writes a model whose projections are 2:4
 * already. --tensor-parallel N splits every layer over N GPUs of this
 * process (rank r on device r; on the host backend, N tasks): heads and
 * MLP columns, an all-reduce after the o and down projections
 * (tensor_parallel.c); prompts go through the batcher's steps, and
 * --speculate is refused. Errors go to stderr as one line, exit status
 * 1; bad usage exits 2.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "llm.h"

typedef struct gen {
    const char *dir, *prompt, *prompt_ids, *backend;
    int max_tokens, print_ids, print_top, parallel, stats;
    int ignore_eos;        /* generate max_tokens whatever the model ends with */
    int speculate, ngram;  /* draft tokens a round (0: off) and the longest n-gram */
    const char *draft_dir; /* the draft model proposes, not n-grams */
    wl_model draft;
    int kv_pages;      /* pages of the model's KV cache, WL_KV_PAGE tokens each */
    int pipeline;      /* a stage a rank of the MPI job */
    int sparse_2_4;    /* the dense projections pruned to 2:4, multiplied sparse */
    int ranks;         /* tensor parallel over this many (1: off) */
    wl_model **models; /* each rank's (wl_open_ranks: the first is model) */
    wl_link *link;
    wl_sampler sampler;
    wl_penalties penalties;
    wl_model model;
    wl_engine engine;
    wl_tokenizer *tk;
    int32_t *ids;
    size_t n_ids;
    int failed;
    char message[512]; /* the task's error line: tasks move between threads */
} gen;

static int usage(void)
{
    fprintf(stderr,
            "usage: weft-llm random-model DIR --preset tiny|1b|8b|moe|qwen2moe [--seed N] "
            "[--config-only] [--shard-mb N] [--fp32 | --fp8] [--prune-2-4]\n"
            "       weft-llm generate MODEL_DIR (--prompt TEXT | --prompt-ids 1,2,3) "
            "[--max-tokens N] [--seed N] [--kv-pages N] [--parallel N]\n"
            "                [--temperature T] [--top-k K] [--top-p P] [--backend "
            "host|cuda|auto] [--print-ids] [--print-top]\n"
            "                [--speculate K [--ngram N | --draft DIR]] [--stats] "
            "[--repetition-penalty R]\n"
            "                [--frequency-penalty F] [--presence-penalty P] [--ignore-eos] "
            "[--sparse-2-4]\n"
            "                [--pipeline] (every rank of an MPI job: a stage of layers each) "
            "[--tensor-parallel N] (N GPUs)\n"
            "       weft-llm tokenize MODEL_DIR|tokenizer.json TEXT [--no-special]\n"
            "       weft-llm check MODEL_DIR\n"
            "       weft-llm loadgen URL [--rate R|inf] [--requests N] [--concurrency C] ... "
            "(loadgen --help)\n"
            "       weft-llm bench MODEL_DIR [--backend B] [--prompt-lens 128,512,2048] "
            "[--batches 1,8,32,128] ...\n"
            "       weft-llm serve MODEL_DIR [--host H] [--port N] ... (weft-llm serve --help)\n");
    return 2;
}

static int parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return !*s || *end || errno || !(*out >= lo && *out <= hi) ? -1 : 0;
}

static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = strlen(s) / 2 + 1;
    *ids = malloc(cap * sizeof **ids);
    *n = 0;
    while (*ids && *s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ','))
            break;
        (*ids)[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
        if (!*s && *end)
            break; /* a trailing comma */
    }
    if (!*ids || *s || !*n)
        return wl_fail("--prompt-ids: expected comma-separated token ids, like 1,2,3");
    return 0;
}

static int tokenizer_path(const char *arg, char *path, size_t cap)
{
    struct stat st;
    if (!stat(arg, &st) && S_ISDIR(st.st_mode))
        snprintf(path, cap, "%s/tokenizer.json", arg);
    else
        snprintf(path, cap, "%s", arg);
    return 0;
}

/* The text of token id: streamed to stdout (one sequence), or kept in
 * text (several, printed at the end). */
static void emit(const gen *g, int32_t id, int at_start, char **text, size_t *len)
{
    char buf[1024];
    int n = g->tk ? wl_decode_token(g->tk, id, 0, at_start, buf, sizeof buf) : 0;
    if (n < 0)
        n = 0; /* an id of the model's (padded) vocabulary that the tokenizer lacks: no text */
    if (!text) {
        fwrite(buf, 1, (size_t)n, stdout);
        fflush(stdout);
        return;
    }
    char *t = realloc(*text, *len + (size_t)n + 1);
    if (!t)
        return; /* the text is cut short; the ids are still printed with --print-ids */
    memcpy(t + *len, buf, (size_t)n);
    *len += (size_t)n;
    t[*len] = 0;
    *text = t;
}

/* The step's two largest logits, as tests/apps/llm_reference.py prints
 * transformers' (to tell a divergence at a near tie from a bug). */
static void print_top_two(const float *logits, int vocab, int step, int32_t id, int index)
{
    int a = 0, b = -1;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[a]) {
            b = a;
            a = i;
        } else if (b < 0 || logits[i] > logits[b]) {
            b = i;
        }
    if (index >= 0)
        fprintf(stderr, "[%d]", index);
    fprintf(stderr, "  step %d: token %d (top %d) logit %.5f, next %.5f, gap %.2e\n", step, id, a,
            logits[a], logits[b], (double)logits[a] - logits[b]);
}

/* One sequence of a generate run. */
typedef struct seq_run {
    gen *g;
    int index; /* -1: the run's only sequence */
    wl_sampler sampler;
    int32_t *out;
    int n_out, failed;
    char *text; /* several sequences: the text, printed at the end */
    size_t text_len;
    wl_spec_stats spec;
    double t_start, t_first, t_last; /* the generation's start, its first and last token */
    char message[512];
} seq_run;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int on_token(void *ctx, int32_t id, int eos, const float *logits)
{
    seq_run *r = ctx;
    gen *g = r->g;
    if (g->print_top)
        print_top_two(logits, g->model.cfg.vocab, r->n_out, id, r->index);
    r->t_last = now();
    if (!r->n_out)
        r->t_first = r->t_last;
    r->out[r->n_out++] = id;
    if (!eos) /* a continuation of the prompt: never the text's start */
        emit(g, id, 0, r->index < 0 ? NULL : &r->text, &r->text_len);
    return 0;
}

/* One sequence, one task: the engine queues it, prefills its prompt in
 * this task and then decodes it a token a step through the batcher. */
static void *sequence_task(void *arg)
{
    seq_run *r = arg;
    gen *g = r->g;
    wl_gen req = {.prompt = g->ids,
                  .n_prompt = (int)g->n_ids,
                  .max_tokens = g->max_tokens,
                  .sampler = r->sampler,
                  .on_token = on_token,
                  .ctx = r,
                  .speculate_k = g->speculate,
                  .ngram = g->ngram,
                  .use_draft = g->draft_dir != NULL,
                  .spec_stats = &r->spec,
                  .penalties = g->penalties,
                  .ignore_eos = g->ignore_eos,
                  .wants_logits = g->print_top};
    wl_finish finish;
    r->t_start = now();
    r->failed = wl_engine_generate(&g->engine, &req, &finish);
    if (r->failed)
        snprintf(r->message, sizeof r->message, "%s", wl_error());
    return NULL;
}

static void print_ids(const gen *g, const seq_run *r)
{
    if (r->index >= 0)
        fprintf(stderr, "[%d] ", r->index);
    fprintf(stderr, "prompt ids:");
    for (size_t i = 0; i < g->n_ids; i++)
        fprintf(stderr, "%s%d", i ? "," : " ", g->ids[i]);
    fprintf(stderr, "\ngenerated ids:");
    for (int i = 0; i < r->n_out; i++)
        fprintf(stderr, "%s%d", i ? "," : " ", r->out[i]);
    fprintf(stderr, "\n");
}

/* The speculative counts (--print-ids, --stats) and the timing (--stats). */
static void print_stats(const gen *g, const seq_run *r)
{
    const wl_spec_stats *sp = &r->spec;
    if (g->speculate && (g->print_ids || g->stats))
        fprintf(stderr,
                "speculative: %ld rounds, %ld draft tokens, %ld accepted (%.1f%%), %.2f tokens a "
                "round\n",
                sp->rounds, sp->proposed, sp->accepted,
                sp->proposed ? 100.0 * sp->accepted / sp->proposed : 0.0,
                sp->rounds ? (double)sp->tokens / sp->rounds : 0.0);
    if (!g->stats || r->n_out < 1)
        return;
    if (r->index >= 0)
        fprintf(stderr, "[%d] ", r->index);
    double decode = r->t_last - r->t_first;
    fprintf(stderr, "time: first token %.1f ms; decode %d tokens in %.1f ms (%.1f tokens/s)\n",
            1e3 * (r->t_first - r->t_start), r->n_out - 1, 1e3 * decode,
            decode > 0 ? (r->n_out - 1) / decode : 0.0);
}

/* The engine, a task per sequence, and the engine's end. */
static int run_tasks(gen *g, weft_runtime *rt)
{
    int n = g->parallel, spawned = 0;
    seq_run *runs = calloc((size_t)n, sizeof *runs);
    weft_task **tasks = calloc((size_t)n, sizeof *tasks);
    g->failed = 1;
    if (!runs || !tasks) {
        snprintf(g->message, sizeof g->message, "out of memory");
        goto out;
    }
    if (g->ranks > 1 ? wl_engine_start_tp(&g->engine, rt, g->models, g->ranks, g->kv_pages, n,
                                          (int)g->n_ids + g->max_tokens)
                     : wl_engine_start_pipeline(&g->engine, rt, &g->model, g->kv_pages, n,
                                                (int)g->n_ids + g->max_tokens, g->link)) {
        snprintf(g->message, sizeof g->message, "%s", wl_error());
        goto out;
    }
    if (g->draft_dir && wl_engine_set_draft(&g->engine, &g->draft)) {
        snprintf(g->message, sizeof g->message, "%s", wl_error());
        goto join; /* spawned nothing: stops the engine */
    }
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.name = "sequence";
    opts.device = g->engine.device;
    for (; spawned < n; spawned++) {
        seq_run *r = &runs[spawned];
        r->g = g;
        r->index = n > 1 ? spawned : -1;
        r->sampler = g->sampler;
        r->sampler.state += (uint64_t)spawned; /* copy i: seed + i */
        r->out = malloc(((size_t)g->max_tokens + 1) * sizeof *r->out);
        if (!r->out || weft_spawn(rt, &tasks[spawned], sequence_task, r, &opts) != WEFT_OK) {
            snprintf(g->message, sizeof g->message, "sequence %d: %s", spawned,
                     r->out ? weft_last_error() : "out of memory");
            goto join;
        }
    }
    g->failed = 0;
join:
    for (int i = 0; i < spawned; i++)
        if (weft_join(tasks[i], NULL) != WEFT_OK && !g->failed) {
            g->failed = 1;
            snprintf(g->message, sizeof g->message, "sequence %d's task: %s", i, weft_last_error());
        }
    for (int i = 0; i < spawned && !g->failed; i++)
        if (runs[i].failed) {
            g->failed = 1;
            snprintf(g->message, sizeof g->message, "%s%s", n > 1 ? "a sequence: " : "",
                     runs[i].message);
        }
    if (!g->failed)
        for (int i = 0; i < n; i++) {
            if (runs[i].index < 0)
                fputc('\n', stdout);
            else
                printf("[%d] %s\n", i, runs[i].text ? runs[i].text : "");
            fflush(stdout); /* the text before what follows on stderr */
            if (g->print_ids)
                print_ids(g, &runs[i]);
            print_stats(g, &runs[i]);
        }
    if (wl_engine_stop(&g->engine) && !g->failed) {
        g->failed = 1;
        snprintf(g->message, sizeof g->message, "%s", wl_error());
    }
out:
    for (int i = 0; runs && i < n; i++) {
        free(runs[i].out);
        free(runs[i].text);
    }
    free(runs);
    free(tasks);
    return g->failed;
}

static int run_generate(gen *g)
{
    char path[PATH_MAX];
    weft_runtime *rt = NULL;
    int rc = 1;
    if (wl_model_open(&g->model, g->dir))
        goto out;
    g->model.sparse_2_4 = g->sparse_2_4;
    wl_show_load_on(&g->model, "weights");
    if (wl_open_ranks(&g->models, &g->model, g->dir, g->ranks))
        goto out;
    tokenizer_path(g->dir, path, sizeof path);
    if (wl_tokenizer_load(&g->tk, path)) {
        if (!g->prompt_ids)
            goto out;
        g->tk = NULL; /* ids in, ids out: the tokenizer is optional */
        fprintf(stderr, "weft-llm: no tokenizer (%s); printing ids only\n", wl_error());
        g->print_ids = 1;
    }
    if (g->draft_dir) {
        if (wl_draft_open(&g->draft, g->draft_dir, g->tk))
            goto out;
        wl_show_load_on(&g->draft, "the draft's weights");
    }
    if (g->prompt_ids ? parse_ids(g->prompt_ids, &g->ids, &g->n_ids)
                      : wl_encode(g->tk, g->prompt, strlen(g->prompt), 1, &g->ids, &g->n_ids))
        goto out;
    if (!g->n_ids) {
        wl_fail("the prompt encodes to no tokens");
        goto out;
    }
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.stack_size = 1 << 20;
    cfg.backend = !strcmp(g->backend, "host")   ? WEFT_BACKEND_HOST
                  : !strcmp(g->backend, "cuda") ? WEFT_BACKEND_CUDA
                                                : WEFT_BACKEND_AUTO;
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK) {
        wl_fail("weft runtime: %s", weft_last_error());
        goto out;
    }
    if (g->pipeline && wl_link_open(&g->link, rt))
        goto out;
    if (g->link && wl_link_rank(g->link) != 0) { /* a stage after the first: serve rank 0's steps */
        rc = wl_engine_follow(rt, &g->model, g->kv_pages, g->parallel,
                              (int)g->n_ids + g->max_tokens, g->link);
        goto out;
    }
    run_tasks(g, rt);
    rc = g->failed;
    if (rc)
        wl_fail("%s", g->message);
out:
    wl_link_close(g->link);
    if (rt)
        weft_runtime_destroy(rt);
    if (rc)
        fprintf(stderr, "weft-llm: %s\n", wl_error());
    wl_tokenizer_free(g->tk);
    wl_model_close(&g->model);
    wl_close_ranks(g->models, g->ranks);
    wl_model_close(&g->draft);
    free(g->ids);
    return rc;
}

static int run_generate_job(void *g)
{
    return run_generate(g);
}

static int cmd_generate(int argc, char **argv)
{
    gen g = {.max_tokens = 32,
             .parallel = 1,
             .ranks = 1,
             .kv_pages = WL_KV_DEFAULT_PAGES,
             .backend = "auto",
             .sampler = {.top_p = 1}};
    double v;
    if (argc < 1)
        return usage();
    g.dir = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--print-ids")) {
            g.print_ids = 1;
            continue;
        }
        if (!strcmp(a, "--print-top")) {
            g.print_top = 1;
            continue;
        }
        if (!strcmp(a, "--stats")) {
            g.stats = 1;
            continue;
        }
        if (!strcmp(a, "--ignore-eos")) {
            g.ignore_eos = 1;
            continue;
        }
        if (!strcmp(a, "--pipeline")) {
            g.pipeline = 1;
            continue;
        }
        if (!strcmp(a, "--sparse-2-4")) {
            g.sparse_2_4 = 1;
            continue;
        }
        if (!val)
            return usage();
        i++;
        if (!strcmp(a, "--prompt"))
            g.prompt = val;
        else if (!strcmp(a, "--prompt-ids"))
            g.prompt_ids = val;
        else if (!strcmp(a, "--backend"))
            g.backend = val;
        else if (!strcmp(a, "--max-tokens") && !parse_num(val, 1, 1 << 20, &v))
            g.max_tokens = (int)v;
        else if (!strcmp(a, "--parallel") && !parse_num(val, 1, 1024, &v))
            g.parallel = (int)v;
        else if (!strcmp(a, "--kv-pages") && !parse_num(val, 1, 1 << 24, &v))
            g.kv_pages = (int)v;
        else if (!strcmp(a, "--speculate") && !parse_num(val, 1, WL_SPEC_MAX_K, &v))
            g.speculate = (int)v;
        else if (!strcmp(a, "--ngram") && !parse_num(val, 1, WL_NGRAM_MAX, &v))
            g.ngram = (int)v;
        else if (!strcmp(a, "--tensor-parallel") && !parse_num(val, 1, WL_MAX_RANKS, &v))
            g.ranks = (int)v;
        else if (!strcmp(a, "--draft"))
            g.draft_dir = val;
        else if (!strcmp(a, "--seed") && !parse_num(val, 0, 1.8e19, &v))
            g.sampler.state = (uint64_t)v;
        else if (!strcmp(a, "--temperature") && !parse_num(val, 0, 100, &v))
            g.sampler.temperature = (float)v;
        else if (!strcmp(a, "--top-k") && !parse_num(val, 0, 1 << 30, &v))
            g.sampler.top_k = (int)v;
        else if (!strcmp(a, "--top-p") && !parse_num(val, 0, 1, &v))
            g.sampler.top_p = (float)v;
        else if (!strcmp(a, "--repetition-penalty") && !parse_num(val, 0.01, 100, &v))
            g.penalties.repetition = (float)v;
        else if (!strcmp(a, "--frequency-penalty") && !parse_num(val, -2, 2, &v))
            g.penalties.frequency = (float)v;
        else if (!strcmp(a, "--presence-penalty") && !parse_num(val, -2, 2, &v))
            g.penalties.presence = (float)v;
        else {
            fprintf(stderr, "weft-llm generate: bad option or value: %s %s\n", a, val);
            return 2;
        }
    }
    if (!g.prompt == !g.prompt_ids) {
        fprintf(stderr, "weft-llm generate: give --prompt or --prompt-ids (one of them)\n");
        return 2;
    }
    if (g.speculate && g.parallel > 1) {
        fprintf(stderr, "weft-llm generate: --speculate decodes one sequence alone (the batch-1 "
                        "latency path); it takes --parallel 1\n");
        return 2;
    }
    if ((g.ngram || g.draft_dir) && !g.speculate) {
        fprintf(stderr, "weft-llm generate: --%s is the proposer's, for --speculate\n",
                g.ngram ? "ngram" : "draft");
        return 2;
    }
    if (g.ngram && g.draft_dir) {
        fprintf(stderr, "weft-llm generate: the draft model or n-grams propose: --draft or "
                        "--ngram, not both\n");
        return 2;
    }
    if (strcmp(g.backend, "host") && strcmp(g.backend, "cuda") && strcmp(g.backend, "auto")) {
        fprintf(stderr, "weft-llm generate: --backend is host, cuda or auto\n");
        return 2;
    }
    if ((g.pipeline || g.ranks > 1) && g.speculate) {
        fprintf(stderr,
                "weft-llm generate: a split model does not decode speculatively: "
                "--%s or --speculate\n",
                g.pipeline ? "pipeline" : "tensor-parallel");
        return 2;
    }
    if (g.pipeline && g.ranks > 1) {
        fprintf(stderr, "weft-llm generate: --pipeline or --tensor-parallel, not both\n");
        return 2;
    }
    return g.pipeline ? wl_link_job("weft-llm generate", run_generate_job, &g) : run_generate(&g);
}

static int cmd_random_model(int argc, char **argv)
{
    wl_write_opts o = {.preset = NULL};
    double v;
    if (argc < 1)
        return usage();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config-only") || !strcmp(a, "--fp32") || !strcmp(a, "--fp8") ||
            !strcmp(a, "--prune-2-4")) {
            *(!strcmp(a, "--fp32")        ? &o.fp32
              : !strcmp(a, "--fp8")       ? &o.fp8
              : !strcmp(a, "--prune-2-4") ? &o.prune_2_4
                                          : &o.config_only) = 1;
            continue;
        }
        if (!val)
            return usage();
        i++;
        if (!strcmp(a, "--preset"))
            o.preset = val;
        else if (!strcmp(a, "--seed") && !parse_num(val, 0, 1.8e19, &v))
            o.seed = (uint64_t)v;
        else if (!strcmp(a, "--shard-mb") && !parse_num(val, 0.001, 1e6, &v))
            o.shard_bytes = (size_t)(v * (1 << 20));
        else {
            fprintf(stderr, "weft-llm random-model: bad option or value: %s %s\n", a, val);
            return 2;
        }
    }
    if (!o.preset)
        return usage();
    if (wl_write_random_model(argv[0], &o)) {
        fprintf(stderr, "weft-llm: %s\n", wl_error());
        return 1;
    }
    return 0;
}

static int cmd_tokenize(int argc, char **argv)
{
    char path[PATH_MAX];
    wl_tokenizer *tk;
    int32_t *ids;
    size_t n;
    if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "--no-special")))
        return usage();
    tokenizer_path(argv[0], path, sizeof path);
    if (wl_tokenizer_load(&tk, path) ||
        wl_encode(tk, argv[1], strlen(argv[1]), argc == 2, &ids, &n)) {
        fprintf(stderr, "weft-llm: %s\n", wl_error());
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? "," : "", ids[i]);
    printf("\n");
    free(ids);
    wl_tokenizer_free(tk);
    return 0;
}

static int cmd_check(int argc, char **argv)
{
    wl_model m;
    if (argc != 1)
        return usage();
    if (wl_model_open(&m, argv[0])) {
        fprintf(stderr, "weft-llm: %s\n", wl_error());
        return 1;
    }
    printf("%s: %s, %d layers, hidden %d, %d heads (%d kv), vocab %d, %s%s, %zu file(s)\n", argv[0],
           m.cfg.model_type, m.cfg.layers, m.cfg.hidden, m.cfg.heads, m.cfg.kv_heads, m.cfg.vocab,
           wl_dtype_name(m.dtype),
           m.cfg.fp8 ? (m.cfg.fp8_tensor_scale ? " with FP8 projections (a scale a tensor)"
                                               : " with FP8 projections (a scale a channel)")
                     : "",
           m.n_files);
    wl_model_close(&m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage();
    if (!strcmp(argv[1], "generate"))
        return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "random-model"))
        return cmd_random_model(argc - 2, argv + 2);
    if (!strcmp(argv[1], "tokenize"))
        return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "check"))
        return cmd_check(argc - 2, argv + 2);
    if (!strcmp(argv[1], "loadgen")) {
#ifdef WL_HAVE_LOADGEN
        return wl_loadgen_main(argc - 2, argv + 2);
#else
        fprintf(stderr, "weft-llm: loadgen was not built: libcurl was missing at build time "
                        "(scripts/install-deps installs it)\n");
        return 1;
#endif
    }
    if (!strcmp(argv[1], "bench"))
        return wl_bench_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "serve")) {
#ifdef WL_HAVE_SERVE
        return wl_serve_main(argc - 2, argv + 2);
#else
        fprintf(stderr, "weft-llm: built without serve (it needs libmicrohttpd-dev)\n");
        return 2;
#endif
    }
    return usage();
}
