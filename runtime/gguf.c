/* gguf.c - GGUF files: a reader that checks everything before it hands anything out, and a
 * writer (bp-gguf.h).
 *
 * Reading is one pass over the mapped bytes through a cursor whose every read is checked
 * against what is left, so no count or length in the file can send it outside the file: counts
 * are also bounded by the smallest size their items can take (a million-entry array of strings
 * needs at least 8 MB), tensors' offsets and sizes are checked against the data section and
 * against each other (sorted by offset, each must end before the next begins). Keys and tensor
 * names are copied out NUL-terminated, string values too, and every scalar and numeric array
 * is copied: after the open only tensor data is read from the file (where a file cut short under
 * its mapping is a SIGBUS, bp-gguf.h), never a metadata getter.
 *
 * The writer never rewrites a file in place (files.c): a process serving the old file from its
 * mapping keeps it, and a write that fails half-way leaves it as it was. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bp-impl.h"
#include <backplane/bp-backend.h>
#include <backplane/bp-gguf.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

/* ---- ggml's types ------------------------------------------------------------------------- */

struct ggml_type_info {
    int id;
    const char *name;
    int64_t block;   /* elements per block */
    size_t size;     /* bytes per block */
    int bp;          /* enum bp_type, or -1 */
};

/* Every type ggml writes into files, so that files using the ones we do not compute with are
 * still checked for their sizes and described by name. */
static const struct ggml_type_info ggml_types[] = {
    {0, "f32", 1, 4, BP_TYPE_F32},            {1, "f16", 1, 2, BP_TYPE_F16},
    {2, "q4_0", 32, 18, BP_TYPE_Q4_0},        {3, "q4_1", 32, 20, BP_TYPE_Q4_1},
    {6, "q5_0", 32, 22, BP_TYPE_Q5_0},        {7, "q5_1", 32, 24, BP_TYPE_Q5_1},
    {8, "q8_0", 32, 34, BP_TYPE_Q8_0},        {9, "q8_1", 32, 36, BP_TYPE_Q8_1},
    {10, "q2_K", 256, 84, BP_TYPE_Q2_K},      {11, "q3_K", 256, 110, BP_TYPE_Q3_K},
    {12, "q4_K", 256, 144, BP_TYPE_Q4_K},     {13, "q5_K", 256, 176, BP_TYPE_Q5_K},
    {14, "q6_K", 256, 210, BP_TYPE_Q6_K},     {15, "q8_K", 256, 292, BP_TYPE_Q8_K},
    {16, "iq2_xxs", 256, 66, -1},             {17, "iq2_xs", 256, 74, -1},
    {18, "iq3_xxs", 256, 98, -1},             {19, "iq1_s", 256, 50, -1},
    {20, "iq4_nl", 32, 18, BP_TYPE_IQ4_NL},   {21, "iq3_s", 256, 110, -1},
    {22, "iq2_s", 256, 82, -1},               {23, "iq4_xs", 256, 136, BP_TYPE_IQ4_XS},
    {24, "i8", 1, 1, -1},                     {25, "i16", 1, 2, -1},
    {26, "i32", 1, 4, BP_TYPE_I32},           {27, "i64", 1, 8, -1},
    {28, "f64", 1, 8, -1},                    {29, "iq1_m", 256, 56, -1},
    {30, "bf16", 1, 2, BP_TYPE_BF16},         {34, "tq1_0", 256, 54, -1},
    {35, "tq2_0", 256, 66, -1},               {39, "mxfp4", 32, 17, -1},
};

static const struct ggml_type_info *ggml_type(uint32_t id)
{
    for (size_t i = 0; i < sizeof(ggml_types) / sizeof(ggml_types[0]); i++)
        if ((uint32_t)ggml_types[i].id == id)
            return &ggml_types[i];
    return NULL;
}

static int ggml_id_of(enum bp_type t)
{
    for (size_t i = 0; i < sizeof(ggml_types) / sizeof(ggml_types[0]); i++)
        if (ggml_types[i].bp == (int)t)
            return ggml_types[i].id;
    return -1;
}

