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
int weft__fail(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Where the message of the current context is kept: the running task's
 * buffer, or the thread's. Provided by the task layer. */
char *weft__error_buffer(size_t *size);

#define WEFT__ERRMSG_SIZE 160

#endif
