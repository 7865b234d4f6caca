/*
 * test_trace.c - the timeline: WEFT_TRACE and weft_trace_start/stop write
 * strict JSON with the events the runtime's work implies.
 *
 * Each test runs known work - named tasks that join, lock a contended
 * mutex, pass items over a channel, sleep and await host-device work, each
 * wait made long enough to happen under any load - and
 * reads the file back: it must parse (json.h), satisfy what every trace
 * must (trace_check.h: paired async events, non-negative durations, named
 * tracks) and hold the runs, waits and operations that work produced.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "trace/trace.h"
#include "trace_check.h"
#include "weft.h"
#include "weft_test.h"

/* ---- the work ------------------------------------------------------------ */

typedef struct shared {
    weft_mutex *mu;
    weft_chan *ch;
    atomic_int lockers; /* lockers that reached weft_mutex_lock */
} shared;

static void touch(void *arg)
{
    (*(int *)arg)++;
}

/* A host function that takes long enough for its task's await to wait. */
static void slow_touch(void *arg)
{
    sleep_ms(10);
    touch(arg);
}

static void *child(void *arg)
{
    (void)arg;
    weft_sleep_ns(20000000); /* the parent joins while this sleeps */
    return NULL;
}

static void *producer(void *arg)
{
    shared *sh = arg;
    for (int i = 0; i < 50; i++)
        if (weft_chan_send(sh->ch, &i))
            return (void *)1;
    return NULL;
}

static void *consumer(void *arg)
{
    shared *sh = arg;
    int v, sum = 0;
    for (int i = 0; i < 50; i++) {
        if (weft_chan_recv(sh->ch, &v))
            return (void *)1;
        sum += v;
    }
    return sum == 49 * 50 / 2 ? NULL : (void *)1;
}

/* Two of these contend for the mutex: the one that takes it holds it until
 * the other has come to lock it too (or 2 s have passed), and 20 ms more,
 * so that the other waits however late a loaded machine runs it. */
static void *locker(void *arg)
{
    shared *sh = arg;
    atomic_fetch_add(&sh->lockers, 1);
    if (weft_mutex_lock(sh->mu))
        return (void *)1;
    for (int ms = 0; ms < 2000 && atomic_load(&sh->lockers) < 2; ms++)
        weft_sleep_ns(1000000);
    weft_sleep_ns(20000000);
    weft_mutex_unlock(sh->mu);
    return NULL;
}

static void *device_user(void *arg)
{
    (void)arg;
    static char src[4096], dst[4096];
    int n = 0;
    memset(src, 7, sizeof src);
    if (weft_memcpy_async(dst, src, sizeof src) || weft_memset_async(src, 0, 100) ||
        weft_host_async(slow_touch, &n) || weft_await())
        return (void *)1;
    return n == 1 && dst[4095] == 7 ? NULL : (void *)1;
}

static void *root(void *arg)
{
    shared *sh = arg;
    static const struct {
        const char *name;
        void *(*fn)(void *);
    } kids[] = {{"producer", producer}, {"consumer", consumer}, {"locker", locker},
                {"locker", locker},     {"device", device_user}, {"child", child}};
    weft_task *ts[6];
    for (int i = 0; i < 6; i++) {
        weft_task_opts o = {.name = kids[i].name};
        if (weft_spawn(weft_runtime_current(), &ts[i], kids[i].fn, sh, &o))
            return (void *)1;
    }
    void *bad = NULL;
    for (int i = 0; i < 6; i++) {
        void *r = (void *)1;
        if (weft_join(ts[i], &r) || r)
            bad = (void *)1;
    }
    return bad;
}

static weft_runtime *runtime(unsigned workers)
{
    weft_config cfg = {.workers = workers, .backend = WEFT_BACKEND_HOST};
    weft_runtime *rt;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    return rt;
}