const char *bp_gguf_type_name(enum bp_gguf_type t)
{
    static const char *const names[] = {"uint8", "int8",   "uint16", "int16", "uint32",
                                        "int32", "float32", "bool",  "string", "array",
                                        "uint64", "int64", "float64"};
    return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

/* Bytes of one element of a fixed-size type; 0 for string and array. */
static size_t scalar_size(uint32_t t)
{
    static const unsigned char sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof(sizes) ? sizes[t] : 0;
}

/* ---- The object --------------------------------------------------------------------------- */

struct gguf_kv {
    char *key;
    uint32_t type;     /* enum bp_gguf_type */
    uint32_t arr_type; /* for arrays */
    uint64_t n;        /* array elements */
    unsigned char *raw;       /* scalar or numeric array bytes, a copy */
    char **strs;              /* string value (one) or string array elements, NUL-terminated */
    size_t *lens;
};

struct gguf_tensor {
    char *name;
    uint32_t type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t offset; /* in the data section */
    uint64_t size;
};

struct bp_gguf {
    char *name;
    const unsigned char *bytes;
    size_t size;
    void *map; /* when bp_gguf_open mapped the file */
    uint32_t version;
    uint64_t alignment;
    size_t data_offset;
    int64_t n_kv, n_tensors;
    struct gguf_kv *kv;
    struct gguf_tensor *tensors;
};

/* ---- Reading ------------------------------------------------------------------------------ */

struct cursor {
    bp_gguf *g;
    size_t pos;
};

static size_t left(const struct cursor *c)
{
    return c->g->size - c->pos;
}

static bool take(struct cursor *c, void *out, size_t n, const char *what)
{
    if (n > left(c)) {
        bp__error(BP_ERR_SHAPE, "GGUF file %s is truncated: %s at byte %zu needs %zu bytes, %zu "
                  "remain", c->g->name, what, c->pos, n, left(c));
        return false;
    }
    if (out != NULL)
        memcpy(out, c->g->bytes + c->pos, n);
    c->pos += n;
    return true;
}

static bool take_u32(struct cursor *c, uint32_t *v, const char *what)
{
    return take(c, v, 4, what);
}

static bool take_u64(struct cursor *c, uint64_t *v, const char *what)
{
    return take(c, v, 8, what);
}

/* Well-formed UTF-8 (no overlong forms, surrogates or values past U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, min = 0x80, c &= 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, min = 0x800, c &= 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, min = 0x10000, c &= 0x07;
        } else {
            return false;
        }
        if (len > n - i)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            c = (c << 6) | (s[i + k] & 0x3f);
        }
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

/* A length-prefixed string, copied out NUL-terminated. */
static bool take_str(struct cursor *c, char **out, size_t *len, const char *what)
{
    uint64_t n;
    if (!take_u64(c, &n, what))
        return false;
    if (n > left(c)) {
        bp__error(BP_ERR_SHAPE, "GGUF file %s: %s at byte %zu claims %llu bytes, but only %zu "
                  "remain", c->g->name, what, c->pos - 8, (unsigned long long)n, left(c));
        return false;
    }
    char *s = bp__malloc((size_t)n + 1, "a GGUF string");
    if (s == NULL)
        return false;
    memcpy(s, c->g->bytes + c->pos, (size_t)n);
    s[n] = '\0';
    c->pos += (size_t)n;
    *out = s;
    if (len != NULL)
        *len = (size_t)n;
    return true;
}

/* A count of items that each take at least min_bytes must fit in what is left. */
static bool count_fits(struct cursor *c, uint64_t n, size_t min_bytes, const char *what)
{
    if (min_bytes > 0 && n > left(c) / min_bytes) {
        bp__error(BP_ERR_SHAPE, "GGUF file %s: %s is %llu, more than the %zu bytes left could "
                  "hold", c->g->name, what, (unsigned long long)n, left(c));
        return false;
    }
    return true;
}

static bool read_value(struct cursor *c, struct gguf_kv *kv)
{
    if (!take_u32(c, &kv->type, "a value type"))
        return false;
    if (kv->type > BP_GGUF_TYPE_FLOAT64)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: key '%s' has value type %u, which is not "
                         "a GGUF type", c->g->name, kv->key, kv->type), false;
    uint32_t et = kv->type;
    uint64_t n = 1;
    if (kv->type == BP_GGUF_TYPE_ARRAY) {
        if (!take_u32(c, &kv->arr_type, "an array type") || !take_u64(c, &n, "an array length"))
            return false;
        et = kv->arr_type;
        if (et == BP_GGUF_TYPE_ARRAY || et > BP_GGUF_TYPE_FLOAT64)
            return bp__error(BP_ERR_SHAPE, "GGUF file %s: key '%s' is an array of %s, which is "
                             "not supported", c->g->name, kv->key,
                             et == BP_GGUF_TYPE_ARRAY ? "arrays" : "an unknown type"), false;
    }
    kv->n = n;
    if (et == BP_GGUF_TYPE_STRING) {
        if (!count_fits(c, n, 8, "the length of a string array"))
            return false;
        kv->strs = bp__calloc(n ? (size_t)n : 1, sizeof(char *), "GGUF strings");
        kv->lens = bp__calloc(n ? (size_t)n : 1, sizeof(size_t), "GGUF strings");
        if (kv->strs == NULL || kv->lens == NULL)
            return false;
        for (uint64_t j = 0; j < n; j++)
            if (!take_str(c, &kv->strs[j], &kv->lens[j], "a string value"))
                return false;
        return true;
    }
    const size_t es = scalar_size(et);
    if (!count_fits(c, n, es, "the length of an array"))
        return false;
    /* Bounded by the file's size (count_fits); one byte more so that an empty array is not a
     * zero-byte allocation. */
    kv->raw = bp__malloc((size_t)n * es + 1, "a GGUF value");
    return kv->raw != NULL && take(c, kv->raw, (size_t)n * es, "a value");
}

static bool read_kvs(struct cursor *c)
{
    bp_gguf *g = c->g;
    uint64_t n = (uint64_t)g->n_kv;
    /* a key (8-byte length) and a type (4) at the least */
    if (!count_fits(c, n, 12, "the number of metadata keys"))
        return false;
    g->kv = bp__calloc(n ? (size_t)n : 1, sizeof(*g->kv), "GGUF metadata");
    if (g->kv == NULL)
        return false;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_kv *kv = &g->kv[i];
        const size_t at = c->pos;
        size_t len;
        if (!take_str(c, &kv->key, &len, "a metadata key"))
            return false;
        if (len == 0 || memchr(kv->key, '\0', len) != NULL ||
            !utf8_valid((const unsigned char *)kv->key, len))
            return bp__error(BP_ERR_SHAPE, "GGUF file %s: the key at byte %zu is %s", g->name, at,
                             len == 0 ? "empty" : "not valid UTF-8 text"), false;
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->kv[j].key, kv->key) == 0)
                return bp__error(BP_ERR_SHAPE, "GGUF file %s: key '%s' appears twice", g->name,
                                 kv->key), false;
        if (!read_value(c, kv))
            return false;
    }
    return true;
}

static bool read_alignment(bp_gguf *g)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = bp_gguf_find_key(g, "general.alignment");
    if (i < 0)
        return true;
    int64_t a;
    if (bp_gguf_get_int(g, i, &a) != BP_OK)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: general.alignment holds %s, not an integer",
                         g->name, bp_gguf_type_name((enum bp_gguf_type)g->kv[i].type)), false;
    if (a <= 0 || a > (1 << 20) || (a & (a - 1)) != 0)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: general.alignment is %lld; it must be a "
                         "power of two up to 1 MiB", g->name, (long long)a), false;
    g->alignment = (uint64_t)a;
    return true;
}

