/*
 * test_task_device.c - weft_task_device on the host backend: a task learns
 * its device as WEFT_DEVICE(i) (placing itself first when it has no
 * stream yet), a task spawned with that device reports the same one, and
 * the call is refused outside a task and without a place to write to.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "weft.h"

typedef struct probe {
    weft_runtime *rt;
    unsigned device, child_device;
    int rc, child_rc, null_rc;
} probe;

static void *child(void *arg)
{
    probe *p = arg;
    p->child_rc = weft_task_device(&p->child_device);
    return NULL;
}

static void *parent(void *arg)
{
    probe *p = arg;
    p->null_rc = weft_task_device(NULL);
    p->rc = weft_task_device(&p->device);
    if (p->rc != WEFT_OK)
        return NULL;
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.device = p->device;
    weft_task *t;
    if (weft_spawn(p->rt, &t, child, p, &opts) != WEFT_OK || weft_join(t, NULL) != WEFT_OK)
        p->child_rc = -1000;
    return NULL;
}

static void test_a_task_and_its_child_share_a_device(void **state)
{
    (void)state;
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.backend = WEFT_BACKEND_HOST;
    cfg.workers = 2;
    probe p = {0};
    assert_int_equal(weft_runtime_create(&p.rt, &cfg), WEFT_OK);
    unsigned outside = 77;
    assert_int_equal(weft_task_device(&outside), WEFT_ENOTASK);
    assert_int_equal(outside, 77);
    weft_task *t;
    assert_int_equal(weft_spawn(p.rt, &t, parent, &p, NULL), WEFT_OK);
    assert_int_equal(weft_join(t, NULL), WEFT_OK);
    assert_int_equal(p.null_rc, WEFT_EINVAL);
    assert_int_equal(p.rc, WEFT_OK);
    assert_int_equal(p.device, WEFT_DEVICE(0)); /* the host backend's one device */
    assert_int_equal(p.child_rc, WEFT_OK);
    assert_int_equal(p.child_device, p.device);
    assert_int_equal(weft_runtime_destroy(p.rt), WEFT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_task_and_its_child_share_a_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
