/*
 * moe.c - the mixture-of-experts router, permute and combine
 * (weft_moe_gate, weft_moe_permute, weft_moe_unpermute): their argument
 * checks and host references. moe.cu holds the kernels;
 * grouped_matmul.c the experts' matmul between permute and combine.
 *
 * The fusion: a framework routes with softmax, topk, a renormalising
 * division, then argsort/bincount/cumsum to group the rows by expert -
 * half a dozen kernels and, for the group sizes, often a copy to the
 * host. Here one call produces the weights, the ids and every table the
 * experts need (offsets, the permutation and its inverse), on the device.
 *
 * The host reference defines the results: the ids and tables exactly (the
 * selection compares logits, never rounded scores: moe.h), the weights in
 * the order written here (the kernels differ in the softmax's sum order
 * and their exp, within ~1e-6). The combine sums each product rounded on
 * its own, in slot order, so the kernels match it bit for bit.
 */
#include "core/error.h"
#include "ops/moe.h"
#include "ops/ops_internal.h"

/* ---- the router ------------------------------------------------------- */

static const char GATE[] = "weft_moe_gate";

/* Token t's k choices: ids in slot order, largest rank first. */
static void host_select(const weft__moe_gate_args *g, size_t t, int32_t *ids)
{
    uint64_t taken[WEFT__MOE_MAX_K];
    for (size_t j = 0; j < g->k; j++) {
        uint64_t best = 0;
        int have = 0;
        for (size_t e = 0; e < g->experts; e++) {
            float x = weft__load(g->dtype, g->logits, t * g->stride + e);
            uint64_t r = weft__rank(weft__f32_bits(x), (unsigned)e);
            int used = 0;
            for (size_t i = 0; i < j; i++)
                used |= taken[i] == r;
            if (!used && (!have || r > best))
                best = r, have = 1;
        }
        taken[j] = best;
        ids[j] = (int32_t)weft__rank_index(best);
    }
}

static float sigmoid(float x)
{
    return 1.0f / (1.0f + weft__expf(-x));
}

static void host_weights(const weft__moe_gate_args *g, size_t t, const int32_t *ids, float *w)
{
    const size_t row = t * g->stride;
    if (g->score == WEFT_MOE_SOFTMAX) {
        float m = -INFINITY;
        for (size_t e = 0; e < g->experts; e++)
            m = fmaxf(m, weft__load(g->dtype, g->logits, row + e));
        weft__sum s = {0};
        for (size_t e = 0; e < g->experts; e++)
            weft__sum_add(&s, weft__expf(weft__load(g->dtype, g->logits, row + e) - m));
        float total = weft__sum_get(&s);
        for (size_t j = 0; j < g->k; j++)
            w[j] = weft__expf(weft__load(g->dtype, g->logits, row + (size_t)ids[j]) - m) / total;
    } else {
        for (size_t j = 0; j < g->k; j++)
            w[j] = sigmoid(weft__load(g->dtype, g->logits, row + (size_t)ids[j]));
    }
    if (g->renormalize) {
        float sum = 0.0f;
        for (size_t j = 0; j < g->k; j++)
            sum += w[j];
        for (size_t j = 0; j < g->k; j++)
            w[j] /= sum;
    }
}

/* Offsets by counting, then each pair placed at its expert's cursor in
 * token order: the stable grouping the kernels must reproduce. */
static void host_tables(const weft__moe_gate_args *g)
{
    const weft_moe_routing *o = &g->out;
    const size_t pairs = g->tokens * g->k;
    int32_t cursor[WEFT__MOE_MAX_EXPERTS + 1] = {0};

    for (size_t i = 0; i < pairs; i++)
        cursor[o->ids[i] + 1]++;
    for (size_t e = 0; e < g->experts; e++)
        cursor[e + 1] += cursor[e];
    for (size_t e = 0; e <= g->experts; e++)
        o->offsets[e] = cursor[e];
    for (size_t i = 0; i < pairs; i++) {
        int32_t p = cursor[o->ids[i]]++;
        o->perm[p] = (int32_t)i;
        o->inverse[i] = p;
    }
}

