/*
 * images_test.h - what the weft-images tests share: running the programs,
 * reading what they wrote, and fixtures whose results are known from
 * first principles.
 *
 * Fixtures (written here with stb_image_write or by hand, never stored):
 *  - a flat colour and a flat grey picture: every AC coefficient of a
 *    constant block is exactly zero (each DCT basis row sums to zero), so
 *    the hash is 0, and the histogram is one bin holding every pixel;
 *  - 32x32 "quadrants", white top-left and bottom-right, black elsewhere,
 *    and its inverse: the shrink is the identity at 32x32 and the blur is
 *    separable and mirror-symmetric, so the shrunken image is
 *    K/2 + (255/2) b(x) b(y) with b the blurred +-1 step. Coefficients with
 *    an even frequency in either direction vanish exactly (48 of 64, so
 *    the median is 0); the 16 odd-odd ones are (255/2) B(u) B(v), with
 *    B(k) = sum_x cos((2x+1) k pi / 64) b(x), whose signs give the bits.
 *    The expected hash is computed that way, in floating point, apart from
 *    the program's integer arithmetic. So is the detail: the mean of the
 *    64 |C(u, v)| of an orthonormal DCT, (255/2) |B(u) B(v)| / 16 / 256 /
 *    64 summed over the odd-odd ones (b scaled by 16, the weights' sum;
 *    with the fixed-point basis it agrees to a few parts in 10 000).
 */
#ifndef WEFT_IMAGES_TEST_H
#define WEFT_IMAGES_TEST_H

#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stb_image_write.h>

extern char **environ;

/* ---- files and folders ---------------------------------------------------- */

static inline char *tmp_dir(void)
{
    const char *base = getenv("TMPDIR");
    char *path;
    if (asprintf(&path, "%s/weft-images-test.XXXXXX", base ? base : "/tmp") < 0 || !mkdtemp(path))
        return NULL;
    return path;
}

static inline void remove_tree(const char *dir)
{
    char *cmd;
    if (dir && asprintf(&cmd, "rm -rf '%s'", dir) >= 0) {
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
        free(cmd);
    }
}

/* The whole of a file, NUL-terminated (NULL if unreadable). */
static inline char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = '\0';
    fclose(f);
    return buf;
}

static inline long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static inline char *join(const char *dir, const char *name)
{
    char *p;
    return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

/* ---- running programs ----------------------------------------------------- */

typedef struct ran {
    int status; /* exit status, or -1 if it did not exit normally */
    char *out, *err;
} ran;

/* Run argv (NULL-terminated) with stdout and stderr captured. */
static inline ran run_program(const char *dir, char *const argv[])
{
    ran r = {-1, NULL, NULL};
    char *out = join(dir, ".stdout"), *err = join(dir, ".stderr");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int ws;
    if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) == 0 && waitpid(pid, &ws, 0) == pid &&
        WIFEXITED(ws))
        r.status = WEXITSTATUS(ws);
    posix_spawn_file_actions_destroy(&fa);
    r.out = slurp(out);
    r.err = slurp(err);
    if (!r.out)
        r.out = strdup("");
    if (!r.err)
        r.err = strdup("");
    free(out);
    free(err);
    return r;
}

static inline void ran_free(ran *r)
{
    free(r->out);
    free(r->err);
}

/* The line of text that contains needle, or NULL. */
static inline const char *line_with(const char *text, const char *needle)
{
    const char *hit = strstr(text, needle);
    if (!hit)
        return NULL;
    while (hit > text && hit[-1] != '\n')
        hit--;
    return hit;
}

static inline size_t count_lines_with(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        const char *hit = strstr(line, needle);
        if (hit && hit < line + len)
            n++;
        line += len + (end != NULL);
    }
    return n;
}

/* ---- fixtures ------------------------------------------------------------- */

enum { QUAD = 32 };

static inline void fill_flat(uint8_t *rgb, int w, int h, uint8_t r, uint8_t g, uint8_t b)
{
    for (int i = 0; i < w * h; i++) {
        rgb[3 * i] = r;
        rgb[3 * i + 1] = g;
        rgb[3 * i + 2] = b;
    }
}

