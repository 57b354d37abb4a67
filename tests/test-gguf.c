/* test-gguf.c - the GGUF reader and writer: a file written by the GGUF project's own Python
 * package (tests/gguf/reference.gguf, made by tests/gguf/make-reference.py) read exactly as that
 * package reads it; our writer's files read back exactly; and every kind of hostile file refused
 * with a sentence (every truncation of a valid file, bad magic and versions, absurd counts and
 * lengths, offsets past the end, overlapping or misaligned tensors, bad keys, duplicates); and
 * the files around them: FIFOs, devices and directories refused at once, metadata that outlives
 * the file it came from, and a writer that replaces a file without disturbing its readers, its
 * permissions or its links, and leaves it whole when a write fails. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test-util.h"

/* ---- The package's file ------------------------------------------------------------------ */

static char *path_in_srcdir(const char *name)
{
    const char *dir = getenv("srcdir");
    static char path[4096];
    snprintf(path, sizeof(path), "%s/tests/gguf/%s", dir != NULL ? dir : "..", name);
    return path;
}

/* One tensor of tests/gguf/reference.txt: what the package read. */
struct expect {
    char name[64], type[16];
    int n_dims;
    long long ne[4], offset, bytes;
    double *values;
    long long n_values;
};

static char *next_token(char **p)
{
    while (**p == ' ')
        (*p)++;
    if (**p == '\0' || **p == '\n')
        return NULL;
    char *t = *p;
    while (**p != ' ' && **p != '\0' && **p != '\n')
        (*p)++;
    if (**p != '\0')
        *(*p)++ = '\0';
    return t;
}

START_TEST(test_reads_what_the_gguf_package_wrote)
{
    bp_gguf *g = bp_gguf_open(path_in_srcdir("reference.gguf"));
    ck_assert_msg(g != NULL, "%s", bp_last_error());
    ck_assert_uint_eq(bp_gguf_get_version(g), 3);
    ck_assert_uint_eq(bp_gguf_get_alignment(g), 32);
    FILE *f = fopen(path_in_srcdir("reference.txt"), "r");
    ck_assert_ptr_nonnull(f);
    static char line[1 << 16];
    struct expect e = {0};
    int tensors = 0, kvs = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        char *p = line;
        if (strncmp(line, "tensor ", 7) == 0) {
            ck_assert_int_ge(sscanf(line, "tensor %63s %15s %d", e.name, e.type, &e.n_dims), 3);
            p = line + 7;
            for (int k = 0; k < 3; k++)
                next_token(&p);
            for (int d = 0; d < 4; d++)
                e.ne[d] = d < e.n_dims ? atoll(next_token(&p)) : 1;
            e.offset = atoll(next_token(&p));
            e.bytes = atoll(next_token(&p));
        } else if (strncmp(line, "values ", 7) == 0) {
            p = line + 7;
            int64_t i = bp_gguf_find_tensor(g, e.name);
            ck_assert_msg(i >= 0, "tensor %s not found", e.name);
            struct bp_gguf_tensor t;
            ck_assert_int_eq(bp_gguf_get_tensor(g, i, &t), BP_OK);
            ck_assert_str_eq(t.type_name, e.type);
            ck_assert_int_eq(t.n_dims, e.n_dims);
            for (int d = 0; d < 4; d++)
                ck_assert_int_eq(t.ne[d], e.ne[d]);
            ck_assert_int_eq((long long)t.offset, e.offset);
            ck_assert_int_eq((long long)t.size, e.bytes);
            const int64_t n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
            float *got = malloc((size_t)n * sizeof(float));
            bp_type_get_traits(t.type)->to_float(t.data, got, n);
            for (int64_t k = 0; k < n; k++) {
                char *tok = next_token(&p);
                ck_assert_msg(tok != NULL, "%s: the package read fewer values", e.name);
                /* both dequantise in f32 and print exactly: equal to the bit */
                ck_assert_msg((float)strtod(tok, NULL) == got[k], "%s[%lld]: ours %.9g, the "
                              "package's %s", e.name, (long long)k, got[k], tok);
            }
            ck_assert_ptr_null(next_token(&p));
            free(got);
            tensors++;
        } else if (strncmp(line, "kv ", 3) == 0) {
            p = line + 3;
            char *key = next_token(&p);
            char *val = p;
            val[strcspn(val, "\n")] = '\0';
            int64_t i = bp_gguf_find_key(g, key);
            ck_assert_msg(i >= 0, "key %s not found", key);
            const int type = bp_gguf_get_kv_type(g, i);
            char mine[512] = "";
            size_t used = 0;
            const uint64_t n = type == BP_GGUF_TYPE_ARRAY ? bp_gguf_get_arr_n(g, i) : 1;
            const int et = type == BP_GGUF_TYPE_ARRAY ? bp_gguf_get_arr_type(g, i) : type;
            for (uint64_t j = 0; j < n; j++) {
                const bool arr = type == BP_GGUF_TYPE_ARRAY;
                int64_t iv;
                double fv;
                const char *sv;
                bool bv;
                const char *sep = j ? "\t" : "";
                if (et == BP_GGUF_TYPE_STRING) {
                    ck_assert_int_eq(arr ? bp_gguf_get_arr_str(g, i, j, &sv, NULL)
                                         : bp_gguf_get_str(g, i, &sv, NULL), BP_OK);
                    used += (size_t)snprintf(mine + used, sizeof(mine) - used, "%s'%s'", sep, sv);
                } else if (et == BP_GGUF_TYPE_FLOAT32 || et == BP_GGUF_TYPE_FLOAT64) {
                    ck_assert_int_eq(arr ? bp_gguf_get_arr_float(g, i, j, &fv)
                                         : bp_gguf_get_float(g, i, &fv), BP_OK);
                    used += (size_t)snprintf(mine + used, sizeof(mine) - used, "%s%.17g", sep, fv);
                } else if (et == BP_GGUF_TYPE_BOOL) {
                    ck_assert_int_eq(bp_gguf_get_bool(g, i, &bv), BP_OK);
                    used += (size_t)snprintf(mine + used, sizeof(mine) - used, "%s%s", sep,
                                             bv ? "True" : "False");
                } else {
                    ck_assert_int_eq(arr ? bp_gguf_get_arr_int(g, i, j, &iv)
                                         : bp_gguf_get_int(g, i, &iv), BP_OK);
                    used += (size_t)snprintf(mine + used, sizeof(mine) - used, "%s%lld", sep,
                                             (long long)iv);
                }
            }
            if (et == BP_GGUF_TYPE_FLOAT32 || et == BP_GGUF_TYPE_FLOAT64) {
                /* compare numerically: Python prints the shortest repr */
                char *a = mine, *b = val;
                for (uint64_t j = 0; j < n; j++) {
                    double x = strtod(a, &a), y = strtod(b, &b);
                    ck_assert_msg(x == y, "%s: ours %.17g, the package's %.17g", key, x, y);
                }
            } else {
                ck_assert_msg(strcmp(mine, val) == 0, "%s: ours %s, the package's %s", key, mine,
                              val);
            }
            kvs++;
        }
    }
    fclose(f);
    ck_assert_int_eq(tensors, 6);
    ck_assert_int_eq(kvs, 15);
    ck_assert_int_eq(bp_gguf_get_n_tensors(g), 6);
    /* the package's own keys are there too */
    int64_t arch = bp_gguf_find_key(g, "general.architecture");
    const char *s;
    ck_assert_int_eq(bp_gguf_get_str(g, arch, &s, NULL), BP_OK);
    ck_assert_str_eq(s, "llama");
    int64_t ctx = bp_gguf_find_key(g, "llama.context_length"), v;
    ck_assert_int_eq(bp_gguf_get_int(g, ctx, &v), BP_OK);
    ck_assert_int_eq(v, 256);
    bp_gguf_close(g);
}
END_TEST

