/*
 * test_version.c - the three places that state weft's version agree: the
 * header's WEFT_VERSION_* macros, the string weft_version() returns, and
 * CMake's project(VERSION), which the build passes in as
 * WEFT_PROJECT_VERSION (the configure step already refuses a header that
 * disagrees with it; this checks what the compiled library says).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "weft.h"

static void version_string_is_the_header_macros(void **state)
{
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR,
             WEFT_VERSION_PATCH);
    assert_string_equal(weft_version(), want);
}

static void version_string_is_the_cmake_project_version(void **state)
{
    (void)state;
    assert_string_equal(weft_version(), WEFT_PROJECT_VERSION);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version_string_is_the_header_macros),
        cmocka_unit_test(version_string_is_the_cmake_project_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
