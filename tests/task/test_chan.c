/*
 * test_chan.c - channels: FIFO delivery with none lost or duplicated under
 * many producers and consumers, unbuffered rendezvous, close, the try-calls,
 * plain threads as both ends, cancellation of blocked ends, bad arguments.
 *
 * Public API only. "Blocked" is reached by a flag set just before the call
 * plus a short sleep; the checks that matter hold whether or not the task
 * was already blocked when the test acted.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "weft.h"
#include "weft_test.h"

#define NOT_RUN 1 /* a status slot of a task that never ran */


/* One end of a channel operation, run in a task or a thread. */
typedef struct op {
    weft_chan *ch;
    uint64_t item;
    int status;
    atomic_int started;
} op;

static void op_init(op *o, weft_chan *ch, uint64_t item)
{
    o->ch = ch;
    o->item = item;
    o->status = NOT_RUN;
    atomic_init(&o->started, 0);
}

static void *send_fn(void *arg)
{
    op *o = arg;

    atomic_store(&o->started, 1);
    o->status = weft_chan_send(o->ch, &o->item);
    return NULL;
}

static void *recv_fn(void *arg)
{
    op *o = arg;

    atomic_store(&o->started, 1);
    o->status = weft_chan_recv(o->ch, &o->item);
    return NULL;
}

static void *thread_send(void *arg)
{
    return send_fn(arg);
}

static void *thread_recv(void *arg)
{
    return recv_fn(arg);
}

/* ---- many producers, many consumers ------------------------------------ */

enum { NPROD = 8, NCONS = 8, PER_PROD = 125000, TOTAL = NPROD * PER_PROD };

static struct {
    weft_chan *ch;
    uint64_t per_prod;
    _Atomic uint64_t seen[(TOTAL + 63) / 64];
    atomic_long received, dups, order_errors, bad, send_errors;
} mpmc;

static void *producer_fn(void *arg)
{
    uint64_t p = (uintptr_t)arg;

    for (uint64_t seq = 0; seq < mpmc.per_prod; seq++) {
        uint64_t item = p << 32 | seq;

        if (weft_chan_send(mpmc.ch, &item) != WEFT_OK) {
            atomic_fetch_add(&mpmc.send_errors, 1);
            break;
        }
    }
    return NULL;
}

static void *consumer_fn(void *arg)
{
    int64_t last[NPROD];
    long count = 0;
    uint64_t item;
    int status;

    (void)arg;
    for (int p = 0; p < NPROD; p++)
        last[p] = -1;
    while ((status = weft_chan_recv(mpmc.ch, &item)) == WEFT_OK) {
        uint64_t p = item >> 32, seq = item & 0xffffffffu, idx, bit;

        if (p >= NPROD || seq >= mpmc.per_prod) {
            atomic_fetch_add(&mpmc.bad, 1);
            continue;
        }
        idx = p * mpmc.per_prod + seq;
        bit = UINT64_C(1) << (idx % 64);
        if (atomic_fetch_or_explicit(&mpmc.seen[idx / 64], bit, memory_order_relaxed) & bit)
            atomic_fetch_add(&mpmc.dups, 1);
        if ((int64_t)seq <= last[p])
            atomic_fetch_add(&mpmc.order_errors, 1);
        last[p] = (int64_t)seq;
        count++;
    }
    if (status != WEFT_ECLOSED)
        atomic_fetch_add(&mpmc.bad, 1);
    atomic_fetch_add(&mpmc.received, count);
    return NULL;
}

