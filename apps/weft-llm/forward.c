/*
 * forward.c - the decoder's forward pass on weft's ops, one sequence per
 * weft task.
 *
 * Every op goes on WEFT_TASK_STREAM, so the same code runs on the host
 * backend (weft's host references, in stream order) and on a GPU (its
 * kernels, with the weights and buffers in device memory: wl_model_upload
 * and weft_malloc_async). Per layer:
 *   h = RMSNorm(x); q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv),
 *   written side by side in one row per token; Qwen3's RMSNorm per head of
 *   q and k; RoPE (halves, as transformers rotates); attention; x = x +
 *   attn Wo^T (the residual is the matmul's C); h = RMSNorm(x); gate and up
 *   side by side, SwiGLU, x = x + act Wd^T (a mixture-of-experts layer's
 *   MLP is moe.c's, shared with batch.c).
 * Then the last token's RMSNorm and the lm_head into fp32 logits
 * (wl_forward), or every new token's (wl_forward_rows: speculative
 * decoding's verify pass, which needs the next-token logits after each
 * draft token). Activations are stored in the model's dtype between ops,
 * as transformers keeps them in a bf16 model; the logits are fp32.
 *
 * Attention runs on weft's attention ops over the model's paged KV cache
 * (kv.c; weft_kv_cache's pools, one block table per sequence):
 *  - each call first takes the pages its new tokens need (an exhausted pool
 *    is an error before anything runs) and appends the new tokens' K and V
 *    to them with weft_kv_append;
 *  - a prompt that starts the sequence (position 0) is processed in one
 *    call: its keys are the whole prompt, so weft_attention (causal) reads
 *    the dense K and V straight from the projection's rows, not the pages;
 *  - a call that continues the sequence (decode, a prompt's later chunk
 *    or one after a shared prefix, a verify pass) runs weft_attention_paged
 *    over the pages, its queries the last of the sequence's keys.
 * Rewinding (wl_seq_rewind, for rejected draft tokens) only moves the
 * sequence's length back: the K and V rows past it stay in the pages until
 * the next append overwrites them, and nothing reads them meanwhile, since
 * attention sees keys below the sequence's length only (and the dense
 * prefill path only the call's own rows).
 * Both ops take Mistral's sliding_window as it is: their window counts the
 * keys a query sees, itself included, as transformers' does.
 * RoPE: weft_rope (weft_rope_scaled with Llama 3's scaled frequencies)
 * rotates q and k in place before the append here, so the append and
 * attention take no fused rotation (a batch's decode step, batch.c, fuses
 * it into both).
 * weft's paged cache and attention take bf16 or fp16 and head_dim 64 or 128
 * (weft_attention 256 too): other models are refused by wl_kv_create.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "forward_impl.h"

/* The error line is the thread's, and a task that waits may resume on
 * another worker: a wait after a failure carries the line across it. */
void wl_await_keeping_error(void)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", wl_error());
    weft_await();
    wl_fail("%s", msg);
}

int wl_model_has_dense_mlp(const wl_model *m)
{
    for (int l = 0; l < m->cfg.layers; l++)
        if (!wl_config_layer_moe(&m->cfg, l))
            return 1;
    return 0;
}

int wl_seq_create(wl_seq **out, const wl_model *m, wl_kv *kv, int max_tokens, int max_step)
{
    const wl_config *c = &m->cfg;
    size_t es = wl_dtype_size(m->dtype), T = (size_t)max_step;
    wl_seq *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return wl_fail("out of memory");
    if (max_step < 1 || max_step > max_tokens) {
        free(s);
        return wl_fail("sequence: a step of %d tokens in a sequence of %d", max_step, max_tokens);
    }
    s->m = m;
    s->kv = kv;
    s->max_tokens = max_tokens;
    s->max_step = max_step;
    s->rows = 1;
    s->q_dim = (size_t)c->heads * c->head_dim;
    s->kv_dim = (size_t)c->kv_heads * c->head_dim;
    s->qkv_dim = s->q_dim + 2 * s->kv_dim;
    if (wl_kv_seq_init(&s->pages, kv, max_tokens)) {
        free(s);
        return -1;
    }
    TRY(weft_malloc_async(&s->x, T * c->hidden * es));
    TRY(weft_malloc_async(&s->h, T * c->hidden * es));
    TRY(weft_malloc_async(&s->qkv, T * s->qkv_dim * es));
    TRY(weft_malloc_async(&s->attn, T * s->q_dim * es));
    if (wl_model_has_dense_mlp(m)) {
        TRY(weft_malloc_async(&s->gu, T * 2 * c->intermediate * es));
        TRY(weft_malloc_async(&s->act, T * c->intermediate * es));
    }
    TRY(weft_malloc_async((void **)&s->logits, (size_t)c->vocab * 4));
    TRY(weft_malloc_async((void **)&s->positions, T * 4));
    TRY(weft_malloc_async((void **)&s->seq_ids, T * 4));
    TRY(weft_malloc_async((void **)&s->table, (size_t)s->pages.max_pages * 4));
    TRY(weft_malloc_async((void **)&s->seq_len, 4));
    if ((c->qk_norm && wl_row_ids(&s->row_ids, T)) || wl_fp8_in_create(&s->fp8, m, T))
        goto fail;
    if (c->experts && wl_moe_bufs_create(&s->moe, m, max_step))
        goto fail;
    s->pos_host = malloc((T + 1) * 4);
    s->zeros = calloc(T, 4);
    s->logits_host = malloc((size_t)c->vocab * 4);
    if (!s->pos_host || !s->zeros || !s->logits_host) {
        wl_fail("out of memory for a sequence of %d tokens", max_tokens);
        goto fail;
    }
    TRY(weft_memcpy_async(s->seq_ids, s->zeros, T * 4)); /* every token is sequence 0 */
    *out = s;
    return 0;
fail : {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", wl_error());
    wl_seq_destroy(s); /* waits: see wl_await_keeping_error */
    return wl_fail("%s", msg);
}
}

