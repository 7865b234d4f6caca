/*
 * timing.h - the timeline's share of a CUDA stream and device (timing.c,
 * cupti.c): GPU operations timed by CUDA events or CUPTI's records while a
 * trace records. A stream's record is guarded by the stream's lock but for
 * timing_chain, which only the task enqueuing on the stream (its
 * leaseholder) touches; a device's anchor by anchor_lock.
 */
#ifndef WEFT_CUDA_TIMING_H
#define WEFT_CUDA_TIMING_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/lock.h"
#include "device/device.h"

/* A stream's timed operations. */
typedef struct weft__cuda_timing_stream {
    struct weft__cuda_timed *timed; /* operations awaiting read-back, oldest first (a ring) */
    unsigned timed_head, timed_count, timed_cap;
    cudaEvent_t *timing_spare; /* timing events to record again */
    unsigned ntiming_spare, timing_spare_cap;
    bool timing_chain;     /* nothing enqueued since the newest timed op's end
                            * event: the next op may start from it */
    bool timed_end_known;  /* timed_end_ns holds the last read-back op's end */
    uint64_t timed_end_ns; /* host time: where an op chained to it starts */
} weft__cuda_timing_stream;

/* A device's anchor: an event whose host time is known, which the device
 * times of operations are measured from. */
typedef struct weft__cuda_timing_device {
    weft__lock anchor_lock;
    cudaEvent_t anchor;
    uint64_t anchor_ns;
    cudaStream_t anchor_stream;
} weft__cuda_timing_device;

typedef struct weft__cuda_device weft__cuda_device;

void *weft__cuda_trace_begin(weft__stream *s, weft__op_kind kind);
void weft__cuda_trace_end(weft__stream *s, void *begin, const weft__op_info *op);
void weft__cuda_trace_collect(weft__stream *s);
void weft__cuda_trace_flush(weft__device *dev);
void weft__cuda_trace_prepare(weft__device *dev);
void weft__cuda_trace_stream_fini(weft__stream *s);
void weft__cuda_trace_fini(weft__cuda_device *dev);

/* A kernel's name for the timeline, looked up once per kernel; a mangled
 * name's last component (buf holds what is not kept). */
const char *weft__cuda_kernel_name(const void *kernel, char *buf, size_t size);
const char *weft__cuda_demangle(const char *name, char *buf, size_t size);

/* How a trace times GPU operations, as WEFT_TRACE_GPU says: CUPTI's records
 * (cupti, the default), CUDA events (events), or not at all (off: the
 * tasks and their waits only). */
typedef enum weft__gpu_timing {
    WEFT__TIMING_EVENTS,
    WEFT__TIMING_CUPTI,
    WEFT__TIMING_OFF,
} weft__gpu_timing;

weft__gpu_timing weft__cuda_gpu_timing(void);

/* ---- cupti.c ------------------------------------------------------------ */

/* Start CUPTI's records if they are not on. false: CUPTI cannot time
 * operations (they go to the events; said once on stderr). */
bool weft__cupti_start(void);

/* Before an operation is enqueued: start CUPTI if need be and tag what the
 * calling thread enqueues next. false: CUPTI cannot time it (the operation
 * goes to the events). */
bool weft__cupti_tag(uint64_t *tag);

/* After it: stop tagging, and keep what the operation was for the record
 * that will come with its times. */
void weft__cupti_untag(weft__stream *s, uint64_t tag, const weft__op_info *op);

/* Report to tr every operation of its whose record CUPTI still holds, and
 * forget the rest of tr's; CUPTI stops once no trace has operations in
 * flight. */
void weft__cupti_flush(weft__trace *tr);

#endif