static void mpmc_run(weft_runtime *rt, size_t capacity, uint64_t per_prod)
{
    weft_task *prod[NPROD], *cons[NCONS];
    long missing = 0;

    memset(&mpmc, 0, sizeof(mpmc));
    mpmc.per_prod = per_prod;
    assert_int_equal(weft_chan_create(&mpmc.ch, sizeof(uint64_t), capacity), WEFT_OK);
    for (int i = 0; i < NCONS; i++)
        cons[i] = spawn(rt, consumer_fn, NULL);
    for (uintptr_t i = 0; i < NPROD; i++)
        prod[i] = spawn(rt, producer_fn, (void *)i);
    for (int i = 0; i < NPROD; i++)
        assert_int_equal(weft_join(prod[i], NULL), WEFT_OK);
    assert_int_equal(weft_chan_close(mpmc.ch), WEFT_OK);
    for (int i = 0; i < NCONS; i++)
        assert_int_equal(weft_join(cons[i], NULL), WEFT_OK);

    for (size_t i = 0; i < NPROD * per_prod; i++)
        if (!(atomic_load(&mpmc.seen[i / 64]) >> (i % 64) & 1))
            missing++;
    assert_int_equal(atomic_load(&mpmc.send_errors), 0);
    assert_int_equal(atomic_load(&mpmc.bad), 0);
    assert_int_equal(atomic_load(&mpmc.dups), 0);
    assert_int_equal(missing, 0);
    assert_int_equal(atomic_load(&mpmc.order_errors), 0);
    assert_int_equal(atomic_load(&mpmc.received), NPROD * per_prod);
    assert_int_equal(weft_chan_destroy(mpmc.ch), WEFT_OK);
}

static void test_chan_mpmc_million_items_none_lost_or_duplicated(void **state)
{
    mpmc_run(*state, 1024, PER_PROD);
}

/* A small ring makes senders and receivers wait and hand off constantly
 * (200,000 items). */
static void test_chan_mpmc_small_ring_keeps_fifo_per_producer(void **state)
{
    mpmc_run(*state, 4, PER_PROD / 5);
}

/* ---- unbuffered rendezvous --------------------------------------------- */

static void test_chan_unbuffered_send_waits_for_receiver(void **state)
{
    weft_chan *ch;
    op s;
    weft_task *t;
    uint64_t got = 0;

    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 0), WEFT_OK);
    op_init(&s, ch, 42);
    t = spawn(*state, send_fn, &s);
    wait_flag(&s.started);
    sleep_ms(20);
    assert_int_equal(s.status, NOT_RUN); /* still waiting: nobody received */
    assert_int_equal(weft_chan_recv(ch, &got), WEFT_OK);
    assert_int_equal(got, 42);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(s.status, WEFT_OK);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

static void test_chan_unbuffered_try_calls_need_a_waiting_peer(void **state)
{
    weft_chan *ch;
    uint64_t x = 7;
    op r;
    weft_task *t;

    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 0), WEFT_OK);
    assert_int_equal(weft_chan_trysend(ch, &x), WEFT_EAGAIN);
    assert_int_equal(weft_chan_tryrecv(ch, &x), WEFT_EAGAIN);

    /* With a receiver waiting, trysend hands the item straight to it. */
    op_init(&r, ch, 0);
    t = spawn(*state, recv_fn, &r);
    wait_flag(&r.started);
    while (weft_chan_trysend(ch, &x) == WEFT_EAGAIN)
        sleep_ms(1);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(r.status, WEFT_OK);
    assert_int_equal(r.item, 7);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

enum { PINGS = 20000 };

static void *ping_fn(void *arg)
{
    weft_chan **chs = arg; /* [0]: to the peer, [1]: from the peer */

    for (uint64_t i = 0; i < PINGS; i++) {
        uint64_t back = 0;

        if (weft_chan_send(chs[0], &i) != WEFT_OK || weft_chan_recv(chs[1], &back) != WEFT_OK ||
            back != i + 1)
            return (void *)1;
    }
    return NULL;
}

static void *pong_fn(void *arg)
{
    weft_chan **chs = arg;

    for (uint64_t i = 0; i < PINGS; i++) {
        uint64_t v = 0;

        if (weft_chan_recv(chs[0], &v) != WEFT_OK || v != i)
            return (void *)1;
        v++;
        if (weft_chan_send(chs[1], &v) != WEFT_OK)
            return (void *)1;
    }
    return NULL;
}

static void test_chan_unbuffered_ping_pong_between_tasks(void **state)
{
    weft_chan *chs[2];
    weft_task *a, *b;
    void *ra = (void *)2, *rb = (void *)2;

    assert_int_equal(weft_chan_create(&chs[0], sizeof(uint64_t), 0), WEFT_OK);
    assert_int_equal(weft_chan_create(&chs[1], sizeof(uint64_t), 0), WEFT_OK);
    a = spawn(*state, ping_fn, chs);
    b = spawn(*state, pong_fn, chs);
    assert_int_equal(weft_join(a, &ra), WEFT_OK);
    assert_int_equal(weft_join(b, &rb), WEFT_OK);
    assert_null(ra);
    assert_null(rb);
    assert_int_equal(weft_chan_destroy(chs[0]), WEFT_OK);
    assert_int_equal(weft_chan_destroy(chs[1]), WEFT_OK);
}

