/*
 * decode.c - reading a file and decoding it with stb_image.
 *
 * stb_image (Debian's libstb) decodes PNG, JPEG, BMP, GIF and PNM. It
 * rejects most damaged files itself, but fills the missing rows of a
 * truncated BMP or PNM (and the last frame of a GIF) without complaint, so
 * those are checked here against the sizes their headers promise: a file
 * cut short is reported, never hashed as a different picture.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stb_image.h>

#include "images.h"

enum {
    MAX_PIXELS = 1 << 28, /* 256 Mpixels: 768 MiB decoded, ~2 GiB on the device */
    MAX_SIDE = 1 << 19,   /* keeps every launch grid within CUDA's limits */
};

typedef enum format { FMT_UNKNOWN, FMT_PNG, FMT_JPEG, FMT_GIF, FMT_BMP, FMT_PNM } format;

static const char *const format_names[] = {"", "PNG", "JPEG", "GIF", "BMP", "PNM"};

static format sniff(const uint8_t *p, size_t n)
{
    if (n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8))
        return FMT_PNG;
    if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff)
        return FMT_JPEG;
    if (n >= 6 && (!memcmp(p, "GIF87a", 6) || !memcmp(p, "GIF89a", 6)))
        return FMT_GIF;
    if (n >= 2 && p[0] == 'B' && p[1] == 'M')
        return FMT_BMP;
    if (n >= 2 && p[0] == 'P' && (p[1] == '5' || p[1] == '6'))
        return FMT_PNM;
    return FMT_UNKNOWN;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Bytes an uncompressed BMP needs, from its header; 0 when unknown. */
static uint64_t bmp_needs(const uint8_t *p, size_t n)
{
    if (n < 34 || le32(p + 14) < 40)
        return 0; /* old OS/2 headers: let the decoder judge */
    uint32_t compression = le32(p + 30), bpp = (uint32_t)p[28] | (uint32_t)p[29] << 8;
    if (compression != 0 && compression != 3)
        return 0; /* run-length encoded: no fixed size */
    int64_t w = (int32_t)le32(p + 18), h = (int32_t)le32(p + 22);
    uint64_t stride = ((uint64_t)(w < 0 ? -w : w) * bpp + 31) / 32 * 4;
    return le32(p + 10) + stride * (uint64_t)(h < 0 ? -h : h);
}

/* Bytes a binary PNM needs, from its header; 0 when unknown. */
static uint64_t pnm_needs(const uint8_t *p, size_t n)
{
    uint64_t field[3];
    size_t i = 2;
    for (int f = 0; f < 3; f++) {
        for (;;) { /* whitespace and comments */
            while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r')))
                i++;
            if (i < n && p[i] == '#')
                while (i < n && p[i] != '\n')
                    i++;
            else
                break;
        }
        if (i >= n || p[i] < '0' || p[i] > '9')
            return 0;
        field[f] = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9' && field[f] < ((uint64_t)1 << 40))
            field[f] = field[f] * 10 + (uint64_t)(p[i++] - '0');
    }
    uint64_t channels = p[1] == '6' ? 3 : 1, depth = field[2] > 255 ? 2 : 1;
    return i + 1 + field[0] * field[1] * channels * depth; /* one whitespace after maxval */
}

/* A reason the file is cut short, or NULL. */
static const char *truncated(format fmt, const uint8_t *p, size_t n)
{
    switch (fmt) {
    case FMT_BMP: {
        uint64_t need = bmp_needs(p, n);
        return need && n < need ? "truncated BMP: shorter than its header says" : NULL;
    }
    case FMT_PNM: {
        uint64_t need = pnm_needs(p, n);
        return need && n < need ? "truncated PNM: shorter than its header says" : NULL;
    }
    case FMT_GIF:
        return p[n - 1] != 0x3b ? "truncated GIF: no trailer" : NULL;
    default:
        return NULL; /* PNG and JPEG: stb_image itself runs out of data */
    }
}

static int read_all(const char *path, uint8_t **out, size_t *len, char *why, size_t why_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_len, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "not a regular file");
        close(fd);
        return -1;
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        snprintf(why, why_len, "out of memory for %zu bytes", n);
        close(fd);
        return -1;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(why, why_len, "cannot read: %s", r < 0 ? strerror(errno) : "file shrank");
            free(buf);
            close(fd);
            return -1;
        }
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = n;
    return 0;
}

