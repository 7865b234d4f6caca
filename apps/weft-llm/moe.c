/*
 * moe.c - the mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE) on
 * weft's MoE ops, shared by the one-sequence forward pass (forward.c) and
 * the batched decode step (batch.c), and the packing of the experts'
 * weights into the blocks those ops read.
 *
 * For the n normed rows h of a MoE layer, on the task's stream:
 *   logits = h Wr^T                       weft_matmul, [n][E] in the model's
 *                                         dtype, as transformers' router
 *                                         Linear gives them
 *   weights, ids, tables = gate(logits)   weft_moe_gate: softmax in fp32 over
 *                                         all E, the k largest (ties to the
 *                                         lower expert), renormalised when
 *                                         the config says (Mixtral always)
 *   xp = h in expert order                weft_moe_permute
 *   gu = xp [Wg_e; Wu_e]^T per expert     weft_grouped_matmul, gate and up
 *                                         side by side in one call
 *   act = SiLU(g) * u                     weft_glu
 *   y = act Wd_e^T per expert             weft_grouped_matmul
 *   x = x + sum_j weights_j y_j           weft_moe_unpermute, the residual
 *                                         added in the same pass
 * and for Qwen2-MoE's shared expert a dense SwiGLU MLP (weft_matmul,
 * weft_glu) whose output sy is scaled by sigmoid(h . w_sg): the scale is
 * weft_moe_gate's sigmoid score of the one-column logits with one expert
 * and k = 1 (so its tables are the identity), and weft_moe_unpermute
 * with k = 1 adds sigmoid * sy to x. Every activation is stored in the
 * model's dtype between ops; the routing weights stay fp32.
 * The sequence of ops is the same for any number of rows, so a batch's
 * row goes through what the row alone goes through.
 *
 * The grouped matmul reads a layer's experts as one [E][n][k] block, which
 * wl_model_upload packs (pack.c).
 */
#include <stdlib.h>
#include <string.h>

#include "forward_impl.h"

