/*
 * futex.h - the two futex operations weft parks threads with.
 *
 * Private futexes on 32-bit words. Waits may return spuriously; every
 * caller re-checks its condition in a loop.
 */
#ifndef WEFT_FUTEX_H
#define WEFT_FUTEX_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Sleep while *word == expected, at most timeout (NULL: no limit). */
static inline void weft__futex_wait(atomic_uint *word, unsigned expected,
                                    const struct timespec *timeout)
{
    syscall(SYS_futex, (void *)word, FUTEX_WAIT_PRIVATE, expected, timeout,
            NULL, 0);
}

/* Wake up to n threads sleeping on word. */
static inline void weft__futex_wake(atomic_uint *word, int n)
{
    syscall(SYS_futex, (void *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

#endif
