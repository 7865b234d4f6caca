/*
 * paged.c - the paged KV cache's calls, weft_kv_append and
 * weft_attention_decode: their argument checks and the choice of backend
 * (the host reference is paged_host.c, the kernels paged.cu).
 *
 * Every check here runs before anything is read through the cache's
 * pointers, so a refused call has written nothing. The tables (block
 * table, seq_ids, positions, seq_lens) are data, read where the work
 * runs: only the host reference on the NULL stream reads them in time to
 * refuse them; elsewhere they are clamped (ops.h says how).
 *
 * The split of a decode (how many parts each sequence's keys are cut
 * into) is sized here from the shape alone, so the workspace query, the
 * host and every device agree on the workspace's size; the kernels choose
 * how many of those parts to use from the device's SM count.
 */
#include <math.h>

#include "core/error.h"
#include "ops/ops_internal.h"
#include "ops/paged.h"

static const char APPEND[] = "weft_kv_append", DECODE[] = "weft_attention_decode";

/* a * b into *out, or 0 when it overflows size_t. */
static int mul_ok(size_t a, size_t b, size_t *out)
{
    if (b != 0 && a > SIZE_MAX / b)
        return 0;
    *out = a * b;
    return 1;
}

static int reserved_zero(const uint64_t *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (r[i] != 0)
            return 0;
    return 1;
}

int weft__kv_check_cache(const char *op, const weft_kv_cache *c)
{
    size_t n;

    if (c == NULL)
        return weft__fail(WEFT_EINVAL, "%s: cache is NULL", op);
    if (!reserved_zero(c->reserved, sizeof c->reserved / sizeof c->reserved[0]))
        return weft__fail(WEFT_EINVAL, "%s: cache->reserved is not zero", op);
    if (c->dtype != WEFT_DTYPE_BF16 && c->dtype != WEFT_DTYPE_F16)
        return weft__fail(WEFT_EINVAL, "%s: cache dtype %d is not bf16 or fp16", op, (int)c->dtype);
    if (c->head_dim != 64 && c->head_dim != 128)
        return weft__fail(WEFT_EINVAL, "%s: head_dim %zu is not 64 or 128", op, c->head_dim);
    if (c->page_size < 16 || c->page_size > 256 || (c->page_size & (c->page_size - 1)) != 0)
        return weft__fail(WEFT_EINVAL, "%s: page_size %zu is not a power of two from 16 to 256", op,
                          c->page_size);
    if (c->pages == 0 || c->kv_heads == 0 || c->seqs == 0 || c->max_pages == 0)
        return weft__fail(WEFT_EINVAL,
                          "%s: a zero size (pages %zu, kv_heads %zu, seqs %zu, "
                          "max_pages %zu)",
                          op, c->pages, c->kv_heads, c->seqs, c->max_pages);
    if (c->pages > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: %zu pages cannot be named by int32 entries", op,
                          c->pages);
    if (c->max_pages > INT32_MAX / c->page_size)
        return weft__fail(WEFT_EINVAL,
                          "%s: a sequence's capacity (%zu pages of %zu) is over "
                          "int32",
                          op, c->max_pages, c->page_size);
    if (c->format != WEFT_KV_DTYPE && c->format != WEFT_KV_FP8_E4M3)
        return weft__fail(WEFT_EINVAL, "%s: unknown cache format %d", op, (int)c->format);
    if (c->format == WEFT_KV_FP8_E4M3) {
        if (c->k_scale == NULL || c->v_scale == NULL)
            return weft__fail(WEFT_EINVAL, "%s: an FP8 cache needs k_scale and v_scale", op);
        if ((uintptr_t)c->k_scale % sizeof(float) != 0 ||
            (uintptr_t)c->v_scale % sizeof(float) != 0)
            return weft__fail(WEFT_EINVAL, "%s: k_scale or v_scale is not 4-byte aligned", op);
    } else if (c->k_scale || c->v_scale)
        return weft__fail(WEFT_EINVAL, "%s: k_scale and v_scale are for FP8 caches only", op);
    if (!mul_ok(c->pages, c->page_size, &n) || !mul_ok(n, c->kv_heads, &n) ||
        !mul_ok(n, c->head_dim, &n) || !mul_ok(n, 2, &n))
        return weft__fail(WEFT_EINVAL, "%s: the pools' size overflows", op);
    if (!mul_ok(c->seqs, c->max_pages, &n) || !mul_ok(n, sizeof(int32_t), &n))
        return weft__fail(WEFT_EINVAL, "%s: the block table's size overflows", op);
    if (c->k == NULL || c->v == NULL)
        return weft__fail(WEFT_EINVAL, "%s: the cache's %s pool is NULL", op, c->k ? "v" : "k");
    if ((uintptr_t)c->k % 16 != 0 || (uintptr_t)c->v % 16 != 0)
        return weft__fail(WEFT_EINVAL, "%s: the cache's pools are not 16-byte aligned", op);
    if (c->k == c->v)
        return weft__fail(WEFT_EINVAL, "%s: the k and v pools are the same memory", op);
    if (c->block_table == NULL)
        return weft__fail(WEFT_EINVAL, "%s: block_table is NULL", op);
    if ((uintptr_t)c->block_table % sizeof(int32_t) != 0)
        return weft__fail(WEFT_EINVAL, "%s: block_table is not 4-byte aligned", op);
    return WEFT_OK;
}

