/*
 * trace.c - recording sessions, per-thread buffers and the JSON writer.
 *
 * Buffers. A thread records into a buffer of its own, found through a
 * thread-local that remembers which trace it belongs to. A buffer fills a
 * chunk of events; a full chunk is pushed (one CAS) on the trace's list of
 * full chunks, which the writer thread turns into JSON every FLUSH_NS.
 *
 * Stopping while threads record. An appender sets its buffer's `busy`, then
 * checks `recording`; the stopper clears `recording`, then waits until no
 * buffer is busy. Both are sequentially consistent, so either the appender
 * sees the session over (and writes nothing), or the stopper sees it busy
 * and waits: after the wait every buffer's chunk is the stopper's to write.
 *
 * The file is one JSON object: {"traceEvents":[ ... ],"displayTimeUnit":
 * "ns"}. Events are written in no particular order (viewers sort them);
 * the names of threads, devices and streams are written last, for the
 * tracks that were seen. A session still open when the process exits is
 * stopped by an exit handler, so the file stays valid JSON.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "trace/nvtx.h"
#include "trace/trace.h"

enum {
    CHUNK_EVENTS = 512,
    FLUSH_NS = 50 * 1000 * 1000, /* the writer's period */
    MAX_DEVICES = 64,            /* named devices; more are called "device N" */
    DEVICE_PID = 0x7f000000,     /* pid of device 0's tracks; real pids stay below */
};

typedef enum rec_kind { REC_RUN, REC_WAIT, REC_OP } rec_kind;

typedef struct rec {
    uint64_t ts, dur;
    uint64_t task;   /* the task's id (0: none) */
    uint64_t extra;  /* WAIT: ns spent ready after the wait; OP: bytes */
    uint32_t tid;    /* RUN, WAIT: the recording thread; OP: the stream */
    uint16_t device; /* OP */
    uint8_t kind, what;
    char name[WEFT__TRACE_NAME];
} rec;

typedef struct chunk {
    struct chunk *next;
    unsigned n;
    rec recs[CHUNK_EVENTS];
} chunk;

typedef struct buffer {
    struct buffer *next; /* the trace's buffers, under its lock */
    atomic_bool busy;    /* the owner is appending */
    chunk *chunk;        /* being filled (NULL between sessions) */
    uint32_t index;      /* among the trace's buffers: the high half of task ids */
    uint32_t tid;
    uint64_t ids; /* task ids handed out */
    char name[16];
} buffer;

/* The (device, stream) tracks the writer has seen, for naming them. */
typedef struct track_set {
    uint32_t *keys; /* key + 1; 0: empty */
    size_t cap, n;
} track_set;

struct weft__trace {
    uint64_t serial;
    atomic_bool recording;
    bool nvtx;            /* a profiler is attached: NVTX ranges too */
    pthread_mutex_t lock; /* buffers, starting and stopping, device names */
    buffer *buffers;
    uint32_t nbuffers;
    _Atomic(chunk *) full; /* filled chunks, newest first */

    /* the session: the file and the writer */
    FILE *out;
    char *path;
    uint64_t epoch;
    int pid;              /* the process's tracks */
    unsigned long events; /* written so far */
    track_set tracks;
    pthread_t writer;
    pthread_mutex_t writer_mu;
    pthread_cond_t writer_cv;
    bool writer_stop;
    struct weft__trace *next_open;
    void (*after_start)(void *), (*before_stop)(void *); /* weft__trace_hooks */
    void *hooks_arg;

    char device_names[MAX_DEVICES][32];
};

atomic_uint weft__trace_live;

static atomic_uint_least64_t next_serial = 1;

