/*
 * batch.c - continuous batching of decode steps: wl_forward_batch runs one
 * token of each of several sequences through the model in one pass, and
 * the batcher (a weft task) forms each step's batch from the sequence
 * tasks waiting on it.
 *
 * A batch's rows are tokens of distinct sequences, each at its own next
 * position. Every row goes through the ops forward.c runs for a single
 * decode token, in the same order: the embedding row, RMSNorm, the q, k and
 * v projections (Qwen3's per-head norms), RoPE, the append of K and V to
 * the pages, decode attention with q_len 1, the o projection into the
 * residual, the MLP, the final norm and the lm_head. Here each op is one
 * call over all the rows: weft_matmul with m = the batch, one
 * weft_kv_append with a sequence id and a position per token, and one
 * weft_attention_decode over the batch's block tables (row i of the
 * device table is seqs[i]'s table) and lengths, which reads q from the
 * q | k | v rows of the packed projection (its q_stride). RoPE has no
 * call of its own in a decode step: the append turns k and the attention
 * q as they read them, the same rotation and rounding as weft_rope_scaled.
 *
 * A mixed step (wl_forward_mixed) also takes prompts' chunks: a sequence's
 * rows are consecutive (its chunk's tokens at their positions), K and V of
 * every row are appended first, and one weft_attention_paged call attends
 * each sequence's rows over its pages, causally (the new keys last); the
 * final norm and the lm_head then run over each sequence's last row only,
 * gathered by weft_gather_rows. The rows change with the chunks, so a
 * mixed step runs eagerly; a step of one token a sequence is the decode
 * step above, whatever brought its members there.
 *
 * Graph mode: a step's device work (the copies in, every layer, the
 * logits out) is one weft region keyed by the batch size, so a step that
 * repeats with the same number of rows is one graph launch. Its inputs
 * (token ids, positions, tables) are copied from fixed page-locked
 * buffers and the embeddings gathered by those ids on the device
 * (weft_gather_rows), so the work is the same whatever the tokens: once
 * a step of a size has been recorded, the next ones replay its graph as
 * it stands (weft_region_replay), with no recording and no update, the
 * host's part of a step being the copies into those buffers and one
 * launch. Nothing in it waits (the step's one weft_await follows the
 * region); the host buffers being page-locked, graph mode records the
 * copies as they are. WEFT_LLM_GRAPH=0 runs the steps eagerly and
 * WEFT_LLM_REPLAY=0 records every step (to compare).
 *
 * A step brings back each row's next token, drawn on the backend by
 * weft_sample with the row's own parameters (temperature, top-k, top-p,
 * seed and offset: page-locked like the other inputs, so a replayed graph
 * draws with each step's) after weft_penalize has applied the row's
 * penalties (its adjustments read from page-locked memory as the step
 * runs), and the logits themselves only when a row needs them
 * (logprobs): decoding copies one int32 a row to the host, not a
 * vocabulary of floats.
 *
 * The batcher: one weft mutex guards its members' slots; sequences wait on
 * one condition variable (done) for their step's logits and the batcher on
 * another (work) for every member to be waiting. A step is formed only
 * when every joined sequence is waiting, so all of them take part and the
 * batch's logits rows are read by their sequences before the next step
 * overwrites them. The forward itself runs outside the mutex.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "forward_impl.h"

struct wl_batch {
    const wl_model *m;
    wl_kv *kv;
    int max_seqs, max_pages;
    int most, max_rows; /* the most tokens of one sequence a step takes (chunk, or 1), and in all */
    size_t q_dim, kv_dim, qkv_dim, workspace_bytes;
    /* the backend's memory: max_rows token rows, max_seqs sequences */
    void *x, *h, *qkv, *attn, *gu, *act, *workspace;
    wl_moe_bufs moe; /* a mixture-of-experts model's */
    float *logits;   /* a row a sequence */
    int32_t *positions, *seq_ids, *table, *seq_lens;
    /* a mixed step's: each row's sequence, the query rows' prefix sums, and
     * each sequence's last row */
    int32_t *row_seqs, *cu_rows, *last_rows;
    int32_t *row_ids; /* 0, 1, ...: Qwen3's q/k norms' gathers */
    wl_fp8_in fp8;    /* an FP8 model's projections' inputs */
    /* host memory: page-locked (weft_host_alloc) where a step copies it,
     * so that graph mode records the copies as they are */
    weft_runtime *rt;
    int graph;       /* each step a graph-mode region keyed by its size */
    int replay;      /* a repeating step replays its graph without recording it */
    uint64_t serial; /* this batch's, in its regions' keys */
    uint64_t own_ns; /* thread CPU of the steps' own host work (wl_batch_own_cpu_ns) */
    int32_t *pos_host, *table_host, *lens_host, *rows_host; /* rows_host: the three above */
    float *logits_host;
    weft_sampling *sampling, *sampling_host; /* how each row draws, there and here */
    int32_t *picked, *picked_host;           /* each row's token, there and here */
    /* each row's penalties, and its adjustments from row * adjust_row on:
     * page-locked, read by the kernel as it runs (taken at the first step
     * with penalties, at their most, so a recorded step's stay valid) */
    weft_penalties *pen_host;
    weft_logit_adjust *adjust_host;
    size_t adjust_row;
    int32_t *tokens, *tokens_host; /* the step's token ids, there and here */
    /* a pipeline stage's (wl_batch_link): its link, and its hidden rows
     * as they arrive from the stage before or leave for the next */
    wl_link *link;
    void *x_host;
    /* tensor parallel's (wl_batch_tp): the group, and this batch's rank */
    wl_tp *tp;
    int tp_rank;
    struct cpu_account *own; /* the running step's account (forward_step's), or NULL */
};

/* The key of a step's region: the batch's serial, its rows, what it
 * brings back (logits, tokens) and whether it penalises. Region keys are
 * the runtime's and a replay launches a key's graph as it stands, on the
 * buffers it was recorded with: each batch (the engine's, a draft model's,
 * one made after another was destroyed) has keys of its own. */
#define STEP_REGION(serial, n, logits, picked, penalised)                                          \
    (0x776c000000000000ull | (uint64_t)(serial) << 20 | (uint64_t)(n) | (uint64_t)(logits) << 16 | \
     (uint64_t)(picked) << 17 | (uint64_t)(penalised) << 18)

static _Atomic uint64_t batches_made; /* the serials: 2^28 before they wrap */

