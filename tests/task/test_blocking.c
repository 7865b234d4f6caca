/*
 * test_blocking.c - weft_blocking: fn's result comes back; other tasks keep
 * running on the only worker while fn blocks; the pool never runs more than
 * blocking_threads calls at once, nor starts more threads; a call cancelled
 * before fn started never runs it; one cancelled while fn runs waits for it
 * (fn may write into the caller's stack) and returns its result; from a
 * plain thread it calls fn right there.
 *
 * Timings are bounds that cannot flake: "blocked" is reached by flags, and
 * the only deadlines are seconds away, there to turn a hang into a failure.
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
#include <unistd.h>

#include "weft.h"
#include "weft_test.h"

#define SECONDS(n) ((uint64_t)(n)*1000000000u)

static weft_runtime *runtime(unsigned workers, unsigned blocking_threads)
{
    weft_config cfg = {
        .workers = workers, .backend = WEFT_BACKEND_HOST, .blocking_threads = blocking_threads};
    weft_runtime *rt = NULL;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    return rt;
}

/* ---- the result ----------------------------------------------------------- */

static void *add_one(void *arg)
{
    return (void *)((intptr_t)arg + 1);
}

typedef struct call {
    void *(*fn)(void *);
    void *arg;
    void *result;
    int status;
    pthread_t caller;
} call;

static void *call_blocking(void *arg)
{
    call *c = arg;
    c->caller = pthread_self();
    c->status = weft_blocking(c->fn, c->arg, &c->result);
    return NULL;
}