/* ---- Getters ---------------------------------------------------------------------------------- */

START_TEST(test_getters_check_types)
{
    bp_gguf *g = bp_gguf_open(path_in_srcdir("reference.gguf"));
    ck_assert_ptr_nonnull(g);
    int64_t i = bp_gguf_find_key(g, "test.str"), iv;
    double fv;
    const char *sv;
    ck_assert_int_eq(bp_gguf_get_int(g, i, &iv), BP_ERR_TYPE);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "'test.str' holds string, not an integer"));
    ck_assert_int_eq(bp_gguf_get_float(g, bp_gguf_find_key(g, "test.i32"), &fv), BP_ERR_TYPE);
    ck_assert_int_eq(bp_gguf_get_str(g, bp_gguf_find_key(g, "test.arr_str"), &sv, NULL),
                     BP_ERR_TYPE);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "is an array"));
    ck_assert_int_eq(bp_gguf_get_arr_str(g, bp_gguf_find_key(g, "test.arr_str"), 3, &sv, NULL),
                     BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_gguf_get_arr_int(g, bp_gguf_find_key(g, "test.u32"), 0, &iv), BP_ERR_TYPE);
    ck_assert_int_eq(bp_gguf_get_int(g, -1, &iv), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_gguf_get_int(g, bp_gguf_get_n_kv(g), &iv), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_gguf_find_key(g, "no.such.key"), -1);
    ck_assert_int_eq(bp_gguf_find_key(g, NULL), -1);
    ck_assert_ptr_null(bp_gguf_get_key(g, -1));
    ck_assert_int_eq(bp_gguf_get_kv_type(g, 1 << 20), -1);
    struct bp_gguf_tensor t;
    ck_assert_int_eq(bp_gguf_get_tensor(g, 6, &t), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_gguf_get_tensor(g, 0, NULL), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_gguf_find_tensor(g, "nope"), -1);
    bp_gguf_close(g);
    bp_gguf_close(NULL);
    ck_assert_rejected(bp_gguf_open("/nonexistent/x.gguf"), BP_ERR_IO, "No such file");
    ck_assert_rejected(bp_gguf_open("/"), BP_ERR_IO, "not a regular file");
    ck_assert_rejected(bp_gguf_open(NULL), BP_ERR_INVALID_ARG, "path is NULL");
}
END_TEST

/* ---- Our writer ------------------------------------------------------------------------------ */

