/*
 * memory.h - a pool of page-locked host memory for the CUDA backend.
 *
 * cudaHostAlloc and cudaFreeHost cost milliseconds and synchronize the
 * device, so freed blocks are kept by size class (powers of two) and handed
 * out again. Every block is mapped and portable: any GPU can address it.
 */
#ifndef WEFT_CUDA_MEMORY_H
#define WEFT_CUDA_MEMORY_H

#include <stdbool.h>
#include <stddef.h>

#include "core/addrset.h"
#include "core/lock.h"

#define WEFT__HOST_CLASSES 40

typedef struct weft__cuda_host_pool {
    weft__lock lock;
    void *free[WEFT__HOST_CLASSES]; /* free blocks per class, linked through their headers */
    size_t cached;                  /* bytes held in free lists */
    weft__addrset live;             /* blocks handed out: the caller's pointers */
} weft__cuda_host_pool;

void weft__cuda_host_pool_init(weft__cuda_host_pool *pool);
void weft__cuda_host_pool_destroy(weft__cuda_host_pool *pool);
int weft__cuda_host_pool_get(weft__cuda_host_pool *pool, size_t n, void **ptr);
/* Give back a block of this pool; anything else is refused with WEFT_EINVAL
 * (a message naming call), nothing read or freed. */
int weft__cuda_host_pool_put(weft__cuda_host_pool *pool, void *ptr, const char *call);
/* Give a block back without ever freeing it (no CUDA call): safe from a
 * host function running in a stream. */
void weft__cuda_host_pool_put_cached(weft__cuda_host_pool *pool, void *ptr);

/* Memory weft handed out that CUDA can address directly (pinned blocks of
 * the pool, device blocks of weft_malloc_async): copies need not ask CUDA
 * what kind of memory it is, a call that takes the driver's lock. Process
 * wide, thread-safe. */
int weft__cuda_known_add(const void *start, size_t n, bool host);
void weft__cuda_known_remove(const void *start);
bool weft__cuda_known(const void *p);
/* As weft__cuda_known, telling the kind: 0 not known, else one of these. */
enum { WEFT__CUDA_KNOWN_DEVICE = 1, WEFT__CUDA_KNOWN_HOST = 2 };
int weft__cuda_known_kind(const void *p);

#endif
