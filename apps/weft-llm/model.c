/*
 * model.c - a model folder in the Hugging Face layout: config.json and
 * the weights, in model.safetensors or in shards that
 * model.safetensors.index.json lists.
 *
 * Every weight the forward pass reads is found by its transformers name
 * and checked against the configuration: its shape, and its dtype, which
 * is one for the whole model (weft's ops take one dtype per call) and
 * torch_dtype's when the config names one. The pointers stay inside the
 * files' read-only mappings, so opening a model reads only the headers.
 *
 * Mixture-of-experts layers (Mixtral's block_sparse_moe, Qwen2-MoE's and
 * Qwen3-MoE's mlp with its experts, Qwen2-MoE's shared expert) bind every
 * expert's tensors one by one; packing them into the [E][...] blocks the
 * grouped matmul reads waits for wl_model_upload (moe.c), so that opening
 * a model (`weft-llm check`) still reads only the headers.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "llm.h"

typedef struct binder {
    wl_model *m;
    json_t *weight_map; /* from the index, or NULL for one file */
    int dtype_set;
    size_t scales_used; /* of the model's scale block */
} binder;

static int open_file(wl_model *m, const char *dir, const char *name, size_t *idx)
{
    char path[PATH_MAX];
    for (size_t i = 0; i < m->n_files; i++) {
        const char *p = strrchr(m->files[i].path, '/');
        if (!strcmp(p ? p + 1 : m->files[i].path, name)) {
            *idx = i;
            return 0;
        }
    }
    if (strchr(name, '/') || !strcmp(name, "..") || !strcmp(name, "."))
        return wl_fail("%s: the index names file \"%s\", which is not a file in the folder", dir,
                       name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    wl_st_file *grown = realloc(m->files, (m->n_files + 1) * sizeof *grown);
    if (!grown)
        return wl_fail("out of memory");
    m->files = grown;
    if (wl_st_open(&m->files[m->n_files], path))
        return -1;
    *idx = m->n_files++;
    return 0;
}

/* The tensor name in whichever file holds it. */
static int find(binder *b, const char *dir, const char *name, const wl_tensor **out)
{
    wl_model *m = b->m;
    const wl_tensor *t = NULL;
    const char *where = "model.safetensors";
    if (b->weight_map) {
        json_t *f = json_object_get(b->weight_map, name);
        if (!json_is_string(f))
            return wl_fail("%s: tensor %s is missing (model.safetensors.index.json does not "
                           "list it)",
                           dir, name);
        size_t idx;
        where = json_string_value(f);
        if (open_file(m, dir, where, &idx))
            return -1;
        t = wl_st_find(&m->files[idx], name);
    } else {
        t = wl_st_find(&m->files[0], name);
    }
    if (!t)
        return wl_fail("%s: tensor %s is missing from %s", dir, name, where);
    *out = t;
    return 0;
}

/* Whether t has the shape (rows, cols; cols 0 for a vector), an error
 * saying what it has when not. */
static int check_shape(const char *dir, const wl_tensor *t, uint64_t rows, uint64_t cols)
{
    const char *name = t->name;
    int ok = cols ? t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols
                  : t->ndim == 1 && t->shape[0] == rows;
    if (!ok) {
        char got[128] = "";
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "",
                     (unsigned long long)t->shape[i]);
        if (cols)
            return wl_fail("%s: tensor %s has shape [%s]; the config needs [%llu, %llu]", dir, name,
                           got, (unsigned long long)rows, (unsigned long long)cols);
        return wl_fail("%s: tensor %s has shape [%s]; the config needs [%llu]", dir, name, got,
                       (unsigned long long)rows);
    }
    return 0;
}

/* The tensor name, checked to have the shape (rows, cols; cols 0 for a
 * vector) and the model's dtype. */
