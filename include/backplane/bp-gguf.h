/* bp-gguf.h - reading and writing GGUF files (the format of ggml and llama.cpp models).
 *
 * The reader maps the file and checks all of it before it returns: versions 2 and 3, every
 * metadata type, tensor infos, alignment; counts, lengths, offsets and sizes against the file,
 * tensors against each other (no overlaps), keys as UTF-8, no duplicate keys or tensor names.
 * A file that fails any check is refused with one sentence in bp_last_error() naming the file,
 * what was wrong and where; nothing it contains can make the reader read outside the file.
 * Tensors of every ggml type are described; those backplane has (every enum bp_type: F32, F16,
 * BF16, I32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K to Q8_K, IQ4_NL, IQ4_XS, whose block
 * layouts are ggml's) get a bp_type, the others (IQ1/IQ2/IQ3, TQ, MXFP4, I8...) are named in
 * the error of bp_gguf_get_tensor.
 *
 * Files that change underneath. bp_gguf_open reads the header through the mapping once and
 * copies everything in it (keys, every value, tensor infos): after the open, the metadata
 * getters and bp_gguf_get_tensor never touch the file, whatever becomes of it. Tensor data is
 * the one thing read from the mapping, as with any mmap reader: if the file is modified while it
 * is open, the bytes seen are undefined (MAP_PRIVATE does not snapshot pages not yet read), and
 * if it is truncated, touching data past the new end kills the process with SIGBUS. Do not
 * modify a file that is being served; replace it instead (bp_gguf_writer_write does: a reader
 * keeps the file it opened). Truncation during bp_gguf_open itself is the same SIGBUS. Tensors
 * that must survive a file changing on disk belong in a File buffer (bp_buffer_from_file, in
 * bp-backend.h), whose reads use pread and report a file cut short or changed as BP_ERR_IO. */
#ifndef BACKPLANE_BP_GGUF_H
#define BACKPLANE_BP_GGUF_H

#include <backplane/bp-tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bp_gguf bp_gguf;

/* Metadata value types, numbered as in the file. */
enum bp_gguf_type {
    BP_GGUF_TYPE_UINT8 = 0,
    BP_GGUF_TYPE_INT8 = 1,
    BP_GGUF_TYPE_UINT16 = 2,
    BP_GGUF_TYPE_INT16 = 3,
    BP_GGUF_TYPE_UINT32 = 4,
    BP_GGUF_TYPE_INT32 = 5,
    BP_GGUF_TYPE_FLOAT32 = 6,
    BP_GGUF_TYPE_BOOL = 7,
    BP_GGUF_TYPE_STRING = 8,
    BP_GGUF_TYPE_ARRAY = 9,
    BP_GGUF_TYPE_UINT64 = 10,
    BP_GGUF_TYPE_INT64 = 11,
    BP_GGUF_TYPE_FLOAT64 = 12,
};

/* "uint32" for BP_GGUF_TYPE_UINT32, ...; "?" outside the enum. */
BP_API const char *bp_gguf_type_name(enum bp_gguf_type type);

/* Opens and checks path (mapped read-only, private). NULL with bp_last_error() set when the
 * file cannot be read or is not a well-formed GGUF file. The open never blocks: a FIFO, socket,
 * device or directory is refused with BP_ERR_IO and a sentence saying what it is. Close with
 * bp_gguf_close. */
BP_API bp_gguf *bp_gguf_open(const char *path);
/* The same over size bytes at data, which the caller keeps unchanged until bp_gguf_close;
 * name is what error messages call it. */
BP_API bp_gguf *bp_gguf_open_memory(const void *data, size_t size, const char *name);
BP_API void bp_gguf_close(bp_gguf *gguf);

BP_API uint32_t bp_gguf_get_version(const bp_gguf *gguf);
/* general.alignment, or 32 when the file does not set it. */
BP_API size_t bp_gguf_get_alignment(const bp_gguf *gguf);
/* Byte offset of the tensor data section in the file. */
BP_API size_t bp_gguf_get_data_offset(const bp_gguf *gguf);

/* ---- Metadata ------------------------------------------------------------------------------
 * Keys are found by name (-1 when absent: not an error) or enumerated by index. The getters
 * take an index and check the value's type: a mismatch is BP_ERR_TYPE naming the key and both
 * types. Integers of any width read through get_int (a uint64 above INT64_MAX is refused),
 * floats of either width through get_float; strings are NUL-terminated copies (they may also
 * contain NUL bytes: len is the whole length). */
BP_API int64_t bp_gguf_get_n_kv(const bp_gguf *gguf);
BP_API int64_t bp_gguf_find_key(const bp_gguf *gguf, const char *key);
/* NULL when i is out of range. */
BP_API const char *bp_gguf_get_key(const bp_gguf *gguf, int64_t i);
/* The value's type; BP_GGUF_TYPE_ARRAY for arrays, whose elements have get_arr_type. -1 when i is
 * out of range. */
BP_API int bp_gguf_get_kv_type(const bp_gguf *gguf, int64_t i);
BP_API int bp_gguf_get_arr_type(const bp_gguf *gguf, int64_t i);
/* Elements of an array value; 0 when i is not an array. */
BP_API uint64_t bp_gguf_get_arr_n(const bp_gguf *gguf, int64_t i);

BP_API enum bp_status bp_gguf_get_int(const bp_gguf *gguf, int64_t i, int64_t *value);
BP_API enum bp_status bp_gguf_get_float(const bp_gguf *gguf, int64_t i, double *value);
BP_API enum bp_status bp_gguf_get_bool(const bp_gguf *gguf, int64_t i, bool *value);
BP_API enum bp_status bp_gguf_get_str(const bp_gguf *gguf, int64_t i, const char **value,
                                      size_t *len);
