/*
 * test_llm_spec.c - weft-llm's speculative decoding on the host backend:
 * the n-gram proposer, the acceptance rule (greedy exactly; sampled, the
 * emitted token's distribution against the sampler's p over many seeded
 * trials), the verify pass (wl_forward_rows against one token at a time;
 * a rewound sequence's stale keys never read), and generations through
 * the engine with speculate_k against plain greedy decoding, token for
 * token, on a repetitive prompt and a non-repetitive one, ending at
 * max_tokens, at an end-of-sequence token and at on_token's stop (in the
 * middle of a round too); then the command line's --speculate.
 * The model and token ids are drawn from the printed seed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "llm_test.h"

static char *dir, *model_dir;
static uint64_t seed;

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
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_scratch(dir);
    free(dir);
    free(model_dir);
    return 0;
}

enum { V = TINY_VOCAB };

/* ---- the proposer ------------------------------------------------------------ */

/* Proposes from toks (n of them) and checks the draft. The buffer past n
 * holds a sentinel that would change the answer if it were read. */
static void expect_draft(const int32_t *toks, int n, int max_ngram, int k, const int32_t *want,
                         int want_n)
{
    int32_t buf[64], draft[40];
    memcpy(buf, toks, (size_t)n * sizeof *buf);
    for (int i = n; i < 64; i++)
        buf[i] = 999;
    for (int i = 0; i < 40; i++)
        draft[i] = -7;
    int got = wl_ngram_propose(buf, n, max_ngram, k, draft);
    printf("  n %d, ngram %d, k %d: %d drafted:", n, max_ngram, k, got);
    for (int i = 0; i < got; i++)
        printf(" %d", draft[i]);
    printf("\n");
    assert_int_equal(got, want_n);
    for (int i = 0; i < want_n; i++)
        assert_int_equal(draft[i], want[i]);
    for (int i = want_n; i < 40; i++)
        assert_int_equal(draft[i], -7); /* nothing written past the draft */
}

static void test_ngram_proposer(void **state)
{
    (void)state;
    /* the tokens that followed the last 3-gram's earlier occurrence */
    expect_draft((int32_t[]){1, 2, 3, 4, 9, 1, 2, 3}, 8, 3, 3, (int32_t[]){4, 9, 1}, 3);
    /* k caps the draft */
    expect_draft((int32_t[]){1, 2, 3, 4, 9, 1, 2, 3}, 8, 3, 1, (int32_t[]){4}, 1);
    /* the most recent earlier occurrence */
    expect_draft((int32_t[]){1, 2, 3, 7, 1, 2, 3, 8, 5, 1, 2, 3}, 12, 3, 3, (int32_t[]){8, 5, 1},
                 3);
    /* a longer n-gram before a more recent shorter one: "5 6 7" is at 0,
     * "6 7" also at 5 */
    expect_draft((int32_t[]){5, 6, 7, 40, 9, 6, 7, 41, 5, 6, 7}, 11, 3, 2, (int32_t[]){40, 9}, 2);
    /* ... unless the n-gram is limited to 2 */
    expect_draft((int32_t[]){5, 6, 7, 40, 9, 6, 7, 41, 5, 6, 7}, 11, 2, 2, (int32_t[]){41, 5}, 2);
    /* down to a 1-gram */
    expect_draft((int32_t[]){4, 8, 2, 9, 4}, 5, 3, 3, (int32_t[]){8, 2, 9}, 3);
    /* a repeating pattern goes on past the end, through the draft itself */
    expect_draft((int32_t[]){1, 2, 1, 2, 1}, 5, 3, 5, (int32_t[]){2, 1, 2, 1, 2}, 5);
    expect_draft((int32_t[]){3, 7, 7, 7}, 4, 3, 4, (int32_t[]){7, 7, 7, 7}, 4);
    expect_draft((int32_t[]){5, 1, 2, 3, 1, 2, 3}, 7, 3, 7, (int32_t[]){1, 2, 3, 1, 2, 3, 1}, 7);
    /* nothing to find: no repeat, one token, k 0 */
    expect_draft((int32_t[]){1, 2, 3, 4}, 4, 3, 4, NULL, 0);
    expect_draft((int32_t[]){1}, 1, 3, 4, NULL, 0);
    expect_draft((int32_t[]){1, 1}, 2, 3, 0, NULL, 0);
    expect_draft((int32_t[]){1, 1}, 2, 3, 2, (int32_t[]){1, 1}, 2);

    /* random sequences over a small alphabet against a reference built
     * differently: the sequence extended by the draft, searched by memcmp */
    uint64_t st = seed ^ 0x9a9a;
    int hits = 0;
    for (int trial = 0; trial < 2000; trial++) {
        int32_t toks[48], draft[16], ext[64];
        int n = 1 + (int)(wl_rand_next(&st) % 40), ng = 1 + (int)(wl_rand_next(&st) % 4);
        int k = (int)(wl_rand_next(&st) % 9), alpha = 2 + (int)(wl_rand_next(&st) % 6);
        for (int i = 0; i < n; i++)
            toks[i] = (int32_t)(wl_rand_next(&st) % (uint64_t)alpha);
        int got = wl_ngram_propose(toks, n, ng, k, draft);
        int want = 0, from = -1;
        for (int len = ng; len >= 1 && from < 0; len--) {
            if (len >= n)
                continue;
            for (int at = n - len - 1; at >= 0; at--)
                if (!memcmp(toks + at, toks + n - len, (size_t)len * sizeof *toks)) {
                    from = at + len;
                    break;
                }
        }
        memcpy(ext, toks, (size_t)n * sizeof *ext);
        if (from >= 0 && k > 0) {
            want = k;
            for (int i = 0; i < k; i++)
                ext[n + i] = ext[from + i];
        }
        if (got != want || memcmp(draft, ext + n, (size_t)want * sizeof *draft))
            fail_msg("trial %d: n %d ngram %d k %d: %d drafted, want %d", trial, n, ng, k, got,
                     want);
        hits += got > 0;
    }
    printf("  2000 random sequences match the reference (%d drafted)\n", hits);
    assert_true(hits > 500);
}

/* ---- the acceptance rule ------------------------------------------------- */

/* The sampler's distribution worked out here in float64: softmax of
 * logits / T over the top k, then the fewest reaching top_p. */
