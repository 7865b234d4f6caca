/*
 * weft-images-sample - a sample set for weft-images, with its ground truth.
 *
 *   weft-images-sample -t TRUTH [-n COUNT] [-s SEED] [--broken N] [-j THREADS] DIR
 *
 * Writes COUNT images into DIR: original scenes (a gradient and a few
 * blended shapes, with a little noise), and for about a third of them one
 * to three near-duplicates made by resizing, cropping a few percent off
 * the edges, changing brightness, turning grey (Rec. 709 weights, not the
 * hash's BT.601: another program's grey) and re-encoding (another format,
 * or JPEG at another quality). Originals are 48 to 400 pixels a side;
 * formats are PNG, JPEG, BMP, GIF (with giflib), PPM and PGM (PGM: a grey
 * copy too). File names are shuffled, so a group is not told by its
 * names. TRUTH gets one line per group of near-duplicates: its file
 * names, separated by tabs.
 *
 * About one scene in forty instead gives a decoy pair, in no group: a
 * heavily blurred grey picture of the scene, and a smooth field of one
 * colour shaded by a faint copy of that picture's light and dark (a few
 * levels), as a wallpaper is. The hash keeps only the signs of the low
 * frequencies, and those of the pair agree, so their hashes are close;
 * they are what a second signal must tell apart.
 *
 * N more files (default 5) are broken on purpose: empty, truncated PNG,
 * JPEG, BMP, GIF and PPM, random bytes, plain text. They are in no group.
 *
 * The output depends on COUNT, SEED and --broken only (not on THREADS):
 * every image is drawn from its own random stream.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stb_image_write.h>
#ifdef WI_HAVE_GIF
#include <gif_lib.h>
#endif

/* ---- random numbers: splitmix64, one stream per image --------------------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static rng stream(uint64_t seed, uint64_t id, uint64_t purpose)
{
    rng r = {seed * 0x100000001b3u ^ id * 0x9e3779b97f4a7c15u ^ purpose << 56};
    next(&r);
    return r;
}

static double uniform(rng *r, double lo, double hi) /* [lo, hi) */
{
    return lo + (hi - lo) * (double)(next(r) >> 11) / 9007199254740992.0;
}

static int between(rng *r, int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(next(r) % (uint64_t)(hi - lo + 1));
}

/* ---- pictures --------------------------------------------------------------- */

typedef struct picture {
    int w, h;
    uint8_t *rgb;
} picture;

static picture picture_new(int w, int h)
{
    picture p = {w, h, calloc((size_t)w * h * 3, 1)};
    if (!p.rgb) {
        fprintf(stderr, "weft-images-sample: out of memory\n");
        exit(1);
    }
    return p;
}

static uint8_t clamp8(double v)
{
    return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)(v + 0.5);
}

enum { SHAPES_MIN = 3, SHAPES_MAX = 7 };

typedef struct shape {
    bool ellipse;
    double cx, cy, rx, ry, cos_a, sin_a, alpha;
    double rgb[3];
} shape;

/* A scene in coordinates relative to the picture, so that it can be drawn at
 * any size. */
typedef struct scene {
    double from[3], to[3], dir_x, dir_y;
    shape shapes[SHAPES_MAX];
    int nshapes;
    uint64_t noise_seed;
} scene;

static void scene_make(scene *s, rng *r)
{
    for (int c = 0; c < 3; c++) {
        s->from[c] = uniform(r, 0, 255);
        s->to[c] = uniform(r, 0, 255);
    }
    double a = uniform(r, 0, 2 * M_PI);
    s->dir_x = cos(a);
    s->dir_y = sin(a);
    s->nshapes = between(r, SHAPES_MIN, SHAPES_MAX);
    for (int i = 0; i < s->nshapes; i++) {
        shape *sh = &s->shapes[i];
        double t = uniform(r, 0, M_PI);
        sh->ellipse = next(r) & 1;
        sh->cx = uniform(r, 0.05, 0.95);
        sh->cy = uniform(r, 0.05, 0.95);
        sh->rx = uniform(r, 0.08, 0.35);
        sh->ry = uniform(r, 0.08, 0.35);
        sh->cos_a = cos(t);
        sh->sin_a = sin(t);
        sh->alpha = uniform(r, 0.7, 1.0);
        for (int c = 0; c < 3; c++)
            sh->rgb[c] = uniform(r, 0, 255);
    }
    s->noise_seed = next(r);
}

