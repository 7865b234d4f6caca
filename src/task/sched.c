/*
 * sched.c - workers, their queues, searching and parking.
 *
 * Where a worker looks for its next task, in order:
 *   1. the shared high-priority queue, whenever it is not empty;
 *   2. every FAIR_TICKS ticks: the injection queue, then the low queue, so
 *      neither starves behind a worker that keeps feeding itself;
 *   3. its LIFO slot (the task it woke last), then its own deque;
 *   4. the injection queue (taking a batch into its deque);
 *   5. other workers' deques, stealing half of what each holds;
 *   6. the shared low-priority queue;
 *   7. when about to park: other workers' LIFO slots.
 *
 * Parking protocol (no lost wake-ups): a worker that found nothing
 *   registers on the event count (prepare), stops counting itself as
 *   searching, re-checks every queue, and only then sleeps (commit).
 * A producer publishes its task, issues a full fence, and wakes a worker only
 * if nobody is searching. Either the producer sees no searcher and wakes the
 * registered worker, or the worker's re-check sees the task.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "core/clock.h"
#include "core/futex.h"
#include "core/lock.h"
#include "task/deque.h"
#include "task/sched.h"
#include "trace/trace.h"

enum {
    FAIR_TICKS = 61,        /* shared queues checked first every this many picks */
    SPIN_ROUNDS = 64,       /* searches before parking */
    INJECT_BATCH = 32,      /* most tasks moved from the injection queue at once */
    WATCH_SPIN_NS = 30000,  /* the watcher first polls without sleeping ... */
    WATCH_SHARE = 16,       /* ... then sleeps a sixteenth of how long it has watched, */
    WATCH_MIN_NS = 20000,   /* ... at least this ... */
    WATCH_MAX_NS = 1000000, /* ... and at most this */
};

/* A poll source's callbacks (weft__sched_set_poller). */
typedef struct poll_source {
    unsigned (*poll)(void *ctx);
    bool (*pending)(void *ctx);
    void *ctx;
} poll_source;

/* A FIFO of tasks shared by all workers. */
typedef struct task_queue {
    pthread_mutex_t lock;
    weft__task *head, *tail;
    atomic_size_t len; /* read without the lock as a hint */
} task_queue;

struct weft__worker {
    weft__deque deque;
    _Atomic(weft__task *) lifo;
    weft__sched *sched;
    unsigned index;
    unsigned tick;
    uint32_t rng;
    bool searching;
    weft__fiber fiber; /* the worker's own context, where the loop runs */
    weft__task *current;
    weft__leave leave; /* what current asked for when it switched away */
    weft__stack_cache stacks;
    weft__task_cache tasks;
    weft__worker_stats stats;
    pthread_t thread;
};

struct weft__sched {
    weft__worker *workers;
    unsigned nworkers;
    weft__stack_pool *stacks;
    task_queue inject, high, low;
    atomic_uint searching;                 /* workers looking for work, not parked */
    atomic_uint epoch;                     /* event count: futex word, bumped to wake */
    atomic_uint sleepers;                  /* event count: registered (parking) workers */
    atomic_uint outside;                   /* threads other than workers inside spawn/wake */
    atomic_uint_least64_t spawned_outside; /* spawns from threads, not workers */
    atomic_bool stopping;
    atomic_bool watching; /* a parked worker is watching the poll sources */
    atomic_uint polling;  /* bit i: sources[i] is set */
    atomic_uint polls_in_flight;
    poll_source sources[WEFT__POLL_SOURCES];
    atomic_bool probing; /* the two below are set */
    uint64_t (*busy_ns)(void *ctx);
    void *probe_ctx;
};

void weft__sched_set_poller(weft__sched *s, unsigned source, unsigned (*poll)(void *ctx),
                            bool (*pending)(void *ctx), void *ctx)
{
    s->sources[source] = (poll_source){poll, pending, ctx};
    atomic_fetch_or_explicit(&s->polling, 1u << source, memory_order_release);
}

bool weft__sched_polls(weft__sched *s, unsigned source)
{
    return atomic_load_explicit(&s->polling, memory_order_acquire) & (1u << source);
}

void weft__sched_set_idle_probe(weft__sched *s, uint64_t (*busy_ns)(void *ctx), void *ctx)
{
    s->busy_ns = busy_ns;
    s->probe_ctx = ctx;
    atomic_store_explicit(&s->probing, true, memory_order_release);
}