static void reference_p(const float *logits, int n, double T, int top_k, double top_p, double *p)
{
    int order[16];
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = 0; i < n; i++) /* by logit, descending (distinct in these tests) */
        for (int j = i + 1; j < n; j++)
            if (logits[order[j]] > logits[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    int keep = top_k > 0 && top_k < n ? top_k : n;
    double z = 0, w[16];
    for (int i = 0; i < keep; i++)
        z += w[i] = exp((logits[order[i]] - logits[order[0]]) / T);
    if (top_p > 0 && top_p < 1) {
        double acc = 0;
        for (int i = 0; i < keep; i++)
            if ((acc += w[i] / z) >= top_p) {
                keep = i + 1;
                break;
            }
        z = 0;
        for (int i = 0; i < keep; i++)
            z += w[i];
    }
    for (int i = 0; i < n; i++)
        p[i] = 0;
    for (int i = 0; i < keep; i++)
        p[order[i]] = w[i] / z;
}

static void test_draft_acceptance_distribution(void **state)
{
    (void)state;
    enum { N = 6, TRIALS = 200000 };
    const float logits[N] = {2.0f, 1.0f, 0.5f, 3.0f, -1.0f, 0.25f};
    struct {
        float T;
        int top_k;
        float top_p;
    } modes[3] = {{1.0f, 0, 1.0f}, {0.7f, 4, 1.0f}, {1.3f, 0, 0.8f}};
    wl_dist d;
    assert_int_equal(wl_dist_alloc(&d, N), 0);
    for (int mi = 0; mi < 3; mi++) {
        wl_sampler sm = {.temperature = modes[mi].T,
                         .top_k = modes[mi].top_k,
                         .top_p = modes[mi].top_p,
                         .state = seed + (uint64_t)mi};
        double p[N];
        reference_p(logits, N, modes[mi].T, modes[mi].top_k, modes[mi].top_p, p);
        /* the factored distribution is this one */
        assert_int_equal(wl_sampler_dist(&sm, logits, N, &d), 0);
        double dsum = 0;
        for (int i = 0; i < d.n; i++) {
            /* the sampler divides by T in fp32 */
            assert_true(fabs(d.w[i] / d.sum - p[d.id[i]]) < 1e-6);
            dsum += p[d.id[i]];
        }
        assert_true(fabs(dsum - 1) < 1e-6); /* every token of p's support is listed */
        /* drafts: the likeliest token, a middling one, one p leaves out
         * (top-k and top-p drop token 4) or the least likely */
        int drafts[3] = {3, 1, 4};
        for (int di = 0; di < 3; di++) {
            int x = drafts[di], count[N] = {0}, accepted_n = 0;
            for (int t = 0; t < TRIALS; t++) {
                int acc = -1, id = wl_sample_draft(&sm, logits, N, x, NULL, &acc);
                assert_true(id >= 0 && id < N);
                assert_true(acc == 0 || acc == 1);
                assert_true(acc ? id == x : id != x); /* a rejected draft is never drawn */
                count[id]++;
                accepted_n += acc;
            }
            printf("  T %.1f top-k %d top-p %.1f, draft %d (p %.4f): accepted %.4f\n", modes[mi].T,
                   modes[mi].top_k, modes[mi].top_p, x, p[x], (double)accepted_n / TRIALS);
            double sa = sqrt(TRIALS * p[x] * (1 - p[x]));
            assert_true(fabs(accepted_n - TRIALS * p[x]) <= 5 * sa + 1);
            for (int i = 0; i < N; i++) {
                double want = TRIALS * p[i], sigma = sqrt(TRIALS * p[i] * (1 - p[i]));
                printf("    token %d: emitted %6d, expected %8.1f (%+.2f sigma)\n", i, count[i],
                       want, sigma > 0 ? (count[i] - want) / sigma : 0.0);
                if (p[i] == 0)
                    assert_int_equal(count[i], 0);
                else
                    assert_true(fabs(count[i] - want) <= 5 * sigma + 1);
            }
        }
    }
    wl_dist_free(&d);
    /* greedy: accepted exactly when the draft is the argmax, which is
     * returned either way; no draw is taken */
    wl_sampler g = {.state = 5};
    int acc;
    assert_int_equal(wl_sample_draft(&g, logits, N, 3, NULL, &acc), 3);
    assert_int_equal(acc, 1);
    assert_int_equal(wl_sample_draft(&g, logits, N, 0, NULL, &acc), 3);
    assert_int_equal(acc, 0);
    assert_int_equal(g.state, 5);
    /* a draft p holds all of (top-k 1) is always accepted, and one out of
     * top-k 1 always replaced by the top token */
    wl_sampler k1 = {.temperature = 1, .top_k = 1, .state = seed};
    for (int t = 0; t < 1000; t++) {
        assert_int_equal(wl_sample_draft(&k1, logits, N, 3, NULL, &acc), 3);
        assert_int_equal(acc, 1);
        assert_int_equal(wl_sample_draft(&k1, logits, N, 2, NULL, &acc), 3);
        assert_int_equal(acc, 0);
    }
}

/* A draft model's token: x drawn from the draft's q, then accepted with
 * probability min(1, p(x) / q(x)) or replaced from max(0, p - q). The
 * emitted token must be distributed as p, and the draft accepted with
 * probability sum_x min(p(x), q(x)); q may leave out tokens p keeps and
 * keep some p leaves out, and may cover fewer tokens than the target's
 * vocabulary (a draft model with a smaller embedding). */
static void test_draft_model_acceptance_distribution(void **state)
{
    (void)state;
    enum { N = 6, TRIALS = 200000 };
    const float logits[N] = {2.0f, 1.0f, 0.5f, 3.0f, -1.0f, 0.25f};
    const float draft_logits[N] = {1.0f, 2.5f, 0.5f, 2.0f, 1.5f, -2.0f};
    struct {
        float T;
        int top_k;
        float top_p;
        int q_vocab;
    } modes[4] = {{1.0f, 0, 1.0f, N}, {0.7f, 3, 1.0f, N}, {1.3f, 0, 0.8f, N}, {1.0f, 0, 1.0f, 5}};
    for (int mi = 0; mi < 4; mi++) {
        wl_sampler sm = {.temperature = modes[mi].T,
                         .top_k = modes[mi].top_k,
                         .top_p = modes[mi].top_p,
                         .state = seed + 100 + (uint64_t)mi};
        wl_sampler proposer = {.state = seed ^ 0x5bd1e995u};
        int qv = modes[mi].q_vocab;
        double p[N], q[N] = {0}, overlap = 0;
        reference_p(logits, N, modes[mi].T, modes[mi].top_k, modes[mi].top_p, p);
        reference_p(draft_logits, qv, modes[mi].T, modes[mi].top_k, modes[mi].top_p, q);
        for (int i = 0; i < N; i++)
            overlap += fmin(p[i], q[i]);
        /* the draft's distribution as the proposer keeps it: its nucleus
         * alone, copied out of one with room for the vocabulary */
        wl_dist full = {0}, dq = {0};
        assert_int_equal(wl_dist_alloc(&full, qv), 0);
        assert_int_equal(wl_sampler_dist(&sm, draft_logits, qv, &full), 0);
        assert_int_equal(wl_dist_copy(&dq, &full), 0);
        wl_dist_free(&full);
        int count[N] = {0}, drafted[N] = {0}, accepted_n = 0;
        for (int t = 0; t < TRIALS; t++) {
            int x = wl_dist_draw(&proposer, &dq); /* as the proposer draws */
            assert_true(x >= 0 && x < qv && q[x] > 0);
            drafted[x]++;
            int acc = -1, id = wl_sample_draft(&sm, logits, N, x, &dq, &acc);
            assert_true(id >= 0 && id < N);
            assert_true(acc ? id == x : 1);
            count[id]++;
            accepted_n += acc == 1;
        }
        printf("  T %.1f top-k %d top-p %.1f, draft vocabulary %d: accepted %.4f (expected "
               "%.4f)\n",
               modes[mi].T, modes[mi].top_k, modes[mi].top_p, qv, (double)accepted_n / TRIALS,
               overlap);
        wl_dist_free(&dq);
        double sa = sqrt(TRIALS * overlap * (1 - overlap));
        assert_true(fabs(accepted_n - TRIALS * overlap) <= 5 * sa + 1);
        for (int i = 0; i < qv; i++) { /* the drafts follow q */
            double want = TRIALS * q[i], sigma = sqrt(TRIALS * q[i] * (1 - q[i]));
            assert_true(fabs(drafted[i] - want) <= 5 * sigma + 1);
        }
        for (int i = 0; i < N; i++) {
            double want = TRIALS * p[i], sigma = sqrt(TRIALS * p[i] * (1 - p[i]));
            printf("    token %d: p %.4f q %.4f, emitted %6d, expected %8.1f (%+.2f sigma)\n", i,
                   p[i], q[i], count[i], want, sigma > 0 ? (count[i] - want) / sigma : 0.0);
            if (p[i] == 0)
                assert_int_equal(count[i], 0);
            else
                assert_true(fabs(count[i] - want) <= 5 * sigma + 1);
        }
    }
    /* greedy ignores q: the target's argmax, accepted when it is the draft */
    wl_sampler g = {.state = 5};
    wl_dist q = {0};
    assert_int_equal(wl_dist_alloc(&q, N), 0);
    assert_int_equal(wl_sampler_dist(&(wl_sampler){.temperature = 1}, draft_logits, N, &q), 0);
    int acc;
    assert_int_equal(wl_sample_draft(&g, logits, N, 1, &q, &acc), 3);
    assert_int_equal(acc, 0);
    assert_int_equal(wl_sample_draft(&g, logits, N, 3, &q, &acc), 3);
    assert_int_equal(acc, 1);
    wl_dist_free(&q);
}

/* A round's acceptance over rows whose argmaxes are set: greedy takes the
 * draft while it is each row's argmax, then that row's argmax. */
static void test_round_acceptance(void **state)
{
    (void)state;
    enum { R = 5, W = 8 };
    float rows[R * W];
    const int argmaxes[R] = {6, 2, 5, 1, 7};
    for (int r = 0; r < R; r++)
        for (int i = 0; i < W; i++)
            rows[r * W + i] = i == argmaxes[r] ? 1.0f : -(float)i * 0.1f;
    wl_sampler g = {0};
    int32_t out[R];
    /* all four accepted: the fifth row's argmax is the bonus */
    assert_int_equal(wl_spec_accept(&g, rows, W, (int32_t[]){6, 2, 5, 1}, 4, NULL, out), 5);
    assert_memory_equal(out, ((int32_t[]){6, 2, 5, 1, 7}), sizeof out);
    /* the third is wrong: two accepted, then the correction */
    assert_int_equal(wl_spec_accept(&g, rows, W, (int32_t[]){6, 2, 4, 1}, 4, NULL, out), 3);
    assert_memory_equal(out, ((int32_t[]){6, 2, 5}), 3 * sizeof *out);
    /* the first is wrong */
    assert_int_equal(wl_spec_accept(&g, rows, W, (int32_t[]){0, 2}, 2, NULL, out), 1);
    assert_int_equal(out[0], 6);
    /* no draft: a plain step */
    assert_int_equal(wl_spec_accept(&g, rows, W, NULL, 0, NULL, out), 1);
    assert_int_equal(out[0], 6);
}

/* ---- the verify pass ------------------------------------------------------- */

typedef struct rows_job {
    wl_model *m;
    const int32_t *ids;
    int failed;
    char message[1024];
    double worst, scale, stale_diff, fresh_worst;
} rows_job;

enum { RP = 13, RN = 6 }; /* prompt; tokens a verify pass (13..18 crosses a page) */

static double max_diff(const float *a, const float *b, int n, double *scale)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        if (scale)
            *scale = fmax(*scale, fabs((double)a[i]));
    }
    return worst;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(j->message, sizeof j->message, __VA_ARGS__);                                  \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static void *rows_task(void *arg)
{
    rows_job *j = arg;
    wl_kv kv = {0};
    wl_seq *a = NULL, *b = NULL;
    const float *lg, *rows;
    float *steps = malloc(sizeof(float) * RN * V), *first = malloc(sizeof(float) * RN * V);
    float *stale_a = malloc(sizeof(float) * V), *stale_b = malloc(sizeof(float) * V);
    const int32_t *ids = j->ids;
    j->failed = 1;
    CHECK(!wl_model_upload(j->m) && !wl_kv_create(&kv, j->m, 8, 16), "setup: %s", wl_error());
    CHECK(!wl_seq_create(&a, j->m, &kv, 48, RP) && !wl_seq_create(&b, j->m, &kv, 48, RP), "%s",
          wl_error());
    /* a: one token a call (the plain path); b: the RN tokens in one call */
    CHECK(!wl_forward(a, ids, RP, &lg) && !wl_forward(b, ids, RP, &lg), "prefill: %s", wl_error());
    for (int t = 0; t < RN; t++) {
        CHECK(!wl_forward(a, ids + RP + t, 1, &lg), "step %d: %s", t, wl_error());
        memcpy(steps + (size_t)t * V, lg, sizeof(float) * V);
    }
    CHECK(!wl_forward_rows(b, ids + RP, RN, &rows), "rows: %s", wl_error());
    memcpy(first, rows, sizeof(float) * RN * V);
    j->worst = max_diff(steps, first, RN * V, &j->scale);
    /* rewound and run again, over poisoned rows: the same rows bit for bit,
     * every one written */
    CHECK(!wl_seq_rewind(b, RP), "rewind: %s", wl_error());
    for (int i = 0; i < RN * V; i++)
        ((float *)rows)[i] = NAN;
    CHECK(!wl_forward_rows(b, ids + RP, RN, &rows), "rows again: %s", wl_error());
    CHECK(!memcmp(rows, first, sizeof(float) * RN * V), "a rerun after a rewind differs");

    /* stale keys: b keeps 2 of the 6 (13, 14), then runs token 15 with
     * 16..18 left over in the next page; a runs 2 of another 6 the same
     * way. Were any key past the length read, the two would differ. */
    CHECK(!wl_seq_rewind(b, RP + 2), "%s", wl_error());
    CHECK(!wl_forward_rows(b, ids + RP + RN, 1, &rows), "%s", wl_error());
    memcpy(stale_b, rows, sizeof(float) * V);
    int32_t other[RN];
    memcpy(other, ids + RP, sizeof other);
    for (int i = 2; i < RN; i++)
        other[i] = (other[i] + 101 + 37 * i) % V;
    CHECK(!wl_seq_rewind(a, RP), "%s", wl_error());
    CHECK(!wl_forward_rows(a, other, RN, &rows) && !wl_seq_rewind(a, RP + 2), "%s", wl_error());
    CHECK(!wl_forward_rows(a, ids + RP + RN, 1, &rows), "%s", wl_error());
    memcpy(stale_a, rows, sizeof(float) * V);
    j->stale_diff = max_diff(stale_a, stale_b, V, NULL);
    CHECK(!memcmp(stale_a, stale_b, sizeof(float) * V),
          "the keys past a rewound length were read: the logits differ by %.3e", j->stale_diff);
    /* and against a sequence that never held them (other shapes: within
     * rounding) */
    CHECK(!wl_seq_rewind(a, RP) && !wl_forward_rows(a, ids + RP, 2, &rows) &&
              !wl_forward(a, ids + RP + RN, 1, &lg),
          "%s", wl_error());
    j->fresh_worst = max_diff(lg, stale_a, V, NULL);

    /* errors, each before anything runs */
    int pos_before = RP + 3;
    CHECK(wl_forward_rows(a, ids, RP + 1, &rows) == -1 && strstr(wl_error(), "its step's 13"),
          "a pass past max_step: %s", wl_error());
    CHECK(wl_forward_rows(a, ids, 0, &rows) == -1, "0 tokens");
    CHECK(wl_seq_rewind(a, pos_before + 1) == -1 && strstr(wl_error(), "outside the sequence's 0 "
                                                                       "to 16"),
          "rewind past the length: %s", wl_error());
    CHECK(wl_seq_rewind(a, -1) == -1, "rewind to -1");
    /* to 0: the prompt again gives its logits again, bit for bit */
    CHECK(!wl_seq_rewind(a, 0) && !wl_forward(a, ids, RP, &lg), "%s", wl_error());
    CHECK(!wl_forward(a, ids + RP, 1, &lg) && !memcmp(lg, steps, sizeof(float) * V),
          "after a rewind to 0 the sequence's logits differ");
    j->failed = 0;
out:
    wl_seq_destroy(a);
    wl_seq_destroy(b);
    if (!j->failed && wl_kv_free_pages(&kv) != 8) {
        snprintf(j->message, sizeof j->message, "pages kept: %d of 8 free", wl_kv_free_pages(&kv));
        j->failed = 1;
    }
    wl_kv_destroy(&kv);
    wl_model_release(j->m);
    free(steps);
    free(first);
    free(stale_a);
    free(stale_b);
    return NULL;
}

