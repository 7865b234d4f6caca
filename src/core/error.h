/*
 * error.h - setting the caller's last-error message.
 *
 * Each failing public call records a message naming the call and the reason.
 * Inside a task the message belongs to the task (tasks migrate between
 * threads); outside tasks it belongs to the thread.
 */
#ifndef WEFT_ERROR_H
#define WEFT_ERROR_H

#include "weft.h"

/* Record "fmt ..." as the caller's last error and return status, so that a
 * failure reads: return weft__fail(WEFT_EINVAL, "weft_join: t is NULL"); */
int weft__fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define WEFT__ERRMSG_SIZE 160

/* A last-error message. The task layer keeps one in each task record. */
typedef struct weft__errbuf {
    char msg[WEFT__ERRMSG_SIZE];
} weft__errbuf;

/* Where the message of the current context is kept: lookup returns the
 * running task's buffer, or NULL outside tasks (the thread's own buffer is
 * then used). The composition root sets the task layer's lookup when it
 * creates a runtime (no task runs before that); until then every message
 * goes to the thread's buffer. */
void weft__error_set_lookup(weft__errbuf *(*lookup)(void));

#endif
