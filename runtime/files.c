/* files.c - opening and replacing the files a user names (GGUF files, file buffers).
 *
 * A path can name anything: a FIFO (whose open blocks until a writer comes, forever if none
 * does), a socket, a terminal or other device, a directory. Every open here is non-blocking and
 * close-on-exec and is followed by fstat on the descriptor itself, so what is checked is what is
 * read: anything but a regular file is refused with one sentence, before a single read.
 *
 * A file is replaced the way editors do it, never rewritten in place: the new contents go to a
 * temporary file in the target's directory, which is synced and renamed over the target, then
 * the directory is synced. A process that mapped the old file keeps its inode (a rewrite in
 * place would cut the mapping short under it: SIGBUS), and a failure half-way leaves the old
 * file as it was and no temporary behind. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bp-impl.h"

/* Symbolic links followed to find the file a path names, as the kernel's own limit. */
#define MAX_LINKS 40
/* Names tried for a temporary file before giving up (each is random: a clash is rare). */
#define TEMP_TRIES 64

const char *bp__file_kind(mode_t mode)
{
    if (S_ISREG(mode))
        return "a regular file";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    return "not a file";
}

int bp__open_regular(const char *path, const char *what, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        /* A socket cannot be opened at all (ENXIO): say what it is, as for the others. */
        const int err = errno;
        if (stat(path, st) == 0 && !S_ISREG(st->st_mode))
            return bp__error(BP_ERR_IO, "%s %s is %s, not a regular file", what, path,
                             bp__file_kind(st->st_mode)), -1;
        return bp__error(BP_ERR_IO, "cannot open %s %s: %s", what, path, strerror(err)), -1;
    }
    if (fstat(fd, st) != 0) {
        const int err = errno;
        close(fd);
        return bp__error(BP_ERR_IO, "cannot look at %s %s: %s", what, path, strerror(err)), -1;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return bp__error(BP_ERR_IO, "%s %s is %s, not a regular file", what, path,
                         bp__file_kind(st->st_mode)), -1;
    }
    /* Reads of a regular file never block anyway; the flag goes so that nothing later has to
     * know it was there. */
    const int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

/* The file path names after following symbolic links (which may not exist yet: a link to a
 * missing file names the file it would create); heap, or NULL with the error set. */
static char *final_target(const char *path, const char *what)
{
    char *cur = bp__strdup(path, "a file name");
    for (int hops = 0; cur != NULL; hops++) {
        struct stat ls;
        if (lstat(cur, &ls) != 0) {
            if (errno == ENOENT)
                return cur;
            bp__error(BP_ERR_IO, "cannot write %s %s: %s", what, path, strerror(errno));
            break;
        }
        if (!S_ISLNK(ls.st_mode))
            return cur;
        if (hops == MAX_LINKS) {
            bp__error(BP_ERR_IO, "cannot write %s %s: %s", what, path, strerror(ELOOP));
            break;
        }
        /* st_size is the link's length, but a link may change meanwhile: grow until it fits. */
        size_t cap = (size_t)ls.st_size + 2;
        char *link = NULL;
        ssize_t n;
        for (;;) {
            bp__free(link);
            link = bp__malloc(cap, "a symbolic link's target");
            if (link == NULL)
                break;
            n = readlink(cur, link, cap);
            if (n < 0 || (size_t)n < cap)
                break;
            cap *= 2;
        }
        if (link == NULL)
            break;
        if (n < 0) {
            bp__error(BP_ERR_IO, "cannot read the link %s: %s", cur, strerror(errno));
            bp__free(link);
            break;
        }
        link[n] = '\0';
        /* A relative target is relative to the directory holding the link. */
        const char *slash = strrchr(cur, '/');
        char *next = link[0] == '/' || slash == NULL
                         ? bp__strdup(link, "a file name")
                         : bp__asprintf("a file name", "%.*s/%s", (int)(slash - cur), cur, link);
        bp__free(link);
        bp__free(cur);
        cur = next;
    }
    bp__free(cur);
    return NULL;
}

/* Creates a new, empty temporary file next to target with the mode new files get (0666 less
 * the umask, the kernel applies it as for fopen); its descriptor, or -1 with errno set. */
#define TEMP_BASE_MAX 200