/* Wait until no worker is inside a poll, a pending or the probe begun
 * before a source (or the probe) was cleared. */
static void quiesce(weft__sched *s)
{
    while (atomic_load(&s->polls_in_flight) != 0)
        sched_yield();
}

void weft__sched_clear_poller(weft__sched *s, unsigned source)
{
    atomic_fetch_and(&s->polling, ~(1u << source));
    quiesce(s);
}

void weft__sched_clear_idle_probe(weft__sched *s)
{
    atomic_store(&s->probing, false);
    quiesce(s);
}

/* Fire what completed on every poll source; woken tasks land in our LIFO
 * slot and deque. Counted while inside, so that a source can be taken away
 * safely. With no source set this is one relaxed load, as is pending(); with
 * the devices alone, what it was before there were other sources. */
static bool poll_sources(weft__sched *s)
{
    if (!atomic_load_explicit(&s->polling, memory_order_relaxed))
        return false;
    atomic_fetch_add(&s->polls_in_flight, 1);
    unsigned fired = 0, set = atomic_load(&s->polling);
    for (const poll_source *src = s->sources; set; set >>= 1, src++)
        if (set & 1)
            fired += src->poll(src->ctx);
    atomic_fetch_sub_explicit(&s->polls_in_flight, 1, memory_order_release);
    return fired > 0;
}

static bool sources_pending(weft__sched *s)
{
    if (!atomic_load_explicit(&s->polling, memory_order_relaxed))
        return false;
    atomic_fetch_add(&s->polls_in_flight, 1);
    bool pending = false;
    unsigned set = atomic_load(&s->polling);
    for (const poll_source *src = s->sources; set && !pending; set >>= 1, src++)
        pending = (set & 1) && src->pending(src->ctx);
    atomic_fetch_sub_explicit(&s->polls_in_flight, 1, memory_order_release);
    return pending;
}

/* The devices' busy time (weft__sched_set_idle_probe); false when not
 * probing. Counted in flight like a poll. */
static bool devices_busy_ns(weft__sched *s, uint64_t *ns)
{
    if (!atomic_load_explicit(&s->probing, memory_order_relaxed))
        return false;
    atomic_fetch_add(&s->polls_in_flight, 1);
    bool probing = atomic_load(&s->probing);
    if (probing)
        *ns = s->busy_ns(s->probe_ctx);
    atomic_fetch_sub_explicit(&s->polls_in_flight, 1, memory_order_release);
    return probing;
}

/* A sleep from slept_ns with the devices busy busy_ns then: count what of
 * it was a stall (weft__sched_set_idle_probe). */
static void count_stall(weft__worker *w, uint64_t slept_ns, uint64_t busy_ns)
{
    uint64_t busy_now, now = weft__now_ns();
    if (weft__sched_live(w->sched) <= 0 || !devices_busy_ns(w->sched, &busy_now))
        return;
    uint64_t asleep = now - slept_ns, busy = busy_now - busy_ns;
    if (asleep > busy)
        weft__count(&w->stats.stalled_ns, asleep - busy);
}

static _Thread_local weft__worker *self;

__attribute__((noinline)) weft__worker *weft__worker_self(void)
{
    /* A volatile read: the compiler must not reuse a value read before a
     * fiber switch, which may have moved us to another thread. */
    return *(weft__worker *volatile *)&self;
}

weft__task *weft__worker_current(weft__worker *w)
{
    return w->current;
}

weft__sched *weft__worker_sched(weft__worker *w)
{
    return w->sched;
}

weft__worker_stats *weft__worker_stats_of(weft__worker *w)
{
    return &w->stats;
}

void weft__sched_stats(weft__sched *s, weft_stats *out)
{
    uint64_t await_ns = 0;
    *out = (weft_stats){.spawned = atomic_load(&s->spawned_outside)};
    for (unsigned i = 0; i < s->nworkers; i++) {
        weft__worker_stats *st = &s->workers[i].stats;
        out->spawned += atomic_load_explicit(&st->spawned, memory_order_relaxed);
        out->finished += atomic_load_explicit(&st->finished, memory_order_relaxed);
        out->switches += atomic_load_explicit(&st->switches, memory_order_relaxed);
        out->steals += atomic_load_explicit(&st->steals, memory_order_relaxed);
        out->parks += atomic_load_explicit(&st->parks, memory_order_relaxed);
        out->awaits += atomic_load_explicit(&st->awaits, memory_order_relaxed);
        out->stalled_ns += atomic_load_explicit(&st->stalled_ns, memory_order_relaxed);
        await_ns += atomic_load_explicit(&st->await_ns, memory_order_relaxed);
    }
    out->await_mean_us = out->awaits ? (double)await_ns / (double)out->awaits / 1e3 : 0.0;
}

