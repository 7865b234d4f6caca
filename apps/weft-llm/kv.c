/*
 * kv.c - the model's paged KV cache: for every layer a key pool and a value
 * pool of fixed-size pages in weft_kv_cache's layout, and one block
 * allocator of pages shared by all the model's sequences.
 *
 * A page index names the same page in every layer's pools, so one table
 * per sequence serves all layers. Each page has a count of the tables
 * holding it; a page held by none is on the free list. free_count + the
 * distinct pages the live tables hold == pages. A sequence takes pages as
 * its length grows (wl_kv_seq_grow) and gives all of them back at once
 * (wl_kv_seq_release) when it ends or is cancelled. Sequences are tasks
 * that may run on several workers at once, so the allocator is guarded by
 * a mutex held only for its own updates (no weft call, nothing that could
 * suspend the task, happens under it). An exhausted pool is the caller's
 * error (too many or too long sequences for --kv-pages), reported as such;
 * nothing is taken in that case.
 *
 * Prompt prefixes (when kv->sharing is on): a page filled entirely by a
 * prompt's tokens is published under a key that hashes every token before
 * it and its own, with its tokens kept beside it. A later sequence whose
 * prompt starts with the same tokens finds those pages by key (its own
 * tokens compared, so a hash collision cannot share wrong keys and values)
 * and holds them too instead of computing them again; it never writes
 * them, since its own tokens go to positions past them. A published page
 * that no sequence holds any more stays findable on the free list until
 * it is taken for new tokens: the free list is kept in order, pages never
 * published first, then published ones in the order they were freed, so
 * the least recently used prefix is the first to go.
 */
#include <stdlib.h>
#include <string.h>

#include "llm.h"

#define NO_PAGE (-1)
#define GONE (-2) /* an index slot whose page left: probing goes past it */

static int is_pow2(int v)
{
    return v > 0 && (v & (v - 1)) == 0;
}

/* ---- the free list: doubly linked through next/prev, head taken first ---- */

static void free_unlink(wl_kv *kv, int p)
{
    if (kv->prev[p] != NO_PAGE)
        kv->next[kv->prev[p]] = kv->next[p];
    else
        kv->free_head = kv->next[p];
    if (kv->next[p] != NO_PAGE)
        kv->prev[kv->next[p]] = kv->prev[p];
    else
        kv->free_tail = kv->prev[p];
    kv->free_count--;
}

/* A page nobody holds: a published one goes last (kept longest), others
 * first (taken before any published page is given up). */
static void free_link(wl_kv *kv, int p)
{
    if (kv->key[p]) {
        kv->prev[p] = kv->free_tail;
        kv->next[p] = NO_PAGE;
        if (kv->free_tail != NO_PAGE)
            kv->next[kv->free_tail] = p;
        else
            kv->free_head = p;
        kv->free_tail = p;
    } else {
        kv->next[p] = kv->free_head;
        kv->prev[p] = NO_PAGE;
        if (kv->free_head != NO_PAGE)
            kv->prev[kv->free_head] = p;
        else
            kv->free_tail = p;
        kv->free_head = p;
    }
    kv->free_count++;
}

/* ---- the prefix index: open addressing on the key, page numbers in slots -- */

static size_t slot_of(const wl_kv *kv, uint64_t key)
{
    return (size_t)(key ^ key >> 29) & (kv->index_cap - 1);
}

/* The page published under key whose tokens are tokens, or NO_PAGE. */
static int index_find(const wl_kv *kv, uint64_t key, const int32_t *tokens)
{
    size_t ps = (size_t)kv->page_size;
    for (size_t i = slot_of(kv, key);; i = (i + 1) & (kv->index_cap - 1)) {
        int p = kv->index[i];
        if (p == NO_PAGE)
            return NO_PAGE;
        if (p != GONE && kv->key[p] == key &&
            !memcmp(kv->tokens + (size_t)p * ps, tokens, ps * sizeof *tokens))
            return p;
    }
}

static void index_remove(wl_kv *kv, int page)
{
    for (size_t i = slot_of(kv, kv->key[page]);; i = (i + 1) & (kv->index_cap - 1))
        if (kv->index[i] == page) {
            kv->index[i] = GONE;
            break;
        }
    kv->key[page] = 0;
}

/* At most pages are published and the index has twice the slots, but
 * removals leave GONE slots behind: rebuilt when a probe could run long. */
static void index_insert(wl_kv *kv, int page, uint64_t key, const int32_t *tokens)
{
    size_t ps = (size_t)kv->page_size;
    if (++kv->index_used > kv->index_cap * 3 / 4) {
        int published = 0;
        for (size_t i = 0; i < kv->index_cap; i++)
            kv->index[i] = NO_PAGE;
        for (int p = 0; p < kv->pages; p++)
            if (kv->key[p] && p != page) {
                size_t j = slot_of(kv, kv->key[p]);
                while (kv->index[j] != NO_PAGE)
                    j = (j + 1) & (kv->index_cap - 1);
                kv->index[j] = p;
                published++;
            }
        kv->index_used = published + 1;
    }
    size_t j = slot_of(kv, key);
    while (kv->index[j] >= 0)
        j = (j + 1) & (kv->index_cap - 1);
    kv->index[j] = page;
    kv->key[page] = key;
    memcpy(kv->tokens + (size_t)page * ps, tokens, ps * sizeof *tokens);
}

