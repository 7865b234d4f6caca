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
 *   side by side, SwiGLU, x = x + act Wd^T.
 * Then the last token's RMSNorm and the lm_head into fp32 logits.
 * Activations are stored in the model's dtype between ops, as transformers
 * keeps them in a bf16 model; the logits are fp32.
 *
 * ATTENTION IS A HOST STAND-IN (attend_host below): until weft has its
 * attention op and paged KV cache, q, k and v are copied to the host, the
 * KV cache is a plain contiguous fp32 array per sequence, and causal GQA
 * attention (with Mistral's sliding window) runs in C, its output copied
 * back. Llama 3's scaled RoPE frequencies are applied there too, since
 * weft_rope takes one base. Swap both for the weft ops when they land.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

struct wl_seq {
    const wl_model *m;
    int max_tokens, pos;
    size_t q_dim, kv_dim, qkv_dim;
    /* the backend's memory (weft_malloc_async) */
    void *x, *h, *qkv, *attn, *gu, *act;
    float *logits;
    int32_t *positions;
    /* host memory */
    void *qkv_host, *attn_host;
    int32_t *pos_host;
    float *logits_host, *kcache, *vcache, *scores;
};

#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != WEFT_OK) {                                                                      \
            wl_fail("%s: %s (%s)", #call, weft_strerror(rc_), weft_last_error());                  \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* The error line is the thread's, and a task that waits may resume on
 * another worker: a wait after a failure carries the line across it. */
static void await_keeping_error(void)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", wl_error());
    weft_await();
    wl_fail("%s", msg);
}

int wl_seq_create(wl_seq **out, const wl_model *m, int max_tokens)
{
    const wl_config *c = &m->cfg;
    size_t es = wl_dtype_size(m->dtype), T = (size_t)max_tokens;
    wl_seq *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return wl_fail("out of memory");
    s->m = m;
    s->max_tokens = max_tokens;
    s->q_dim = (size_t)c->heads * c->head_dim;
    s->kv_dim = (size_t)c->kv_heads * c->head_dim;
    s->qkv_dim = s->q_dim + 2 * s->kv_dim;
    TRY(weft_malloc_async(&s->x, T * c->hidden * es));
    TRY(weft_malloc_async(&s->h, T * c->hidden * es));
    TRY(weft_malloc_async(&s->qkv, T * s->qkv_dim * es));
    TRY(weft_malloc_async(&s->attn, T * s->q_dim * es));
    TRY(weft_malloc_async(&s->gu, T * 2 * c->intermediate * es));
    TRY(weft_malloc_async(&s->act, T * c->intermediate * es));
    TRY(weft_malloc_async((void **)&s->logits, (size_t)c->vocab * 4));
    TRY(weft_malloc_async((void **)&s->positions, T * 4));
    s->qkv_host = malloc(T * s->qkv_dim * es);
    s->attn_host = malloc(T * s->q_dim * es);
    s->pos_host = malloc(T * 4);
    s->logits_host = malloc((size_t)c->vocab * 4);
    s->kcache = malloc((size_t)c->layers * T * s->kv_dim * 4);
    s->vcache = malloc((size_t)c->layers * T * s->kv_dim * 4);
    s->scores = malloc(T * sizeof *s->scores);
    if (!s->qkv_host || !s->attn_host || !s->pos_host || !s->logits_host || !s->kcache ||
        !s->vcache || !s->scores) {
        wl_fail("out of memory for a sequence of %d tokens", max_tokens);
        goto fail;
    }
    *out = s;
    return 0;
fail : {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", wl_error());
    wl_seq_destroy(s); /* waits: see await_keeping_error */
    return wl_fail("%s", msg);
}
}

void wl_seq_destroy(wl_seq *s)
{
    if (!s)
        return;
    weft_await(); /* nothing of ours may still be in flight */
    void *dev[] = {s->x, s->h, s->qkv, s->attn, s->gu, s->act, s->logits, s->positions};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        weft_free_async(dev[i]);
    weft_await();
    free(s->qkv_host);
    free(s->attn_host);
    free(s->pos_host);
    free(s->logits_host);
    free(s->kcache);
    free(s->vcache);
    free(s->scores);
    free(s);
}

/* Llama 3's frequency for pair i: long wavelengths slowed by factor, short
 * ones kept, a smooth blend between. */
static double rope_freq(const wl_config *c, int i)
{
    double f = pow(c->rope_theta, -2.0 * i / c->head_dim);
    if (!c->rope_llama3)
        return f;
    double wavelen = 2 * M_PI / f, old = c->rope_original_max;
    if (wavelen < old / c->rope_high_freq)
        return f;
    if (wavelen > old / c->rope_low_freq)
        return f / c->rope_factor;
    double smooth = (old / wavelen - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
    return (1 - smooth) * f / c->rope_factor + smooth * f;
}

/* Host stand-in for weft_rope with scaled frequencies (halves layout). */
static void rope_host(const wl_seq *s, void *row, int heads, int pos)
{
    const wl_config *c = &s->m->cfg;
    weft_dtype dt = s->m->dtype;
    int half = c->head_dim / 2;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < half; i++) {
            double a = pos * rope_freq(c, i);
            float cs = (float)cos(a), sn = (float)sin(a);
            size_t j = (size_t)h * c->head_dim + i;
            float x = wl_load(dt, row, j), y = wl_load(dt, row, j + half);
            wl_store(dt, row, j, x * cs - y * sn);
            wl_store(dt, row, j + half, x * sn + y * cs);
        }
}

/* HOST STAND-IN for weft_attention (see the top of the file): the new
 * tokens' k and v join the cache, then each query head attends causally to
 * its group's key head over the cached positions. Scores and sums in
 * double; the output is rounded to the model's dtype once. */
static void attend_host(wl_seq *s, int layer, int n)
{
    const wl_config *c = &s->m->cfg;
    weft_dtype dt = s->m->dtype;
    int hd = c->head_dim, group = c->heads / c->kv_heads;
    float *kc = s->kcache + (size_t)layer * s->max_tokens * s->kv_dim;
    float *vc = s->vcache + (size_t)layer * s->max_tokens * s->kv_dim;
    for (int t = 0; t < n; t++) {
        char *row = (char *)s->qkv_host + (size_t)t * s->qkv_dim * wl_dtype_size(dt);
        if (c->rope_llama3) {
            rope_host(s, row, c->heads, s->pos + t);
            rope_host(s, row + s->q_dim * wl_dtype_size(dt), c->kv_heads, s->pos + t);
        }
        for (size_t j = 0; j < s->kv_dim; j++) {
            kc[(size_t)(s->pos + t) * s->kv_dim + j] = wl_load(dt, row, s->q_dim + j);
            vc[(size_t)(s->pos + t) * s->kv_dim + j] = wl_load(dt, row, s->q_dim + s->kv_dim + j);
        }
    }
    double scale = 1.0 / sqrt((double)hd);
    for (int t = 0; t < n; t++) {
        const char *row = (const char *)s->qkv_host + (size_t)t * s->qkv_dim * wl_dtype_size(dt);
        int p = s->pos + t, lo = 0;
        if (c->sliding_window && p - c->sliding_window + 1 > 0)
            lo = p - c->sliding_window + 1;
        for (int h = 0; h < c->heads; h++) {
            size_t ko = (size_t)(h / group) * hd;
            double mx = -INFINITY, sum = 0;
            for (int j = lo; j <= p; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)wl_load(dt, row, (size_t)h * hd + i) *
                         kc[(size_t)j * s->kv_dim + ko + i];
                s->scores[j] = (float)(d * scale);
                if (s->scores[j] > mx)
                    mx = s->scores[j];
            }
            for (int j = lo; j <= p; j++)
                sum += exp(s->scores[j] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = lo; j <= p; j++)
                    o += exp(s->scores[j] - mx) * vc[(size_t)j * s->kv_dim + ko + i];
                wl_store(dt, s->attn_host, (size_t)t * s->q_dim + (size_t)h * hd + i,
                         (float)(o / sum));
            }
        }
    }
}

