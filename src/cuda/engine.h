/*
 * engine.h - the completion engine's share of a CUDA stream and device
 * (engine.c): how markers are noticed complete, and the streams it watches.
 * Only engine.c changes these records, under the stream's lock or the
 * device's active_lock as each field says; backend.c allocates the mapped
 * completion words and hands each stream its own.
 */
#ifndef WEFT_CUDA_ENGINE_H
#define WEFT_CUDA_ENGINE_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/lock.h"
#include "device/device.h"

enum {
    WEFT__CUDA_MAX_STREAMS = 256, /* per priority class; beyond, leases share */
    WEFT__CUDA_FLAG_STRIDE = 16,  /* words between completion flags: a cache line each */
};

/* How a marker's completion is noticed (engine.c says what each costs).
 * WEFT_CUDA_COMPLETION=auto|flag|event chooses; callback only in builds
 * for measuring (WEFT_MEASURE_MODES, docs/design.md says why). */
typedef enum weft__cuda_completion {
    WEFT__CUDA_FLAG,     /* the GPU writes the sequence number into mapped memory */
    WEFT__CUDA_EVENT,    /* a CUDA event per marker, queried by the engine */
    WEFT__CUDA_CALLBACK, /* a host function per marker fires the waiters itself */
    WEFT__CUDA_AUTO      /* flags, or events while many streams complete often */
} weft__cuda_completion;

/* An event recorded as a marker, while the engine waits for it. */
typedef struct weft__cuda_mark_event {
    uint64_t seq;
    cudaEvent_t event;
} weft__cuda_mark_event;

/* A stream's completion state, guarded by the stream's lock unless said. */
typedef struct weft__cuda_engine_stream {
    weft__waitq pending; /* waiters, in sequence order */
    bool active;         /* on the device's active list (changed holding both locks) */

    volatile uint32_t *flag; /* FLAG, AUTO: written by the GPU */
    CUdeviceptr flag_device;
    _Atomic uint64_t flag_marked;  /* AUTO: the last marker that is a flag */
    _Atomic uint64_t done;         /* EVENT, CALLBACK, AUTO: highest sequence known done */
    weft__cuda_mark_event *events; /* EVENT, AUTO: recorded, oldest first (a ring) */
    unsigned ev_head, ev_count, ev_cap;
    cudaEvent_t *spare; /* EVENT, AUTO: events to record again */
    unsigned nspare, spare_cap;
} weft__cuda_engine_stream;

/* A device's completion state. */
typedef struct weft__cuda_engine_device {
    weft__cuda_completion completion;

    uint32_t *flags; /* 2 * MAX_STREAMS completion words, mapped */
    CUdeviceptr flags_device;

    weft__lock active_lock; /* guards active; also keeps one poller at a time */
    weft__stream *active[2 * WEFT__CUDA_MAX_STREAMS];
    unsigned nactive;
    atomic_uint npending; /* waiters, all streams */
    uint64_t last_backstop;
    unsigned next_query; /* the backstop's turn among active streams */
    unsigned next_poll;  /* EVENT, AUTO: where the next sweep starts */
    uint64_t last_sweep; /* EVENT, AUTO: when every active stream was last queried */
    /* AUTO: the waiters the pollers fired since rate_start, and whether the
     * last full window was crowded enough for markers to be events */
    unsigned rate_fired;
    _Atomic uint64_t rate_start;
    atomic_bool crowded;
} weft__cuda_engine_device;

/* Look up the driver's stream memory operations; once per process. */
int weft__cuda_engine_load(void);

/* Set up and tear down a stream's share of the engine. */
void weft__cuda_engine_stream_init(weft__stream *s, unsigned slot);
void weft__cuda_engine_stream_fini(weft__stream *s);

int weft__cuda_mark(weft__stream *s, uint64_t *seq);
int weft__cuda_wait(weft__stream *s, uint64_t seq, uint64_t deadline);
int weft__cuda_stream_wait(weft__stream *s, weft__stream *other, uint64_t seq);
bool weft__cuda_reached(weft__stream *s, uint64_t seq); /* has s reached seq? */
unsigned weft__cuda_poll(weft__device *d);
bool weft__cuda_pending(weft__device *d);

#endif
