/* fuzz-gguf.c - libFuzzer target for the GGUF reader: the input is a file. Whatever it holds,
 * bp_gguf_open_memory must either refuse it with a message or accept it; an accepted file is
 * then walked whole: every key with every getter (type mismatches must be clean errors), every
 * array element, every tensor's description and, for the types backplane computes with, every
 * byte of its data converted to floats, so that a size or offset the reader let through that
 * points outside the input is caught by ASan. Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>

static void walk_kv(const bp_gguf *g, int64_t i)
{
    int64_t iv;
    double fv;
    bool bv;
    const char *sv;
    size_t len;
    if (bp_gguf_get_key(g, i) == NULL)
        abort();
    (void)bp_gguf_get_int(g, i, &iv);
    (void)bp_gguf_get_float(g, i, &fv);
    (void)bp_gguf_get_bool(g, i, &bv);
    if (bp_gguf_get_str(g, i, &sv, &len) == BP_OK && sv[len] != '\0')
        abort();
    const uint64_t n = bp_gguf_get_arr_n(g, i);
    for (uint64_t j = 0; j < n && j < 4096; j++) {
        (void)bp_gguf_get_arr_int(g, i, j, &iv);
        (void)bp_gguf_get_arr_float(g, i, j, &fv);
        if (bp_gguf_get_arr_str(g, i, j, &sv, &len) == BP_OK && sv[len] != '\0')
            abort();
    }
    if (n > 0) /* the last element too */
        (void)bp_gguf_get_arr_int(g, i, n - 1, &iv);
}

static void walk_tensor(const bp_gguf *g, int64_t i, size_t size)
{
    struct bp_gguf_tensor t;
    enum bp_status st = bp_gguf_get_tensor(g, i, &t);
    if (st != BP_OK && st != BP_ERR_UNSUPPORTED)
        abort();
    if (bp_last_error()[0] == '\0' && st != BP_OK)
        abort();
    if (t.offset > size || t.size > size - t.offset)
        abort(); /* the reader let a tensor out of the file */
    if (st != BP_OK)
        return;
    /* The reader promises that the product of the nonzero sizes fits in int64_t, so no
     * product of some of them wraps, even for an empty tensor. */
    int64_t nz = 1;
    for (int d = 0; d < 4; d++) {
        if (t.ne[d] < 0 || (t.ne[d] > 0 && __builtin_mul_overflow(nz, t.ne[d], &nz)))
            abort();
    }
    const int64_t rows = t.ne[1] * t.ne[2] * t.ne[3];
    if (t.ne[0] == 0 || rows == 0)
        return;
    const struct bp_type_traits *tr = bp_type_get_traits(t.type);
    if (bp_row_size(t.type, t.ne[0]) * (size_t)rows != t.size)
        abort();
    float *row = malloc((size_t)t.ne[0] * sizeof(float));
    if (row == NULL)
        return;
    const size_t rs = bp_row_size(t.type, t.ne[0]);
    for (int64_t r = 0; r < rows && r < 256; r++) /* reads each byte of the first rows */
        tr->to_float((const char *)t.data + (size_t)r * rs, row, t.ne[0]);
    if (rows > 256) /* and of the last one */
        tr->to_float((const char *)t.data + (size_t)(rows - 1) * rs, row, t.ne[0]);
    free(row);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a private copy of exactly size bytes, so that ASan sees a read past its end */
    uint8_t *copy = malloc(size ? size : 1);
    if (copy == NULL)
        return 0;
    memcpy(copy, data, size);
    bp_clear_error();
    bp_gguf *g = bp_gguf_open_memory(copy, size, "fuzz.gguf");
    if (g == NULL) {
        if (bp_last_error()[0] == '\0')
            abort(); /* refused without a reason */
        free(copy);
        return 0;
    }
    for (int64_t i = 0; i < bp_gguf_get_n_kv(g); i++)
        walk_kv(g, i);
    for (int64_t i = 0; i < bp_gguf_get_n_tensors(g); i++)
        walk_tensor(g, i, size);
    (void)bp_gguf_find_key(g, "general.architecture");
    (void)bp_gguf_find_tensor(g, "token_embd.weight");
    bp_gguf_close(g);
    free(copy);
    return 0;
}
