/*
 * test_sync.c - mutex, condition variable and semaphore: mutual exclusion
 * across tasks and plain threads, ownership (EPERM, EDEADLK), FIFO hand-off,
 * producer/consumer on a condition variable, the semaphore's bound,
 * cancellation of each kind of wait, bad arguments.
 *
 * Public API only. "Blocked" is reached by a flag set just before the call
 * plus a short sleep, except where the test can tell for certain (a thread
 * can take the mutex only once a cond_wait has released it).
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


/* One call on a sync object, run in a task. */
typedef struct op {
    weft_mutex *m;
    weft_cond *c;
    weft_sem *s;
    int status;  /* what the waiting call returned */
    int status2; /* what the follow-up call returned */
    atomic_int started;
    atomic_int *order; /* shared arrival counter, for FIFO checks */
    int rank;          /* where this one came through */
} op;

static void op_init(op *o, weft_mutex *m, weft_cond *c, weft_sem *s)
{
    memset(o, 0, sizeof(*o));
    o->m = m;
    o->c = c;
    o->s = s;
    o->status = o->status2 = NOT_RUN;
    o->rank = -1;
    atomic_init(&o->started, 0);
}

/* lock, then unlock if that worked. */
static void *lock_fn(void *arg)
{
    op *o = arg;

    atomic_store(&o->started, 1);
    o->status = weft_mutex_lock(o->m);
    if (o->status == WEFT_OK) {
        if (o->order)
            o->rank = atomic_fetch_add(o->order, 1);
        o->status2 = weft_mutex_unlock(o->m);
    }
    return NULL;
}

static void *sem_wait_fn(void *arg)
{
    op *o = arg;

    atomic_store(&o->started, 1);
    o->status = weft_sem_wait(o->s);
    if (o->status == WEFT_OK && o->order)
        o->rank = atomic_fetch_add(o->order, 1);
    return NULL;
}

/* lock; cond_wait; then check the mutex is held by unlocking it. */
static void *cond_wait_fn(void *arg)
{
    op *o = arg;

    if (weft_mutex_lock(o->m) != WEFT_OK)
        return NULL;
    atomic_store(&o->started, 1);
    o->status = weft_cond_wait(o->c, o->m);
    o->status2 = weft_mutex_unlock(o->m);
    return NULL;
}

/* ---- mutex: exclusion --------------------------------------------------- */

enum { CNT_TASKS = 16, CNT_THREADS = 4, CNT_ITERS = 10000 };

static struct {
    weft_mutex *m;
    long counter; /* deliberately not atomic: the mutex is its only guard */
    atomic_int errors;
} cnt;

static void count_up(bool in_task)
{
    for (int i = 0; i < CNT_ITERS; i++) {
        long v;

        if (weft_mutex_lock(cnt.m) != WEFT_OK) {
            atomic_fetch_add(&cnt.errors, 1);
            return;
        }
        v = cnt.counter;
        if (in_task && i % 256 == 0)
            weft_yield(); /* sleep on the lock: others queue up behind it */
        cnt.counter = v + 1;
        if (weft_mutex_unlock(cnt.m) != WEFT_OK)
            atomic_fetch_add(&cnt.errors, 1);
    }
}

static void *count_task(void *arg)
{
    (void)arg;
    count_up(true);
    return NULL;
}

static void *count_thread(void *arg)
{
    (void)arg;
    count_up(false);
    return NULL;
}

static void test_mutex_counter_exact_across_tasks_and_threads(void **state)
{
    weft_task *t[CNT_TASKS];
    pthread_t th[CNT_THREADS];

    memset(&cnt, 0, sizeof(cnt));
    assert_int_equal(weft_mutex_create(&cnt.m), WEFT_OK);
    for (int i = 0; i < CNT_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, count_thread, NULL), 0);
    for (int i = 0; i < CNT_TASKS; i++)
        t[i] = spawn(*state, count_task, NULL);
    for (int i = 0; i < CNT_TASKS; i++)
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
    for (int i = 0; i < CNT_THREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(atomic_load(&cnt.errors), 0);
    assert_int_equal(cnt.counter, (long)(CNT_TASKS + CNT_THREADS) * CNT_ITERS);
    assert_int_equal(weft_mutex_destroy(cnt.m), WEFT_OK);
}

/* ---- mutex: ownership -------------------------------------------------- */

