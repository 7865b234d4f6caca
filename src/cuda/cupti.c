/*
 * cupti.c - timing GPU operations for the timeline with CUPTI's
 * activity records, in place of CUDA events (the default; WEFT_TRACE_GPU=
 * events or off turns it off).
 *
 * Each timing event is a driver call, and where threads contend for the
 * driver those calls cost a pipeline a quarter of its jobs; CUPTI's
 * records cost about half as much (bench/peers/op_timing.cu, and the
 * pipeline's tracing cost in bench/RESULTS.md). Here an
 * operation a task enqueues is tagged: an external correlation id pushed
 * before the call and popped after it (thread-local, no driver call), and
 * what the operation was (trace, device, stream, task) kept under the tag
 * in a table. CUPTI delivers, in buffers and from a thread of its own,
 * a record of each operation with its start and end (the GPU's clock,
 * which CUPTI converts to weft__now_ns through the timestamp callback),
 * and a record tying the API call's correlation id to the tag. Joining
 * the two names the operation; it is reported from the delivering thread.
 * A record whose other half has not come yet waits a few buffers.
 *
 * CUPTI is process-wide: it starts as a trace starts, so that enabling it
 * is not part of the work it times (or with the first operation it times,
 * on devices not yet in use then), and stops when the last recording
 * trace stops (a stop first flushes what CUPTI holds, through the device's
 * trace_flush). libcupti is opened at run time, so that weft does not
 * depend on it; without it, or when a profiler holds CUPTI, operations are
 * timed with events.
 */
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "cuda/backend.h"

enum {
    TAGS = 1 << 16,         /* operations between enqueue and record (a power of two) */
    CORRELATIONS = 1 << 16, /* API calls' tags kept for their records (likewise) */
    WAITING = 4096,         /* records waiting for the other half of their join */
    WAITING_BUFFERS = 16,   /* ... for at most this many buffers */
    BUFFER_BYTES = 4 << 20,
    FLUSH_PERIOD_MS = 100, /* CUPTI delivers at least this often */
};

/* The CUPTI calls made, looked up in libcupti. */
#define CUPTI_CALLS(X)                                                                             \
    X(cuptiActivityEnable)                                                                         \
    X(cuptiActivityDisable)                                                                        \
    X(cuptiActivityRegisterCallbacks)                                                              \
    X(cuptiActivityRegisterTimestampCallback)                                                      \
    X(cuptiActivityFlushAll)                                                                       \
    X(cuptiActivityFlushPeriod)                                                                    \
    X(cuptiActivityGetNextRecord)                                                                  \
    X(cuptiActivityPushExternalCorrelationId)                                                      \
    X(cuptiActivityPopExternalCorrelationId)                                                       \
    X(cuptiGetResultString)

static struct {
#define CUPTI_POINTER(f) __typeof__(f) *f;
    CUPTI_CALLS(CUPTI_POINTER)
#undef CUPTI_POINTER
} cupti;

/* What is recorded: the operations, and the API calls that carry tags. */
static const CUpti_ActivityKind kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
};
#define NKINDS (sizeof kinds / sizeof *kinds)

enum { CUPTI_OFF, CUPTI_ON, CUPTI_UNAVAILABLE };

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER; /* starting, stopping */
static atomic_int state;
static bool loaded;

/* ---- the tags ------------------------------------------------------------ */

/* What a tagged operation was. */
typedef struct tagged_op {
    weft__trace *trace;
    unsigned device, stream;
    weft__op_kind kind;
    uint64_t task;
    char name[WEFT__TRACE_NAME]; /* a kernel's, else empty */
} tagged_op;

/* A slot of the table, written by the enqueuing thread and read by the
 * delivering one without a lock: tag is 0 while op is being written, and
 * a reader that sees the same tag before and after copying op has it
 * whole. */
typedef struct tag_slot {
    _Atomic uint64_t tag;
    tagged_op op;
} tag_slot;

static atomic_uint_least64_t next_tag = 1;
static tag_slot *tags; /* TAGS slots, from the first start on */

static bool tag_lookup(uint64_t tag, tagged_op *op)
{
    tag_slot *slot = &tags[tag & (TAGS - 1)];
    if (atomic_load_explicit(&slot->tag, memory_order_acquire) != tag)
        return false;
    *op = slot->op;
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&slot->tag, memory_order_relaxed) == tag;
}