static bool inside(const shape *sh, double u, double v)
{
    double du = u - sh->cx, dv = v - sh->cy;
    double x = (du * sh->cos_a + dv * sh->sin_a) / sh->rx;
    double y = (-du * sh->sin_a + dv * sh->cos_a) / sh->ry;
    return sh->ellipse ? x * x + y * y <= 1 : fabs(x) <= 1 && fabs(y) <= 1;
}

static picture scene_draw(const scene *s, int w, int h)
{
    picture p = picture_new(w, h);
    rng noise = {s->noise_seed};
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            double u = (x + 0.5) / w, v = (y + 0.5) / h;
            double t = 0.5 + 0.5 * ((u - 0.5) * s->dir_x + (v - 0.5) * s->dir_y) * 1.41421356;
            double px[3];
            for (int c = 0; c < 3; c++)
                px[c] = s->from[c] + (s->to[c] - s->from[c]) * t;
            for (int i = 0; i < s->nshapes; i++) {
                const shape *sh = &s->shapes[i];
                if (inside(sh, u, v))
                    for (int c = 0; c < 3; c++)
                        px[c] += (sh->rgb[c] - px[c]) * sh->alpha;
            }
            double grain = (double)(next(&noise) % 17) - 8;
            uint8_t *out = p.rgb + ((size_t)y * w + x) * 3;
            for (int c = 0; c < 3; c++)
                out[c] = clamp8(px[c] + grain);
        }
    return p;
}

/* Resample to w x h, each output pixel the mean of the source pixels it
 * covers (at least one). */
static picture resize(const picture *src, int w, int h)
{
    picture p = picture_new(w, h);
    for (int y = 0; y < h; y++) {
        int y0 = (int)((int64_t)y * src->h / h), y1 = (int)((int64_t)(y + 1) * src->h / h);
        if (y1 <= y0)
            y1 = y0 + 1;
        for (int x = 0; x < w; x++) {
            int x0 = (int)((int64_t)x * src->w / w), x1 = (int)((int64_t)(x + 1) * src->w / w);
            if (x1 <= x0)
                x1 = x0 + 1;
            unsigned sum[3] = {0, 0, 0}, n = 0;
            for (int sy = y0; sy < y1; sy++)
                for (int sx = x0; sx < x1; sx++, n++)
                    for (int c = 0; c < 3; c++)
                        sum[c] += src->rgb[((size_t)sy * src->w + sx) * 3 + c];
            for (int c = 0; c < 3; c++)
                p.rgb[((size_t)y * w + x) * 3 + c] = (uint8_t)((sum[c] + n / 2) / n);
        }
    }
    return p;
}

static picture crop(const picture *src, int left, int top, int right, int bottom)
{
    picture p = picture_new(src->w - left - right, src->h - top - bottom);
    for (int y = 0; y < p.h; y++)
        memcpy(p.rgb + (size_t)y * p.w * 3, src->rgb + ((size_t)(y + top) * src->w + left) * 3,
               (size_t)p.w * 3);
    return p;
}

static void brighten(picture *p, double gain, double offset)
{
    for (size_t i = 0; i < (size_t)p->w * p->h * 3; i++)
        p->rgb[i] = clamp8(p->rgb[i] * gain + offset);
}

/* Grey with Rec. 709 weights, as many editors make it. */
static void to_grey(picture *p)
{
    for (size_t i = 0; i < (size_t)p->w * p->h; i++) {
        uint8_t *px = p->rgb + 3 * i;
        memset(px, clamp8(0.2126 * px[0] + 0.7152 * px[1] + 0.0722 * px[2]), 3);
    }
}

/* Three passes of a box of 2 radius + 1 along rows, then columns (close
 * to a Gaussian of sigma radius), edges clamped. */
