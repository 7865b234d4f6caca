/*
 * test_llm_tp.c - weft-llm's tensor parallel on the host backend: a
 * rank's share of every weight against the whole model's, byte for byte
 * (dense, Qwen2's biases, FP8 and its scales, the experts); the
 * engine over two ranks (each holding half the heads, half the key-value
 * heads and half the MLP, an all-reduce after the o and down projections)
 * against the engine on one, generations at once, greedy: the same tokens
 * up to a near tie, and before it logits within a few bf16 units (the
 * ranks' partial products are rounded to bf16 before they are summed);
 * every page back after; Qwen2's biases, Qwen3's per-head norms, Mistral's
 * window, fp32 and FP8 weights likewise, and Mixtral's and Qwen2-MoE's
 * experts. Then what it refuses (heads that do not divide, 2:4 weights, a
 * pipeline stage, speculation, a draft model, a second split), a
 * rank that breaks mid-generation (every generation fails, nothing hangs)
 * and generate and bench --tensor-parallel on the command line. The model and the
 * prompts are drawn from the printed seed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "llm_test.h"
#include "llm_ref.h"

static char *dir, *model_dir, *moe_dir, *qwen2moe_dir;
static uint64_t seed;

static int setup(void **state)
{
    (void)state;
    seed = test_seed();
    dir = scratch_dir();
    if (!dir)
        return -1;
    model_dir = path_in(dir, "tiny");
    moe_dir = path_in(dir, "moe");
    qwen2moe_dir = path_in(dir, "qwen2moe");
    wl_write_opts o = {.preset = "tiny", .seed = seed}, mo = {.preset = "moe", .seed = seed},
                  qo = {.preset = "qwen2moe", .seed = seed};
    if (wl_write_random_model(model_dir, &o) || wl_write_random_model(moe_dir, &mo) ||
        wl_write_random_model(qwen2moe_dir, &qo)) {
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
    free(moe_dir);
    free(qwen2moe_dir);
    return 0;
}

enum { V = TINY_VOCAB, GENS = 4, PROMPT = 9, TOKENS = 24, PAGES = 32 };

/* One engine: the tiny model whole, or split over `ranks`. */
enum { MAX_RANKS = 4 };
typedef struct rig {
    wl_model m[MAX_RANKS];
    int ranks;
    wl_engine e;
    weft_runtime *rt;
} rig;

static int rig_up(rig *r, const char *model, int ranks)
{
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.stack_size = 1 << 20;
    memset(r, 0, sizeof *r);
    r->ranks = ranks;
    for (int i = 0; i < ranks; i++)
        assert_int_equal(wl_model_open(&r->m[i], model), 0);
    assert_int_equal(weft_runtime_create(&r->rt, &cfg), WEFT_OK);
    wl_model *models[MAX_RANKS] = {&r->m[0], &r->m[1], &r->m[2], &r->m[3]};
    return ranks > 1 ? wl_engine_start_tp(&r->e, r->rt, models, ranks, PAGES, GENS, 64)
                     : wl_engine_start(&r->e, r->rt, &r->m[0], PAGES, GENS, 64);
}

static void rig_down(rig *r, int started)
{
    if (started)
        assert_int_equal(wl_engine_stop(&r->e), 0);
    weft_runtime_destroy(r->rt);
    for (int i = 0; i < r->ranks; i++)
        wl_model_close(&r->m[i]);
}

/* One greedy generation, keeping each token and its logits. */
typedef struct tp_run {
    wl_engine *e;
    int32_t prompt[PROMPT], ids[TOKENS];
    float logits[TOKENS][V];
    int n, failed, cancel_after; /* cancel_after: break rank 1 after this many tokens (0: never) */
    char message[512];
    wl_finish finish;
} tp_run;

static int keep(void *ctx, int32_t id, int eos, const float *logits)
{
    (void)eos;
    tp_run *g = ctx;
    if (g->n < TOKENS) {
        g->ids[g->n] = id;
        memcpy(g->logits[g->n], logits, sizeof g->logits[0]);
    }
    g->n++;
    if (g->cancel_after && g->n == g->cancel_after)
        wl_tp_break(g->e->tp, 1, "broken by the test");
    return 0;
}