static void run_work(weft_runtime *rt)
{
    shared sh = {0};
    weft_task *t;
    void *r = (void *)1;
    weft_task_opts o = {.name = "root"};
    assert_int_equal(weft_mutex_create(&sh.mu), WEFT_OK);
    assert_int_equal(weft_chan_create(&sh.ch, sizeof(int), 0), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &t, root, &sh, &o), WEFT_OK);
    assert_int_equal(weft_join(t, &r), WEFT_OK);
    assert_null(r);
    weft_mutex_destroy(sh.mu);
    weft_chan_destroy(sh.ch);
}

/* ---- checks ---------------------------------------------------------------- */

/* Every run of a task named name is on a worker thread and carries a task
 * id; returns how many there are. */
static size_t runs_named(const json *doc, const char *name)
{
    const json *events = trace_events(doc);
    size_t n = 0;
    for (size_t i = 0; i < events->n; i++) {
        const json *e = events->items[i];
        const char *ph = json_str(e, "ph"), *nm = json_str(e, "name"), *cat = json_str(e, "cat");
        double pid = 0;
        if (strcmp(ph, "X") || strcmp(cat, "task") || strcmp(nm, name))
            continue;
        assert_true(json_num(e, "pid", &pid));
        assert_true(pid == (double)getpid());
        assert_non_null(json_str(json_get(e, "args"), "task"));
        n++;
    }
    return n;
}

/* The thread_name events of the process name its worker threads. */
static size_t worker_names(const json *doc)
{
    const json *events = trace_events(doc);
    size_t n = 0;
    for (size_t i = 0; i < events->n; i++) {
        const json *e = events->items[i];
        const char *thread = json_str(json_get(e, "args"), "name");
        if (!strcmp(json_str(e, "ph"), "M") && !strcmp(json_str(e, "name"), "thread_name") &&
            thread && !strncmp(thread, "weft-worker/", 12))
            n++;
    }
    return n;
}

/* The task id of the runs named name, which must all carry the same one. */
static const char *task_id_of(const json *doc, const char *name)
{
    const json *events = trace_events(doc);
    const char *id = NULL;
    for (size_t i = 0; i < events->n; i++) {
        const json *e = events->items[i];
        if (strcmp(json_str(e, "ph"), "X") || strcmp(json_str(e, "cat"), "task") ||
            strcmp(json_str(e, "name"), name))
            continue;
        const char *mine = json_str(json_get(e, "args"), "task");
        assert_non_null(mine);
        if (id)
            assert_string_equal(id, mine);
        id = mine;
    }
    assert_non_null(id);
    return id;
}

/* Every device operation names the task that enqueued it: in this work,
 * only the task named "device" enqueues any. */
static void expect_ops_carry_their_task(const json *doc)
{
    const json *events = trace_events(doc);
    const char *id = task_id_of(doc, "device");
    size_t n = 0;
    for (size_t i = 0; i < events->n; i++) {
        const json *e = events->items[i];
        if (strcmp(json_str(e, "ph"), "X") || strcmp(json_str(e, "cat"), "device"))
            continue;
        const char *task = json_str(json_get(e, "args"), "task");
        if (!task)
            fail_msg("device operation \"%s\" carries no task id", json_str(e, "name"));
        assert_string_equal(task, id);
        n++;
    }
    assert_true(n >= 3); /* the copy, the memset, the host function */
}