static void test_verify_pass_and_rewind(void **state)
{
    (void)state;
    int32_t ids[RP + RN + 1];
    uint64_t st = seed ^ 0x7e7e;
    for (int i = 0; i < RP + RN + 1; i++)
        ids[i] = (int32_t)(wl_rand_next(&st) % V);
    wl_model m;
    assert_int_equal(wl_model_open(&m, model_dir), 0);
    rows_job j = {.m = &m, .ids = ids};
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.stack_size = 1 << 20;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, rows_task, &j, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    wl_model_close(&m);
    if (j.failed)
        fail_msg("%s", j.message);
    printf("  %d rows in one pass against one token a call: max |logit| %.4f, max difference "
           "%.3e; a rewound length's stale keys: %.3e; against never holding them: %.3e\n",
           RN, j.scale, j.worst, j.stale_diff, j.fresh_worst);
    assert_true(j.scale > 0.01);
    /* the same ops a row, the matmul over 6 rows against one (one bf16
     * unit, as the batch's test allows) */
    assert_true(j.worst <= j.scale / 128);
    assert_true(j.fresh_worst <= j.scale / 128);
}

/* ---- generations through the engine -------------------------------------- */

enum { MAXT = GR_MAX_TOKENS };

static void generate(weft_runtime *rt, gen_run *r)
{
    if (run_generation(rt, r))
        fail_msg("generate (speculate %d): %s", r->speculate, r->message);
}

