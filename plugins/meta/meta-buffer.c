/* meta-buffer.c - meta buffers and their buffer type: where a tensor of a meta buffer lives on
 * each part, storage made at first use, writes, and reads that put a tensor together again.
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
#include <sys/mman.h>

#include <backplane/bp-cpu.h>

#include "meta-impl.h"
#include "meta-rules.h"

static const struct bp_meta_split MIRROR = {.state = BP_META_MIRRORED};

/* ---- Where tensors live ------------------------------------------------------------------ */

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

void *bp_meta_part_address(const bp_tensor *t, int part)
{
    struct meta_buf *mb = bp_buffer_get_context(t->buffer);
    struct meta_slot *sl = mb->materialized ? NULL : slot_at(mb, t->data);
    if (sl != NULL)
        return sl->part[part] == NULL ? NULL /* a part on another process */
                                      : (char *)bp_buffer_get_base(sl->part[part]) +
                                            ((const char *)t->data - sl->data);
    if (!mb->materialized || mb->parts[part] == NULL)
        return NULL;
    return (char *)bp_buffer_get_base(mb->parts[part]) + ((const char *)t->data - mb->reserve);
}

bp_buffer *bp_meta_part_buffer(const bp_tensor *t, int part)
{
    struct meta_buf *mb = bp_buffer_get_context(t->buffer);
    struct meta_slot *sl = mb->materialized ? NULL : slot_at(mb, t->data);
    return sl != NULL ? sl->part[part] : mb->parts[part];
}

const struct meta_slot *bp_meta_sliced_slot(const bp_tensor *t)
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
        if (!bp_meta_local(mb->md, p))
            continue; /* held by its own process */
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

bool bp_meta_inside_slices(const bp_tensor *t)
{
    if (t->buffer == NULL)
        return false;
    struct meta_buf *mb = bp_buffer_get_context(t->buffer);
    const struct meta_slot *sl = mb->materialized ? NULL : slot_at(mb, t->data);
    if (sl == NULL || !sl->sliced)
        return false;
    const bp_tensor *w = owner_of(t);
    return sl->data != (const char *)t->data || memcmp(t->ne, w->ne, sizeof(t->ne)) != 0 ||
           memcmp(t->nb, w->nb, sizeof(t->nb)) != 0;
}