START_TEST(test_writer_round_trip)
{
    static const enum bp_type types[] = {BP_TYPE_F32, BP_TYPE_F16, BP_TYPE_BF16, BP_TYPE_I32,
                                         BP_TYPE_Q8_0, BP_TYPE_Q4_0};
    bp_context *ctx = bp_context_new(16);
    bp_tensor *ts[6];
    for (int k = 0; k < 6; k++) {
        ts[k] = k == 2 ? bp_new_tensor_3d(ctx, types[k], 64, 3, 2)
                       : bp_new_tensor_2d(ctx, types[k], 64, 1 + k);
        char name[16];
        snprintf(name, sizeof(name), "w.%s", bp_type_name(types[k]));
        bp_set_name(ts[k], name);
    }
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    ck_assert_ptr_nonnull(buf);
    for (int k = 0; k < 6; k++) {
        unsigned char *p = ts[k]->data;
        for (size_t b = 0; b < bp_nbytes(ts[k]); b++)
            p[b] = (unsigned char)(b * 7 + (size_t)k * 13 + 1);
        if (types[k] == BP_TYPE_Q8_0 || types[k] == BP_TYPE_Q4_0 || types[k] == BP_TYPE_F16 ||
            types[k] == BP_TYPE_BF16) { /* finite values: scales and halves of 0x3c00 */
            for (size_t b = 1; b < bp_nbytes(ts[k]); b += 2)
                p[b] &= 0x3f;
        }
    }
    bp_gguf_writer *w = bp_gguf_writer_new();
    ck_assert_int_eq(bp_gguf_writer_set_str(w, "general.architecture", "llama"), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_u32(w, "a.u32", 7), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_u32(w, "a.u32", 4000000000u), BP_OK); /* replaced */
    ck_assert_int_eq(bp_gguf_writer_set_i32(w, "a.i32", -5), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_f32(w, "a.f32", 1e-5f), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_bool(w, "a.bool", false), BP_OK);
    const int32_t ints[3] = {3, -1, 4};
    const float floats[2] = {0.5f, -8.0f};
    const char *const strs[3] = {"x", "", "üñï"};
    ck_assert_int_eq(bp_gguf_writer_set_arr_i32(w, "a.ints", ints, 3), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_arr_f32(w, "a.floats", floats, 2), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_arr_str(w, "a.strs", strs, 3), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_arr_str(w, "a.none", NULL, 0), BP_OK);
    for (int k = 0; k < 6; k++)
        ck_assert_int_eq(bp_gguf_writer_add_tensor(w, NULL, ts[k]), BP_OK);
    /* refusals */
    ck_assert_int_eq(bp_gguf_writer_add_tensor(w, NULL, ts[0]), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "already added"));
    ck_assert_int_eq(bp_gguf_writer_set_u32(w, "", 1), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_gguf_writer_set_u32(w, "bad\xff", 1), BP_ERR_INVALID_ARG);
    bp_tensor *loose = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_set_name(loose, "loose");
    ck_assert_int_eq(bp_gguf_writer_add_tensor(w, NULL, loose), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "allocated"));

    char path[] = "/tmp/bp-gguf-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(bp_gguf_writer_write(w, path), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_write(w, "/nonexistent/dir/x.gguf"), BP_ERR_IO);

    /* general.alignment chooses the data alignment: 64 here; not a power of two, refused */
    char path64[] = "/tmp/bp-gguf-XXXXXX";
    fd = mkstemp(path64);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(bp_gguf_writer_set_u32(w, "general.alignment", 48), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_write(w, path64), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "power of two"));
    ck_assert_int_eq(bp_gguf_writer_set_u32(w, "general.alignment", 64), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_write(w, path64), BP_OK);
    bp_gguf_writer_free(w);
    bp_gguf *g64 = bp_gguf_open(path64);
    ck_assert_msg(g64 != NULL, "%s", bp_last_error());
    ck_assert_uint_eq(bp_gguf_get_alignment(g64), 64);
    ck_assert_uint_eq(bp_gguf_get_data_offset(g64) % 64, 0);
    for (int64_t k = 0; k < bp_gguf_get_n_tensors(g64); k++) {
        struct bp_gguf_tensor t;
        ck_assert_int_eq(bp_gguf_get_tensor(g64, k, &t), BP_OK);
        ck_assert_uint_eq(t.offset % 64, 0);
        ck_assert_mem_eq(t.data, ts[k]->data, t.size);
    }
    bp_gguf_close(g64);
    unlink(path64);

    bp_gguf *g = bp_gguf_open(path);
    ck_assert_msg(g != NULL, "%s", bp_last_error());
    int64_t v;
    double d;
    bool b;
    const char *s;
    ck_assert_int_eq(bp_gguf_get_n_kv(g), 9);
    ck_assert_int_eq(bp_gguf_get_int(g, bp_gguf_find_key(g, "a.u32"), &v), BP_OK);
    ck_assert_int_eq(v, 4000000000LL);
    ck_assert_int_eq(bp_gguf_get_kv_type(g, bp_gguf_find_key(g, "a.u32")), BP_GGUF_TYPE_UINT32);
    ck_assert_int_eq(bp_gguf_get_int(g, bp_gguf_find_key(g, "a.i32"), &v), BP_OK);
    ck_assert_int_eq(v, -5);
    ck_assert_int_eq(bp_gguf_get_float(g, bp_gguf_find_key(g, "a.f32"), &d), BP_OK);
    ck_assert(d == (double)1e-5f);
    ck_assert_int_eq(bp_gguf_get_bool(g, bp_gguf_find_key(g, "a.bool"), &b), BP_OK);
    ck_assert(!b);
    ck_assert_int_eq(bp_gguf_get_arr_n(g, bp_gguf_find_key(g, "a.ints")), 3);
    ck_assert_int_eq(bp_gguf_get_arr_int(g, bp_gguf_find_key(g, "a.ints"), 2, &v), BP_OK);
    ck_assert_int_eq(v, 4);
    ck_assert_int_eq(bp_gguf_get_arr_float(g, bp_gguf_find_key(g, "a.floats"), 1, &d), BP_OK);
    ck_assert(d == -8.0);
    ck_assert_int_eq(bp_gguf_get_arr_str(g, bp_gguf_find_key(g, "a.strs"), 2, &s, NULL), BP_OK);
    ck_assert_str_eq(s, "üñï");
    ck_assert_int_eq(bp_gguf_get_arr_n(g, bp_gguf_find_key(g, "a.none")), 0);
    ck_assert_int_eq(bp_gguf_get_n_tensors(g), 6);
    for (int k = 0; k < 6; k++) {
        struct bp_gguf_tensor t;
        ck_assert_int_eq(bp_gguf_get_tensor(g, bp_gguf_find_tensor(g, bp_get_name(ts[k])), &t),
                         BP_OK);
        ck_assert_int_eq(t.type, types[k]);
        for (int dd = 0; dd < 4; dd++)
            ck_assert_int_eq(t.ne[dd], ts[k]->ne[dd]);
        ck_assert_int_eq(t.n_dims, k == 2 ? 3 : (k == 0 ? 1 : 2));
        ck_assert_uint_eq(t.size, bp_nbytes(ts[k]));
        ck_assert_uint_eq(t.offset % 32, 0);
        ck_assert_mem_eq(t.data, ts[k]->data, t.size);
    }
    bp_gguf_close(g);
    unlink(path);
    bp_buffer_free(buf);
    bp_context_free(ctx);
}
END_TEST

/* ---- The files around the format ------------------------------------------------------------ */

/* A new empty directory under /tmp; the caller removes it with rm_dir. */
static void make_dir(char *dir, size_t size)
{
    snprintf(dir, size, "/tmp/bp-gguf-dir-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

/* The names in dir other than . and .., as one string "a b c" (readdir's order, sorted by the
 * caller's expectations: these tests leave at most one or two files). */
static int dir_entries(const char *dir, char *names, size_t size)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    names[0] = '\0';
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        n++;
        strncat(names, e->d_name, size - strlen(names) - 2);
        strcat(names, " ");
    }
    closedir(d);
    return n;
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    char path[4096];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        ck_assert_int_eq(unlink(path), 0);
    }
    closedir(d);
    ck_assert_int_eq(rmdir(dir), 0);
}

static unsigned char *read_whole(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    static unsigned char buf[1 << 20];
    *n = fread(buf, 1, sizeof(buf), f);
    ck_assert(feof(f));
    fclose(f);
    unsigned char *copy = malloc(*n + 1);
    memcpy(copy, buf, *n);
    return copy;
}

/* A FIFO (whose blocking open would wait for a writer forever), a device and a directory: each
 * refused at once, naming what it is. The case's short timeout turns a hang into a failure. */