void wl_seq_destroy(wl_seq *s)
{
    if (!s)
        return;
    weft_await(); /* nothing of ours may still be in flight */
    void *dev[] = {s->x,      s->h,         s->qkv,     s->attn,  s->gu,      s->act,
                   s->logits, s->positions, s->seq_ids, s->table, s->seq_len, s->row_ids};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i])
            weft_free_async(dev[i]);
    wl_fp8_in_destroy(&s->fp8);
    wl_moe_bufs_destroy(&s->moe);
    weft_await();
    wl_kv_seq_release(&s->pages); /* ended or cancelled: the pages go back */
    free(s->pos_host);
    free(s->zeros);
    free(s->logits_host);
    free(s);
}

weft_kv_rope wl_kv_rope(const wl_model *m, weft_rope_llama3 *llama3)
{
    const wl_config *c = &m->cfg;
    *llama3 = (weft_rope_llama3){.factor = c->rope_factor,
                                 .low_freq_factor = c->rope_low_freq,
                                 .high_freq_factor = c->rope_high_freq,
                                 .original_max_positions = c->rope_original_max};
    return (weft_kv_rope){.layout = WEFT_ROPE_HALVES,
                          .base = (float)c->rope_theta,
                          .scaling = c->rope_llama3 ? llama3 : NULL};
}

int wl_rope(const wl_model *m, void *q, size_t q_stride, void *k, size_t k_stride, int n,
            const int32_t *positions)
{
    const wl_config *c = &m->cfg;
    weft_rope_llama3 llama3;
    weft_kv_rope r = wl_kv_rope(m, &llama3);
    return weft_rope_scaled(WEFT_TASK_STREAM, m->dtype, r.layout, q, (size_t)c->heads, q_stride, k,
                            (size_t)c->kv_heads, k_stride, (size_t)n, (size_t)c->head_dim,
                            positions, r.base, r.scaling);
}

/* One of q's or k's parts of n rows (heads heads each), normed in place:
 * one token's heads directly, several tokens' through scratch, where the
 * part's rows lie one after another, so every head is a row of one call. */
static int norm_heads(const wl_model *m, char *part, size_t qkv_stride, int n, size_t heads,
                      const void *weight, void *scratch, const int32_t *row_ids)
{
    const wl_config *c = &m->cfg;
    size_t hd = (size_t)c->head_dim, width = heads * hd;
    float eps = (float)c->rms_eps;
    if (n == 1)
        return weft_rmsnorm(WEFT_TASK_STREAM, m->dtype, part, NULL, part, NULL, weight, eps, heads,
                            hd, hd);
    int rc = weft_gather_rows(WEFT_TASK_STREAM, m->dtype, scratch, part, row_ids, (size_t)n, width,
                              (size_t)n, qkv_stride, width);
    if (rc == WEFT_OK)
        rc = weft_rmsnorm(WEFT_TASK_STREAM, m->dtype, scratch, NULL, scratch, NULL, weight, eps,
                          (size_t)n * heads, hd, hd);
    if (rc == WEFT_OK)
        rc = weft_gather_rows(WEFT_TASK_STREAM, m->dtype, part, scratch, row_ids, (size_t)n, width,
                              (size_t)n, width, qkv_stride);
    return rc;
}

int wl_qk_norm(const wl_model *m, const wl_layer *L, void *qkv, size_t qkv_stride, int n,
               void *scratch, const int32_t *row_ids)
{
    const wl_config *c = &m->cfg;
    size_t es = wl_dtype_size(m->dtype), q_dim = (size_t)c->heads * c->head_dim;
    char *q = qkv, *k = q + q_dim * es;
    TRY(norm_heads(m, q, qkv_stride, n, (size_t)c->heads, L->q_norm, scratch, row_ids));
    TRY(norm_heads(m, k, qkv_stride, n, (size_t)c->kv_heads, L->k_norm, scratch, row_ids));
    return 0;
fail:
    return -1;
}

int wl_row_ids(int32_t **ids, size_t n)
{
    int32_t *host = malloc(n * sizeof *host);
    if (!host)
        return wl_fail("out of memory for %zu row ids", n);
    for (size_t i = 0; i < n; i++)
        host[i] = (int32_t)i;
    int rc = weft_malloc_async((void **)ids, n * sizeof *host);
    if (rc == WEFT_OK)
        rc = weft_memcpy_async(*ids, host, n * sizeof *host);
    if (rc == WEFT_OK)
        rc = weft_await(); /* host is freed below */
    free(host);
    return rc == WEFT_OK ? 0 : wl_fail("row ids: %s", weft_last_error());
}

/* Attention of the n new tokens (rows of qkv, rotated) for layer li: their
 * K and V into the pages, then the queries against the keys, into attn. */
static int attend(wl_seq *s, int li, int n)
{
    const wl_config *c = &s->m->cfg;
    weft_dtype dt = s->m->dtype;
    size_t es = wl_dtype_size(dt);
    char *qkv = s->qkv;
    weft_kv_cache cache = wl_kv_layer(s->kv, li, s->table, s->pages.max_pages);
    TRY(weft_kv_append(WEFT_TASK_STREAM, &cache, qkv + s->q_dim * es, s->qkv_dim,
                       qkv + (s->q_dim + s->kv_dim) * es, s->qkv_dim, (size_t)n, s->seq_ids,
                       s->positions, NULL));
    weft_attention_desc d = {.dtype = dt,
                             .batch = 1,
                             .heads = (size_t)c->heads,
                             .kv_heads = (size_t)c->kv_heads,
                             .head_dim = (size_t)c->head_dim,
                             .seq_q = (size_t)n,
                             .q_stride = s->qkv_dim,
                             .causal = 1,
                             .window = (size_t)c->sliding_window};
    if (s->pos == 0) {
        /* the whole prompt in this call: its dense K and V are all the keys */
        d.seq_k = (size_t)n;
        d.k_stride = d.v_stride = s->qkv_dim;
        TRY(weft_attention(WEFT_TASK_STREAM, &d, s->attn, qkv, qkv + s->q_dim * es,
                           qkv + (s->q_dim + s->kv_dim) * es));
        return 0;
    }
    /* continuing a cache: the keys are in the pages, the new ones last */
    TRY(weft_attention_paged(WEFT_TASK_STREAM, &cache, &d, s->seq_len, s->attn, qkv));
    return 0;
fail:
    return -1;
}