/* d (rows n, leading dimension ldd) = a W^T (+ bias) (+ c), W n_out x k. */
static int linear(const wl_seq *s, void *d, size_t ldd, const void *a, size_t k, const void *w,
                  size_t n_out, const void *bias, const void *c, int n, weft_dtype out_type)
{
    weft_matmul_desc desc = {.m = (size_t)n,
                             .n = n_out,
                             .k = k,
                             .type = out_type,
                             .in_type = s->m->dtype,
                             .trans_b = 1,
                             .ldd = ldd,
                             .ldc = ldd,
                             .bias = bias};
    return weft_matmul(WEFT_TASK_STREAM, &desc, d, a, w, c);
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
    TRY(weft_rmsnorm(WEFT_TASK_STREAM, dt, s->h, NULL, s->x, NULL, L->attn_norm, eps, (size_t)n, H,
                     H));
    TRY(linear(s, qkv, s->qkv_dim, s->h, H, L->q, s->q_dim, L->q_bias, NULL, n, dt));
    TRY(linear(s, qkv + s->q_dim * es, s->qkv_dim, s->h, H, L->k, s->kv_dim, L->k_bias, NULL, n,
               dt));
    TRY(linear(s, qkv + (s->q_dim + s->kv_dim) * es, s->qkv_dim, s->h, H, L->v, s->kv_dim,
               L->v_bias, NULL, n, dt));
    for (int t = 0; c->qk_norm && t < n; t++) {
        char *row = qkv + (size_t)t * s->qkv_dim * es;
        size_t hd = (size_t)c->head_dim;
        TRY(weft_rmsnorm(WEFT_TASK_STREAM, dt, row, NULL, row, NULL, L->q_norm, eps,
                         (size_t)c->heads, hd, hd));
        TRY(weft_rmsnorm(WEFT_TASK_STREAM, dt, row + s->q_dim * es, NULL, row + s->q_dim * es, NULL,
                         L->k_norm, eps, (size_t)c->kv_heads, hd, hd));
    }
    if (!c->rope_llama3)
        TRY(weft_rope(WEFT_TASK_STREAM, dt, WEFT_ROPE_HALVES, qkv, (size_t)c->heads, s->qkv_dim,
                      qkv + s->q_dim * es, (size_t)c->kv_heads, s->qkv_dim, (size_t)n,
                      (size_t)c->head_dim, s->positions, (float)c->rope_theta));
    TRY(weft_memcpy_async(s->qkv_host, qkv, (size_t)n * s->qkv_dim * es));
    TRY(weft_await());
    attend_host(s, li, n);
    TRY(weft_memcpy_async(s->attn, s->attn_host, (size_t)n * s->q_dim * es));
    TRY(linear(s, s->x, H, s->attn, s->q_dim, L->o, H, NULL, s->x, n, dt));
    TRY(weft_rmsnorm(WEFT_TASK_STREAM, dt, s->h, NULL, s->x, NULL, L->mlp_norm, eps, (size_t)n, H,
                     H));
    TRY(linear(s, s->gu, 2 * I, s->h, H, L->gate, I, NULL, NULL, n, dt));
    TRY(linear(s, (char *)s->gu + I * es, 2 * I, s->h, H, L->up, I, NULL, NULL, n, dt));
    TRY(weft_glu(WEFT_TASK_STREAM, dt, WEFT_GLU_SWIGLU, s->act, s->gu, (size_t)n, I, 2 * I, I));
    TRY(linear(s, s->x, H, s->act, I, L->down, H, NULL, s->x, n, dt));
    return 0;
fail:
    return -1;
}