/* Element j of an array value, by the same rules. */
BP_API enum bp_status bp_gguf_get_arr_int(const bp_gguf *gguf, int64_t i, uint64_t j,
                                          int64_t *value);
BP_API enum bp_status bp_gguf_get_arr_float(const bp_gguf *gguf, int64_t i, uint64_t j,
                                            double *value);
BP_API enum bp_status bp_gguf_get_arr_str(const bp_gguf *gguf, int64_t i, uint64_t j,
                                          const char **value, size_t *len);

/* ---- Tensors ------------------------------------------------------------------------------ */

struct bp_gguf_tensor {
    const char *name;
    int ggml_type;          /* as in the file */
    const char *type_name;  /* ggml's name for it: "f16", "q4_K", ... */
    enum bp_type type;      /* the backplane type, when supported */
    bool supported;         /* whether type is meaningful */
    int n_dims;
    int64_t ne[4];          /* elements per dimension, ne[0] innermost; 1 beyond n_dims */
    size_t offset;          /* from the start of the file */
    size_t size;            /* bytes */
    const void *data;       /* the bytes, in the mapping (valid until bp_gguf_close; see the
                               top of this file for a file that changes while open) */
};

BP_API int64_t bp_gguf_get_n_tensors(const bp_gguf *gguf);
BP_API int64_t bp_gguf_find_tensor(const bp_gguf *gguf, const char *name);
/* Describes tensor i (BP_ERR_OUT_OF_BOUNDS when there is none). Its type is always filled in;
 * a type backplane does not compute with is BP_ERR_UNSUPPORTED with a sentence naming the
 * tensor and its type, *info still filled in. */
BP_API enum bp_status bp_gguf_get_tensor(const bp_gguf *gguf, int64_t i,
                                         struct bp_gguf_tensor *info);

/* ---- Writing ------------------------------------------------------------------------------
 * A writer collects metadata and tensors, then writes a version-3 file in one go. Setting a key
 * twice replaces its value. Tensors are written from their buffers (bp_tensor_get), so they
 * must be allocated and stay alive until bp_gguf_writer_write returns; names must be unique.
 * Every enum bp_type is written, under ggml's type id for it. */
typedef struct bp_gguf_writer bp_gguf_writer;

BP_API bp_gguf_writer *bp_gguf_writer_new(void);
BP_API void bp_gguf_writer_free(bp_gguf_writer *w);
BP_API enum bp_status bp_gguf_writer_set_u32(bp_gguf_writer *w, const char *key, uint32_t v);
BP_API enum bp_status bp_gguf_writer_set_i32(bp_gguf_writer *w, const char *key, int32_t v);
BP_API enum bp_status bp_gguf_writer_set_f32(bp_gguf_writer *w, const char *key, float v);
BP_API enum bp_status bp_gguf_writer_set_bool(bp_gguf_writer *w, const char *key, bool v);
BP_API enum bp_status bp_gguf_writer_set_str(bp_gguf_writer *w, const char *key, const char *v);
BP_API enum bp_status bp_gguf_writer_set_arr_i32(bp_gguf_writer *w, const char *key,
                                                 const int32_t *v, size_t n);
BP_API enum bp_status bp_gguf_writer_set_arr_f32(bp_gguf_writer *w, const char *key,
                                                 const float *v, size_t n);
BP_API enum bp_status bp_gguf_writer_set_arr_str(bp_gguf_writer *w, const char *key,
                                                 const char *const *v, size_t n);
/* Copies key i of an open file (any value type, arrays of any element type, strings with NUL
 * bytes in them) into the writer, replacing a value it already has under that key: how a tool
 * keeps a file's metadata when it writes a new one. */
BP_API enum bp_status bp_gguf_writer_copy_kv(bp_gguf_writer *w, const bp_gguf *g, int64_t i);
/* The tensor's data, at most 4 dimensions; name as in the file (t's own name if NULL). */
BP_API enum bp_status bp_gguf_writer_add_tensor(bp_gguf_writer *w, const char *name,
                                                const bp_tensor *t);
/* Writes the file, replacing path; BP_ERR_IO with the system's reason. The alignment of the
 * tensor data is GGUF's default 32, or general.alignment when set (bp_gguf_writer_set_u32; a
 * power of two from 8 to 65536: 64 lets a reader use the data in place where tensors must be
 * 64-byte aligned).
 * The file is never rewritten in place: it is written to a temporary file in the target's
 * directory (".NAME.XXXXXXXXXXXX.tmp"), synced, renamed over the target, and the directory is
 * synced. So a process that has the old file open or mapped keeps reading the old file, and a
 * write that fails half-way (a tensor that cannot be read, a full disk) leaves the old file as
 * it was and no temporary file behind. An existing target keeps its permissions (and its owner
 * where the caller may set it); a new one gets 0666 less the umask, as fopen gives. When path is
 * a symbolic link (or a chain of them), the file it points to is replaced and the link stays,
 * as editors do; a dangling link creates the file it names. Other hard links to the old file
 * keep the old contents. A target that exists and is not a regular file (a directory, FIFO,
 * device) is refused with BP_ERR_IO. The target's directory must be writable. */
BP_API enum bp_status bp_gguf_writer_write(bp_gguf_writer *w, const char *path);

#ifdef __cplusplus
}
#endif

#endif
