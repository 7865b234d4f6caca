/*
 * chan.c - bounded FIFO channels with close, buffered or unbuffered.
 *
 * A channel is a ring of capacity items of item_size bytes (allocated with
 * the channel, behind it) plus two FIFOs of waiters, all under one
 * weft__lock. Items are copied: a waiting sender's w->data points at its
 * item (on its stack), a waiting receiver's at its destination buffer. Who
 * finds a waiter on the other side moves the item itself, while holding the
 * lock, and only then fires the waiter (task/wait.h).
 *
 * Invariants, under the lock:
 *  - A live receiver waits only while the ring is empty and no live sender
 *    waits; a live sender only while the ring is full (every sender when
 *    capacity is 0) and no live receiver waits. So a sender serves waiting
 *    receivers before the ring, and a receiver that empties a slot of a full
 *    ring refills it from the first waiting sender: the channel is one FIFO.
 *  - An item moves exactly once. A firer copies before it fires, because a
 *    fired waiter may vanish at once; if the fire fails (the waiter was
 *    cancelled and is leaving) the copy is dropped: the ring slot is not
 *    committed, or the next waiter's copy overwrites it. A cancelled or
 *    timed-out sender's item was therefore never sent, and such a receiver
 *    got nothing, whatever its buffer now holds.
 *  - closed never goes back to false. Once closed, no waiter is linked
 *    except cancelled ones on their way out: close fires every sender and,
 *    the ring being empty whenever a live receiver waits, every receiver.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/lock.h"
#include "task/task.h"
#include "task/wait.h"
#include "weft.h"

struct weft_chan {
    weft__lock lock;
    bool closed;
    size_t item_size;
    size_t capacity;       /* ring slots; 0: unbuffered */
    size_t head;           /* slot of the oldest item */
    size_t count;          /* items in the ring */
    weft__waitq senders;   /* w->data: the item to send */
    weft__waitq receivers; /* w->data: where the item goes */
    unsigned char ring[];  /* capacity * item_size bytes */
};

static unsigned char *slot(weft_chan *ch, size_t i)
{
    i += ch->head;
    if (i >= ch->capacity)
        i -= ch->capacity;
    return ch->ring + i * ch->item_size;
}

/* Copy item to the first live waiting receiver. */
static bool give_to_receiver(weft_chan *ch, const void *item)
{
    weft__waiter *w;

    while ((w = weft__waitq_pop(&ch->receivers)) != NULL) {
        memcpy(w->data, item, ch->item_size);
        if (weft__waiter_fire(w, WEFT_OK))
            return true;
    }
    return false;
}

/* Copy the item of the first live waiting sender to dst. */
static bool take_from_sender(weft_chan *ch, void *dst)
{
    weft__waiter *w;

    while ((w = weft__waitq_pop(&ch->senders)) != NULL) {
        memcpy(dst, w->data, ch->item_size);
        if (weft__waiter_fire(w, WEFT_OK))
            return true;
    }
    return false;
}

/* Send without waiting: WEFT_OK, WEFT_ECLOSED, or WEFT_EAGAIN (must wait). */
static int send_locked(weft_chan *ch, const void *item)
{
    if (ch->closed)
        return WEFT_ECLOSED;
    if (give_to_receiver(ch, item))
        return WEFT_OK;
    if (ch->count == ch->capacity)
        return WEFT_EAGAIN;
    memcpy(slot(ch, ch->count), item, ch->item_size);
    ch->count++;
    return WEFT_OK;
}

/* Receive without waiting: WEFT_OK, WEFT_ECLOSED (closed and drained), or
 * WEFT_EAGAIN (must wait). */
static int recv_locked(weft_chan *ch, void *item)
{
    if (ch->count > 0) {
        memcpy(item, slot(ch, 0), ch->item_size);
        ch->head = ch->head + 1 == ch->capacity ? 0 : ch->head + 1;
        ch->count--;
        /* The ring had been full if a sender waits: move its item in. */
        if (take_from_sender(ch, slot(ch, ch->count)))
            ch->count++;
        return WEFT_OK;
    }
    if (take_from_sender(ch, item))
        return WEFT_OK;
    return ch->closed ? WEFT_ECLOSED : WEFT_EAGAIN;
}

int weft_chan_create(weft_chan **ch, size_t item_size, size_t capacity)
{
    const size_t limit = (size_t)PTRDIFF_MAX - sizeof(weft_chan);
    weft_chan *c;

    if (ch == NULL)
        return weft__fail(WEFT_EINVAL, "weft_chan_create: ch is NULL");
    *ch = NULL;
    if (item_size == 0)
        return weft__fail(WEFT_EINVAL, "weft_chan_create: item_size is 0");
    if (item_size > limit || (capacity > 0 && item_size > limit / capacity))
        return weft__fail(WEFT_EINVAL, "weft_chan_create: %zu items of %zu bytes is too large",
                          capacity, item_size);
    c = calloc(1, sizeof(*c) + item_size * capacity);
    if (c == NULL)
        return weft__fail(WEFT_ENOMEM, "weft_chan_create: out of memory (%zu items of %zu bytes)",
                          capacity, item_size);
    c->item_size = item_size;
    c->capacity = capacity;
    *ch = c;
    return WEFT_OK;
}

int weft_chan_destroy(weft_chan *ch)
{
    bool busy;

    if (ch == NULL)
        return weft__fail(WEFT_EINVAL, "weft_chan_destroy: ch is NULL");
    weft__lock_acquire(&ch->lock);
    busy = ch->senders.head != NULL || ch->receivers.head != NULL;
    weft__lock_release(&ch->lock);
    if (busy)
        return weft__fail(WEFT_ESTATE, "weft_chan_destroy: tasks are waiting on it");
    free(ch);
    return WEFT_OK;
}

