/*
 * test_switch.c - the context switch: values pass between fibers, the
 * callee-saved registers and the floating-point control state survive a
 * switch, a fiber resumes on another thread, ten thousand fibers live at
 * once (2000 under gcc's TSan, see MANY), and a switch costs what it should.
 *
 * Bodies that run on a fiber only record what they see; the checks run on
 * the thread's own context, where a failing cmocka assertion can unwind.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fiber/fiber.h"
#include "fiber/internal.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#endif

#define STACK_SIZE (256u * 1024)

/* A call the compiler must really make each time: the migration test reads
 * thread identity after a switch, and a cached answer would be the bug we
 * are looking for. */
#if defined(__clang__)
#define OPAQUE __attribute__((noinline))
#else
#define OPAQUE __attribute__((noinline, noipa))
#endif

static weft__stack_pool *pool;

static int setup_pool(void **state)
{
    (void)state;
    return weft__stack_pool_create(&pool, STACK_SIZE);
}

static int teardown_pool(void **state)
{
    (void)state;
    weft__stack_pool_destroy(pool);
    pool = NULL;
    return 0;
}

static weft__stack *stack_take(void)
{
    weft__stack *s = NULL;

    assert_int_equal(weft__stack_get(pool, NULL, 0, &s), 0);
    assert_non_null(s);
    return s;
}

/* ---- ping-pong ---------------------------------------------------------- */

typedef struct pingpong {
    weft__fiber main, fiber;
    long value;
    int rounds;
    bool done;
    const weft__fiber *running_inside;
} pingpong;

static void pingpong_body(void *arg)
{
    pingpong *p = arg;

    p->running_inside = weft__fiber_running();
    for (int i = 0; i < p->rounds; i++) {
        p->value = p->value * 2 + 1;
        weft__fiber_switch(&p->fiber, &p->main);
    }
    p->done = true;
    weft__fiber_exit(&p->fiber, &p->main);
}

static void test_pingpong_passes_values_both_ways(void **state)
{
    weft__stack *s = stack_take();
    pingpong p = {.rounds = 100};

    (void)state;
    weft__fiber_init_thread(&p.main);
    weft__fiber_init(&p.fiber, s, pingpong_body, &p);
    for (int i = 0; i < p.rounds; i++) {
        p.value = i;
        weft__fiber_switch(&p.main, &p.fiber);
        assert_int_equal(p.value, 2 * i + 1);
        assert_false(p.done);
        assert_ptr_equal(weft__fiber_running(), &p.main);
    }
    weft__fiber_switch(&p.main, &p.fiber);
    assert_true(p.done);
    assert_ptr_equal(p.running_inside, &p.fiber);
    assert_null(p.fiber.sp); /* exited: cannot be resumed */
    weft__fiber_release(&p.fiber);
    weft__stack_put(pool, NULL, s);
}

/* ---- callee-saved registers --------------------------------------------- */

/* regs_switch(from, to, seed, out) loads seed + i into the i-th callee-saved
 * register, calls weft__fiber_switch(from, to), and stores what those
 * registers hold once it returns into out[i]. Written in assembly because
 * C cannot pin values to registers across a call. */
void regs_switch(weft__fiber *from, weft__fiber *to, uint64_t seed, uint64_t *out);

#if defined(__x86_64__)
#define REGS_N 6 /* rbx rbp r12 r13 r14 r15 */
__asm__(".text\n"
        ".globl regs_switch\n"
        ".type regs_switch, @function\n"
        "regs_switch:\n"
        "  pushq %rbx\n  pushq %rbp\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  pushq %rcx\n" /* out; rsp is now 16-byte aligned for the call */
        "  movq %rdx, %rbx\n"
        "  leaq 1(%rdx), %rbp\n  leaq 2(%rdx), %r12\n  leaq 3(%rdx), %r13\n"
        "  leaq 4(%rdx), %r14\n  leaq 5(%rdx), %r15\n"
        "  call weft__fiber_switch@PLT\n"
        "  popq %rcx\n"
        "  movq %rbx, 0(%rcx)\n  movq %rbp, 8(%rcx)\n  movq %r12, 16(%rcx)\n"
        "  movq %r13, 24(%rcx)\n  movq %r14, 32(%rcx)\n  movq %r15, 40(%rcx)\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbp\n  popq %rbx\n"
        "  ret\n"
        ".size regs_switch, .-regs_switch\n");