int64_t weft__sched_live(weft__sched *s)
{
    uint64_t finished = 0, spawned = 0;
    for (unsigned i = 0; i < s->nworkers; i++)
        finished += atomic_load_explicit(&s->workers[i].stats.finished, memory_order_acquire);
    spawned = atomic_load(&s->spawned_outside);
    for (unsigned i = 0; i < s->nworkers; i++)
        spawned += atomic_load_explicit(&s->workers[i].stats.spawned, memory_order_acquire);
    return (int64_t)(spawned - finished);
}

weft__stack_cache *weft__worker_stacks(weft__worker *w)
{
    return &w->stacks;
}

weft__task_cache *weft__worker_tasks(weft__worker *w)
{
    return &w->tasks;
}

unsigned weft__sched_workers(const weft__sched *s)
{
    return s->nworkers;
}

/* ---- shared queues ----------------------------------------------------- */

static void queue_init(task_queue *q)
{
    pthread_mutex_init(&q->lock, NULL);
    q->head = q->tail = NULL;
    atomic_init(&q->len, 0);
}

static void queue_push(task_queue *q, weft__task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&q->lock);
    if (q->tail)
        q->tail->next = t;
    else
        q->head = t;
    q->tail = t;
    atomic_fetch_add_explicit(&q->len, 1, memory_order_relaxed);
    pthread_mutex_unlock(&q->lock);
}

/* Pop up to max tasks as a chain; returns the first, NULL when empty. */
static weft__task *queue_pop(task_queue *q, size_t max, size_t *got)
{
    if (atomic_load_explicit(&q->len, memory_order_relaxed) == 0)
        return NULL;
    pthread_mutex_lock(&q->lock);
    weft__task *first = q->head, *last = NULL;
    size_t n = 0;
    for (weft__task *t = first; t && n < max; t = t->next, n++)
        last = t;
    if (n) {
        q->head = last->next;
        if (!q->head)
            q->tail = NULL;
        last->next = NULL;
        atomic_fetch_sub_explicit(&q->len, n, memory_order_relaxed);
    }
    pthread_mutex_unlock(&q->lock);
    if (got)
        *got = n;
    return n ? first : NULL;
}

static bool queue_empty(task_queue *q)
{
    return atomic_load_explicit(&q->len, memory_order_relaxed) == 0;
}

/* ---- waking and parking ------------------------------------------------ */

/* Called after publishing work: wake one parked worker, unless a worker is
 * already searching (it will find the work, and wake the next if needed).
 * Between a wake-up and the woken worker counting itself as searching,
 * another producer may wake a second worker; that over-wake is bounded by
 * the number of parked workers and only happens in bursts of new work. */
static void notify_one(weft__sched *s)
{
    weft__fence();
    if (atomic_load_explicit(&s->searching, memory_order_relaxed) != 0 ||
        atomic_load_explicit(&s->sleepers, memory_order_relaxed) == 0)
        return;
    atomic_fetch_add(&s->epoch, 1);
    weft__futex_wake(&s->epoch, 1);
}

void weft__sched_kick(weft__sched *s)
{
    if (!atomic_load(&s->watching))
        notify_one(s);
}

static void notify_all(weft__sched *s)
{
    atomic_fetch_add(&s->epoch, 1);
    weft__futex_wake(&s->epoch, INT32_MAX);
}

static void begin_search(weft__worker *w)
{
    if (w->searching)
        return;
    w->searching = true;
    atomic_fetch_add(&w->sched->searching, 1);
}

/* Returns true if w was the last searcher. */
static bool end_search(weft__worker *w)
{
    if (!w->searching)
        return false;
    w->searching = false;
    return atomic_fetch_sub(&w->sched->searching, 1) == 1;
}

/* ---- finding work ------------------------------------------------------ */

static uint32_t next_random(weft__worker *w)
{
    /* xorshift32: victims are picked in a different order by each worker */
    uint32_t x = w->rng;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return w->rng = x;
}

/* Push onto w's own deque, overflowing into the injection queue. */
static void push_local(weft__worker *w, weft__task *t)
{
    if (!weft__deque_push(&w->deque, t))
        queue_push(&w->sched->inject, t);
}

