/*
 * task.c - spawn, join, detach, when_all, when_any, cancel, yield, sleep.
 *
 * Handles. A weft_task * is the record's address with a 16-bit generation in
 * the (unused) top bits. Releasing a record bumps its generation, so a stale
 * handle - joined twice, used after detach - is recognized and refused with
 * WEFT_ESTATE rather than acting on whatever task reuses the record.
 *
 * Records belong to one runtime record for good: they are allocated in
 * chunks kept by it, t->rt is written once, and destroying the runtime
 * bumps every generation and keeps the chunks for the record's next life.
 * So any handle ever returned points at a task record, its runtime is read
 * without a race, and a handle call enters that runtime (as every call on a
 * runtime does) and checks the generation again once inside: a handle of a
 * destroyed runtime is refused, even after its records were reused.
 *
 * Life of a record: spawned (queued) -> started (has a stack) -> done (stack
 * given back, joiners woken) -> released by join, or at the end of a
 * detached task. `done` is set under the record's lock; a releaser takes
 * that lock once, so it never frees a record the finisher still holds.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core/sized.h"
#include "task/sched.h"
#include "task/task.h"
#include "task/tasks.h"

enum {
    HANDLE_SHIFT = 48,
    CHUNK_TASKS = 64,  /* records allocated together */
    CACHE_MAX = 256,   /* records a worker keeps before returning half */
};

/* weft_task_opts as weft 0.1 laid it out, which size 0 stands for: fixed
 * for good, however the struct grows (core/sized.h). */
#define TASK_OPTS_SIZE_0_1 (offsetof(weft_task_opts, device) + sizeof(unsigned))

/* ---- current task and error buffer ------------------------------------- */

weft__task *weft__task_self(void)
{
    weft__worker *w = weft__worker_self();
    return w ? weft__worker_current(w) : NULL;
}

weft__errbuf *weft__task_errbuf(void)
{
    weft__task *t = weft__task_self();
    return t ? &t->errmsg : NULL;
}

int weft__task_may_suspend(const char *fn)
{
    weft__task *t = weft__task_self();
    if (!t || !t->region_open)
        return WEFT_OK;
    t->region_broken = true;
    return weft__fail(WEFT_ESTATE,
                      "%s: a task may not suspend inside a graph region; the region is dropped",
                      fn);
}

/* ---- record pool ------------------------------------------------------- */

typedef struct task_chunk {
    struct task_chunk *next;
    weft__task tasks[CHUNK_TASKS];
} task_chunk;

static weft__task_cache *local_cache(weft_runtime *rt)
{
    weft__worker *w = weft__worker_self();
    return w && weft__worker_sched(w) == weft__tasks_of(rt)->sched ? weft__worker_tasks(w) : NULL;
}

/* Refill cache (or get one record) from the shared pool, allocating a new
 * chunk when it is empty. Returns one record, the rest go to cache. */
static weft__task *pool_take(weft_runtime *rt, weft__task_cache *cache)
{
    weft__tasks *tk = weft__tasks_of(rt);
    pthread_mutex_lock(&tk->pool_lock);
    if (!tk->free_tasks) {
        task_chunk *c = NULL;
        if (posix_memalign((void **)&c, 64, sizeof *c) || (uintptr_t)c >> HANDLE_SHIFT) {
            /* (handles need the top bits free) */
            free(c);
            pthread_mutex_unlock(&tk->pool_lock);
            return NULL;
        }
        memset(c, 0, sizeof *c);
        c->next = tk->task_chunks;
        tk->task_chunks = c;
        for (int i = CHUNK_TASKS - 1; i >= 0; i--) {
            c->tasks[i].rt = rt; /* for good: see the top */
            c->tasks[i].next = tk->free_tasks;
            tk->free_tasks = &c->tasks[i];
        }
    }
    weft__task *t = tk->free_tasks;
    tk->free_tasks = t->next;
    for (unsigned n = 0; cache && tk->free_tasks && n < CHUNK_TASKS; n++) {
        weft__task *extra = tk->free_tasks;
        tk->free_tasks = extra->next;
        extra->next = cache->head;
        cache->head = extra;
        cache->count++;
    }
    pthread_mutex_unlock(&tk->pool_lock);
    return t;
}

