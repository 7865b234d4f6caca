/*
 * test_llm_batch.c - weft-llm's batched decoding on the host backend: the
 * batcher task and wl_forward_batch against each sequence run alone with
 * the one-sequence path (wl_forward), the KV pages coming back, a sequence
 * stopped midway leaving the others going, wl_forward_batch's errors,
 * tokens drawn on the backend (greedy, no logits copied, or sampled by
 * each sequence's own parameters) against those drawn from the logits, a long prompt prefilled in
 * chunks between another sequence's decode steps, and generate --parallel on the command line; for
 * the tiny Llama and the mixture-of-experts presets (Mixtral, Qwen2-MoE). Token ids and the model
 * are drawn from the printed seed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "llm_test.h"

static char *dir, *model_dir, *moe_dirs[2];
static uint64_t seed;
static const char *const moe_presets[2] = {"moe", "qwen2moe"}; /* Mixtral, Qwen2-MoE */

static int setup(void **state)
{
    (void)state;
    seed = test_seed();
    dir = scratch_dir();
    if (!dir)
        return -1;
    model_dir = path_in(dir, "tiny");
    wl_write_opts o = {.preset = "tiny", .seed = seed};
    if (wl_write_random_model(model_dir, &o)) {
        fprintf(stderr, "%s\n", wl_error());
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        moe_dirs[i] = path_in(dir, moe_presets[i]);
        wl_write_opts mo = {.preset = moe_presets[i], .seed = seed};
        if (wl_write_random_model(moe_dirs[i], &mo)) {
            fprintf(stderr, "%s\n", wl_error());
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_scratch(dir);
    free(dir);
    free(model_dir);
    free(moe_dirs[0]);
    free(moe_dirs[1]);
    return 0;
}

enum { SEQS = 5, MAX_TOTAL = 14, V = TINY_VOCAB, PAGES = 8 };

/* Sequence q's prompt and total length; sequence 3 stops after STOP of its
 * decode steps (a request dropped), and sequence 4's task is cancelled
 * (weft_cancel) by itself after CANCEL, both before their natural end. */
static const int prompt_len[SEQS] = {5, 3, 7, 4, 2};
static const int total_len[SEQS] = {9, 14, 12, 13, 14};
enum { STOP = 2, CANCEL = 3 };

static void batched_decode_matches_alone(const char *model, int chunk)
{
    enum { STEPS = MAX_TOTAL };
    int32_t ids[SEQS][MAX_TOTAL], picked[SEQS][MAX_TOTAL];
    /* sequences 0 and 2 sample, each by its own parameters; the rest greedy */
    const weft_sampling sampled[2] = {
        {.temperature = 0.9f, .top_p = 0.95f, .seed = seed, .offset = 5},
        {.temperature = 1.3f, .top_k = 7, .seed = seed + 1}};
    uint64_t st = seed ^ 0xba7c;
    float *alone = malloc(sizeof(float) * SEQS * STEPS * V);
    float *together = malloc(sizeof(float) * SEQS * STEPS * V);
    char msg[512];
    for (size_t i = 0; i < (size_t)SEQS * STEPS * V; i++)
        together[i] = NAN; /* every row a sequence decodes must be written */
    batch_run r = {.seqs = SEQS, .pages = PAGES, .chunk = chunk};
    for (int q = 0; q < SEQS; q++) {
        for (int i = 0; i < MAX_TOTAL; i++)
            ids[q][i] = (int32_t)(wl_rand_next(&st) % V);
        if (run_forward(WEFT_BACKEND_HOST, model, ids[q], prompt_len[q], total_len[q],
                        alone + (size_t)q * STEPS * V, msg))
            fail_msg("alone: %s", msg);
        r.ids[q] = ids[q];
        r.prompt[q] = prompt_len[q];
        r.total[q] = total_len[q];
        r.stop[q] = q == 3 ? STOP : 0;
        r.cancel[q] = q == 4 ? CANCEL : 0;
        r.logits[q] = together + (size_t)q * STEPS * V;
        r.picked[q] = picked[q];
        r.how[q] = q == 0 ? &sampled[0] : q == 2 ? &sampled[1] : NULL;
        r.greedy_only[q] = q == 1; /* the longest: its last steps are alone, no logits copied */
    }
    printf("  %s, %s\n", model, chunk ? "prompts in the batcher's steps" : "prompts alone");
    if (run_batched(WEFT_BACKEND_HOST, model, &r))
        fail_msg("batched: %s", r.message);
    assert_int_equal(r.free_pages, PAGES); /* every page back */
    long want_rows = 0;
    for (int q = 0; q < SEQS; q++) {
        int decoded = q == 3 ? STOP : q == 4 ? CANCEL : total_len[q] - prompt_len[q];
        assert_int_equal(r.steps_done[q], decoded);
        want_rows += decoded;
    }
    if (chunk) /* the prompts' tokens went through the steps too */
        for (int q = 0; q < SEQS; q++)
            want_rows += prompt_len[q];
    printf("  %ld tokens in %ld batched steps\n", r.rows, r.steps);
    assert_int_equal(r.rows, want_rows);
    assert_true(r.steps < r.rows); /* sequences shared steps */
    /* step for step, each sequence's logits are those it gives alone */
    double worst = 0, scale = 0;
    long differing = 0;
    for (int q = 0; q < SEQS; q++)
        for (int k = 0; k <= (r.greedy_only[q] ? 0 : r.steps_done[q]); k++)
            for (int i = 0; i < V; i++) {
                size_t at = ((size_t)q * STEPS + k) * V + i;
                assert_false(isnan(together[at]));
                differing += alone[at] != together[at];
                worst = fmax(worst, fabs((double)alone[at] - together[at]));
                scale = fmax(scale, fabs((double)alone[at]));
            }
    printf("  max |logit| %.4f, max difference from alone %.3e, %ld logits differ\n", scale, worst,
           differing);
    assert_true(scale > 0.01);
    /* The host backend runs each row through the same ops in the same
     * order, so the only freedom is sgemm's for m rows against one row. */
    assert_true(worst <= scale / 128);
    /* each step's token: a sampling sequence's, weft_sample's draw from the
     * row it came with by its parameters at that step's offset; a greedy
     * one's, the first maximum of that row, and for the sequence that took
     * no logits, a maximum of its row alone (within the batch's rounding) */
    int draws_differ = 0;
    for (int q = 0; q < SEQS; q++)
        for (int k = 0; k < r.steps_done[q]; k++) {
            const float *row =
                (r.greedy_only[q] ? alone : together) + ((size_t)q * STEPS + k + 1) * V;
            int first = 0;
            for (int i = 1; i < V; i++)
                first = row[i] > row[first] ? i : first;
            if (r.how[q]) {
                weft_sampling how = *r.how[q];
                how.offset += (uint64_t)k;
                int32_t want = -1;
                assert_int_equal(weft_sample(NULL, WEFT_DTYPE_F32, &want, row, 1, V, V, &how),
                                 WEFT_OK);
                assert_int_equal(picked[q][k], want);
                draws_differ += want != first;
            } else if (r.greedy_only[q]) {
                /* its own rows unseen: within the bound the seen rows keep */
                assert_true(row[picked[q][k]] >= row[first] - fmax(2 * worst, scale / 128));
            } else {
                assert_int_equal(picked[q][k], first);
            }
        }
    printf("  %d sampled tokens are not their row's maximum\n", draws_differ);
    free(alone);
    free(together);
}

/* The tiny Llama, and the MoE presets: their experts run over the batch's
 * rows in one grouped matmul per projection, each row routed as alone. */
static void test_batched_decode_matches_alone(void **state)
{
    (void)state;
    batched_decode_matches_alone(model_dir, 0);
    for (int i = 0; i < 2; i++)
        batched_decode_matches_alone(moe_dirs[i], 0);
}

/* Prompts handed to the batcher in chunks of 3 (wl_batcher_prefill): each
 * step mixes decode tokens with chunks of other prompts (a chunk at
 * position 0, and the later ones over their pages), and every row comes
 * out as the sequence gives it alone. The dense model only: a MoE prompt's
 * rows computed beside others round differently, and where its router's
 * top scores nearly tie a token may take another expert, a step away from
 * the bound (the MoE models' mixed steps run in the engine's tests). */
static void test_prompts_in_mixed_steps_match_alone(void **state)
{
    (void)state;
    batched_decode_matches_alone(model_dir, 3);
}

/* wl_forward_batch refuses, before anything runs, a sequence with no
 * prompt yet, one given twice, a token outside the vocabulary and a batch
 * larger than its buffers; wl_forward_mixed a chunk longer than the batch
 * takes. */
typedef struct err_job {
    wl_model *m;
    int failed;
    char message[1024];
} err_job;

static void *errors_task(void *arg)
{
    err_job *j = arg;
    wl_kv kv = {0};
    wl_batch *b = NULL;
    wl_seq *s[2] = {NULL, NULL};
    const float *lg[3];
    int32_t ids[3] = {1, 2, 3}, bad[2] = {1, V};
    char *p = j->message;
    size_t cap = sizeof j->message;
    j->failed = 1;
    if (wl_model_upload(j->m) || wl_kv_create(&kv, j->m, 4, 16) ||
        wl_batch_create(&b, j->m, &kv, 2, 16, 0) || wl_seq_create(&s[0], j->m, &kv, 16, 16) ||
        wl_seq_create(&s[1], j->m, &kv, 16, 16)) {
        snprintf(p, cap, "setup: %s", wl_error());
        goto out;
    }
    struct {
        wl_seq *a, *b;
        const int32_t *ids;
        int n;
        const char *want;
    } cases[4];
    cases[0] = (__typeof__(cases[0])){s[0], s[1], ids, 2, "no prompt yet"};
    if (wl_forward(s[0], ids, 2, &lg[0]) || wl_forward(s[1], ids, 3, &lg[0])) {
        snprintf(p, cap, "prefill: %s", wl_error());
        goto out;
    }
    cases[1] = (__typeof__(cases[1])){s[0], s[0], ids, 2, "is also row 0"};
    cases[2] = (__typeof__(cases[2])){s[0], s[1], bad, 2, "outside the vocabulary"};
    cases[3] = (__typeof__(cases[3])){s[0], s[1], ids, 3, "the batch takes 1 to 2"};
    for (int c = 0; c < 4; c++) {
        if (c == 0) {
            wl_seq *fresh = NULL;
            if (wl_seq_create(&fresh, j->m, &kv, 16, 16))
                goto out;
            wl_seq *pair[2] = {s[0], fresh};
            int rc = wl_forward_batch(b, pair, ids, 2, lg, NULL, NULL);
            int ok = rc == -1 && strstr(wl_error(), cases[c].want);
            wl_seq_destroy(fresh);
            if (!ok) {
                snprintf(p, cap, "case %d: rc %d, %s", c, rc, wl_error());
                goto out;
            }
            continue;
        }
        wl_seq *pair[3] = {cases[c].a, cases[c].b, s[1]};
        int free_before = wl_kv_free_pages(&kv);
        int rc = wl_forward_batch(b, pair, cases[c].ids, cases[c].n, lg, NULL, NULL);
        if (rc != -1 || !strstr(wl_error(), cases[c].want) ||
            wl_kv_free_pages(&kv) != free_before) {
            snprintf(p, cap, "case %d: rc %d, %s", c, rc, wl_error());
            goto out;
        }
    }
    /* a batch made for decode steps takes no chunk */
    int counts[2] = {2, 1};
    wl_seq *two[2] = {s[0], s[1]};
    if (wl_forward_mixed(b, two, ids, counts, 2, lg, NULL, NULL) != -1 ||
        !strstr(wl_error(), "a step takes 1 to 1 of one")) {
        snprintf(p, cap, "a chunk in a decode batch: %s", wl_error());
        goto out;
    }
    /* and a good batch of the two still runs */
    wl_seq *pair[2] = {s[0], s[1]};
    if (wl_forward_batch(b, pair, ids, 2, lg, NULL, NULL)) {
        snprintf(p, cap, "good batch: %s", wl_error());
        goto out;
    }
    j->failed = 0;
out:
    wl_seq_destroy(s[0]);
    wl_seq_destroy(s[1]);
    wl_batch_destroy(b);
    if (!j->failed && wl_kv_free_pages(&kv) != 4) {
        snprintf(p, cap, "pages kept: %d free of 4", wl_kv_free_pages(&kv));
        j->failed = 1;
    }
    wl_kv_destroy(&kv);
    wl_model_release(j->m);
    return NULL;
}

static void test_forward_batch_errors(void **state)
{
    (void)state;
    err_job j = {0};
    wl_model m;
    assert_int_equal(wl_model_open(&m, model_dir), 0);
    j.m = &m;
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.stack_size = 1 << 20;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, errors_task, &j, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    wl_model_close(&m);
    if (j.failed)
        fail_msg("%s", j.message);
}

/* generate --parallel N: N copies of the prompt through the batcher, each
 * printed with its index; greedy, every copy continues as the run of one
 * sequence does (the batch's logits are within a bf16 unit of it, see
 * above, so only a near tie could part them); sampled, copy i draws with
 * seed + i, so copy 0 is the one-sequence run with the same seed. */
static char *run_cli(const char *args, char **err)
{
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s %s", WL_BIN, args);
    int rc = run_capture(cmd, &out, err);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", cmd, rc, *err);
    return out;
}

static void test_cli_parallel(void **state)
{
    (void)state;
    enum { N = 3 };
    char args[1024], *err1, *errn, *errs, *errs1;
    snprintf(args, sizeof args,
             "generate %s --prompt 'The old woman' --max-tokens 10 --print-ids --backend host",
             model_dir);
    char *one = run_cli(args, &err1);
    snprintf(args + strlen(args), sizeof args - strlen(args), " --parallel %d", N);
    char *many = run_cli(args, &errn);
    printf("  one: %s  %d: %s", one, N, many);
    const char *gen1 = strstr(err1, "generated ids: ");
    assert_non_null(gen1);
    char want[512];
    snprintf(want, sizeof want, "%.*s", (int)strcspn(gen1, "\n"), gen1);
    const char *at = many;
    for (int i = 0; i < N; i++) {
        char head[16];
        snprintf(head, sizeof head, "[%d] ", i);
        at = strstr(at, head);
        if (!at)
            fail_msg("no line opens with \"%s\" in:\n%s", head, many);
        /* the text of each copy is the single run's */
        size_t len = strcspn(one, "\n");
        assert_int_equal(strncmp(at + strlen(head), one, len), 0);
        assert_non_null(strstr(errn, head));
    }
    at = errn;
    for (int i = 0; i < N; i++) {
        at = strstr(at, want);
        assert_non_null(at);
        at += strlen(want);
    }
    /* a cache of two pages holds one of these sequences at a time: the
     * engine admits them one after another, and each still ends as alone */
    snprintf(args + strlen(args), sizeof args - strlen(args), " --kv-pages 2");
    char *errq, *queued = run_cli(args, &errq);
    assert_string_equal(queued, many);
    assert_string_equal(errq, errn);
    free(queued);
    free(errq);
    /* sampled: copy 0 is the single run with the same seed. The copies run
     * one after another (two pages hold one), each alone as the single run
     * is: run together, their rows would round as their steps' company
     * makes them, and a draw on the random model's flat distribution can
     * take a neighbouring token (the greedy copies above hold regardless) */
    snprintf(args, sizeof args,
             "generate %s --prompt 'The old woman' --max-tokens 10 --print-ids --backend host "
             "--temperature 1.2 --seed 7",
             model_dir);
    char *s1 = run_cli(args, &errs1);
    snprintf(args + strlen(args), sizeof args - strlen(args), " --parallel %d --kv-pages 2", N);
    char *sn = run_cli(args, &errs);
    printf("  sampled: %s  %s", s1, sn);
    const char *g1 = strstr(errs1, "generated ids: "), *g0 = strstr(errs, "[0] prompt ids");
    assert_non_null(g1);
    assert_non_null(g0);
    g0 = strstr(g0, "generated ids: ");
    assert_non_null(g0);
    assert_int_equal(strncmp(g0, g1, strcspn(g1, "\n")), 0);
    /* a bad count */
    char *out = NULL, *err = NULL, cmd[2048];
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt hi --parallel 0", WL_BIN, model_dir);
    assert_int_equal(run_capture(cmd, &out, &err), 2);
    assert_non_null(strstr(err, "--parallel"));
    free(out);
    free(err);
    free(one);
    free(many);
    free(s1);
    free(sn);
    free(err1);
    free(errn);
    free(errs);
    free(errs1);
}

/* The engine's admission: one place in the batch, held by a long
 * generation; a normal and then a high-priority generation queue behind
 * it, and the high one is admitted first. A queued generation whose hook
 * says cancelled leaves the queue without running. */
typedef struct adm_run {
    wl_engine *e;
    weft_priority priority;
    int cancel; /* its cancelled hook says yes */
    int tokens, order, failed;
    wl_finish finish;
} adm_run;

static int admitted_so_far;

static int adm_token(void *ctx, int32_t id, int eos, const float *logits)
{
    adm_run *r = ctx;
    (void)id, (void)eos, (void)logits;
    if (!r->tokens++)
        r->order = __atomic_add_fetch(&admitted_so_far, 1, __ATOMIC_ACQ_REL);
    return 0;
}

static int adm_cancelled(void *ctx)
{
    return ((adm_run *)ctx)->cancel;
}

static void *adm_task(void *arg)
{
    adm_run *r = arg;
    static const int32_t prompt[] = {256, 296, 267};
    wl_gen g = {.prompt = prompt,
                .n_prompt = 3,
                .max_tokens = r->priority == WEFT_PRIO_LOW ? 60 : 4,
                .ignore_eos = 1,
                .priority = r->priority,
                .on_token = adm_token,
                .cancelled = adm_cancelled,
                .ctx = r};
    r->failed = wl_engine_generate(r->e, &g, &r->finish);
    return NULL;
}

/* The tiny model's engine on a runtime of 2 host workers: pages of the
 * cache, places in the batch, tokens a sequence. */
static void engine_up(wl_model *m, wl_engine *e, weft_runtime **rt, int pages, int seqs, int tokens)
{
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.stack_size = 1 << 20;
    assert_int_equal(wl_model_open(m, model_dir), 0);
    assert_int_equal(weft_runtime_create(rt, &cfg), WEFT_OK);
    assert_int_equal(wl_engine_start(e, *rt, m, pages, seqs, tokens), 0);
}

static void engine_down(wl_model *m, wl_engine *e, weft_runtime *rt)
{
    assert_int_equal(wl_engine_stop(e), 0);
    weft_runtime_destroy(rt);
    wl_model_close(m);
}

static void test_engine_admission_order(void **state)
{
    (void)state;
    wl_model m;
    wl_engine e;
    weft_runtime *rt;
    engine_up(&m, &e, &rt, 16, 1, 64);
    adm_run runs[4] = {{.e = &e, .priority = WEFT_PRIO_LOW},
                       {.e = &e, .priority = WEFT_PRIO_NORMAL},
                       {.e = &e, .priority = WEFT_PRIO_NORMAL, .cancel = 1},
                       {.e = &e, .priority = WEFT_PRIO_HIGH}};
    weft_task *t[4];
    admitted_so_far = 0;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(weft_spawn(rt, &t[i], adm_task, &runs[i], NULL), WEFT_OK);
        /* each queues before the next arrives: the first is running */
        for (int k = 0; k < 200; k++) {
            wl_engine_counts c;
            wl_engine_stats(&e, &c);
            if (c.running + c.queued == i + 1)
                break;
            usleep(5000);
        }
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
    printf("  admitted: low %d, normal %d, high %d; the cancelled one ran %d tokens\n",
           runs[0].order, runs[1].order, runs[3].order, runs[2].tokens);
    for (int i = 0; i < 4; i++)
        assert_false(runs[i].failed);
    assert_int_equal(runs[0].order, 1);
    assert_int_equal(runs[3].order, 2); /* high before the normal that came first */
    assert_int_equal(runs[1].order, 3);
    assert_int_equal(runs[2].tokens, 0);
    assert_int_equal(runs[2].finish, WL_FINISH_CANCELLED);
    wl_engine_counts c;
    wl_engine_stats(&e, &c);
    assert_int_equal(c.running + c.queued + c.reserved_pages + c.used_pages, 0);
    engine_down(&m, &e, rt);
}

/* Generations cancelled by other tasks at random moments (queued, in
 * their prefill, waiting on a step, between steps), several rounds of four
 * on an engine of three places: each one ends (nothing hangs: the test's
 * timeout would say so), as cancelled or with an error, and every page
 * and place comes back. */
typedef struct cancel_run {
    wl_engine *e;
    int tokens, failed;
    wl_finish finish;
} cancel_run;

static int count_token(void *ctx, int32_t id, int eos, const float *logits)
{
    (void)id, (void)eos, (void)logits;
    ((cancel_run *)ctx)->tokens++;
    return 0;
}

static void *cancel_gen_task(void *arg)
{
    cancel_run *r = arg;
    static const int32_t prompt[] = {256, 296, 267, 323};
    wl_gen g = {.prompt = prompt,
                .n_prompt = 4,
                .max_tokens = 40,
                .ignore_eos = 1,
                .on_token = count_token,
                .ctx = r};
    r->failed = wl_engine_generate(r->e, &g, &r->finish);
    return NULL;
}

typedef struct canceller {
    weft_task *target;
    uint64_t after_ns;
} canceller;

static void *cancel_later(void *arg)
{
    canceller *k = arg;
    weft_sleep_ns(k->after_ns);
    weft_cancel(k->target);
    return NULL;
}

static void survives_cancellation(int pages)
{
    enum { ROUNDS = 30, GENS = 4 };
    wl_model m;
    wl_engine e;
    weft_runtime *rt;
    uint64_t st = seed ^ 0xca9c;
    engine_up(&m, &e, &rt, pages, 3, 64);
    long ended_early = 0, tokens = 0;
    for (int round = 0; round < ROUNDS; round++) {
        cancel_run runs[GENS];
        canceller ks[GENS];
        weft_task *t[GENS], *k[GENS];
        for (int i = 0; i < GENS; i++) {
            runs[i] = (cancel_run){.e = &e};
            assert_int_equal(weft_spawn(rt, &t[i], cancel_gen_task, &runs[i], NULL), WEFT_OK);
        }
        for (int i = 0; i < GENS; i++) {
            ks[i] = (canceller){t[i], (wl_rand_next(&st) % 160) * 250000ull}; /* 0-40 ms */
            assert_int_equal(weft_spawn(rt, &k[i], cancel_later, &ks[i], NULL), WEFT_OK);
        }
        for (int i = 0; i < GENS; i++) {
            assert_int_equal(weft_join(k[i], NULL), WEFT_OK);
            int rc = weft_join(t[i], NULL);
            assert_true(rc == WEFT_OK || rc == WEFT_ETASKCANCELED);
            ended_early += runs[i].tokens < 40;
            tokens += runs[i].tokens;
        }
        wl_engine_counts c;
        wl_engine_stats(&e, &c);
        assert_int_equal(c.running + c.queued + c.reserved_pages + c.used_pages, 0);
    }
    wl_engine_counts c;
    wl_engine_stats(&e, &c);
    printf("  %d pages: %d generations cancelled at random: %ld ended early, %ld tokens in all, "
           "%ld preemptions\n",
           pages, ROUNDS * GENS, ended_early, tokens, c.preemptions);
    assert_true(ended_early > 0);
    engine_down(&m, &e, rt);
}

/* With room for all (16 pages), and with room for two of the three that
 * decode at once (6 pages of 3 a generation), where cancellations land
 * in preemptions too. */
static void test_engine_survives_cancellation(void **state)
{
    (void)state;
    survives_cancellation(16);
    survives_cancellation(6);
}

/* More generations than the cache holds at their longest: six of 10 + 60
 * tokens (5 pages each at the end) on 10 pages. Each is admitted with the
 * pages of its prompt and grows; when the cache runs out the newest is
 * preempted and later recomputes its prompt and tokens. Every one ends
 * with its 60 tokens, the tokens it makes on a roomy cache (greedy), and
 * every page comes back. A recomputed prefix runs its matmuls over many
 * rows where the steps ran one, and a bf16 activation may round the other
 * way, so two runs may part at a near tie (top two within a bf16 unit of
 * the largest, 1/128 of it), never elsewhere. */
typedef struct preempt_run {
    wl_engine *e;
    int32_t prompt[10], ids[60];
    float gap[60]; /* between the two largest logits of each token's row, over the largest's size */
    int n, failed;
    wl_finish finish;
} preempt_run;

static int keep_token(void *ctx, int32_t id, int eos, const float *logits)
{
    (void)eos;
    preempt_run *r = ctx;
    if (r->n < 60) {
        float top = -INFINITY, second = -INFINITY;
        for (int i = 0; i < V; i++)
            if (logits[i] > top)
                second = top, top = logits[i];
            else if (logits[i] > second)
                second = logits[i];
        r->ids[r->n] = id;
        r->gap[r->n] = (top - second) / fabsf(top);
    }
    r->n++;
    return 0;
}

static void *preempt_task(void *arg)
{
    preempt_run *r = arg;
    wl_gen g = {.prompt = r->prompt,
                .n_prompt = 10,
                .max_tokens = 60,
                .ignore_eos = 1,
                .on_token = keep_token,
                .wants_logits = 1,
                .ctx = r};
    r->failed = wl_engine_generate(r->e, &g, &r->finish);
    return NULL;
}

static void run_all(int pages, size_t swap_bytes, preempt_run *runs, int count,
                    wl_engine_counts *after)
{
    wl_model m;
    wl_engine e;
    weft_runtime *rt;
    weft_task *t[8];
    engine_up(&m, &e, &rt, pages, count, 80);
    e.swap_bytes = swap_bytes;
    for (int i = 0; i < count; i++) {
        runs[i].e = &e;
        runs[i].n = 0;
        assert_int_equal(weft_spawn(rt, &t[i], preempt_task, &runs[i], NULL), WEFT_OK);
    }
    for (int i = 0; i < count; i++)
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
    wl_engine_stats(&e, after);
    engine_down(&m, &e, rt);
}

static void preempts_and_comes_back(size_t swap_bytes)
{
    enum { GENS = 6 };
    preempt_run tight[GENS], roomy[GENS];
    uint64_t st = seed ^ 0x9e37;
    for (int i = 0; i < GENS; i++)
        for (int j = 0; j < 10; j++)
            tight[i].prompt[j] = roomy[i].prompt[j] = (int32_t)(wl_rand_next(&st) % V);
    wl_engine_counts c;
    run_all(64, 0, roomy, GENS, &c);
    assert_int_equal(c.preemptions, 0);
    run_all(10, swap_bytes, tight, GENS, &c);
    printf("  %d generations on 10 pages: %ld preemptions, %ld of them swapped\n", GENS,
           c.preemptions, c.swaps);
    assert_true(c.preemptions > 0);
    if (swap_bytes)
        assert_true(c.swaps > 0);
    else
        assert_int_equal(c.swaps, 0);
    assert_int_equal(c.running + c.queued + c.reserved_pages + c.used_pages, 0);
    for (int i = 0; i < GENS; i++) {
        assert_false(tight[i].failed);
        assert_int_equal(tight[i].n, 60);
        assert_int_equal(tight[i].finish, WL_FINISH_LENGTH);
        for (int k = 0; k < 60; k++)
            if (tight[i].ids[k] != roomy[i].ids[k]) {
                printf("  generation %d parts at token %d, a near tie (gap %.2g of the top)\n", i,
                       k, roomy[i].gap[k]);
                assert_true(roomy[i].gap[k] < 1.0f / 128);
                break;
            }
    }
}

static void test_engine_preempts_and_recomputes(void **state)
{
    (void)state;
    preempts_and_comes_back(0);
}

/* The same with room in host memory for every preempted cache: they come
 * back swapped in, not recomputed. */
static void test_engine_preempts_and_swaps(void **state)
{
    (void)state;
    preempts_and_comes_back(64u << 20);
}

/* A sequence's cache swapped out to host memory and into a fresh
 * sequence's own pages continues bit for bit (llm_test.h). */
static void test_a_swapped_sequence_continues_bit_for_bit(void **state)
{
    (void)state;
    char msg[512];
    if (run_swap_roundtrip(WEFT_BACKEND_HOST, model_dir, msg))
        fail_msg("%s", msg);
}

/* A prompt whose first pages another prompt published: the second
 * generation starts its prefill after them (decode attention over the
 * pages for the rest) and its first logits agree with the first's, which
 * computed the whole prompt. */
typedef struct prefix_run {
    wl_engine *e;
    const int32_t *prompt;
    int n;
    float logits[V];
    int failed;
} prefix_run;

static int keep_first_logits(void *ctx, int32_t id, int eos, const float *logits)
{
    (void)id, (void)eos;
    memcpy(((prefix_run *)ctx)->logits, logits, sizeof(float) * V);
    return 1; /* one token is enough */
}

static void *prefix_task(void *arg)
{
    prefix_run *r = arg;
    wl_gen g = {.prompt = r->prompt,
                .n_prompt = r->n,
                .max_tokens = 1,
                .on_token = keep_first_logits,
                .wants_logits = 1,
                .ctx = r};
    wl_finish f;
    r->failed = wl_engine_generate(r->e, &g, &f);
    return NULL;
}

static void test_engine_shares_prompt_prefixes(void **state)
{
    (void)state;
    enum { N = 45 };
    int32_t prompt[N];
    uint64_t st = seed ^ 0x9f1c;
    for (int i = 0; i < N; i++)
        prompt[i] = (int32_t)(wl_rand_next(&st) % V);
    wl_model m;
    wl_engine e;
    weft_runtime *rt;
    engine_up(&m, &e, &rt, 16, 2, 64);
    e.kv.sharing = 1;
    prefix_run first = {.e = &e, .prompt = prompt, .n = N},
               second = {.e = &e, .prompt = prompt, .n = N};
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, prefix_task, &first, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &t, prefix_task, &second, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_false(first.failed);
    assert_false(second.failed);
    wl_engine_counts c;
    wl_engine_stats(&e, &c);
    double worst = 0, scale = 0;
    for (int i = 0; i < V; i++) {
        worst = fmax(worst, fabs((double)first.logits[i] - second.logits[i]));
        scale = fmax(scale, fabs((double)first.logits[i]));
    }
    printf("  %ld of %d prompt tokens shared; first logits differ by %.3e (max |logit| %.4f)\n",
           c.shared_tokens, N, worst, scale);
    assert_int_equal(c.shared_tokens, 32); /* two whole pages of 16 */
    assert_true(scale > 0.01);
    assert_true(worst <= scale / 128);
    engine_down(&m, &e, rt);
}

/* A greedy generation whose on_token reads no logits takes each decode
 * step's id from the backend's argmax (no logits copied back): the same
 * tokens as one that asks for the logits and draws from them on the host;
 * and one of each at once, sharing steps. */
static void test_greedy_without_logits_chooses_the_same_tokens(void **state)
{
    (void)state;
    enum { NP = 6, MAXT = 40 };
    int32_t prompt[NP];
    uint64_t st = seed ^ 0x6e3d;
    for (int i = 0; i < NP; i++)
        prompt[i] = (int32_t)(wl_rand_next(&st) % V);
    wl_model m;
    wl_engine e;
    weft_runtime *rt;
    engine_up(&m, &e, &rt, 16, 2, 64);
    gen_run *with = calloc(1, sizeof *with), *without = calloc(1, sizeof *without);
    assert_true(with && without);
    *with = (gen_run){.e = &e, .prompt = prompt, .n_prompt = NP, .max_tokens = MAXT};
    *without = *with;
    with->logits = malloc(sizeof(float) * MAXT * V);
    assert_non_null(with->logits);
    for (int together = 0; together < 2; together++) {
        weft_task *a, *b;
        assert_int_equal(weft_spawn(rt, &a, gr_task, with, NULL), WEFT_OK);
        if (!together)
            assert_int_equal(weft_join(a, NULL), WEFT_OK);
        assert_int_equal(weft_spawn(rt, &b, gr_task, without, NULL), WEFT_OK);
        if (together)
            assert_int_equal(weft_join(a, NULL), WEFT_OK);
        assert_int_equal(weft_join(b, NULL), WEFT_OK);
        if (with->failed || without->failed)
            fail_msg("%s%s", with->message, without->message);
        assert_int_equal(with->n, without->n);
        for (int i = 0; i < with->n; i++)
            assert_int_equal(with->ids[i], without->ids[i]);
        printf("  %s: %d tokens alike\n", together ? "at once" : "one after the other", with->n);
    }
    engine_down(&m, &e, rt);
    free(with->logits);
    free(with);
    free(without);
}

/* A long prompt arriving while another sequence decodes is prefilled in
 * chunks, each after one more decode step: the decoder takes a step at
 * every chunk boundary, and the prompt's logits are those of a prefill in
 * one piece. */
/* A prompt of NB tokens prefilled in chunks of `chunk` while another
 * sequence decodes, the batcher's prompt budget `budget` (0: none): the
 * decoder goes on through it, at least as many steps run meanwhile as the
 * chunks (or, with a budget, the budget's parts) make, and the prompt's
 * logits are those of the prompt in one piece. */
static void long_prompt_between_steps(int chunk, int budget)
{
    enum { NA = 4, NB = 41 };
    const int per_step = budget ? budget : chunk, parts = (NB - 1) / per_step;
    int32_t pa[NA], pb[NB];
    uint64_t st = seed ^ 0xc4a2;
    for (int i = 0; i < NA; i++)
        pa[i] = (int32_t)(wl_rand_next(&st) % V);
    for (int i = 0; i < NB; i++)
        pb[i] = (int32_t)(wl_rand_next(&st) % V);
    wl_model m;
    wl_engine e;
    weft_runtime *rt;
    engine_up(&m, &e, &rt, 16, 2, 128);
    e.prefill_chunk = chunk;
    wl_batcher_set_prompt_budget(e.batcher, budget);
    gen_run *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *whole = calloc(1, sizeof *whole);
    assert_true(a && b && whole);
    *a = (gen_run){.e = &e, .prompt = pa, .n_prompt = NA, .max_tokens = 60, .ignore_eos = 1};
    *b = (gen_run){.e = &e, .prompt = pb, .n_prompt = NB, .max_tokens = 1};
    *whole = *b;
    b->logits = malloc(sizeof(float) * V);
    whole->logits = malloc(sizeof(float) * V);
    assert_true(b->logits && whole->logits);
    weft_task *ta, *tb;
    assert_int_equal(weft_spawn(rt, &ta, gr_task, a, NULL), WEFT_OK);
    wl_engine_counts c0, c1;
    do { /* the decoder is under way */
        usleep(1000);
        wl_engine_stats(&e, &c0);
    } while (c0.steps < 2);
    assert_int_equal(weft_spawn(rt, &tb, gr_task, b, NULL), WEFT_OK);
    assert_int_equal(weft_join(tb, NULL), WEFT_OK);
    wl_engine_stats(&e, &c1);
    assert_int_equal(weft_join(ta, NULL), WEFT_OK);
    if (a->failed || b->failed)
        fail_msg("%s%s", a->message, b->message);
    printf("  %d prompt tokens in chunks of %d, at most %d a step: %ld decode steps ran "
           "meanwhile\n",
           NB, chunk, per_step, c1.steps - c0.steps);
    assert_int_equal(a->n, 60); /* it decoded throughout */
    assert_true(c1.steps - c0.steps >= parts);
    e.prefill_chunk = 0; /* the same prompt in one piece, alone */
    assert_int_equal(run_generation(rt, whole), 0);
    double worst = 0, scale = 0;
    for (int i = 0; i < V; i++) {
        worst = fmax(worst, fabs((double)b->logits[i] - whole->logits[i]));
        scale = fmax(scale, fabs((double)whole->logits[i]));
    }
    printf("  its logits against one piece's: max difference %.3e (max |logit| %.4f)\n", worst,
           scale);
    assert_true(scale > 0.01);
    assert_true(worst <= scale / 128);
    engine_down(&m, &e, rt);
    free(a);
    free(b->logits), free(b);
    free(whole->logits), free(whole);
}

static void test_a_long_prompt_is_prefilled_between_steps(void **state)
{
    (void)state;
    long_prompt_between_steps(8, 0);
}

/* The budget cuts each chunk of 8 into parts of 3, 3 and 2. */
static void test_a_prompt_budget_cuts_chunks_between_steps(void **state)
{
    (void)state;
    long_prompt_between_steps(8, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_decode_matches_alone),
        cmocka_unit_test(test_prompts_in_mixed_steps_match_alone),
        cmocka_unit_test(test_forward_batch_errors),
        cmocka_unit_test(test_cli_parallel),
        cmocka_unit_test(test_engine_admission_order),
        cmocka_unit_test(test_engine_shares_prompt_prefixes),
        cmocka_unit_test(test_engine_survives_cancellation),
        cmocka_unit_test(test_engine_preempts_and_recomputes),
        cmocka_unit_test(test_engine_preempts_and_swaps),
        cmocka_unit_test(test_a_swapped_sequence_continues_bit_for_bit),
        cmocka_unit_test(test_greedy_without_logits_chooses_the_same_tokens),
        cmocka_unit_test(test_a_long_prompt_is_prefilled_between_steps),
        cmocka_unit_test(test_a_prompt_budget_cuts_chunks_between_steps),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
