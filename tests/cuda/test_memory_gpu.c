/*
 * test_memory.c - copies and fills of the CUDA backend.
 *
 * weft_memcpy_async between every pair of the memory kinds a task meets
 * (pageable heap, its own stack, pinned from weft_host_alloc, device from
 * weft_malloc_async, mapped from weft_mapped_alloc through either alias),
 * weft_memset_async on each of them, and random programs of copies and
 * fills whose result is only right if the stream ran them in order.
 *
 * Every check is exact: destination buffers are poisoned whole before the
 * operation, then compared whole against a reference, so a short, long,
 * misplaced or missing write fails. Data are random each run (see
 * gpu_test.h for the seed).
 */
#include "gpu_support/gpu_test.h"

enum {
    BUF_CAP = 4 << 20,   /* bytes of each heap, pinned, device, mapped buffer */
    STACK_CAP = 8 << 10, /* bytes of each buffer on the task's stack */
    EDGE = 64,           /* copies start up to EDGE bytes in, end EDGE before the end */
    DRIVER_STACK = 1 << 20,
};

typedef enum kind { PAGEABLE, STACK, PINNED, DEVICE, MAPPED_HOST, MAPPED_DEVICE, NKINDS } kind;

static const char *const kind_name[NKINDS] = {
    "pageable", "stack", "pinned", "device", "mapped(host alias)", "mapped(device alias)",
};

/* A buffer of one kind: p is what weft calls get, host what the CPU reads
 * and writes (NULL for device memory). */
typedef struct membuf {
    kind k;
    unsigned char *p;
    unsigned char *host;
    size_t cap;
} membuf;

/* In a task. stack: STACK_CAP bytes in the caller's frame, for kind STACK. */
static bool mb_alloc(membuf *b, kind k, unsigned char *stack)
{
    weft_runtime *rt = weft_runtime_current();
    void *p = NULL, *d = NULL;

    *b = (membuf){k, NULL, NULL, BUF_CAP};
    switch (k) {
    case PAGEABLE:
        b->p = b->host = malloc(BUF_CAP);
        return GT_CHECK(b->p != NULL, "malloc");
    case STACK:
        b->p = b->host = stack;
        b->cap = STACK_CAP;
        return true;
    case PINNED:
        if (!GT_OK(weft_host_alloc(rt, &p, BUF_CAP)))
            return false;
        b->p = b->host = p;
        return true;
    case DEVICE:
        if (!GT_OK(weft_malloc_async(&p, BUF_CAP)))
            return false;
        b->p = p;
        return true;
    case MAPPED_HOST:
    case MAPPED_DEVICE:
        if (!GT_OK(weft_mapped_alloc(rt, &p, &d, BUF_CAP)))
            return false;
        b->host = p;
        b->p = k == MAPPED_HOST ? p : d;
        return true;
    case NKINDS:
        break;
    }
    return false;
}

static void mb_free(membuf *b)
{
    weft_runtime *rt = weft_runtime_current();

    switch (b->k) {
    case PAGEABLE:
        free(b->p);
        break;
    case PINNED:
        GT_OK(weft_host_free(rt, b->p));
        break;
    case DEVICE:
        if (b->p)
            GT_OK(weft_free_async(b->p));
        break;
    case MAPPED_HOST:
    case MAPPED_DEVICE:
        if (b->host)
            GT_OK(weft_mapped_free(rt, b->host));
        break;
    case STACK:
    case NKINDS:
        break;
    }
    b->p = b->host = NULL;
}

/* Set the whole buffer to data (cap bytes): at once for host memory, in
 * stream order for device memory. */
static bool mb_load(membuf *b, const unsigned char *data)
{
    if (b->host) {
        memcpy(b->host, data, b->cap);
        return true;
    }
    return GT_OK(weft_memcpy_async(b->p, data, b->cap));
}

static bool mb_poison(membuf *b)
{
    if (b->host) {
        memset(b->host, GT_POISON, b->cap);
        return true;
    }
    return GT_OK(weft_memset_async(b->p, GT_POISON, b->cap));
}

