/*
 * llm.h - what the parts of weft-llm share: the error line, number
 * conversions, safetensors files, the model's configuration and weights,
 * the tokenizer, chat templates, the forward pass and sampling.
 *
 * Every call that can fail returns 0 or -1; on -1 the reason is in
 * wl_error() (one line, naming the file and the field or tensor at fault).
 * Nothing here aborts on a bad file: every size and offset read from disk
 * is checked before it is used.
 */
#ifndef WL_LLM_H
#define WL_LLM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>
#include <weft.h>
#include <weft/ops.h>

/* ---- errors --------------------------------------------------------------- */

/* Sets the calling thread's error line; always returns -1. */
int wl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *wl_error(void);

/* weft_mutex_lock that also takes the lock in a cancelled task (whose
 * weft_mutex_lock refuses at once), by yielding until it is free: a
 * cancelled sequence must still be able to leave and give back what it
 * holds. */
void wl_lock_always(weft_mutex *m);

/* ---- a growable byte buffer ------------------------------------------------ */

typedef struct wl_buf {
    char *data; /* terminated by a 0 past len, when not NULL */
    size_t len, cap;
    int failed; /* an allocation failed: the contents are cut short */
} wl_buf;

void wl_buf_append(wl_buf *b, const void *p, size_t n);
void wl_buf_puts(wl_buf *b, const char *s);
void wl_buf_printf(wl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void wl_buf_free(wl_buf *b);

/* Appends s[0, n) as valid UTF-8: each byte that does not begin a complete,
 * well-formed sequence becomes U+FFFD. JSON strings must be UTF-8, and a
 * token may end in the middle of a character. */
void wl_utf8_sanitize(wl_buf *out, const char *s, size_t n);
/* The length of s[0, n)'s prefix that does not end inside a character
 * still incomplete (one whose next bytes may come with the next token). */
size_t wl_utf8_complete(const char *s, size_t n);

/* ---- numbers -------------------------------------------------------------- */

size_t wl_dtype_size(weft_dtype dt);
const char *wl_dtype_name(weft_dtype dt); /* safetensors' spelling: BF16, F16, F32 */
float wl_load(weft_dtype dt, const void *p, size_t i);
void wl_store(weft_dtype dt, void *p, size_t i, float v); /* to nearest, ties to even */
double wl_round(weft_dtype dt, double v);                 /* v rounded through fp32 and dt */

/* ---- safetensors ------------------------------------------------------------ */

#define WL_MAX_DIMS 8

typedef struct wl_tensor {
    char *name;
    weft_dtype dtype;
    int ndim;
    uint64_t shape[WL_MAX_DIMS];
    const void *data; /* inside the file's mapping, aligned to the element */
    size_t nbytes;
} wl_tensor;

typedef struct wl_st_file {
    char *path;
    void *map;
    size_t size;
    wl_tensor *tensors; /* sorted by name */
    size_t count;
} wl_st_file;

/* Maps path and checks all of it: header length, JSON, each tensor's dtype,
 * shape and offsets (inside the data, sizes matching, no overlap). */
int wl_st_open(wl_st_file *f, const char *path);
void wl_st_close(wl_st_file *f);
const wl_tensor *wl_st_find(const wl_st_file *f, const char *name);

/* Writing: the header first (names, dtypes, shapes, in order), then each
 * tensor's bytes in that order through wl_st_write_data. */
typedef struct wl_st_spec {
    const char *name;
    weft_dtype dtype;
    int ndim;
    uint64_t shape[WL_MAX_DIMS];
} wl_st_spec;
int wl_st_write_header(FILE *out, const wl_st_spec *specs, size_t n);

/* ---- configuration ------------------------------------------------------ */

/* mlp_only_layers may name layers below this. */
#define WL_MAX_LAYER_BITS 1024
/* weft_moe_gate's limits. */
#define WL_MAX_EXPERTS 256
#define WL_MAX_EXPERTS_PER_TOKEN 8

typedef enum wl_arch {
    WL_ARCH_LLAMA,
    WL_ARCH_MISTRAL,
    WL_ARCH_QWEN2,
    WL_ARCH_QWEN3,
    WL_ARCH_MIXTRAL,
    WL_ARCH_QWEN2_MOE,
    WL_ARCH_QWEN3_MOE
} wl_arch;

typedef struct wl_config {
    wl_arch arch;
    char model_type[32];
    int hidden, intermediate, layers, heads, kv_heads, head_dim, vocab;
    int max_positions;
    double rms_eps, rope_theta;
    int tie_embeddings;
    int attention_bias; /* q, k and v projections have biases (Qwen2) */
    int qk_norm;        /* RMSNorm over each head of q and k (Qwen3) */
    int sliding_window; /* 0: none */
    int has_dtype;      /* torch_dtype was given ... */
    weft_dtype dtype;   /* ... and names this */
    int bos_id;         /* -1: none */
    int eos_ids[8];
    int n_eos;
    /* rope_scaling "llama3" */
    int rope_llama3;
    double rope_factor, rope_low_freq, rope_high_freq;
    int rope_original_max;
    /* mixture of experts: experts > 0. moe_intermediate is an expert's
     * MLP size (Mixtral's intermediate_size), shared_intermediate Qwen2-MoE's
     * shared expert's (0: none). The router's softmax weights of a token's
     * experts_per_token experts are renormalised to sum to 1 when
     * norm_topk_prob (always for Mixtral). Qwen's dense layers: those in
     * mlp_only_layers (a bitmap) and those where (layer + 1) is not a
     * multiple of decoder_sparse_step (sparse_step). */
    int experts, experts_per_token, moe_intermediate, shared_intermediate;
    int norm_topk_prob, sparse_step;
    uint64_t mlp_only[WL_MAX_LAYER_BITS / 64];
    /* FP8 weights (a compressed-tensors "float-quantized" checkpoint): the
     * layers' seven projections are E4M3 with fp32 scales per output
     * channel (fp8_tensor_scale: one per tensor), and their inputs are
     * quantized per token as the forward pass goes (weft_quantize_fp8). */
    int fp8, fp8_tensor_scale;
} wl_config;

/* Parses and checks dir/config.json. */
int wl_config_load(wl_config *c, const char *path);
/* Whether layer's MLP is the mixture of experts (else the dense MLP of
 * intermediate_size), as transformers builds the model. */
int wl_config_layer_moe(const wl_config *c, int layer);

/* ---- the model -------------------------------------------------------------- */

typedef struct wl_layer {
    const void *attn_norm, *q, *k, *v, *o, *q_bias, *k_bias, *v_bias, *q_norm, *k_norm;
    const void *mlp_norm, *gate, *up, *down; /* the dense MLP (NULL in a MoE layer) */
    /* FP8 weights' scales, a float per output row (NULL: not FP8); qkv's
     * and gu's packed as their weights are */
    const float *q_scale, *k_scale, *v_scale, *o_scale, *gate_scale, *up_scale, *down_scale;
    const float *qkv_scale, *gu_scale;
    /* Packed by wl_model_upload (pack.c), what the forward pass reads:
     * [q + 2 kv][hidden] q, k and v rows and their biases; [2 I][hidden]
     * gate and up rows (dense MLP); the shared expert's likewise. */
    const void *qkv, *qkv_bias, *gu, *shared_gu;
    /* A mixture-of-experts layer (moe set), E experts of MLP size I: */
    int moe;
    const void *router;       /* [E][hidden] */
    const void **expert;      /* expert[3 e + 0, 1, 2]: expert e's gate and up [I][hidden] and
                                 down [hidden][I], as bound (in the files' mappings) */
    const void *experts_gu;   /* [E][2 I][hidden]: expert e's gate rows then its up rows */
    const void *experts_down; /* [E][hidden][I] */
    /* Qwen2-MoE's shared expert: a dense MLP of shared_intermediate whose
     * output is scaled by sigmoid(h . shared_router) ([1][hidden]) */
    const void *shared_gate, *shared_up, *shared_down, *shared_router;
    /* With the model's sparse_2_4: the dense layer's packed q|k|v, o,
     * gate|up and down, pruned to 2:4 and multiplied sparse
     * (weft_matmul_sparse); NULL otherwise. */
    weft_sparse_weight *qkv_sparse, *o_sparse, *gu_sparse, *down_sparse;
} wl_layer;

typedef struct wl_model {
    wl_config cfg;
    weft_dtype dtype; /* of every weight (an fp32 model's: bf16 once uploaded) */
    wl_st_file *files;
    size_t n_files;
    const void *embed, *final_norm, *lm_head;
    wl_layer *layer;
    const void **expert_ptrs; /* what the layers' expert arrays point into */
    void *device_block;       /* weights copied to a GPU (NULL on the host backend) */
    void *host_block;         /* the packed weights on the host (pack.c) */
    void *narrow_block;       /* an fp32 model's weights rounded to bf16 */
    float *scale_block;       /* FP8 weights' scales as fp32 (model.c) */
    /* The layers this process runs, [first_layer, end_layer): all of them,
     * or a pipeline stage's (wl_model_set_stage), whose upload and KV cache
     * hold those layers alone, the embedding only on the first stage and
     * the final norm and lm_head only on the last. */
    int first_layer, end_layer;
    /* Told how an upload goes (wl_model_upload, from its task): bytes
     * copied of the total, every 100 ms or so and once at the end (done ==
     * total); NULL: not told. */
    void (*on_load)(void *ctx, size_t done, size_t total);
    void *load_ctx;
    /* Set before the upload (--sparse-2-4): wl_model_upload then prunes
     * each dense layer's projections to the 2:4 pattern (a copy of each:
     * the weights themselves stay as read) and makes them sparse weights,
     * which the forward pass multiplies through weft_matmul_sparse:
     * half the weights' bytes on a GPU with cuSPARSELt. A model whose
     * projections are 2:4 already computes what it would densely; any
     * other loses what pruning without retraining loses. */
    int sparse_2_4;
    /* Tensor parallel (wl_model_set_shard): this rank's share of each
     * layer, shard_rank of shard_ranks (0 of 1: the whole model); the
     * rank's columns of o and down, copied out of the files. */
    int shard_rank, shard_ranks;
    void *shard_block;
} wl_model;

/* Reads dir's config and safetensors (one file or an index of shards) and
 * binds every weight the forward pass needs, checking name, shape and dtype.
 * Some tensors are read as one block (a layer's q, k and v; gate and up;
 * a mixture of experts' experts), which wl_model_upload packs (on the GPU,
 * or in host memory for the host backend): the layers' packed pointers
 * are NULL until then. */
int wl_model_open(wl_model *m, const char *dir);
void wl_model_close(wl_model *m);
/* Makes m a pipeline stage running layers [first, end), before its upload. */
int wl_model_set_stage(wl_model *m, int first, int end);
/* Whether m runs every layer (not a pipeline stage). */
int wl_model_whole(const wl_model *m);
/* Makes m rank `rank` of a tensor-parallel split over `ranks`, before its
 * upload (tensor_parallel.c says how): its configuration then counts the
 * rank's heads, key-value heads and MLP width. An error for a model that
 * does not split evenly, or whose kind is not split (mixtures of experts,
 * FP8 or 2:4 sparse weights, pipeline stages). */
int wl_model_set_shard(wl_model *m, int rank, int ranks);
/* The models of a split over `ranks` (tensor parallel): *models gets
 * ranks pointers, the first `first` (the caller's own, open: rank 0's), the
 * others each a fresh open of dir's files, a mapping of their own.
 * wl_close_ranks closes those (not first) and frees the array. */
int wl_open_ranks(wl_model ***models, wl_model *first, const char *dir, int ranks);
void wl_close_ranks(wl_model **models, int ranks);
/* Whether m ends in the logits: the last layers' stage, tensor parallel's
 * rank 0. */
int wl_model_makes_logits(const wl_model *m);
/* An on_load for a terminal: a bar on stderr, redrawn in place, ended by a
 * newline once done == total; ctx names what loads ("weights"). Set it
 * where stderr is a terminal (wl_show_load_on). */
void wl_show_load(void *ctx, size_t done, size_t total);
void wl_show_load_on(wl_model *m, const char *what);

/* ---- tokenizer ------------------------------------------------------------- */

typedef struct wl_tokenizer wl_tokenizer;

int wl_tokenizer_load(wl_tokenizer **tk, const char *path);
void wl_tokenizer_free(wl_tokenizer *tk);
/* Encodes len bytes of text; with add_special the post-processor's tokens
 * (a BOS) are added. *ids is malloc'd. */
int wl_encode(const wl_tokenizer *tk, const char *text, size_t len, int add_special, int32_t **ids,
              size_t *n);
/* Writes the bytes of token id to buf (special tokens only when
 * keep_special; at_start: the token opens the text, where a SentencePiece
 * decoder drops the leading space). Returns the bytes written, or -1 for
 * an unknown id. */
int wl_decode_token(const wl_tokenizer *tk, int32_t id, int keep_special, int at_start, char *buf,
                    size_t cap);
size_t wl_tokenizer_size(const wl_tokenizer *tk); /* one more than the largest id */
/* Whether two tokenizers map every id to the same token (a draft model's
 * and its target's): 0, or -1 naming the first difference. */
int wl_tokenizers_agree(const wl_tokenizer *a, const wl_tokenizer *b);
/* Opens dir's model (model.c) to draft for a target whose tokenizer is tk
 * (NULL: not known, not checked): dir's tokenizer.json must give every id
 * the target's token. */
int wl_draft_open(wl_model *d, const char *dir, const wl_tokenizer *tk);
/* GPT-2's byte-to-unicode table: the character (UTF-8, terminated) that
 * stands for byte b in byte-level tokens. */
void wl_byte_char(unsigned char b, char out[3]);
/* Llama 3's pre-tokenizer regex, which the written tokenizers use. */
extern const char wl_llama3_pattern[];

/* Learns merges from text and writes a byte-level BPE tokenizer.json with
 * the 256 byte tokens (ids 0-255), the merges (ids from 256 on) and the
 * special tokens at the given ids; the first special token is the BOS the
 * post-processor adds. */
int wl_tokenizer_train_write(const char *path, const char *text, int merges,
                             const char *const *special, const int *special_ids, int n_special);

/* ---- chat templates (chat.c) ---------------------------------------------- */

/* A model's chat template. This does not interpret Jinja: wl_chat_load
 * recognises the template's family by markers in its text, and rendering
 * writes that family's format (ChatML, as Qwen2, Qwen2.5 and Qwen3 use it;
 * Llama 3, 3.0's form and from 3.1 on the dated system header; Llama 2's
 * [INST] with <<SYS>>; Mistral's [INST] forms), the details that differ
 * between versions read from the template text too. A template that was
 * edited past what its markers show renders as its family does, which may
 * differ from what transformers renders. Read-only once loaded: rendering
 * may run on several threads. */
typedef struct wl_chat wl_chat;

/* Reads model_dir's chat template: chat_template.jinja when there is one,
 * else tokenizer_config.json's chat_template (a string, or a list of
 * {name, template} of which "default" is taken), and that file's
 * bos_token and eos_token (strings or objects with "content"). An error
 * when model_dir is not a folder, or for a file that is there but
 * unreadable or malformed (not JSON,
 * chat_template or a token of the wrong type, a list entry without name
 * and template). No template (or a list without "default"), or one of no
 * known family, loads: rendering then fails, saying so. */
int wl_chat_load(wl_chat **c, const char *model_dir);
void wl_chat_free(wl_chat *c);
/* "ChatML", "Llama 3", "Llama 2" or "Mistral"; NULL when rendering fails. */
const char *wl_chat_family(const wl_chat *c);
/* The text of the token that closes an answer in this format
 * ("<|im_end|>", "<|eot_id|>", the eos_token of the [INST] formats), for
 * the caller to stop on; NULL when not known. */
const char *wl_chat_end_of_turn(const wl_chat *c);
/* Renders messages, an OpenAI chat request's "messages": an array of
 * objects with a string "role" (system, user, assistant, tool, or
 * developer, taken as system) and a "content" that is a string or an
 * array of parts, whose "text" parts are joined as they are (no
 * separator). With add_generation_prompt the text ends with the opening
 * of an assistant turn (the [INST] formats end there anyway). *text is
 * malloc'd, NUL-terminated. *add_special is 0 when the text already opens
 * with the BOS (encode it with wl_encode's add_special 0), 1 when it does
 * not (let the tokenizer add its own, if its post-processor has one). On
 * error (-1, *text NULL, *add_special untouched): the model has no chat
 * template or one not recognised, messages is not a non-empty array, a
 * message is not an object, lacks a role or content or has one of the
 * wrong type, a part is not a text part, content holds a NUL, a message
 * carries tool_calls, or the roles do not fit the format (the [INST]
 * formats: an optional system message first, then user and assistant
 * alternating from the user; no tool role). */
int wl_chat_render(const wl_chat *c, json_t *messages, int add_generation_prompt, char **text,
                   int *add_special);

/* ---- the random-model writer ---------------------------------------------- */

typedef struct wl_write_opts {
    const char *preset; /* tiny, 1b, 8b, moe (Mixtral) or qwen2moe */
    uint64_t seed;
    int config_only;    /* config, generation config, tokenizer and its config; no weights */
    size_t shard_bytes; /* split the weights into shards of about this size; 0: preset's */
    int fp32;           /* the weights in fp32 (the same bf16 values, widened) */
    /* the layers' projections in FP8 E4M3 with a scale a row (the same
     * bf16 values, quantized), compressed-tensors' layout; dense presets */
    int fp8;
    /* the dense layers' projections (q, k, v, o, gate, up, down) pruned to
     * the 2:4 pattern (weft_prune_2_4's rule on the drawn values): a model
     * whose weights weft-llm --sparse-2-4 multiplies sparse as they are */
    int prune_2_4;
} wl_write_opts;

int wl_write_random_model(const char *dir, const wl_write_opts *o);

/* ---- paged KV cache (kv.c) ------------------------------------------------- */

/* A model's paged KV cache: per layer a key and a value pool of pages
 * (weft_kv_cache's layout, backend memory), and the block allocator of
 * those pages, shared by all the model's sequences (thread-safe). Page p
 * is page p of every layer's pools, so a sequence has one table. With
 * sharing on, pages filled by a prompt are found again by later prompts
 * that begin with the same tokens (kv.c says how). */
typedef struct wl_kv {
    weft_dtype dtype;
    int first_layer, layers, pages, page_size, kv_heads, head_dim;
    /* the pools of layers first_layer on (the model's, or its pipeline
     * stage's), each pages * page_size * kv_heads * head_dim */
    void **k, **v;
    int sharing; /* share prompt prefixes: set before any sequence */
    /* the allocator, under lock */
    int32_t *refs;        /* [pages]: the sequences holding each page */
    int32_t *next, *prev; /* [pages]: the free list, in the order pages are taken */
    int32_t free_head, free_tail;
    int free_count, lock_made;
    uint64_t *key;   /* [pages]: a published page's prefix key; 0: not published */
    int32_t *tokens; /* [pages][page_size]: a published page's tokens */
    int32_t *index;  /* open addressing over keys: page numbers */
    size_t index_cap, index_used;
    long shared_tokens; /* tokens found in the index instead of computed */
    pthread_mutex_t lock;
} wl_kv;

/* The command line's page size, and its default pool: 4096 tokens, a
 * generate run's sequence of up to 4096 tokens (the tiny model's pools are
 * 2 MiB; Llama 3.1 8B's 512 MiB). */
#define WL_KV_PAGE 16
#define WL_KV_DEFAULT_PAGES 256

/* One sequence's pages: table[i] holds its tokens i * page_size onwards. */
typedef struct wl_kv_seq {
    wl_kv *kv;
    int32_t *table; /* host memory, max_pages entries, used of them taken */
    int max_pages, used;
} wl_kv_seq;

/* The allocator alone (no pools): pages of page_size tokens (a power of
 * two from 16 to 256, as weft_kv_cache asks). */
int wl_kv_pages_init(wl_kv *kv, int pages, int page_size);
/* Task only: the allocator and every layer's pools for m (bf16 or fp16,
 * head_dim 64 or 128: what weft's paged cache takes; else an error). */
int wl_kv_create(wl_kv *kv, const wl_model *m, int pages, int page_size);
/* Task only when it has pools. Every sequence must be released first. */
void wl_kv_destroy(wl_kv *kv);
int wl_kv_free_pages(wl_kv *kv);
/* Layer's cache for one sequence whose device table is block_table. */
weft_kv_cache wl_kv_layer(const wl_kv *kv, int layer, const int32_t *block_table, int max_pages);
/* A sequence of up to max_tokens tokens, holding no page yet. */
int wl_kv_seq_init(wl_kv_seq *s, wl_kv *kv, int max_tokens);
/* Takes pages until the sequence holds tokens tokens; an error naming the
 * shortfall (and taking nothing) when the pool has too few free. */
int wl_kv_seq_grow(wl_kv_seq *s, int tokens);
/* Gives every page back (a sequence that ended or was cancelled); a page
 * another sequence holds stays with it. */
void wl_kv_seq_release(wl_kv_seq *s);
/* With sharing on, a fresh sequence (holding no page) whose prompt is
 * ids[0, n): holds the published pages its prompt begins with (whole
 * pages, short of the prompt's last token). Returns the tokens they hold:
 * the prefill starts there. */
int wl_kv_seq_share(wl_kv_seq *s, const int32_t *ids, int n);
/* After the prefill of ids[0, n): publishes the sequence's pages that the
 * prompt fills entirely, for later prompts to find. */
void wl_kv_seq_publish(wl_kv_seq *s, const int32_t *ids, int n);

/* ---- forward pass and sampling -------------------------------------------- */

typedef struct wl_seq wl_seq;

/* Task only: the buffers of one sequence of up to max_tokens tokens, its
 * keys and values in kv's pages (taken as it grows, all given back by
 * wl_seq_destroy). kv is m's (wl_kv_create) and outlives the sequence. Its
 * activations hold max_step tokens, the most one wl_forward or
 * wl_forward_rows takes (the prompt, or a verify pass; decode steps through
 * a batch use the batch's). */
int wl_seq_create(wl_seq **s, const wl_model *m, wl_kv *kv, int max_tokens, int max_step);
void wl_seq_destroy(wl_seq *s);
/* Task only: runs n tokens at the sequence's next positions and leaves the
 * last one's logits (fp32, vocab of them) in *logits (host memory owned by
 * the sequence). */
int wl_forward(wl_seq *s, const int32_t *ids, int n, const float **logits);
/* A fresh sequence whose prompt is ids[0, n) takes the pages other prompts
 * published for the tokens it begins with (with the cache's sharing on):
 * returns how many tokens that is, the position its own wl_forward starts
 * at (ids + that many). 0 when nothing is shared. */
int wl_seq_share_prefix(wl_seq *s, const int32_t *ids, int n);
/* After the prompt's forward: publishes its whole pages for later prompts. */
void wl_seq_publish_prefix(wl_seq *s, const int32_t *ids, int n);
/* Task only: as wl_forward, but the logits of every one of the n tokens:
 * *rows holds n rows of vocab fp32 logits, row i the next-token logits
 * after ids[i] (host memory owned by the sequence, valid until its next
 * forward call). Speculative decoding's verify pass. The sequence's logits
 * buffers grow to n rows on the first call that needs them (n <=
 * max_step); row n - 1 is what wl_forward would give for these ids, to
 * within the matmul's rounding of n rows against one (not bit for bit). */
int wl_forward_rows(wl_seq *s, const int32_t *ids, int n, const float **rows);
/* Drops the sequence's tokens from position pos on (0 <= pos <= its
 * length): the next forward call runs at pos. Their K and V stay in the
 * pages until later appends overwrite them; attention reads only keys
 * below the sequence's length, so they are never seen. The pages stay the
 * sequence's (they are within its max_tokens, the next tokens reuse them
 * at once, and a generation's pages are reserved for its whole life
 * anyway); wl_seq_destroy gives them back. An error for pos out of range. */
int wl_seq_rewind(wl_seq *s, int pos);
/* The tokens the sequence holds (its next position). */
int wl_seq_length(const wl_seq *s);
/* Swapping a preempted sequence's cache to host memory and back: the bytes
 * of tokens tokens' keys and values in every layer; wl_seq_swap_out (task
 * only) copies s's into host ([layer][k, v][token][kv_heads * head_dim],
 * the model's dtype); wl_seq_swap_in (task only, a fresh sequence) takes
 * pages for tokens tokens and writes them back, after which s holds them
 * bit for bit as the swapped one did. */
size_t wl_seq_swap_bytes(const wl_model *m, int tokens);
int wl_seq_swap_out(wl_seq *s, void *host);
int wl_seq_swap_in(wl_seq *s, const void *host, int tokens);
/* Task only: copies the weights to the task's device when it has one,
 * packed (pack.c), by several tasks at once (telling on_load how far it
 * is); on the host backend packs them in host memory (once, kept until
 * wl_model_close; several tasks may call it at once there; on_load is
 * told the packed bytes once). */
int wl_model_upload(wl_model *m);
int wl_model_release(wl_model *m);
/* Frees the sparse weights of m's layers (--sparse-2-4), once no step uses
 * them: wl_model_release and wl_model_close do. */
void wl_model_drop_sparse(wl_model *m);

/* ---- batched decoding (batch.c) -------------------------------------------- */

/* How a decode step draws a row's token: the sampler's next draw
 * (wl_sampler_next), after the generation's penalties (NULL: none). */
typedef struct wl_draw {
    weft_sampling how;
    const struct wl_pen_track *pen;
} wl_draw;

/* Buffers for one step of up to max_seqs sequences of up to max_tokens
 * tokens each, all of model m and cache kv: a decode step, or a mixed one
 * that also takes up to chunk tokens of a sequence's prompt (0: decode
 * steps only), max_seqs + chunk tokens in all. */
typedef struct wl_batch wl_batch;

/* Task only. */
int wl_batch_create(wl_batch **b, const wl_model *m, wl_kv *kv, int max_seqs, int max_tokens,
                    int chunk);
void wl_batch_destroy(wl_batch *b); /* task only */
/* The thread CPU time b's steps (wl_forward_batch, wl_forward_mixed) have
 * spent on their own host work so far: the checks, staging the inputs,
 * the launch and taking the results, not the wait between (the runtime's
 * waiting threads are the process's, not a step's). A pipeline's first
 * stage counts none (its transfers wait too). */
uint64_t wl_batch_own_cpu_ns(const wl_batch *b);
/* Task only: one decode step of n sequences at once (n <= max_seqs, each
 * already prefilled by wl_forward, none twice): token ids[i] at seqs[i]'s
 * next position. Every op runs once over the n rows (weft_matmul with m =
 * n, one weft_kv_append with per-token sequence ids and positions, one
 * weft_attention_decode over the n block tables and lengths). Each row
 * goes through the ops that wl_forward runs for one token, in the same
 * order. What comes back, each optional (NULL: not made):
 *  - logits[i], seqs[i]'s row (fp32, vocab; host memory of the batch's,
 *    valid until its next step);
 *  - picked[i], the token drawn from that row by draws[i] (NULL: every
 *    row greedy, its largest logit's index), on the backend: a step that
 *    needs no logits copies back one int32 a row. The logits come back as
 *    the model gave them, before the penalties. */
int wl_forward_batch(wl_batch *b, wl_seq *const *seqs, const int32_t *ids, int n,
                     const float **logits, const wl_draw *draws, int32_t *picked);
/* Task only: a mixed step, wl_forward_batch whose sequence i takes
 * counts[i] tokens (1 to the batch's chunk; at most max_seqs + chunk in
 * all) at its next positions: ids holds them one sequence after another.
 * A prompt's chunk (position 0 included) goes in with other sequences'
 * decode tokens and chunks: one pass of every op over all the rows,
 * attention by weft_attention_paged over each sequence's pages (its new
 * keys appended first). What comes back is each sequence's last row's, as
 * wl_forward_batch gives it. Runs eagerly (its rows vary from step to
 * step); a step of one token a sequence goes as wl_forward_batch. */
int wl_forward_mixed(wl_batch *b, wl_seq *const *seqs, const int32_t *ids, const int *counts, int n,
                     const float **logits, const wl_draw *draws, int32_t *picked);

/* ---- pipeline stages over MPI (pipeline.c; batch.c's steps) ----------------- */

/* A process's place in a pipeline of the model's layers over the ranks of
 * MPI_COMM_WORLD: rank r runs a contiguous share of the layers
 * (wl_link_stage), the first rank the embedding too and the last the final
 * norm, the lm_head and the draws. Rank 0 forms the steps (its batch's
 * wl_forward_batch and wl_forward_mixed, its sequences holding the pages);
 * each step's inputs and hidden rows go rank to rank, and the last rank's
 * tokens and logits come back to rank 0. The other ranks serve the steps
 * (wl_batch_follow) until rank 0 ends them (wl_batch_unlink). A pipeline
 * splits a model too large for one GPU; a step still runs its stages one
 * after another. Built without MPI, wl_link_open fails saying so. */
typedef struct wl_link wl_link;

/* One of a step's messages: bytes at `at`. */
typedef struct wl_part {
    void *at;
    size_t bytes;
} wl_part;
enum { WL_MAX_PARTS = 16 };

/* A command run as a rank of an MPI job: MPI initialised at
 * MPI_THREAD_MULTIPLE, run(arg), and MPI finalised; a run that fails
 * (nonzero) ends the job, since the other ranks may wait on this one.
 * run's status, or 1 (with a line on stderr naming cmd) where MPI does not
 * start or the build lacks it. */
int wl_link_job(const char *cmd, int (*run)(void *), void *arg);
/* MPI initialised at MPI_THREAD_MULTIPLE (MPI_Init_thread); rt's tasks may
 * then await MPI requests (weft_mpi_init). The link has a communicator of
 * its own. */
int wl_link_open(wl_link **l, weft_runtime *rt);
void wl_link_close(wl_link *l);
int wl_link_rank(const wl_link *l);
int wl_link_ranks(const wl_link *l);
/* This rank's layers [first, end) of a model of `layers`: an error when
 * the ranks outnumber the layers. */
int wl_link_stage(const wl_link *l, int layers, int *first, int *end);
/* Task only, every rank: each rank's n values (mine) into all, rank by rank. */
int wl_link_gather(wl_link *l, const int32_t *mine, int n, int32_t *all);
/* Task only: the n parts sent to (sending) or received from rank peer, in
 * order, awaited. */
int wl_link_move(wl_link *l, int peer, int sending, const wl_part *parts, int n);

/* Task only, every rank at once: makes b (of a model set to this rank's
 * stage, whose KV cache has as many pages on every rank) one stage of l's
 * pipeline, before its first step; the ranks check that their batches and
 * models agree (an error on every rank if not). On every rank a decode
 * step's device work is a graph region, as a lone batch's is: its inputs
 * arrive in the batch's page-locked buffers, and the transfers follow the
 * step's await. */
int wl_batch_link(wl_batch *b, wl_link *l);
/* Task only, ranks but 0: runs the steps rank 0 sends, each on this stage's
 * layers, until rank 0 ends them (0) or a step fails (-1, with the error:
 * the ranks waiting on this one are then for the job to end). */
int wl_batch_follow(wl_batch *b);
/* Task only, rank 0: ends the other ranks' wl_batch_follow. */
int wl_batch_unlink(wl_batch *b);

/* ---- tensor parallel in one process (tensor_parallel.c; batch.c's steps) ---- */

/* The ranks of a model split over rt's GPUs (rank r on device r, through
 * NCCL) or, on the host backend, over tasks: rank 0's batch forms the
 * steps, which the other ranks' batches run with it (wl_batch_follow_tp),
 * each over its share of the model (wl_model_set_shard). */
typedef struct wl_tp wl_tp;
enum { WL_TP_HEAD_WORDS = 8, WL_MAX_RANKS = 64 };

/* From a thread: a group of `ranks` (2 or more; on GPUs no more than rt
 * has, and NCCL in the build). */
int wl_tp_create(wl_tp **tp, weft_runtime *rt, int ranks);
void wl_tp_destroy(wl_tp *tp); /* once no rank uses it */
int wl_tp_ranks(const wl_tp *tp);
/* Where rank's tasks run: WEFT_DEVICE(rank) on GPUs, 0 (anywhere) on the
 * host backend (weft_task_opts.device). */
unsigned wl_tp_device(const wl_tp *tp, int rank);
/* Task only: returns once every rank has called it; an error (the first
 * failure's) once a rank broke the group. */
int wl_tp_barrier(wl_tp *tp);
/* A rank failed: every wait in the group, now and later, fails with this
 * (the first one's). */
void wl_tp_break(wl_tp *tp, int rank, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Task only, every rank with its own buf of count elements: each buf
 * becomes the sum over the ranks. */
int wl_tp_all_reduce(wl_tp *tp, int rank, void *buf, size_t count, weft_dtype dt);
/* Rank 0: a step (its head, and rank 0's batch whose inputs it copies). */
void wl_tp_post(wl_tp *tp, const int32_t *head, const void *leader);
/* Task only, ranks but 0: the step after the one *seen counts; an error
 * when the group broke before one came. */
int wl_tp_next(wl_tp *tp, uint64_t *seen, int32_t *head, const void **leader);

/* Ranks 1 on of tp, each in a task of its own (on rt's device r; on the
 * host backend anywhere), from a thread or a task: models[r] becomes rank
 * r's share (wl_model_set_shard), with a cache of kv_pages pages and a
 * batch as wl_batch_create makes one (max_seqs, max_tokens, chunk), made
 * as rank 0 makes its own; then each waits in wl_tp_barrier for the
 * others to be ready (rank 0's call of it too) and runs rank 0's steps
 * (wl_batch_follow_tp) until rank 0's batch ends them or the group
 * breaks. A rank whose setup failed breaks the group, saying why. */
void wl_tp_start_ranks(wl_tp *tp, weft_runtime *rt, wl_model *const *models, int kv_pages,
                       int max_seqs, int max_tokens, int chunk);
/* Waits for the ranks wl_tp_start_ranks started to end. */
void wl_tp_join_ranks(wl_tp *tp);

/* Task only: makes b (of rank's shard of the model, on rank's device, its
 * cache as many pages as rank 0's) rank's of tp, before its first step. */
int wl_batch_tp(wl_batch *b, wl_tp *tp, int rank);
/* Task only, ranks but 0: runs rank 0's steps until it ends them (0) or
 * the group breaks (-1, with the failure). */
int wl_batch_follow_tp(wl_batch *b);

/* A batcher: a task (wl_batcher_run) that forms each step's batch from the
 * sequences that have joined it. A sequence task joins, hands its prompt
 * in chunks to wl_batcher_prefill (or prefills itself with wl_forward
 * first), then each next token to wl_batcher_step, which suspends it (a
 * weft condition variable: no worker is blocked) until the batcher has run
 * the step; the batcher runs a step once every joined sequence is waiting,
 * so each step takes all of them (a chunk that does not fit, the next).
 * A sequence that ends or stops (a cancelled request) leaves
 * (wl_batcher_leave) before it is destroyed (its pages go back with
 * wl_seq_destroy); the others go on. A member's task that cancels itself
 * (weft_cancel) gets an error from its next wl_batcher_step and still
 * leaves; so does one cancelled by another task, in whatever it is waiting
 * on (the admission queue, its step: test_llm_batch.c cancels generations
 * at random moments and checks that every one ends and gives its pages
 * back). */
typedef struct wl_batcher wl_batcher;

/* Task only: wl_batch_link and wl_batch_unlink of the batcher's batch. */
int wl_batcher_link(wl_batcher *bt, wl_link *l);
int wl_batcher_unlink(wl_batcher *bt);
/* Task only: wl_batch_tp of the batcher's batch, as rank 0; its unlink
 * ends the other ranks' wl_batch_follow_tp. */
int wl_batcher_tp(wl_batcher *bt, wl_tp *tp);

/* Task only (makes the batch's buffers: chunk as wl_batch_create takes it,
 * the most tokens of one prompt a step takes; 0: decode steps only). */
int wl_batcher_create(wl_batcher **bt, const wl_model *m, wl_kv *kv, int max_seqs, int max_tokens,
                      int chunk);
/* At most `tokens` prompt tokens a step beside decoding rows (0, the
 * default: as many as the batch's rows hold): a chunk that does not fit is
 * cut, its rest run by the next steps, so a step that decodes never
 * carries more prefill than that, whatever the chunks' size. A step with
 * no decoding rows takes chunks whole. */
void wl_batcher_set_prompt_budget(wl_batcher *bt, int tokens);
/* The batcher task's body (arg: the batcher): returns once wl_batcher_close
 * was called and every sequence has left. */
void *wl_batcher_run(void *batcher);
/* At most max_seqs sequences at once; an error past that. */
int wl_batcher_join(wl_batcher *bt, wl_seq *s);
/* What wl_batcher_step returns to a sequence preempted (wl_batcher_evict)
 * before a step took its token: it has left no token in the batch. */
#define WL_PREEMPTED 1

/* Task only: s's next token. *picked is the token the step drew for s by
 * *draw (NULL: greedy, its largest logit; draw's tracker is read during
 * the step); *logits, when asked for, its
 * row as wl_forward_batch gives it, valid until s's next step or its
 * leave (a step whose members ask for none copies no logits to the host).
 * An error of the step is every member's; WL_PREEMPTED once s is evicted. */
int wl_batcher_step(wl_batcher *bt, wl_seq *s, int32_t id, const wl_draw *draw,
                    const float **logits, int32_t *picked);
/* Task only: as wl_batcher_step, but n tokens of s's prompt (1 to the
 * batcher's chunk; ids stay the caller's while it waits), at its next
 * positions (0 included: a member may join before its prefill); *logits
 * and *picked are those of the chunk's last token. A step takes every
 * decode token first, then chunks while its rows last; a chunk left out
 * waits for the next step. */
int wl_batcher_prefill(wl_batcher *bt, wl_seq *s, const int32_t *ids, int n, const wl_draw *draw,
                       const float **logits, int32_t *picked);
void wl_batcher_leave(wl_batcher *bt, wl_seq *s);
/* s's next wl_batcher_step returns WL_PREEMPTED (at once, if it waits for
 * a step that has not taken its token; else when it next calls). Any
 * thread or task. */
void wl_batcher_evict(wl_batcher *bt, const wl_seq *s);
void wl_batcher_close(wl_batcher *bt);
/* Steps run so far and the rows (tokens) they took. */
void wl_batcher_stats(wl_batcher *bt, long *steps, long *rows);
/* Task only: returns once the batcher has run one more step, or at once
 * when no sequence is decoding (or it is closed); WL_PREEMPTED as soon as
 * stop(ctx) (asked every 50 ms at most; NULL: never) says so. An error
 * when the calling task is cancelled while it waits. */
int wl_batcher_next_step(wl_batcher *bt, int (*stop)(void *ctx), void *ctx);
/* Task only, after the batcher's task has returned. */
void wl_batcher_destroy(wl_batcher *bt);

typedef struct wl_sampler {
    float temperature; /* 0: greedy */
    int top_k;         /* 0: all */
    float top_p;       /* 1 (or 0): all */
    /* The seed: the key of weft_sample's draws, and the generator of
     * speculative decoding's acceptance (which moves it). */
    uint64_t state;
    uint64_t drawn; /* draws so far: the next one's Philox offset */
} wl_sampler;

/* The next draw's parameters for weft_sample, on the backend or the host:
 * the same (seed, offset) either way, so one seed gives one text. */
weft_sampling wl_sampler_next(wl_sampler *s);

/* The token: greedy (temperature 0) the largest logit (the smallest id of
 * equal ones); else weft_sample's draw on the host with wl_sampler_next. */
int wl_sample(wl_sampler *s, const float *logits, int vocab);

/* What shapes each draw besides the sampler, as inference servers define
 * it: penalties for what the generation has said - repetition (Hugging
 * Face's: a logit of a token in the prompt or the output so far is divided
 * by it when positive, multiplied when not; 1 or 0: none), OpenAI's
 * frequency and presence penalties (a logit of a token the output holds
 * c > 0 times loses frequency * c + presence) - and then OpenAI's
 * logit_bias (n_bias tokens' logits plus their bias; ids outside the
 * vocabulary are skipped). */
typedef struct wl_penalties {
    float repetition, frequency, presence;
    const int32_t *bias_ids;
    const float *bias;
    int n_bias;
} wl_penalties;

#define WL_MAX_BIAS 300 /* logit_bias entries at most, as OpenAI allows */

int wl_penalties_active(const wl_penalties *p);

/* A generation's penalties as weft_penalize applies them: one adjustment
 * a token of the prompt, of the output or of the biases (the biases of an
 * id given twice summed, ids outside the vocabulary left out), kept as
 * the output grows. */
typedef struct wl_pen_track {
    weft_penalties row;        /* the penalties; first 0, count the adjustments */
    weft_logit_adjust *adjust; /* cap entries */
    int32_t *at;               /* vocab entries: a token's adjustment, or -1 */
    int cap, vocab;
} wl_pen_track;
/* For a prompt and at most max_tokens generated; -1 out of memory. */
int wl_pen_track_init(wl_pen_track *t, const wl_penalties *p, const int32_t *prompt, int n_prompt,
                      int max_tokens, int vocab);
void wl_pen_track_add(wl_pen_track *t, int32_t token); /* a generated token */
void wl_pen_track_free(wl_pen_track *t);

/* The distribution wl_sample draws from (in double here; weft_sample's
 * integer weights round each token's below 2^-32): the tokens kept, in descending
 * order of logit (equal logits: smaller id first), with weights w[i] =
 * exp((l_i - l_max) / T) and p(id[i]) = w[i] / sum. At temperature T > 0
 * the top_k largest are kept (0: all), then of those the fewest whose mass
 * reaches top_p (1 or 0: all); greedy is the argmax alone, weight 1. */
typedef struct wl_dist {
    int n, cap;  /* tokens kept, and room for */
    int32_t *id; /* cap entries */
    double *w;   /* cap entries */
    double sum;
} wl_dist;
int wl_dist_alloc(wl_dist *d, int vocab); /* room for vocab; -1: out of memory */
void wl_dist_free(wl_dist *d);
/* d's tokens, from a d with room for vocab of them. */
int wl_sampler_dist(const wl_sampler *s, const float *logits, int vocab, wl_dist *d);
/* A copy of src's kept tokens into dst (zeroed, or a copy's), which grows
 * to hold them: a nucleus kept in its own few entries. -1: out of memory. */
int wl_dist_copy(wl_dist *dst, const wl_dist *src);
/* A token drawn from d with s's generator (one draw). */
int32_t wl_dist_draw(wl_sampler *s, const wl_dist *d);

/* Speculative decoding's acceptance of one draft token x, with logits the
 * target's row for its position, p its distribution under
 * wl_sampler_dist. The draft's distribution q is one-hot at x (NULL: an
 * n-gram proposed it), or the draft model's, which x was drawn from (its
 * wl_sampler_dist over a vocabulary of at most vocab tokens, drawn by
 * wl_dist_draw). Greedy: accepted when x is the argmax, and the argmax is
 * returned either way. Sampled: accepted with probability
 * min(1, p(x) / q(x)) (one draw of the sampler's generator); on rejection
 * the token is drawn (a second draw) from max(0, p - q), renormalised
 * (with q one-hot: p without x). Either way the token returned is
 * distributed as p, as wl_sample's is (up to weft_sample's rounding of
 * p's weights below 2^-32). *accepted says which. */
int wl_sample_draft(wl_sampler *s, const float *logits, int vocab, int32_t draft, const wl_dist *q,
                    int *accepted);

/* ---- speculative decoding (spec.c) ---------------------------------------- */

#define WL_SPEC_MAX_K 32   /* draft tokens a round at most */
#define WL_NGRAM_DEFAULT 3 /* the longest n-gram the proposer looks up */
#define WL_NGRAM_MAX 16

/* The n-gram (prompt-lookup) proposer: for n = max_ngram down to 1 (and
 * below toks' length), the most recent earlier occurrence of toks' last n
 * tokens; the k tokens that followed it are the draft. Where the
 * continuation reaches the end of toks (the match is less than k tokens
 * back: a repeating pattern), it goes on with the draft's own tokens, as
 * if the draft were appended: a loop of period p is extended, not cut at
 * p. Returns the draft's length, k when an n-gram matched and 0 when none
 * did (or k < 1). Pure: reads toks[0, n), writes draft[0, k). */
int wl_ngram_propose(const int32_t *toks, int n, int max_ngram, int k, int32_t *draft);

/* One verify round's acceptance: rows[i] (vocab logits each) are the
 * target's rows after the last token and after draft[0, i), n_draft + 1 of
 * them; q[i], the draft model's distribution draft[i] was drawn from
 * (NULL: n-grams proposed the draft). Draft tokens are
 * taken in order through wl_sample_draft while accepted; the first
 * rejected one is replaced by the token drawn there (the correction), or,
 * all accepted, a token is sampled from the last row (the bonus). out gets
 * the accepted draft tokens then that token; returns their count
 * (accepted + 1). Greedy, out is plain greedy decoding's. */
int wl_spec_accept(wl_sampler *s, const float *rows, int vocab, const int32_t *draft, int n_draft,
                   const wl_dist *q, int32_t *out);

/* A speculative generation's counts, for the acceptance rate
 * (accepted / proposed) and the tokens a verify pass gives (tokens /
 * rounds). */
typedef struct wl_spec_stats {
    long rounds;   /* verify passes (one wl_forward_rows each) */
    long proposed; /* draft tokens verified */
    long accepted; /* of those, accepted */
    /* tokens the rounds handed to on_token: the accepted ones and each
     * round's correction or bonus, fewer where an end cut a round short;
     * the prefill's first token is not a round's */
    long tokens;
} wl_spec_stats;

/* ---- the engine (engine.c) -------------------------------------------------- */

/* A model served to many generations at once: the weights on the backend,
 * the KV cache and the batcher's task. A generation (wl_engine_generate)
 * is admitted once the pages its prompt and max_tokens can need, and a
 * place in the batch (unless it decodes alone, speculatively), are free
 * (reserved for its whole life, so it is never preempted); waiters are
 * admitted by priority, then in arrival order. */
typedef struct wl_waiter wl_waiter;
enum { WL_PREFILL_CHUNK = 512 };
typedef struct wl_engine {
    wl_model *model;
    weft_runtime *rt;
    int kv_pages, max_seqs, max_tokens; /* max_tokens: a sequence's, prompt and output */
    /* Prompts are prefilled in chunks of this many tokens (0: whole): a
     * chunk a batcher step, beside the running decodes and other prompts'
     * chunks, so a long prompt never holds their tokens back by more than
     * a chunk's time. WL_PREFILL_CHUNK unless changed; read as each
     * generation starts. A chunk longer than the batcher's steps take
     * (batcher_chunk: WL_PREFILL_CHUNK, or max_tokens when smaller), or a
     * whole prompt, is prefilled by its own task between steps. */
    int prefill_chunk;
    wl_kv kv;
    wl_batcher *batcher;
    int batcher_chunk;
    weft_task *batcher_task;
    weft_mutex *lock;                            /* guards the admission state below */
    weft_cond *pages_back;                       /* growing generations wait here for pages */
    wl_waiter *queue, *runners;                  /* waiting, and admitted (the latter unordered) */
    int queued, running, placed, reserved_pages; /* placed: running in the batch */
    long admissions, preemptions, swaps;
    /* Host memory a preempted generation's keys and values may take
     * (wl_seq_swap_out) to come back without recomputing them: 0 (the
     * default) recomputes; set before the first generation. In use: swapped. */
    size_t swap_bytes, swapped;
    /* The draft model of the speculative generations that ask for one
     * (wl_engine_set_draft; NULL: none), and its cache. */
    wl_model *draft;
    wl_kv draft_kv;
    /* Rank 0 of a pipeline (wl_engine_start_pipeline; NULL: one process):
     * the model is its first stage, every prompt goes through the
     * batcher's steps, and nothing speculates or swaps. */
    wl_link *link;
    /* Tensor parallel (wl_engine_start_tp; NULL: one GPU): the group, and
     * its ranks but 0, which run the batcher's steps with rank 0's. */
    wl_tp *tp;
    /* The device of the weights (rank 0's), WEFT_DEVICE(i): the tasks that
     * run generations should be spawned on it (weft_task_opts.device). */
    unsigned device;
    char message[512];
} wl_engine;

/* From a thread (not a task): m is open (wl_model_open) and outlives the
 * engine; its weights go to rt's device, the cache gets kv_pages pages of
 * WL_KV_PAGE tokens, the batch max_seqs places. */
int wl_engine_start(wl_engine *e, weft_runtime *rt, wl_model *m, int kv_pages, int max_seqs,
                    int max_tokens);
/* wl_engine_start on rank 0 of l's pipeline (l open, outliving the
 * engine): m becomes the first stage; wl_engine_stop ends the other
 * ranks' wl_engine_follow. The other ranks call wl_engine_follow at the
 * same time, with the same arguments. */
int wl_engine_start_pipeline(wl_engine *e, weft_runtime *rt, wl_model *m, int kv_pages,
                             int max_seqs, int max_tokens, wl_link *l);
/* From a thread: wl_engine_start with the model split over `ranks` ranks
 * (tensor_parallel.c): models[r], open on the same files and outliving the
 * engine, becomes rank r's share, on rt's device r (on the host backend,
 * in a task of its own); models[0] is the engine's model. Every rank's
 * cache gets kv_pages pages, the shares of the key-value heads. */
int wl_engine_start_tp(wl_engine *e, weft_runtime *rt, wl_model *const *models, int ranks,
                       int kv_pages, int max_seqs, int max_tokens);
/* From a thread, ranks but 0 of l's pipeline: m (open) becomes this rank's
 * stage, and this rank serves the steps of rank 0's engine, started with
 * the same arguments, until it stops. */
int wl_engine_follow(weft_runtime *rt, wl_model *m, int kv_pages, int max_seqs, int max_tokens,
                     wl_link *l);
/* From a thread, after wl_engine_start and before any generation: d (open,
 * outliving the engine) becomes the draft model of the speculative
 * generations that ask for one (wl_gen's use_draft). Its tokenizer must be
 * the target's (the caller checks the files: wl_tokenizers_agree); its
 * vocabulary may be smaller (a draft with a trimmed embedding), not
 * larger. Its weights go to rt's device beside the target's, its cache
 * gets the target's page count (a draft sequence holds fewer tokens than
 * its generation reserves in the target's). */
int wl_engine_set_draft(wl_engine *e, wl_model *d);
/* From a thread, once every generation has returned. */
int wl_engine_stop(wl_engine *e);

typedef struct wl_engine_counts {
    int running, queued;   /* generations admitted, and waiting */
    int pages, used_pages; /* the cache's pages, and those holding tokens */
    int reserved_pages;    /* promised to the running generations */
    long preemptions;      /* generations that gave their pages back to recompute later */
    long swaps;            /* of those, the ones that kept their cache in host memory */
    long shared_tokens;    /* prompt tokens found in pages other prompts published */
    long steps, rows;      /* the batcher's steps and their tokens */
} wl_engine_counts;
void wl_engine_stats(wl_engine *e, wl_engine_counts *out);

typedef enum wl_finish {
    WL_FINISH_LENGTH,   /* max_tokens generated */
    WL_FINISH_STOP,     /* an end-of-sequence token, or on_token said stop */
    WL_FINISH_CANCELLED /* cancelled (the caller's hook, or its task) */
} wl_finish;

/* One generation. */
typedef struct wl_gen {
    const int32_t *prompt;
    int n_prompt, max_tokens; /* max_tokens: generated tokens at most */
    wl_sampler sampler;
    int ignore_eos; /* an end-of-sequence token does not end it */
    /* Admission order: high before normal before low (the caller's task
     * should run at the same weft priority). */
    weft_priority priority;
    /* Each sampled token in order (an end-of-sequence one too, with eos
     * set: it ends the generation), with the logits it was drawn from.
     * Returns 0 to go on, > 0 to stop (a stop string), < 0 to cancel. */
    int (*on_token)(void *ctx, int32_t id, int eos, const float *logits);
    /* on_token reads the logits (logprobs, a display of them). Without it
     * (and without penalties) the decode steps draw on the backend and
     * hand on_token NULL logits. */
    int wants_logits;
    /* Polled while queued and after each token; NULL: never. */
    int (*cancelled)(void *ctx);
    void *ctx;
    /* Speculative decoding (0: off), by the n-gram proposer or the
     * engine's draft model (use_draft): the generation then runs alone,
     * outside the batcher (the batch-1 latency path). After the prefill's
     * token, each round proposes up to speculate_k tokens (wl_ngram_propose
     * over the prompt and the tokens so far, n-grams up to ngram long, 0:
     * WL_NGRAM_DEFAULT; or the draft model's; the draft is cut so a round
     * never passes max_tokens), verifies the last token and the draft in
     * one wl_forward_rows, accepts by wl_spec_accept and rewinds past the
     * rejected tokens. on_token sees each accepted token in order with the
     * row it was drawn from, as in a plain generation (eos, stop,
     * cancellation and max_tokens alike). Greedy, the tokens are plain
     * greedy decoding's; sampled, each token's distribution is the
     * sampler's (the draws, not the distribution, differ from a plain
     * run's). */
    int speculate_k; /* 0, or 1 to WL_SPEC_MAX_K */
    int ngram;       /* 0 (the default), or 1 to WL_NGRAM_MAX */
    /* The engine's draft model proposes instead of n-grams (not with
     * ngram): its own sequence decodes the speculate_k tokens one at a
     * time, greedy or drawn from its row by the sampler's settings with a
     * generator of its own, and wl_spec_accept weighs each against the
     * draft's distribution. */
    int use_draft;
    wl_spec_stats *spec_stats; /* the counts, when given */
    /* Penalties on the logits before each draw (not on those on_token
     * sees): wl_penalties. Not with speculate_k. */
    wl_penalties penalties;
} wl_gen;

/* The errors wl_engine_generate would give a generation of these sizes
 * before admitting it (an empty prompt, max_tokens under 1, past the
 * context, more pages than the cache has). */
int wl_engine_check(const wl_engine *e, int n_prompt, int max_tokens);
/* Task only: queues, then prefills the prompt in the calling task and
 * decodes through the batcher (or alone, speculatively, with
 * speculate_k) until max_tokens, an end-of-sequence token or
 * on_token's stop, or cancellation (*finish says which). Everything the
 * generation took is given back before it returns. -1 on an error (the
 * tokens so far were handed to on_token). */
int wl_engine_generate(wl_engine *e, const wl_gen *g, wl_finish *finish);

/* ---- the load generator (loadgen.c, built with libcurl) -------------------- */

/* `weft-llm loadgen`: argv holds the arguments after "loadgen"; returns
 * the exit status. */
int wl_loadgen_main(int argc, char **argv);

/* ---- the benchmark (bench.c) ------------------------------------------------ */

/* `weft-llm bench MODEL_DIR [options]`: argv holds what follows "bench". */
int wl_bench_main(int argc, char **argv);

/* ---- the server (serve.c) -------------------------------------------------- */

/* `weft-llm serve MODEL_DIR [options]`: argv holds what follows "serve". */
int wl_serve_main(int argc, char **argv);

/* ---- random numbers (shared by the writer and the tests) ------------------ */

uint64_t wl_rand_next(uint64_t *state);
double wl_rand_uniform(uint64_t *state); /* in [0, 1) */
double wl_rand_normal(uint64_t *state);

#endif
