/*
 * test_llm_batch.c - weft-llm's batched decoding on the host backend: the
 * batcher task and wl_forward_batch against each sequence run alone with
 * the one-sequence path (wl_forward), the KV pages coming back, a sequence
 * stopped midway leaving the others going, wl_forward_batch's errors, and
 * generate --parallel on the command line; for the tiny Llama and the
 * mixture-of-experts presets (Mixtral, Qwen2-MoE).
 * Token ids and the model are drawn from the printed seed.
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

enum { SEQS = 5, MAX_TOTAL = 14, V = 512, PAGES = 8 };

/* Sequence q's prompt and total length; sequence 3 stops after STOP of its
 * decode steps (a request dropped), and sequence 4's task is cancelled
 * (weft_cancel) by itself after CANCEL, both before their natural end. */
static const int prompt_len[SEQS] = {5, 3, 7, 4, 2};
static const int total_len[SEQS] = {9, 14, 12, 13, 14};
enum { STOP = 2, CANCEL = 3 };

static void batched_decode_matches_alone(const char *model)
{
    enum { STEPS = MAX_TOTAL };
    int32_t ids[SEQS][MAX_TOTAL];
    uint64_t st = seed ^ 0xba7c;
    float *alone = malloc(sizeof(float) * SEQS * STEPS * V);
    float *together = malloc(sizeof(float) * SEQS * STEPS * V);
    char msg[512];
    for (size_t i = 0; i < (size_t)SEQS * STEPS * V; i++)
        together[i] = NAN; /* every row a sequence decodes must be written */
    batch_run r = {.seqs = SEQS, .pages = PAGES};
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
    }
    printf("  %s\n", model);
    if (run_batched(WEFT_BACKEND_HOST, model, &r))
        fail_msg("batched: %s", r.message);
    assert_int_equal(r.free_pages, PAGES); /* every page back */
    long want_rows = 0;
    for (int q = 0; q < SEQS; q++) {
        int decoded = q == 3 ? STOP : q == 4 ? CANCEL : total_len[q] - prompt_len[q];
        assert_int_equal(r.steps_done[q], decoded);
        want_rows += decoded;
    }
    printf("  %ld decode tokens in %ld batched steps\n", r.rows, r.steps);
    assert_int_equal(r.rows, want_rows);
    assert_true(r.steps < r.rows); /* sequences shared steps */
    /* step for step, each sequence's logits are those it gives alone */
    double worst = 0, scale = 0;
    long differing = 0;
    for (int q = 0; q < SEQS; q++)
        for (int k = 0; k <= r.steps_done[q]; k++)
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
    free(alone);
    free(together);
}

/* The tiny Llama, and the MoE presets: their experts run over the batch's
 * rows in one grouped matmul per projection, each row routed as alone. */
static void test_batched_decode_matches_alone(void **state)
{
    (void)state;
    batched_decode_matches_alone(model_dir);
    for (int i = 0; i < 2; i++)
        batched_decode_matches_alone(moe_dirs[i]);
}

/* wl_forward_batch refuses, before anything runs, a sequence with no
 * prompt yet, one given twice, a token outside the vocabulary and a batch
 * larger than its buffers. */
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
        wl_batch_create(&b, j->m, &kv, 2, 16) || wl_seq_create(&s[0], j->m, &kv, 16, 16) ||
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
            int rc = wl_forward_batch(b, pair, ids, 2, lg);
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
        int rc = wl_forward_batch(b, pair, cases[c].ids, cases[c].n, lg);
        if (rc != -1 || !strstr(wl_error(), cases[c].want) ||
            wl_kv_free_pages(&kv) != free_before) {
            snprintf(p, cap, "case %d: rc %d, %s", c, rc, wl_error());
            goto out;
        }
    }
    /* and a good batch of the two still runs */
    wl_seq *pair[2] = {s[0], s[1]};
    if (wl_forward_batch(b, pair, ids, 2, lg)) {
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
    /* sampled: copy 0 is the single run with the same seed */
    snprintf(args, sizeof args,
             "generate %s --prompt 'The old woman' --max-tokens 10 --print-ids --backend host "
             "--temperature 1.2 --seed 7",
             model_dir);
    char *s1 = run_cli(args, &errs1);
    snprintf(args + strlen(args), sizeof args - strlen(args), " --parallel %d", N);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_decode_matches_alone),
        cmocka_unit_test(test_forward_batch_errors),
        cmocka_unit_test(test_cli_parallel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
