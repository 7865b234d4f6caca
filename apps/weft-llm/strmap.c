/*
 * strmap.c - the tokenizer's hash map (see strmap.h). FNV-1a hashes; the
 * table doubles before it is half full, so probes stay short and a lookup
 * always reaches an empty slot.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strmap.h"

static uint64_t hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static size_t find(const wl_strmap *m, const char *key, size_t len)
{
    size_t i = (size_t)hash(key, len) & (m->cap - 1);
    while (m->keys[i] && (m->lens[i] != len || memcmp(m->keys[i], key, len)))
        i = (i + 1) & (m->cap - 1);
    return i;
}

static int grow(wl_strmap *m)
{
    wl_strmap n = {.cap = m->cap ? 2 * m->cap : 1024};
    n.keys = calloc(n.cap, sizeof *n.keys);
    n.lens = calloc(n.cap, sizeof *n.lens);
    n.values = calloc(n.cap, sizeof *n.values);
    if (!n.keys || !n.lens || !n.values) {
        free(n.keys);
        free(n.lens);
        free(n.values);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t j = find(&n, m->keys[i], m->lens[i]);
        n.keys[j] = m->keys[i];
        n.lens[j] = m->lens[i];
        n.values[j] = m->values[i];
    }
    n.count = m->count;
    free(m->keys);
    free(m->lens);
    free(m->values);
    *m = n;
    return 0;
}

int wl_strmap_put(wl_strmap *m, const char *key, size_t len, int value)
{
    if (2 * (m->count + 1) > m->cap && grow(m))
        return -1;
    size_t i = find(m, key, len);
    if (!m->keys[i]) {
        if (!(m->keys[i] = malloc(len + 1)))
            return -1;
        memcpy(m->keys[i], key, len);
        m->keys[i][len] = 0;
        m->lens[i] = len;
        m->count++;
    }
    m->values[i] = value;
    return 0;
}

int wl_strmap_get(const wl_strmap *m, const char *key, size_t len, int *value)
{
    if (!m->cap)
        return 0;
    size_t i = find(m, key, len);
    if (!m->keys[i])
        return 0;
    *value = m->values[i];
    return 1;
}

void wl_strmap_free(wl_strmap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        free(m->keys[i]);
    free(m->keys);
    free(m->lens);
    free(m->values);
    memset(m, 0, sizeof *m);
}
