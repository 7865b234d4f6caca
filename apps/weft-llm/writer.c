/*
 * writer.c - `weft-llm random-model`: a model folder in the Hugging Face
 * layout with seeded random weights, for tests and benchmarks without a
 * download.
 *
 * The weights are initialised as transformers initialises a fresh model
 * (normal, standard deviation 0.02; norm weights 1), stored as bf16; the
 * MoE presets' experts, routers and biases wider (see list_tensors). Each
 * tensor draws from its own generator seeded by the model seed and the
 * tensor's position, so a seed names one model whatever the shard size.
 * The tokenizer is byte-level BPE learned from the English text below, so
 * ordinary text encodes into multi-byte tokens; its special tokens are a
 * BOS, an EOS and ChatML's <|im_start|> and <|im_end|>, so that the chat
 * template written with it (tokenizer_config.json) gives single ids for
 * its markers. <|im_end|> ends generation as the EOS does.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "llm.h"

/* Written for this program; prose about the things it handles. */
static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. A language model reads the text one token at "
    "a time and predicts the next one. The tokens are pieces of words: the most common words "
    "become single tokens, and the rare ones are spelled out from smaller pieces. When the model "
    "is small, the pieces are short, and when it is large, they are long.\n"
    "Each layer of the transformer has two parts. The attention looks back at the tokens that "
    "came before, and the feed-forward network thinks about each token on its own. Between them "
    "the residual stream carries what the model has learned so far, and a normalization keeps "
    "the numbers in a range where they behave.\n"
    "The weights are stored in files that hold tensors by name, with their shapes and their "
    "types written in a small header at the start. A reader maps the file into memory and finds "
    "each tensor where the header says it is, after checking that the header tells the truth.\n"
    "On the graphics processor the work of many sequences runs at the same time. Each sequence "
    "is a task with its own stream, and the tasks wait for their work without holding a thread. "
    "That is how the program keeps the processor busy while it waits for memory.\n"
    "There was a house at the end of the road, and in the house there lived an old woman who "
    "liked to read. Every evening she sat by the window with a book and a cup of tea, and she "
    "read until the light was gone. The children of the village came to hear her stories, and "
    "she told them about the sea, the mountains, the forests and the cities far away.\n"
    "Numbers are tokens too: 1, 2, 3, 10, 42, 100, 2024 and 3.14159 are split into digits and "
    "groups of digits. Punctuation, quotes and brackets (like these) have tokens of their own, "
    "and so do the spaces and the new lines between the words.\n";

enum { LLAMA, MIXTRAL, QWEN2_MOE };

typedef struct preset {
    const char *name;
    int hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_pos;
    double theta;
    int tied, llama3_scaling;
    double scaling_factor;
    int bos, eos, im_start, experts, per_token; /* <|im_end|> is im_start + 1 */
    /* mixture of experts: Mixtral's experts are intermediate wide; Qwen2-MoE's
     * moe_intermediate, with a shared expert of shared_intermediate, and
     * the layers in dense_mask keep a dense MLP (mlp_only_layers) */
    int kind, moe_intermediate, shared_intermediate, dense_mask;
} preset;

/* Every preset's tokenizer has the 256 bytes and this many merges. */
enum { MERGES = 254 };

/* tiny fits a CI run on two cores; 1b and 8b have Llama 3.2 1B's and
 * Llama 3.1 8B's shapes; moe is a tiny Mixtral, qwen2moe a tiny Qwen2-MoE
 * (q/k/v biases, a shared expert, no renormalisation of the top k, its
 * middle layer dense). tiny's vocabulary is exactly its tokenizer's: the
 * bytes, the merges between them and the BOS and EOS (ids 256 and 257,
 * which the merges skip), then the chat markers last (512, 513), where
 * they change no other token's id. The large presets keep the small
 * tokenizer below their vocab_size, as real models pad theirs; the
 * embedding and lm_head rows of the ids it lacks are zero, so that greedy
 * output stays among its tokens (a zero row's logit is below the largest
 * of the others') and a served stream shows text as it goes. */