/* base's generation plainly, then with 4 draft tokens a round (from
 * base's proposer). */
static void run_pair(weft_runtime *rt, const gen_run *base, gen_run *plain, gen_run *spec)
{
    float *lp = plain->logits, *ls = spec->logits;
    *plain = *base;
    plain->logits = lp;
    plain->use_draft = 0;
    generate(rt, plain);
    *spec = *base;
    spec->logits = ls;
    spec->speculate = 4;
    generate(rt, spec);
}

/* A generation's record with room for its logits, and its end. */
static gen_run *new_run(void)
{
    gen_run *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->logits = malloc(sizeof(float) * MAXT * V);
    assert_non_null(r->logits);
    return r;
}

static void free_run(gen_run *r)
{
    free(r->logits);
    free(r);
}

static void top_two(const float *l, int *a, int *b)
{
    logits_top_two(l, V, a, b);
}

/* spec against plain: the same tokens, eos flags and end; each handed
 * logits row within a bf16 unit of plain's (another row count in the
 * matmuls), every token its row's argmax. The two may part where plain's
 * top two logits are within two bf16 units (a row computed among k + 1
 * rounds apart from one computed alone), and are compared up to there; a
 * divergence anywhere else fails, reported with both paths' top two. */
static double compare_runs(const char *what, const gen_run *plain, const gen_run *spec)
{
    double worst = 0, scale = 0;
    int n = plain->n < spec->n ? plain->n : spec->n, parted = 0;
    for (int i = 0; i < n; i++) {
        const float *lp = plain->logits + (size_t)i * V, *ls = spec->logits + (size_t)i * V;
        worst = fmax(worst, max_diff(lp, ls, V, &scale));
        if (plain->ids[i] != spec->ids[i]) {
            int pa, pb, sa, sb;
            top_two(lp, &pa, &pb);
            top_two(ls, &sa, &sb);
            int tie = (double)lp[pa] - lp[pb] < scale / 64;
            printf("  %s: token %d differs: plain %d (top %d %.6f, next %d %.6f, gap %.2e), "
                   "speculative %d (top %d %.6f, next %d %.6f, gap %.2e); a bf16 unit at "
                   "this scale is %.2e: %s\n",
                   what, i, plain->ids[i], pa, lp[pa], pb, lp[pb], (double)lp[pa] - lp[pb],
                   spec->ids[i], sa, ls[sa], sb, ls[sb], (double)ls[sa] - ls[sb], scale / 128,
                   tie ? "a near tie" : "NOT a near tie");
            if (!tie)
                fail_msg("%s: the runs part at token %d, not at a near tie", what, i);
            parted = 1;
            break;
        }
        int a, b;
        top_two(ls, &a, &b);
        assert_int_equal(spec->ids[i], a);
        assert_int_equal(spec->eos[i], plain->eos[i]);
    }
    if (!parted) {
        assert_int_equal(spec->n, plain->n);
        assert_int_equal(spec->finish, plain->finish);
    }
    /* the counts: every token after the first came from a round */
    const wl_spec_stats *st = &spec->st;
    assert_int_equal(st->tokens, spec->n - 1);
    assert_true(st->rounds <= st->tokens && st->accepted <= st->proposed);
    assert_true(st->accepted + st->rounds >= st->tokens);
    printf("  %s: %d tokens, %ld rounds, %ld drafted, %ld accepted; logits within %.2e of "
           "plain's (scale %.3f)\n",
           what, spec->n, st->rounds, st->proposed, st->accepted, worst, scale);
    assert_true(worst <= scale / 128);
    return worst;
}

