/*
 * runtime.c - creating and destroying runtimes.
 *
 * Creation starts the layers bottom-up (stacks, timers, workers); the device
 * waits for the first device call. Destruction closes the runtime to calls
 * from outside its tasks, waits until no such call is in progress and no
 * task is left, then stops the layers top-down. Dead runtime records are
 * kept on a list and reused, so a stale weft_runtime * is recognized rather
 * than dereferenced after free.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"
#include "core/sized.h"

/* The task layer reaches its share by a cast (task/tasks.h). */
_Static_assert(offsetof(weft_runtime, tasks) == 0, "a runtime begins with its tasks' share");

#define DEFAULT_STACK (256 * 1024)
#define MAX_WORKERS 4096

static pthread_mutex_t dead_lock = PTHREAD_MUTEX_INITIALIZER;
static weft_runtime *dead_runtimes;

static weft_runtime *record_get(void)
{
    pthread_mutex_lock(&dead_lock);
    weft_runtime *rt = dead_runtimes;
    if (rt)
        dead_runtimes = rt->next_dead;
    pthread_mutex_unlock(&dead_lock);
    if (!rt && !(rt = calloc(1, sizeof *rt)))
        return NULL;
    /* Keep state DEAD and calls closed while we build: a stale handle must
     * not get in yet. The task records stay for this life. */
    memset(&rt->tasks.sched, 0, sizeof rt->tasks - offsetof(weft__tasks, sched));
    memset(&rt->cfg, 0, sizeof *rt - offsetof(weft_runtime, cfg));
    return rt;
}

static void record_put(weft_runtime *rt)
{
    atomic_store(&rt->tasks.state, WEFT__RT_DEAD);
    pthread_mutex_lock(&dead_lock);
    rt->next_dead = dead_runtimes;
    dead_runtimes = rt;
    pthread_mutex_unlock(&dead_lock);
}

/* The first sized layout (weft 0.1), which size 0 stands for: fixed for
 * good, however the structs grow. */
#define CONFIG_SIZE_0_1 (offsetof(weft_config, blocking_threads) + sizeof(unsigned))

static int fill_config(weft_config *cfg, const weft_config *given)
{
    int rc;
    memset(cfg, 0, sizeof *cfg); /* the defaults, whatever given's size covers */
    if (given && (rc = weft__sized_in(cfg, sizeof *cfg, given, CONFIG_SIZE_0_1,
                                      "weft_runtime_create", "cfg")))
        return rc;
    if (cfg->workers > MAX_WORKERS)
        return weft__fail(WEFT_EINVAL, "weft_runtime_create: %u workers is more than %d",
                          cfg->workers, MAX_WORKERS);
    if (cfg->stack_size && (cfg->stack_size < WEFT__STACK_MIN || cfg->stack_size > WEFT__STACK_MAX))
        return weft__fail(WEFT_EINVAL, "weft_runtime_create: stack_size %zu is outside [%zu, %zu]",
                          cfg->stack_size, WEFT__STACK_MIN, WEFT__STACK_MAX);
    if (cfg->backend != WEFT_BACKEND_AUTO && cfg->backend != WEFT_BACKEND_HOST &&
        cfg->backend != WEFT_BACKEND_CUDA)
        return weft__fail(WEFT_EINVAL, "weft_runtime_create: backend %d is not a weft_backend",
                          (int)cfg->backend);
    if (cfg->host_threads > MAX_WORKERS)
        return weft__fail(WEFT_EINVAL, "weft_runtime_create: %u host threads is more than %d",
                          cfg->host_threads, MAX_WORKERS);
    if (cfg->blocking_threads > MAX_WORKERS)
        return weft__fail(WEFT_EINVAL, "weft_runtime_create: %u blocking threads is more than %d",
                          cfg->blocking_threads, MAX_WORKERS);
    if (!cfg->workers) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        cfg->workers = n > 0 ? (unsigned)n : 1;
    }
    if (!cfg->stack_size)
        cfg->stack_size = DEFAULT_STACK;
    if (!cfg->graph_cache)
        cfg->graph_cache = 256;
    return WEFT_OK;
}

/* ---- devices ----------------------------------------------------------- */

/* Idle workers poll the devices' completion engines through this. */
static unsigned poll_devices(void *ctx)
{
    weft_runtime *rt = ctx;
    unsigned fired = 0;
    for (unsigned i = 0; i < rt->ndevices; i++)
        fired += rt->devices[i]->ops->poll(rt->devices[i]);
    return fired;
}

static bool devices_pending(void *ctx)
{
    weft_runtime *rt = ctx;
    for (unsigned i = 0; i < rt->ndevices; i++)
        if (rt->devices[i]->ops->pending(rt->devices[i]))
            return true;
    return false;
}