static int create_temp(const char *target, char **tmp_out)
{
    static unsigned counter;
    const char *slash = strrchr(target, '/');
    const int dir_len = slash != NULL ? (int)(slash - target + 1) : 0;
    const char *base = target + dir_len;
    /* ".NAME." and ".<12 hex>.tmp" add 19 bytes: a long name is cut to TEMP_BASE_MAX bytes so
     * that the temporary's name stays within NAME_MAX (255) where the target's does. */
    const size_t base_len = strlen(base);
    const int keep = base_len > TEMP_BASE_MAX ? TEMP_BASE_MAX : (int)base_len;
    for (int i = 0; i < TEMP_TRIES; i++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        /* splitmix64 of the time, the process and a counter: names no one can guess ahead */
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                     ((uint64_t)getpid() << 40) ^
                     ((uint64_t)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) << 20);
        x += 0x9e3779b97f4a7c15ull;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        x ^= x >> 31;
        char *tmp = bp__asprintf("a temporary file name", "%.*s.%.*s.%012llx.tmp", dir_len,
                                 target, keep, base, (unsigned long long)(x & 0xffffffffffffull));
        if (tmp == NULL)
            return errno = ENOMEM, -1;
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0666);
        if (fd >= 0) {
            *tmp_out = tmp;
            return fd;
        }
        const int err = errno;
        bp__free(tmp);
        if (err != EEXIST)
            return errno = err, -1;
    }
    return errno = EEXIST, -1;
}

bool bp__replace_open(struct bp__replace *r, const char *path, const char *what)
{
    memset(r, 0, sizeof(*r));
    r->fd = -1;
    r->what = what;
    r->target = final_target(path, what);
    if (r->target == NULL)
        return false;
    struct stat st;
    const bool exists = stat(r->target, &st) == 0;
    if (exists && !S_ISREG(st.st_mode)) {
        bp__error(BP_ERR_IO, "%s %s is %s; only a regular file is replaced", what, path,
                  bp__file_kind(st.st_mode));
        goto fail;
    }
    r->fd = create_temp(r->target, &r->tmp);
    if (r->fd < 0) {
        bp__error(BP_ERR_IO, "cannot write %s %s: %s", what, path, strerror(errno));
        goto fail;
    }
    if (exists) {
        /* The new file takes the old one's owner (where allowed: a user cannot give a file
         * away, and then keeps it) and then its permissions, since a change of owner clears the
         * set-user-ID bits. */
        if (st.st_uid != geteuid() || st.st_gid != getegid())
            (void)fchown(r->fd, st.st_uid, st.st_gid);
        if (fchmod(r->fd, st.st_mode & 07777) != 0) {
            bp__error(BP_ERR_IO, "cannot write %s %s: cannot give the new file the old one's "
                      "permissions: %s", what, path, strerror(errno));
            goto fail;
        }
    }
    r->f = fdopen(r->fd, "wb");
    if (r->f == NULL) {
        bp__error(BP_ERR_IO, "cannot write %s %s: %s", what, path, strerror(errno));
        goto fail;
    }
    return true;
fail:
    bp__replace_abort(r);
    return false;
}

void bp__replace_abort(struct bp__replace *r)
{
    if (r->f != NULL)
        fclose(r->f);
    else if (r->fd >= 0)
        close(r->fd);
    if (r->tmp != NULL)
        unlink(r->tmp);
    bp__free(r->tmp);
    bp__free(r->target);
    memset(r, 0, sizeof(*r));
    r->fd = -1;
}

/* Syncs the directory holding target, so that the rename survives a crash. Filesystems that
 * cannot sync a directory (EINVAL) have nothing to sync. */
static int sync_dir(const char *target)
{
    const char *slash = strrchr(target, '/');
    char *dir = slash == NULL ? bp__strdup(".", "a directory name")
                : slash == target
                    ? bp__strdup("/", "a directory name")
                    : bp__asprintf("a directory name", "%.*s", (int)(slash - target), target);
    if (dir == NULL)
        return ENOMEM;
    int err = 0;
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
        err = errno;
    if (fd >= 0)
        close(fd);
    bp__free(dir);
    return err;
}

enum bp_status bp__replace_commit(struct bp__replace *r, const char *path)
{
    const char *what = r->what;
    int err = 0;
    errno = 0;
    if (fflush(r->f) != 0 || ferror(r->f) || fsync(r->fd) != 0)
        err = errno ? errno : EIO;
    const int closed = fclose(r->f);
    r->f = NULL;
    r->fd = -1;
    if (err == 0 && closed != 0)
        err = errno ? errno : EIO;
    if (err == 0 && rename(r->tmp, r->target) != 0)
        err = errno;
    if (err != 0) {
        const enum bp_status st = bp__error(BP_ERR_IO, "cannot write %s %s: %s", what, path,
                                            strerror(err));
        bp__replace_abort(r);
        return st;
    }
    bp__free(r->tmp);
    r->tmp = NULL; /* renamed: nothing left to remove */
    err = sync_dir(r->target);
    bp__replace_abort(r);
    if (err != 0)
        return bp__error(BP_ERR_IO, "%s %s was written, but its directory could not be synced "
                         "to disk: %s", what, path, strerror(err));
    return BP_OK;
}