START_TEST(test_special_files_refused_at_once)
{
    char dir[64], fifo[96];
    make_dir(dir, sizeof(dir));
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    const struct {
        const char *path, *kind;
    } bad[] = {{fifo, "is a FIFO, not a regular file"},
               {"/dev/null", "is a character device, not a regular file"},
               {dir, "is a directory, not a regular file"}};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        ck_assert_rejected(bp_gguf_open(bad[k].path), BP_ERR_IO, bad[k].kind);
        ck_assert_ptr_nonnull(strstr(bp_last_error(), bad[k].path));
        /* a file buffer of any size, even 0, over one of them: not "out of bounds" */
        ck_assert_rejected(bp_buffer_from_file(bad[k].path, 0, 0), BP_ERR_IO, bad[k].kind);
        ck_assert_ptr_nonnull(strstr(bp_last_error(), bad[k].path));
    }
    /* a socket cannot even be opened (ENXIO): still named for what it is */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/sock", dir);
    const int sock = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(sock, 0);
    ck_assert_int_eq(bind(sock, (const struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_rejected(bp_gguf_open(sa.sun_path), BP_ERR_IO, "is a socket, not a regular file");
    ck_assert_rejected(bp_buffer_from_file(sa.sun_path, 0, 0), BP_ERR_IO,
                       "is a socket, not a regular file");
    close(sock);
    unlink(sa.sun_path);
    /* nor is one replaced by the writer: refused, and still what it was */
    bp_gguf_writer *w = bp_gguf_writer_new();
    ck_assert_int_eq(bp_gguf_writer_set_u32(w, "a.u32", 1), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_write(w, fifo), BP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "is a FIFO; only a regular file is replaced"));
    ck_assert_int_eq(bp_gguf_writer_write(w, dir), BP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "is a directory;"));
    ck_assert_int_eq(bp_gguf_writer_write(w, "/dev/null"), BP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "is a character device;"));
    bp_gguf_writer_free(w);
    struct stat st;
    ck_assert_int_eq(lstat(fifo, &st), 0);
    ck_assert(S_ISFIFO(st.st_mode));
    char names[256];
    ck_assert_int_eq(dir_entries(dir, names, sizeof(names)), 1); /* no temporary left */
    rm_dir(dir);
}
END_TEST

/* Every kind of value, with a long string first so that the later values lie pages into the
 * file (a getter reading the mapping of a file cut short there would die of SIGBUS). */
static bp_gguf_writer *all_kinds(void)
{
    static char big[3 * 4096];
    memset(big, 'x', sizeof(big) - 1);
    bp_gguf_writer *w = bp_gguf_writer_new();
    const int32_t ints[3] = {3, -1, 4};
    const float floats[2] = {0.5f, -8.0f};
    const char *const strs[2] = {"first", "second"};
    ck_assert_int_eq(bp_gguf_writer_set_str(w, "a.big", big), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_u32(w, "a.u32", 4000000000u), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_i32(w, "a.i32", -5), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_f32(w, "a.f32", 0.25f), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_bool(w, "a.bool", true), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_str(w, "a.str", "hello"), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_arr_i32(w, "a.ints", ints, 3), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_arr_f32(w, "a.floats", floats, 2), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_arr_str(w, "a.strs", strs, 2), BP_OK);
    return w;
}

START_TEST(test_metadata_outlives_a_truncated_file)
{
    char path[] = "/tmp/bp-gguf-XXXXXX";
    const int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    bp_gguf_writer *w = all_kinds();
    ck_assert_int_eq(bp_gguf_writer_write(w, path), BP_OK);
    bp_gguf_writer_free(w);
    bp_gguf *g = bp_gguf_open(path);
    ck_assert_msg(g != NULL, "%s", bp_last_error());
    ck_assert_int_eq(truncate(path, 8), 0); /* under the open file's mapping */
    int64_t v;
    double d;
    bool b;
    const char *s;
    size_t len;
    ck_assert_int_eq(bp_gguf_get_n_kv(g), 9);
    ck_assert_int_eq(bp_gguf_get_int(g, bp_gguf_find_key(g, "a.u32"), &v), BP_OK);
    ck_assert_int_eq(v, 4000000000LL);
    ck_assert_int_eq(bp_gguf_get_int(g, bp_gguf_find_key(g, "a.i32"), &v), BP_OK);
    ck_assert_int_eq(v, -5);
    ck_assert_int_eq(bp_gguf_get_float(g, bp_gguf_find_key(g, "a.f32"), &d), BP_OK);
    ck_assert(d == 0.25);
    ck_assert_int_eq(bp_gguf_get_bool(g, bp_gguf_find_key(g, "a.bool"), &b), BP_OK);
    ck_assert(b);
    ck_assert_int_eq(bp_gguf_get_str(g, bp_gguf_find_key(g, "a.str"), &s, &len), BP_OK);
    ck_assert_str_eq(s, "hello");
    ck_assert_int_eq(bp_gguf_get_str(g, bp_gguf_find_key(g, "a.big"), &s, &len), BP_OK);
    ck_assert_uint_eq(len, 3 * 4096 - 1);
    ck_assert_int_eq(s[len - 1], 'x');
    const int64_t ints = bp_gguf_find_key(g, "a.ints"), floats = bp_gguf_find_key(g, "a.floats");
    const int32_t want_i[3] = {3, -1, 4};
    for (uint64_t j = 0; j < 3; j++) {
        ck_assert_int_eq(bp_gguf_get_arr_int(g, ints, j, &v), BP_OK);
        ck_assert_int_eq(v, want_i[j]);
    }
    ck_assert_int_eq(bp_gguf_get_arr_float(g, floats, 0, &d), BP_OK);
    ck_assert(d == 0.5);
    ck_assert_int_eq(bp_gguf_get_arr_float(g, floats, 1, &d), BP_OK);
    ck_assert(d == -8.0);
    ck_assert_int_eq(bp_gguf_get_arr_str(g, bp_gguf_find_key(g, "a.strs"), 1, &s, NULL), BP_OK);
    ck_assert_str_eq(s, "second");
    bp_gguf_close(g);
    unlink(path);
}
END_TEST

/* One f32 tensor of n values, all v, in a host buffer; *buf and *ctx for the caller to free. */
static bp_tensor *filled(int n, float v, bp_context **ctx, bp_buffer **buf)
{
    *ctx = bp_context_new(1);
    bp_tensor *t = bp_new_tensor_1d(*ctx, BP_TYPE_F32, n);
    bp_set_name(t, "w");
    *buf = bp_alloc_ctx_tensors(*ctx, bp_host_buffer_type());
    ck_assert_ptr_nonnull(*buf);
    for (int i = 0; i < n; i++)
        ((float *)t->data)[i] = v;
    return t;
}

