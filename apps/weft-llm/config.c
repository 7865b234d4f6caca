/*
 * config.c - a Hugging Face config.json into a wl_config, checked.
 *
 * Fields follow transformers' names and defaults per model_type (Llama 2
 * and 3 with rope_scaling "llama3", Mistral's sliding_window, Qwen2's QKV
 * biases, Qwen3's q/k norms, the Mixtral and Qwen MoE fields, Qwen's
 * dense layers among the sparse ones). A missing
 * required field, a wrong type or an inconsistent shape (heads that do not
 * divide, an odd head_dim) is an error naming the field; a field this
 * program does not use is ignored, as transformers ignores it.
 */
#include <string.h>

#include <jansson.h>

#include "llm.h"

static const struct {
    const char *name;
    wl_arch arch;
} archs[] = {
    {"llama", WL_ARCH_LLAMA},         {"mistral", WL_ARCH_MISTRAL},
    {"qwen2", WL_ARCH_QWEN2},         {"qwen3", WL_ARCH_QWEN3},
    {"mixtral", WL_ARCH_MIXTRAL},     {"qwen2_moe", WL_ARCH_QWEN2_MOE},
    {"qwen3_moe", WL_ARCH_QWEN3_MOE},
};

/* An integer field: required (def < 0 means no default) and >= min. */
static int get_int(const char *path, json_t *root, const char *key, int def, int min, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (def < 0)
            return wl_fail("%s: %s is missing", path, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return wl_fail("%s: %s is not an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > (1 << 30))
        return wl_fail("%s: %s = %lld is out of range (%d to 2^30)", path, key, (long long)x, min);
    *out = (int)x;
    return 0;
}

static int get_real(const char *path, json_t *root, const char *key, double def, double *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return wl_fail("%s: %s is not a number", path, key);
    *out = json_number_value(v);
    if (!(*out > 0) || *out > 1e300)
        return wl_fail("%s: %s = %g must be positive and finite", path, key, *out);
    return 0;
}

static int get_bool(const char *path, json_t *root, const char *key, int def, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return wl_fail("%s: %s is not true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

static int parse_rope_scaling(const char *path, json_t *root, wl_config *c)
{
    json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs))
        return 0;
    if (!json_is_object(rs))
        return wl_fail("%s: rope_scaling is not an object", path);
    json_t *type = json_object_get(rs, "rope_type");
    if (!type)
        type = json_object_get(rs, "type");
    if (!json_is_string(type))
        return wl_fail("%s: rope_scaling has no rope_type", path);
    const char *t = json_string_value(type);
    if (!strcmp(t, "default"))
        return 0;
    if (strcmp(t, "llama3"))
        return wl_fail("%s: rope_scaling type \"%s\" is not supported (only \"llama3\")", path, t);
    c->rope_llama3 = 1;
    if (get_real(path, rs, "factor", -1, &c->rope_factor) ||
        get_real(path, rs, "low_freq_factor", -1, &c->rope_low_freq) ||
        get_real(path, rs, "high_freq_factor", -1, &c->rope_high_freq))
        return -1;
    if (c->rope_factor < 0 || c->rope_low_freq < 0 || c->rope_high_freq < 0)
        return wl_fail("%s: rope_scaling llama3 needs factor, low_freq_factor and "
                       "high_freq_factor",
                       path);
    if (get_int(path, rs, "original_max_position_embeddings", -1, 1, &c->rope_original_max))
        return -1;
    if (c->rope_high_freq <= c->rope_low_freq)
        return wl_fail("%s: rope_scaling: high_freq_factor must exceed low_freq_factor", path);
    return 0;
}

static int parse_token_ids(const char *path, json_t *root, wl_config *c)
{
    json_t *bos = json_object_get(root, "bos_token_id"),
           *eos = json_object_get(root, "eos_token_id");
    c->bos_id = -1;
    if (json_is_integer(bos))
        c->bos_id = (int)json_integer_value(bos);
    else if (bos && !json_is_null(bos))
        return wl_fail("%s: bos_token_id is not an integer", path);
    if (json_is_integer(eos)) {
        c->eos_ids[c->n_eos++] = (int)json_integer_value(eos);
    } else if (json_is_array(eos)) {
        size_t i;
        json_t *v;
        json_array_foreach(eos, i, v)
        {
            if (!json_is_integer(v) || c->n_eos == 8)
                return wl_fail("%s: eos_token_id must be up to 8 integers", path);
            c->eos_ids[c->n_eos++] = (int)json_integer_value(v);
        }
    } else if (eos && !json_is_null(eos)) {
        return wl_fail("%s: eos_token_id is not an integer or a list", path);
    }
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] < 0 || c->eos_ids[i] >= c->vocab)
            return wl_fail("%s: eos_token_id %d is outside the vocabulary", path, c->eos_ids[i]);
    if (c->bos_id >= c->vocab)
        return wl_fail("%s: bos_token_id %d is outside the vocabulary", path, c->bos_id);
    return 0;
}

