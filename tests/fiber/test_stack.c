/*
 * test_stack.c - the stack pool: guarded default stacks, reuse through the
 * caller's cache and through the pool, non-default sizes, the fallback to
 * unguarded slab stacks once the guard budget is spent, and the canary that
 * catches an overrun of an unguarded stack.
 *
 * Each test gets a fresh pool, so what it gets back is what it put in.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fiber/fiber.h"
#include "fiber/internal.h"

#include "child.h"

#define STACK_SIZE (256u * 1024)

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define ASAN 1
#endif

static weft__stack_pool *pool;

static int pool_new(void **state)
{
    (void)state;
    return weft__stack_pool_create(&pool, STACK_SIZE);
}

static int pool_free(void **state)
{
    (void)state;
    weft__stack_pool_destroy(pool);
    pool = NULL;
    return 0;
}

static weft__stack *take(weft__stack_cache *cache, size_t size)
{
    weft__stack *s = NULL;

    assert_int_equal(weft__stack_get(pool, cache, size, &s), 0);
    assert_non_null(s);
    assert_null(s->next);
    return s;
}

/* The permissions of the mapping holding addr, from /proc/self/maps. */
static bool maps_perms(const void *addr, char perms[5])
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    bool found = false;

    assert_non_null(f);
    while (!found && fgets(line, sizeof line, f) != NULL) {
        uintptr_t lo, hi;

        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) == 3 &&
            (uintptr_t)addr >= lo && (uintptr_t)addr < hi)
            found = true;
    }
    fclose(f);
    return found;
}

/* ---- running something on a stack -------------------------------------- */

typedef struct job {
    weft__fiber main, fiber;
    size_t use;         /* bytes of stack to fill */
    unsigned long sum;  /* proof the bytes were written and read back */
    uintptr_t buf_addr; /* where the big frame was */
    bool smash_canary;  /* overwrite the low end of the stack, then switch */
    bool done;
} job;

#if defined(__clang__)
#define OPAQUE __attribute__((noinline))
#else
#define OPAQUE __attribute__((noinline, noipa))
#endif

#define BIG (900u * 1024)

OPAQUE static unsigned long fill_big(job *j)
{
    char buf[BIG];
    unsigned long sum = 0;

    memset(buf, 1, sizeof buf);
    j->buf_addr = (uintptr_t)buf;
    for (size_t i = 0; i < sizeof buf; i += 4096)
        sum += (unsigned char)((volatile char *)buf)[i];
    return sum + (unsigned char)buf[sizeof buf - 1];
}

OPAQUE static unsigned long fill_small(size_t n)
{
    char buf[64 * 1024];
    unsigned long sum = 0;

    if (n > sizeof buf)
        n = sizeof buf;
    memset(buf, 2, n);
    for (size_t i = 0; i < n; i += 512)
        sum += (unsigned char)((volatile char *)buf)[i];
    return sum;
}

static void job_body(void *arg)
{
    job *j = arg;

    if (j->smash_canary)
        memset(j->fiber.stack->lo, 0, 16);
    j->sum = j->use > 64 * 1024 ? fill_big(j) : fill_small(j->use);
    weft__fiber_switch(&j->fiber, &j->main); /* the canary is checked here */
    j->done = true;
    weft__fiber_exit(&j->fiber, &j->main);
}

static void run_on(const weft__stack *s, job *j)
{
    weft__fiber_init_thread(&j->main);
    weft__fiber_init(&j->fiber, s, job_body, j);
    weft__fiber_switch(&j->main, &j->fiber);
    weft__fiber_switch(&j->main, &j->fiber);
    weft__fiber_release(&j->fiber);
}

/* ---- tests -------------------------------------------------------------- */

/* The guard is 256 KiB of no access, all of it: a frame as large as the
 * ones cuDNN makes cannot step over it. */
static void test_default_stack_has_guard_page_below(void **state)
{
    long page = sysconf(_SC_PAGESIZE);
    weft__stack *s = take(NULL, 0);
    char perms[5];

    (void)state;
    assert_int_equal(s->size, STACK_SIZE);
    assert_true(s->guarded);
    assert_int_equal((uintptr_t)s->lo % (uintptr_t)page, 0);
    assert_true(maps_perms(s->lo, perms));
    assert_string_equal(perms, "rw-p");
    assert_true(maps_perms((char *)s->lo - 1, perms));
    assert_string_equal(perms, "---p");
    assert_true((char *)s->lo - (char *)s->map >= 256 * 1024);
    assert_true(maps_perms(s->map, perms));
    assert_string_equal(perms, "---p");
    weft__stack_put(pool, NULL, s);
}

static void test_stack_comes_back_from_cache(void **state)
{
    weft__stack_cache cache = {0};
    weft__stack *a = take(&cache, 0);

    (void)state;
    weft__stack_put(pool, &cache, a);
    assert_int_equal(cache.count, 1);
    assert_ptr_equal(take(&cache, 0), a);
    assert_int_equal(cache.count, 0);
    weft__stack_put(pool, &cache, a);
    weft__stack_cache_drain(pool, &cache);
}