static void blur(picture *p, int radius)
{
    int n = 2 * radius + 1;
    size_t len = (size_t)(p->w > p->h ? p->w : p->h);
    double *line = malloc(len * sizeof *line);
    if (!line) {
        fprintf(stderr, "weft-images-sample: out of memory\n");
        exit(1);
    }
    for (int pass = 0; pass < 6; pass++) {
        bool rows = pass % 2 == 0;
        int count = rows ? p->h : p->w, along = rows ? p->w : p->h;
        size_t step = rows ? 3 : (size_t)p->w * 3;
        for (int k = 0; k < count; k++)
            for (int c = 0; c < 3; c++) {
                uint8_t *at = p->rgb + (rows ? (size_t)k * p->w * 3 : (size_t)k * 3) + c;
                for (int i = 0; i < along; i++)
                    line[i] = at[(size_t)i * step];
                double sum = 0;
                for (int i = -radius - 1; i < radius; i++)
                    sum += line[i < 0 ? 0 : i >= along ? along - 1 : i];
                for (int i = 0; i < along; i++) {
                    int in = i + radius, out = i - radius - 1;
                    sum += line[in >= along ? along - 1 : in] - line[out < 0 ? 0 : out];
                    at[(size_t)i * step] = clamp8(sum / n);
                }
            }
    }
    free(line);
}

/* ---- files ------------------------------------------------------------------ */

typedef enum format { PNG, JPEG, BMP, GIF, PPM, PGM, FORMATS } format;

static const char *const extension[FORMATS] = {"png", "jpg", "bmp", "gif", "ppm", "pgm"};

static format pick_format(rng *r)
{
    static const format weighted[] = {PNG,  PNG, PNG, JPEG, JPEG, JPEG,
                                      JPEG, BMP, GIF, GIF,  PPM,  PGM};
    format f = weighted[next(r) % (sizeof weighted / sizeof *weighted)];
#ifndef WI_HAVE_GIF
    if (f == GIF)
        f = PNG;
#endif
    return f;
}

static int write_pnm(const char *path, const picture *p, bool gray)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fprintf(f, "P%c\n%d %d\n255\n", gray ? '5' : '6', p->w, p->h);
    for (size_t i = 0; i < (size_t)p->w * p->h; i++) {
        const uint8_t *px = p->rgb + 3 * i;
        if (gray)
            fputc((77 * px[0] + 150 * px[1] + 29 * px[2] + 128) >> 8, f);
        else
            fwrite(px, 1, 3, f);
    }
    return fclose(f) == 0;
}

#ifdef WI_HAVE_GIF
/* giflib's median cut to a 256-colour palette, then one frame. */
static int write_gif(const char *path, const picture *p)
{
    size_t n = (size_t)p->w * p->h;
    GifByteType *plane = malloc(4 * n), *r = plane, *g = plane + n, *b = plane + 2 * n,
                *index = plane + 3 * n;
    GifColorType colours[256];
    int ncolours = 256, err = 0, ok = 0;
    if (!plane)
        return 0;
    for (size_t i = 0; i < n; i++) {
        r[i] = p->rgb[3 * i];
        g[i] = p->rgb[3 * i + 1];
        b[i] = p->rgb[3 * i + 2];
    }
    GifFileType *gif = NULL;
    ColorMapObject *map = NULL;
    if (GifQuantizeBuffer((unsigned)p->w, (unsigned)p->h, &ncolours, r, g, b, index, colours) ==
            GIF_OK &&
        (map = GifMakeMapObject(256, colours)) != NULL &&
        (gif = EGifOpenFileName(path, false, &err)) != NULL &&
        EGifPutScreenDesc(gif, p->w, p->h, 8, 0, map) == GIF_OK &&
        EGifPutImageDesc(gif, 0, 0, p->w, p->h, false, NULL) == GIF_OK) {
        ok = 1;
        for (int y = 0; y < p->h && ok; y++)
            ok = EGifPutLine(gif, index + (size_t)y * p->w, p->w) == GIF_OK;
    }
    if (gif && EGifCloseFile(gif, &err) != GIF_OK)
        ok = 0;
    GifFreeMapObject(map);
    free(plane);
    return ok;
}
#endif

static int write_picture(const char *path, const picture *p, format f, int quality)
{
    switch (f) {
    case PNG:
        return stbi_write_png(path, p->w, p->h, 3, p->rgb, p->w * 3);
    case JPEG:
        return stbi_write_jpg(path, p->w, p->h, 3, p->rgb, quality);
    case BMP:
        return stbi_write_bmp(path, p->w, p->h, 3, p->rgb);
#ifdef WI_HAVE_GIF
    case GIF:
        return write_gif(path, p);
#else
    case GIF:
        return 0;
#endif
    case PPM:
        return write_pnm(path, p, false);
    case PGM:
        return write_pnm(path, p, true);
    default:
        return 0;
    }
}

/* ---- the plan ---------------------------------------------------------------- */

