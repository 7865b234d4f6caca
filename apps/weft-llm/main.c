/*
 * main.c - the weft-llm command line:
 *   weft-llm random-model DIR --preset tiny|1b|8b|moe [--seed N] [--config-only]
 *            [--shard-mb N]
 *   weft-llm generate MODEL_DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]
 *            [--seed N] [--temperature T] [--top-k K] [--top-p P] [--backend host|cuda|auto]
 *            [--print-ids] [--print-top] [--kv-pages N]
 *   weft-llm tokenize MODEL_DIR|tokenizer.json TEXT [--no-special]
 *   weft-llm check MODEL_DIR
 * generate streams the decoded text to stdout as it is sampled; with
 * --print-ids the prompt's and the generated ids follow on stderr, with
 * --print-top each step's two largest logits as they come. Errors
 * go to stderr as one line, exit status 1; bad usage exits 2.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llm.h"

typedef struct gen {
    const char *dir, *prompt, *prompt_ids, *backend;
    int max_tokens, print_ids, print_top;
    int kv_pages; /* pages of the model's KV cache, WL_KV_PAGE tokens each */
    wl_sampler sampler;
    wl_model model;
    wl_tokenizer *tk;
    int32_t *ids;
    size_t n_ids;
    int failed;
    char message[512]; /* the task's error line: tasks move between threads */
} gen;

static int usage(void)
{
    fprintf(stderr,
            "usage: weft-llm random-model DIR --preset tiny|1b|8b|moe [--seed N] [--config-only] "
            "[--shard-mb N]\n"
            "       weft-llm generate MODEL_DIR (--prompt TEXT | --prompt-ids 1,2,3) "
            "[--max-tokens N] [--seed N] [--kv-pages N]\n"
            "                [--temperature T] [--top-k K] [--top-p P] [--backend "
            "host|cuda|auto] [--print-ids] [--print-top]\n"
            "       weft-llm tokenize MODEL_DIR|tokenizer.json TEXT [--no-special]\n"
            "       weft-llm check MODEL_DIR\n");
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

static void emit(const gen *g, int32_t id, int at_start)
{
    char buf[1024];
    int n = g->tk ? wl_decode_token(g->tk, id, 0, at_start, buf, sizeof buf) : 0;
    if (n < 0)
        n = 0; /* an id of the model's (padded) vocabulary that the tokenizer lacks: no text */
    fwrite(buf, 1, (size_t)n, stdout);
    fflush(stdout);
}

static int is_eos(const wl_config *c, int id)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return 0;
}

/* The step's two largest logits, as tests/apps/llm_reference.py prints
 * transformers' (to tell a divergence at a near tie from a bug). */
static void print_top_two(const float *logits, int vocab, int step, int32_t id)
{
    int a = 0, b = -1;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[a]) {
            b = a;
            a = i;
        } else if (b < 0 || logits[i] > logits[b]) {
            b = i;
        }
    fprintf(stderr, "  step %d: token %d (top %d) logit %.5f, next %.5f, gap %.2e\n", step, id, a,
            logits[a], logits[b], (double)logits[a] - logits[b]);
}

/* One sequence, one task: prefill the prompt, then a token at a time. */
static void *generate_task(void *arg)
{
    gen *g = arg;
    wl_seq *s = NULL;
    wl_kv kv = {0};
    const float *logits;
    int32_t *out = malloc(((size_t)g->max_tokens + 1) * sizeof *out);
    int n_out = 0;
    g->failed = 1;
    if (!out) {
        wl_fail("out of memory");
        return NULL;
    }
    if (wl_model_upload(&g->model) || wl_kv_create(&kv, &g->model, g->kv_pages, WL_KV_PAGE) ||
        wl_seq_create(&s, &g->model, &kv, (int)g->n_ids + g->max_tokens) ||
        wl_forward(s, g->ids, (int)g->n_ids, &logits))
        goto done;
    while (n_out < g->max_tokens) {
        int32_t id = wl_sample(&g->sampler, logits, g->model.cfg.vocab);
        if (g->print_top)
            print_top_two(logits, g->model.cfg.vocab, n_out, id);
        out[n_out++] = id;
        if (is_eos(&g->model.cfg, id))
            break;
        emit(g, id, 0); /* a continuation of the prompt: never the text's start */
        if (n_out < g->max_tokens && wl_forward(s, &id, 1, &logits))
            goto done;
    }
    g->failed = 0;
    fputc('\n', stdout);
    if (g->print_ids) {
        fprintf(stderr, "prompt ids:");
        for (size_t i = 0; i < g->n_ids; i++)
            fprintf(stderr, "%s%d", i ? "," : " ", g->ids[i]);
        fprintf(stderr, "\ngenerated ids:");
        for (int i = 0; i < n_out; i++)
            fprintf(stderr, "%s%d", i ? "," : " ", out[i]);
        fprintf(stderr, "\n");
    }
done:
    if (g->failed)
        snprintf(g->message, sizeof g->message, "%s", wl_error());
    wl_seq_destroy(s);
    wl_kv_destroy(&kv);
    if (wl_model_release(&g->model) && !g->failed) {
        g->failed = 1;
        snprintf(g->message, sizeof g->message, "%s", wl_error());
    }
    free(out);
    return NULL;
}

