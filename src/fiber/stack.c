/*
 * stack.c - fiber stacks: mapped on demand, pooled, reused.
 *
 * Every stack is anonymous memory mapped MAP_NORESERVE | MAP_STACK, so the
 * kernel commits a page only when the fiber first touches it: a 256 KiB
 * stack whose task uses 8 KiB costs 8 KiB of memory.
 *
 * Guard pages and the map count. A stack normally has a PROT_NONE region
 * right below it; running into it faults, and overflow.c turns the fault
 * into a readable report. The region is GUARD_BYTES, not one page: a frame
 * larger than the guard can step over it and write into whatever lies
 * below (another task's stack), a fault that comes later and elsewhere if
 * at all, and libraries tasks call make such frames without stack probes
 * (cuDNN 9's entry points reserve 64 KiB at once, its heuristics 122 KiB).
 * The guard is address space only: nothing is committed for it. But each
 * guarded stack costs two kernel mappings (VMAs), and the kernel caps a
 * process at vm.max_map_count of them (65530 by default), which would
 * allow only ~32,000 suspended tasks - fewer once CUDA, malloc and the
 * loader have taken theirs. So a quarter of the limit,
 * read at the first pool's creation, is the process-wide budget of guarded
 * stacks (two VMAs each, so limit/8 stacks: 8191 by default). Past the
 * budget, or when mmap or mprotect fails with ENOMEM, stacks come unguarded
 * from slabs: one mapping holding many stacks back to back, never split and
 * never unmapped before the pool is destroyed (and kept off transparent
 * huge pages, which would commit memory for stacks nobody touched). An
 * unguarded stack has a canary word at its low end, which fiber.c checks
 * whenever a fiber switches away from it: an overrun is still caught, just
 * later, and after it has corrupted the stack below. Users who want guard
 * pages on more tasks raise vm.max_map_count (sysctl).
 *
 * Invariants:
 *  - A stack has one of three forms: a dedicated guarded mapping (map_size
 *    != 0, guarded), a dedicated unguarded mapping for a non-default size
 *    when the budget is spent (map_size != 0, !guarded, canary), or a slab
 *    slot (map_size == 0, !guarded, canary).
 *  - guarded_live counts the guarded stacks mapped in the process, in use or
 *    pooled, across all pools; it never exceeds the budget except when a
 *    test lowers the budget under live stacks.
 *  - A weft__stack_cache holds default-size stacks only, at most
 *    WEFT__STACK_CACHE_MAX. The pool keeps stacks of the default size and of
 *    up to WEFT__STACK_SIZE_CLASSES other sizes, at most FREE_MAX of each
 *    (and of another size no more than SIZED_BYTES_MAX): tasks spawned with
 *    their own stack size come and go by the thousand as default ones do.
 *    Dedicated stacks beyond the bound, or of a size no class is free for,
 *    are unmapped; slab stacks beyond it stay listed but give their pages
 *    back (MADV_DONTNEED), except the page with the canary.
 *  - A size class with no stack listed holds no size: the next size put
 *    back may take it.
 *  - pool->out counts stacks handed out and not yet back in the pool's
 *    lists; stacks sitting in caches count as out.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fiber/fiber.h"
#include "fiber/internal.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define WEFT__VALGRIND 1
#endif
#endif

#define STACK_MIN (16u * 1024) /* smaller requests are raised to this */
/* Default-size stacks of each kind the pool keeps. Generous: a workload
 * that keeps thousands of tasks alive at once does so again and again, and
 * a kept stack costs only its touched pages, where a new one costs mmap,
 * mprotect, page faults and later munmap. */
#define FREE_MAX 4096u
/* Bytes of stacks of one other size the pool keeps: what FREE_MAX stacks
 * of the usual default (256 KiB) come to, so that it keeps fewer of big
 * ones. */
#define SIZED_BYTES_MAX ((size_t)1 << 30)
#define SLAB_BYTES (16u << 20) /* a slab's size aims at this... */
#define SLAB_STACKS_MIN 4u     /* ...within these stack counts */
#define SLAB_STACKS_MAX 64u
#define MAP_COUNT_DEFAULT 65530 /* when /proc says nothing */
#define GUARD_BYTES (256u * 1024) /* below a guarded stack (a multiple of pages) */
#define HUGE_PAGE_BYTES (2u << 20)