weft__task *weft__task_alloc(weft_runtime *rt)
{
    weft__task_cache *cache = local_cache(rt);
    if (cache && cache->head) {
        weft__task *t = cache->head;
        cache->head = t->next;
        cache->count--;
        return t;
    }
    return pool_take(rt, cache);
}

static void task_free(weft_runtime *rt, weft__task *t)
{
    weft__tasks *tk = weft__tasks_of(rt);
    weft__task_cache *cache = local_cache(rt);
    if (cache) {
        t->next = cache->head;
        cache->head = t;
        if (++cache->count <= CACHE_MAX)
            return;
        /* Too many: hand half back so workers that spawn can reuse them. */
        weft__task *first = cache->head, *last = first;
        for (unsigned n = 1; n < CACHE_MAX / 2; n++)
            last = last->next;
        cache->head = last->next;
        cache->count -= CACHE_MAX / 2;
        pthread_mutex_lock(&tk->pool_lock);
        last->next = tk->free_tasks;
        tk->free_tasks = first;
        pthread_mutex_unlock(&tk->pool_lock);
        return;
    }
    pthread_mutex_lock(&tk->pool_lock);
    t->next = tk->free_tasks;
    tk->free_tasks = t;
    pthread_mutex_unlock(&tk->pool_lock);
}

/* No task of rt is left and no call is inside it, so every record is free
 * or done and unjoined (or in a worker's cache, which is gone): all go back
 * on the free list, each with a new generation, which makes the unjoined
 * handles stale. The chunks are never freed: a stale handle may be read. */
void weft__task_pool_retire(weft_runtime *rt)
{
    weft__tasks *tk = weft__tasks_of(rt);
    tk->free_tasks = NULL;
    for (task_chunk *c = tk->task_chunks; c; c = c->next)
        for (int i = CHUNK_TASKS - 1; i >= 0; i--) {
            weft__task *t = &c->tasks[i];
            atomic_fetch_add_explicit(&t->generation, 1, memory_order_relaxed);
            t->next = tk->free_tasks;
            tk->free_tasks = t;
        }
}

/* A released record had its join claimed (join, detach, or spawned
 * detached), and a record never used is not done: an ended task whose
 * claim is still open is one nobody joined. */
uint64_t weft__task_unjoined(weft_runtime *rt)
{
    weft__tasks *tk = weft__tasks_of(rt);
    uint64_t n = 0;
    pthread_mutex_lock(&tk->pool_lock);
    for (task_chunk *c = tk->task_chunks; c; c = c->next)
        for (int i = 0; i < CHUNK_TASKS; i++) {
            weft__task *t = &c->tasks[i];
            n += atomic_load(&t->done) && !atomic_load(&t->join_claimed);
        }
    pthread_mutex_unlock(&tk->pool_lock);
    return n;
}

/* Wait out a finisher that may still hold t's lock, then recycle t. */
static void task_release(weft__task *t)
{
    weft__lock_acquire(&t->lock);
    weft__lock_release(&t->lock);
    atomic_fetch_add_explicit(&t->generation, 1, memory_order_relaxed);
    task_free(t->rt, t);
}

/* ---- handles ----------------------------------------------------------- */

static weft_task *handle_of(weft__task *t)
{
    uintptr_t gen = atomic_load_explicit(&t->generation, memory_order_relaxed);
    return (weft_task *)((uintptr_t)t | gen << HANDLE_SHIFT);
}

static weft__task *record_of(weft_task *h)
{
    return (weft__task *)((uintptr_t)h & (((uintptr_t)1 << HANDLE_SHIFT) - 1));
}

static int task_of(weft_task *h, const char *fn, weft__task **out)
{
    uintptr_t v = (uintptr_t)h;
    weft__task *t = record_of(h);
    if (!h)
        return weft__fail(WEFT_EINVAL, "%s: task handle is NULL", fn);
    if ((uintptr_t)t % _Alignof(weft__task) != 0)
        return weft__fail(WEFT_EINVAL, "%s: %p is not a task handle", fn, (void *)h);
    if ((uint16_t)(v >> HANDLE_SHIFT) !=
        atomic_load_explicit(&t->generation, memory_order_relaxed))
        return weft__fail(WEFT_ESTATE,
                          "%s: task handle was already joined or detached, or its runtime "
                          "destroyed",
                          fn);
    *out = t;
    return WEFT_OK;
}

