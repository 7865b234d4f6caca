/*
 * test_llm_files.c - weft-llm's readers of model folders: safetensors
 * files good and hostile (each refusal with its own message, never a read
 * past the file), config.json fields and their checks, and a model folder
 * whose weights do not match its config (a missing tensor, a wrong shape,
 * a wrong dtype), one file or shards; mixture-of-experts folders (the
 * experts bound, each mismatch refused naming the tensor).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <jansson.h>

#include "llm_test.h"

static char *dir;

static int setup(void **state)
{
    (void)state;
    dir = scratch_dir();
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove_scratch(dir);
    free(dir);
    return 0;
}

/* A file: the 8-byte length (len_override when nonzero), the header, data. */
static char *st_file(const char *name, const char *header, uint64_t len_override, const void *data,
                     size_t n)
{
    char *path = path_in(dir, name);
    size_t hl = (strlen(header) + 7) / 8 * 8; /* padded with spaces, as writers do */
    uint64_t len = len_override ? len_override : hl;
    unsigned char *buf = malloc(8 + hl + n + 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(len >> (8 * i));
    memset(buf + 8, ' ', hl);
    memcpy(buf + 8, header, strlen(header));
    if (n)
        memcpy(buf + 8 + hl, data, n);
    assert_int_equal(write_bytes(path, buf, 8 + hl + n), 0);
    free(buf);
    return path;
}

static void expect_refusal(const char *name, const char *header, uint64_t len, size_t data_bytes,
                           const char *message)
{
    unsigned char data[64] = {0};
    char *path = st_file(name, header, len, data, data_bytes);
    wl_st_file f;
    assert_int_equal(wl_st_open(&f, path), -1);
    printf("  %-14s -> %s\n", name, wl_error());
    if (!strstr(wl_error(), message))
        fail_msg("%s: expected \"%s\" in \"%s\"", name, message, wl_error());
    assert_non_null(strstr(wl_error(), path)); /* names the file */
    free(path);
}

/* 8-byte aligned header text, as writers pad it. */
#define GOOD_HEADER                                                                                \
    "{\"__metadata__\":{\"format\":\"pt\"},"                                                       \
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"                           \
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}"

static void test_safetensors_good_file(void **state)
{
    (void)state;
    float a[6] = {1, 2, 3, 4, 5, 6};
    unsigned char data[32];
    memcpy(data, a, 24);
    for (int i = 0; i < 4; i++)
        wl_store(WEFT_DTYPE_BF16, data + 24, (size_t)i, (float)(i + 10));
    char *path = st_file("good.safetensors", GOOD_HEADER, 0, data, sizeof data);
    wl_st_file f;
    assert_int_equal(wl_st_open(&f, path), 0);
    assert_int_equal(f.count, 2);
    const wl_tensor *ta = wl_st_find(&f, "a"), *tb = wl_st_find(&f, "b");
    assert_non_null(ta);
    assert_non_null(tb);
    assert_null(wl_st_find(&f, "c"));
    assert_int_equal(ta->dtype, WEFT_DTYPE_F32);
    assert_int_equal(ta->ndim, 2);
    assert_int_equal(ta->shape[0], 2);
    assert_int_equal(ta->shape[1], 3);
    assert_int_equal(tb->dtype, WEFT_DTYPE_BF16);
    for (int i = 0; i < 6; i++)
        assert_true(wl_load(WEFT_DTYPE_F32, ta->data, (size_t)i) == a[i]);
    for (int i = 0; i < 4; i++)
        assert_true(wl_load(WEFT_DTYPE_BF16, tb->data, (size_t)i) == (float)(i + 10));
    wl_st_close(&f);
    free(path);
}

static void test_safetensors_hostile_files(void **state)
{
    (void)state;
    const char *t = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_refusal("zero-length", "", 0, 0, "header length 0 is not sane");
    {
        char *path = path_in(dir, "three-bytes");
        assert_int_equal(write_bytes(path, "\x05\0\0", 3), 0);
        wl_st_file f;
        assert_int_equal(wl_st_open(&f, path), -1);
        assert_non_null(strstr(wl_error(), "less than the 8-byte header length"));
        free(path);
    }
    expect_refusal("huge-length", t, 1ull << 40, 8, "not sane");
    expect_refusal("past-end", t, 4096, 8, "truncated: the header claims 4096");
    expect_refusal("not-json", "{\"a\": [1, 2", 0, 0, "not valid JSON");
    expect_refusal("not-object", "[1,2,3]", 0, 0, "not a JSON object");
    expect_refusal("truncated-data", t, 0, 4, "run past the data's 4 bytes");
    expect_refusal("offsets-past",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 0, 8,
                   "run past");
    expect_refusal("overlap",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   0, 16, "overlap");
    expect_refusal("bad-dtype", "{\"a\":{\"dtype\":\"BF17\",\"shape\":[2],\"data_offsets\":[0,4]}}",
                   0, 4, "unknown dtype \"BF17\"");
    expect_refusal("int-dtype", "{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
                   0, 8, "has dtype I64; weft-llm reads");
    expect_refusal("size-mismatch",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 16,
                   "hold 8 bytes but shape x F32 needs 12");
    expect_refusal("neg-shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}",
                   0, 0, "shape[0]");
    expect_refusal("reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}",
                   0, 8, "begin <= end");
    expect_refusal("no-offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, 8, "needs dtype");
    expect_refusal("overflow",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                   "\"data_offsets\":[0,8]}}",
                   0, 8, "overflows");
    expect_refusal("metadata", "{\"__metadata__\":{\"k\":3}}", 0, 0, "__metadata__.k");
    expect_refusal("misaligned", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}",
                   0, 8, "not aligned");
    expect_refusal("duplicate",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   0, 8, "not valid JSON");
}

/* ---- model folders -------------------------------------------------------- */

static char *tiny_model(const char *name, size_t shard_bytes)
{
    char *d = path_in(dir, name);
    wl_write_opts o = {.preset = "tiny", .seed = 7, .shard_bytes = shard_bytes};
    if (wl_write_random_model(d, &o))
        fail_msg("%s", wl_error());
    return d;
}

/* Sets key in d/config.json to v (NULL: removes it). */
static void edit_config(const char *d, const char *key, json_t *v)
{
    char *p = path_in(d, "config.json");
    json_t *c = json_load_file(p, 0, NULL);
    assert_non_null(c);
    if (v)
        json_object_set_new(c, key, v);
    else
        json_object_del(c, key);
    assert_int_equal(json_dump_file(c, p, JSON_INDENT(1)), 0);
    json_decref(c);
    free(p);
}

static void expect_model_error(const char *d, const char *message)
{
    wl_model m;
    assert_int_equal(wl_model_open(&m, d), -1);
    printf("  %s\n", wl_error());
    if (!strstr(wl_error(), message))
        fail_msg("expected \"%s\" in \"%s\"", message, wl_error());
}

/* Rewrites d/model.safetensors without the tensor named drop. */
static void drop_tensor(const char *d, const char *drop)
{
    char *p = path_in(d, "model.safetensors"), *q = path_in(d, "cut.safetensors");
    wl_st_file f;
    assert_int_equal(wl_st_open(&f, p), 0);
    wl_st_spec *specs = calloc(f.count, sizeof *specs);
    size_t n = 0;
    for (size_t i = 0; i < f.count; i++) {
        if (!strcmp(f.tensors[i].name, drop))
            continue;
        specs[n] = (wl_st_spec){
            .name = f.tensors[i].name, .dtype = f.tensors[i].dtype, .ndim = f.tensors[i].ndim};
        memcpy(specs[n].shape, f.tensors[i].shape, sizeof specs[n].shape);
        n++;
    }
    assert_int_equal(n + 1, f.count); /* it was there */
    FILE *out = fopen(q, "wb");
    assert_int_equal(wl_st_write_header(out, specs, n), 0);
    for (size_t i = 0; i < n; i++) {
        const wl_tensor *t = wl_st_find(&f, specs[i].name);
        assert_int_equal(fwrite(t->data, 1, t->nbytes, out), t->nbytes);
    }
    assert_int_equal(fclose(out), 0);
    wl_st_close(&f);
    free(specs);
    assert_int_equal(rename(q, p), 0);
    free(p);
    free(q);
}

static void test_model_folder_checks(void **state)
{
    (void)state;
    char *d = tiny_model("tiny", 0);
    wl_model m;
    assert_int_equal(wl_model_open(&m, d), 0);
    assert_int_equal(m.cfg.arch, WL_ARCH_LLAMA);
    assert_int_equal(m.cfg.hidden, 64);
    assert_int_equal(m.cfg.layers, 2);
    assert_int_equal(m.cfg.kv_heads, 2);
    assert_int_equal(m.cfg.vocab, TINY_VOCAB);
    assert_int_equal(m.dtype, WEFT_DTYPE_BF16);
    assert_int_equal(m.n_files, 1);
    /* initialised as a fresh model: norms 1, weights small and centred */
    for (int i = 0; i < 64; i++)
        assert_true(wl_load(WEFT_DTYPE_BF16, m.layer[1].mlp_norm, (size_t)i) == 1.0f);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < TINY_VOCAB * 64; i++) {
        double v = wl_load(WEFT_DTYPE_BF16, m.embed, i);
        sum += v;
        sq += v * v;
    }
    double sd = sqrt(sq / (TINY_VOCAB * 64));
    printf("  embedding: mean %.2e, sd %.4f\n", sum / (TINY_VOCAB * 64), sd);
    assert_true(fabs(sd - 0.02) < 0.001 && fabs(sum / (TINY_VOCAB * 64)) < 0.001);
    wl_model_close(&m);

    edit_config(d, "intermediate_size", json_integer(96));
    expect_model_error(d, "mlp.gate_proj.weight has shape [128, 64]; the config needs [96, 64]");
    edit_config(d, "intermediate_size", json_integer(128));
    edit_config(d, "torch_dtype", json_string("float16"));
    expect_model_error(d, "is BF16 but config.json's torch_dtype says F16");
    edit_config(d, "torch_dtype", json_string("bfloat16"));
    edit_config(d, "tie_word_embeddings", json_true());
    assert_int_equal(wl_model_open(&m, d), 0); /* lm_head present but unused: fine */
    assert_ptr_equal(m.lm_head, m.embed);
    wl_model_close(&m);
    edit_config(d, "attention_bias", json_true());
    expect_model_error(d, "self_attn.q_proj.bias is missing");
    edit_config(d, "attention_bias", json_false());

    /* the same weights without one tensor */
    drop_tensor(d, "model.layers.1.mlp.up_proj.weight");
    expect_model_error(d, "tensor model.layers.1.mlp.up_proj.weight is missing from "
                          "model.safetensors");
    char *p = path_in(d, "model.safetensors");
    assert_int_equal(unlink(p), 0);
    expect_model_error(d, "model.safetensors: No such file");
    free(p);
    free(d);
}

