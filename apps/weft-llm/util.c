/*
 * util.c - weft-llm's error line, the dtype conversions, the seeded
 * random numbers and a growable byte buffer.
 *
 * The conversions round to nearest, ties to even, as weft's ops do, so a
 * value stored here and one written by an op agree bit for bit.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm.h"

static _Thread_local char error_line[512];

int wl_fail(const char *fmt, ...)
{
    char line[sizeof error_line]; /* the arguments may hold wl_error()'s line */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    memcpy(error_line, line, sizeof line);
    return -1;
}

const char *wl_error(void)
{
    return error_line[0] ? error_line : "no error";
}

void wl_lock_always(weft_mutex *m)
{
    if (weft_mutex_lock(m) == WEFT_OK)
        return;
    while (weft_mutex_trylock(m) != WEFT_OK)
        weft_yield();
}

size_t wl_dtype_size(weft_dtype dt)
{
    switch (dt) {
    case WEFT_DTYPE_F32:
    case WEFT_DTYPE_I32:
        return 4;
    case WEFT_DTYPE_BF16:
    case WEFT_DTYPE_F16:
        return 2;
    case WEFT_DTYPE_F8_E4M3:
    case WEFT_DTYPE_F8_E5M2:
    case WEFT_DTYPE_I8:
        return 1;
    }
    return 0;
}

const char *wl_dtype_name(weft_dtype dt)
{
    switch (dt) {
    case WEFT_DTYPE_F32:
        return "F32";
    case WEFT_DTYPE_BF16:
        return "BF16";
    case WEFT_DTYPE_F16:
        return "F16";
    case WEFT_DTYPE_F8_E4M3: /* safetensors' names */
        return "F8_E4M3";
    case WEFT_DTYPE_F8_E5M2:
        return "F8_E5M2";
    case WEFT_DTYPE_I8:
        return "I8";
    case WEFT_DTYPE_I32:
        return "I32";
    }
    return "?";
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 1024), (int)exp - 25);
    return sign ? -v : v;
}

static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    float a = fabsf(f);
    if (isnan(f))
        return sign | 0x7e00;
    if (a >= 65520.0f) /* rounds past the largest half */
        return sign | 0x7c00;
    if (a < ldexpf(1.0f, -14)) { /* subnormal: multiples of 2^-24, nearbyint ties to even */
        return sign | (uint16_t)nearbyintf(a * 16777216.0f);
    }
    int e;
    float m = frexpf(a, &e);                        /* a = m 2^e, m in [0.5, 1) */
    uint32_t q = (uint32_t)nearbyintf(m * 2048.0f); /* 11 significant bits */
    if (q == 2048) {
        q = 1024;
        e++;
    }
    if (e + 14 >= 31)
        return sign | 0x7c00;
    return sign | (uint16_t)((uint32_t)(e + 14) << 10 | (q & 1023));
}

float wl_load(weft_dtype dt, const void *p, size_t i)
{
    if (dt == WEFT_DTYPE_F32) {
        float v;
        memcpy(&v, (const char *)p + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, 2);
    if (dt == WEFT_DTYPE_F16)
        return half_to_float(h);
    uint32_t x = (uint32_t)h << 16;
    float v;
    memcpy(&v, &x, 4);
    return v;
}

void wl_store(weft_dtype dt, void *p, size_t i, float v)
{
    if (dt == WEFT_DTYPE_F32) {
        memcpy((char *)p + 4 * i, &v, 4);
        return;
    }
    uint16_t h;
    if (dt == WEFT_DTYPE_F16) {
        h = float_to_half(v);
    } else {
        uint32_t x;
        memcpy(&x, &v, 4);
        if (isnan(v))
            h = (uint16_t)((x >> 16) | 0x40);
        else
            h = (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
    }
    memcpy((char *)p + 2 * i, &h, 2);
}

double wl_round(weft_dtype dt, double v)
{
    uint32_t buf;
    wl_store(dt, &buf, 0, (float)v);
    return wl_load(dt, &buf, 0);
}

/* splitmix64: a full-period generator whose every seed is a good one. */
uint64_t wl_rand_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double wl_rand_uniform(uint64_t *state)
{
    return (double)(wl_rand_next(state) >> 11) * 0x1p-53;
}

double wl_rand_normal(uint64_t *state)
{
    double u = wl_rand_uniform(state), v = wl_rand_uniform(state);
    return sqrt(-2.0 * log1p(-u)) * cos(2.0 * M_PI * v);
}

/* ---- bytes ------------------------------------------------------------------ */

void wl_buf_append(wl_buf *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->failed = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void wl_buf_printf(wl_buf *b, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        wl_buf_append(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    wl_buf_append(b, big, (size_t)n);
    free(big);
}

void wl_buf_puts(wl_buf *b, const char *s)
{
    wl_buf_append(b, s, strlen(s));
}

void wl_buf_free(wl_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- UTF-8 -------------------------------------------------------------------- */

/* The length of the well-formed sequence at s (n bytes left): 1 to 4, 0 if
 * it is cut short by the end, -1 if it is malformed. */
static int utf8_sequence(const unsigned char *s, size_t n)
{
    int len;
    unsigned lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf)
        len = 2;
    else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        len = 3;
        lo = s[0] == 0xe0 ? 0xa0 : 0x80; /* no overlong forms */
        hi = s[0] == 0xed ? 0x9f : 0xbf; /* no surrogates */
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        len = 4;
        lo = s[0] == 0xf0 ? 0x90 : 0x80;
        hi = s[0] == 0xf4 ? 0x8f : 0xbf;
    } else
        return -1;
    for (int i = 1; i < len; i++) {
        if ((size_t)i == n)
            return 0;
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xbf))
            return -1;
    }
    return len;
}

void wl_utf8_sanitize(wl_buf *out, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int l = utf8_sequence(p + i, n - i);
        if (l > 0) {
            wl_buf_append(out, p + i, (size_t)l);
            i += (size_t)l;
        } else {
            wl_buf_append(out, "\xef\xbf\xbd", 3);
            i++;
        }
    }
}

size_t wl_utf8_complete(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int l = utf8_sequence(p + i, n - i);
        if (l == 0)
            return i; /* the last character is unfinished */
        i += l > 0 ? (size_t)l : 1;
    }
    return n;
}

void wl_show_load(void *ctx, size_t done, size_t total)
{
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int filled = total ? (int)((double)done / total * WIDTH) : WIDTH;
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < filled ? '#' : ' ';
    bar[WIDTH] = 0;
    double unit = total >= 1e9 ? 1e9 : 1e6;
    fprintf(stderr, "\rweft-llm: loading %s [%s] %3d%% (%.2f of %.2f %s)%s", (const char *)ctx, bar,
            total ? (int)(100.0 * done / total) : 100, done / unit, total / unit,
            unit == 1e9 ? "GB" : "MB", done == total ? "\n" : "");
    fflush(stderr);
}

void wl_show_load_on(wl_model *m, const char *what)
{
    if (isatty(STDERR_FILENO)) {
        m->on_load = wl_show_load;
        m->load_ctx = (void *)what;
    }
}