static void write_filled(const char *path, int n, float v)
{
    bp_context *ctx;
    bp_buffer *buf;
    bp_tensor *t = filled(n, v, &ctx, &buf);
    bp_gguf_writer *w = bp_gguf_writer_new();
    ck_assert_int_eq(bp_gguf_writer_add_tensor(w, NULL, t), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_set_f32(w, "a.value", v), BP_OK);
    ck_assert_msg(bp_gguf_writer_write(w, path) == BP_OK, "%s", bp_last_error());
    bp_gguf_writer_free(w);
    bp_buffer_free(buf);
    bp_context_free(ctx);
}

/* The value the file at path holds (a.value), or NAN. */
static double value_of(const char *path)
{
    bp_gguf *g = bp_gguf_open(path);
    ck_assert_msg(g != NULL, "%s", bp_last_error());
    double d = NAN;
    ck_assert_int_eq(bp_gguf_get_float(g, bp_gguf_find_key(g, "a.value"), &d), BP_OK);
    bp_gguf_close(g);
    return d;
}

/* A file rewritten while a reader has it mapped: the reader keeps the old bytes (the writer
 * renames a new file over the name; the old inode lives on in the mapping). */
START_TEST(test_rewrite_under_a_reader)
{
    char dir[64], path[96];
    make_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/m.gguf", dir);
    write_filled(path, 4096, 1.0f);
    bp_gguf *g = bp_gguf_open(path);
    ck_assert_msg(g != NULL, "%s", bp_last_error());
    write_filled(path, 16, 2.0f); /* shorter: an in-place rewrite would cut the mapping short */
    struct bp_gguf_tensor t;
    ck_assert_int_eq(bp_gguf_get_tensor(g, 0, &t), BP_OK);
    ck_assert_int_eq(t.ne[0], 4096);
    for (int i = 0; i < 4096; i++)
        ck_assert(((const float *)t.data)[i] == 1.0f);
    bp_gguf_close(g);
    ck_assert(value_of(path) == 2.0);
    char names[256];
    ck_assert_int_eq(dir_entries(dir, names, sizeof(names)), 1);
    ck_assert_str_eq(names, "m.gguf ");
    rm_dir(dir);
}
END_TEST

/* A write that fails half-way, once because a tensor's bytes cannot be read and once because
 * the file size limit stops the write itself: the old file stays byte for byte, and no
 * temporary file is left beside it. Neither depends on permissions (tests may run as root). */
START_TEST(test_failed_write_leaves_the_old_file)
{
    char dir[64], path[96], src[96], names[256];
    make_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/m.gguf", dir);
    snprintf(src, sizeof(src), "%s/src.bin", dir);
    write_filled(path, 64, 1.0f);
    size_t n0, n1;
    unsigned char *before = read_whole(path, &n0);

    /* a tensor of a file buffer whose file changed since: bp_tensor_get fails */
    static float zeros[4096];
    FILE *f = fopen(src, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(zeros, sizeof(zeros), 1, f), 1);
    fclose(f);
    bp_buffer *fbuf = bp_buffer_from_file(src, 0, sizeof(zeros));
    ck_assert_msg(fbuf != NULL, "%s", bp_last_error());
    bp_context *ctx = bp_context_new(1);
    bp_tensor *t = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4096);
    bp_set_name(t, "w");
    ck_assert_int_eq(bp_buffer_place_tensor(fbuf, t, bp_buffer_get_base(fbuf)), BP_OK);
    bp_gguf_writer *w = bp_gguf_writer_new();
    ck_assert_int_eq(bp_gguf_writer_set_str(w, "a.str", "new"), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_add_tensor(w, NULL, t), BP_OK);
    ck_assert_int_eq(truncate(src, 100), 0);
    ck_assert_int_eq(bp_gguf_writer_write(w, path), BP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "changed on disk"));
    bp_gguf_writer_free(w);
    bp_buffer_free(fbuf);
    bp_context_free(ctx);
    unsigned char *after = read_whole(path, &n1);
    ck_assert_uint_eq(n1, n0);
    ck_assert_mem_eq(after, before, n0);
    free(after);
    ck_assert_int_eq(dir_entries(dir, names, sizeof(names)), 2); /* m.gguf and src.bin */

    /* the file size limit, in a child of its own (SIGXFSZ ignored: the write fails EFBIG) */
    const pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        const struct rlimit lim = {4096, 4096};
        bp_context *cctx;
        bp_buffer *cbuf;
        bp_tensor *ct = filled(8192, 3.0f, &cctx, &cbuf);
        bp_gguf_writer *cw = bp_gguf_writer_new();
        const bool ok = setrlimit(RLIMIT_FSIZE, &lim) == 0 &&
                        bp_gguf_writer_add_tensor(cw, NULL, ct) == BP_OK &&
                        bp_gguf_writer_write(cw, path) == BP_ERR_IO &&
                        strstr(bp_last_error(), "File too large") != NULL;
        if (!ok)
            fprintf(stderr, "child: %s\n", bp_last_error());
        _exit(ok ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the write did not fail as "
                  "expected (status %d)", status);
    after = read_whole(path, &n1);
    ck_assert_uint_eq(n1, n0);
    ck_assert_mem_eq(after, before, n0);
    free(after);
    free(before);
    ck_assert_int_eq(dir_entries(dir, names, sizeof(names)), 2);
    rm_dir(dir);
}
END_TEST

static unsigned mode_of(const char *path)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return st.st_mode & 07777;
}