/* Sessions open, for the exit handler. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static weft__trace *open_traces;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static const char *const waits_on_names[WEFT__WAITS_COUNT] = {
    [WEFT__WAITS_OTHER] = "wait",
    [WEFT__WAITS_JOIN] = "wait: join",
    [WEFT__WAITS_ANY] = "wait: when_any",
    [WEFT__WAITS_MUTEX] = "wait: mutex",
    [WEFT__WAITS_COND] = "wait: cond",
    [WEFT__WAITS_SEM] = "wait: semaphore",
    [WEFT__WAITS_SEND] = "wait: chan send",
    [WEFT__WAITS_RECV] = "wait: chan recv",
    [WEFT__WAITS_SLEEP] = "wait: sleep",
    [WEFT__WAITS_GPU] = "wait: GPU",
    [WEFT__WAITS_HOST_DEVICE] = "wait: host device",
    [WEFT__WAITS_BLOCKING] = "wait: blocking call",
};

static const char *const op_names[WEFT__OP_COUNT] = {
    [WEFT__OP_COPY] = "copy",     [WEFT__OP_FILL] = "memset", [WEFT__OP_HOST_FN] = "host function",
    [WEFT__OP_KERNEL] = "kernel", [WEFT__OP_GRAPH] = "graph",
};

const char *weft__waits_on_name(weft__waits_on what)
{
    return what < WEFT__WAITS_COUNT ? waits_on_names[what] : "wait";
}

const char *weft__op_kind_name(weft__op_kind kind)
{
    return kind < WEFT__OP_COUNT ? op_names[kind] : "operation";
}

/* ---- buffers --------------------------------------------------------------- */

static _Thread_local struct {
    uint64_t serial; /* of the trace buf belongs to */
    buffer *buf;
} mine;

static buffer *buffer_register(weft__trace *tr)
{
    buffer *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->tid = (uint32_t)gettid();
    if (pthread_getname_np(pthread_self(), b->name, sizeof b->name) != 0)
        snprintf(b->name, sizeof b->name, "thread %u", b->tid);
    pthread_mutex_lock(&tr->lock);
    b->index = ++tr->nbuffers;
    b->next = tr->buffers;
    tr->buffers = b;
    pthread_mutex_unlock(&tr->lock);
    mine.serial = tr->serial;
    mine.buf = b;
    return b;
}

/* The calling thread's buffer for tr. Never inlined: tasks move between
 * threads, and the thread-local must be read afresh each time. */
__attribute__((noinline)) static buffer *my_buffer(weft__trace *tr)
{
    if (mine.serial == tr->serial)
        return mine.buf;
    return buffer_register(tr);
}

static void push_full(weft__trace *tr, chunk *c)
{
    c->next = atomic_load_explicit(&tr->full, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&tr->full, &c->next, c, memory_order_release,
                                                  memory_order_relaxed))
        ;
}

/* A record to fill in, or NULL when tr is not recording (or memory ran out).
 * Every non-NULL return is followed by append_end. */
static rec *append_begin(weft__trace *tr, buffer **bp)
{
    buffer *b = my_buffer(tr);
    if (!b)
        return NULL;
    atomic_store(&b->busy, true);
    if (!atomic_load(&tr->recording)) {
        atomic_store_explicit(&b->busy, false, memory_order_release);
        return NULL;
    }
    chunk *c = b->chunk;
    if (!c || c->n == CHUNK_EVENTS) {
        if (c)
            push_full(tr, c);
        if (!(c = b->chunk = malloc(sizeof *c))) {
            atomic_store_explicit(&b->busy, false, memory_order_release);
            return NULL; /* the event is lost, not the program */
        }
        c->n = 0;
    }
    *bp = b;
    return &c->recs[c->n];
}

static void append_end(buffer *b)
{
    b->chunk->n++;
    atomic_store_explicit(&b->busy, false, memory_order_release);
}

/* ---- events ---------------------------------------------------------------- */

bool weft__trace_recording(const weft__trace *tr)
{
    return atomic_load_explicit(&((weft__trace *)tr)->recording, memory_order_relaxed);
}

bool weft__trace_nvtx(const weft__trace *tr)
{
    return tr->nvtx;
}

uint64_t weft__trace_task_id(weft__trace *tr, uint64_t *id)
{
    if (*id == 0) {
        buffer *b = my_buffer(tr);
        if (b)
            *id = (uint64_t)b->index << 32 | ++b->ids;
    }
    return *id;
}

void weft__trace_run(weft__trace *tr, uint64_t *task_id, const char *task_name, uint64_t start)
{
    buffer *b;
    uint64_t now = weft__now_ns();
    rec *r = append_begin(tr, &b);
    if (!r)
        return;
    *r = (rec){.ts = start,
               .dur = now - start,
               .task = weft__trace_task_id(tr, task_id),
               .tid = b->tid,
               .kind = REC_RUN};
    weft__trace_copy_name(r->name, task_name ? task_name : "task");
    append_end(b);
}