int wl_batch_create(wl_batch **out, const wl_model *m, wl_kv *kv, int max_seqs, int max_tokens,
                    int chunk)
{
    const wl_config *c = &m->cfg;
    size_t es = wl_dtype_size(m->dtype), B = (size_t)max_seqs, R = B + (size_t)chunk;
    *out = NULL;
    if (max_seqs < 1 || max_seqs > 0xffff || max_tokens < 1 || chunk < 0 || chunk > max_tokens)
        return wl_fail("batch: %d sequences of %d tokens, chunks of %d", max_seqs, max_tokens,
                       chunk);
    wl_batch *b = calloc(1, sizeof *b);
    if (!b)
        return wl_fail("out of memory");
    b->m = m;
    b->kv = kv;
    b->max_seqs = max_seqs;
    b->max_pages = (max_tokens + kv->page_size - 1) / kv->page_size;
    b->most = chunk > 1 ? chunk : 1;
    b->max_rows = (int)R;
    b->adjust_row = (size_t)max_tokens + WL_MAX_BIAS;
    b->q_dim = (size_t)c->heads * c->head_dim;
    b->kv_dim = (size_t)c->kv_heads * c->head_dim;
    b->qkv_dim = b->q_dim + 2 * b->kv_dim;
    size_t P = (size_t)b->max_pages;
    TRY(weft_malloc_async(&b->x, R * c->hidden * es));
    TRY(weft_malloc_async(&b->h, R * c->hidden * es));
    TRY(weft_malloc_async(&b->qkv, R * b->qkv_dim * es));
    TRY(weft_malloc_async(&b->attn, R * b->q_dim * es));
    if (wl_model_has_dense_mlp(m)) {
        TRY(weft_malloc_async(&b->gu, R * 2 * c->intermediate * es));
        TRY(weft_malloc_async(&b->act, R * c->intermediate * es));
    }
    TRY(weft_malloc_async((void **)&b->logits, B * c->vocab * 4));
    TRY(weft_malloc_async((void **)&b->positions, R * 4));
    TRY(weft_malloc_async((void **)&b->seq_ids, B * 4));
    TRY(weft_malloc_async((void **)&b->row_seqs, R * 4));
    TRY(weft_malloc_async((void **)&b->cu_rows, (B + 1) * 4));
    TRY(weft_malloc_async((void **)&b->last_rows, B * 4));
    TRY(weft_malloc_async((void **)&b->table, B * P * 4));
    TRY(weft_malloc_async((void **)&b->seq_lens, B * 4));
    TRY(weft_malloc_async((void **)&b->sampling, B * sizeof *b->sampling));
    TRY(weft_malloc_async((void **)&b->picked, B * 4));
    TRY(weft_malloc_async((void **)&b->tokens, R * 4));
    if ((c->qk_norm && wl_row_ids(&b->row_ids, R)) || wl_fp8_in_create(&b->fp8, m, R))
        goto fail;
    if (c->experts && wl_moe_bufs_create(&b->moe, m, (int)R))
        goto fail;
    /* the decode workspace for any batch size: the split the op chooses
     * (more parts for fewer sequences) need not grow with the batch */
    for (size_t n = 1; n <= B; n++) {
        weft_kv_cache cache = wl_kv_layer(kv, kv->first_layer, b->table, b->max_pages);
        cache.seqs = n;
        weft_attention_decode_desc d = {
            .q_len = 1, .heads = (size_t)c->heads, .window = (size_t)c->sliding_window};
        size_t bytes = 0;
        TRY(weft_attention_decode_workspace(&cache, &d, &bytes));
        if (bytes > b->workspace_bytes)
            b->workspace_bytes = bytes;
    }
    if (b->workspace_bytes)
        TRY(weft_malloc_async(&b->workspace, b->workspace_bytes));
    const char *graph = getenv("WEFT_LLM_GRAPH"), *replay = getenv("WEFT_LLM_REPLAY");
    b->graph = !(graph && !strcmp(graph, "0"));
    b->replay = b->graph && !(replay && !strcmp(replay, "0"));
    b->rt = weft_runtime_current();
    b->serial = atomic_fetch_add(&batches_made, 1) & ((1ull << 28) - 1);
    TRY(weft_host_alloc(b->rt, (void **)&b->pos_host, R * 4));
    TRY(weft_host_alloc(b->rt, (void **)&b->rows_host, (R + 2 * B + 1) * 4));
    TRY(weft_host_alloc(b->rt, (void **)&b->table_host, B * P * 4));
    TRY(weft_host_alloc(b->rt, (void **)&b->lens_host, B * 4));
    TRY(weft_host_alloc(b->rt, (void **)&b->logits_host, B * c->vocab * 4));
    TRY(weft_host_alloc(b->rt, (void **)&b->sampling_host, B * sizeof *b->sampling_host));
    TRY(weft_host_alloc(b->rt, (void **)&b->picked_host, B * 4));
    TRY(weft_host_alloc(b->rt, (void **)&b->tokens_host, R * 4));
    memset(b->table_host, 0, B * P * 4);
    /* row i is sequence i of the batch's table: set once, through the
     * token buffer, which the steps overwrite after the await */
    for (int i = 0; i < max_seqs; i++)
        b->tokens_host[i] = i;
    TRY(weft_memcpy_async(b->seq_ids, b->tokens_host, B * 4));
    TRY(weft_await());
    *out = b;
    return 0;
fail : {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", wl_error());
    wl_batch_destroy(b); /* waits: see wl_await_keeping_error */
    return wl_fail("%s", msg);
}
}

void wl_batch_destroy(wl_batch *b)
{
    if (!b)
        return;
    weft_await();
    void *dev[] = {b->x,        b->h,         b->qkv,       b->attn,      b->gu,
                   b->act,      b->workspace, b->logits,    b->positions, b->seq_ids,
                   b->table,    b->seq_lens,  b->sampling,  b->picked,    b->tokens,
                   b->row_seqs, b->cu_rows,   b->last_rows, b->row_ids};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i])
            weft_free_async(dev[i]);
    wl_moe_bufs_destroy(&b->moe);
    wl_fp8_in_destroy(&b->fp8);
    weft_await();
    void *host[] = {b->pos_host,      b->table_host,  b->lens_host,   b->logits_host,
                    b->sampling_host, b->picked_host, b->tokens_host, b->pen_host,
                    b->adjust_host,   b->rows_host,   b->x_host};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++)
        if (host[i])
            weft_host_free(b->rt, host[i]);
    free(b);
}

/* The calling thread's CPU time. */
static uint64_t thread_cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A step's own host CPU time, summed over the stretches its task runs
 * between waits: each on one thread, whose clock it is read on (after a
 * wait the task may resume on another). */
typedef struct cpu_account {
    uint64_t total, since; /* since: the running stretch's start */
} cpu_account;

static void account_pause(cpu_account *a)
{
    a->total += thread_cpu_ns() - a->since;
}

static void account_resume(cpu_account *a)
{
    a->since = thread_cpu_ns();
}

/* Tensor parallel: x's rows summed over the ranks. The host backend's sum
 * waits for the other ranks, which is not the step's own CPU time. */
static int sum_over_ranks(wl_batch *b, int rows)
{
    size_t count = (size_t)rows * b->m->cfg.hidden;
    if (b->own)
        account_pause(b->own);
    int rc = wl_tp_all_reduce(b->tp, b->tp_rank, b->x, count, b->m->dtype);
    if (b->own)
        account_resume(b->own);
    return rc;
}

/* Layer li over the step's rows, those of n sequences (x holds the
 * residuals): a decode step's one a sequence, or a mixed step's (mixed:
 * each sequence's rows consecutive, as cu_rows says). */