static void kick_sched(void *sched)
{
    weft__sched_kick(sched);
}

static int devices_create(weft_runtime *rt)
{
    int rc = WEFT_OK;
    if (rt->cfg.backend != WEFT_BACKEND_HOST) {
        if ((rc = weft__cuda_devices_create(&rt->devices, &rt->ndevices, rt->cfg.graph_cache)))
            return rc;
        if (rt->ndevices == 0 && rt->cfg.backend == WEFT_BACKEND_CUDA)
            return weft__fail(WEFT_EDEVICE, "device: no GPU found for the CUDA backend");
    }
    if (rt->ndevices == 0) {
        if (!(rt->devices = calloc(1, sizeof *rt->devices)))
            return weft__fail(WEFT_ENOMEM, "device: out of memory");
        if ((rc = weft__host_device_create(&rt->devices[0], rt->cfg.host_threads))) {
            free(rt->devices);
            rt->devices = NULL;
            return rc;
        }
        rt->ndevices = 1;
    }
    bool polled = rt->devices[0]->ops->poll != NULL;
    if (polled)
        weft__sched_set_poller(rt->tasks.sched, WEFT__POLL_DEVICES, poll_devices, devices_pending,
                               rt);
    for (unsigned i = 0; i < rt->ndevices; i++) {
        weft__device *dev = rt->devices[i];
        char name[32];
        bool gpu = strcmp(dev->ops->name, "cuda") == 0;
        snprintf(name, sizeof name, gpu ? "GPU %u" : "host device %u", i);
        weft__trace_name_device(rt->tasks.trace, i, name);
        dev->trace = rt->tasks.trace;
        dev->index = i;
        if (polled) {
            dev->kick = kick_sched;
            dev->kick_ctx = rt->tasks.sched;
        }
    }
    return WEFT_OK;
}

static int runtime_devices(weft_runtime *rt, weft__device ***devs, unsigned *n)
{
    int rc = WEFT_OK;
    if (!atomic_load_explicit(&rt->devices_ready, memory_order_acquire)) {
        pthread_mutex_lock(&rt->device_lock);
        if (!atomic_load(&rt->devices_ready) && (rc = devices_create(rt)) == WEFT_OK)
            atomic_store_explicit(&rt->devices_ready, true, memory_order_release);
        pthread_mutex_unlock(&rt->device_lock);
        if (rc)
            return rc; /* the backend said why */
    }
    *devs = rt->devices;
    *n = rt->ndevices;
    return WEFT_OK;
}

static void devices_destroy(weft_runtime *rt)
{
    /* idle workers poll the devices and probe their busy time */
    weft__sched_clear_idle_probe(rt->tasks.sched);
    weft__sched_clear_poller(rt->tasks.sched, WEFT__POLL_DEVICES);
    for (unsigned i = 0; i < rt->ndevices; i++)
        rt->devices[i]->ops->destroy(rt->devices[i]);
    free(rt->devices);
    rt->devices = NULL;
    rt->ndevices = 0;
}

/* ---- tracing ------------------------------------------------------------ */

/* WEFT_TRACE=FILE: the first runtime of the process writes FILE, the n-th
 * FILE.n (before FILE's extension, if it has one: trace.3.json). A file
 * that cannot be opened is reported on stderr; the runtime runs untraced. */
static void trace_from_environment(weft_runtime *rt)
{
    static atomic_uint traced;
    const char *path = getenv("WEFT_TRACE");
    if (!path || !*path)
        return;
    unsigned n = atomic_fetch_add(&traced, 1) + 1;
    char numbered[4096];
    if (n > 1) {
        const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
        int stem = dot && dot > (slash ? slash : path) ? (int)(dot - path) : (int)strlen(path);
        snprintf(numbered, sizeof numbered, "%.*s.%u%s", stem, path, n, path + stem);
        path = numbered;
    }
    if (weft__trace_start(rt->tasks.trace, path, "WEFT_TRACE") != WEFT_OK)
        fprintf(stderr, "weft: %s; not tracing\n", weft_last_error());
}

/* As a trace session starts, the devices get ready to time operations
 * (trace_prepare); as it stops, they report the operations whose times
 * they have yet to receive (trace_flush). Devices not set up yet have
 * neither to do: they get ready with their first operation. */
static void device_timings(weft_runtime *rt, bool starting)
{
    if (!atomic_load_explicit(&rt->devices_ready, memory_order_acquire))
        return;
    for (unsigned i = 0; i < rt->ndevices; i++) {
        weft__device *dev = rt->devices[i];
        void (*op)(weft__device *) = starting ? dev->ops->trace_prepare : dev->ops->trace_flush;
        if (op)
            op(dev);
    }
}