static void test_stack_comes_back_from_pool(void **state)
{
    weft__stack *a = take(NULL, 0);
    void *lo = a->lo;

    (void)state;
    weft__stack_put(pool, NULL, a);
    a = take(NULL, 0);
    assert_ptr_equal(a->lo, lo);
    weft__stack_put(pool, NULL, a);
}

static void test_cache_is_bounded_and_drains_to_pool(void **state)
{
    weft__stack_cache cache = {0};
    weft__stack *s[WEFT__STACK_CACHE_MAX + 4];
    const size_t n = sizeof s / sizeof s[0];
    weft__stack *back;

    (void)state;
    for (size_t i = 0; i < n; i++)
        s[i] = take(&cache, 0);
    for (size_t i = 0; i < n; i++)
        weft__stack_put(pool, &cache, s[i]);
    assert_int_equal(cache.count, WEFT__STACK_CACHE_MAX);
    weft__stack_cache_drain(pool, &cache);
    assert_int_equal(cache.count, 0);
    assert_null(cache.head);
    /* What the pool hands out now is one of ours. */
    back = take(NULL, 0);
    bool ours = false;
    for (size_t i = 0; i < n; i++)
        ours |= back == s[i];
    assert_true(ours);
    weft__stack_put(pool, NULL, back);
}

static void test_tiny_size_rounds_up_to_usable_stack(void **state)
{
    long page = sysconf(_SC_PAGESIZE);
    weft__stack *s = take(NULL, 1);

    (void)state;
    assert_true(s->size >= 16 * 1024);
    assert_int_equal(s->size % (size_t)page, 0);
    weft__stack_put(pool, NULL, s);
}

static void test_large_nondefault_stack_runs_a_900k_frame(void **state)
{
    weft__stack *s = take(NULL, 1024 * 1024);
    void *lo = s->lo;
    job j = {.use = BIG};

    (void)state;
    assert_true(s->size >= 1024 * 1024);
    assert_true(s->size != STACK_SIZE);
    run_on(s, &j);
    assert_true(j.done);
    assert_int_equal(j.sum, BIG / 4096 + 1);
#if !ASAN /* with fake stacks ASan may move big frames to the heap */
    assert_true(j.buf_addr >= (uintptr_t)s->lo);
    assert_true(j.buf_addr + BIG <= (uintptr_t)s->lo + s->size);
#endif
    weft__stack_put(pool, NULL, s);
    /* A stack of the same odd size is reused too. */
    s = take(NULL, 1024 * 1024);
    assert_ptr_equal(s->lo, lo);
    weft__stack_put(pool, NULL, s);
}

/* A word at the top of a stack: a stack that comes back from the pool still
 * holds what was written there, a new mapping reads zero. */
static uint64_t *top_word(const weft__stack *s)
{
    return (uint64_t *)((char *)s->lo + s->size - sizeof(uint64_t));
}

/* Tasks spawned with their own stack size come and go by the thousand like
 * default ones: their stacks must come back from the pool, not from new
 * mappings, and two sizes must not evict each other. */
static void test_stacks_of_other_sizes_are_pooled_by_the_hundred(void **state)
{
    enum { N = 200 };
    static weft__stack *s[2 * N];
    const size_t sizes[2] = {64 * 1024, 128 * 1024};

    (void)state;
    for (size_t i = 0; i < 2 * N; i++) {
        s[i] = take(NULL, sizes[i % 2]);
        *top_word(s[i]) = 1000 + i;
    }
    for (size_t i = 0; i < 2 * N; i++)
        weft__stack_put(pool, NULL, s[i]);
    for (size_t i = 0; i < 2 * N; i++) {
        s[i] = take(NULL, sizes[i % 2]);
        assert_int_equal(s[i]->size, sizes[i % 2]);
        uint64_t mark = *top_word(s[i]);
        assert_true(mark >= 1000 && mark < 1000 + 2 * N && mark % 2 == i % 2);
    }
    for (size_t i = 0; i < 2 * N; i++)
        weft__stack_put(pool, NULL, s[i]);
}

/* Big stacks of another size are kept up to 1 GiB of them, not by count:
 * of 2 MiB ones, 512. */
static void test_big_stacks_of_another_size_are_kept_up_to_a_gib(void **state)
{
    enum { N = 520, KEPT = 512 };
    static weft__stack *s[N];
    const size_t size = 2u << 20;
    unsigned marked = 0;

    (void)state;
    for (size_t i = 0; i < N; i++) {
        s[i] = take(NULL, size);
        *top_word(s[i]) = 1;
    }
    for (size_t i = 0; i < N; i++)
        weft__stack_put(pool, NULL, s[i]);
    for (size_t i = 0; i < N; i++) {
        s[i] = take(NULL, size);
        marked += *top_word(s[i]) == 1;
    }
    assert_int_equal(marked, KEPT);
    for (size_t i = 0; i < N; i++)
        weft__stack_put(pool, NULL, s[i]);
}

