/* views.c - builders for copies and views: DUP, CPY, CONT, RESHAPE, VIEW, PERMUTE, TRANSPOSE.
 *
 * A view records the tensor that owns the data (view_src, never itself a view) and a byte
 * offset into it, so a view of a view still points straight at the owner. Every view is checked
 * against the owner's extent when it is built: an out-of-bounds view is refused here rather than
 * becoming an out-of-bounds access in some kernel later. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "bp-impl.h"

/* Names a derived tensor "<source name> (<what>)" when the source has a name. */
static void derive_name(bp_tensor *t, const bp_tensor *a, const char *what)
{
    if (a->name[0] != '\0')
        bp_format_name(t, "%.40s (%s)", a->name, what);
}

bp_tensor *bp_dup(bp_context *ctx, bp_tensor *a)
{
    if (a == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_dup: source tensor is NULL");
    bp_tensor *t = bp__new_tensor_impl(ctx, a->type, a->ne, "bp_dup");
    if (t == NULL)
        return NULL;
    t->op = BP_OP_DUP;
    t->src[0] = a;
    derive_name(t, a, "copy");
    return t;
}

bool bp__tensors_overlap(const bp_tensor *a, const bp_tensor *b)
{
    const bp_tensor *oa = a->view_src ? a->view_src : a, *ob = b->view_src ? b->view_src : b;
    size_t na = bp_nbytes(a), nb = bp_nbytes(b);
    if (oa != ob || na == 0 || nb == 0)
        return false;
    size_t sa = a->view_src ? a->view_offs : 0, sb = b->view_src ? b->view_offs : 0;
    return sa < sb + nb && sb < sa + na;
}

bp_tensor *bp_cpy(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    if (a == NULL || b == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_cpy: source and destination must not be NULL");
    /* Kernels copy element by element in any order (and convert types), so a source that
     * shares bytes with its destination would read values already overwritten. */
    if (bp__tensors_overlap(a, b))
        return bp__error_null(BP_ERR_INVALID_ARG,
                              "bp_cpy: source %s and destination %s overlap in the memory of %s; "
                              "copy the source with bp_cont first",
                              bp__describe(a).s, bp__describe(b).s,
                              bp__describe(b->view_src ? b->view_src : b).s);
    if (bp_nelements(a) != bp_nelements(b))
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_cpy: cannot copy %s (%lld elements) into %s (%lld elements)",
                              bp__describe(a).s, (long long)bp_nelements(a), bp__describe(b).s,
                              (long long)bp_nelements(b));
    bp_tensor *t = bp__view_of(ctx, b, "bp_cpy");
    if (t == NULL)
        return NULL;
    t->op = BP_OP_CPY;
    t->src[0] = a;
    t->src[1] = b;
    if (b->name[0] != '\0')
        bp_format_name(t, "%.30s (copy of %.20s)", b->name, a->name);
    return t;
}

bp_tensor *bp_cont(bp_context *ctx, bp_tensor *a)
{
    if (a == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_cont: source tensor is NULL");
    return bp_cont_4d(ctx, a, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
}

bp_tensor *bp_cont_4d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                      int64_t ne3)
{
    if (a == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_cont: source tensor is NULL");
    int64_t ne[BP_MAX_DIMS] = {ne0, ne1, ne2, ne3};
    int64_t count;
    if (ne0 < 0 || ne1 < 0 || ne2 < 0 || ne3 < 0 || !bp__count_elements(ne, &count) ||
        count != bp_nelements(a))
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_cont: cannot lay out %s as [%lld, %lld, %lld, %lld]: the element "
                              "counts differ",
                              bp__describe(a).s, (long long)ne0, (long long)ne1, (long long)ne2,
                              (long long)ne3);
    bp_tensor *t = bp__new_tensor_impl(ctx, a->type, ne, "bp_cont");
    if (t == NULL)
        return NULL;
    t->op = BP_OP_CONT;
    t->src[0] = a;
    derive_name(t, a, "cont");
    return t;
}

/* ---- Views ------------------------------------------------------------------------------ */

/* Bytes spanned by view v, as bp_nbytes() but refusing sizes that overflow. */
static bool view_extent(const bp_tensor *v, size_t *out)
{
    int64_t blck = bp_type_block_size(v->type);
    size_t n, step;
    if (!bp__mul_size((size_t)(v->ne[0] / blck), v->nb[0], &n))
        return false;
    for (int i = 1; i < BP_MAX_DIMS; i++) {
        if (!bp__mul_size((size_t)(v->ne[i] - 1), v->nb[i], &step) || !bp__add_size(n, step, &n))
            return false;
    }
    *out = n;
    return true;
}

/* The bytes that view v at byte offset offs of owner would reach must lie inside owner. */
static bool view_in_bounds(const bp_tensor *owner, size_t offs, const bp_tensor *v)
{
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        if (v->ne[i] == 0)
            return offs <= bp_nbytes(owner); /* an empty view reads nothing */
    }
    size_t extent, end;
    return view_extent(v, &extent) && bp__add_size(offs, extent, &end) &&
           end <= bp_nbytes(owner);
}

bp_tensor *bp_reshape(bp_context *ctx, bp_tensor *a, int n_dims, const int64_t *ne)
{
    if (a == NULL || ne == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_reshape: tensor and shape must not be NULL");
    if (n_dims < 1 || n_dims > BP_MAX_DIMS)
        return bp__error_null(BP_ERR_SHAPE, "bp_reshape: n_dims is %d, expected 1 to %d", n_dims,
                              BP_MAX_DIMS);
    int64_t full[BP_MAX_DIMS] = {1, 1, 1, 1};
    int64_t n;
    for (int i = 0; i < n_dims; i++) {
        if (ne[i] < 0)
            return bp__error_null(BP_ERR_SHAPE, "bp_reshape: dimension %d has negative size %lld",
                                  i, (long long)ne[i]);
        full[i] = ne[i];
    }
    if (!bp__count_elements(full, &n))
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_reshape: cannot reshape %s (%lld elements) to [%lld, %lld, %lld, "
                              "%lld]: that many elements do not fit in 64 bits",
                              bp__describe(a).s, (long long)bp_nelements(a), (long long)full[0],
                              (long long)full[1], (long long)full[2], (long long)full[3]);
    if (!bp_is_contiguous(a))
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_reshape: %s is not contiguous; apply bp_cont first",
                              bp__describe(a).s);
    if (n != bp_nelements(a))
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_reshape: cannot reshape %s (%lld elements) to [%lld, %lld, %lld, "
                              "%lld] (%lld elements)",
                              bp__describe(a).s, (long long)bp_nelements(a), (long long)full[0],
                              (long long)full[1], (long long)full[2], (long long)full[3],
                              (long long)n);
    bp_tensor *t = bp__new_tensor_impl(ctx, a->type, full, "bp_reshape");
    if (t == NULL)
        return NULL;
    t->view_src = a->view_src ? a->view_src : a;
    t->view_offs = a->view_offs;
    t->buffer = a->buffer;
    t->data = a->data;
    t->op = BP_OP_RESHAPE;
    t->src[0] = a;
    derive_name(t, a, "reshaped");
    return t;
}

bp_tensor *bp_reshape_1d(bp_context *ctx, bp_tensor *a, int64_t ne0)
{
    return bp_reshape(ctx, a, 1, (int64_t[]){ne0});
}

bp_tensor *bp_reshape_2d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1)
{
    return bp_reshape(ctx, a, 2, (int64_t[]){ne0, ne1});
}