/* d (rows n, leading dimension ldd) = a W^T (+ bias) (+ c), W n_out x k. */
int wl_linear(const wl_model *mod, void *d, size_t ldd, const void *a, size_t k, const void *w,
              size_t n_out, const void *bias, const void *c, int n, weft_dtype out_type)
{
    weft_matmul_desc desc = {.m = (size_t)n,
                             .n = n_out,
                             .k = k,
                             .type = out_type,
                             .in_type = mod->dtype,
                             .trans_b = 1,
                             .ldd = ldd,
                             .ldc = ldd,
                             .bias = bias,
                             .b_constant = 1}; /* weights: read while the op before ends */
    return weft_matmul(WEFT_TASK_STREAM, &desc, d, a, w, c);
}

int wl_fp8_in_create(wl_fp8_in *in, const wl_model *m, size_t rows)
{
    const wl_config *c = &m->cfg;
    size_t widest = (size_t)c->hidden, q = (size_t)c->heads * c->head_dim;
    widest = q > widest ? q : widest;
    widest = (size_t)c->intermediate > widest ? (size_t)c->intermediate : widest;
    memset(in, 0, sizeof *in);
    if (!c->fp8)
        return 0;
    if (weft_malloc_async(&in->act, rows * widest) != WEFT_OK ||
        weft_malloc_async((void **)&in->scales, rows * sizeof(float)) != WEFT_OK)
        return wl_fail("FP8 inputs of %zu rows: %s", rows, weft_last_error());
    return 0;
}

void wl_fp8_in_destroy(wl_fp8_in *in)
{
    if (in->act)
        weft_free_async(in->act);
    if (in->scales)
        weft_free_async(in->scales);
    memset(in, 0, sizeof *in);
}

/* d = in's quantized rows times FP8 w, both scales as outer vectors. */
static int fp8_product(const wl_model *m, const wl_fp8_in *in, void *d, size_t ldd, size_t k,
                       const void *w, const float *w_scale, size_t n_out, const void *bias,
                       const void *c, int n)
{
    weft_matmul_desc desc = {.m = (size_t)n,
                             .n = n_out,
                             .k = k,
                             .type = m->dtype,
                             .in_type = WEFT_DTYPE_F8_E4M3,
                             .trans_b = 1,
                             .ldd = ldd,
                             .ldc = ldd,
                             .bias = bias,
                             .scale_a_mode = WEFT_MATMUL_SCALE_OUTER,
                             .scale_b_mode = WEFT_MATMUL_SCALE_OUTER,
                             .scale_a = in->scales,
                             .scale_b = w_scale,
                             .b_constant = 1};
    return weft_matmul(WEFT_TASK_STREAM, &desc, d, in->act, w, c);
}

/* wl_linear with the model's dtype out, through the sparse weight when the
 * layer has one (--sparse-2-4). */
static int dense_or_sparse(const wl_model *m, void *d, size_t ldd, const void *a, size_t k,
                           const void *w, const weft_sparse_weight *sparse, size_t n_out,
                           const void *bias, const void *c, int n)
{
    if (!sparse)
        return wl_linear(m, d, ldd, a, k, w, n_out, bias, c, n, m->dtype);
    weft_matmul_desc desc = {.m = (size_t)n,
                             .n = n_out,
                             .k = k,
                             .type = m->dtype,
                             .trans_b = 1,
                             .ldd = ldd,
                             .ldc = ldd,
                             .bias = bias};
    return weft_matmul_sparse(WEFT_TASK_STREAM, &desc, d, a, sparse, c);
}

int wl_project(const wl_model *m, const wl_fp8_in *in, void *d, size_t ldd, const void *a, size_t k,
               const void *w, const float *w_scale, const weft_sparse_weight *sparse, size_t n_out,
               const void *bias, const void *c, int n)
{
    if (!w_scale)
        return dense_or_sparse(m, d, ldd, a, k, w, sparse, n_out, bias, c, n);
    int rc = weft_quantize_fp8(WEFT_TASK_STREAM, WEFT_DTYPE_F8_E4M3, in->act, in->scales, m->dtype,
                               a, (size_t)n, k, k, k);
    return rc ? rc : fp8_product(m, in, d, ldd, k, w, w_scale, n_out, bias, c, n);
}

int wl_norm_project(const wl_model *m, const wl_fp8_in *in, void *h, const void *x,
                    const void *norm_w, int n, void *d, size_t ldd, const void *w,
                    const float *w_scale, const weft_sparse_weight *sparse, size_t n_out,
                    const void *bias)
{
    size_t H = (size_t)m->cfg.hidden;
    float eps = (float)m->cfg.rms_eps;
    int rc;
    if (!w_scale) {
        rc = weft_rmsnorm(WEFT_TASK_STREAM, m->dtype, h, NULL, x, NULL, norm_w, eps, (size_t)n, H,
                          H);
        return rc ? rc : dense_or_sparse(m, d, ldd, h, H, w, sparse, n_out, bias, NULL, n);
    }
    rc = weft_rmsnorm_fp8(WEFT_TASK_STREAM, m->dtype, WEFT_DTYPE_F8_E4M3, in->act, in->scales, NULL,
                          x, NULL, norm_w, eps, (size_t)n, H, H, H);
    return rc ? rc : fp8_product(m, in, d, ldd, H, w, w_scale, n_out, bias, NULL, n);
}