void weft__trace_wait(weft__trace *tr, uint64_t *task_id, const char *task_name,
                      weft__waits_on what, uint64_t start, uint64_t woken)
{
    buffer *b;
    uint64_t now = weft__now_ns();
    if (woken < start || woken > now) /* woken before it finished parking, or unknown */
        woken = woken < start ? start : now;
    rec *r = append_begin(tr, &b);
    if (!r)
        return;
    *r = (rec){.ts = start,
               .dur = woken - start,
               .task = weft__trace_task_id(tr, task_id),
               .extra = now - woken,
               .tid = b->tid,
               .kind = REC_WAIT,
               .what = (uint8_t)what};
    weft__trace_copy_name(r->name, task_name ? task_name : "task");
    append_end(b);
}

void weft__trace_op(weft__trace *tr, unsigned device, unsigned stream, weft__op_kind kind,
                    const char *name, uint64_t bytes, uint64_t task_id, uint64_t start,
                    uint64_t end)
{
    buffer *b;
    rec *r = append_begin(tr, &b);
    if (!r)
        return;
    *r = (rec){.ts = start,
               .dur = end > start ? end - start : 0,
               .task = task_id,
               .extra = bytes,
               .tid = stream,
               .device = (uint16_t)device,
               .kind = REC_OP,
               .what = (uint8_t)kind};
    weft__trace_copy_name(r->name, name ? name : weft__op_kind_name(kind));
    append_end(b);
}

/* ---- JSON ------------------------------------------------------------------ */

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (len == 0 || s[0] > 0xf4 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

/* The writer formats by hand into its FILE, which only it (or the stopper,
 * after it) touches: no format parsing, no stream locking per event. */
static void put(FILE *f, const char *s)
{
    fputs_unlocked(s, f);
}

static void put_u64(FILE *f, uint64_t v)
{
    char digits[24];
    int i = sizeof digits;
    do
        digits[--i] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    fwrite_unlocked(digits + i, 1, sizeof digits - (size_t)i, f);
}

/* ,"key":value */
static void put_key_u64(FILE *f, const char *key, uint64_t v)
{
    putc_unlocked(',', f);
    putc_unlocked('"', f);
    put(f, key);
    put(f, "\":");
    put_u64(f, v);
}

/* s as the inside of a JSON string: escaped, with bytes that are not UTF-8
 * (a name cut inside a character) written as '?'. */
static void put_string(FILE *f, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        size_t len = 1;
        if (c == '"' || c == '\\') {
            putc_unlocked('\\', f);
            putc_unlocked(c, f);
        } else if (c < 0x20) {
            put(f, "\\u00");
            putc_unlocked(hex[c >> 4], f);
            putc_unlocked(hex[c & 15], f);
        } else if (c < 0x80) {
            putc_unlocked(c, f);
        } else if ((len = utf8_len(p + i, n - i)) == 0) {
            putc_unlocked('?', f);
            len = 1;
        } else {
            fwrite_unlocked(p + i, 1, len, f);
        }
        i += len;
    }
}

/* ,"key":<microseconds since the session began, exact to the ns> */
static void put_us(FILE *f, const char *key, int64_t ns)
{
    uint64_t a = ns < 0 ? (uint64_t)-ns : (uint64_t)ns;
    unsigned frac = (unsigned)(a % 1000);
    putc_unlocked(',', f);
    putc_unlocked('"', f);
    put(f, key);
    put(f, ns < 0 ? "\":-" : "\":");
    put_u64(f, a / 1000);
    putc_unlocked('.', f);
    putc_unlocked((char)('0' + frac / 100), f);
    putc_unlocked((char)('0' + frac / 10 % 10), f);
    putc_unlocked((char)('0' + frac % 10), f);
}

/* A task id as the trace shows it: "thread.count". */
static void put_id(FILE *f, uint64_t id)
{
    putc_unlocked('"', f);
    put_u64(f, id >> 32);
    putc_unlocked('.', f);
    put_u64(f, (uint32_t)id);
    putc_unlocked('"', f);
}

static void put_task(FILE *f, uint64_t id)
{
    put(f, "\"task\":");
    put_id(f, id);
}

static void event_open(weft__trace *tr, const char *ph)
{
    put(tr->out, tr->events++ ? ",\n{\"ph\":\"" : "{\"ph\":\"");
    put(tr->out, ph);
    putc_unlocked('"', tr->out);
}

