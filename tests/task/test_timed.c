/*
 * test_timed.c - the _until forms of every wait: each times out with
 * WEFT_ETIMEDOUT, never before its deadline, when nothing comes; succeeds
 * when what it waits for comes in time; a past deadline makes it a try; and
 * a waiter that timed out took nothing and keeps nothing from the next
 * waiter (the lock, permit, wake-up or item goes on, or stays available).
 * Each scenario runs once from the main thread and once from a task.
 *
 * Timings are bounds that cannot flake: a timed-out call must not return
 * before its deadline, and "in time" means within seconds. Scenarios run in
 * a task or a thread, so they report the line of a failed check instead of
 * asserting (cmocka's longjmp must not leave a fiber).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "weft.h"
#include "weft_test.h"

#define MS 1000000ull
#define SHORT (20 * MS)   /* a deadline meant to pass */
#define LONG (10000 * MS) /* a deadline meant not to */
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            return __LINE__;                                                                       \
    } while (0)

typedef int (*scenario)(weft_runtime *rt);

/* ---- running a scenario from a thread and from a task ------------------ */

typedef struct run {
    scenario fn;
    weft_runtime *rt;
    int line;
} run;

static void *run_task(void *arg)
{
    run *r = arg;
    r->line = r->fn(r->rt);
    return NULL;
}

static void both(weft_runtime *rt, scenario fn)
{
    run r = {fn, rt, -1};

    assert_int_equal(fn(rt), 0); /* from the main thread */
    weft_task *t = spawn(rt, run_task, &r);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(r.line, 0); /* from a task */
}

/* Pause a little in a task or a thread alike. */
static void pause_ms(unsigned ms)
{
    if (weft_task_current())
        weft_sleep_ns(ms * MS);
    else
        sleep_ms(ms);
}

static void wait_for(atomic_int *flag)
{
    while (!atomic_load(flag))
        pause_ms(1);
}

static bool timed_out(int rc, uint64_t deadline)
{
    return rc == WEFT_ETIMEDOUT && weft_now_ns() >= deadline;
}

/* ---- helpers that run as tasks ------------------------------------------ */

typedef struct helper {
    weft_mutex *m;
    weft_cond *c;
    weft_sem *s;
    weft_chan *ch;
    unsigned delay_ms; /* before acting */
    int item;
    int status;
    atomic_int ready; /* set once it holds the mutex / is about to wait */
    atomic_int go;    /* for the holder: let the mutex go */
    atomic_int flag;  /* for cond: the predicate */
} helper;

static weft_task *start(weft_runtime *rt, void *(*fn)(void *), helper *h)
{
    h->status = 1;
    return spawn(rt, fn, h);
}

static void *post_later(void *arg)
{
    helper *h = arg;
    weft_sleep_ns(h->delay_ms * MS);
    h->status = weft_sem_post(h->s);
    return NULL;
}

static void *sem_waiter(void *arg)
{
    helper *h = arg;
    weft_sleep_ns(h->delay_ms * MS);
    h->status = weft_sem_wait_until(h->s, weft_deadline_in_ns(LONG));
    return NULL;
}

/* Take the mutex, say so, hold it until go (or delay_ms), let it go. */
static void *holder(void *arg)
{
    helper *h = arg;
    h->status = weft_mutex_lock(h->m);
    atomic_store(&h->ready, 1);
    if (h->delay_ms)
        weft_sleep_ns(h->delay_ms * MS);
    else
        wait_for(&h->go);
    weft_mutex_unlock(h->m);
    return NULL;
}

static void *locker(void *arg)
{
    helper *h = arg;
    weft_sleep_ns(h->delay_ms * MS);
    h->status = weft_mutex_lock_until(h->m, weft_deadline_in_ns(LONG));
    if (h->status == WEFT_OK)
        weft_mutex_unlock(h->m);
    return NULL;
}