static void test_greedy_matches_plain(void **state)
{
    (void)state;
    enum { PHRASE = 7, REPEATS = 6, NP = PHRASE * REPEATS };
    int32_t rep[NP], plain_ids[NP];
    uint64_t st = seed ^ 0x5bec;
    for (int i = 0; i < PHRASE; i++)
        rep[i] = 256 + (int32_t)(wl_rand_next(&st) % (V - 256));
    for (int i = PHRASE; i < NP; i++)
        rep[i] = rep[i - PHRASE];
    for (int i = 0; i < NP; i++) /* distinct ids: nothing for the proposer to find */
        plain_ids[i] = (int32_t)((i * 37 + (int)(seed % 97)) % V);
    wl_model m;
    assert_int_equal(wl_model_open(&m, model_dir), 0);
    m.cfg.n_eos = 0; /* set per case below */
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.stack_size = 1 << 20;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    wl_engine e;
    if (wl_engine_start(&e, rt, &m, 8, 1, 128))
        fail_msg("engine: %s", wl_error());
    gen_run *plain = new_run(), *spec = new_run();
    const int lengths[] = {1, 2, 3, 5, 8, 13, 50};
    long accepted_repetitive = 0;
    for (int p = 0; p < 2; p++) {
        const int32_t *prompt = p ? plain_ids : rep;
        const char *name = p ? "non-repetitive" : "repetitive";
        for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
            gen_run base = {.e = &e, .prompt = prompt, .n_prompt = NP, .max_tokens = lengths[li]};
            char what[128];
            snprintf(what, sizeof what, "%s, max_tokens %d", name, lengths[li]);
            run_pair(rt, &base, plain, spec);
            compare_runs(what, plain, spec);
            assert_int_equal(spec->finish, WL_FINISH_LENGTH);
            assert_int_equal(spec->n, lengths[li]);
            if (!p && lengths[li] == 50)
                accepted_repetitive = spec->st.accepted;
        }
        /* an end-of-sequence token: the 12th token of the 50 above made
         * the model's eos; both stop at its first occurrence */
        int32_t eos = plain->ids[11];
        m.cfg.eos_ids[0] = eos;
        m.cfg.n_eos = 1;
        gen_run base = {.e = &e, .prompt = prompt, .n_prompt = NP, .max_tokens = 50};
        char what[128];
        snprintf(what, sizeof what, "%s, eos %d", name, eos);
        run_pair(rt, &base, plain, spec);
        compare_runs(what, plain, spec);
        assert_int_equal(spec->finish, WL_FINISH_STOP);
        assert_true(spec->n <= 12 && spec->ids[spec->n - 1] == eos && spec->eos[spec->n - 1]);
        m.cfg.n_eos = 0;
        /* on_token's stop after 6 to 16 tokens: where a round had
         * accepted more than it could hand on (accepted + rounds > tokens),
         * the stop came mid-round */
        int mid_round = 0;
        for (int stop = 6; stop <= 16; stop++) {
            base.stop_after = stop;
            snprintf(what, sizeof what, "%s, stopped after %d", name, stop);
            run_pair(rt, &base, plain, spec);
            compare_runs(what, plain, spec);
            assert_int_equal(spec->n, stop);
            assert_int_equal(spec->finish, WL_FINISH_STOP);
            mid_round += spec->st.accepted + spec->st.rounds > spec->st.tokens;
        }
        printf("  %s: %d of 11 stops came mid-round\n", name, mid_round);
        if (!p)
            assert_true(mid_round > 0);
    }
    /* the proposer found the model's repeats, and the model took some */
    printf("  repetitive prompt, 50 tokens: %ld draft tokens accepted\n", accepted_repetitive);
    assert_true(accepted_repetitive > 0);
    /* out-of-range requests are refused before admission */
    gen_run bad = {.e = &e, .prompt = rep, .n_prompt = NP, .max_tokens = 4, .logits = spec->logits};
    bad.speculate = WL_SPEC_MAX_K + 1;
    assert_int_equal(run_generation(rt, &bad), -1);
    printf("  speculate %d: %s\n", bad.speculate, bad.message);
    assert_non_null(strstr(bad.message, "draft tokens a round"));
    wl_engine_counts counts;
    wl_engine_stats(&e, &counts);
    assert_int_equal(counts.used_pages, 0); /* every page back */
    assert_int_equal(counts.reserved_pages, 0);
    assert_int_equal(wl_engine_stop(&e), 0);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    wl_model_close(&m);
    free_run(plain);
    free_run(spec);
}