/* task_of, then enter h's runtime (weft__runtime_leave(t->rt) must follow
 * on WEFT_OK). Checked again inside: the runtime may have been destroyed,
 * and its record reused, between the first check and the entry. */
static int task_enter(weft_task *h, const char *fn, weft__task **out)
{
    weft__task *t = NULL;
    int rc = task_of(h, fn, &t);
    if (rc || (rc = weft__runtime_enter(t->rt, fn)))
        return rc;
    if ((rc = task_of(h, fn, &t))) {
        weft__runtime_leave(t->rt);
        return rc;
    }
    *out = t;
    return WEFT_OK;
}

/* ---- spawning, running, finishing ------------------------------------- */

static void task_entry(void *arg)
{
    weft__task *t = arg;
    t->result = t->fn(t->arg);
    if (t->stream) /* device work left unawaited: the device layer drains it */
        weft__tasks_of(t->rt)->task_exit(t);
    weft__sched_leave(t, WEFT__LEAVE_EXIT);
}

static int check_opts(weft_runtime *rt, const weft_task_opts *opts)
{
    if (!opts)
        return WEFT_OK;
    if (opts->priority != WEFT_PRIO_NORMAL && opts->priority != WEFT_PRIO_HIGH &&
        opts->priority != WEFT_PRIO_LOW)
        return weft__fail(WEFT_EINVAL, "weft_spawn: priority %d is not a weft_priority",
                          (int)opts->priority);
    if (opts->stack_size &&
        (opts->stack_size < WEFT__STACK_MIN || opts->stack_size > WEFT__STACK_MAX))
        return weft__fail(WEFT_EINVAL, "weft_spawn: stack_size %zu is outside [%zu, %zu]",
                          opts->stack_size, WEFT__STACK_MIN, WEFT__STACK_MAX);
    if (opts->device) {
        struct weft__device **devs;
        unsigned n;
        int rc = weft__runtime_devices(rt, &devs, &n);
        if (rc)
            return rc;
        if (opts->device > n)
            return weft__fail(WEFT_EINVAL, "weft_spawn: device %u asked for; the runtime has %u",
                              opts->device - 1, n);
    }
    return WEFT_OK;
}

static int spawn_in(weft_runtime *rt, weft_task **out, void *(*fn)(void *), void *arg,
                    const weft_task_opts *opts)
{
    int rc;
    if (!fn)
        return weft__fail(WEFT_EINVAL, "weft_spawn: fn is NULL");
    if ((rc = check_opts(rt, opts)))
        return rc;
    weft__task *t = weft__task_alloc(rt);
    if (!t)
        return weft__fail(WEFT_ENOMEM, "weft_spawn: no memory for a task record");
    assert(t->rt == rt);

    t->next = NULL;
    atomic_store_explicit(&t->parker.state, WEFT__PARK_RUNNING, memory_order_relaxed);
    t->parker.task = t;
    t->worker = NULL;
    t->fn = fn;
    t->arg = arg;
    t->result = NULL;
    t->stack = NULL;
    t->stack_size = opts ? opts->stack_size : 0;
    t->name = opts ? opts->name : NULL;
    t->priority = opts ? (uint8_t)opts->priority : WEFT_PRIO_NORMAL;
    t->started = false;
    atomic_store_explicit(&t->cancelled, false, memory_order_relaxed);
    atomic_store_explicit(&t->done, false, memory_order_relaxed);
    t->joiners.head = t->joiners.tail = NULL;
    t->detached = out == NULL;
    atomic_store_explicit(&t->join_claimed, out == NULL, memory_order_relaxed);
    t->status = WEFT_OK;
    t->device = opts ? opts->device : 0;
    t->stream = NULL;
    t->stream_device = NULL;
    t->device_status = WEFT_OK;
    t->checks = NULL;
    t->region_open = t->region_broken = false;
    t->region_stream = NULL;
    t->errmsg.msg[0] = '\0';
    t->trace.id = 0;
    t->trace.parked = 0;
    t->trace.nvtx_wait = 0;

    if (out)
        *out = handle_of(t);
    weft__sched_spawn(weft__tasks_of(rt)->sched, t);
    return WEFT_OK;
}

