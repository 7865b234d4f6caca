/*
 * test_moe.c - the mixture-of-experts calls' host references (NULL stream)
 * against the float64 loops of moe_ref.h, on fresh random data each run
 * (the seed is printed; WEFT_TEST_SEED replays it): the router with every
 * score function, renormalised or not, k of 1, 2 and 8, 8 to 256 experts, 1
 * to 1000 tokens, with and without exact ties, its NaN and infinity rules;
 * the tables' consistency; permute and combine as a round trip; the grouped
 * matmul with groups of no rows, one row and many, every activation, bias
 * and padded rows; the calls in a task's stream order (the grouped matmul
 * clamping a table it reads too late to refuse); and every bad argument
 * refused with its reason before anything is written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <time.h>

#include "ops/moe_ref.h"
#include "weft.h"
#include "weft/ops.h"

static const weft_dtype TYPES[] = {WEFT_DTYPE_F32, WEFT_DTYPE_BF16, WEFT_DTYPE_F16};

/* One router call on fresh logits, checked against float64. */
static void gate_case(weft_dtype t, weft_moe_score score, int renorm, size_t tokens, size_t experts,
                      size_t k, int ties)
{
    char name[160];
    snprintf(name, sizeof name, "gate dtype %d score %d renorm %d T %zu E %zu k %zu ties %d",
             (int)t, (int)score, renorm, tokens, experts, k, ties);
    size_t stride = experts + (tokens % 3);
    void *logits = moe_logits(t, tokens, experts, stride, ties);
    moe_host_routing r = moe_routing_poisoned(tokens, experts, k);
    weft_moe_routing o = moe_as_routing(&r);
    int rc = weft_moe_gate(NULL, t, score, renorm, logits, tokens, experts, stride, k, &o);
    if (rc != WEFT_OK)
        fail_msg("%s: %d %s", name, rc, weft_last_error());
    size_t bad = moe_check_gate(name, t, score, renorm, logits, tokens, experts, stride, k, &r);
    if (bad)
        fail_msg("%s: %zu mistakes", name, bad);
    moe_routing_free(&r);
    free(logits);
}

static void test_gate_matches_float64_for_every_score_k_and_size(void **state)
{
    (void)state;
    static const size_t EXPERTS[] = {8, 60, 64, 256}, TOKENS[] = {1, 17, 1000}, KS[] = {1, 2, 8};
    for (size_t ti = 0; ti < 3; ti++)
        for (int score = 0; score < 2; score++)
            for (int renorm = 0; renorm < 2; renorm++)
                for (size_t ei = 0; ei < 4; ei++)
                    for (size_t ki = 0; ki < 3; ki++)
                        for (size_t ni = 0; ni < 3; ni++) {
                            size_t tokens =
                                EXPERTS[ei] == 256 && TOKENS[ni] == 1000 ? 300 : TOKENS[ni];
                            gate_case(TYPES[ti], (weft_moe_score)score, renorm, tokens, EXPERTS[ei],
                                      KS[ki], (int)(ni + ki) % 2);
                        }
}

static void test_gate_breaks_exact_ties_by_the_lower_expert(void **state)
{
    (void)state;
    /* Every logit equal (and -0 against +0): the k lowest experts, in order. */
    float logits[2][8] = {{1, 1, 1, 1, 1, 1, 1, 1}, {0.0f, -0.0f, 0.0f, -0.0f, -1, -1, -1, -1}};
    moe_host_routing r = moe_routing_poisoned(2, 8, 3);
    weft_moe_routing o = moe_as_routing(&r);
    assert_int_equal(
        weft_moe_gate(NULL, WEFT_DTYPE_F32, WEFT_MOE_SOFTMAX, 1, logits, 2, 8, 8, 3, &o), WEFT_OK);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(r.ids[j], j);
        assert_int_equal(r.ids[3 + j], j);
        assert_true(fabsf(r.weights[j] - 1.0f / 3) < 1e-6f);
    }
    /* Expert 0 and 1 are chosen by rows 0 and 1; 2 by both. */
    assert_int_equal(r.offsets[0], 0);
    assert_int_equal(r.offsets[1], 2);
    assert_int_equal(r.offsets[3], 6);
    assert_int_equal(r.perm[0], 0);
    assert_int_equal(r.perm[1], 3);
    moe_routing_free(&r);
}