/* ---- a draft model -------------------------------------------------------------- */

/* An engine whose draft model is opened from dir (its own wl_model). */
typedef struct drafted {
    wl_model target, draft;
    weft_runtime *rt;
    wl_engine e;
} drafted;

static void drafted_start(drafted *d, const char *draft_dir, double theta_times)
{
    assert_int_equal(wl_model_open(&d->target, model_dir), 0);
    assert_int_equal(wl_model_open(&d->draft, draft_dir), 0);
    d->draft.cfg.rope_theta *= theta_times;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.stack_size = 1 << 20;
    assert_int_equal(weft_runtime_create(&d->rt, &cfg), WEFT_OK);
    if (wl_engine_start(&d->e, d->rt, &d->target, 8, 1, 128) ||
        wl_engine_set_draft(&d->e, &d->draft))
        fail_msg("engine: %s", wl_error());
}

/* Every page of both caches back, then the engine's end. */
static void drafted_stop(drafted *d)
{
    wl_engine_counts counts;
    wl_engine_stats(&d->e, &counts);
    assert_int_equal(counts.used_pages, 0);
    assert_int_equal(counts.reserved_pages, 0);
    assert_int_equal(wl_kv_free_pages(&d->e.draft_kv), d->e.draft_kv.pages);
    assert_int_equal(wl_engine_stop(&d->e), 0);
    assert_int_equal(weft_runtime_destroy(d->rt), WEFT_OK);
    wl_model_close(&d->target);
    wl_model_close(&d->draft);
}

/* A prompt of distinct ids: nothing an n-gram would find. */
static void distinct_prompt(int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 37 + (int)(seed % 97)) % V);
}

/* The target drafting for itself (its files opened a second time): greedy
 * output is plain decoding's, and the draft, decoding one token a call
 * where the verify pass runs k + 1 rows, agrees with the target nearly
 * always: an acceptance rate below 80% would mean its cache went out of
 * step with the text (a catch-up or a rewind wrong). Ends at max_tokens,
 * at on_token's stop (mid-round too) and at a page boundary. Sampled, a
 * seed gives one text, the draft is mostly accepted, and draws differ
 * from a different seed's. */
static void test_draft_model_drafting_for_itself(void **state)
{
    (void)state;
    enum { NP = 29 };
    int32_t prompt[NP];
    distinct_prompt(prompt, NP);
    drafted d;
    drafted_start(&d, model_dir, 1);
    gen_run *plain = new_run(), *spec = new_run();
    long proposed = 0, accepted = 0;
    const int lengths[] = {1, 2, 3, 4, 5, 6, 19, 50};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        gen_run base = {.e = &d.e,
                        .prompt = prompt,
                        .n_prompt = NP,
                        .max_tokens = lengths[li],
                        .use_draft = 1,
                        .ignore_eos = 1};
        char what[128];
        snprintf(what, sizeof what, "self-draft, max_tokens %d", lengths[li]);
        run_pair(d.rt, &base, plain, spec);
        compare_runs(what, plain, spec);
        assert_int_equal(spec->n, lengths[li]);
        proposed += spec->st.proposed;
        accepted += spec->st.accepted;
    }
    for (int stop = 6; stop <= 11; stop++) {
        gen_run base = {.e = &d.e,
                        .prompt = prompt,
                        .n_prompt = NP,
                        .max_tokens = 40,
                        .use_draft = 1,
                        .stop_after = stop,
                        .ignore_eos = 1};
        char what[128];
        snprintf(what, sizeof what, "self-draft, stopped after %d", stop);
        run_pair(d.rt, &base, plain, spec);
        compare_runs(what, plain, spec);
        assert_int_equal(spec->n, stop);
        assert_int_equal(spec->finish, WL_FINISH_STOP);
    }
    printf("  self-draft, greedy: %ld of %ld draft tokens accepted\n", accepted, proposed);
    assert_true(proposed > 40);
    assert_true(accepted >= proposed * 8 / 10);
    /* sampled */
    gen_run base = {.e = &d.e,
                    .prompt = prompt,
                    .n_prompt = NP,
                    .max_tokens = 60,
                    .use_draft = 1,
                    .speculate = 4,
                    .ignore_eos = 1,
                    .sampler = {.temperature = 0.8f, .top_p = 0.95f, .state = seed}};
    gen_run *once = calloc(1, sizeof *once), *again = calloc(1, sizeof *again),
            *other = calloc(1, sizeof *other);
    *once = base;
    *again = base;
    *other = base;
    other->sampler.state = seed + 1;
    generate(d.rt, once);
    generate(d.rt, again);
    generate(d.rt, other);
    assert_int_equal(once->n, 60);
    assert_int_equal(again->n, 60);
    assert_memory_equal(once->ids, again->ids, 60 * sizeof *once->ids);
    printf("  self-draft, sampled at T 0.8, top-p 0.95: %ld of %ld accepted; seed + 1 %s\n",
           once->st.accepted, once->st.proposed,
           memcmp(once->ids, other->ids, 60 * sizeof *once->ids) ? "differs" : "is the same");
    assert_true(once->st.accepted >= once->st.proposed / 2);
    assert_true(memcmp(once->ids, other->ids, 60 * sizeof *once->ids) != 0);
    drafted_stop(&d);
    free_run(plain);
    free_run(spec);
    free(once);
    free(again);
    free(other);
}

/* Another model drafting (another seed's weights, the same tokenizer):
 * its tokens are mostly rejected, and the output is still plain greedy
 * decoding's, token for token. */