static const preset presets[] = {
    {"tiny", 64, 128, 2, 4, 2, 64, 514, 512, 10000.0, 0, 0, 0, 256, 257, 512, 0, 0, LLAMA, 0, 0, 0},
    {"1b", 2048, 8192,   16,     32,     8, 64, 128256, 131072, 500000.0, 1,
     1,    32.0, 128000, 128001, 128002, 0, 0,  LLAMA,  0,      0,        0},
    {"8b", 4096, 14336,  32,     32,     8, 128, 128256, 131072, 500000.0, 0,
     1,    8.0,  128000, 128001, 128002, 0, 0,   LLAMA,  0,      0,        0},
    {"moe", 64, 128, 2,   4,   2, 64, 514,     512, 1000000.0, 0,
     0,     0,  256, 257, 512, 4, 2,  MIXTRAL, 0,   0,         0},
    {"qwen2moe", 64, 128, 3,   4,   2, 64, 514,       512, 1000000.0, 0,
     0,          0,  256, 257, 512, 8, 2,  QWEN2_MOE, 32,  64,        1 << 1},
};

static int layer_is_moe(const preset *p, int i)
{
    return p->kind != LLAMA && !(p->dense_mask >> i & 1);
}

/* ChatML, written for these models: each message as
 * <|im_start|>role\ncontent<|im_end|>\n, then the assistant's opening. */
static const char chat_template[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

static int write_json(const char *dir, const char *name, json_t *j)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    return rc ? wl_fail("%s: cannot write", path) : 0;
}

/* FP8 weights as llm-compressor writes them: compressed-tensors'
 * float-quantized format, weights a scale a channel, activations
 * quantized dynamically per token, lm_head left alone. */
static json_t *fp8_quantization(void)
{
    return json_pack("{s:s, s:s, s:{s:{s:[s], s:{s:i, s:s, s:s, s:b, s:b}, s:{s:i, s:s, s:s, "
                     "s:b, s:b}}}, s:[s]}",
                     "quant_method", "compressed-tensors", "format", "float-quantized",
                     "config_groups", "group_0", "targets", "Linear", "weights", "num_bits", 8,
                     "type", "float", "strategy", "channel", "symmetric", 1, "dynamic", 0,
                     "input_activations", "num_bits", 8, "type", "float", "strategy", "token",
                     "symmetric", 1, "dynamic", 1, "ignore", "lm_head");
}

static json_t *config_json(const preset *p, int fp32, int fp8)
{
    static const char *const type[] = {"llama", "mixtral", "qwen2_moe"};
    static const char *const arch[] = {"LlamaForCausalLM", "MixtralForCausalLM",
                                       "Qwen2MoeForCausalLM"};
    json_t *c = json_pack(
        "{s:s, s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, "
        "s:b, s:i, s:[i, i], s:s, s:f, s:s, s:b, s:b}",
        "model_type", type[p->kind], "architectures", arch[p->kind], "hidden_size", p->hidden,
        "intermediate_size", p->intermediate, "num_hidden_layers", p->layers, "num_attention_heads",
        p->heads, "num_key_value_heads", p->kv_heads, "head_dim", p->head_dim, "vocab_size",
        p->vocab, "max_position_embeddings", p->max_pos, "rms_norm_eps", 1e-5, "rope_theta",
        p->theta, "tie_word_embeddings", p->tied, "attention_bias", 0, "bos_token_id", p->bos,
        "eos_token_id", p->eos, p->im_start + 1, "hidden_act", "silu", "initializer_range", 0.02,
        "torch_dtype", fp32 ? "float32" : "bfloat16", "mlp_bias", 0, "use_cache", 1);
    if (fp8)
        json_object_set_new(c, "quantization_config", fp8_quantization());
    if (p->llama3_scaling)
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                      p->scaling_factor, "low_freq_factor", 1.0, "high_freq_factor",
                                      4.0, "original_max_position_embeddings", 8192));
    if (p->kind == MIXTRAL) {
        json_object_set_new(c, "num_local_experts", json_integer(p->experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(p->per_token));
    } else if (p->kind == QWEN2_MOE) {
        json_t *dense = json_array();
        for (int i = 0; i < p->layers; i++)
            if (!layer_is_moe(p, i))
                json_array_append_new(dense, json_integer(i));
        json_t *moe = json_pack("{s:i, s:i, s:i, s:i, s:b, s:i, s:o, s:b, s:b, s:b}", "num_experts",
                                p->experts, "num_experts_per_tok", p->per_token,
                                "moe_intermediate_size", p->moe_intermediate,
                                "shared_expert_intermediate_size", p->shared_intermediate,
                                "norm_topk_prob", 0, "decoder_sparse_step", 1, "mlp_only_layers",
                                dense, "use_sliding_window", 0, "attention_bias", 1, "qkv_bias", 1);
        json_object_update(c, moe);
        json_decref(moe);
    }
    return c;
}