static char *preset_model(const char *preset, const char *name)
{
    char *d = path_in(dir, name);
    wl_write_opts o = {.preset = preset, .seed = 9};
    if (wl_write_random_model(d, &o))
        fail_msg("%s", wl_error());
    return d;
}

/* The MoE presets open with every expert bound, and a folder whose experts
 * do not match its config is refused naming the tensor: one missing, one
 * of the wrong shape, fewer than the config counts, a shared expert or its
 * gate missing or mis-sized, a layer made sparse whose experts are absent;
 * and routers past weft's (256 experts, 8 a token). */
static void test_moe_folder_checks(void **state)
{
    (void)state;
    char *d = preset_model("moe", "moe");
    wl_model m;
    assert_int_equal(wl_model_open(&m, d), 0);
    assert_int_equal(m.cfg.arch, WL_ARCH_MIXTRAL);
    assert_int_equal(m.cfg.experts, 4);
    assert_int_equal(m.cfg.experts_per_token, 2);
    assert_int_equal(m.cfg.moe_intermediate, 128);
    assert_true(m.cfg.norm_topk_prob && !m.cfg.shared_intermediate);
    for (int l = 0; l < 2; l++) {
        assert_true(m.layer[l].moe && m.layer[l].router && !m.layer[l].gate);
        for (int j = 0; j < 12; j++)
            assert_non_null(m.layer[l].expert[j]);
        assert_null(m.layer[l].experts_gu); /* packed by wl_model_upload */
    }
    assert_true(m.layer[1].expert[3 * 2 + 1] != m.layer[1].expert[3 * 2]);
    wl_model_close(&m);

    edit_config(d, "intermediate_size", json_integer(96));
    expect_model_error(d, "tensor model.layers.0.block_sparse_moe.experts.0.w1.weight has shape "
                          "[128, 64]; the config needs [96, 64]");
    edit_config(d, "intermediate_size", json_integer(128));
    edit_config(d, "num_local_experts", json_integer(5));
    expect_model_error(d, "tensor model.layers.0.block_sparse_moe.gate.weight has shape [4, 64]; "
                          "the config needs [5, 64]");
    edit_config(d, "num_local_experts", json_integer(300));
    expect_model_error(d, "300 experts, 2 per token; weft's router takes up to 256 experts and 8 "
                          "per token");
    edit_config(d, "num_local_experts", json_integer(16));
    edit_config(d, "num_experts_per_tok", json_integer(9));
    expect_model_error(d, "16 experts, 9 per token; weft's router takes");
    edit_config(d, "num_local_experts", json_integer(4));
    expect_model_error(d, "num_experts_per_tok = 9 exceeds the 4 experts");
    edit_config(d, "num_experts_per_tok", json_integer(2));
    drop_tensor(d, "model.layers.1.block_sparse_moe.experts.3.w2.weight");
    expect_model_error(d, "tensor model.layers.1.block_sparse_moe.experts.3.w2.weight is missing "
                          "from model.safetensors");
    free(d);

    d = preset_model("qwen2moe", "qwen2moe");
    assert_int_equal(wl_model_open(&m, d), 0);
    assert_int_equal(m.cfg.arch, WL_ARCH_QWEN2_MOE);
    assert_true(m.cfg.experts == 8 && m.cfg.moe_intermediate == 32 &&
                m.cfg.shared_intermediate == 64 && !m.cfg.norm_topk_prob);
    assert_true(m.layer[0].moe && !m.layer[1].moe && m.layer[2].moe); /* mlp_only_layers [1] */
    assert_non_null(m.layer[1].gate);
    assert_non_null(m.layer[2].shared_router);
    assert_non_null(m.layer[0].q_bias);
    wl_model_close(&m);
    edit_config(d, "shared_expert_intermediate_size", json_integer(48));
    expect_model_error(d, "tensor model.layers.0.mlp.shared_expert.gate_proj.weight has shape "
                          "[64, 64]; the config needs [48, 64]");
    edit_config(d, "shared_expert_intermediate_size", NULL);
    expect_model_error(d, "shared_expert_intermediate_size is missing");
    edit_config(d, "shared_expert_intermediate_size", json_integer(64));
    edit_config(d, "moe_intermediate_size", json_integer(64));
    expect_model_error(d, "tensor model.layers.0.mlp.experts.0.gate_proj.weight has shape [32, "
                          "64]; the config needs [64, 64]");
    edit_config(d, "moe_intermediate_size", json_integer(32));
    edit_config(d, "mlp_only_layers", json_array());
    expect_model_error(d, "tensor model.layers.1.mlp.gate.weight is missing");
    edit_config(d, "mlp_only_layers", json_pack("[i, i]", 1, 7)); /* 7 names no layer */
    assert_int_equal(wl_model_open(&m, d), 0);
    wl_model_close(&m);
    drop_tensor(d, "model.layers.2.mlp.shared_expert_gate.weight");
    expect_model_error(d, "tensor model.layers.2.mlp.shared_expert_gate.weight is missing");
    free(d);
}

