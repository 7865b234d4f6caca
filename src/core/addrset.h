/*
 * addrset.h - a set of addresses: the blocks a backend has handed out,
 * each with a word its owner keeps beside it (what the free needs to know
 * of the block: its size, where it came from; 0 when nothing).
 *
 * A free call asks the set, not the block, whether a pointer is one of its
 * own: a foreign pointer may point at unmapped memory or into the middle of
 * someone's heap block, so nothing before or at it can be read safely. A
 * block is in the set from the allocation that hands it out to the free
 * that takes it back; weft__addrset_take removes it atomically, so of two
 * frees of one block exactly one finds it.
 *
 * Open addressing with linear probing, at most half full, deletions by
 * backward shift (no tombstones, so a probe ends at the first empty slot).
 * One lock per set; each call holds it for a hash and a short probe.
 */
#ifndef WEFT_ADDRSET_H
#define WEFT_ADDRSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/lock.h"

typedef struct weft__addrset_slot {
    uintptr_t addr; /* 0: empty; NULL is never a member */
    uint64_t word;
} weft__addrset_slot;

typedef struct weft__addrset {
    weft__lock lock;
    weft__addrset_slot *slots;
    size_t cap; /* a power of two, or 0 before the first add */
    size_t count;
} weft__addrset;

#define WEFT__ADDRSET_INIT                                                                         \
    {                                                                                              \
        WEFT__LOCK_INIT, NULL, 0, 0                                                                \
    }

/* Addresses are passed as integers: the set never reads what they point at.
 * Put a (not 0, not a member) in the set with its word. WEFT_OK, or
 * WEFT_ENOMEM with no message set: the caller names the call that failed. */
int weft__addrset_add(weft__addrset *set, uintptr_t a, uint64_t word);

/* Remove a, and give its word to *word when word is not NULL; false (and
 * nothing changed) if it was not a member. */
bool weft__addrset_take(weft__addrset *set, uintptr_t a, uint64_t *word);

/* Free the set's storage; it is empty (and usable) afterwards. */
void weft__addrset_fini(weft__addrset *set);

#endif