/* Qwen's mlp_only_layers: the layers whose MLP stays dense. */
static int parse_mlp_only(const char *path, json_t *root, wl_config *c)
{
    json_t *v = json_object_get(root, "mlp_only_layers");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return wl_fail("%s: mlp_only_layers is not a list", path);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return wl_fail("%s: mlp_only_layers[%zu] is not a layer index", path, i);
        json_int_t l = json_integer_value(e);
        if (l >= c->layers)
            continue; /* names no layer: transformers ignores it too */
        if (l >= WL_MAX_LAYER_BITS)
            return wl_fail("%s: mlp_only_layers names layer %lld; weft-llm reads up to %d", path,
                           (long long)l, WL_MAX_LAYER_BITS);
        c->mlp_only[l / 64] |= 1ull << (l % 64);
    }
    return 0;
}

static int parse_moe(const char *path, json_t *root, wl_config *c)
{
    c->sparse_step = 1;
    if (c->arch == WL_ARCH_MIXTRAL) {
        if (get_int(path, root, "num_local_experts", -1, 1, &c->experts) ||
            get_int(path, root, "num_experts_per_tok", -1, 1, &c->experts_per_token))
            return -1;
        c->moe_intermediate = c->intermediate;
        c->norm_topk_prob = 1; /* Mixtral always renormalises its top k */
    } else if (c->arch == WL_ARCH_QWEN2_MOE || c->arch == WL_ARCH_QWEN3_MOE) {
        if (get_int(path, root, "num_experts", -1, 1, &c->experts) ||
            get_int(path, root, "num_experts_per_tok", -1, 1, &c->experts_per_token) ||
            get_int(path, root, "moe_intermediate_size", -1, 1, &c->moe_intermediate) ||
            get_bool(path, root, "norm_topk_prob", 0, &c->norm_topk_prob) ||
            get_int(path, root, "decoder_sparse_step", 1, 1, &c->sparse_step) ||
            parse_mlp_only(path, root, c))
            return -1;
        /* Qwen2-MoE always has its shared expert; Qwen3-MoE has none */
        if (c->arch == WL_ARCH_QWEN2_MOE &&
            get_int(path, root, "shared_expert_intermediate_size", -1, 1, &c->shared_intermediate))
            return -1;
    } else {
        return 0;
    }
    if (c->experts_per_token > c->experts)
        return wl_fail("%s: num_experts_per_tok = %d exceeds the %d experts", path,
                       c->experts_per_token, c->experts);
    return 0;
}

int wl_config_layer_moe(const wl_config *c, int layer)
{
    if (!c->experts)
        return 0;
    if (layer < WL_MAX_LAYER_BITS && (c->mlp_only[layer / 64] >> (layer % 64) & 1))
        return 0;
    return (layer + 1) % c->sparse_step == 0;
}

static int parse_dtype_field(const char *path, json_t *root, wl_config *c)
{
    json_t *v = json_object_get(root, "torch_dtype");
    if (!v)
        v = json_object_get(root, "dtype");
    if (!v || json_is_null(v))
        return 0;
    const char *s = json_string_value(v);
    if (!s)
        return wl_fail("%s: torch_dtype is not a string", path);
    c->has_dtype = 1;
    if (!strcmp(s, "bfloat16"))
        c->dtype = WEFT_DTYPE_BF16;
    else if (!strcmp(s, "float16"))
        c->dtype = WEFT_DTYPE_F16;
    else if (!strcmp(s, "float32"))
        c->dtype = WEFT_DTYPE_F32;
    else
        return wl_fail("%s: torch_dtype \"%s\" is not bfloat16, float16 or float32", path, s);
    return 0;
}

/* quantization_config: none, or FP8 weights as llm-compressor writes them
 * (compressed-tensors, "float-quantized"): one config group, 8-bit float
 * weights with a scale per channel or per tensor, and 8-bit float input
 * activations quantized dynamically per token, which is what the forward
 * pass does. Anything else is refused naming what it is. */
