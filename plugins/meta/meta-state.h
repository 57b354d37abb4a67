/* meta-state.h - private to plugins/meta/: the meta plugin's one pointer-keyed hash table, and
 * the table of tensor states each meta device keeps with it. */
#ifndef BP_META_STATE_H
#define BP_META_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include <backplane/bp-backend.h>
#include <backplane/bp-meta.h>

/* A hash table from pointers to values of one fixed size, by open addressing. The caller owns
 * the struct; the table owns its arrays (bp_meta_ptab_close frees them). A value pointer stays
 * valid until the next bp_meta_ptab_put that grows the table, or a retain, clear or close. */
struct bp_meta_ptab {
    const void **keys;   /* size slots; NULL marks an empty one */
    unsigned char *vals; /* size values of val_size bytes, zeroed when their key is put */
    size_t val_size;
    size_t size; /* 0 or a power of two; never more than half full */
    size_t used;
};

void bp_meta_ptab_init(struct bp_meta_ptab *tab, size_t val_size);
void bp_meta_ptab_close(struct bp_meta_ptab *tab);
/* Room for n entries in all, so that puts up to n never grow the table. False: out of memory. */
bool bp_meta_ptab_reserve(struct bp_meta_ptab *tab, size_t n);
/* key's value, or NULL when key is not in the table. */
void *bp_meta_ptab_get(const struct bp_meta_ptab *tab, const void *key);
/* key's value, added (zeroed, *added true) when missing. NULL: out of memory (nothing added). */
void *bp_meta_ptab_put(struct bp_meta_ptab *tab, const void *key, bool *added);
/* Keeps only the entries for which keep(value, arg) is true. False: out of memory for the
 * rebuilt table, and the table is unchanged. */
bool bp_meta_ptab_retain(struct bp_meta_ptab *tab, bool (*keep)(const void *val, const void *arg),
                         const void *arg);
void bp_meta_ptab_clear(struct bp_meta_ptab *tab);
/* Iteration: start with *i = 0; each call gives the next entry, false after the last. */
bool bp_meta_ptab_next(const struct bp_meta_ptab *tab, size_t *i, const void **key, void **val);

/* The state each tensor had after the last computation of its meta device, for reading it back
 * and for the next computation. A tensor not in the table is MIRRORED, and so is one that has
 * moved (another buffer or address) since its state was set. Every backend of the meta device
 * shares the table, and different backends may be used on different threads at once, so each
 * call takes the table's lock (states are copied out, never pointed into). */
struct bp_meta_states {
    struct bp_meta_ptab tab;
    pthread_mutex_t lock;
};

void bp_meta_states_init(struct bp_meta_states *states);
void bp_meta_states_close(struct bp_meta_states *states);
struct bp_meta_split bp_meta_state_get(struct bp_meta_states *states, const bp_tensor *t);
/* False: out of memory (the state is not recorded). */
bool bp_meta_state_set(struct bp_meta_states *states, const bp_tensor *t,
                       const struct bp_meta_split *s);
/* Drops the states of tensors in buf (freed or cleared: its data is the same on every part). */
void bp_meta_states_forget(struct bp_meta_states *states, const bp_buffer *buf);

#endif