/* Await everything enqueued, then copy the whole buffer into out. */
static bool mb_read(membuf *b, unsigned char *out)
{
    if (!b->host) {
        memset(out, (unsigned char)~GT_POISON, b->cap);
        if (!GT_OK(weft_memcpy_async(out, b->p, b->cap)))
            return false;
    }
    if (!GT_OK(weft_await()))
        return false;
    if (b->host)
        memcpy(out, b->host, b->cap);
    return true;
}

/* out (cap bytes) must hold want[0..n) at off and the poison elsewhere. */
static bool check_range(const unsigned char *out, size_t cap, size_t off, const unsigned char *want,
                        size_t n, const char *what)
{
    size_t i;

    if ((i = gt_first_not(out, GT_POISON, off)) < off)
        return GT_FAIL("%s: byte %zu before the range was overwritten (0x%02x)", what, i, out[i]);
    if ((i = gt_first_diff(out + off, want, n)) < n)
        return GT_FAIL("%s: byte %zu of %zu wrong: 0x%02x, expected 0x%02x", what, i, n,
                       out[off + i], want[i]);
    if ((i = gt_first_not(out + off + n, GT_POISON, cap - off - n)) < cap - off - n)
        return GT_FAIL("%s: byte %zu after the range was overwritten (0x%02x)", what, i,
                       out[off + n + i]);
    return true;
}

/* ---- copies in every direction ----------------------------------------- */

typedef struct directions {
    uint64_t rng;
    unsigned copies;
} directions;

static size_t copy_size(uint64_t *rng, unsigned round, size_t room)
{
    switch (round) {
    case 0:
        return gt_between(rng, 1, 16);
    case 1:
        return gt_between(rng, 17, room < 65536 ? room : 65536);
    case 2:
        return room;
    default:
        return gt_between(rng, 1, room);
    }
}

static void *directions_main(void *arg)
{
    directions *d = arg;
    unsigned char stack[2][STACK_CAP]; /* targets of asynchronous copies */
    membuf buf[NKINDS][2];
    unsigned char *data = malloc(BUF_CAP), *out = malloc(BUF_CAP);
    char what[160];
    bool ok = GT_CHECK(data && out, "malloc");

    memset(buf, 0, sizeof buf);
    for (int k = 0; k < NKINDS; k++)
        for (int j = 0; j < 2; j++)
            ok = ok && mb_alloc(&buf[k][j], (kind)k, stack[j]);
    /* the kinds are what they claim to be */
    ok = ok && GT_CHECK(gk_pointer_kind(buf[PAGEABLE][0].p, NULL) == GK_MEM_PAGEABLE, "pageable") &&
         GT_CHECK(gk_pointer_kind(buf[PINNED][0].p, NULL) == GK_MEM_PINNED,
                  "weft_host_alloc memory is not page-locked") &&
         GT_CHECK(gk_pointer_kind(buf[DEVICE][0].p, NULL) == GK_MEM_DEVICE,
                  "weft_malloc_async memory is not device memory");

    for (int sk = 0; ok && sk < NKINDS; sk++)
        for (int dk = 0; ok && dk < NKINDS; dk++)
            for (unsigned round = 0; ok && round < 4; round++) {
                membuf *src = &buf[sk][0], *dst = &buf[dk][1];
                size_t cap = src->cap < dst->cap ? src->cap : dst->cap;
                size_t n = copy_size(&d->rng, round, cap - 2 * EDGE);
                size_t soff = gt_between(&d->rng, 0, EDGE), doff = gt_between(&d->rng, 0, EDGE);

                snprintf(what, sizeof what, "%s -> %s, %zu bytes from +%zu to +%zu", kind_name[sk],
                         kind_name[dk], n, soff, doff);
                gt_fill(&d->rng, data, src->cap);
                ok = mb_load(src, data) && mb_poison(dst) &&
                     GT_OK(weft_memcpy_async(dst->p + doff, src->p + soff, n)) &&
                     mb_read(dst, out) && check_range(out, dst->cap, doff, data + soff, n, what);
                d->copies++;
            }
    GT_OK(weft_await());
    for (int k = 0; k < NKINDS; k++)
        for (int j = 0; j < 2; j++)
            mb_free(&buf[k][j]);
    GT_OK(weft_await());
    free(data);
    free(out);
    return NULL;
}

