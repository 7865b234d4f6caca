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
    char *path;      /* as given, joined with the path below the root */
    const char *rel; /* points into path: below the root folder */
} wi_file;

typedef struct wi_files {
    wi_file *v;
    size_t n, cap;
} wi_files;

/* Add every regular file under root (recursively; names starting with a
 * dot are skipped, symbolic links to folders not followed), or root itself
 * if it is a file. Returns 0, or -1 with a message in why (root missing or
 * unreadable). Call wi_files_sort once all roots are in. */
int wi_files_add(wi_files *fs, const char *root, char *why, size_t why_len);
void wi_files_sort(wi_files *fs);
void wi_files_free(wi_files *fs);

/* ---- decoding (decode.c) ------------------------------------------------ */

typedef struct wi_image {
    uint8_t *rgb; /* width * height * 3, from stb_image (wi_image_free) */
    uint32_t width, height;
    uint64_t file_bytes;
} wi_image;

/* Read and decode path into RGB. Returns 0, or -1 with a one-line reason
 * in why ("empty file", "truncated GIF: no trailer", "not an image
 * (stb_image: unknown image type)", a system error). */
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
int wi_json_write(FILE *f, const char *path, const wi_image *img, const wi_result *r);
int wi_json_put_string(FILE *f, const char *s);

/* ---- grouping (groups.c) ------------------------------------------------ */

/* Near-duplicate groups: images whose hashes are within threshold bits of
 * each other are linked, and groups are the connected sets of two or more.
 * group[i] receives image i's group number (0-based, in order of each
 * group's first image) or -1; returns the number of groups. */
size_t wi_group(const uint64_t *hash, size_t n, unsigned threshold, long *group);

/* Pairwise agreement with a ground truth: a pair of images is "predicted"
 * when they share a group and "true" when they share a truth group.
 * precision = |predicted and true| / |predicted|, recall = ... / |true|
 * (1 when the denominator is 0). */
typedef struct wi_score {
    uint64_t predicted, truth, both;
    double precision, recall;
} wi_score;

/* truth_path: one line per true group, its member paths relative to the
 * folder, separated by tabs. rel[i] names image i (NULL: not an image);
 * group[i] as from wi_group. Returns 0, or -1 with a message in why. */
int wi_score_truth(const char *truth_path, const char *const *rel, const long *group, size_t n,
                   wi_score *out, char *why, size_t why_len);

#endif