static void expect_the_work(const json *doc, unsigned workers)
{
    assert_int_equal(runs_named(doc, "root") >= 2, 1); /* it runs, joins, runs again */
    assert_true(runs_named(doc, "producer") >= 1);
    assert_true(runs_named(doc, "consumer") >= 1);
    assert_true(runs_named(doc, "locker") >= 2);
    assert_true(runs_named(doc, "device") >= 1);
    assert_true(worker_names(doc) >= 1 && worker_names(doc) <= workers);

    assert_true(trace_count(doc, "b", "wait: join", "wait") >= 1);
    assert_true(trace_count(doc, "b", "wait: chan ", "wait") >= 1); /* send or recv: who came first */
    assert_true(trace_count(doc, "b", "wait: mutex", "wait") >= 1);
    assert_true(trace_count(doc, "b", "wait: sleep", "wait") >= 1);
    assert_true(trace_count(doc, "b", "wait: host device", "wait") >= 1);
    assert_int_equal(trace_count(doc, "b", NULL, "wait"), trace_count(doc, "e", NULL, "wait"));

    /* the host device's operations, on its own tracks */
    assert_true(trace_count(doc, "X", "copy", "device") >= 1);
    assert_true(trace_count(doc, "X", "memset", "device") >= 1);
    assert_true(trace_count(doc, "X", "host function", "device") >= 1);
    assert_true(trace_count(doc, "M", "process_name", NULL) >= 2); /* weft, host device 0 */
    expect_ops_carry_their_task(doc);
}

/* ---- tests ----------------------------------------------------------------- */

/* The runtimes of a process that WEFT_TRACE traces are numbered: the n-th
 * writes x.n.json for x.json (the number before the extension, so that the
 * file still opens as JSON), the first x.json. This counts them, so that a
 * test knows which file its runtime writes whatever ran before it. */
static unsigned env_traced;

static weft_runtime *env_runtime(const char *path, unsigned workers, char *writes, size_t size)
{
    setenv("WEFT_TRACE", path, 1);
    weft_runtime *rt = runtime(workers);
    unsetenv("WEFT_TRACE");
    size_t stem = strlen(path) - strlen(".json");
    if (++env_traced == 1)
        snprintf(writes, size, "%s", path);
    else
        snprintf(writes, size, "%.*s.%u.json", (int)stem, path, env_traced);
    return rt;
}

static void test_weft_trace_env_records_runs_waits_and_device_ops(void **state)
{
    char path[256], writes[256];
    (void)state;
    trace_temp_path(path, sizeof path, "env");
    weft_runtime *rt = env_runtime(path, 2, writes, sizeof writes);
    run_work(rt);
    assert_int_equal(weft_trace_start(rt, path), WEFT_ESTATE); /* recording already */
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);

    json *doc = trace_load_checked(writes);
    expect_the_work(doc, 2);
    json_free(doc);
    remove(writes);
}

/* The runtime after another of the same process writes x.N.json, not
 * x.json.N, and both files are complete. */
static void test_weft_trace_env_numbers_a_second_runtime_before_the_extension(void **state)
{
    char path[256], first[256], second[256];
    (void)state;
    trace_temp_path(path, sizeof path, "numbered");
    weft_runtime *a = env_runtime(path, 1, first, sizeof first);
    weft_runtime *b = env_runtime(path, 1, second, sizeof second);
    assert_true(strcmp(second, path) != 0);
    run_work(b);
    assert_int_equal(weft_runtime_destroy(b), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(a), WEFT_OK);

    json *doc = trace_load_checked(second);
    expect_the_work(doc, 1);
    json_free(doc);
    json_free(trace_load_checked(first)); /* no work, still valid JSON */
    remove(first);
    remove(second);
}

static void test_trace_start_and_stop_bound_the_recording(void **state)
{
    char path[256], path2[256];
    (void)state;
    trace_temp_path(path, sizeof path, "startstop");
    trace_temp_path(path2, sizeof path2, "second");
    weft_runtime *rt = runtime(3);
    assert_int_equal(weft_trace_stop(rt), WEFT_ESTATE); /* not recording */
    assert_int_equal(weft_trace_start(rt, NULL), WEFT_EINVAL);
    assert_int_equal(weft_trace_start(rt, "/nonexistent-dir/x.json"), WEFT_ESYS);
    assert_non_null(strstr(weft_last_error(), "/nonexistent-dir/x.json"));
    assert_int_equal(weft_trace_start(NULL, path), WEFT_EINVAL);

    run_work(rt); /* not recorded */
    assert_int_equal(weft_trace_start(rt, path), WEFT_OK);
    run_work(rt);
    assert_int_equal(weft_trace_stop(rt), WEFT_OK);
    run_work(rt); /* not recorded either */
    assert_int_equal(weft_trace_stop(rt), WEFT_ESTATE);

    json *doc = trace_load_checked(path);
    expect_the_work(doc, 3);
    assert_int_equal(runs_named(doc, "producer") <= 50, 1);
    size_t roots = runs_named(doc, "root");
    json_free(doc);

    /* a second session on the same runtime writes a second file alike */
    assert_int_equal(weft_trace_start(rt, path2), WEFT_OK);
    run_work(rt);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK); /* stops it */
    doc = trace_load_checked(path2);
    expect_the_work(doc, 3);
    assert_true(runs_named(doc, "root") >= 2 && roots >= 2);
    json_free(doc);
    remove(path);
    remove(path2);
    assert_int_equal(weft_trace_stop(rt), WEFT_ESTATE); /* destroyed */
}