static void *unlock_fn(void *arg)
{
    op *o = arg;

    o->status = weft_mutex_unlock(o->m);
    o->status2 = weft_mutex_trylock(o->m);
    return NULL;
}

/* Lock in a task, hold it across suspensions (and maybe workers), wait for
 * a go, unlock. */
static void *hold_fn(void *arg)
{
    op *o = arg;

    o->status = weft_mutex_lock(o->m);
    for (int i = 0; i < 10; i++)
        weft_yield();
    atomic_store(&o->started, 1);
    if (weft_sem_wait(o->s) != WEFT_OK)
        return NULL;
    o->status2 = weft_mutex_unlock(o->m);
    return NULL;
}

static void test_mutex_unlock_by_non_holder_is_eperm(void **state)
{
    weft_mutex *m;
    weft_sem *go;
    op o, h;
    weft_task *t;
    pthread_t th;

    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_sem_create(&go, 0), WEFT_OK);
    assert_int_equal(weft_mutex_unlock(m), WEFT_EPERM); /* not locked at all */
    assert_non_null(strstr(weft_last_error(), "weft_mutex_unlock"));

    /* Held by this thread: a task may neither unlock nor take it. */
    assert_int_equal(weft_mutex_lock(m), WEFT_OK);
    assert_int_equal(weft_mutex_lock(m), WEFT_EDEADLK);
    assert_int_equal(weft_mutex_trylock(m), WEFT_EAGAIN);
    op_init(&o, m, NULL, NULL);
    t = spawn(*state, unlock_fn, &o);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(o.status, WEFT_EPERM);
    assert_int_equal(o.status2, WEFT_EAGAIN);
    assert_int_equal(weft_mutex_unlock(m), WEFT_OK);

    /* Held by a task: neither this thread nor another thread may unlock. */
    op_init(&h, m, NULL, go);
    t = spawn(*state, hold_fn, &h);
    wait_flag(&h.started);
    assert_int_equal(weft_mutex_unlock(m), WEFT_EPERM);
    op_init(&o, m, NULL, NULL);
    assert_int_equal(pthread_create(&th, NULL, unlock_fn, &o), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(o.status, WEFT_EPERM);
    assert_int_equal(o.status2, WEFT_EAGAIN);
    assert_int_equal(weft_sem_post(go), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(h.status, WEFT_OK);
    assert_int_equal(h.status2, WEFT_OK);

    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
    assert_int_equal(weft_sem_destroy(go), WEFT_OK);
}

/* ---- mutex: FIFO hand-off ---------------------------------------------- */

enum { QUEUED = 4 };

static void test_mutex_hands_off_to_waiters_in_fifo_order(void **state)
{
    weft_mutex *m;
    op o[QUEUED];
    weft_task *t[QUEUED];
    atomic_int order = 0;

    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_mutex_lock(m), WEFT_OK);
    for (int i = 0; i < QUEUED; i++) {
        op_init(&o[i], m, NULL, NULL);
        o[i].order = &order;
        t[i] = spawn(*state, lock_fn, &o[i]);
        wait_flag(&o[i].started);
        sleep_ms(20); /* queued before the next one comes */
    }
    assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
    /* Handed to the first waiter: nobody can barge in now. */
    assert_int_equal(weft_mutex_trylock(m), WEFT_EAGAIN);
    for (int i = 0; i < QUEUED; i++) {
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
        assert_int_equal(o[i].status, WEFT_OK);
        assert_int_equal(o[i].status2, WEFT_OK);
        assert_int_equal(o[i].rank, i);
    }
    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
}

/* ---- condition variable ------------------------------------------------ */

enum { PC_SLOTS = 8, PC_PRODUCERS = 4, PC_CONSUMERS = 4, PC_PER_PRODUCER = 5000 };

static struct {
    weft_mutex *m;
    weft_cond *not_full, *not_empty;
    uint64_t ring[PC_SLOTS]; /* all guarded by m */
    unsigned head, count;
    bool done;
    uint64_t sum;
    long taken;
    atomic_int errors;
} pc;

