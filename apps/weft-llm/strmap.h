/*
 * strmap.h - a string-to-int hash map for the tokenizer's vocabulary and
 * merge ranks: open addressing, linear probing, at most half full, keys
 * copied in. Lookups take a length, so a key need not be terminated.
 */
#ifndef WL_STRMAP_H
#define WL_STRMAP_H

#include <stddef.h>

typedef struct wl_strmap {
    char **keys;
    size_t *lens;
    int *values;
    size_t cap, count; /* cap a power of two */
} wl_strmap;

int wl_strmap_put(wl_strmap *m, const char *key, size_t len, int value); /* 0, or -1: no memory */
int wl_strmap_get(const wl_strmap *m, const char *key, size_t len, int *value); /* 1 if found */
void wl_strmap_free(wl_strmap *m);

#endif
