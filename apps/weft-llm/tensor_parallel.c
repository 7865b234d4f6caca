/*
 * tensor_parallel.c - a model split over the GPUs of one process.
 *
 * Rank r of R holds 1/R of every layer (Megatron's split):
 *  - q, k and v by heads and gate and up by MLP rows (their rows are
 *    contiguous in the files: the rank's weights start further in), so
 *    each rank's attention runs over its own heads, with its own share of
 *    the key-value heads in its own cache, and its MLP over its own
 *    columns of the activation;
 *  - o and down by their input columns (strided in the files: copied once
 *    into a host block of the rank's), so each rank's product is a
 *    partial sum of the full output;
 *  - a mixture of experts' experts each as a dense MLP is (gate and up
 *    rows, down columns), and a shared expert likewise; the router whole,
 *    so that every rank routes each token to the same experts;
 *  - the norms and the embedding whole on every rank, the final norm and
 *    the lm_head on rank 0 alone.
 * A layer's residual stream is whole on every rank: after the o and down
 * products (rank 0 adds the residual, the others their products alone)
 * one all-reduce sums the ranks' rows, so each rank continues from the
 * same rows. On GPUs that is NCCL's all-reduce on the rank's stream (a
 * decode step's graph records it with the rest); on the host backend the
 * ranks' tasks add their rows in host memory here, rank by rank in the
 * same order on every call.
 *
 * The group also hands rank 0's steps to the other ranks (batch.c): rank 0
 * posts each step and the followers copy its inputs; a barrier then
 * starts the step on every rank, and another ends it, carrying the first
 * failure to all of them (a failed rank breaks the group: every wait in it
 * returns the failure from then on).
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "forward_impl.h"
#ifdef WL_HAVE_NCCL
#include <weft/nccl.h>
#endif

/* ---- the model's share ------------------------------------------------------ */

/* The rank's columns [rank cols, (rank + 1) cols) of a row-major matrix
 * of rows x width elements of es bytes, copied to dst; returns dst's end. */
static char *columns(char *dst, const void *src, size_t rows, size_t width, size_t cols, int rank,
                     size_t es)
{
    for (size_t row = 0; row < rows; row++, dst += cols * es)
        memcpy(dst, (const char *)src + (row * width + (size_t)rank * cols) * es, cols * es);
    return dst;
}

/* The rank's rows of a row-major matrix (or vector) whose rows are width
 * elements wide: they start rank rows rows further in. */
static const void *rows_of(const void *p, int rank, size_t rows, size_t width, size_t es)
{
    return (const char *)p + (size_t)rank * rows * width * es;
}