/* Counted in the runtime until queued: destroy then waits for the task. */
int weft_spawn(weft_runtime *rt, weft_task **out, void *(*fn)(void *), void *arg,
               const weft_task_opts *opts)
{
    weft_task_opts known; /* the caller's fields, in this weft's layout */
    int rc;
    if (opts &&
        (rc = weft__sized_in(&known, sizeof known, opts, TASK_OPTS_SIZE_0_1, "weft_spawn", "opts")))
        return rc;
    if ((rc = weft__runtime_enter(rt, "weft_spawn")))
        return rc;
    rc = spawn_in(rt, out, fn, arg, opts ? &known : NULL);
    weft__runtime_leave(rt);
    return rc;
}

bool weft__task_start(weft__worker *w, weft__task *t)
{
    if (atomic_load(&t->cancelled)) {
        weft__task_finish(w, t); /* dropped before it ever ran */
        return false;
    }
    if (weft__stack_get(weft__tasks_of(t->rt)->stacks, weft__worker_stacks(w), t->stack_size,
                        &t->stack)) {
        t->status = WEFT_ENOMEM;
        weft__fail(WEFT_ENOMEM, "task: no memory for a stack of %zu bytes",
                   t->stack_size ? t->stack_size : weft__tasks_of(t->rt)->stack_size);
        weft__task_finish(w, t);
        return false;
    }
    weft__fiber_init(&t->fiber, t->stack, task_entry, t);
    t->fiber.label = t->name;
    t->started = true;
    return true;
}

void weft__task_finish(weft__worker *w, weft__task *t)
{
    weft_runtime *rt = t->rt;
    if (t->stack) {
        weft__fiber_release(&t->fiber);
        weft__stack_put(weft__tasks_of(rt)->stacks, weft__worker_stacks(w), t->stack);
        t->stack = NULL;
    }
    if (atomic_load(&t->cancelled))
        t->status = WEFT_ECANCELED;
    else if (t->status == WEFT_OK)
        t->status = t->device_status;

    weft__lock_acquire(&t->lock);
    atomic_store_explicit(&t->done, true, memory_order_release);
    weft__waitq_fire_all(&t->joiners, WEFT_OK);
    bool detached = t->detached;
    weft__lock_release(&t->lock);

    if (detached)
        task_release(t);
    weft__count(&weft__worker_stats_of(w)->finished, 1);
    weft__runtime_task_ended(rt);
}

/* ---- waiting for tasks ------------------------------------------------- */

/* Like every suspension point, fails at once in a cancelled task. */
static int wait_done_until(weft__task *t, uint64_t deadline)
{
    if (weft_cancelled())
        return WEFT_ECANCELED;
    if (atomic_load_explicit(&t->done, memory_order_acquire))
        return WEFT_OK;
    weft__waiter w;
    weft__waiter_init(&w, WEFT__WAITS_JOIN);
    weft__lock_acquire(&t->lock);
    if (atomic_load_explicit(&t->done, memory_order_relaxed)) {
        weft__lock_release(&t->lock);
        return WEFT_OK;
    }
    weft__waitq_push(&t->joiners, &w);
    return weft__waitq_park_until(&t->joiners, &w, &t->lock, true, deadline);
}

static int wait_done(weft__task *t)
{
    return wait_done_until(t, WEFT_FOREVER);
}

static int join_failure(const weft__task *t)
{
    switch (t->status) {
    case WEFT_ECANCELED: /* t's own cancellation: a code apart from the caller's */
        return weft__fail(WEFT_ETASKCANCELED, "weft_join: the task joined was cancelled");
    default:
        return weft__fail(t->status, "weft_join: the task failed: %s",
                          t->errmsg.msg[0] ? t->errmsg.msg : weft_strerror(t->status));
    }
}

static int join(weft__task *t, void **result, uint64_t deadline)
{
    int rc;
    if (t == weft__task_self())
        return weft__fail(WEFT_EDEADLK, "weft_join: a task cannot join itself");
    if ((rc = weft__task_may_suspend("weft_join")))
        return rc;
    if (atomic_exchange(&t->join_claimed, true))
        return weft__fail(WEFT_ESTATE, "weft_join: task is being joined elsewhere or was detached");
    if ((rc = wait_done_until(t, deadline))) {
        atomic_store(&t->join_claimed, false);
        return weft__fail(rc, "weft_join: %s; the task is still joinable",
                          rc == WEFT_ETIMEDOUT ? "the deadline passed first"
                          : rc == WEFT_ENOMEM  ? "no memory to set up the deadline"
                                               : "cancelled while waiting");
    }
    if (result)
        *result = t->result;
    int status = t->status;
    rc = status == WEFT_OK ? WEFT_OK : join_failure(t);
    task_release(t);
    return rc;
}