static void *pc_produce(void *arg)
{
    uint64_t base = (uintptr_t)arg * PC_PER_PRODUCER;

    for (uint64_t i = 0; i < PC_PER_PRODUCER; i++) {
        if (weft_mutex_lock(pc.m) != WEFT_OK)
            goto fail;
        while (pc.count == PC_SLOTS)
            if (weft_cond_wait(pc.not_full, pc.m) != WEFT_OK)
                goto fail_locked;
        pc.ring[(pc.head + pc.count) % PC_SLOTS] = base + i + 1;
        pc.count++;
        weft_cond_signal(pc.not_empty);
        weft_mutex_unlock(pc.m);
    }
    return NULL;
fail_locked:
    weft_mutex_unlock(pc.m);
fail:
    atomic_fetch_add(&pc.errors, 1);
    return NULL;
}

static void *pc_consume(void *arg)
{
    (void)arg;
    for (;;) {
        if (weft_mutex_lock(pc.m) != WEFT_OK)
            goto fail;
        while (pc.count == 0 && !pc.done)
            if (weft_cond_wait(pc.not_empty, pc.m) != WEFT_OK)
                goto fail_locked;
        if (pc.count == 0) {
            weft_mutex_unlock(pc.m);
            return NULL;
        }
        pc.sum += pc.ring[pc.head];
        pc.head = (pc.head + 1) % PC_SLOTS;
        pc.count--;
        pc.taken++;
        weft_cond_signal(pc.not_full);
        weft_mutex_unlock(pc.m);
    }
fail_locked:
    weft_mutex_unlock(pc.m);
fail:
    atomic_fetch_add(&pc.errors, 1);
    return NULL;
}

static void test_cond_producer_consumer_moves_every_item(void **state)
{
    weft_task *prod[PC_PRODUCERS], *cons[PC_CONSUMERS];
    pthread_t th;
    const uint64_t n = (PC_PRODUCERS + 1) * (uint64_t)PC_PER_PRODUCER;

    memset(&pc, 0, sizeof(pc));
    assert_int_equal(weft_mutex_create(&pc.m), WEFT_OK);
    assert_int_equal(weft_cond_create(&pc.not_full), WEFT_OK);
    assert_int_equal(weft_cond_create(&pc.not_empty), WEFT_OK);
    for (int i = 0; i < PC_CONSUMERS; i++)
        cons[i] = spawn(*state, pc_consume, NULL);
    for (uintptr_t i = 0; i < PC_PRODUCERS; i++)
        prod[i] = spawn(*state, pc_produce, (void *)i);
    /* One more producer is a plain thread, waiting on the same conds. */
    assert_int_equal(pthread_create(&th, NULL, pc_produce, (void *)(uintptr_t)PC_PRODUCERS), 0);
    for (int i = 0; i < PC_PRODUCERS; i++)
        assert_int_equal(weft_join(prod[i], NULL), WEFT_OK);
    assert_int_equal(pthread_join(th, NULL), 0);

    assert_int_equal(weft_mutex_lock(pc.m), WEFT_OK);
    pc.done = true;
    assert_int_equal(weft_cond_broadcast(pc.not_empty), WEFT_OK);
    assert_int_equal(weft_mutex_unlock(pc.m), WEFT_OK);
    for (int i = 0; i < PC_CONSUMERS; i++)
        assert_int_equal(weft_join(cons[i], NULL), WEFT_OK);

    assert_int_equal(atomic_load(&pc.errors), 0);
    assert_int_equal(pc.taken, (long)n);
    assert_int_equal(pc.sum, n * (n + 1) / 2);
    assert_int_equal(weft_cond_destroy(pc.not_full), WEFT_OK);
    assert_int_equal(weft_cond_destroy(pc.not_empty), WEFT_OK);
    assert_int_equal(weft_mutex_destroy(pc.m), WEFT_OK);
}

/* cond_wait_fn, but holding the mutex a while first so that the signaller
 * is already queued on it when cond_wait lets go. */
static void *cond_wait_then_flag_fn(void *arg)
{
    op *o = arg;

    if (weft_mutex_lock(o->m) != WEFT_OK)
        return NULL;
    atomic_store(&o->started, 1);
    weft_sleep_ns(2000000);
    o->status = weft_cond_wait(o->c, o->m);
    o->status2 = weft_mutex_unlock(o->m);
    atomic_store(&o->started, 2);
    return NULL;
}

/* Whoever takes the mutex after cond_wait released it and signals, wakes
 * the waiter: release and wait are one step. */