static void *signal_later(void *arg)
{
    helper *h = arg;
    weft_sleep_ns(h->delay_ms * MS);
    weft_mutex_lock(h->m);
    atomic_store(&h->flag, 1);
    h->status = weft_cond_signal(h->c);
    weft_mutex_unlock(h->m);
    return NULL;
}

/* Wait on the condition once; ready is set under the mutex, so whoever sees
 * it under the mutex knows this waiter is linked. */
static void *cond_waiter(void *arg)
{
    helper *h = arg;
    weft_sleep_ns(h->delay_ms * MS);
    weft_mutex_lock(h->m);
    atomic_store(&h->ready, 1);
    h->status = weft_cond_wait_until(h->c, h->m, weft_deadline_in_ns(LONG));
    weft_mutex_unlock(h->m);
    return NULL;
}

static void *send_later(void *arg)
{
    helper *h = arg;
    weft_sleep_ns(h->delay_ms * MS);
    h->status = weft_chan_send_until(h->ch, &h->item, weft_deadline_in_ns(LONG));
    return NULL;
}

static void *recv_later(void *arg)
{
    helper *h = arg;
    weft_sleep_ns(h->delay_ms * MS);
    h->item = -1;
    h->status = weft_chan_recv_until(h->ch, &h->item, weft_deadline_in_ns(LONG));
    return NULL;
}

/* ---- semaphore ---------------------------------------------------------- */

static int sem_times_out(weft_runtime *rt)
{
    (void)rt;
    weft_sem *s;
    CHECK(weft_sem_create(&s, 0) == WEFT_OK);
    uint64_t d = weft_deadline_in_ns(SHORT);
    CHECK(timed_out(weft_sem_wait_until(s, d), d));
    CHECK(weft_sem_wait_until(s, 0) == WEFT_ETIMEDOUT); /* past: a try */
    CHECK(weft_sem_trywait(s) == WEFT_EAGAIN);          /* nothing appeared */
    CHECK(weft_sem_post(s) == WEFT_OK);
    CHECK(weft_sem_wait_until(s, 0) == WEFT_OK); /* a try that can */
    CHECK(weft_sem_destroy(s) == WEFT_OK);       /* no waiter left linked */
    return 0;
}

static int sem_in_time(weft_runtime *rt)
{
    weft_sem *s;
    helper h = {.delay_ms = 20};
    CHECK(weft_sem_create(&s, 0) == WEFT_OK);
    h.s = s;
    weft_task *t = start(rt, post_later, &h);
    CHECK(weft_sem_wait_until(s, weft_deadline_in_ns(LONG)) == WEFT_OK);
    CHECK(weft_join(t, NULL) == WEFT_OK && h.status == WEFT_OK);
    CHECK(weft_sem_trywait(s) == WEFT_EAGAIN);
    CHECK(weft_sem_destroy(s) == WEFT_OK);
    return 0;
}

/* This waiter times out ahead of a later one; the next post goes to it. */
static int sem_loses_nothing(weft_runtime *rt)
{
    weft_sem *s;
    helper b = {.delay_ms = 5};
    CHECK(weft_sem_create(&s, 0) == WEFT_OK);
    b.s = s;
    weft_task *t = start(rt, sem_waiter, &b);
    uint64_t d = weft_deadline_in_ns(3 * SHORT);
    CHECK(timed_out(weft_sem_wait_until(s, d), d));
    CHECK(weft_sem_post(s) == WEFT_OK);
    CHECK(weft_join(t, NULL) == WEFT_OK);
    CHECK(b.status == WEFT_OK);                /* the permit reached b */
    CHECK(weft_sem_trywait(s) == WEFT_EAGAIN); /* and only b */
    CHECK(weft_sem_post(s) == WEFT_OK);        /* a post with nobody left waiting */
    CHECK(weft_sem_trywait(s) == WEFT_OK);     /* stays available */
    CHECK(weft_sem_destroy(s) == WEFT_OK);
    return 0;
}

static void test_sem_until_times_out(void **state)
{
    both(*state, sem_times_out);
}

