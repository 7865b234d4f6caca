/*
 * version.c - the version of the library itself, as opposed to the header a
 * program was compiled with: the string is built from the macros when the
 * library is compiled, so a program linked against one libweft.so and run
 * with another sees the version it actually runs.
 */
#include "weft.h"

#define STR_(x) #x
#define STR(x) STR_(x)

const char *weft_version(void)
{
    return STR(WEFT_VERSION_MAJOR) "." STR(WEFT_VERSION_MINOR) "." STR(WEFT_VERSION_PATCH);
}