static int layer_batch(wl_batch *b, int li, int rows, int n, int mixed)
{
    const wl_model *m = b->m;
    const wl_config *c = &m->cfg;
    const wl_layer *L = &m->layer[li];
    weft_dtype dt = m->dtype;
    size_t es = wl_dtype_size(dt), H = (size_t)c->hidden, I = (size_t)c->intermediate;
    size_t qkv_dim = b->qkv_dim;
    char *q = b->qkv, *k = q + b->q_dim * es, *v = k + b->kv_dim * es;
    float eps = (float)c->rms_eps;
    TRY(wl_norm_project(m, &b->fp8, b->h, b->x, L->attn_norm, rows, q, qkv_dim, L->qkv,
                        L->qkv_scale, L->qkv_sparse, qkv_dim, L->qkv_bias));
    if (c->qk_norm && wl_qk_norm(m, L, q, qkv_dim, rows, b->attn, b->row_ids))
        goto fail;
    /* A decode step turns k in the append and q in the attention, as they
     * are read; a mixed step's attention takes both turned. */
    weft_rope_llama3 llama3;
    weft_kv_rope rope = wl_kv_rope(m, &llama3);
    if (mixed)
        TRY(wl_rope(m, q, qkv_dim, k, qkv_dim, rows, b->positions));
    weft_kv_cache cache = wl_kv_layer(b->kv, li, b->table, b->max_pages);
    cache.seqs = (size_t)n;
    TRY(weft_kv_append(WEFT_TASK_STREAM, &cache, k, qkv_dim, v, qkv_dim, (size_t)rows,
                       mixed ? b->row_seqs : b->seq_ids, b->positions, mixed ? NULL : &rope));
    if (mixed) { /* each sequence's rows against its pages, the new keys last */
        weft_attention_desc d = {.dtype = dt,
                                 .batch = (size_t)n,
                                 .heads = (size_t)c->heads,
                                 .seq_q = (size_t)b->most,
                                 .cu_seqlens_q = b->cu_rows,
                                 .q_stride = qkv_dim,
                                 .causal = 1,
                                 .window = (size_t)c->sliding_window};
        TRY(weft_attention_paged(WEFT_TASK_STREAM, &cache, &d, b->seq_lens, b->attn, q));
    } else {
        weft_attention_decode_desc d = {.q_len = 1,
                                        .heads = (size_t)c->heads,
                                        .window = (size_t)c->sliding_window,
                                        .q_stride = qkv_dim,
                                        .q_rope = &rope};
        TRY(weft_attention_decode(WEFT_TASK_STREAM, &cache, &d, b->attn, NULL, q, b->seq_lens,
                                  b->workspace, b->workspace_bytes));
    }
    /* tensor parallel: each rank's o and down give a part of the sum, to
     * which rank 0 alone adds the residual; the parts summed, every rank
     * holds the layer's rows */
    const void *residual = b->tp && b->tp_rank ? NULL : b->x;
    TRY(wl_project(m, &b->fp8, b->x, H, b->attn, b->q_dim, L->o, L->o_scale, L->o_sparse, H, NULL,
                   residual, rows));
    if (b->tp && sum_over_ranks(b, rows))
        goto fail;
    if (L->moe) {
        TRY(weft_rmsnorm(WEFT_TASK_STREAM, dt, b->h, NULL, b->x, NULL, L->mlp_norm, eps,
                         (size_t)rows, H, H));
        if (wl_moe_mlp(m, &b->moe, li, b->x, b->h, rows, residual != NULL))
            goto fail;
        return b->tp && sum_over_ranks(b, rows) ? -1 : 0;
    }
    TRY(wl_norm_project(m, &b->fp8, b->h, b->x, L->mlp_norm, rows, b->gu, 2 * I, L->gu, L->gu_scale,
                        L->gu_sparse, 2 * I, NULL));
    TRY(weft_glu(WEFT_TASK_STREAM, dt, WEFT_GLU_SWIGLU, b->act, b->gu, (size_t)rows, I, 2 * I, I));
    TRY(wl_project(m, &b->fp8, b->x, H, b->act, I, L->down, L->down_scale, L->down_sparse, H, NULL,
                   residual, rows));
    if (b->tp && sum_over_ranks(b, rows))
        goto fail;
    return 0;
fail:
    return -1;
}

/* A step's device work for its rows of n sequences (mixed: as
 * wl_forward_mixed lays them out), from the inputs in the host buffers to
 * the drawn tokens and the logits (each when asked) in theirs. */
static int enqueue_step(wl_batch *b, int rows, int n, int mixed, int want_logits, int want_picked,
                        int penalised)
{
    const wl_model *m = b->m;
    const wl_config *c = &m->cfg;
    size_t H = (size_t)c->hidden, P = (size_t)b->max_pages, es = wl_dtype_size(m->dtype);
    int first = m->first_layer == 0, last = m->end_layer == c->layers; /* a pipeline's stages */
    TRY(weft_memcpy_async(b->positions, b->pos_host, (size_t)rows * 4));
    TRY(weft_memcpy_async(b->seq_lens, b->lens_host, (size_t)n * 4));
    TRY(weft_memcpy_async(b->table, b->table_host, (size_t)n * P * 4));
    if (first)
        TRY(weft_memcpy_async(b->tokens, b->tokens_host, (size_t)rows * 4));
    if (mixed) {
        TRY(weft_memcpy_async(b->row_seqs, b->rows_host, (size_t)rows * 4));
        TRY(weft_memcpy_async(b->cu_rows, b->rows_host + rows, (size_t)(n + 1) * 4));
        TRY(weft_memcpy_async(b->last_rows, b->rows_host + rows + n + 1, (size_t)n * 4));
    }
    if (first)
        TRY(weft_gather_rows(WEFT_TASK_STREAM, m->dtype, b->x, m->embed, b->tokens, (size_t)rows, H,
                             (size_t)c->vocab, H, H));
    else /* the stage before's hidden rows */
        TRY(weft_memcpy_async(b->x, b->x_host, (size_t)rows * H * es));
    for (int li = m->first_layer; li < m->end_layer; li++)
        if (layer_batch(b, li, rows, n, mixed))
            return -1;
    if (!last) { /* for the next stage */
        TRY(weft_memcpy_async(b->x_host, b->x, (size_t)rows * H * es));
        return 0;
    }
    if (!wl_model_makes_logits(m)) /* tensor parallel's ranks but 0 */
        return 0;
    if (mixed) { /* each sequence's last row: the logits it continues from */
        TRY(weft_gather_rows(WEFT_TASK_STREAM, m->dtype, b->h, b->x, b->last_rows, (size_t)n, H,
                             (size_t)rows, H, H));
        TRY(weft_rmsnorm(WEFT_TASK_STREAM, m->dtype, b->h, NULL, b->h, NULL, m->final_norm,
                         (float)c->rms_eps, (size_t)n, H, H));
    } else {
        TRY(weft_rmsnorm(WEFT_TASK_STREAM, m->dtype, b->h, NULL, b->x, NULL, m->final_norm,
                         (float)c->rms_eps, (size_t)n, H, H));
    }
    TRY(wl_linear(m, b->logits, (size_t)c->vocab, b->h, H, m->lm_head, (size_t)c->vocab, NULL, NULL,
                  n, WEFT_DTYPE_F32));
    if (want_logits) /* as the model gave them, before the penalties */
        TRY(weft_memcpy_async(b->logits_host, b->logits, (size_t)n * c->vocab * 4));
    if (penalised)
        TRY(weft_penalize(WEFT_TASK_STREAM, WEFT_DTYPE_F32, b->logits, (size_t)n, (size_t)c->vocab,
                          (size_t)c->vocab, b->pen_host, b->adjust_host));
    if (want_picked) {
        TRY(weft_memcpy_async(b->sampling, b->sampling_host, (size_t)n * sizeof *b->sampling));
        TRY(weft_sample(WEFT_TASK_STREAM, WEFT_DTYPE_F32, b->picked, b->logits, (size_t)n,
                        (size_t)c->vocab, (size_t)c->vocab, b->sampling));
        TRY(weft_memcpy_async(b->picked_host, b->picked, (size_t)n * 4));
    }
    return 0;
fail:
    return -1;
}

