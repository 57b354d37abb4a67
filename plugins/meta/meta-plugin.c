/* meta-plugin.c - the meta plugin's objects: registry "Meta", meta devices over other plugins'
 * devices, their buffer type, buffers and backends.
 *
 * A meta buffer reserves an address range and gets its storage on the parts at first use. An
 * ordinary buffer becomes one buffer per part device, all of the full size, with identical
 * layouts: a tensor at offset o of the meta buffer lives at offset o of every part, and writing
 * it writes the full data to every part, so any later split of it is just a different view of
 * memory that is already there. A weights buffer (usage BP_BUFFER_USAGE_WEIGHTS) gets one slot
 * per tensor instead: a weight that the split callback splits when it is first written is
 * stored as slices, each part holding only its own (the memory saving of tensor parallelism);
 * other weights are stored whole on every part. Reading a tensor gathers it according to its
 * state (docs/meta.md, "Memory"). */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

#include "meta-impl.h"

#define MAX_META_DEVICES 32

static struct {
    bp_registry *reg;
    struct meta_dev *devs[MAX_META_DEVICES];
    int n;
} meta;

/* ---- Buffers ----------------------------------------------------------------------------- */

static bool is_weights(bp_buffer *buf)
{
    return bp_buffer_get_usage(buf) == BP_BUFFER_USAGE_WEIGHTS;
}

/* The slot whose range holds p, or NULL. Slots are sorted by data and do not overlap. */
static struct meta_slot *slot_at(struct meta_buf *mb, const char *p)
{
    size_t lo = 0, hi = mb->n_slots;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        const struct meta_slot *sl = &mb->slots[mid];
        if (p < sl->data)
            hi = mid;
        else if (p >= sl->data + (sl->nbytes ? sl->nbytes : 1))
            lo = mid + 1;
        else
            return &mb->slots[mid];
    }
    return NULL;
}

void *meta_part_address(const bp_tensor *t, int part)
{
    struct meta_buf *mb = bp_buffer_get_context(t->buffer);
    struct meta_slot *sl = mb->materialized ? NULL : slot_at(mb, t->data);
    if (sl != NULL)
        return (char *)bp_buffer_get_base(sl->part[part]) + ((const char *)t->data - sl->data);
    if (!mb->materialized)
        return NULL;
    return (char *)bp_buffer_get_base(mb->parts[part]) + ((const char *)t->data - mb->reserve);
}

bp_buffer *meta_part_buffer(const bp_tensor *t, int part)
{
    struct meta_buf *mb = bp_buffer_get_context(t->buffer);
    struct meta_slot *sl = mb->materialized ? NULL : slot_at(mb, t->data);
    return sl != NULL ? sl->part[part] : mb->parts[part];
}

const struct meta_slot *meta_sliced_slot(const bp_tensor *t)
{
    if (t->buffer == NULL)
        return NULL;
    struct meta_buf *mb = bp_buffer_get_context(t->buffer);
    struct meta_slot *sl = mb->materialized ? NULL : slot_at(mb, t->data);
    return sl != NULL && sl->sliced && sl->data == (const char *)t->data ? sl : NULL;
}

/* One full-size buffer per part, with the reserved range's layout. */
static enum bp_status materialize(struct meta_buf *mb)
{
    if (mb->materialized)
        return BP_OK;
    if (mb->n_slots > 0)
        return bp_set_error(BP_ERR_INVALID_ARG, "%s: a weights buffer cannot also be used as "
                            "another kind of buffer", mb->md->name);
    for (int p = 0; p < mb->md->n; p++) {
        mb->parts[p] = bp_buffer_type_alloc(bp_device_get_buffer_type(mb->md->parts[p]), mb->size);
        if (mb->parts[p] == NULL) {
            for (int q = 0; q < p; q++) {
                bp_buffer_free(mb->parts[q]);
                mb->parts[q] = NULL;
            }
            return bp_last_status(); /* the part's error stands */
        }
    }
    mb->materialized = true;
    return BP_OK;
}

/* The tensor that owns t's memory (t itself unless t is a view). */
static const bp_tensor *owner_of(const bp_tensor *t)
{
    while (t->view_src != NULL)
        t = t->view_src;
    return t;
}

/* "a+b+c": the first n sizes of s, for messages. */
static void sizes_text(const struct bp_meta_split *s, int n, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int p = 0; p < n && used < cap; p++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", p ? "+" : "",
                                 (long long)s->sizes[p]);
}