static void test_cond_signal_under_the_mutex_is_never_lost(void **state)
{
    weft_mutex *m;
    weft_cond *c;

    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_cond_create(&c), WEFT_OK);
    for (int i = 0; i < 100; i++) {
        op o;
        weft_task *t;
        int waited_ms = 0;

        op_init(&o, m, c, NULL);
        t = spawn(*state, cond_wait_then_flag_fn, &o);
        wait_flag(&o.started);
        assert_int_equal(weft_mutex_lock(m), WEFT_OK); /* released by cond_wait */
        assert_int_equal(weft_cond_signal(c), WEFT_OK);
        assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
        while (atomic_load(&o.started) != 2 && waited_ms < 2000) {
            sleep_ms(1);
            waited_ms++;
        }
        if (atomic_load(&o.started) != 2)
            weft_cond_broadcast(c); /* lost: free it so the runtime can stop */
        assert_int_equal(weft_join(t, NULL), WEFT_OK);
        assert_true(waited_ms < 2000);
        assert_int_equal(o.status, WEFT_OK);
        assert_int_equal(o.status2, WEFT_OK);
    }
    assert_int_equal(weft_cond_destroy(c), WEFT_OK);
    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
}

static void test_cond_wait_without_the_mutex_is_eperm(void **state)
{
    weft_mutex *m;
    weft_cond *c;

    (void)state;
    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_cond_create(&c), WEFT_OK);
    assert_int_equal(weft_cond_wait(c, m), WEFT_EPERM);
    assert_non_null(strstr(weft_last_error(), "weft_cond_wait"));
    assert_int_equal(weft_cond_signal(c), WEFT_OK); /* nobody waits: a no-op */
    assert_int_equal(weft_cond_broadcast(c), WEFT_OK);
    assert_int_equal(weft_cond_destroy(c), WEFT_OK);
    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
}

/* ---- semaphore --------------------------------------------------------- */

enum { SEM_LIMIT = 3, SEM_TASKS = 24, SEM_THREADS = 2, SEM_ROUNDS = 20 };

static struct {
    weft_sem *s;
    atomic_int inside, max_inside, errors;
} lim;

static void limited_round(bool in_task)
{
    int now, seen;

    if (weft_sem_wait(lim.s) != WEFT_OK) {
        atomic_fetch_add(&lim.errors, 1);
        return;
    }
    now = atomic_fetch_add(&lim.inside, 1) + 1;
    seen = atomic_load(&lim.max_inside);
    while (now > seen && !atomic_compare_exchange_weak(&lim.max_inside, &seen, now))
        ;
    if (in_task)
        weft_sleep_ns(200000);
    else
        sleep_ms(1);
    atomic_fetch_sub(&lim.inside, 1);
    if (weft_sem_post(lim.s) != WEFT_OK)
        atomic_fetch_add(&lim.errors, 1);
}

static void *limited_task(void *arg)
{
    (void)arg;
    for (int i = 0; i < SEM_ROUNDS; i++)
        limited_round(true);
    return NULL;
}

static void *limited_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < SEM_ROUNDS; i++)
        limited_round(false);
    return NULL;
}

static void test_sem_never_lets_more_than_n_inside(void **state)
{
    weft_task *t[SEM_TASKS];
    pthread_t th[SEM_THREADS];

    memset(&lim, 0, sizeof(lim));
    assert_int_equal(weft_sem_create(&lim.s, SEM_LIMIT), WEFT_OK);
    for (int i = 0; i < SEM_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, limited_thread, NULL), 0);
    for (int i = 0; i < SEM_TASKS; i++)
        t[i] = spawn(*state, limited_task, NULL);
    for (int i = 0; i < SEM_TASKS; i++)
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
    for (int i = 0; i < SEM_THREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(atomic_load(&lim.errors), 0);
    assert_true(atomic_load(&lim.max_inside) <= SEM_LIMIT);
    assert_int_equal(atomic_load(&lim.max_inside), SEM_LIMIT); /* and it is a limit, not less */
    /* Every permit came back. */
    for (int i = 0; i < SEM_LIMIT; i++)
        assert_int_equal(weft_sem_trywait(lim.s), WEFT_OK);
    assert_int_equal(weft_sem_trywait(lim.s), WEFT_EAGAIN);
    assert_int_equal(weft_sem_destroy(lim.s), WEFT_OK);
}