static void test_draft_model_of_other_weights(void **state)
{
    (void)state;
    enum { NP = 23 };
    int32_t prompt[NP];
    distinct_prompt(prompt, NP);
    char *other_dir = path_in(dir, "tiny-other");
    wl_write_opts o = {.preset = "tiny", .seed = seed + 1};
    if (wl_write_random_model(other_dir, &o))
        fail_msg("%s", wl_error());
    drafted d;
    drafted_start(&d, other_dir, 1);
    gen_run *plain = new_run(), *spec = new_run();
    gen_run base = {.e = &d.e,
                    .prompt = prompt,
                    .n_prompt = NP,
                    .max_tokens = 50,
                    .use_draft = 1,
                    .ignore_eos = 1};
    run_pair(d.rt, &base, plain, spec);
    compare_runs("another model's draft", plain, spec);
    assert_int_equal(spec->n, 50);
    drafted_stop(&d);
    free_run(plain);
    free_run(spec);
    free(other_dir);
}

/* A near twin drafting: the target's weights with RoPE's theta changed,
 * mostly accepted (about 90%) and sometimes rejected, so rounds end both
 * ways, the draft's cache rewound past rejected tokens or catching up on
 * the correction and the bonus; greedy output is plain decoding's. */
static void test_draft_model_near_twin(void **state)
{
    (void)state;
    enum { NP = 23 };
    int32_t prompt[NP];
    drafted d;
    drafted_start(&d, model_dir, 0.05);
    gen_run *plain = new_run(), *spec = new_run();
    long proposed = 0, accepted = 0;
    for (int p = 0; p < 6; p++) {
        uint64_t st = seed + 77 * p;
        for (int i = 0; i < NP; i++)
            prompt[i] = (int32_t)(wl_rand_next(&st) % V);
        gen_run base = {.e = &d.e,
                        .prompt = prompt,
                        .n_prompt = NP,
                        .max_tokens = 60,
                        .use_draft = 1,
                        .ignore_eos = 1};
        run_pair(d.rt, &base, plain, spec);
        compare_runs("near twin", plain, spec);
        proposed += spec->st.proposed;
        accepted += spec->st.accepted;
    }
    printf("  near twin: %ld of %ld accepted\n", accepted, proposed);
    assert_true(accepted >= proposed / 2);
    drafted_stop(&d);
    free_run(plain);
    free_run(spec);
}

/* A generation that asks for a draft the engine lacks, with n-grams too,
 * or without speculate; a draft whose vocabulary is larger than the
 * target's; a second draft. */