enum bp_status bp_meta_ask_split(struct meta_dev *md, const bp_tensor *w,
                                 struct bp_meta_split *out, bool *given)
{
    *given = false;
    if (md->split_fn == NULL)
        return BP_OK;
    /* Zeroed first: a callback that fills only what its state uses leaves nothing undefined. */
    struct bp_meta_split s;
    memset(&s, 0, sizeof(s));
    if (!md->split_fn(w, md->n, &s, md->split_user))
        return BP_OK;
    if (s.state == BP_META_MIRRORED) {
        *out = s;
        *given = true;
        return BP_OK;
    }
    /* Every message below starts with this: the device, the weight, its type and shape. */
    char who[BP_MAX_NAME + 160];
    snprintf(who, sizeof(who), "the split callback's answer for weight '%s' (%s [%lld, %lld, "
             "%lld, %lld]) is invalid", w->name, bp_type_name(w->type), (long long)w->ne[0],
             (long long)w->ne[1], (long long)w->ne[2], (long long)w->ne[3]);
    if (s.state != BP_META_SPLIT)
        return bp_set_error(BP_ERR_INVALID_ARG, "%s: %s: state %d is neither BP_META_SPLIT nor "
                            "BP_META_MIRRORED (a weight cannot be PARTIAL)", md->name, who,
                            (int)s.state);
    if (s.axis < 0 || s.axis > 3)
        return bp_set_error(BP_ERR_INVALID_ARG, "%s: %s: split axis %d is not 0..3", md->name,
                            who, s.axis);
    char sizes[BP_META_MAX_DEVICES * 22];
    sizes_text(&s, md->n, sizes, sizeof(sizes));
    const int64_t extent = w->ne[s.axis], block = bp_type_block_size(w->type);
    int64_t sum = 0;
    bool over = false;
    for (int p = 0; p < md->n; p++) {
        if (s.sizes[p] < 0)
            return bp_set_error(BP_ERR_INVALID_ARG, "%s: %s: sizes %s on axis %d: size %lld of "
                                "part %d is negative", md->name, who, sizes, s.axis,
                                (long long)s.sizes[p], p);
        if (s.axis == 0 && s.sizes[p] % block != 0)
            return bp_set_error(BP_ERR_INVALID_ARG, "%s: %s: sizes %s on axis 0 are not whole "
                                "blocks of %lld elements (part %d: %lld)", md->name, who, sizes,
                                (long long)block, p, (long long)s.sizes[p]);
        over |= s.sizes[p] > INT64_MAX - sum;
        if (!over)
            sum += s.sizes[p];
    }
    if (over || sum != extent) {
        char total[40];
        if (over)
            snprintf(total, sizeof(total), "more than %lld", (long long)INT64_MAX);
        else
            snprintf(total, sizeof(total), "%lld", (long long)sum);
        return bp_set_error(BP_ERR_INVALID_ARG, "%s: %s: sizes %s on axis %d sum to %s, not to "
                            "ne[%d] = %lld", md->name, who, sizes, s.axis, total, s.axis,
                            (long long)extent);
    }
    *out = s;
    *given = true;
    return BP_OK;
}

/* Whether weight w is stored sliced, and in which split: when the split callback splits a 2-D
 * tensor with contiguous rows along its rows (axis 1) or, in whole blocks, its columns (axis 0).
 * An invalid answer is an error, so a bad callback never gets a weight stored or computed. */
static enum bp_status sliced_split(struct meta_dev *md, const bp_tensor *w, bool *sliced,
                                   struct bp_meta_split *out)
{
    *sliced = false;
    if (md->split_fn == NULL || w->ne[2] != 1 || w->ne[3] != 1 || !bp_is_contiguous(w))
        return BP_OK;
    struct bp_meta_split s;
    bool given;
    enum bp_status st = bp_meta_ask_split(md, w, &s, &given);
    if (st != BP_OK || !given || s.state != BP_META_SPLIT || (s.axis != 0 && s.axis != 1))
        return st;
    *out = s;
    *sliced = true;
    return BP_OK;
}

/* Bytes of part p's packed slice. */
static size_t slice_bytes(const bp_tensor *w, const struct bp_meta_split *s, int p)
{
    return s->axis == 1 ? (size_t)s->sizes[p] * w->nb[1]
                        : (size_t)w->ne[1] * bp_row_size(w->type, s->sizes[p]);
}