static void test_sem_until_succeeds_in_time(void **state)
{
    both(*state, sem_in_time);
}

static void test_sem_timed_out_waiter_loses_nothing(void **state)
{
    both(*state, sem_loses_nothing);
}

/* ---- mutex -------------------------------------------------------------- */

static int mutex_times_out(weft_runtime *rt)
{
    weft_mutex *m;
    helper h = {0};
    CHECK(weft_mutex_create(&m) == WEFT_OK);
    h.m = m;
    weft_task *t = start(rt, holder, &h);
    wait_for(&h.ready);
    uint64_t d = weft_deadline_in_ns(SHORT);
    CHECK(timed_out(weft_mutex_lock_until(m, d), d));
    CHECK(weft_mutex_lock_until(m, 0) == WEFT_ETIMEDOUT);
    CHECK(weft_mutex_unlock(m) == WEFT_EPERM); /* not held by us */
    atomic_store(&h.go, 1);
    CHECK(weft_join(t, NULL) == WEFT_OK && h.status == WEFT_OK);
    CHECK(weft_mutex_lock_until(m, 0) == WEFT_OK); /* free: a try takes it */
    CHECK(weft_mutex_unlock(m) == WEFT_OK);
    CHECK(weft_mutex_destroy(m) == WEFT_OK);
    return 0;
}

static int mutex_in_time(weft_runtime *rt)
{
    weft_mutex *m;
    helper h = {.delay_ms = 20};
    CHECK(weft_mutex_create(&m) == WEFT_OK);
    h.m = m;
    weft_task *t = start(rt, holder, &h);
    wait_for(&h.ready);
    CHECK(weft_mutex_lock_until(m, weft_deadline_in_ns(LONG)) == WEFT_OK);
    CHECK(weft_mutex_unlock(m) == WEFT_OK);
    CHECK(weft_join(t, NULL) == WEFT_OK);
    CHECK(weft_mutex_destroy(m) == WEFT_OK);
    return 0;
}

/* The unlock after this waiter timed out hands the mutex to the next one,
 * and once that one is done the mutex is free. */
static int mutex_loses_nothing(weft_runtime *rt)
{
    weft_mutex *m;
    helper h = {0}, b = {.delay_ms = 5};
    CHECK(weft_mutex_create(&m) == WEFT_OK);
    h.m = b.m = m;
    weft_task *th = start(rt, holder, &h);
    wait_for(&h.ready);
    weft_task *tb = start(rt, locker, &b);
    uint64_t d = weft_deadline_in_ns(3 * SHORT);
    CHECK(timed_out(weft_mutex_lock_until(m, d), d));
    atomic_store(&h.go, 1);
    CHECK(weft_join(th, NULL) == WEFT_OK);
    CHECK(weft_join(tb, NULL) == WEFT_OK);
    CHECK(b.status == WEFT_OK);
    CHECK(weft_mutex_trylock(m) == WEFT_OK); /* nobody kept it */
    CHECK(weft_mutex_unlock(m) == WEFT_OK);
    CHECK(weft_mutex_destroy(m) == WEFT_OK);
    return 0;
}

static void test_mutex_until_times_out(void **state)
{
    both(*state, mutex_times_out);
}

static void test_mutex_until_succeeds_in_time(void **state)
{
    both(*state, mutex_in_time);
}

static void test_mutex_timed_out_waiter_loses_nothing(void **state)
{
    both(*state, mutex_loses_nothing);
}

/* ---- condition variable ------------------------------------------------- */

static int cond_times_out(weft_runtime *rt)
{
    (void)rt;
    weft_mutex *m;
    weft_cond *c;
    CHECK(weft_mutex_create(&m) == WEFT_OK && weft_cond_create(&c) == WEFT_OK);
    CHECK(weft_mutex_lock(m) == WEFT_OK);
    uint64_t d = weft_deadline_in_ns(SHORT);
    CHECK(timed_out(weft_cond_wait_until(c, m, d), d));
    CHECK(weft_cond_wait_until(c, m, 0) == WEFT_ETIMEDOUT);
    CHECK(weft_mutex_unlock(m) == WEFT_OK); /* held again on return */
    CHECK(weft_cond_destroy(c) == WEFT_OK); /* no waiter left linked */
    CHECK(weft_mutex_destroy(m) == WEFT_OK);
    return 0;
}