static int bind(binder *b, const char *dir, const char *name, uint64_t rows, uint64_t cols,
                const void **out)
{
    wl_model *m = b->m;
    const wl_tensor *t;
    if (find(b, dir, name, &t) || check_shape(dir, t, rows, cols))
        return -1;
    if (t->dtype == WEFT_DTYPE_F8_E4M3)
        return wl_fail("%s: tensor %s is F8_E4M3; only the layers' projections may be, in a "
                       "model whose config.json has a quantization_config that says so",
                       dir, name);
    if (!b->dtype_set) {
        m->dtype = t->dtype;
        b->dtype_set = 1;
        if (m->cfg.has_dtype && m->cfg.dtype != t->dtype)
            return wl_fail("%s: tensor %s is %s but config.json's torch_dtype says %s", dir, name,
                           wl_dtype_name(t->dtype), wl_dtype_name(m->cfg.dtype));
    } else if (t->dtype != m->dtype) {
        return wl_fail("%s: tensor %s is %s but the other weights are %s (one dtype per model)",
                       dir, name, wl_dtype_name(t->dtype), wl_dtype_name(m->dtype));
    }
    *out = t->data;
    return 0;
}

/* A projection's weight name: E4M3 with the rows x cols shape, and its
 * weight_scale (fp32, bf16 or fp16; [rows, 1] or [rows] a channel each,
 * or one for the tensor) read into the next rows floats of the model's
 * scale block. */
static int bind_fp8(binder *b, const char *dir, const char *name, uint64_t rows, uint64_t cols,
                    const void **out, const float **scale)
{
    const wl_tensor *t, *st;
    char sname[192];
    if (find(b, dir, name, &t) || check_shape(dir, t, rows, cols))
        return -1;
    if (t->dtype != WEFT_DTYPE_F8_E4M3)
        return wl_fail("%s: tensor %s is %s; the config's quantization makes it F8_E4M3", dir, name,
                       wl_dtype_name(t->dtype));
    snprintf(sname, sizeof sname, "%s_scale", name);
    if (find(b, dir, sname, &st))
        return -1;
    uint64_t n = 1;
    for (int i = 0; i < st->ndim; i++)
        n *= st->shape[i];
    int tensor = b->m->cfg.fp8_tensor_scale;
    if (n != (tensor ? 1 : rows) || (st->dtype != WEFT_DTYPE_F32 && st->dtype != WEFT_DTYPE_BF16 &&
                                     st->dtype != WEFT_DTYPE_F16))
        return wl_fail("%s: tensor %s is %s of %llu elements; FP8 weights of %llu rows need %s "
                       "in fp32, bf16 or fp16",
                       dir, sname, wl_dtype_name(st->dtype), (unsigned long long)n,
                       (unsigned long long)rows, tensor ? "one scale" : "a scale a row");
    float *to = b->m->scale_block + b->scales_used;
    for (uint64_t r = 0; r < rows; r++) {
        to[r] = wl_load(st->dtype, st->data, tensor ? 0 : r);
        if (!(to[r] > 0) || !isfinite(to[r]))
            return wl_fail("%s: tensor %s holds %g; a scale must be positive and finite", dir,
                           sname, to[r]);
    }
    b->scales_used += rows;
    *out = t->data;
    *scale = to;
    return 0;
}

/* A mixture-of-experts MLP: the router, each expert's three matrices,
 * Qwen2-MoE's shared expert and its gate. */
static int bind_moe(binder *b, const char *dir, int i)
{
    const wl_config *c = &b->m->cfg;
    wl_layer *L = &b->m->layer[i];
    uint64_t H = (uint64_t)c->hidden, E = (uint64_t)c->experts, I = (uint64_t)c->moe_intermediate;
    uint64_t S = (uint64_t)c->shared_intermediate;
    int mixtral = c->arch == WL_ARCH_MIXTRAL;
    const char *moe = mixtral ? "block_sparse_moe" : "mlp";
    static const char *const names[2][3] = {{"gate_proj", "up_proj", "down_proj"},
                                            {"w1", "w3", "w2"}};
    char n[192];
    snprintf(n, sizeof n, "model.layers.%d.%s.gate.weight", i, moe);
    if (bind(b, dir, n, E, H, &L->router))
        return -1;
    for (int e = 0; e < c->experts; e++)
        for (int j = 0; j < 3; j++) {
            snprintf(n, sizeof n, "model.layers.%d.%s.experts.%d.%s.weight", i, moe, e,
                     names[mixtral][j]);
            if (bind(b, dir, n, j < 2 ? I : H, j < 2 ? H : I, &L->expert[3 * e + j]))
                return -1;
        }
    if (!S)
        return 0;
#define BIND(suffix, rows, cols, field)                                                            \
    (snprintf(n, sizeof n, "model.layers.%d.mlp.%s", i, suffix), bind(b, dir, n, rows, cols, field))
    if (BIND("shared_expert.gate_proj.weight", S, H, &L->shared_gate) ||
        BIND("shared_expert.up_proj.weight", S, H, &L->shared_up) ||
        BIND("shared_expert.down_proj.weight", H, S, &L->shared_down) ||
        BIND("shared_expert_gate.weight", 1, H, &L->shared_router))
        return -1;
#undef BIND
    return 0;
}