static int layer_forward(wl_seq *s, int li, int n)
{
    const wl_model *m = s->m;
    const wl_config *c = &m->cfg;
    const wl_layer *L = &m->layer[li];
    weft_dtype dt = m->dtype;
    size_t es = wl_dtype_size(dt), H = (size_t)c->hidden, I = (size_t)c->intermediate;
    char *qkv = s->qkv;
    float eps = (float)c->rms_eps;
    TRY(wl_norm_project(m, &s->fp8, s->h, s->x, L->attn_norm, n, qkv, s->qkv_dim, L->qkv,
                        L->qkv_scale, L->qkv_sparse, s->qkv_dim, L->qkv_bias));
    if (c->qk_norm && wl_qk_norm(m, L, qkv, s->qkv_dim, n, s->attn, s->row_ids))
        goto fail;
    TRY(wl_rope(s->m, qkv, s->qkv_dim, qkv + s->q_dim * es, s->qkv_dim, n, s->positions));
    if (attend(s, li, n))
        goto fail;
    TRY(wl_project(m, &s->fp8, s->x, H, s->attn, s->q_dim, L->o, L->o_scale, L->o_sparse, H, NULL,
                   s->x, n));
    if (L->moe) {
        TRY(weft_rmsnorm(WEFT_TASK_STREAM, dt, s->h, NULL, s->x, NULL, L->mlp_norm, eps, (size_t)n,
                         H, H));
        return wl_moe_mlp(m, &s->moe, li, s->x, s->h, n, 1);
    }
    TRY(wl_norm_project(m, &s->fp8, s->h, s->x, L->mlp_norm, n, s->gu, 2 * I, L->gu, L->gu_scale,
                        L->gu_sparse, 2 * I, NULL));
    TRY(weft_glu(WEFT_TASK_STREAM, dt, WEFT_GLU_SWIGLU, s->act, s->gu, (size_t)n, I, 2 * I, I));
    TRY(wl_project(m, &s->fp8, s->x, H, s->act, I, L->down, L->down_scale, L->down_sparse, H, NULL,
                   s->x, n));
    return 0;
fail:
    return -1;
}

/* Makes the logits buffers hold rows rows (doubling, up to max_step, so a
 * verify pass that grows by a row at a time reallocates only a few times).
 * The old device buffer is freed in stream order, after any work that
 * still reads it; the old host rows go at once, which is why a forward
 * call's logits are valid only until the next call. */
static int grow_rows(wl_seq *s, int rows)
{
    size_t V = (size_t)s->m->cfg.vocab;
    if (rows <= s->rows)
        return 0;
    int want = 2 * s->rows > rows ? 2 * s->rows : rows;
    want = want < s->max_step ? want : s->max_step;
    float *dev = NULL, *host = malloc((size_t)want * V * 4);
    if (!host)
        return wl_fail("out of memory for %d rows of logits", want);
    if (weft_malloc_async((void **)&dev, (size_t)want * V * 4) != WEFT_OK) {
        free(host);
        return wl_fail("%d rows of logits: %s", want, weft_last_error());
    }
    if (weft_free_async(s->logits) != WEFT_OK) {
        wl_fail("freeing the logits: %s", weft_last_error());
        weft_free_async(dev);
        free(host);
        return -1;
    }
    free(s->logits_host);
    s->logits = dev;
    s->logits_host = host;
    s->rows = want;
    return 0;
}

/* wl_forward and wl_forward_rows: n tokens at the sequence's next
 * positions, then the final norm and the lm_head over the last rows rows
 * of them (rows <= n). */
static int forward(wl_seq *s, const int32_t *ids, int n, int rows, const float **logits)
{
    const wl_model *m = s->m;
    const wl_config *c = &m->cfg;
    size_t es = wl_dtype_size(m->dtype), H = (size_t)c->hidden, V = (size_t)c->vocab;
    if (!wl_model_whole(m))
        return wl_fail("forward: a pipeline stage runs the batch's steps only");
    if (n < 1 || n > s->max_tokens - s->pos || n > s->max_step)
        return wl_fail("forward: %d tokens at position %d exceed the sequence's %d or its step's "
                       "%d",
                       n, s->pos, s->max_tokens, s->max_step);
    for (int t = 0; t < n; t++) {
        if (ids[t] < 0 || ids[t] >= c->vocab)
            return wl_fail("forward: token id %d is outside the vocabulary (%d)", ids[t], c->vocab);
        s->pos_host[t] = s->pos + t;
    }
    if (grow_rows(s, rows) || wl_kv_seq_grow(&s->pages, s->pos + n))
        return -1;               /* nothing enqueued */
    s->pos_host[n] = s->pos + n; /* the keys once these are appended */
    TRY(weft_memcpy_async(s->positions, s->pos_host, (size_t)n * 4));
    TRY(weft_memcpy_async(s->table, s->pages.table, (size_t)s->pages.used * 4));
    TRY(weft_memcpy_async(s->seq_len, s->pos_host + n, 4));
    for (int t = 0; t < n; t++)
        TRY(weft_memcpy_async((char *)s->x + t * H * es,
                              (const char *)m->embed + (size_t)ids[t] * H * es, H * es));
    for (int li = 0; li < c->layers; li++)
        if (layer_forward(s, li, n))
            goto fail;
    const char *first = (const char *)s->x + (size_t)(n - rows) * H * es;
    TRY(weft_rmsnorm(WEFT_TASK_STREAM, m->dtype, s->h, NULL, first, NULL, m->final_norm,
                     (float)c->rms_eps, (size_t)rows, H, H));
    TRY(wl_linear(s->m, s->logits, V, s->h, H, m->lm_head, V, NULL, NULL, rows, WEFT_DTYPE_F32));
    TRY(weft_memcpy_async(s->logits_host, s->logits, (size_t)rows * V * 4));
    TRY(weft_await());
    s->pos += n;
    *logits = s->logits_host;
    return 0;
fail:
    wl_await_keeping_error(); /* work already enqueued reads our buffers */
    return -1;
}