static size_t round256(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

/* The next part of a carved allocation: its offset, each 256-aligned. */
static size_t carve(size_t *at, size_t bytes)
{
    size_t o = *at;
    *at += round256(bytes);
    return o;
}

int wl_moe_bufs_create(wl_moe_bufs *b, const wl_model *m, int tokens)
{
    const wl_config *c = &m->cfg;
    memset(b, 0, sizeof *b);
    for (int li = m->first_layer; li < m->end_layer; li++)
        if (m->layer[li].moe && (!m->layer[li].experts_gu || !m->layer[li].experts_down))
            return wl_fail("forward: layer %d's experts are not packed (wl_model_upload the "
                           "model first)",
                           li);
    size_t es = wl_dtype_size(m->dtype), T = (size_t)tokens, E = (size_t)c->experts;
    size_t K = (size_t)c->experts_per_token, I = (size_t)c->moe_intermediate;
    size_t S = (size_t)c->shared_intermediate, H = (size_t)c->hidden, at = 0;
    size_t o_logits = carve(&at, T * E * es), o_w = carve(&at, T * K * 4),
           o_ids = carve(&at, T * K * 4), o_off = carve(&at, (E + 1) * 4),
           o_perm = carve(&at, T * K * 4), o_inv = carve(&at, T * K * 4),
           o_xp = carve(&at, T * K * H * es), o_gu = carve(&at, T * K * 2 * I * es),
           o_act = carve(&at, T * K * I * es), o_y = carve(&at, T * K * H * es);
    size_t o_sgu = carve(&at, T * 2 * S * es), o_sact = carve(&at, T * S * es),
           o_sy = carve(&at, T * H * es), o_slogit = carve(&at, T * es), o_sw = carve(&at, T * 4),
           o_sids = carve(&at, T * 4), o_soff = carve(&at, 2 * 4), o_sperm = carve(&at, T * 4),
           o_sinv = carve(&at, T * 4);
    if (weft_malloc_async(&b->block, at) != WEFT_OK)
        return wl_fail("mixture of experts: %zu bytes of buffers for %d tokens: %s", at, tokens,
                       weft_last_error());
    char *base = b->block;
    b->logits = base + o_logits;
    b->r = (weft_moe_routing){(float *)(base + o_w), (int32_t *)(base + o_ids),
                              (int32_t *)(base + o_off), (int32_t *)(base + o_perm),
                              (int32_t *)(base + o_inv)};
    b->xp = base + o_xp;
    b->gu = base + o_gu;
    b->act = base + o_act;
    b->y = base + o_y;
    if (S) {
        b->sgu = base + o_sgu;
        b->sact = base + o_sact;
        b->sy = base + o_sy;
        b->slogit = base + o_slogit;
        b->sr = (weft_moe_routing){(float *)(base + o_sw), (int32_t *)(base + o_sids),
                                   (int32_t *)(base + o_soff), (int32_t *)(base + o_sperm),
                                   (int32_t *)(base + o_sinv)};
    }
    return 0;
}

void wl_moe_bufs_destroy(wl_moe_bufs *b)
{
    if (b->block)
        weft_free_async(b->block);
    memset(b, 0, sizeof *b);
}

/* Qwen2-MoE's shared expert over the n rows: x += sigmoid(h . w_sg) *
 * down(SiLU(h Wg^T) * (h Wu^T)) (a tensor-parallel rank's share of it:
 * the scale is a row's whole, and the shares sum). */
static int shared_expert(const wl_model *m, wl_moe_bufs *b, const wl_layer *L, void *x,
                         const void *h, int n)
{
    const wl_config *c = &m->cfg;
    weft_dtype dt = m->dtype;
    size_t H = (size_t)c->hidden, S = (size_t)c->shared_intermediate;
    TRY(wl_linear(m, b->sgu, 2 * S, h, H, L->shared_gu, 2 * S, NULL, NULL, n, dt));
    TRY(weft_glu(WEFT_TASK_STREAM, dt, WEFT_GLU_SWIGLU, b->sact, b->sgu, (size_t)n, S, 2 * S, S));
    TRY(wl_linear(m, b->sy, H, b->sact, S, L->shared_down, H, NULL, NULL, n, dt));
    TRY(wl_linear(m, b->slogit, 1, h, H, L->shared_router, 1, NULL, NULL, n, dt));
    TRY(weft_moe_gate(WEFT_TASK_STREAM, dt, WEFT_MOE_SIGMOID, 0, b->slogit, (size_t)n, 1, 1, 1,
                      &b->sr));
    TRY(weft_moe_unpermute(WEFT_TASK_STREAM, dt, x, b->sy, b->sr.weights, b->sr.inverse, x,
                           (size_t)n, 1, H, H, H));
    return 0;
fail:
    return -1;
}

int wl_moe_mlp(const wl_model *m, wl_moe_bufs *b, int li, void *x, const void *h, int n,
               int residual)
{
    const wl_config *c = &m->cfg;
    const wl_layer *L = &m->layer[li];
    weft_dtype dt = m->dtype;
    size_t H = (size_t)c->hidden, E = (size_t)c->experts, K = (size_t)c->experts_per_token;
    size_t I = (size_t)c->moe_intermediate, rows = (size_t)n * K;
    TRY(wl_linear(m, b->logits, E, h, H, L->router, E, NULL, NULL, n, dt));
    TRY(weft_moe_gate(WEFT_TASK_STREAM, dt, WEFT_MOE_SOFTMAX, c->norm_topk_prob, b->logits,
                      (size_t)n, E, E, K, &b->r));
    TRY(weft_moe_permute(WEFT_TASK_STREAM, dt, b->xp, h, b->r.perm, (size_t)n, K, H, H, H));
    weft_grouped_matmul_desc gu = {.groups = E, .rows = rows, .n = 2 * I, .k = H, .type = dt};
    TRY(weft_grouped_matmul(WEFT_TASK_STREAM, &gu, b->gu, b->xp, L->experts_gu, b->r.offsets));
    TRY(weft_glu(WEFT_TASK_STREAM, dt, WEFT_GLU_SWIGLU, b->act, b->gu, rows, I, 2 * I, I));
    weft_grouped_matmul_desc down = {.groups = E, .rows = rows, .n = H, .k = I, .type = dt};
    TRY(weft_grouped_matmul(WEFT_TASK_STREAM, &down, b->y, b->act, L->experts_down, b->r.offsets));
    TRY(weft_moe_unpermute(WEFT_TASK_STREAM, dt, x, b->y, b->r.weights, b->r.inverse,
                           residual ? x : NULL, (size_t)n, K, H, H, H));
    if (c->shared_intermediate && shared_expert(m, b, L, x, h, n))
        goto fail;
    return 0;
fail:
    return -1;
}