/* The slot of weight t's owner, made (and its part buffers allocated, zeroed) when missing. */
static enum bp_status slot_for(struct meta_buf *mb, const bp_tensor *t, struct meta_slot **out)
{
    const bp_tensor *w = owner_of(t);
    struct meta_slot *sl = slot_at(mb, w->data);
    if (sl != NULL) {
        *out = sl;
        return BP_OK;
    }
    if (mb->n_slots == mb->cap_slots) {
        size_t cap = mb->cap_slots ? 2 * mb->cap_slots : 64;
        struct meta_slot *g = realloc(mb->slots, cap * sizeof(*g));
        if (g == NULL)
            return bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", mb->md->name);
        mb->slots = g;
        mb->cap_slots = cap;
    }
    struct meta_slot n;
    memset(&n, 0, sizeof(n));
    n.data = w->data;
    n.nbytes = bp_nbytes(w);
    enum bp_status st = sliced_split(mb->md, w, &n.sliced, &n.s);
    for (int p = 0; p < mb->md->n && st == BP_OK; p++) {
        const size_t bytes = n.sliced ? slice_bytes(w, &n.s, p) : n.nbytes;
        n.part[p] = bp_buffer_type_alloc(bp_device_get_buffer_type(mb->md->parts[p]), bytes);
        st = n.part[p] != NULL ? bp_buffer_clear(n.part[p], 0) : bp_last_status();
    }
    if (st != BP_OK) {
        for (int p = 0; p < mb->md->n; p++)
            bp_buffer_free(n.part[p]);
        return st;
    }
    size_t at = 0;
    while (at < mb->n_slots && mb->slots[at].data < n.data)
        at++;
    memmove(&mb->slots[at + 1], &mb->slots[at], (mb->n_slots - at) * sizeof(n));
    mb->slots[at] = n;
    mb->n_slots++;
    *out = &mb->slots[at];
    return BP_OK;
}

enum bp_status meta_prepare(const bp_tensor *t)
{
    struct meta_buf *mb = bp_buffer_get_context(t->buffer);
    if (mb->materialized)
        return BP_OK;
    if (is_weights(t->buffer) || mb->n_slots > 0) {
        struct meta_slot *sl;
        return slot_for(mb, t, &sl);
    }
    return materialize(mb);
}

/* t as it lives in part p: same shape and strides, the part's memory. */
static bp_tensor part_view(const bp_tensor *t, int p)
{
    bp_tensor v = *t;
    v.view_src = NULL;
    v.view_offs = 0;
    v.buffer = meta_part_buffer(t, p);
    v.data = meta_part_address(t, p);
    return v;
}

static void *mbuf_base(bp_buffer *buf)
{
    struct meta_buf *mb = bp_buffer_get_context(buf);
    return mb->reserve;
}

static void mbuf_free(bp_buffer *buf)
{
    struct meta_buf *mb = bp_buffer_get_context(buf);
    bp_meta_states_forget(&mb->md->states, buf);
    for (int p = 0; p < mb->md->n; p++)
        bp_buffer_free(mb->parts[p]);
    for (size_t i = 0; i < mb->n_slots; i++)
        for (int p = 0; p < mb->md->n; p++)
            bp_buffer_free(mb->slots[i].part[p]);
    free(mb->slots);
    munmap(mb->reserve, mb->reserve_size);
    free(mb);
}

/* After a write of the same bytes to every part the tensor is MIRRORED. */
static enum bp_status mark_mirrored(struct meta_dev *md, const bp_tensor *t)
{
    static const struct bp_meta_split mirrored = {.state = BP_META_MIRRORED};
    return bp_meta_state_set(&md->states, t, &mirrored)
               ? BP_OK
               : bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory recording the state of "
                              "'%s'", md->name, t->name);
}

/* Writes bytes [off, off + n) of a sliced weight: each row's share goes to the part that holds
 * it (whole rows for a row split, the part's columns of every row for a column split). */
static enum bp_status scatter(struct meta_buf *mb, const struct meta_slot *sl, const bp_tensor *w,
                              const char *d, size_t off, size_t n, int value)
{
    const size_t row = w->nb[1];
    if (off % row != 0 || n % row != 0)
        return bp_set_error(BP_ERR_INVALID_ARG, "%s: '%s' is stored in slices: write it in whole "
                            "rows of %zu bytes (offset %zu, size %zu)", mb->md->name, w->name,
                            row, off, n);
    enum bp_status st = BP_OK;
    int64_t start[BP_META_MAX_DEVICES], acc = 0;
    for (int p = 0; p < mb->md->n; p++) {
        start[p] = acc;
        acc += sl->s.sizes[p];
    }
    for (int64_t r = (int64_t)(off / row); r < (int64_t)((off + n) / row) && st == BP_OK; r++) {
        const char *src = d ? d + ((size_t)r * row - off) : NULL;
        for (int p = 0; p < mb->md->n && st == BP_OK; p++) {
            bp_tensor dst = *w;
            dst.view_src = NULL;
            dst.buffer = sl->part[p];
            dst.data = bp_buffer_get_base(sl->part[p]);
            size_t to, from, len;
            if (sl->s.axis == 1) {
                if (r < start[p] || r >= start[p] + sl->s.sizes[p])
                    continue;
                to = (size_t)(r - start[p]) * row;
                from = 0;
                len = row;
            } else {
                len = bp_row_size(w->type, sl->s.sizes[p]);
                to = (size_t)r * len;
                from = bp_row_size(w->type, start[p]);
            }
            if (len == 0)
                continue;
            dst.ne[0] = (int64_t)(slice_bytes(w, &sl->s, p) / bp_type_size(w->type)) *
                        bp_type_block_size(w->type);
            dst.ne[1] = dst.ne[2] = dst.ne[3] = 1;
            dst.nb[1] = dst.nb[2] = dst.nb[3] = slice_bytes(w, &sl->s, p);
            st = src ? bp_tensor_set(&dst, src + from, to, len)
                     : bp_tensor_memset(&dst, (uint8_t)value, to, len);
        }
    }
    return st;
}