int wl_seq_share_prefix(wl_seq *s, const int32_t *ids, int n)
{
    if (s->pos)
        return 0;
    s->pos = wl_kv_seq_share(&s->pages, ids, n);
    return s->pos;
}

void wl_seq_publish_prefix(wl_seq *s, const int32_t *ids, int n)
{
    wl_kv_seq_publish(&s->pages, ids, n);
}

int wl_forward(wl_seq *s, const int32_t *ids, int n, const float **logits)
{
    return forward(s, ids, n, 1, logits);
}

int wl_forward_rows(wl_seq *s, const int32_t *ids, int n, const float **rows)
{
    return forward(s, ids, n, n < 1 ? 1 : n, rows);
}

int wl_seq_rewind(wl_seq *s, int pos)
{
    if (pos < 0 || pos > s->pos)
        return wl_fail("rewind: position %d is outside the sequence's 0 to %d", pos, s->pos);
    s->pos = pos; /* the pages stay the sequence's: see llm.h */
    return 0;
}

int wl_seq_length(const wl_seq *s)
{
    return s->pos;
}

size_t wl_seq_swap_bytes(const wl_model *m, int tokens)
{
    const wl_config *c = &m->cfg;
    return (size_t)tokens * 2 * (size_t)c->layers * c->kv_heads * c->head_dim *
           wl_dtype_size(m->dtype);
}

/* A device buffer of bytes, and host copies of the int32 tables the swap
 * needs, freed together in stream order. */
typedef struct swap_scratch {
    void *dev;
    int32_t *idx; /* device: positions 0 .. n - 1, then n zeros (sequence ids) */
    int32_t *idx_host;
} swap_scratch;

static void scratch_free(swap_scratch *x, int failed)
{
    if (x->dev)
        weft_free_async(x->dev);
    if (x->idx)
        weft_free_async(x->idx);
    if (failed) /* the copies read idx_host until they have run */
        wl_await_keeping_error();
    else
        weft_await();
    free(x->idx_host);
}

int wl_seq_swap_out(wl_seq *s, void *host)
{
    const wl_config *c = &s->m->cfg;
    size_t es = wl_dtype_size(s->m->dtype), kv = s->kv_dim, n = (size_t)s->pos;
    size_t ps = (size_t)s->kv->page_size, used = (n + ps - 1) / ps;
    swap_scratch x = {0};
    if (!wl_model_whole(s->m))
        return wl_fail("swap out: a pipeline stage's sequences are not swapped");
    if (n == 0)
        return 0;
    /* the whole pages it uses, a token a row, gathered a layer and pool at
     * a time and copied out */
    TRY(weft_malloc_async(&x.dev, used * ps * kv * es));
    TRY(weft_memcpy_async(s->table, s->pages.table, used * 4));
    for (int li = 0; li < c->layers; li++) {
        weft_kv_cache cache = wl_kv_layer(s->kv, li, s->table, s->pages.max_pages);
        const void *pool[2] = {cache.k, cache.v};
        for (int p = 0; p < 2; p++) {
            TRY(weft_gather_rows(WEFT_TASK_STREAM, s->m->dtype, x.dev, pool[p], s->table, used,
                                 ps * kv, cache.pages, ps * kv, ps * kv));
            TRY(weft_memcpy_async((char *)host + ((size_t)(2 * li + p) * n) * kv * es, x.dev,
                                  n * kv * es));
        }
    }
    TRY(weft_await());
    scratch_free(&x, 0);
    return 0;
fail:
    scratch_free(&x, 1);
    return -1;
}

int wl_seq_swap_in(wl_seq *s, const void *host, int tokens)
{
    const wl_config *c = &s->m->cfg;
    size_t es = wl_dtype_size(s->m->dtype), kv = s->kv_dim, n = (size_t)tokens;
    swap_scratch x = {0};
    if (!wl_model_whole(s->m))
        return wl_fail("swap in: a pipeline stage's sequences are not swapped");
    if (s->pos != 0 || tokens < 1 || tokens > s->max_tokens)
        return wl_fail("swap in: %d tokens into a sequence of %d holding %d", tokens, s->max_tokens,
                       s->pos);
    if (wl_kv_seq_grow(&s->pages, tokens))
        return -1;
    if (!(x.idx_host = malloc(2 * n * sizeof *x.idx_host)))
        return wl_fail("out of memory for %d tokens' positions", tokens);
    for (size_t t = 0; t < n; t++)
        x.idx_host[t] = (int32_t)t, x.idx_host[n + t] = 0;
    TRY(weft_malloc_async(&x.dev, 2 * n * kv * es));
    TRY(weft_malloc_async((void **)&x.idx, 2 * n * sizeof *x.idx));
    TRY(weft_memcpy_async(x.idx, x.idx_host, 2 * n * sizeof *x.idx));
    TRY(weft_memcpy_async(s->table, s->pages.table, (size_t)s->pages.used * 4));
    /* each layer's keys and values back, written into the new pages by
     * position as the forward pass appends them (they are stored rotated) */
    char *k = x.dev, *v = k + n * kv * es;
    for (int li = 0; li < c->layers; li++) {
        weft_kv_cache cache = wl_kv_layer(s->kv, li, s->table, s->pages.max_pages);
        TRY(weft_memcpy_async(k, (const char *)host + (size_t)(2 * li) * n * kv * es, n * kv * es));
        TRY(weft_memcpy_async(v, (const char *)host + (size_t)(2 * li + 1) * n * kv * es,
                              n * kv * es));
        TRY(weft_kv_append(WEFT_TASK_STREAM, &cache, k, kv, v, kv, n, x.idx + n, x.idx, NULL));
    }
    TRY(weft_await());
    scratch_free(&x, 0);
    s->pos = tokens;
    return 0;
fail:
    scratch_free(&x, 1);
    return -1;
}

