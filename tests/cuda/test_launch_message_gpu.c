/*
 * test_launch_message_gpu.c - what a launch of a kernel weft's CUDA runtime
 * does not know says.
 *
 * The failure is built by weft__cuda_launch_fail from the CUDA error alone,
 * so it is checked here on the error code, with a device record that no GPU
 * backs: cudaErrorInvalidResourceHandle (CUDA 13) and
 * cudaErrorInvalidDeviceFunction (earlier runtimes) name the likely cause (a program
 * built with nvcc's default -cudart static, linked with libweft.so) and the
 * fix, whole within the message buffer, as WEFT_EINVAL, and does not mark
 * the device failed; another error keeps CUDA's own wording. Needs no GPU.
 * foreign_cudart.cu makes the same failure happen for real.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "cuda/backend.h"
#include "weft.h"

/* CUDA 13 reports such a launch as an invalid resource handle, earlier
 * runtimes as an invalid device function: both name the cause. */
static void test_unknown_kernel_names_cause_and_fix(void **state)
{
    static weft__cuda_device dev; /* zero: healthy */
    const cudaError_t codes[] = {cudaErrorInvalidResourceHandle, cudaErrorInvalidDeviceFunction};

    (void)state;
    dev.ordinal = 15; /* two digits: the longest message a 16-GPU host gives */
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        char want[96];
        assert_int_equal(weft__cuda_launch_fail(&dev, codes[i]), WEFT_EINVAL);
        const char *msg = weft_last_error();
        snprintf(want, sizeof want, "cudaLaunchKernel: %s on GPU 15", cudaGetErrorName(codes[i]));
        assert_non_null(strstr(msg, want));
        assert_non_null(strstr(msg, "-cudart shared"));
        /* the whole advice fits: the message was not cut */
        size_t len = strlen(msg);
        assert_true(len >= strlen("libweft.a"));
        assert_string_equal(msg + len - strlen("libweft.a"), "libweft.a");
        assert_int_equal(atomic_load(&dev.failed), 0);
    }
}

static void test_other_errors_keep_cuda_wording(void **state)
{
    static weft__cuda_device dev;

    (void)state;
    assert_int_equal(weft__cuda_fail(&dev, "cudaMemcpyAsync", cudaErrorInvalidValue), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "cudaErrorInvalidValue"));
    assert_null(strstr(weft_last_error(), "-cudart"));
    /* a launch refused for another reason keeps CUDA's wording too */
    assert_int_equal(weft__cuda_launch_fail(&dev, cudaErrorInvalidConfiguration), WEFT_EINVAL);
    assert_non_null(strstr(weft_last_error(), "cudaErrorInvalidConfiguration"));
    assert_null(strstr(weft_last_error(), "-cudart"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_kernel_names_cause_and_fix),
        cmocka_unit_test(test_other_errors_keep_cuda_wording),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