int wl_model_set_shard(wl_model *m, int rank, int ranks)
{
    wl_config *c = &m->cfg;
    if (ranks < 1 || rank < 0 || rank >= ranks)
        return wl_fail("tensor parallel: rank %d of %d", rank, ranks);
    if (m->device_block || m->host_block || m->narrow_block || m->shard_block)
        return wl_fail("tensor parallel: a model is split before its upload, once");
    if (ranks == 1)
        return 0;
    if (m->sparse_2_4 || !wl_model_whole(m))
        return wl_fail("tensor parallel: %s are not split",
                       m->sparse_2_4 ? "2:4 sparse weights" : "pipeline stages");
    if (c->heads % ranks || c->kv_heads % ranks || c->intermediate % ranks ||
        c->moe_intermediate % ranks || c->shared_intermediate % ranks) {
        char experts[96] = "";
        if (c->experts)
            snprintf(experts, sizeof experts, " (an expert's %d, the shared expert's %d)",
                     c->moe_intermediate, c->shared_intermediate);
        return wl_fail("tensor parallel over %d ranks: the model's %d heads, %d key-value heads "
                       "and MLP width %d%s must each divide by %d",
                       ranks, c->heads, c->kv_heads, c->intermediate, experts, ranks);
    }
    size_t es = wl_dtype_size(m->dtype), H = (size_t)c->hidden, E = (size_t)c->experts;
    size_t wes = c->fp8 ? 1 : es; /* a projection's elements (FP8: their scales a float a row) */
    size_t q = (size_t)c->heads * c->head_dim, kv = (size_t)c->kv_heads * c->head_dim;
    size_t I = (size_t)c->intermediate, M = (size_t)c->moe_intermediate;
    size_t S = (size_t)c->shared_intermediate, R = (size_t)ranks;
    size_t qr = q / R, kvr = kv / R, Ir = I / R, Mr = M / R, Sr = S / R, bytes = 0;
    for (int li = 0; li < c->layers; li++) /* o's columns, and down's (the experts', shared) */
        bytes += H * (qr * wes + (m->layer[li].moe ? (E * Mr + Sr) * es : Ir * wes));
    char *block = malloc(bytes ? bytes : 1), *at = block;
    if (!block)
        return wl_fail("tensor parallel: out of memory for %zu bytes of o and down columns", bytes);
    for (int li = 0; li < c->layers; li++) {
        wl_layer *L = &m->layer[li];
        L->q = rows_of(L->q, rank, qr, H, wes);
        L->k = rows_of(L->k, rank, kvr, H, wes);
        L->v = rows_of(L->v, rank, kvr, H, wes);
        if (c->fp8) { /* a scale an output row: o's and down's rows stay whole */
            L->q_scale = rows_of(L->q_scale, rank, qr, 1, 4);
            L->k_scale = rows_of(L->k_scale, rank, kvr, 1, 4);
            L->v_scale = rows_of(L->v_scale, rank, kvr, 1, 4);
        }
        if (c->attention_bias) {
            L->q_bias = rows_of(L->q_bias, rank, qr, 1, es);
            L->k_bias = rows_of(L->k_bias, rank, kvr, 1, es);
            L->v_bias = rows_of(L->v_bias, rank, kvr, 1, es);
        }
        const void *o = L->o;
        L->o = at;
        at = columns(at, o, H, q, qr, rank, wes);
        if (!L->moe) {
            const void *down = L->down;
            L->gate = rows_of(L->gate, rank, Ir, H, wes);
            L->up = rows_of(L->up, rank, Ir, H, wes);
            if (c->fp8) {
                L->gate_scale = rows_of(L->gate_scale, rank, Ir, 1, 4);
                L->up_scale = rows_of(L->up_scale, rank, Ir, 1, 4);
            }
            L->down = at;
            at = columns(at, down, H, I, Ir, rank, wes);
            continue;
        }
        for (size_t e = 0; e < E; e++) { /* the router stays whole: every rank routes alike */
            const void *down = L->expert[3 * e + 2];
            L->expert[3 * e] = rows_of(L->expert[3 * e], rank, Mr, H, es);
            L->expert[3 * e + 1] = rows_of(L->expert[3 * e + 1], rank, Mr, H, es);
            L->expert[3 * e + 2] = at;
            at = columns(at, down, H, M, Mr, rank, es);
        }
        if (S) {
            const void *down = L->shared_down;
            L->shared_gate = rows_of(L->shared_gate, rank, Sr, H, es);
            L->shared_up = rows_of(L->shared_up, rank, Sr, H, es);
            L->shared_down = at;
            at = columns(at, down, H, S, Sr, rank, es);
        }
    }
    c->heads /= ranks;
    c->kv_heads /= ranks;
    c->intermediate /= ranks;
    c->moe_intermediate /= ranks;
    c->shared_intermediate /= ranks;
    m->shard_block = block;
    m->shard_rank = rank;
    m->shard_ranks = ranks;
    return 0;
}

int wl_open_ranks(wl_model ***out, wl_model *first, const char *dir, int ranks)
{
    size_t R = ranks > 1 ? (size_t)ranks : 1;
    wl_model **models = calloc(1, R * sizeof *models + (R - 1) * sizeof **models);
    *out = NULL;
    if (!models)
        return wl_fail("out of memory");
    wl_model *own = (wl_model *)(models + R);
    models[0] = first;
    for (size_t r = 1; r < R; r++) {
        models[r] = &own[r - 1];
        if (wl_model_open(models[r], dir)) {
            wl_close_ranks(models, (int)r);
            return -1;
        }
    }
    *out = models;
    return 0;
}

void wl_close_ranks(wl_model **models, int ranks)
{
    for (int r = 1; models && r < ranks; r++)
        wl_model_close(models[r]);
    free(models);
}

int wl_model_makes_logits(const wl_model *m)
{
    return m->end_layer == m->cfg.layers && m->shard_rank == 0;
}

/* ---- the group ---------------------------------------------------------------- */

/* A rank but 0's life (wl_tp_start_ranks). */
typedef struct rank_run {
    wl_tp *tp;
    wl_model *m;
    int rank, kv_pages, max_seqs, max_tokens, chunk;
    weft_task *task;
} rank_run;

struct wl_tp {
    int ranks;
    rank_run *run; /* [ranks]: 1 on, once started */
    int host;      /* the host backend: the ranks add their rows here */
    weft_mutex *lock;
    weft_cond *moved;    /* a barrier's generation, a posted step, a failure */
    int arrived;         /* at the barrier now */
    uint64_t generation; /* barriers passed */
    int broken;          /* a rank failed: every wait fails */
    char message[512];   /* the first failure */
    void **rows;         /* [ranks]: each rank's buffer in a host all-reduce */
    uint64_t posted;     /* steps rank 0 has posted */
    int32_t head[WL_TP_HEAD_WORDS];
    const void *leader; /* the posted step's batch (rank 0's) */
#ifdef WL_HAVE_NCCL
    weft_nccl_comm **comms; /* [ranks]: rank r's on device r */
#endif
};