static void prepare_device_timings(void *rt)
{
    device_timings(rt, true);
}

static void report_device_timings(void *rt)
{
    device_timings(rt, false);
}

int weft_trace_start(weft_runtime *rt, const char *path)
{
    int rc = weft__runtime_enter(rt, "weft_trace_start");
    if (rc)
        return rc;
    rc = weft__trace_start(rt->tasks.trace, path, "weft_trace_start");
    weft__runtime_leave(rt);
    return rc;
}

int weft_trace_stop(weft_runtime *rt)
{
    int rc = weft__runtime_enter(rt, "weft_trace_stop");
    if (rc)
        return rc;
    rc = weft__trace_stop(rt->tasks.trace, "weft_trace_stop");
    weft__runtime_leave(rt);
    return rc;
}

/* ---- creating and destroying --------------------------------------------- */

int weft_runtime_create(weft_runtime **out, const weft_config *given)
{
    weft_config cfg;
    weft__error_set_lookup(weft__task_errbuf); /* messages of tasks go to the task */
    if (!out)
        return weft__fail(WEFT_EINVAL, "weft_runtime_create: rt is NULL");
    int rc = fill_config(&cfg, given);
    if (rc)
        return rc;
    weft_runtime *rt = record_get();
    if (!rt)
        return weft__fail(WEFT_ENOMEM, "weft_runtime_create: out of memory");
    rt->cfg = cfg;
    rt->tasks.stack_size = cfg.stack_size;
    rt->tasks.devices = runtime_devices;
    rt->tasks.task_exit = weft__device_task_exit;
    pthread_mutex_init(&rt->tasks.idle_lock, NULL);
    pthread_cond_init(&rt->tasks.idle, NULL);
    pthread_mutex_init(&rt->tasks.pool_lock, NULL);
    pthread_mutex_init(&rt->device_lock, NULL);
    weft__blocking_init(&rt->tasks.blocking, cfg.blocking_threads);

    if (weft__trace_create(&rt->tasks.trace) != WEFT_OK) {
        rc = weft__fail(WEFT_ENOMEM, "weft_runtime_create: out of memory");
        goto fail_locks;
    }
    weft__trace_hooks(rt->tasks.trace, prepare_device_timings, report_device_timings, rt);
    if (weft__overflow_install() != 0) {
        rc = weft__fail(WEFT_ESYS, "weft_runtime_create: cannot install the overflow handler");
        goto fail_locks;
    }
    if (weft__stack_pool_create(&rt->tasks.stacks, cfg.stack_size) != 0) {
        rc = weft__fail(WEFT_ENOMEM, "weft_runtime_create: no memory for the stack pool");
        goto fail_locks;
    }
    if ((rc = weft__timers_create(&rt->tasks.timers))) {
        weft__fail(rc, "weft_runtime_create: cannot start the timer thread");
        goto fail_stacks;
    }
    if ((rc = weft__sched_create(&rt->tasks.sched, cfg.workers, rt->tasks.stacks))) {
        weft__fail(rc, "weft_runtime_create: cannot start %u workers", cfg.workers);
        goto fail_timers;
    }
    rt->created_ns = weft__now_ns();
    weft__sched_set_idle_probe(rt->tasks.sched, weft__runtime_busy_ns, rt);
    if (cfg.backend == WEFT_BACKEND_CUDA) { /* asked for GPUs: fail now if there are none */
        weft__device **devs;
        unsigned n;
        if ((rc = weft__runtime_devices(rt, &devs, &n)))
            goto fail_sched;
    }
    trace_from_environment(rt);
    atomic_store(&rt->tasks.state, WEFT__RT_LIVE);
    /* Release: a call let in sees the runtime built. */
    atomic_fetch_or_explicit(&rt->tasks.calls, WEFT__RT_OPEN, memory_order_release);
    *out = rt;
    return WEFT_OK;

fail_sched:
    weft__sched_destroy(rt->tasks.sched);

fail_timers:
    weft__timers_destroy(rt->tasks.timers);
fail_stacks:
    weft__stack_pool_destroy(rt->tasks.stacks);
fail_locks:
    weft__trace_destroy(rt->tasks.trace);
    pthread_mutex_destroy(&rt->tasks.idle_lock);
    pthread_cond_destroy(&rt->tasks.idle);
    pthread_mutex_destroy(&rt->tasks.pool_lock);
    pthread_mutex_destroy(&rt->device_lock);
    weft__blocking_fini(&rt->tasks.blocking);
    record_put(rt);
    return rc;
}