/* The page-locked penalties, taken at the first penalised step. */
static int penalty_buffers(wl_batch *b)
{
    size_t B = (size_t)b->max_seqs;
    if (!b->pen_host)
        TRY(weft_host_alloc(b->rt, (void **)&b->pen_host, B * sizeof *b->pen_host));
    if (!b->adjust_host)
        TRY(weft_host_alloc(b->rt, (void **)&b->adjust_host,
                            B * b->adjust_row * sizeof *b->adjust_host));
    return 0;
fail:
    return -1;
}

/* Row i's penalties into the page-locked buffers (taken at the first
 * penalised step); whether any row has some. */
static int stage_penalties(wl_batch *b, const wl_draw *draws, int n, int *penalised)
{
    *penalised = 0;
    for (int i = 0; draws && i < n; i++)
        *penalised |= draws[i].pen != NULL;
    if (!*penalised)
        return 0;
    if (penalty_buffers(b))
        return -1;
    for (int i = 0; i < n; i++) {
        const wl_pen_track *t = draws[i].pen;
        if (t && t->row.count > b->adjust_row)
            return wl_fail("batch: %u penalised tokens in a row; the batch holds %zu", t->row.count,
                           b->adjust_row);
        b->pen_host[i] = t ? t->row : (weft_penalties){0};
        b->pen_host[i].first = (uint32_t)((size_t)i * b->adjust_row);
        if (t)
            memcpy(b->adjust_host + (size_t)i * b->adjust_row, t->adjust,
                   t->row.count * sizeof *t->adjust);
    }
    return 0;
}

/* A step's device work (enqueue_step's), awaited: a graph per batch size
 * and what it brings back. A repeating step replays its graph as it
 * stands (its inputs are the page-locked buffers just filled), else
 * records it (the host backend runs it as it comes). A mixed step, whose
 * rows change with its chunks, runs eagerly. */
/* own, when not NULL, is forward_step's account: paused over the await. */
static int run_step(wl_batch *b, int rows, int n, int mixed, int want_logits, int want_picked,
                    int penalised, cpu_account *own)
{
    int graph = b->graph && !mixed, replayed = 0, in_region = 0;
    uint64_t key = STEP_REGION(b->serial, n, want_logits, want_picked, penalised);
    if (graph && b->replay)
        TRY(weft_region_replay(key, &replayed));
    if (!replayed) {
        if (graph)
            TRY(weft_region_begin(key));
        in_region = graph;
        b->own = own;
        int failed = enqueue_step(b, rows, n, mixed, want_logits, want_picked, penalised);
        b->own = NULL;
        if (failed)
            goto fail;
        in_region = 0;
        if (graph)
            TRY(weft_region_end());
    }
    if (own)
        account_pause(own);
    TRY(weft_await());
    if (own)
        account_resume(own);
    return 0;
fail:
    if (in_region) { /* closed, its work dropped; the error is the op's */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", wl_error());
        weft_region_end();
        wl_fail("%s", msg);
    }
    wl_await_keeping_error(); /* work already enqueued reads our buffers */
    return -1;
}

/* ---- pipeline stages ------------------------------------------------------- */

/*
 * A step goes from rank to rank as a head (what it is and its sizes) and
 * then its parts: the host inputs that the stages' copies in read
 * (positions, lengths, tables, a mixed step's rows, the draws and
 * penalties for the last stage) and the hidden rows. Both sides list the
 * parts from the head alone (step_parts), so they agree on them; the
 * ranks' batches were found alike when they were linked. The last stage
 * sends the step's results to rank 0: the drawn tokens and the logits, as
 * asked.
 */
enum { STEP_END, STEP_RUN, STEP_FAILED };

/* How a step went on the stages after rank 0: the last stage sends it to
 * rank 0 before the results, and a stage whose step failed passes it on
 * in place of the step (STEP_FAILED), so rank 0's step fails with the
 * message instead of waiting. */
typedef struct step_status {
    int32_t failed, rank;
    char message[504];
} step_status;

enum {
    HEAD_KIND,
    HEAD_ROWS,
    HEAD_SEQS,
    HEAD_MIXED,
    HEAD_LOGITS,
    HEAD_PICKED,
    HEAD_PENALISED,
    HEAD_WORDS
};

static void step_head(int32_t *head, int kind, int rows, int n, int mixed, int logits, int picked,
                      int penalised)
{
    int32_t h[HEAD_WORDS] = {kind, rows, n, mixed, logits, picked, penalised};
    memcpy(head, h, sizeof h);
}

/* A run step's parts after its head, the hidden rows last. */
static int step_parts(const wl_batch *b, const int32_t *head, wl_part *p)
{
    size_t rows = (size_t)head[HEAD_ROWS], n = (size_t)head[HEAD_SEQS], k = 0;
    size_t H = (size_t)b->m->cfg.hidden, es = wl_dtype_size(b->m->dtype);
    p[k++] = (wl_part){b->pos_host, rows * 4};
    p[k++] = (wl_part){b->lens_host, n * 4};
    p[k++] = (wl_part){b->table_host, n * (size_t)b->max_pages * 4};
    if (head[HEAD_MIXED])
        p[k++] = (wl_part){b->rows_host, (rows + 2 * n + 1) * 4};
    if (head[HEAD_PICKED])
        p[k++] = (wl_part){b->sampling_host, n * sizeof *b->sampling_host};
    if (head[HEAD_PENALISED]) {
        p[k++] = (wl_part){b->pen_host, n * sizeof *b->pen_host};
        p[k++] = (wl_part){b->adjust_host, n * b->adjust_row * sizeof *b->adjust_host};
    }
    p[k++] = (wl_part){b->x_host, rows * H * es};
    return (int)k;
}

/* The step (its head, then its parts) to the next rank. */
static int pass_on(wl_batch *b, const int32_t *head)
{
    wl_part p[WL_MAX_PARTS];
    int n = 0, next = wl_link_rank(b->link) + 1;
    p[n++] = (wl_part){(void *)head, HEAD_WORDS * 4};
    if (head[HEAD_KIND] == STEP_RUN)
        n += step_parts(b, head, p + n);
    return wl_link_move(b->link, next, 1, p, n);
}

/* The step's results, sent by the last stage (sending, with how the step
 * went there) or received by rank 0: the status, then if the step went
 * through the tokens and the logits, those the head asks for. */