static weft__task *take_injected(weft__worker *w)
{
    weft__sched *s = w->sched;
    size_t len = atomic_load_explicit(&s->inject.len, memory_order_relaxed);
    if (len == 0)
        return NULL;
    size_t want = len / s->nworkers + 1;
    if (want > INJECT_BATCH)
        want = INJECT_BATCH;
    weft__task *first = queue_pop(&s->inject, want, NULL);
    if (!first)
        return NULL;
    for (weft__task *t = first->next, *next; t; t = next) {
        next = t->next;
        push_local(w, t);
    }
    return first;
}

/* Steal half of v's deque: one task to run, the rest into w's deque. */
static weft__task *steal_half(weft__worker *w, weft__worker *v)
{
    long long want = (weft__deque_size(&v->deque) + 1) / 2;
    weft__task *first = NULL;
    for (int lost = 0; want > 0 && lost < 4;) {
        void *item = weft__deque_steal(&v->deque);
        if (item == WEFT__STEAL_EMPTY)
            break;
        if (item == WEFT__STEAL_LOST) {
            lost++;
            continue;
        }
        if (!first)
            first = item;
        else
            push_local(w, item);
        weft__count(&w->stats.steals, 1);
        want--;
    }
    return first;
}

static weft__task *steal(weft__worker *w, bool lifo_too)
{
    weft__sched *s = w->sched;
    unsigned n = s->nworkers, start = next_random(w) % n;
    for (unsigned i = 0; i < n; i++) {
        weft__worker *v = &s->workers[(start + i) % n];
        if (v == w)
            continue;
        weft__task *t = steal_half(w, v);
        if (!t && lifo_too && atomic_load_explicit(&v->lifo, memory_order_relaxed) &&
            (t = atomic_exchange(&v->lifo, NULL)))
            weft__count(&w->stats.steals, 1);
        if (t)
            return t;
    }
    return NULL;
}

static weft__task *find_work(weft__worker *w, bool lifo_too)
{
    weft__sched *s = w->sched;
    weft__task *t;

    if (!queue_empty(&s->high) && (t = queue_pop(&s->high, 1, NULL)))
        return t;
    if (++w->tick % FAIR_TICKS == 0) {
        poll_sources(s); /* busy workers notice completions too */
        if ((t = queue_pop(&s->inject, 1, NULL)) || (t = queue_pop(&s->low, 1, NULL)))
            return t;
    }
    if (atomic_load_explicit(&w->lifo, memory_order_relaxed) &&
        (t = atomic_exchange(&w->lifo, NULL)))
        return t;
    if ((t = weft__deque_pop(&w->deque)))
        return t;
    if ((t = take_injected(w)))
        return t;
    if (s->nworkers > 1 && (t = steal(w, lifo_too)))
        return t;
    return queue_pop(&s->low, 1, NULL);
}

/* The watcher's sleep: still registered as parked (new work wakes it), it
 * polls the sources on a timeout, and goes back to searching once something
 * completed or new work arrived. The timeout is a share of how long it has
 * watched, so a wait of any length is seen to end at most about 6% late
 * (plus a wake-up): a timeout that doubled while nothing completed saw a
 * 1 ms wait end up to a millisecond late, and started the next wait at the
 * last one's long timeout (bench/mpi/bench_wake.c measures the lateness).
 * The price is wake-ups: about 35 in a wait of 1 ms, 70 in one of 10 ms,
 * then a thousand a second. */
static void watch_sources(weft__sched *s, unsigned key)
{
    /* A wait that ends within tens of microseconds (an await right after a
     * short kernel) is common, and a sleep and wake-up cost about as much:
     * poll without sleeping for a while first. */
    const uint64_t start = weft__now_ns();
    while (weft__now_ns() - start < WATCH_SPIN_NS) {
        if (atomic_load(&s->epoch) != key || atomic_load(&s->stopping) || poll_sources(s))
            goto out;
        for (int i = 0; i < 16; i++)
            weft__cpu_relax();
    }
    for (;;) {
        uint64_t ns = (weft__now_ns() - start) / WATCH_SHARE;
        ns = ns < WATCH_MIN_NS ? WATCH_MIN_NS : ns > WATCH_MAX_NS ? WATCH_MAX_NS : ns;
        struct timespec timeout = {0, (long)ns};
        weft__futex_wait(&s->epoch, key, &timeout);
        if (atomic_load(&s->epoch) != key || atomic_load(&s->stopping) || poll_sources(s) ||
            !sources_pending(s))
            break;
    }
out:
    atomic_store(&s->watching, false);
}