#elif defined(__aarch64__)
#define REGS_N 19 /* x19-x29, d8-d15 */
__asm__(".text\n"
        ".globl regs_switch\n"
        ".type regs_switch, %function\n"
        "regs_switch:\n"
        "  stp x29, x30, [sp, #-176]!\n"
        "  stp x19, x20, [sp, #16]\n  stp x21, x22, [sp, #32]\n  stp x23, x24, [sp, #48]\n"
        "  stp x25, x26, [sp, #64]\n  stp x27, x28, [sp, #80]\n"
        "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n"
        "  stp d12, d13, [sp, #128]\n  stp d14, d15, [sp, #144]\n"
        "  str x3, [sp, #160]\n"
        "  mov x19, x2\n  add x20, x2, #1\n  add x21, x2, #2\n  add x22, x2, #3\n"
        "  add x23, x2, #4\n  add x24, x2, #5\n  add x25, x2, #6\n  add x26, x2, #7\n"
        "  add x27, x2, #8\n  add x28, x2, #9\n  add x29, x2, #10\n"
        "  add x9, x2, #11\n  fmov d8, x9\n  add x9, x2, #12\n  fmov d9, x9\n"
        "  add x9, x2, #13\n  fmov d10, x9\n  add x9, x2, #14\n  fmov d11, x9\n"
        "  add x9, x2, #15\n  fmov d12, x9\n  add x9, x2, #16\n  fmov d13, x9\n"
        "  add x9, x2, #17\n  fmov d14, x9\n  add x9, x2, #18\n  fmov d15, x9\n"
        "  bl weft__fiber_switch\n"
        "  ldr x3, [sp, #160]\n"
        "  stp x19, x20, [x3, #0]\n  stp x21, x22, [x3, #16]\n  stp x23, x24, [x3, #32]\n"
        "  stp x25, x26, [x3, #48]\n  stp x27, x28, [x3, #64]\n  str x29, [x3, #80]\n"
        "  fmov x9, d8\n  str x9, [x3, #88]\n  fmov x9, d9\n  str x9, [x3, #96]\n"
        "  fmov x9, d10\n  str x9, [x3, #104]\n  fmov x9, d11\n  str x9, [x3, #112]\n"
        "  fmov x9, d12\n  str x9, [x3, #120]\n  fmov x9, d13\n  str x9, [x3, #128]\n"
        "  fmov x9, d14\n  str x9, [x3, #136]\n  fmov x9, d15\n  str x9, [x3, #144]\n"
        "  ldp x19, x20, [sp, #16]\n  ldp x21, x22, [sp, #32]\n  ldp x23, x24, [sp, #48]\n"
        "  ldp x25, x26, [sp, #64]\n  ldp x27, x28, [sp, #80]\n"
        "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n"
        "  ldp d12, d13, [sp, #128]\n  ldp d14, d15, [sp, #144]\n"
        "  ldp x29, x30, [sp], #176\n"
        "  ret\n"
        ".size regs_switch, .-regs_switch\n");
#endif

#define SEED_A 0x1111000000000000u
#define SEED_A2 0x3333000000000000u
#define SEED_B 0x2222000000000000u

typedef struct regs {
    weft__fiber main, fiber;
    uint64_t main_seen[REGS_N], fiber_seen[REGS_N];
} regs;

static void regs_body(void *arg)
{
    regs *r = arg;

    regs_switch(&r->fiber, &r->main, SEED_B, r->fiber_seen);
    weft__fiber_exit(&r->fiber, &r->main);
}