/* ---- plain threads ------------------------------------------------------ */

static void test_chan_plain_threads_block_and_are_woken_by_tasks(void **state)
{
    weft_chan *ch;
    pthread_t th;
    op r, s;
    weft_task *t;

    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 0), WEFT_OK);

    /* A thread waits to receive; a task sends. */
    op_init(&r, ch, 0);
    op_init(&s, ch, 11);
    assert_int_equal(pthread_create(&th, NULL, thread_recv, &r), 0);
    wait_flag(&r.started);
    sleep_ms(10);
    t = spawn(*state, send_fn, &s);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(s.status, WEFT_OK);
    assert_int_equal(r.status, WEFT_OK);
    assert_int_equal(r.item, 11);

    /* A thread waits to send; a task receives. */
    op_init(&r, ch, 0);
    op_init(&s, ch, 12);
    assert_int_equal(pthread_create(&th, NULL, thread_send, &s), 0);
    wait_flag(&s.started);
    sleep_ms(10);
    t = spawn(*state, recv_fn, &r);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(s.status, WEFT_OK);
    assert_int_equal(r.status, WEFT_OK);
    assert_int_equal(r.item, 12);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

/* ---- close ------------------------------------------------------------- */

static void test_chan_close_drains_buffer_then_reports_closed(void **state)
{
    weft_chan *ch;
    uint64_t x;

    (void)state;
    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 4), WEFT_OK);
    for (x = 1; x <= 3; x++)
        assert_int_equal(weft_chan_send(ch, &x), WEFT_OK);
    assert_int_equal(weft_chan_close(ch), WEFT_OK);
    assert_int_equal(weft_chan_send(ch, &x), WEFT_ECLOSED);
    assert_int_equal(weft_chan_trysend(ch, &x), WEFT_ECLOSED);
    assert_non_null(strstr(weft_last_error(), "weft_chan_trysend"));
    assert_int_equal(weft_chan_recv(ch, &x), WEFT_OK);
    assert_int_equal(x, 1);
    assert_int_equal(weft_chan_tryrecv(ch, &x), WEFT_OK);
    assert_int_equal(x, 2);
    assert_int_equal(weft_chan_recv(ch, &x), WEFT_OK);
    assert_int_equal(x, 3);
    assert_int_equal(weft_chan_recv(ch, &x), WEFT_ECLOSED);
    assert_int_equal(weft_chan_tryrecv(ch, &x), WEFT_ECLOSED);
    assert_int_equal(weft_chan_close(ch), WEFT_ECLOSED); /* closing twice */
    assert_non_null(strstr(weft_last_error(), "weft_chan_close"));
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

enum { BLOCKED = 4 };

static void test_chan_close_fails_blocked_senders_keeps_buffered_item(void **state)
{
    weft_chan *ch;
    op s[BLOCKED];
    weft_task *t[BLOCKED];
    uint64_t x = 100;

    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 1), WEFT_OK);
    assert_int_equal(weft_chan_send(ch, &x), WEFT_OK); /* now full */
    for (int i = 0; i < BLOCKED; i++) {
        op_init(&s[i], ch, (uint64_t)i);
        t[i] = spawn(*state, send_fn, &s[i]);
    }
    for (int i = 0; i < BLOCKED; i++)
        wait_flag(&s[i].started);
    sleep_ms(20);
    assert_int_equal(weft_chan_close(ch), WEFT_OK);
    for (int i = 0; i < BLOCKED; i++) {
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
        assert_int_equal(s[i].status, WEFT_ECLOSED);
    }
    assert_int_equal(weft_chan_recv(ch, &x), WEFT_OK);
    assert_int_equal(x, 100);
    assert_int_equal(weft_chan_recv(ch, &x), WEFT_ECLOSED);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

