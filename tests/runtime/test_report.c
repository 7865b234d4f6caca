/*
 * test_report.c - weft_stats_report names each symptom a run shows, with its
 * figure, and says nothing about a healthy run; WEFT_REPORT prints it, with
 * what was left behind, at destroy.
 *
 * Each test provokes one symptom on the host backend (kernels and pageable
 * copies need a GPU: tests/runtime/test_report_gpu.c) and checks the
 * report for the symptom's name and the figure the counters give, not for
 * its prose.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weft.h"
#include "weft_test.h"

enum { REPORT_MAX = 8192 };

static weft_runtime *host_runtime(void)
{
    weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST};
    weft_runtime *rt;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    return rt;
}

/* rt's report, in a buffer the caller frees; *len its length. */
static char *report_of(weft_runtime *rt, int *len)
{
    char *buf = malloc(REPORT_MAX);
    assert_non_null(buf);
    *len = weft_stats_report(rt, buf, REPORT_MAX);
    assert_true(*len >= 0 && *len < REPORT_MAX);
    assert_int_equal(strlen(buf), (size_t)*len);
    return buf;
}

static void spawn_all(weft_runtime *rt, weft_task **ts, unsigned n, void *(*fn)(void *), void *arg)
{
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(weft_spawn(rt, &ts[i], fn, arg, NULL), WEFT_OK);
    for (unsigned i = 0; i < n; i++) {
        void *r = (void *)1;
        assert_int_equal(weft_join(ts[i], &r), WEFT_OK);
        assert_null(r);
    }
}

/* ---- work that provokes each symptom, or none ------------------------------ */

static void spin_200us(void *arg)
{
    (void)arg;
    uint64_t until = weft_now_ns() + 200000;
    while (weft_now_ns() < until)
        ;
}

/* Compute on the device with a small copy beside it, many tasks at once. */
static void *healthy(void *arg)
{
    char src[4096] = {1}, dst[4096];
    (void)arg;
    for (int i = 0; i < 20; i++)
        if (weft_host_async(spin_200us, NULL) || weft_memcpy_async(dst, src, sizeof src) ||
            weft_await())
            return (void *)1;
    return NULL;
}

/* A little device work, then a sleep: the task is alive, nothing is ready,
 * the device is idle. */
static void *mostly_asleep(void *arg)
{
    char src[64] = {1}, dst[64];
    (void)arg;
    /* sleeps long beside a wake-up's latency, which a loaded machine
     * stretches and which counts as no stall */
    for (int i = 0; i < 6; i++)
        if (weft_memcpy_async(dst, src, sizeof src) || weft_await() || weft_sleep_ns(30000000))
            return (void *)1;
    return NULL;
}

enum { SERIAL_ROUNDS = 40 };

static void nothing(void *arg)
{
    (void)arg;
}

static void *rounds_in_turn(void *arg)
{
    (void)arg;
    for (int i = 0; i < SERIAL_ROUNDS; i++)
        if (weft_host_async(nothing, NULL) || weft_await())
            return (void *)1;
    return NULL;
}

enum { COPY_TASKS = 4, COPY_ROUNDS = 8 };
#define COPY_BYTES ((size_t)8 << 20)

static void *big_copies(void *arg)
{
    char *src = malloc(COPY_BYTES), *dst = malloc(COPY_BYTES);
    void *rc = (void *)1;
    (void)arg;
    if (!src || !dst)
        goto out;
    memset(src, 7, COPY_BYTES);
    for (int i = 0; i < COPY_ROUNDS; i++)
        if (weft_memcpy_async(dst, src, COPY_BYTES) || weft_await())
            goto out;
    rc = dst[COPY_BYTES - 1] == 7 ? NULL : (void *)1;
out:
    free(src);
    free(dst);
    return rc;
}

/* ---- the tests ------------------------------------------------------------------ */