typedef enum kind {
    ORIGINAL,
    COPY,      /* a near-duplicate of the original */
    DECOY,     /* the scene blurred and grey: no original, no group */
    WALLPAPER, /* a smooth field of colour shaded by a faint DECOY */
} kind;

/* One output image. */
typedef struct item {
    long base;   /* the scene's number */
    kind kind;   /* what is made of it */
    unsigned id; /* the file's number: names are shuffled */
    char name[32];
} item;

typedef struct plan {
    const char *dir;
    uint64_t seed;
    item *items;
    size_t n;
    atomic_size_t next;
    atomic_int failed;
} plan;

/* The original of base b: its size and scene. */
static picture original(uint64_t seed, long b)
{
    rng r = stream(seed, (uint64_t)b, 1);
    int w = between(&r, 48, 400);
    int h = (int)(w * uniform(&r, 0.6, 1.5));
    h = h < 48 ? 48 : h > 400 ? 400 : h;
    scene s;
    scene_make(&s, &r);
    return scene_draw(&s, w, h);
}

/* The decoy of base b: its scene blurred away to a few soft patches of
 * light and dark, grey. */
static picture decoy(uint64_t seed, long b)
{
    picture p = original(seed, b);
    blur(&p, (p.w > p.h ? p.w : p.h) / 40);
    to_grey(&p);
    return p;
}

/* The wallpaper beside the decoy of base b: a colour whose luminance
 * follows the decoy's, scaled down to a few levels either side, at
 * another size. Every step keeps the signs of the low frequencies, which
 * are all the hash keeps. */
static picture wallpaper(uint64_t seed, long b, rng *r)
{
    picture grey = decoy(seed, b);
    size_t n = (size_t)grey.w * grey.h;
    double mean = 0, colour[3];
    for (size_t i = 0; i < n; i++)
        mean += grey.rgb[3 * i];
    mean /= (double)n;
    for (int c = 0; c < 3; c++)
        colour[c] = uniform(r, 60, 200);
    colour[between(r, 0, 2)] = uniform(r, 20, 60); /* a colour, not a grey */
    double faint = uniform(r, 0.15, 0.3);
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < 3; c++)
            grey.rgb[3 * i + c] = clamp8(colour[c] + faint * (grey.rgb[3 * i] - mean));
    double s = uniform(r, 0.7, 1.4);
    picture p = resize(&grey, (int)(grey.w * s) < 32 ? 32 : (int)(grey.w * s),
                       (int)(grey.h * s) < 32 ? 32 : (int)(grey.h * s));
    free(grey.rgb);
    return p;
}

/* A near-duplicate: at least one edit, each with some probability. */
static picture near_copy(picture base, rng *r, int *quality)
{
    picture p = base, q;
    bool edited = false;
    while (!edited) {
        if (next(r) % 2) { /* resize */
            double s = uniform(r, 0.5, 1.6);
            int w = (int)(p.w * s), h = (int)(p.h * s);
            q = resize(&p, w < 32 ? 32 : w, h < 32 ? 32 : h);
            free(p.rgb), p = q, edited = true;
        }
        if (next(r) % 3 == 0) { /* crop up to 4% per side */
            int l = (int)(p.w * uniform(r, 0, 0.04)), t = (int)(p.h * uniform(r, 0, 0.04));
            int rt = (int)(p.w * uniform(r, 0, 0.04)), b = (int)(p.h * uniform(r, 0, 0.04));
            q = crop(&p, l, t, rt, b);
            free(p.rgb), p = q, edited = true;
        }
        if (next(r) % 2) { /* brightness */
            brighten(&p, uniform(r, 0.8, 1.2), uniform(r, -25, 25));
            edited = true;
        }
        if (next(r) % 5 == 0) { /* grey */
            to_grey(&p);
            edited = true;
        }
        if (next(r) % 3 == 0) { /* re-encoded harder */
            *quality = between(r, 35, 70);
            edited = true;
        }
    }
    return p;
}