static void test_gate_nan_logits_rank_last_and_poison_softmax_weights(void **state)
{
    (void)state;
    /* Token 0: NaN at expert 1 and 2 among numbers; token 1: all NaN but
     * one -Inf; token 2: one NaN, sigmoid. */
    float logits[3][4] = {
        {1.0f, NAN, NAN, -INFINITY}, {NAN, NAN, -INFINITY, NAN}, {0.5f, NAN, 2.0f, -1.0f}};
    for (int score = 0; score < 2; score++)
        for (int renorm = 0; renorm < 2; renorm++) {
            moe_host_routing r = moe_routing_poisoned(3, 4, 3);
            weft_moe_routing o = moe_as_routing(&r);
            assert_int_equal(weft_moe_gate(NULL, WEFT_DTYPE_F32, (weft_moe_score)score, renorm,
                                           logits, 3, 4, 4, 3, &o),
                             WEFT_OK);
            int32_t want[9] = {0, 3, 1, 2, 0, 1, 2, 0, 3};
            for (int i = 0; i < 9; i++)
                assert_int_equal(r.ids[i], want[i]);
            for (int i = 0; i < 9; i++) {
                int t = i / 3;
                int nan_chosen = (t == 0 && i % 3 == 2) || (t == 1 && i % 3 > 0);
                int want_nan =
                    score == WEFT_MOE_SOFTMAX || nan_chosen || (renorm && (t == 0 || t == 1));
                if (want_nan != !!isnan(r.weights[i]))
                    fail_msg("score %d renorm %d: weight %d is %g", score, renorm, i, r.weights[i]);
            }
            assert_int_equal(r.offsets[4], 9);
            moe_routing_free(&r);
        }
}

static void test_gate_infinities_follow_ieee(void **state)
{
    (void)state;
    /* Token 0: +Inf among numbers; token 1: all -Inf; token 2: -Inf chosen. */
    float logits[3][4] = {{1.0f, INFINITY, 0.0f, -1.0f},
                          {-INFINITY, -INFINITY, -INFINITY, -INFINITY},
                          {2.0f, -INFINITY, -INFINITY, -INFINITY}};
    for (int score = 0; score < 2; score++) {
        moe_host_routing r = moe_routing_poisoned(3, 4, 2);
        weft_moe_routing o = moe_as_routing(&r);
        assert_int_equal(
            weft_moe_gate(NULL, WEFT_DTYPE_F32, (weft_moe_score)score, 0, logits, 3, 4, 4, 2, &o),
            WEFT_OK);
        int32_t want[6] = {1, 0, 0, 1, 0, 1};
        for (int i = 0; i < 6; i++)
            assert_int_equal(r.ids[i], want[i]);
        if (score == WEFT_MOE_SOFTMAX) {
            for (int i = 0; i < 4; i++) /* tokens 0 and 1: NaN */
                assert_true(isnan(r.weights[i]));
            assert_true(r.weights[4] == 1.0f && r.weights[5] == 0.0f);
        } else {
            assert_true(r.weights[0] == 1.0f && fabsf(r.weights[1] - 0.7310586f) < 1e-6f);
            assert_true(r.weights[2] == 0.0f && r.weights[3] == 0.0f && r.weights[5] == 0.0f);
        }
        moe_routing_free(&r);
    }
}

/* Permute, then "experts" that return their input, then combine: each
 * token comes back as sum_j w_j x[t] (+ residual), against float64. */
