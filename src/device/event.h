/*
 * event.h - the records behind weft_event handles.
 *
 * An event is a point in a stream: a device, a stream of it and a sequence
 * number there. Its handle names a slot of a process-wide pool and the
 * slot's generation, not an address, so that every check of a handle - a
 * second destroy, a wait on a destroyed event, a pointer that never was an
 * event - is a lookup in memory the pool owns and never reads through the
 * caller's pointer. Destroying an event bumps its slot's generation: the
 * old handle is stale from then on, even once the slot holds a new event.
 */
#ifndef WEFT_EVENT_H
#define WEFT_EVENT_H

#include <stdint.h>

#include "device/device.h"

typedef struct weft__event_point {
    weft__device *dev;
    weft__stream *stream;
    uint64_t seq;
} weft__event_point;

/* A new event at *point. WEFT_OK or WEFT_ENOMEM (message naming fn). */
int weft__event_new(const weft__event_point *point, const char *fn, weft_event **ev);

/* The point ev marks: WEFT_OK; WEFT_ESTATE if ev was destroyed; WEFT_EINVAL
 * if ev is not an event's handle (messages naming fn). */
int weft__event_point_of(weft_event *ev, const char *fn, weft__event_point *point);

/* Destroy ev (same answers as weft__event_point_of). */
int weft__event_free(weft_event *ev, const char *fn);

/* Events not destroyed yet that mark points on dev: a scan of the pool,
 * for the report of what a runtime left behind at its destroy. */
uint64_t weft__events_live(const weft__device *dev);

#endif
