/*
 * error.c - status codes and last-error messages.
 *
 * The message of a failed call is kept where its caller lives: in the
 * running task's record (tasks migrate between threads, so a thread-local
 * buffer would mix up tasks) or, outside tasks, in a thread-local buffer.
 * Core owns the buffer type and the lookup; the task layer, above, owns
 * the tasks and registers the lookup (error.h), so core calls nothing above
 * it by name. Only failing calls and weft_last_error look.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#include "core/error.h"

static _Atomic(weft__errbuf *(*)(void)) task_lookup;

void weft__error_set_lookup(weft__errbuf *(*lookup)(void))
{
    atomic_store_explicit(&task_lookup, lookup, memory_order_relaxed);
}

static _Thread_local weft__errbuf thread_errmsg;

/* Never inlined: a task that migrated must not reuse another thread's
 * address of the thread-local. */
__attribute__((noinline)) static weft__errbuf *thread_error_buffer(void)
{
    return &thread_errmsg;
}

static weft__errbuf *error_buffer(void)
{
    weft__errbuf *(*lookup)(void) = atomic_load_explicit(&task_lookup, memory_order_relaxed);
    weft__errbuf *b = lookup ? lookup() : NULL;
    return b ? b : thread_error_buffer();
}

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
    [-WEFT_ETASKCANCELED] = "joined task was cancelled",
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
    weft__errbuf *b = error_buffer();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    return status;
}

const char *weft_last_error(void)
{
    const weft__errbuf *b = error_buffer();
    return b->msg[0] ? b->msg : "no error";
}