typedef struct slab {
    struct slab *next;
    char *base;
    size_t size;     /* bytes mapped */
    unsigned count;  /* slots in the slab */
    unsigned carved; /* slots handed out at least once */
    weft__stack slots[];
} slab;

/* Pooled stacks of one non-default size. */
typedef struct size_class {
    size_t size; /* meaningful while count > 0 */
    weft__stack *free;
    unsigned count;
} size_class;

struct weft__stack_pool {
    pthread_mutex_t lock;
    size_t page;
    size_t default_size;
    unsigned slab_stacks; /* slots per slab */
    weft__stack *free;    /* default size, dedicated (guarded) */
    unsigned free_count;
    weft__stack *slab_free; /* default size, slab slots */
    unsigned slab_free_count;
    size_class odd[WEFT__STACK_SIZE_CLASSES]; /* other sizes, dedicated */
    slab *slabs;
    size_t out;
};

/* ---- the process-wide guard budget ------------------------------------- */

static pthread_once_t budget_once = PTHREAD_ONCE_INIT;
static atomic_size_t guard_budget;
static atomic_size_t guarded_live;

static void budget_init(void)
{
    unsigned long limit = MAP_COUNT_DEFAULT;
    char buf[32];
    ssize_t n;
    int fd;

    fd = open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, buf, sizeof buf - 1);
        if (n > 0) {
            buf[n] = '\0';
            limit = strtoul(buf, NULL, 10);
        }
        close(fd);
    }
    /* A quarter of the mappings, two per guarded stack. */
    atomic_store(&guard_budget, limit / 4 / 2);
}

size_t weft__stack_guard_budget_set(size_t stacks)
{
    pthread_once(&budget_once, budget_init);
    return atomic_exchange(&guard_budget, stacks);
}

static bool guard_reserve(void)
{
    size_t n = atomic_load(&guarded_live);

    do {
        if (n >= atomic_load(&guard_budget))
            return false;
    } while (!atomic_compare_exchange_weak(&guarded_live, &n, n + 1));
    return true;
}

static void guard_release(void)
{
    atomic_fetch_sub(&guarded_live, 1);
}

/* ---- mapping ----------------------------------------------------------- */

static void *map_anon(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);

    if (p == MAP_FAILED)
        return NULL;
    /* Where transparent huge pages are on for everything, the first touch
     * of one stack in a slab would commit 2 MiB. */
    if (len >= HUGE_PAGE_BYTES)
        madvise(p, len, MADV_NOHUGEPAGE);
    return p;
}

static void stack_register(weft__stack *s)
{
#if WEFT__VALGRIND
    s->valgrind_id = VALGRIND_STACK_REGISTER(s->lo, (char *)s->lo + s->size);
#else
    s->valgrind_id = 0;
#endif
}

static void stack_deregister(weft__stack *s)
{
#if WEFT__VALGRIND
    VALGRIND_STACK_DEREGISTER(s->valgrind_id);
#else
    (void)s;
#endif
}

static void canary_set(weft__stack *s)
{
    *(uint64_t *)s->lo = WEFT__STACK_CANARY;
}

/* Map a stack of its own. Returns 0, or -ENOMEM when the mapping (or, for
 * a guarded one, the guard) could not be made. */
