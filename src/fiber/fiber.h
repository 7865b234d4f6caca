/*
 * fiber.h - stackful execution contexts and the stacks they run on.
 *
 * The bottom layer of weft. It knows nothing of tasks or threads: a fiber is
 * a saved register set plus the stack it runs on, and weft__fiber_switch
 * moves the calling thread from one fiber to another without a system call.
 *
 * Invariants:
 *  - A fiber's saved context lives on its own stack; `sp` is the only state
 *    kept outside it. Stacks never move (tasks hand pointers to stack buffers
 *    to asynchronous copies).
 *  - The switch saves exactly the callee-saved registers of the ABI and the
 *    floating-point control state (MXCSR and the x87 control word on x86-64,
 *    FPCR on aarch64).
 *  - A fiber may be resumed on a different thread than the one it left.
 *  - Every switch goes through weft__fiber_switch or weft__fiber_exit, which
 *    carry the ASan and TSan fiber annotations.
 */
#ifndef WEFT_FIBER_H
#define WEFT_FIBER_H

#include <stdbool.h>
#include <stddef.h>

/* ---- stacks ------------------------------------------------------------ */

typedef struct weft__stack {
    void *lo;                  /* lowest usable address */
    size_t size;               /* usable bytes, a multiple of the page size */
    void *map;                 /* the mapping this stack was carved from */
    size_t map_size;           /* 0 when the stack lives in a shared slab */
    bool guarded;              /* a PROT_NONE page sits right below lo */
    unsigned valgrind_id;      /* valgrind stack registration */
    struct weft__stack *next;  /* free-list link while pooled */
} weft__stack;

/* A small per-thread cache of default-size stacks; owned by its caller,
 * used without locks, zero-initialized. */
typedef struct weft__stack_cache {
    weft__stack *head;
    unsigned count;
} weft__stack_cache;

typedef struct weft__stack_pool weft__stack_pool;

/* Create a pool handing out stacks of default_size bytes (rounded up to
 * pages). Returns 0 or -ENOMEM. */
int weft__stack_pool_create(weft__stack_pool **pool, size_t default_size);

/* Unmap every stack the pool owns. All stacks must have been put back. */
void weft__stack_pool_destroy(weft__stack_pool *pool);

/* Take a stack of at least size bytes (0: the pool's default). cache may be
 * NULL. Thread-safe. Returns 0 or -ENOMEM. */
int weft__stack_get(weft__stack_pool *pool, weft__stack_cache *cache,
                    size_t size, weft__stack **out);

/* Give a stack back. cache may be NULL. Thread-safe. */
void weft__stack_put(weft__stack_pool *pool, weft__stack_cache *cache,
                     weft__stack *stack);

/* Return every stack held in cache to the pool. */
void weft__stack_cache_drain(weft__stack_pool *pool, weft__stack_cache *cache);

/* ---- fibers ------------------------------------------------------------ */

typedef struct weft__fiber {
    void *sp;                  /* saved stack pointer while switched out */
    const weft__stack *stack;  /* NULL for a thread's own context */
    const char *label;         /* named in the stack overflow report */
    void *asan_fake_stack;     /* ASan's fake-stack handle across a switch */
    const void *asan_lo;       /* stack bounds handed to ASan */
    size_t asan_size;
    void *tsan_fiber;          /* TSan's fiber handle */
} weft__fiber;

/* Make f stand for the calling thread's own context (the side that runs
 * the scheduler). Call once per thread, before its first switch. */
void weft__fiber_init_thread(weft__fiber *f);

/* Prepare f to run entry(arg) on stack at the next switch into it. entry
 * must never return: it ends with weft__fiber_exit. */
void weft__fiber_init(weft__fiber *f, const weft__stack *stack,
                      void (*entry)(void *arg), void *arg);

/* Save the current context into from and resume to. Returns when another
 * fiber switches back into from, possibly on another thread. */
void weft__fiber_switch(weft__fiber *from, weft__fiber *to);

/* Leave from for good and resume to. from's stack may be reused as soon as
 * to runs. */
_Noreturn void weft__fiber_exit(weft__fiber *from, weft__fiber *to);

/* Release what a fiber that has exited (or never ran) still holds for the
 * sanitizers. Call from another fiber. */
void weft__fiber_release(weft__fiber *f);

/* ---- stack overflow reporting ------------------------------------------ */

/* Install, once per process, the SIGSEGV handler that reports a fault in a
 * fiber's guard page as "weft: task stack overflow ..." and then lets the
 * process die of the signal. Faults elsewhere go to the previous handler.
 * Returns 0 or a negative errno. Thread-safe and idempotent. */
int weft__overflow_install(void);

/* Give the calling thread an alternate signal stack so the handler can run
 * when a fiber's stack is exhausted. Pair with weft__overflow_thread_fini. */
int weft__overflow_thread_init(void);
void weft__overflow_thread_fini(void);

#endif
