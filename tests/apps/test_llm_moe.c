/*
 * test_llm_moe.c - weft-llm's mixture-of-experts models on the host
 * backend: the forward pass of Mixtral, Qwen2-MoE (its shared expert and
 * sigmoid gate, no renormalisation, a dense layer among the sparse) and
 * Qwen3-MoE (renormalised, per-head norms, decoder_sparse_step) shapes
 * against the float64 reference of llm_ref.h, each with a mistake the
 * comparison must see (the experts' blocks packed one off, the
 * renormalisation flipped, the shared expert ungated); the random-model
 * presets moe and qwen2moe against it too; a sequence of a model whose
 * experts were never packed refused; and generate on them end to end.
 * Weights are drawn from the printed seed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sys/stat.h>

#include <jansson.h>

#include "llm_test.h"
#include "llm_ref.h"

static char *dir, *tiny_dir;
static uint64_t seed;

static int setup(void **state)
{
    (void)state;
    seed = test_seed();
    dir = scratch_dir();
    if (!dir)
        return -1;
    tiny_dir = path_in(dir, "tiny");
    wl_write_opts o = {.preset = "tiny", .seed = seed};
    if (wl_write_random_model(tiny_dir, &o)) {
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
    free(tiny_dir);
    return 0;
}

/* ---- MoE models written here ------------------------------------------------ */

/* A mixture-of-experts copy of the tiny model (hidden 64, 2 layers, MLP
 * 128): its attention and, in dense layers, its MLP kept; the MoE layers'
 * MLPs replaced by a router and experts (and Qwen2-MoE's shared expert),
 * drawn here, with Qwen2's q/k/v biases or Qwen3's q/k norms added. */
typedef struct moe_spec {
    const char *name, *model_type;
    int experts, k, moe_i, shared_i, norm_topk, sparse_step;
    int dense_mask; /* mlp_only_layers, as bits */
    /* the standard deviations of the router's, the experts' and the shared
     * expert's weights */
    double router_sd, expert_sd, shared_sd;
} moe_spec;

enum { COPY, NORMAL, NORM };

typedef struct tensor_list {
    wl_st_spec s[512];
    char names[512][96];
    int fill[512];
    double sd[512];
    size_t n;
} tensor_list;

static void add(tensor_list *l, int fill, double sd, uint64_t rows, uint64_t cols, const char *fmt,
                ...) __attribute__((format(printf, 6, 7)));
static void add(tensor_list *l, int fill, double sd, uint64_t rows, uint64_t cols, const char *fmt,
                ...)
{
    assert_true(l->n < 512);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->names[l->n], sizeof l->names[0], fmt, ap);
    va_end(ap);
    l->s[l->n] = (wl_st_spec){l->names[l->n], WEFT_DTYPE_BF16, cols ? 2 : 1, {rows, cols}};
    l->fill[l->n] = fill;
    l->sd[l->n++] = sd;
}

static int layer_moe(const moe_spec *sp, int l)
{
    return !(sp->dense_mask >> l & 1) && (l + 1) % sp->sparse_step == 0;
}

/* The router's weights are drawn wide, so that the softmax is far from
 * uniform and which experts win, and by how much, shows in the logits; the
 * experts' so that their sum is about as large as the rest of the residual
 * stream (were it much larger, the final norm would hide a mistake that
 * scales it). */