static int results(wl_batch *b, const int32_t *head, int sending, step_status *st)
{
    wl_part p[2] = {{st, sizeof *st}};
    int n = 0, peer = sending ? 0 : wl_link_ranks(b->link) - 1;
    size_t seqs = (size_t)head[HEAD_SEQS];
    if (wl_link_move(b->link, peer, sending, p, 1))
        return -1;
    if (st->failed) {
        st->message[sizeof st->message - 1] = 0;
        return sending ? 0 : wl_fail("pipeline: rank %d: %s", st->rank, st->message);
    }
    if (head[HEAD_PICKED])
        p[n++] = (wl_part){b->picked_host, seqs * 4};
    if (head[HEAD_LOGITS])
        p[n++] = (wl_part){b->logits_host, seqs * (size_t)b->m->cfg.vocab * 4};
    return n ? wl_link_move(b->link, peer, sending, p, n) : 0;
}

int wl_batch_link(wl_batch *b, wl_link *l)
{
    const wl_model *m = b->m;
    const wl_config *c = &m->cfg;
    int first = 0, end = 0, ranks = wl_link_ranks(l), staged = 0;
    if (wl_link_stage(l, c->layers, &first, &end) == 0)
        staged = m->first_layer == first && m->end_layer == end;
    /* what every rank's steps must agree on, and whether its model is its stage */
    enum { WORDS = 9 };
    int32_t mine[WORDS] = {staged,         first,        end,
                           m->first_layer, m->end_layer, b->max_seqs,
                           b->max_pages,   b->max_rows,  (int32_t)b->adjust_row};
    int32_t *all = malloc((size_t)ranks * WORDS * sizeof *all);
    if (!all)
        return wl_fail("out of memory");
    if (wl_link_gather(l, mine, WORDS, all)) {
        free(all);
        return -1;
    }
    int rc = 0;
    for (int r = 0; r < ranks && !rc; r++) {
        const int32_t *w = all + (size_t)r * WORDS;
        if (!w[0])
            rc = wl_fail("pipeline: rank %d runs layers [%d, %d); its model is set to [%d, %d)", r,
                         w[1], w[2], w[3], w[4]);
        else if (memcmp(w + 5, mine + 5, 4 * sizeof *w))
            rc = wl_fail("pipeline: rank %d's batch is of another shape than rank %d's (%d "
                         "sequences, %d pages, %d rows a step)",
                         r, wl_link_rank(l), w[5], w[6], w[7]);
    }
    free(all);
    if (rc)
        return -1;
    if (!b->x_host) {
        size_t bytes = (size_t)b->max_rows * m->cfg.hidden * wl_dtype_size(m->dtype);
        TRY(weft_host_alloc(b->rt, &b->x_host, bytes));
    }
    b->link = l;
    return 0;
fail:
    return -1;
}

int wl_batch_unlink(wl_batch *b)
{
    int rc = 0;
    if (b->tp && b->tp_rank == 0) { /* the followers' last step */
        int32_t head[WL_TP_HEAD_WORDS] = {0};
        step_head(head, STEP_END, 0, 0, 0, 0, 0, 0);
        wl_tp_post(b->tp, head, b);
        b->tp = NULL;
    }
    if (b->link && wl_link_rank(b->link) == 0 && wl_link_ranks(b->link) > 1) {
        int32_t head[HEAD_WORDS];
        step_head(head, STEP_END, 0, 0, 0, 0, 0, 0);
        rc = pass_on(b, head);
    }
    b->link = NULL;
    return rc;
}

/* A step that failed here, or came failed from the stage before: passed
 * on, or from the last stage to rank 0. */
static int report_failed(wl_batch *b, int32_t *head, step_status *st, int last)
{
    if (last)
        return results(b, head, 1, st);
    head[HEAD_KIND] = STEP_FAILED;
    wl_part p[2] = {{head, HEAD_WORDS * 4}, {st, sizeof *st}};
    return wl_link_move(b->link, wl_link_rank(b->link) + 1, 1, p, 2);
}

int wl_batch_follow(wl_batch *b)
{
    if (!b->link || wl_link_rank(b->link) == 0)
        return wl_fail("pipeline: wl_batch_follow is for ranks but 0, their batch linked");
    const int rank = wl_link_rank(b->link), last = rank == wl_link_ranks(b->link) - 1;
    for (;;) {
        int32_t head[HEAD_WORDS];
        step_status st = {0};
        wl_part p[WL_MAX_PARTS] = {{head, sizeof head}};
        if (wl_link_move(b->link, rank - 1, 0, p, 1))
            return -1;
        if (head[HEAD_KIND] == STEP_END)
            return last ? 0 : pass_on(b, head);
        if (head[HEAD_KIND] == STEP_FAILED) {
            p[0] = (wl_part){&st, sizeof st};
            if (wl_link_move(b->link, rank - 1, 0, p, 1) || report_failed(b, head, &st, last))
                return -1;
            continue;
        }
        if (head[HEAD_KIND] != STEP_RUN)
            return wl_fail("pipeline: rank %d got a step of unknown kind %d", rank,
                           (int)head[HEAD_KIND]);
        if (head[HEAD_PENALISED] && penalty_buffers(b))
            return -1; /* its parts unread: the link is broken */
        int n = step_parts(b, head, p);
        if (wl_link_move(b->link, rank - 1, 0, p, n))
            return -1;
        if (run_step(b, head[HEAD_ROWS], head[HEAD_SEQS], head[HEAD_MIXED], head[HEAD_LOGITS],
                     head[HEAD_PICKED], head[HEAD_PENALISED], NULL)) {
            st.failed = 1;
            st.rank = rank;
            snprintf(st.message, sizeof st.message, "%s", wl_error());
            if (report_failed(b, head, &st, last))
                return -1;
            continue;
        }
        if (last ? results(b, head, 1, &st) : pass_on(b, head))
            return -1;
    }
}

/* ---- tensor parallel ------------------------------------------------------ */

/*
 * Rank 0 posts each step (its head, and its batch, whose host inputs the
 * followers copy into their own page-locked buffers: those their graphs
 * were recorded with); a barrier starts the step on every rank once all
 * have their inputs, and another ends it. The followers' steps make no
 * logits, so their heads ask for none.
 */
_Static_assert((int)HEAD_WORDS <= (int)WL_TP_HEAD_WORDS, "a step's head fits tensor parallel's");

int wl_batch_tp(wl_batch *b, wl_tp *tp, int rank)
{
    void *stream = NULL;
    if (b->link)
        return wl_fail("tensor parallel: the batch is a pipeline's stage");
    if (rank < 0 || rank >= wl_tp_ranks(tp) || b->m->shard_rank != rank ||
        b->m->shard_ranks != wl_tp_ranks(tp))
        return wl_fail("tensor parallel: the batch's model is rank %d of %d, not %d of %d",
                       b->m->shard_rank, b->m->shard_ranks, rank, wl_tp_ranks(tp));
    if (weft_stream(&stream) != WEFT_OK)
        return wl_fail("tensor parallel: %s", weft_last_error());
    if (!stream) /* the host backend's all-reduce waits for the rows inside the step */
        b->graph = b->replay = 0;
    b->tp = tp;
    b->tp_rank = rank;
    return 0;
}