int weft_join_until(weft_task *h, void **result, uint64_t deadline)
{
    weft__task *t = NULL;
    int rc = task_enter(h, "weft_join", &t);
    if (rc)
        return rc;
    weft_runtime *rt = t->rt;
    rc = join(t, result, deadline);
    weft__runtime_leave(rt);
    return rc;
}

int weft_join(weft_task *h, void **result)
{
    return weft_join_until(h, result, WEFT_FOREVER);
}

static int detach(weft__task *t)
{
    if (atomic_exchange(&t->join_claimed, true))
        return weft__fail(WEFT_ESTATE, "weft_detach: task is being joined or was detached");
    weft__lock_acquire(&t->lock);
    bool done = atomic_load(&t->done);
    t->detached = !done;
    weft__lock_release(&t->lock);
    if (done)
        task_release(t);
    return WEFT_OK;
}

int weft_detach(weft_task *h)
{
    weft__task *t = NULL;
    int rc = task_enter(h, "weft_detach", &t);
    if (rc)
        return rc;
    weft_runtime *rt = t->rt;
    rc = detach(t);
    weft__runtime_leave(rt);
    return rc;
}

/* Leave the runtimes of ts[0..n) that group_enter entered: each that
 * differs from the one before. */
static void group_leave(weft_task *const *ts, size_t n)
{
    for (size_t i = 0; ts && i < n; i++) {
        weft_runtime *rt = record_of(ts[i])->rt;
        if (i == 0 || rt != record_of(ts[i - 1])->rt)
            weft__runtime_leave(rt);
    }
}

/* Enter the runtimes of every handle in ts (see task_enter), each run of
 * handles of one runtime once. On failure nothing stays entered. */
static int group_enter(weft_task *const *ts, size_t n, const char *fn)
{
    weft__task *t = NULL;
    for (size_t i = 0; ts && i < n; i++) {
        int rc = task_of(ts[i], fn, &t);
        if (rc == WEFT_OK && (i == 0 || t->rt != record_of(ts[i - 1])->rt))
            rc = weft__runtime_enter(t->rt, fn);
        if (rc) {
            group_leave(ts, i);
            return rc;
        }
    }
    for (size_t i = 0; ts && i < n; i++) {
        int rc = task_of(ts[i], fn, &t);
        if (rc) {
            group_leave(ts, n);
            return rc;
        }
    }
    return WEFT_OK;
}

static int check_group(weft_task *const *ts, size_t n, const char *fn)
{
    if (n && !ts)
        return weft__fail(WEFT_EINVAL, "%s: ts is NULL", fn);
    weft__task *self = weft__task_self();
    for (size_t i = 0; i < n; i++) {
        weft__task *t = NULL;
        int rc = task_of(ts[i], fn, &t);
        if (rc)
            return rc;
        if (t == self)
            return weft__fail(WEFT_EDEADLK, "%s: a task cannot wait for itself", fn);
    }
    return WEFT_OK;
}

static int when_all(weft_task *const *ts, size_t n)
{
    int rc = check_group(ts, n, "weft_when_all");
    if (rc == WEFT_OK)
        rc = weft__task_may_suspend("weft_when_all");
    for (size_t i = 0; rc == WEFT_OK && i < n; i++)
        if ((rc = wait_done(record_of(ts[i]))))
            weft__fail(rc, "weft_when_all: cancelled while waiting");
    return rc;
}

int weft_when_all(weft_task *const *ts, size_t n)
{
    int rc = group_enter(ts, n, "weft_when_all");
    if (rc)
        return rc;
    rc = when_all(ts, n);
    group_leave(ts, n);
    return rc;
}

static bool first_done(weft_task *const *ts, size_t n, size_t *first)
{
    for (size_t i = 0; i < n; i++)
        if (atomic_load_explicit(&record_of(ts[i])->done, memory_order_acquire)) {
            *first = i;
            return true;
        }
    return false;
}