enum bp_status bp_meta_refuse_inside_slices(const struct meta_dev *md, const bp_tensor *t,
                                            const char *what)
{
    char desc[BP_TENSOR_DESC_SIZE], wdesc[BP_TENSOR_DESC_SIZE];
    return bp_set_error(BP_ERR_UNSUPPORTED, "%s: %s of %s: it is a view into the weight %s, "
                        "which the split callback stores in slices (each part holds only its "
                        "own, packed); use the weight itself, or let the callback store it whole",
                        md->name, what, bp_describe_tensor(t, desc, sizeof(desc)),
                        bp_describe_tensor(owner_of(t), wdesc, sizeof(wdesc)));
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

/* Whether weight w is stored sliced, and in which split: when the split callback splits a
 * contiguous matrix, or stack of matrices [K, M, n, 1] (MUL_MAT_ID's experts), along its rows
 * (axis 1: the same rows of every matrix) or, in whole blocks, its columns (axis 0). An invalid
 * answer is an error, so a bad callback never gets a weight stored or computed. */
static enum bp_status sliced_split(struct meta_dev *md, const bp_tensor *w, bool *sliced,
                                   struct bp_meta_split *out)
{
    *sliced = false;
    if (md->split_fn == NULL || w->ne[3] != 1 || !bp_is_contiguous(w))
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

/* Bytes of part p's packed slice: its rows (of every matrix), or its columns of every row. */
static size_t slice_bytes(const bp_tensor *w, const struct bp_meta_split *s, int p)
{
    return s->axis == 1 ? (size_t)s->sizes[p] * w->nb[1] * (size_t)w->ne[2]
                        : (size_t)(w->ne[1] * w->ne[2]) * bp_row_size(w->type, s->sizes[p]);
}

/* Part p's packed slice of weight w in split s as a tensor description: w's shape with the
 * slice's extent on the split axis, contiguous (no buffer, no data). */
static bp_tensor packed_desc(const bp_tensor *w, const struct bp_meta_split *s, int p)
{
    bp_tensor d = *w;
    d.view_src = NULL;
    d.view_offs = 0;
    d.buffer = NULL;
    d.data = NULL;
    d.ne[s->axis] = s->sizes[p];
    d.nb[0] = bp_type_size(w->type);
    d.nb[1] = bp_row_size(w->type, d.ne[0]);
    d.nb[2] = d.nb[1] * (size_t)d.ne[1];
    d.nb[3] = d.nb[2] * (size_t)d.ne[2];
    return d;
}

/* Where part p keeps its slice of weight w: in the layout its device multiplies such weights
 * fastest in when its plugin offers one for weights of w's type (the CPU's row-interleaved
 * CPU_REPACK, for the types its loaded variant repacks, as a CPU device's own weights get it),
 * else its default buffer type. BP_META_NO_REPACK=1 keeps every slice in the default one. */
static bp_buffer_type *slice_buffer_type(const struct meta_dev *md, const bp_tensor *w, int p)
{
    bp_device *dev = md->parts[p];
    const char *off = getenv("BP_META_NO_REPACK");
    if (!(off && off[0] == '1')) {
        bp_registry *reg = bp_device_get_registry(dev);
        void *tproc = bp_registry_get_proc_address(reg, "bp_cpu_repack_type");
        void *bproc = bp_registry_get_proc_address(reg, "bp_cpu_repack_buffer_type");
        bp_cpu_repack_type_fn stores;
        bp_cpu_repack_buffer_type_fn get;
        memcpy(&stores, &tproc, sizeof(stores));
        memcpy(&get, &bproc, sizeof(get));
        bp_buffer_type *buft =
            tproc != NULL && bproc != NULL && stores(dev, w->type) ? get(dev) : NULL;
        bp_clear_error();
        if (buft != NULL)
            return buft;
    }
    return bp_device_get_buffer_type(dev);
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
    n.type = w->type;
    memcpy(n.ne, w->ne, sizeof(n.ne));
    enum bp_status st = sliced_split(mb->md, w, &n.sliced, &n.s);
    for (int p = 0; p < mb->md->n && st == BP_OK; p++) {
        const size_t bytes = n.sliced ? slice_bytes(w, &n.s, p) : n.nbytes;
        n.part_bytes[p] = bytes;
        if (!bp_meta_local(mb->md, p))
            continue; /* its process stores it */
        bp_buffer_type *buft = n.sliced ? slice_buffer_type(mb->md, w, p)
                                         : bp_device_get_buffer_type(mb->md->parts[p]);
        size_t alloc = bytes;
        if (n.sliced) { /* (a layout of its own may take more: CPU_REPACK pads row groups) */
            const bp_tensor d = packed_desc(w, &n.s, p);
            const size_t a = bp_buffer_type_get_alloc_size(buft, &d);
            alloc = a > alloc ? a : alloc;
        }
        n.part[p] = bp_buffer_type_alloc(buft, alloc);
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

enum bp_status bp_meta_prepare(const bp_tensor *t)
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
    v.buffer = bp_meta_part_buffer(t, p);
    v.data = bp_meta_part_address(t, p);
    return v;
}

/* ---- Tensors as a part sees them ------------------------------------------------------- */

/* t in state s as part p sees it, laid out like t in (buf, base): sliced when s is SPLIT. */
bp_tensor *bp_meta_shadow_at(bp_context *ctx, const bp_tensor *t, const struct bp_meta_split *s,
                             int p, bp_buffer *buf, void *base)
{
    int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    size_t offs = 0;
    if (s->state == BP_META_SPLIT) {
        ne[s->axis] = s->sizes[p];
        int64_t start = bp_meta_split_start(s, p);
        offs = (size_t)(start / bp_type_block_size(t->type)) * t->nb[s->axis];
        if (s->axis != 0)
            offs = (size_t)start * t->nb[s->axis];
    }
    bp_tensor *sh = bp_new_tensor_4d(ctx, t->type, ne[0], ne[1], ne[2], ne[3]);
    if (sh == NULL)
        return NULL;
    memcpy(sh->nb, t->nb, sizeof(sh->nb));
    memcpy(sh->op_params, t->op_params, sizeof(sh->op_params));
    memcpy(sh->name, t->name, sizeof(sh->name));
    sh->buffer = buf;
    sh->data = (char *)base + offs;
    return sh;
}

/* Part p's packed slice of a sliced weight: rows of the slice's own width. */
bp_tensor *bp_meta_packed_shadow(bp_context *ctx, const bp_tensor *t, const struct meta_slot *sl,
                                 int p)
{
    int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    ne[sl->s.axis] = sl->s.sizes[p];
    bp_tensor *sh = bp_new_tensor_4d(ctx, t->type, ne[0], ne[1], ne[2], ne[3]);
    if (sh == NULL)
        return NULL;
    memcpy(sh->op_params, t->op_params, sizeof(sh->op_params));
    memcpy(sh->name, t->name, sizeof(sh->name));
    sh->buffer = sl->part[p];
    sh->data = bp_buffer_get_base(sl->part[p]);
    return sh; /* strides: bp_new_tensor_4d's contiguous ones, the packed layout */
}

/* t as part p sees it in state s: a tensor on the part's memory, sliced when s is SPLIT. */
bp_tensor *bp_meta_shadow(bp_context *ctx, const struct meta_dev *md, const bp_tensor *t,
                          const struct bp_meta_split *s, int p)
{
    const struct meta_slot *sl = bp_meta_sliced_slot(t);
    if (sl != NULL) {
        if (bp_meta_same_state(s, &sl->s, md->n))
            return bp_meta_packed_shadow(ctx, t, sl, p);
        char desc[BP_TENSOR_DESC_SIZE];
        bp_set_error(BP_ERR_UNSUPPORTED, "%s: %s is stored in slices; it cannot be used or "
                     "written in another state here", md->name,
                     bp_describe_tensor(t, desc, sizeof(desc)));
        return NULL;
    }
    return bp_meta_shadow_at(ctx, t, s, p, bp_meta_part_buffer(t, p), bp_meta_part_address(t, p));
}

/* Copies src's elements into dst (same shape, other memory, each with its own strides), row
 * by row when both have contiguous rows. */
enum bp_status bp_meta_copy_rows(const bp_tensor *src, bp_tensor *dst, char *tmp)
{
    if (bp_nelements(src) == 0)
        return BP_OK;
    const size_t esz = bp_type_size(src->type);
    const bool rows = src->nb[0] == esz && dst->nb[0] == esz;
    const size_t seg = rows ? bp_row_size(src->type, src->ne[0]) : esz;
    for (int64_t i3 = 0; i3 < src->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < src->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < src->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < (rows ? 1 : src->ne[0]); i0++) {
                    size_t off = (size_t)i0 * src->nb[0] + (size_t)i1 * src->nb[1] +
                                 (size_t)i2 * src->nb[2] + (size_t)i3 * src->nb[3];
                    size_t doff = (size_t)i0 * dst->nb[0] + (size_t)i1 * dst->nb[1] +
                                  (size_t)i2 * dst->nb[2] + (size_t)i3 * dst->nb[3];
                    enum bp_status st = bp_tensor_get(src, tmp, off, seg);
                    if (st == BP_OK)
                        st = bp_tensor_set(dst, tmp, doff, seg);
                    if (st != BP_OK)
                        return st;
                }
    return BP_OK;
}

/* Where part p's slice of a sliced weight t sits in a whole copy of t at (buf, base). */
bp_tensor bp_meta_slice_in_whole(const bp_tensor *t, const struct meta_slot *sl, int p,
                                 const bp_tensor *packed, bp_buffer *buf, char *base)
{
    bp_tensor to = *packed;
    memcpy(to.nb, t->nb, sizeof(to.nb));
    to.buffer = buf;
    to.data = base + (sl->s.axis == 1 ? (size_t)bp_meta_split_start(&sl->s, p) * t->nb[1]
                                      : bp_row_size(t->type, bp_meta_split_start(&sl->s, p)));
    return to;
}

/* ---- Reading ----------------------------------------------------------------------------- */

/* Reads bytes [offset, offset + size) of t as the value its state represents: the parts' slices
 * put together, the parts' summands added up, or part 0's copy. */
static enum bp_status read_tensor(struct meta_dev *md, const bp_tensor *t, void *data,
                                  size_t offset, size_t size)
{
    const struct meta_slot *sl = bp_meta_sliced_slot(t);
    const struct bp_meta_split state = sl != NULL ? sl->s : bp_meta_state_get(&md->states, t);
    const struct bp_meta_split *s = &state;
    const size_t bytes = bp_nbytes(t);
    char *full = malloc(bytes + 64), *tmp = malloc(bytes + 64);
    enum bp_status st = BP_OK;
    if (full == NULL || tmp == NULL) {
        st = bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory reading '%s'", md->name,
                          t->name);
        goto done;
    }
    bp_context *ctx = bp_context_new((size_t)md->n + 4);
    if (ctx == NULL) {
        st = bp_last_status();
        goto done;
    }
    for (int p = 0; p < md->n && st == BP_OK; p++)
        if (!bp_meta_local(md, p) && (s->state == BP_META_PARTIAL ||
                                      (s->state == BP_META_SPLIT && s->sizes[p] > 0)))
            st = bp_set_error(BP_ERR_UNSUPPORTED, "%s: cannot read '%s' here: part %d holds %s "
                              "of it on rank %d (%s)", md->name, t->name, p,
                              s->state == BP_META_SPLIT ? "a slice" : "a partial sum",
                              md->rank[p], sl != NULL
                                  ? "a weight stored in slices across processes is not read "
                                    "back whole; keep the values it was written from"
                                  : "mark it an output with bp_set_output, and the computation "
                                    "gathers it on every rank");
    if (st != BP_OK) {
        bp_context_free(ctx);
        goto done;
    }
    if (s->state == BP_META_SPLIT) {
        /* Every part's slice, in place, in one host copy of the whole tensor. */
        bp_tensor host = *t;
        host.view_src = NULL;
        host.buffer = bp_buffer_from_host_ptr(full, bytes);
        host.data = full;
        if (host.buffer == NULL)
            st = bp_last_status();
        for (int p = 0; p < md->n && st == BP_OK; p++) {
            if (s->sizes[p] == 0)
                continue;
            bp_tensor *from = bp_meta_shadow(ctx, md, t, s, p);
            if (from == NULL) {
                st = bp_last_status();
                break;
            }
            bp_tensor to = *from;
            if (sl != NULL) {
                to = bp_meta_slice_in_whole(t, sl, p, from, host.buffer, full);
            } else {
                to.buffer = host.buffer;
                to.data = full + ((char *)from->data - (char *)bp_meta_part_address(t, p));
            }
            st = bp_meta_copy_rows(from, &to, tmp);
        }
        bp_buffer_free(host.buffer);
    } else {
        bp_tensor *p0 = bp_meta_shadow(ctx, md, t, &MIRROR, bp_meta_first_local(md));
        st = p0 ? bp_tensor_get(p0, full, 0, bytes) : bp_last_status();
        if (st == BP_OK && s->state == BP_META_PARTIAL && t->type != BP_TYPE_F32)
            st = bp_set_error(BP_ERR_TYPE, "%s: cannot read '%s': it holds partial sums of type "
                              "%s, which only f32 supports", md->name, t->name,
                              bp_type_name(t->type));
        if (s->state == BP_META_PARTIAL && t->type == BP_TYPE_F32) {
            for (int p = 1; p < md->n && st == BP_OK; p++) {
                bp_tensor *pp = bp_meta_shadow(ctx, md, t, &MIRROR, p);
                st = pp ? bp_tensor_get(pp, tmp, 0, bytes) : bp_last_status();
                for (size_t i = 0; st == BP_OK && i < bytes / sizeof(float); i++)
                    ((float *)full)[i] += ((float *)tmp)[i];
            }
        }
    }
    if (st == BP_OK)
        memcpy(data, full + offset, size);
    bp_context_free(ctx);
done:
    free(full);
    free(tmp);
    return st;
}

/* ---- The buffer and buffer type interfaces ---------------------------------------------- */

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
            if (mb->slots[i].part[p] != NULL)
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
    const int64_t M = w->ne[1]; /* rows of each matrix: a row split takes the same of each */
    for (int64_t r = (int64_t)(off / row); r < (int64_t)((off + n) / row) && st == BP_OK; r++) {
        const char *src = d ? d + ((size_t)r * row - off) : NULL;
        const int64_t mat = r / M, m = r % M;
        for (int p = 0; p < mb->md->n && st == BP_OK; p++) {
            if (sl->part[p] == NULL)
                continue; /* a part on another process: its own rank stores its share */
            /* The packed slice as computations see it (bp_meta_packed_shadow), so that a
             * buffer that lays weights out its own way places these bytes where they go. */
            bp_tensor dst = packed_desc(w, &sl->s, p);
            dst.buffer = sl->part[p];
            dst.data = bp_buffer_get_base(sl->part[p]);
            size_t to, from, len;
            if (sl->s.axis == 1) {
                if (m < start[p] || m >= start[p] + sl->s.sizes[p])
                    continue;
                to = (size_t)(mat * sl->s.sizes[p] + m - start[p]) * row;
                from = 0;
                len = row;
            } else {
                len = bp_row_size(w->type, sl->s.sizes[p]);
                to = (size_t)r * len;
                from = bp_row_size(w->type, start[p]);
            }
            if (len == 0)
                continue;
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
    enum bp_status st = bp_meta_prepare(t);
    if (st != BP_OK)
        return st;
    if (bp_meta_inside_slices(t))
        return bp_meta_refuse_inside_slices(mb->md, t, d ? "a write" : "a memset");
    const struct meta_slot *sl = bp_meta_sliced_slot(t);
    if (sl != NULL)
        return scatter(mb, sl, owner_of(t), d, off, n, v);
    for (int p = 0; p < mb->md->n; p++) {
        if (!bp_meta_local(mb->md, p))
            continue;
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
    enum bp_status st = bp_meta_prepare(t);
    if (st == BP_OK && bp_meta_inside_slices(t))
        return bp_meta_refuse_inside_slices(mb->md, t, "a read");
    return st == BP_OK ? read_tensor(mb->md, t, d, off, n) : st;
}

/* Part p of slot sl set to v. A slice in a buffer with a layout of its own (CPU_REPACK) may keep
 * its blocks in other bytes than a plain copy would (the super-block types' widened scales):
 * memset through the slice's description makes them read back as v too. */
static enum bp_status clear_slot(const struct meta_slot *sl, int p, uint8_t v)
{
    if (sl->part[p] == NULL)
        return BP_OK;
    enum bp_status st = bp_buffer_clear(sl->part[p], v);
    if (st != BP_OK || !sl->sliced || v == 0)
        return st;
    bp_tensor w;
    memset(&w, 0, sizeof(w));
    w.type = sl->type;
    memcpy(w.ne, sl->ne, sizeof(w.ne));
    bp_tensor dst = packed_desc(&w, &sl->s, p);
    dst.buffer = sl->part[p];
    dst.data = bp_buffer_get_base(sl->part[p]);
    return bp_tensor_memset(&dst, v, 0, bp_nbytes(&dst));
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
            st = clear_slot(&mb->slots[i], p, v);
        if (st != BP_OK)
            return st;
    }
    /* Everything is now the same bytes on every part; a sliced weight keeps its split, which
     * its slot (not the state table) says. */
    bp_meta_states_forget(&mb->md->states, buf);
    return BP_OK;
}

size_t bp_meta_buffer_bytes_on(bp_buffer *buf, int part)
{
    struct meta_buf *mb = bp_buffer_get_context(buf);
    /* A part on another process: what that process holds, known from the same splits. */
    size_t bytes = mb->parts[part] ? bp_buffer_get_size(mb->parts[part])
                   : mb->materialized && !bp_meta_local(mb->md, part) ? mb->size
                                                                      : 0;
    for (size_t i = 0; i < mb->n_slots; i++)
        bytes += mb->slots[i].part[part] ? bp_buffer_get_size(mb->slots[i].part[part])
                                         : mb->slots[i].part_bytes[part];
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
        if (!bp_meta_local(md, p))
            continue;
        size_t x = bp_buffer_type_get_alignment(bp_device_get_buffer_type(md->parts[p]));
        a = x > a ? x : a;
    }
    return a;
}

static size_t mbuft_max_size(bp_buffer_type *buft)
{
    struct meta_dev *md = bp_buffer_type_get_context(buft);
    size_t m = SIZE_MAX;
    for (int p = 0; p < md->n; p++) {
        if (!bp_meta_local(md, p))
            continue;
        size_t x = bp_buffer_type_get_max_size(bp_device_get_buffer_type(md->parts[p]));
        m = x < m ? x : m;
    }
    return m;
}

static size_t mbuft_alloc_size(bp_buffer_type *buft, const bp_tensor *t)
{
    struct meta_dev *md = bp_buffer_type_get_context(buft);
    size_t m = 0;
    for (int p = 0; p < md->n; p++) {
        if (!bp_meta_local(md, p))
            continue;
        size_t x = bp_buffer_type_get_alloc_size(bp_device_get_buffer_type(md->parts[p]), t);
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

bp_buffer_type *bp_meta_buffer_type_new(struct meta_dev *md)
{
    return bp_buffer_type_new(md->dev, &meta_buft_iface, md);
}