/* Writes the same bytes (d, or the value v when d is NULL) to t's storage: to every part for a
 * whole tensor (any later split of it is then a view of memory already there), or scattered
 * for a weight the split callback slices, each part getting only its own. */
static enum bp_status write_parts(bp_buffer *buf, bp_tensor *t, const void *d, uint8_t v,
                                  size_t off, size_t n)
{
    struct meta_buf *mb = bp_buffer_get_context(buf);
    enum bp_status st = meta_prepare(t);
    if (st != BP_OK)
        return st;
    const struct meta_slot *sl = meta_sliced_slot(t);
    if (sl != NULL)
        return scatter(mb, sl, owner_of(t), d, off, n, v);
    for (int p = 0; p < mb->md->n; p++) {
        bp_tensor pv = part_view(t, p);
        st = d ? bp_tensor_set(&pv, d, off, n) : bp_tensor_memset(&pv, v, off, n);
        if (st != BP_OK)
            return st;
    }
    return mark_mirrored(mb->md, t);
}

static enum bp_status mbuf_memset(bp_buffer *buf, bp_tensor *t, uint8_t v, size_t off, size_t n)
{
    return write_parts(buf, t, NULL, v, off, n);
}

static enum bp_status mbuf_set(bp_buffer *buf, bp_tensor *t, const void *d, size_t off, size_t n)
{
    return write_parts(buf, t, d, 0, off, n);
}

static enum bp_status mbuf_get(bp_buffer *buf, const bp_tensor *t, void *d, size_t off, size_t n)
{
    struct meta_buf *mb = bp_buffer_get_context(buf);
    enum bp_status st = meta_prepare(t);
    return st == BP_OK ? meta_read(mb->md, t, d, off, n) : st;
}

static enum bp_status mbuf_clear(bp_buffer *buf, uint8_t v)
{
    struct meta_buf *mb = bp_buffer_get_context(buf);
    if (!mb->materialized && mb->n_slots == 0 && !is_weights(buf)) {
        enum bp_status st = materialize(mb);
        if (st != BP_OK)
            return st;
    }
    for (int p = 0; p < mb->md->n; p++) {
        enum bp_status st = mb->parts[p] ? bp_buffer_clear(mb->parts[p], v) : BP_OK;
        for (size_t i = 0; i < mb->n_slots && st == BP_OK; i++)
            st = bp_buffer_clear(mb->slots[i].part[p], v);
        if (st != BP_OK)
            return st;
    }
    /* Everything is now the same bytes on every part; a sliced weight keeps its split, which
     * its slot (not the state table) says. */
    bp_meta_states_forget(&mb->md->states, buf);
    return BP_OK;
}

/* Bytes buf holds on its part `part` (0 for anything else). */
static size_t meta_buffer_part_bytes(bp_buffer *buf, int part)
{
    struct meta_dev *md = NULL;
    for (int i = 0; i < meta.n && md == NULL; i++)
        if (bp_buffer_get_type(buf) == meta.devs[i]->buft)
            md = meta.devs[i];
    /* 0 is also an answer ("nothing made yet"), so the error only explains a 0. */
    if (md == NULL) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_buffer_part_bytes: %s", buf == NULL ?
                     "buffer is NULL" : "not a meta device's buffer");
        return 0;
    }
    if (part < 0 || part >= md->n) {
        bp_set_error(BP_ERR_OUT_OF_BOUNDS, "bp_meta_buffer_part_bytes: part %d of '%s' is not "
                     "in 0..%d", part, md->name, md->n - 1);
        return 0;
    }
    struct meta_buf *mb = bp_buffer_get_context(buf);
    size_t bytes = mb->parts[part] ? bp_buffer_get_size(mb->parts[part]) : 0;
    for (size_t i = 0; i < mb->n_slots; i++)
        bytes += bp_buffer_get_size(mb->slots[i].part[part]);
    return bytes;
}

static const struct bp_buffer_iface meta_buffer_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = mbuf_free,
    .get_base = mbuf_base,
    .memset_tensor = mbuf_memset,
    .set_tensor = mbuf_set,
    .get_tensor = mbuf_get,
    .clear = mbuf_clear,
};