int wl_forward(wl_seq *s, const int32_t *ids, int n, const float **logits)
{
    const wl_model *m = s->m;
    const wl_config *c = &m->cfg;
    size_t es = wl_dtype_size(m->dtype), H = (size_t)c->hidden;
    if (n < 1 || n > s->max_tokens - s->pos)
        return wl_fail("forward: %d tokens at position %d exceed the sequence's %d", n, s->pos,
                       s->max_tokens);
    for (int t = 0; t < n; t++) {
        if (ids[t] < 0 || ids[t] >= c->vocab)
            return wl_fail("forward: token id %d is outside the vocabulary (%d)", ids[t], c->vocab);
        s->pos_host[t] = s->pos + t;
    }
    TRY(weft_memcpy_async(s->positions, s->pos_host, (size_t)n * 4));
    for (int t = 0; t < n; t++)
        TRY(weft_memcpy_async((char *)s->x + t * H * es,
                              (const char *)m->embed + (size_t)ids[t] * H * es, H * es));
    for (int li = 0; li < c->layers; li++)
        if (layer_forward(s, li, n))
            goto fail;
    const char *last = (const char *)s->x + (size_t)(n - 1) * H * es;
    TRY(weft_rmsnorm(WEFT_TASK_STREAM, m->dtype, s->h, NULL, last, NULL, m->final_norm,
                     (float)c->rms_eps, 1, H, H));
    TRY(linear(s, s->logits, (size_t)c->vocab, s->h, H, m->lm_head, (size_t)c->vocab, NULL, NULL, 1,
               WEFT_DTYPE_F32));
    TRY(weft_memcpy_async(s->logits_host, s->logits, (size_t)c->vocab * 4));
    TRY(weft_await());
    s->pos += n;
    *logits = s->logits_host;
    return 0;
fail:
    await_keeping_error(); /* work already enqueued reads our buffers */
    return -1;
}