static bool is_link(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

/* The replaced file keeps its permissions; a new one gets 0666 less the umask; a symbolic link
 * (relative, absolute, a chain, one to a file not there yet) is written through and stays. */
START_TEST(test_write_keeps_mode_and_follows_links)
{
    char dir[64], path[96], p2[96], l1[96], l2[96], l3[96], dangle[96], made[96], names[512];
    make_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/m.gguf", dir);
    snprintf(p2, sizeof(p2), "%s/new.gguf", dir);
    snprintf(l1, sizeof(l1), "%s/l1.gguf", dir);
    snprintf(l2, sizeof(l2), "%s/l2.gguf", dir);
    snprintf(l3, sizeof(l3), "%s/l3.gguf", dir);
    snprintf(dangle, sizeof(dangle), "%s/dangle.gguf", dir);
    snprintf(made, sizeof(made), "%s/made.gguf", dir);
    write_filled(path, 16, 1.0f);
    ck_assert_int_eq(chmod(path, 0604), 0);
    write_filled(path, 16, 2.0f);
    ck_assert_uint_eq(mode_of(path), 0604);
    ck_assert(value_of(path) == 2.0);
    const mode_t old_mask = umask(027);
    write_filled(p2, 16, 1.0f);
    umask(old_mask);
    ck_assert_uint_eq(mode_of(p2), 0640);

    ck_assert_int_eq(symlink("m.gguf", l1), 0);  /* relative */
    ck_assert_int_eq(symlink("l1.gguf", l2), 0); /* a chain */
    ck_assert_int_eq(symlink(path, l3), 0);      /* absolute */
    ck_assert_int_eq(symlink("made.gguf", dangle), 0);
    write_filled(l1, 16, 3.0f);
    ck_assert(value_of(path) == 3.0);
    write_filled(l2, 16, 4.0f);
    ck_assert(value_of(path) == 4.0);
    write_filled(l3, 16, 5.0f);
    ck_assert(value_of(path) == 5.0);
    ck_assert_uint_eq(mode_of(path), 0604);
    write_filled(dangle, 16, 6.0f);
    ck_assert(value_of(made) == 6.0);
    ck_assert(is_link(l1) && is_link(l2) && is_link(l3) && is_link(dangle));
    ck_assert(!is_link(path) && !is_link(made));
    char target[64];
    const ssize_t n = readlink(l1, target, sizeof(target) - 1);
    ck_assert_int_eq(n, 6);
    target[n] = '\0';
    ck_assert_str_eq(target, "m.gguf");

    /* a loop of links has no file at its end */
    char a[96], b[96];
    snprintf(a, sizeof(a), "%s/a", dir);
    snprintf(b, sizeof(b), "%s/b", dir);
    ck_assert_int_eq(symlink("b", a), 0);
    ck_assert_int_eq(symlink("a", b), 0);
    bp_gguf_writer *w = bp_gguf_writer_new();
    ck_assert_int_eq(bp_gguf_writer_write(w, a), BP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "symbolic links"));
    bp_gguf_writer_free(w);
    /* m, new, l1, l2, l3, dangle, made, a, b: no temporary file among them */
    ck_assert_int_eq(dir_entries(dir, names, sizeof(names)), 9);
    rm_dir(dir);
}
END_TEST

/* ---- Hostile files ---------------------------------------------------------------------------- */

struct bytes {
    unsigned char p[4096];
    size_t n;
};

static void put(struct bytes *b, const void *v, size_t n)
{
    ck_assert_uint_le(b->n + n, sizeof(b->p));
    memcpy(b->p + b->n, v, n);
    b->n += n;
}

static void u32(struct bytes *b, uint32_t v)
{
    put(b, &v, 4);
}

static void u64(struct bytes *b, uint64_t v)
{
    put(b, &v, 8);
}

static void str(struct bytes *b, const char *s)
{
    u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void header(struct bytes *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    b->n = 0;
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, n_tensors);
    u64(b, n_kv);
}

static void tensor_info(struct bytes *b, const char *name, uint32_t nd, const uint64_t *ne,
                        uint32_t type, uint64_t offset)
{
    str(b, name);
    u32(b, nd);
    for (uint32_t d = 0; d < nd; d++)
        u64(b, ne[d]);
    u32(b, type);
    u64(b, offset);
}

static void pad_to(struct bytes *b, size_t align)
{
    while (b->n % align != 0)
        b->p[b->n++] = 0;
}

static void zeros(struct bytes *b, size_t n)
{
    ck_assert_uint_le(b->n + n, sizeof(b->p));
    memset(b->p + b->n, 0, n);
    b->n += n;
}

/* A well-formed file: one key, two f32 tensors of 8 elements. */
static void valid(struct bytes *b)
{
    header(b, 3, 2, 1);
    str(b, "general.name");
    u32(b, BP_GGUF_TYPE_STRING);
    str(b, "ok");
    const uint64_t ne[1] = {8};
    tensor_info(b, "a", 1, ne, 0, 0);
    tensor_info(b, "b", 1, ne, 0, 32);
    pad_to(b, 32);
    zeros(b, 64);
}

#define REFUSED(b, needle)                                                                     \
    do {                                                                                       \
        bp_clear_error();                                                                      \
        bp_gguf *g_ = bp_gguf_open_memory((b).p, (b).n, "hostile.gguf");                        \
        ck_assert_msg(g_ == NULL, "a hostile file was accepted (expected: %s)", (needle));     \
        ck_assert_msg(strstr(bp_last_error(), (needle)) != NULL, "'%s' does not say '%s'",    \
                      bp_last_error(), (needle));                                              \
        ck_assert_ptr_nonnull(strstr(bp_last_error(), "hostile.gguf"));                         \
    } while (0)

START_TEST(test_every_truncation_is_refused)
{
    struct bytes b;
    valid(&b);
    bp_gguf *g = bp_gguf_open_memory(b.p, b.n, "valid.gguf");
    ck_assert_msg(g != NULL, "%s", bp_last_error());
    bp_gguf_close(g);
    for (size_t n = 0; n < b.n; n++) {
        bp_clear_error();
        g = bp_gguf_open_memory(b.p, n, "cut.gguf");
        ck_assert_msg(g == NULL, "a file cut to %zu of %zu bytes was accepted", n, b.n);
        ck_assert_msg(bp_last_error()[0] != '\0', "no reason for a cut at %zu", n);
    }
}
END_TEST

START_TEST(test_hostile_headers)
{
    struct bytes b;
    valid(&b);
    memcpy(b.p, "GGUG", 4);
    REFUSED(b, "not a GGUF file");
    for (uint32_t v = 0; v < 6; v++) {
        if (v == 2 || v == 3)
            continue;
        valid(&b);
        memcpy(b.p + 4, &v, 4);
        REFUSED(b, "versions 2 and 3 are supported");
    }
    header(&b, 3, 0, UINT64_MAX);
    REFUSED(b, "absurd counts");
    header(&b, 3, 0, 1u << 30);
    REFUSED(b, "number of metadata keys");
    header(&b, 3, 1u << 30, 0);
    REFUSED(b, "number of tensors");
    /* version 2 is read like 3 */
    valid(&b);
    b.p[4] = 2;
    bp_gguf *g = bp_gguf_open_memory(b.p, b.n, "v2.gguf");
    ck_assert_msg(g != NULL, "%s", bp_last_error());
    ck_assert_uint_eq(bp_gguf_get_version(g), 2);
    bp_gguf_close(g);
}
END_TEST