static bool read_tensor_info(struct cursor *c, struct gguf_tensor *t)
{
    bp_gguf *g = c->g;
    size_t len;
    if (!take_str(c, &t->name, &len, "a tensor name"))
        return false;
    if (len == 0 || memchr(t->name, '\0', len) != NULL)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: a tensor name is %s", g->name,
                         len == 0 ? "empty" : "not text"), false;
    uint32_t nd;
    if (!take_u32(c, &nd, "a tensor's dimension count"))
        return false;
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: tensor '%s' has %u dimensions (1 to %d "
                         "are supported)", g->name, t->name, nd, GGUF_MAX_DIMS), false;
    t->n_dims = (int)nd;
    /* The product of the nonzero dimensions must fit, so that no product of some of them
     * (a row count, an element count) wraps for a reader, even when the tensor is empty. */
    int64_t count = 1;
    bool empty = false;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims && !take_u64(c, &ne, "a tensor dimension"))
            return false;
        if (ne > (uint64_t)INT64_MAX || (ne > 0 && count > INT64_MAX / (int64_t)ne))
            return bp__error(BP_ERR_SHAPE, "GGUF file %s: tensor '%s' has an absurd size "
                             "(dimension %d is %llu)", g->name, t->name, d,
                             (unsigned long long)ne), false;
        t->ne[d] = (int64_t)ne;
        if (ne == 0)
            empty = true;
        else
            count *= (int64_t)ne;
    }
    if (empty)
        count = 0;
    if (!take_u32(c, &t->type, "a tensor type") || !take_u64(c, &t->offset, "a tensor offset"))
        return false;
    const struct ggml_type_info *ti = ggml_type(t->type);
    if (ti == NULL)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: tensor '%s' has type %u, which is not a "
                         "ggml type", g->name, t->name, t->type), false;
    if (t->ne[0] % ti->block != 0)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: tensor '%s' of type %s has rows of %lld "
                         "elements, not a whole number of %lld-element blocks", g->name, t->name,
                         ti->name, (long long)t->ne[0], (long long)ti->block), false;
    const uint64_t blocks = (uint64_t)(count / ti->block);
    if (blocks > UINT64_MAX / ti->size)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: tensor '%s' has an absurd size", g->name,
                         t->name), false;
    t->size = blocks * ti->size;
    if (t->offset % g->alignment != 0)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: tensor '%s' starts at data offset %llu, "
                         "not a multiple of the alignment %llu", g->name, t->name,
                         (unsigned long long)t->offset, (unsigned long long)g->alignment), false;
    return true;
}

static int by_offset(const void *a, const void *b)
{
    const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
    const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Each tensor inside the data section and none overlapping another. */
static bool check_layout(bp_gguf *g)
{
    const uint64_t data = g->size - g->data_offset;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        if (t->offset > data || t->size > data - t->offset)
            return bp__error(BP_ERR_SHAPE, "GGUF file %s: tensor '%s' (%llu bytes at data "
                             "offset %llu) ends past the end of the file (%llu bytes of data)",
                             g->name, t->name, (unsigned long long)t->size,
                             (unsigned long long)t->offset, (unsigned long long)data), false;
    }
    if (g->n_tensors < 2)
        return true;
    const struct gguf_tensor **order =
        bp__calloc((size_t)g->n_tensors, sizeof(*order), "a GGUF tensor order");
    if (order == NULL)
        return false;
    for (int64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, (size_t)g->n_tensors, sizeof(*order), by_offset);
    bool ok = true;
    for (int64_t i = 1; i < g->n_tensors && ok; i++) {
        const struct gguf_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + a->size > b->offset && a->size > 0 && b->size > 0) {
            bp__error(BP_ERR_SHAPE, "GGUF file %s: tensors '%s' and '%s' overlap (data offsets "
                      "%llu and %llu, %llu bytes for the first)", g->name, a->name, b->name,
                      (unsigned long long)a->offset, (unsigned long long)b->offset,
                      (unsigned long long)a->size);
            ok = false;
        }
    }
    bp__free(order);
    return ok;
}

static bool read_tensors(struct cursor *c)
{
    bp_gguf *g = c->g;
    /* a name (8), a dimension count (4), one dimension (8), a type (4), an offset (8) */
    if (!count_fits(c, (uint64_t)g->n_tensors, 32, "the number of tensors"))
        return false;
    g->tensors = bp__calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof(*g->tensors),
                            "GGUF tensor infos");
    if (g->tensors == NULL)
        return false;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        if (!read_tensor_info(c, &g->tensors[i]))
            return false;
        for (int64_t j = 0; j < i; j++)
            if (strcmp(g->tensors[j].name, g->tensors[i].name) == 0)
                return bp__error(BP_ERR_SHAPE, "GGUF file %s: tensor '%s' appears twice",
                                 g->name, g->tensors[i].name), false;
    }
    /* The data section starts at the next multiple of the alignment. */
    const uint64_t pad = (g->alignment - c->pos % g->alignment) % g->alignment;
    if (g->n_tensors > 0 && pad > left(c))
        return bp__error(BP_ERR_SHAPE, "GGUF file %s is truncated before its tensor data",
                         g->name), false;
    g->data_offset = c->pos + (size_t)(pad <= left(c) ? pad : left(c));
    return check_layout(g);
}