/* Each weight pointer of m with its size in bytes, for the upload. */
static size_t weight_slots(wl_model *m, const void ***slot, size_t *bytes)
{
    const wl_config *c = &m->cfg;
    size_t es = wl_dtype_size(m->dtype), n = 0, H = (size_t)c->hidden;
    size_t q = (size_t)c->heads * c->head_dim, kv = (size_t)c->kv_heads * c->head_dim;
    size_t I = (size_t)c->intermediate, hd = (size_t)c->head_dim;
#define SLOT(p, count) (slot[n] = (const void **)&(p), bytes[n++] = (count)*es)
    SLOT(m->embed, (size_t)c->vocab * H);
    SLOT(m->final_norm, H);
    if (!c->tie_embeddings)
        SLOT(m->lm_head, (size_t)c->vocab * H);
    for (int i = 0; i < c->layers; i++) {
        wl_layer *L = &m->layer[i];
        SLOT(L->attn_norm, H);
        SLOT(L->q, q * H);
        SLOT(L->k, kv * H);
        SLOT(L->v, kv * H);
        SLOT(L->o, H * q);
        SLOT(L->mlp_norm, H);
        SLOT(L->gate, I * H);
        SLOT(L->up, I * H);
        SLOT(L->down, H * I);
        if (c->attention_bias) {
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
    return n;
}

int wl_model_upload(wl_model *m)
{
    void *stream = NULL;
    TRY(weft_stream(&stream));
    if (!stream)
        return 0; /* the host backend reads the mapped files as they are */
    size_t max = 3 + 14 * (size_t)m->cfg.layers, n, total = 0;
    const void ***slot = malloc(max * sizeof *slot);
    size_t *bytes = malloc(max * sizeof *bytes);
    if (!slot || !bytes) {
        free(slot);
        free(bytes);
        return wl_fail("out of memory");
    }
    n = weight_slots(m, slot, bytes);
    for (size_t i = 0; i < n; i++)
        total += (bytes[i] + 255) / 256 * 256; /* each weight 256-byte aligned */
    char *block = NULL;
    if (weft_malloc_async((void **)&block, total) != WEFT_OK) {
        free(slot);
        free(bytes);
        return wl_fail("upload: %zu bytes of weights: %s", total, weft_last_error());
    }
    m->device_block = block;
    for (size_t i = 0, off = 0; i < n; i++) {
        int rc = weft_memcpy_async(block + off, *slot[i], bytes[i]);
        if (rc != WEFT_OK) {
            free(slot);
            free(bytes);
            wl_fail("upload: %s", weft_last_error());
            await_keeping_error();
            return -1;
        }
        *slot[i] = block + off;
        off += (bytes[i] + 255) / 256 * 256;
    }
    if (m->cfg.tie_embeddings)
        m->lm_head = m->embed;
    free(slot);
    free(bytes);
    TRY(weft_await());
    return 0;
fail:
    return -1;
}

int wl_model_release(wl_model *m)
{
    if (!m->device_block)
        return 0;
    TRY(weft_free_async(m->device_block));
    TRY(weft_await());
    m->device_block = NULL;
    return 0;
fail:
    return -1;
}