/* The step's inputs, from rank 0's batch into b's. */
static void take_inputs(wl_batch *b, const wl_batch *lead, const int32_t *head)
{
    size_t rows = (size_t)head[HEAD_ROWS], n = (size_t)head[HEAD_SEQS];
    memcpy(b->pos_host, lead->pos_host, rows * 4);
    memcpy(b->tokens_host, lead->tokens_host, rows * 4);
    memcpy(b->lens_host, lead->lens_host, n * 4);
    memcpy(b->table_host, lead->table_host, n * (size_t)b->max_pages * 4);
    if (head[HEAD_MIXED])
        memcpy(b->rows_host, lead->rows_host, (rows + 2 * n + 1) * 4);
}

int wl_batch_follow_tp(wl_batch *b)
{
    if (!b->tp || b->tp_rank == 0)
        return wl_fail("tensor parallel: wl_batch_follow_tp is for ranks but 0, their batch "
                       "joined");
    uint64_t seen = 0;
    for (;;) {
        int32_t head[WL_TP_HEAD_WORDS];
        const void *lead;
        if (wl_tp_next(b->tp, &seen, head, &lead))
            return -1;
        if (head[HEAD_KIND] == STEP_END)
            return 0;
        const wl_batch *l = lead;
        if (l->max_pages != b->max_pages || head[HEAD_ROWS] > b->max_rows ||
            head[HEAD_SEQS] > b->max_seqs) {
            wl_tp_break(b->tp, b->tp_rank, "its batch is of another shape than rank 0's");
            continue;
        }
        take_inputs(b, l, head);
        if (wl_tp_barrier(b->tp))
            continue; /* broken: the next wait says so */
        if (run_step(b, head[HEAD_ROWS], head[HEAD_SEQS], head[HEAD_MIXED], 0, 0, 0, NULL)) {
            wl_tp_break(b->tp, b->tp_rank, "%s", wl_error());
            continue;
        }
        wl_tp_barrier(b->tp);
    }
}

/* Rank 0's step on every rank: posted, started together, ended together. */
static int run_tp_step(wl_batch *b, int rows, int n, int mixed, int want_logits, int want_picked,
                       int penalised, cpu_account *own)
{
    int32_t head[WL_TP_HEAD_WORDS] = {0};
    step_head(head, STEP_RUN, rows, n, mixed, want_logits, want_picked, penalised);
    wl_tp_post(b->tp, head, b);
    account_pause(own); /* the barriers wait, as the await does */
    int rc = wl_tp_barrier(b->tp);
    account_resume(own);
    if (rc)
        return -1;
    if (run_step(b, rows, n, mixed, want_logits, want_picked, penalised, own)) {
        wl_tp_break(b->tp, 0, "%s", wl_error());
        return -1;
    }
    account_pause(own);
    rc = wl_tp_barrier(b->tp);
    account_resume(own);
    return rc;
}

/* wl_forward_batch (counts NULL: a token each) and wl_forward_mixed. */
static int forward_step(wl_batch *b, wl_seq *const *seqs, const int32_t *ids, const int *counts,
                        int n, const float **logits, const wl_draw *draws, int32_t *picked)
{
    const wl_model *m = b->m;
    const wl_config *c = &m->cfg;
    size_t P = (size_t)b->max_pages;
    int penalised = 0, rows = 0, mixed = 0;
    cpu_account own = {0, thread_cpu_ns()};
    if (n < 1 || n > b->max_seqs)
        return wl_fail("batch: %d sequences; the batch takes 1 to %d", n, b->max_seqs);
    for (int i = 0; i < n; i++) {
        const wl_seq *s = seqs[i];
        int k = counts ? counts[i] : 1;
        if (s->m != m || s->kv != b->kv)
            return wl_fail("batch: sequence %d is of another model or KV cache", i);
        if (!counts && s->pos < 1)
            return wl_fail("batch: sequence %d has no prompt yet (prefill it with wl_forward)", i);
        if (k < 1 || k > b->most)
            return wl_fail("batch: %d tokens of sequence %d; a step takes 1 to %d of one", k, i,
                           b->most);
        if (s->pos + k > s->max_tokens || s->pages.max_pages > b->max_pages)
            return wl_fail("batch: sequence %d is full (%d tokens) or longer than the batch's %d "
                           "pages",
                           i, s->max_tokens, b->max_pages);
        for (int t = 0; t < k; t++)
            if (ids[rows + t] < 0 || ids[rows + t] >= c->vocab)
                return wl_fail("batch: token id %d is outside the vocabulary (%d)", ids[rows + t],
                               c->vocab);
        for (int j = 0; j < i; j++)
            if (seqs[j] == s)
                return wl_fail("batch: sequence %d is also row %d", i, j);
        rows += k;
        mixed |= k > 1;
    }
    if (rows > b->max_rows)
        return wl_fail("batch: a step of %d tokens; the batch holds %d", rows, b->max_rows);
    if (stage_penalties(b, draws, n, &penalised))
        return -1;
    for (int i = 0; i < n; i++)
        if (wl_kv_seq_grow(&seqs[i]->pages, seqs[i]->pos + (counts ? counts[i] : 1)))
            return -1; /* nothing enqueued; pages taken stay the sequences' */
    int32_t *row_seqs = b->rows_host, *cu = row_seqs + rows, *last = cu + n + 1;
    cu[0] = 0;
    for (int i = 0, r = 0; i < n; i++) {
        const wl_seq *s = seqs[i];
        int k = counts ? counts[i] : 1;
        for (int t = 0; t < k; t++, r++) {
            b->pos_host[r] = s->pos + t;
            b->tokens_host[r] = ids[r];
            row_seqs[r] = i;
        }
        cu[i + 1] = r;
        last[i] = r - 1;
        b->lens_host[i] = s->pos + k;
        b->sampling_host[i] = draws ? draws[i].how : (weft_sampling){0};
        memcpy(b->table_host + i * P, s->pages.table, (size_t)s->pages.used * 4);
    }
    if (b->tp ? run_tp_step(b, rows, n, mixed, logits != NULL, picked != NULL, penalised, &own)
              : run_step(b, rows, n, mixed, logits != NULL, picked != NULL, penalised, &own))
        return -1;
    const int piped = b->link && wl_link_ranks(b->link) > 1;
    if (piped) { /* a pipeline's first stage */
        int32_t head[HEAD_WORDS];
        step_head(head, STEP_RUN, rows, n, mixed, logits != NULL, picked != NULL, penalised);
        step_status st = {0};
        if (pass_on(b, head) || results(b, head, 0, &st))
            return -1;
    }
    for (int i = 0; i < n; i++) {
        seqs[i]->pos += counts ? counts[i] : 1;
        if (logits)
            logits[i] = b->logits_host + (size_t)i * c->vocab;
        if (picked)
            picked[i] = b->picked_host[i];
    }
    if (!piped) { /* a pipeline's transfers wait too: its steps go unaccounted */
        account_pause(&own);
        b->own_ns += own.total;
    }
    return 0;
}

uint64_t wl_batch_own_cpu_ns(const wl_batch *b)
{
    return b->own_ns;
}