/* The ids the tokenizer written with p defines: the 256 bytes, the MERGES
 * ids from 256 on that are not special, and the special ids. */
typedef struct vocab_ids {
    int special[4];
    uint64_t end; /* one past the last merge's id */
} vocab_ids;

static vocab_ids vocab_of(const preset *p)
{
    vocab_ids v = {{p->bos, p->eos, p->im_start, p->im_start + 1}, 256};
    for (int merges = 0; merges < MERGES; v.end++) {
        int taken = 0;
        for (int i = 0; i < 4; i++)
            taken |= (uint64_t)v.special[i] == v.end;
        merges += !taken;
    }
    return v;
}

static int token_defined(const vocab_ids *v, uint64_t id)
{
    for (int i = 0; i < 4; i++)
        if ((uint64_t)v->special[i] == id)
            return 1;
    return id < v->end;
}

/* The tensors in file order, with what each is filled with: normal draws
 * of standard deviation sd, or ones (a norm's weight) where sd is 0. */
typedef struct spec_list {
    wl_st_spec *s;
    double *sd;
    uint64_t *seed_at; /* a tensor's draws: the seed's stream for this value tensor's place */
    size_t n, cap, values;
    char **names;
    weft_dtype dtype;      /* every tensor's but FP8 projections' and their scales */
    int fp8;               /* the layers' projections in E4M3, each with its scales after it */
    int prune_2_4;         /* the dense layers' projections pruned to 2:4 as they are written */
    unsigned char *pruned; /* per tensor: pruned to 2:4 */
    unsigned char *vocab;  /* per tensor: a row a token id (embedding, lm_head) */
    float *scales;         /* the last FP8 tensor's, for its scale tensor */
    vocab_ids vocab_ids;   /* the ids the model's tokenizer defines */
} spec_list;

/* sd's meanings besides a standard deviation: ones (a norm's weight), and
 * the scales of the FP8 tensor before (its place in the list right after). */
enum { ONES = 0, SCALES = -1 };
#define INIT_SD 0.02 /* transformers' initializer_range */

static void add(spec_list *l, double sd, uint64_t rows, uint64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void add(spec_list *l, double sd, uint64_t rows, uint64_t cols, const char *fmt, ...)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->s = realloc(l->s, l->cap * sizeof *l->s);
        l->sd = realloc(l->sd, l->cap * sizeof *l->sd);
        l->seed_at = realloc(l->seed_at, l->cap * sizeof *l->seed_at);
        l->names = realloc(l->names, l->cap * sizeof *l->names);
        l->pruned = realloc(l->pruned, l->cap * sizeof *l->pruned);
        l->vocab = realloc(l->vocab, l->cap * sizeof *l->vocab);
        if (!l->s || !l->sd || !l->seed_at || !l->names || !l->pruned || !l->vocab)
            abort(); /* out of memory building a list of a few hundred names */
    }
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    l->names[l->n] = strdup(name);
    l->s[l->n] = (wl_st_spec){
        .name = l->names[l->n], .dtype = l->dtype, .ndim = cols ? 2 : 1, .shape = {rows, cols}};
    l->seed_at[l->n] = sd == SCALES ? 0 : l->values++; /* an FP8 twin draws the same values */
    l->pruned[l->n] = 0;
    l->vocab[l->n] = 0;
    l->sd[l->n++] = sd;
}

/* A layer's projection: the last tensor added, pruned to 2:4 when the
 * list is, or made E4M3 with its scales ([rows, 1], fp32) after it when
 * the list is FP8. */
static void projection(spec_list *l)
{
    l->pruned[l->n - 1] = (unsigned char)l->prune_2_4;
    if (!l->fp8)
        return;
    wl_st_spec *w = &l->s[l->n - 1];
    uint64_t rows = w->shape[0];
    w->dtype = WEFT_DTYPE_F8_E4M3;
    add(l, SCALES, rows, 1, "%s_scale", l->names[l->n - 1]);
    l->s[l->n - 1].dtype = WEFT_DTYPE_F32;
}