static void test_sem_hands_permits_to_waiters_in_fifo_order(void **state)
{
    weft_sem *s;
    op o[QUEUED];
    weft_task *t[QUEUED];
    atomic_int order = 0;

    assert_int_equal(weft_sem_create(&s, 0), WEFT_OK);
    for (int i = 0; i < QUEUED; i++) {
        op_init(&o[i], NULL, NULL, s);
        o[i].order = &order;
        t[i] = spawn(*state, sem_wait_fn, &o[i]);
        wait_flag(&o[i].started);
        sleep_ms(20); /* queued before the next one comes */
    }
    for (int i = 0; i < QUEUED; i++) {
        assert_int_equal(weft_sem_post(s), WEFT_OK);
        /* The permit went to a waiter, not to the count. */
        assert_int_equal(weft_sem_trywait(s), WEFT_EAGAIN);
        assert_int_equal(weft_join(t[i], NULL), WEFT_OK);
        assert_int_equal(o[i].status, WEFT_OK);
        assert_int_equal(o[i].rank, i);
    }
    assert_int_equal(weft_sem_destroy(s), WEFT_OK);
}

static void test_sem_post_past_the_maximum_is_estate(void **state)
{
    weft_sem *s;

    (void)state;
    assert_int_equal(weft_sem_create(&s, UINT64_MAX), WEFT_OK);
    assert_int_equal(weft_sem_post(s), WEFT_ESTATE);
    assert_non_null(strstr(weft_last_error(), "weft_sem_post"));
    assert_int_equal(weft_sem_trywait(s), WEFT_OK);
    assert_int_equal(weft_sem_post(s), WEFT_OK);
    assert_int_equal(weft_sem_destroy(s), WEFT_OK);
}

/* ---- cancellation ------------------------------------------------------- */

static void test_mutex_cancelled_waiter_fails_and_lock_passes_on(void **state)
{
    weft_mutex *m;
    op a, b;
    weft_task *ta, *tb;

    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_mutex_lock(m), WEFT_OK);
    op_init(&a, m, NULL, NULL);
    op_init(&b, m, NULL, NULL);
    ta = spawn(*state, lock_fn, &a);
    wait_flag(&a.started);
    sleep_ms(10);
    tb = spawn(*state, lock_fn, &b);
    wait_flag(&b.started);
    sleep_ms(10);
    assert_int_equal(weft_cancel(ta), WEFT_OK);
    assert_int_equal(weft_join(ta, NULL), WEFT_ETASKCANCELED);
    assert_int_equal(a.status, WEFT_ECANCELED);
    assert_int_equal(weft_mutex_unlock(m), WEFT_OK); /* goes to b, not to a */
    assert_int_equal(weft_join(tb, NULL), WEFT_OK);
    assert_int_equal(b.status, WEFT_OK);
    assert_int_equal(b.status2, WEFT_OK);
    assert_int_equal(weft_mutex_trylock(m), WEFT_OK);
    assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
}

static void test_sem_cancelled_waiter_fails_and_loses_no_permit(void **state)
{
    weft_sem *s;
    op o;
    weft_task *t;

    assert_int_equal(weft_sem_create(&s, 0), WEFT_OK);
    op_init(&o, NULL, NULL, s);
    t = spawn(*state, sem_wait_fn, &o);
    wait_flag(&o.started);
    sleep_ms(10);
    assert_int_equal(weft_cancel(t), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_ETASKCANCELED);
    assert_int_equal(o.status, WEFT_ECANCELED);
    assert_int_equal(weft_sem_post(s), WEFT_OK);
    assert_int_equal(weft_sem_trywait(s), WEFT_OK);
    assert_int_equal(weft_sem_trywait(s), WEFT_EAGAIN);
    assert_int_equal(weft_sem_destroy(s), WEFT_OK);
}

static void test_cond_cancelled_waiter_fails_holding_the_mutex(void **state)
{
    weft_mutex *m;
    weft_cond *c;
    op o;
    weft_task *t;

    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_cond_create(&c), WEFT_OK);
    op_init(&o, m, c, NULL);
    t = spawn(*state, cond_wait_fn, &o);
    wait_flag(&o.started);
    /* We get the mutex only once cond_wait released it: the task waits. */
    assert_int_equal(weft_mutex_lock(m), WEFT_OK);
    assert_int_equal(weft_cond_destroy(c), WEFT_ESTATE);
    assert_non_null(strstr(weft_last_error(), "weft_cond_destroy"));
    assert_int_equal(weft_cancel(t), WEFT_OK);
    sleep_ms(10); /* it cannot return before it has the mutex back */
    assert_int_equal(o.status, NOT_RUN);
    assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_ETASKCANCELED);
    assert_int_equal(o.status, WEFT_ECANCELED);
    assert_int_equal(o.status2, WEFT_OK); /* it held the mutex on return */
    assert_int_equal(weft_cond_destroy(c), WEFT_OK);
    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
}

