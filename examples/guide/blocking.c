/*
 * blocking.c - the guide's blocking work (docs/guide.md, "Blocking work"):
 * a task reads a file with fread, which blocks, through weft_blocking, so
 * that its worker runs other tasks meanwhile. The file is a temporary one
 * written first; the task checks it read back what was written. Either
 * backend, no GPU calls.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <weft.h>

typedef struct {
    FILE *f;
    void *buf;
    size_t n;
} read_req;

static void *do_read(void *arg)
{
    read_req *r = arg;
    return (void *)fread(r->buf, 1, r->n, r->f);
}

static const char text[] = "read through weft_blocking, off the worker threads\n";

static int use(const char *buf, size_t n)
{
    return n == sizeof text && memcmp(buf, text, n) == 0 ? 0 : -1;
}

static void *reader(void *arg)
{
    FILE *f = arg;
    char buf[256];
    int rc;
    read_req req = {f, buf, sizeof buf}; /* on the task's stack: fine */
    void *got;
    if ((rc = weft_blocking(do_read, &req, &got)) == WEFT_OK)
        rc = use(buf, (size_t)got);
    return (void *)(intptr_t)rc;
}

int main(void)
{
    weft_runtime *rt;
    weft_task *t;
    void *rc = (void *)1;
    FILE *f = tmpfile();
    if (!f || fwrite(text, 1, sizeof text, f) != sizeof text || fseek(f, 0, SEEK_SET)) {
        perror("blocking: temporary file");
        return 1;
    }
    if (weft_runtime_create(&rt, NULL) || weft_spawn(rt, &t, reader, f, NULL)) {
        fprintf(stderr, "blocking: %s\n", weft_last_error());
        return 1;
    }
    weft_join(t, &rc);
    printf("blocking: a task read %zu bytes through weft_blocking: %s\n", sizeof text,
           rc ? "WRONG" : "as written");
    fclose(f);
    return weft_runtime_destroy(rt) || rc;
}
