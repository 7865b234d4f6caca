/*
 * attention.c - weft_attention: its argument checks, the masks' key ranges
 * both backends share, and the choice of backend.
 *
 * The fusion: a framework computes attention as a batched matmul into a
 * [heads][Lq][Lk] score tensor, a masked softmax over it and a second
 * matmul; the scores' round trip through memory dominates at long
 * sequences. Here each block of queries walks the keys in blocks, keeps a
 * running maximum and sum of its rows (the online softmax) and its output
 * in registers, and writes O and the LSE once (attention.cu). RoPE, when
 * asked, turns Q and K as they are read, so rotated copies never exist.
 *
 * Every check runs here, before either backend sees the call, and the
 * GPU's own requirements (16-byte rows, grid limits) are asked of the host
 * too, so a call valid on one backend is valid on the other.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/ops_internal.h"
#include "ops/paged.h"

static const char DENSE[] = "weft_attention", PAGED[] = "weft_attention_paged";

/* The grid's second and third dimensions hold heads and sequences. */
enum { GRID_LIMIT = 65535 };

/* A paged sequence's keys: its length clamped into [0, seq_k]. */
static size_t paged_keys(const weft__attention_args *a, size_t b)
{
    int64_t n = a->k_lens[b];
    return n < 0 ? 0 : n > (int64_t)a->seq_k ? a->seq_k : (size_t)n;
}

void weft__attention_sequence(const weft__attention_args *a, size_t b, size_t *q0, size_t *lq,
                              size_t *k0, size_t *lk)
{
    if (!a->cu_seqlens_q) {
        *q0 = b * a->seq_q, *lq = a->seq_q;
        *k0 = b * a->seq_k, *lk = a->seq_k;
        if (a->paged)
            *k0 = 0, *lk = paged_keys(a, b);
        return;
    }
    int64_t qs = a->cu_seqlens_q[b], qe = a->cu_seqlens_q[b + 1];
    int64_t nq = qe - qs;
    nq = nq < 0 ? 0 : nq > (int64_t)a->seq_q ? (int64_t)a->seq_q : nq;
    *q0 = qs < 0 ? 0 : (size_t)qs, *lq = (size_t)nq;
    if (a->paged) {
        *k0 = 0, *lk = paged_keys(a, b);
        return;
    }
    int64_t ks = a->cu_seqlens_k[b], ke = a->cu_seqlens_k[b + 1];
    int64_t nk = ke - ks;
    nk = nk < 0 ? 0 : nk > (int64_t)a->seq_k ? (int64_t)a->seq_k : nk;
    *k0 = ks < 0 ? 0 : (size_t)ks, *lk = (size_t)nk;
}

void weft__attention_keys(const weft__attention_args *a, size_t i, size_t lq, size_t lk, size_t *lo,
                          size_t *hi)
{
    *lo = 0, *hi = lk;
    if (!a->causal)
        return;
    /* p = i + lk - lq, the query's position among the keys; p < 0 sees none */
    if (i + lk < lq) {
        *hi = 0;
        return;
    }
    size_t p = i + lk - lq;
    *hi = p + 1 < lk ? p + 1 : lk;
    if (a->window && p + 1 > a->window)
        *lo = p + 1 - a->window;
}

/* A tensor of rows x width elements, stride apart (0 = width): checks it
 * and returns the resolved stride in *out. */