/* ---- joining the records ---------------------------------------------- */

/* An API call's correlation id and its tag. */
typedef struct correlation {
    uint32_t id;
    uint64_t tag;
} correlation;

/* An operation's times, as its record gave them. */
typedef struct timing {
    uint32_t correlation;
    weft__op_kind kind;
    uint64_t start, end, bytes;
    unsigned age; /* buffers delivered since it came */
    char name[WEFT__TRACE_NAME];
} timing;

/* Guards the join: records come from CUPTI's thread and from threads that
 * flush. */
static pthread_mutex_t join_lock = PTHREAD_MUTEX_INITIALIZER;
static correlation *correlations; /* CORRELATIONS, from the first start on */
static timing waiting[WAITING];
static unsigned nwaiting;

/* Report r if both its halves have come. */
static bool join(const timing *r)
{
    const correlation *c = &correlations[r->correlation & (CORRELATIONS - 1)];
    tagged_op op;
    if (c->id != r->correlation || c->tag == 0 || !tag_lookup(c->tag, &op))
        return false;
    /* a graph launch: each of its nodes, named by what it does */
    bool node = op.kind == WEFT__OP_GRAPH;
    const char *name = NULL;
    if (r->kind == WEFT__OP_KERNEL)
        name = !node && op.name[0] ? op.name : r->name;
    else if (node)
        name = weft__op_kind_name(r->kind);
    weft__trace_op(op.trace, op.device, op.stream, node ? WEFT__OP_GRAPH : r->kind, name, r->bytes,
                   op.task, r->start, r->end);
    return true;
}

static void take(const CUpti_Activity *record)
{
    timing r = {0};
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const CUpti_ActivityExternalCorrelation *c = (const void *)record;
        if (c->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
            correlations[c->correlationId & (CORRELATIONS - 1)] =
                (correlation){c->correlationId, c->externalId};
        return;
    }
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const void *)record;
        char buf[64];
        r = (timing){k->correlationId, WEFT__OP_KERNEL, k->start, k->end, 0, 0, ""};
        weft__trace_copy_name(r.name,
                              k->name ? weft__cuda_demangle(k->name, buf, sizeof buf) : "kernel");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const void *)record;
        r = (timing){m->correlationId, WEFT__OP_COPY, m->start, m->end, m->bytes, 0, ""};
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const void *)record;
        r = (timing){m->correlationId, WEFT__OP_FILL, m->start, m->end, m->bytes, 0, ""};
        break;
    }
    default:
        return;
    }
    if (r.start == 0 || r.end < r.start) /* flushed before it completed */
        return;
    if (!join(&r) && nwaiting < WAITING)
        waiting[nwaiting++] = r;
}

/* Join what waits; drop what has waited too long (an operation not
 * tagged: a user's own work on a leased stream, or one enqueued as
 * CUPTI started). */