static bool parse(bp_gguf *g)
{
    struct cursor c = {g, 0};
    char magic[4];
    if (!take(&c, magic, 4, "the magic"))
        return false;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0)
        return bp__error(BP_ERR_SHAPE, "%s is not a GGUF file (it does not start with \"GGUF\")",
                         g->name), false;
    if (!take_u32(&c, &g->version, "the version"))
        return false;
    if (g->version != 2 && g->version != 3)
        return bp__error(BP_ERR_UNSUPPORTED, "GGUF file %s has version %u; versions 2 and 3 are "
                         "supported", g->name, g->version), false;
    uint64_t nt, nk;
    if (!take_u64(&c, &nt, "the tensor count") || !take_u64(&c, &nk, "the metadata count"))
        return false;
    if (nt > (uint64_t)INT64_MAX || nk > (uint64_t)INT64_MAX)
        return bp__error(BP_ERR_SHAPE, "GGUF file %s: absurd counts", g->name), false;
    g->n_tensors = (int64_t)nt;
    g->n_kv = (int64_t)nk;
    return read_kvs(&c) && read_alignment(g) && read_tensors(&c);
}

static bp_gguf *open_bytes(const void *data, size_t size, const char *name, void *map)
{
    bp_gguf *g = bp__calloc(1, sizeof(*g), "a GGUF file");
    if (g == NULL)
        return NULL;
    g->name = bp__strdup(name, "a GGUF file name");
    g->bytes = data;
    g->size = size;
    g->map = map;
    if (g->name == NULL || !parse(g)) {
        g->map = NULL; /* the caller unmaps what it mapped */
        bp_gguf_close(g);
        return NULL;
    }
    return g;
}

bp_gguf *bp_gguf_open_memory(const void *data, size_t size, const char *name)
{
    if (data == NULL && size > 0)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_gguf_open_memory: data is NULL");
    return open_bytes(data, size, name != NULL ? name : "(memory)", NULL);
}

bp_gguf *bp_gguf_open(const char *path)
{
    if (path == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_gguf_open: path is NULL");
    struct stat st;
    const int fd = bp__open_regular(path, "GGUF file", &st);
    if (fd < 0)
        return NULL;
    if (st.st_size == 0) {
        close(fd);
        return bp__error_null(BP_ERR_SHAPE, "GGUF file %s is empty", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return bp__error_null(BP_ERR_IO, "cannot map GGUF file %s: %s", path, strerror(errno));
    bp_gguf *g = open_bytes(map, (size_t)st.st_size, path, map);
    if (g == NULL)
        munmap(map, (size_t)st.st_size);
    return g;
}

void bp_gguf_close(bp_gguf *g)
{
    if (g == NULL)
        return;
    for (int64_t i = 0; g->kv != NULL && i < g->n_kv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        bp__free(kv->key);
        for (uint64_t j = 0; kv->strs != NULL && j < kv->n; j++)
            bp__free(kv->strs[j]);
        bp__free(kv->strs);
        bp__free(kv->lens);
        bp__free(kv->raw);
    }
    for (int64_t i = 0; g->tensors != NULL && i < g->n_tensors; i++)
        bp__free(g->tensors[i].name);
    bp__free(g->kv);
    bp__free(g->tensors);
    if (g->map != NULL)
        munmap(g->map, g->size);
    bp__free(g->name);
    bp__free(g);
}

/* ---- Metadata getters ----------------------------------------------------------------------- */

uint32_t bp_gguf_get_version(const bp_gguf *g)
{
    return g != NULL ? g->version : 0;
}

size_t bp_gguf_get_alignment(const bp_gguf *g)
{
    return g != NULL ? (size_t)g->alignment : 0;
}

size_t bp_gguf_get_data_offset(const bp_gguf *g)
{
    return g != NULL ? g->data_offset : 0;
}

int64_t bp_gguf_get_n_kv(const bp_gguf *g)
{
    return g != NULL ? g->n_kv : 0;
}

int64_t bp_gguf_find_key(const bp_gguf *g, const char *key)
{
    for (int64_t i = 0; g != NULL && key != NULL && i < g->n_kv; i++)
        if (g->kv[i].key != NULL && strcmp(g->kv[i].key, key) == 0)
            return i;
    return -1;
}

static const struct gguf_kv *kv_at(const bp_gguf *g, int64_t i)
{
    return g != NULL && i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const char *bp_gguf_get_key(const bp_gguf *g, int64_t i)
{
    const struct gguf_kv *kv = kv_at(g, i);
    return kv != NULL ? kv->key : NULL;
}

int bp_gguf_get_kv_type(const bp_gguf *g, int64_t i)
{
    const struct gguf_kv *kv = kv_at(g, i);
    return kv != NULL ? (int)kv->type : -1;
}

int bp_gguf_get_arr_type(const bp_gguf *g, int64_t i)
{
    const struct gguf_kv *kv = kv_at(g, i);
    return kv != NULL && kv->type == BP_GGUF_TYPE_ARRAY ? (int)kv->arr_type : -1;
}

uint64_t bp_gguf_get_arr_n(const bp_gguf *g, int64_t i)
{
    const struct gguf_kv *kv = kv_at(g, i);
    return kv != NULL && kv->type == BP_GGUF_TYPE_ARRAY ? kv->n : 0;
}

/* The element type and index asked for: the scalar itself, or element j of an array. */
static enum bp_status element(const bp_gguf *g, int64_t i, bool array, uint64_t j,
                              const struct gguf_kv **out, uint32_t *type, const char *fn)
{
    const struct gguf_kv *kv = kv_at(g, i);
    if (kv == NULL)
        return bp__error(BP_ERR_OUT_OF_BOUNDS, "%s: there is no metadata entry %lld", fn,
                         (long long)i);
    if (array != (kv->type == BP_GGUF_TYPE_ARRAY))
        return bp__error(BP_ERR_TYPE, "%s: '%s' is %s", fn, kv->key,
                         array ? "not an array" : "an array");
    if (array && j >= kv->n)
        return bp__error(BP_ERR_OUT_OF_BOUNDS, "%s: '%s' has %llu elements; there is no element "
                         "%llu", fn, kv->key, (unsigned long long)kv->n, (unsigned long long)j);
    *out = kv;
    *type = array ? kv->arr_type : kv->type;
    return BP_OK;
}

static enum bp_status get_int(const bp_gguf *g, int64_t i, bool array, uint64_t j, int64_t *v,
                              const char *fn)
{
    const struct gguf_kv *kv;
    uint32_t t;
    enum bp_status st = element(g, i, array, j, &kv, &t, fn);
    if (st != BP_OK)
        return st;
    if (v == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "%s: value is NULL", fn);
    if (t == BP_GGUF_TYPE_FLOAT32 || t == BP_GGUF_TYPE_FLOAT64 || t == BP_GGUF_TYPE_BOOL ||
        t == BP_GGUF_TYPE_STRING)
        return bp__error(BP_ERR_TYPE, "%s: '%s' holds %s, not an integer", fn, kv->key,
                         bp_gguf_type_name((enum bp_gguf_type)t));
    const unsigned char *p = kv->raw + (size_t)j * scalar_size(t);
    switch (t) {
    case BP_GGUF_TYPE_UINT8: *v = p[0]; return BP_OK;
    case BP_GGUF_TYPE_INT8: *v = (int8_t)p[0]; return BP_OK;
    case BP_GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); *v = x; return BP_OK; }
    case BP_GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); *v = x; return BP_OK; }
    case BP_GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); *v = x; return BP_OK; }
    case BP_GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); *v = x; return BP_OK; }
    case BP_GGUF_TYPE_INT64: { int64_t x; memcpy(&x, p, 8); *v = x; return BP_OK; }
    case BP_GGUF_TYPE_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        if (x > (uint64_t)INT64_MAX)
            return bp__error(BP_ERR_OUT_OF_BOUNDS, "%s: '%s' is %llu, beyond the int64 range",
                             fn, kv->key, (unsigned long long)x);
        *v = (int64_t)x;
        return BP_OK;
    }
    default:
        return bp__error(BP_ERR_TYPE, "%s: '%s' holds %s, not an integer", fn, kv->key,
                         bp_gguf_type_name((enum bp_gguf_type)t));
    }
}