static int when_any(weft_task *const *ts, size_t n, size_t *first)
{
    int rc = check_group(ts, n, "weft_when_any");
    if (rc || (rc = weft__task_may_suspend("weft_when_any")))
        return rc;
    if (n == 0 || !first)
        return weft__fail(WEFT_EINVAL, "weft_when_any: %s", n ? "first is NULL" : "no tasks");
    if (first_done(ts, n, first))
        return WEFT_OK;

    /* One parker, one waiter per task: the first task to finish ends it. */
    weft__waiter local[16], *ws = local;
    if (n > 16 && !(ws = malloc(n * sizeof *ws)))
        return weft__fail(WEFT_ENOMEM, "weft_when_any: no memory for %zu waiters", n);
    weft__parker *p = weft__parker_self();
    weft__parker_arm(p, true, WEFT__WAITS_ANY);
    size_t linked = 0;
    for (; linked < n; linked++) {
        weft__task *t = record_of(ts[linked]);
        weft__waiter_init(&ws[linked], WEFT__WAITS_ANY);
        weft__lock_acquire(&t->lock);
        bool done = atomic_load(&t->done);
        if (!done)
            weft__waitq_push(&t->joiners, &ws[linked]);
        weft__lock_release(&t->lock);
        if (done) {
            weft__parker_notify(p, WEFT_OK, false);
            break;
        }
    }
    rc = weft__parker_park(p, NULL);
    for (size_t i = 0; i < linked; i++) {
        weft__task *t = record_of(ts[i]);
        weft__lock_acquire(&t->lock);
        if (ws[i].linked)
            weft__waitq_remove(&t->joiners, &ws[i]);
        weft__lock_release(&t->lock);
    }
    if (ws != local)
        free(ws);
    if (rc)
        return weft__fail(rc, "weft_when_any: cancelled while waiting");
    first_done(ts, n, first);
    return WEFT_OK;
}

int weft_when_any(weft_task *const *ts, size_t n, size_t *first)
{
    int rc = group_enter(ts, n, "weft_when_any");
    if (rc)
        return rc;
    rc = when_any(ts, n, first);
    group_leave(ts, n);
    return rc;
}

/* ---- cancellation, yielding, sleeping ---------------------------------- */

int weft_cancel(weft_task *h)
{
    weft__task *t = NULL;
    int rc = task_enter(h, "weft_cancel", &t);
    if (rc)
        return rc;
    atomic_store(&t->cancelled, true);
    weft__parker_notify(&t->parker, WEFT_ECANCELED, true);
    weft__runtime_leave(t->rt);
    return WEFT_OK;
}

int weft_cancelled(void)
{
    weft__task *t = weft__task_self();
    return t && atomic_load_explicit(&t->cancelled, memory_order_relaxed);
}

weft_task *weft_task_current(void)
{
    weft__task *t = weft__task_self();
    return t ? handle_of(t) : NULL;
}

int weft_yield(void)
{
    weft__task *t = weft__task_self();
    if (!t)
        return weft__fail(WEFT_ENOTASK, "weft_yield: not called from a task");
    int rc = weft__task_may_suspend("weft_yield");
    if (rc)
        return rc;
    weft__sched_leave(t, WEFT__LEAVE_YIELD);
    if (atomic_load(&t->cancelled))
        return weft__fail(WEFT_ECANCELED, "weft_yield: the task was cancelled");
    return WEFT_OK;
}

int weft_sleep_ns(uint64_t ns)
{
    weft__task *t = weft__task_self();
    if (!t)
        return weft__fail(WEFT_ENOTASK, "weft_sleep_ns: not called from a task");
    int rc = weft__task_may_suspend("weft_sleep_ns");
    if (rc)
        return rc;
    if (atomic_load(&t->cancelled))
        return weft__fail(WEFT_ECANCELED, "weft_sleep_ns: the task was cancelled");
    if (ns == 0)
        return weft_yield();
    rc = weft__timers_sleep(weft__tasks_of(t->rt)->timers, ns);
    return rc ? weft__fail(rc, "weft_sleep_ns: %s", weft_strerror(rc)) : WEFT_OK;
}
