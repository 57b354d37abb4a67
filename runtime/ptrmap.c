/* ptrmap.c - the pointer map's allocation, growth and generations (lookups are inline in
 * ptrmap.h, which explains the design). */
#include "config.h"

#include <string.h>

#include "bp-impl.h"
#include "ptrmap.h"

/* The smallest power of two, at least 4, that is at least n; 0 when none fits in size_t. */
static size_t slots_for(size_t n)
{
    size_t size = 4;
    while (size < n) {
        if (size > SIZE_MAX / 2)
            return 0;
        size <<= 1;
    }
    return size;
}

static struct bp__ptrmap_slot *new_slots(size_t min_slots, size_t *size, const char *what)
{
    *size = slots_for(min_slots);
    if (*size == 0) {
        bp__error(BP_ERR_OUT_OF_MEMORY, "a table of %zu entries for %s is too large", min_slots,
                  what);
        return NULL;
    }
    return bp__calloc(*size, sizeof(struct bp__ptrmap_slot), what);
}

bool bp__ptrmap_init(struct bp__ptrmap *m, size_t min_slots, const char *what)
{
    size_t size;
    *m = (struct bp__ptrmap){0};
    m->slots = new_slots(min_slots, &size, what);
    if (m->slots == NULL)
        return false;
    m->mask = size - 1;
    m->gen = 1; /* fresh slots have generation 0: all free */
    return true;
}

void bp__ptrmap_close(struct bp__ptrmap *m)
{
    bp__free(m->slots);
    *m = (struct bp__ptrmap){0};
}

bool bp__ptrmap_reserve(struct bp__ptrmap *m, size_t min_slots, const char *what)
{
    if (min_slots <= bp__ptrmap_size(m))
        return true;
    size_t size;
    struct bp__ptrmap_slot *slots = new_slots(min_slots, &size, what);
    if (slots == NULL)
        return false;
    struct bp__ptrmap old = *m;
    m->slots = slots;
    m->mask = size - 1;
    m->gen = 1;
    /* Move the live entries over; the new table is larger, so every one fits. */
    for (size_t i = 0; old.slots != NULL && i <= old.mask; i++) {
        if (old.slots[i].gen != old.gen)
            continue;
        struct bp__ptrmap_slot *s = bp__ptrmap_slot(m, old.slots[i].key);
        *s = old.slots[i];
        s->gen = m->gen;
    }
    bp__free(old.slots);
    return true;
}

void bp__ptrmap_clear(struct bp__ptrmap *m)
{
    m->used = 0;
    if (m->slots == NULL)
        return;
    /* A new generation frees every slot at once; only when the counter wraps do the slots'
     * old generations have to be wiped, or a slot from 2^32 clears ago would look live. */
    if (++m->gen == 0) {
        memset(m->slots, 0, bp__ptrmap_size(m) * sizeof(*m->slots));
        m->gen = 1;
    }
}