bp_tensor *bp_reshape_3d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2)
{
    return bp_reshape(ctx, a, 3, (int64_t[]){ne0, ne1, ne2});
}

bp_tensor *bp_reshape_4d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                         int64_t ne3)
{
    return bp_reshape(ctx, a, 4, (int64_t[]){ne0, ne1, ne2, ne3});
}

static bp_tensor *view_impl(bp_context *ctx, bp_tensor *a, const int64_t ne[BP_MAX_DIMS],
                            const size_t nb_outer[3], size_t offset)
{
    if (a == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_view: source tensor is NULL");
    size_t esize = bp_type_size(a->type);
    if (offset % esize != 0)
        return bp__error_null(BP_ERR_INVALID_ARG,
                              "bp_view: offset %zu into %s is not a multiple of its element size "
                              "%zu",
                              offset, bp__describe(a).s, esize);
    for (int i = 0; i < 3; i++) {
        if (nb_outer[i] % esize != 0)
            return bp__error_null(BP_ERR_INVALID_ARG,
                                  "bp_view: stride nb%d = %zu of a view of %s is not a multiple of "
                                  "its element size %zu",
                                  i + 1, nb_outer[i], bp__describe(a).s, esize);
    }
    /* Check the extent on a scratch tensor first, so a refused view uses no context slot. */
    bp_tensor probe = {.type = a->type};
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        if (ne[i] < 0)
            return bp__error_null(BP_ERR_SHAPE, "bp_view: dimension %d has negative size %lld", i,
                                  (long long)ne[i]);
        probe.ne[i] = ne[i];
    }
    probe.nb[0] = esize;
    probe.nb[1] = nb_outer[0];
    probe.nb[2] = nb_outer[1];
    probe.nb[3] = nb_outer[2];
    bp_tensor *owner = a->view_src ? a->view_src : a;
    size_t offs;
    if (!bp__add_size(a->view_offs, offset, &offs))
        return bp__error_null(BP_ERR_OUT_OF_BOUNDS,
                              "bp_view: byte offset %zu into %s (itself at byte offset %zu of its "
                              "source) does not fit in size_t",
                              offset, bp__describe(a).s, a->view_offs);
    if (!view_in_bounds(owner, offs, &probe))
        return bp__error_null(BP_ERR_OUT_OF_BOUNDS,
                              "bp_view: a view %s at byte offset %zu reaches past the end of %s "
                              "(%zu bytes)",
                              bp__describe(&probe).s, offs, bp__describe(owner).s,
                              bp_nbytes(owner));

    bp_tensor *t = bp__new_tensor_impl(ctx, a->type, ne, "bp_view");
    if (t == NULL)
        return NULL;
    memcpy(t->nb, probe.nb, sizeof(t->nb));
    t->view_src = owner;
    t->view_offs = offs;
    t->buffer = a->buffer;
    if (owner->data != NULL)
        t->data = (char *)owner->data + offs;
    t->op = BP_OP_VIEW;
    t->src[0] = a;
    memcpy(t->op_params, &offset, sizeof(offset));
    derive_name(t, a, "view");
    return t;
}