START_TEST(test_hostile_metadata)
{
    struct bytes b;
    header(&b, 3, 0, 1);
    u64(&b, 1ull << 60); /* key length */
    zeros(&b, 16);
    REFUSED(b, "claims");
    header(&b, 3, 0, 1);
    str(&b, "bad\xc3\x28key");
    u32(&b, BP_GGUF_TYPE_UINT8);
    put(&b, "x", 1);
    REFUSED(b, "not valid UTF-8");
    header(&b, 3, 0, 1);
    str(&b, "");
    u32(&b, BP_GGUF_TYPE_UINT8);
    put(&b, "x", 1);
    REFUSED(b, "empty");
    header(&b, 3, 0, 2);
    str(&b, "k");
    u32(&b, BP_GGUF_TYPE_UINT8);
    put(&b, "x", 1);
    str(&b, "k");
    u32(&b, BP_GGUF_TYPE_UINT8);
    put(&b, "x", 1);
    REFUSED(b, "appears twice");
    header(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, 13);
    REFUSED(b, "not a GGUF type");
    header(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, BP_GGUF_TYPE_ARRAY);
    u32(&b, BP_GGUF_TYPE_ARRAY);
    u64(&b, 1);
    REFUSED(b, "array of arrays");
    header(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, BP_GGUF_TYPE_ARRAY);
    u32(&b, BP_GGUF_TYPE_UINT64);
    u64(&b, 1ull << 61);
    REFUSED(b, "length of an array");
    header(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, BP_GGUF_TYPE_ARRAY);
    u32(&b, BP_GGUF_TYPE_STRING);
    u64(&b, 1ull << 40);
    REFUSED(b, "length of a string array");
    header(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, BP_GGUF_TYPE_STRING);
    u64(&b, 100);
    REFUSED(b, "claims 100 bytes");
    /* alignment: must be a power of two, of an integer type */
    const uint32_t aligns[] = {0, 3, 1u << 21};
    for (int k = 0; k < 3; k++) {
        header(&b, 3, 0, 1);
        str(&b, "general.alignment");
        u32(&b, BP_GGUF_TYPE_UINT32);
        u32(&b, aligns[k]);
        REFUSED(b, "power of two");
    }
    header(&b, 3, 0, 1);
    str(&b, "general.alignment");
    u32(&b, BP_GGUF_TYPE_FLOAT32);
    u32(&b, 0);
    REFUSED(b, "not an integer");
}
END_TEST

START_TEST(test_hostile_tensors)
{
    struct bytes b;
    const uint64_t ne8[1] = {8}, ne_big[2] = {1ull << 62, 16}, ne_odd[1] = {33};
    /* dimensions */
    for (uint32_t nd = 0; nd <= 5; nd += 5) {
        header(&b, 3, 1, 0);
        const uint64_t ne[5] = {1, 1, 1, 1, 1};
        tensor_info(&b, "t", nd, ne, 0, 0);
        pad_to(&b, 32);
        zeros(&b, 32);
        REFUSED(b, "dimensions (1 to 4");
    }
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 2, ne_big, 0, 0);
    REFUSED(b, "absurd size");
    /* empty, but the other dimensions multiply past 2^63: a reader's row count would wrap */
    const uint64_t ne_empty_big[4] = {32, 0, 1ull << 40, 1ull << 40};
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 4, ne_empty_big, 0, 0);
    REFUSED(b, "absurd size");
    /* an empty tensor whose other dimensions fit opens, with no data */
    const uint64_t ne_empty[4] = {32, 0, 1ull << 20, 3};
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 4, ne_empty, 0, 0);
    pad_to(&b, 32);
    bp_gguf *ge = bp_gguf_open_memory(b.p, b.n, "empty.gguf");
    ck_assert_msg(ge != NULL, "%s", bp_last_error());
    struct bp_gguf_tensor te;
    ck_assert_int_eq(bp_gguf_get_tensor(ge, 0, &te), BP_OK);
    ck_assert_uint_eq(te.size, 0);
    ck_assert_int_eq(te.ne[2], 1 << 20);
    bp_gguf_close(ge);
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 1, ne8, 77, 0);
    REFUSED(b, "not a ggml type");
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 1, ne_odd, 8, 0); /* q8_0 rows of 33 */
    REFUSED(b, "whole number of 32-element blocks");
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 1, ne8, 0, 16);
    REFUSED(b, "not a multiple of the alignment");
    header(&b, 3, 1, 0);
    tensor_info(&b, "t", 1, ne8, 0, 64);
    pad_to(&b, 32);
    zeros(&b, 64);
    REFUSED(b, "ends past the end of the file");
    header(&b, 3, 2, 0);
    tensor_info(&b, "t", 1, ne8, 0, 0);
    tensor_info(&b, "t", 1, ne8, 0, 32);
    pad_to(&b, 32);
    zeros(&b, 64);
    REFUSED(b, "appears twice");
    const uint64_t ne16[1] = {16};
    header(&b, 3, 2, 0);
    tensor_info(&b, "a", 1, ne16, 0, 0); /* 64 bytes at 0 */
    tensor_info(&b, "b", 1, ne8, 0, 32);  /* 32 bytes at 32: inside a */
    pad_to(&b, 32);
    zeros(&b, 96);
    REFUSED(b, "overlap");
    header(&b, 3, 1, 0);
    tensor_info(&b, "", 1, ne8, 0, 0);
    REFUSED(b, "name is empty");
    /* a type we do not compute with opens, and is named when asked for */
    const uint64_t ne256[1] = {256};
    header(&b, 3, 1, 0);
    tensor_info(&b, "blk.0.ffn_down.weight", 1, ne256, 16, 0);
    pad_to(&b, 32);
    zeros(&b, 66);
    bp_gguf *g = bp_gguf_open_memory(b.p, b.n, "iq2.gguf");
    ck_assert_msg(g != NULL, "%s", bp_last_error());
    struct bp_gguf_tensor t;
    ck_assert_int_eq(bp_gguf_get_tensor(g, 0, &t), BP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "'blk.0.ffn_down.weight' has type iq2_xxs"));
    ck_assert_str_eq(t.type_name, "iq2_xxs");
    ck_assert(!t.supported);
    ck_assert_uint_eq(t.size, 66);
    bp_gguf_close(g);
}
END_TEST

/* Key i of a against key i of b: the same name, type, count and values (strings byte for byte,
 * NUL bytes included). */
