/*
 * test_addrset.c - the set of handed-out addresses (core/addrset.h).
 *
 * A random program of adds and takes, checked step by step against a plain
 * array of flags: every take answers whether the address was a member and
 * gives back the word added with it, through growth and through removals
 * that shift runs back across the end of the table. Addresses are drawn from a small range, 16
 * bytes apart as allocators align them, so that runs of colliding slots are long.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <string.h>

#include "core/addrset.h"
#include "weft.h"

enum { RANGE = 5000, STEPS = 400000 };

static uint64_t rng_next(uint64_t *state) /* splitmix64 */
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uintptr_t addr(unsigned i)
{
    return (uintptr_t)0x7f0000000000u + 16u * (i + 1);
}

/* A word that differs from member to member and from one add to the next. */
static uint64_t word_of(unsigned i, unsigned step)
{
    return (uint64_t)i << 32 | step;
}

static void test_takes_answer_membership_and_word_exactly(void **state)
{
    static bool member[RANGE];
    static uint64_t added[RANGE];
    weft__addrset set = WEFT__ADDRSET_INIT;
    uint64_t rng = 42;
    size_t count = 0;

    (void)state;
    memset(member, 0, sizeof member);
    for (unsigned step = 0; step < STEPS; step++) {
        unsigned i = (unsigned)(rng_next(&rng) % RANGE);
        /* drift between mostly adding and mostly taking, so the set both
         * fills up (growth) and drains (long backward shifts) */
        bool add = rng_next(&rng) % 100 < (step / 50000 % 2 ? 30u : 70u);
        if (add && !member[i]) {
            added[i] = word_of(i, step);
            assert_int_equal(weft__addrset_add(&set, addr(i), added[i]), WEFT_OK);
            member[i] = true;
            count++;
        } else {
            uint64_t word = UINT64_MAX;
            assert_int_equal(weft__addrset_take(&set, addr(i), &word), member[i]);
            if (member[i])
                assert_int_equal(word, added[i]);
            else
                assert_int_equal(word, UINT64_MAX); /* untouched when not found */
            count -= member[i];
            member[i] = false;
            /* a second take of the same address never finds it */
            assert_false(weft__addrset_take(&set, addr(i), NULL));
        }
        assert_int_equal(set.count, count);
        assert_true(2 * set.count <= set.cap);
    }
    for (unsigned i = 0; i < RANGE; i++) {
        uint64_t word = 0;
        assert_int_equal(weft__addrset_take(&set, addr(i), &word), member[i]);
        if (member[i])
            assert_int_equal(word, added[i]);
    }
    assert_int_equal(set.count, 0);
    assert_false(weft__addrset_take(&set, 0, NULL));
    weft__addrset_fini(&set);
}

static void test_empty_set_finds_nothing(void **state)
{
    weft__addrset set = WEFT__ADDRSET_INIT;

    (void)state;
    assert_false(weft__addrset_take(&set, addr(1), NULL));
    assert_int_equal(weft__addrset_add(&set, addr(1), 7), WEFT_OK);
    assert_false(weft__addrset_take(&set, addr(1) + 8, NULL)); /* inside is not the block */
    assert_true(weft__addrset_take(&set, addr(1), NULL));
    weft__addrset_fini(&set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_takes_answer_membership_and_word_exactly),
        cmocka_unit_test(test_empty_set_finds_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
