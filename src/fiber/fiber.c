/*
 * fiber.c - starting, switching and ending fibers, and telling the
 * sanitizers about it.
 *
 * The register work is in fiber_<isa>.S; this file adds what the assembly
 * cannot know: which fiber the thread runs now (for the stack overflow
 * handler), the canary check of unguarded stacks, and the ASan and TSan
 * fiber annotations, which compile to nothing in a normal build.
 *
 * Invariants:
 *  - f->sp is non-NULL exactly while f is switched out and resumable. It is
 *    cleared when f is resumed, so resuming a running or finished fiber
 *    trips an assertion instead of running two copies of it.
 *  - A fiber may leave one thread and come back on another inside
 *    weft__fiber_switch. Nothing after the swap in this file touches a
 *    _Thread_local: the compiler may have kept the address of the old
 *    thread's copy. `running` is set before the swap, through a function the
 *    compiler cannot inline or see through.
 *  - Under ASan every switch is bracketed by __sanitizer_start_switch_fiber
 *    and __sanitizer_finish_switch_fiber. The stack bounds of a thread's own
 *    context are not known up front; ASan reports them at the first finish
 *    after that context switched out, and the swap's transfer value says
 *    which context that was.
 *  - Under TSan each fiber with a stack owns a TSan fiber from init to
 *    release; a thread's own context uses the thread's.
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include "fiber/fiber.h"
#include "fiber/internal.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WEFT__ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define WEFT__TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(WEFT__ASAN)
#define WEFT__ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(WEFT__TSAN)
#define WEFT__TSAN 1
#endif

#if WEFT__ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if WEFT__TSAN
#include <sanitizer/tsan_interface.h>
#endif

/* A call the compiler must make every time: no inlining, no cloning, no
 * conclusions drawn from the body. */
#if defined(__clang__)
#define WEFT__OPAQUE __attribute__((noinline))
#else
#define WEFT__OPAQUE __attribute__((noinline, noipa))
#endif

/* initial-exec: the signal handler reads it, and a TLS access that may
 * allocate (the general-dynamic model's first touch) is not signal-safe. */
static _Thread_local const weft__fiber *running __attribute__((tls_model("initial-exec")));

WEFT__OPAQUE static void set_running(const weft__fiber *f)
{
    running = f;
}

WEFT__OPAQUE const weft__fiber *weft__fiber_running(void)
{
    return running;
}

/* An unguarded stack has no page to fault on; its canary is the only
 * witness of an overrun, and by now the memory below is already corrupt. */
static void check_stack(const weft__fiber *f)
{
    const weft__stack *s = f->stack;

    if (s != NULL && !s->guarded && *(const volatile uint64_t *)s->lo != WEFT__STACK_CANARY) {
        weft__overflow_report(f, NULL);
        abort();
    }
}

/* ---- sanitizer annotations -------------------------------------------- */

/* A macro, not a function: under TSan every instrumented function pushes a
 * frame on the current TSan fiber's shadow call stack on entry and pops one
 * on return. __tsan_switch_to_fiber inside a helper would pop from the
 * fiber being switched to, which underflows (clang does not always inline
 * even a static inline helper). Expanded in the frame of weft__fiber_switch,
 * that function's push lands on the fiber switching out and its pop comes
 * when that fiber is resumed, so each fiber's shadow stack stays balanced. */
#if WEFT__ASAN
#define SAN_SWITCH_ASAN(fake_stack_slot, to)                                                       \
    __sanitizer_start_switch_fiber((fake_stack_slot), (to)->asan_lo, (to)->asan_size)
#else
#define SAN_SWITCH_ASAN(fake_stack_slot, to) ((void)(fake_stack_slot), (void)(to))
#endif
#if WEFT__TSAN
#define SAN_SWITCH_TSAN(to) __tsan_switch_to_fiber((to)->tsan_fiber, 0)
#else
#define SAN_SWITCH_TSAN(to) ((void)(to))
#endif
#define SAN_START_SWITCH(fake_stack_slot, to)                                                      \
    do {                                                                                           \
        SAN_SWITCH_ASAN(fake_stack_slot, to);                                                      \
        SAN_SWITCH_TSAN(to);                                                                       \
    } while (0)

/* Runs first in the resumed context. prev is the context that switched
 * here, or NULL when it exited. */