static bool track_add(track_set *set, uint32_t key)
{
    if (2 * (set->n + 1) > set->cap) {
        size_t cap = set->cap ? 2 * set->cap : 64;
        uint32_t *keys = calloc(cap, sizeof *keys);
        if (!keys)
            return false;
        for (size_t i = 0; i < set->cap; i++)
            if (set->keys[i]) {
                size_t j = set->keys[i] * 2654435761u % cap;
                while (keys[j])
                    j = (j + 1) % cap;
                keys[j] = set->keys[i];
            }
        free(set->keys);
        set->keys = keys;
        set->cap = cap;
    }
    size_t j = (key + 1) * 2654435761u % set->cap;
    while (set->keys[j] && set->keys[j] != key + 1)
        j = (j + 1) % set->cap;
    if (!set->keys[j]) {
        set->keys[j] = key + 1;
        set->n++;
    }
    return true;
}

/* ,"pid":pid,"tid":tid */
static void put_track(FILE *f, int pid, uint64_t tid)
{
    put_key_u64(f, "pid", (uint64_t)pid);
    put_key_u64(f, "tid", tid);
}

static void write_rec(weft__trace *tr, const rec *r)
{
    FILE *f = tr->out;
    int64_t ts = (int64_t)(r->ts - tr->epoch);
    switch ((rec_kind)r->kind) {
    case REC_RUN:
        event_open(tr, "X");
        put(f, ",\"cat\":\"task\",\"name\":\"");
        put_string(f, r->name);
        putc_unlocked('"', f);
        put_track(f, tr->pid, r->tid);
        put_us(f, "ts", ts);
        put_us(f, "dur", (int64_t)r->dur);
        put(f, ",\"args\":{");
        put_task(f, r->task);
        put(f, "}}");
        break;
    case REC_WAIT: {
        /* the wait, then the time ready, on the task's own async track */
        const char *names[2] = {weft__waits_on_name(r->what), "ready"};
        int64_t from[2] = {ts, ts + (int64_t)r->dur};
        int64_t to[2] = {from[1], from[1] + (int64_t)r->extra};
        for (int k = 0; k < 2; k++) {
            if (k == 1 && r->extra == 0)
                break;
            for (int end = 0; end < 2; end++) {
                event_open(tr, end ? "e" : "b");
                put(f, ",\"cat\":\"wait\",\"name\":\"");
                put(f, names[k]);
                put(f, "\",\"id\":");
                put_id(f, r->task);
                put_track(f, tr->pid, r->tid);
                put_us(f, "ts", end ? to[k] : from[k]);
                if (!end) {
                    put(f, ",\"args\":{");
                    put_task(f, r->task);
                    put(f, ",\"name\":\"");
                    put_string(f, r->name);
                    put(f, "\"}");
                }
                putc_unlocked('}', f);
            }
        }
        break;
    }
    case REC_OP:
        track_add(&tr->tracks, (uint32_t)r->device << 20 | (r->tid & 0xfffff));
        event_open(tr, "X");
        put(f, ",\"cat\":\"device\",\"name\":\"");
        put_string(f, r->name);
        putc_unlocked('"', f);
        put_track(f, DEVICE_PID + r->device, (uint64_t)r->tid + 1);
        put_us(f, "ts", ts);
        put_us(f, "dur", (int64_t)r->dur);
        put(f, ",\"args\":{\"op\":\"");
        put(f, weft__op_kind_name(r->what));
        putc_unlocked('"', f);
        if (r->extra)
            put_key_u64(f, "bytes", r->extra);
        if (r->task) {
            putc_unlocked(',', f);
            put_task(f, r->task);
        }
        put(f, "}}");
        break;
    }
}

static void write_chunk(weft__trace *tr, chunk *c)
{
    for (unsigned i = 0; i < c->n; i++)
        write_rec(tr, &c->recs[i]);
}

/* Write and free the full chunks, oldest first. */
static void write_full(weft__trace *tr)
{
    chunk *c = atomic_exchange_explicit(&tr->full, NULL, memory_order_acquire), *prev = NULL;
    while (c) { /* reverse: the list is newest first */
        chunk *next = c->next;
        c->next = prev;
        prev = c;
        c = next;
    }
    for (c = prev; c; c = prev) {
        prev = c->next;
        write_chunk(tr, c);
        free(c);
    }
}