static void list_moe(const moe_spec *sp, int l, tensor_list *t)
{
    int mixtral = !strcmp(sp->model_type, "mixtral");
    const char *pre = mixtral ? "block_sparse_moe" : "mlp";
    const char *gate = mixtral ? "w1" : "gate_proj", *up = mixtral ? "w3" : "up_proj";
    const char *down = mixtral ? "w2" : "down_proj";
    uint64_t I = (uint64_t)sp->moe_i, S = (uint64_t)sp->shared_i;
    add(t, NORMAL, sp->router_sd, (uint64_t)sp->experts, 64, "model.layers.%d.%s.gate.weight", l,
        pre);
    for (int e = 0; e < sp->experts; e++) {
        add(t, NORMAL, sp->expert_sd, I, 64, "model.layers.%d.%s.experts.%d.%s.weight", l, pre, e,
            gate);
        add(t, NORMAL, sp->expert_sd, I, 64, "model.layers.%d.%s.experts.%d.%s.weight", l, pre, e,
            up);
        add(t, NORMAL, sp->expert_sd, 64, I, "model.layers.%d.%s.experts.%d.%s.weight", l, pre, e,
            down);
    }
    if (!S)
        return;
    add(t, NORMAL, sp->shared_sd, S, 64, "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
    add(t, NORMAL, sp->shared_sd, S, 64, "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
    add(t, NORMAL, sp->shared_sd, 64, S, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
    add(t, NORMAL, 0.1, 1, 64, "model.layers.%d.mlp.shared_expert_gate.weight", l);
}

static char *make_moe(const moe_spec *sp)
{
    char *dst = path_in(dir, sp->name), *src_cfg = path_in(tiny_dir, "config.json");
    char *dst_cfg = path_in(dst, "config.json"), *src = path_in(tiny_dir, "model.safetensors");
    char *out_path = path_in(dst, "model.safetensors");
    int mixtral = !strcmp(sp->model_type, "mixtral"), qwen2 = !strcmp(sp->model_type, "qwen2_moe");
    int qwen3 = !strcmp(sp->model_type, "qwen3_moe");
    assert_int_equal(mkdir(dst, 0777), 0);
    json_t *cfg = json_load_file(src_cfg, 0, NULL), *dense = json_array();
    json_object_set_new(cfg, "model_type", json_string(sp->model_type));
    json_object_set_new(cfg, mixtral ? "num_local_experts" : "num_experts",
                        json_integer(sp->experts));
    json_object_set_new(cfg, "num_experts_per_tok", json_integer(sp->k));
    if (!mixtral) {
        for (int l = 0; l < 2; l++)
            if (sp->dense_mask >> l & 1)
                json_array_append_new(dense, json_integer(l));
        json_t *extra = json_pack("{s:i, s:b, s:i, s:O}", "moe_intermediate_size", sp->moe_i,
                                  "norm_topk_prob", sp->norm_topk, "decoder_sparse_step",
                                  sp->sparse_step, "mlp_only_layers", dense);
        json_object_update(cfg, extra);
        json_decref(extra);
    }
    json_decref(dense);
    if (qwen2)
        json_object_set_new(cfg, "shared_expert_intermediate_size", json_integer(sp->shared_i));
    assert_int_equal(json_dump_file(cfg, dst_cfg, JSON_INDENT(1)), 0);
    json_decref(cfg);

    wl_st_file f;
    assert_int_equal(wl_st_open(&f, src), 0);
    tensor_list *t = calloc(1, sizeof *t);
    for (size_t i = 0; i < f.count; i++) {
        int l = -1;
        if (sscanf(f.tensors[i].name, "model.layers.%d.mlp.", &l) == 1 &&
            strstr(f.tensors[i].name, ".mlp.") && layer_moe(sp, l))
            continue; /* the dense MLP this layer no longer has */
        add(t, COPY, 0, f.tensors[i].shape[0], f.tensors[i].ndim == 2 ? f.tensors[i].shape[1] : 0,
            "%s", f.tensors[i].name);
    }
    for (int l = 0; l < 2; l++) {
        if (qwen2) {
            add(t, NORMAL, 0.5, 256, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            add(t, NORMAL, 0.5, 128, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            add(t, NORMAL, 0.5, 128, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (qwen3) {
            add(t, NORM, 0, 64, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            add(t, NORM, 0, 64, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        if (layer_moe(sp, l))
            list_moe(sp, l, t);
    }
    FILE *out = fopen(out_path, "wb");
    assert_int_equal(wl_st_write_header(out, t->s, t->n), 0);
    uint64_t st = seed ^ 0x30e;
    for (size_t i = 0; i < t->n; i++) {
        uint16_t v;
        if (t->fill[i] == COPY) {
            const wl_tensor *src_t = wl_st_find(&f, t->s[i].name);
            assert_int_equal(fwrite(src_t->data, 1, src_t->nbytes, out), src_t->nbytes);
            continue;
        }
        uint64_t count = t->s[i].shape[0] * (t->s[i].ndim == 2 ? t->s[i].shape[1] : 1);
        for (uint64_t j = 0; j < count; j++) {
            double x = wl_rand_normal(&st);
            wl_store(WEFT_DTYPE_BF16, &v, 0,
                     (float)(t->fill[i] == NORM ? 1 + 0.3 * x : t->sd[i] * x));
            assert_int_equal(fwrite(&v, 2, 1, out), 1);
        }
    }
    assert_int_equal(fclose(out), 0);
    wl_st_close(&f);
    free(t);
    free(src_cfg);
    free(dst_cfg);
    free(src);
    free(out_path);
    return dst;
}

static const moe_spec mixtral = {"mixtral", "mixtral", 8, 2, 128, 0, 1, 1, 0, 0.1, 0.05, 0};
/* 16 experts, 4 a token, not renormalised; layer 1 dense (mlp_only_layers) */
static const moe_spec qwen2_moe = {"qwen2-moe", "qwen2_moe", 16,     4,   32,  64,
                                   0,           1,           1 << 1, 0.1, 0.1, 0.08};
/* renormalised; decoder_sparse_step 2 makes layer 0 dense */
static const moe_spec qwen3_moe = {"qwen3-moe", "qwen3_moe", 8, 3, 48, 0, 1, 2, 0, 0.1, 0.08, 0};

/* ---- the forward pass ------------------------------------------------------- */

static void test_mixtral_matches_float64_reference(void **state)
{
    (void)state;
    char *d = make_moe(&mixtral);
    wl_model m;
    assert_int_equal(wl_model_open(&m, d), 0);
    assert_true(m.layer[0].moe && m.layer[1].moe && !m.layer[0].gate);
    wl_model_close(&m);
    check_forward(d, ALT_NONE, seed);
    check_forward(d, ALT_EXPERT_SHIFTED, seed);
    check_forward(d, ALT_RENORM_FLIPPED, seed);
    free(d);
}

static void test_qwen2_moe_matches_float64_reference(void **state)
{
    (void)state;
    char *d = make_moe(&qwen2_moe);
    wl_model m;
    assert_int_equal(wl_model_open(&m, d), 0);
    assert_true(m.layer[0].moe && !m.layer[1].moe && m.layer[1].gate);
    assert_true(m.cfg.shared_intermediate == 64 && !m.cfg.norm_topk_prob);
    wl_model_close(&m);
    check_forward(d, ALT_SHARED_UNGATED, seed);
    check_forward(d, ALT_RENORM_FLIPPED, seed);
    check_forward(d, ALT_EXPERT_SHIFTED, seed);
    free(d);
}

static void test_qwen3_moe_matches_float64_reference(void **state)
{
    (void)state;
    char *d = make_moe(&qwen3_moe);
    wl_model m;
    assert_int_equal(wl_model_open(&m, d), 0);
    assert_true(!m.layer[0].moe && m.layer[1].moe && m.cfg.norm_topk_prob);
    wl_model_close(&m);
    check_forward(d, ALT_RENORM_FLIPPED, seed);
    check_forward(d, ALT_EXPERT_SHIFTED, seed);
    free(d);
}

/* The random-model presets: a tiny Mixtral, and a tiny Qwen2-MoE of 3
 * layers whose middle one is dense. */
static void test_presets_match_float64_reference(void **state)
{
    (void)state;
    static const char *const presets[] = {"moe", "qwen2moe"};
    for (int i = 0; i < 2; i++) {
        char *d = path_in(dir, presets[i]);
        wl_write_opts o = {.preset = presets[i], .seed = seed};
        if (wl_write_random_model(d, &o))
            fail_msg("%s", wl_error());
        check_forward(d, ALT_NONE, seed);
        free(d);
    }
}

/* A sequence of a MoE model whose weights were not uploaded (the experts
 * not packed) is refused at its creation, saying so. */
typedef struct unpacked_job {
    wl_model *m;
    int rc;
    char message[512];
} unpacked_job;

static void *unpacked_task(void *arg)
{
    unpacked_job *j = arg;
    wl_kv kv = {0};
    wl_seq *s = NULL;
    j->rc = wl_kv_create(&kv, j->m, 4, 16);
    if (!j->rc)
        j->rc = wl_seq_create(&s, j->m, &kv, 16, 16);
    snprintf(j->message, sizeof j->message, "%s", wl_error());
    wl_seq_destroy(s);
    wl_kv_destroy(&kv);
    return NULL;
}

static void test_experts_must_be_packed(void **state)
{
    (void)state;
    char *d = path_in(dir, "unpacked");
    wl_write_opts o = {.preset = "moe", .seed = seed};
    assert_int_equal(wl_write_random_model(d, &o), 0);
    wl_model m;
    assert_int_equal(wl_model_open(&m, d), 0);
    unpacked_job j = {&m, 0, ""};
    weft_runtime *rt;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = 1;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.stack_size = 1 << 20;
    weft_task *t;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &t, unpacked_task, &j, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    printf("  %s\n", j.message);
    assert_int_equal(j.rc, -1);
    assert_non_null(strstr(j.message, "layer 0's experts are not packed"));
    wl_model_close(&m);
    free(d);
}

/* ---- the command line ------------------------------------------------------- */

static char *run_ok(const char *cmd, char **err)
{
    char *out = NULL;
    int rc = run_capture(cmd, &out, err);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", cmd, rc, *err);
    return out;
}

/* generate on each MoE preset: greedy twice gives one text, each step's
 * token its top logit; --parallel 3 gives each copy the single run's
 * tokens (batched decode through the experts). */
static void test_cli_generates_with_experts(void **state)
{
    (void)state;
    static const char *const presets[] = {"moe", "qwen2moe"};
    for (int i = 0; i < 2; i++) {
        char cmd[2048], *e1, *e2, *en, *d = path_in(dir, presets[i]);
        snprintf(cmd, sizeof cmd, "%s random-model %s-cli --preset %s --seed 5", WL_BIN, d,
                 presets[i]);
        char *w = run_ok(cmd, &e1);
        free(w);
        free(e1);
        snprintf(cmd, sizeof cmd,
                 "%s generate %s-cli --prompt 'The old woman' --max-tokens 12 --print-ids "
                 "--print-top --backend host",
                 WL_BIN, d);
        char *a = run_ok(cmd, &e1), *b = run_ok(cmd, &e2);
        printf("  %s: %s  %s", presets[i], a, e1);
        assert_string_equal(a, b);
        assert_string_equal(e1, e2);
        const char *gen = strstr(e1, "generated ids: ");
        assert_non_null(gen);
        char step0[64], want[512];
        snprintf(step0, sizeof step0, "step 0: token %d (top %d)", atoi(gen + 15), atoi(gen + 15));
        assert_non_null(strstr(e1, step0));
        snprintf(want, sizeof want, "%.*s", (int)strcspn(gen, "\n"), gen);
        snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " --parallel 3");
        char *many = run_ok(cmd, &en);
        const char *at = en;
        for (int q = 0; q < 3; q++) {
            at = strstr(at, want);
            if (!at)
                fail_msg("copy %d of --parallel 3 does not continue as alone:\n%s", q, en);
            at += strlen(want);
        }
        free(a);
        free(b);
        free(many);
        free(e1);
        free(e2);
        free(en);
        free(d);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixtral_matches_float64_reference),
        cmocka_unit_test(test_qwen2_moe_matches_float64_reference),
        cmocka_unit_test(test_qwen3_moe_matches_float64_reference),
        cmocka_unit_test(test_presets_match_float64_reference),
        cmocka_unit_test(test_experts_must_be_packed),
        cmocka_unit_test(test_cli_generates_with_experts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
