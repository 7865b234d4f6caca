/*
 * test_fault.c - a kernel fault fails its task and its device, nothing else.
 *
 * One task launches a kernel that writes to an address nothing is mapped
 * at. Its weft_await must return WEFT_EDEVICE within a second, with the
 * CUDA error's name in the message, although a faulted GPU never writes
 * another completion flag. At the same moment: another task awaiting a
 * long kernel on the same GPU, a task awaiting the faulting task's event,
 * and tasks doing host work only. The waiters fail with WEFT_EDEVICE, the
 * host work finishes, and afterwards the runtime still spawns and joins
 * tasks while every device call fails with WEFT_EDEVICE.
 *
 * A sticky fault poisons the CUDA context of the whole process, so this
 * test has a program of its own, and the tests after the fault only check
 * what must still work. Under compute-sanitizer's memcheck the fault is
 * the sanitizer's to report (scripts/gpu-check leaves this program out).
 */
#include "gpu_support/gpu_test.h"

enum { HOST_TASKS = 32, HOST_ROUNDS = 40 };
/* Half a second: running when the fault happens. CUDA reports a fault only
 * once the kernels running at the time have ended (seen on the H200: a 5 s
 * kernel on another stream delayed the report by 5 s), so a longer one
 * would hold back every wait's failure by as much. */
#define LONG_KERNEL_NS 500000000ull

static weft_dim3 dim(unsigned x, unsigned y, unsigned z)
{
    weft_dim3 d = {x, y, z};
    return d;
}

static struct {
    /* the faulting task */
    int f_await_rc;
    double f_seconds;
    char f_message[512];
    weft_event *f_event;
    weft_chan *f_event_to_w;
    /* the task awaiting a long kernel */
    atomic_uint g_enqueued;
    int g_await_rc;
    double g_seconds;
    /* the task awaiting the faulting task's event */
    int w_rc;
    /* each of the three sets its flag when its wait has returned */
    atomic_uint f_done, g_done, w_done;
    /* host work */
    atomic_uint host_done;
} fr;

static void *faulting_main(void *arg)
{
    uint32_t *bad = (uint32_t *)(uintptr_t)0x10; /* no memory there */
    void *args[] = {&bad};
    weft_event *ev = NULL;
    double t0;

    (void)arg;
    t0 = gt_now();
    if (!GT_OK(weft_launch(gk_fault(), dim(1, 1, 1), dim(32, 1, 1), 0, args))) {
        weft_chan_close(fr.f_event_to_w);
        return NULL;
    }
    /* an event behind the fault; recording may already see the failure */
    if (weft_event_record(&ev) != WEFT_OK)
        ev = NULL;
    fr.f_event = ev;
    GT_OK(weft_chan_send(fr.f_event_to_w, &ev));
    fr.f_await_rc = weft_await();
    fr.f_seconds = gt_now() - t0;
    snprintf(fr.f_message, sizeof fr.f_message, "%s", weft_last_error());
    atomic_store(&fr.f_done, 1);
    return NULL;
}

static void *long_kernel_main(void *arg)
{
    uint64_t spin = LONG_KERNEL_NS;
    uint32_t *none = NULL;
    void *args[] = {&spin, &none};
    double t0;

    (void)arg;
    if (!GT_OK(weft_launch(gk_busy(), dim(1, 1, 1), dim(32, 1, 1), 0, args)))
        return NULL;
    atomic_store(&fr.g_enqueued, 1);
    t0 = gt_now();
    fr.g_await_rc = weft_await();
    fr.g_seconds = gt_now() - t0;
    atomic_store(&fr.g_done, 1);
    return NULL;
}

static void *event_waiter_main(void *arg)
{
    weft_event *ev = NULL;

    (void)arg;
    if (!GT_OK(weft_chan_recv(fr.f_event_to_w, &ev)))
        return NULL;
    fr.w_rc = ev ? weft_event_await(ev) : WEFT_EDEVICE; /* no event: recording saw it */
    atomic_store(&fr.w_done, 1);
    return NULL;
}