static void host_gate(const weft__moe_gate_args *g)
{
    for (size_t t = 0; t < g->tokens; t++) {
        host_select(g, t, g->out.ids + t * g->k);
        host_weights(g, t, g->out.ids + t * g->k, g->out.weights + t * g->k);
    }
    host_tables(g);
}

static void run_host_gate(const void *args)
{
    host_gate(args);
}

/* A table's pointer: required, aligned to its 4-byte elements. */
static int check_table(const char *op, const char *name, const void *p)
{
    if (!p)
        return weft__fail(WEFT_EINVAL, "%s: %s is NULL", op, name);
    if ((uintptr_t)p % 4 != 0)
        return weft__fail(WEFT_EINVAL, "%s: %s is not aligned to its 4-byte elements", op, name);
    return WEFT_OK;
}

/* tokens * k pairs, indexed by int32 in the tables. */
static int check_pairs(const char *op, size_t tokens, size_t k)
{
    if (tokens == 0)
        return weft__fail(WEFT_EINVAL, "%s: tokens must be >= 1", op);
    if (k == 0 || k > WEFT__MOE_MAX_K)
        return weft__fail(WEFT_EINVAL, "%s: k = %zu is outside [1, %d]", op, k, WEFT__MOE_MAX_K);
    if (tokens > (size_t)INT32_MAX / k)
        return weft__fail(WEFT_EINVAL, "%s: %zu tokens x k %zu pairs do not fit int32 tables", op,
                          tokens, k);
    return WEFT_OK;
}