/* weft_memcpy_async between each pair of memory kinds, in sizes from one
 * byte to 4 MiB at unaligned offsets: exactly the range arrives. */
static void test_memcpy_between_every_pair_of_memory_kinds(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    weft_task_opts opts = {.stack_size = DRIVER_STACK};
    directions d = {gt_rng(1), 0};
    weft_task *t;

    (void)state;
    assert_ok(weft_spawn(rt, &t, directions_main, &d, &opts));
    assert_ok(weft_join(t, NULL));
    gt_assert_passed();
    assert_int_equal(d.copies, NKINDS * NKINDS * 4);
    gt_runtime_destroy(rt);
}

static void *zero_bytes_main(void *arg)
{
    unsigned char a[16], b[16];

    (void)arg;
    memset(a, 1, sizeof a);
    memset(b, 2, sizeof b);
    GT_OK(weft_memcpy_async(NULL, NULL, 0));
    GT_OK(weft_memcpy_async(a, b, 0));
    GT_OK(weft_memset_async(NULL, 0, 0));
    GT_OK(weft_memset_async(a, 3, 0));
    GT_OK(weft_await());
    GT_CHECK(gt_first_not(a, 1, sizeof a) == sizeof a, "a zero-byte operation wrote");
    return NULL;
}

/* Zero bytes: nothing to do, not an error, even with NULL pointers. */
static void test_zero_byte_copies_and_fills_do_nothing(void **state)
{
    weft_runtime *rt = gt_runtime(2);

    (void)state;
    gt_run(rt, zero_bytes_main, NULL);
    gt_runtime_destroy(rt);
}

/* ---- fills ------------------------------------------------------------- */

typedef struct fills {
    uint64_t rng;
    unsigned done;
} fills;

static void *fills_main(void *arg)
{
    fills *f = arg;
    unsigned char stack[STACK_CAP];
    unsigned char *ref = malloc(BUF_CAP), *out = malloc(BUF_CAP);
    char what[160];
    bool ok = GT_CHECK(ref && out, "malloc");

    for (int k = 0; ok && k < NKINDS; k++) {
        membuf b;
        if (!(ok = mb_alloc(&b, (kind)k, stack)))
            break;
        for (unsigned round = 0; ok && round < 6; round++) {
            /* three overlapping fills in a row, no await between: the
             * later ones win where they overlap */
            memset(ref, GT_POISON, b.cap);
            ok = mb_poison(&b);
            for (unsigned j = 0; ok && j < 3; j++) {
                size_t n = round == 0 ? b.cap : gt_between(&f->rng, 1, b.cap / 2);
                size_t off = gt_between(&f->rng, 0, b.cap - n);
                int value = (int)gt_u32(&f->rng); /* any int: the low byte counts */
                memset(ref + off, value, n);
                ok = GT_OK(weft_memset_async(b.p + off, value, n));
            }
            snprintf(what, sizeof what, "memset on %s, round %u", kind_name[k], round);
            ok = ok && mb_read(&b, out) && check_range(out, b.cap, 0, ref, b.cap, what);
            f->done++;
        }
        mb_free(&b);
    }
    GT_OK(weft_await());
    free(ref);
    free(out);
    return NULL;
}

/* weft_memset_async on every kind of memory, with values beyond a byte
 * (only the low byte is stored) and overlapping fills in stream order. */
static void test_memset_on_every_memory_kind(void **state)
{
    weft_runtime *rt = gt_runtime(0);
    weft_task_opts opts = {.stack_size = DRIVER_STACK};
    fills f = {gt_rng(2), 0};
    weft_task *t;

    (void)state;
    assert_ok(weft_spawn(rt, &t, fills_main, &f, &opts));
    assert_ok(weft_join(t, NULL));
    gt_assert_passed();
    assert_int_equal(f.done, NKINDS * 6);
    gt_runtime_destroy(rt);
}

/* ---- stream order ------------------------------------------------------ */
/*
 * A random program of copies and fills over five buffers of different
 * kinds, each step reading what earlier ones wrote, is enqueued without
 * awaits and applied at once to host references. At random checkpoints and
 * at the end every buffer must equal its reference: only in-order
 * execution gives that result.
 */