static int chan_send(weft_chan *ch, const void *item, uint64_t deadline, const char *fn)
{
    weft__waiter w;
    int status;

    if (ch == NULL)
        return weft__fail(WEFT_EINVAL, "%s: ch is NULL", fn);
    if (item == NULL)
        return weft__fail(WEFT_EINVAL, "%s: item is NULL", fn);
    if (weft_cancelled())
        return weft__fail(WEFT_ECANCELED, "%s: task cancelled", fn);
    if ((status = weft__task_may_suspend(fn)))
        return status;
    weft__lock_acquire(&ch->lock);
    status = send_locked(ch, item);
    if (status == WEFT_EAGAIN) {
        weft__waiter_init(&w, WEFT__WAITS_SEND);
        w.data = (void *)item; /* only ever read */
        weft__waitq_push(&ch->senders, &w);
        /* WEFT_OK: a receiver took the item; ECLOSED: closed meanwhile. */
        status = weft__waitq_park_until(&ch->senders, &w, &ch->lock, true, deadline);
    } else {
        weft__lock_release(&ch->lock);
    }
    if (status == WEFT_ECLOSED)
        return weft__fail(status, "%s: channel is closed", fn);
    if (status != WEFT_OK)
        return weft__wait_fail(status, fn);
    return WEFT_OK;
}

int weft_chan_send(weft_chan *ch, const void *item)
{
    return chan_send(ch, item, WEFT_FOREVER, "weft_chan_send");
}

int weft_chan_send_until(weft_chan *ch, const void *item, uint64_t deadline_ns)
{
    return chan_send(ch, item, deadline_ns, "weft_chan_send_until");
}

static int chan_recv(weft_chan *ch, void *item, uint64_t deadline, const char *fn)
{
    weft__waiter w;
    int status;

    if (ch == NULL)
        return weft__fail(WEFT_EINVAL, "%s: ch is NULL", fn);
    if (item == NULL)
        return weft__fail(WEFT_EINVAL, "%s: item is NULL", fn);
    if (weft_cancelled())
        return weft__fail(WEFT_ECANCELED, "%s: task cancelled", fn);
    if ((status = weft__task_may_suspend(fn)))
        return status;
    weft__lock_acquire(&ch->lock);
    status = recv_locked(ch, item);
    if (status == WEFT_EAGAIN) {
        weft__waiter_init(&w, WEFT__WAITS_RECV);
        w.data = item;
        weft__waitq_push(&ch->receivers, &w);
        /* WEFT_OK: a sender copied its item in; ECLOSED: closed meanwhile. */
        status = weft__waitq_park_until(&ch->receivers, &w, &ch->lock, true, deadline);
    } else {
        weft__lock_release(&ch->lock);
    }
    if (status == WEFT_ECLOSED)
        return weft__fail(status, "%s: channel is closed and drained", fn);
    if (status != WEFT_OK)
        return weft__wait_fail(status, fn);
    return WEFT_OK;
}

int weft_chan_recv(weft_chan *ch, void *item)
{
    return chan_recv(ch, item, WEFT_FOREVER, "weft_chan_recv");
}

int weft_chan_recv_until(weft_chan *ch, void *item, uint64_t deadline_ns)
{
    return chan_recv(ch, item, deadline_ns, "weft_chan_recv_until");
}

int weft_chan_trysend(weft_chan *ch, const void *item)
{
    int status;

    if (ch == NULL)
        return weft__fail(WEFT_EINVAL, "weft_chan_trysend: ch is NULL");
    if (item == NULL)
        return weft__fail(WEFT_EINVAL, "weft_chan_trysend: item is NULL");
    weft__lock_acquire(&ch->lock);
    status = send_locked(ch, item);
    weft__lock_release(&ch->lock);
    if (status == WEFT_ECLOSED)
        return weft__fail(status, "weft_chan_trysend: channel is closed");
    if (status == WEFT_EAGAIN)
        return weft__fail(status, "weft_chan_trysend: no room and no receiver waiting");
    return WEFT_OK;
}

int weft_chan_tryrecv(weft_chan *ch, void *item)
{
    int status;

    if (ch == NULL)
        return weft__fail(WEFT_EINVAL, "weft_chan_tryrecv: ch is NULL");
    if (item == NULL)
        return weft__fail(WEFT_EINVAL, "weft_chan_tryrecv: item is NULL");
    weft__lock_acquire(&ch->lock);
    status = recv_locked(ch, item);
    weft__lock_release(&ch->lock);
    if (status == WEFT_ECLOSED)
        return weft__fail(status, "weft_chan_tryrecv: channel is closed and drained");
    if (status == WEFT_EAGAIN)
        return weft__fail(status, "weft_chan_tryrecv: no item and no sender waiting");
    return WEFT_OK;
}

int weft_chan_close(weft_chan *ch)
{
    bool was_closed;

    if (ch == NULL)
        return weft__fail(WEFT_EINVAL, "weft_chan_close: ch is NULL");
    weft__lock_acquire(&ch->lock);
    was_closed = ch->closed;
    if (!was_closed) {
        ch->closed = true;
        weft__waitq_fire_all(&ch->senders, WEFT_ECLOSED);
        weft__waitq_fire_all(&ch->receivers, WEFT_ECLOSED);
    }
    weft__lock_release(&ch->lock);
    if (was_closed)
        return weft__fail(WEFT_ECLOSED, "weft_chan_close: channel already closed");
    return WEFT_OK;
}