static void test_report_is_silent_for_a_healthy_run(void **state)
{
    weft_task *ts[16];
    int len;
    (void)state;
    weft_runtime *rt = host_runtime();
    spawn_all(rt, ts, 16, healthy, NULL);
    char *text = report_of(rt, &len);
    assert_string_equal(text, "");
    assert_int_equal(len, 0);
    /* the figures were there to judge: work overlapped, time passed */
    weft_stats st;
    assert_int_equal(weft_stats_get(rt, &st), WEFT_OK);
    assert_true(st.streams_max > 1);
    assert_true(st.awaits == 16 * 20);
    assert_true(st.elapsed_ns >= 10000000);
    assert_int_equal(st.copy_bytes[WEFT_COPY_HOST], 16 * 20 * 4096);
    free(text);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void test_report_names_cpu_and_device_idle_together(void **state)
{
    weft_task *ts[4];
    int len;
    (void)state;
    weft_runtime *rt = host_runtime();
    spawn_all(rt, ts, 4, mostly_asleep, NULL);
    weft_stats st;
    assert_int_equal(weft_stats_get(rt, &st), WEFT_OK);
    char *text = report_of(rt, &len);
    /* the figure: most of the workers' time was a stall */
    assert_true((double)st.stalled_ns >= 0.5 * 2.0 * (double)st.elapsed_ns);
    assert_non_null(strstr(text, "idle together"));
    assert_non_null(strstr(text, "over 2 workers"));
    free(text);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void test_report_names_device_work_that_never_overlapped(void **state)
{
    weft_task *t;
    int len;
    char figure[64];
    (void)state;
    weft_runtime *rt = host_runtime();
    spawn_all(rt, &t, 1, rounds_in_turn, NULL);
    char *text = report_of(rt, &len);
    assert_non_null(strstr(text, "never overlapped"));
    snprintf(figure, sizeof figure, "1 stream in use at once over %d awaits", SERIAL_ROUNDS);
    assert_non_null(strstr(text, figure));
    free(text);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void test_report_names_copies_that_dominate(void **state)
{
    weft_task *ts[COPY_TASKS];
    int len;
    (void)state;
    weft_runtime *rt = host_runtime();
    spawn_all(rt, ts, COPY_TASKS, big_copies, NULL);
    weft_stats st;
    assert_int_equal(weft_stats_get(rt, &st), WEFT_OK);
    assert_int_equal(st.copy_bytes[WEFT_COPY_HOST],
                     (uint64_t)COPY_TASKS * COPY_ROUNDS * COPY_BYTES);
    assert_int_equal(st.copy_bytes[WEFT_COPY_PAGEABLE] + st.copy_bytes[WEFT_COPY_PINNED] +
                         st.copy_bytes[WEFT_COPY_DEVICE],
                     0);
    assert_true(st.copy_ns > st.device_busy_ns[0] / 2);
    char *text = report_of(rt, &len);
    assert_non_null(strstr(text, "copies dominate"));
    assert_non_null(strstr(text, "ms busy"));
    assert_null(strstr(text, "pageable memory:")); /* the host backend has no such memory */
    free(text);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

static void test_report_is_cut_to_size_and_refuses_bad_arguments(void **state)
{
    weft_task *t;
    char small[16];
    (void)state;
    weft_runtime *rt = host_runtime();
    spawn_all(rt, &t, 1, rounds_in_turn, NULL);
    int whole = weft_stats_report(rt, NULL, 0);
    assert_true(whole > (int)sizeof small);
    assert_int_equal(weft_stats_report(rt, small, sizeof small), whole);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_int_equal(weft_stats_report(rt, NULL, 8), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "buf is NULL"));
    assert_int_equal(weft_stats_report(NULL, small, sizeof small), WEFT_EINVAL);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    assert_int_equal(weft_stats_report(rt, small, sizeof small), WEFT_ESTATE);
}

/* ---- at destroy --------------------------------------------------------------- */

static void *leave_an_event(void *arg)
{
    weft_event **ev = arg;
    return weft_host_async(nothing, NULL) || weft_event_record(ev) || weft_await() ? (void *)1
                                                                                   : NULL;
}

static void *leave_a_block(void *arg)
{
    void **block = arg;
    return weft_malloc_async(block, 64) || weft_await() ? (void *)1 : NULL;
}

static void *finish(void *arg)
{
    return arg;
}

static void *free_block(void *block)
{
    return weft_free_async(block) || weft_await() ? (void *)1 : NULL;
}

static char *read_file(const char *path)
{
    static char text[REPORT_MAX];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f)
        fclose(f);
    text[n] = '\0';
    return text;
}

static void test_report_at_destroy_lists_what_was_left_behind(void **state)
{
    char path[] = "/tmp/weft-report-XXXXXX";
    int fd = mkstemp(path);
    weft_task *t, *unjoined;
    weft_event *ev = NULL;
    void *pinned = NULL, *block = NULL;
    (void)state;
    assert_true(fd >= 0);
    close(fd);
    setenv("WEFT_REPORT", path, 1);

    weft_runtime *rt = host_runtime();
    assert_int_equal(weft_spawn(rt, &t, leave_an_event, &ev, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &t, leave_a_block, &block, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(weft_host_alloc(rt, &pinned, 128), WEFT_OK);
    assert_int_equal(weft_spawn(rt, &unjoined, finish, NULL, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);

    const char *text = read_file(path);
    assert_non_null(strstr(text, "left at destroy"));
    assert_non_null(strstr(text, "1 task never joined"));
    assert_non_null(strstr(text, "1 event never destroyed"));
    assert_non_null(strstr(text, "1 host block never freed"));
    assert_non_null(strstr(text, "1 device block never freed"));
    /* The host backend's pinned memory is the C heap's, and its runtime is
     * gone; a task of any runtime may free a block of weft_malloc_async. */
    free(pinned);
    assert_int_equal(weft_event_destroy(ev), WEFT_OK);

    /* The same without leftovers: nothing is written. */
    assert_int_equal(truncate(path, 0), 0);
    rt = host_runtime();
    assert_int_equal(weft_spawn(rt, &t, free_block, block, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
    assert_string_equal(read_file(path), "");
    unsetenv("WEFT_REPORT");
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_is_silent_for_a_healthy_run),
        cmocka_unit_test(test_report_names_cpu_and_device_idle_together),
        cmocka_unit_test(test_report_names_device_work_that_never_overlapped),
        cmocka_unit_test(test_report_names_copies_that_dominate),
        cmocka_unit_test(test_report_is_cut_to_size_and_refuses_bad_arguments),
        cmocka_unit_test(test_report_at_destroy_lists_what_was_left_behind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