static void assert_same_kv(const bp_gguf *a, const bp_gguf *b, int64_t i)
{
    const int64_t j = bp_gguf_find_key(b, bp_gguf_get_key(a, i));
    ck_assert_msg(j >= 0, "key %s lost", bp_gguf_get_key(a, i));
    const int type = bp_gguf_get_kv_type(a, i);
    ck_assert_int_eq(bp_gguf_get_kv_type(b, j), type);
    const bool arr = type == BP_GGUF_TYPE_ARRAY;
    const int et = arr ? bp_gguf_get_arr_type(a, i) : type;
    ck_assert_int_eq(arr ? bp_gguf_get_arr_type(b, j) : et, et);
    const uint64_t n = arr ? bp_gguf_get_arr_n(a, i) : 1;
    ck_assert_uint_eq(arr ? bp_gguf_get_arr_n(b, j) : 1, n);
    for (uint64_t k = 0; k < n; k++) {
        if (et == BP_GGUF_TYPE_STRING) {
            const char *x, *y;
            size_t lx, ly;
            ck_assert_int_eq(arr ? bp_gguf_get_arr_str(a, i, k, &x, &lx) : bp_gguf_get_str(a, i, &x, &lx), BP_OK);
            ck_assert_int_eq(arr ? bp_gguf_get_arr_str(b, j, k, &y, &ly) : bp_gguf_get_str(b, j, &y, &ly), BP_OK);
            ck_assert_uint_eq(lx, ly);
            ck_assert_mem_eq(x, y, lx);
        } else if (et == BP_GGUF_TYPE_FLOAT32 || et == BP_GGUF_TYPE_FLOAT64) {
            double x, y;
            ck_assert_int_eq(arr ? bp_gguf_get_arr_float(a, i, k, &x) : bp_gguf_get_float(a, i, &x), BP_OK);
            ck_assert_int_eq(arr ? bp_gguf_get_arr_float(b, j, k, &y) : bp_gguf_get_float(b, j, &y), BP_OK);
            ck_assert(memcmp(&x, &y, sizeof(x)) == 0);
        } else if (et == BP_GGUF_TYPE_BOOL) {
            bool x, y;
            ck_assert_int_eq(bp_gguf_get_bool(a, i, &x), BP_OK);
            ck_assert_int_eq(bp_gguf_get_bool(b, j, &y), BP_OK);
            ck_assert_int_eq(x, y);
        } else if (et != BP_GGUF_TYPE_UINT64) { /* (a uint64 above INT64_MAX reads as an error) */
            int64_t x, y;
            ck_assert_int_eq(arr ? bp_gguf_get_arr_int(a, i, k, &x) : bp_gguf_get_int(a, i, &x), BP_OK);
            ck_assert_int_eq(arr ? bp_gguf_get_arr_int(b, j, k, &y) : bp_gguf_get_int(b, j, &y), BP_OK);
            ck_assert_int_eq(x, y);
        }
    }
}

/* Every key of the gguf package's reference file (every value type, arrays of each) copied into
 * a writer and back, beside one tensor of each type added with the new weight types. */
START_TEST(test_writer_copies_keys_and_writes_every_type)
{
    bp_gguf *ref = bp_gguf_open(path_in_srcdir("reference.gguf"));
    ck_assert_msg(ref != NULL, "%s", bp_last_error());
    bp_gguf_writer *w = bp_gguf_writer_new();
    for (int64_t i = 0; i < bp_gguf_get_n_kv(ref); i++)
        ck_assert_int_eq(bp_gguf_writer_copy_kv(w, ref, i), BP_OK);
    ck_assert_int_eq(bp_gguf_writer_copy_kv(w, ref, bp_gguf_get_n_kv(ref)), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_gguf_writer_copy_kv(w, NULL, 0), BP_ERR_INVALID_ARG);
    bp_context *ctx = bp_context_new(BP_TYPE_COUNT);
    for (int t = 0; t < BP_TYPE_COUNT; t++)
        bp_set_name(bp_new_tensor_2d(ctx, (enum bp_type)t, 256, 2), bp_type_name((enum bp_type)t));
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    ck_assert_ptr_nonnull(buf);
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        bp_tensor *x = bp_context_get_tensor(ctx, (size_t)t);
        for (size_t b = 0; b < bp_nbytes(x); b++)
            ((unsigned char *)x->data)[b] = (unsigned char)(b * 31 + (size_t)t);
        ck_assert_int_eq(bp_gguf_writer_add_tensor(w, NULL, x), BP_OK);
    }
    char path[] = "/tmp/bp-gguf-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(bp_gguf_writer_write(w, path), BP_OK);
    bp_gguf *g = bp_gguf_open(path);
    ck_assert_msg(g != NULL, "%s", bp_last_error());
    ck_assert_int_eq(bp_gguf_get_n_kv(g), bp_gguf_get_n_kv(ref));
    for (int64_t i = 0; i < bp_gguf_get_n_kv(ref); i++)
        assert_same_kv(ref, g, i);
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        struct bp_gguf_tensor info;
        ck_assert_int_eq(bp_gguf_get_tensor(g, t, &info), BP_OK);
        ck_assert_int_eq(info.type, t);
        ck_assert_str_eq(info.type_name, bp_type_name((enum bp_type)t));
        ck_assert_mem_eq(info.data, bp_context_get_tensor(ctx, (size_t)t)->data, info.size);
    }
    bp_gguf_close(g);
    bp_gguf_close(ref);
    unlink(path);
    bp_gguf_writer_free(w);
    bp_buffer_free(buf);
    bp_context_free(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gguf");
    BP_TCASE(s, test_reads_what_the_gguf_package_wrote, 60);
    BP_TCASE(s, test_getters_check_types, 60);
    BP_TCASE(s, test_writer_round_trip, 60);
    BP_TCASE(s, test_writer_copies_keys_and_writes_every_type, 60);
    BP_TCASE(s, test_every_truncation_is_refused, 60);
    BP_TCASE(s, test_hostile_headers, 60);
    BP_TCASE(s, test_hostile_metadata, 60);
    BP_TCASE(s, test_hostile_tensors, 60);
    BP_TCASE(s, test_special_files_refused_at_once, 10);
    BP_TCASE(s, test_metadata_outlives_a_truncated_file, 60);
    BP_TCASE(s, test_rewrite_under_a_reader, 60);
    BP_TCASE(s, test_failed_write_leaves_the_old_file, 60);
    BP_TCASE(s, test_write_keeps_mode_and_follows_links, 60);
    return bp_test_run(s);
}
