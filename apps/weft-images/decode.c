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
    MAX_PIXELS = WI_MAX_PIXELS, /* 256 Mpixels: 768 MiB decoded, ~2 GiB on the device */
    MAX_SIDE = 1 << 19,         /* keeps every launch grid within CUDA's limits */
    MAX_FILE_BYTES = INT32_MAX, /* stb_image takes an int length */
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

/* stb_image keeps its last reason (per thread) and some failures set none,
 * so a stale reason from an earlier file could show: before a call that
 * may fail, set the reason a known format can never get. */
#define RESET_REASON "unknown image type"

static void stb_reset(void)
{
    int w, h, c;
    stbi_info_from_memory((const stbi_uc *)"", 1, &w, &h, &c);
}

/* stb_image's terse reason in words; it gives none for some failures. */
static const char *stb_reason(const char *r)
{
    if (!r || !*r)
        return "it gave no reason";
    if (!strcmp(r, "outofmem"))
        return "out of memory";
    return r;
}

/* The declared size of a PNG, GIF or BMP from its first bytes, for when
 * stb_image refuses a header as too large to say what it declared. */
static bool header_dims(format fmt, const uint8_t *p, size_t n, uint64_t *w, uint64_t *h)
{
    if (fmt == FMT_PNG && n >= 24 && !memcmp(p + 12, "IHDR", 4)) {
        *w = (uint64_t)p[16] << 24 | (uint64_t)p[17] << 16 | (uint64_t)p[18] << 8 | p[19];
        *h = (uint64_t)p[20] << 24 | (uint64_t)p[21] << 16 | (uint64_t)p[22] << 8 | p[23];
        return true;
    }
    if (fmt == FMT_GIF && n >= 10) {
        *w = (uint64_t)p[6] | (uint64_t)p[7] << 8;
        *h = (uint64_t)p[8] | (uint64_t)p[9] << 8;
        return true;
    }
    if (fmt == FMT_BMP && n >= 26 && le32(p + 14) >= 40) {
        int64_t sw = (int32_t)le32(p + 18), sh = (int32_t)le32(p + 22);
        *w = (uint64_t)(sw < 0 ? -sw : sw);
        *h = (uint64_t)(sh < 0 ? -sh : sh);
        return true;
    }
    return false;
}

/* A reason to refuse w x h pixels, written into why; false when they are
 * fine. */
static bool bad_dims(uint64_t w, uint64_t h, uint64_t max_pixels, char *why, size_t why_len)
{
    if (w == 0 || h == 0)
        snprintf(why, why_len, "%llu x %llu pixels: an image with no pixels", (unsigned long long)w,
                 (unsigned long long)h);
    else if (w > MAX_SIDE || h > MAX_SIDE)
        snprintf(why, why_len,
                 "%llu x %llu pixels: a side longer than %d pixels is more than this program "
                 "takes",
                 (unsigned long long)w, (unsigned long long)h, MAX_SIDE);
    else if (w * h > max_pixels)
        snprintf(why, why_len,
                 "%llu x %llu pixels (%.1f Mpixels) is more than the limit of %llu pixels "
                 "(--max-pixels raises it, up to %d)",
                 (unsigned long long)w, (unsigned long long)h, (double)(w * h) / 1e6,
                 (unsigned long long)max_pixels, MAX_PIXELS);
    else
        return false;
    return true;
}

/* stb_image's callbacks on a file descriptor, so that the header can be
 * read without reading the file: a JPEG's SOF may follow long metadata,
 * which skip() steps over. */
static int fd_read(void *user, char *data, int size)
{
    ssize_t r;
    do
        r = read(*(int *)user, data, (size_t)size);
    while (r < 0 && errno == EINTR);
    return r < 0 ? 0 : (int)r;
}

static void fd_skip(void *user, int n)
{
    lseek(*(int *)user, n, SEEK_CUR);
}

static int fd_eof(void *user)
{
    char c;
    int fd = *(int *)user;
    off_t at = lseek(fd, 0, SEEK_CUR);
    ssize_t r = pread(fd, &c, 1, at);
    return r <= 0;
}

static const char *kind_of(mode_t m)
{
    return S_ISDIR(m)    ? "a folder"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "not a regular file";
}