static int bind_layer(binder *b, const char *dir, int i)
{
    const wl_config *c = &b->m->cfg;
    wl_layer *L = &b->m->layer[i];
    uint64_t H = (uint64_t)c->hidden, q = (uint64_t)c->heads * c->head_dim;
    uint64_t kv = (uint64_t)c->kv_heads * c->head_dim, I = (uint64_t)c->intermediate;
    char n[160];
#define BIND(suffix, rows, cols, field)                                                            \
    (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), bind(b, dir, n, rows, cols, field))
    /* a projection: in the model's dtype, or FP8 with its scales */
#define PROJ(suffix, rows, cols, field, scale)                                                     \
    (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix),                                       \
     c->fp8 ? bind_fp8(b, dir, n, rows, cols, field, scale) : bind(b, dir, n, rows, cols, field))
    if (BIND("input_layernorm.weight", H, 0, &L->attn_norm) ||
        PROJ("self_attn.q_proj.weight", q, H, &L->q, &L->q_scale) ||
        PROJ("self_attn.k_proj.weight", kv, H, &L->k, &L->k_scale) ||
        PROJ("self_attn.v_proj.weight", kv, H, &L->v, &L->v_scale) ||
        PROJ("self_attn.o_proj.weight", H, q, &L->o, &L->o_scale) ||
        BIND("post_attention_layernorm.weight", H, 0, &L->mlp_norm))
        return -1;
    L->moe = wl_config_layer_moe(c, i);
    if (L->moe) {
        L->expert = b->m->expert_ptrs + (size_t)i * 3 * c->experts;
        if (bind_moe(b, dir, i))
            return -1;
    } else if (PROJ("mlp.gate_proj.weight", I, H, &L->gate, &L->gate_scale) ||
               PROJ("mlp.up_proj.weight", I, H, &L->up, &L->up_scale) ||
               PROJ("mlp.down_proj.weight", H, I, &L->down, &L->down_scale)) {
        return -1;
    }
#undef PROJ
    if (c->attention_bias && (BIND("self_attn.q_proj.bias", q, 0, &L->q_bias) ||
                              BIND("self_attn.k_proj.bias", kv, 0, &L->k_bias) ||
                              BIND("self_attn.v_proj.bias", kv, 0, &L->v_bias)))
        return -1;
    if (c->qk_norm && (BIND("self_attn.q_norm.weight", (uint64_t)c->head_dim, 0, &L->q_norm) ||
                       BIND("self_attn.k_norm.weight", (uint64_t)c->head_dim, 0, &L->k_norm)))
        return -1;
#undef BIND
    return 0;
}

static int load_index(const char *dir, json_t **root, json_t **map)
{
    char path[PATH_MAX];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK))
        return 0;
    if (!(*root = json_load_file(path, 0, &jerr)))
        return wl_fail("%s: %s (line %d)", path, jerr.text, jerr.line);
    *map = json_object_get(*root, "weight_map");
    if (!json_is_object(*map))
        return wl_fail("%s: weight_map is missing or not an object", path);
    return 0;
}