static void *writer_main(void *arg)
{
    weft__trace *tr = arg;
    pthread_mutex_lock(&tr->writer_mu);
    while (!tr->writer_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += FLUSH_NS;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&tr->writer_cv, &tr->writer_mu, &until);
        pthread_mutex_unlock(&tr->writer_mu);
        write_full(tr);
        pthread_mutex_lock(&tr->writer_mu);
    }
    pthread_mutex_unlock(&tr->writer_mu);
    write_full(tr);
    return NULL;
}

static void put_meta(weft__trace *tr, const char *what, int pid, long tid, const char *name)
{
    event_open(tr, "M");
    put(tr->out, ",\"name\":\"");
    put(tr->out, what);
    putc_unlocked('"', tr->out);
    put_key_u64(tr->out, "pid", (uint64_t)pid);
    if (tid >= 0)
        put_key_u64(tr->out, "tid", (uint64_t)tid);
    put(tr->out, ",\"args\":{\"name\":\"");
    put_string(tr->out, name);
    put(tr->out, "\"}}");
}

/* Name the process, its threads, and the devices and streams seen. Call
 * with tr->lock held, once nobody appends. */
static void write_names(weft__trace *tr)
{
    int pid = tr->pid;
    char name[64];
    put_meta(tr, "process_name", pid, -1, "weft");
    for (buffer *b = tr->buffers; b; b = b->next)
        put_meta(tr, "thread_name", pid, b->tid, b->name);
    uint32_t named_devices[MAX_DEVICES] = {0};
    for (size_t i = 0; i < tr->tracks.cap; i++) {
        if (!tr->tracks.keys[i])
            continue;
        uint32_t key = tr->tracks.keys[i] - 1, dev = key >> 20, stream = key & 0xfffff;
        if (dev >= MAX_DEVICES || !named_devices[dev]++) {
            const char *dn = dev < MAX_DEVICES ? tr->device_names[dev] : "";
            if (!*dn) {
                snprintf(name, sizeof name, "device %u", dev);
                dn = name;
            }
            put_meta(tr, "process_name", DEVICE_PID + (int)dev, -1, dn);
        }
        snprintf(name, sizeof name, "stream %u", stream);
        put_meta(tr, "thread_name", DEVICE_PID + (int)dev, (long)stream + 1, name);
    }
}

/* ---- sessions -------------------------------------------------------------- */

static void stop_open_traces(void)
{
    for (;;) {
        pthread_mutex_lock(&open_lock);
        weft__trace *tr = open_traces;
        pthread_mutex_unlock(&open_lock);
        if (!tr)
            return;
        weft__trace_stop(tr, "weft: at exit");
    }
}

static void install_exit_handler(void)
{
    atexit(stop_open_traces);
}

static void open_list_remove(weft__trace *tr)
{
    pthread_mutex_lock(&open_lock);
    for (weft__trace **p = &open_traces; *p; p = &(*p)->next_open)
        if (*p == tr) {
            *p = tr->next_open;
            break;
        }
    pthread_mutex_unlock(&open_lock);
}

int weft__trace_create(weft__trace **out)
{
    weft__trace *tr = calloc(1, sizeof *tr);
    if (!tr)
        return WEFT_ENOMEM;
    tr->serial = atomic_fetch_add(&next_serial, 1);
    pthread_mutex_init(&tr->lock, NULL);
    pthread_mutex_init(&tr->writer_mu, NULL);
    pthread_cond_init(&tr->writer_cv, NULL);
    tr->nvtx = weft__nvtx_attached();
    if (tr->nvtx)
        atomic_fetch_add(&weft__trace_live, 1);
    *out = tr;
    return WEFT_OK;
}

