/*
 * forward_impl.h - what the one-sequence forward pass (forward.c) and the
 * batched decode step (batch.c) share: a sequence's state and the helpers
 * both run, so that a token's row goes through the same ops in the same
 * order on either path.
 */
#ifndef WL_FORWARD_IMPL_H
#define WL_FORWARD_IMPL_H

#include "llm.h"

/* The buffers of a mixture-of-experts MLP over up to tokens rows (moe.c),
 * carved from one allocation of the backend's memory: the router's logits
 * and tables, the rows in expert order and the experts' activations; for
 * Qwen2-MoE the shared expert's and its one-expert "routing" (its sigmoid
 * weight and identity tables). */
typedef struct wl_moe_bufs {
    void *block;
    void *logits, *xp, *gu, *act, *y;
    weft_moe_routing r;
    void *sgu, *sact, *sy, *slogit;
    weft_moe_routing sr;
} wl_moe_bufs;

/* An FP8 model's projections' inputs, quantized a row at a time: rows x
 * the widest input (hidden, q's or the MLP's width) bytes, and a scale a
 * row (wl_fp8_in_create makes nothing for other models). */
typedef struct wl_fp8_in {
    void *act;
    float *scales;
} wl_fp8_in;

struct wl_seq {
    const wl_model *m;
    wl_kv *kv;
    wl_kv_seq pages;               /* this sequence's pages of kv, its table on the host */
    int max_tokens, max_step, pos; /* max_step: the most tokens one wl_forward takes */
    int rows;                      /* logits rows the buffers hold (wl_forward_rows grows them) */
    size_t q_dim, kv_dim, qkv_dim;
    /* the backend's memory (weft_malloc_async) */
    void *x, *h, *qkv, *attn, *gu, *act;
    wl_moe_bufs moe;                                /* a mixture-of-experts model's */
    wl_fp8_in fp8;                                  /* an FP8 model's */
    float *logits;                                  /* rows x vocab */
    int32_t *positions, *seq_ids, *table, *seq_len; /* seq_len: after the call's tokens */
    int32_t *row_ids;                               /* 0, 1, ...: Qwen3's q/k norms' gathers */
    /* host memory */
    int32_t *pos_host, *zeros; /* pos_host: the call's positions, then its seq_len */
    float *logits_host;        /* rows x vocab */
};

#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != WEFT_OK) {                                                                      \
            wl_fail("%s: %s (%s)", #call, weft_strerror(rc_), weft_last_error());                  \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Whether some layer of m has a dense MLP (and so needs the gate/up and
 * activation buffers a mixture-of-experts layer does not use). */
int wl_model_has_dense_mlp(const wl_model *m);
/* weft_await keeping the error line (a task may resume on another worker). */
void wl_await_keeping_error(void);
/* The model's RoPE (halves layout; Llama 3's scaled frequencies where
 * rope_scaling says so) as weft_kv_append and weft_attention_decode take it;
 * *llama3 holds the scaling the result points to. */
weft_kv_rope wl_kv_rope(const wl_model *m, weft_rope_llama3 *llama3);
/* That RoPE on n tokens' q and k rows, on the calling task's stream. */
int wl_rope(const wl_model *m, void *q, size_t q_stride, void *k, size_t k_stride, int n,
            const int32_t *positions);
/* Qwen3's RMSNorm of each head of q and k, in place, in n rows of q | k | v
 * qkv_stride elements apart, on the calling task's stream: two norms of a
 * token's heads for one row, else q's and k's parts gathered into scratch
 * (n x heads x head_dim elements) by row_ids (0 to n - 1, wl_row_ids),
 * normed in one call each and put back: six calls however many rows. */
int wl_qk_norm(const wl_model *m, const wl_layer *L, void *qkv, size_t qkv_stride, int n,
               void *scratch, const int32_t *row_ids);