static void test_permute_and_combine_round_trip(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < 3; ti++)
        for (int with_res = 0; with_res < 2; with_res++) {
            weft_dtype t = TYPES[ti];
            size_t tokens = 37, experts = 16, k = 4, cols = 24, in_stride = 29, out_stride = 31;
            size_t es = weft__dtype_size(t);
            void *logits = moe_logits(WEFT_DTYPE_F32, tokens, experts, experts, 0);
            moe_host_routing r = moe_routing_poisoned(tokens, experts, k);
            weft_moe_routing o = moe_as_routing(&r);
            assert_int_equal(weft_moe_gate(NULL, WEFT_DTYPE_F32, WEFT_MOE_SOFTMAX, 1, logits,
                                           tokens, experts, experts, k, &o),
                             WEFT_OK);
            size_t nx = (tokens - 1) * in_stride + cols, ny = (tokens * k - 1) * out_stride + cols;
            size_t nout = (tokens - 1) * out_stride + cols;
            void *x = moe_random(t, nx, 2.0), *res = with_res ? moe_random(t, nout, 1.0) : NULL;
            void *y = moe_poisoned(ny * es), *out = moe_poisoned(nout * es);
            assert_int_equal(
                weft_moe_permute(NULL, t, y, x, r.perm, tokens, k, cols, in_stride, out_stride),
                WEFT_OK);
            for (size_t p = 0; p < tokens * k; p++)
                assert_memory_equal((char *)y + p * out_stride * es,
                                    (char *)x + (size_t)(r.perm[p] / (int)k) * in_stride * es,
                                    cols * es);
            assert_int_equal(weft_moe_unpermute(NULL, t, out, y, r.weights, r.inverse, res, tokens,
                                                k, cols, out_stride, out_stride),
                             WEFT_OK);
            double ulp = t == WEFT_DTYPE_F32 ? 0x1p-23 : t == WEFT_DTYPE_BF16 ? 0x1p-8 : 0x1p-10;
            for (size_t tk = 0; tk < tokens; tk++)
                for (size_t c = 0; c < cols; c++) {
                    double want = 0, size = 0;
                    for (size_t j = 0; j < k; j++) {
                        double v = (double)r.weights[tk * k + j] *
                                   weft__load(t, y, (size_t)r.inverse[tk * k + j] * out_stride + c);
                        want += v, size += fabs(v);
                    }
                    double xv = weft__load(t, x, tk * in_stride + c);
                    if (fabs(want - xv) > 1e-5 * fabs(xv) + 1e-6)
                        fail_msg("token %zu: the weights do not sum to 1 (%g vs %g)", tk, want, xv);
                    if (res) {
                        double rv = weft__load(t, res, tk * out_stride + c);
                        want += rv, size += fabs(rv);
                    }
                    double got = weft__load(t, out, tk * out_stride + c);
                    if (!(fabs(got - want) <= 8 * 0x1p-24 * size + ulp * fabs(want)))
                        fail_msg("dtype %d residual %d: out[%zu][%zu] = %.8g, want %.8g", (int)t,
                                 with_res, tk, c, got, want);
                }
            moe_routing_free(&r);
            free(logits), free(x), free(res), free(y), free(out);
        }
}

#ifdef WEFT_HAVE_HOST_BLAS
/* Groups of 0, 1 and many rows (and an empty last), every activation,
 * bias or not, padded leading dimensions and rows past offsets[G]. */
static void test_grouped_matmul_matches_float64(void **state)
{
    (void)state;
    int32_t offsets[] = {0, 0, 1, 38, 38, 107, 107};
    const size_t groups = 6, rows = 110;
    for (int t = 1; t < 3; t++)
        for (int act = 0; act <= WEFT_MATMUL_ACT_GELU_ERF; act++)
            for (int pad = 0; pad < 2; pad++) {
                weft_dtype type = TYPES[t];
                weft_grouped_matmul_desc d = {.groups = groups,
                                              .rows = rows,
                                              .n = 45,
                                              .k = 70,
                                              .type = type,
                                              .ldx = pad ? 75 : 0,
                                              .ldy = pad ? 50 : 0,
                                              .act = (weft_matmul_act)act};
                size_t ldx = pad ? 75 : 70, ldy = pad ? 50 : 45;
                void *x = moe_random(type, (rows - 1) * ldx + d.k, 1.0);
                void *w = moe_random(type, groups * d.n * d.k, 1.0);
                void *bias = pad ? moe_random(type, groups * d.n, 1.0) : NULL;
                void *y = moe_poisoned(((rows - 1) * ldy + d.n) * 2);
                d.bias = bias;
                int rc = weft_grouped_matmul(NULL, &d, y, x, w, offsets);
                if (rc != WEFT_OK)
                    fail_msg("%d: %s", rc, weft_last_error());
                char name[96];
                snprintf(name, sizeof name, "grouped type %d act %d pad %d", (int)type, act, pad);
                size_t bad = moe_check_grouped(name, &d, y, x, w, offsets, 1.0);
                if (bad)
                    fail_msg("%s: %zu mistakes", name, bad);
                free(x), free(w), free(bias), free(y);
            }
}