/* The key of a page of tokens after the prefix whose key is prev: never 0
 * (0 marks a page that is not published). */
static uint64_t prefix_key(uint64_t prev, const int32_t *tokens, int n)
{
    uint64_t h = prev ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i];
        h *= 0x100000001b3ull;
        h ^= h >> 32;
    }
    return h ? h : 1;
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
    kv->index_cap = 16;
    while (kv->index_cap < 2 * (size_t)pages)
        kv->index_cap *= 2;
    kv->refs = calloc((size_t)pages, sizeof *kv->refs);
    kv->next = malloc((size_t)pages * sizeof *kv->next);
    kv->prev = malloc((size_t)pages * sizeof *kv->prev);
    kv->key = calloc((size_t)pages, sizeof *kv->key);
    kv->tokens = malloc((size_t)pages * page_size * sizeof *kv->tokens);
    kv->index = malloc(kv->index_cap * sizeof *kv->index);
    if (!kv->refs || !kv->next || !kv->prev || !kv->key || !kv->tokens || !kv->index) {
        wl_kv_destroy(kv);
        return wl_fail("KV cache: out of memory for %d pages' allocator", pages);
    }
    for (size_t i = 0; i < kv->index_cap; i++)
        kv->index[i] = NO_PAGE;
    kv->free_head = kv->free_tail = NO_PAGE;
    for (int i = pages - 1; i >= 0; i--) /* low pages first: they are taken first */
        free_link(kv, i);
    if (pthread_mutex_init(&kv->lock, NULL)) {
        wl_kv_destroy(kv);
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
    kv->first_layer = m->first_layer;
    kv->layers = m->end_layer - m->first_layer; /* a pipeline stage's own */
    kv->kv_heads = c->kv_heads;
    kv->head_dim = c->head_dim;
    kv->k = calloc((size_t)kv->layers, sizeof *kv->k);
    kv->v = calloc((size_t)kv->layers, sizeof *kv->v);
    if (!kv->k || !kv->v) {
        wl_kv_destroy(kv);
        return wl_fail("KV cache: out of memory");
    }
    size_t bytes = (size_t)pages * page_size * c->kv_heads * c->head_dim * wl_dtype_size(m->dtype);
    for (int l = 0; l < kv->layers; l++)
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
    free(kv->refs);
    free(kv->next);
    free(kv->prev);
    free(kv->key);
    free(kv->tokens);
    free(kv->index);
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
                           .k = kv->k[layer - kv->first_layer],
                           .v = kv->v[layer - kv->first_layer],
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

/* Under the lock: the free list's head, taken by a sequence (a published
 * page taken for new tokens stops being findable). */
static int take_page(wl_kv *kv)
{
    int p = kv->free_head;
    free_unlink(kv, p);
    if (kv->key[p])
        index_remove(kv, p);
    kv->refs[p] = 1;
    return p;
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
        s->table[s->used++] = take_page(kv);
    pthread_mutex_unlock(&kv->lock);
    return 0;
}

int wl_kv_seq_share(wl_kv_seq *s, const int32_t *ids, int n)
{
    wl_kv *kv = s->kv;
    int ps = kv->page_size;
    uint64_t key = 0;
    if (!kv->sharing || s->used)
        return 0;
    pthread_mutex_lock(&kv->lock);
    /* whole pages only, and never the prompt's last token: its logits are
     * what the prefill is for */
    for (int i = 0; (i + 1) * ps < n && i < s->max_pages; i++) {
        key = prefix_key(key, ids + (size_t)i * ps, ps);
        int p = index_find(kv, key, ids + (size_t)i * ps);
        if (p == NO_PAGE)
            break;
        if (!kv->refs[p]++)
            free_unlink(kv, p); /* kept after its last holder ended: taken back */
        s->table[s->used++] = p;
    }
    kv->shared_tokens += (long)s->used * ps;
    pthread_mutex_unlock(&kv->lock);
    return s->used * ps;
}

void wl_kv_seq_publish(wl_kv_seq *s, const int32_t *ids, int n)
{
    wl_kv *kv = s->kv;
    int ps = kv->page_size;
    uint64_t key = 0;
    if (!kv->sharing)
        return;
    pthread_mutex_lock(&kv->lock);
    for (int i = 0; (i + 1) * ps <= n && i < s->used; i++) {
        key = prefix_key(key, ids + (size_t)i * ps, ps);
        int p = s->table[i];
        if (kv->key[p] == key)
            continue; /* shared from the index, or published already */
        if (kv->key[p] || index_find(kv, key, ids + (size_t)i * ps) != NO_PAGE)
            continue; /* another sequence published the same prefix first */
        index_insert(kv, p, key, ids + (size_t)i * ps);
    }
    pthread_mutex_unlock(&kv->lock);
}

void wl_kv_seq_release(wl_kv_seq *s)
{
    wl_kv *kv = s->kv;
    if (!kv)
        return;
    pthread_mutex_lock(&kv->lock);
    while (s->used > 0) {
        int p = s->table[--s->used];
        if (!--kv->refs[p])
            free_link(kv, p);
    }
    pthread_mutex_unlock(&kv->lock);
    free(s->table);
    memset(s, 0, sizeof *s);
}