enum bp_status bp_gguf_get_int(const bp_gguf *g, int64_t i, int64_t *v)
{
    return get_int(g, i, false, 0, v, __func__);
}

enum bp_status bp_gguf_get_arr_int(const bp_gguf *g, int64_t i, uint64_t j, int64_t *v)
{
    return get_int(g, i, true, j, v, __func__);
}

static enum bp_status get_float(const bp_gguf *g, int64_t i, bool array, uint64_t j, double *v,
                                const char *fn)
{
    const struct gguf_kv *kv;
    uint32_t t;
    enum bp_status st = element(g, i, array, j, &kv, &t, fn);
    if (st != BP_OK)
        return st;
    if (v == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "%s: value is NULL", fn);
    if (t == BP_GGUF_TYPE_FLOAT32) {
        float x;
        memcpy(&x, kv->raw + (size_t)j * 4, 4);
        *v = x;
        return BP_OK;
    }
    if (t == BP_GGUF_TYPE_FLOAT64) {
        memcpy(v, kv->raw + (size_t)j * 8, 8);
        return BP_OK;
    }
    return bp__error(BP_ERR_TYPE, "%s: '%s' holds %s, not a float", fn, kv->key,
                     bp_gguf_type_name((enum bp_gguf_type)t));
}

enum bp_status bp_gguf_get_float(const bp_gguf *g, int64_t i, double *v)
{
    return get_float(g, i, false, 0, v, __func__);
}

enum bp_status bp_gguf_get_arr_float(const bp_gguf *g, int64_t i, uint64_t j, double *v)
{
    return get_float(g, i, true, j, v, __func__);
}