static void *render(void *arg)
{
    plan *pl = arg;
    size_t i;
    char path[4096];
    while ((i = atomic_fetch_add(&pl->next, 1)) < pl->n) {
        item *it = &pl->items[i];
        rng edit = stream(pl->seed, it->id, 2);
        int quality = between(&edit, 75, 95);
        picture p;
        format f;
        if (it->kind == WALLPAPER) {
            p = wallpaper(pl->seed, it->base, &edit);
            f = next(&edit) % 2 ? PNG : BMP; /* lossless: JPEG would block a faint shading */
        } else {
            p = it->kind == DECOY ? decoy(pl->seed, it->base) : original(pl->seed, it->base);
            if (it->kind == COPY)
                p = near_copy(p, &edit, &quality);
            f = pick_format(&edit);
        }
        snprintf(it->name + strlen(it->name), sizeof it->name - strlen(it->name), ".%s",
                 extension[f]);
        snprintf(path, sizeof path, "%s/%s", pl->dir, it->name);
        if (!write_picture(path, &p, f, quality)) {
            fprintf(stderr, "weft-images-sample: cannot write %s\n", path);
            atomic_store(&pl->failed, 1);
        }
        free(p.rgb);
    }
    return NULL;
}

/* ---- broken files ---------------------------------------------------------- */

static int write_bytes(const char *dir, const char *name, const void *data, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t put = n ? fwrite(data, 1, n, f) : 0;
    return fclose(f) == 0 && put == n ? 0 : -1;
}

/* Encode a small picture as f into memory (through a scratch file). */
static uint8_t *encoded(const char *dir, const picture *p, format f, size_t *n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/.scratch.%s", dir, extension[f]);
    uint8_t *buf = NULL;
    FILE *in;
    if (write_picture(path, p, f, 85) && (in = fopen(path, "rb")) != NULL) {
        fseek(in, 0, SEEK_END);
        long len = ftell(in);
        rewind(in);
        if (len > 0 && (buf = malloc((size_t)len)) != NULL &&
            fread(buf, 1, (size_t)len, in) != (size_t)len) {
            free(buf);
            buf = NULL;
        }
        *n = len > 0 ? (size_t)len : 0;
        fclose(in);
    }
    remove(path);
    return buf;
}

static int write_broken(const char *dir, uint64_t seed, unsigned count)
{
    static const struct {
        const char *name;
        format f;
        int keep_percent; /* of an encoded picture; 0: not a picture */
    } kinds[] = {
        {"empty.png", PNG, -1},     {"truncated.png", PNG, 50}, {"truncated.jpg", JPEG, 60},
        {"noise.jpg", JPEG, 0},     {"notes.txt", PNG, 0},      {"truncated.bmp", BMP, 70},
        {"truncated.gif", GIF, 50}, {"truncated.ppm", PPM, 60},
    };
    rng r = stream(seed, 0, 3);
    scene s;
    scene_make(&s, &r);
    picture p = scene_draw(&s, 96, 80);
    int rc = 0;
    for (unsigned i = 0; i < count && rc == 0; i++) {
        unsigned k = i % (sizeof kinds / sizeof *kinds);
        char name[64];
        snprintf(name, sizeof name, "broken-%02u-%s", i + 1, kinds[k].name);
        uint8_t noise[4096];
        if (kinds[k].keep_percent < 0) {
            rc = write_bytes(dir, name, "", 0);
        } else if (kinds[k].keep_percent == 0 && kinds[k].f == PNG) {
            static const char text[] = "This is not an image.\n";
            rc = write_bytes(dir, name, text, sizeof text - 1);
        } else if (kinds[k].keep_percent == 0) {
            for (size_t j = 0; j < sizeof noise; j++)
                noise[j] = (uint8_t)next(&r);
            rc = write_bytes(dir, name, noise, sizeof noise);
        } else {
#ifndef WI_HAVE_GIF
            if (kinds[k].f == GIF)
                continue;
#endif
            size_t n = 0;
            uint8_t *data = encoded(dir, &p, kinds[k].f, &n);
            rc = data ? write_bytes(dir, name, data, n * (size_t)kinds[k].keep_percent / 100) : -1;
            free(data);
        }
    }
    free(p.rgb);
    return rc;
}

/* ---- main ------------------------------------------------------------------- */

