/*
 * images.h - the host side of weft-images that needs no runtime: finding
 * files, reading and decoding them, the JSON line, grouping hashes and
 * scoring groups against a ground truth. Shared by weft-images and its
 * thread-pool peer, so both do exactly the same host work.
 */
#ifndef WEFT_IMAGES_IMAGES_H
#define WEFT_IMAGES_IMAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "stages.h"

/* ---- finding files (scan.c) --------------------------------------------- */

typedef struct wi_file {
    char *path;        /* as given, joined with the path below the root */
    const char *rel;   /* points into path: below the root folder */
    uint64_t dev, ino; /* what it names (0, 0: could not be told) */
} wi_file;

typedef struct wi_files {
    wi_file *v;
    size_t n, cap;
    size_t skipped;    /* not regular files, unreadable folders, paths too long */
    size_t duplicates; /* second names of a file already in the list */
} wi_files;

/* Add every regular file under root (recursively; names starting with a
 * dot are skipped, symbolic links to folders not followed), or root itself
 * if it is a file. What is not a regular file, a sub-folder that cannot be
 * read and a path longer than PATH_MAX are reported on stderr, counted in
 * skipped, and the walk goes on; at most one folder is open at a time.
 * Returns 0, or -1 with a message in why (root missing or unreadable, out
 * of memory). Call wi_files_sort once all roots are in. */
int wi_files_add(wi_files *fs, const char *root, char *why, size_t why_len);
/* Sort by path and keep one name of each file (device and inode), the
 * first in path order; each other name is reported and counted in
 * duplicates. */
void wi_files_sort(wi_files *fs);
void wi_files_free(wi_files *fs);

/* ---- decoding (decode.c) ------------------------------------------------ */

typedef struct wi_image {
    uint8_t *rgb; /* width * height * 3, from stb_image (wi_image_free) */
    uint32_t width, height;
    uint64_t file_bytes;
} wi_image;

enum {
    WI_MAX_PIXELS = 1 << 28,         /* the most --max-pixels allows */
    WI_DEFAULT_MAX_PIXELS = 1 << 26, /* 64 Mpixels: about 1 GiB while decoding */
    WI_DECODE_BYTES_PER_PIXEL = 16,  /* stb_image's peak: a 16-bit RGBA PNG, two copies */
};

/* A file opened and its header read, not yet decoded. */
typedef struct wi_probe {
    int fd;
    uint64_t file_bytes;
    uint32_t width, height;
    uint64_t need; /* memory its decoding may take at its peak: file and pixels */
} wi_probe;

/* Open path without blocking, check that it is a regular file of a size
 * stb_image reads, and read its declared size from the header alone
 * (nothing is decoded). Images of more than max_pixels are refused.
 * Returns 0, or -1 with a one-line reason in why ("empty file", "a FIFO,
 * not a regular file: skipped", "not an image (stb_image: unknown image
 * type)", a system error). */
int wi_image_probe(const char *path, uint64_t max_pixels, wi_probe *pr, char *why, size_t why_len);
/* Read and decode a probed file into RGB, closing it. Returns 0, or -1
 * with a reason ("truncated GIF: no trailer", "out of memory decoding ..."). */
int wi_image_decode(wi_probe *pr, wi_image *img, char *why, size_t why_len);
void wi_probe_close(wi_probe *pr);
/* Both, with the default pixel limit. */
int wi_image_load(const char *path, wi_image *img, char *why, size_t why_len);
void wi_image_free(wi_image *img);

/* ---- output ------------------------------------------------------------- */

/* The JSON line of one image (with its newline) into buf; returns its
 * length, or the length it would need (as snprintf). */
size_t wi_json_line(char *buf, size_t len, const char *path, uint32_t w, uint32_t h,
                    uint64_t file_bytes, const wi_result *r);
/* s as a JSON string, quotes included, into buf; returns as wi_json_line. */
size_t wi_json_string(char *buf, size_t len, const char *s);
/* Write the JSON line of one image (wi_json_write) or s as a JSON string
 * (wi_json_put_string) to f with one fputs, so that lines from several
 * threads do not interleave. Return 0, or -1 when out of memory for a very
 * long path or when f failed. */
/* s for a message on stderr, into buf: control characters and bytes that
 * are not UTF-8 as \xNN, a backslash doubled; cut with "..." when longer
 * than buf. Returns buf. */
const char *wi_shown(const char *s, char *buf, size_t len);
int wi_json_write(FILE *f, const char *path, const wi_image *img, const wi_result *r);
int wi_json_put_string(FILE *f, const char *s);

/* ---- grouping (groups.c) ------------------------------------------------ */

/* What grouping looks at, per image: from wi_result. */
typedef struct wi_features {
    uint64_t hash, detail;
} wi_features;

/* The second signal. The hash keeps only the signs of the low
 * frequencies, so a faint pattern (a smooth wallpaper) and a strong one
 * (a picture) with the same signs collide; their detail (the summed
 * magnitude of the same frequencies) differs by the ratio of their
 * contrasts. Two images are confirmed when the larger detail is at most
 * WI_DETAIL_RATIO times the smaller, a detail under WI_DETAIL_FLOOR
 * (one luminance level: as flat as the hash can see) counting as the
 * floor. Grey-scale conversion keeps the luminance, hence the detail. The
 * ratio sits between what a contrast change does to a copy (under 2x) and
 * what a faint shading is to the picture it follows (5x and more). */
enum { WI_DETAIL_RATIO = 3 };
#define WI_DETAIL_FLOOR ((uint64_t)1 << 42)
bool wi_confirmed(uint64_t detail_a, uint64_t detail_b);

/* Called for each pair within the threshold that the confirmation refused
 * (a < b, indices into the features). */
typedef void wi_refused_fn(void *arg, size_t a, size_t b);

/* Near-duplicate groups: images whose hashes are within threshold bits of
 * each other, and with confirm whose details also agree (wi_confirmed),
 * are linked, and groups are the connected sets of two or more. group[i]
 * receives image i's group number (0-based, in order of each group's first
 * image) or -1; returns the number of groups. refused (may be NULL) hears
 * of each pair the confirmation refused. */
size_t wi_group(const wi_features *f, size_t n, unsigned threshold, bool confirm, long *group,
                wi_refused_fn *refused, void *arg);

/* Pairwise agreement with a ground truth: a pair of images is "predicted"
 * when they share a group and "true" when they share a truth group.
 * precision = |predicted and true| / |predicted|, recall = ... / |true|
 * (1 when the denominator is 0). */
typedef struct wi_score {
    uint64_t predicted, truth, both;
    double precision, recall;
} wi_score;

/* A truth file, read whole: one line per true group, its member paths
 * relative to the folder, separated by tabs; '#' starts a comment line. */
typedef struct wi_truth {
    char *text; /* the lines, each NUL-terminated in place */
    size_t len;
} wi_truth;

enum { WI_TRUTH_MAX_BYTES = 1 << 28 };

/* Read path (a regular file of at most WI_TRUTH_MAX_BYTES, text without
 * NUL bytes) before the run starts. Returns 0, or -1 with a message. */
int wi_truth_load(const char *path, wi_truth *t, char *why, size_t why_len);
void wi_truth_free(wi_truth *t);

/* rel[i] names image i (NULL: not an image); group[i] as from wi_group.
 * Returns 0, or -1 with a message in why (out of memory). */
int wi_score_truth(const wi_truth *t, const char *const *rel, const long *group, size_t n,
                   wi_score *out, char *why, size_t why_len);

#endif