/* Each weight pointer of m (of its pipeline stage) with its size in
 * bytes: those pack.c leaves alone (the upload's), or with packed nonzero
 * every tensor of the files but the experts (the narrowing's). */
static size_t weight_slots(wl_model *m, const void ***slot, size_t *bytes, int packed)
{
    const wl_config *c = &m->cfg;
    size_t es = wl_dtype_size(m->dtype), n = 0, H = (size_t)c->hidden;
    size_t q = (size_t)c->heads * c->head_dim, kv = (size_t)c->kv_heads * c->head_dim;
    size_t I = (size_t)c->intermediate, hd = (size_t)c->head_dim;
    size_t E = (size_t)c->experts, S = (size_t)c->shared_intermediate;
    size_t wes = c->fp8 ? 1 : es; /* a projection's elements; its scales are fp32 */
#define SLOT(p, count) (slot[n] = (const void **)&(p), bytes[n++] = (count)*es)
#define PROJ(p, count) (slot[n] = (const void **)&(p), bytes[n++] = (count)*wes)
    /* a pipeline stage's: the embedding where it gathers (the first) or is
     * the lm_head (the last, tied), the final norm and lm_head on the last
     * (on tensor parallel's rank 0) */
    int first = m->first_layer == 0, last = wl_model_makes_logits(m);
    if (first || (last && c->tie_embeddings))
        SLOT(m->embed, (size_t)c->vocab * H);
    if (last)
        SLOT(m->final_norm, H);
    if (last && !c->tie_embeddings)
        SLOT(m->lm_head, (size_t)c->vocab * H);
    for (int i = m->first_layer; i < m->end_layer; i++) {
        wl_layer *L = &m->layer[i];
        SLOT(L->attn_norm, H);
        if (!c->fp8 || packed) /* an FP8 model's o and down are packed (pack.c) */
            PROJ(L->o, H * q);
        SLOT(L->mlp_norm, H);
        if (packed) {
            PROJ(L->q, q * H);
            PROJ(L->k, kv * H);
            PROJ(L->v, kv * H);
        }
        if (!L->moe) {
            if (!c->fp8 || packed)
                PROJ(L->down, H * I);
            if (packed) {
                PROJ(L->gate, I * H);
                PROJ(L->up, I * H);
            }
        } else {
            SLOT(L->router, E * H);
            if (S) {
                SLOT(L->shared_down, H * S);
                SLOT(L->shared_router, H);
            }
            if (S && packed) {
                SLOT(L->shared_gate, S * H);
                SLOT(L->shared_up, S * H);
            }
        }
        if (c->attention_bias && packed) {
            SLOT(L->q_bias, q);
            SLOT(L->k_bias, kv);
            SLOT(L->v_bias, kv);
        }
        if (c->qk_norm) {
            SLOT(L->q_norm, hd);
            SLOT(L->k_norm, hd);
        }
    }
#undef SLOT
#undef PROJ
    return n;
}

/* An fp32 model computes in bf16, as weft's attention and paged cache
 * need: every weight (the experts too) rounded once, to nearest, into a
 * host block the model keeps, at its first upload; then it is a bf16
 * model. */
static int narrow_to_bf16(wl_model *m)
{
    const wl_config *c = &m->cfg;
    size_t E = (size_t)c->experts, max = 3 + 16 * (size_t)c->layers + 3 * E * c->layers;
    const void ***slot = malloc(max * sizeof *slot);
    size_t *bytes = malloc(max * sizeof *bytes), n, total = 0;
    if (!slot || !bytes) {
        free(slot);
        free(bytes);
        return wl_fail("out of memory");
    }
    n = weight_slots(m, slot, bytes, 1);
    size_t H = (size_t)c->hidden, M = (size_t)c->moe_intermediate;
    for (int i = m->first_layer; i < m->end_layer; i++)
        for (size_t j = 0; m->layer[i].moe && j < 3 * E; j++) {
            slot[n] = (const void **)&m->layer[i].expert[j];
            bytes[n++] = M * H * 4; /* gate, up and down alike: M x H or H x M */
        }
    for (size_t i = 0; i < n; i++)
        total += bytes[i] / 2;
    char *block = malloc(total ? total : 1);
    if (!block) {
        free(slot);
        free(bytes);
        return wl_fail("out of memory for the fp32 model's %zu bytes in bf16", total);
    }
    for (size_t i = 0, off = 0; i < n; i++) {
        const char *from = *slot[i]; /* a file's bytes: no alignment promised */
        for (size_t e = 0; e < bytes[i] / 4; e++) {
            float v;
            memcpy(&v, from + 4 * e, 4);
            wl_store(WEFT_DTYPE_BF16, block + off, e, v);
        }
        *slot[i] = block + off;
        off += bytes[i] / 2;
    }
    free(slot);
    free(bytes);
    m->narrow_block = block;
    m->dtype = WEFT_DTYPE_BF16;
    if (c->tie_embeddings)
        m->lm_head = m->embed;
    return 0;
}

/* The upload's copies: pieces of at most this many bytes (the progress
 * moves by no more), made by this many tasks at once. */
enum { UPLOAD_PIECE = 64 << 20, UPLOAD_TASKS = 4 };