int wi_image_probe(const char *path, uint64_t max_pixels, wi_probe *pr, char *why, size_t why_len)
{
    *pr = (wi_probe){.fd = -1};
    /* O_NONBLOCK: a FIFO put there after the scan must not hang the open */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_len, "cannot open: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "cannot stat: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "%s, not a regular file: skipped", kind_of(st.st_mode));
        close(fd);
        return -1;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size == 0) {
        snprintf(why, why_len, "empty file");
        close(fd);
        return -1;
    }
    if (size > MAX_FILE_BYTES) { /* checked before reading: a sparse file can be huge */
        snprintf(why, why_len, "%llu bytes: larger than the %d bytes stb_image reads",
                 (unsigned long long)size, MAX_FILE_BYTES);
        close(fd);
        return -1;
    }
    uint8_t head[32];
    ssize_t got = pread(fd, head, sizeof head, 0);
    size_t head_n = got > 0 ? (size_t)got : 0;
    format fmt = sniff(head, head_n);
    int w, h, comp;
    int ok = stbi_info_from_callbacks(&(stbi_io_callbacks){fd_read, fd_skip, fd_eof}, &fd, &w, &h,
                                      &comp);
    uint64_t dw, dh;
    if (!ok) {
        const char *r = stbi_failure_reason();
        if (header_dims(fmt, head, head_n, &dw, &dh) && bad_dims(dw, dh, max_pixels, why, why_len))
            ; /* a valid header declaring more than we take: stb_image calls it corrupt */
        else if (r && !strcmp(r, "too large"))
            snprintf(why, why_len, "%s declares more pixels than stb_image takes",
                     fmt == FMT_UNKNOWN ? "image" : format_names[fmt]);
        else if (fmt == FMT_UNKNOWN)
            snprintf(why, why_len, "not an image (stb_image: %s)",
                     stb_reason(stbi_failure_reason()));
        else
            snprintf(why, why_len, "corrupt %s (stb_image: %s)", format_names[fmt],
                     r && !strcmp(r, RESET_REASON) ? "its header is not valid" : stb_reason(r));
        close(fd);
        return -1;
    }
    if (bad_dims((uint64_t)w, (uint64_t)h, max_pixels, why, why_len)) {
        close(fd);
        return -1;
    }
    *pr = (wi_probe){fd, size, (uint32_t)w, (uint32_t)h,
                     size + (uint64_t)w * (uint64_t)h * WI_DECODE_BYTES_PER_PIXEL};
    return 0;
}

void wi_probe_close(wi_probe *pr)
{
    if (pr->fd >= 0)
        close(pr->fd);
    pr->fd = -1;
}

static int read_all(int fd, uint8_t *buf, size_t n, char *why, size_t why_len)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0) {
            snprintf(why, why_len, "cannot read: %s",
                     r < 0 ? strerror(errno) : "the file shrank while being read");
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* JPEG: stb_image leaves a colour component's pixels unwritten (whatever
 * the heap held) when no scan carries it, and accepts such a file, so the
 * hash would change from run to run. Every component of the frame must be
 * in a scan; in a progressive file, in a first DC scan (the one that
 * zeroes its coefficients). Returns a reason, or NULL (also when the file
 * is too damaged to walk: stb_image then judges it). */
static const char *jpeg_unscanned(const uint8_t *p, size_t n)
{
    uint8_t ids[4] = {0};
    unsigned ncomp = 0, covered = 0;
    bool progressive = false, frame = false;
    size_t i = 2;
    while (i + 4 <= n) {
        if (p[i] != 0xff)
            return NULL;
        uint8_t m = p[i + 1];
        if (m == 0xff) {
            i++;
            continue;
        }
        if (m == 0xd9)
            break;
        if (m == 0x01 || (m >= 0xd0 && m <= 0xd7)) {
            i += 2;
            continue;
        }
        size_t len = (size_t)p[i + 2] << 8 | p[i + 3];
        if (len < 2 || i + 2 + len > n)
            break;
        const uint8_t *seg = p + i + 4;
        if (m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc) {
            if (len < 8 || frame)
                return NULL;
            frame = true;
            progressive = m == 0xc2;
            ncomp = seg[5] < 4 ? seg[5] : 4;
            if (len < 8 + 3 * (size_t)ncomp)
                return NULL;
            for (unsigned k = 0; k < ncomp; k++)
                ids[k] = seg[6 + 3 * k];
        } else if (m == 0xda) {
            unsigned ns = len >= 3 ? seg[0] : 0;
            if (!frame || len < 6 + 2 * (size_t)ns)
                return NULL;
            bool first_dc = seg[1 + 2 * ns] == 0 && (seg[3 + 2 * ns] >> 4) == 0;
            for (unsigned s = 0; s < ns; s++)
                for (unsigned k = 0; k < ncomp; k++)
                    if (seg[1 + 2 * s] == ids[k] && (!progressive || first_dc))
                        covered |= 1u << k;
            size_t j = i + 2 + len; /* past the entropy-coded data */
            while (j + 1 < n &&
                   !(p[j] == 0xff && p[j + 1] != 0 && (p[j + 1] < 0xd0 || p[j + 1] > 0xd7)))
                j++;
            i = j;
            continue;
        }
        i += 2 + len;
    }
    if (!frame)
        return NULL;
    if (covered == 0)
        return "corrupt or truncated JPEG: no image data (no scan of its pixels)";
    if (covered != (1u << ncomp) - 1)
        return "corrupt or truncated JPEG: no image data for some of its colour components";
    return NULL;
}

