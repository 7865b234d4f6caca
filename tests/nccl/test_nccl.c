/*
 * test_nccl.c - libweft_nccl's refusals that need no GPU: calls outside
 * tasks, bad arguments, and every call on a runtime of the host backend,
 * each with its code and a message that names the cause. The collectives
 * themselves are tested on a GPU (test_nccl_gpu.c).
 *
 * cmocka's assertions must not run inside tasks (they jump back to the
 * test's thread): a task records each result and its message, and the
 * test checks them after the join.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "weft.h"
#include "weft/nccl.h"
#include "weft_test.h"

/* A result and the last-error message that came with it. */
typedef struct outcome {
    int rc;
    char msg[256];
} outcome;

static void record(outcome *o, int rc)
{
    o->rc = rc;
    snprintf(o->msg, sizeof o->msg, "%s", rc ? weft_last_error() : "");
}

/* o must be want, its message containing each of the words given. */
#define check_outcome(o, want, ...) check_outcome_at((o), (want), #o, __VA_ARGS__, (char *)NULL)

static void check_outcome_at(const outcome *o, int want, const char *what, ...)
{
    va_list ap;
    if (o->rc != want)
        fail_msg("%s returned %d (%s), expected %d (%s); message: %s", what, o->rc,
                 weft_strerror(o->rc), want, weft_strerror(want), o->msg);
    va_start(ap, what);
    for (const char *word; (word = va_arg(ap, const char *));)
        if (!strstr(o->msg, word))
            fail_msg("%s: message \"%s\" lacks \"%s\"", what, o->msg, word);
    va_end(ap);
}

static weft_runtime *host_runtime(void)
{
    weft_config cfg = WEFT_CONFIG_INIT;
    weft_runtime *rt = NULL;
    cfg.workers = 2;
    cfg.backend = WEFT_BACKEND_HOST;
    assert_int_equal(weft_runtime_create(&rt, &cfg), WEFT_OK);
    assert_string_equal(weft_backend_name(rt), "host");
    return rt;
}

/* ---- outside tasks ------------------------------------------------------ */

static void test_task_only(void **state)
{
    (void)state;
    float a[4] = {0}, b[4] = {0};
    outcome o;
    record(&o, weft_nccl_all_reduce(NULL, a, b, 4, WEFT_DTYPE_F32, WEFT_NCCL_SUM));
    check_outcome(&o, WEFT_ENOTASK, "weft_nccl_all_reduce", "task only");
    record(&o, weft_nccl_all_gather(NULL, a, b, 4, WEFT_DTYPE_F32));
    check_outcome(&o, WEFT_ENOTASK, "weft_nccl_all_gather");
    record(&o, weft_nccl_reduce_scatter(NULL, a, b, 4, WEFT_DTYPE_F32, WEFT_NCCL_SUM));
    check_outcome(&o, WEFT_ENOTASK, "weft_nccl_reduce_scatter");
    record(&o, weft_nccl_broadcast(NULL, a, b, 4, WEFT_DTYPE_F32, 0));
    check_outcome(&o, WEFT_ENOTASK, "weft_nccl_broadcast");
    record(&o, weft_nccl_send(NULL, a, 4, WEFT_DTYPE_F32, 0));
    check_outcome(&o, WEFT_ENOTASK, "weft_nccl_send");
    record(&o, weft_nccl_recv(NULL, b, 4, WEFT_DTYPE_F32, 0));
    check_outcome(&o, WEFT_ENOTASK, "weft_nccl_recv");
    record(&o, weft_nccl_group_begin());
    check_outcome(&o, WEFT_ENOTASK, "weft_nccl_group_begin");
    record(&o, weft_nccl_group_end());
    check_outcome(&o, WEFT_ENOTASK, "weft_nccl_group_end");
    record(&o, weft_nccl_await(NULL, WEFT_FOREVER));
    check_outcome(&o, WEFT_ENOTASK, "weft_nccl_await");
}