int wl_copy_add(wl_copy_list *l, void *dst, const void *src, size_t bytes)
{
    for (size_t at = 0; at < bytes; at += UPLOAD_PIECE) {
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 256;
            wl_copy *grown = realloc(l->at, cap * sizeof *grown);
            if (!grown)
                return wl_fail("out of memory for the upload's copies");
            l->at = grown;
            l->cap = cap;
        }
        size_t piece = bytes - at < UPLOAD_PIECE ? bytes - at : UPLOAD_PIECE;
        l->at[l->n++] = (wl_copy){(char *)dst + at, (const char *)src + at, piece};
        l->bytes += piece;
    }
    return 0;
}

/* The state an upload shares with its copying tasks, on the heap: each
 * holds a reference, so a task left to finish on its own (its uploader
 * cancelled) never reads freed memory; the last one out frees it. */
typedef struct upload {
    wl_copy *copies;                /* the list's, copied */
    size_t parts[UPLOAD_TASKS + 1]; /* part i: copies [parts[i], parts[i + 1]) */
    _Atomic size_t done;            /* bytes copied */
    _Atomic int refs, failed;
    char message[512];
} upload;

typedef struct upload_part {
    upload *u;
    int i;
} upload_part;

static void upload_drop(upload *u)
{
    if (atomic_fetch_sub(&u->refs, 1) == 1) {
        free(u->copies);
        free(u);
    }
}

/* Part i of the list, each copy awaited and counted in done. */
static void *upload_part_task(void *arg)
{
    upload_part *p = arg;
    upload *u = p->u;
    for (size_t i = u->parts[p->i]; i < u->parts[p->i + 1] && !atomic_load(&u->failed); i++) {
        const wl_copy *c = &u->copies[i];
        if (weft_memcpy_async(c->dst, c->src, c->bytes) != WEFT_OK || weft_await() != WEFT_OK) {
            if (!atomic_exchange(&u->failed, 1))
                snprintf(u->message, sizeof u->message, "upload: %s", weft_last_error());
            break;
        }
        atomic_fetch_add(&u->done, c->bytes);
    }
    free(p);
    upload_drop(u);
    return NULL;
}

/* The list's copies made by up to UPLOAD_TASKS tasks, each a run of about
 * equal bytes, so that the files' pages are read and the host's side of
 * the copies made on several threads, while this task hands the progress
 * to m's on_load every 100 ms. The tasks work on the caller's device. The
 * uploading task is not to be cancelled (the engine's setup task never
 * is): if it is, its copying tasks are cancelled and left to end on their
 * own, and copies they had under way may still land in the device block. */
int wl_copy_all(wl_model *m, const wl_copy_list *l)
{
    weft_task *tasks[UPLOAD_TASKS];
    int spawned = 0, rc = 0;
    upload *u = calloc(1, sizeof *u);
    if (!u || !(u->copies = malloc((l->n ? l->n : 1) * sizeof *u->copies))) {
        free(u);
        return wl_fail("upload: out of memory");
    }
    if (l->n) /* an empty list may have no array */
        memcpy(u->copies, l->at, l->n * sizeof *u->copies);
    atomic_init(&u->refs, 1);
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.name = "upload";
    if (weft_task_device(&opts.device) != WEFT_OK) {
        upload_drop(u);
        return wl_fail("upload: %s", weft_last_error());
    }
    for (size_t from = 0, acc = 0; from < l->n && spawned < UPLOAD_TASKS; spawned++) {
        size_t goal = l->bytes / UPLOAD_TASKS * (size_t)(spawned + 1), to = from;
        while (to < l->n && (to == from || acc < goal || spawned == UPLOAD_TASKS - 1))
            acc += l->at[to++].bytes;
        /* part s is [parts[s], parts[s + 1]): parts[s] was set before task
         * s - 1 was spawned (parts[0] is 0), and is not written again
         * while that task reads it */
        u->parts[spawned + 1] = to;
        from = to;
        upload_part *p = malloc(sizeof *p);
        if (!p) {
            rc = wl_fail("upload: out of memory");
            break;
        }
        *p = (upload_part){u, spawned};
        atomic_fetch_add(&u->refs, 1);
        if (weft_spawn(weft_runtime_current(), &tasks[spawned], upload_part_task, p, &opts) !=
            WEFT_OK) {
            atomic_fetch_sub(&u->refs, 1);
            free(p);
            rc = wl_fail("upload: a copying task: %s", weft_last_error());
            break;
        }
    }
    if (rc)
        atomic_store(&u->failed, 1); /* the others stop at their next copy */
    for (int i = 0; i < spawned; i++) {
        int jr;
        while ((jr = weft_join_until(tasks[i], NULL, weft_deadline_in_ns(100 * 1000000ull))) ==
               WEFT_ETIMEDOUT)
            if (m->on_load)
                m->on_load(m->load_ctx, atomic_load(&u->done), l->bytes);
        if (jr == WEFT_ECANCELED) { /* this task's: the copying tasks end on their own */
            atomic_store(&u->failed, 1);
            for (int j = i; j < spawned; j++) {
                weft_cancel(tasks[j]);
                weft_detach(tasks[j]);
            }
            rc = wl_fail("upload: cancelled");
            break;
        }
        if (jr != WEFT_OK && !rc)
            rc = wl_fail("upload: a copying task: %s", weft_last_error());
    }
    if (!rc && atomic_load(&u->failed))
        rc = wl_fail("%s", u->message);
    if (!rc && m->on_load)
        m->on_load(m->load_ctx, l->bytes, l->bytes);
    upload_drop(u);
    return rc;
}

/* ---- 2:4 sparse projections (--sparse-2-4) ------------------------------ */

/* A projection (n x k at w, packed rows) pruned to 2:4 and made a sparse
 * weight, from a copy: the weight itself stays as read (the host backend
 * reads it from the mapped file). */