static void test_chan_close_fails_blocked_receivers_and_unbuffered_senders(void **state)
{
    weft_chan *ch;
    op o[BLOCKED];
    weft_task *t[BLOCKED];

    /* Receivers on an empty channel. */
    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 2), WEFT_OK);
    for (int i = 0; i < BLOCKED; i++) {
        op_init(&o[i], ch, 0);
        t[i] = spawn(*state, recv_fn, &o[i]);
    }
    for (int i = 0; i < BLOCKED; i++)
        wait_flag(&o[i].started);
    sleep_ms(20);
    assert_int_equal(weft_chan_close(ch), WEFT_OK);
    for (int i = 0; i < BLOCKED; i++) {
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
        assert_int_equal(o[i].status, WEFT_ECLOSED);
    }
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);

    /* Senders on an unbuffered channel: their items are not delivered. */
    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 0), WEFT_OK);
    for (int i = 0; i < BLOCKED; i++) {
        op_init(&o[i], ch, (uint64_t)i);
        t[i] = spawn(*state, send_fn, &o[i]);
    }
    for (int i = 0; i < BLOCKED; i++)
        wait_flag(&o[i].started);
    sleep_ms(20);
    assert_int_equal(weft_chan_close(ch), WEFT_OK);
    for (int i = 0; i < BLOCKED; i++) {
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
        assert_int_equal(o[i].status, WEFT_ECLOSED);
    }
    assert_int_equal(weft_chan_tryrecv(ch, &o[0].item), WEFT_ECLOSED);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

/* ---- try-calls --------------------------------------------------------- */

static void test_chan_try_calls_report_full_and_empty(void **state)
{
    weft_chan *ch;
    uint64_t x;

    (void)state;
    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 2), WEFT_OK);
    assert_int_equal(weft_chan_tryrecv(ch, &x), WEFT_EAGAIN);
    assert_non_null(strstr(weft_last_error(), "weft_chan_tryrecv"));
    x = 1;
    assert_int_equal(weft_chan_trysend(ch, &x), WEFT_OK);
    x = 2;
    assert_int_equal(weft_chan_trysend(ch, &x), WEFT_OK);
    x = 3;
    assert_int_equal(weft_chan_trysend(ch, &x), WEFT_EAGAIN);
    assert_non_null(strstr(weft_last_error(), "weft_chan_trysend"));
    assert_int_equal(weft_chan_tryrecv(ch, &x), WEFT_OK);
    assert_int_equal(x, 1);
    x = 3; /* the ring wraps around */
    assert_int_equal(weft_chan_trysend(ch, &x), WEFT_OK);
    assert_int_equal(weft_chan_tryrecv(ch, &x), WEFT_OK);
    assert_int_equal(x, 2);
    assert_int_equal(weft_chan_tryrecv(ch, &x), WEFT_OK);
    assert_int_equal(x, 3);
    assert_int_equal(weft_chan_tryrecv(ch, &x), WEFT_EAGAIN);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

static void test_chan_items_of_odd_size_are_copied_whole(void **state)
{
    unsigned char in[3][37], out[37];
    weft_chan *ch;

    (void)state;
    assert_int_equal(weft_chan_create(&ch, sizeof(in[0]), 2), WEFT_OK);
    for (int i = 0; i < 3; i++)
        memset(in[i], 'a' + i, sizeof(in[i]));
    assert_int_equal(weft_chan_send(ch, in[0]), WEFT_OK);
    assert_int_equal(weft_chan_send(ch, in[1]), WEFT_OK);
    assert_int_equal(weft_chan_recv(ch, out), WEFT_OK);
    assert_memory_equal(out, in[0], sizeof(out));
    assert_int_equal(weft_chan_send(ch, in[2]), WEFT_OK);
    assert_int_equal(weft_chan_recv(ch, out), WEFT_OK);
    assert_memory_equal(out, in[1], sizeof(out));
    assert_int_equal(weft_chan_recv(ch, out), WEFT_OK);
    assert_memory_equal(out, in[2], sizeof(out));
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

/* ---- cancellation ------------------------------------------------------- */

static void test_chan_cancelled_receiver_fails_and_item_goes_to_next(void **state)
{
    weft_chan *ch;
    op r1, r2;
    weft_task *t1, *t2;
    uint64_t x = 77;
    int st;

    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 0), WEFT_OK);
    op_init(&r1, ch, 0);
    op_init(&r2, ch, 0);
    t1 = spawn(*state, recv_fn, &r1);
    wait_flag(&r1.started);
    sleep_ms(10);
    t2 = spawn(*state, recv_fn, &r2);
    wait_flag(&r2.started);
    sleep_ms(10);
    assert_int_equal(weft_cancel(t1), WEFT_OK);
    st = weft_join(t1, NULL);
    assert_int_equal(st, WEFT_ETASKCANCELED);
    assert_int_equal(r1.status, WEFT_ECANCELED);
    assert_int_equal(weft_chan_send(ch, &x), WEFT_OK);
    assert_int_equal(weft_join(t2, NULL), WEFT_OK);
    assert_int_equal(r2.status, WEFT_OK);
    assert_int_equal(r2.item, 77);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