/* A task already cancelled: the waiting calls refuse at once, the try-calls
 * and the calls that never wait still work (so it can clean up). */
static void *cancelled_self_fn(void *arg)
{
    op *o = arg;
    int *r = &o->rank; /* reused as a bit set of failed checks */

    *r = 0;
    weft_cancel(weft_task_current());
    if (weft_mutex_lock(o->m) != WEFT_ECANCELED)
        *r |= 1;
    if (weft_sem_wait(o->s) != WEFT_ECANCELED)
        *r |= 2;
    if (weft_mutex_trylock(o->m) != WEFT_OK)
        *r |= 4;
    if (weft_cond_wait(o->c, o->m) != WEFT_ECANCELED)
        *r |= 8;
    if (weft_mutex_unlock(o->m) != WEFT_OK) /* still held after cond_wait */
        *r |= 16;
    if (weft_sem_trywait(o->s) != WEFT_OK || weft_sem_post(o->s) != WEFT_OK)
        *r |= 32;
    if (weft_cond_signal(o->c) != WEFT_OK)
        *r |= 64;
    return NULL;
}

static void test_sync_waits_in_a_cancelled_task_fail_at_once(void **state)
{
    weft_mutex *m;
    weft_cond *c;
    weft_sem *s;
    op o;
    weft_task *t;

    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_cond_create(&c), WEFT_OK);
    assert_int_equal(weft_sem_create(&s, 1), WEFT_OK);
    op_init(&o, m, c, s);
    t = spawn(*state, cancelled_self_fn, &o);
    assert_int_equal(weft_join(t, NULL), WEFT_ETASKCANCELED);
    assert_int_equal(o.rank, 0);
    assert_int_equal(weft_mutex_trylock(m), WEFT_OK);
    assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
    assert_int_equal(weft_sem_trywait(s), WEFT_OK);
    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
    assert_int_equal(weft_cond_destroy(c), WEFT_OK);
    assert_int_equal(weft_sem_destroy(s), WEFT_OK);
}

/* Cancel a waiter while the lock or permit is being handed to it: either it
 * got it (and gave the lock back) or it did not and nothing was lost. */
static void test_sync_cancel_racing_hand_off_loses_nothing(void **state)
{
    weft_mutex *m;
    weft_sem *s;

    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_sem_create(&s, 0), WEFT_OK);
    for (unsigned i = 0; i < 300; i++) {
        op o;
        weft_task *t;
        int st;

        assert_int_equal(weft_mutex_lock(m), WEFT_OK);
        op_init(&o, m, NULL, NULL);
        t = spawn(*state, lock_fn, &o);
        for (volatile unsigned spin = 0; spin < (i % 16) * 500; spin++)
            ;
        if (i & 1) {
            assert_int_equal(weft_cancel(t), WEFT_OK);
            assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
        } else {
            assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
            assert_int_equal(weft_cancel(t), WEFT_OK);
        }
        st = weft_join(t, NULL);
        assert_true(st == WEFT_OK || st == WEFT_ETASKCANCELED);
        assert_true(o.status == NOT_RUN || o.status == WEFT_OK || o.status == WEFT_ECANCELED);
        if (o.status == WEFT_OK)
            assert_int_equal(o.status2, WEFT_OK);
        assert_int_equal(weft_mutex_trylock(m), WEFT_OK); /* free again */
        assert_int_equal(weft_mutex_unlock(m), WEFT_OK);

        op_init(&o, NULL, NULL, s);
        t = spawn(*state, sem_wait_fn, &o);
        for (volatile unsigned spin = 0; spin < (i % 16) * 500; spin++)
            ;
        assert_int_equal(weft_cancel(t), WEFT_OK);
        assert_int_equal(weft_sem_post(s), WEFT_OK);
        st = weft_join(t, NULL);
        assert_true(st == WEFT_OK || st == WEFT_ETASKCANCELED);
        if (o.status == WEFT_OK) {
            assert_int_equal(weft_sem_trywait(s), WEFT_EAGAIN); /* it took the permit */
        } else {
            assert_int_equal(weft_sem_trywait(s), WEFT_OK); /* the permit is still here */
            assert_int_equal(weft_sem_trywait(s), WEFT_EAGAIN);
        }
    }
    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
    assert_int_equal(weft_sem_destroy(s), WEFT_OK);
}