static void test_grouped_matmul_refuses_a_bad_table_on_the_host(void **state)
{
    (void)state;
    uint16_t x[4 * 8] = {0}, w[2 * 8 * 8] = {0}, y[4 * 8];
    weft_grouped_matmul_desc d = {.groups = 2, .rows = 4, .n = 8, .k = 8, .type = WEFT_DTYPE_BF16};
    int32_t decreasing[] = {0, 3, 2}, negative[] = {-1, 2, 3}, past[] = {0, 2, 5};
    const int32_t *tables[] = {decreasing, negative, past};
    for (int i = 0; i < 3; i++) {
        memset(y, 0xa7, sizeof y);
        assert_int_equal(weft_grouped_matmul(NULL, &d, y, x, w, tables[i]), WEFT_EINVAL);
        assert_non_null(strstr(weft_last_error(), "offsets"));
        for (size_t j = 0; j < 32; j++)
            assert_int_equal(y[j], 0xa7a7);
    }
}
#endif

/* ---- in a task's stream order (host backend) -------------------------- */

typedef struct chain {
    void *logits, *x, *y, *out;
    moe_host_routing r;
    size_t tokens, experts, k, cols;
    int rc;
} chain;

static void *chain_task(void *arg)
{
    chain *c = arg;
    weft_moe_routing o = moe_as_routing(&c->r);
    void *s = WEFT_TASK_STREAM;
    if ((c->rc = weft_moe_gate(s, WEFT_DTYPE_F32, WEFT_MOE_SIGMOID, 1, c->logits, c->tokens,
                               c->experts, c->experts, c->k, &o)) != WEFT_OK ||
        (c->rc = weft_moe_permute(s, WEFT_DTYPE_F32, c->y, c->x, c->r.perm, c->tokens, c->k,
                                  c->cols, c->cols, c->cols)) != WEFT_OK ||
        (c->rc = weft_moe_unpermute(s, WEFT_DTYPE_F32, c->out, c->y, c->r.weights, c->r.inverse,
                                    NULL, c->tokens, c->k, c->cols, c->cols, c->cols)) != WEFT_OK)
        return NULL;
    c->rc = weft_await();
    return NULL;
}