bp_tensor *bp_view_1d(bp_context *ctx, bp_tensor *a, int64_t ne0, size_t offset)
{
    if (a == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_view: source tensor is NULL");
    size_t row = bp_row_size(a->type, ne0);
    const size_t nb[3] = {row, row, row};
    return view_impl(ctx, a, (int64_t[]){ne0, 1, 1, 1}, nb, offset);
}

bp_tensor *bp_view_2d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, size_t nb1,
                      size_t offset)
{
    const size_t nb[3] = {nb1, nb1 * (size_t)(ne1 > 0 ? ne1 : 0), nb1 * (size_t)(ne1 > 0 ? ne1 : 0)};
    return view_impl(ctx, a, (int64_t[]){ne0, ne1, 1, 1}, nb, offset);
}

bp_tensor *bp_view_3d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                      size_t nb1, size_t nb2, size_t offset)
{
    const size_t nb[3] = {nb1, nb2, nb2 * (size_t)(ne2 > 0 ? ne2 : 0)};
    return view_impl(ctx, a, (int64_t[]){ne0, ne1, ne2, 1}, nb, offset);
}

bp_tensor *bp_view_4d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                      int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset)
{
    const size_t nb[3] = {nb1, nb2, nb3};
    return view_impl(ctx, a, (int64_t[]){ne0, ne1, ne2, ne3}, nb, offset);
}

bp_tensor *bp_permute(bp_context *ctx, bp_tensor *a, int p0, int p1, int p2, int p3)
{
    if (a == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_permute: source tensor is NULL");
    const int p[BP_MAX_DIMS] = {p0, p1, p2, p3};
    int seen = 0;
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        if (p[i] < 0 || p[i] >= BP_MAX_DIMS || (seen & (1 << p[i])))
            return bp__error_null(BP_ERR_INVALID_ARG,
                                  "bp_permute: (%d, %d, %d, %d) is not a permutation of the axes "
                                  "0..3 of %s",
                                  p0, p1, p2, p3, bp__describe(a).s);
        seen |= 1 << p[i];
    }
    if (bp_type_block_size(a->type) > 1 && p0 != 0)
        return bp__error_null(BP_ERR_TYPE,
                              "bp_permute: cannot move axis 0 of quantised tensor %s: its rows "
                              "are stored as blocks",
                              bp__describe(a).s);
    bp_tensor *t = bp__view_of(ctx, a, "bp_permute");
    if (t == NULL)
        return NULL;
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        t->ne[p[i]] = a->ne[i];
        t->nb[p[i]] = a->nb[i];
    }
    t->op = BP_OP_PERMUTE;
    t->src[0] = a;
    for (int i = 0; i < BP_MAX_DIMS; i++)
        t->op_params[i] = p[i];
    derive_name(t, a, "permuted");
    return t;
}

bp_tensor *bp_transpose(bp_context *ctx, bp_tensor *a)
{
    if (a == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_transpose: source tensor is NULL");
    if (bp_type_block_size(a->type) > 1)
        return bp__error_null(BP_ERR_TYPE,
                              "bp_transpose: cannot transpose quantised tensor %s: its rows are "
                              "stored as blocks",
                              bp__describe(a).s);
    bp_tensor *t = bp__view_of(ctx, a, "bp_transpose");
    if (t == NULL)
        return NULL;
    t->ne[0] = a->ne[1];
    t->ne[1] = a->ne[0];
    t->nb[0] = a->nb[1];
    t->nb[1] = a->nb[0];
    t->op = BP_OP_TRANSPOSE;
    t->src[0] = a;
    derive_name(t, a, "transposed");
    return t;
}