static const char *mbuft_name(bp_buffer_type *buft)
{
    struct meta_dev *md = bp_buffer_type_get_context(buft);
    return md->name;
}

static size_t mbuft_alignment(bp_buffer_type *buft)
{
    struct meta_dev *md = bp_buffer_type_get_context(buft);
    size_t a = 1;
    for (int p = 0; p < md->n; p++) {
        size_t x = bp_buffer_type_alignment(bp_device_get_buffer_type(md->parts[p]));
        a = x > a ? x : a;
    }
    return a;
}

static size_t mbuft_max_size(bp_buffer_type *buft)
{
    struct meta_dev *md = bp_buffer_type_get_context(buft);
    size_t m = SIZE_MAX;
    for (int p = 0; p < md->n; p++) {
        size_t x = bp_buffer_type_max_size(bp_device_get_buffer_type(md->parts[p]));
        m = x < m ? x : m;
    }
    return m;
}

static size_t mbuft_alloc_size(bp_buffer_type *buft, const bp_tensor *t)
{
    struct meta_dev *md = bp_buffer_type_get_context(buft);
    size_t m = 0;
    for (int p = 0; p < md->n; p++) {
        size_t x = bp_buffer_type_alloc_size(bp_device_get_buffer_type(md->parts[p]), t);
        m = x > m ? x : m;
    }
    return m;
}

static bp_buffer *mbuft_alloc(bp_buffer_type *buft, size_t size)
{
    struct meta_dev *md = bp_buffer_type_get_context(buft);
    struct meta_buf *mb = calloc(1, sizeof(*mb));
    if (mb == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", md->name);
        return NULL;
    }
    mb->md = md;
    mb->size = size;
    /* Addresses only: the parts' memory comes at first use (see struct meta_buf). */
    mb->reserve_size = size > 0 ? size : 1;
    void *r = mmap(NULL, mb->reserve_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (r == MAP_FAILED) {
        free(mb);
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: cannot reserve %zu bytes of address space: %s",
                     md->name, size, strerror(errno));
        return NULL;
    }
    mb->reserve = r;
    bp_buffer *buf = bp_buffer_new(buft, &meta_buffer_iface, mb, size);
    if (buf == NULL) {
        munmap(mb->reserve, mb->reserve_size);
        free(mb);
    }
    return buf;
}

static const struct bp_buffer_type_iface meta_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = mbuft_name,
    .alloc_buffer = mbuft_alloc,
    .get_alignment = mbuft_alignment,
    .get_max_size = mbuft_max_size,
    .get_alloc_size = mbuft_alloc_size,
};

/* ---- Backend ----------------------------------------------------------------------------- */

static const char *mbe_name(bp_backend *be)
{
    struct meta_backend *mb = bp_backend_get_context(be);
    return mb->md->name;
}

static void mbe_free(bp_backend *be)
{
    struct meta_backend *mb = bp_backend_get_context(be);
    meta_workers_stop(mb);
    if (mb->comm)
        mb->comm_free(mb->comm);
    for (int p = 0; p < mb->md->n; p++)
        bp_backend_free(mb->parts[p]);
    free(mb);
}

static enum bp_status mbe_sync(bp_backend *be)
{
    struct meta_backend *mb = bp_backend_get_context(be);
    enum bp_status st = BP_OK;
    for (int p = 0; p < mb->md->n && st == BP_OK; p++)
        st = bp_backend_synchronize(mb->parts[p]);
    return st;
}

static enum bp_status mbe_compute(bp_backend *be, bp_graph *g)
{
    return meta_graph_compute(bp_backend_get_context(be), g);
}

static enum bp_status meta_backend_stats(bp_backend *be, int *n_reduces, double *seconds)
{
    if (be == NULL)
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_backend_stats: backend is NULL");
    if (meta.reg == NULL || bp_device_get_registry(bp_backend_get_device(be)) != meta.reg)
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_backend_stats: '%s' is not a meta "
                            "backend", bp_backend_name(be));
    struct meta_backend *mb = bp_backend_get_context(be);
    if (n_reduces)
        *n_reduces = mb->n_reduces;
    if (seconds)
        *seconds = mb->reduce_seconds;
    return BP_OK;
}

static const struct bp_backend_iface meta_backend_iface = {
    .struct_size = sizeof(struct bp_backend_iface),
    .get_name = mbe_name,
    .free = mbe_free,
    .synchronize = mbe_sync,
    .graph_compute = mbe_compute,
};

/* ---- Device ------------------------------------------------------------------------------ */

static const char *mdev_name(bp_device *dev)
{
    return ((struct meta_dev *)bp_device_get_context(dev))->name;
}

static const char *mdev_desc(bp_device *dev)
{
    return ((struct meta_dev *)bp_device_get_context(dev))->description;
}