static int sparse_one(const wl_model *m, int li, const char *what, const void *w, size_t n,
                      size_t k, weft_sparse_weight **out)
{
    size_t bytes = n * k * wl_dtype_size(m->dtype);
    void *stream = NULL, *copy = NULL;
    int rc = -1;
    if (weft_stream(&stream) != WEFT_OK)
        return wl_fail("--sparse-2-4: %s", weft_last_error());
    if (stream ? weft_malloc_async(&copy, bytes) != WEFT_OK : !(copy = malloc(bytes)))
        return wl_fail("--sparse-2-4: layer %d's %s: out of memory", li, what);
    if (!stream)
        memcpy(copy, w, bytes);
    if ((stream && weft_memcpy_async(copy, w, bytes) != WEFT_OK) ||
        weft_prune_2_4(WEFT_TASK_STREAM, m->dtype, copy, n, k, k) != WEFT_OK ||
        weft_sparse_weight_create(WEFT_TASK_STREAM, m->dtype, copy, n, k, k, out) != WEFT_OK)
        wl_fail("--sparse-2-4: layer %d's %s (%zu x %zu): %s", li, what, n, k, weft_last_error());
    else
        rc = 0;
    if (stream) /* after the weight's creation, which waited for the stream */
        weft_free_async(copy);
    else
        free(copy);
    return rc;
}

/* Every dense layer's projections of the model's stage as sparse weights;
 * a mixture of experts' layers keep their dense experts (the grouped
 * matmul has no sparse form). */
static int sparsify(wl_model *m)
{
    const wl_config *c = &m->cfg;
    size_t H = (size_t)c->hidden, I = (size_t)c->intermediate;
    size_t q = (size_t)c->heads * (size_t)c->head_dim,
           kv = (size_t)c->kv_heads * (size_t)c->head_dim;
    for (int li = m->first_layer; li < m->end_layer; li++) {
        wl_layer *L = &m->layer[li];
        if (L->qkv_scale)
            return wl_fail("--sparse-2-4: layer %d's projections are FP8; the sparse product "
                           "takes bf16 or fp16 weights",
                           li);
        if (sparse_one(m, li, "q|k|v", L->qkv, q + 2 * kv, H, &L->qkv_sparse) ||
            sparse_one(m, li, "o", L->o, H, q, &L->o_sparse))
            return -1;
        if (!L->moe && (sparse_one(m, li, "gate|up", L->gu, 2 * I, H, &L->gu_sparse) ||
                        sparse_one(m, li, "down", L->down, H, I, &L->down_sparse)))
            return -1;
    }
    return 0;
}

void wl_model_drop_sparse(wl_model *m)
{
    for (int li = 0; m->layer && li < m->cfg.layers; li++) {
        wl_layer *L = &m->layer[li];
        weft_sparse_weight_destroy(L->qkv_sparse);
        weft_sparse_weight_destroy(L->o_sparse);
        weft_sparse_weight_destroy(L->gu_sparse);
        weft_sparse_weight_destroy(L->down_sparse);
        L->qkv_sparse = L->o_sparse = L->gu_sparse = L->down_sparse = NULL;
    }
}

int wl_model_upload(wl_model *m)
{
    void *stream = NULL;
    if (m->dtype == WEFT_DTYPE_F32 && narrow_to_bf16(m))
        return -1;
    if (weft_stream(&stream) != WEFT_OK)
        return wl_fail("upload: %s", weft_last_error());
    if (!stream) { /* the host backend reads the mapped files and its packed block */
        long long packed = wl_packed_bytes(m);
        int rc = packed < 0 ? -1 : wl_pack_host(m);
        if (!rc && m->on_load)
            m->on_load(m->load_ctx, (size_t)packed, (size_t)packed);
        return rc || !m->sparse_2_4 ? rc : sparsify(m);
    }
    size_t max = 3 + 24 * (size_t)m->cfg.layers, n, total = 0;
    const void ***slot = malloc(max * sizeof *slot);
    size_t *bytes = malloc(max * sizeof *bytes);
    wl_copy_list list = {0};
    int rc = -1;
    if (!slot || !bytes) {
        wl_fail("out of memory");
        goto out;
    }
    n = weight_slots(m, slot, bytes, 0);
    for (size_t i = 0; i < n; i++)
        total += (bytes[i] + 255) / 256 * 256; /* each weight 256-byte aligned */
    size_t packed_at = total;
    long long packed = wl_packed_bytes(m);
    if (packed < 0)
        goto out;
    total += (size_t)packed;
    char *block = NULL;
    if (weft_malloc_async((void **)&block, total) != WEFT_OK) {
        wl_fail("upload: %zu bytes of weights: %s", total, weft_last_error());
        goto out;
    }
    m->device_block = block;       /* wl_model_release frees it, whatever happens next */
    if (weft_await() != WEFT_OK) { /* the block is there before other tasks copy into it */
        wl_fail("upload: %s", weft_last_error());
        goto out;
    }
    for (size_t i = 0, off = 0; i < n; i++) {
        if (wl_copy_add(&list, block + off, *slot[i], bytes[i]))
            goto out;
        *slot[i] = block + off;
        off += (bytes[i] + 255) / 256 * 256;
    }
    if (wl_pack_list(m, block + packed_at, &list) || wl_copy_all(m, &list))
        goto out;
    if (m->cfg.tie_embeddings)
        m->lm_head = m->embed;
    rc = m->sparse_2_4 ? sparsify(m) : 0;
out:
    free(slot);
    free(bytes);
    free(list.at);
    return rc;
}

int wl_model_release(wl_model *m)
{
    if (!m->device_block)
        return 0;
    TRY(weft_free_async(m->device_block));
    TRY(weft_await());
    wl_model_drop_sparse(m); /* no step uses them now */
    m->device_block = NULL;
    return 0;
fail:
    return -1;
}