int wl_forward_batch(wl_batch *b, wl_seq *const *seqs, const int32_t *ids, int n,
                     const float **logits, const wl_draw *draws, int32_t *picked)
{
    return forward_step(b, seqs, ids, NULL, n, logits, draws, picked);
}

int wl_forward_mixed(wl_batch *b, wl_seq *const *seqs, const int32_t *ids, const int *counts, int n,
                     const float **logits, const wl_draw *draws, int32_t *picked)
{
    if (!counts)
        return wl_fail("batch: a mixed step needs its counts");
    return forward_step(b, seqs, ids, counts, n, logits, draws, picked);
}

/* ---- the batcher ------------------------------------------------------------ */

typedef struct slot {
    wl_seq *seq; /* NULL: free */
    int32_t id;
    const int32_t *toks; /* its tokens for the step: &id, or a prompt's chunk */
    int count;
    int waiting; /* handed a token; cleared when its logits (or error) are in */
    int taken;   /* its token is in the step the batcher is running */
    int wants_logits;
    int evicted;  /* preempted: its next step returns WL_PREEMPTED */
    wl_draw draw; /* how its token is drawn */
    int rc;
    const float *logits; /* NULL when no member of the step wanted them */
    int32_t picked;
    char message[512];
} slot;

struct wl_batcher {
    wl_batch *batch;
    weft_mutex *lock;
    weft_cond *work, *done;
    int max_seqs, max_rows, members, waiting, closed;
    int prompt_budget; /* prompt tokens a step beside decoding rows (0: the rows') */
    long steps, rows_run;
    slot *slots;
    /* the step's sequences and tokens (the batcher's own, outside the lock) */
    wl_seq **seqs;
    int32_t *ids; /* max_rows */
    int *rows, *counts;
    const float **logits;
    wl_draw *draws;
    int32_t *picked;
};

int wl_batcher_link(wl_batcher *bt, wl_link *l)
{
    return wl_batch_link(bt->batch, l);
}

int wl_batcher_unlink(wl_batcher *bt)
{
    return wl_batch_unlink(bt->batch);
}

int wl_batcher_tp(wl_batcher *bt, wl_tp *tp)
{
    return wl_batch_tp(bt->batch, tp, 0);
}

int wl_batcher_create(wl_batcher **out, const wl_model *m, wl_kv *kv, int max_seqs, int max_tokens,
                      int chunk)
{
    wl_batcher *bt = calloc(1, sizeof *bt);
    *out = NULL;
    if (!bt)
        return wl_fail("out of memory");
    bt->max_seqs = max_seqs;
    chunk = chunk > 0 ? chunk : 0;
    bt->max_rows = max_seqs + chunk; /* the batch's rows */
    bt->slots = calloc((size_t)(max_seqs > 0 ? max_seqs : 1), sizeof *bt->slots);
    bt->seqs = calloc((size_t)(max_seqs > 0 ? max_seqs : 1), sizeof *bt->seqs);
    bt->ids = calloc((size_t)(bt->max_rows > 0 ? bt->max_rows : 1), sizeof *bt->ids);
    bt->rows = calloc((size_t)(max_seqs > 0 ? max_seqs : 1), sizeof *bt->rows);
    bt->counts = calloc((size_t)(max_seqs > 0 ? max_seqs : 1), sizeof *bt->counts);
    bt->logits = calloc((size_t)(max_seqs > 0 ? max_seqs : 1), sizeof *bt->logits);
    bt->draws = calloc((size_t)(max_seqs > 0 ? max_seqs : 1), sizeof *bt->draws);
    bt->picked = calloc((size_t)(max_seqs > 0 ? max_seqs : 1), sizeof *bt->picked);
    if (!bt->slots || !bt->seqs || !bt->ids || !bt->rows || !bt->counts || !bt->logits ||
        !bt->draws || !bt->picked) {
        wl_batcher_destroy(bt);
        return wl_fail("out of memory");
    }
    if (weft_mutex_create(&bt->lock) != WEFT_OK || weft_cond_create(&bt->work) != WEFT_OK ||
        weft_cond_create(&bt->done) != WEFT_OK) {
        wl_fail("batcher: %s", weft_last_error());
        wl_batcher_destroy(bt);
        return -1;
    }
    if (wl_batch_create(&bt->batch, m, kv, max_seqs, max_tokens, chunk)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", wl_error());
        wl_batcher_destroy(bt);
        return wl_fail("%s", msg);
    }
    *out = bt;
    return 0;
}

void wl_batcher_destroy(wl_batcher *bt)
{
    if (!bt)
        return;
    wl_batch_destroy(bt->batch);
    if (bt->done)
        weft_cond_destroy(bt->done);
    if (bt->work)
        weft_cond_destroy(bt->work);
    if (bt->lock)
        weft_mutex_destroy(bt->lock);
    free(bt->slots);
    free(bt->seqs);
    free(bt->ids);
    free(bt->rows);
    free(bt->counts);
    free(bt->logits);
    free(bt->draws);
    free(bt->picked);
    free(bt);
}

void *wl_batcher_run(void *arg)
{
    wl_batcher *bt = arg;
    wl_lock_always(bt->lock);
    for (;;) {
        while (!(bt->members > 0 && bt->waiting == bt->members) &&
               !(bt->closed && bt->members == 0))
            if (weft_cond_wait(bt->work, bt->lock) == WEFT_ECANCELED)
                goto out; /* the batcher's task was cancelled */
        if (bt->members == 0)
            break; /* closed, and every sequence has left */
        /* every decode token, then prompts' chunks while the rows last (a
         * chunk left out stays waiting, for the next step); beside decoding
         * rows, prompt tokens up to the budget, a chunk cut where it runs
         * out (its rest waits for the next step) */
        int n = 0, tokens = 0, wants_logits = 0, decoding = 0, prompt = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < bt->max_seqs; i++) {
                slot *sl = &bt->slots[i];
                if (!sl->seq || !sl->waiting || (sl->count > 1) != pass)
                    continue;
                int take = sl->count;
                if (pass == 1 && decoding && bt->prompt_budget > 0)
                    take = take < bt->prompt_budget - prompt ? take : bt->prompt_budget - prompt;
                if (take < 1 || tokens + take > bt->max_rows)
                    continue;
                sl->taken = 1;
                wants_logits |= sl->wants_logits && take == sl->count;
                bt->rows[n] = i;
                bt->seqs[n] = sl->seq;
                /* a part of a chunk draws nothing its sequence reads */
                bt->draws[n] = take == sl->count ? sl->draw : (wl_draw){{0}, NULL};
                bt->counts[n++] = take;
                memcpy(bt->ids + tokens, sl->toks, (size_t)take * sizeof *bt->ids);
                tokens += take;
                decoding += pass == 0;
                prompt += pass == 1 ? take : 0;
            }
        /* every member waits in wl_batcher_step until we clear waiting:
         * none can join's slot or leave while the step runs unlocked */
        weft_mutex_unlock(bt->lock);
        int rc = wl_forward_mixed(bt->batch, bt->seqs, bt->ids, bt->counts, n,
                                  wants_logits ? bt->logits : NULL, bt->draws, bt->picked);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rc ? wl_error() : "");
        wl_lock_always(bt->lock);
        int finished = 0;
        for (int r = 0; r < n; r++) {
            slot *sl = &bt->slots[bt->rows[r]];
            if (!rc && bt->counts[r] < sl->count) { /* a part: the rest is still waiting */
                sl->toks += bt->counts[r];
                sl->count -= bt->counts[r];
                sl->taken = 0;
                continue;
            }
            finished++;
            sl->rc = rc;
            sl->logits = rc || !wants_logits ? NULL : bt->logits[r];
            sl->picked = bt->picked[r];
            snprintf(sl->message, sizeof sl->message, "%s", msg);
            sl->waiting = sl->taken = 0;
        }
        bt->waiting -= finished;
        bt->steps++;
        bt->rows_run += tokens;
        weft_cond_broadcast(bt->done);
    }
