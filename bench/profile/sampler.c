/*
 * A sampling CPU profiler, loaded into any program with LD_PRELOAD.
 *
 *   WEFT_SAMPLE=FILE [WEFT_SAMPLE_US=N] [WEFT_SAMPLE_DEPTH=D] \
 *       LD_PRELOAD=libweft_sampler.so PROGRAM ...
 *   bench/profile/sample_report.py FILE
 *
 * Every N µs of the process's CPU time (default 1000; the kernel rounds to
 * its tick), SIGPROF stops the thread that is running and the handler keeps
 * its call stack: the interrupted address and the return addresses that the
 * unwinder finds (at most D - 1 of them; 1 keeps the address alone). At exit
 * the samples are written to FILE with a copy of /proc/self/maps, and
 * sample_report.py names the addresses with nm. Every process that loads the
 * sampler writes FILE, so give it to the program, not to a wrapper:
 * `timeout 60 env LD_PRELOAD=... PROGRAM`.
 *
 * It is for machines without perf (the H200 host among them): where a job's
 * CPU time goes (the runtime, the CUDA driver, the kernel's syscalls, the
 * host work) is then measured from inside the process.
 *
 * Code whose unwind tables are wrong (weft's context switch had such a
 * spot) can send the unwinder to read memory that is not there. A SIGSEGV or SIGBUS while this
 * thread unwinds returns to the sample, which keeps the interrupted address
 * alone; any other goes to the handler that was there before.
 */
#include <errno.h>
#include <execinfo.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

enum { SAMPLE_DEPTH = 24, SAMPLE_CAPACITY = 1 << 20 };

struct sample {
    uint64_t ns; /* CLOCK_MONOTONIC */
    uint32_t tid;
    uint32_t depth;
    uintptr_t pc[SAMPLE_DEPTH]; /* [0] the interrupted address, then callers */
};

static struct sample *samples;
static atomic_size_t sample_count;
static const char *sample_path;
static int sample_depth = SAMPLE_DEPTH; /* WEFT_SAMPLE_DEPTH: 1 for no unwinding */

/* Where a fault in this thread's unwinding returns to; set while it unwinds.
 * Initial-exec: a signal handler must not allocate thread-local storage. */
static __thread __attribute__((tls_model("initial-exec"))) sigjmp_buf *unwind_escape;
static struct sigaction fault_before[2]; /* SIGSEGV, SIGBUS */
static atomic_size_t unwinds_abandoned;

static uintptr_t interrupted_pc(const ucontext_t *uc)
{
#if defined(__x86_64__)
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)uc->uc_mcontext.pc;
#else
#error "sampler: unsupported architecture"
#endif
}

static void on_sigprof(int sig, siginfo_t *info, void *context)
{
    (void)sig;
    (void)info;
    int saved_errno = errno;
    size_t i = atomic_fetch_add_explicit(&sample_count, 1, memory_order_relaxed);
    if (i < SAMPLE_CAPACITY) {
        struct sample *s = &samples[i];
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s->ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
        s->tid = (uint32_t)syscall(SYS_gettid);
        s->pc[0] = interrupted_pc((const ucontext_t *)context);

        /* The unwinder starts in this handler and passes the signal frame;
         * keep what follows the interrupted address. */
        void *frames[SAMPLE_DEPTH + 4];
        volatile int n = 0;
        sigjmp_buf escape;
        if (sample_depth > 1 && sigsetjmp(escape, 1) == 0) {
            unwind_escape = &escape;
            n = backtrace(frames, SAMPLE_DEPTH + 4);
        }
        unwind_escape = NULL;
        int k = 0;
        while (k < n && (uintptr_t)frames[k] != s->pc[0])
            k++;
        uint32_t depth = 1;
        if (k < n)
            for (k++; k < n && depth < (uint32_t)sample_depth; k++)
                s->pc[depth++] = (uintptr_t)frames[k];
        s->depth = depth;
    }
    errno = saved_errno;
}