static int make_dirs(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static void usage(FILE *f)
{
    fputs("usage: weft-images-sample -t TRUTH [-n COUNT] [-s SEED] [--broken N] [-j THREADS] DIR\n"
          "Write COUNT images (default 3000) with planted near-duplicates into DIR, the\n"
          "true groups into TRUTH (tab-separated names, a group a line), and N broken files\n"
          "(default 5).\n",
          f);
}

static int number(const char *s, unsigned long max, unsigned long *out)
{
    char *end;
    errno = 0;
    *out = strtoul(s, &end, 10);
    return errno || end == s || *end || s[0] == '-' || *out > max ? -1 : 0;
}

int main(int argc, char **argv)
{
    static const struct option longs[] = {
        {"broken", required_argument, NULL, 'b'}, {"help", no_argument, NULL, 'h'}, {0}};
    unsigned long count = 3000, seed = 1, broken = 5, threads = 0, v;
    const char *truth = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "n:s:t:j:h", longs, NULL)) != -1) {
        unsigned long *dst = c == 'n'   ? &count
                             : c == 's' ? &seed
                             : c == 'b' ? &broken
                             : c == 'j' ? &threads
                                        : NULL;
        if (c == 't') {
            truth = optarg;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else if (!dst || number(optarg, 10000000, &v)) {
            usage(stderr);
            return 2;
        } else {
            *dst = v;
        }
    }
    if (optind != argc - 1 || !truth) {
        usage(stderr);
        return 2;
    }
    plan pl = {.dir = argv[optind], .seed = seed, .n = count};
    if (make_dirs(pl.dir)) {
        fprintf(stderr, "weft-images-sample: %s: %s\n", pl.dir, strerror(errno));
        return 1;
    }
    stbi_write_png_compression_level = 6; /* quicker; the files are still real PNGs */

    /* Originals, each followed by its copies: about a third get 1 to 3;
     * one scene in forty gives a decoy pair instead. */
    pl.items = calloc(count ? count : 1, sizeof *pl.items);
    unsigned *ids = calloc(count ? count : 1, sizeof *ids);
    if (!pl.items || !ids)
        return 1;
    rng r = stream(seed, 0, 0);
    long base = 0;
    size_t decoys = 0;
    for (size_t i = 0; i < count; base++) {
        if (next(&r) % 40 == 0 && i + 2 <= count) {
            pl.items[i++] = (item){.base = base, .kind = DECOY};
            pl.items[i++] = (item){.base = base, .kind = WALLPAPER};
            decoys++;
            continue;
        }
        pl.items[i++] = (item){.base = base};
        int copies = next(&r) % 3 == 0 ? between(&r, 1, 3) : 0;
        for (int k = 0; k < copies && i < count; k++)
            pl.items[i++] = (item){.base = base, .kind = COPY};
    }
    for (size_t i = 0; i < count; i++)
        ids[i] = (unsigned)i + 1;
    for (size_t i = count; i > 1; i--) { /* shuffle the names */
        size_t j = next(&r) % i;
        unsigned t = ids[i - 1];
        ids[i - 1] = ids[j];
        ids[j] = t;
    }
    for (size_t i = 0; i < count; i++) {
        pl.items[i].id = ids[i];
        snprintf(pl.items[i].name, sizeof pl.items[i].name, "img-%05u", ids[i]);
    }

    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned long)n : 1;
    }
    pthread_t *tids = calloc(threads, sizeof *tids);
    unsigned long started = 0;
    for (; tids && started < threads; started++)
        if (pthread_create(&tids[started], NULL, render, &pl) != 0)
            break;
    if (started == 0)
        render(&pl);
    for (unsigned long t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    free(tids);
    if (atomic_load(&pl.failed) || write_broken(pl.dir, seed, (unsigned)broken)) {
        fprintf(stderr, "weft-images-sample: writing into %s failed\n", pl.dir);
        return 1;
    }

    /* The truth last: its presence says the set is complete. */
    FILE *f = fopen(truth, "w");
    if (!f) {
        fprintf(stderr, "weft-images-sample: %s: %s\n", truth, strerror(errno));
        return 1;
    }
    size_t groups = 0;
    for (size_t i = 0; i < count;) {
        size_t j = i + 1;
        while (j < count && pl.items[j].base == pl.items[i].base)
            j++;
        if (j - i > 1 && pl.items[i].kind == ORIGINAL) {
            for (size_t k = i; k < j; k++)
                fprintf(f, "%s%c", pl.items[k].name, k + 1 < j ? '\t' : '\n');
            groups++;
        }
        i = j;
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "weft-images-sample: %s: write failed\n", truth);
        return 1;
    }
    fprintf(stderr,
            "weft-images-sample: %zu images (%zu groups of near-duplicates, %zu decoy pairs) and "
            "%lu broken files in %s\n",
            (size_t)count, groups, decoys, broken, pl.dir);
    free(pl.items);
    free(ids);
    return 0;
}
