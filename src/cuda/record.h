/*
 * record.h - a graph-mode region's operations kept as data (record.c):
 * what a recording capture stream holds until the region ends, and what a
 * graph built from it keeps to compare the next region with.
 */
#ifndef WEFT_CUDA_RECORD_H
#define WEFT_CUDA_RECORD_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>

#include "weft.h"

typedef struct weft__cuda_record weft__cuda_record;

/* A record_* call could not record the operation: the caller captures the
 * region (weft__cuda_region_capture) and enqueues it as usual. */
#define WEFT__CUDA_NOT_RECORDED 1

weft__cuda_record *weft__cuda_record_new(void);
void weft__cuda_record_free(weft__cuda_record *r);
void weft__cuda_record_reset(weft__cuda_record *r);
unsigned weft__cuda_record_length(const weft__cuda_record *r);
int weft__cuda_record_launch(weft__cuda_record *r, const void *kernel, weft_dim3 grid,
                             weft_dim3 block, size_t shared_bytes, void **args);
int weft__cuda_record_fill(weft__cuda_record *r, void *dst, int value, size_t n);
int weft__cuda_record_copy(weft__cuda_record *r, void *dst, const void *src, size_t n);

/* Enqueue the recorded operations on stream, in order. */
cudaError_t weft__cuda_record_enqueue(const weft__cuda_record *r, cudaStream_t stream);
/* A graph of the recorded operations as a chain; nodes[i] is operation i. */
cudaError_t weft__cuda_record_build(const weft__cuda_record *r, cudaGraph_t *graph,
                                    cudaGraphNode_t **nodes);
/* Same operations and kernels in the same order: one graph serves both. */
bool weft__cuda_record_same_shape(const weft__cuda_record *a, const weft__cuda_record *b);
/* Bring exec, instantiated from was's graph (nodes), to now's parameters,
 * setting only the nodes that differ (*changed counts them). */
cudaError_t weft__cuda_record_apply(cudaGraphExec_t exec, const cudaGraphNode_t *nodes,
                                    const weft__cuda_record *was, const weft__cuda_record *now,
                                    unsigned *changed);

#endif