static void test_draft_model_refusals(void **state)
{
    (void)state;
    int32_t prompt[5] = {300, 301, 302, 303, 304};
    wl_model m, big;
    assert_int_equal(wl_model_open(&m, model_dir), 0);
    assert_int_equal(wl_model_open(&big, model_dir), 0);
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 1;
    cfg.backend = WEFT_BACKEND_HOST;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    wl_engine e;
    if (wl_engine_start(&e, rt, &m, 8, 1, 64))
        fail_msg("engine: %s", wl_error());
    struct {
        int speculate, use_draft, ngram;
        const char *says;
    } cases[] = {{4, 1, 0, "no draft model"}, {0, 1, 0, "give speculate_k"}, {4, 1, 2, "not both"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gen_run r = {.e = &e,
                     .prompt = prompt,
                     .n_prompt = 5,
                     .max_tokens = 4,
                     .speculate = cases[i].speculate,
                     .use_draft = cases[i].use_draft,
                     .ngram = cases[i].ngram};
        assert_int_equal(run_generation(rt, &r), -1);
        printf("  speculate %d, draft %d, ngram %d: %s\n", cases[i].speculate, cases[i].use_draft,
               cases[i].ngram, r.message);
        assert_non_null(strstr(r.message, cases[i].says));
    }
    big.cfg.vocab = V + 1;
    assert_int_equal(wl_engine_set_draft(&e, &big), -1);
    printf("  a larger vocabulary: %s\n", wl_error());
    assert_non_null(strstr(wl_error(), "larger than the target's"));
    assert_int_equal(wl_engine_set_draft(&e, &m), -1);
    assert_non_null(strstr(wl_error(), "the target itself"));
    big.cfg.vocab = V;
    assert_int_equal(wl_engine_set_draft(&e, &big), 0);
    assert_int_equal(wl_engine_set_draft(&e, &big), -1);
    assert_non_null(strstr(wl_error(), "already"));
    assert_int_equal(wl_engine_stop(&e), 0);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    wl_model_close(&m);
    wl_model_close(&big);
}

/* ---- the command line ---------------------------------------------------------- */

static char *run_ok(const char *args, char **err)
{
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s %s", WL_BIN, args);
    int rc = run_capture(cmd, &out, err);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", cmd, rc, *err);
    return out;
}

static void expect_usage_error(const char *args, const char *message)
{
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s %s", WL_BIN, args);
    int rc = run_capture(cmd, &out, &err);
    printf("  %s -> %d: %s", args, rc, err);
    assert_int_equal(rc, 2);
    if (!strstr(err, message))
        fail_msg("expected \"%s\" in \"%s\"", message, err);
    free(out);
    free(err);
}

static void test_cli_speculate(void **state)
{
    (void)state;
    const char *prompt = "the old woman sat by the door. the old woman sat by the door. the old "
                         "woman sat by the door.";
    char args[1024], *e1, *e2, *e3, *e4;
    snprintf(args, sizeof args,
             "generate %s --prompt '%s' --max-tokens 40 --print-ids --backend host", model_dir,
             prompt);
    size_t common = strlen(args);
    snprintf(args + common, sizeof args - common, " --print-top");
    char *plain = run_ok(args, &e1);
    snprintf(args + common, sizeof args - common, " --speculate 4 --stats");
    char *spec = run_ok(args, &e2);
    printf("  plain: %s  speculative: %s%s", plain, spec, e2);
    /* the same ids, or the same up to a near tie (printed_gap) */
    long long a[64], b[64], token;
    int n = printed_ids(e1, a, 64), k = 0;
    assert_int_equal(printed_ids(e2, b, 64), n);
    while (k < n && a[k] == b[k])
        k++;
    if (k == n) {
        assert_string_equal(plain, spec);
    } else {
        double gap = printed_gap(e1, k, &token);
        printf("  they part at token %d (%lld, plain %lld), gap %.2g of the top\n", k, b[k], a[k],
               gap);
        assert_int_equal(token, a[k]);
        assert_true(gap < 1.0 / 128);
    }
    assert_non_null(strstr(e2, "speculative: "));
    assert_non_null(strstr(e2, "tokens a round"));
    assert_non_null(strstr(e2, "time: first token"));
    assert_null(strstr(e1, "speculative: ")); /* a plain run has no such counts */
    /* sampled: a seed gives one text, speculative or not */
    snprintf(args, sizeof args,
             "generate %s --prompt '%s' --max-tokens 30 --print-ids --backend host --temperature "
             "0.9 --top-k 40 --seed 3 --speculate 3 --ngram 2",
             model_dir, prompt);
    char *s1 = run_ok(args, &e3), *s2 = run_ok(args, &e4);
    printf("  sampled: %s%s", s1, e3);
    assert_string_equal(s1, s2);
    assert_string_equal(e3, e4);
    snprintf(args, sizeof args, "generate %s --prompt hi --speculate 4 --parallel 2", model_dir);
    expect_usage_error(args, "it takes --parallel 1");
    snprintf(args, sizeof args, "generate %s --prompt hi --ngram 2", model_dir);
    expect_usage_error(args, "--ngram is the proposer's, for --speculate");
    snprintf(args, sizeof args, "generate %s --prompt hi --speculate 0", model_dir);
    expect_usage_error(args, "bad option or value: --speculate 0");
    snprintf(args, sizeof args, "generate %s --prompt hi --speculate 33", model_dir);
    expect_usage_error(args, "bad option or value: --speculate 33");
    snprintf(args, sizeof args, "generate %s --prompt hi --speculate 2 --ngram 17", model_dir);
    expect_usage_error(args, "bad option or value: --ngram 17");
    free(plain);
    free(spec);
    free(s1);
    free(s2);
    free(e1);
    free(e2);
    free(e3);
    free(e4);
}

/* --draft: greedy text and ids equal the plain run's, the draft's counts
 * reported; a seed gives one sampled text; a draft whose tokenizer is not
 * the target's is refused naming the difference (exit 1), --draft without
 * --speculate or with --ngram is bad usage. */
static void test_cli_draft(void **state)
{
    (void)state;
    const char *prompt = "a quiet river ran past the mill, and the miller listened";
    char args[2048], *e1, *e2, *e3, *e4;
    snprintf(args, sizeof args,
             "generate %s --prompt '%s' --max-tokens 40 --print-ids --backend host --ignore-eos",
             model_dir, prompt);
    char *plain = run_ok(args, &e1);
    snprintf(args + strlen(args), sizeof args - strlen(args), " --speculate 3 --draft %s --stats",
             model_dir);
    char *spec = run_ok(args, &e2);
    printf("  plain: %s%s  drafted: %s%s", plain, e1, spec, e2);
    assert_string_equal(plain, spec);
    const char *g1 = strstr(e1, "generated ids: "), *g2 = strstr(e2, "generated ids: ");
    assert_non_null(g1);
    assert_non_null(g2);
    assert_int_equal(strncmp(g1, g2, strcspn(g1, "\n") + 1), 0);
    const char *counts = strstr(e2, "speculative: ");
    assert_non_null(counts);
    long rounds, proposed, accepted;
    assert_int_equal(sscanf(counts, "speculative: %ld rounds, %ld draft tokens, %ld accepted",
                            &rounds, &proposed, &accepted),
                     3);
    assert_true(proposed > 0 && accepted > 0); /* the target's own weights draft for it */
    snprintf(args, sizeof args,
             "generate %s --prompt '%s' --max-tokens 30 --print-ids --backend host --temperature "
             "0.9 --top-p 0.9 --seed 11 --speculate 2 --draft %s",
             model_dir, prompt, model_dir);
    char *s1 = run_ok(args, &e3), *s2 = run_ok(args, &e4);
    printf("  sampled: %s%s", s1, e3);
    assert_string_equal(s1, s2);
    assert_string_equal(e3, e4);
    /* another tokenizer beside the same weights */
    char *other = path_in(dir, "other-tokenizer"), cmd[4096];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && ln -sf %s/config.json %s/model.safetensors %s/ && cp %s/gpt2-"
             "tokenizer.json %s/tokenizer.json",
             other, model_dir, model_dir, other, WL_DATA_DIR, other);
    assert_int_equal(system(cmd), 0);
    char *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt hi --backend host --speculate 2 --draft %s",
             WL_BIN, model_dir, other);
    int rc = run_capture(cmd, &out, &err);
    printf("  another tokenizer -> %d: %s", rc, err);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "is not the target's"));
    assert_non_null(strstr(err, "vocabularies differ"));
    wl_tokenizer *a, *b, *c;
    char *tk_path = path_in(model_dir, "tokenizer.json");
    assert_int_equal(wl_tokenizer_load(&a, tk_path), 0);
    assert_int_equal(wl_tokenizer_load(&b, tk_path), 0);
    assert_int_equal(wl_tokenizer_load(&c, WL_DATA_DIR "/gpt2-tokenizer.json"), 0);
    assert_int_equal(wl_tokenizers_agree(a, b), 0);
    assert_int_equal(wl_tokenizers_agree(a, c), -1);
    wl_tokenizer_free(a);
    wl_tokenizer_free(b);
    wl_tokenizer_free(c);
    snprintf(args, sizeof args, "generate %s --prompt hi --draft %s", model_dir, model_dir);
    expect_usage_error(args, "--draft is the proposer's, for --speculate");
    snprintf(args, sizeof args, "generate %s --prompt hi --speculate 2 --ngram 2 --draft %s",
             model_dir, model_dir);
    expect_usage_error(args, "not both");
    free(tk_path);
    free(out);
    free(err);
    free(other);
    free(plain);
    free(spec);
    free(s1);
    free(s2);
    free(e1);
    free(e2);
    free(e3);
    free(e4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_proposer),
        cmocka_unit_test(test_draft_acceptance_distribution),
        cmocka_unit_test(test_draft_model_acceptance_distribution),
        cmocka_unit_test(test_round_acceptance),
        cmocka_unit_test(test_verify_pass_and_rewind),
        cmocka_unit_test(test_greedy_matches_plain),
        cmocka_unit_test(test_draft_model_drafting_for_itself),
        cmocka_unit_test(test_draft_model_of_other_weights),
        cmocka_unit_test(test_draft_model_near_twin),
        cmocka_unit_test(test_draft_model_refusals),
        cmocka_unit_test(test_cli_speculate),
        cmocka_unit_test(test_cli_draft),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