/* An all-reduce run eagerly (a mixed step's) that takes longer than this
 * is aborted by libweft_nccl's watcher, failing its step, instead of
 * hanging (a rank that failed before it never joins); one inside a
 * replayed graph is not followed, and ends when the failed rank breaks the
 * group (wl_tp_break aborts the communicators). */
#define WL_TP_TIMEOUT_NS (120ull * 1000000000ull)

int wl_tp_create(wl_tp **out, weft_runtime *rt, int ranks)
{
    *out = NULL;
    unsigned devices = weft_device_count(rt);
    int host = !strcmp(weft_backend_name(rt), "host");
    if (ranks < 2)
        return wl_fail("tensor parallel: %d ranks; it takes 2 or more", ranks);
    if (!host && (unsigned)ranks > devices)
        return wl_fail("tensor parallel over %d GPUs: this machine has %u", ranks, devices);
#ifndef WL_HAVE_NCCL
    if (!host)
        return wl_fail("tensor parallel on GPUs needs NCCL, which this build lacks");
#endif
    wl_tp *tp = calloc(1, sizeof *tp);
    if (!tp || !(tp->rows = calloc((size_t)ranks, sizeof *tp->rows))) {
        free(tp);
        return wl_fail("out of memory");
    }
    tp->ranks = ranks;
    tp->host = host;
    if (weft_mutex_create(&tp->lock) != WEFT_OK || weft_cond_create(&tp->moved) != WEFT_OK) {
        wl_fail("tensor parallel: %s", weft_last_error());
        wl_tp_destroy(tp);
        return -1;
    }
#ifdef WL_HAVE_NCCL
    if (!host) {
        unsigned *dev = malloc((size_t)ranks * sizeof *dev);
        tp->comms = calloc((size_t)ranks, sizeof *tp->comms);
        for (int r = 0; dev && r < ranks; r++)
            dev[r] = (unsigned)r;
        int rc = !dev || !tp->comms ? WEFT_ENOMEM
                                    : weft_nccl_comm_init_all(rt, (unsigned)ranks, dev, tp->comms);
        for (int r = 0; rc == WEFT_OK && r < ranks; r++)
            rc = weft_nccl_comm_set_timeout(tp->comms[r], WL_TP_TIMEOUT_NS);
        free(dev);
        if (rc != WEFT_OK) {
            wl_fail("tensor parallel: NCCL's communicators: %s", weft_last_error());
            wl_tp_destroy(tp);
            return -1;
        }
    }
#endif
    *out = tp;
    return 0;
}

void wl_tp_destroy(wl_tp *tp)
{
    if (!tp)
        return;
#ifdef WL_HAVE_NCCL
    for (int r = 0; tp->comms && r < tp->ranks; r++)
        if (tp->comms[r])
            weft_nccl_comm_destroy(tp->comms[r]);
    free(tp->comms);
#endif
    if (tp->moved)
        weft_cond_destroy(tp->moved);
    if (tp->lock)
        weft_mutex_destroy(tp->lock);
    free(tp->rows);
    free(tp->run);
    free(tp);
}

int wl_tp_ranks(const wl_tp *tp)
{
    return tp->ranks;
}

unsigned wl_tp_device(const wl_tp *tp, int rank)
{
    return tp->host ? 0 : WEFT_DEVICE(rank);
}

/* The group's failure as the caller's error. */
static int failed(wl_tp *tp)
{
    return wl_fail("%s", tp->message);
}

void wl_tp_break(wl_tp *tp, int rank, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    wl_lock_always(tp->lock);
    if (!tp->broken) {
        tp->broken = 1;
        snprintf(tp->message, sizeof tp->message, "tensor parallel: rank %d: %s", rank, what);
#ifdef WL_HAVE_NCCL /* ends the collectives the others wait in */
        for (int r = 0; tp->comms && r < tp->ranks; r++)
            weft_nccl_comm_abort(tp->comms[r]);
#endif
    }
    weft_cond_broadcast(tp->moved);
    weft_mutex_unlock(tp->lock);
}

/* Under the lock: returns once every rank has arrived (0), or the group
 * broke (-1). */
static int barrier_locked(wl_tp *tp)
{
    uint64_t gen = tp->generation;
    if (tp->broken)
        return -1;
    if (++tp->arrived == tp->ranks) {
        tp->arrived = 0;
        tp->generation++;
        weft_cond_broadcast(tp->moved);
        return 0;
    }
    while (tp->generation == gen && !tp->broken)
        weft_cond_wait(tp->moved, tp->lock);
    return tp->generation == gen ? -1 : 0;
}