static void list_tensors(const preset *p, spec_list *l)
{
    uint64_t H = (uint64_t)p->hidden, I = (uint64_t)p->intermediate;
    uint64_t q = (uint64_t)p->heads * p->head_dim, kv = (uint64_t)p->kv_heads * p->head_dim;
    /* The MoE presets' routers, experts and shared experts, and Qwen2-MoE's
     * biases, are drawn wider than a fresh model's 0.02: at 0.02 a tiny
     * model's MLP adds a hundredth of its residual stream, so neither the
     * routing nor the experts would show in the logits that tests compare.
     * These make the experts' sum about as large as the rest of it. */
    double router = 0.1, expert = p->kind == MIXTRAL ? 0.05 : 0.1, shared = 0.08, bias = 0.1;
    add(l, INIT_SD, (uint64_t)p->vocab, H, "model.embed_tokens.weight");
    l->vocab[l->n - 1] = 1;
    for (int i = 0; i < p->layers; i++) {
        add(l, ONES, H, 0, "model.layers.%d.input_layernorm.weight", i);
        add(l, INIT_SD, q, H, "model.layers.%d.self_attn.q_proj.weight", i);
        projection(l);
        add(l, INIT_SD, kv, H, "model.layers.%d.self_attn.k_proj.weight", i);
        projection(l);
        add(l, INIT_SD, kv, H, "model.layers.%d.self_attn.v_proj.weight", i);
        projection(l);
        add(l, INIT_SD, H, q, "model.layers.%d.self_attn.o_proj.weight", i);
        projection(l);
        if (p->kind == QWEN2_MOE) {
            add(l, bias, q, 0, "model.layers.%d.self_attn.q_proj.bias", i);
            add(l, bias, kv, 0, "model.layers.%d.self_attn.k_proj.bias", i);
            add(l, bias, kv, 0, "model.layers.%d.self_attn.v_proj.bias", i);
        }
        add(l, ONES, H, 0, "model.layers.%d.post_attention_layernorm.weight", i);
        if (layer_is_moe(p, i) && p->kind == MIXTRAL) {
            add(l, router, (uint64_t)p->experts, H, "model.layers.%d.block_sparse_moe.gate.weight",
                i);
            for (int e = 0; e < p->experts; e++) {
                add(l, expert, I, H, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", i, e);
                add(l, expert, H, I, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", i, e);
                add(l, expert, I, H, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", i, e);
            }
        } else if (layer_is_moe(p, i)) {
            uint64_t M = (uint64_t)p->moe_intermediate, S = (uint64_t)p->shared_intermediate;
            add(l, router, (uint64_t)p->experts, H, "model.layers.%d.mlp.gate.weight", i);
            for (int e = 0; e < p->experts; e++) {
                add(l, expert, M, H, "model.layers.%d.mlp.experts.%d.gate_proj.weight", i, e);
                add(l, expert, M, H, "model.layers.%d.mlp.experts.%d.up_proj.weight", i, e);
                add(l, expert, H, M, "model.layers.%d.mlp.experts.%d.down_proj.weight", i, e);
            }
            add(l, shared, S, H, "model.layers.%d.mlp.shared_expert.gate_proj.weight", i);
            add(l, shared, S, H, "model.layers.%d.mlp.shared_expert.up_proj.weight", i);
            add(l, shared, H, S, "model.layers.%d.mlp.shared_expert.down_proj.weight", i);
            add(l, router, 1, H, "model.layers.%d.mlp.shared_expert_gate.weight", i);
        } else {
            add(l, INIT_SD, I, H, "model.layers.%d.mlp.gate_proj.weight", i);
            projection(l);
            add(l, INIT_SD, I, H, "model.layers.%d.mlp.up_proj.weight", i);
            projection(l);
            add(l, INIT_SD, H, I, "model.layers.%d.mlp.down_proj.weight", i);
            projection(l);
        }
    }
    add(l, ONES, H, 0, "model.norm.weight");
    if (!p->tied) {
        add(l, INIT_SD, (uint64_t)p->vocab, H, "lm_head.weight");
        l->vocab[l->n - 1] = 1;
    }
}

static uint64_t spec_bytes(const wl_st_spec *s)
{
    return s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1) * wl_dtype_size(s->dtype);
}

/* A bf16 value, in the tensor's dtype (fp32: the same value, widened). */
static void put(const wl_st_spec *s, void *buf, size_t i, float v)
{
    uint16_t b;
    wl_store(WEFT_DTYPE_BF16, &b, 0, v);
    wl_store(s->dtype, buf, i, wl_load(WEFT_DTYPE_BF16, &b, 0));
}

/* A tensor's values are drawn in chunks of this many, each chunk n normal
 * draws of standard deviation sd: Box-Muller gives two a draw (an odd
 * chunk's last leaves its second unused). */
enum { CHUNK = 1 << 16 };

static void normals(uint64_t *state, double sd, float *out, size_t n)
{
    for (size_t i = 0; i < n; i += 2) {
        double r = sd * sqrt(-2.0 * log1p(-wl_rand_uniform(state)));
        double a = 2.0 * M_PI * wl_rand_uniform(state);
        out[i] = (float)(r * cos(a));
        if (i + 1 < n)
            out[i + 1] = (float)(r * sin(a));
    }
}

/* A tensor's values; pruned, each group of four of a row (a chunk holds
 * whole groups: rows and chunks are multiples of four) keeps its two
 * largest, as weft_prune_2_4 keeps them. */
static int fill(FILE *f, const wl_st_spec *s, double sd, uint64_t seed, int prune,
                const vocab_ids *vocab)
{
    static float vals[CHUNK], buf[CHUNK];
    size_t es = wl_dtype_size(s->dtype);
    uint64_t total = spec_bytes(s) / es, count = total, state = seed, cols = s->shape[1];
    while (count) {
        size_t n = count < CHUNK ? (size_t)count : CHUNK;
        uint64_t at = total - count;
        normals(&state, sd, vals, n);
        for (size_t i = 0; i < n; i++) {
            int zero = vocab && !token_defined(vocab, (at + i) / cols);
            put(s, buf, i, sd == ONES ? 1.0f : zero ? 0.0f : vals[i]);
        }
        if (prune && weft_prune_2_4(NULL, s->dtype, buf, 1, n, n) != WEFT_OK)
            return wl_fail("%s: %s", s->name, weft_last_error());
        if (fwrite(buf, es, n, f) != n)
            return wl_fail("write failed: %s", strerror(errno));
        count -= n;
    }
    return 0;
}

/* An FP8 projection: the values its bf16 twin has (the same draws in the
 * same order, rounded to bf16), quantized a row at a time by
 * weft_quantize_fp8 (a scale a row), the scales kept in l for the tensor
 * after it. */
static int fill_fp8(FILE *f, spec_list *l, const wl_st_spec *s, double sd, uint64_t seed)
{
    size_t rows = (size_t)s->shape[0], cols = (size_t)s->shape[1], count = rows * cols;
    float *v = malloc(count * sizeof *v);
    uint8_t *codes = malloc(count);
    free(l->scales);
    l->scales = malloc(rows * sizeof *l->scales);
    if (!v || !codes || !l->scales) {
        free(v), free(codes);
        return wl_fail("out of memory for %s", s->name);
    }
    uint64_t state = seed;
    for (size_t at = 0; at < count; at += CHUNK) /* fill's chunks: the same draws */
        normals(&state, sd, v + at, count - at < CHUNK ? count - at : CHUNK);
    for (size_t i = 0; i < count; i++)
        v[i] = (float)wl_round(WEFT_DTYPE_BF16, v[i]);
    int rc = 0;
    if (weft_quantize_fp8(NULL, WEFT_DTYPE_F8_E4M3, codes, l->scales, WEFT_DTYPE_F32, v, rows, cols,
                          cols, cols) != WEFT_OK)
        rc = wl_fail("%s: %s", s->name, weft_last_error());
    else if (fwrite(codes, 1, count, f) != count)
        rc = wl_fail("write failed: %s", strerror(errno));
    free(v), free(codes);
    return rc;
}

static int write_shard(const char *path, spec_list *l, size_t from, size_t to, uint64_t seed)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return wl_fail("%s: %s", path, strerror(errno));
    int rc = wl_st_write_header(f, l->s + from, to - from);
    for (size_t i = from; !rc && i < to; i++) {
        uint64_t ts = seed ^ (0x9e3779b97f4a7c15ull * (l->seed_at[i] + 1));
        const wl_st_spec *s = &l->s[i];
        if (l->sd[i] == SCALES)
            rc = fwrite(l->scales, sizeof *l->scales, (size_t)s->shape[0], f) == s->shape[0]
                     ? 0
                     : wl_fail("write failed: %s", strerror(errno));
        else if (s->dtype == WEFT_DTYPE_F8_E4M3)
            rc = fill_fp8(f, l, s, l->sd[i], wl_rand_next(&ts));
        else
            rc = fill(f, s, l->sd[i], wl_rand_next(&ts), l->pruned[i],
                      l->vocab[i] ? &l->vocab_ids : NULL);
    }
    if (fclose(f) && !rc)
        rc = wl_fail("%s: %s", path, strerror(errno));
    if (rc)
        wl_fail("%s: %s", path, wl_error());
    return rc;
}

static int write_weights(const char *dir, const preset *p, const wl_write_opts *o)
{
    spec_list l = {.dtype = o->fp32 ? WEFT_DTYPE_F32 : WEFT_DTYPE_BF16,
                   .fp8 = o->fp8,
                   .prune_2_4 = o->prune_2_4};
    l.vocab_ids = vocab_of(p);
    list_tensors(p, &l);
    size_t limit = o->shard_bytes ? o->shard_bytes : (size_t)2 << 30;
    size_t starts[4096], n_shards = 0;
    uint64_t acc = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (i == 0 || (acc + spec_bytes(&l.s[i]) > limit && acc > 0 && n_shards < 4095)) {
            starts[n_shards++] = i;
            acc = 0;
        }
        acc += spec_bytes(&l.s[i]);
    }
    starts[n_shards] = l.n;
    char path[4096], name[64];
    int rc = 0;
    json_t *map = json_object();
    uint64_t total = 0;
    for (size_t s = 0; !rc && s < n_shards; s++) {
        if (n_shards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rc = write_shard(path, &l, starts[s], starts[s + 1], o->seed);
        for (size_t i = starts[s]; i < starts[s + 1]; i++) {
            json_object_set_new(map, l.s[i].name, json_string(name));
            total += spec_bytes(&l.s[i]);
        }
    }
    if (!rc && n_shards > 1)
        rc = write_json(dir, "model.safetensors.index.json",
                        json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                                  "weight_map", json_incref(map)));
    json_decref(map);
    for (size_t i = 0; i < l.n; i++)
        free(l.names[i]);
    free(l.s);
    free(l.sd);
    free(l.seed_at);
    free(l.scales);
    free(l.names);
    free(l.pruned);
    free(l.vocab);
    return rc;
}