static int cond_in_time(weft_runtime *rt)
{
    weft_mutex *m;
    weft_cond *c;
    helper h = {.delay_ms = 20};
    CHECK(weft_mutex_create(&m) == WEFT_OK && weft_cond_create(&c) == WEFT_OK);
    h.m = m;
    h.c = c;
    CHECK(weft_mutex_lock(m) == WEFT_OK);
    weft_task *t = start(rt, signal_later, &h);
    while (!atomic_load(&h.flag))
        CHECK(weft_cond_wait_until(c, m, weft_deadline_in_ns(LONG)) == WEFT_OK);
    CHECK(weft_mutex_unlock(m) == WEFT_OK);
    CHECK(weft_join(t, NULL) == WEFT_OK);
    CHECK(weft_cond_destroy(c) == WEFT_OK && weft_mutex_destroy(m) == WEFT_OK);
    return 0;
}

/* One signal after this waiter timed out wakes the other waiter. */
static int cond_loses_nothing(weft_runtime *rt)
{
    weft_mutex *m;
    weft_cond *c;
    helper b = {.delay_ms = 5};
    CHECK(weft_mutex_create(&m) == WEFT_OK && weft_cond_create(&c) == WEFT_OK);
    b.m = m;
    b.c = c;
    weft_task *t = start(rt, cond_waiter, &b);
    CHECK(weft_mutex_lock(m) == WEFT_OK);
    uint64_t d = weft_deadline_in_ns(3 * SHORT);
    CHECK(timed_out(weft_cond_wait_until(c, m, d), d));
    while (!atomic_load(&b.ready)) { /* b is linked once we see this under m */
        CHECK(weft_mutex_unlock(m) == WEFT_OK);
        pause_ms(1);
        CHECK(weft_mutex_lock(m) == WEFT_OK);
    }
    CHECK(weft_cond_signal(c) == WEFT_OK);
    CHECK(weft_mutex_unlock(m) == WEFT_OK);
    CHECK(weft_join(t, NULL) == WEFT_OK);
    CHECK(b.status == WEFT_OK); /* woken, not timed out after seconds */
    CHECK(weft_cond_destroy(c) == WEFT_OK && weft_mutex_destroy(m) == WEFT_OK);
    return 0;
}

static void test_cond_until_times_out(void **state)
{
    both(*state, cond_times_out);
}

static void test_cond_until_succeeds_in_time(void **state)
{
    both(*state, cond_in_time);
}

static void test_cond_timed_out_waiter_loses_nothing(void **state)
{
    both(*state, cond_loses_nothing);
}

/* ---- channels ----------------------------------------------------------- */

static int chan_times_out(weft_runtime *rt)
{
    (void)rt;
    weft_chan *ch;
    int v = 7;
    CHECK(weft_chan_create(&ch, sizeof(int), 0) == WEFT_OK);
    uint64_t d = weft_deadline_in_ns(SHORT);
    CHECK(timed_out(weft_chan_recv_until(ch, &v, d), d));
    d = weft_deadline_in_ns(SHORT);
    CHECK(timed_out(weft_chan_send_until(ch, &v, d), d));
    CHECK(weft_chan_tryrecv(ch, &v) == WEFT_EAGAIN); /* the item was not sent */
    CHECK(weft_chan_send_until(ch, &v, 0) == WEFT_ETIMEDOUT);
    CHECK(weft_chan_recv_until(ch, &v, 0) == WEFT_ETIMEDOUT);
    CHECK(weft_chan_destroy(ch) == WEFT_OK); /* no waiter left linked */

    /* Buffered and full: a timed-out sender's item never goes in. */
    CHECK(weft_chan_create(&ch, sizeof(int), 1) == WEFT_OK);
    CHECK(weft_chan_send_until(ch, &v, 0) == WEFT_OK); /* room: a try sends */
    int other = 8;
    d = weft_deadline_in_ns(SHORT);
    CHECK(timed_out(weft_chan_send_until(ch, &other, d), d));
    CHECK(weft_chan_recv_until(ch, &v, 0) == WEFT_OK && v == 7);
    CHECK(weft_chan_tryrecv(ch, &v) == WEFT_EAGAIN);
    CHECK(weft_chan_destroy(ch) == WEFT_OK);
    return 0;
}