static int run_generate(gen *g)
{
    char path[PATH_MAX];
    weft_runtime *rt = NULL;
    weft_task *task;
    int rc = 1;
    if (wl_model_open(&g->model, g->dir))
        goto out;
    tokenizer_path(g->dir, path, sizeof path);
    if (wl_tokenizer_load(&g->tk, path)) {
        if (!g->prompt_ids)
            goto out;
        g->tk = NULL; /* ids in, ids out: the tokenizer is optional */
        fprintf(stderr, "weft-llm: no tokenizer (%s); printing ids only\n", wl_error());
        g->print_ids = 1;
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
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.name = "sequence";
    if (weft_spawn(rt, &task, generate_task, g, &opts) != WEFT_OK ||
        weft_join(task, NULL) != WEFT_OK) {
        wl_fail("the sequence's task failed: %s", weft_last_error());
        goto out;
    }
    rc = g->failed;
    if (rc)
        wl_fail("%s", g->message);
out:
    if (rt)
        weft_runtime_destroy(rt);
    if (rc)
        fprintf(stderr, "weft-llm: %s\n", wl_error());
    wl_tokenizer_free(g->tk);
    wl_model_close(&g->model);
    free(g->ids);
    return rc;
}

static int cmd_generate(int argc, char **argv)
{
    gen g = {.max_tokens = 32,
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
        else if (!strcmp(a, "--kv-pages") && !parse_num(val, 1, 1 << 24, &v))
            g.kv_pages = (int)v;
        else if (!strcmp(a, "--seed") && !parse_num(val, 0, 1.8e19, &v))
            g.sampler.state = (uint64_t)v;
        else if (!strcmp(a, "--temperature") && !parse_num(val, 0, 100, &v))
            g.sampler.temperature = (float)v;
        else if (!strcmp(a, "--top-k") && !parse_num(val, 0, 1 << 30, &v))
            g.sampler.top_k = (int)v;
        else if (!strcmp(a, "--top-p") && !parse_num(val, 0, 1, &v))
            g.sampler.top_p = (float)v;
        else {
            fprintf(stderr, "weft-llm generate: bad option or value: %s %s\n", a, val);
            return 2;
        }
    }
    if (!g.prompt == !g.prompt_ids) {
        fprintf(stderr, "weft-llm generate: give --prompt or --prompt-ids (one of them)\n");
        return 2;
    }
    if (strcmp(g.backend, "host") && strcmp(g.backend, "cuda") && strcmp(g.backend, "auto")) {
        fprintf(stderr, "weft-llm generate: --backend is host, cuda or auto\n");
        return 2;
    }
    return run_generate(&g);
}

static int cmd_random_model(int argc, char **argv)
{
    wl_write_opts o = {.preset = NULL};
    double v;
    if (argc < 1)
        return usage();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config-only")) {
            o.config_only = 1;
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
    printf("%s: %s, %d layers, hidden %d, %d heads (%d kv), vocab %d, %s, %zu file(s)\n", argv[0],
           m.cfg.model_type, m.cfg.layers, m.cfg.hidden, m.cfg.heads, m.cfg.kv_heads, m.cfg.vocab,
           wl_dtype_name(m.dtype), m.n_files);
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
    return usage();
}