static void test_model_shards_match_one_file(void **state)
{
    (void)state;
    char *one = tiny_model("one", 0), *many = tiny_model("many", 64 << 10);
    wl_model a, b;
    assert_int_equal(wl_model_open(&a, one), 0);
    assert_int_equal(wl_model_open(&b, many), 0);
    printf("  %zu shards\n", b.n_files);
    assert_int_equal(b.n_files, 8); /* the test below names the first */
    assert_memory_equal(a.embed, b.embed, TINY_VOCAB * 64 * 2);
    assert_memory_equal(a.layer[1].down, b.layer[1].down, 64 * 128 * 2);
    assert_memory_equal(a.lm_head, b.lm_head, TINY_VOCAB * 64 * 2);
    assert_true(memcmp(a.layer[0].q, a.layer[1].q, 64 * 64 * 2) != 0); /* tensors differ */
    wl_model_close(&a);
    wl_model_close(&b);

    /* an index that points a tensor at a file that lacks it */
    char *ip = path_in(many, "model.safetensors.index.json");
    json_t *idx = json_load_file(ip, 0, NULL);
    json_object_set_new(json_object_get(idx, "weight_map"), "model.norm.weight",
                        json_string("model-00001-of-00008.safetensors"));
    json_object_set_new(json_object_get(idx, "weight_map"), "lm_head.weight",
                        json_string("../elsewhere.safetensors"));
    assert_int_equal(json_dump_file(idx, ip, 0), 0);
    json_decref(idx);
    expect_model_error(many, "tensor model.norm.weight is missing from model-00001");
    json_t *idx2 = json_load_file(ip, 0, NULL);
    json_object_del(json_object_get(idx2, "weight_map"), "model.norm.weight");
    assert_int_equal(json_dump_file(idx2, ip, 0), 0);
    json_decref(idx2);
    expect_model_error(many, "index.json does not list it");
    free(ip);
    free(one);
    free(many);
}