static int map_dedicated(weft__stack_pool *pool, size_t size, bool guarded, weft__stack **out)
{
    size_t guard = guarded ? (GUARD_BYTES + pool->page - 1) & ~(pool->page - 1) : 0;
    weft__stack *s;
    char *map;

    s = malloc(sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    map = map_anon(guard + size);
    if (map == NULL)
        goto fail_free;
    if (guarded && mprotect(map, guard, PROT_NONE) != 0)
        goto fail_unmap;
    *s = (weft__stack){
        .lo = map + guard, .size = size, .map = map, .map_size = guard + size, .guarded = guarded};
    if (!guarded)
        canary_set(s);
    stack_register(s);
    *out = s;
    return 0;

fail_unmap:
    munmap(map, guard + size);
fail_free:
    free(s);
    return -ENOMEM;
}

static void unmap_dedicated(weft__stack *s)
{
    assert(s->map_size != 0);
    stack_deregister(s);
    munmap(s->map, s->map_size);
    if (s->guarded)
        guard_release();
    free(s);
}

/* Take a never-used slab slot, mapping a new slab when the last is full.
 * Called with the lock held: a new slab is needed once per slab_stacks
 * stacks, and serializing those mappings costs little. */
static int slab_carve(weft__stack_pool *pool, weft__stack **out)
{
    slab *sl = pool->slabs;
    weft__stack *s;

    if (sl == NULL || sl->carved == sl->count) {
        size_t bytes = (size_t)pool->slab_stacks * pool->default_size;

        sl = malloc(sizeof *sl + pool->slab_stacks * sizeof sl->slots[0]);
        if (sl == NULL)
            return -ENOMEM;
        sl->base = map_anon(bytes);
        if (sl->base == NULL) {
            free(sl);
            return -ENOMEM;
        }
        sl->size = bytes;
        sl->count = pool->slab_stacks;
        sl->carved = 0;
        sl->next = pool->slabs;
        pool->slabs = sl;
    }
    s = &sl->slots[sl->carved];
    *s = (weft__stack){.lo = sl->base + (size_t)sl->carved * pool->default_size,
                       .size = pool->default_size,
                       .map = sl->base};
    sl->carved++;
    canary_set(s);
    stack_register(s);
    *out = s;
    return 0;
}

/* ---- lists ------------------------------------------------------------- */

static void push(weft__stack **list, unsigned *count, weft__stack *s)
{
    s->next = *list;
    *list = s;
    (*count)++;
}

static weft__stack *pop(weft__stack **list, unsigned *count)
{
    weft__stack *s = *list;

    if (s != NULL) {
        *list = s->next;
        s->next = NULL;
        (*count)--;
    }
    return s;
}

/* The class listing stacks of size; with vacant, an empty class when none
 * does. NULL when there is neither. */
static size_class *odd_class(weft__stack_pool *pool, size_t size, bool vacant)
{
    size_class *empty = NULL;

    for (unsigned i = 0; i < WEFT__STACK_SIZE_CLASSES; i++) {
        size_class *c = &pool->odd[i];
        if (c->count == 0)
            empty = empty ? empty : c;
        else if (c->size == size)
            return c;
    }
    return vacant ? empty : NULL;
}

/* Return s to the pool's lists. Returns s when it must be unmapped by the
 * caller (outside the lock), NULL when it was kept. A slab slot beyond the
 * bound has had its pages released by the caller beforehand. */
static weft__stack *put_locked(weft__stack_pool *pool, weft__stack *s)
{
    assert(pool->out > 0);
    pool->out--;
    if (s->map_size == 0) {
        push(&pool->slab_free, &pool->slab_free_count, s);
        return NULL;
    }
    if (s->size == pool->default_size) {
        if (pool->free_count >= FREE_MAX)
            return s;
        push(&pool->free, &pool->free_count, s);
        return NULL;
    }
    size_class *c = odd_class(pool, s->size, true);
    if (c == NULL || c->count >= FREE_MAX || (c->count + 1) * s->size > SIZED_BYTES_MAX)
        return s;
    c->size = s->size;
    push(&c->free, &c->count, s);
    return NULL;
}

/* The pages of an idle slab slot beyond the pool's bound go back to the
 * kernel; the first page stays, it holds the canary. */
static void slab_slot_release(weft__stack_pool *pool, weft__stack *s)
{
    madvise((char *)s->lo + pool->page, s->size - pool->page, MADV_DONTNEED);
}

/* ---- the contract ------------------------------------------------------ */

static size_t round_size(const weft__stack_pool *pool, size_t size)
{
    if (size < STACK_MIN)
        size = STACK_MIN;
    if (size > SIZE_MAX / 2)
        return 0;
    return (size + pool->page - 1) & ~(pool->page - 1);
}

int weft__stack_pool_create(weft__stack_pool **out, size_t default_size)
{
    weft__stack_pool *pool;
    size_t per_slab;

    pthread_once(&budget_once, budget_init);
    pool = calloc(1, sizeof *pool);
    if (pool == NULL)
        return -ENOMEM;
    pool->page = (size_t)sysconf(_SC_PAGESIZE);
    pool->default_size = round_size(pool, default_size);
    if (pool->default_size == 0 || pthread_mutex_init(&pool->lock, NULL) != 0) {
        free(pool);
        return -ENOMEM;
    }
    per_slab = SLAB_BYTES / pool->default_size;
    if (per_slab < SLAB_STACKS_MIN)
        per_slab = SLAB_STACKS_MIN;
    if (per_slab > SLAB_STACKS_MAX)
        per_slab = SLAB_STACKS_MAX;
    pool->slab_stacks = (unsigned)per_slab;
    *out = pool;
    return 0;
}

void weft__stack_pool_destroy(weft__stack_pool *pool)
{
    weft__stack *s;
    slab *sl;

    if (pool == NULL)
        return;
    assert(pool->out == 0 && "stacks still out (or in an undrained cache)");
    while ((s = pop(&pool->free, &pool->free_count)) != NULL)
        unmap_dedicated(s);
    for (unsigned i = 0; i < WEFT__STACK_SIZE_CLASSES; i++)
        while ((s = pop(&pool->odd[i].free, &pool->odd[i].count)) != NULL)
            unmap_dedicated(s);
    while ((sl = pool->slabs) != NULL) {
        pool->slabs = sl->next;
        for (unsigned i = 0; i < sl->carved; i++)
            stack_deregister(&sl->slots[i]);
        munmap(sl->base, sl->size);
        free(sl);
    }
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

static int get_default(weft__stack_pool *pool, weft__stack **out)
{
    weft__stack *s;
    int rc;

    pthread_mutex_lock(&pool->lock);
    s = pop(&pool->free, &pool->free_count);
    if (s != NULL)
        goto got;
    pthread_mutex_unlock(&pool->lock);

    /* Guard pages while the budget lasts: they catch an overflow where it
     * happens. mmap runs outside the lock. */
    if (guard_reserve()) {
        rc = map_dedicated(pool, pool->default_size, true, &s);
        pthread_mutex_lock(&pool->lock);
        if (rc == 0)
            goto got;
        guard_release();
    } else {
        pthread_mutex_lock(&pool->lock);
    }

    s = pop(&pool->slab_free, &pool->slab_free_count);
    if (s == NULL) {
        rc = slab_carve(pool, &s);
        if (rc != 0) {
            pthread_mutex_unlock(&pool->lock);
            return rc;
        }
    }
got:
    pool->out++;
    pthread_mutex_unlock(&pool->lock);
    *out = s;
    return 0;
}

static int get_odd(weft__stack_pool *pool, size_t size, weft__stack **out)
{
    size_class *c;
    int rc;

    pthread_mutex_lock(&pool->lock);
    if ((c = odd_class(pool, size, false)) != NULL) {
        *out = pop(&c->free, &c->count);
        pool->out++;
        pthread_mutex_unlock(&pool->lock);
        return 0;
    }
    pthread_mutex_unlock(&pool->lock);

    rc = -ENOMEM;
    if (guard_reserve()) {
        rc = map_dedicated(pool, size, true, out);
        if (rc != 0)
            guard_release();
    }
    if (rc != 0)
        rc = map_dedicated(pool, size, false, out);
    if (rc == 0) {
        pthread_mutex_lock(&pool->lock);
        pool->out++;
        pthread_mutex_unlock(&pool->lock);
    }
    return rc;
}

int weft__stack_get(weft__stack_pool *pool, weft__stack_cache *cache, size_t size,
                    weft__stack **out)
{
    size = size == 0 ? pool->default_size : round_size(pool, size);
    if (size == 0)
        return -ENOMEM;
    if (size != pool->default_size)
        return get_odd(pool, size, out);
    if (cache != NULL && cache->head != NULL) {
        *out = pop(&cache->head, &cache->count);
        return 0;
    }
    return get_default(pool, out);
}

void weft__stack_put(weft__stack_pool *pool, weft__stack_cache *cache, weft__stack *stack)
{
    weft__stack *unmap;
    bool release;

    assert(stack != NULL && stack->next == NULL);
    if (cache != NULL && stack->size == pool->default_size &&
        cache->count < WEFT__STACK_CACHE_MAX) {
        push(&cache->head, &cache->count, stack);
        return;
    }

    pthread_mutex_lock(&pool->lock);
    release = stack->map_size == 0 && pool->slab_free_count >= FREE_MAX;
    if (release) {
        /* Give the pages back before the slot is listed, where another
         * thread could take it. */
        pthread_mutex_unlock(&pool->lock);
        slab_slot_release(pool, stack);
        pthread_mutex_lock(&pool->lock);
    }
    unmap = put_locked(pool, stack);
    pthread_mutex_unlock(&pool->lock);
    if (unmap != NULL)
        unmap_dedicated(unmap);
}

void weft__stack_cache_drain(weft__stack_pool *pool, weft__stack_cache *cache)
{
    weft__stack *s;

    while ((s = pop(&cache->head, &cache->count)) != NULL)
        weft__stack_put(pool, NULL, s);
}