static void *gen_task(void *arg)
{
    tp_run *g = arg;
    wl_gen w = {.prompt = g->prompt,
                .n_prompt = PROMPT,
                .max_tokens = TOKENS,
                .ignore_eos = 1,
                .on_token = keep,
                .wants_logits = 1,
                .ctx = g};
    g->n = 0;
    g->failed = wl_engine_generate(g->e, &w, &g->finish);
    snprintf(g->message, sizeof g->message, "%s", g->failed ? wl_error() : "");
    return NULL;
}

static void run_gens(rig *r, tp_run *g)
{
    weft_task *t[GENS];
    for (int i = 0; i < GENS; i++) {
        g[i].e = &r->e;
        assert_int_equal(weft_spawn(r->rt, &t[i], gen_task, &g[i], NULL), WEFT_OK);
    }
    for (int i = 0; i < GENS; i++)
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void top_two(const float *l, int *a, int *b)
{
    logits_top_two(l, V, a, b);
}

/* bf16 units at the router logits' scale a prompt's routing keeps from a
 * tie (llm_ref.h's ref_draw_ids), as test_llm_gpu draws them. */
#define ROUTE_MARGIN 4.0

/* model's generations on one rank and on two: the same greedy tokens up to
 * a near tie (the top two within two bf16 units), and before it logits
 * within four bf16 units of the top. A mixture of experts' router may
 * choose another expert for a generated token whose top two router logits
 * nearly tie (its prompts are drawn so that none of theirs does), and its
 * logits then move by tens of units: a tie, not a mistake. So there, the
 * prompt's row is held, and the other rows' median (a split that went
 * wrong moves every row). An FP8 model quantizes o's and down's inputs a
 * token at a time, over each rank's share of the row, with a scale of the
 * share's own: E4M3 rounds them otherwise than one GPU's scale over the
 * whole row, so it is held to an E4M3 unit (16 bf16 units: 4 bits of
 * significand against 8; 21 seeds gave at most 7), and parts within one. */
static void compare_ranks(const char *model, const char *what)
{
    static tp_run one[GENS], two[GENS];
    static double units[GENS * TOKENS];
    uint64_t st = seed ^ 0x7e5;
    wl_model m;
    assert_int_equal(wl_model_open(&m, model), 0);
    int routed = m.cfg.experts > 0;
    double bound = m.cfg.fp8 ? 16 : 4, tie = m.cfg.fp8 ? 16 : 2; /* bf16 units of the top */
    for (int i = 0; i < GENS; i++) {
        ref_draw_ids(&m, &st, one[i].prompt, PROMPT, ROUTE_MARGIN);
        memcpy(two[i].prompt, one[i].prompt, sizeof one[i].prompt);
    }
    wl_model_close(&m);
    rig r;
    assert_int_equal(rig_up(&r, model, 1), 0);
    run_gens(&r, one);
    rig_down(&r, 1);
    if (rig_up(&r, model, 2))
        fail_msg("%s, tensor parallel: %s", what, wl_error());
    assert_int_equal(r.m[0].cfg.heads, 2); /* tiny's 4 heads, 2 key-value heads, MLP 128 */
    assert_int_equal(r.m[1].cfg.kv_heads, 1);
    assert_int_equal(r.m[1].cfg.intermediate, 64);
    run_gens(&r, two);
    wl_engine_counts c;
    wl_engine_stats(&r.e, &c);
    assert_int_equal(c.used_pages + c.reserved_pages + c.running + c.queued, 0);
    printf("  %s on two ranks: %ld steps of %ld rows\n", what, c.steps, c.rows);
    assert_true(c.steps > 0);
    rig_down(&r, 1);
    double worst = 0, first = 0;
    int n = 0;
    for (int i = 0; i < GENS; i++) {
        assert_false(one[i].failed);
        if (two[i].failed)
            fail_msg("generation %d on two ranks: %s", i, two[i].message);
        assert_int_equal(two[i].n, TOKENS);
        assert_int_equal(two[i].finish, WL_FINISH_LENGTH);
        for (int k = 0; k < TOKENS; k++) {
            const float *a = one[i].logits[k], *b = two[i].logits[k];
            int pa, pb;
            top_two(a, &pa, &pb);
            double scale = fabs(a[pa]), diff = 0;
            for (int v = 0; v < V; v++)
                diff = fmax(diff, fabs((double)a[v] - b[v]));
            units[n++] = diff / scale * 128;
            first = k ? first : fmax(first, diff / scale * 128);
            if (one[i].ids[k] != two[i].ids[k]) {
                printf("  generation %d parts at token %d (gap %.2g of the top, logits %.1f "
                       "units apart)\n",
                       i, k, (a[pa] - a[pb]) / scale, diff / scale * 128);
                if (!routed)
                    assert_true((a[pa] - a[pb]) / scale * 128 < tie);
                break;
            }
            worst = fmax(worst, diff / scale * 128);
        }
    }
    qsort(units, (size_t)n, sizeof *units, by_value);
    printf("  logits: the prompts' rows at most %.2f bf16 units of the top apart, the rows' "
           "median %.2f, the largest %.2f\n",
           first, units[n / 2], worst);
    assert_true(first < bound);
    assert_true((routed ? units[n / 2] : worst) < bound);
}

static void test_tp_matches_one_rank(void **state)
{
    (void)state;
    compare_ranks(model_dir, "tiny");
}

/* The variants whose weights split otherwise: Qwen2's q, k and v biases
 * (a rank's share of each), Qwen3's per-head norms (whole on every rank),
 * Mistral's sliding window, and fp32 weights (split, then rounded to
 * bf16 at the upload). */
/* Mixtral's and Qwen2-MoE's experts split as dense MLPs are (and the
 * latter's shared expert), every rank routing alike. */
static void test_tp_moe_matches_one_rank(void **state)
{
    (void)state;
    compare_ranks(moe_dir, "moe");
    compare_ranks(qwen2moe_dir, "qwen2moe");
}

static void test_tp_variants_match_one_rank(void **state)
{
    (void)state;
    char *v[4] = {
        write_variant(dir, model_dir, "qwen2", "qwen2", json_object(), 1, 0, WEFT_DTYPE_BF16, seed),
        write_variant(dir, model_dir, "qwen3", "qwen3", json_object(), 0, 1, WEFT_DTYPE_BF16, seed),
        write_variant(dir, model_dir, "mistral", "mistral", json_pack("{s:i}", "sliding_window", 4),
                      0, 0, WEFT_DTYPE_BF16, seed),
        write_variant(dir, model_dir, "fp32", "llama", json_pack("{s:s}", "torch_dtype", "float32"),
                      0, 0, WEFT_DTYPE_F32, seed)};
    const char *names[4] = {"qwen2", "qwen3", "mistral", "fp32"};
    for (int i = 0; i < 4; i++) {
        compare_ranks(v[i], names[i]);
        free(v[i]);
    }
    /* FP8 weights: a rank's rows and their scales, o's and down's columns
     * (their scales, an output row's, whole) */
    char *fp8 = path_in(dir, "fp8");
    wl_write_opts fo = {.preset = "tiny", .seed = seed, .fp8 = 1};
    assert_int_equal(wl_write_random_model(fp8, &fo), 0);
    compare_ranks(fp8, "fp8");
    free(fp8);
}

/* Rank r's share's rows (rows of width elements of es bytes) are the
 * whole's rows from r rows on. */
static void same_rows(const void *share, const void *whole, int r, size_t rows, size_t width,
                      size_t es, const char *what, int layer)
{
    if (memcmp(share, (const char *)whole + (size_t)r * rows * width * es, rows * width * es))
        fail_msg("layer %d's %s: rank %d's rows are not the whole's", layer, what, r);
}

/* Rank r's share of a [rows][width] matrix is its columns [r cols, +cols). */
static void same_columns(const void *share, const void *whole, int r, size_t rows, size_t width,
                         size_t cols, size_t es, const char *what, int layer)
{
    for (size_t i = 0; i < rows; i++)
        if (memcmp((const char *)share + i * cols * es,
                   (const char *)whole + (i * width + (size_t)r * cols) * es, cols * es))
            fail_msg("layer %d's %s: rank %d's row %zu is not the whole's columns", layer, what, r,
                     i);
}

/* Each weight of rank 1 of 2 against the whole model's, byte for byte: q,
 * k, v (their biases, FP8 scales), gate and up rows from the rank's on; o's
 * and down's columns (the experts', the shared expert's); o's and down's
 * FP8 scales, the norms and the router whole. */
static void expect_shares(const char *model)
{
    wl_model w, sh;
    assert_int_equal(wl_model_open(&w, model), 0);
    assert_int_equal(wl_model_open(&sh, model), 0);
    assert_int_equal(wl_model_set_shard(&sh, 1, 2), 0);
    const wl_config *c = &w.cfg;
    size_t es = wl_dtype_size(w.dtype), wes = c->fp8 ? 1 : es, H = (size_t)c->hidden;
    size_t q = (size_t)c->heads * c->head_dim, kv = (size_t)c->kv_heads * c->head_dim;
    size_t I = (size_t)c->intermediate, M = (size_t)c->moe_intermediate;
    size_t S = (size_t)c->shared_intermediate;
    assert_int_equal(sh.cfg.heads * 2, c->heads);
    assert_int_equal(sh.cfg.kv_heads * 2, c->kv_heads);
    assert_int_equal(sh.cfg.intermediate * 2, c->intermediate);
    assert_int_equal(sh.cfg.moe_intermediate * 2, c->moe_intermediate);
    for (int l = 0; l < c->layers; l++) {
        const wl_layer *a = &sh.layer[l], *b = &w.layer[l];
        same_rows(a->q, b->q, 1, q / 2, H, wes, "q", l);
        same_rows(a->k, b->k, 1, kv / 2, H, wes, "k", l);
        same_rows(a->v, b->v, 1, kv / 2, H, wes, "v", l);
        same_columns(a->o, b->o, 1, H, q, q / 2, wes, "o", l);
        if (c->attention_bias) {
            same_rows(a->q_bias, b->q_bias, 1, q / 2, 1, es, "q bias", l);
            same_rows(a->k_bias, b->k_bias, 1, kv / 2, 1, es, "k bias", l);
            same_rows(a->v_bias, b->v_bias, 1, kv / 2, 1, es, "v bias", l);
        }
        if (c->fp8) {
            same_rows(a->q_scale, b->q_scale, 1, q / 2, 1, 4, "q scales", l);
            same_rows(a->k_scale, b->k_scale, 1, kv / 2, 1, 4, "k scales", l);
            same_rows(a->v_scale, b->v_scale, 1, kv / 2, 1, 4, "v scales", l);
            same_rows(a->o_scale, b->o_scale, 0, H, 1, 4, "o scales", l);
        }
        same_rows(a->attn_norm, b->attn_norm, 0, 1, H, es, "attention norm", l);
        same_rows(a->mlp_norm, b->mlp_norm, 0, 1, H, es, "MLP norm", l);
        if (!b->moe) {
            same_rows(a->gate, b->gate, 1, I / 2, H, wes, "gate", l);
            same_rows(a->up, b->up, 1, I / 2, H, wes, "up", l);
            same_columns(a->down, b->down, 1, H, I, I / 2, wes, "down", l);
            if (c->fp8) {
                same_rows(a->gate_scale, b->gate_scale, 1, I / 2, 1, 4, "gate scales", l);
                same_rows(a->up_scale, b->up_scale, 1, I / 2, 1, 4, "up scales", l);
                same_rows(a->down_scale, b->down_scale, 0, H, 1, 4, "down scales", l);
            }
            continue;
        }
        same_rows(a->router, b->router, 0, (size_t)c->experts, H, es, "router", l);
        for (int e = 0; e < c->experts; e++) {
            same_rows(a->expert[3 * e], b->expert[3 * e], 1, M / 2, H, es, "an expert's gate", l);
            same_rows(a->expert[3 * e + 1], b->expert[3 * e + 1], 1, M / 2, H, es, "an expert's up",
                      l);
            same_columns(a->expert[3 * e + 2], b->expert[3 * e + 2], 1, H, M, M / 2, es,
                         "an expert's down", l);
        }
        if (S) {
            same_rows(a->shared_gate, b->shared_gate, 1, S / 2, H, es, "shared gate", l);
            same_rows(a->shared_up, b->shared_up, 1, S / 2, H, es, "shared up", l);
            same_columns(a->shared_down, b->shared_down, 1, H, S, S / 2, es, "shared down", l);
            same_rows(a->shared_router, b->shared_router, 0, 1, H, es, "shared router", l);
        }
    }
    wl_model_close(&sh);
    wl_model_close(&w);
}

static void test_tp_shares(void **state)
{
    (void)state;
    char *fp8 = path_in(dir, "fp8-shares");
    wl_write_opts fo = {.preset = "tiny", .seed = seed, .fp8 = 1};
    assert_int_equal(wl_write_random_model(fp8, &fo), 0);
    char *qwen2 = write_variant(dir, model_dir, "qwen2-shares", "qwen2", json_object(), 1, 0,
                                WEFT_DTYPE_BF16, seed);
    const char *models[] = {model_dir, qwen2, fp8, moe_dir, qwen2moe_dir};
    for (int i = 0; i < 5; i++)
        expect_shares(models[i]);
    printf("  tiny, Qwen2, FP8, Mixtral and Qwen2-MoE: rank 1's weights are the whole's share\n");
    free(fp8);
    free(qwen2);
}

static void expect_refused(const char *model, int ranks, const char *want)
{
    rig r;
    int rc = rig_up(&r, model, ranks);
    const char *err = wl_error();
    printf("  %d ranks of %s: %s\n", ranks, model == moe_dir ? "moe" : "tiny",
           rc ? err : "started");
    assert_int_equal(rc, -1);
    if (!strstr(err, want))
        fail_msg("\"%s\" lacks \"%s\"", err, want);
    rig_down(&r, 0);
}

static void test_tp_refuses(void **state)
{
    (void)state;
    /* 4 heads over 3 ranks */
    wl_model m3[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(wl_model_open(&m3[i], model_dir), 0);
    assert_int_equal(wl_model_set_shard(&m3[0], 0, 3), -1);
    assert_non_null(strstr(wl_error(), "must each divide by 3"));
    assert_int_equal(wl_model_set_shard(&m3[1], 3, 3), -1); /* no rank 3 of 3 */
    assert_int_equal(wl_model_set_shard(&m3[2], 1, 2), 0);
    assert_int_equal(wl_model_set_shard(&m3[2], 1, 2), -1); /* split once */
    assert_non_null(strstr(wl_error(), "once"));
    for (int i = 0; i < 3; i++)
        wl_model_close(&m3[i]);
    expect_refused(model_dir, 3, "must each divide by 3"); /* the engine says so too */
    wl_model m;
    assert_int_equal(wl_model_open(&m, model_dir), 0);
    m.sparse_2_4 = 1;
    assert_int_equal(wl_model_set_shard(&m, 0, 2), -1);
    assert_non_null(strstr(wl_error(), "2:4 sparse weights are not split"));
    m.sparse_2_4 = 0;
    assert_int_equal(wl_model_set_stage(&m, 0, 1), 0);
    assert_int_equal(wl_model_set_shard(&m, 0, 2), -1);
    assert_non_null(strstr(wl_error(), "pipeline stages are not split"));
    wl_model_close(&m);
    rig r;
    assert_int_equal(rig_up(&r, model_dir, 2), 0);
    wl_model d;
    assert_int_equal(wl_model_open(&d, model_dir), 0);
    assert_int_equal(wl_engine_set_draft(&r.e, &d), -1);
    assert_non_null(strstr(wl_error(), "tensor parallel"));
    wl_model_close(&d);
    rig_down(&r, 1);
}

/* Speculation is refused in the generation's own task. */
typedef struct spec_try {
    wl_engine *e;
    int rc;
    char message[512];
} spec_try;

static void *spec_task(void *arg)
{
    spec_try *s = arg;
    int32_t prompt[3] = {1, 2, 3};
    wl_gen g = {.prompt = prompt, .n_prompt = 3, .max_tokens = 4, .speculate_k = 2};
    wl_finish f;
    s->rc = wl_engine_generate(s->e, &g, &f);
    snprintf(s->message, sizeof s->message, "%s", wl_error());
    return NULL;
}

static void test_tp_refuses_speculation(void **state)
{
    (void)state;
    rig r;
    assert_int_equal(rig_up(&r, model_dir, 2), 0);
    spec_try s = {.e = &r.e};
    weft_task *t;
    assert_int_equal(weft_spawn(r.rt, &t, spec_task, &s, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    printf("  speculate_k 2: %s\n", s.message);
    assert_int_equal(s.rc, -1);
    assert_non_null(strstr(s.message, "does not decode speculatively"));
    rig_down(&r, 1);
}

/* Rank 1 breaks after a generation's third token: every generation ends
 * in an error naming it (none hangs: the test's timeout would say so),
 * and the engine still stops, every page back. */
static void test_tp_broken_rank(void **state)
{
    (void)state;
    static tp_run g[GENS];
    uint64_t st = seed ^ 0xb4e;
    for (int i = 0; i < GENS; i++)
        for (int j = 0; j < PROMPT; j++)
            g[i].prompt[j] = (int32_t)(wl_rand_next(&st) % V);
    g[0].cancel_after = 3;
    rig r;
    assert_int_equal(rig_up(&r, model_dir, 2), 0);
    run_gens(&r, g);
    for (int i = 0; i < GENS; i++) {
        printf("  generation %d: %d tokens, %s\n", i, g[i].n,
               g[i].failed ? g[i].message : "no error");
        assert_true(g[i].failed);
        assert_non_null(strstr(g[i].message, "rank 1: broken by the test"));
    }
    wl_engine_counts c;
    wl_engine_stats(&r.e, &c);
    assert_int_equal(c.used_pages + c.reserved_pages + c.running + c.queued, 0);
    rig_down(&r, 1);
}

static void test_cli_tensor_parallel(void **state)
{
    (void)state;
    char cmd[2048], *out, *err, *out2, *err2;
    snprintf(cmd, sizeof cmd,
             "%s generate %s --prompt-ids 5,6,7,8 --max-tokens 12 --ignore-eos --print-ids "
             "--backend host --parallel 2 --print-top",
             WL_BIN, model_dir);
    assert_int_equal(run_capture(cmd, &out, &err), 0);
    snprintf(cmd, sizeof cmd,
             "%s generate %s --prompt-ids 5,6,7,8 --max-tokens 12 --ignore-eos --print-ids "
             "--backend host --parallel 2 --tensor-parallel 2",
             WL_BIN, model_dir);
    int rc = run_capture(cmd, &out2, &err2);
    printf("  --tensor-parallel 2 (exit %d): %s%s", rc, out2, err2);
    assert_int_equal(rc, 0);
    /* greedy: both copies the same ids as one rank's, up to a near tie */
    long long a[64], b[64], token;
    int n = printed_ids(err, a, 64), k = 0;
    assert_int_equal(printed_ids(err2, b, 64), n);
    while (k < n && a[k] == b[k])
        k++;
    if (k < n) {
        double gap = printed_gap(err, k, &token);
        printf("  they part at token %d, gap %.2g of the top\n", k, gap);
        assert_true(gap < 1.0 / 64);
    }
    free(out), free(err), free(out2), free(err2);
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt-ids 5,6 --backend host --tensor-parallel 3",
             WL_BIN, model_dir);
    rc = run_capture(cmd, &out, &err);
    printf("  --tensor-parallel 3 (exit %d): %s", rc, err);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "must each divide by 3"));
    free(out), free(err);
    snprintf(cmd, sizeof cmd,
             "%s generate %s --prompt-ids 5,6 --backend host --tensor-parallel 2 --speculate 2",
             WL_BIN, model_dir);
    rc = run_capture(cmd, &out, &err);
    printf("  --tensor-parallel 2 --speculate 2 (exit %d): %s", rc, err);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err, "does not decode speculatively"));
    free(out), free(err);
    /* bench: decode steps over the split model */
    snprintf(cmd, sizeof cmd,
             "%s bench %s --backend host --prompt-lens 16 --batches 1,3 --steps 3 --repeats 1 "
             "--decode-prompt 8 --tensor-parallel 2",
             WL_BIN, model_dir);
    rc = run_capture(cmd, &out, &err);
    printf("  bench --tensor-parallel 2 (exit %d): %s%s", rc, out, err);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "BENCH llm.tensor_parallel 2 ranks"));
    assert_non_null(strstr(out, "BENCH llm.decode.B3.step_ms"));
    assert_null(strstr(out, "BENCH llm.prefill")); /* not measured split */
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "%s bench %s --backend host --prompt-lens 16 --tensor-parallel 3",
             WL_BIN, model_dir);
    rc = run_capture(cmd, &out, &err);
    printf("  bench --tensor-parallel 3 (exit %d): %s", rc, err);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "must each divide by 3"));
    free(out), free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_shares),
        cmocka_unit_test(test_tp_matches_one_rank),
        cmocka_unit_test(test_tp_variants_match_one_rank),
        cmocka_unit_test(test_tp_moe_matches_one_rank),
        cmocka_unit_test(test_tp_refuses),
        cmocka_unit_test(test_tp_refuses_speculation),
        cmocka_unit_test(test_tp_broken_rank),
        cmocka_unit_test(test_cli_tensor_parallel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