/* An fp32 model computes in bf16: written as the bf16 twin's values
 * widened, it reads as fp32 and its logits are the twin's, bit for bit
 * (the tiny Llama and the Qwen2-MoE preset, whose experts are rounded
 * too). */
static void test_fp32_model_runs_as_its_bf16_twin(void **state)
{
    (void)state;
    static const char *const presets[] = {"tiny", "qwen2moe"};
    enum { PROMPT = 5, TOTAL = 8 };
    const int32_t ids[TOTAL] = {256, 296, 267, 300, 41, 7, 99, 3};
    for (int p = 0; p < 2; p++) {
        char name[32];
        snprintf(name, sizeof name, "%s16", presets[p]);
        char *d16 = path_in(dir, name);
        snprintf(name, sizeof name, "%s32", presets[p]);
        char *d32 = path_in(dir, name);
        wl_write_opts o = {.preset = presets[p], .seed = 11};
        assert_int_equal(wl_write_random_model(d16, &o), 0);
        o.fp32 = 1;
        assert_int_equal(wl_write_random_model(d32, &o), 0);
        wl_model a, b;
        assert_int_equal(wl_model_open(&a, d16), 0);
        assert_int_equal(wl_model_open(&b, d32), 0);
        assert_int_equal(b.dtype, WEFT_DTYPE_F32);
        assert_int_equal(b.cfg.dtype, WEFT_DTYPE_F32); /* torch_dtype "float32" */
        for (int i = 0; i < 64 * 64; i++)
            assert_true(wl_load(WEFT_DTYPE_BF16, a.layer[0].q, (size_t)i) ==
                        wl_load(WEFT_DTYPE_F32, b.layer[0].q, (size_t)i));
        wl_model_close(&a);
        wl_model_close(&b);
        int V = p ? 0 : TINY_VOCAB;
        if (!V) { /* the preset's vocabulary, from its config */
            wl_model m;
            assert_int_equal(wl_model_open(&m, d16), 0);
            V = m.cfg.vocab;
            wl_model_close(&m);
        }
        size_t n = (size_t)(TOTAL - PROMPT + 1) * V;
        float *l16 = malloc(n * 4), *l32 = malloc(n * 4);
        char msg[512];
        assert_true(l16 && l32);
        if (run_forward(WEFT_BACKEND_HOST, d16, ids, PROMPT, TOTAL, l16, msg) ||
            run_forward(WEFT_BACKEND_HOST, d32, ids, PROMPT, TOTAL, l32, msg))
            fail_msg("%s: %s", presets[p], msg);
        assert_memory_equal(l16, l32, n * 4);
        printf("  %s: fp32 and bf16 give the same %zu logits\n", presets[p], n);
        free(l16), free(l32), free(d16), free(d32);
    }
}