/* Tasks cancelled before they ran, cancelled while waiting, and left
 * waiting on a channel until the runtime's end: the file is still whole. */
static void *wait_forever(void *arg)
{
    int v;
    return weft_chan_recv(arg, &v) == WEFT_ECANCELED ? NULL : (void *)1;
}

static void test_trace_is_valid_json_when_tasks_fail(void **state)
{
    char path[256];
    weft_chan *ch;
    weft_task *ts[40];
    (void)state;
    trace_temp_path(path, sizeof path, "fail");
    weft_runtime *rt = runtime(2);
    assert_int_equal(weft_trace_start(rt, path), WEFT_OK);
    assert_int_equal(weft_chan_create(&ch, sizeof(int), 1), WEFT_OK);
    for (int i = 0; i < 40; i++) {
        weft_task_opts o = {.name = i % 2 ? "doomed \"quoted\" \\ name\n" : "d\xc3\xa9j\xc3\xa0"};
        assert_int_equal(weft_spawn(rt, &ts[i], wait_forever, ch, &o), WEFT_OK);
        if (i % 4 == 0)
            weft_cancel(ts[i]); /* maybe before it ever runs */
    }
    sleep_ms(20);
    for (int i = 0; i < 40; i++)
        weft_cancel(ts[i]);
    for (int i = 0; i < 40; i++)
        assert_int_equal(weft_join(ts[i], NULL), WEFT_ETASKCANCELED);
    for (int i = 0; i < 8; i++) /* still waiting as the runtime ends: the close ends them */
        assert_int_equal(weft_spawn(rt, NULL, wait_forever, ch, NULL), WEFT_OK);
    sleep_ms(5);
    weft_chan_close(ch);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    weft_chan_destroy(ch);

    json *doc = trace_load_checked(path);
    assert_true(runs_named(doc, "doomed \"quoted\" \\ name\n") >= 1);
    assert_true(runs_named(doc, "d\xc3\xa9j\xc3\xa0") >= 1);
    assert_true(trace_count(doc, "b", "wait: chan recv", "wait") >= 1);
    json_free(doc);
    remove(path);
}

/* Stopping and starting while tasks keep running on every worker, with
 * enough events to fill many buffers: every file is whole. */
static atomic_int stop_spinning;

static void *ping(void *arg)
{
    weft_chan **chs = arg;
    int v = 0;
    while (!atomic_load(&stop_spinning)) {
        if (weft_chan_send(chs[0], &v) || weft_chan_recv(chs[1], &v))
            return (void *)1;
        if (weft_host_async(touch, &v) || weft_await())
            return (void *)1;
    }
    return NULL;
}

static void *pong(void *arg)
{
    weft_chan **chs = arg;
    int v;
    for (;;) {
        int rc = weft_chan_recv(chs[0], &v);
        if (rc == WEFT_ECLOSED)
            return NULL;
        if (rc || weft_chan_send(chs[1], &v))
            return (void *)1;
    }
}