static int check_tensor(const char *op, const char *what, const void *p, size_t rows, size_t width,
                        size_t stride, weft_dtype dtype, size_t *out)
{
    int rc;
    if (stride == 0)
        stride = width;
    if ((rc = weft__check_ptr(op, what, p, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_rows(op, what, rows, width, stride, dtype)) != WEFT_OK)
        return rc;
    if ((uintptr_t)p % 16 != 0)
        return weft__fail(WEFT_EINVAL, "%s: %s is not 16-byte aligned", op, what);
    if (stride % 8 != 0)
        return weft__fail(WEFT_EINVAL, "%s: %s's stride %zu is not a multiple of 8 elements", op,
                          what, stride);
    *out = stride;
    return WEFT_OK;
}

static int check_int32(const char *op, const char *what, const int32_t *p)
{
    if (p && (uintptr_t)p % sizeof *p != 0)
        return weft__fail(WEFT_EINVAL, "%s: %s is not 4-byte aligned", op, what);
    return WEFT_OK;
}

/* A varlen table on the host: nondecreasing from cu[0] >= 0, lengths at
 * most longest; *rows gets cu[batch]. */
static int check_table(const char *op, const char *what, const int32_t *cu, size_t batch,
                       size_t longest, size_t *rows)
{
    if (cu[0] < 0)
        return weft__fail(WEFT_EINVAL, "%s: %s[0] is %d, negative", op, what, (int)cu[0]);
    for (size_t b = 0; b < batch; b++) {
        if (cu[b + 1] < cu[b])
            return weft__fail(WEFT_EINVAL, "%s: %s decreases at %zu (%d then %d)", op, what, b,
                              (int)cu[b], (int)cu[b + 1]);
        if ((size_t)(cu[b + 1] - cu[b]) > longest)
            return weft__fail(WEFT_EINVAL,
                              "%s: sequence %zu of %s has %d rows, more than the longest (%zu)", op,
                              b, what, (int)(cu[b + 1] - cu[b]), longest);
    }
    *rows = (size_t)cu[batch];
    return WEFT_OK;
}

/* What a paged call asks of the cache and of desc's fields about K and V;
 * *out is desc with the cache's sizes where desc leaves them zero. */
static int check_paged(const char *op, const weft_kv_cache *c, const weft_attention_desc *d,
                       weft_attention_desc *out)
{
    int rc;
    if ((rc = weft__kv_check_cache(op, c)) != WEFT_OK)
        return rc;
    if (c->format != WEFT_KV_DTYPE)
        return weft__fail(WEFT_EINVAL,
                          "%s: FP8 pages are read by weft_attention_decode only; this call "
                          "takes pages of the cache's dtype",
                          op);
    *out = *d;
    out->kv_heads = d->kv_heads ? d->kv_heads : c->kv_heads;
    out->head_dim = d->head_dim ? d->head_dim : c->head_dim;
    size_t capacity = c->max_pages * c->page_size;
    out->seq_k = d->seq_k ? d->seq_k : capacity;
    if (d->dtype != c->dtype)
        return weft__fail(WEFT_EINVAL, "%s: desc's dtype %d is not the cache's %d", op,
                          (int)d->dtype, (int)c->dtype);
    if (out->kv_heads != c->kv_heads || out->head_dim != c->head_dim)
        return weft__fail(WEFT_EINVAL,
                          "%s: desc's kv_heads %zu and head_dim %zu are not the cache's %zu "
                          "and %zu",
                          op, out->kv_heads, out->head_dim, c->kv_heads, c->head_dim);
    if (d->batch > c->seqs)
        return weft__fail(WEFT_EINVAL, "%s: batch %zu is more than the cache's %zu sequences", op,
                          d->batch, c->seqs);
    if (out->seq_k > capacity)
        return weft__fail(WEFT_EINVAL,
                          "%s: seq_k %zu is over the table's capacity %zu (%zu pages of %zu)", op,
                          out->seq_k, capacity, c->max_pages, c->page_size);
    if (d->cu_seqlens_k || d->k_positions || d->k_stride || d->v_stride)
        return weft__fail(WEFT_EINVAL,
                          "%s: the keys are the cache's: cu_seqlens_k, k_positions, k_stride "
                          "and v_stride must be zero (seq_lens gives the lengths; keys are "
                          "rotated as they are appended)",
                          op);
    return WEFT_OK;
}

/* The rows Q and K hold: dense batch * seq, varlen cu[batch] where the
 * tables can be read now (the NULL stream), else at least the longest
 * sequence's (what can be checked). */
static int check_desc(const char *op, void *stream, const weft_attention_desc *d,
                      const weft_kv_cache *cache, void *o, const void *q, const void *k,
                      const void *v, weft__attention_args *x)
{
    int rc;
    if (!d)
        return weft__fail(WEFT_EINVAL, "%s: desc is NULL", op);
    weft_attention_desc paged_desc;
    if (cache && (rc = check_paged(op, cache, d, &paged_desc)) != WEFT_OK)
        return rc;
    if (cache)
        d = &paged_desc; /* the cache's sizes filled in */
    for (size_t i = 0; i < sizeof d->reserved / sizeof d->reserved[0]; i++)
        if (d->reserved[i] != 0)
            return weft__fail(WEFT_EINVAL, "%s: desc->reserved[%zu] is not zero", op, i);
    if (d->dtype != WEFT_DTYPE_BF16 && d->dtype != WEFT_DTYPE_F16)
        return weft__fail(WEFT_EINVAL, "%s: dtype %d is not bf16 or fp16", op, (int)d->dtype);
    if (d->batch == 0 || d->heads == 0 || d->seq_q == 0 || d->seq_k == 0)
        return weft__fail(WEFT_EINVAL,
                          "%s: batch, heads, seq_q and seq_k must be >= 1 (%zu, %zu, "
                          "%zu, %zu)",
                          op, d->batch, d->heads, d->seq_q, d->seq_k);
    if (d->batch > GRID_LIMIT || d->heads > GRID_LIMIT)
        return weft__fail(WEFT_EINVAL, "%s: batch (%zu) and heads (%zu) must be at most %d", op,
                          d->batch, d->heads, GRID_LIMIT);
    if (d->head_dim != 64 && d->head_dim != 128 && d->head_dim != 256)
        return weft__fail(WEFT_EINVAL, "%s: head_dim %zu is not supported (64, 128 or 256)", op,
                          d->head_dim);
    size_t kvh = d->kv_heads ? d->kv_heads : d->heads;
    if (d->heads % kvh != 0)
        return weft__fail(WEFT_EINVAL, "%s: kv_heads %zu does not divide heads %zu", op, kvh,
                          d->heads);
    /* the kernel counts rows and keys in int, a block's reach past the end too */
    if (d->seq_q > INT32_MAX - 256 || d->seq_k > INT32_MAX - 256)
        return weft__fail(WEFT_EINVAL, "%s: seq_q and seq_k must be below 2^31 - 256", op);
    if (d->window && !d->causal)
        return weft__fail(WEFT_EINVAL,
                          "%s: a sliding window needs causal (a window on both sides is not "
                          "supported)",
                          op);
    if (!isfinite(d->scale))
        return weft__fail(WEFT_EINVAL, "%s: scale %g is not finite", op, (double)d->scale);
    if (!cache && (d->cu_seqlens_q == NULL) != (d->cu_seqlens_k == NULL))
        return weft__fail(WEFT_EINVAL, "%s: varlen needs both cu_seqlens_q and cu_seqlens_k", op);
    if (!cache && (d->q_positions == NULL) != (d->k_positions == NULL))
        return weft__fail(WEFT_EINVAL, "%s: RoPE needs both q_positions and k_positions", op);
    if (d->q_positions) {
        if (d->rope_layout != WEFT_ROPE_INTERLEAVED && d->rope_layout != WEFT_ROPE_HALVES)
            return weft__fail(WEFT_EINVAL, "%s: unknown RoPE layout %d", op, (int)d->rope_layout);
        if (!isfinite(d->rope_base) || d->rope_base < 0)
            return weft__fail(WEFT_EINVAL, "%s: rope_base %g is not finite and > 0", op,
                              (double)d->rope_base);
    }
    if ((rc = check_int32(op, "cu_seqlens_q", d->cu_seqlens_q)) != WEFT_OK ||
        (rc = check_int32(op, "cu_seqlens_k", d->cu_seqlens_k)) != WEFT_OK ||
        (rc = check_int32(op, "q_positions", d->q_positions)) != WEFT_OK ||
        (rc = check_int32(op, "k_positions", d->k_positions)) != WEFT_OK)
        return rc;
    if (d->lse && (uintptr_t)d->lse % sizeof(float) != 0)
        return weft__fail(WEFT_EINVAL, "%s: lse is not 4-byte aligned", op);

    size_t q_rows, k_rows;
    if (d->cu_seqlens_q) {
        q_rows = d->seq_q, k_rows = d->seq_k;
        if (stream == NULL &&
            ((rc = check_table(op, "cu_seqlens_q", d->cu_seqlens_q, d->batch, d->seq_q, &q_rows)) !=
                 WEFT_OK ||
             (!cache && (rc = check_table(op, "cu_seqlens_k", d->cu_seqlens_k, d->batch, d->seq_k,
                                          &k_rows)) != WEFT_OK)))
            return rc;
        if (q_rows == 0)
            q_rows = 1; /* every sequence empty: nothing is read */
        if (k_rows == 0)
            k_rows = 1;
    } else {
        if (d->batch > SIZE_MAX / d->seq_q || d->batch > SIZE_MAX / d->seq_k)
            return weft__fail(WEFT_EINVAL, "%s: batch * seq overflows", op);
        q_rows = d->batch * d->seq_q, k_rows = d->batch * d->seq_k;
    }

    *x = (weft__attention_args){0};
    x->dtype = d->dtype;
    x->batch = d->batch, x->heads = d->heads, x->kv_heads = kvh, x->head_dim = d->head_dim;
    x->seq_q = d->seq_q, x->seq_k = d->seq_k;
    x->cu_seqlens_q = d->cu_seqlens_q, x->cu_seqlens_k = d->cu_seqlens_k;
    x->scale = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)d->head_dim));
    x->causal = d->causal != 0;
    x->window = d->window;
    x->q_positions = d->q_positions, x->k_positions = d->k_positions;
    x->rope_layout = d->rope_layout;
    x->rope_base = d->rope_base != 0.0f ? d->rope_base : 10000.0f;
    x->o = o, x->q = q, x->k = k, x->v = v;

    size_t qw = d->heads * d->head_dim, kw = kvh * d->head_dim;
    if ((rc = check_tensor(op, "Q", q, q_rows, qw, d->q_stride, d->dtype, &x->q_stride)) !=
            WEFT_OK ||
        (rc = check_tensor(op, "O", o, q_rows, qw, d->o_stride, d->dtype, &x->o_stride)) != WEFT_OK)
        return rc;
    if (cache) {
        x->paged = 1;
        x->k = cache->k, x->v = cache->v;
        x->k_stride = x->v_stride = kw;
        x->table = cache->block_table;
        x->page_size = cache->page_size, x->pages = cache->pages;
        x->max_pages = cache->max_pages;
    } else if ((rc = check_tensor(op, "K", k, k_rows, kw, d->k_stride, d->dtype, &x->k_stride)) !=
                   WEFT_OK ||
               (rc = check_tensor(op, "V", v, k_rows, kw, d->v_stride, d->dtype, &x->v_stride)) !=
                   WEFT_OK) {
        return rc;
    }
    if (o == q || o == x->k || o == x->v)
        return weft__fail(WEFT_EINVAL, "%s: O must be a buffer of its own", op);

    if (d->lse) {
        x->lse = d->lse;
        x->lse_stride = d->lse_stride;
        if (x->lse_stride == 0) {
            if (d->cu_seqlens_q)
                return weft__fail(WEFT_EINVAL, "%s: a varlen call with lse must give lse_stride",
                                  op);
            x->lse_stride = q_rows;
        }
        if (x->lse_stride < q_rows)
            return weft__fail(WEFT_EINVAL, "%s: lse_stride %zu is smaller than Q's rows (%zu)", op,
                              x->lse_stride, q_rows);
        if (x->lse_stride > SIZE_MAX / sizeof(float) / d->heads)
            return weft__fail(WEFT_EINVAL, "%s: heads * lse_stride is too large", op);
    }
    return WEFT_OK;
}