static void test_config_fields_and_errors(void **state)
{
    (void)state;
    char *d = path_in(dir, "big");
    wl_write_opts o = {.preset = "1b", .seed = 1, .config_only = 1};
    assert_int_equal(wl_write_random_model(d, &o), 0);
    char *cp = path_in(d, "config.json");
    wl_config c;
    assert_int_equal(wl_config_load(&c, cp), 0);
    assert_int_equal(c.hidden, 2048);
    assert_int_equal(c.layers, 16);
    assert_int_equal(c.heads, 32);
    assert_int_equal(c.kv_heads, 8);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.vocab, 128256);
    assert_true(c.tie_embeddings);
    assert_true(c.rope_llama3);
    assert_true(c.rope_factor == 32.0 && c.rope_low_freq == 1.0 && c.rope_high_freq == 4.0);
    assert_int_equal(c.rope_original_max, 8192);
    assert_true(c.rope_theta == 500000.0);
    assert_int_equal(c.bos_id, 128000);
    expect_model_error(d, "model.safetensors: No such file"); /* config only */

    /* Mistral, Qwen2, Qwen3 and MoE fields */
    edit_config(d, "model_type", json_string("mistral"));
    edit_config(d, "sliding_window", json_integer(4096));
    assert_int_equal(wl_config_load(&c, cp), 0);
    assert_int_equal(c.sliding_window, 4096);
    edit_config(d, "model_type", json_string("qwen2"));
    assert_int_equal(wl_config_load(&c, cp), 0);
    assert_true(c.attention_bias && !c.qk_norm);
    assert_int_equal(c.sliding_window, 0); /* use_sliding_window is false by default */
    edit_config(d, "model_type", json_string("qwen3"));
    assert_int_equal(wl_config_load(&c, cp), 0);
    assert_true(!c.attention_bias && c.qk_norm);
    edit_config(d, "model_type", json_string("qwen3_moe"));
    expect_model_error(d, "num_experts is missing");
    edit_config(d, "num_experts", json_integer(128));
    edit_config(d, "num_experts_per_tok", json_integer(8));
    edit_config(d, "moe_intermediate_size", json_integer(768));
    assert_int_equal(wl_config_load(&c, cp), 0);
    assert_int_equal(c.experts, 128);
    assert_int_equal(c.moe_intermediate, 768);
    assert_true(!c.norm_topk_prob && !c.shared_intermediate && c.sparse_step == 1);
    for (int l = 0; l < 16; l++)
        assert_true(wl_config_layer_moe(&c, l));
    expect_model_error(d, "model.safetensors: No such file"); /* run, once it has weights */
    /* Qwen's dense layers: mlp_only_layers, and decoder_sparse_step */
    edit_config(d, "norm_topk_prob", json_true());
    edit_config(d, "mlp_only_layers", json_pack("[i, i, i]", 0, 5, 100));
    edit_config(d, "decoder_sparse_step", json_integer(2));
    assert_int_equal(wl_config_load(&c, cp), 0);
    assert_true(c.norm_topk_prob);
    for (int l = 0; l < 16; l++)
        assert_int_equal(wl_config_layer_moe(&c, l), l != 5 && l % 2 == 1);
    edit_config(d, "decoder_sparse_step", json_integer(0));
    expect_model_error(d, "decoder_sparse_step = 0 is out of range");
    edit_config(d, "decoder_sparse_step", json_integer(1));
    edit_config(d, "mlp_only_layers", json_string("0"));
    expect_model_error(d, "mlp_only_layers is not a list");
    edit_config(d, "mlp_only_layers", json_pack("[i]", -1));
    expect_model_error(d, "mlp_only_layers[0] is not a layer index");
    edit_config(d, "mlp_only_layers", NULL);
    edit_config(d, "norm_topk_prob", json_integer(1));
    expect_model_error(d, "norm_topk_prob is not true or false");
    edit_config(d, "norm_topk_prob", NULL);
    edit_config(d, "num_experts_per_tok", json_integer(200));
    expect_model_error(d, "num_experts_per_tok = 200 exceeds the 128 experts");
    edit_config(d, "num_experts_per_tok", json_integer(8));
    edit_config(d, "model_type", json_string("qwen2_moe"));
    expect_model_error(d, "shared_expert_intermediate_size is missing");
    edit_config(d, "model_type", json_string("llama"));

    /* the checks, each by its message */
    edit_config(d, "num_key_value_heads", json_integer(5));
    expect_model_error(d, "not a multiple of num_key_value_heads = 5");
    edit_config(d, "num_key_value_heads", json_integer(8));
    edit_config(d, "head_dim", json_integer(63));
    expect_model_error(d, "head_dim = 63 must be even");
    edit_config(d, "head_dim", json_integer(64));
    edit_config(d, "hidden_size", NULL);
    expect_model_error(d, "hidden_size is missing");
    edit_config(d, "hidden_size", json_string("2048"));
    expect_model_error(d, "hidden_size is not an integer");
    edit_config(d, "hidden_size", json_integer(2048));
    edit_config(d, "rms_norm_eps", json_real(-1));
    expect_model_error(d, "rms_norm_eps = -1 must be positive");
    edit_config(d, "rms_norm_eps", json_real(1e-5));
    edit_config(d, "rope_scaling", json_pack("{s:s}", "rope_type", "yarn"));
    expect_model_error(d, "rope_scaling type \"yarn\" is not supported");
    edit_config(d, "rope_scaling", json_pack("{s:s, s:f}", "rope_type", "llama3", "factor", 8.0));
    expect_model_error(d, "low_freq_factor");
    edit_config(d, "rope_scaling", json_null());
    edit_config(d, "eos_token_id", json_integer(999999));
    expect_model_error(d, "eos_token_id 999999 is outside the vocabulary");
    edit_config(d, "eos_token_id", json_pack("[i, i]", 128001, 128009));
    assert_int_equal(wl_config_load(&c, cp), 0);
    assert_int_equal(c.n_eos, 2);
    edit_config(d, "torch_dtype", json_string("int8"));
    expect_model_error(d, "torch_dtype \"int8\"");
    edit_config(d, "model_type", json_string("gpt2"));
    expect_model_error(d, "model_type \"gpt2\" is not one weft-llm knows");
    char *bad = path_in(d, "config.json");
    assert_int_equal(write_bytes(bad, "{\"model_type\": ", 15), 0);
    expect_model_error(d, "config.json");
    free(bad);
    free(cp);
    free(d);

    wl_write_opts bad_preset = {.preset = "70b"};
    char *bad_dir = path_in(dir, "70b");
    assert_int_equal(wl_write_random_model(bad_dir, &bad_preset), -1);
    assert_non_null(strstr(wl_error(), "unknown preset \"70b\""));
    free(bad_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_good_file),
        cmocka_unit_test(test_safetensors_hostile_files),
        cmocka_unit_test(test_model_folder_checks),
        cmocka_unit_test(test_model_shards_match_one_file),
        cmocka_unit_test(test_moe_folder_checks),
        cmocka_unit_test(test_fp32_model_runs_as_its_bf16_twin),
        cmocka_unit_test(test_config_fields_and_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