/* The calls on handles and ids, which work anywhere. */
static void test_null_handles(void **state)
{
    (void)state;
    outcome o;
    int rank = -7;
    record(&o, weft_nccl_unique_id(NULL));
    check_outcome(&o, WEFT_EINVAL, "weft_nccl_unique_id", "id is NULL");
    record(&o, weft_nccl_comm_info(NULL, &rank, NULL, NULL));
    check_outcome(&o, WEFT_EINVAL, "weft_nccl_comm_info", "comm is NULL");
    assert_int_equal(rank, -7);
    record(&o, weft_nccl_comm_check(NULL));
    check_outcome(&o, WEFT_EINVAL, "weft_nccl_comm_check", "comm is NULL");
    record(&o, weft_nccl_comm_abort(NULL));
    check_outcome(&o, WEFT_EINVAL, "weft_nccl_comm_abort", "comm is NULL");
    assert_int_equal(weft_nccl_comm_destroy(NULL), WEFT_OK);
}

/* ---- communicators on the host backend --------------------------------- */

static void test_init_refusals(void **state)
{
    (void)state;
    weft_runtime *rt = host_runtime();
    weft_nccl_comm *poison = (weft_nccl_comm *)(uintptr_t)0xa7a7a7a7u;
    weft_nccl_comm *comms[2] = {poison, poison}, *comm = poison;
    unsigned devices[2] = {0, 1};
    weft_nccl_id id;
    memset(&id, 0x5a, sizeof id);
    outcome o;

    record(&o, weft_nccl_comm_init_all(rt, 0, devices, comms));
    check_outcome(&o, WEFT_EINVAL, "weft_nccl_comm_init_all", "ndev is 0");
    record(&o, weft_nccl_comm_init_all(rt, 2, NULL, comms));
    check_outcome(&o, WEFT_EINVAL, "devices is NULL");
    record(&o, weft_nccl_comm_init_all(rt, 2, devices, NULL));
    check_outcome(&o, WEFT_EINVAL, "comms is NULL");
    record(&o, weft_nccl_comm_init_all(rt, 2, devices, comms));
    check_outcome(&o, WEFT_EINVAL, "weft_nccl_comm_init_all", "NCCL needs the CUDA backend",
                  "'host'");
    record(&o, weft_nccl_comm_init_all(NULL, 1, devices, comms));
    check_outcome(&o, WEFT_EINVAL, "NCCL needs the CUDA backend");
    assert_ptr_equal(comms[0], poison);
    assert_ptr_equal(comms[1], poison);

    record(&o, weft_nccl_comm_init_rank(rt, 0, 2, NULL, 0, WEFT_FOREVER, &comm));
    check_outcome(&o, WEFT_EINVAL, "weft_nccl_comm_init_rank", "id is NULL");
    record(&o, weft_nccl_comm_init_rank(rt, 0, 2, &id, 0, WEFT_FOREVER, NULL));
    check_outcome(&o, WEFT_EINVAL, "comm is NULL");
    record(&o, weft_nccl_comm_init_rank(rt, 0, 2, &id, 2, WEFT_FOREVER, &comm));
    check_outcome(&o, WEFT_EINVAL, "rank 2 of 2");
    record(&o, weft_nccl_comm_init_rank(rt, 0, 2, &id, -1, WEFT_FOREVER, &comm));
    check_outcome(&o, WEFT_EINVAL, "rank -1 of 2");
    record(&o, weft_nccl_comm_init_rank(rt, 0, 0, &id, 0, WEFT_FOREVER, &comm));
    check_outcome(&o, WEFT_EINVAL, "rank 0 of 0");
    record(&o, weft_nccl_comm_init_rank(rt, 0, 2, &id, 1, WEFT_FOREVER, &comm));
    check_outcome(&o, WEFT_EINVAL, "NCCL needs the CUDA backend");
    assert_ptr_equal(comm, poison);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);
}

/* ---- collectives from a host task -------------------------------------- */

enum { N_OUT = 24 };

/* Each call with one argument wrong, then with valid arguments (which the
 * host backend refuses), in one task. */
