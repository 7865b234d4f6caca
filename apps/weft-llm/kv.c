/*
 * kv.c - the model's paged KV cache: for every layer a key pool and a value
 * pool of fixed-size pages in weft_kv_cache's layout, and one block
 * allocator of pages shared by all the model's sequences.
 *
 * A page index names the same page in every layer's pools, so one table
 * per sequence serves all layers. Invariants: a page is either on the free
 * list or in exactly one sequence's table (never both, never twice);
 * free_count + the pages all live tables hold == pages. A sequence takes
 * pages as its length grows (wl_kv_seq_grow) and gives all of them back at
 * once (wl_kv_seq_release) when it ends or is cancelled. Sequences are
 * tasks that may run on several workers at once, so the free list is
 * guarded by a mutex, held only for the list's own updates (no weft call,
 * nothing that could suspend the task, happens under it).
 * An exhausted pool is the caller's error (too many or too long sequences
 * for --kv-pages), reported as such; nothing is taken in that case.
 */
#include <stdlib.h>
#include <string.h>

#include "llm.h"

static int is_pow2(int v)
{
    return v > 0 && (v & (v - 1)) == 0;
}

int wl_kv_pages_init(wl_kv *kv, int pages, int page_size)
{
    memset(kv, 0, sizeof *kv);
    if (pages < 1)
        return wl_fail("KV cache: %d pages; at least 1 is needed", pages);
    if (page_size < 16 || page_size > 256 || !is_pow2(page_size))
        return wl_fail("KV cache: page size %d is not a power of two from 16 to 256", page_size);
    if ((size_t)pages * (size_t)page_size > INT32_MAX)
        return wl_fail("KV cache: %d pages of %d tokens exceed int32 positions", pages, page_size);
    kv->pages = pages;
    kv->page_size = page_size;
    kv->free_list = malloc((size_t)pages * sizeof *kv->free_list);
    if (!kv->free_list)
        return wl_fail("KV cache: out of memory for %d pages' free list", pages);
    /* low pages on top: they are taken first */
    for (int i = 0; i < pages; i++)
        kv->free_list[i] = pages - 1 - i;
    kv->free_count = pages;
    if (pthread_mutex_init(&kv->lock, NULL)) {
        free(kv->free_list);
        kv->free_list = NULL;
        return wl_fail("KV cache: cannot create its lock");
    }
    kv->lock_made = 1;
    return 0;
}

int wl_kv_create(wl_kv *kv, const wl_model *m, int pages, int page_size)
{
    const wl_config *c = &m->cfg;
    if (m->dtype != WEFT_DTYPE_BF16 && m->dtype != WEFT_DTYPE_F16)
        return wl_fail("KV cache: the model's dtype %s is not bf16 or fp16, which weft's paged "
                       "cache and attention need",
                       wl_dtype_name(m->dtype));
    if (c->head_dim != 64 && c->head_dim != 128)
        return wl_fail("KV cache: head_dim %d is not 64 or 128, which weft's paged cache needs",
                       c->head_dim);
    if (wl_kv_pages_init(kv, pages, page_size))
        return -1;
    kv->dtype = m->dtype;
    kv->layers = c->layers;
    kv->kv_heads = c->kv_heads;
    kv->head_dim = c->head_dim;
    kv->k = calloc((size_t)c->layers, sizeof *kv->k);
    kv->v = calloc((size_t)c->layers, sizeof *kv->v);
    if (!kv->k || !kv->v) {
        wl_kv_destroy(kv);
        return wl_fail("KV cache: out of memory");
    }
    size_t bytes = (size_t)pages * page_size * c->kv_heads * c->head_dim * wl_dtype_size(m->dtype);
    for (int l = 0; l < c->layers; l++)
        if (weft_malloc_async(&kv->k[l], bytes) != WEFT_OK ||
            weft_malloc_async(&kv->v[l], bytes) != WEFT_OK) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "KV cache: %d pages of %d tokens (%zu bytes a pool, 2 "
                     "pools a layer): %s",
                     pages, page_size, bytes, weft_last_error());
            wl_kv_destroy(kv);
            return wl_fail("%s", msg);
        }
    return 0;
}

void wl_kv_destroy(wl_kv *kv)
{
    for (int l = 0; l < kv->layers; l++) {
        if (kv->k && kv->k[l])
            weft_free_async(kv->k[l]);
        if (kv->v && kv->v[l])
            weft_free_async(kv->v[l]);
    }
    if (kv->k || kv->v)
        weft_await();
    free(kv->k);
    free(kv->v);
    free(kv->free_list);
    if (kv->lock_made)
        pthread_mutex_destroy(&kv->lock);
    memset(kv, 0, sizeof *kv);
}

int wl_kv_free_pages(wl_kv *kv)
{
    pthread_mutex_lock(&kv->lock);
    int n = kv->free_count;
    pthread_mutex_unlock(&kv->lock);
    return n;
}

weft_kv_cache wl_kv_layer(const wl_kv *kv, int layer, const int32_t *block_table, int max_pages)
{
    return (weft_kv_cache){.dtype = kv->dtype,
                           .k = kv->k[layer],
                           .v = kv->v[layer],
                           .pages = (size_t)kv->pages,
                           .page_size = (size_t)kv->page_size,
                           .kv_heads = (size_t)kv->kv_heads,
                           .head_dim = (size_t)kv->head_dim,
                           .block_table = block_table,
                           .seqs = 1,
                           .max_pages = (size_t)max_pages};
}

int wl_kv_seq_init(wl_kv_seq *s, wl_kv *kv, int max_tokens)
{
    memset(s, 0, sizeof *s);
    if (max_tokens < 1)
        return wl_fail("KV cache: a sequence of %d tokens", max_tokens);
    s->kv = kv;
    s->max_pages = (max_tokens + kv->page_size - 1) / kv->page_size;
    s->table = malloc((size_t)s->max_pages * sizeof *s->table);
    if (!s->table)
        return wl_fail("KV cache: out of memory for a block table of %d pages", s->max_pages);
    return 0;
}

int wl_kv_seq_grow(wl_kv_seq *s, int tokens)
{
    wl_kv *kv = s->kv;
    int need = (tokens + kv->page_size - 1) / kv->page_size;
    if (tokens < 0 || need > s->max_pages)
        return wl_fail("KV cache: %d tokens exceed the sequence's %d pages of %d", tokens,
                       s->max_pages, kv->page_size);
    if (need <= s->used)
        return 0;
    pthread_mutex_lock(&kv->lock);
    int free_now = kv->free_count;
    if (need - s->used > free_now) {
        pthread_mutex_unlock(&kv->lock);
        return wl_fail("KV cache exhausted: %d tokens need %d more pages of %d tokens, %d of %d "
                       "are free (raise --kv-pages, or run fewer or shorter sequences)",
                       tokens, need - s->used, kv->page_size, free_now, kv->pages);
    }
    while (s->used < need)
        s->table[s->used++] = kv->free_list[--kv->free_count];
    pthread_mutex_unlock(&kv->lock);
    return 0;
}

void wl_kv_seq_release(wl_kv_seq *s)
{
    wl_kv *kv = s->kv;
    if (!kv)
        return;
    pthread_mutex_lock(&kv->lock);
    while (s->used > 0)
        kv->free_list[kv->free_count++] = s->table[--s->used];
    pthread_mutex_unlock(&kv->lock);
    free(s->table);
    memset(s, 0, sizeof *s);
}