static void test_chan_cancelled_sender_fails_and_its_item_is_not_sent(void **state)
{
    weft_chan *ch;
    op s;
    weft_task *t;
    uint64_t x = 1;

    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 1), WEFT_OK);
    assert_int_equal(weft_chan_send(ch, &x), WEFT_OK);
    op_init(&s, ch, 2);
    t = spawn(*state, send_fn, &s);
    wait_flag(&s.started);
    sleep_ms(10);
    assert_int_equal(weft_cancel(t), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_ETASKCANCELED);
    assert_int_equal(s.status, WEFT_ECANCELED);
    assert_int_equal(weft_chan_recv(ch, &x), WEFT_OK);
    assert_int_equal(x, 1);
    assert_int_equal(weft_chan_tryrecv(ch, &x), WEFT_EAGAIN);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

/* Cancel a receiver (and every other time the sender) while they meet.
 * Whatever wins, the item is delivered at most once, and exactly once when
 * the sender reports success. */
static void race_cancel(weft_runtime *rt, size_t capacity)
{
    for (unsigned i = 0; i < 300; i++) {
        weft_chan *ch;
        op r, s;
        weft_task *tr, *ts;
        uint64_t drained;
        int delivered = 0, st;

        assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), capacity), WEFT_OK);
        op_init(&r, ch, 0);
        op_init(&s, ch, 1000 + i);
        tr = spawn(rt, recv_fn, &r);
        ts = spawn(rt, send_fn, &s);
        for (volatile unsigned spin = 0; spin < (i % 16) * 500; spin++)
            ;
        assert_int_equal(weft_cancel(tr), WEFT_OK);
        if (i & 1)
            assert_int_equal(weft_cancel(ts), WEFT_OK);
        st = weft_join(tr, NULL);
        assert_true(st == WEFT_OK || st == WEFT_ETASKCANCELED);
        assert_int_equal(weft_chan_close(ch), WEFT_OK); /* frees a blocked sender */
        st = weft_join(ts, NULL);
        assert_true(st == WEFT_OK || st == WEFT_ETASKCANCELED);

        assert_true(r.status == NOT_RUN || r.status == WEFT_OK || r.status == WEFT_ECANCELED);
        if (r.status == WEFT_OK) {
            assert_int_equal(r.item, 1000 + i);
            delivered++;
        }
        while (weft_chan_tryrecv(ch, &drained) == WEFT_OK) {
            assert_int_equal(drained, 1000 + i);
            delivered++;
        }
        if (s.status == WEFT_OK)
            assert_int_equal(delivered, 1);
        else
            assert_int_equal(delivered, 0);
        assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
    }
}

static void test_chan_cancel_racing_delivery_never_loses_or_duplicates(void **state)
{
    race_cancel(*state, 0);
    race_cancel(*state, 1);
}

/* Many senders wait; half are cancelled while a thread receives. Exactly
 * the items of the senders that report success arrive, each once. */
enum { CROWD = 16, PREFILL = 999 };

typedef struct drain {
    weft_chan *ch;
    int got[CROWD + 1]; /* [CROWD]: the prefilled item */
    int bad;
} drain;

static void *drain_thread(void *arg)
{
    drain *d = arg;
    uint64_t x;

    while (weft_chan_recv(d->ch, &x) == WEFT_OK) {
        if (x == PREFILL)
            d->got[CROWD]++;
        else if (x < CROWD)
            d->got[x]++;
        else
            d->bad++;
    }
    return NULL;
}