static int parse_quantization(const char *path, json_t *root, wl_config *c)
{
    json_t *q = json_object_get(root, "quantization_config");
    if (!q || json_is_null(q))
        return 0;
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    const char *format = json_string_value(json_object_get(q, "format"));
    if (!method || strcmp(method, "compressed-tensors") || !format ||
        strcmp(format, "float-quantized"))
        return wl_fail("%s: quantization_config (quant_method \"%s\", format \"%s\") is not one "
                       "weft-llm runs: FP8 weights in compressed-tensors' float-quantized format",
                       path, method ? method : "?", format ? format : "?");
    json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1)
        return wl_fail("%s: quantization_config needs exactly one config group", path);
    json_t *g = json_object_iter_value(json_object_iter(groups));
    json_t *w = json_object_get(g, "weights"), *a = json_object_get(g, "input_activations");
    const char *wtype = json_string_value(json_object_get(w, "type"));
    const char *strategy = json_string_value(json_object_get(w, "strategy"));
    if (json_integer_value(json_object_get(w, "num_bits")) != 8 || !wtype ||
        strcmp(wtype, "float") || !strategy ||
        (strcmp(strategy, "channel") && strcmp(strategy, "tensor")))
        return wl_fail("%s: quantization_config's weights are not 8-bit floats with a scale per "
                       "channel or per tensor",
                       path);
    const char *atype = json_string_value(json_object_get(a, "type"));
    const char *astrategy = json_string_value(json_object_get(a, "strategy"));
    if (!json_is_true(json_object_get(a, "dynamic")) ||
        json_integer_value(json_object_get(a, "num_bits")) != 8 || !atype ||
        strcmp(atype, "float") || !astrategy || strcmp(astrategy, "token"))
        return wl_fail("%s: quantization_config's input activations are not 8-bit floats "
                       "quantized dynamically per token (static scales and weight-only FP8 are "
                       "not supported)",
                       path);
    if (c->experts)
        return wl_fail("%s: FP8 weights in a mixture of experts are not supported", path);
    c->fp8 = 1;
    c->fp8_tensor_scale = !strcmp(strategy, "tensor");
    return 0;
}

static int parse(const char *path, json_t *root, wl_config *c)
{
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return wl_fail("%s: model_type is missing", path);
    const char *t = json_string_value(mt);
    size_t i;
    for (i = 0; i < sizeof archs / sizeof *archs; i++)
        if (!strcmp(t, archs[i].name))
            break;
    if (i == sizeof archs / sizeof *archs)
        return wl_fail("%s: model_type \"%s\" is not one weft-llm knows (llama, mistral, qwen2, "
                       "qwen3, mixtral, qwen2_moe, qwen3_moe)",
                       path, t);
    c->arch = archs[i].arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", t);
    int qwen = c->arch == WL_ARCH_QWEN2 || c->arch == WL_ARCH_QWEN2_MOE;
    int qwen3 = c->arch == WL_ARCH_QWEN3 || c->arch == WL_ARCH_QWEN3_MOE;
    if (get_int(path, root, "hidden_size", -1, 1, &c->hidden) ||
        get_int(path, root, "intermediate_size", -1, 1, &c->intermediate) ||
        get_int(path, root, "num_hidden_layers", -1, 1, &c->layers) ||
        get_int(path, root, "num_attention_heads", -1, 1, &c->heads) ||
        get_int(path, root, "num_key_value_heads", c->heads, 1, &c->kv_heads) ||
        get_int(path, root, "head_dim", c->hidden / c->heads, 1, &c->head_dim) ||
        get_int(path, root, "vocab_size", -1, 1, &c->vocab) ||
        get_int(path, root, "max_position_embeddings", 2048, 1, &c->max_positions) ||
        get_real(path, root, "rms_norm_eps", 1e-6, &c->rms_eps) ||
        get_real(path, root, "rope_theta", 10000.0, &c->rope_theta) ||
        get_bool(path, root, "tie_word_embeddings", 0, &c->tie_embeddings) ||
        get_bool(path, root, "attention_bias", 0, &c->attention_bias))
        return -1;
    if (qwen)
        c->attention_bias = 1; /* Qwen2's q/k/v always carry biases */
    c->qk_norm = qwen3;
    if (c->heads % c->kv_heads)
        return wl_fail("%s: num_attention_heads = %d is not a multiple of num_key_value_heads "
                       "= %d",
                       path, c->heads, c->kv_heads);
    if (c->head_dim % 2)
        return wl_fail("%s: head_dim = %d must be even for the rotary embedding", path,
                       c->head_dim);
    /* Mistral's window always applies; Qwen's only with use_sliding_window. */
    int use_window = 1;
    if ((qwen || qwen3) && get_bool(path, root, "use_sliding_window", 0, &use_window))
        return -1;
    if (use_window && c->arch != WL_ARCH_LLAMA)
        if (get_int(path, root, "sliding_window", 0, 0, &c->sliding_window))
            return -1;
    if (parse_rope_scaling(path, root, c) || parse_token_ids(path, root, c) ||
        parse_moe(path, root, c) || parse_dtype_field(path, root, c) ||
        parse_quantization(path, root, c))
        return -1;
    return 0;
}

int wl_config_load(wl_config *c, const char *path)
{
    json_error_t jerr;
    memset(c, 0, sizeof *c);
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return wl_fail("%s: %s (line %d)", path, jerr.text, jerr.line);
    int rc = json_is_object(root) ? parse(path, root, c) : wl_fail("%s: not a JSON object", path);
    json_decref(root);
    return rc;
}
