/*
 * attention.h - what weft_attention's files share: the checked arguments,
 * the host reference (attention_host.c) and, with CUDA, the kernels'
 * launchers (attention.cu, and attention_wgmma.cu for Hopper).
 *
 * attention.c resolves every default (kv_heads, strides, scale, the LSE's
 * stride, the RoPE base) before either backend sees the call, so both read
 * plain values and never a zero that means something else.
 */
#ifndef WEFT_OPS_ATTENTION_H
#define WEFT_OPS_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "weft/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checked and resolved; sizes and strides in elements. */
typedef struct weft__attention_args {
    weft_dtype dtype;
    size_t batch, heads, kv_heads, head_dim;
    size_t seq_q, seq_k;                        /* dense lengths, or varlen's longest (the clamp) */
    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* NULL: dense */
    size_t q_stride, k_stride, v_stride, o_stride;
    float scale;
    int causal;
    size_t window; /* 0: none */
    float *lse;
    size_t lse_stride;
    const int32_t *q_positions, *k_positions; /* NULL: no rotation (paged: K never rotates) */
    weft_rope_layout rope_layout;
    float rope_base;
    void *o;
    const void *q, *k, *v;
    /* weft_attention_paged: K and V are the cache's pools (k, v above, rows
     * of kv_heads * head_dim: k_stride), sequence b's keys its table row's
     * first k_lens[b] tokens (clamped into [0, seq_k]) */
    int paged;
    const int32_t *table, *k_lens;
    size_t page_size, pages, max_pages;
    float *host_ws; /* the host reference's scratch (weft__attention_host_prepare) */
} weft__attention_args;

/* Sequence b's first Q and K rows and its lengths Lq, Lk (clamped as
 * weft_attention_desc says), from host-readable tables. */
void weft__attention_sequence(const weft__attention_args *a, size_t b, size_t *q0, size_t *lq,
                              size_t *k0, size_t *lk);

/* Sequence b's key j's row in a paged cache's pools: its table entry
 * clamped into the pool. */
static inline size_t weft__attention_page_row(const weft__attention_args *a, size_t b, size_t j)
{
    int64_t page = a->table[b * a->max_pages + j / a->page_size];
    page = page < 0 ? 0 : page >= (int64_t)a->pages ? (int64_t)a->pages - 1 : page;
    return (size_t)page * a->page_size + j % a->page_size;
}

/* The keys [*lo, *hi) that query i of a sequence of lq queries and lk keys
 * sees (an empty range when none). */
void weft__attention_keys(const weft__attention_args *a, size_t i, size_t lq, size_t lk, size_t *lo,
                          size_t *hi);

/* The host reference, in two steps so that its memory is taken (and can
 * fail, WEFT_ENOMEM) at the call, before anything is enqueued: prepare
 * allocates a->host_ws; run computes and frees it. */
int weft__attention_host_prepare(const char *op, weft__attention_args *a);
void weft__attention_host_run(weft__attention_args *a);

#ifdef WEFT_HAVE_CUDA
/* Enqueues the kernel on stream (a cudaStream_t); the arguments have been
 * checked. WEFT_OK, or the launch's error with CUDA's name for it. */
int weft__attention_cuda(void *stream, const weft__attention_args *a);

/* Hopper's kernel (attention_wgmma.cu, sm_90a): whether it is on for the
 * current device (asked for, compute capability 9.0, its image loaded),
 * whether it takes the call (on, and head_dim 64 or 128), and its
 * launch. */
int weft__attention_wgmma_on(void);
int weft__attention_wgmma_takes(const weft__attention_args *a);
int weft__attention_wgmma_cuda(void *stream, const weft__attention_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif
