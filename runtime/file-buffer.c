/* file-buffer.c - read-only buffers whose bytes stay in a file ("File" buffer type): tensors
 * placed in one are read with pread when someone asks for them (a scheduler copying the experts
 * a MUL_MAT_ID uses, bp_tensor_get), never mapped, so a file that shrinks or changes on disk is
 * an error of the read that meets it, not a SIGBUS in whatever touched the mapping.
 *
 * No device supports the buffer type, so no kernel reads such a tensor in place: a scheduler
 * copies it (or only its used experts) to the backend that needs it. The buffer's base is an
 * address range reserved without memory (PROT_NONE), so tensors get unique addresses that
 * nothing may dereference, as with any device buffer. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend-impl.h"

struct file_buffer {
    int fd;
    uint64_t offset; /* of byte 0 of the buffer in the file */
    void *reserve;   /* PROT_NONE range of the buffer's size (at least one page) */
    size_t reserve_size;
    struct stat at_open; /* the file as it was: size, inode, modification time */
    char path[256];
};

static void *fb_base(bp_buffer *buf)
{
    struct file_buffer *fb = buf->context;
    return fb->reserve;
}

static void fb_free(bp_buffer *buf)
{
    struct file_buffer *fb = buf->context;
    close(fb->fd);
    munmap(fb->reserve, fb->reserve_size);
    bp__free(fb);
}

static enum bp_status read_only(bp_buffer *buf, const char *what)
{
    struct file_buffer *fb = buf->context;
    return bp__error(BP_ERR_UNSUPPORTED, "file buffer of '%s': %s: the buffer is read-only (its "
                     "bytes stay in the file)", fb->path, what);
}

static enum bp_status fb_memset(bp_buffer *buf, bp_tensor *t, uint8_t v, size_t off, size_t n)
{
    (void)t, (void)v, (void)off, (void)n;
    return read_only(buf, "memset");
}

static enum bp_status fb_set(bp_buffer *buf, bp_tensor *t, const void *d, size_t off, size_t n)
{
    (void)t, (void)d, (void)off, (void)n;
    return read_only(buf, "set");
}

static enum bp_status fb_clear(bp_buffer *buf, uint8_t v)
{
    (void)v;
    return read_only(buf, "clear");
}

/* Whether the file is unchanged since it was opened: its size and modification time (the open
 * descriptor keeps reading the same inode even if another file now has its name). */
static bool unchanged(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static enum bp_status fb_get(bp_buffer *buf, const bp_tensor *t, void *data, size_t off,
                             size_t n)
{
    struct file_buffer *fb = buf->context;
    struct stat now;
    memset(&now, 0, sizeof(now));
    if (fstat(fb->fd, &now) != 0)
        return bp__error(BP_ERR_IO, "file buffer of '%s': cannot look at the file: %s", fb->path,
                         strerror(errno));
    if (!unchanged(&fb->at_open, &now))
        return bp__error(BP_ERR_IO, "file buffer of '%s': the file changed on disk since it "
                         "was opened (%lld bytes then, %lld now); its tensors cannot be read",
                         fb->path, (long long)fb->at_open.st_size, (long long)now.st_size);
    const uint64_t at = fb->offset + (uint64_t)((const char *)t->data - (char *)fb->reserve) + off;
    for (size_t done = 0; done < n;) {
        const ssize_t r = pread(fb->fd, (char *)data + done, n - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return bp__error(BP_ERR_IO, "file buffer of '%s': reading %zu bytes at %llu: %s",
                             fb->path, n, (unsigned long long)at,
                             r < 0 ? strerror(errno) : "the file ends before them");
        done += (size_t)r;
    }
    return BP_OK;
}

static const struct bp_buffer_iface file_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = fb_free,
    .get_base = fb_base,
    .memset_tensor = fb_memset,
    .set_tensor = fb_set,
    .get_tensor = fb_get,
    .clear = fb_clear,
};

static const char *file_buft_name(bp_buffer_type *buft)
{
    (void)buft;
    return "File";
}

static size_t file_buft_alignment(bp_buffer_type *buft)
{
    (void)buft;
    return 1;
}

static bp_buffer *file_buft_alloc(bp_buffer_type *buft, size_t size)
{
    (void)buft;
    return bp__error_null(BP_ERR_UNSUPPORTED, "the File buffer type allocates nothing (%zu bytes "
                          "asked): make its buffers with bp_buffer_from_file", size);
}

static const struct bp_buffer_type_iface file_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = file_buft_name,
    .alloc_buffer = file_buft_alloc,
    .get_alignment = file_buft_alignment,
};

static struct bp_buffer_type file_buft = {
    .iface = &file_buft_iface,
    .context = NULL,
    .device = NULL,
};

bp_buffer_type *bp_file_buffer_type(void)
{
    return &file_buft;
}

bp_buffer *bp_buffer_from_file(const char *path, uint64_t offset, size_t size)
{
    if (path == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_buffer_from_file: path is NULL");
    struct file_buffer *fb = bp__calloc(1, sizeof(*fb), "a file buffer");
    if (fb == NULL)
        return NULL;
    snprintf(fb->path, sizeof(fb->path), "%s", path);
    fb->offset = offset;
    fb->fd = bp__open_regular(path, "the file for a file buffer", &fb->at_open);
    if (fb->fd < 0) {
        bp__free(fb);
        return NULL;
    }
    uint64_t end;
    if (__builtin_add_overflow(offset, (uint64_t)size, &end) ||
        end > (uint64_t)fb->at_open.st_size) {
        bp__error(BP_ERR_OUT_OF_BOUNDS, "bp_buffer_from_file: '%s' is %lld bytes; bytes [%llu, "
                  "%llu + %zu) are not all in it", path, (long long)fb->at_open.st_size,
                  (unsigned long long)offset, (unsigned long long)offset, size);
        close(fb->fd);
        bp__free(fb);
        return NULL;
    }
    fb->reserve_size = size > 0 ? size : 1;
    fb->reserve = mmap(NULL, fb->reserve_size, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (fb->reserve == MAP_FAILED) {
        close(fb->fd);
        bp__free(fb);
        return bp__error_null(BP_ERR_OUT_OF_MEMORY, "bp_buffer_from_file: cannot reserve %zu "
                              "bytes of addresses for '%s'", size, path);
    }
    bp_buffer *buf = bp_buffer_new(&file_buft, &file_iface, fb, size);
    if (buf == NULL) {
        munmap(fb->reserve, fb->reserve_size);
        close(fb->fd);
        bp__free(fb);
    }
    return buf;
}
