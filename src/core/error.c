/*
 * error.c - status codes and last-error messages.
 *
 * The message of a failed call is kept where its caller lives: in the
 * running task's record (tasks migrate between threads, so a thread-local
 * buffer would mix up tasks) or, outside tasks, in a thread-local buffer.
 */
#include <stdarg.h>
#include <stdio.h>

#include "core/error.h"

static const char *const messages[] = {
    [0] = "success",
    [-WEFT_EINVAL] = "invalid argument",
    [-WEFT_ENOMEM] = "out of memory",
    [-WEFT_ECANCELED] = "task cancelled",
    [-WEFT_ENOTASK] = "not called from a task",
    [-WEFT_ESTATE] = "object in the wrong state",
    [-WEFT_ECLOSED] = "channel closed",
    [-WEFT_EAGAIN] = "would have to wait",
    [-WEFT_EDEADLK] = "wait could never end",
    [-WEFT_EDEVICE] = "device error",
    [-WEFT_ETIMEDOUT] = "timed out",
    [-WEFT_EPERM] = "not the owner",
    [-WEFT_ESYS] = "system call failed",
};

const char *weft_strerror(int status)
{
    if (status > 0 || -status >= (int)(sizeof messages / sizeof *messages) ||
        messages[-status] == NULL)
        return "unknown status";
    return messages[-status];
}

int weft__fail(int status, const char *fmt, ...)
{
    size_t size;
    char *buf = weft__error_buffer(&size);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    return status;
}

const char *weft_last_error(void)
{
    size_t size;
    const char *buf = weft__error_buffer(&size);
    return buf[0] ? buf : "no error";
}
