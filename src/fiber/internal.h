/*
 * internal.h - what the files of the fiber layer share with each other and
 * with its tests, and nothing else includes.
 *
 * The assembly routines below are the only code that knows the layout of a
 * saved context; C code treats a saved `sp` as opaque.
 */
#ifndef WEFT_FIBER_INTERNAL_H
#define WEFT_FIBER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"

/* ---- assembly (fiber_x86_64.S, fiber_aarch64.S) ------------------------ */

/* Build the first frame of a context below top (16-byte aligned by the
 * callee) so that the first swap into the returned sp calls entry(arg,
 * transfer) - entry(arg) for a function of one argument. entry is typed as
 * C's generic function pointer since the call is made from assembly. The
 * new context starts with the floating-point control state of the caller. */
void *weft__fiber_make(void *top, void (*entry)(void), void *arg);

/* Save the callee-saved state on the current stack, store sp in *save_sp,
 * load to_sp and restore from it. Returns, in the context being resumed,
 * the transfer value of whoever switched into it. */
void *weft__fiber_swap(void **save_sp, void *to_sp, void *transfer);

/* Like weft__fiber_swap without saving anything: the current context is
 * abandoned. */
_Noreturn void weft__fiber_jump(void *to_sp, void *transfer);

/* ---- fiber.c ----------------------------------------------------------- */

/* The fiber the calling thread runs now, as last set by a switch (or by
 * weft__fiber_init_thread); NULL on a thread that never switched. Safe to
 * call from a signal handler. */
const weft__fiber *weft__fiber_running(void);

/* ---- overflow.c -------------------------------------------------------- */

/* Write the stack overflow report for f to stderr with write(2) alone (it
 * runs in a signal handler). fault is the faulting address, or NULL when
 * the canary of an unguarded stack was found overwritten. */
void weft__overflow_report(const weft__fiber *f, const void *fault);

/* ---- stack.c ----------------------------------------------------------- */

/* The word at the low end of every unguarded stack. A fiber that overran
 * its stack has overwritten it (or the stack below) by the time it switches
 * out. */
#define WEFT__STACK_CANARY ((uint64_t)0x5745465421535431u) /* "WEFT!ST1" */

/* Default-size stacks a weft__stack_cache holds before giving back to the
 * pool. */
#define WEFT__STACK_CACHE_MAX 16u

/* Sizes other than its default that a pool keeps stacks of at once. */
#define WEFT__STACK_SIZE_CLASSES 8u

/* Test hook: set the process-wide number of guarded stacks that may exist at
 * once and return the previous value. */
size_t weft__stack_guard_budget_set(size_t stacks);

#endif