static void *calls_task(void *arg)
{
    outcome *out = arg;
    float a[8] = {0}, b[8] = {0};
    int k = 0;
    /* arguments checked before the backend */
    record(&out[k++], weft_nccl_all_reduce(NULL, NULL, b, 8, WEFT_DTYPE_F32, WEFT_NCCL_SUM));
    record(&out[k++], weft_nccl_all_reduce(NULL, a, NULL, 8, WEFT_DTYPE_F32, WEFT_NCCL_SUM));
    record(&out[k++], weft_nccl_all_reduce(NULL, a, b, 8, (weft_dtype)99, WEFT_NCCL_SUM));
    record(&out[k++], weft_nccl_all_reduce(NULL, a, b, 8, WEFT_DTYPE_F32, (weft_nccl_op)5));
    record(&out[k++], weft_nccl_all_gather(NULL, a, NULL, 8, WEFT_DTYPE_BF16));
    record(&out[k++], weft_nccl_reduce_scatter(NULL, a, b, 8, (weft_dtype)-1, WEFT_NCCL_MAX));
    record(&out[k++], weft_nccl_reduce_scatter(NULL, a, b, 8, WEFT_DTYPE_I32, (weft_nccl_op)-1));
    record(&out[k++], weft_nccl_broadcast(NULL, a, NULL, 8, WEFT_DTYPE_F16, 0));
    record(&out[k++], weft_nccl_send(NULL, NULL, 8, WEFT_DTYPE_I8, 0));
    record(&out[k++], weft_nccl_recv(NULL, NULL, 8, WEFT_DTYPE_I8, 0));
    record(&out[k++], weft_nccl_recv(NULL, b, 8, (weft_dtype)7, 0));
    /* valid arguments: the host backend */
    record(&out[k++], weft_nccl_all_reduce(NULL, a, b, 8, WEFT_DTYPE_F32, WEFT_NCCL_AVG));
    record(&out[k++], weft_nccl_all_gather(NULL, a, b, 8, WEFT_DTYPE_F8_E4M3));
    record(&out[k++], weft_nccl_reduce_scatter(NULL, a, b, 8, WEFT_DTYPE_F8_E5M2, WEFT_NCCL_MIN));
    record(&out[k++], weft_nccl_broadcast(NULL, NULL, b, 8, WEFT_DTYPE_I32, 0));
    record(&out[k++], weft_nccl_send(NULL, a, 8, WEFT_DTYPE_I8, 0));
    record(&out[k++], weft_nccl_recv(NULL, b, 8, WEFT_DTYPE_I8, 0));
    record(&out[k++], weft_nccl_group_begin());
    record(&out[k++], weft_nccl_group_end());
    record(&out[k++], weft_nccl_await(NULL, WEFT_FOREVER));
    return NULL;
}

static void test_host_task_refusals(void **state)
{
    (void)state;
    weft_runtime *rt = host_runtime();
    outcome out[N_OUT];
    memset(out, 0, sizeof out);
    for (int i = 0; i < N_OUT; i++)
        out[i].rc = 12345; /* not a result: a call not made shows */
    weft_task *t = NULL;
    assert_int_equal(weft_spawn(rt, &t, calls_task, out, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(weft_runtime_destroy(rt), WEFT_OK);

    int k = 0;
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_all_reduce", "send is NULL");
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_all_reduce", "recv is NULL");
    check_outcome(&out[k++], WEFT_EINVAL, "dtype 99");
    check_outcome(&out[k++], WEFT_EINVAL, "op 5");
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_all_gather", "recv is NULL");
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_reduce_scatter", "dtype -1");
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_reduce_scatter", "op -1");
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_broadcast", "recv is NULL");
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_send", "buf is NULL");
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_recv", "buf is NULL");
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_recv", "dtype 7");
    static const char *const calls[] = {"weft_nccl_all_reduce",     "weft_nccl_all_gather",
                                        "weft_nccl_reduce_scatter", "weft_nccl_broadcast",
                                        "weft_nccl_send",           "weft_nccl_recv",
                                        "weft_nccl_group_begin"};
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++)
        check_outcome(&out[k++], WEFT_EINVAL, calls[i], "NCCL needs the CUDA backend", "'host'");
    check_outcome(&out[k++], WEFT_ESTATE, "weft_nccl_group_end", "no group is open");
    check_outcome(&out[k++], WEFT_EINVAL, "weft_nccl_await", "comm is NULL");
    assert_true(k <= N_OUT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_task_only),
        cmocka_unit_test(test_null_handles),
        cmocka_unit_test(test_init_refusals),
        cmocka_unit_test(test_host_task_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
