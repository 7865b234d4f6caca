/*
 * blocks.h - weft_malloc_async's device blocks: CUDA's stream-ordered pool
 * with a few freed blocks kept by each stream.
 *
 * cudaMallocAsync and cudaFreeAsync each take locks of the CUDA runtime's
 * and the driver's. A program that allocates a block per job from a dozen
 * threads queues on them (weft-images at 16 workers spent a fifth of each
 * task's time there; at 4 workers, nothing measurable). Yet a block freed
 * on a stream may be used again on that same stream at once: whatever is
 * enqueued there after the free runs after the work before it, the rule
 * CUDA's pool itself follows. So each stream keeps the last few blocks
 * freed on it and hands one to an allocation on it that fits, with no CUDA
 * call and no lock but the stream's own.
 *
 * Never kept: blocks over WEFT__CUDA_KEPT_MAX bytes, blocks of another
 * device, and blocks allocated or freed while their stream records a
 * graph region (a captured allocation belongs to its graph, and a kept
 * block must never be baked into one). When CUDA refuses an allocation for
 * want of memory, every stream of the device gives its kept blocks back
 * and the allocation is tried once more.
 */
#ifndef WEFT_CUDA_BLOCKS_H
#define WEFT_CUDA_BLOCKS_H

#include <stddef.h>

enum {
    WEFT__CUDA_KEPT_BLOCKS = 4,      /* blocks a stream keeps */
    WEFT__CUDA_KEPT_MAX = 16u << 20, /* largest block kept */
};

typedef struct weft__cuda_kept_block {
    void *ptr;
    size_t size; /* as allocated */
} weft__cuda_kept_block;

/* A stream's kept blocks, oldest first; guarded by the stream's lock. */
typedef struct weft__cuda_kept_blocks {
    weft__cuda_kept_block v[WEFT__CUDA_KEPT_BLOCKS];
    unsigned n;
} weft__cuda_kept_blocks;

typedef struct weft__stream weft__stream;

/* weft_malloc_async and weft_free_async on s (a stream of the lease pool). */
int weft__cuda_block_alloc(weft__stream *s, void **ptr, size_t n);
int weft__cuda_block_free(weft__stream *s, void *ptr);

/* Give s's kept blocks back to CUDA (cudaFreeAsync on s): at the device's
 * destroy, before s is synchronized for the last time. */
void weft__cuda_blocks_release(weft__stream *s);

#endif