enum bp_status bp_gguf_get_bool(const bp_gguf *g, int64_t i, bool *v)
{
    const struct gguf_kv *kv;
    uint32_t t;
    enum bp_status st = element(g, i, false, 0, &kv, &t, __func__);
    if (st != BP_OK)
        return st;
    if (t != BP_GGUF_TYPE_BOOL)
        return bp__error(BP_ERR_TYPE, "bp_gguf_get_bool: '%s' holds %s, not a bool", kv->key,
                         bp_gguf_type_name((enum bp_gguf_type)t));
    if (v == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_gguf_get_bool: value is NULL");
    *v = kv->raw[0] != 0;
    return BP_OK;
}

static enum bp_status get_str(const bp_gguf *g, int64_t i, bool array, uint64_t j,
                              const char **v, size_t *len, const char *fn)
{
    const struct gguf_kv *kv;
    uint32_t t;
    enum bp_status st = element(g, i, array, j, &kv, &t, fn);
    if (st != BP_OK)
        return st;
    if (t != BP_GGUF_TYPE_STRING)
        return bp__error(BP_ERR_TYPE, "%s: '%s' holds %s, not a string", fn, kv->key,
                         bp_gguf_type_name((enum bp_gguf_type)t));
    if (v == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "%s: value is NULL", fn);
    *v = kv->strs[j];
    if (len != NULL)
        *len = kv->lens[j];
    return BP_OK;
}

enum bp_status bp_gguf_get_str(const bp_gguf *g, int64_t i, const char **v, size_t *len)
{
    return get_str(g, i, false, 0, v, len, __func__);
}

enum bp_status bp_gguf_get_arr_str(const bp_gguf *g, int64_t i, uint64_t j, const char **v,
                                   size_t *len)
{
    return get_str(g, i, true, j, v, len, __func__);
}

/* ---- Tensors -------------------------------------------------------------------------------- */

int64_t bp_gguf_get_n_tensors(const bp_gguf *g)
{
    return g != NULL ? g->n_tensors : 0;
}

int64_t bp_gguf_find_tensor(const bp_gguf *g, const char *name)
{
    for (int64_t i = 0; g != NULL && name != NULL && i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return i;
    return -1;
}

enum bp_status bp_gguf_get_tensor(const bp_gguf *g, int64_t i, struct bp_gguf_tensor *info)
{
    if (g == NULL || info == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_gguf_get_tensor: %s is NULL",
                         g == NULL ? "the file" : "info");
    if (i < 0 || i >= g->n_tensors)
        return bp__error(BP_ERR_OUT_OF_BOUNDS, "bp_gguf_get_tensor: %s has %lld tensors; there "
                         "is no tensor %lld", g->name, (long long)g->n_tensors, (long long)i);
    const struct gguf_tensor *t = &g->tensors[i];
    const struct ggml_type_info *ti = ggml_type(t->type);
    memset(info, 0, sizeof(*info));
    info->name = t->name;
    info->ggml_type = (int)t->type;
    info->type_name = ti->name;
    info->supported = ti->bp >= 0;
    info->type = ti->bp >= 0 ? (enum bp_type)ti->bp : BP_TYPE_F32;
    info->n_dims = t->n_dims;
    memcpy(info->ne, t->ne, sizeof(info->ne));
    info->offset = g->data_offset + (size_t)t->offset;
    info->size = (size_t)t->size;
    info->data = g->bytes + info->offset;
    if (!info->supported)
        return bp__error(BP_ERR_UNSUPPORTED, "GGUF file %s: tensor '%s' has type %s, which "
                         "backplane does not have", g->name, t->name, ti->name);
    return BP_OK;
}

/* ---- Writing -------------------------------------------------------------------------------- */

struct wkv {
    char *key;
    uint32_t type, arr_type;
    uint64_t n;
    void *data;  /* numeric values */
    char **strs; /* strings */
    size_t *lens; /* their lengths, when copied from a file (they may hold NUL bytes) */
};

struct wtensor {
    char *name;
    const bp_tensor *t;
};

struct bp_gguf_writer {
    struct wkv *kv;
    size_t n_kv, cap_kv;
    struct wtensor *tensors;
    size_t n_tensors, cap_tensors;
};

bp_gguf_writer *bp_gguf_writer_new(void)
{
    return bp__calloc(1, sizeof(bp_gguf_writer), "a GGUF writer");
}

static void wkv_clear(struct wkv *kv)
{
    for (uint64_t j = 0; kv->strs != NULL && j < kv->n; j++)
        bp__free(kv->strs[j]);
    bp__free(kv->strs);
    bp__free(kv->lens);
    bp__free(kv->data);
    kv->strs = NULL;
    kv->lens = NULL;
    kv->data = NULL;
}

void bp_gguf_writer_free(bp_gguf_writer *w)
{
    if (w == NULL)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        wkv_clear(&w->kv[i]);
        bp__free(w->kv[i].key);
    }
    for (size_t i = 0; i < w->n_tensors; i++)
        bp__free(w->tensors[i].name);
    bp__free(w->kv);
    bp__free(w->tensors);
    bp__free(w);
}

/* The entry for key, new or emptied for a new value. */
static struct wkv *wkv_for(bp_gguf_writer *w, const char *key, const char *fn)
{
    if (w == NULL || key == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "%s: %s is NULL", fn, w ? "key" : "writer");
    const size_t len = strlen(key);
    if (len == 0 || !utf8_valid((const unsigned char *)key, len))
        return bp__error_null(BP_ERR_INVALID_ARG, "%s: a key must be non-empty UTF-8 text", fn);
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            wkv_clear(&w->kv[i]);
            return &w->kv[i];
        }
    }
    if (!bp__grow((void **)&w->kv, &w->cap_kv, w->n_kv + 1, sizeof(*w->kv), "GGUF metadata"))
        return NULL;
    struct wkv *kv = &w->kv[w->n_kv];
    memset(kv, 0, sizeof(*kv));
    kv->key = bp__strdup(key, "a GGUF key");
    if (kv->key == NULL)
        return NULL;
    w->n_kv++;
    return kv;
}

static enum bp_status set_numeric(bp_gguf_writer *w, const char *key, uint32_t type, bool array,
                                  const void *v, size_t n, const char *fn)
{
    if (array && v == NULL && n > 0)
        return bp__error(BP_ERR_INVALID_ARG, "%s: values are NULL", fn);
    struct wkv *kv = wkv_for(w, key, fn);
    if (kv == NULL)
        return bp_last_status();
    const size_t es = scalar_size(type);
    kv->type = array ? BP_GGUF_TYPE_ARRAY : type;
    kv->arr_type = type;
    kv->n = array ? n : 1;
    kv->data = bp__malloc(es * (size_t)kv->n + 1, "a GGUF value");
    if (kv->data == NULL) {
        kv->n = 0;
        return BP_ERR_OUT_OF_MEMORY;
    }
    memcpy(kv->data, v, es * (size_t)kv->n);
    return BP_OK;
}

enum bp_status bp_gguf_writer_set_u32(bp_gguf_writer *w, const char *key, uint32_t v)
{
    return set_numeric(w, key, BP_GGUF_TYPE_UINT32, false, &v, 1, __func__);
}

enum bp_status bp_gguf_writer_set_i32(bp_gguf_writer *w, const char *key, int32_t v)
{
    return set_numeric(w, key, BP_GGUF_TYPE_INT32, false, &v, 1, __func__);
}

