/*
 * llm_test.h - what the weft-llm tests share: a scratch folder, running
 * the program with its output captured, and writing files byte for byte.
 */
#ifndef LLM_TEST_H
#define LLM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include "llm.h"

static inline char *scratch_dir(void)
{
    char tmpl[] = "/tmp/weft-llm-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static inline void remove_scratch(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static inline char *path_in(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static inline int write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) || w != n ? -1 : 0;
}

/* Runs a shell command; its stdout (and stderr, when err is given) into
 * malloc'd strings. Returns the exit status. */
static inline int run_capture(const char *cmd, char **out, char **err)
{
    char full[4096], errpath[] = "/tmp/weft-llm-err-XXXXXX";
    *out = NULL;
    if (err)
        *err = NULL;
    int fd = mkstemp(errpath);
    if (fd < 0)
        return -1;
    close(fd);
    snprintf(full, sizeof full, "%s 2>%s", cmd, errpath);
    FILE *p = popen(full, "r");
    if (!p)
        return -1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t r; (r = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += r;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int status = pclose(p);
    *out = buf;
    if (err) {
        FILE *e = fopen(errpath, "rb");
        char *eb = calloc(1, 1 << 16);
        if (e) {
            size_t r = fread(eb, 1, (1 << 16) - 1, e);
            eb[r] = 0;
            fclose(e);
        }
        *err = eb;
    }
    unlink(errpath);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline uint64_t test_seed(void)
{
    const char *s = getenv("WEFT_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (WEFT_TEST_SEED=%llu repeats it)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    return seed;
}

#endif