int wl_tp_barrier(wl_tp *tp)
{
    wl_lock_always(tp->lock);
    int rc = barrier_locked(tp);
    weft_mutex_unlock(tp->lock);
    return rc ? failed(tp) : 0;
}

int wl_tp_all_reduce(wl_tp *tp, int rank, void *buf, size_t count, weft_dtype dt)
{
    if (!tp->host) {
#ifdef WL_HAVE_NCCL
        if (weft_nccl_all_reduce(tp->comms[rank], buf, buf, count, dt, WEFT_NCCL_SUM) != WEFT_OK)
            return wl_fail("tensor parallel: all-reduce: %s", weft_last_error());
        return 0;
#endif
    }
    /* the rows are there once this rank's work before is done; rank 0
     * sums them in fp32, rank by rank, into every rank's buffer */
    if (weft_await() != WEFT_OK)
        return wl_fail("tensor parallel: %s", weft_last_error());
    wl_lock_always(tp->lock);
    tp->rows[rank] = buf;
    int rc = barrier_locked(tp);
    weft_mutex_unlock(tp->lock);
    if (!rc && rank == 0)
        for (size_t i = 0; i < count; i++) {
            float sum = 0;
            for (int r = 0; r < tp->ranks; r++)
                sum += wl_load(dt, tp->rows[r], i);
            for (int r = 0; r < tp->ranks; r++)
                wl_store(dt, tp->rows[r], i, sum);
        }
    return rc ? failed(tp) : wl_tp_barrier(tp);
}

/* ---- steps -------------------------------------------------------------------- */

void wl_tp_post(wl_tp *tp, const int32_t *head, const void *leader)
{
    wl_lock_always(tp->lock);
    memcpy(tp->head, head, sizeof tp->head);
    tp->leader = leader;
    tp->posted++;
    weft_cond_broadcast(tp->moved);
    weft_mutex_unlock(tp->lock);
}

int wl_tp_next(wl_tp *tp, uint64_t *seen, int32_t *head, const void **leader)
{
    wl_lock_always(tp->lock);
    while (tp->posted == *seen && !tp->broken)
        weft_cond_wait(tp->moved, tp->lock);
    int rc = tp->posted == *seen ? -1 : 0;
    if (!rc) {
        *seen = tp->posted;
        memcpy(head, tp->head, sizeof tp->head);
        *leader = tp->leader;
    }
    weft_mutex_unlock(tp->lock);
    return rc ? failed(tp) : 0;
}

/* ---- the ranks but 0 ------------------------------------------------------------ */

static void *rank_task(void *arg)
{
    rank_run *f = arg;
    wl_kv kv = {0};
    wl_batch *b = NULL;
    int failed = wl_model_set_shard(f->m, f->rank, f->tp->ranks) || wl_model_upload(f->m) ||
                 wl_kv_create(&kv, f->m, f->kv_pages, WL_KV_PAGE) ||
                 wl_batch_create(&b, f->m, &kv, f->max_seqs, f->max_tokens, f->chunk) ||
                 wl_batch_tp(b, f->tp, f->rank);
    if (failed)
        wl_tp_break(f->tp, f->rank, "%s", wl_error());
    if (!wl_tp_barrier(f->tp) && wl_batch_follow_tp(b)) /* ready with the others, or broken */
        wl_tp_break(f->tp, f->rank, "%s", wl_error());  /* already broken, as a rule */
    wl_batch_destroy(b);
    if (kv.lock_made)
        wl_kv_destroy(&kv);
    wl_model_release(f->m);
    return NULL;
}

void wl_tp_start_ranks(wl_tp *tp, weft_runtime *rt, wl_model *const *models, int kv_pages,
                       int max_seqs, int max_tokens, int chunk)
{
    if (!(tp->run = calloc((size_t)tp->ranks, sizeof *tp->run))) {
        wl_tp_break(tp, 0, "out of memory");
        return;
    }
    for (int r = 1; r < tp->ranks; r++) {
        rank_run *f = &tp->run[r];
        *f = (rank_run){tp, models[r], r, kv_pages, max_seqs, max_tokens, chunk, NULL};
        weft_task_opts opts = WEFT_TASK_OPTS_INIT;
        opts.name = "tensor-parallel rank";
        opts.device = wl_tp_device(tp, r);
        if (weft_spawn(rt, &f->task, rank_task, f, &opts) != WEFT_OK) {
            f->task = NULL;
            wl_tp_break(tp, r, "its task: %s", weft_last_error());
            return;
        }
    }
}

void wl_tp_join_ranks(wl_tp *tp)
{
    for (int r = 1; tp && tp->run && r < tp->ranks; r++)
        if (tp->run[r].task) {
            weft_join(tp->run[r].task, NULL);
            tp->run[r].task = NULL;
        }
}