/* Many wait; half are cancelled while the lock or permits are handed out.
 * Every permit posted is taken by a waiter that reports success or is still
 * there; the mutex ends free. */
enum { CROWD = 16 };

typedef struct poster {
    weft_sem *s;
    int n, failed;
} poster;

static void *post_thread(void *arg)
{
    poster *p = arg;

    for (int i = 0; i < p->n; i++)
        if (weft_sem_post(p->s) != WEFT_OK)
            p->failed++;
    return NULL;
}

static void test_sync_cancel_in_a_crowd_of_waiters_loses_nothing(void **state)
{
    for (unsigned iter = 0; iter < 40; iter++) {
        op o[CROWD];
        weft_task *t[CROWD];
        poster p = {.n = CROWD / 2};
        weft_mutex *m;
        pthread_t th;
        int taken = 0;

        /* Semaphore. */
        assert_int_equal(weft_sem_create(&p.s, 0), WEFT_OK);
        for (int i = 0; i < CROWD; i++) {
            op_init(&o[i], NULL, NULL, p.s);
            t[i] = spawn(*state, sem_wait_fn, &o[i]);
        }
        for (int i = 0; i < CROWD; i++)
            wait_flag(&o[i].started);
        assert_int_equal(pthread_create(&th, NULL, post_thread, &p), 0);
        for (int i = (int)(iter % 2); i < CROWD; i += 2)
            assert_int_equal(weft_cancel(t[i]), WEFT_OK);
        assert_int_equal(pthread_join(th, NULL), 0);
        assert_int_equal(p.failed, 0);
        /* A cancelled one may have won a permit first, leaving one of the
         * others without: cancel those too, and count. */
        for (int i = 0; i < CROWD; i++)
            assert_int_equal(weft_cancel(t[i]), WEFT_OK);
        for (int i = 0; i < CROWD; i++)
            weft_join(t[i], NULL);
        for (int i = 0; i < CROWD; i++) {
            assert_true(o[i].status == WEFT_OK || o[i].status == WEFT_ECANCELED);
            taken += o[i].status == WEFT_OK;
        }
        while (weft_sem_trywait(p.s) == WEFT_OK)
            taken++;
        assert_int_equal(taken, p.n);
        assert_int_equal(weft_sem_destroy(p.s), WEFT_OK);

        /* Mutex. */
        assert_int_equal(weft_mutex_create(&m), WEFT_OK);
        assert_int_equal(weft_mutex_lock(m), WEFT_OK);
        for (int i = 0; i < CROWD; i++) {
            op_init(&o[i], m, NULL, NULL);
            t[i] = spawn(*state, lock_fn, &o[i]);
        }
        for (int i = 0; i < CROWD; i++)
            wait_flag(&o[i].started);
        for (int i = (int)(iter % 2); i < CROWD; i += 2) {
            assert_int_equal(weft_cancel(t[i]), WEFT_OK);
            if (i / 2 == CROWD / 4) /* halfway through, let them go */
                assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
        }
        for (int i = 0; i < CROWD; i++) {
            weft_join(t[i], NULL);
            if (o[i].status == WEFT_OK)
                assert_int_equal(o[i].status2, WEFT_OK);
            else
                assert_int_equal(o[i].status, WEFT_ECANCELED);
        }
        assert_int_equal(weft_mutex_trylock(m), WEFT_OK); /* free at the end */
        assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
        assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
    }
}

/* ---- bad arguments ----------------------------------------------------- */

