/*
 * groups.c - near-duplicate groups, and how well they match a truth.
 *
 * Every pair of hashes is compared (a popcount each: 50 million pairs take
 * about a tenth of a second for 10 000 images); a pair within the
 * threshold is a candidate, confirmed (unless the caller asks for the hash
 * alone) when the two details agree, and confirmed pairs are joined in a
 * union-find; groups are its sets of two or more. Linking is transitive,
 * as a user deduplicating a folder expects: a resized copy of a cropped
 * copy lands in the original's group.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "images.h"

static size_t find(size_t *parent, size_t i)
{
    while (parent[i] != i) {
        parent[i] = parent[parent[i]]; /* path halving */
        i = parent[i];
    }
    return i;
}

static void join(size_t *parent, size_t a, size_t b)
{
    a = find(parent, a);
    b = find(parent, b);
    if (a != b) /* the lower index is the root: group numbers follow input order */
        parent[a > b ? a : b] = a < b ? a : b;
}

bool wi_confirmed(uint64_t detail_a, uint64_t detail_b)
{
    uint64_t lo = detail_a < detail_b ? detail_a : detail_b;
    uint64_t hi = detail_a < detail_b ? detail_b : detail_a;
    return hi <= WI_DETAIL_RATIO *
                     (lo > WI_DETAIL_FLOOR ? lo : WI_DETAIL_FLOOR); /* < 2^58: no overflow */
}

size_t wi_group(const wi_features *f, size_t n, unsigned threshold, bool confirm, long *group,
                wi_refused_fn *refused, void *arg)
{
    size_t *parent = malloc((n ? n : 1) * sizeof *parent);
    size_t *size = calloc(n ? n : 1, sizeof *size);
    if (!parent || !size) {
        free(parent);
        free(size);
        for (size_t i = 0; i < n; i++)
            group[i] = -1;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        parent[i] = i;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            if ((unsigned)__builtin_popcountll(f[i].hash ^ f[j].hash) > threshold)
                continue;
            if (!confirm || wi_confirmed(f[i].detail, f[j].detail))
                join(parent, i, j);
            else if (refused)
                refused(arg, i, j);
        }
    for (size_t i = 0; i < n; i++)
        size[find(parent, i)]++;
    size_t groups = 0;
    for (size_t i = 0; i < n; i++) {
        size_t root = find(parent, i);
        if (size[root] < 2)
            group[i] = -1;
        else if (root == i)
            group[i] = (long)groups++;
        else
            group[i] = group[root]; /* root < i: numbered already */
    }
    free(parent);
    free(size);
    return groups;
}

/* ---- scoring -------------------------------------------------------------- */

typedef struct named {
    const char *rel;
    size_t index;
} named;

static int by_rel(const void *a, const void *b)
{
    return strcmp(((const named *)a)->rel, ((const named *)b)->rel);
}

typedef struct pair_count {
    long group, truth;
} pair_count;

static int by_group_then_truth(const void *a, const void *b)
{
    const pair_count *x = a, *y = b;
    if (x->group != y->group)
        return x->group < y->group ? -1 : 1;
    return x->truth < y->truth ? -1 : x->truth > y->truth;
}

static uint64_t pairs(uint64_t k)
{
    return k * (k - 1) / 2;
}

int wi_truth_load(const char *path, wi_truth *t, char *why, size_t why_len)
{
    *t = (wi_truth){0};
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC); /* a FIFO must not hang */
    if (fd < 0) {
        snprintf(why, why_len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "%s: %s, not a regular file", path,
                 S_ISDIR(st.st_mode) ? "a folder" : "a device, FIFO or socket");
    } else if ((uint64_t)st.st_size > WI_TRUTH_MAX_BYTES) {
        snprintf(why, why_len, "%s: %llu bytes, more than a truth file takes (%d)", path,
                 (unsigned long long)st.st_size, WI_TRUTH_MAX_BYTES);
    } else if (!(t->text = malloc((size_t)st.st_size + 1))) {
        snprintf(why, why_len, "%s: out of memory", path);
    } else {
        size_t n = (size_t)st.st_size, got = 0;
        ssize_t r = 1;
        while (got < n && (r = read(fd, t->text + got, n - got)) != 0)
            if (r > 0)
                got += (size_t)r;
            else if (errno != EINTR && errno != EAGAIN)
                break;
        t->len = got;
        t->text[got] = '\0';
        const char *nul = memchr(t->text, '\0', got);
        if (got < n && r < 0)
            snprintf(why, why_len, "%s: cannot read: %s", path, strerror(errno));
        else if (nul)
            snprintf(why, why_len, "%s: not text (a NUL byte at offset %zu)", path,
                     (size_t)(nul - t->text));
        else
            rc = 0;
    }
    close(fd);
    if (rc)
        wi_truth_free(t);
    return rc;
}

void wi_truth_free(wi_truth *t)
{
    free(t->text);
    *t = (wi_truth){0};
}

int wi_score_truth(const wi_truth *t, const char *const *rel, const long *group, size_t n,
                   wi_score *out, char *why, size_t why_len)
{
    named *names = malloc((n ? n : 1) * sizeof *names);
    long *truth = malloc((n ? n : 1) * sizeof *truth);
    pair_count *pc = malloc((n ? n : 1) * sizeof *pc);
    char *text = malloc(t->len + 1); /* strtok_r cuts it */
    int rc = -1;
    if (!names || !truth || !pc || !text) {
        snprintf(why, why_len, "out of memory");
        goto out;
    }
    memcpy(text, t->text, t->len + 1);
    for (size_t i = 0; i < n; i++) {
        names[i] = (named){rel[i], i};
        truth[i] = -1;
    }
    qsort(names, n, sizeof *names, by_rel);

    /* Truth groups: count their pairs, and label the images we have. */
    *out = (wi_score){0};
    long id = 0;
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        line[strcspn(line, "\r")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        uint64_t members = 0;
        for (char *save, *tok = strtok_r(line, "\t", &save); tok;
             tok = strtok_r(NULL, "\t", &save)) {
            members++;
            named key = {tok, 0}, *hit = bsearch(&key, names, n, sizeof *names, by_rel);
            if (hit)
                truth[hit->index] = id;
        }
        out->truth += members > 1 ? pairs(members) : 0;
        id++;
    }

    /* Predicted pairs, and those that are also true: count each group's
     * members per truth label. */
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (group[i] >= 0)
            pc[m++] = (pair_count){group[i], truth[i]};
    qsort(pc, m, sizeof *pc, by_group_then_truth);
    for (size_t i = 0; i < m;) {
        size_t j = i;
        while (j < m && pc[j].group == pc[i].group)
            j++;
        out->predicted += pairs(j - i);
        for (size_t k = i; k < j;) {
            size_t l = k;
            while (l < j && pc[l].truth == pc[k].truth)
                l++;
            if (pc[k].truth >= 0)
                out->both += pairs(l - k);
            k = l;
        }
        i = j;
    }
    out->precision = out->predicted ? (double)out->both / (double)out->predicted : 1.0;
    out->recall = out->truth ? (double)out->both / (double)out->truth : 1.0;
    rc = 0;
out:
    free(text);
    free(names);
    free(truth);
    free(pc);
    return rc;
}