static void mdev_memory(bp_device *dev, size_t *f, size_t *t)
{
    struct meta_dev *md = bp_device_get_context(dev);
    *f = *t = 0;
    for (int p = 0; p < md->n; p++) {
        size_t pf, pt;
        bp_device_memory(md->parts[p], &pf, &pt);
        *f += pf;
        *t += pt;
    }
}

static enum bp_device_type mdev_type(bp_device *dev)
{
    (void)dev;
    return BP_DEVICE_TYPE_META;
}

static void mdev_caps(bp_device *dev, struct bp_device_caps *caps)
{
    struct meta_dev *md = bp_device_get_context(dev);
    *caps = (struct bp_device_caps){true, true, true, true};
    for (int p = 0; p < md->n; p++) {
        struct bp_device_props pr;
        bp_device_get_props(md->parts[p], &pr);
        caps->async &= pr.caps.async;
        caps->host_buffer &= pr.caps.host_buffer;
        caps->buffer_from_host_ptr = false;
        caps->events = false; /* the meta device has no events of its own yet */
    }
}

static bp_backend *mdev_init_backend(bp_device *dev, const char *params)
{
    struct meta_dev *md = bp_device_get_context(dev);
    struct meta_backend *mb = calloc(1, sizeof(*mb));
    if (mb == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", md->name);
        return NULL;
    }
    mb->md = md;
    for (int p = 0; p < md->n; p++) {
        mb->parts[p] = bp_device_init_backend(md->parts[p], params);
        if (mb->parts[p] == NULL) {
            for (int q = 0; q < p; q++)
                bp_backend_free(mb->parts[q]);
            free(mb);
            return NULL;
        }
        struct bp_device_props pr;
        bp_device_get_props(md->parts[p], &pr);
        mb->async[p] = pr.caps.async;
    }
    /* Collectives of the parts' registry, when all parts share one and it has them. */
    bp_registry *reg = bp_device_get_registry(md->parts[0]);
    bool same = true;
    for (int p = 1; p < md->n; p++)
        same &= bp_device_get_registry(md->parts[p]) == reg;
    const char *off = getenv("BP_META_NO_COMM");
    if (same && !(off && off[0] == '1')) {
        bp_comm_init_fn init = (bp_comm_init_fn)bp_registry_get_proc_address(reg, "bp_comm_init");
        mb->allreduce =
            (bp_comm_allreduce_fn)bp_registry_get_proc_address(reg, "bp_comm_allreduce");
        mb->comm_free = (bp_comm_free_fn)bp_registry_get_proc_address(reg, "bp_comm_free");
        if (init && mb->allreduce && mb->comm_free)
            mb->comm = init(mb->parts, md->n);
    }
    bp_backend *be = bp_backend_new(dev, &meta_backend_iface, mb);
    if (be == NULL) {
        if (mb->comm)
            mb->comm_free(mb->comm);
        for (int p = 0; p < md->n; p++)
            bp_backend_free(mb->parts[p]);
        free(mb);
    }
    return be;
}

static bp_buffer_type *mdev_buft(bp_device *dev)
{
    return ((struct meta_dev *)bp_device_get_context(dev))->buft;
}

static bool mdev_supports_op(bp_device *dev, const bp_tensor *op)
{
    struct meta_dev *md = bp_device_get_context(dev);
    for (int p = 0; p < md->n; p++) {
        if (!bp_device_supports_op(md->parts[p], op))
            return false;
    }
    return true;
}

static bool mdev_supports_buft(bp_device *dev, bp_buffer_type *buft)
{
    return buft == ((struct meta_dev *)bp_device_get_context(dev))->buft;
}

static const struct bp_device_iface meta_device_iface = {
    .struct_size = sizeof(struct bp_device_iface),
    .get_name = mdev_name,
    .get_description = mdev_desc,
    .get_memory = mdev_memory,
    .get_type = mdev_type,
    .get_caps = mdev_caps,
    .init_backend = mdev_init_backend,
    .get_buffer_type = mdev_buft,
    .supports_op = mdev_supports_op,
    .supports_buft = mdev_supports_buft,
};

/* ---- Registry ---------------------------------------------------------------------------- */

/* At most this many bytes of a user's string are quoted in a message (the message has a fixed
 * size, and the facts come before the quotes). */
#define SHOWN 96
#define SHOW(str) (int)(strlen(str) > SHOWN ? SHOWN : strlen(str)), (str), \
                  (strlen(str) > SHOWN ? "..." : "")