static void test_sync_bad_arguments_are_einval(void **state)
{
    weft_mutex *m = (weft_mutex *)&m;
    weft_cond *c = (weft_cond *)&c;
    weft_sem *s = (weft_sem *)&s;

    (void)state;
    assert_int_equal(weft_mutex_create(NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "weft_mutex_create"));
    assert_int_equal(weft_mutex_destroy(NULL), WEFT_EINVAL);
    assert_int_equal(weft_mutex_lock(NULL), WEFT_EINVAL);
    assert_int_equal(weft_mutex_trylock(NULL), WEFT_EINVAL);
    assert_int_equal(weft_mutex_unlock(NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "weft_mutex_unlock"));

    assert_int_equal(weft_cond_create(NULL), WEFT_EINVAL);
    assert_int_equal(weft_cond_destroy(NULL), WEFT_EINVAL);
    assert_int_equal(weft_cond_signal(NULL), WEFT_EINVAL);
    assert_int_equal(weft_cond_broadcast(NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "weft_cond_broadcast"));

    assert_int_equal(weft_sem_create(NULL, 1), WEFT_EINVAL);
    assert_int_equal(weft_sem_destroy(NULL), WEFT_EINVAL);
    assert_int_equal(weft_sem_wait(NULL), WEFT_EINVAL);
    assert_int_equal(weft_sem_trywait(NULL), WEFT_EINVAL);
    assert_int_equal(weft_sem_post(NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "weft_sem_post"));

    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_cond_create(&c), WEFT_OK);
    assert_int_equal(weft_cond_wait(NULL, m), WEFT_EINVAL);
    assert_int_equal(weft_cond_wait(c, NULL), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "weft_cond_wait"));

    /* Destroying a held mutex is refused, and it stays usable. */
    assert_int_equal(weft_mutex_lock(m), WEFT_OK);
    assert_int_equal(weft_mutex_destroy(m), WEFT_ESTATE);
    assert_non_null(strstr(weft_last_error(), "weft_mutex_destroy"));
    assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);
    assert_int_equal(weft_cond_destroy(c), WEFT_OK);
}

static void test_sync_destroy_with_waiters_is_estate(void **state)
{
    weft_mutex *m;
    weft_sem *s;
    op o;
    weft_task *t;

    /* A waiter on a mutex: refused even once the holder let go. */
    assert_int_equal(weft_mutex_create(&m), WEFT_OK);
    assert_int_equal(weft_mutex_lock(m), WEFT_OK);
    op_init(&o, m, NULL, NULL);
    t = spawn(*state, lock_fn, &o);
    wait_flag(&o.started);
    sleep_ms(50);
    assert_int_equal(weft_mutex_destroy(m), WEFT_ESTATE);
    assert_int_equal(weft_mutex_unlock(m), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(o.status2, WEFT_OK);
    assert_int_equal(weft_mutex_destroy(m), WEFT_OK);

    /* A waiter on a semaphore. */
    assert_int_equal(weft_sem_create(&s, 0), WEFT_OK);
    op_init(&o, NULL, NULL, s);
    t = spawn(*state, sem_wait_fn, &o);
    wait_flag(&o.started);
    sleep_ms(50);
    assert_int_equal(weft_sem_destroy(s), WEFT_ESTATE);
    assert_non_null(strstr(weft_last_error(), "weft_sem_destroy"));
    assert_int_equal(weft_sem_post(s), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(o.status, WEFT_OK);
    assert_int_equal(weft_sem_destroy(s), WEFT_OK);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_rt, teardown_rt)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_mutex_counter_exact_across_tasks_and_threads),
        T(test_mutex_unlock_by_non_holder_is_eperm),
        T(test_mutex_hands_off_to_waiters_in_fifo_order),
        T(test_cond_producer_consumer_moves_every_item),
        T(test_cond_signal_under_the_mutex_is_never_lost),
        T(test_cond_wait_without_the_mutex_is_eperm),
        T(test_sem_never_lets_more_than_n_inside),
        T(test_sem_hands_permits_to_waiters_in_fifo_order),
        T(test_sem_post_past_the_maximum_is_estate),
        T(test_mutex_cancelled_waiter_fails_and_lock_passes_on),
        T(test_sem_cancelled_waiter_fails_and_loses_no_permit),
        T(test_cond_cancelled_waiter_fails_holding_the_mutex),
        T(test_sync_waits_in_a_cancelled_task_fail_at_once),
        T(test_sync_cancel_racing_hand_off_loses_nothing),
        T(test_sync_cancel_in_a_crowd_of_waiters_loses_nothing),
        T(test_sync_bad_arguments_are_einval),
        T(test_sync_destroy_with_waiters_is_estate),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