static void test_callee_saved_registers_survive_switch(void **state)
{
    weft__stack *s = stack_take();
    regs r = {0};

    (void)state;
    weft__fiber_init_thread(&r.main);
    weft__fiber_init(&r.fiber, s, regs_body, &r);
    /* In: the fiber loads its own values and switches back. */
    regs_switch(&r.main, &r.fiber, SEED_A, r.main_seen);
    for (unsigned i = 0; i < REGS_N; i++)
        assert_int_equal(r.main_seen[i], SEED_A + i);
    /* And again: the fiber must find its values, we ours. */
    regs_switch(&r.main, &r.fiber, SEED_A2, r.main_seen);
    for (unsigned i = 0; i < REGS_N; i++) {
        assert_int_equal(r.fiber_seen[i], SEED_B + i);
        assert_int_equal(r.main_seen[i], SEED_A2 + i);
    }
    weft__fiber_release(&r.fiber);
    weft__stack_put(pool, NULL, s);
}

/* ---- floating-point control state --------------------------------------- */

enum { ROUND_NEAREST, ROUND_DOWN, ROUND_UP, ROUND_ZERO };

#if defined(__x86_64__)
/* MXCSR (status flags masked off) in the low half, x87 control word above. */
static uint64_t fpctl_get(void)
{
    uint32_t mxcsr;
    uint16_t cw;

    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    return (mxcsr & ~0x3fu) | (uint64_t)cw << 32;
}

static void fpctl_set(uint64_t v)
{
    uint32_t mxcsr = (uint32_t)v;
    uint16_t cw = (uint16_t)(v >> 32);

    __asm__ volatile("ldmxcsr %0" : : "m"(mxcsr));
    __asm__ volatile("fldcw %0" : : "m"(cw));
}

/* The same RC encoding in both: 0 nearest, 1 down, 2 up, 3 toward zero. */
static void round_set(int mode)
{
    uint64_t v = fpctl_get();
    uint32_t mxcsr = ((uint32_t)v & ~0x6000u) | (uint32_t)mode << 13;
    uint16_t cw = (uint16_t)(((v >> 32) & ~0xc00u) | (uint32_t)mode << 10);

    fpctl_set(mxcsr | (uint64_t)cw << 32);
}

/* The mode, or -1 when SSE and x87 disagree (one of them was not kept). */
static int round_get(void)
{
    uint64_t v = fpctl_get();
    int sse = (int)((v >> 13) & 3), x87 = (int)((v >> 42) & 3);

    return sse == x87 ? sse : -1;
}
#elif defined(__aarch64__)
static uint64_t fpctl_get(void)
{
    uint64_t v;

    __asm__ volatile("mrs %0, fpcr" : "=r"(v));
    return v;
}

static void fpctl_set(uint64_t v)
{
    __asm__ volatile("msr fpcr, %0" : : "r"(v));
}

static const int rmode[4] = {0, 2, 1, 3}; /* RN, RM, RP, RZ */

static void round_set(int mode)
{
    fpctl_set((fpctl_get() & ~(3ull << 22)) | (uint64_t)rmode[mode] << 22);
}

static int round_get(void)
{
    int r = (int)((fpctl_get() >> 22) & 3);

    for (int m = 0; m < 4; m++)
        if (rmode[m] == r)
            return m;
    return -1;
}
#endif

OPAQUE static double third(void)
{
    volatile double one = 1.0, three = 3.0;

    return one / three;
}

typedef struct fpstate {
    weft__fiber main, fiber;
    int at_start, after_resume;
    double q;
} fpstate;

static void fp_body(void *arg)
{
    fpstate *f = arg;

    f->at_start = round_get();
    round_set(ROUND_UP);
    f->q = third();
    weft__fiber_switch(&f->fiber, &f->main);
    f->after_resume = round_get();
    weft__fiber_exit(&f->fiber, &f->main);
}

static void test_fp_control_state_is_kept_per_fiber(void **state)
{
    uint64_t saved = fpctl_get();
    weft__stack *s = stack_take();
    fpstate f = {0};
    double q_down;

    (void)state;
    weft__fiber_init_thread(&f.main);
    round_set(ROUND_DOWN);
    weft__fiber_init(&f.fiber, s, fp_body, &f);
    weft__fiber_switch(&f.main, &f.fiber);
    int main_mode = round_get();
    q_down = third();
    round_set(ROUND_ZERO);
    weft__fiber_switch(&f.main, &f.fiber);
    int main_mode_end = round_get();
    fpctl_set(saved);
    weft__fiber_release(&f.fiber);
    weft__stack_put(pool, NULL, s);

    assert_int_equal(f.at_start, ROUND_DOWN); /* a new fiber inherits its creator's */
    assert_int_equal(main_mode, ROUND_DOWN);  /* the fiber's change did not leak */
    assert_int_equal(f.after_resume, ROUND_UP);
    assert_int_equal(main_mode_end, ROUND_ZERO);
    assert_true(q_down < f.q); /* and the modes really were in force */
}