static int check_int32_array(const char *op, const char *name, const int32_t *p)
{
    if (p == NULL)
        return weft__fail(WEFT_EINVAL, "%s: %s is NULL", op, name);
    if ((uintptr_t)p % sizeof *p != 0)
        return weft__fail(WEFT_EINVAL, "%s: %s is not 4-byte aligned", op, name);
    return WEFT_OK;
}

/* A weft_kv_rope checked (WEFT_EINVAL naming op) and resolved into *freq. */
static int check_rope(const char *op, const weft_kv_rope *rope, size_t head_dim,
                      weft__rope_freq *freq)
{
    if (rope->layout != WEFT_ROPE_INTERLEAVED && rope->layout != WEFT_ROPE_HALVES)
        return weft__fail(WEFT_EINVAL, "%s: unknown RoPE layout %d", op, (int)rope->layout);
    return weft__rope_freq_resolve(op, rope->base, rope->scaling, head_dim, freq);
}

static void run_append_host(const void *args)
{
    (void)weft__kv_append_host(args, 0);
}

int weft_kv_append(void *stream, const weft_kv_cache *cache, const void *k, size_t k_stride,
                   const void *v, size_t v_stride, size_t tokens, const int32_t *seq_ids,
                   const int32_t *positions, const weft_kv_rope *rope)
{
    int rc;

    if ((rc = weft__kv_check_cache(APPEND, cache)) != WEFT_OK)
        return rc;
    size_t row = cache->kv_heads * cache->head_dim; /* cannot overflow: the pools' size did not */
    if (tokens == 0)
        return weft__fail(WEFT_EINVAL, "%s: tokens is 0", APPEND);
    k_stride = k_stride ? k_stride : row;
    v_stride = v_stride ? v_stride : row;
    if ((rc = weft__check_rows(APPEND, "k", tokens, row, k_stride, cache->dtype)) != WEFT_OK ||
        (rc = weft__check_rows(APPEND, "v", tokens, row, v_stride, cache->dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(APPEND, "k", k, 0, cache->dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(APPEND, "v", v, 0, cache->dtype)) != WEFT_OK ||
        (rc = check_int32_array(APPEND, "seq_ids", seq_ids)) != WEFT_OK ||
        (rc = check_int32_array(APPEND, "positions", positions)) != WEFT_OK)
        return rc;
    if (tokens > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: %zu tokens is over int32", APPEND, tokens);
    weft__rope_freq freq = {0};
    if (rope && (rc = check_rope(APPEND, rope, cache->head_dim, &freq)) != WEFT_OK)
        return rc;
    if ((rc = weft__check_stream(APPEND, (void *)stream)) != WEFT_OK)
        return rc;
    weft__kv_append_args a = {.c = *cache,
                              .k = k,
                              .v = v,
                              .k_stride = k_stride,
                              .v_stride = v_stride,
                              .tokens = tokens,
                              .seq_ids = seq_ids,
                              .positions = positions,
                              .rope = rope != NULL,
                              .layout = rope ? rope->layout : WEFT_ROPE_INTERLEAVED,
                              .freq = freq};
    if (stream == WEFT_TASK_STREAM && (rc = weft__task_stream_op(APPEND, &stream, run_append_host,
                                                                 &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__kv_append_cuda(stream, &a);
#endif
    return weft__kv_append_host(&a, 1);
}

/* ---- decode --------------------------------------------------------------- */

size_t weft__decode_max_splits(const weft_kv_cache *c, const weft_attention_decode_desc *d,
                               size_t max_seq_len)
{
    size_t pages = (max_seq_len + c->page_size - 1) / c->page_size, parts;

    if (d->splits == 1 || pages <= 1)
        return 1;
    if (d->splits > 1) /* forced: at most one part a page */
        parts = d->splits < pages ? d->splits : pages;
    else {
        size_t unit =
            c->page_size > WEFT__DECODE_SPLIT_KEYS ? c->page_size : WEFT__DECODE_SPLIT_KEYS;
        parts = (max_seq_len + unit - 1) / unit;
    }
    return parts < WEFT__DECODE_MAX_SPLITS ? parts : WEFT__DECODE_MAX_SPLITS;
}

/* The checks weft_attention_decode and its workspace query share; *a gets
 * the shape's resolved values and *bytes the workspace's size. */
static int check_decode_shape(const weft_kv_cache *c, const weft_attention_decode_desc *d,
                              weft__decode_args *a, size_t *bytes)
{
    int rc;
    size_t rows, n;

    if ((rc = weft__kv_check_cache(DECODE, c)) != WEFT_OK)
        return rc;
    if (d == NULL)
        return weft__fail(WEFT_EINVAL, "%s: desc is NULL", DECODE);
    if (!reserved_zero(d->reserved, sizeof d->reserved / sizeof d->reserved[0]))
        return weft__fail(WEFT_EINVAL, "%s: desc->reserved is not zero", DECODE);
    if (d->q_len < 1 || d->q_len > 8)
        return weft__fail(WEFT_EINVAL, "%s: q_len %zu is not 1 to 8", DECODE, d->q_len);
    if (d->heads == 0 || d->heads % c->kv_heads != 0)
        return weft__fail(WEFT_EINVAL, "%s: heads %zu is not a multiple of kv_heads %zu", DECODE,
                          d->heads, c->kv_heads);
    if (!isfinite(d->scale) || d->scale < 0)
        return weft__fail(WEFT_EINVAL, "%s: scale %g is not finite and >= 0", DECODE,
                          (double)d->scale);
    size_t capacity = c->max_pages * c->page_size;
    if (d->max_seq_len > capacity)
        return weft__fail(WEFT_EINVAL,
                          "%s: max_seq_len %zu is over the table's capacity %zu "
                          "(%zu pages of %zu)",
                          DECODE, d->max_seq_len, capacity, c->max_pages, c->page_size);
    if (!mul_ok(c->seqs, d->q_len, &rows) || !mul_ok(rows, d->heads, &rows) ||
        !mul_ok(rows, c->head_dim, &n) || !mul_ok(n, sizeof(uint16_t), &n) || rows > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: q's size overflows", DECODE);
    size_t width = d->heads * c->head_dim;
    if (d->q_stride != 0 && (d->q_stride < width || d->q_stride % 8 != 0))
        return weft__fail(WEFT_EINVAL,
                          "%s: q_stride %zu is below a row's %zu elements or not a "
                          "multiple of 8",
                          DECODE, d->q_stride, width);
    a->q_rope = d->q_rope != NULL;
    a->q_layout = d->q_rope ? d->q_rope->layout : WEFT_ROPE_INTERLEAVED;
    if (d->q_rope && (rc = check_rope(DECODE, d->q_rope, c->head_dim, &a->q_freq)) != WEFT_OK)
        return rc;
    a->c = *c;
    a->q_stride = d->q_stride ? d->q_stride : width;
    a->q_len = d->q_len;
    a->heads = d->heads;
    a->window = d->window;
    a->max_seq_len = d->max_seq_len ? d->max_seq_len : capacity;
    a->scale = d->scale != 0 ? d->scale : (float)(1.0 / sqrt((double)c->head_dim));
    a->max_splits = weft__decode_max_splits(c, d, a->max_seq_len);
    a->forced = d->splits > 1;
    *bytes = 0;
    if (a->max_splits > 1 && (!mul_ok(rows, a->max_splits, &n) || !mul_ok(n, c->head_dim + 1, &n) ||
                              !mul_ok(n, sizeof(float), bytes)))
        return weft__fail(WEFT_EINVAL, "%s: the workspace's size overflows", DECODE);
    return WEFT_OK;
}

int weft_attention_decode_workspace(const weft_kv_cache *cache,
                                    const weft_attention_decode_desc *desc, size_t *bytes)
{
    weft__decode_args a = {0};
    size_t need;
    int rc;

    if (bytes == NULL)
        return weft__fail(WEFT_EINVAL, "%s: bytes is NULL", DECODE);
    if ((rc = check_decode_shape(cache, desc, &a, &need)) != WEFT_OK)
        return rc;
    *bytes = need;
    return WEFT_OK;
}

static int overlaps(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bn && y < x + an;
}

static void run_decode_host(const void *args)
{
    (void)weft__decode_host(args, 0);
}

int weft_attention_decode(void *stream, const weft_kv_cache *cache,
                          const weft_attention_decode_desc *desc, void *out, float *lse,
                          const void *q, const int32_t *seq_lens, void *workspace,
                          size_t workspace_bytes)
{
    weft__decode_args a = {0};
    size_t need;
    int rc;

    if ((rc = check_decode_shape(cache, desc, &a, &need)) != WEFT_OK)
        return rc;
    size_t rows = cache->seqs * desc->q_len, width = desc->heads * cache->head_dim;
    size_t out_bytes = rows * width * 2, q_bytes = ((rows - 1) * a.q_stride + width) * 2;
    if (q == NULL || out == NULL)
        return weft__fail(WEFT_EINVAL, "%s: %s is NULL", DECODE, q ? "out" : "q");
    if ((uintptr_t)q % 16 != 0 || (uintptr_t)out % 16 != 0)
        return weft__fail(WEFT_EINVAL, "%s: q and out must be 16-byte aligned", DECODE);
    if (overlaps(q, q_bytes, out, out_bytes))
        return weft__fail(WEFT_EINVAL, "%s: out overlaps q", DECODE);
    if (lse && (uintptr_t)lse % sizeof *lse != 0)
        return weft__fail(WEFT_EINVAL, "%s: lse is not 4-byte aligned", DECODE);
    if ((rc = check_int32_array(DECODE, "seq_lens", seq_lens)) != WEFT_OK)
        return rc;
    if (workspace_bytes < need)
        return weft__fail(WEFT_EINVAL,
                          "%s: workspace of %zu bytes is short of the %zu this "
                          "shape needs (weft_attention_decode_workspace)",
                          DECODE, workspace_bytes, need);
    if (need > 0 && workspace == NULL)
        return weft__fail(WEFT_EINVAL, "%s: workspace is NULL", DECODE);
    if (need > 0 && (uintptr_t)workspace % 16 != 0)
        return weft__fail(WEFT_EINVAL, "%s: workspace is not 16-byte aligned", DECODE);
    if ((rc = weft__check_stream(DECODE, stream)) != WEFT_OK)
        return rc;
    a.out = out;
    a.lse = lse;
    a.q = q;
    a.seq_lens = seq_lens;
    a.workspace = workspace;
    if (stream == WEFT_TASK_STREAM && (rc = weft__task_stream_op(DECODE, &stream, run_decode_host,
                                                                 &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__decode_cuda(stream, &a);
#endif
    return weft__decode_host(&a, 1);
}