/* With every class holding a size, a new size is not kept; once a class
 * has given out its last stack, the new size takes it. */
static void test_a_new_size_waits_for_a_class_to_empty(void **state)
{
    enum { K = WEFT__STACK_SIZE_CLASSES };
    const size_t other = 40 * 1024;
    weft__stack *s[K], *a, *b;

    (void)state;
    for (size_t i = 0; i < K; i++) {
        s[i] = take(NULL, (64 + 16 * i) * 1024);
        *top_word(s[i]) = 1;
    }
    for (size_t i = 0; i < K; i++)
        weft__stack_put(pool, NULL, s[i]); /* one class each */
    a = take(NULL, other);
    *top_word(a) = 2;
    weft__stack_put(pool, NULL, a); /* no class free: unmapped */
    a = take(NULL, other);
    assert_int_equal(*top_word(a), 0);

    s[0] = take(NULL, 64 * 1024); /* its class empties */
    assert_int_equal(*top_word(s[0]), 1);
    *top_word(a) = 3;
    weft__stack_put(pool, NULL, a); /* kept now */
    b = take(NULL, other);
    assert_int_equal(*top_word(b), 3);
    weft__stack_put(pool, NULL, b);
    weft__stack_put(pool, NULL, s[0]);
}

static void test_spent_guard_budget_gives_unguarded_stacks_that_run(void **state)
{
    size_t budget = weft__stack_guard_budget_set(0);
    weft__stack *s[5], *odd, *guarded;

    (void)state;
    for (size_t i = 0; i < 5; i++) {
        s[i] = take(NULL, 0);
        assert_false(s[i]->guarded);
        assert_int_equal(s[i]->map_size, 0); /* a slab slot */
        assert_int_equal(s[i]->size, STACK_SIZE);
        assert_true(*(uint64_t *)s[i]->lo == WEFT__STACK_CANARY);
        if (i > 0) /* carved back to back from one mapping */
            assert_ptr_equal(s[i]->map, s[0]->map);
    }
    odd = take(NULL, 512 * 1024);
    assert_false(odd->guarded);
    assert_int_not_equal(odd->map_size, 0);
    assert_true(*(uint64_t *)odd->lo == WEFT__STACK_CANARY);

    for (size_t i = 0; i < 5; i++) {
        job j = {.use = 60 * 1024};

        run_on(s[i], &j);
        assert_true(j.done);
        assert_int_equal(j.sum, 2 * (60 * 1024 / 512));
    }
    job j = {.use = 60 * 1024};
    run_on(odd, &j);
    assert_true(j.done);

    for (size_t i = 0; i < 5; i++)
        weft__stack_put(pool, NULL, s[i]);
    weft__stack_put(pool, NULL, odd);

    /* With the budget back, a new guarded stack is preferred over the idle
     * slab slots. */
    weft__stack_guard_budget_set(budget);
    guarded = take(NULL, 0);
    assert_true(guarded->guarded);
    weft__stack_put(pool, NULL, guarded);
}

static void smash_canary_child(void)
{
    weft__stack *s;
    job j = {.smash_canary = true};

    weft__stack_guard_budget_set(0);
    if (weft__stack_get(pool, NULL, 0, &s) != 0 || s->guarded)
        _exit(3);
    weft__fiber_init_thread(&j.main);
    weft__fiber_init(&j.fiber, s, job_body, &j);
    j.fiber.label = "smasher";
    weft__fiber_switch(&j.main, &j.fiber);
    _exit(4); /* not reached: switching out of the fiber aborts */
}

static void test_broken_canary_aborts_with_report(void **state)
{
    child_result r;

    (void)state;
    assert_true(child_run(smash_canary_child, &r));
    if (!child_killed_by(&r, SIGABRT))
        fail_msg("child status 0x%x, stderr:\n%s", r.status, r.err);
    assert_non_null(strstr(r.err, "weft: task stack overflow in task \"smasher\""));
    assert_non_null(strstr(r.err, "canary"));
    assert_non_null(strstr(r.err, "raise weft_config.stack_size or weft_task_opts.stack_size"));
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, pool_new, pool_free)
    const struct CMUnitTest tests[] = {
        T(test_default_stack_has_guard_page_below),
        T(test_stack_comes_back_from_cache),
        T(test_stack_comes_back_from_pool),
        T(test_cache_is_bounded_and_drains_to_pool),
        T(test_tiny_size_rounds_up_to_usable_stack),
        T(test_large_nondefault_stack_runs_a_900k_frame),
        T(test_stacks_of_other_sizes_are_pooled_by_the_hundred),
        T(test_a_new_size_waits_for_a_class_to_empty),
        T(test_big_stacks_of_another_size_are_kept_up_to_a_gib),
        T(test_spent_guard_budget_gives_unguarded_stacks_that_run),
        T(test_broken_canary_aborts_with_report),
    };
#undef T

    return cmocka_run_group_tests(tests, NULL, NULL);
}