static void test_trace_stops_and_restarts_while_tasks_run(void **state)
{
    enum { PAIRS = 4, SESSIONS = 3 };
    char paths[SESSIONS][256];
    weft_chan *chs[PAIRS][2];
    weft_task *pings[PAIRS], *pongs[PAIRS];
    (void)state;
    weft_runtime *rt = runtime(4);
    atomic_store(&stop_spinning, 0);
    for (int p = 0; p < PAIRS; p++) {
        weft_task_opts po = {.name = "ping"}, qo = {.name = "pong"};
        assert_int_equal(weft_chan_create(&chs[p][0], sizeof(int), 0), WEFT_OK);
        assert_int_equal(weft_chan_create(&chs[p][1], sizeof(int), 0), WEFT_OK);
        assert_int_equal(weft_spawn(rt, &pings[p], ping, chs[p], &po), WEFT_OK);
        assert_int_equal(weft_spawn(rt, &pongs[p], pong, chs[p], &qo), WEFT_OK);
    }
    for (int k = 0; k < SESSIONS; k++) {
        char what[16];
        snprintf(what, sizeof what, "restart%d", k);
        trace_temp_path(paths[k], sizeof paths[k], what);
        sleep_ms(10);
        assert_int_equal(weft_trace_start(rt, paths[k]), WEFT_OK);
        sleep_ms(70); /* longer than the writer's period */
        assert_int_equal(weft_trace_stop(rt), WEFT_OK);
    }
    atomic_store(&stop_spinning, 1);
    for (int p = 0; p < PAIRS; p++) {
        void *r = (void *)1;
        assert_int_equal(weft_join(pings[p], &r), WEFT_OK);
        assert_null(r);
        weft_chan_close(chs[p][0]);
        assert_int_equal(weft_join(pongs[p], &r), WEFT_OK);
        assert_null(r);
        weft_chan_destroy(chs[p][0]);
        weft_chan_destroy(chs[p][1]);
    }
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    for (int k = 0; k < SESSIONS; k++) {
        json *doc = trace_load_checked(paths[k]);
        assert_true(runs_named(doc, "ping") >= 1);
        assert_true(runs_named(doc, "pong") >= 1);
        assert_true(trace_count(doc, "X", "host function", "device") >= 1);
        json_free(doc);
        remove(paths[k]);
    }
}

/* With a profiler announced (NVTX's injection variable; here one that does
 * not exist, so NVTX stays inert) the hooks run for NVTX ranges without a
 * trace recording: the work is unaffected and nothing is written. Then a
 * trace recorded alongside holds the work as usual. */
static void test_profiler_hooks_without_a_trace_change_nothing(void **state)
{
    char path[256];
    (void)state;
    trace_temp_path(path, sizeof path, "nvtx");
    remove(path);
    setenv("NVTX_INJECTION64_PATH", "/nonexistent/libinjection.so", 1);
    weft_runtime *rt = runtime(2);
    unsetenv("NVTX_INJECTION64_PATH");
    run_work(rt);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(weft_trace_start(rt, path), WEFT_OK);
    run_work(rt);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    json *doc = trace_load_checked(path);
    expect_the_work(doc, 2);
    json_free(doc);
    remove(path);
}