static void run_host(const void *args)
{
    weft__attention_args x = *(const weft__attention_args *)args;
    weft__attention_host_run(&x);
}

/* WEFT_TASK_STREAM: the task's CUDA stream in *stream, or (host backend)
 * the host reference enqueued in the task's stream order. */
static int task_stream(const char *op, void **stream, weft__attention_args *x)
{
    void *s = NULL;
    int rc = weft_stream(&s);
    if (rc == WEFT_ENOTASK)
        return weft__fail(rc, "%s: WEFT_TASK_STREAM outside a task", op);
    if (rc != WEFT_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", weft_last_error());
        return weft__fail(rc, "%s: the task's stream: %s", op, why);
    }
    if (s) {
        *stream = s;
        return WEFT__ON_STREAM;
    }
    if ((rc = weft__attention_host_prepare(op, x)) != WEFT_OK)
        return rc;
    rc = weft__task_stream_op(op, stream, run_host, x, sizeof *x);
    if (rc != WEFT_OK)
        free(x->host_ws); /* not enqueued: the scratch is still ours */
    return rc;
}

static int run(const char *op, void *stream, weft__attention_args *x)
{
    int rc;
    if (stream == WEFT_TASK_STREAM && (rc = task_stream(op, &stream, x)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__attention_cuda(stream, x);
#endif
    if ((rc = weft__attention_host_prepare(op, x)) != WEFT_OK)
        return rc;
    weft__attention_host_run(x);
    return WEFT_OK;
}

int weft_attention(void *stream, const weft_attention_desc *desc, void *o, const void *q,
                   const void *k, const void *v)
{
    weft__attention_args x;
    int rc;

    if ((rc = check_desc(DENSE, stream, desc, NULL, o, q, k, v, &x)) != WEFT_OK ||
        (rc = weft__check_stream(DENSE, stream)) != WEFT_OK)
        return rc;
    return run(DENSE, stream, &x);
}

/* A paged call's NULL-stream checks, where the tables are host memory read
 * now: every length within [0, seq_k], and the table entries of the pages
 * those lengths use within the pool. */
static int check_paged_tables(const weft__attention_args *x, const int32_t *seq_lens)
{
    for (size_t b = 0; b < x->batch; b++) {
        if (seq_lens[b] < 0 || (size_t)seq_lens[b] > x->seq_k)
            return weft__fail(WEFT_EINVAL, "%s: seq_lens[%zu] is %d, outside [0, %zu]", PAGED, b,
                              (int)seq_lens[b], x->seq_k);
        size_t used = ((size_t)seq_lens[b] + x->page_size - 1) / x->page_size;
        for (size_t i = 0; i < used; i++) {
            int32_t page = x->table[b * x->max_pages + i];
            if (page < 0 || (size_t)page >= x->pages)
                return weft__fail(WEFT_EINVAL,
                                  "%s: sequence %zu's page %zu is %d, outside the pool's %zu",
                                  PAGED, b, i, (int)page, x->pages);
        }
    }
    return WEFT_OK;
}

int weft_attention_paged(void *stream, const weft_kv_cache *cache, const weft_attention_desc *desc,
                         const int32_t *seq_lens, void *o, const void *q)
{
    weft__attention_args x;
    int rc;

    if (!cache)
        return weft__fail(WEFT_EINVAL, "%s: cache is NULL", PAGED);
    if ((rc = check_desc(PAGED, stream, desc, cache, o, q, NULL, NULL, &x)) != WEFT_OK ||
        (rc = check_int32(PAGED, "seq_lens", seq_lens)) != WEFT_OK ||
        (rc = weft__check_stream(PAGED, stream)) != WEFT_OK)
        return rc;
    if (!seq_lens)
        return weft__fail(WEFT_EINVAL, "%s: seq_lens is NULL", PAGED);
    if (stream == NULL && (rc = check_paged_tables(&x, seq_lens)) != WEFT_OK)
        return rc;
    x.k_lens = seq_lens;
    return run(PAGED, stream, &x);
}