static inline void san_finish_switch(void *fake_stack, weft__fiber *prev)
{
#if WEFT__ASAN
    const void *lo = NULL;
    size_t size = 0;

    __sanitizer_finish_switch_fiber(fake_stack, &lo, &size);
    /* Only a thread's own context has unknown bounds. It never migrates,
     * and it has just been suspended on this very thread, so nothing else
     * can be looking at it. */
    if (prev != NULL && prev->stack == NULL) {
        prev->asan_lo = lo;
        prev->asan_size = size;
    }
#else
    (void)fake_stack;
    (void)prev;
#endif
}

#if WEFT__ASAN
/* Under ASan the new fiber must finish the switch before running any user
 * code, so its first frame is this shim; the user's entry and arg wait at
 * the top of the fiber's stack. */
struct start_record {
    void (*entry)(void *arg);
    void *arg;
};

static void start_annotated(void *record, void *transfer)
{
    struct start_record *r = record;

    san_finish_switch(NULL, transfer);
    r->entry(r->arg);
    __builtin_trap(); /* entry must end with weft__fiber_exit */
}
#endif

/* ---- the contract ------------------------------------------------------ */

void weft__fiber_init_thread(weft__fiber *f)
{
    assert(f != NULL);
    *f = (weft__fiber){0};
#if WEFT__TSAN
    f->tsan_fiber = __tsan_get_current_fiber();
#endif
    set_running(f);
}

void weft__fiber_init(weft__fiber *f, const weft__stack *stack, void (*entry)(void *arg), void *arg)
{
    void (*first)(void) = (void (*)(void))entry;
    void *first_arg = arg;
    char *top;

    assert(f != NULL && stack != NULL && entry != NULL);
    *f = (weft__fiber){.stack = stack, .asan_lo = stack->lo, .asan_size = stack->size};
    top = (char *)stack->lo + stack->size;
#if WEFT__ASAN
    /* Frames of the stack's previous fiber ended without returning and
     * left their redzones poisoned. */
    __asan_unpoison_memory_region(stack->lo, stack->size);
    {
        struct start_record *r =
            (struct start_record *)(((uintptr_t)top - sizeof *r) & ~(uintptr_t)15);

        r->entry = entry;
        r->arg = arg;
        top = (char *)r;
        first = (void (*)(void))start_annotated;
        first_arg = r;
    }
#endif
#if WEFT__TSAN
    f->tsan_fiber = __tsan_create_fiber(0);
#endif
    f->sp = weft__fiber_make(top, first, first_arg);
}

void weft__fiber_switch(weft__fiber *from, weft__fiber *to)
{
    void *sp = to->sp;
    weft__fiber *prev;

    assert(from != to && sp != NULL);
    assert(weft__fiber_running() == from);
    check_stack(from);
    to->sp = NULL;
    set_running(to);
    SAN_START_SWITCH(&from->asan_fake_stack, to);
    prev = weft__fiber_swap(&from->sp, sp, from);
    /* Possibly on another thread now: no thread-locals below this line. */
    san_finish_switch(from->asan_fake_stack, prev);
}

_Noreturn void weft__fiber_exit(weft__fiber *from, weft__fiber *to)
{
    void *sp = to->sp;

    assert(from != to && sp != NULL);
    assert(weft__fiber_running() == from);
    check_stack(from);
    to->sp = NULL;
    set_running(to);
    /* A NULL fake-stack slot tells ASan this fiber is gone for good. */
    SAN_START_SWITCH(NULL, to);
    weft__fiber_jump(sp, NULL);
}

void weft__fiber_release(weft__fiber *f)
{
    assert(f != NULL);
#if WEFT__TSAN
    if (f->stack != NULL && f->tsan_fiber != NULL) {
        /* Newer TSan runtimes corrupt their trace state when a fiber that
         * was never current is destroyed; make it current for an instant.
         * No instrumented call in between, so no shadow-stack traffic. */
        if (f->sp != NULL) {
            void *self = __tsan_get_current_fiber();

            __tsan_switch_to_fiber(f->tsan_fiber, 0);
            __tsan_switch_to_fiber(self, 0);
        }
        __tsan_destroy_fiber(f->tsan_fiber);
    }
#endif
    f->tsan_fiber = NULL;
    f->asan_fake_stack = NULL;
    f->sp = NULL; /* a fiber that never ran can no longer be started */
}