/* The checker itself refuses what is not a trace: a test of the test. */
static void test_trace_checker_refuses_broken_files(void **state)
{
    static const char *bad[] = {
        "{\"traceEvents\":[{\"ph\":\"X\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":0,\"dur\":1}",
        "{\"traceEvents\":[1,]}",
        "{\"traceEvents\":[{\"ph\":\"X\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":0,\"dur\":-1}]}",
        /* a wait that never ends */
        "{\"traceEvents\":[{\"ph\":\"b\",\"cat\":\"w\",\"id\":\"1\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":5}]}",
        "{\"traceEvents\":[{\"ph\":\"X\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":0,\"dur\":1}]}",
        "{\"traceEvents\":[]} x",
        "{\"traceEvents\":[\"\xc3\"]}",
    };
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char error[256] = "";
        json *doc = json_parse(bad[i], strlen(bad[i]), error, sizeof error);
        bool ok = doc && trace_check(doc, error, sizeof error);
        json_free(doc);
        if (ok)
            fail_msg("accepted broken trace %zu: %s", i, bad[i]);
    }
    const char *good = "{\"traceEvents\":[{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,"
                       "\"args\":{\"name\":\"p\"}},{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":"
                       "1,\"tid\":2,\"args\":{\"name\":\"t\"}},{\"ph\":\"X\",\"name\":\"a\",\"pid\":"
                       "1,\"tid\":2,\"ts\":1.5,\"dur\":0}]}";
    char error[256];
    json *doc = json_parse(good, strlen(good), error, sizeof error);
    assert_non_null(doc);
    assert_true(trace_check(doc, error, sizeof error));
    json_free(doc);
}

/* ---- what devices report as a session stops ------------------------------ */

/* A backend whose operations' times arrive later reports the rest from
 * the stop's hook, on a thread of its own (CUPTI delivers on its thread):
 * those operations are in the file, and the hook runs once a stop, and
 * not for a stop with no session. */
typedef struct late {
    weft__trace *tr;
    int starts, stops;
    uint64_t t0;
} late;

/* As a device gets ready: the session it readies for is recording. */
static void after_start(void *arg)
{
    late *l = arg;
    assert_true(weft__trace_recording(l->tr));
    l->starts++;
}

static void *report_late(void *arg)
{
    late *l = arg;
    weft__trace_op(l->tr, 0, 3, WEFT__OP_KERNEL, "late_kernel", 0, 0, l->t0, l->t0 + 1000);
    return NULL;
}

static void before_stop(void *arg)
{
    late *l = arg;
    pthread_t reporter;
    l->stops++;
    assert_int_equal(pthread_create(&reporter, NULL, report_late, l), 0);
    pthread_join(reporter, NULL);
}

static void test_trace_start_and_stop_let_devices_prepare_and_report(void **state)
{
    char path[256];
    weft__trace *tr;
    (void)state;
    trace_temp_path(path, sizeof path, "late");
    assert_int_equal(weft__trace_create(&tr), WEFT_OK);
    late l = {tr, 0, 0, 0};
    weft__trace_hooks(tr, after_start, before_stop, &l);
    assert_int_equal(weft__trace_stop(tr, "test"), WEFT_ESTATE);
    assert_int_equal(l.stops, 0);
    assert_int_equal(weft__trace_start(tr, "", "test"), WEFT_EINVAL);
    assert_int_equal(l.starts, 0);

    assert_int_equal(weft__trace_start(tr, path, "test"), WEFT_OK);
    assert_int_equal(l.starts, 1);
    assert_int_equal(weft__trace_start(tr, path, "test"), WEFT_ESTATE); /* one at a time */
    assert_int_equal(l.starts, 1);
    l.t0 = weft__now_ns();
    assert_int_equal(weft__trace_stop(tr, "test"), WEFT_OK);
    assert_int_equal(l.stops, 1);
    json *doc = trace_load_checked(path);
    assert_int_equal(trace_count(doc, "X", "late_kernel", "device"), 1);
    json_free(doc);
    weft__trace_destroy(tr); /* no session: no hook */
    assert_int_equal(l.stops, 1);
    remove(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_start_and_stop_let_devices_prepare_and_report),
        cmocka_unit_test(test_trace_checker_refuses_broken_files),
        cmocka_unit_test(test_weft_trace_env_records_runs_waits_and_device_ops),
        cmocka_unit_test(test_weft_trace_env_numbers_a_second_runtime_before_the_extension),
        cmocka_unit_test(test_trace_start_and_stop_bound_the_recording),
        cmocka_unit_test(test_trace_is_valid_json_when_tasks_fail),
        cmocka_unit_test(test_trace_stops_and_restarts_while_tasks_run),
        cmocka_unit_test(test_profiler_hooks_without_a_trace_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