int weft_moe_gate(void *stream, weft_dtype dtype, weft_moe_score score, int renormalize,
                  const void *logits, size_t tokens, size_t experts, size_t stride, size_t k,
                  const weft_moe_routing *out)
{
    int rc;

    if ((rc = weft__check_dtype(GATE, dtype)) != WEFT_OK)
        return rc;
    if (score != WEFT_MOE_SOFTMAX && score != WEFT_MOE_SIGMOID)
        return weft__fail(WEFT_EINVAL, "%s: unknown score function %d", GATE, (int)score);
    if (experts == 0 || experts > WEFT__MOE_MAX_EXPERTS)
        return weft__fail(WEFT_EINVAL, "%s: experts = %zu is outside [1, %d]", GATE, experts,
                          WEFT__MOE_MAX_EXPERTS);
    if ((rc = check_pairs(GATE, tokens, k)) != WEFT_OK)
        return rc;
    if (k > experts)
        return weft__fail(WEFT_EINVAL, "%s: k = %zu is more than the %zu experts", GATE, k,
                          experts);
    if (!out)
        return weft__fail(WEFT_EINVAL, "%s: out is NULL", GATE);
    if ((rc = weft__check_rows(GATE, "logits", tokens, experts, stride, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(GATE, "logits", logits, 0, dtype)) != WEFT_OK ||
        (rc = check_table(GATE, "out->weights", out->weights)) != WEFT_OK ||
        (rc = check_table(GATE, "out->ids", out->ids)) != WEFT_OK ||
        (rc = check_table(GATE, "out->offsets", out->offsets)) != WEFT_OK ||
        (rc = check_table(GATE, "out->perm", out->perm)) != WEFT_OK ||
        (rc = check_table(GATE, "out->inverse", out->inverse)) != WEFT_OK ||
        (rc = weft__check_stream(GATE, stream)) != WEFT_OK)
        return rc;

    weft__moe_gate_args g = {dtype, score, renormalize != 0, logits, tokens, experts, stride,
                             k,     *out};
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(GATE, &stream, run_host_gate, &g, sizeof g)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__moe_gate_cuda(stream, &g);
#endif
    host_gate(&g);
    return WEFT_OK;
}

/* ---- permute and combine ---------------------------------------------- */

static const char PERMUTE[] = "weft_moe_permute", UNPERMUTE[] = "weft_moe_unpermute";

static void host_permute(const weft__moe_permute_args *a)
{
    const size_t es = weft__dtype_size(a->dtype), rows = a->tokens * a->k;
    for (size_t p = 0; p < rows; p++) {
        size_t t = (size_t)a->perm[p] / a->k;
        memcpy((char *)a->out + p * a->out_stride * es, (const char *)a->in + t * a->in_stride * es,
               a->cols * es);
    }
}

static void run_host_permute(const void *args)
{
    host_permute(args);
}

int weft_moe_permute(void *stream, weft_dtype dtype, void *out, const void *in, const int32_t *perm,
                     size_t tokens, size_t k, size_t cols, size_t in_stride, size_t out_stride)
{
    int rc;

    if ((rc = weft__check_dtype(PERMUTE, dtype)) != WEFT_OK ||
        (rc = check_pairs(PERMUTE, tokens, k)) != WEFT_OK ||
        (rc = weft__check_rows(PERMUTE, "in", tokens, cols, in_stride, dtype)) != WEFT_OK ||
        (rc = weft__check_rows(PERMUTE, "out", tokens * k, cols, out_stride, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(PERMUTE, "out", out, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(PERMUTE, "in", in, 0, dtype)) != WEFT_OK ||
        (rc = check_table(PERMUTE, "perm", perm)) != WEFT_OK ||
        (rc = weft__check_stream(PERMUTE, stream)) != WEFT_OK)
        return rc;
    if (out == in)
        return weft__fail(WEFT_EINVAL, "%s: out must not be in", PERMUTE);

    weft__moe_permute_args a = {dtype, out, in, perm, tokens, k, cols, in_stride, out_stride};
    if (stream == WEFT_TASK_STREAM && (rc = weft__task_stream_op(PERMUTE, &stream, run_host_permute,
                                                                 &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__moe_permute_cuda(stream, &a);
#endif
    host_permute(&a);
    return WEFT_OK;
}

static void host_unpermute(const weft__moe_unpermute_args *a)
{
    for (size_t t = 0; t < a->tokens; t++)
        for (size_t c = 0; c < a->cols; c++) {
            float acc = 0.0f;
            for (size_t j = 0; j < a->k; j++) {
                size_t row = (size_t)a->inverse[t * a->k + j];
                float term =
                    a->weights[t * a->k + j] * weft__load(a->dtype, a->y, row * a->y_stride + c);
                acc = acc + term; /* two statements: never one fused multiply-add */
            }
            if (a->residual)
                acc = acc + weft__load(a->dtype, a->residual, t * a->out_stride + c);
            weft__store(a->dtype, a->out, t * a->out_stride + c, acc);
        }
}

static void run_host_unpermute(const void *args)
{
    host_unpermute(args);
}

int weft_moe_unpermute(void *stream, weft_dtype dtype, void *out, const void *y,
                       const float *weights, const int32_t *inverse, const void *residual,
                       size_t tokens, size_t k, size_t cols, size_t y_stride, size_t out_stride)
{
    int rc;

    if ((rc = weft__check_dtype(UNPERMUTE, dtype)) != WEFT_OK ||
        (rc = check_pairs(UNPERMUTE, tokens, k)) != WEFT_OK ||
        (rc = weft__check_rows(UNPERMUTE, "y", tokens * k, cols, y_stride, dtype)) != WEFT_OK ||
        (rc = weft__check_rows(UNPERMUTE, "out", tokens, cols, out_stride, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(UNPERMUTE, "out", out, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(UNPERMUTE, "y", y, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(UNPERMUTE, "residual", residual, 1, dtype)) != WEFT_OK ||
        (rc = check_table(UNPERMUTE, "weights", weights)) != WEFT_OK ||
        (rc = check_table(UNPERMUTE, "inverse", inverse)) != WEFT_OK ||
        (rc = weft__check_stream(UNPERMUTE, stream)) != WEFT_OK)
        return rc;
    if (out == y)
        return weft__fail(WEFT_EINVAL, "%s: out must not be y", UNPERMUTE);

    weft__moe_unpermute_args a = {dtype,  out, y,    residual, weights,   inverse,
                                  tokens, k,   cols, y_stride, out_stride};
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(UNPERMUTE, &stream, run_host_unpermute, &a, sizeof a)) !=
            WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__moe_unpermute_cuda(stream, &a);
#endif
    host_unpermute(&a);
    return WEFT_OK;
}