int wl_write_random_model(const char *dir, const wl_write_opts *o)
{
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (!strcmp(o->preset, presets[i].name))
            p = &presets[i];
    if (!p)
        return wl_fail("unknown preset \"%s\" (tiny, 1b, 8b, moe or qwen2moe)", o->preset);
    if (mkdir(dir, 0777) && errno != EEXIST)
        return wl_fail("%s: %s", dir, strerror(errno));
    const char *special[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"};
    int special_ids[] = {p->bos, p->eos, p->im_start, p->im_start + 1};
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (o->fp8 && (o->fp32 || p->kind != LLAMA))
        return wl_fail("--fp8 writes a dense model's projections in FP8, beside bf16 weights "
                       "(not with --fp32 or a mixture of experts)");
    if (o->fp8 && o->prune_2_4)
        return wl_fail("--prune-2-4 prunes bf16 or fp32 projections, not FP8 ones");
    if (write_json(dir, "config.json", config_json(p, o->fp32, o->fp8)) ||
        write_json(dir, "generation_config.json",
                   json_pack("{s:i, s:[i, i], s:b}", "bos_token_id", p->bos, "eos_token_id", p->eos,
                             p->im_start + 1, "do_sample", 0)) ||
        write_json(dir, "tokenizer_config.json",
                   json_pack("{s:s, s:s, s:s, s:s, s:i, s:b}", "tokenizer_class",
                             "PreTrainedTokenizerFast", "bos_token", special[0], "eos_token",
                             special[1], "chat_template", chat_template, "model_max_length",
                             p->max_pos, "clean_up_tokenization_spaces", 0)) ||
        wl_tokenizer_train_write(path, corpus, MERGES, special, special_ids, 4))
        return -1;
    return o->config_only ? 0 : write_weights(dir, p, o);
}
