/* ptrmap.h - private to runtime/: an open-addressing map from pointers to ints (ptrmap.c).
 *
 * The graph, the graph allocator and the scheduler each keep a table keyed by tensor pointer:
 * the graph maps a tensor to its use count, the allocator and the scheduler map it to the index
 * of their own per-tensor record (a dense array they own and size with bp__ptrmap_limit). Keys
 * are never removed one by one; the whole map is emptied in O(1) by bp__ptrmap_clear, which
 * starts a new generation: a slot belongs to the map only while its generation is the map's,
 * so a clear touches no slot (a real memset happens once in 4 billion clears, when the counter
 * wraps).
 *
 * Linear probing in a power-of-two table, filled to at most three quarters, so that a probe
 * always ends at a free slot. The lookups are inline: they run for every source of every node
 * the scheduler and the allocator see. */
#ifndef BACKPLANE_PTRMAP_H
#define BACKPLANE_PTRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bp__ptrmap_slot {
    const void *key;
    unsigned gen; /* the slot is in use only when gen == the map's gen */
    int value;
};

struct bp__ptrmap {
    struct bp__ptrmap_slot *slots;
    size_t mask; /* number of slots - 1; 0 with no slots */
    size_t used; /* entries in the current generation */
    unsigned gen;
};

/* An empty map with at least min_slots slots (rounded up to a power of two, at least 4); false
 * with the error set when memory runs out (the map is then empty and safe to close). */
bool bp__ptrmap_init(struct bp__ptrmap *m, size_t min_slots, const char *what);
/* Frees the slots; the map may be initialised again. Closing a zeroed map does nothing. */
void bp__ptrmap_close(struct bp__ptrmap *m);
/* Grows m to at least min_slots slots, keeping its entries and their values; false with the
 * error set (m unchanged) when memory runs out. Does nothing when m is large enough already. */
bool bp__ptrmap_reserve(struct bp__ptrmap *m, size_t min_slots, const char *what);
/* Empties the map (every value is forgotten) without touching the slots. */
void bp__ptrmap_clear(struct bp__ptrmap *m);

/* Slots of the map. */
static inline size_t bp__ptrmap_size(const struct bp__ptrmap *m)
{
    return m->slots != NULL ? m->mask + 1 : 0;
}

/* The most entries the map takes before bp__ptrmap_put refuses (three quarters of the slots),
 * so that a caller can size an array of records indexed by value. */
static inline size_t bp__ptrmap_limit(const struct bp__ptrmap *m)
{
    return 3 * bp__ptrmap_size(m) / 4;
}

static inline size_t bp__ptrmap_hash(const void *p)
{
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 17;
    x *= (uintptr_t)0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return (size_t)x;
}

/* The slot holding key, or the free slot where it would go. The map must have slots. */
static inline struct bp__ptrmap_slot *bp__ptrmap_slot(const struct bp__ptrmap *m,
                                                      const void *key)
{
    size_t i = bp__ptrmap_hash(key) & m->mask;
    while (m->slots[i].gen == m->gen && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    return &m->slots[i];
}

/* The value stored for key, or NULL when key is not in the map. */
static inline int *bp__ptrmap_get(const struct bp__ptrmap *m, const void *key)
{
    if (m->slots == NULL)
        return NULL;
    struct bp__ptrmap_slot *s = bp__ptrmap_slot(m, key);
    return s->gen == m->gen ? &s->value : NULL;
}

/* The value stored for key; when key is new it is added with value and *added is set. NULL
 * when key is new and the map holds bp__ptrmap_limit entries already (nothing is added). */
static inline int *bp__ptrmap_put(struct bp__ptrmap *m, const void *key, int value, bool *added)
{
    *added = false;
    if (m->slots == NULL)
        return NULL;
    struct bp__ptrmap_slot *s = bp__ptrmap_slot(m, key);
    if (s->gen == m->gen)
        return &s->value;
    if (4 * (m->used + 1) > 3 * (m->mask + 1))
        return NULL;
    s->key = key;
    s->gen = m->gen;
    s->value = value;
    m->used++;
    *added = true;
    return &s->value;
}

#endif