/* Host work only: sleeps, yields, arithmetic. Returns its checksum. */
static void *host_work_main(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    uint64_t sum = id;

    for (unsigned r = 0; r < HOST_ROUNDS; r++) {
        if (!GT_OK(weft_sleep_ns(2000000)) || !GT_OK(weft_yield()))
            return NULL;
        sum = sum * 6364136223846793005u + r;
    }
    atomic_fetch_add(&fr.host_done, 1);
    return (void *)(uintptr_t)sum;
}

static uintptr_t host_work_expect(uintptr_t id)
{
    uint64_t sum = id;

    for (unsigned r = 0; r < HOST_ROUNDS; r++)
        sum = sum * 6364136223846793005u + r;
    return (uintptr_t)sum;
}

/* Every device call of a task on the failed device returns WEFT_EDEVICE. */
static void *after_fault_device_main(void *arg)
{
    unsigned char a[64] = {0}, b[64] = {0};
    uint32_t *p = NULL, *q = NULL;
    unsigned n = 16;
    uint32_t x = 1, y = 2;
    void *args[] = {&q, &q, &n, &x, &y};
    void *s = NULL;
    weft_event *ev = NULL;

    (void)arg;
    GT_RC(weft_malloc_async((void **)&p, 64), WEFT_EDEVICE);
    GT_RC(weft_memcpy_async(a, b, sizeof a), WEFT_EDEVICE);
    GT_RC(weft_memset_async(a, 0, sizeof a), WEFT_EDEVICE);
    GT_RC(weft_launch(gk_affine(), dim(1, 1, 1), dim(16, 1, 1), 0, args), WEFT_EDEVICE);
    GT_RC(weft_stream(&s), WEFT_EDEVICE);
    GT_RC(weft_event_record(&ev), WEFT_EDEVICE);
    int rc = weft_await(); /* nothing was enqueued: no reason to wait */
    GT_CHECK(rc == WEFT_OK || rc == WEFT_EDEVICE, "weft_await after the fault returned %d (%s)", rc,
             weft_strerror(rc));
    return NULL;
}

static void *trivial_main(void *arg)
{
    return arg;
}

