/* meta-state.c - the meta plugin's pointer-keyed hash table, and each meta device's table of
 * tensor states built on it.
 *
 * The table is open addressing with linear probing, kept at most half full. Linear probing has
 * no cheap delete, so dropping entries rebuilds the table from those that are kept. The same
 * table serves the device's states (tensor -> state after the last computation) and a
 * computation's records (tensor -> state and shadows, meta-compute.c). */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta-state.h"

void bp_meta_ptab_init(struct bp_meta_ptab *tab, size_t val_size)
{
    memset(tab, 0, sizeof(*tab));
    tab->val_size = val_size;
}

void bp_meta_ptab_close(struct bp_meta_ptab *tab)
{
    free(tab->keys);
    free(tab->vals);
    bp_meta_ptab_init(tab, tab->val_size);
}

static size_t slot_of(const void *key, size_t size)
{
    size_t i = (size_t)(((uintptr_t)key >> 4) * (uintptr_t)0x9E3779B97F4A7C15ull) & (size - 1);
    return i;
}

/* The slot that holds key, or the empty one where it would go. size must be > 0. */
static size_t find(const void *const *keys, size_t size, const void *key)
{
    size_t i = slot_of(key, size);
    while (keys[i] != NULL && keys[i] != key)
        i = (i + 1) & (size - 1);
    return i;
}

/* Rebuilds tab with `size` slots, keeping the entries keep() accepts (all when keep is NULL). */
static bool rebuild(struct bp_meta_ptab *tab, size_t size,
                    bool (*keep)(const void *val, const void *arg), const void *arg)
{
    const void **keys = calloc(size, sizeof(*keys));
    unsigned char *vals = calloc(size, tab->val_size);
    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        return false;
    }
    size_t used = 0;
    for (size_t i = 0; i < tab->size; i++) {
        const unsigned char *v = tab->vals + i * tab->val_size;
        if (tab->keys[i] == NULL || (keep != NULL && !keep(v, arg)))
            continue;
        const size_t j = find(keys, size, tab->keys[i]);
        keys[j] = tab->keys[i];
        memcpy(vals + j * tab->val_size, v, tab->val_size);
        used++;
    }
    free(tab->keys);
    free(tab->vals);
    tab->keys = keys;
    tab->vals = vals;
    tab->size = size;
    tab->used = used;
    return true;
}

bool bp_meta_ptab_reserve(struct bp_meta_ptab *tab, size_t n)
{
    size_t size = tab->size ? tab->size : 64;
    while (size < 2 * n)
        size *= 2;
    return size == tab->size || rebuild(tab, size, NULL, NULL);
}

void *bp_meta_ptab_get(const struct bp_meta_ptab *tab, const void *key)
{
    if (tab->size == 0)
        return NULL;
    const size_t i = find(tab->keys, tab->size, key);
    return tab->keys[i] == key ? tab->vals + i * tab->val_size : NULL;
}

void *bp_meta_ptab_put(struct bp_meta_ptab *tab, const void *key, bool *added)
{
    if (!bp_meta_ptab_reserve(tab, tab->used + 1))
        return NULL;
    const size_t i = find(tab->keys, tab->size, key);
    unsigned char *v = tab->vals + i * tab->val_size;
    *added = tab->keys[i] == NULL;
    if (*added) {
        tab->keys[i] = key;
        memset(v, 0, tab->val_size);
        tab->used++;
    }
    return v;
}

bool bp_meta_ptab_retain(struct bp_meta_ptab *tab, bool (*keep)(const void *val, const void *arg),
                         const void *arg)
{
    return tab->used == 0 || rebuild(tab, tab->size, keep, arg);
}

void bp_meta_ptab_clear(struct bp_meta_ptab *tab)
{
    if (tab->size > 0)
        memset(tab->keys, 0, tab->size * sizeof(*tab->keys));
    tab->used = 0;
}

bool bp_meta_ptab_next(const struct bp_meta_ptab *tab, size_t *i, const void **key, void **val)
{
    for (; *i < tab->size; (*i)++) {
        if (tab->keys[*i] != NULL) {
            *key = tab->keys[*i];
            *val = tab->vals + *i * tab->val_size;
            (*i)++;
            return true;
        }
    }
    return false;
}

/* ---- Tensor states ----------------------------------------------------------------------- */

/* A tensor's state, and where the tensor was when it was set: a later tensor at the same
 * address, or the tensor moved elsewhere, does not inherit it. */
struct state_entry {
    const bp_buffer *buffer;
    const void *data;
    struct bp_meta_split s;
};

void bp_meta_states_init(struct bp_meta_states *states)
{
    bp_meta_ptab_init(&states->tab, sizeof(struct state_entry));
    pthread_mutex_init(&states->lock, NULL);
}

void bp_meta_states_close(struct bp_meta_states *states)
{
    bp_meta_ptab_close(&states->tab);
    pthread_mutex_destroy(&states->lock);
}

struct bp_meta_split bp_meta_state_get(struct bp_meta_states *states, const bp_tensor *t)
{
    struct bp_meta_split s = {.state = BP_META_MIRRORED};
    pthread_mutex_lock(&states->lock);
    const struct state_entry *e = bp_meta_ptab_get(&states->tab, t);
    if (e != NULL && e->buffer == t->buffer && e->data == t->data)
        s = e->s;
    pthread_mutex_unlock(&states->lock);
    return s;
}

bool bp_meta_state_set(struct bp_meta_states *states, const bp_tensor *t,
                       const struct bp_meta_split *s)
{
    bool added;
    pthread_mutex_lock(&states->lock);
    struct state_entry *e = bp_meta_ptab_put(&states->tab, t, &added);
    if (e != NULL) {
        e->buffer = t->buffer;
        e->data = t->data;
        e->s = *s;
    }
    pthread_mutex_unlock(&states->lock);
    return e != NULL;
}

static bool not_in_buffer(const void *val, const void *buf)
{
    return ((const struct state_entry *)val)->buffer != buf;
}

void bp_meta_states_forget(struct bp_meta_states *states, const bp_buffer *buf)
{
    pthread_mutex_lock(&states->lock);
    /* No memory for a new table: forget everything rather than keep stale states. */
    if (!bp_meta_ptab_retain(&states->tab, not_in_buffer, buf))
        bp_meta_ptab_clear(&states->tab);
    pthread_mutex_unlock(&states->lock);
}