int wl_model_open(wl_model *m, const char *dir)
{
    char path[PATH_MAX];
    json_t *index = NULL;
    binder b = {.m = m};
    memset(m, 0, sizeof *m);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (wl_config_load(&m->cfg, path))
        return -1;
    const wl_config *c = &m->cfg;
    if (c->experts > WL_MAX_EXPERTS || c->experts_per_token > WL_MAX_EXPERTS_PER_TOKEN)
        return wl_fail("%s: %s has %d experts, %d per token; weft's router takes up to %d "
                       "experts and %d per token",
                       dir, c->model_type, c->experts, c->experts_per_token, WL_MAX_EXPERTS,
                       WL_MAX_EXPERTS_PER_TOKEN);
    if (load_index(dir, &index, &b.weight_map))
        goto fail;
    if (!b.weight_map) {
        size_t idx;
        if (open_file(m, dir, "model.safetensors", &idx))
            goto fail;
    }
    size_t per_layer = (size_t)(c->heads + 2 * c->kv_heads) * c->head_dim + 2 * (size_t)c->hidden +
                       2 * (size_t)c->intermediate;
    if (c->fp8 && !(m->scale_block = malloc((size_t)c->layers * per_layer * sizeof(float)))) {
        wl_fail("out of memory");
        goto fail;
    }
    if (!(m->layer = calloc((size_t)c->layers, sizeof *m->layer)) ||
        (c->experts &&
         !(m->expert_ptrs = calloc((size_t)c->layers * 3 * c->experts, sizeof *m->expert_ptrs)))) {
        wl_fail("out of memory");
        goto fail;
    }
    uint64_t V = (uint64_t)c->vocab, H = (uint64_t)c->hidden;
    if (bind(&b, dir, "model.embed_tokens.weight", V, H, &m->embed))
        goto fail;
    for (int i = 0; i < c->layers; i++)
        if (bind_layer(&b, dir, i))
            goto fail;
    if (bind(&b, dir, "model.norm.weight", H, 0, &m->final_norm))
        goto fail;
    if (c->tie_embeddings)
        m->lm_head = m->embed;
    else if (bind(&b, dir, "lm_head.weight", V, H, &m->lm_head))
        goto fail;
    if (c->fp8 && m->dtype == WEFT_DTYPE_F32) {
        wl_fail("%s: FP8 weights beside fp32 ones; weft-llm takes them beside bf16 or fp16", dir);
        goto fail;
    }
    m->first_layer = 0;
    m->end_layer = c->layers;
    json_decref(index);
    return 0;
fail:
    json_decref(index);
    wl_model_close(m);
    return -1;
}

void wl_model_close(wl_model *m)
{
    wl_model_drop_sparse(m);
    for (size_t i = 0; i < m->n_files; i++)
        wl_st_close(&m->files[i]);
    free(m->files);
    free(m->layer);
    free(m->expert_ptrs);
    free(m->host_block);
    free(m->narrow_block);
    free(m->scale_block);
    free(m->shard_block);
    m->shard_block = NULL;
    m->narrow_block = NULL;
    m->scale_block = NULL;
    m->files = NULL;
    m->layer = NULL;
    m->expert_ptrs = NULL;
    m->host_block = NULL;
    m->n_files = 0;
}

int wl_model_set_stage(wl_model *m, int first, int end)
{
    if (m->device_block || m->host_block || m->narrow_block)
        return wl_fail("a pipeline stage is set before the model's upload");
    if (first < 0 || first >= end || end > m->cfg.layers)
        return wl_fail("a pipeline stage of layers [%d, %d) in a model of %d", first, end,
                       m->cfg.layers);
    m->first_layer = first;
    m->end_layer = end;
    return 0;
}

int wl_model_whole(const wl_model *m)
{
    return m->first_layer == 0 && m->end_layer == m->cfg.layers;
}

int wl_draft_open(wl_model *d, const char *dir, const wl_tokenizer *tk)
{
    char path[PATH_MAX];
    wl_tokenizer *own = NULL;
    if (wl_model_open(d, dir))
        return wl_fail("the draft model: %s", wl_error());
    if (!tk)
        return 0;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int rc =
        wl_tokenizer_load(&own, path) ? wl_fail("the draft model's tokenizer: %s", wl_error())
        : wl_tokenizers_agree(tk, own)
            ? wl_fail("the draft model's tokenizer (%s) is not the target's: %s", path, wl_error())
            : 0;
    wl_tokenizer_free(own);
    if (rc)
        wl_model_close(d);
    return rc;
}
