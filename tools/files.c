/* files.c - the files the tool writes (--dot, --logits). Each is opened without blocking, so
 * that nothing named on the command line can hang the run in open: a FIFO that has a reader
 * (`--dot >(dot -Tsvg)`, a pipe through /dev/stdout) and a character device (/dev/null, a
 * terminal) are streams to write to; a FIFO without a reader, a directory, a socket or a block
 * device is refused with a sentence before anything is written. A regular file is emptied only
 * after that check. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool.h"

static const char *kind(mode_t mode)
{
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
                            : "not a regular file";
}

static FILE *refuse(const char *cmd, const char *opt, const char *path, const char *why)
{
    fprintf(stderr, "%s: cannot write %s file '", cmd, opt);
    tool_put_text(path, stderr);
    fprintf(stderr, "': %s\n", why);
    return NULL;
}

FILE *tool_open_output(const char *cmd, const char *opt, const char *path)
{
    struct stat st;
    const int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
    if (fd < 0) {
        /* A FIFO without a reader (ENXIO) or a directory (EISDIR): say what it is. */
        const int err = errno;
        if (err == ENXIO && stat(path, &st) == 0 && S_ISFIFO(st.st_mode))
            return refuse(cmd, opt, path, "it is a FIFO that nothing reads");
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
            char why[64];
            snprintf(why, sizeof(why), "it is %s, not a file or stream", kind(st.st_mode));
            return refuse(cmd, opt, path, why);
        }
        return refuse(cmd, opt, path, strerror(err));
    }
    FILE *f = NULL;
    if (fstat(fd, &st) != 0) {
        refuse(cmd, opt, path, strerror(errno));
    } else if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
        char why[64];
        snprintf(why, sizeof(why), "it is %s, not a file or stream", kind(st.st_mode));
        refuse(cmd, opt, path, why);
    } else if ((S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0) ||
               fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 ||
               (f = fdopen(fd, "w")) == NULL) {
        refuse(cmd, opt, path, strerror(errno));
    }
    if (f == NULL)
        close(fd);
    return f;
}
