/*
 * safetensors.c - reading and writing safetensors files.
 *
 * The format: 8 bytes of little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {"key": "value"}}, then the data, the offsets counting
 * from the data's first byte. The file is mapped read-only and everything
 * the header claims is checked against the mapping before a tensor is
 * handed out: a tensor's bytes lie inside the data, equal its shape times
 * its element size, are aligned to its element, and overlap no other
 * tensor's. So a truncated or hostile file is an error line, never a read
 * past the mapping.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "llm.h"

/* Real headers are tens of kilobytes; a few hundred megabytes is a
 * corrupted length, refused before the JSON parser sees it. */
#define MAX_HEADER (100u << 20)

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const wl_tensor *)a)->name, ((const wl_tensor *)b)->name);
}

static int cmp_tensor_data(const void *a, const void *b)
{
    const wl_tensor *x = *(const wl_tensor *const *)a, *y = *(const wl_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

static int parse_dtype(const char *path, const char *name, const char *s, weft_dtype *dt)
{
    static const char *const others[] = {"F64", "F8_E5M2", "I64", "I32", "I16", "I8",
                                         "U64", "U32",     "U16", "U8",  "BOOL"};
    if (!strcmp(s, "BF16"))
        *dt = WEFT_DTYPE_BF16;
    else if (!strcmp(s, "F16"))
        *dt = WEFT_DTYPE_F16;
    else if (!strcmp(s, "F32"))
        *dt = WEFT_DTYPE_F32;
    else if (!strcmp(s, "F8_E4M3")) /* FP8 projections (model.c checks where) */
        *dt = WEFT_DTYPE_F8_E4M3;
    else {
        for (size_t i = 0; i < sizeof others / sizeof *others; i++)
            if (!strcmp(s, others[i]))
                return wl_fail("%s: tensor %s has dtype %s; weft-llm reads BF16, F16, F32 and "
                               "F8_E4M3",
                               path, name, s);
        return wl_fail("%s: tensor %s has an unknown dtype \"%s\"", path, name, s);
    }
    return 0;
}

/* One header entry into t, checked against the data's size. */
static int parse_entry(const char *path, const char *name, json_t *v, const char *data,
                       size_t data_size, wl_tensor *t)
{
    json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(dtype) || !json_is_array(shape) ||
        !json_is_array(offs) || json_array_size(offs) != 2)
        return wl_fail("%s: tensor %s: the header entry needs dtype (a string), shape (an "
                       "array) and data_offsets ([begin, end])",
                       path, name);
    if (parse_dtype(path, name, json_string_value(dtype), &t->dtype))
        return -1;
    size_t nd = json_array_size(shape);
    if (nd > WL_MAX_DIMS)
        return wl_fail("%s: tensor %s has %zu dimensions (at most %d)", path, name, nd,
                       WL_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t count = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return wl_fail("%s: tensor %s: shape[%zu] is not a non-negative integer", path, name,
                           i);
        t->shape[i] = (uint64_t)json_integer_value(d);
        if (t->shape[i] && count > UINT64_MAX / 8 / t->shape[i])
            return wl_fail("%s: tensor %s: its shape's size overflows", path, name);
        count *= t->shape[i];
    }
    json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return wl_fail("%s: tensor %s: data_offsets must be integers 0 <= begin <= end", path,
                       name);
    uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
    if (end > data_size)
        return wl_fail("%s: tensor %s: data_offsets [%llu, %llu] run past the data's %zu bytes "
                       "(file truncated?)",
                       path, name, (unsigned long long)begin, (unsigned long long)end, data_size);
    uint64_t want = count * wl_dtype_size(t->dtype);
    if (end - begin != want)
        return wl_fail("%s: tensor %s: data_offsets hold %llu bytes but shape x %s needs %llu",
                       path, name, (unsigned long long)(end - begin), wl_dtype_name(t->dtype),
                       (unsigned long long)want);
    t->data = data + begin;
    t->nbytes = (size_t)want;
    if ((uintptr_t)t->data % wl_dtype_size(t->dtype))
        return wl_fail("%s: tensor %s starts at an offset not aligned to its %zu-byte elements",
                       path, name, wl_dtype_size(t->dtype));
    return 0;
}

static int check_metadata(const char *path, json_t *meta)
{
    const char *key;
    json_t *v;
    if (!json_is_object(meta))
        return wl_fail("%s: __metadata__ is not an object", path);
    json_object_foreach(meta, key, v)
    {
        if (!json_is_string(v))
            return wl_fail("%s: __metadata__.%s is not a string", path, key);
    }
    return 0;
}

static int parse_header(wl_st_file *f, const char *json, size_t len, const char *data,
                        size_t data_size)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    int rc = -1;
    if (!root)
        return wl_fail("%s: the header is not valid JSON (%s at byte %d)", f->path, jerr.text,
                       jerr.position);
    if (!json_is_object(root)) {
        wl_fail("%s: the header is not a JSON object", f->path);
        goto out;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        wl_fail("%s: out of memory", f->path);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (!strcmp(key, "__metadata__")) {
            if (check_metadata(f->path, v))
                goto out;
            continue;
        }
        wl_tensor *t = &f->tensors[f->count];
        if (!(t->name = strdup(key))) {
            wl_fail("%s: out of memory", f->path);
            goto out;
        }
        f->count++;
        if (parse_entry(f->path, key, v, data, data_size, t))
            goto out;
    }
    /* No two tensors may share bytes: sort by start, compare neighbours. */
    const wl_tensor **by_data = malloc((f->count ? f->count : 1) * sizeof *by_data);
    if (!by_data) {
        wl_fail("%s: out of memory", f->path);
        goto out;
    }
    for (size_t i = 0; i < f->count; i++)
        by_data[i] = &f->tensors[i];
    qsort(by_data, f->count, sizeof *by_data, cmp_tensor_data);
    for (size_t i = 1; i < f->count; i++) {
        const wl_tensor *a = by_data[i - 1], *b = by_data[i];
        if ((const char *)a->data + a->nbytes > (const char *)b->data) {
            wl_fail("%s: tensors %s and %s overlap in the data", f->path, a->name, b->name);
            free(by_data);
            goto out;
        }
    }
    free(by_data);
    qsort(f->tensors, f->count, sizeof *f->tensors, cmp_tensor_name);
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int wl_st_open(wl_st_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wl_fail("%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return wl_fail("%s: not a regular file", path);
    }
    f->path = strdup(path);
    f->size = (size_t)st.st_size;
    if (!f->path) {
        close(fd);
        return wl_fail("%s: out of memory", path);
    }
    if (f->size < 8) {
        close(fd);
        wl_fail("%s: truncated: %zu bytes, less than the 8-byte header length", path, f->size);
        goto fail;
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        wl_fail("%s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    const unsigned char *p = f->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | p[i];
    if (n < 2 || n > MAX_HEADER) {
        wl_fail("%s: header length %llu is not sane (2 to %u bytes)", path, (unsigned long long)n,
                MAX_HEADER);
        goto fail;
    }
    if (n > f->size - 8) {
        wl_fail("%s: truncated: the header claims %llu bytes but only %zu follow", path,
                (unsigned long long)n, f->size - 8);
        goto fail;
    }
    if (parse_header(f, (const char *)p + 8, (size_t)n, (const char *)p + 8 + n,
                     f->size - 8 - (size_t)n))
        goto fail;
    return 0;
fail:
    wl_st_close(f);
    return -1;
}

void wl_st_close(wl_st_file *f)
{
    if (f->map)
        munmap(f->map, f->size);
    for (size_t i = 0; i < f->count; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const wl_tensor *wl_st_find(const wl_st_file *f, const char *name)
{
    wl_tensor key = {.name = (char *)name};
    return f->count ? bsearch(&key, f->tensors, f->count, sizeof key, cmp_tensor_name) : NULL;
}

int wl_st_write_header(FILE *out, const wl_st_spec *specs, size_t n)
{
    json_t *root = json_object(), *meta = json_object();
    uint64_t off = 0;
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_object(), *shape = json_array();
        uint64_t count = 1;
        for (int d = 0; d < specs[i].ndim; d++) {
            json_array_append_new(shape, json_integer((json_int_t)specs[i].shape[d]));
            count *= specs[i].shape[d];
        }
        uint64_t bytes = count * wl_dtype_size(specs[i].dtype);
        json_object_set_new(e, "dtype", json_string(wl_dtype_name(specs[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + bytes)));
        json_object_set_new(root, specs[i].name, e);
        off += bytes;
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    if (!text)
        return wl_fail("safetensors header: out of memory");
    /* Pad with spaces so the data starts 8-byte aligned, as writers do. */
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lenbuf, 8, 1, out) == 1 && fwrite(text, 1, len, out) == len;
    for (size_t i = len; ok && i < padded; i++)
        ok = fputc(' ', out) != EOF;
    free(text);
    return ok ? 0 : wl_fail("safetensors header: write failed: %s", strerror(errno));
}
