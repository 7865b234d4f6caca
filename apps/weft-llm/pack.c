/*
 * pack.c - the weights laid out as the forward pass reads them.
 *
 * A checkpoint stores every projection as a tensor of its own, while the
 * forward pass reads some of them as one matrix:
 *  - a layer's q, k and v projections read the same normed rows, so they
 *    are one [q + 2 kv][hidden] matrix (q's rows, then k's, then v's) and
 *    their biases one vector (Qwen2): one weft_matmul gives each token's
 *    q | k | v row, as the cache and attention take it;
 *  - a dense MLP's gate and up are one [2 I][hidden] matrix (gate's rows,
 *    then up's), so one weft_matmul gives the gate | up row weft_glu
 *    takes; Qwen2-MoE's shared expert likewise;
 *  - FP8 weights' scales (a float a row) are packed as their rows are,
 *    and an FP8 model's o and down projections are copied in as they are
 *    (with their scales), since FP8 operands must be 16-byte aligned;
 *  - a mixture of experts' experts are [E][2 I][hidden] (expert e's gate
 *    and up rows) and [E][hidden][I] blocks, which the grouped matmul
 *    reads.
 * Fewer, wider matmuls matter most in decode, where each is a read of its
 * weights with a launch's fixed cost around it.
 * wl_model_upload packs them into the device block on a GPU (listing the
 * copies for its tasks to make), and into one
 * host allocation on the host backend (made once, under a lock since
 * several tasks may upload one model at once, and freed with the model;
 * the files' pages of the packed tensors are not read again).
 */
#include <pthread.h>
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

enum pack_mode { SIZE_ONLY, POINT, COPY_HOST, LIST };

typedef struct packer {
    char *dst;
    size_t off;
    enum pack_mode mode;
    int failed;
    wl_copy_list *list; /* LIST: the copies, made later by the upload's tasks */
} packer;

/* The n tensors src[i] (bytes[i] each) one after another in a new part,
 * copied there as the mode says; *slot points at the part afterwards
 * (written only when it moves: other tasks may be reading it). */
static void put(packer *p, const void **slot, const void *const *src, const size_t *bytes, int n,
                int layer)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += bytes[i];
    size_t off = carve(&p->off, total);
    if (p->mode == SIZE_ONLY || p->failed)
        return;
    char *at = p->dst + off, *to = at;
    for (int i = 0; p->mode != POINT && i < n; to += bytes[i], i++) {
        if (p->mode == COPY_HOST)
            memcpy(to, src[i], bytes[i]);
        else if (wl_copy_add(p->list, to, src[i], bytes[i])) {
            wl_fail("upload: layer %d: %s", layer, wl_error());
            p->failed = 1;
            return;
        }
    }
    if (*slot != at)
        *slot = at;
}

/* Lays every packed weight of m's layers (its pipeline stage's) out from
 * dst (one part after another, each 256-byte aligned) and points the
 * layers at them, copying the tensors there unless mode is POINT or
 * SIZE_ONLY. The bytes in all, or -1. */
