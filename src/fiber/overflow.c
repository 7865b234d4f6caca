/*
 * overflow.c - turns a fiber running off the end of its stack into a
 * message that names the task and says what to change, then lets the
 * process die of the signal as it would have.
 *
 * A fault in a guard page arrives as SIGSEGV with the stack exhausted, so
 * the handler runs on an alternate signal stack that each thread sets up
 * with weft__overflow_thread_init. It asks fiber.c which fiber the thread
 * was running and calls the fault an overflow when the address lies in
 * that fiber's guard page, when the stack pointer itself has left the
 * fiber's stack (a frame that jumped over the guard, an unguarded stack
 * that ran down its slab), or when the fiber's stack is unguarded and its
 * canary is broken. Anything else goes to the handler that was there
 * before.
 *
 * Invariants:
 *  - The handler and weft__overflow_report use only async-signal-safe
 *    calls (write, sigaction, raise) and no locks; errno is preserved.
 *  - After reporting, the handler restores SIG_DFL and returns: the faulting
 *    instruction runs again and the process dies of SIGSEGV, with a core
 *    dump where enabled, exactly as without weft.
 *  - A thread's alternate stack is ours to unmap only if we installed it;
 *    one already in place (the application's, or ASan's) is left alone.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "fiber/fiber.h"
#include "fiber/internal.h"

#define ALTSTACK_SIZE (64u * 1024)
#define ALTSTACK_KEEP (32u * 1024) /* an existing alternate stack this big will do */
#define WILD_REACH (1u << 20)      /* how far below its mapping a lost sp may be */

static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_rc;
static struct sigaction prev_action;

/* ---- the report, built without malloc or stdio ------------------------- */

typedef struct msg {
    char buf[512];
    size_t len;
} msg;

static void put_str(msg *m, const char *s, size_t max)
{
    for (size_t i = 0; s[i] != '\0' && i < max && m->len < sizeof m->buf; i++)
        m->buf[m->len++] = s[i];
}

static void put_uint(msg *m, uintmax_t v, unsigned base)
{
    char digits[32];
    size_t n = 0;

    if (base == 16)
        put_str(m, "0x", 2);
    do {
        digits[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v != 0);
    while (n > 0 && m->len < sizeof m->buf)
        m->buf[m->len++] = digits[--n];
}

static void write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        p += n;
        len -= (size_t)n;
    }
}

void weft__overflow_report(const weft__fiber *f, const void *fault)
{
    const weft__stack *s = f->stack;
    int saved_errno = errno;
    msg m = {.len = 0};

    put_str(&m, "weft: task stack overflow in task \"", SIZE_MAX);
    put_str(&m, f->label != NULL ? f->label : "?", 128);
    put_str(&m, "\": stack of ", SIZE_MAX);
    put_uint(&m, s->size / 1024, 10);
    put_str(&m, " KiB at ", SIZE_MAX);
    put_uint(&m, (uintptr_t)s->lo, 16);
    put_str(&m, "-", 1);
    put_uint(&m, (uintptr_t)s->lo + s->size, 16);
    if (fault != NULL) {
        put_str(&m, " exhausted (fault at ", SIZE_MAX);
        put_uint(&m, (uintptr_t)fault, 16);
        put_str(&m, ")", 1);
    } else {
        put_str(&m,
                " exhausted (its canary was overwritten: the stack has no guard page, "
                "raise vm.max_map_count for guard pages on more tasks)",
                SIZE_MAX);
    }
    put_str(&m, "; raise weft_config.stack_size or weft_task_opts.stack_size\n", SIZE_MAX);
    write_all(STDERR_FILENO, m.buf, m.len);
    errno = saved_errno;
}

/* ---- the handler ------------------------------------------------------- */

static uintptr_t fault_sp(const void *uctx)
{
    const ucontext_t *uc = uctx;

#if defined(__x86_64__)
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    return (uintptr_t)uc->uc_mcontext.sp;
#else
    (void)uc;
    return UINTPTR_MAX;
#endif
}

/* Not instrumented: under ASan the low end of an overrun stack is covered
 * by the poisoned redzones of the frames that overran it. */
__attribute__((no_sanitize_address)) static uint64_t canary_of(const weft__stack *s)
{
    return *(const volatile uint64_t *)s->lo;
}