out:
    weft_mutex_unlock(bt->lock);
    return NULL;
}

static slot *find(wl_batcher *bt, const wl_seq *s)
{
    for (int i = 0; i < bt->max_seqs; i++)
        if (bt->slots[i].seq == s)
            return &bt->slots[i];
    return NULL;
}

void wl_batcher_set_prompt_budget(wl_batcher *bt, int tokens)
{
    wl_lock_always(bt->lock);
    bt->prompt_budget = tokens > 0 ? tokens : 0;
    weft_mutex_unlock(bt->lock);
}

int wl_batcher_join(wl_batcher *bt, wl_seq *s)
{
    wl_lock_always(bt->lock);
    slot *sl = bt->closed || find(bt, s) ? NULL : find(bt, NULL);
    if (sl) {
        memset(sl, 0, sizeof *sl);
        sl->seq = s;
        bt->members++;
    }
    int closed = bt->closed;
    weft_mutex_unlock(bt->lock);
    if (!sl)
        return wl_fail(closed ? "batcher: closed"
                              : "batcher: already a member, or all %d "
                                "places are taken",
                       bt->max_seqs);
    return 0;
}

/* wl_batcher_step (a token) and wl_batcher_prefill (a chunk). */
static int submit(wl_batcher *bt, wl_seq *s, int32_t id, const int32_t *chunk, int count,
                  const wl_draw *draw, const float **logits, int32_t *picked)
{
    if (logits)
        *logits = NULL;
    if (weft_cancelled())
        return wl_fail("batcher: the sequence's task was cancelled");
    wl_lock_always(bt->lock);
    slot *sl = find(bt, s);
    if (!sl) {
        weft_mutex_unlock(bt->lock);
        return wl_fail("batcher: the sequence has not joined");
    }
    if (sl->evicted) {
        weft_mutex_unlock(bt->lock);
        return WL_PREEMPTED;
    }
    sl->id = id;
    sl->toks = chunk ? chunk : &sl->id;
    sl->count = count;
    sl->wants_logits = logits != NULL;
    sl->draw = draw ? *draw : (wl_draw){{0}, NULL};
    sl->waiting = 1;
    bt->waiting++;
    if (bt->waiting == bt->members)
        weft_cond_signal(bt->work);
    int withdrawn = 0, evicted = 0;
    while (sl->waiting) {
        if (sl->evicted && !sl->taken) { /* preempted before a step took its token */
            sl->waiting = 0;
            bt->waiting--;
            evicted = 1;
            break;
        }
        if (weft_cond_wait(bt->done, bt->lock) != WEFT_ECANCELED)
            continue;
        /* cancelled while waiting: a token not yet in a step is withdrawn;
         * a step in flight reads the sequence, so that one is waited out
         * (the condition variable refuses a cancelled task: by yielding) */
        if (!sl->taken) {
            sl->waiting = 0;
            bt->waiting--;
            withdrawn = 1;
            break;
        }
        weft_mutex_unlock(bt->lock);
        weft_yield();
        wl_lock_always(bt->lock);
    }
    if (evicted) {
        weft_mutex_unlock(bt->lock);
        return WL_PREEMPTED;
    }
    int rc = withdrawn ? -1 : sl->rc;
    char msg[512];
    snprintf(msg, sizeof msg, "%s",
             withdrawn ? "batcher: the sequence's task was cancelled" : sl->message);
    if (logits)
        *logits = rc ? NULL : sl->logits;
    if (picked)
        *picked = rc ? -1 : sl->picked;
    weft_mutex_unlock(bt->lock);
    return rc ? wl_fail("%s", msg) : 0;
}

int wl_batcher_step(wl_batcher *bt, wl_seq *s, int32_t id, const wl_draw *draw,
                    const float **logits, int32_t *picked)
{
    return submit(bt, s, id, NULL, 1, draw, logits, picked);
}

int wl_batcher_prefill(wl_batcher *bt, wl_seq *s, const int32_t *ids, int n, const wl_draw *draw,
                       const float **logits, int32_t *picked)
{
    if (n < 1 || n > bt->batch->most)
        return wl_fail("batcher: a chunk of %d tokens; its steps take 1 to %d", n, bt->batch->most);
    return submit(bt, s, ids[0], ids, n, draw, logits, picked);
}

void wl_batcher_leave(wl_batcher *bt, wl_seq *s)
{
    wl_lock_always(bt->lock);
    slot *sl = find(bt, s);
    if (sl) {
        sl->seq = NULL;
        bt->members--;
        /* the rest may all be waiting already, or the batcher may be done */
        weft_cond_signal(bt->work);
    }
    weft_mutex_unlock(bt->lock);
}

void wl_batcher_evict(wl_batcher *bt, const wl_seq *s)
{
    wl_lock_always(bt->lock);
    slot *sl = find(bt, s);
    if (sl)
        sl->evicted = 1;
    weft_cond_broadcast(bt->done);
    weft_mutex_unlock(bt->lock);
}

void wl_batcher_close(wl_batcher *bt)
{
    wl_lock_always(bt->lock);
    bt->closed = 1;
    weft_cond_signal(bt->work);
    weft_mutex_unlock(bt->lock);
}

int wl_batcher_next_step(wl_batcher *bt, int (*stop)(void *ctx), void *ctx)
{
    wl_lock_always(bt->lock);
    long seen = bt->steps;
    int rc = 0;
    while (bt->members > 0 && !bt->closed && bt->steps == seen) {
        /* stop is asked between waits of at most 50 ms, outside the lock
         * (it may take its caller's) */
        int w = weft_cond_wait_until(bt->done, bt->lock, weft_deadline_in_ns(50 * 1000000ull));
        if (w == WEFT_ECANCELED) {
            rc = -1;
            break;
        }
        if (stop) {
            weft_mutex_unlock(bt->lock);
            int go = stop(ctx);
            wl_lock_always(bt->lock);
            if (go) {
                rc = WL_PREEMPTED;
                break;
            }
        }
    }
    weft_mutex_unlock(bt->lock);
    if (rc == -1)
        return wl_fail("batcher: the task was cancelled while its prompt waited for a step");
    return rc;
}

void wl_batcher_stats(wl_batcher *bt, long *steps, long *rows)
{
    wl_lock_always(bt->lock);
    *steps = bt->steps;
    *rows = bt->rows_run;
    weft_mutex_unlock(bt->lock);
}