static void crowd_of_senders(weft_runtime *rt, size_t capacity)
{
    for (unsigned iter = 0; iter < 40; iter++) {
        op s[CROWD];
        weft_task *t[CROWD];
        drain d = {0};
        pthread_t th;
        uint64_t x = PREFILL;

        assert_int_equal(weft_chan_create(&d.ch, sizeof(uint64_t), capacity), WEFT_OK);
        if (capacity > 0)
            assert_int_equal(weft_chan_send(d.ch, &x), WEFT_OK); /* full */
        for (int i = 0; i < CROWD; i++) {
            op_init(&s[i], d.ch, (uint64_t)i);
            t[i] = spawn(rt, send_fn, &s[i]);
        }
        for (int i = 0; i < CROWD; i++)
            wait_flag(&s[i].started);
        assert_int_equal(pthread_create(&th, NULL, drain_thread, &d), 0);
        for (int i = (int)(iter % 2); i < CROWD; i += 2)
            assert_int_equal(weft_cancel(t[i]), WEFT_OK);
        for (int i = 0; i < CROWD; i++)
            weft_join(t[i], NULL);
        assert_int_equal(weft_chan_close(d.ch), WEFT_OK);
        assert_int_equal(pthread_join(th, NULL), 0);

        assert_int_equal(d.bad, 0);
        assert_int_equal(d.got[CROWD], capacity > 0 ? 1 : 0);
        for (int i = 0; i < CROWD; i++) {
            assert_true(s[i].status == WEFT_OK || s[i].status == WEFT_ECANCELED);
            assert_int_equal(d.got[i], s[i].status == WEFT_OK ? 1 : 0);
        }
        assert_int_equal(weft_chan_destroy(d.ch), WEFT_OK);
    }
}

/* Many receivers wait; half are cancelled while a thread sends one item
 * per receiver left. Every item sent is received once or stays buffered. */
typedef struct feed {
    weft_chan *ch;
    int n, failed;
} feed;

static void *feed_thread(void *arg)
{
    feed *f = arg;

    for (uint64_t i = 0; i < (uint64_t)f->n; i++)
        if (weft_chan_send(f->ch, &i) != WEFT_OK)
            f->failed++;
    return NULL;
}

static void crowd_of_receivers(weft_runtime *rt, size_t capacity)
{
    for (unsigned iter = 0; iter < 40; iter++) {
        op r[CROWD];
        weft_task *t[CROWD];
        int got[CROWD] = {0};
        feed f = {.n = CROWD / 2};
        pthread_t th;
        uint64_t x;

        assert_int_equal(weft_chan_create(&f.ch, sizeof(uint64_t), capacity), WEFT_OK);
        for (int i = 0; i < CROWD; i++) {
            op_init(&r[i], f.ch, UINT64_MAX);
            t[i] = spawn(rt, recv_fn, &r[i]);
        }
        for (int i = 0; i < CROWD; i++)
            wait_flag(&r[i].started);
        assert_int_equal(pthread_create(&th, NULL, feed_thread, &f), 0);
        for (int i = (int)(iter % 2); i < CROWD; i += 2)
            assert_int_equal(weft_cancel(t[i]), WEFT_OK);
        assert_int_equal(pthread_join(th, NULL), 0); /* enough live receivers */
        assert_int_equal(f.failed, 0);
        assert_int_equal(weft_chan_close(f.ch), WEFT_OK);
        for (int i = 0; i < CROWD; i++)
            weft_join(t[i], NULL);

        for (int i = 0; i < CROWD; i++) {
            if (r[i].status == WEFT_OK) {
                assert_true(r[i].item < (uint64_t)f.n);
                got[r[i].item]++;
            } else {
                assert_true(r[i].status == WEFT_ECANCELED || r[i].status == WEFT_ECLOSED ||
                            r[i].status == NOT_RUN);
            }
        }
        while (weft_chan_tryrecv(f.ch, &x) == WEFT_OK) {
            assert_true(x < (uint64_t)f.n);
            got[x]++;
        }
        for (int i = 0; i < f.n; i++)
            assert_int_equal(got[i], 1);
        assert_int_equal(weft_chan_destroy(f.ch), WEFT_OK);
    }
}