static void on_fault(int sig, siginfo_t *info, void *context)
{
    if (unwind_escape) {
        atomic_fetch_add_explicit(&unwinds_abandoned, 1, memory_order_relaxed);
        siglongjmp(*unwind_escape, 1);
    }
    /* Not ours: as if this handler had never been there. A fault returned
     * from repeats, now with the handler before. */
    struct sigaction *before = &fault_before[sig == SIGBUS];
    if (before->sa_flags & SA_SIGINFO)
        before->sa_sigaction(sig, info, context);
    else if (before->sa_handler != SIG_IGN && before->sa_handler != SIG_DFL)
        before->sa_handler(sig);
    else {
        sigaction(sig, before, NULL);
        if (info->si_code <= 0) /* sent, not a fault: it will not repeat */
            raise(sig);
    }
}

static void copy_file(const char *from, FILE *to)
{
    FILE *in = fopen(from, "r");
    if (!in)
        return;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, n, to);
    fclose(in);
}

/* Text, one sample a line: "s <ns> <tid> <pc> <pc> ...", then how many
 * unwinds a fault cut short ("faults <n>"), then the maps. */
static void write_samples(void)
{
    struct itimerval off;
    memset(&off, 0, sizeof off);
    setitimer(ITIMER_PROF, &off, NULL);
    signal(SIGPROF, SIG_IGN);

    FILE *f = fopen(sample_path, "w");
    if (!f) {
        fprintf(stderr, "sampler: cannot write %s: %s\n", sample_path, strerror(errno));
        return;
    }
    size_t n = atomic_load(&sample_count);
    if (n > SAMPLE_CAPACITY) {
        fprintf(stderr, "sampler: %zu samples, kept the first %d\n", n, SAMPLE_CAPACITY);
        n = SAMPLE_CAPACITY;
    }
    for (size_t i = 0; i < n; i++) {
        const struct sample *s = &samples[i];
        fprintf(f, "s %llu %u", (unsigned long long)s->ns, s->tid);
        for (uint32_t d = 0; d < s->depth; d++)
            fprintf(f, " %lx", (unsigned long)s->pc[d]);
        fputc('\n', f);
    }
    fprintf(f, "faults %zu\n", atomic_load(&unwinds_abandoned));
    fputs("maps\n", f);
    copy_file("/proc/self/maps", f);
    fclose(f);
    fprintf(stderr, "sampler: %zu samples in %s\n", n, sample_path);
}

__attribute__((constructor)) static void sampler_start(void)
{
    sample_path = getenv("WEFT_SAMPLE");
    if (!sample_path || !*sample_path)
        return;
    long period_us = 1000;
    const char *us = getenv("WEFT_SAMPLE_US");
    if (us && atol(us) > 0)
        period_us = atol(us);
    const char *depth = getenv("WEFT_SAMPLE_DEPTH");
    if (depth && atoi(depth) > 0 && atoi(depth) < SAMPLE_DEPTH)
        sample_depth = atoi(depth);

    samples = mmap(NULL, sizeof(struct sample) * SAMPLE_CAPACITY, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (samples == MAP_FAILED) {
        fprintf(stderr, "sampler: no memory for samples\n");
        return;
    }
    /* The first backtrace loads the unwinder: never in the handler. */
    void *warm[4];
    backtrace(warm, 4);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigprof;
    /* On the thread's alternate stack where it has one: a task's stack
     * may be too small for the unwinder on top of what it holds. */
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPROF, &sa, NULL);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, &fault_before[0]);
    sigaction(SIGBUS, &sa, &fault_before[1]);
    struct itimerval every = {{period_us / 1000000, period_us % 1000000},
                              {period_us / 1000000, period_us % 1000000}};
    setitimer(ITIMER_PROF, &every, NULL);
    atexit(write_samples);
}