static void test_kernel_fault_fails_its_task_and_device_only(void **state)
{
    weft_runtime *rt = gt_runtime(4);
    weft_task *host[HOST_TASKS], *f, *g, *w, *d;
    void *res;
    int rc;

    (void)state;
    memset(&fr, 0, sizeof fr);
    atomic_init(&fr.g_enqueued, 0);
    atomic_init(&fr.f_done, 0);
    atomic_init(&fr.g_done, 0);
    atomic_init(&fr.w_done, 0);
    atomic_init(&fr.host_done, 0);
    fr.f_await_rc = fr.g_await_rc = fr.w_rc = -100;
    assert_ok(weft_chan_create(&fr.f_event_to_w, sizeof(weft_event *), 1));

    for (uintptr_t i = 0; i < HOST_TASKS; i++)
        assert_ok(weft_spawn(rt, &host[i], host_work_main, (void *)i, NULL));
    assert_ok(weft_spawn(rt, &g, long_kernel_main, NULL, NULL));
    assert_true(gt_wait_for(&fr.g_enqueued, 1, 10));
    assert_ok(weft_spawn(rt, &w, event_waiter_main, NULL, NULL));
    assert_ok(weft_spawn(rt, &f, faulting_main, NULL, NULL));

    /* a wait that never ends would hang the joins: fail with a reason first */
    if (!gt_wait_for(&fr.f_done, 1, 20) || !gt_wait_for(&fr.w_done, 1, 20) ||
        !gt_wait_for(&fr.g_done, 1, 20))
        fail_msg("a wait did not return within 20 s of a kernel fault (faulting task %u, event "
                 "waiter %u, long kernel %u): does the completion engine notice faults?",
                 atomic_load(&fr.f_done), atomic_load(&fr.w_done), atomic_load(&fr.g_done));

    /* the faulting task */
    assert_rc(weft_join(f, NULL), WEFT_EDEVICE);
    print_message("fault: weft_await returned %d after %.3f s: %s\n", fr.f_await_rc, fr.f_seconds,
                  fr.f_message);
    assert_int_equal(fr.f_await_rc, WEFT_EDEVICE);
    assert_true(fr.f_seconds < gt_deadline(1.0));
    if (!strstr(fr.f_message, gt_sanitizer() ? "cudaError" : "cudaErrorIllegalAddress"))
        fail_msg("the message does not name the CUDA error: \"%s\"", fr.f_message);

    /* the others waiting on the GPU fail too, without waiting for it */
    assert_ok(weft_join(w, NULL));
    assert_int_equal(fr.w_rc, WEFT_EDEVICE);
    /* The long kernel may end before CUDA reports the fault (it reports it
     * only then): its task either sees its work done or the failure. */
    int g_join = weft_join(g, NULL);
    assert_true(g_join == WEFT_OK || g_join == WEFT_EDEVICE);
    assert_true(fr.g_await_rc == WEFT_OK || fr.g_await_rc == WEFT_EDEVICE);
    assert_int_equal(g_join, fr.g_await_rc);
    assert_true(fr.g_seconds < gt_deadline(3.0));
    if (fr.f_event) { /* a thread waiting on the failed device fails too */
        assert_rc(weft_event_await(fr.f_event), WEFT_EDEVICE);
        assert_ok(weft_event_destroy(fr.f_event));
    }

    /* host work finished normally */
    for (uintptr_t i = 0; i < HOST_TASKS; i++) {
        res = NULL;
        assert_ok(weft_join(host[i], &res));
        assert_true((uintptr_t)res == host_work_expect(i));
    }
    assert_int_equal(atomic_load(&fr.host_done), HOST_TASKS);
    gt_assert_passed();

    /* afterwards: tasks still run; device calls fail with WEFT_EDEVICE */
    for (uintptr_t i = 0; i < 100; i++) {
        weft_task *t;
        res = NULL;
        assert_ok(weft_spawn(rt, &t, trivial_main, (void *)(i + 1), NULL));
        assert_ok(weft_join(t, &res));
        assert_true((uintptr_t)res == i + 1);
    }
    assert_ok(weft_spawn(rt, &d, after_fault_device_main, NULL, NULL));
    rc = weft_join(d, NULL);
    assert_true(rc == WEFT_OK || rc == WEFT_EDEVICE);
    gt_assert_passed();
    assert_ok(weft_chan_destroy(fr.f_event_to_w));
    gt_runtime_destroy(rt);
}

static void *host_backend_main(void *arg)
{
    uint32_t src[256], dst[256];

    (void)arg;
    for (unsigned i = 0; i < 256; i++)
        src[i] = i * 2654435761u;
    memset(dst, GT_POISON, sizeof dst);
    if (GT_OK(weft_memcpy_async(dst, src, sizeof src)) && GT_OK(weft_await()))
        GT_CHECK(memcmp(dst, src, sizeof src) == 0, "host backend copy after the fault");
    return NULL;
}

/* After the fault, in the same process: a host-backend runtime works; a
 * new CUDA runtime either refuses to start or fails its device calls -
 * neither hangs nor crashes. */
static void test_new_runtimes_after_the_fault(void **state)
{
    weft_config host_cfg = {.workers = 2, .backend = WEFT_BACKEND_HOST};
    weft_config cuda_cfg = {.workers = 2, .backend = WEFT_BACKEND_CUDA};
    weft_runtime *rt = NULL;
    int rc;

    (void)state;
    gt_reset();
    assert_ok(weft_runtime_create(&rt, &host_cfg));
    gt_run(rt, host_backend_main, NULL);
    assert_ok(weft_runtime_destroy(rt));

    rt = NULL;
    rc = weft_runtime_create(&rt, &cuda_cfg);
    print_message("a CUDA runtime after the fault: weft_runtime_create returned %d (%s)%s%s\n", rc,
                  weft_strerror(rc), rc ? ": " : "", rc ? weft_last_error() : "");
    if (rc == WEFT_OK) {
        weft_task *t;
        assert_ok(weft_spawn(rt, &t, trivial_main, NULL, NULL));
        assert_ok(weft_join(t, NULL));
        assert_ok(weft_runtime_destroy(rt));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_fault_fails_its_task_and_device_only),
        cmocka_unit_test(test_new_runtimes_after_the_fault),
    };
    int skip = gt_start("gpu.fault");

    if (skip)
        return skip;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
