/*
 * nvtx.h - NVTX ranges, so that Nsight shows weft's structure: a range per
 * task run on its worker's thread, a range per wait (it may end on another
 * thread), and one around each enqueued operation, which Nsight ties to
 * the GPU work it caused.
 *
 * Built on the header-only NVTX 3 of the CUDA toolkit; without CUDA these
 * do nothing. The ranges cost a call each, so the hooks make them only when
 * a profiler has attached itself (weft__nvtx_attached, read once per
 * runtime).
 */
#ifndef WEFT_NVTX_H
#define WEFT_NVTX_H

#include <stdbool.h>
#include <stdint.h>

/* Is an NVTX tool (Nsight Systems, Nsight Compute) injected? */
bool weft__nvtx_attached(void);

void weft__nvtx_push(const char *name);
void weft__nvtx_pop(void);
uint64_t weft__nvtx_start(const char *name); /* a range that may end on another thread */
void weft__nvtx_end(uint64_t range);

#endif