/* Task only: n int32s 0 to n - 1 in the backend's memory. */
int wl_row_ids(int32_t **ids, size_t n);
/* Task only. */
int wl_fp8_in_create(wl_fp8_in *in, const wl_model *m, size_t rows);
void wl_fp8_in_destroy(wl_fp8_in *in);
/* A layer's projection, as wl_linear with the model's dtype out; with FP8
 * weights (w_scale, a float per row of w) a's rows are quantized into in
 * (weft_quantize_fp8, a scale a row) and multiplied in FP8 with both
 * scales as weft_matmul's outer vectors, bias and c as wl_linear's. */
int wl_project(const wl_model *m, const wl_fp8_in *in, void *d, size_t ldd, const void *a, size_t k,
               const void *w, const float *w_scale, const weft_sparse_weight *sparse, size_t n_out,
               const void *bias, const void *c, int n);
/* A layer's RMSNorm of x (n rows of the hidden size) with weight norm_w,
 * and the projection of the result: h = norm(x), then wl_project of h. An
 * FP8 model's norm writes the projection's FP8 input itself
 * (weft_rmsnorm_fp8, the same bytes as norming into h and quantizing h),
 * so h is left as it was; every other model's h holds the norm. */
int wl_norm_project(const wl_model *m, const wl_fp8_in *in, void *h, const void *x,
                    const void *norm_w, int n, void *d, size_t ldd, const void *w,
                    const float *w_scale, const weft_sparse_weight *sparse, size_t n_out,
                    const void *bias);
/* d (rows n, leading dimension ldd) = a W^T (+ bias) (+ c), W n_out x k, on
 * the calling task's stream. */
int wl_linear(const wl_model *m, void *d, size_t ldd, const void *a, size_t k, const void *w,
              size_t n_out, const void *bias, const void *c, int n, weft_dtype out_type);

/* ---- mixture of experts (moe.c) ---- */

/* Task only: b's buffers for up to tokens rows of m (a MoE model, uploaded:
 * its experts packed). */
int wl_moe_bufs_create(wl_moe_bufs *b, const wl_model *m, int tokens);
/* Task only: gives b's memory back once the work enqueued before is done. */
void wl_moe_bufs_destroy(wl_moe_bufs *b);
/* Task only: MoE layer li's MLP over n rows, on the task's stream: x (n
 * rows of hidden, the residual) += the experts' combined output for the
 * normed rows h (+ the shared expert's); without residual, x = that output
 * alone (a tensor-parallel rank's share but rank 0's). The same ops in the
 * same order for any n, so a row gives what it gives alone up to the
 * matmuls' sums. */
int wl_moe_mlp(const wl_model *m, wl_moe_bufs *b, int li, void *x, const void *h, int n,
               int residual);

/* ---- packed weights (pack.c) ---- */

/* Copies from host memory to the device, listed to be made by several
 * tasks (forward.c's upload). */
typedef struct wl_copy {
    void *dst;
    const void *src;
    size_t bytes;
} wl_copy;
typedef struct wl_copy_list {
    wl_copy *at;
    size_t n, cap;
    size_t bytes; /* of every copy */
} wl_copy_list;
/* Appends a copy, cut into pieces of at most 64 MiB; -1: out of memory. */
int wl_copy_add(wl_copy_list *l, void *dst, const void *src, size_t bytes);
/* Task only (not to be cancelled): makes l's copies by up to four tasks at
 * once, each a run of about equal bytes, telling m's on_load how far it is
 * every 100 ms and once done. wl_model_upload's; on either backend. */
int wl_copy_all(wl_model *m, const wl_copy_list *l);

/* The bytes of m's packed weights (-1: out of memory), and the packing into
 * dst (that many bytes of device memory): every layer's qkv, qkv_bias, gu,
 * shared_gu, experts_gu and experts_down (those it has) point into dst
 * afterwards, and list gets the copies that fill it. */
long long wl_packed_bytes(wl_model *m);
int wl_pack_list(wl_model *m, char *dst, wl_copy_list *list);
/* The host backend's upload: packs them into m->host_block once. */
int wl_pack_host(wl_model *m);

#endif
