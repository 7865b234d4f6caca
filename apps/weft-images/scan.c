/*
 * scan.c - the files weft-images looks at.
 *
 * Every regular file below each root counts, whatever its name: a file
 * that is not an image is reported as such, not silently skipped. Hidden
 * names (a leading dot) are skipped, and symbolic links to folders are not
 * followed, so a link cannot make the walk loop.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "images.h"

static int push(wi_files *fs, const char *path, size_t root_len)
{
    if (fs->n == fs->cap) {
        size_t cap = fs->cap ? 2 * fs->cap : 256;
        wi_file *v = realloc(fs->v, cap * sizeof *v);
        if (!v)
            return -1;
        fs->v = v;
        fs->cap = cap;
    }
    char *copy = strdup(path);
    if (!copy)
        return -1;
    const char *rel = copy + root_len;
    while (*rel == '/')
        rel++;
    fs->v[fs->n++] = (wi_file){copy, rel};
    return 0;
}

/* Walk dir (a path of len bytes in buf, which has room for PATH_MAX). */
static int walk(wi_files *fs, char *buf, size_t len, size_t root_len, char *why, size_t why_len)
{
    DIR *d = opendir(buf);
    if (!d) {
        snprintf(why, why_len, "%s: cannot open folder: %s", buf, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        size_t name_len = strlen(e->d_name);
        bool slash = len > 0 && buf[len - 1] == '/';
        if (len + !slash + name_len + 1 > PATH_MAX) {
            fprintf(stderr, "weft-images: %s/%s: path too long, skipped\n", buf, e->d_name);
            continue;
        }
        size_t at = len + !slash;
        if (!slash)
            buf[len] = '/';
        memcpy(buf + at, e->d_name, name_len + 1);
        struct stat st, lst;
        if (lstat(buf, &lst) == 0 && S_ISDIR(lst.st_mode))
            rc = walk(fs, buf, at + name_len, root_len, why, why_len);
        else if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
            ;                             /* a link to a folder */
        else if (push(fs, buf, root_len)) /* files, and what cannot be read: reported later */
            rc = -1, snprintf(why, why_len, "out of memory");
        buf[len] = '\0';
    }
    closedir(d);
    return rc;
}

int wi_files_add(wi_files *fs, const char *root, char *why, size_t why_len)
{
    struct stat st;
    if (stat(root, &st) != 0) {
        snprintf(why, why_len, "%s: %s", root, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (push(fs, root, 0)) {
            snprintf(why, why_len, "out of memory");
            return -1;
        }
        return 0;
    }
    size_t len = strlen(root);
    if (len >= PATH_MAX) {
        snprintf(why, why_len, "%s: path too long", root);
        return -1;
    }
    char *buf = malloc(PATH_MAX);
    if (!buf) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    memcpy(buf, root, len + 1);
    int rc = walk(fs, buf, len, len, why, why_len);
    free(buf);
    return rc;
}

static int by_path(const void *a, const void *b)
{
    return strcmp(((const wi_file *)a)->path, ((const wi_file *)b)->path);
}

void wi_files_sort(wi_files *fs)
{
    if (fs->n > 1)
        qsort(fs->v, fs->n, sizeof *fs->v, by_path);
}

void wi_files_free(wi_files *fs)
{
    for (size_t i = 0; i < fs->n; i++)
        free(fs->v[i].path);
    free(fs->v);
    *fs = (wi_files){0};
}