void weft__trace_destroy(weft__trace *tr)
{
    if (!tr)
        return;
    pthread_mutex_lock(&tr->lock);
    bool open = tr->out != NULL;
    pthread_mutex_unlock(&tr->lock);
    if (open)
        weft__trace_stop(tr, "weft_runtime_destroy");
    if (tr->nvtx)
        atomic_fetch_sub(&weft__trace_live, 1);
    for (buffer *b = tr->buffers, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    pthread_cond_destroy(&tr->writer_cv);
    pthread_mutex_destroy(&tr->writer_mu);
    pthread_mutex_destroy(&tr->lock);
    free(tr);
}

void weft__trace_hooks(weft__trace *tr, void (*after_start)(void *), void (*before_stop)(void *),
                       void *arg)
{
    pthread_mutex_lock(&tr->lock);
    tr->after_start = after_start;
    tr->before_stop = before_stop;
    tr->hooks_arg = arg;
    pthread_mutex_unlock(&tr->lock);
}

void weft__trace_name_device(weft__trace *tr, unsigned device, const char *name)
{
    if (device >= MAX_DEVICES)
        return;
    pthread_mutex_lock(&tr->lock);
    snprintf(tr->device_names[device], sizeof tr->device_names[device], "%s", name);
    pthread_mutex_unlock(&tr->lock);
}

int weft__trace_start(weft__trace *tr, const char *path, const char *fn)
{
    if (!path || !*path)
        return weft__fail(WEFT_EINVAL, "%s: path is %s", fn, path ? "empty" : "NULL");
    pthread_mutex_lock(&tr->lock);
    int rc = WEFT_OK;
    if (tr->out) {
        rc = weft__fail(WEFT_ESTATE, "%s: the runtime is recording a trace already (to %s)", fn,
                        tr->path);
        goto out;
    }
    FILE *f = fopen(path, "w");
    char *copy = strdup(path);
    if (!f || !copy) {
        rc = weft__fail(f ? WEFT_ENOMEM : WEFT_ESYS, "%s: cannot open %s: %s", fn, path,
                        f ? "out of memory" : strerror(errno));
        if (f)
            fclose(f);
        free(copy);
        goto out;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    fputs("{\"traceEvents\":[\n", f);
    tr->out = f;
    tr->path = copy;
    tr->epoch = weft__now_ns();
    tr->pid = (int)getpid();
    tr->events = 0;
    tr->writer_stop = false;
    free(tr->tracks.keys);
    tr->tracks = (track_set){0};
    if (pthread_create(&tr->writer, NULL, writer_main, tr) != 0) {
        fclose(f);
        remove(path);
        free(copy);
        tr->out = NULL;
        tr->path = NULL;
        rc = weft__fail(WEFT_ESYS, "%s: cannot start the trace writer thread", fn);
        goto out;
    }
    pthread_setname_np(tr->writer, "weft-trace");
    pthread_once(&exit_once, install_exit_handler);
    pthread_mutex_lock(&open_lock);
    tr->next_open = open_traces;
    open_traces = tr;
    pthread_mutex_unlock(&open_lock);
    atomic_store(&tr->recording, true);
    atomic_fetch_add(&weft__trace_live, 1);
out:
    pthread_mutex_unlock(&tr->lock);
    /* outside the lock, as before_stop */
    if (rc == WEFT_OK && tr->after_start)
        tr->after_start(tr->hooks_arg);
    return rc;
}

int weft__trace_stop(weft__trace *tr, const char *fn)
{
    /* outside the lock: what it reports registers buffers under it */
    if (tr->before_stop && weft__trace_recording(tr))
        tr->before_stop(tr->hooks_arg);
    pthread_mutex_lock(&tr->lock);
    if (!tr->out) {
        pthread_mutex_unlock(&tr->lock);
        return weft__fail(WEFT_ESTATE, "%s: the runtime is not recording a trace", fn);
    }
    open_list_remove(tr);
    atomic_store(&tr->recording, false);
    atomic_fetch_sub(&weft__trace_live, 1);
    for (buffer *b = tr->buffers; b; b = b->next)
        while (atomic_load(&b->busy))
            sched_yield(); /* an append is finishing */

    pthread_mutex_lock(&tr->writer_mu);
    tr->writer_stop = true;
    pthread_cond_signal(&tr->writer_cv);
    pthread_mutex_unlock(&tr->writer_mu);
    pthread_join(tr->writer, NULL);

    write_full(tr);
    for (buffer *b = tr->buffers; b; b = b->next)
        if (b->chunk) {
            write_chunk(tr, b->chunk);
            free(b->chunk);
            b->chunk = NULL;
        }
    write_names(tr);
    fputs("\n],\"displayTimeUnit\":\"ns\"}\n", tr->out);
    bool failed = ferror(tr->out) != 0;
    failed |= fclose(tr->out) != 0;
    int rc = failed ? weft__fail(WEFT_ESYS, "%s: writing the trace to %s failed", fn, tr->path)
                    : WEFT_OK;
    tr->out = NULL;
    free(tr->path);
    tr->path = NULL;
    free(tr->tracks.keys);
    tr->tracks = (track_set){0};
    pthread_mutex_unlock(&tr->lock);
    return rc;
}