static int chan_in_time(weft_runtime *rt)
{
    weft_chan *ch;
    helper h = {.delay_ms = 20, .item = 42};
    int v = 0;
    CHECK(weft_chan_create(&ch, sizeof(int), 0) == WEFT_OK);
    h.ch = ch;
    weft_task *t = start(rt, send_later, &h);
    CHECK(weft_chan_recv_until(ch, &v, weft_deadline_in_ns(LONG)) == WEFT_OK && v == 42);
    CHECK(weft_join(t, NULL) == WEFT_OK && h.status == WEFT_OK);

    t = start(rt, recv_later, &h);
    v = 43;
    CHECK(weft_chan_send_until(ch, &v, weft_deadline_in_ns(LONG)) == WEFT_OK);
    CHECK(weft_join(t, NULL) == WEFT_OK && h.status == WEFT_OK && h.item == 43);
    CHECK(weft_chan_destroy(ch) == WEFT_OK);
    return 0;
}

/* After a timed-out receive the next item goes to the next receiver; after
 * a timed-out send the receiver gets the next sender's item, not ours. */
static int chan_loses_nothing(weft_runtime *rt)
{
    weft_chan *ch;
    helper b = {.delay_ms = 5, .item = 2};
    int v = 1;
    CHECK(weft_chan_create(&ch, sizeof(int), 0) == WEFT_OK);
    b.ch = ch;
    weft_task *t = start(rt, recv_later, &b);
    uint64_t d = weft_deadline_in_ns(3 * SHORT);
    CHECK(timed_out(weft_chan_recv_until(ch, &v, d), d));
    v = 5;
    CHECK(weft_chan_send_until(ch, &v, weft_deadline_in_ns(LONG)) == WEFT_OK);
    CHECK(weft_join(t, NULL) == WEFT_OK);
    CHECK(b.status == WEFT_OK && b.item == 5);

    b.item = 2;
    t = start(rt, send_later, &b);
    v = 1;
    d = weft_deadline_in_ns(3 * SHORT);
    CHECK(timed_out(weft_chan_send_until(ch, &v, d), d));
    CHECK(weft_chan_recv_until(ch, &v, weft_deadline_in_ns(LONG)) == WEFT_OK);
    CHECK(v == 2); /* b's item, not the one whose send timed out */
    CHECK(weft_join(t, NULL) == WEFT_OK && b.status == WEFT_OK);
    CHECK(weft_chan_tryrecv(ch, &v) == WEFT_EAGAIN);
    CHECK(weft_chan_destroy(ch) == WEFT_OK);
    return 0;
}

static void test_chan_until_times_out(void **state)
{
    both(*state, chan_times_out);
}

static void test_chan_until_succeeds_in_time(void **state)
{
    both(*state, chan_in_time);
}

static void test_chan_timed_out_waiter_loses_nothing(void **state)
{
    both(*state, chan_loses_nothing);
}

/* ---- join ---------------------------------------------------------------- */

static void *wait_then_return(void *arg)
{
    helper *h = arg;
    if (h->delay_ms)
        weft_sleep_ns(h->delay_ms * MS);
    else
        weft_sem_wait(h->s);
    return (void *)(intptr_t)h->item;
}