/* White where the quadrant's sign is positive (top-left, bottom-right),
 * black elsewhere; inverse swaps them. */
static inline void fill_quadrants(uint8_t *rgb, bool inverse)
{
    for (int y = 0; y < QUAD; y++)
        for (int x = 0; x < QUAD; x++) {
            bool white = ((x < QUAD / 2) == (y < QUAD / 2)) != inverse;
            memset(rgb + 3 * (y * QUAD + x), white ? 255 : 0, 3);
        }
}

static inline int write_pnm(const char *path, const uint8_t *rgb, int w, int h, bool gray)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fprintf(f, "P%c\n%d %d\n255\n", gray ? '5' : '6', w, h);
    for (int i = 0; i < w * h; i++)
        if (gray)
            fputc(rgb[3 * i], f);
        else
            fwrite(rgb + 3 * i, 1, 3, f);
    return fclose(f) == 0;
}

/* The hash of the quadrants picture, and its detail in luminance levels,
 * derived as the header says. */
static inline uint64_t quadrants_hash(bool inverse, double *detail)
{
    static const int w5[5] = {1, 4, 6, 4, 1};
    double b[QUAD], big[8];
    for (int x = 0; x < QUAD; x++) { /* the blurred step, edges clamped */
        b[x] = 0;
        for (int k = -2; k <= 2; k++) {
            int i = x + k < 0 ? 0 : x + k >= QUAD ? QUAD - 1 : x + k;
            b[x] += w5[k + 2] * (i < QUAD / 2 ? 1.0 : -1.0);
        }
    }
    for (int k = 1; k <= 8; k++) {
        big[k - 1] = 0;
        for (int x = 0; x < QUAD; x++)
            big[k - 1] += cos((2 * x + 1) * k * M_PI / 64) * b[x];
    }
    uint64_t hash = 0;
    *detail = 0;
    for (int u = 1; u <= 8; u++)
        for (int v = 1; v <= 8; v++) {
            double c = (inverse ? -1 : 1) * big[u - 1] * big[v - 1];
            bool odd = (u % 2) && (v % 2);
            if (odd && c > 0)
                hash |= (uint64_t)1 << (63 - ((u - 1) * 8 + (v - 1)));
            if (odd)
                *detail += 255.0 / 2 * fabs(c) / 16 / 256 / 64;
        }
    return hash;
}

/* The JSON line the program must write for a picture whose histogram has
 * the given (bin, count) entries, with its detail as the text detail. */
static inline char *expected_line(const char *path, int w, int h, uint64_t hash, const char *detail,
                                  int nbins, const int *bins, const int *counts)
{
    int hist[64] = {0};
    for (int i = 0; i < nbins; i++)
        hist[bins[i]] = counts[i];
    char *line, *list = calloc(64, 12);
    size_t at = 0;
    for (int i = 0; list && i < 64; i++)
        at += (size_t)sprintf(list + at, i ? ",%d" : "%d", hist[i]);
    if (!list || asprintf(&line,
                          "{\"path\":\"%s\",\"width\":%d,\"height\":%d,\"bytes\":%ld,"
                          "\"hash\":\"%016llx\",\"detail\":%s,\"histogram\":[%s]}",
                          path, w, h, file_size(path), (unsigned long long)hash, detail, list) < 0)
        line = NULL;
    free(list);
    return line;
}

/* The text of field name ("hash", "detail") in path's image line, into
 * buf; NULL when there is no such line. */
static inline const char *image_field(const char *out, const char *path, const char *name,
                                      char *buf, size_t len)
{
    char *key;
    if (asprintf(&key, "{\"path\":\"%s\",", path) < 0)
        return NULL;
    const char *line = strstr(out, key), *end, *at = NULL;
    free(key);
    if (!line || asprintf(&key, "\"%s\":", name) < 0)
        return NULL;
    end = strchr(line, '\n');
    at = strstr(line, key);
    size_t klen = strlen(key);
    free(key);
    if (!at || (end && at > end))
        return NULL;
    at += klen;
    if (*at == '"')
        at++;
    size_t n = strcspn(at, "\",}");
    snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), at);
    return buf;
}

#endif