int weft_runtime_destroy(weft_runtime *rt)
{
    if (!rt)
        return weft__fail(WEFT_EINVAL, "weft_runtime_destroy: runtime is NULL");
    weft__task *self = weft__task_self();
    if (self && self->rt == rt)
        return weft__fail(WEFT_EDEADLK,
                          "weft_runtime_destroy: called from a task of the same runtime");
    unsigned live = WEFT__RT_LIVE;
    if (!atomic_compare_exchange_strong(&rt->tasks.state, &live, WEFT__RT_DYING))
        return weft__fail(WEFT_ESTATE, live == WEFT__RT_DYING
                                           ? "weft_runtime_destroy: the runtime is being destroyed"
                                           : "weft_runtime_destroy: the runtime was destroyed");
    atomic_fetch_and(&rt->tasks.calls, ~WEFT__RT_OPEN); /* from now on only rt's tasks get in */

    /* Calls from outside first: a spawn among them is counted before it
     * leaves, so once none is left the live count below includes its task.
     * Tasks are counted per worker (no shared counter on the hot path): look
     * again whenever a call or a task ends, and every few milliseconds in
     * case an end came just before we started to look. */
    pthread_mutex_lock(&rt->tasks.idle_lock);
    while (atomic_load_explicit(&rt->tasks.calls, memory_order_acquire) != 0 ||
           weft__sched_live(rt->tasks.sched) > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 5000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&rt->tasks.idle, &rt->tasks.idle_lock, &until);
    }
    pthread_mutex_unlock(&rt->tasks.idle_lock);
    weft__report_at_destroy(rt); /* WEFT_REPORT: the run's diagnosis */

    /* Top-down: device executors and the timer thread may still be waking
     * the last tasks, so they stop before the workers they wake. */
    devices_destroy(rt);
    weft__blocking_fini(&rt->tasks.blocking); /* idle: every task that used it ended */
    weft__timers_destroy(rt->tasks.timers);
    weft__sched_destroy(rt->tasks.sched);
    weft__trace_destroy(rt->tasks.trace); /* every thread that records has stopped */
    weft__task_pool_retire(rt);
    weft__stack_pool_destroy(rt->tasks.stacks);
    pthread_mutex_destroy(&rt->tasks.idle_lock);
    pthread_cond_destroy(&rt->tasks.idle);
    pthread_mutex_destroy(&rt->tasks.pool_lock);
    pthread_mutex_destroy(&rt->device_lock);
    record_put(rt);
    return WEFT_OK;
}

weft_runtime *weft_runtime_current(void)
{
    weft__task *t = weft__task_self();
    return t ? t->rt : NULL;
}

int weft_stats_get_sized(weft_runtime *rt, weft_stats *stats, size_t size)
{
    if (!stats)
        return weft__fail(WEFT_EINVAL, "weft_stats_get: stats is NULL");
    if (size < sizeof stats->size)
        return weft__fail(WEFT_EINVAL, "weft_stats_get: %zu bytes is smaller than the size field",
                          size);
    int rc = weft__runtime_enter(rt, "weft_stats_get");
    if (rc != WEFT_OK)
        return rc;
    weft_stats all = {0};
    weft__stats_read(rt, &all);
    weft__runtime_leave(rt);
    weft__sized_out(stats, size, &all, sizeof all);
    return WEFT_OK;
}

void weft__stats_read(weft_runtime *rt, weft_stats *stats)
{
    weft__sched_stats(rt->tasks.sched, stats);
    stats->devices = 0;
    stats->graph = (weft_graph_stats){0};
    if (atomic_load_explicit(&rt->devices_ready, memory_order_acquire)) {
        stats->devices = rt->ndevices;
        for (unsigned i = 0; i < rt->ndevices; i++) {
            weft__device *dev = rt->devices[i];
            if (i < WEFT_STATS_DEVICES)
                stats->device_busy_ns[i] = weft__busy_read(&dev->busy);
            if (dev->ops->graph_stats)
                dev->ops->graph_stats(dev, &stats->graph);
        }
    }
    weft__stats_devices(rt, stats);
}

unsigned weft_runtime_workers(const weft_runtime *crt)
{
    weft_runtime *rt = (weft_runtime *)crt; /* entering counts the call in it */
    if (!rt || atomic_load(&rt->tasks.state) != WEFT__RT_LIVE ||
        weft__runtime_enter(rt, "weft_runtime_workers"))
        return 0;
    unsigned n = weft__sched_workers(rt->tasks.sched);
    weft__runtime_leave(rt);
    return n;
}