enum bp_status bp_gguf_writer_set_f32(bp_gguf_writer *w, const char *key, float v)
{
    return set_numeric(w, key, BP_GGUF_TYPE_FLOAT32, false, &v, 1, __func__);
}

enum bp_status bp_gguf_writer_set_bool(bp_gguf_writer *w, const char *key, bool v)
{
    const uint8_t b = v ? 1 : 0;
    return set_numeric(w, key, BP_GGUF_TYPE_BOOL, false, &b, 1, __func__);
}

enum bp_status bp_gguf_writer_set_arr_i32(bp_gguf_writer *w, const char *key, const int32_t *v,
                                          size_t n)
{
    return set_numeric(w, key, BP_GGUF_TYPE_INT32, true, v, n, __func__);
}

enum bp_status bp_gguf_writer_set_arr_f32(bp_gguf_writer *w, const char *key, const float *v,
                                          size_t n)
{
    return set_numeric(w, key, BP_GGUF_TYPE_FLOAT32, true, v, n, __func__);
}

static enum bp_status set_strings(bp_gguf_writer *w, const char *key, bool array,
                                  const char *const *v, size_t n, const char *fn)
{
    if (v == NULL && n > 0)
        return bp__error(BP_ERR_INVALID_ARG, "%s: values are NULL", fn);
    for (size_t j = 0; j < n; j++)
        if (v[j] == NULL)
            return bp__error(BP_ERR_INVALID_ARG, "%s: string %zu is NULL", fn, j);
    struct wkv *kv = wkv_for(w, key, fn);
    if (kv == NULL)
        return bp_last_status();
    kv->type = array ? BP_GGUF_TYPE_ARRAY : BP_GGUF_TYPE_STRING;
    kv->arr_type = BP_GGUF_TYPE_STRING;
    kv->n = 0;
    kv->strs = bp__calloc(n ? n : 1, sizeof(char *), "GGUF strings");
    if (kv->strs == NULL)
        return BP_ERR_OUT_OF_MEMORY;
    for (size_t j = 0; j < n; j++) {
        kv->strs[j] = bp__strdup(v[j], "a GGUF string");
        if (kv->strs[j] == NULL)
            return BP_ERR_OUT_OF_MEMORY;
        kv->n = j + 1;
    }
    return BP_OK;
}

enum bp_status bp_gguf_writer_set_str(bp_gguf_writer *w, const char *key, const char *v)
{
    return set_strings(w, key, false, &v, 1, __func__);
}

enum bp_status bp_gguf_writer_set_arr_str(bp_gguf_writer *w, const char *key,
                                          const char *const *v, size_t n)
{
    return set_strings(w, key, true, v, n, __func__);
}

/* The strings of src (NUL bytes and all) into kv. */
static bool copy_strings(struct wkv *kv, const struct gguf_kv *src)
{
    kv->n = 0;
    kv->strs = bp__calloc(src->n ? (size_t)src->n : 1, sizeof(char *), "GGUF strings");
    kv->lens = bp__calloc(src->n ? (size_t)src->n : 1, sizeof(size_t), "GGUF strings");
    if (kv->strs == NULL || kv->lens == NULL)
        return false;
    for (uint64_t j = 0; j < src->n; j++) {
        kv->strs[j] = bp__malloc(src->lens[j] + 1, "a GGUF string");
        if (kv->strs[j] == NULL)
            return false;
        memcpy(kv->strs[j], src->strs[j], src->lens[j] + 1);
        kv->lens[j] = src->lens[j];
        kv->n = j + 1;
    }
    return true;
}

enum bp_status bp_gguf_writer_copy_kv(bp_gguf_writer *w, const bp_gguf *g, int64_t i)
{
    if (g == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_gguf_writer_copy_kv: the file is NULL");
    const struct gguf_kv *src = kv_at(g, i);
    if (src == NULL)
        return bp__error(BP_ERR_OUT_OF_BOUNDS, "bp_gguf_writer_copy_kv: %s has %lld keys; "
                         "there is no key %lld", g->name, (long long)g->n_kv, (long long)i);
    struct wkv *kv = wkv_for(w, src->key, "bp_gguf_writer_copy_kv");
    if (kv == NULL)
        return bp_last_status();
    const uint32_t et = src->type == BP_GGUF_TYPE_ARRAY ? src->arr_type : src->type;
    kv->type = src->type;
    kv->arr_type = et;
    if (et == BP_GGUF_TYPE_STRING)
        return copy_strings(kv, src) ? BP_OK : BP_ERR_OUT_OF_MEMORY;
    const size_t bytes = scalar_size(et) * (size_t)src->n;
    kv->data = bp__malloc(bytes + 1, "a GGUF value");
    if (kv->data == NULL)
        return BP_ERR_OUT_OF_MEMORY;
    memcpy(kv->data, src->raw, bytes);
    kv->n = src->n;
    return BP_OK;
}

enum bp_status bp_gguf_writer_add_tensor(bp_gguf_writer *w, const char *name, const bp_tensor *t)
{
    if (w == NULL || t == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_gguf_writer_add_tensor: %s is NULL",
                         w ? "the tensor" : "the writer");
    if (name == NULL)
        name = bp_get_name(t);
    if (name == NULL || name[0] == '\0')
        return bp__error(BP_ERR_INVALID_ARG, "bp_gguf_writer_add_tensor: %s has no name",
                         bp__describe(t).s);
    if (ggml_id_of(t->type) < 0)
        return bp__error(BP_ERR_TYPE, "bp_gguf_writer_add_tensor: %s has a type GGUF files "
                         "cannot hold", bp__describe(t).s);
    if (t->buffer == NULL || !bp_is_contiguous(t))
        return bp__error(BP_ERR_INVALID_ARG, "bp_gguf_writer_add_tensor: %s must be allocated "
                         "and contiguous", bp__describe(t).s);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return bp__error(BP_ERR_INVALID_ARG, "bp_gguf_writer_add_tensor: a tensor named "
                             "'%s' was already added", name);
    if (!bp__grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors + 1, sizeof(*w->tensors),
                  "GGUF tensors"))
        return BP_ERR_OUT_OF_MEMORY;
    char *copy = bp__strdup(name, "a tensor name");
    if (copy == NULL)
        return BP_ERR_OUT_OF_MEMORY;
    w->tensors[w->n_tensors++] = (struct wtensor){copy, t};
    return BP_OK;
}