/* "Meta(A,B,...)" from the parts' names, on the heap (names have no length limit). */
static char *compose_name(bp_device *const *devices, int n)
{
    size_t len = sizeof("Meta()");
    for (int i = 0; i < n; i++)
        len += strlen(bp_device_name(devices[i])) + 1;
    char *name = malloc(len);
    if (name == NULL)
        return NULL;
    size_t used = (size_t)snprintf(name, len, "Meta(");
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(name + used, len - used, "%s%s", i ? "," : "",
                                 bp_device_name(devices[i]));
    snprintf(name + used, len - used, ")");
    return name;
}

/* The meta device over devices[0..n) with split policy (fn, user): one device per name, so
 * asking again for the same parts gives the device already made. A request without a policy
 * (fn NULL, as "Meta(...)" names make) takes the device whatever policy it was made with; a
 * request with a policy other than the existing device's is an error, since the policy decides
 * how that device's weights are stored. `who` starts every error message. */
static bp_device *device_for(bp_device *const *devices, int n, bp_meta_split_fn fn, void *user,
                             const char *who)
{
    for (int i = 0; i < n; i++) {
        if (devices[i] == NULL) {
            bp_set_error(BP_ERR_INVALID_ARG, "%s: device %d of %d is NULL", who, i, n);
            return NULL;
        }
        if (bp_device_get_type(devices[i]) == BP_DEVICE_TYPE_META) {
            bp_set_error(BP_ERR_INVALID_ARG, "%s: device %d ('%.*s%s') is itself a meta device; "
                         "a meta device cannot be a part of another", who, i,
                         SHOW(bp_device_name(devices[i])));
            return NULL;
        }
        for (int j = 0; j < i; j++) {
            if (devices[j] == devices[i]) {
                bp_set_error(BP_ERR_INVALID_ARG, "%s: device '%.*s%s' is listed twice (parts %d "
                             "and %d); each device can be one part only", who,
                             SHOW(bp_device_name(devices[i])), j, i);
                return NULL;
            }
        }
    }
    if (fn == NULL)
        user = NULL; /* no policy: the user data means nothing */
    char *name = compose_name(devices, n);
    if (name == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
        return NULL;
    }
    for (int k = 0; k < meta.n; k++) {
        struct meta_dev *md = meta.devs[k];
        if (strcasecmp(md->name, name) != 0)
            continue;
        bool same_parts = md->n == n;
        for (int i = 0; same_parts && i < n; i++)
            same_parts = md->parts[i] == devices[i];
        free(name);
        if (!same_parts) {
            bp_set_error(BP_ERR_INVALID_ARG, "%s: a meta device named '%.*s%s' already exists "
                         "over other devices of the same names", who, SHOW(md->name));
            return NULL;
        }
        if (fn != NULL && (md->split_fn != fn || md->split_user != user)) {
            bp_set_error(BP_ERR_INVALID_ARG, "%s: '%.*s%s' already exists with %s split policy; "
                         "one set of devices makes one meta device, so use that device (or ask "
                         "without a policy)", who, SHOW(md->name),
                         md->split_fn ? "another" : "the default");
            return NULL;
        }
        return md->dev;
    }
    if (meta.n == MAX_META_DEVICES) {
        free(name);
        bp_set_error(BP_ERR_CAPACITY, "%s: at most %d meta devices", who, MAX_META_DEVICES);
        return NULL;
    }
    struct meta_dev *md = calloc(1, sizeof(*md));
    if (md == NULL) {
        free(name);
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
        return NULL;
    }
    md->name = name;
    md->n = n;
    md->split_fn = fn;
    md->split_user = user;
    bp_meta_states_init(&md->states);
    for (int i = 0; i < n; i++)
        md->parts[i] = devices[i];
    snprintf(md->description, sizeof(md->description), "tensor parallelism over %d devices%s",
             n, fn ? " (user split policy)" : "");
    md->dev = bp_device_new(meta.reg, &meta_device_iface, md);
    md->buft = md->dev ? bp_buffer_type_new(md->dev, &meta_buft_iface, md) : NULL;
    if (md->buft == NULL) {
        free(md->name);
        free(md);
        return NULL; /* a device without a buffer type stays listed; it cannot be created */
    }
    meta.devs[meta.n++] = md;
    return md->dev;
}

/* The "bp_meta_device_new" proc address. */
static bp_device *meta_device_new(bp_device *const *devices, int n, bp_meta_split_fn fn,
                                  void *user)
{
    if (devices == NULL) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_device_new: the device array is NULL (n = %d)",
                     n);
        return NULL;
    }
    if (n < 1 || n > BP_META_MAX_DEVICES) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_device_new: need 1 to %d devices, got %d",
                     BP_META_MAX_DEVICES, n);
        return NULL;
    }
    return device_for(devices, n, fn, user, "bp_meta_device_new");
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* "Meta(A,B,...)": the meta device over the named devices (the default policy when it is new).
 * The whole name is parsed, with no length limit: "Meta(" in any case, one or more device names
 * separated by commas (spaces around a name are ignored), ")" and nothing after it. An empty
 * name, a device listed twice, a nested "(" and anything after the ")" are errors. */
