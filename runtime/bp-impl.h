/* bp-impl.h - private to runtime/: internal helpers shared between the library's files.
 * Never installed and never included by plugins, which see only include/backplane/. */
#ifndef BACKPLANE_BP_IMPL_H
#define BACKPLANE_BP_IMPL_H

#include <backplane/backplane.h>

#include <stdio.h>
#include <sys/types.h>
#include "escape.h"

/* Broken internal invariant: print where and abort. Never for anything a user controls. */
#define BP_ASSERT(cond)                                                                        \
    do {                                                                                       \
        if (!(cond))                                                                           \
            bp__assert_fail(__FILE__, __LINE__, #cond);                                        \
    } while (0)

void bp__assert_fail(const char *file, int line, const char *cond) __attribute__((noreturn));

/* "s" unless n is 1, for messages that count things: "%zu device%s", n, BP_PLURAL(n). */
#define BP_PLURAL(n) ((n) == 1 ? "" : "s")

/* Records status and a one-sentence message for bp_last_error() on this thread and returns
 * status, so that error paths read `return bp__error(BP_ERR_SHAPE, "...", ...);`. */
enum bp_status bp__error(enum bp_status status, const char *fmt, ...) BP_PRINTF(2, 3);
enum bp_status bp__verror(enum bp_status status, const char *fmt, va_list ap);

/* src escaped by bp__escape_controls (escape.h) into a new allocation of the right size
 * (bp__free it); NULL when out of memory. */
char *bp__escape_dup(const char *src, const char *what);

/* The library's one allocation path, so out-of-memory handling can be exercised by tests.
 * On failure they set bp_last_error() (naming `what`) and return NULL. */
/* True when fault injection wants this allocation to fail (see mem.c); false otherwise. */
bool bp__fault(size_t size, const char *what);
void *bp__malloc(size_t size, const char *what);
void *bp__calloc(size_t n, size_t size, const char *what);
void *bp__realloc(void *p, size_t size, const char *what);
void bp__free(void *p);
char *bp__strdup(const char *s, const char *what);
/* A formatted string of any length on the heap (free with bp__free), so that paths and names
 * are never cut at a fixed buffer size; NULL with the error set when memory runs out. */
char *bp__asprintf(const char *what, const char *fmt, ...) BP_PRINTF(2, 3);
char *bp__vasprintf(const char *what, const char *fmt, va_list ap);
/* s (heap or NULL) with the formatted text appended; on failure s is freed and NULL returned,
 * so a string can be built in a loop with one check per step. */
char *bp__strcat_printf(char *s, const char *what, const char *fmt, ...) BP_PRINTF(3, 4);
/* Makes the array *p (of *cap elements of elem bytes) hold at least need elements, doubling
 * its capacity (from 8) so that appending one at a time stays linear. The contents are kept
 * and the new elements are not initialised. False with the error set (naming what) when memory
 * runs out or the size overflows; *p and *cap are then unchanged. */
bool bp__grow(void **p, size_t *cap, size_t need, size_t elem, const char *what);

/* Overflow-checked size arithmetic: false when the result does not fit. */
static inline bool bp__mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool bp__add_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* Product of the four sizes; false when the product of the nonzero ones does not fit in
 * int64_t, so that any product of some of the sizes (a slice, a row count, a loop bound) fits
 * too, even for an empty tensor. */
static inline bool bp__count_elements(const int64_t ne[4], int64_t *out)
{
    int64_t n = 1;
    bool empty = false;
    for (int i = 0; i < 4; i++) {
        if (ne[i] == 0)
            empty = true;
        else if (__builtin_mul_overflow(n, ne[i], &n))
            return false;
    }
    *out = empty ? 0 : n;
    return true;
}

/* Op-table lookups used by builders and the graph (runtime/ops.c). */
bool bp__op_valid(enum bp_op op);

/* Makes a new tensor in ctx with shape ne and contiguous strides, or NULL (error set). Used by
 * the builders; `op_name` goes into the error message. */
bp_tensor *bp__new_tensor_impl(bp_context *ctx, enum bp_type type, const int64_t ne[BP_MAX_DIMS],
                               const char *op_name);
/* Whether a and b reach common bytes of one tensor's memory (one is a view of the other, or
 * both views of one source, with intersecting byte ranges). */
bool bp__tensors_overlap(const bp_tensor *a, const bp_tensor *b);

/* A view of a with a's shape and strides (view_src/view_offs set to reach a's data). */
bp_tensor *bp__view_of(bp_context *ctx, bp_tensor *a, const char *op_name);

/* Replaces g's contents with the given nodes and leafs, in this order (the caller guarantees it
 * is a valid execution order). BP_ERR_CAPACITY when they do not fit. */
enum bp_status bp__graph_set(bp_graph *g, bp_tensor *const *nodes, int n_nodes,
                             bp_tensor *const *leafs, int n_leafs);

/* The node and leaf arrays of g, for the runtime's own loops (no bounds checks). */
bp_tensor **bp__graph_nodes(const bp_graph *g);
/* A hash of everything about g's nodes and leafs that decides placement and memory (graph.c). */
uint64_t bp__graph_fingerprint(const bp_graph *g);

/* sched-experts.c: whether copy (of src, an input of the split whose graph is sg) is read only
 * as the stacked experts of MUL_MAT_ID nodes, and (*ids_known) whether their ids are known
 * before the split runs; then bp__sched_copy_experts copies into it only the experts the ids
 * choose (waiting for every backend first: the ids come from any of them). */
bool bp__sched_experts_only(const bp_graph *sg, const bp_tensor *src, const bp_tensor *copy,
                            bool *ids_known);
struct bp__expert_caches;
struct bp__expert_caches *bp__expert_caches_new(void);
void bp__expert_caches_free(struct bp__expert_caches *ec);
void bp__expert_caches_clear(struct bp__expert_caches *ec); /* every cache emptied and freed */
/* ... copying into copy on backend b, through ec's cache of `slots` experts for src there when
 * slots > 0, counting into *stats. ug, the user's graph (NULL: unknown), names unnamed tensors
 * in messages (bp__describe_in). With a cache that can hold every used expert, the products
 * read them in place there instead: swaps[] (room for 2 * 16) then lists the sources to give
 * them for this compute (the caller swaps them and puts them back after). */
struct bp__expert_swap {
    bp_tensor *node;
    int slot;
    bp_tensor *to;
};
enum bp_status bp__sched_copy_experts(bp_backend *const *backends, int n_backends, int b,
                                      const bp_graph *ug, const bp_graph *sg, bp_tensor *src,
                                      bp_tensor *copy,
                                      struct bp__expert_caches *ec, int slots,
                                      struct bp_sched_expert_stats *stats,
                                      struct bp__expert_swap *swaps, int *n_swaps);
/* Queues, for ec's copy thread, the experts of src that ids (known now) names and that the
 * cache of src on backend b lacks, into its least recently used slots (ug: as above). */
enum bp_status bp__sched_prefetch_experts(bp_backend *const *backends, int b,
                                          const bp_graph *ug, const bp_tensor *src,
                                          const bp_tensor *ids,
                                          struct bp__expert_caches *ec, int slots,
                                          struct bp_sched_expert_stats *stats);
/* Waits for the copy thread's jobs under way and drops those not started, adding the wait and
 * the copy thread's time into *stats. */
void bp__expert_caches_drain(struct bp__expert_caches *ec, struct bp_sched_expert_stats *stats);
/* Whether buf is (or was: freed when it grew) one of ga's compute buffers; compares pointers
 * only, so a freed buffer is never read. */
bool bp__gallocr_owns(const bp_gallocr *ga, const bp_buffer *buf);
/* The index of the buffer type whose compute buffer last failed to grow (its size asked in
 * *size), or -1 when the last growth succeeded or none was tried. */
int bp__gallocr_failed(const bp_gallocr *ga, size_t *size);
bp_tensor **bp__graph_leafs(const bp_graph *g);

/* ---- Files a user names (files.c) ----
 * "a directory", "a FIFO", "a character device", ... for messages. */
const char *bp__file_kind(mode_t mode);
struct stat;
/* Opens path for reading without blocking (a FIFO with no writer, a terminal) and refuses,
 * with BP_ERR_IO and a sentence naming `what` and path, anything fstat does not call a regular
 * file. The descriptor (close-on-exec, O_NONBLOCK cleared) with *st filled in, or -1. */
int bp__open_regular(const char *path, const char *what, struct stat *st);
/* Replacing a file: bp__replace_open resolves symbolic links in path to the file they name
 * (which is replaced, the links stay), refuses a target that exists and is not a regular file,
 * and opens a temporary file beside the target with its owner and permissions (a new file's:
 * 0666 less the umask) as r->f. Write to r->f, then bp__replace_commit syncs it, renames it
 * over the target and syncs the directory, or bp__replace_abort removes it; either way the
 * target is untouched until the rename and nothing is left behind after a failure. `what`
 * names the file in messages ("GGUF file"), path is what the user gave. */
struct bp__replace {
    FILE *f;
    int fd;
    char *target, *tmp;
    const char *what;
};
bool bp__replace_open(struct bp__replace *r, const char *path, const char *what);
enum bp_status bp__replace_commit(struct bp__replace *r, const char *path);
void bp__replace_abort(struct bp__replace *r);

/* Like bp__error but returns NULL, for constructors and builders. */
void *bp__error_null(enum bp_status status, const char *fmt, ...) BP_PRINTF(2, 3);

/* A printable description of a tensor for error messages: "'name' f32 [4, 3, 1, 1]". Returned
 * by value so it can be used inline in one printf call. */
struct bp__tdesc {
    char s[BP_TENSOR_DESC_SIZE];
};
struct bp__tdesc bp__describe(const bp_tensor *t);
/* The same, for a tensor of graph g (NULL: bp__describe): an unnamed one is named by its place
 * in g, "#12 (MUL_MAT) f32 [64, 8, 1, 1]" for node 12, "leaf #3 f32 [...]" for a leaf. */
struct bp__tdesc bp__describe_in(const bp_graph *g, const bp_tensor *t);
#endif
