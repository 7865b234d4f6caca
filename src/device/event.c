/*
 * event.c - the pool of event records (event.h).
 *
 * A handle is (generation << 32) | (slot + 1): never NULL, and never an
 * address the pool reads through. Slots live in chunks that are never
 * given back, so a stale handle always finds readable memory of the pool's
 * and a handle of an event destroyed long ago reads as destroyed, not as
 * whatever took its place. The pool is as large as the most events alive
 * at once.
 *
 * Invariants, under the pool's lock: a slot is live exactly while it is
 * off the free list; a live slot's generation is the one in its handle,
 * and generations are never 0, so a handle with generation 0 (say, any
 * address below 4 GiB) is not an event's; each destroy moves the
 * generation on, so a destroyed handle never matches again until 2^32 - 1
 * events have used its slot.
 */
#include <stdbool.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/lock.h"
#include "device/event.h"

enum { CHUNK_SLOTS = 256, MAX_SLOTS = 1u << 31 };

typedef struct slot {
    weft__event_point point;
    uint32_t generation;
    uint32_t next_free; /* slot + 1 of the next free slot, 0: none */
    bool live;
} slot;

static struct {
    weft__lock lock;
    slot **chunks;
    uint32_t nslots;    /* slots in chunks */
    uint32_t free_head; /* slot + 1, 0: none */
} pool = {WEFT__LOCK_INIT, NULL, 0, 0};

static slot *slot_at(uint32_t i)
{
    return &pool.chunks[i / CHUNK_SLOTS][i % CHUNK_SLOTS];
}

/* Add a chunk of free slots. Call with the lock held. */
static bool pool_grow(void)
{
    uint32_t nchunks = pool.nslots / CHUNK_SLOTS;
    if (pool.nslots >= MAX_SLOTS)
        return false;
    slot **chunks = realloc(pool.chunks, (nchunks + 1) * sizeof *chunks);
    if (!chunks)
        return false;
    pool.chunks = chunks;
    slot *c = calloc(CHUNK_SLOTS, sizeof *c);
    if (!c)
        return false;
    chunks[nchunks] = c;
    for (uint32_t k = CHUNK_SLOTS; k-- > 0;) {
        c[k].generation = 1;
        c[k].next_free = pool.free_head;
        pool.free_head = pool.nslots + k + 1;
    }
    pool.nslots += CHUNK_SLOTS;
    return true;
}

int weft__event_new(const weft__event_point *point, const char *fn, weft_event **ev)
{
    weft__lock_acquire(&pool.lock);
    if (!pool.free_head && !pool_grow()) {
        weft__lock_release(&pool.lock);
        return weft__fail(WEFT_ENOMEM, "%s: out of memory", fn);
    }
    uint32_t i = pool.free_head - 1;
    slot *s = slot_at(i);
    pool.free_head = s->next_free;
    s->point = *point;
    s->live = true;
    *ev = (weft_event *)((uintptr_t)s->generation << 32 | (uintptr_t)(i + 1));
    weft__lock_release(&pool.lock);
    return WEFT_OK;
}

/* The live slot ev names, or NULL with the failure in *rc. Call with the
 * lock held. */
static slot *lookup(weft_event *ev, const char *fn, int *rc)
{
    uintptr_t h = (uintptr_t)ev;
    uint32_t i = (uint32_t)h - 1, generation = (uint32_t)(h >> 32);

    if (!ev) {
        *rc = weft__fail(WEFT_EINVAL, "%s: ev is NULL", fn);
        return NULL;
    }
    if ((uint32_t)h == 0 || i >= pool.nslots || generation == 0) {
        *rc = weft__fail(WEFT_EINVAL, "%s: %p is not an event", fn, (void *)ev);
        return NULL;
    }
    slot *s = slot_at(i);
    if (!s->live || s->generation != generation) {
        *rc = weft__fail(WEFT_ESTATE, "%s: the event was destroyed", fn);
        return NULL;
    }
    return s;
}

int weft__event_point_of(weft_event *ev, const char *fn, weft__event_point *point)
{
    int rc = WEFT_OK;
    weft__lock_acquire(&pool.lock);
    slot *s = lookup(ev, fn, &rc);
    if (s)
        *point = s->point;
    weft__lock_release(&pool.lock);
    return rc;
}

int weft__event_free(weft_event *ev, const char *fn)
{
    int rc = WEFT_OK;
    weft__lock_acquire(&pool.lock);
    slot *s = lookup(ev, fn, &rc);
    if (s) {
        s->live = false;
        if (++s->generation == 0)
            s->generation = 1;
        s->next_free = pool.free_head;
        pool.free_head = (uint32_t)((uintptr_t)ev); /* slot + 1 */
    }
    weft__lock_release(&pool.lock);
    return rc;
}

uint64_t weft__events_live(const weft__device *dev)
{
    uint64_t n = 0;
    weft__lock_acquire(&pool.lock);
    for (uint32_t i = 0; i < pool.nslots; i++) {
        const slot *s = slot_at(i);
        n += s->live && s->point.dev == dev;
    }
    weft__lock_release(&pool.lock);
    return n;
}