enum { PROG_CAP = 64 << 10, PROG_BUFS = 5, PROG_STEPS = 400 };

static const kind prog_kinds[PROG_BUFS] = {DEVICE, DEVICE, PINNED, PAGEABLE, MAPPED_DEVICE};

typedef struct program {
    unsigned index;
    unsigned checkpoints;
} program;

static void *program_main(void *arg)
{
    program *pg = arg;
    uint64_t rng = gt_rng(100 + pg->index);
    membuf buf[PROG_BUFS];
    unsigned char *ref[PROG_BUFS], *out = malloc(PROG_CAP);
    char what[160];
    bool ok = GT_CHECK(out != NULL, "malloc");

    memset(buf, 0, sizeof buf);
    memset(ref, 0, sizeof ref);
    for (int i = 0; i < PROG_BUFS; i++) {
        ref[i] = malloc(PROG_CAP);
        ok = ok && GT_CHECK(ref[i] != NULL, "malloc") && mb_alloc(&buf[i], prog_kinds[i], NULL);
        if (!ok)
            break;
        buf[i].cap = PROG_CAP;
        gt_fill(&rng, ref[i], PROG_CAP);
        ok = mb_load(&buf[i], ref[i]);
    }
    ok = ok && GT_OK(weft_await()); /* the loads read ref[], which changes from here on */
    for (unsigned step = 0; ok && step <= PROG_STEPS; step++) {
        if (step == PROG_STEPS || gt_between(&rng, 0, 40) == 0) { /* checkpoint */
            for (int i = 0; ok && i < PROG_BUFS; i++) {
                snprintf(what, sizeof what, "program %u, step %u, %s buffer %d", pg->index, step,
                         kind_name[buf[i].k], i);
                ok = mb_read(&buf[i], out) && check_range(out, PROG_CAP, 0, ref[i], PROG_CAP, what);
            }
            pg->checkpoints++;
            continue;
        }
        int d = (int)gt_between(&rng, 0, PROG_BUFS - 1);
        size_t n = gt_between(&rng, 1, PROG_CAP / 2);
        size_t doff = gt_between(&rng, 0, PROG_CAP - n);
        if (gt_between(&rng, 0, 3) == 0) {
            int value = (int)gt_u32(&rng);
            memset(ref[d] + doff, value, n);
            ok = GT_OK(weft_memset_async(buf[d].p + doff, value, n));
        } else {
            int s = (d + 1 + (int)gt_between(&rng, 0, PROG_BUFS - 2)) % PROG_BUFS;
            size_t soff = gt_between(&rng, 0, PROG_CAP - n);
            memcpy(ref[d] + doff, ref[s] + soff, n);
            ok = GT_OK(weft_memcpy_async(buf[d].p + doff, buf[s].p + soff, n));
        }
    }
    GT_OK(weft_await());
    for (int i = 0; i < PROG_BUFS; i++) {
        if (buf[i].p)
            mb_free(&buf[i]);
        free(ref[i]);
    }
    GT_OK(weft_await());
    free(out);
    return NULL;
}

/* Sixteen tasks each run a random program of copies and fills over device,
 * pinned, pageable and mapped buffers; all results match in-order
 * execution. */
static void test_copies_and_fills_run_in_stream_order(void **state)
{
    enum { N = 16 };
    weft_runtime *rt = gt_runtime(0);
    weft_task *t[N];
    program pg[N];

    (void)state;
    for (unsigned i = 0; i < N; i++) {
        pg[i] = (program){i, 0};
        assert_ok(weft_spawn(rt, &t[i], program_main, &pg[i], NULL));
    }
    for (unsigned i = 0; i < N; i++)
        assert_ok(weft_join(t[i], NULL));
    gt_assert_passed();
    for (unsigned i = 0; i < N; i++)
        assert_true(pg[i].checkpoints >= 1);
    gt_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memcpy_between_every_pair_of_memory_kinds),
        cmocka_unit_test(test_zero_byte_copies_and_fills_do_nothing),
        cmocka_unit_test(test_memset_on_every_memory_kind),
        cmocka_unit_test(test_copies_and_fills_run_in_stream_order),
    };
    int skip = gt_start("gpu.memory");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