static void retry_waiting(unsigned max_age)
{
    for (unsigned i = 0; i < nwaiting;)
        if (join(&waiting[i]) || ++waiting[i].age > max_age)
            waiting[i] = waiting[--nwaiting];
        else
            i++;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *record = NULL;
    pthread_mutex_lock(&join_lock);
    while (cupti.cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
        take(record);
    retry_waiting(WAITING_BUFFERS);
    pthread_mutex_unlock(&join_lock);
    free(buffer);
}

static uint64_t CUPTIAPI host_now(void)
{
    return weft__now_ns();
}

/* ---- starting and stopping ----------------------------------------------- */

static void unavailable(const char *why, CUptiResult r)
{
    const char *what = "";
    if (r != CUPTI_SUCCESS && cupti.cuptiGetResultString)
        cupti.cuptiGetResultString(r, &what);
    fprintf(stderr,
            "weft: the trace cannot time GPU operations with CUPTI: %s%s%s; timing with "
            "CUDA events\n",
            why, *what ? ": " : "", what);
}

/* Open libcupti, look up the calls, register the callbacks. Once. Call
 * with state_lock held. */
static bool load(void)
{
    char name[64];
    snprintf(name, sizeof name, "libcupti.so.%d", CUDART_VERSION / 1000);
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
#ifdef WEFT_CUPTI_DIR
    if (!lib) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", WEFT_CUPTI_DIR, name);
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
#endif
    if (!lib) {
        unavailable("cannot open libcupti", CUPTI_SUCCESS);
        return false;
    }
#define CUPTI_LOOKUP(f)                                                                            \
    if (!(cupti.f = (__typeof__(f) *)dlsym(lib, #f))) {                                            \
        unavailable("libcupti has no " #f, CUPTI_SUCCESS);                                         \
        return false;                                                                              \
    }
    CUPTI_CALLS(CUPTI_LOOKUP)
#undef CUPTI_LOOKUP

    tags = calloc(TAGS, sizeof *tags);
    correlations = calloc(CORRELATIONS, sizeof *correlations);
    if (!tags || !correlations) {
        unavailable("out of memory", CUPTI_SUCCESS);
        return false;
    }
    /* the clock first: it must be set before any kind is enabled */
    CUptiResult r = cupti.cuptiActivityRegisterTimestampCallback(host_now);
    if (r == CUPTI_SUCCESS)
        r = cupti.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        unavailable("cannot register with CUPTI", r);
        return false;
    }
    return true;
}

/* Enable the kinds; all or none. Call with state_lock held. */
static bool enable(void)
{
    for (size_t i = 0; i < NKINDS; i++) {
        CUptiResult r = cupti.cuptiActivityEnable(kinds[i]);
        if (r != CUPTI_SUCCESS) {
            while (i-- > 0)
                cupti.cuptiActivityDisable(kinds[i]);
            unavailable("cannot enable CUPTI's activity records", r);
            return false;
        }
    }
    cupti.cuptiActivityFlushPeriod(FLUSH_PERIOD_MS);
    return true;
}

bool weft__cupti_start(void)
{
    pthread_mutex_lock(&state_lock);
    int now = atomic_load(&state);
    if (now == CUPTI_OFF) {
        bool ok = (loaded || (loaded = load())) && enable();
        now = ok ? CUPTI_ON : CUPTI_UNAVAILABLE;
        atomic_store_explicit(&state, now, memory_order_release);
    }
    pthread_mutex_unlock(&state_lock);
    return now == CUPTI_ON;
}

static void stop(void)
{
    pthread_mutex_lock(&state_lock);
    if (atomic_load(&state) == CUPTI_ON) {
        for (size_t i = 0; i < NKINDS; i++)
            cupti.cuptiActivityDisable(kinds[i]);
        cupti.cuptiActivityFlushPeriod(0);
        atomic_store(&state, CUPTI_OFF);
    }
    pthread_mutex_unlock(&state_lock);
}

/* ---- the backend's side ------------------------------------------------- */

bool weft__cupti_tag(uint64_t *tag)
{
    int now = atomic_load_explicit(&state, memory_order_acquire);
    if (now == CUPTI_UNAVAILABLE || (now == CUPTI_OFF && !weft__cupti_start()))
        return false;
    *tag = atomic_fetch_add_explicit(&next_tag, 1, memory_order_relaxed);
    return cupti.cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                                                        *tag) == CUPTI_SUCCESS;
}

void weft__cupti_untag(weft__stream *s, uint64_t tag, const weft__op_info *op)
{
    uint64_t popped;
    char buf[64];
    cupti.cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &popped);
    tag_slot *slot = &tags[tag & (TAGS - 1)];
    atomic_store_explicit(&slot->tag, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    slot->op = (tagged_op){.trace = s->dev->base.trace,
                           .device = s->dev->base.index,
                           .stream = weft__cuda_stream_index(s),
                           .kind = op->kind,
                           .task = op->task};
    if (op->kind == WEFT__OP_KERNEL)
        weft__trace_copy_name(slot->op.name, weft__cuda_kernel_name(op->kernel, buf, sizeof buf));
    atomic_store_explicit(&slot->tag, tag, memory_order_release);
}

void weft__cupti_flush(weft__trace *tr)
{
    if (atomic_load_explicit(&state, memory_order_acquire) != CUPTI_ON)
        return;
    cupti.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); /* delivers, maybe here */
    pthread_mutex_lock(&join_lock);
    retry_waiting(0);
    for (unsigned i = 0; i < TAGS; i++) /* tr may go away: nothing may name it */
        if (tags[i].op.trace == tr)
            atomic_store_explicit(&tags[i].tag, 0, memory_order_relaxed);
    pthread_mutex_unlock(&join_lock);
    if (atomic_load(&weft__trace_live) <= 1) /* tr is the last recording */
        stop();
}