static bp_backend *meta_init_by_name(const char *name, const char *params)
{
    if (name == NULL)
        return (bp_backend *)(bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_init_by_name: name is "
                                           "NULL"), NULL);
    if (strncasecmp(name, "Meta(", 5) != 0)
        return (bp_backend *)(bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s' is not of the form "
                                           "Meta(A,B,...)", SHOW(name)), NULL);
    bp_device *devs[BP_META_MAX_DEVICES];
    int n = 0;
    char *item = NULL; /* the current device name, NUL-terminated for the lookup */
    const char *p = name + 5;
    for (;;) {
        const char *start = p, *end = p + strcspn(p, ",()");
        const char sep = *end;
        while (start < end && is_space(*start))
            start++;
        const char *stop = end;
        while (stop > start && is_space(stop[-1]))
            stop--;
        if (sep == '\0') {
            bp_set_error(BP_ERR_INVALID_ARG, "no closing parenthesis in '%.*s%s' (the form is "
                         "Meta(A,B,...))", SHOW(name));
            goto fail;
        }
        if (sep == '(') {
            bp_set_error(BP_ERR_INVALID_ARG, "'(' inside '%.*s%s': a meta device cannot be a "
                         "part of another", SHOW(name));
            goto fail;
        }
        if (start == stop) {
            if (n == 0 && sep == ')')
                bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s' names no devices", SHOW(name));
            else
                bp_set_error(BP_ERR_INVALID_ARG, "device %d of '%.*s%s' is empty (an extra or "
                             "missing comma?)", n + 1, SHOW(name));
            goto fail;
        }
        if (n == BP_META_MAX_DEVICES) {
            bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s' names more than %d devices", SHOW(name),
                         BP_META_MAX_DEVICES);
            goto fail;
        }
        char *grown = realloc(item, (size_t)(stop - start) + 1);
        if (grown == NULL) {
            bp_set_error(BP_ERR_OUT_OF_MEMORY, "out of memory parsing '%.*s%s'", SHOW(name));
            goto fail;
        }
        item = grown;
        memcpy(item, start, (size_t)(stop - start));
        item[stop - start] = '\0';
        devs[n] = bp_device_by_name(item);
        if (devs[n] == NULL)
            goto fail; /* the lookup's error names the device and lists those that exist */
        n++;
        p = end + 1;
        if (sep == ')')
            break;
    }
    if (*p != '\0') {
        bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s' after the closing parenthesis of '%.*s%s'",
                     SHOW(p), SHOW(name));
        goto fail;
    }
    free(item);
    char who[SHOWN + 8];
    snprintf(who, sizeof(who), "'%.*s%s'", SHOW(name));
    bp_device *md = device_for(devs, n, NULL, NULL, who);
    return md ? bp_device_init_backend(md, params) : NULL;
fail:
    free(item);
    return NULL;
}

static const char *mreg_name(bp_registry *reg)
{
    (void)reg;
    return "Meta";
}

static size_t mreg_count(bp_registry *reg)
{
    (void)reg;
    return (size_t)meta.n;
}

static bp_device *mreg_device(bp_registry *reg, size_t i)
{
    (void)reg;
    return meta.devs[i]->dev;
}

static void *mreg_proc(bp_registry *reg, const char *name)
{
    (void)reg;
    if (strcmp(name, "bp_meta_device_new") == 0)
        return (void *)meta_device_new;
    if (strcmp(name, "bp_meta_init_by_name") == 0)
        return (void *)meta_init_by_name;
    if (strcmp(name, "bp_meta_backend_stats") == 0)
        return (void *)meta_backend_stats;
    if (strcmp(name, "bp_meta_buffer_part_bytes") == 0)
        return (void *)meta_buffer_part_bytes;
    return NULL;
}

static void mreg_free(bp_registry *reg)
{
    (void)reg;
    for (int i = 0; i < meta.n; i++) {
        bp_meta_ptab_close(&meta.devs[i]->states);
        free(meta.devs[i]->name);
        free(meta.devs[i]);
    }
    meta.n = 0;
    meta.reg = NULL;
}

static const struct bp_registry_iface meta_registry_iface = {
    .struct_size = sizeof(struct bp_registry_iface),
    .get_name = mreg_name,
    .get_device_count = mreg_count,
    .get_device = mreg_device,
    .get_proc_address = mreg_proc,
    .free = mreg_free,
};

static bp_registry *meta_plugin_init(void)
{
    meta.reg = bp_registry_new(&meta_registry_iface, NULL);
    return meta.reg;
}

BP_PLUGIN_DEFINE("meta", "", 0, meta_plugin_init, NULL);