int wi_image_decode(wi_probe *pr, wi_image *img, char *why, size_t why_len)
{
    *img = (wi_image){0};
    size_t n = (size_t)pr->file_bytes;
    uint8_t *buf = malloc(n);
    int rc = -1, w, h, comp;
    if (!buf) {
        snprintf(why, why_len, "out of memory for the file's %zu bytes", n);
        wi_probe_close(pr);
        return -1;
    }
    if (read_all(pr->fd, buf, n, why, why_len)) {
        free(buf);
        wi_probe_close(pr);
        return -1;
    }
    wi_probe_close(pr);
    format fmt = sniff(buf, n);
    const char *cut;
    if (!stbi_info_from_memory(buf, (int)n, &w, &h, &comp) || (uint32_t)w != pr->width ||
        (uint32_t)h != pr->height) {
        snprintf(why, why_len, "changed while being read");
    } else if ((cut = truncated(fmt, buf, n)) != NULL ||
               (fmt == FMT_JPEG && (cut = jpeg_unscanned(buf, n)) != NULL)) {
        snprintf(why, why_len, "%s", cut);
    } else if (stb_reset(), !(img->rgb = stbi_load_from_memory(buf, (int)n, &w, &h, &comp, 3))) {
        const char *r = stbi_failure_reason();
        if (r && !strcmp(r, RESET_REASON))
            r = NULL; /* a known format failed without saying why */
        if (r && !strcmp(r, "outofmem"))
            snprintf(why, why_len, "out of memory decoding %d x %d pixels", w, h);
        else if (fmt == FMT_GIF && (!r || !*r)) /* stb_image's GIF reader stops at the trailer */
            snprintf(why, why_len, "corrupt GIF: no image in it, only a header");
        else
            snprintf(why, why_len, "corrupt or truncated %s (stb_image: %s)",
                     fmt == FMT_UNKNOWN ? "image" : format_names[fmt], stb_reason(r));
    } else {
        img->width = (uint32_t)w;
        img->height = (uint32_t)h;
        img->file_bytes = n;
        rc = 0;
    }
    free(buf);
    return rc;
}

int wi_image_load(const char *path, wi_image *img, char *why, size_t why_len)
{
    wi_probe pr;
    *img = (wi_image){0};
    if (wi_image_probe(path, WI_DEFAULT_MAX_PIXELS, &pr, why, why_len))
        return -1;
    return wi_image_decode(&pr, img, why, why_len);
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

/* The length of the valid UTF-8 sequence at s (1-4), or 0 when s starts
 * with a byte that is not one: a stray continuation byte, an overlong
 * form, a surrogate or a code point past U+10FFFF. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (n == 0 || c >= 0xf5 || c == 0xc0 || c == 0xc1)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0; /* also stops at the NUL */
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) || (c == 0xf0 && s[1] < 0x90) ||
        (c == 0xf4 && s[1] >= 0x90))
        return 0;
    return n;
}

size_t wi_json_string(char *buf, size_t len, const char *s)
{
    size_t at = 0;
    PUT("\"");
    for (const unsigned char *c = (const unsigned char *)s; *c;) {
        size_t n = *c < 0x80 ? 1 : utf8_len(c);
        if (*c == '"' || *c == '\\')
            PUT("\\%c", *c);
        else if (*c < 0x20 || *c == 0x7f)
            PUT("\\u%04x", *c);
        else if (n == 0) /* a byte that is not UTF-8: a lone low surrogate, as PEP 383 */
            PUT("\\udc%02x", *c);
        else
            PUT("%.*s", (int)n, (const char *)c);
        c += n ? n : 1;
    }
    PUT("\"");
    return at;
}

const char *wi_shown(const char *s, char *buf, size_t len)
{
    size_t at = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c && at + 8 < len;) {
        size_t n = *c < 0x80 ? 1 : utf8_len(c);
        if (*c == '\\')
            PUT("\\\\");
        else if (*c < 0x20 || *c == 0x7f || n == 0)
            PUT("\\x%02x", *c);
        else
            PUT("%.*s", (int)n, (const char *)c);
        c += n ? n : 1;
        if (*c && at + 8 >= len)
            PUT("...");
    }
    if (len)
        buf[at < len ? at : len - 1] = '\0';
    return buf;
}

size_t wi_json_line(char *buf, size_t len, const char *path, uint32_t w, uint32_t h,
                    uint64_t file_bytes, const wi_result *r)
{
    size_t at = 0;
    PUT("{\"path\":");
    at += wi_json_string(buf + (at < len ? at : len), at < len ? len - at : 0, path);
    PUT(",\"width\":%u,\"height\":%u,\"bytes\":%llu,\"hash\":\"%016llx\",\"detail\":%.3f,"
        "\"histogram\":[",
        w, h, (unsigned long long)file_bytes, (unsigned long long)r->hash,
        wi_detail_levels(r->detail));
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
