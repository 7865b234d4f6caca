/*
 * blocks.c - weft_malloc_async's device blocks (blocks.h): the registry of
 * blocks handed out, and the few freed blocks each stream keeps.
 *
 * Every block from cudaMallocAsync is in the registry from its allocation
 * to its free, with a word that says its size, its device and whether it
 * was allocated under capture; a free that does not find its pointer there
 * is refused. A kept block is out of the registry (it was freed) but stays
 * in the known ranges (memory.c), so handing it out again costs neither.
 *
 * Which kept block an allocation takes: the smallest that holds n bytes,
 * if it is no more than twice n, so that a stream's big blocks are not
 * spent on small requests.
 */
#include <stdbool.h>
#include <stdint.h>

#include "core/addrset.h"
#include "core/error.h"
#include "cuda/backend.h"

static weft__addrset registry = WEFT__ADDRSET_INIT;

/* The registry's word: size, then whether allocated under capture, then
 * the device's ordinal. */
enum { ORDINAL_BITS = 15, CAPTURED_BIT = 1u << ORDINAL_BITS, SIZE_SHIFT = ORDINAL_BITS + 1 };

static uint64_t block_word(size_t size, int ordinal, bool captured)
{
    return (uint64_t)size << SIZE_SHIFT | (captured ? CAPTURED_BIT : 0) |
           ((uint64_t)ordinal & (CAPTURED_BIT - 1));
}

/* Is work on s going into a graph: a region of graph mode, or a capture of
 * the caller's own on the handle weft_stream gave out? Only such a stream
 * is asked, since asking is a driver call. */
static bool capturing(weft__stream *s)
{
    if (s->graph.capture)
        return true;
    if (!s->handle_out)
        return false;
    enum cudaStreamCaptureStatus status;
    if (cudaStreamIsCapturing(s->handle, &status) != cudaSuccess) {
        cudaGetLastError();
        return true; /* unsure: keep nothing */
    }
    return status != cudaStreamCaptureStatusNone;
}

/* Take a kept block of s that fits n (its size to *size), or NULL. */
static void *take_kept(weft__stream *s, size_t n, size_t *size)
{
    weft__cuda_kept_blocks *k = &s->kept;
    void *ptr = NULL;
    weft__lock_acquire(&s->lock);
    unsigned best = k->n;
    for (unsigned i = 0; i < k->n; i++)
        if (k->v[i].size >= n && k->v[i].size / 2 <= n &&
            (best == k->n || k->v[i].size < k->v[best].size))
            best = i;
    if (best < k->n) {
        ptr = k->v[best].ptr;
        *size = k->v[best].size;
        for (unsigned i = best; i + 1 < k->n; i++)
            k->v[i] = k->v[i + 1];
        k->n--;
    }
    weft__lock_release(&s->lock);
    return ptr;
}

/* Hand ptr (freed) to CUDA for good, in s's order. */
static void give_back(weft__stream *s, void *ptr)
{
    weft__cuda_known_remove(ptr);
    if (cudaFreeAsync(ptr, s->handle) != cudaSuccess)
        cudaGetLastError(); /* a failed device: its memory goes with it */
}

/* Keep ptr on s; the block it pushes out, if any, goes back to CUDA. */
static void keep(weft__stream *s, void *ptr, size_t size)
{
    weft__cuda_kept_blocks *k = &s->kept;
    weft__cuda_kept_block out = {NULL, 0};
    weft__lock_acquire(&s->lock);
    if (k->n == WEFT__CUDA_KEPT_BLOCKS) {
        out = k->v[0];
        for (unsigned i = 0; i + 1 < k->n; i++)
            k->v[i] = k->v[i + 1];
        k->n--;
    }
    k->v[k->n++] = (weft__cuda_kept_block){ptr, size};
    weft__lock_release(&s->lock);
    if (out.ptr)
        give_back(s, out.ptr);
}

void weft__cuda_blocks_release(weft__stream *s)
{
    weft__lock_acquire(&s->lock);
    weft__cuda_kept_blocks k = s->kept;
    s->kept.n = 0;
    weft__lock_release(&s->lock);
    for (unsigned i = 0; i < k.n; i++)
        give_back(s, k.v[i].ptr);
}

/* Out of memory: every stream of s's device gives its kept blocks back. */
static void release_device(weft__stream *s)
{
    weft__cuda_device *dev = s->dev;
    weft__lock_acquire(&dev->pool_lock);
    for (int c = 0; c < 2; c++)
        for (unsigned i = 0; i < dev->nstreams[c]; i++)
            weft__cuda_blocks_release(dev->streams[c][i]);
    weft__lock_release(&dev->pool_lock);
}

int weft__cuda_block_alloc(weft__stream *s, void **ptr, size_t n)
{
    int rc = weft__cuda_enter(s, "weft_malloc_async");
    if (rc || (s->graph.recording && (rc = weft__cuda_region_capture(s))))
        return rc;
    bool captured = capturing(s);
    size_t size = n;
    void *p = captured ? NULL : take_kept(s, n, &size);
    if (!p) {
        cudaError_t e = cudaMallocAsync(&p, n, s->handle);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            release_device(s);
            e = cudaMallocAsync(&p, n, s->handle);
        }
        if (e != cudaSuccess)
            return weft__cuda_fail(s->dev, "cudaMallocAsync", e);
        weft__cuda_known_add(p, n, false);
    }
    if (weft__addrset_add(&registry, (uintptr_t)p, block_word(size, s->dev->ordinal, captured)) !=
        WEFT_OK) {
        give_back(s, p);
        return weft__fail(WEFT_ENOMEM, "weft_malloc_async: out of memory");
    }
    *ptr = p;
    weft__tally(&s->counts.allocs, 1);
    return WEFT_OK;
}

int weft__cuda_block_free(weft__stream *s, void *ptr)
{
    int rc = weft__cuda_enter(s, "weft_free_async");
    if (rc || (s->graph.recording && (rc = weft__cuda_region_capture(s))))
        return rc;
    uint64_t word;
    if (!weft__addrset_take(&registry, (uintptr_t)ptr, &word))
        return weft__fail(WEFT_EINVAL,
                          "weft_free_async: %p is not a block of weft_malloc_async, or was "
                          "freed already",
                          ptr);
    weft__tally(&s->counts.frees, 1);
    size_t size = (size_t)(word >> SIZE_SHIFT);
    bool ours = (word & (CAPTURED_BIT - 1)) == ((uint64_t)s->dev->ordinal & (CAPTURED_BIT - 1));
    if (!(word & CAPTURED_BIT) && ours && size <= WEFT__CUDA_KEPT_MAX && !capturing(s)) {
        keep(s, ptr, size);
        return WEFT_OK;
    }
    weft__cuda_known_remove(ptr);
    cudaError_t e = cudaFreeAsync(ptr, s->handle);
    return e == cudaSuccess ? WEFT_OK : weft__cuda_fail(s->dev, "cudaFreeAsync", e);
}