/* Search, then park, until work turns up (or the scheduler stops: NULL).
 * While a poll source has waits outstanding, one parked worker is the watcher: it
 * sleeps on a timeout that grows with the wait (watch_sources), and polls. */
static weft__task *idle(weft__worker *w)
{
    weft__sched *s = w->sched;
    weft__task *t;
    for (;;) {
        begin_search(w);
        for (int round = 0; round < SPIN_ROUNDS; round++) {
            if (round % 8 == 0)
                poll_sources(s);
            if ((t = find_work(w, round == SPIN_ROUNDS - 1)))
                goto found;
            if (atomic_load_explicit(&s->stopping, memory_order_relaxed))
                goto stop;
            weft__cpu_relax();
        }

        /* prepare, re-check, commit */
        bool watch = sources_pending(s) && !atomic_exchange(&s->watching, true);
        atomic_fetch_add(&s->sleepers, 1);
        unsigned key = atomic_load(&s->epoch);
        end_search(w);
        weft__fence();
        if ((t = find_work(w, true)) || atomic_load(&s->stopping)) {
            atomic_fetch_sub(&s->sleepers, 1);
            if (watch)
                atomic_store(&s->watching, false);
            if (t) {
                notify_one(s); /* there may be more: let another search */
                return t;
            }
            return NULL;
        }
        weft__count(&w->stats.parks, 1);
        /* A stall: tasks alive, none ready, the devices idle. */
        uint64_t busy_ns = 0, slept_ns = 0;
        bool stall = weft__sched_live(s) > 0 && devices_busy_ns(s, &busy_ns);
        if (stall)
            slept_ns = weft__now_ns();
        if (watch) {
            watch_sources(s, key);
        } else {
            while (atomic_load(&s->epoch) == key)
                weft__futex_wait(&s->epoch, key, NULL);
        }
        if (stall)
            count_stall(w, slept_ns, busy_ns);
        atomic_fetch_sub(&s->sleepers, 1);
    }
found:
    if (end_search(w))
        notify_one(s); /* we were the last searcher: hand the search on */
    return t;
stop:
    end_search(w);
    return NULL;
}

/* ---- running tasks ----------------------------------------------------- */

/* t's parker was armed before it switched away; now that its registers are
 * saved it may be scheduled. If it was notified meanwhile, run it again. */
static void commit_park(weft__worker *w, weft__task *t)
{
    unsigned st = atomic_load(&t->parker.state);
    while ((st & WEFT__PARK_PHASE) == WEFT__PARK_ARMED)
        if (atomic_compare_exchange_weak(&t->parker.state, &st,
                                         (st & ~WEFT__PARK_PHASE) | WEFT__PARK_WAITING))
            return;
    weft__task *old = atomic_exchange(&w->lifo, t);
    if (old) {
        push_local(w, old);
        notify_one(w->sched);
    }
}

/* The switch into t while a trace is on: its wait and its run are
 * reported around it (before commit_park can let another worker take it). */
__attribute__((noinline)) static void switch_traced(weft__worker *w, weft__task *t)
{
    uint64_t start = weft__trace_resume(t);
    weft__fiber_switch(&w->fiber, &t->fiber);
    weft__trace_leave(t, start, w->leave == WEFT__LEAVE_PARK);
}

static void run(weft__worker *w, weft__task *t)
{
    if (!t->started && !weft__task_start(w, t))
        return;
    w->current = t;
    t->worker = w;
    weft__count(&w->stats.switches, 1);
    if (weft__trace_on())
        switch_traced(w, t);
    else
        weft__fiber_switch(&w->fiber, &t->fiber);
    w->current = NULL;
    switch (w->leave) {
    case WEFT__LEAVE_PARK:
        commit_park(w, t);
        break;
    case WEFT__LEAVE_YIELD:
        queue_push(&w->sched->inject, t);
        notify_one(w->sched);
        break;
    case WEFT__LEAVE_EXIT:
        weft__task_finish(w, t);
        break;
    }
}

void weft__sched_leave(weft__task *t, weft__leave how)
{
    weft__worker *w = weft__worker_self();
    w->leave = how;
    if (how == WEFT__LEAVE_EXIT)
        weft__fiber_exit(&t->fiber, &w->fiber);
    weft__fiber_switch(&t->fiber, &w->fiber);
}

