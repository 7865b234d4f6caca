/*
 * argmax_ref.h - what weft_argmax's host and GPU tests share: rows of
 * fresh random values with what makes a choice hard planted in them (ties
 * at the maximum, NaN, rows of only NaN, -Inf or signed zeros), padding
 * that must never be read (+Inf, which would win), and the plain loop
 * that says which index each row's maximum is: the first of the largest
 * values, comparisons in double, NaN skipped (a row of NaN: 0).
 */
#ifndef WEFT_TEST_ARGMAX_REF_H
#define WEFT_TEST_ARGMAX_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/ops_internal.h"
#include "weft/ops.h"

static uint64_t am_state;

static inline uint64_t am_next(void) /* splitmix64 */
{
    uint64_t z = (am_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A host test group's setup: the seed (WEFT_TEST_SEED when set, else the
 * clock) printed and taken. */
static inline int am_setup(void **state)
{
    (void)state;
    const char *s = getenv("WEFT_TEST_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed =
        s && *s ? strtoull(s, NULL, 0) : (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec;
    printf("seed %llu (WEFT_TEST_SEED=%llu repeats it)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    am_state = seed;
    return 0;
}

typedef enum am_kind {
    AM_RANDOM, /* uniform in [-4, 4): in bf16, ties at the top happen by themselves */
    AM_TIES,   /* the row's maximum planted at three places */
    AM_NAN,    /* a tenth NaN, the first element among them */
    AM_ALL_NAN,
    AM_NEG_INF, /* -Inf everywhere but a few NaN */
    AM_ZEROS,   /* -0 and +0 only: all equal */
    AM_KINDS
} am_kind;

static const char *const am_kind_names[AM_KINDS] = {"random",  "ties", "nan",
                                                    "all nan", "-inf", "signed zeros"};

/* rows rows of cols values of dtype t, stride apart (malloc'd). */
static inline void *am_rows(weft_dtype t, size_t rows, size_t cols, size_t stride, am_kind kind)
{
    size_t n = (rows - 1) * stride + cols + 16;
    void *p = malloc(n * weft__dtype_size(t));
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++)
        weft__store(t, p, i, INFINITY); /* padding: read, it would win */
    for (size_t r = 0; r < rows; r++) {
        size_t base = r * stride;
        for (size_t j = 0; j < cols; j++) {
            float v = (float)((double)(am_next() >> 11) * 0x1p-53 * 8.0 - 4.0);
            if (kind == AM_NAN && (j == 0 || am_next() % 10 == 0))
                v = NAN;
            if (kind == AM_ALL_NAN)
                v = NAN;
            if (kind == AM_NEG_INF)
                v = am_next() % 16 == 0 ? NAN : -INFINITY;
            if (kind == AM_ZEROS)
                v = am_next() % 2 ? -0.0f : 0.0f;
            weft__store(t, p, base + j, v);
        }
        if (kind == AM_TIES) {
            float top = 5.0f; /* above every random value, exact in every type */
            for (int k = 0; k < 3; k++)
                weft__store(t, p, base + am_next() % cols, top);
        }
    }
    return p;
}

/* The index of row r's maximum, by the plain loop. */
static inline int32_t am_ref(weft_dtype t, const void *p, size_t r, size_t cols, size_t stride)
{
    int32_t at = 0;
    int have = 0;
    double best = 0;
    for (size_t j = 0; j < cols; j++) {
        double v = weft__load(t, p, r * stride + j);
        if (isnan(v))
            continue;
        if (!have || v > best)
            best = v, at = (int32_t)j, have = 1;
    }
    return at;
}

#endif
