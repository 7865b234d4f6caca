/*
 * report.c - weft explains its own run: the diagnosis of weft_stats_report.
 *
 * It reads every layer's counters (the scheduler's per-worker sums, each
 * device's per-stream sums, the task and event pools at destroy), so it
 * lives at the composition root beside runtime.c; the counters stay in
 * the layers that own them. Each diagnosis compares a figure with a
 * threshold (docs/guide.md, "Reading a run", gives each one's reason) and,
 * when it is crossed, writes the symptom, the figure and the remedy. A
 * healthy run writes nothing: every diagnosis asks for enough of the run
 * (work done, time passed) that a short or idle run cannot cross it.
 *
 * Reading costs locks on slow paths only (stream pools, the event pool), so
 * a report may be taken at any time; the leftovers at destroy are looked
 * for only once no task is running.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "device/event.h"
#include "runtime.h"

/* Thresholds; docs/guide.md says why each is where it is. */
#define STALL_SHARE 0.5          /* of the workers' time */
#define STALL_MIN_NS 10000000ull /* runs shorter than 10 ms are not judged */
#define SERIAL_MIN_AWAITS 16     /* rounds of device work before "never overlapped" */
#define PAGEABLE_SHARE 0.5       /* of host-device bytes */
#define PAGEABLE_MIN_BYTES (16ull << 20)
#define COPY_SHARE 0.5          /* of device busy time */
#define COPY_MIN_NS 10000000ull /* copies run less than 10 ms are not judged */
#define LAUNCH_MIN 1000         /* eager launches before launch cost is judged */
#define LAUNCH_BUSY_NS 10000.0  /* device time per launch below which launches dominate */
#define LAUNCH_PER_AWAIT 4.0    /* launches per await: a sequence a region could hold */

/* ---- the counters ----------------------------------------------------------- */

/* The devices' sums, zero before the first device call. */
static void device_stats(weft_runtime *rt, weft__device_stats *sum)
{
    *sum = (weft__device_stats){0};
    if (!atomic_load_explicit(&rt->devices_ready, memory_order_acquire))
        return;
    for (unsigned i = 0; i < rt->ndevices; i++)
        if (rt->devices[i]->ops->stats)
            rt->devices[i]->ops->stats(rt->devices[i], sum);
}

void weft__stats_devices(weft_runtime *rt, weft_stats *stats)
{
    weft__device_stats sum;
    device_stats(rt, &sum);
    stats->elapsed_ns = weft__now_ns() - rt->created_ns;
    stats->streams_max = sum.leases_max;
    stats->launches = sum.launches;
    memcpy(stats->copy_bytes, sum.copy_bytes, sizeof stats->copy_bytes);
    stats->copy_ns = sum.copy_ns;
}

/* Summed over devices: with several, a stall is undercounted (their busy
 * times overlap), never overcounted. */
uint64_t weft__runtime_busy_ns(void *ctx)
{
    weft_runtime *rt = ctx;
    uint64_t ns = 0;
    if (atomic_load_explicit(&rt->devices_ready, memory_order_acquire))
        for (unsigned i = 0; i < rt->ndevices; i++)
            ns += weft__busy_read(&rt->devices[i]->busy);
    return ns;
}

/* ---- writing ------------------------------------------------------------------ */

/* snprintf's contract over several calls: len counts the whole report. */
typedef struct writer {
    char *buf;
    size_t size, len;
} writer;