struct out {
    FILE *f;
    uint64_t pos;
    bool ok;
    int err; /* errno of the first write that failed */
};

static void put(struct out *o, const void *p, size_t n)
{
    if (o->ok && n > 0 && fwrite(p, 1, n, o->f) != n) {
        o->ok = false;
        o->err = errno;
    }
    o->pos += n;
}

static void put_u32(struct out *o, uint32_t v)
{
    put(o, &v, 4);
}

static void put_u64(struct out *o, uint64_t v)
{
    put(o, &v, 8);
}

static void put_bytes(struct out *o, const char *s, size_t n)
{
    put_u64(o, n);
    put(o, s, n);
}

static void put_str(struct out *o, const char *s)
{
    put_bytes(o, s, strlen(s));
}

static void put_pad(struct out *o, uint64_t align)
{
    static const unsigned char zeros[64];
    for (uint64_t n = (align - o->pos % align) % align; n > 0;) {
        const size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
        put(o, zeros, k);
        n -= k;
    }
}

static uint64_t aligned(uint64_t n, uint64_t align)
{
    return (n + align - 1) / align * align;
}

/* The alignment the file is written with: general.alignment when the caller set it (a power of
 * two from 8 to 65536, as a uint32), else GGUF's default. 0 after an error. */
static uint64_t writer_alignment(const bp_gguf_writer *w)
{
    for (size_t i = 0; i < w->n_kv; i++) {
        const struct wkv *kv = &w->kv[i];
        if (strcmp(kv->key, "general.alignment") != 0)
            continue;
        uint32_t a = 0;
        if (kv->type == BP_GGUF_TYPE_UINT32)
            memcpy(&a, kv->data, sizeof(a));
        if (a < 8 || a > 65536 || (a & (a - 1)) != 0) {
            bp__error(BP_ERR_INVALID_ARG, "bp_gguf_writer_write: general.alignment must be a "
                      "uint32 power of two from 8 to 65536");
            return 0;
        }
        return a;
    }
    return GGUF_DEFAULT_ALIGNMENT;
}

/* Metadata and tensor infos, then the padding before the data section. */
static void write_header(struct out *o, const bp_gguf_writer *w, uint64_t align)
{
    put(o, GGUF_MAGIC, 4);
    put_u32(o, 3);
    put_u64(o, w->n_tensors);
    put_u64(o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        const struct wkv *kv = &w->kv[i];
        put_str(o, kv->key);
        put_u32(o, kv->type);
        if (kv->type == BP_GGUF_TYPE_ARRAY) {
            put_u32(o, kv->arr_type);
            put_u64(o, kv->n);
        }
        if (kv->arr_type == BP_GGUF_TYPE_STRING && kv->strs != NULL)
            for (uint64_t j = 0; j < kv->n; j++)
                put_bytes(o, kv->strs[j], kv->lens ? kv->lens[j] : strlen(kv->strs[j]));
        else
            put(o, kv->data, scalar_size(kv->arr_type) * (size_t)kv->n);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const bp_tensor *t = w->tensors[i].t;
        int nd = GGUF_MAX_DIMS;
        while (nd > 1 && t->ne[nd - 1] == 1)
            nd--;
        put_str(o, w->tensors[i].name);
        put_u32(o, (uint32_t)nd);
        for (int d = 0; d < nd; d++)
            put_u64(o, (uint64_t)t->ne[d]);
        put_u32(o, (uint32_t)ggml_id_of(t->type));
        put_u64(o, offset);
        offset += aligned(bp_nbytes(t), align);
    }
    put_pad(o, align);
}

/* The tensors' bytes, each padded to the alignment; the status of reading them. */
static enum bp_status write_data(struct out *o, const bp_gguf_writer *w, uint64_t align)
{
    enum bp_status st = BP_OK;
    for (size_t i = 0; i < w->n_tensors && st == BP_OK && o->ok; i++) {
        const bp_tensor *t = w->tensors[i].t;
        const size_t n = bp_nbytes(t);
        void *tmp = bp__malloc(n ? n : 1, "a tensor's bytes for a GGUF file");
        if (tmp == NULL)
            return BP_ERR_OUT_OF_MEMORY;
        st = bp_tensor_get(t, tmp, 0, n);
        put(o, tmp, n);
        bp__free(tmp);
        put_pad(o, align);
    }
    return st;
}

enum bp_status bp_gguf_writer_write(bp_gguf_writer *w, const char *path)
{
    if (w == NULL || path == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_gguf_writer_write: %s is NULL",
                         w ? "path" : "the writer");
    const uint64_t align = writer_alignment(w);
    if (align == 0)
        return bp_last_status();
    struct bp__replace r;
    if (!bp__replace_open(&r, path, "GGUF file"))
        return bp_last_status();
    struct out o = {r.f, 0, true, 0};
    write_header(&o, w, align);
    enum bp_status st = write_data(&o, w, align);
    if (st == BP_OK && !o.ok)
        st = bp__error(BP_ERR_IO, "cannot write GGUF file %s: %s", path,
                       strerror(o.err ? o.err : EIO));
    if (st != BP_OK) {
        bp__replace_abort(&r);
        return st;
    }
    return bp__replace_commit(&r, path);
}
