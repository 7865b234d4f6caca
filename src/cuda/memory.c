/*
 * memory.c - page-locked host memory, pooled by size class.
 *
 * Each block starts with a header (its class, and the free-list link while
 * pooled) in the first HEADER bytes, so the caller's pointer keeps a 256-byte
 * alignment. Blocks of a class are 2^class bytes plus the header; the pool
 * keeps at most CACHE_MAX bytes of free blocks and frees the rest.
 *
 * A block handed out is in the pool's set of live blocks until it comes
 * back, so a put of anything else - a foreign pointer, the middle of a
 * block, a block put already - is refused before its header is read.
 */
#include <assert.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cuda/memory.h"

enum { HEADER = 256, MIN_CLASS = 12 }; /* 4 KiB */
#define CACHE_MAX ((size_t)1 << 30)

typedef struct header {
    unsigned class_;
    void *next; /* free list, while pooled */
} header;

static header *header_of(void *ptr)
{
    return (header *)((char *)ptr - HEADER);
}

static unsigned class_of(size_t n)
{
    unsigned c = MIN_CLASS;
    while (((size_t)1 << c) < n)
        c++;
    return c;
}

/* ---- known ranges: sorted by start, disjoint ------------------------------ */

typedef struct range {
    uintptr_t start, end;
    bool host; /* a pinned block of the pool, else device memory */
} range;

static weft__lock known_lock;
static range *known;
static size_t nknown, known_cap;

/* Index of the first range starting after p. Call with known_lock held. */
static size_t known_upper(uintptr_t p)
{
    size_t lo = 0, hi = nknown;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (known[mid].start <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int weft__cuda_known_add(const void *start, size_t n, bool host)
{
    uintptr_t a = (uintptr_t)start;
    weft__lock_acquire(&known_lock);
    if (nknown == known_cap) {
        size_t cap = known_cap ? 2 * known_cap : 256;
        range *grown = realloc(known, cap * sizeof *grown);
        if (!grown) {
            weft__lock_release(&known_lock);
            return WEFT_ENOMEM; /* not fatal: the copy asks CUDA instead */
        }
        known = grown;
        known_cap = cap;
    }
    size_t i = known_upper(a);
    memmove(&known[i + 1], &known[i], (nknown - i) * sizeof *known);
    known[i] = (range){a, a + n, host};
    nknown++;
    weft__lock_release(&known_lock);
    return WEFT_OK;
}

void weft__cuda_known_remove(const void *start)
{
    uintptr_t a = (uintptr_t)start;
    weft__lock_acquire(&known_lock);
    size_t i = known_upper(a);
    if (i > 0 && known[i - 1].start == a) {
        memmove(&known[i - 1], &known[i], (nknown - i) * sizeof *known);
        nknown--;
    }
    weft__lock_release(&known_lock);
}

int weft__cuda_known_kind(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    weft__lock_acquire(&known_lock);
    size_t i = known_upper(a);
    int kind = i > 0 && a < known[i - 1].end
                   ? (known[i - 1].host ? WEFT__CUDA_KNOWN_HOST : WEFT__CUDA_KNOWN_DEVICE)
                   : 0;
    weft__lock_release(&known_lock);
    return kind;
}

bool weft__cuda_known(const void *p)
{
    return weft__cuda_known_kind(p) != 0;
}

/* ---- the pinned pool ---------------------------------------------------- */

void weft__cuda_host_pool_init(weft__cuda_host_pool *pool)
{
    *pool = (weft__cuda_host_pool){0};
}

void weft__cuda_host_pool_destroy(weft__cuda_host_pool *pool)
{
    for (unsigned c = 0; c < WEFT__HOST_CLASSES; c++)
        while (pool->free[c]) {
            header *h = pool->free[c];
            pool->free[c] = h->next;
            weft__cuda_known_remove(h);
            cudaFreeHost(h);
        }
    pool->cached = 0;
    weft__addrset_fini(&pool->live);
}

static bool keep(weft__cuda_host_pool *pool, header *h, bool force);

int weft__cuda_host_pool_get(weft__cuda_host_pool *pool, size_t n, void **ptr)
{
    unsigned c = class_of(n);
    if (c >= WEFT__HOST_CLASSES)
        return weft__fail(WEFT_ENOMEM, "weft_host_alloc: %zu bytes is too large", n);
    weft__lock_acquire(&pool->lock);
    header *h = pool->free[c];
    if (h) {
        pool->free[c] = h->next;
        pool->cached -= (size_t)1 << c;
    }
    weft__lock_release(&pool->lock);
    if (!h) {
        cudaError_t e = cudaHostAlloc((void **)&h, HEADER + ((size_t)1 << c),
                                      cudaHostAllocMapped | cudaHostAllocPortable);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return weft__fail(e == cudaErrorMemoryAllocation ? WEFT_ENOMEM : WEFT_EDEVICE,
                              "weft_host_alloc: cudaHostAlloc of %zu bytes: %s", n,
                              cudaGetErrorName(e));
        }
        h->class_ = c;
        weft__cuda_known_add(h, HEADER + ((size_t)1 << c), true);
    }
    if (weft__addrset_add(&pool->live, (uintptr_t)h + HEADER, 0) != WEFT_OK) {
        keep(pool, h, true);
        return weft__fail(WEFT_ENOMEM, "weft_host_alloc: out of memory");
    }
    *ptr = (char *)h + HEADER;
    return WEFT_OK;
}

/* List h as free; with force, also beyond the cache bound. */
static bool keep(weft__cuda_host_pool *pool, header *h, bool force)
{
    size_t size = (size_t)1 << h->class_;
    weft__lock_acquire(&pool->lock);
    bool kept = force || pool->cached + size <= CACHE_MAX;
    if (kept) {
        h->next = pool->free[h->class_];
        pool->free[h->class_] = h;
        pool->cached += size;
    }
    weft__lock_release(&pool->lock);
    return kept;
}

int weft__cuda_host_pool_put(weft__cuda_host_pool *pool, void *ptr, const char *call)
{
    if (!weft__addrset_take(&pool->live, (uintptr_t)ptr, NULL))
        return weft__fail(WEFT_EINVAL,
                          "%s: %p is not a block this runtime handed out, or was freed already",
                          call, ptr);
    header *h = header_of(ptr);
    if (!keep(pool, h, false)) {
        weft__cuda_known_remove(h);
        cudaFreeHost(h);
    }
    return WEFT_OK;
}

void weft__cuda_host_pool_put_cached(weft__cuda_host_pool *pool, void *ptr)
{
    bool live = weft__addrset_take(&pool->live, (uintptr_t)ptr, NULL);
    assert(live); /* only weft's own staging buffers come back this way */
    (void)live;
    keep(pool, header_of(ptr), true);
}
