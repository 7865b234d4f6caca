/*
 * addrset.c - the set of addresses of addrset.h.
 *
 * Invariants, under the lock: cap is 0 or a power of two with count <= cap
 * / 2; every member sits at or after its home slot with no empty slot
 * between home and it (wrapping), which is what lets a probe stop at the
 * first empty slot and what removal restores by shifting back.
 */
#include <stdlib.h>

#include "core/addrset.h"
#include "weft.h"

enum { MIN_CAP = 64 };

/* Allocators align blocks to 16 bytes: drop those bits, then mix. */
static size_t home(uintptr_t a, size_t cap)
{
    uint64_t h = (uint64_t)(a >> 4) * 0x9e3779b97f4a7c15u;
    return (size_t)(h >> 32) & (cap - 1);
}

/* Index of a's slot, or of the empty slot where it would go. */
static size_t probe(const weft__addrset *set, uintptr_t a)
{
    size_t i = home(a, set->cap);
    while (set->slots[i].addr && set->slots[i].addr != a)
        i = (i + 1) & (set->cap - 1);
    return i;
}

static int grow(weft__addrset *set)
{
    size_t cap = set->cap ? 2 * set->cap : MIN_CAP;
    weft__addrset_slot *old = set->slots, *slots = calloc(cap, sizeof *slots);
    size_t old_cap = set->cap;

    if (!slots)
        return WEFT_ENOMEM;
    set->slots = slots;
    set->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].addr)
            slots[probe(set, old[i].addr)] = old[i];
    free(old);
    return WEFT_OK;
}

int weft__addrset_add(weft__addrset *set, uintptr_t a, uint64_t word)
{
    int rc = WEFT_OK;

    weft__lock_acquire(&set->lock);
    if (2 * (set->count + 1) > set->cap)
        rc = grow(set);
    if (rc == WEFT_OK) {
        set->slots[probe(set, a)] = (weft__addrset_slot){a, word};
        set->count++;
    }
    weft__lock_release(&set->lock);
    return rc;
}

/* Empty slot i, moving later members of its run back so that none is left
 * beyond an empty slot from its home. */
static void remove_at(weft__addrset *set, size_t i)
{
    size_t mask = set->cap - 1, j = i;

    for (;;) {
        j = (j + 1) & mask;
        if (!set->slots[j].addr)
            break;
        size_t k = home(set->slots[j].addr, set->cap);
        /* the member at j may move to i unless its home lies in (i, j] */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        set->slots[i] = set->slots[j];
        i = j;
    }
    set->slots[i] = (weft__addrset_slot){0, 0};
}

bool weft__addrset_take(weft__addrset *set, uintptr_t a, uint64_t *word)
{
    bool found = false;

    if (!a)
        return false;
    weft__lock_acquire(&set->lock);
    if (set->cap) {
        size_t i = probe(set, a);
        if ((found = set->slots[i].addr == a)) {
            if (word)
                *word = set->slots[i].word;
            remove_at(set, i);
            set->count--;
        }
    }
    weft__lock_release(&set->lock);
    return found;
}

void weft__addrset_fini(weft__addrset *set)
{
    free(set->slots);
    set->slots = NULL;
    set->cap = set->count = 0;
}
