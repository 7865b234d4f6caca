/*
 * graph.h - graph mode's share of a CUDA stream and device (graph.c): the
 * capture streams a region's work goes to, and the cache of executable
 * graphs. A capture stream is outside the lease pool and is never awaited;
 * the cache and its stats are guarded by graph_lock.
 */
#ifndef WEFT_CUDA_GRAPH_H
#define WEFT_CUDA_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "core/lock.h"
#include "cuda/record.h"
#include "device/device.h"

/* A stream's graph-mode state: set on capture streams only. */
typedef struct weft__cuda_graph_stream {
    weft__stream *next_capture; /* a capture stream's free-list link */
    bool capture;               /* records for graph mode, never runs or waits */
    bool recording;             /* a capture stream keeping a record, not capturing */
    weft__cuda_record *record;  /* what it recorded (record.c) */
} weft__cuda_graph_stream;

/* A device's graph cache. */
typedef struct weft__cuda_graph_device {
    weft__lock graph_lock;
    struct weft__cuda_graph *graphs; /* cached executable graphs */
    weft__stream *captures;          /* idle capture streams */
    unsigned ngraphs, graph_cap;
    uint64_t graph_clock;         /* for least recently used */
    weft_graph_stats graph_stats; /* guarded by graph_lock */
} weft__cuda_graph_device;

typedef struct weft__cuda_device weft__cuda_device;

int weft__cuda_graph_init(weft__cuda_device *dev, unsigned cap);
void weft__cuda_graph_fini(weft__cuda_device *dev);
int weft__cuda_region_begin(weft__stream *s, weft__stream **capture);
int weft__cuda_region_end(weft__stream *s, weft__stream *capture, uint64_t key);
void weft__cuda_region_abandon(weft__stream *capture);
int weft__cuda_region_replay(weft__stream *s, uint64_t key, bool *replayed);
/* Turn a recording region into a stream capture, its record enqueued
 * first; nothing when it is capturing already. */
int weft__cuda_region_capture(weft__stream *capture);
void weft__cuda_graph_stats(weft__device *d, weft_graph_stats *sum);

#endif