static void *worker_main(void *arg)
{
    weft__worker *w = arg;
    self = w;
    /* The device watcher sleeps for tens of microseconds at a time. */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    weft__overflow_thread_init();
    weft__fiber_init_thread(&w->fiber);
    for (;;) {
        weft__task *t = find_work(w, false);
        if (!t && !(t = idle(w)))
            break;
        run(w, t);
    }
    weft__stack_cache_drain(w->sched->stacks, &w->stacks);
    weft__overflow_thread_fini();
    self = NULL;
    return NULL;
}

/* ---- submitting -------------------------------------------------------- */

static task_queue *priority_queue(weft__sched *s, const weft__task *t)
{
    if (t->priority == WEFT_PRIO_HIGH)
        return &s->high;
    if (t->priority == WEFT_PRIO_LOW)
        return &s->low;
    return NULL;
}

/* Queue t on a shared queue and wake a worker. A thread that is not one of
 * s's workers is counted while it does so: the task may run and the last
 * task end before this returns, and weft__sched_destroy must not free s
 * under it. */
static void push_shared(weft__sched *s, task_queue *q, weft__task *t, bool outsider)
{
    if (outsider)
        atomic_fetch_add(&s->outside, 1);
    queue_push(q, t);
    notify_one(s);
    if (outsider)
        atomic_fetch_sub_explicit(&s->outside, 1, memory_order_release);
}

void weft__sched_spawn(weft__sched *s, weft__task *t)
{
    weft__worker *w = weft__worker_self();
    if (w && w->sched == s)
        weft__count(&w->stats.spawned, 1);
    else
        atomic_fetch_add_explicit(&s->spawned_outside, 1, memory_order_relaxed);
    task_queue *q = priority_queue(s, t);
    if (!q && w && w->sched == s) {
        push_local(w, t);
        notify_one(s);
    } else {
        push_shared(s, q ? q : &s->inject, t, !w || w->sched != s);
    }
}

void weft__sched_wake(weft__sched *s, weft__task *t)
{
    weft__worker *w = weft__worker_self();
    task_queue *q = priority_queue(s, t);
    if (q || !w || w->sched != s) {
        push_shared(s, q ? q : &s->inject, t, !w || w->sched != s);
        return;
    }
    weft__task *old = atomic_exchange(&w->lifo, t);
    if (old) {
        push_local(w, old);
        notify_one(s);
    }
}

/* ---- life cycle -------------------------------------------------------- */

int weft__sched_create(weft__sched **out, unsigned nworkers, weft__stack_pool *stacks)
{
    weft__sched *s = calloc(1, sizeof *s);
    if (!s)
        return WEFT_ENOMEM;
    if (posix_memalign((void **)&s->workers, 64, nworkers * sizeof *s->workers)) {
        free(s);
        return WEFT_ENOMEM;
    }
    memset(s->workers, 0, nworkers * sizeof *s->workers);
    s->nworkers = nworkers;
    s->stacks = stacks;
    queue_init(&s->inject);
    queue_init(&s->high);
    queue_init(&s->low);

    /* Every worker's queues exist before any thread starts stealing. */
    for (unsigned i = 0; i < nworkers; i++) {
        weft__worker *w = &s->workers[i];
        weft__deque_init(&w->deque);
        atomic_init(&w->lifo, NULL);
        w->sched = s;
        w->index = i;
        w->rng = 0x9e3779b9u * (i + 1);
    }
    unsigned started = 0;
    for (; started < nworkers; started++) {
        weft__worker *w = &s->workers[started];
        if (pthread_create(&w->thread, NULL, worker_main, w))
            break;
        char name[16];
        snprintf(name, sizeof name, "weft-worker/%u", started % 1000u);
        pthread_setname_np(w->thread, name);
    }
    if (started < nworkers) {
        s->nworkers = started;
        weft__sched_destroy(s);
        return WEFT_ESYS;
    }
    *out = s;
    return WEFT_OK;
}

void weft__sched_destroy(weft__sched *s)
{
    atomic_store(&s->stopping, true);
    notify_all(s);
    for (unsigned i = 0; i < s->nworkers; i++)
        pthread_join(s->workers[i].thread, NULL);
    while (atomic_load_explicit(&s->outside, memory_order_acquire) != 0)
        sched_yield(); /* a waker is finishing its notify */
    pthread_mutex_destroy(&s->inject.lock);
    pthread_mutex_destroy(&s->high.lock);
    pthread_mutex_destroy(&s->low.lock);
    free(s->workers);
    free(s);
}
