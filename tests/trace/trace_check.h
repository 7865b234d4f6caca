/*
 * trace_check.h - reading a weft trace file back and checking what any
 * trace must satisfy, for the host and GPU trace tests.
 *
 * trace_load parses the file strictly (json.h). trace_check then requires:
 * an object whose "traceEvents" is an array of events, each with a known
 * phase; complete events (X) with a name, numeric pid, tid, ts and a
 * non-negative dur; async events (b, e) paired by (cat, id, name), each end
 * after its begin and nothing left open; and a name (metadata event) for
 * every process and thread that an X event is on.
 */
#ifndef WEFT_TEST_TRACE_CHECK_H
#define WEFT_TEST_TRACE_CHECK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"

/* The file's whole text, or NULL. */
static inline char *trace_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    *n = text ? fread(text, 1, (size_t)size, f) : 0;
    fclose(f);
    if (text)
        text[*n] = '\0';
    return text;
}

/* A file name of its own for each test (what tells them apart). */
static inline void trace_temp_path(char *buf, size_t n, const char *what)
{
    const char *dir = getenv("TMPDIR");
    snprintf(buf, n, "%s/weft-trace-%s-%d.json", dir && *dir ? dir : "/tmp", what, (int)getpid());
}

/* The parsed trace at path, or NULL with why in error. */
static inline json *trace_load(const char *path, char *error, size_t error_size)
{
    size_t n;
    char *text = trace_read_file(path, &n);
    if (!text) {
        snprintf(error, error_size, "cannot read the file");
        return NULL;
    }
    json *doc = json_parse(text, n, error, error_size);
    free(text);
    return doc;
}

static inline const json *trace_events(const json *doc)
{
    const json *ev = json_get(doc, "traceEvents");
    return ev && ev->type == JSON_ARRAY ? ev : NULL;
}

static inline bool trace_bad(char *error, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, size, fmt, ap);
    va_end(ap);
    return false;
}

/* The tracks named by metadata events: (pid, tid), tid -1 for a process. */
typedef struct trace_names {
    double pid[1024], tid[1024];
    size_t n;
} trace_names;

static inline void trace_collect_names(const json *events, trace_names *names)
{
    names->n = 0;
    for (size_t i = 0; i < events->n && names->n < 1024; i++) {
        const json *e = events->items[i];
        const char *ph = json_str(e, "ph"), *name = json_str(e, "name");
        double pid, tid = -1;
        if (!ph || strcmp(ph, "M") || !name || !json_num(e, "pid", &pid) ||
            !json_str(json_get(e, "args"), "name"))
            continue;
        if (!strcmp(name, "thread_name") && !json_num(e, "tid", &tid))
            continue;
        if (strcmp(name, "thread_name") && strcmp(name, "process_name"))
            continue;
        names->pid[names->n] = pid;
        names->tid[names->n++] = tid;
    }
}

static inline bool trace_named(const trace_names *names, double pid, double tid)
{
    for (size_t i = 0; i < names->n; i++)
        if (names->pid[i] == pid && names->tid[i] == tid)
            return true;
    return false;
}

static inline bool trace_check(const json *doc, char *error, size_t size)
{
    const json *events = trace_events(doc);
    if (!events)
        return trace_bad(error, size, "no traceEvents array");
    /* open async begins: (key, ts), key = cat/id/name */
    size_t nopen = 0, cap = 64;
    char **open_key = malloc(cap * sizeof *open_key);
    double *open_ts = malloc(cap * sizeof *open_ts);
    bool ok = true;
    static trace_names names;
    trace_collect_names(events, &names);
    for (size_t i = 0; ok && i < events->n; i++) {
        const json *e = events->items[i];
        const char *ph = json_str(e, "ph"), *name = json_str(e, "name");
        double pid, tid, ts, dur;
        if (e->type != JSON_OBJECT || !ph || !name || !json_num(e, "pid", &pid)) {
            ok = trace_bad(error, size, "event %zu: no ph, name or pid", i);
        } else if (!strcmp(ph, "X")) {
            if (!json_num(e, "tid", &tid) || !json_num(e, "ts", &ts) || !json_num(e, "dur", &dur))
                ok = trace_bad(error, size, "event %zu (%s): X without tid, ts or dur", i, name);
            else if (dur < 0)
                ok = trace_bad(error, size, "event %zu (%s): negative dur %f", i, name, dur);
            else if (!trace_named(&names, pid, tid) || !trace_named(&names, pid, -1))
                ok = trace_bad(error, size, "event %zu (%s): pid %.0f tid %.0f has no name", i,
                               name, pid, tid);
        } else if (!strcmp(ph, "b") || !strcmp(ph, "e")) {
            const char *cat = json_str(e, "cat"), *id = json_str(e, "id");
            char key[256];
            if (!cat || !id || !json_num(e, "ts", &ts) || !json_num(e, "tid", &tid)) {
                ok = trace_bad(error, size, "event %zu (%s): async without cat, id, ts or tid", i,
                               name);
                continue;
            }
            snprintf(key, sizeof key, "%s/%s/%s", cat, id, name);
            size_t k = 0;
            while (k < nopen && strcmp(open_key[k], key))
                k++;
            if (ph[0] == 'b') {
                if (k < nopen) {
                    ok = trace_bad(error, size, "event %zu: %s begins twice", i, key);
                } else {
                    if (nopen == cap) {
                        open_key = realloc(open_key, (cap *= 2) * sizeof *open_key);
                        open_ts = realloc(open_ts, cap * sizeof *open_ts);
                    }
                    open_key[nopen] = strdup(key);
                    open_ts[nopen++] = ts;
                }
            } else if (k == nopen) {
                ok = trace_bad(error, size, "event %zu: %s ends without a begin", i, key);
            } else if (ts < open_ts[k]) {
                ok = trace_bad(error, size, "event %zu: %s ends before it begins", i, key);
            } else {
                free(open_key[k]);
                open_key[k] = open_key[--nopen];
                open_ts[k] = open_ts[nopen];
            }
        } else if (strcmp(ph, "M")) {
            ok = trace_bad(error, size, "event %zu (%s): unexpected phase %s", i, name, ph);
        }
    }
    if (ok && nopen)
        ok = trace_bad(error, size, "%zu async events never end, e.g. %s", nopen, open_key[0]);
    for (size_t k = 0; k < nopen; k++)
        free(open_key[k]);
    free(open_key);
    free(open_ts);
    return ok;
}

/* Events of phase ph whose name starts with prefix (NULL: any) and, if
 * cat is not NULL, whose category is cat. */
static inline size_t trace_count(const json *doc, const char *ph, const char *prefix, const char *cat)
{
    const json *events = trace_events(doc);
    size_t n = 0;
    for (size_t i = 0; events && i < events->n; i++) {
        const json *e = events->items[i];
        const char *p = json_str(e, "ph"), *name = json_str(e, "name"), *c = json_str(e, "cat");
        if (p && !strcmp(p, ph) && name && (!prefix || !strncmp(name, prefix, strlen(prefix))) &&
            (!cat || (c && !strcmp(c, cat))))
            n++;
    }
    return n;
}

/* ---- for cmocka test programs (include cmocka.h first) ------------------ */
#ifdef cmocka_unit_test

/* The parsed trace at path, failing the test unless it is JSON and passes
 * trace_check. */
static inline json *trace_load_checked(const char *path)
{
    char error[256];
    json *doc = trace_load(path, error, sizeof error);
    if (!doc)
        fail_msg("%s is not JSON: %s", path, error);
    if (!trace_check(doc, error, sizeof error))
        fail_msg("%s: %s", path, error);
    return doc;
}

#endif

#endif
