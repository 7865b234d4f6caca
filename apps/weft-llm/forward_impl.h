/*
 * forward_impl.h - what the one-sequence forward pass (forward.c) and the
 * batched decode step (batch.c) share: a sequence's state and the helpers
 * both run, so that a token's row goes through the same ops in the same
 * order on either path.
 */
#ifndef WL_FORWARD_IMPL_H
#define WL_FORWARD_IMPL_H

#include "llm.h"

/* Queries per weft_attention_decode call (its q_len's limit). */
#define DECODE_CHUNK 8

struct wl_seq {
    const wl_model *m;
    wl_kv *kv;
    wl_kv_seq pages;               /* this sequence's pages of kv, its table on the host */
    int max_tokens, max_step, pos; /* max_step: the most tokens one wl_forward takes */
    int rows;                      /* logits rows the buffers hold (wl_forward_rows grows them) */
    size_t q_dim, kv_dim, qkv_dim, workspace_bytes;
    /* the backend's memory (weft_malloc_async) */
    void *x, *h, *qkv, *attn, *gu, *act, *q_packed, *workspace;
    float *logits;                                   /* rows x vocab */
    int32_t *positions, *seq_ids, *table, *seq_lens; /* seq_lens: one a decode chunk */
    /* host memory */
    int32_t *pos_host, *zeros, *lens_host;
    float *logits_host; /* rows x vocab */
};

#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != WEFT_OK) {                                                                      \
            wl_fail("%s: %s (%s)", #call, weft_strerror(rc_), weft_last_error());                  \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* weft_await keeping the error line (a task may resume on another worker). */
void wl_await_keeping_error(void);
/* RoPE as the model's config defines it (halves layout; Llama 3's scaled
 * frequencies where rope_scaling says so) on n tokens' q and k rows, on the
 * calling task's stream. */
int wl_rope(const wl_model *m, void *q, size_t q_stride, void *k, size_t k_stride, int n,
            const int32_t *positions);
/* d (rows n, leading dimension ldd) = a W^T (+ bias) (+ c), W n_out x k, on
 * the calling task's stream. */
int wl_linear(const wl_model *m, void *d, size_t ldd, const void *a, size_t k, const void *w,
              size_t n_out, const void *bias, const void *c, int n, weft_dtype out_type);

#endif