static int join_times_out(weft_runtime *rt)
{
    weft_sem *s;
    helper h = {.item = 9};
    void *result = NULL;
    CHECK(weft_sem_create(&s, 0) == WEFT_OK);
    h.s = s;
    weft_task *t = spawn(rt, wait_then_return, &h);
    uint64_t d = weft_deadline_in_ns(SHORT);
    CHECK(timed_out(weft_join_until(t, &result, d), d));
    CHECK(weft_join_until(t, &result, 0) == WEFT_ETIMEDOUT);
    CHECK(result == NULL);
    CHECK(weft_sem_post(s) == WEFT_OK);
    CHECK(weft_join_until(t, &result, weft_deadline_in_ns(LONG)) == WEFT_OK); /* still joinable */
    CHECK(result == (void *)9);
    CHECK(weft_sem_destroy(s) == WEFT_OK);
    return 0;
}

static int join_in_time(weft_runtime *rt)
{
    helper h = {.delay_ms = 20, .item = 11};
    void *result = NULL;
    weft_task *t = spawn(rt, wait_then_return, &h);
    CHECK(weft_join_until(t, &result, weft_deadline_in_ns(LONG)) == WEFT_OK);
    CHECK(result == (void *)11);
    return 0;
}

static void test_join_until_times_out(void **state)
{
    both(*state, join_times_out);
}

static void test_join_until_succeeds_in_time(void **state)
{
    both(*state, join_in_time);
}

/* ---- event await ---------------------------------------------------------- */

typedef struct recorder {
    atomic_int gate;          /* the device work waits for it */
    _Atomic(weft_event *) ev; /* published once recorded */
    int status;
} recorder;

static void hold_stream(void *arg)
{
    recorder *r = arg;
    while (!atomic_load(&r->gate))
        sleep_ms(1);
}

static void *record_event(void *arg)
{
    recorder *r = arg;
    weft_event *ev = NULL;
    r->status = weft_host_async(hold_stream, r);
    if (r->status == WEFT_OK)
        r->status = weft_event_record(&ev);
    atomic_store(&r->ev, ev);
    if (r->status == WEFT_OK)
        r->status = weft_await();
    return NULL;
}

static int event_times_out_then_completes(weft_runtime *rt)
{
    recorder r = {0};
    weft_task *t = spawn(rt, record_event, &r);
    weft_event *ev;
    while (!(ev = atomic_load(&r.ev)))
        pause_ms(1);
    uint64_t d = weft_deadline_in_ns(SHORT);
    CHECK(timed_out(weft_event_await_until(ev, d), d));
    CHECK(weft_event_await_until(ev, 0) == WEFT_ETIMEDOUT);
    atomic_store(&r.gate, 1);
    CHECK(weft_event_await_until(ev, weft_deadline_in_ns(LONG)) == WEFT_OK);
    CHECK(weft_event_await_until(ev, 0) == WEFT_OK); /* complete: a try succeeds */
    CHECK(weft_join(t, NULL) == WEFT_OK && r.status == WEFT_OK);
    CHECK(weft_event_destroy(ev) == WEFT_OK);
    return 0;
}

static void test_event_await_until_times_out_then_completes(void **state)
{
    both(*state, event_times_out_then_completes);
}

/* The same on the default backend: a GPU's completion engine where there is
 * one (its waiter leaves the stream's queue on timeout), else the host. */
static void test_event_await_until_on_default_backend(void **state)
{
    (void)state;
    weft_config cfg = {.workers = 2};
    weft_runtime *rt;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    both(rt, event_times_out_then_completes);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- many timed waiters racing posts and sends -------------------------- */

enum { RACERS = 8, ROUNDS = 300 };

typedef struct race {
    weft_sem *s;
    weft_chan *ch;
    atomic_int taken;     /* permits the timed waiters got */
    atomic_long received; /* sum of the items they got */
    atomic_int done;      /* racers finished */
} race;

static void *racer(void *arg)
{
    race *r = arg;
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t d = weft_deadline_in_ns((uint64_t)(i % 3) * 100000u); /* 0, 0.1, 0.2 ms */
        if (weft_sem_wait_until(r->s, d) == WEFT_OK)
            atomic_fetch_add(&r->taken, 1);
        int v;
        if (weft_chan_recv_until(r->ch, &v, d) == WEFT_OK)
            atomic_fetch_add(&r->received, v);
    }
    atomic_fetch_add(&r->done, 1);
    return NULL;
}