int wi_image_load(const char *path, wi_image *img, char *why, size_t why_len)
{
    uint8_t *buf;
    size_t n;
    *img = (wi_image){0};
    if (read_all(path, &buf, &n, why, why_len))
        return -1;
    int rc = -1, w, h, comp;
    format fmt = sniff(buf, n);
    const char *cut;
    if (n == 0) {
        snprintf(why, why_len, "empty file");
    } else if (n > INT32_MAX) {
        snprintf(why, why_len, "too large to decode (%zu bytes)", n);
    } else if (!stbi_info_from_memory(buf, (int)n, &w, &h, &comp)) {
        if (fmt == FMT_UNKNOWN)
            snprintf(why, why_len, "not an image (stb_image: %s)", stbi_failure_reason());
        else
            snprintf(why, why_len, "corrupt %s (stb_image: %s)", format_names[fmt],
                     stbi_failure_reason());
    } else if (w <= 0 || h <= 0 || w > MAX_SIDE || h > MAX_SIDE ||
               (uint64_t)w * (uint64_t)h > MAX_PIXELS) {
        snprintf(why, why_len, "%d x %d pixels is more than this program takes", w, h);
    } else if ((cut = truncated(fmt, buf, n)) != NULL) {
        snprintf(why, why_len, "%s", cut);
    } else if (!(img->rgb = stbi_load_from_memory(buf, (int)n, &w, &h, &comp, 3))) {
        snprintf(why, why_len, "corrupt or truncated %s (stb_image: %s)",
                 fmt == FMT_UNKNOWN ? "image" : format_names[fmt], stbi_failure_reason());
    } else {
        img->width = (uint32_t)w;
        img->height = (uint32_t)h;
        img->file_bytes = n;
        rc = 0;
    }
    free(buf);
    return rc;
}

void wi_image_free(wi_image *img)
{
    stbi_image_free(img->rgb);
    img->rgb = NULL;
}

/* snprintf into buf at at, counting what did not fit as snprintf does. */
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int k = snprintf(buf + (at < len ? at : len), at < len ? len - at : 0, __VA_ARGS__);       \
        at += k > 0 ? (size_t)k : 0;                                                               \
    } while (0)

size_t wi_json_string(char *buf, size_t len, const char *s)
{
    size_t at = 0;
    PUT("\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            PUT("\\%c", *c);
        else if (*c < 0x20)
            PUT("\\u%04x", *c);
        else
            PUT("%c", *c);
    }
    PUT("\"");
    return at;
}

size_t wi_json_line(char *buf, size_t len, const char *path, uint32_t w, uint32_t h,
                    uint64_t file_bytes, const wi_result *r)
{
    size_t at = 0;
    PUT("{\"path\":");
    at += wi_json_string(buf + (at < len ? at : len), at < len ? len - at : 0, path);
    PUT(",\"width\":%u,\"height\":%u,\"bytes\":%llu,\"hash\":\"%016llx\",\"histogram\":[", w, h,
        (unsigned long long)file_bytes, (unsigned long long)r->hash);
    for (unsigned i = 0; i < WI_HIST_BINS; i++)
        PUT(i ? ",%u" : "%u", r->histogram[i]);
    PUT("]}\n");
    return at;
}

#undef PUT

/* What one of the snprintf-like wi_json_* calls formats, written with one
 * fputs: lines from several threads never interleave. */
typedef struct json_text {
    const char *path;
    const wi_image *img; /* NULL: path alone, as a string */
    const wi_result *r;
} json_text;

static size_t json_format(char *buf, size_t len, const json_text *t)
{
    if (!t->img)
        return wi_json_string(buf, len, t->path);
    return wi_json_line(buf, len, t->path, t->img->width, t->img->height, t->img->file_bytes, t->r);
}

static int json_put(FILE *f, const json_text *t)
{
    char small[1024], *buf = small;
    size_t len = json_format(small, sizeof small, t);
    if (len >= sizeof small && (buf = malloc(len + 1)) != NULL) /* a very long path */
        json_format(buf, len + 1, t);
    int rc = buf && fputs(buf, f) != EOF ? 0 : -1;
    if (buf != small)
        free(buf);
    return rc;
}

int wi_json_write(FILE *f, const char *path, const wi_image *img, const wi_result *r)
{
    return json_put(f, &(json_text){path, img, r});
}

int wi_json_put_string(FILE *f, const char *s)
{
    return json_put(f, &(json_text){s, NULL, NULL});
}