static void test_blocking_gives_fn_result_back(void **state)
{
    (void)state;
    weft_runtime *rt = runtime(2, 0);
    call c = {.fn = add_one, .arg = (void *)41, .status = 1};
    weft_task *t = spawn(rt, call_blocking, &c);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(c.status, WEFT_OK);
    assert_ptr_equal(c.result, (void *)42);
    assert_int_equal(weft_blocking(add_one, (void *)1, NULL), WEFT_OK); /* result optional */
    assert_int_equal(weft_blocking(NULL, NULL, NULL), WEFT_EINVAL);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void *whose_thread(void *arg)
{
    *(pthread_t *)arg = pthread_self();
    return arg;
}

static void test_blocking_from_a_thread_calls_fn_there(void **state)
{
    (void)state;
    pthread_t ran = 0;
    void *result = NULL;
    assert_int_equal(weft_blocking(whose_thread, &ran, &result), WEFT_OK);
    assert_true(pthread_equal(ran, pthread_self()));
    assert_ptr_equal(result, &ran);
}

static void test_blocking_runs_fn_on_another_thread(void **state)
{
    (void)state;
    weft_runtime *rt = runtime(1, 0);
    pthread_t ran = 0;
    call c = {.fn = whose_thread, .arg = &ran, .status = 1};
    weft_task *t = spawn(rt, call_blocking, &c);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(c.status, WEFT_OK);
    assert_false(pthread_equal(ran, c.caller)); /* not the worker */
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- the worker stays free -------------------------------------------------- */

typedef struct piped {
    int fds[2];
    atomic_int reading; /* fn is in read() */
    atomic_int wrote;   /* the other task ran and wrote */
    char got;
} piped;

static void *read_pipe(void *arg)
{
    piped *p = arg;
    atomic_store(&p->reading, 1);
    ssize_t n = read(p->fds[0], &p->got, 1); /* blocks until the other task writes */
    return (void *)(intptr_t)n;
}

static void *reader(void *arg)
{
    piped *p = arg;
    void *n = NULL;
    int rc = weft_blocking(read_pipe, p, &n);
    return (void *)(intptr_t)(rc == WEFT_OK && n == (void *)1);
}

static void *writer(void *arg)
{
    piped *p = arg;
    while (!atomic_load(&p->reading))
        weft_yield();
    char c = 'x';
    atomic_store(&p->wrote, write(p->fds[1], &c, 1) == 1);
    return NULL;
}

/* One worker: the reader's fn blocks in read() until the writer - another
 * task, which can only run on that same worker - writes. */
static void test_other_tasks_run_while_fn_blocks(void **state)
{
    (void)state;
    weft_runtime *rt = runtime(1, 0);
    piped p = {0};
    assert_int_equal(pipe(p.fds), 0);
    weft_task *r = spawn(rt, reader, &p);
    weft_task *w = spawn(rt, writer, &p);
    int rc = weft_join_until(w, NULL, weft_deadline_in_ns(SECONDS(10)));
    if (rc != WEFT_OK) { /* the worker is stuck: free it before failing */
        char c = 'y';
        assert_int_equal(write(p.fds[1], &c, 1), 1);
        weft_join(w, NULL);
    }
    assert_int_equal(rc, WEFT_OK);
    assert_int_equal(atomic_load(&p.wrote), 1);
    void *ok = NULL;
    assert_int_equal(weft_join(r, &ok), WEFT_OK);
    assert_ptr_equal(ok, (void *)1);
    assert_int_equal(p.got, 'x');
    close(p.fds[0]);
    close(p.fds[1]);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- the bound ---------------------------------------------------------------- */

enum { BOUND = 2, CALLS = 6 };

typedef struct gated {
    atomic_int gate;
    atomic_int running, most, ran;
    pthread_mutex_t lock;
    pthread_t threads[CALLS];
    int nthreads;
} gated;

static void *wait_gate(void *arg)
{
    gated *g = arg;
    int now = atomic_fetch_add(&g->running, 1) + 1;
    int most = atomic_load(&g->most);
    while (now > most && !atomic_compare_exchange_weak(&g->most, &most, now))
        ;
    pthread_mutex_lock(&g->lock);
    bool seen = false;
    for (int i = 0; i < g->nthreads; i++)
        seen = seen || pthread_equal(g->threads[i], pthread_self());
    if (!seen && g->nthreads < CALLS)
        g->threads[g->nthreads++] = pthread_self();
    pthread_mutex_unlock(&g->lock);
    while (!atomic_load(&g->gate))
        sleep_ms(1);
    atomic_fetch_sub(&g->running, 1);
    atomic_fetch_add(&g->ran, 1);
    return (void *)7;
}

static void test_pool_never_exceeds_its_bound(void **state)
{
    (void)state;
    weft_runtime *rt = runtime(2, BOUND);
    gated g = {0};
    pthread_mutex_init(&g.lock, NULL);
    call c[CALLS];
    weft_task *ts[CALLS];
    for (int i = 0; i < CALLS; i++) {
        c[i] = (call){.fn = wait_gate, .arg = &g, .status = 1};
        ts[i] = spawn(rt, call_blocking, &c[i]);
    }
    while (atomic_load(&g.running) < BOUND) /* the bound is reached... */
        sleep_ms(1);
    sleep_ms(50);
    assert_int_equal(atomic_load(&g.running), BOUND); /* ...and not passed */
    atomic_store(&g.gate, 1);
    for (int i = 0; i < CALLS; i++) {
        assert_int_equal(weft_join(ts[i], NULL), WEFT_OK);
        assert_int_equal(c[i].status, WEFT_OK);
        assert_ptr_equal(c[i].result, (void *)7);
    }
    assert_int_equal(atomic_load(&g.ran), CALLS);
    assert_int_equal(atomic_load(&g.most), BOUND);
    assert_true(g.nthreads <= BOUND); /* threads are reused, not started per call */
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    pthread_mutex_destroy(&g.lock);
}

static void test_config_bound_is_checked(void **state)
{
    (void)state;
    weft_config cfg = {.blocking_threads = 1u << 30};
    weft_runtime *rt = NULL;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_EINVAL);
}

/* ---- cancellation --------------------------------------------------------------- */

static void *must_not_run(void *arg)
{
    atomic_store((atomic_int *)arg, 1);
    return NULL;
}

typedef struct queued {
    atomic_int calling;
    atomic_int ran;
    int status;
} queued;

static void *call_queued(void *arg)
{
    queued *q = arg;
    atomic_store(&q->calling, 1);
    q->status = weft_blocking(must_not_run, &q->ran, NULL);
    return NULL;
}

/* The only thread is busy, so the second call waits in the queue; cancelled
 * there, it returns ECANCELED and its fn never runs, and the pool goes on. */
static void test_cancel_before_start_does_not_run_fn(void **state)
{
    (void)state;
    weft_runtime *rt = runtime(2, 1);
    gated g = {0};
    pthread_mutex_init(&g.lock, NULL);
    call busy = {.fn = wait_gate, .arg = &g, .status = 1};
    weft_task *tb = spawn(rt, call_blocking, &busy);
    while (atomic_load(&g.running) < 1)
        sleep_ms(1);
    queued q = {.status = 1};
    weft_task *tq = spawn(rt, call_queued, &q);
    wait_flag(&q.calling);
    sleep_ms(20); /* most likely queued by now; if not, cancelled on entry */
    assert_int_equal(weft_cancel(tq), WEFT_OK);
    assert_int_equal(weft_join(tq, NULL), WEFT_ETASKCANCELED);
    assert_int_equal(q.status, WEFT_ECANCELED);
    atomic_store(&g.gate, 1);
    assert_int_equal(weft_join(tb, NULL), WEFT_OK);
    assert_int_equal(busy.status, WEFT_OK);
    assert_int_equal(atomic_load(&q.ran), 0);

    call after = {.fn = add_one, .arg = (void *)1, .status = 1};
    weft_task *ta = spawn(rt, call_blocking, &after);
    assert_int_equal(weft_join(ta, NULL), WEFT_OK);
    assert_ptr_equal(after.result, (void *)2);
    assert_int_equal(atomic_load(&q.ran), 0);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    pthread_mutex_destroy(&g.lock);
}

typedef struct into_stack {
    atomic_int started, gate;
    int *slot; /* in the calling task's frame */
} into_stack;

static void *write_into_stack(void *arg)
{
    into_stack *s = arg;
    atomic_store(&s->started, 1);
    while (!atomic_load(&s->gate))
        sleep_ms(1);
    *s->slot = 99;
    return (void *)5;
}

typedef struct running {
    into_stack *s;
    int status, slot_seen;
    void *result;
} running;

static void *call_running(void *arg)
{
    running *r = arg;
    int slot = 0;
    r->s->slot = &slot;
    r->status = weft_blocking(write_into_stack, r->s, &r->result);
    r->slot_seen = slot;
    return NULL;
}

/* Cancelled while fn runs: the call waits for fn, then returns its result. */
static void test_cancel_while_running_waits_for_fn(void **state)
{
    (void)state;
    weft_runtime *rt = runtime(2, 0);
    into_stack s = {0};
    running r = {.s = &s, .status = 1};
    weft_task *t = spawn(rt, call_running, &r);
    wait_flag(&s.started);
    assert_int_equal(weft_cancel(t), WEFT_OK);
    sleep_ms(20);
    assert_int_equal(weft_join_until(t, NULL, 0), WEFT_ETIMEDOUT); /* still waiting for fn */
    atomic_store(&s.gate, 1);
    assert_int_equal(weft_join(t, NULL), WEFT_ETASKCANCELED); /* the task was cancelled */
    assert_int_equal(r.status, WEFT_OK);                  /* but the call was done */
    assert_ptr_equal(r.result, (void *)5);
    assert_int_equal(r.slot_seen, 99);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void *cancelled_first(void *arg)
{
    queued *q = arg;
    weft_cancel(weft_task_current());
    q->status = weft_blocking(must_not_run, &q->ran, NULL);
    return NULL;
}

static void test_cancelled_task_does_not_run_fn(void **state)
{
    (void)state;
    weft_runtime *rt = runtime(1, 0);
    queued q = {.status = 1};
    weft_task *t = spawn(rt, cancelled_first, &q);
    assert_int_equal(weft_join(t, NULL), WEFT_ETASKCANCELED);
    assert_int_equal(q.status, WEFT_ECANCELED);
    assert_int_equal(atomic_load(&q.ran), 0);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocking_gives_fn_result_back),
        cmocka_unit_test(test_blocking_from_a_thread_calls_fn_there),
        cmocka_unit_test(test_blocking_runs_fn_on_another_thread),
        cmocka_unit_test(test_other_tasks_run_while_fn_blocks),
        cmocka_unit_test(test_pool_never_exceeds_its_bound),
        cmocka_unit_test(test_config_bound_is_checked),
        cmocka_unit_test(test_cancel_before_start_does_not_run_fn),
        cmocka_unit_test(test_cancel_while_running_waits_for_fn),
        cmocka_unit_test(test_cancelled_task_does_not_run_fn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