__attribute__((format(printf, 2, 3))) static void put(writer *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = w->len < w->size ? w->size - w->len : 0;
    int n = vsnprintf(room ? w->buf + w->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        w->len += (size_t)n;
}

static double share(uint64_t part, uint64_t whole)
{
    return whole ? (double)part / (double)whole : 0.0;
}

static double mib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

static double ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

static uint64_t busy_total(const weft_stats *st)
{
    uint64_t ns = 0;
    for (unsigned i = 0; i < st->devices && i < WEFT_STATS_DEVICES; i++)
        ns += st->device_busy_ns[i];
    return ns;
}

/* ---- the diagnoses ------------------------------------------------------------ */

static void both_idle(writer *w, const weft_stats *st, unsigned workers)
{
    uint64_t worker_ns = st->elapsed_ns * workers;
    double stalled = share(st->stalled_ns, worker_ns);
    if (!st->awaits || st->elapsed_ns < STALL_MIN_NS || stalled < STALL_SHARE)
        return;
    put(w,
        "weft: GPU and CPU idle together: workers slept %.0f%% of their time (%.1f ms of %.1f "
        "ms over %u workers) with tasks alive, nothing ready to run and no device work "
        "outstanding; the devices were busy %.0f%% of the run.\n"
        "  remedy: keep more tasks in flight (a task per item or per stage, not a few tasks "
        "doing items in turn); look at what the tasks wait for instead (timers, channels fed "
        "slowly, weft_blocking).\n",
        100 * stalled, ms(st->stalled_ns), ms(worker_ns), workers,
        100 * share(busy_total(st), st->elapsed_ns));
}

static void never_overlapped(writer *w, const weft_stats *st)
{
    if (st->streams_max != 1 || st->awaits < SERIAL_MIN_AWAITS)
        return;
    put(w,
        "weft: device work never overlapped: at most 1 stream in use at once over %llu "
        "awaits: everything ran in order on one stream.\n"
        "  remedy: a task's work runs in order on its one stream; run independent items as "
        "separate tasks, whose streams run at once.\n",
        (unsigned long long)st->awaits);
}

static void copies(writer *w, const weft_stats *st)
{
    uint64_t pageable = st->copy_bytes[WEFT_COPY_PAGEABLE];
    uint64_t across = pageable + st->copy_bytes[WEFT_COPY_PINNED];
    if (pageable >= PAGEABLE_MIN_BYTES && share(pageable, across) >= PAGEABLE_SHARE)
        put(w,
            "weft: copies from pageable memory: %.1f MiB of the %.1f MiB copied between host "
            "and device (%.0f%%) went through plain host memory, which CUDA stages.\n"
            "  remedy: allocate the host side with weft_host_alloc (pinned: copies run at "
            "full speed and overlap kernels) or weft_mapped_alloc (kernels read it in "
            "place).\n",
            mib(pageable), mib(across), 100 * share(pageable, across));
    uint64_t busy = busy_total(st);
    double timed = share(st->copy_ns, busy);
    if (st->copy_ns >= COPY_MIN_NS && timed >= COPY_SHARE)
        put(w,
            "weft: copies dominate: they ran %.1f ms of the devices' %.1f ms busy (%.0f%%).\n"
            "  remedy: the run is bound by moving data: copy less (keep data on the device "
            "between steps), let copies of some tasks overlap the compute of others, and copy "
            "from pinned memory (weft_host_alloc) on a GPU.\n",
            ms(st->copy_ns), ms(busy), 100 * (timed > 1 ? 1 : timed));
}

static void launch_bound(writer *w, const weft_stats *st)
{
    if (st->launches < LAUNCH_MIN || !st->awaits)
        return;
    double busy_per = (double)busy_total(st) / (double)st->launches;
    double per_await = (double)st->launches / (double)st->awaits;
    if (busy_per >= LAUNCH_BUSY_NS || per_await < LAUNCH_PER_AWAIT)
        return;
    put(w,
        "weft: kernels dominated by launch cost: %llu kernels launched one by one, %.1f per "
        "await, with %.2f us of device time each.\n"
        "  remedy: enqueue the repeating sequence between weft_region_begin(key) and "
        "weft_region_end() to replay it as one CUDA graph, or fuse the kernels.\n",
        (unsigned long long)st->launches, per_await, busy_per / 1e3);
}

static void left(writer *w, uint64_t n, const char *what, const char *how)
{
    if (n)
        put(w, " %llu %s%s %s;", (unsigned long long)n, what, n == 1 ? "" : "s", how);
}

/* What a runtime leaves behind at destroy: no task runs any more. */
static void leftovers(writer *w, weft_runtime *rt)
{
    uint64_t unjoined = weft__task_unjoined(rt), events = 0;
    weft__device_stats sum;
    device_stats(rt, &sum);
    if ((int64_t)sum.device_blocks < 0) /* more freed here than allocated: others' blocks */
        sum.device_blocks = 0;
    if (atomic_load_explicit(&rt->devices_ready, memory_order_acquire))
        for (unsigned i = 0; i < rt->ndevices; i++)
            events += weft__events_live(rt->devices[i]);
    if (!unjoined && !events && !sum.host_blocks && !sum.device_blocks)
        return;
    put(w, "weft: resources left at destroy:");
    left(w, unjoined, "task", "never joined nor detached");
    left(w, events, "event", "never destroyed");
    left(w, sum.host_blocks, "host block", "never freed");
    left(w, sum.device_blocks, "device block", "never freed");
    put(w, "\n  remedy: join every task's handle or detach it; give back events with "
           "weft_event_destroy, weft_host_alloc's and weft_mapped_alloc's blocks with "
           "weft_host_free and weft_mapped_free, weft_malloc_async's with weft_free_async.\n");
}

static size_t report(weft_runtime *rt, char *buf, size_t size, bool at_destroy)
{
    writer w = {buf, size, 0};
    weft_stats st;
    if (size)
        buf[0] = '\0';
    weft__stats_read(rt, &st);
    if (st.devices) {
        both_idle(&w, &st, weft__sched_workers(rt->tasks.sched));
        never_overlapped(&w, &st);
        copies(&w, &st);
        launch_bound(&w, &st);
    }
    if (at_destroy)
        leftovers(&w, rt);
    return w.len;
}

int weft_stats_report(weft_runtime *rt, char *buf, size_t size)
{
    if (!buf && size)
        return weft__fail(WEFT_EINVAL, "weft_stats_report: buf is NULL and size is %zu", size);
    int rc = weft__runtime_enter(rt, "weft_stats_report");
    if (rc)
        return rc;
    size_t len = report(rt, buf, size, false);
    weft__runtime_leave(rt);
    if (len > (size_t)INT32_MAX)
        return weft__fail(WEFT_ENOMEM, "weft_stats_report: the report is %zu bytes", len);
    return (int)len;
}

/* WEFT_REPORT=1: to stderr; WEFT_REPORT=FILE: appended to FILE (stderr
 * says so if it cannot be opened). Unset, empty or 0: nothing. */
void weft__report_at_destroy(weft_runtime *rt)
{
    const char *to = getenv("WEFT_REPORT");
    if (!to || !*to || strcmp(to, "0") == 0)
        return;
    char text[8192]; /* every diagnosis at once takes a quarter of it */
    if (report(rt, text, sizeof text, true) == 0)
        return; /* healthy: silent */
    bool to_stderr = strcmp(to, "1") == 0;
    FILE *out = to_stderr ? stderr : fopen(to, "a");
    if (!out)
        fprintf(stderr, "weft: WEFT_REPORT: cannot open %s; the report follows\n%s", to, text);
    else {
        fputs(text, out);
        if (!to_stderr)
            fclose(out);
    }
}
