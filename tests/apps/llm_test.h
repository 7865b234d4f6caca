/*
 * llm_test.h - what the weft-llm tests share: a scratch folder, running
 * the program with its output captured, writing files byte for byte, and
 * runs of the forward pass, the batcher and the engine in tasks.
 */
#ifndef LLM_TEST_H
#define LLM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "llm.h"

/* The random-model writer's tiny preset's vocabulary: 256 bytes, 254
 * merges, BOS, EOS, <|im_start|> and <|im_end|>. */
enum { TINY_VOCAB = 514 };

static inline char *scratch_dir(void)
{
    char tmpl[] = "/tmp/weft-llm-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static inline void remove_scratch(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static inline char *path_in(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static inline int write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) || w != n ? -1 : 0;
}

/* Runs a shell command; its stdout (and stderr, when err is given) into
 * malloc'd strings. Returns the exit status. */
static inline int run_capture(const char *cmd, char **out, char **err)
{
    char full[4096], errpath[] = "/tmp/weft-llm-err-XXXXXX";
    *out = NULL;
    if (err)
        *err = NULL;
    int fd = mkstemp(errpath);
    if (fd < 0)
        return -1;
    close(fd);
    snprintf(full, sizeof full, "%s 2>%s", cmd, errpath);
    FILE *p = popen(full, "r");
    if (!p)
        return -1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t r; (r = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += r;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int status = pclose(p);
    *out = buf;
    if (err) {
        FILE *e = fopen(errpath, "rb");
        char *eb = calloc(1, 1 << 16);
        if (e) {
            size_t r = fread(eb, 1, (1 << 16) - 1, e);
            eb[r] = 0;
            fclose(e);
        }
        *err = eb;
    }
    unlink(errpath);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline uint64_t test_seed(void)
{
    const char *s = getenv("WEFT_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (WEFT_TEST_SEED=%llu repeats it)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    return seed;
}

/* The indices of the largest and the second largest of n >= 2 logits (the
 * first of equal ones). */
static inline void logits_top_two(const float *l, int n, int *a, int *b)
{
    *a = 0, *b = 1;
    if (l[1] > l[0])
        *a = 1, *b = 0;
    for (int i = 2; i < n; i++)
        if (l[i] > l[*a])
            *b = *a, *a = i;
        else if (l[i] > l[*b])
            *b = i;
}

/* The ids of generate --print-ids's "generated ids: " line in err (at
 * most cap), and how many. */
static inline int printed_ids(const char *err, long long *ids, int cap)
{
    const char *p = strstr(err, "generated ids: ");
    if (!p)
        fail_msg("no \"generated ids: \" line in generate's output");
    p += strlen("generated ids: ");
    int n = 0;
    for (char *end; n < cap && *p != '\n' && *p; p = end + (*end == ',')) {
        ids[n++] = strtoll(p, &end, 10);
        if (end == p)
            fail_msg("a malformed \"generated ids: \" line");
    }
    return n;
}

/* Step k's line in generate --print-top's output (err): the token it
 * chose, and the gap between its two largest logits over the largest's
 * size. Greedy runs whose matmuls see other row counts (a verify pass, a
 * batch) may part where that gap is under a bf16 unit, 1/128, only. */
static inline double printed_gap(const char *err, int k, long long *token)
{
    char step[32];
    snprintf(step, sizeof step, "step %d: ", k);
    const char *line = strstr(err, step);
    double top = 0, next = 0;
    if (!line || sscanf(line + strlen(step), "token %lld (top %*d) logit %lf, next %lf", token,
                        &top, &next) != 3)
        fail_msg("no step %d in generate's --print-top output", k);
    return (top - next) / fabs(top);
}

/* A copy of the tiny model in model_dir as another architecture, in
 * dir/name (returned, malloc'd): model_type and the fields of extra (taken)
 * set in its config, its weights of variant_dtype, with Qwen2's biases or
 * Qwen3's per-head norms added (random from seed, so that they matter),
 * and q and k scaled up so that attention depends on position. */
static inline char *write_variant(const char *dir, const char *model_dir, const char *name,
                                  const char *model_type, json_t *extra, int bias, int qk_norm,
                                  weft_dtype variant_dtype, uint64_t seed)
{
    char *dst = path_in(dir, name), *src_cfg = path_in(model_dir, "config.json");
    char *dst_cfg = path_in(dst, "config.json"), *src = path_in(model_dir, "model.safetensors");
    char *out_path = path_in(dst, "model.safetensors");
    assert_int_equal(mkdir(dst, 0777), 0);
    json_t *cfg = json_load_file(src_cfg, 0, NULL);
    json_object_set_new(cfg, "model_type", json_string(model_type));
    json_object_update(cfg, extra);
    json_decref(extra);
    assert_int_equal(json_dump_file(cfg, dst_cfg, JSON_INDENT(1)), 0);
    int layers = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    json_decref(cfg);

    wl_st_file f;
    assert_int_equal(wl_st_open(&f, src), 0);
    size_t cap = f.count + 8 * (size_t)layers, n = 0;
    wl_st_spec *specs = calloc(cap, sizeof *specs);
    int *fill = calloc(cap, sizeof *fill); /* 0: copy, 1: bias, 2: norm */
    char(*names)[96] = calloc(cap, sizeof *names);
    for (size_t i = 0; i < f.count; i++) {
        specs[n] = (wl_st_spec){
            .name = f.tensors[i].name, .dtype = variant_dtype, .ndim = f.tensors[i].ndim};
        memcpy(specs[n++].shape, f.tensors[i].shape, sizeof specs[0].shape);
    }
    static const char *const bias_names[] = {"q_proj.bias", "k_proj.bias", "v_proj.bias"};
    static const char *const norm_names[] = {"q_norm.weight", "k_norm.weight"};
    static const uint64_t bias_len[] = {256, 128, 128};
    for (int l = 0; l < layers; l++) {
        for (int b = 0; bias && b < 3; b++) {
            snprintf(names[n], 96, "model.layers.%d.self_attn.%s", l, bias_names[b]);
            specs[n] = (wl_st_spec){names[n], variant_dtype, 1, {bias_len[b]}};
            fill[n++] = 1;
        }
        for (int b = 0; qk_norm && b < 2; b++) {
            snprintf(names[n], 96, "model.layers.%d.self_attn.%s", l, norm_names[b]);
            specs[n] = (wl_st_spec){names[n], variant_dtype, 1, {64}};
            fill[n++] = 2;
        }
    }
    FILE *out = fopen(out_path, "wb");
    assert_int_equal(wl_st_write_header(out, specs, n), 0);
    uint64_t st = seed ^ 0xb1a5;
    for (size_t i = 0; i < n; i++) {
        size_t es = wl_dtype_size(variant_dtype);
        uint32_t v;
        if (!fill[i]) {
            const wl_tensor *t = wl_st_find(&f, specs[i].name);
            /* q and k 8x sharper (exact), so that positions matter: the
             * random model's scores are otherwise near 0 */
            float scale =
                strstr(t->name, "q_proj.weight") || strstr(t->name, "k_proj.weight") ? 8.0f : 1.0f;
            for (size_t j = 0; j < t->nbytes / 2; j++) {
                wl_store(variant_dtype, &v, 0, scale * wl_load(WEFT_DTYPE_BF16, t->data, j));
                assert_int_equal(fwrite(&v, es, 1, out), 1);
            }
            continue;
        }
        for (uint64_t j = 0; j < specs[i].shape[0]; j++) {
            double x = wl_rand_normal(&st);
            wl_store(variant_dtype, &v, 0, (float)(fill[i] == 1 ? 0.5 * x : 1 + 0.3 * x));
            assert_int_equal(fwrite(&v, es, 1, out), 1);
        }
    }
    assert_int_equal(fclose(out), 0);
    wl_st_close(&f);
    free(specs);
    free(fill);
    free(names);
    free(src_cfg);
    free(dst_cfg);
    free(src);
    free(out_path);
    return dst;
}

/* ---- the forward pass in a task ------------------------------------------- */

typedef struct fwd_job {
    wl_model *m;
    const int32_t *ids;
    int n_prompt, n_total;
    float *logits; /* [steps][vocab]: after the prompt, then after each token */
    int failed;
    char message[512]; /* the task's error line (a task may move between threads) */
    int step;          /* tokens a call after the prompt; 0 means 1 */
    wl_kv *kv;         /* the model's cache, shared; NULL: the task makes its own */
} fwd_job;

static inline void *forward_task(void *arg)
{
    fwd_job *j = (fwd_job *)arg;
    wl_seq *s = NULL;
    wl_kv own = {0}, *kv = j->kv ? j->kv : &own;
    const float *lg;
    int V = j->m->cfg.vocab;
    j->failed = 1;
    if (wl_model_upload(j->m) || (!j->kv && wl_kv_create(&own, j->m, 8, 16)) ||
        wl_seq_create(&s, j->m, kv, j->n_total, j->n_total) ||
        wl_forward(s, j->ids, j->n_prompt, &lg))
        goto out;
    memcpy(j->logits, lg, (size_t)V * 4);
    int step = j->step ? j->step : 1;
    for (int t = j->n_prompt, k = 1; t < j->n_total; t += step, k++) {
        int n = j->n_total - t < step ? j->n_total - t : step;
        if (wl_forward(s, &j->ids[t], n, &lg))
            goto out;
        memcpy(j->logits + (size_t)k * V, lg, (size_t)V * 4);
    }
    j->failed = 0;
out:
    snprintf(j->message, sizeof j->message, "%s", wl_error());
    wl_seq_destroy(s);
    if (own.lock_made && wl_kv_free_pages(&own) != own.pages) {
        snprintf(j->message, sizeof j->message, "the sequence kept %d pages",
                 own.pages - wl_kv_free_pages(&own));
        j->failed = 1;
    }
    wl_kv_destroy(&own);
    wl_model_release(j->m);
    return NULL;
}

/* Opens the model in dir and runs ids through it on a runtime of the given
 * backend: the prompt's n_prompt tokens at once, then step at a time up to
 * n_total. The logits after each call (poisoned with NaN first) go to
 * logits. Returns 0, or -1 with the reason in message. */
static inline int run_forward_steps(weft_backend backend, const char *dir, const int32_t *ids,
                                    int n_prompt, int n_total, int step, float *logits,
                                    char message[512])
{
    wl_model m;
    if (wl_model_open(&m, dir)) {
        snprintf(message, 512, "%s", wl_error());
        return -1;
    }
    size_t count = (size_t)(1 + (n_total - n_prompt + step - 1) / step) * m.cfg.vocab;
    for (size_t i = 0; i < count; i++)
        logits[i] = NAN; /* every logit must be written */
    fwd_job job = {&m, ids, n_prompt, n_total, logits, 1, "", step, NULL};
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = backend;
    cfg.stack_size = 1 << 20;
    weft_task *t;
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK) {
        snprintf(message, 512, "runtime: %s", weft_last_error());
        wl_model_close(&m);
        return -1;
    }
    if (weft_spawn(rt, &t, forward_task, &job, NULL) != WEFT_OK || weft_join(t, NULL) != WEFT_OK)
        snprintf(job.message, sizeof job.message, "task: %s", weft_last_error());
    weft_runtime_destroy(rt);
    wl_model_close(&m);
    snprintf(message, 512, "%s", job.message);
    return job.failed ? -1 : 0;
}

/* The prompt, then a token at a time. */
static inline int run_forward(weft_backend backend, const char *dir, const int32_t *ids,
                              int n_prompt, int n_total, float *logits, char message[512])
{
    return run_forward_steps(backend, dir, ids, n_prompt, n_total, 1, logits, message);
}

/* ---- sequences through the batcher --------------------------------------- */

/* A run of seqs sequences through a batcher: sequence q's prompt is
 * ids[q][0, prompt[q]) (prefilled alone, or with chunk > 0 through the
 * batcher's mixed steps, chunk tokens at a time), then ids[q][prompt[q],
 * total[q]) a step at a time through the batcher, unless stop[q] > 0 stops
 * it after that many steps (as a request dropped), and cancel[q] > 0 has
 * its task cancel itself (weft_cancel) after that many: its next step must
 * fail, and it must still leave. logits[q] gets
 * [steps][vocab]: after the prompt, then after each step. */
#define BR_MAX_SEQS 8
#define BR_MAX_TOTAL 64
typedef struct batch_run {
    int seqs, pages, chunk;
    const int32_t *ids[BR_MAX_SEQS];
    int prompt[BR_MAX_SEQS], total[BR_MAX_SEQS], stop[BR_MAX_SEQS], cancel[BR_MAX_SEQS];
    float *logits[BR_MAX_SEQS];
    /* greedy_only[q]: q's steps ask for no logits (its rows past the
     * prompt's stay unwritten); picked[q] (optional) gets each step's
     * token, [steps]: drawn with how[q] at offset how[q].offset + step
     * (how[q] NULL: greedy) */
    int greedy_only[BR_MAX_SEQS];
    int32_t *picked[BR_MAX_SEQS];
    const weft_sampling *how[BR_MAX_SEQS];
    /* results */
    int steps_done[BR_MAX_SEQS];
    long steps, rows; /* the batcher's steps and the tokens they took */
    int free_pages;   /* free after every sequence ended */
    char message[512];
} batch_run;

typedef struct br_env {
    wl_model m;
    wl_kv kv;
    wl_batcher *bt;
    batch_run *r;
    int failed;
    char message[512];
} br_env;

typedef struct br_seq {
    br_env *e;
    int q, failed;
    char message[512];
} br_seq;

static inline void *br_setup_task(void *arg)
{
    br_env *e = (br_env *)arg;
    int longest = 1;
    for (int q = 0; q < e->r->seqs; q++)
        longest = e->r->total[q] > longest ? e->r->total[q] : longest;
    e->failed = wl_model_upload(&e->m) || wl_kv_create(&e->kv, &e->m, e->r->pages, 16) ||
                wl_batcher_create(&e->bt, &e->m, &e->kv, e->r->seqs, longest, e->r->chunk);
    snprintf(e->message, sizeof e->message, "%s", wl_error());
    return NULL;
}

static inline void *br_teardown_task(void *arg)
{
    br_env *e = (br_env *)arg;
    wl_batcher_destroy(e->bt);
    wl_kv_destroy(&e->kv);
    wl_model_release(&e->m);
    return NULL;
}

/* A sequence's life: its prefill alone, then each token through the
 * batcher, then it leaves and its pages go back. */
static inline void *br_seq_task(void *arg)
{
    br_seq *j = (br_seq *)arg;
    batch_run *r = j->e->r;
    int q = j->q, V = j->e->m.cfg.vocab, joined = 0;
    wl_seq *s = NULL;
    const float *lg;
    j->failed = 1;
    if (wl_seq_create(&s, &j->e->m, &j->e->kv, r->total[q], r->total[q]))
        goto out;
    if (r->chunk > 0) { /* joined first, the prompt in the batcher's steps */
        if (wl_batcher_join(j->e->bt, s))
            goto out;
        joined = 1;
        for (int at = 0; at < r->prompt[q]; at += r->chunk) {
            int len = r->prompt[q] - at < r->chunk ? r->prompt[q] - at : r->chunk;
            if (wl_batcher_prefill(j->e->bt, s, r->ids[q] + at, len, NULL, &lg, NULL))
                goto out;
        }
    } else if (wl_forward(s, r->ids[q], r->prompt[q], &lg)) {
        goto out;
    }
    memcpy(r->logits[q], lg, (size_t)V * 4);
    if (!joined && wl_batcher_join(j->e->bt, s))
        goto out;
    joined = 1;
    for (int t = r->prompt[q]; t < r->total[q]; t++) {
        if (r->stop[q] && r->steps_done[q] == r->stop[q])
            break; /* stopped: it leaves while the others go on */
        if (r->cancel[q] && r->steps_done[q] == r->cancel[q]) {
            weft_cancel(weft_task_current());
            if (!wl_batcher_step(j->e->bt, s, r->ids[q][t], NULL, &lg, NULL) ||
                !strstr(wl_error(), "cancelled"))
                goto out; /* a step after the cancellation must fail, saying so */
            break;
        }
        int32_t picked = -1;
        wl_draw draw = {{0}, NULL};
        if (r->how[q])
            draw.how = *r->how[q], draw.how.offset += (uint64_t)r->steps_done[q];
        if (wl_batcher_step(j->e->bt, s, r->ids[q][t], &draw, r->greedy_only[q] ? NULL : &lg,
                            &picked))
            goto out;
        if (r->picked[q])
            r->picked[q][r->steps_done[q]] = picked;
        if (!r->greedy_only[q])
            memcpy(r->logits[q] + (size_t)(r->steps_done[q] + 1) * V, lg, (size_t)V * 4);
        __atomic_store_n(&r->steps_done[q], r->steps_done[q] + 1, __ATOMIC_RELEASE);
    }
    j->failed = 0;
out:
    snprintf(j->message, sizeof j->message, "%s", wl_error());
    if (joined)
        wl_batcher_leave(j->e->bt, s);
    wl_seq_destroy(s);
    return NULL;
}

/* Runs r on a runtime of the given backend. Returns 0, or -1 with the
 * reason in r->message. */
static inline int run_batched(weft_backend backend, const char *dir, batch_run *r)
{
    br_env e;
    br_seq jobs[BR_MAX_SEQS];
    weft_task *t, *bt = NULL, *seq[BR_MAX_SEQS];
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    int spawned = 0, rc = -1;
    memset(&e, 0, sizeof e);
    e.r = r;
    r->steps = r->rows = 0;
    snprintf(r->message, sizeof r->message, "%s", "");
    if (wl_model_open(&e.m, dir)) {
        snprintf(r->message, sizeof r->message, "%s", wl_error());
        return -1;
    }
    cfg.workers = 2;
    cfg.backend = backend;
    cfg.stack_size = 1 << 20;
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK) {
        snprintf(r->message, sizeof r->message, "runtime: %s", weft_last_error());
        wl_model_close(&e.m);
        return -1;
    }
    if (weft_spawn(rt, &t, br_setup_task, &e, NULL) != WEFT_OK || weft_join(t, NULL) != WEFT_OK ||
        e.failed) {
        snprintf(r->message, sizeof r->message, "setup: %.400s", e.message);
        goto out;
    }
    if (weft_spawn(rt, &bt, wl_batcher_run, e.bt, NULL) != WEFT_OK)
        goto out;
    for (; spawned < r->seqs; spawned++) {
        r->steps_done[spawned] = 0;
        jobs[spawned] = (br_seq){.e = &e, .q = spawned};
        if (weft_spawn(rt, &seq[spawned], br_seq_task, &jobs[spawned], NULL) != WEFT_OK)
            break;
    }
    rc = spawned == r->seqs ? 0 : -1;
    for (int q = 0; q < spawned; q++) {
        int jrc = weft_join(seq[q], NULL);
        int join_ok = r->cancel[q] ? jrc == WEFT_ETASKCANCELED : jrc == WEFT_OK;
        if (!join_ok || jobs[q].failed) {
            if (!rc)
                snprintf(r->message, sizeof r->message, "sequence %d: %.400s", q, jobs[q].message);
            rc = -1;
        }
    }
    r->free_pages = wl_kv_free_pages(&e.kv);
    wl_batcher_stats(e.bt, &r->steps, &r->rows);
    wl_batcher_close(e.bt);
    weft_join(bt, NULL);
out:
    if (weft_spawn(rt, &t, br_teardown_task, &e, NULL) == WEFT_OK)
        weft_join(t, NULL);
    weft_runtime_destroy(rt);
    wl_model_close(&e.m);
    if (rc && !r->message[0])
        snprintf(r->message, sizeof r->message, "a task: %s", weft_last_error());
    return rc;
}

/* ---- generations through the engine --------------------------------------- */

/* One generation through a started engine (wl_engine_generate in a task of
 * its own): its tokens, their eos flags and the logits handed with each
 * (logits: GR_MAX_TOKENS rows of the model's vocab, the caller's), how it
 * ended and the speculative counts. stop_after > 0: on_token stops it
 * after that many tokens. */
#define GR_MAX_TOKENS 64
typedef struct gen_run {
    wl_engine *e;
    const int32_t *prompt;
    int n_prompt, max_tokens, speculate, stop_after, ignore_eos;
    int use_draft, ngram; /* speculate's proposer: the engine's draft model, n-grams */
    wl_sampler sampler;
    float *logits;
    /* results */
    int32_t ids[GR_MAX_TOKENS];
    int eos[GR_MAX_TOKENS], n, failed;
    wl_finish finish;
    wl_spec_stats st;
    char message[512];
} gen_run;

static inline int gr_collect(void *ctx, int32_t id, int eos, const float *logits)
{
    gen_run *r = (gen_run *)ctx;
    int vocab = r->e->model->cfg.vocab;
    if (r->n >= GR_MAX_TOKENS)
        return -1;
    r->ids[r->n] = id;
    r->eos[r->n] = eos;
    if (r->logits)
        memcpy(r->logits + (size_t)r->n * vocab, logits, sizeof(float) * vocab);
    r->n++;
    return r->stop_after && r->n == r->stop_after ? 1 : 0;
}

static inline void *gr_task(void *arg)
{
    gen_run *r = (gen_run *)arg;
    wl_gen g = {.prompt = r->prompt,
                .n_prompt = r->n_prompt,
                .max_tokens = r->max_tokens,
                .sampler = r->sampler,
                .on_token = gr_collect,
                .wants_logits = r->logits != NULL,
                .ignore_eos = r->ignore_eos,
                .ctx = r,
                .speculate_k = r->speculate,
                .use_draft = r->use_draft,
                .ngram = r->ngram,
                .spec_stats = &r->st};
    r->n = 0;
    memset(&r->st, 0xff, sizeof r->st); /* must be written */
    r->failed = wl_engine_generate(r->e, &g, &r->finish) != 0;
    snprintf(r->message, sizeof r->message, "%s", r->failed ? wl_error() : "");
    return NULL;
}

/* Returns 0, or -1 with the reason in r->message. */
static inline int run_generation(weft_runtime *rt, gen_run *r)
{
    weft_task *t;
    if (weft_spawn(rt, &t, gr_task, r, NULL) != WEFT_OK || weft_join(t, NULL) != WEFT_OK) {
        snprintf(r->message, sizeof r->message, "task: %s", weft_last_error());
        return -1;
    }
    return r->failed ? -1 : 0;
}

/* ---- a sequence's cache swapped out and back ----------------------------- */

/* A sequence's cache swapped out to host memory and into a fresh
 * sequence's own pages (taken while the first still holds its) continues
 * bit for bit: the next token's logits are those of a sequence that never
 * left; and every page comes back. */
typedef struct swap_job {
    wl_model *m;
    int failed;
    char message[512];
} swap_job;

static inline void *swap_task(void *arg)
{
    swap_job *j = arg;
    wl_kv kv = {0};
    wl_seq *a = NULL, *b = NULL, *c = NULL;
    void *host = NULL;
    const float *lg;
    int V = j->m->cfg.vocab;
    float *want = malloc((size_t)V * sizeof *want);
    int32_t ids[23];
    for (int i = 0; i < 23; i++)
        ids[i] = (int32_t)((37 * i + 5) % V);
    j->failed = 1;
    if (!want || wl_model_upload(j->m) || wl_kv_create(&kv, j->m, 16, 16) ||
        wl_seq_create(&a, j->m, &kv, 40, 20) || wl_seq_create(&b, j->m, &kv, 40, 20) ||
        wl_seq_create(&c, j->m, &kv, 40, 20))
        goto out;
    if (wl_forward(a, ids, 20, &lg) || wl_forward(b, ids, 20, &lg))
        goto out;
    for (int t = 20; t < 23; t++)
        if (wl_forward(a, ids + t, 1, &lg) || (t < 22 && wl_forward(b, ids + t, 1, &lg)))
            goto out;
    memcpy(want, lg, (size_t)V * sizeof *want);
    size_t bytes = wl_seq_swap_bytes(j->m, wl_seq_length(b));
    if (wl_seq_length(b) != 22 || !(host = malloc(bytes))) {
        wl_fail("b holds %d tokens", wl_seq_length(b));
        goto out;
    }
    if (wl_seq_swap_out(b, host) || wl_seq_swap_in(c, host, 22))
        goto out;
    wl_seq_destroy(b);
    b = NULL;
    if (wl_forward(c, ids + 22, 1, &lg))
        goto out;
    if (memcmp(want, lg, (size_t)V * sizeof *want) != 0) {
        wl_fail("the swapped sequence's next logits differ from the one that stayed");
        goto out;
    }
    if (!wl_seq_swap_in(c, host, 22) || !strstr(wl_error(), "holding 23")) {
        wl_fail("swap in over a sequence's own tokens: %s", wl_error());
        goto out;
    }
    j->failed = 0;
out:
    if (j->failed)
        snprintf(j->message, sizeof j->message, "%s", wl_error());
    wl_seq_destroy(a);
    wl_seq_destroy(b);
    wl_seq_destroy(c);
    if (!j->failed && wl_kv_free_pages(&kv) != 16) {
        snprintf(j->message, sizeof j->message, "pages kept: %d free of 16", wl_kv_free_pages(&kv));
        j->failed = 1;
    }
    if (kv.lock_made)
        wl_kv_destroy(&kv);
    wl_model_release(j->m);
    free(host);
    free(want);
    return NULL;
}

/* swap_task on a runtime of the given backend over the model in dir: 0, or
 * -1 with the reason in message. */
static inline int run_swap_roundtrip(weft_backend backend, const char *dir, char message[512])
{
    swap_job j = {0};
    wl_model m;
    weft_runtime *rt;
    weft_task *t;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = backend;
    cfg.stack_size = 1 << 20;
    if (wl_model_open(&m, dir)) {
        snprintf(message, 512, "%s", wl_error());
        return -1;
    }
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK) {
        snprintf(message, 512, "runtime: %s", weft_last_error());
        wl_model_close(&m);
        return -1;
    }
    j.m = &m;
    if (weft_spawn(rt, &t, swap_task, &j, NULL) != WEFT_OK || weft_join(t, NULL) != WEFT_OK) {
        j.failed = 1;
        snprintf(j.message, sizeof j.message, "task: %s", weft_last_error());
    }
    weft_runtime_destroy(rt);
    wl_model_close(&m);
    snprintf(message, 512, "%s", j.message);
    return j.failed ? -1 : 0;
}

#endif
