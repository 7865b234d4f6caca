/*
 * sized.h - reading and writing the public structs that carry their size.
 *
 * weft_config and weft_task_opts open with a size_t size: the sizeof the
 * caller's header gave (WEFT_*_INIT sets it). The library reads only the
 * bytes that size covers and takes the rest as zero (the defaults), so a
 * struct that grows keeps working with callers built against an older
 * header. weft_stats, which the library writes, gets the caller's sizeof
 * from the call itself (weft_stats_get is a macro), so that a struct left
 * uninitialized is never written past its end. Size 0 (a zeroed or
 * designated-initializer struct without the macro) means the first sized
 * layout, `base`, which never changes. A size beyond what this library knows
 * is accepted when the bytes it does not know are zero (fields left at their
 * default) and refused with WEFT_EINVAL otherwise: a setting the caller
 * asked for is never dropped in silence.
 *
 * The rule that keeps this sound: a new field starts at or past the old
 * sizeof (never in an old version's tail padding), and zero is its default.
 */
#ifndef WEFT_SIZED_H
#define WEFT_SIZED_H

#include <stddef.h>
#include <string.h>

#include "error.h"

/* Copy the caller's struct src into dst (the library's layout, have bytes),
 * zero-filling what src's size does not cover; dst's size becomes have. */
static inline int weft__sized_in(void *dst, size_t have, const void *src, size_t base,
                                 const char *fn, const char *what)
{
    size_t size;
    memcpy(&size, src, sizeof size);
    if (size == 0)
        size = base;
    if (size < sizeof size)
        return weft__fail(WEFT_EINVAL, "%s: %s->size is %zu, smaller than the size field", fn, what,
                          size);
    const unsigned char *extra = (const unsigned char *)src + have;
    for (size_t i = 0; size > have && i < size - have; i++)
        if (extra[i])
            return weft__fail(WEFT_EINVAL,
                              "%s: %s sets fields this weft does not know (size %zu, it knows "
                              "%zu): built against a newer weft.h?",
                              fn, what, size, have);
    memset(dst, 0, have);
    memcpy(dst, src, size < have ? size : have);
    memcpy(dst, &have, sizeof have);
    return WEFT_OK;
}

/* Copy the library's struct src (have bytes) into the caller's dst of
 * size bytes (the caller's sizeof, passed by the call, never read from dst:
 * an output struct need not be initialized): as much as both hold, zeros
 * in the bytes of a larger dst past have. dst's size field becomes the
 * bytes that carry values, min(size, have). */
static inline void weft__sized_out(void *dst, size_t size, const void *src, size_t have)
{
    size_t filled = size < have ? size : have;
    memcpy(dst, src, filled);
    if (size > have)
        memset((unsigned char *)dst + have, 0, size - have);
    memcpy(dst, &filled, sizeof filled);
}

#endif