/* ---- migration ---------------------------------------------------------- */

static _Thread_local int thread_tag;

OPAQUE static int tag_get(void)
{
    return thread_tag;
}

OPAQUE static void tag_set(int v)
{
    thread_tag = v;
}

OPAQUE static long tid_get(void)
{
    return (long)syscall(SYS_gettid);
}

typedef struct migrate {
    weft__fiber fiber;
    weft__fiber *back; /* the context that resumed the fiber last */
    long tid[2];
    int tag[2];
    const weft__fiber *running[2];
} migrate;

static void migrate_body(void *arg)
{
    migrate *m = arg;

    m->tid[0] = tid_get();
    m->tag[0] = tag_get();
    m->running[0] = weft__fiber_running();
    weft__fiber_switch(&m->fiber, m->back);
    m->tid[1] = tid_get();
    m->tag[1] = tag_get();
    m->running[1] = weft__fiber_running();
    weft__fiber_exit(&m->fiber, m->back);
}

typedef struct resumer {
    migrate *m;
    int tag;
    long tid;
} resumer;

static void *resume_once(void *arg)
{
    resumer *r = arg;
    weft__fiber self;

    tag_set(r->tag);
    r->tid = tid_get();
    weft__fiber_init_thread(&self);
    r->m->back = &self;
    weft__fiber_switch(&self, &r->m->fiber);
    return NULL;
}