static void test_chan_cancel_in_a_crowd_of_waiters_loses_nothing(void **state)
{
    crowd_of_senders(*state, 0);
    crowd_of_senders(*state, 1);
    crowd_of_receivers(*state, 0);
    crowd_of_receivers(*state, 1);
}

/* ---- bad arguments ----------------------------------------------------- */

static void test_chan_bad_arguments_are_einval(void **state)
{
    weft_chan *ch = (weft_chan *)&ch;
    uint64_t x = 0;

    (void)state;
    assert_int_equal(weft_chan_create(NULL, 8, 1), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "weft_chan_create"));
    assert_int_equal(weft_chan_create(&ch, 0, 1), WEFT_EINVAL);
    assert_null(ch);
    assert_int_equal(weft_chan_create(&ch, SIZE_MAX, 0), WEFT_EINVAL);
    assert_int_equal(weft_chan_create(&ch, 2, SIZE_MAX), WEFT_EINVAL);
    assert_int_equal(weft_chan_create(&ch, SIZE_MAX / 4, 8), WEFT_EINVAL);
    assert_null(ch);

    assert_int_equal(weft_chan_destroy(NULL), WEFT_EINVAL);
    assert_int_equal(weft_chan_send(NULL, &x), WEFT_EINVAL);
    assert_int_equal(weft_chan_recv(NULL, &x), WEFT_EINVAL);
    assert_int_equal(weft_chan_trysend(NULL, &x), WEFT_EINVAL);
    assert_int_equal(weft_chan_tryrecv(NULL, &x), WEFT_EINVAL);
    assert_int_equal(weft_chan_close(NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "weft_chan_close"));

    assert_int_equal(weft_chan_create(&ch, sizeof(x), 1), WEFT_OK);
    assert_int_equal(weft_chan_send(ch, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "item"));
    assert_int_equal(weft_chan_recv(ch, NULL), WEFT_EINVAL);
    assert_int_equal(weft_chan_trysend(ch, NULL), WEFT_EINVAL);
    assert_int_equal(weft_chan_tryrecv(ch, NULL), WEFT_EINVAL);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

static void test_chan_destroy_with_waiters_is_estate(void **state)
{
    weft_chan *ch;
    op r;
    weft_task *t;

    assert_int_equal(weft_chan_create(&ch, sizeof(uint64_t), 1), WEFT_OK);
    op_init(&r, ch, 0);
    t = spawn(*state, recv_fn, &r);
    wait_flag(&r.started);
    sleep_ms(50);
    assert_int_equal(weft_chan_destroy(ch), WEFT_ESTATE);
    assert_non_null(strstr(weft_last_error(), "weft_chan_destroy"));
    assert_int_equal(weft_chan_close(ch), WEFT_OK); /* still usable */
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(r.status, WEFT_ECLOSED);
    assert_int_equal(weft_chan_destroy(ch), WEFT_OK);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_rt, teardown_rt)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_chan_mpmc_million_items_none_lost_or_duplicated),
        T(test_chan_mpmc_small_ring_keeps_fifo_per_producer),
        T(test_chan_unbuffered_send_waits_for_receiver),
        T(test_chan_unbuffered_try_calls_need_a_waiting_peer),
        T(test_chan_unbuffered_ping_pong_between_tasks),
        T(test_chan_plain_threads_block_and_are_woken_by_tasks),
        T(test_chan_close_drains_buffer_then_reports_closed),
        T(test_chan_close_fails_blocked_senders_keeps_buffered_item),
        T(test_chan_close_fails_blocked_receivers_and_unbuffered_senders),
        T(test_chan_try_calls_report_full_and_empty),
        T(test_chan_items_of_odd_size_are_copied_whole),
        T(test_chan_cancelled_receiver_fails_and_item_goes_to_next),
        T(test_chan_cancelled_sender_fails_and_its_item_is_not_sent),
        T(test_chan_cancel_racing_delivery_never_loses_or_duplicates),
        T(test_chan_cancel_in_a_crowd_of_waiters_loses_nothing),
        T(test_chan_bad_arguments_are_einval),
        T(test_chan_destroy_with_waiters_is_estate),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