static long long layout(wl_model *m, char *dst, enum pack_mode mode, wl_copy_list *list)
{
    const wl_config *c = &m->cfg;
    size_t es = wl_dtype_size(m->dtype), H = (size_t)c->hidden;
    size_t wes = c->fp8 ? 1 : es; /* a projection's elements */
    size_t q = (size_t)c->heads * c->head_dim, kv = (size_t)c->kv_heads * c->head_dim;
    size_t I = (size_t)c->intermediate, S = (size_t)c->shared_intermediate;
    size_t mat = (size_t)c->moe_intermediate * H * es, E = (size_t)c->experts;
    packer p = {dst, 0, mode, 0, list};
    const void **src = malloc((2 * E + 3) * sizeof *src);
    size_t *bytes = malloc((2 * E + 3) * sizeof *bytes);
    if (!src || !bytes) {
        free(src), free(bytes);
        return wl_fail("upload: out of memory");
    }
    for (int li = m->first_layer; li < m->end_layer && !p.failed; li++) {
        wl_layer *L = &m->layer[li];
        src[0] = L->q, src[1] = L->k, src[2] = L->v;
        bytes[0] = q * H * wes, bytes[1] = bytes[2] = kv * H * wes;
        put(&p, &L->qkv, src, bytes, 3, li);
        if (c->fp8) {
            src[0] = L->q_scale, src[1] = L->k_scale, src[2] = L->v_scale;
            bytes[0] = q * 4, bytes[1] = bytes[2] = kv * 4;
            put(&p, (const void **)&L->qkv_scale, src, bytes, 3, li);
            /* o and down too, so that every FP8 operand is 16-byte
             * aligned (a file's tensors need not be), with their scales */
            src[0] = L->o, bytes[0] = H * q * wes;
            put(&p, &L->o, src, bytes, 1, li);
            src[0] = L->o_scale, bytes[0] = H * 4;
            put(&p, (const void **)&L->o_scale, src, bytes, 1, li);
            if (!L->moe) {
                src[0] = L->down, bytes[0] = H * I * wes;
                put(&p, &L->down, src, bytes, 1, li);
                src[0] = L->down_scale, bytes[0] = H * 4;
                put(&p, (const void **)&L->down_scale, src, bytes, 1, li);
            }
        }
        if (c->attention_bias) {
            src[0] = L->q_bias, src[1] = L->k_bias, src[2] = L->v_bias;
            bytes[0] = q * es, bytes[1] = bytes[2] = kv * es;
            put(&p, &L->qkv_bias, src, bytes, 3, li);
        }
        if (!L->moe) {
            src[0] = L->gate, src[1] = L->up;
            bytes[0] = bytes[1] = I * H * wes;
            put(&p, &L->gu, src, bytes, 2, li);
            if (c->fp8) {
                src[0] = L->gate_scale, src[1] = L->up_scale;
                bytes[0] = bytes[1] = I * 4;
                put(&p, (const void **)&L->gu_scale, src, bytes, 2, li);
            }
            continue;
        }
        if (S) {
            src[0] = L->shared_gate, src[1] = L->shared_up;
            bytes[0] = bytes[1] = S * H * es;
            put(&p, &L->shared_gu, src, bytes, 2, li);
        }
        for (size_t e = 0; e < E; e++) { /* expert e's gate rows, then its up rows */
            src[2 * e] = L->expert[3 * e], src[2 * e + 1] = L->expert[3 * e + 1];
            bytes[2 * e] = bytes[2 * e + 1] = mat;
        }
        put(&p, &L->experts_gu, src, bytes, 2 * (int)E, li);
        for (size_t e = 0; e < E; e++)
            src[e] = L->expert[3 * e + 2];
        put(&p, &L->experts_down, src, bytes, (int)E, li);
    }
    free(src), free(bytes);
    return p.failed ? -1 : (long long)p.off;
}

long long wl_packed_bytes(wl_model *m)
{
    return layout(m, NULL, SIZE_ONLY, NULL);
}

int wl_pack_list(wl_model *m, char *dst, wl_copy_list *list)
{
    return layout(m, dst, LIST, list) < 0 ? -1 : 0;
}

/* Held only while a model's host block is made or found: no weft call
 * under it. The first upload of a large model holds it for the copy. */
static pthread_mutex_t host_pack_lock = PTHREAD_MUTEX_INITIALIZER;

int wl_pack_host(wl_model *m)
{
    long long bytes = wl_packed_bytes(m);
    int rc = 0;
    if (bytes < 0)
        return -1;
    pthread_mutex_lock(&host_pack_lock);
    if (m->host_block) { /* packed by an earlier upload: point the layers back at it */
        rc = layout(m, m->host_block, POINT, NULL) < 0 ? -1 : 0;
    } else if (!(m->host_block = malloc(bytes ? (size_t)bytes : 1))) {
        rc = wl_fail("upload: out of memory for %lld bytes of packed weights", bytes);
    } else {
        rc = layout(m, m->host_block, COPY_HOST, NULL) < 0 ? -1 : 0;
    }
    pthread_mutex_unlock(&host_pack_lock);
    return rc;
}