static void test_the_calls_run_in_a_tasks_stream_order(void **state)
{
    (void)state;
    chain c = {.tokens = 50, .experts = 12, .k = 3, .cols = 16};
    c.logits = moe_logits(WEFT_DTYPE_F32, c.tokens, c.experts, c.experts, 1);
    c.x = moe_random(WEFT_DTYPE_F32, c.tokens * c.cols, 1.0);
    c.y = moe_poisoned(c.tokens * c.k * c.cols * 4);
    c.out = moe_poisoned(c.tokens * c.cols * 4);
    c.r = moe_routing_poisoned(c.tokens, c.experts, c.k);
    weft_runtime *rt;
    weft_config cfg = {.workers = 1};
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    weft_task *task;
    assert_int_equal(weft_spawn(rt, &task, chain_task, &c, NULL), WEFT_OK);
    assert_int_equal(weft_join(task, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    assert_int_equal(c.rc, WEFT_OK);
    assert_int_equal(moe_check_gate("task", WEFT_DTYPE_F32, WEFT_MOE_SIGMOID, 1, c.logits, c.tokens,
                                    c.experts, c.experts, c.k, &c.r),
                     0);
    for (size_t i = 0; i < c.tokens * c.cols; i++) /* weights renormalised: out = x */
        assert_true(fabsf(((float *)c.out)[i] - ((float *)c.x)[i]) <= 1e-6f);
    moe_routing_free(&c.r);
    free(c.logits), free(c.x), free(c.y), free(c.out);
}

#ifdef WEFT_HAVE_HOST_BLAS
/* The grouped matmul in a task's stream order reads its table when it
 * runs, too late to refuse it: a bad table is clamped, a good one gives
 * the product. */
typedef struct grouped_job {
    weft_grouped_matmul_desc d;
    void *y, *x, *w;
    const int32_t *offsets;
    int rc;
} grouped_job;

static void *grouped_task(void *arg)
{
    grouped_job *j = arg;
    if ((j->rc = weft_grouped_matmul(WEFT_TASK_STREAM, &j->d, j->y, j->x, j->w, j->offsets)) ==
        WEFT_OK)
        j->rc = weft_await();
    return NULL;
}

static void test_grouped_matmul_in_a_tasks_stream_order(void **state)
{
    (void)state;
    weft_grouped_matmul_desc d = {
        .groups = 3, .rows = 50, .n = 24, .k = 32, .type = WEFT_DTYPE_BF16};
    int32_t good[] = {0, 20, 20, 45}, bad[] = {-7, 30, 10, 999};
    void *x = moe_random(d.type, 50 * 32, 1.0), *w = moe_random(d.type, 3 * 24 * 32, 1.0);
    weft_runtime *rt;
    weft_config cfg = {.workers = 1};
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    for (int i = 0; i < 2; i++) {
        grouped_job j = {d, moe_poisoned(50 * 24 * 2), x, w, i ? bad : good, -1};
        weft_task *task;
        assert_int_equal(weft_spawn(rt, &task, grouped_task, &j, NULL), WEFT_OK);
        assert_int_equal(weft_join(task, NULL), WEFT_OK);
        assert_int_equal(j.rc, WEFT_OK);
        if (i == 0)
            assert_int_equal(moe_check_grouped("task", &d, j.y, x, w, good, 1.0), 0);
        free(j.y);
    }
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    free(x), free(w);
}
#endif

/* ---- bad arguments ------------------------------------------------------ */

#define REFUSED(call, words)                                                                       \
    do {                                                                                           \
        assert_int_equal((call), WEFT_EINVAL);                                                     \
        if (!strstr(weft_last_error(), (words)))                                                   \
            fail_msg("%s: message \"%s\" lacks \"%s\"", #call, weft_last_error(), (words));        \
    } while (0)

static void test_bad_arguments_are_refused_before_anything_is_written(void **state)
{
    (void)state;
    float logits[4 * 300];
    memset(logits, 0, sizeof logits);
    moe_host_routing r = moe_routing_poisoned(4, 300, 8);
    weft_moe_routing o = moe_as_routing(&r), bad;
    const weft_dtype F = WEFT_DTYPE_F32;
    REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, logits, 4, 8, 8, 9, &o), "k = 9");
    REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, logits, 4, 8, 8, 0, &o), "k = 0");
    REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, logits, 4, 4, 4, 6, &o), "more than");
    REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, logits, 4, 257, 257, 2, &o),
            "experts = 257");
    REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, logits, 0, 8, 8, 2, &o), "tokens");
    REFUSED(weft_moe_gate(NULL, F, (weft_moe_score)2, 0, logits, 4, 8, 8, 2, &o), "score");
    REFUSED(weft_moe_gate(NULL, (weft_dtype)7, WEFT_MOE_SOFTMAX, 0, logits, 4, 8, 8, 2, &o),
            "dtype");
    REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, logits, 4, 8, 7, 2, &o), "stride");
    REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, NULL, 4, 8, 8, 2, &o), "logits is NULL");
    REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, (char *)logits + 2, 4, 8, 8, 2, &o),
            "aligned");
    REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, logits, 4, 8, 8, 2, NULL), "out is NULL");
    const char *names[] = {"weights", "ids", "offsets", "perm", "inverse"};
    for (int i = 0; i < 5; i++) {
        bad = o;
        void **field = i == 0   ? (void **)&bad.weights
                       : i == 1 ? (void **)&bad.ids
                       : i == 2 ? (void **)&bad.offsets
                       : i == 3 ? (void **)&bad.perm
                                : (void **)&bad.inverse;
        *field = NULL;
        REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, logits, 4, 8, 8, 2, &bad), names[i]);
        *field = (char *)(i == 0 ? (void *)o.weights : (void *)o.ids) + 1;
        REFUSED(weft_moe_gate(NULL, F, WEFT_MOE_SOFTMAX, 0, logits, 4, 8, 8, 2, &bad), "aligned");
    }
    /* Nothing was written by any refused call. */
    for (size_t i = 0; i < 4 * 8; i++)
        assert_int_equal((uint32_t)r.ids[i], 0xa7a7a7a7u);
    assert_int_equal((uint32_t)r.offsets[0], 0xa7a7a7a7u);

    float x[4 * 8], y[32 * 8], out[4 * 8];
    REFUSED(weft_moe_permute(NULL, F, y, x, r.perm, 4, 9, 8, 8, 8), "k = 9");
    REFUSED(weft_moe_permute(NULL, F, y, x, NULL, 4, 2, 8, 8, 8), "perm is NULL");
    REFUSED(weft_moe_permute(NULL, F, y, x, r.perm, 4, 2, 8, 7, 8), "stride");
    REFUSED(weft_moe_permute(NULL, F, x, x, r.perm, 4, 2, 8, 8, 8), "out must not be in");
    REFUSED(weft_moe_permute(NULL, F, (char *)y + 1, x, r.perm, 4, 2, 8, 8, 8), "aligned");
    REFUSED(weft_moe_unpermute(NULL, F, out, y, NULL, r.inverse, NULL, 4, 2, 8, 8, 8),
            "weights is NULL");
    REFUSED(weft_moe_unpermute(NULL, F, out, y, r.weights, NULL, NULL, 4, 2, 8, 8, 8),
            "inverse is NULL");
    REFUSED(weft_moe_unpermute(NULL, F, out, y, r.weights, r.inverse + 0, NULL, 4, 0, 8, 8, 8),
            "k = 0");
    REFUSED(weft_moe_unpermute(NULL, F, y, y, r.weights, r.inverse, NULL, 4, 2, 8, 8, 8),
            "out must not be y");
    REFUSED(weft_moe_unpermute(NULL, F, out, y, r.weights, r.inverse, (char *)x + 2, 4, 2, 8, 8, 8),
            "aligned");

    uint16_t gx[4 * 8], gw[2 * 8 * 8], gy[4 * 8];
    int32_t offs[3] = {0, 2, 4};
    weft_grouped_matmul_desc d = {.groups = 2, .rows = 4, .n = 8, .k = 8, .type = WEFT_DTYPE_BF16};
    weft_grouped_matmul_desc e = d;
    REFUSED(weft_grouped_matmul(NULL, NULL, gy, gx, gw, offs), "desc is NULL");
    e.type = WEFT_DTYPE_F32;
    REFUSED(weft_grouped_matmul(NULL, &e, gy, gx, gw, offs), "not bf16 or fp16");
    e = d, e.groups = 0;
    REFUSED(weft_grouped_matmul(NULL, &e, gy, gx, gw, offs), "must be >= 1");
    e = d, e.ldx = 4;
    REFUSED(weft_grouped_matmul(NULL, &e, gy, gx, gw, offs), "X stride");
    e = d, e.ldy = 7;
    REFUSED(weft_grouped_matmul(NULL, &e, gy, gx, gw, offs), "Y stride");
    e = d, e.act = (weft_matmul_act)9;
    REFUSED(weft_grouped_matmul(NULL, &e, gy, gx, gw, offs), "activation");
    e = d, e.reserved[3] = 1;
    REFUSED(weft_grouped_matmul(NULL, &e, gy, gx, gw, offs), "reserved");
    e = d, e.bias = (char *)gw + 1;
    REFUSED(weft_grouped_matmul(NULL, &e, gy, gx, gw, offs), "bias is not aligned");
    REFUSED(weft_grouped_matmul(NULL, &d, gy, gx, gw, NULL), "offsets is NULL");
    REFUSED(weft_grouped_matmul(NULL, &d, gy, gx, gw, (const int32_t *)((char *)offs + 2)),
            "offsets is not aligned");
    REFUSED(weft_grouped_matmul(NULL, &d, NULL, gx, gw, offs), "Y is NULL");
    REFUSED(weft_grouped_matmul(NULL, &d, gy, (char *)gx + 1, gw, offs), "X is not aligned");
    REFUSED(weft_grouped_matmul(NULL, &d, gy, gx, NULL, offs), "W is NULL");
    REFUSED(weft_grouped_matmul(NULL, &d, gx, gx, gw, offs), "must not be X");
    moe_routing_free(&r);
}

int main(void)
{
    moe_rng_state = moe_seed();
    printf("test_moe: seed %llu\n", (unsigned long long)moe_rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_matches_float64_for_every_score_k_and_size),
        cmocka_unit_test(test_gate_breaks_exact_ties_by_the_lower_expert),
        cmocka_unit_test(test_gate_nan_logits_rank_last_and_poison_softmax_weights),
        cmocka_unit_test(test_gate_infinities_follow_ieee),
        cmocka_unit_test(test_permute_and_combine_round_trip),
#ifdef WEFT_HAVE_HOST_BLAS
        cmocka_unit_test(test_grouped_matmul_matches_float64),
        cmocka_unit_test(test_grouped_matmul_refuses_a_bad_table_on_the_host),
        cmocka_unit_test(test_grouped_matmul_in_a_tasks_stream_order),
#endif
        cmocka_unit_test(test_the_calls_run_in_a_tasks_stream_order),
        cmocka_unit_test(test_bad_arguments_are_refused_before_anything_is_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