static void test_fiber_resumes_on_another_thread(void **state)
{
    weft__stack *s = stack_take();
    migrate m = {0};
    resumer r1 = {.m = &m, .tag = 1}, r2 = {.m = &m, .tag = 2};
    pthread_t t;

    (void)state;
    weft__fiber_init(&m.fiber, s, migrate_body, &m);
    assert_int_equal(pthread_create(&t, NULL, resume_once, &r1), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(pthread_create(&t, NULL, resume_once, &r2), 0);
    assert_int_equal(pthread_join(t, NULL), 0);

    assert_int_not_equal(r1.tid, r2.tid);
    assert_int_equal(m.tid[0], r1.tid);
    assert_int_equal(m.tid[1], r2.tid);
    assert_int_equal(m.tag[0], 1);
    assert_int_equal(m.tag[1], 2); /* the second thread's thread-local */
    assert_ptr_equal(m.running[0], &m.fiber);
    assert_ptr_equal(m.running[1], &m.fiber);
    weft__fiber_release(&m.fiber);
    weft__stack_put(pool, NULL, s);
}

/* ---- many fibers -------------------------------------------------------- */

/* gcc's TSan runtime counts each fiber as a thread and dies past 8128 of
 * them alive at once (clang's has no such limit); stay below it there. */
#if defined(__SANITIZE_THREAD__) && !defined(__clang__)
#define MANY 2000
#else
#define MANY 10000
#endif
#define MANY_ROUNDS 3

typedef struct crowd {
    weft__fiber main;
    weft__fiber fibers[MANY];
    weft__stack *stacks[MANY];
    int rounds[MANY];
    bool done[MANY];
} crowd;

static crowd *the_crowd;

static void crowd_body(void *arg)
{
    size_t i = (size_t)(uintptr_t)arg;
    crowd *c = the_crowd;
    volatile char scratch[512]; /* touch some stack */

    for (int r = 0; r < MANY_ROUNDS; r++) {
        scratch[r] = (char)r;
        c->rounds[i] += 1 + scratch[r] - r;
        weft__fiber_switch(&c->fibers[i], &c->main);
    }
    c->done[i] = true;
    weft__fiber_exit(&c->fibers[i], &c->main);
}

static void test_many_fibers_alive_at_once_run_to_completion(void **state)
{
    size_t budget = weft__stack_guard_budget_set(0);
    weft__stack_cache cache = {0};
    unsigned unguarded = 0;
    crowd *c;

    (void)state;
    weft__stack_guard_budget_set(budget);
    c = calloc(1, sizeof *c);
    assert_non_null(c);
    the_crowd = c;
    weft__fiber_init_thread(&c->main);
    for (size_t i = 0; i < MANY; i++) {
        assert_int_equal(weft__stack_get(pool, &cache, 0, &c->stacks[i]), 0);
        unguarded += !c->stacks[i]->guarded;
        weft__fiber_init(&c->fibers[i], c->stacks[i], crowd_body, (void *)(uintptr_t)i);
    }
    /* All of them alive at once, round-robin until every one has exited. */
    for (int r = 0; r <= MANY_ROUNDS; r++)
        for (size_t i = 0; i < MANY; i++)
            weft__fiber_switch(&c->main, &c->fibers[i]);
    for (size_t i = 0; i < MANY; i++) {
        assert_true(c->done[i]);
        assert_int_equal(c->rounds[i], MANY_ROUNDS);
        weft__fiber_release(&c->fibers[i]);
        weft__stack_put(pool, &cache, c->stacks[i]);
    }
    weft__stack_cache_drain(pool, &cache);
    assert_int_equal(cache.count, 0);
    /* More stacks than guarded ones may exist: the rest came from slabs. */
    if (budget < MANY)
        assert_true(unguarded >= MANY - budget);
    free(c);
}

/* ---- cost --------------------------------------------------------------- */

typedef struct bench {
    weft__fiber main, fiber;
    long n;
} bench;

static void bench_body(void *arg)
{
    bench *b = arg;

    for (long i = 0; i < b->n; i++)
        weft__fiber_switch(&b->fiber, &b->main);
    weft__fiber_exit(&b->fiber, &b->main);
}

/* Thread CPU time: a test run in parallel with others must not count the
 * time it spent preempted. */
static double cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void test_switch_costs_nanoseconds(void **state)
{
#if defined(__SANITIZE_THREAD__) && !defined(__clang__)
    const long n = 20000; /* gcc's TSan: ~25 us per round trip here */
#elif SANITIZED
    const long n = 200000;
#else
    const long n = 5000000;
#endif
    const int batches = 3;
    weft__stack *s = stack_take();
    bench b = {.n = n};
    double best = 1e300;

    (void)state;
    weft__fiber_init_thread(&b.main);
    weft__fiber_init(&b.fiber, s, bench_body, &b);
    weft__fiber_switch(&b.main, &b.fiber); /* warm up: start the fiber */
    for (int k = 0; k < batches; k++) {
        long m = (n - 1) / batches;
        double t0 = cpu_ns(), ns;

        for (long i = 0; i < m; i++)
            weft__fiber_switch(&b.main, &b.fiber);
        ns = (cpu_ns() - t0) / (double)m;
        if (ns < best)
            best = ns;
    }
    for (long i = (n - 1) / batches * batches; i < n - 1; i++)
        weft__fiber_switch(&b.main, &b.fiber);
    weft__fiber_switch(&b.main, &b.fiber); /* let it exit */
    weft__fiber_release(&b.fiber);
    weft__stack_put(pool, NULL, s);
    printf("fiber switch: %.2f ns per resume + suspend (%.2f ns per switch; best of %d x %ld)\n",
           best, best / 2, batches, (n - 1) / batches);
#if !SANITIZED
    /* Generous: a switch with a system call in it (swapcontext's
     * sigprocmask) would cost several hundred. */
    if (best >= 250.0)
        fail_msg("a resume + suspend took %.1f ns", best);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pingpong_passes_values_both_ways),
        cmocka_unit_test(test_callee_saved_registers_survive_switch),
        cmocka_unit_test(test_fp_control_state_is_kept_per_fiber),
        cmocka_unit_test(test_fiber_resumes_on_another_thread),
        cmocka_unit_test(test_many_fibers_alive_at_once_run_to_completion),
        cmocka_unit_test(test_switch_costs_nanoseconds),
    };

    return cmocka_run_group_tests(tests, setup_pool, teardown_pool);
}