static bool is_overflow(const weft__fiber *f, uintptr_t addr, uintptr_t sp)
{
    const weft__stack *s = f->stack;
    uintptr_t lo, map, floor;

    if (s == NULL)
        return false; /* a thread's own stack: not ours to judge */
    lo = (uintptr_t)s->lo;
    map = (uintptr_t)s->map;
    /* The fault is in the guard page. */
    if (s->guarded && addr >= map && addr < lo)
        return true;
    /* The stack pointer itself has left the stack downwards, and not by
     * much more than the mapping holds: a frame jumped over the guard page,
     * or an unguarded stack ran down through the slots below it in its
     * slab. Nothing but an overflow puts the stack pointer there. */
    floor = map > WILD_REACH ? map - WILD_REACH : 0;
    if (sp < lo && sp >= floor && addr < lo)
        return true;
    /* Whatever faulted, an unguarded stack with a broken canary has
     * overflowed. */
    return !s->guarded && canary_of(s) != WEFT__STACK_CANARY;
}

/* Let sig take its default action: at once for a fault (which repeats when
 * the handler returns), by re-raising for a signal someone sent. */
static void die_by_default(int sig, const siginfo_t *info)
{
    struct sigaction dfl;

    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    if (info->si_code <= 0)
        raise(sig);
}

static void chain(int sig, siginfo_t *info, void *uctx)
{
    if (prev_action.sa_flags & SA_SIGINFO) {
        prev_action.sa_sigaction(sig, info, uctx);
    } else if (prev_action.sa_handler == SIG_IGN) {
        /* A real fault cannot be ignored; one that was sent can. */
        if (info->si_code > 0)
            die_by_default(sig, info);
    } else if (prev_action.sa_handler == SIG_DFL) {
        die_by_default(sig, info);
    } else {
        prev_action.sa_handler(sig);
    }
}

static void on_segv(int sig, siginfo_t *info, void *uctx)
{
    const weft__fiber *f = weft__fiber_running();
    int saved_errno = errno;

    if (f != NULL && info->si_code > 0 &&
        is_overflow(f, (uintptr_t)info->si_addr, fault_sp(uctx))) {
        weft__overflow_report(f, info->si_addr);
        die_by_default(sig, info);
    } else {
        chain(sig, info, uctx);
    }
    errno = saved_errno;
}

static void install(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &prev_action) != 0)
        install_rc = -errno;
}

int weft__overflow_install(void)
{
    pthread_once(&install_once, install);
    return install_rc;
}

/* ---- alternate signal stacks ------------------------------------------- */

/* The mapping this thread's alternate stack lives in, if we made it. Only
 * the thread's own context touches it (never a fiber, which could migrate),
 * but it still goes through these like every thread-local in this layer. */
static _Thread_local void *altstack_map;

__attribute__((noinline)) static void *altstack_get(void)
{
    return altstack_map;
}

__attribute__((noinline)) static void altstack_set(void *map)
{
    altstack_map = map;
}

int weft__overflow_thread_init(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    stack_t old, ss;
    char *map;
    int rc;

    if (sigaltstack(NULL, &old) != 0)
        return -errno;
    if (!(old.ss_flags & SS_DISABLE) && old.ss_size >= ALTSTACK_KEEP)
        return 0;
    /* A guard page below, so that a handler overrunning the alternate
     * stack faults instead of scribbling over whatever lies beneath. */
    map = mmap(NULL, page + ALTSTACK_SIZE, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (map == MAP_FAILED)
        return -errno;
    if (mprotect(map, page, PROT_NONE) != 0)
        goto fail;
    memset(&ss, 0, sizeof ss);
    ss.ss_sp = map + page;
    ss.ss_size = ALTSTACK_SIZE;
    if (sigaltstack(&ss, NULL) != 0)
        goto fail;
    altstack_set(map);
    return 0;

fail:
    rc = -errno;
    munmap(map, page + ALTSTACK_SIZE);
    return rc;
}

void weft__overflow_thread_fini(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *map = altstack_get();
    stack_t cur, off;

    if (map == NULL)
        return;
    if (sigaltstack(NULL, &cur) == 0 && cur.ss_sp == map + page) {
        memset(&off, 0, sizeof off);
        off.ss_flags = SS_DISABLE;
        sigaltstack(&off, NULL);
    }
    munmap(map, page + ALTSTACK_SIZE);
    altstack_set(NULL);
}