/* Every permit and item posted while waiters time out all around is either
 * taken by one of them or still there afterwards: none vanish. */
static void test_timeouts_racing_posts_lose_nothing(void **state)
{
    weft_runtime *rt = *state;
    race r = {0};
    weft_task *ts[RACERS];
    assert_int_equal(weft_sem_create(&r.s, 0), WEFT_OK);
    assert_int_equal(weft_chan_create(&r.ch, sizeof(int), 4), WEFT_OK);
    for (int i = 0; i < RACERS; i++)
        ts[i] = spawn(rt, racer, &r);
    int posts = 0;
    long sent = 0;
    for (int v = 1; atomic_load(&r.done) < RACERS; v++) {
        assert_int_equal(weft_sem_post(r.s), WEFT_OK);
        posts++;
        if (weft_chan_trysend(r.ch, &v) == WEFT_OK)
            sent += v;
        if (v % 16 == 0)
            sleep_ms(1);
    }
    for (int i = 0; i < RACERS; i++)
        assert_int_equal(weft_join(ts[i], NULL), WEFT_OK);
    int left = 0, v;
    while (weft_sem_trywait(r.s) == WEFT_OK)
        left++;
    long rest = 0;
    while (weft_chan_tryrecv(r.ch, &v) == WEFT_OK)
        rest += v;
    assert_int_equal(atomic_load(&r.taken) + left, posts);
    assert_int_equal(atomic_load(&r.received) + rest, sent);
    assert_true(atomic_load(&r.taken) > 0);
    assert_int_equal(weft_sem_destroy(r.s), WEFT_OK);
    assert_int_equal(weft_chan_destroy(r.ch), WEFT_OK);
}

/* ---- the clock ------------------------------------------------------------ */

static void test_deadline_saturates(void **state)
{
    (void)state;
    uint64_t before = weft_now_ns();
    assert_int_equal(weft_deadline_in_ns(UINT64_MAX), WEFT_FOREVER);
    assert_int_equal(weft_deadline_in_ns(UINT64_MAX - 1), WEFT_FOREVER);
    uint64_t d = weft_deadline_in_ns(SHORT);
    assert_true(d >= before + SHORT);
    assert_true(weft_now_ns() >= before);
}

static int setup(void **state)
{
    weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST};
    weft_runtime *rt;
    if (weft_runtime_create(&rt, &cfg) != WEFT_OK)
        return -1;
    *state = rt;
    return 0;
}

#define T(f) cmocka_unit_test(f)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_sem_until_times_out),
        T(test_sem_until_succeeds_in_time),
        T(test_sem_timed_out_waiter_loses_nothing),
        T(test_mutex_until_times_out),
        T(test_mutex_until_succeeds_in_time),
        T(test_mutex_timed_out_waiter_loses_nothing),
        T(test_cond_until_times_out),
        T(test_cond_until_succeeds_in_time),
        T(test_cond_timed_out_waiter_loses_nothing),
        T(test_chan_until_times_out),
        T(test_chan_until_succeeds_in_time),
        T(test_chan_timed_out_waiter_loses_nothing),
        T(test_join_until_times_out),
        T(test_join_until_succeeds_in_time),
        T(test_event_await_until_times_out_then_completes),
        T(test_event_await_until_on_default_backend),
        T(test_timeouts_racing_posts_lose_nothing),
        T(test_deadline_saturates),
    };
    return cmocka_run_group_tests(tests, setup, teardown_rt);
}
