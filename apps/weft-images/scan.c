/*
 * scan.c - the files weft-images looks at.
 *
 * Every regular file below each root counts, whatever its name: a file
 * that is not an image is reported as such, not silently skipped. Hidden
 * names (a leading dot) are skipped, and symbolic links to folders are not
 * followed, so a link cannot make the walk loop.
 *
 * What cannot be looked at - a FIFO, socket or device, a sub-folder that
 * cannot be read, a path longer than PATH_MAX - is reported, counted in
 * skipped, and the walk goes on. The walk keeps a stack of folder paths
 * and reads one folder whole before the next, so it holds one descriptor
 * however deep the tree. Each file keeps its device and inode, so that a
 * file reached by two names is looked at once, and the output can be told
 * apart from every input.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "images.h"

static void skip(wi_files *fs, const char *path, const char *fmt, const char *detail)
{
    char shown[1024];
    fprintf(stderr, "weft-images: %s: ", wi_shown(path, shown, sizeof shown));
    fprintf(stderr, fmt, detail);
    fputs(", skipped\n", stderr);
    fs->skipped++;
}

static int push(wi_files *fs, const char *path, size_t root_len, const struct stat *st)
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
    fs->v[fs->n++] =
        (wi_file){copy, rel, st ? (uint64_t)st->st_dev : 0, st ? (uint64_t)st->st_ino : 0};
    return 0;
}

static const char *kind_of(mode_t m)
{
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "an unknown kind of file";
}

/* One entry of a folder (open as d) named path: a file is pushed, a
 * folder pushed on the stack of folders to read. */
static int entry(wi_files *fs, DIR *d, const char *name, char *path, size_t root_len, char ***stack,
                 size_t *depth, size_t *cap)
{
    struct stat lst, st;
    if (fstatat(dirfd(d), name, &lst, AT_SYMLINK_NOFOLLOW) != 0) {
        skip(fs, path, "cannot stat: %s", strerror(errno));
        return 0;
    }
    if (S_ISDIR(lst.st_mode)) {
        if (*depth == *cap) {
            size_t c = *cap ? 2 * *cap : 64;
            char **s = realloc(*stack, c * sizeof *s);
            if (!s)
                return -1;
            *stack = s;
            *cap = c;
        }
        char *copy = strdup(path);
        if (!copy)
            return -1;
        (*stack)[(*depth)++] = copy;
        return 0;
    }
    if (S_ISLNK(lst.st_mode) && fstatat(dirfd(d), name, &st, 0) != 0)
        return push(fs, path, root_len, NULL); /* a dangling link: reported when opened */
    if (!S_ISLNK(lst.st_mode))
        st = lst;
    if (S_ISDIR(st.st_mode))
        return 0; /* a link to a folder: not followed */
    if (!S_ISREG(st.st_mode)) {
        skip(fs, path, "%s, not a regular file", kind_of(st.st_mode));
        return 0;
    }
    return push(fs, path, root_len, &st);
}

/* Read the folder dir; its sub-folders go on the stack. */
static int walk_one(wi_files *fs, const char *dir, size_t root_len, char ***stack, size_t *depth,
                    size_t *cap)
{
    DIR *d = opendir(dir);
    if (!d) {
        skip(fs, dir, "cannot open folder: %s", strerror(errno));
        return 0;
    }
    size_t len = strlen(dir);
    bool slash = len > 0 && dir[len - 1] == '/';
    char *path = malloc(PATH_MAX);
    int rc = path ? 0 : -1;
    struct dirent *e;
    while (rc == 0) {
        errno = 0;
        if ((e = readdir(d)) == NULL) {
            if (errno)
                skip(fs, dir, "cannot read the rest of the folder: %s", strerror(errno));
            break;
        }
        if (e->d_name[0] == '.')
            continue;
        size_t name_len = strlen(e->d_name);
        if (len + !slash + name_len + 1 > PATH_MAX) {
            char *full; /* only to say which */
            if (asprintf(&full, "%s/%s", dir, e->d_name) < 0)
                rc = -1;
            else
                skip(fs, full, "path longer than PATH_MAX%s", "");
            free(full);
            continue;
        }
        memcpy(path, dir, len);
        if (!slash)
            path[len] = '/';
        memcpy(path + len + !slash, e->d_name, name_len + 1);
        rc = entry(fs, d, e->d_name, path, root_len, stack, depth, cap);
    }
    free(path);
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
        if (!S_ISREG(st.st_mode)) {
            skip(fs, root, "%s, not a regular file", kind_of(st.st_mode));
            return 0;
        }
        if (push(fs, root, 0, &st)) {
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
    DIR *d = opendir(root); /* a root that cannot be read is a command-line error */
    if (!d) {
        snprintf(why, why_len, "%s: cannot open folder: %s", root, strerror(errno));
        return -1;
    }
    closedir(d);
    char **stack = malloc(sizeof *stack);
    size_t depth = 0, cap = 1;
    int rc = stack && (stack[0] = strdup(root)) ? 0 : -1;
    depth = rc == 0;
    while (rc == 0 && depth > 0) {
        char *dir = stack[--depth];
        rc = walk_one(fs, dir, len, &stack, &depth, &cap);
        free(dir);
    }
    while (depth > 0)
        free(stack[--depth]);
    free(stack);
    if (rc)
        snprintf(why, why_len, "out of memory");
    return rc;
}

static int by_path(const void *a, const void *b)
{
    return strcmp(((const wi_file *)a)->path, ((const wi_file *)b)->path);
}

/* By device and inode, then by position (the path order). */
static int by_node(const void *a, const void *b, void *files)
{
    const wi_file *v = files, *x = &v[*(const size_t *)a], *y = &v[*(const size_t *)b];
    if (x->dev != y->dev)
        return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino)
        return x->ino < y->ino ? -1 : 1;
    return x < y ? -1 : x > y;
}

void wi_files_sort(wi_files *fs)
{
    if (fs->n > 1)
        qsort(fs->v, fs->n, sizeof *fs->v, by_path);
    size_t *order = malloc((fs->n ? fs->n : 1) * sizeof *order);
    if (!order)
        return; /* duplicates stay: looked at twice, nothing worse */
    for (size_t i = 0; i < fs->n; i++)
        order[i] = i;
    qsort_r(order, fs->n, sizeof *order, by_node, fs->v);
    char a[1024], b[1024];
    for (size_t k = 1; k < fs->n; k++) {
        wi_file *first = &fs->v[order[k - 1]], *f = &fs->v[order[k]];
        if (f->dev == first->dev && f->ino == first->ino && (f->dev || f->ino)) {
            fprintf(stderr, "weft-images: %s: the same file as %s, looked at once\n",
                    wi_shown(f->path, a, sizeof a), wi_shown(first->path, b, sizeof b));
            f->rel = NULL;           /* dropped below */
            order[k] = order[k - 1]; /* the next compares with the one kept */
            fs->duplicates++;
        }
    }
    free(order);
    size_t kept = 0;
    for (size_t i = 0; i < fs->n; i++)
        if (fs->v[i].rel)
            fs->v[kept++] = fs->v[i];
        else
            free(fs->v[i].path);
    fs->n = kept;
}

void wi_files_free(wi_files *fs)
{
    for (size_t i = 0; i < fs->n; i++)
        free(fs->v[i].path);
    free(fs->v);
    *fs = (wi_files){0};
}
