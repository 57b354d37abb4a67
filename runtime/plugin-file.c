/* plugin-file.c - the checks a plugin file passes before the loader opens it for dlopen: every
 * directory and symbolic link on its path, then its ELF headers against its size. */
#include "config.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bp-impl.h"
#include "plugin-file.h"

/* ---- Safe paths ---------------------------------------------------------------------------- *
 * A plugin is only as safe as every directory on the way to it: whoever can write to any of
 * them can swap what lies below. So paths are resolved here one component at a time from the
 * root, as OpenSSH's safe_path does: each directory, including those a symbolic link leads
 * through, must be owned by root or the current user and not writable by group or others
 * (unless root-owned and sticky, like /tmp); each symbolic link must be owned by root or the
 * current user. Every step holds a descriptor of the directory just checked and looks up the
 * next name relative to it, so what was checked is what is used, and there is no length limit
 * beyond the kernel's per-name one. The plugin file itself is opened once, here, and every
 * later step (ELF checks, probe, dlopen) works on that descriptor. */

/* Owner root or us; not writable by group or others unless root-owned and sticky. The problem
 * as a heap sentence (what names the object), or NULL when there is none (*bad false). */
static char *owner_mode_problem(const struct stat *st, const char *what, bool *bad)
{
    *bad = true;
    if (st->st_uid != 0 && st->st_uid != geteuid())
        return bp__asprintf("a plugin check", "%s is owned by uid %u, neither root nor the "
                            "current user", what, (unsigned)st->st_uid);
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_uid == 0 && (st->st_mode & S_ISVTX)))
        return bp__asprintf("a plugin check", "%s is writable by %s (mode %03o)", what,
                            (st->st_mode & S_IWOTH) ? "others" : "its group",
                            (unsigned)(st->st_mode & 0777));
    *bad = false;
    return NULL;
}

/* dir joined with name, or the parent of dir for "..". */
static char *path_step(const char *dir, const char *name)
{
    if (strcmp(name, "..") == 0) {
        const char *slash = strrchr(dir, '/');
        size_t n = slash == NULL || slash == dir ? 1 : (size_t)(slash - dir);
        char *up = bp__malloc(n + 1, "a path");
        if (up != NULL) {
            memcpy(up, slash == NULL ? "/" : dir, n);
            up[n] = '\0';
        }
        return up;
    }
    return bp__asprintf("a path", "%s%s%s", dir, strcmp(dir, "/") == 0 ? "" : "/", name);
}

/* The target of the symbolic link name in dir, on the heap. */
static char *read_link(int dir, const char *name, int *err)
{
    for (size_t size = 256;; size *= 2) {
        char *buf = bp__malloc(size, "a symbolic link's target");
        if (buf == NULL) {
            *err = ENOMEM;
            return NULL;
        }
        ssize_t n = readlinkat(dir, name, buf, size);
        if (n < 0) {
            *err = errno;
            bp__free(buf);
            return NULL;
        }
        if ((size_t)n < size) {
            buf[n] = '\0';
            return buf;
        }
        bp__free(buf);
    }
}

/* The root directory, checked like any other. */
static int open_root(char **path, char **why)
{
    int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        *why = bp__asprintf("a plugin check", "cannot open the directory /: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    bool bad;
    *why = owner_mode_problem(&st, "the directory /", &bad);
    *path = bad ? NULL : bp__strdup("/", "a path");
    if (bad || *path == NULL) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Declared in plugin-file.h. */
int bp__walk(int atfd, const char *at, const char *path, enum bp_walk_target target,
                struct stat *st, char **canon, char **why, int *err)
{
    enum { MAX_LINKS = 40 };
    char *rest = bp__strdup(path, "a path"), *cur_path = NULL;
    int cur = -1, result = -1, links = 0;
    *why = NULL;
    *err = 0;
    if (canon != NULL)
        *canon = NULL;
    if (rest == NULL)
        goto out;
    if (path[0] == '/')
        cur = open_root(&cur_path, why);
    else if ((cur = fcntl(atfd, F_DUPFD_CLOEXEC, 0)) < 0)
        *why = bp__asprintf("a plugin check", "cannot use the directory %s: %s", at,
                            strerror(errno));
    else if ((cur_path = bp__strdup(at, "a path")) == NULL) {
        close(cur);
        cur = -1;
    }
    if (cur < 0)
        goto out;
    for (char *p = rest;;) {
        while (*p == '/')
            p++;
        if (*p == '\0') { /* the path named a directory */
            if (target == BP_WALK_FILE) {
                *why = bp__asprintf("a plugin check", "%s is a directory, not a regular file",
                                    cur_path);
                goto out;
            }
            result = openat(cur, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (result < 0 || fstat(result, st) != 0) {
                *err = errno;
                *why = bp__asprintf("a plugin check", "cannot read the directory %s: %s",
                                    cur_path, strerror(errno));
                if (result >= 0)
                    close(result);
                result = -1;
                goto out;
            }
            if (canon != NULL) {
                *canon = cur_path;
                cur_path = NULL;
            }
            goto out;
        }
        char *next = strchr(p, '/');
        if (next != NULL)
            *next++ = '\0';
        else
            next = p + strlen(p);
        bool last = next[strspn(next, "/")] == '\0';
        const char *comp = p;
        p = next;
        if (strcmp(comp, ".") == 0)
            continue;
        struct stat lst;
        if (fstatat(cur, comp, &lst, AT_SYMLINK_NOFOLLOW) != 0) {
            *err = errno;
            *why = bp__asprintf("a plugin check", "cannot open %s%s%s: %s", cur_path,
                                strcmp(cur_path, "/") == 0 ? "" : "/", comp, strerror(errno));
            goto out;
        }
        char *step = path_step(cur_path, comp);
        if (step == NULL)
            goto out;
        bool bad = false;
        if (S_ISLNK(lst.st_mode)) {
            /* A link's own mode is always 777 and means nothing; who made it does. */
            bool refuse = true;
            if (lst.st_uid != 0 && lst.st_uid != geteuid())
                *why = bp__asprintf("a plugin check", "the symbolic link %s is owned by uid %u, "
                                    "neither root nor the current user", step,
                                    (unsigned)lst.st_uid);
            else if (++links > MAX_LINKS)
                *why = bp__asprintf("a plugin check", "more than %d symbolic links on the way "
                                    "to %s", MAX_LINKS, path);
            else
                refuse = false;
            char *to = refuse ? NULL : read_link(cur, comp, err);
            if (to == NULL && !refuse && *err != ENOMEM)
                *why = bp__asprintf("a plugin check", "cannot read the symbolic link %s: %s",
                                    step, strerror(*err));
            bp__free(step);
            if (to == NULL)
                goto out;
            /* The rest of the path continues from the link's target. */
            char *spliced = bp__asprintf("a path", "%s%s%s", to, *p ? "/" : "", p);
            bp__free(to);
            if (spliced == NULL)
                goto out;
            bp__free(rest);
            rest = p = spliced;
            if (rest[0] == '/') {
                close(cur);
                bp__free(cur_path);
                cur_path = NULL;
                if ((cur = open_root(&cur_path, why)) < 0)
                    goto out;
            }
            continue;
        }
        if (S_ISDIR(lst.st_mode)) {
            int fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            struct stat dst;
            if (fd < 0 || fstat(fd, &dst) != 0) {
                *err = errno;
                *why = bp__asprintf("a plugin check", "cannot open the directory %s: %s", step,
                                    strerror(errno));
                if (fd >= 0)
                    close(fd);
                bp__free(step);
                goto out;
            }
            char *what = bp__asprintf("a plugin check", "the directory %s", step);
            *why = what ? owner_mode_problem(&dst, what, &bad) : NULL;
            bp__free(what);
            close(cur);
            cur = fd;
            bp__free(cur_path);
            cur_path = step;
            if (what == NULL || bad)
                goto out;
            continue;
        }
        if (!last || target == BP_WALK_DIR) {
            *err = ENOTDIR;
            *why = bp__asprintf("a plugin check", "%s is not a directory", step);
            bp__free(step);
            goto out;
        }
        if (!S_ISREG(lst.st_mode)) {
            *why = bp__asprintf("a plugin check", "not a regular file");
            bp__free(step);
            goto out;
        }
        /* Non-blocking: should the name be swapped for a FIFO after the check above, the open
         * must not hang; the type and identity are checked again on the descriptor. */
        int fd = openat(cur, comp, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, st) != 0) {
            *err = errno;
            *why = bp__asprintf("a plugin check", "cannot open the file: %s", strerror(errno));
        } else if (!S_ISREG(st->st_mode) || st->st_dev != lst.st_dev ||
                   st->st_ino != lst.st_ino) {
            *why = bp__asprintf("a plugin check", "the file changed while it was being checked");
        } else if ((*why = owner_mode_problem(st, "the file", &bad)) == NULL && !bad) {
            result = fd;
            if (canon != NULL) {
                *canon = step;
                step = NULL;
            }
        }
        if (result < 0 && fd >= 0)
            close(fd);
        bp__free(step);
        goto out;
    }
out:
    if (cur >= 0)
        close(cur);
    bp__free(cur_path);
    bp__free(rest);
    return result;
}

/* ---- ELF checks --------------------------------------------------------------------------- *
 * The dynamic loader maps every PT_LOAD segment of a file and reads through the mapping: a
 * segment that reaches past the end of a truncated file is a SIGBUS in dlopen, not an error.
 * So before dlopen the headers are checked against the file's size. */

#if defined(__x86_64__)
#define BP_ELF_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define BP_ELF_MACHINE EM_AARCH64
#elif defined(__i386__)
#define BP_ELF_MACHINE EM_386
#elif defined(__powerpc64__)
#define BP_ELF_MACHINE EM_PPC64
#elif defined(__riscv)
#define BP_ELF_MACHINE EM_RISCV
#elif defined(__s390x__)
#define BP_ELF_MACHINE EM_S390
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define BP_ELF_DATA ELFDATA2LSB
#else
#define BP_ELF_DATA ELFDATA2MSB
#endif

/* Program headers beyond this are not a plugin (real ones have about a dozen). */
#define BP_ELF_MAX_PHNUM 1024

static const char *segment_name(uint32_t type)
{
    switch (type) {
    case PT_LOAD:
        return "PT_LOAD";
    case PT_DYNAMIC:
        return "PT_DYNAMIC";
    case PT_INTERP:
        return "PT_INTERP";
    case PT_NOTE:
        return "PT_NOTE";
    case PT_TLS:
        return "PT_TLS";
    default:
        return "a segment";
    }
}

/* Declared in plugin-file.h. */
char *bp__elf_problem(int fd, off_t size, bool *bad)
{
    ElfW(Ehdr) eh;
    *bad = true;
    ssize_t got = pread(fd, &eh, sizeof(eh), 0);
    if (got < 4 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
        return bp__asprintf("a plugin check", "not an ELF shared object");
    if ((size_t)got < sizeof(eh))
        return bp__asprintf("a plugin check", "it is truncated: %lld bytes, less than an ELF "
                            "header", (long long)size);
    if (eh.e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32))
        return bp__asprintf("a plugin check", "it is a %d-bit ELF file; this process is %d-bit",
                            eh.e_ident[EI_CLASS] == ELFCLASS64 ? 64 : 32,
                            (int)sizeof(void *) * 8);
    if (eh.e_ident[EI_DATA] != BP_ELF_DATA)
        return bp__asprintf("a plugin check", "its ELF byte order is not this machine's");
    if (eh.e_type != ET_DYN)
        return bp__asprintf("a plugin check", "not an ELF shared object (ELF type %u)",
                            (unsigned)eh.e_type);
#ifdef BP_ELF_MACHINE
    if (eh.e_machine != BP_ELF_MACHINE)
        return bp__asprintf("a plugin check", "it was built for another machine (ELF machine "
                            "%u; this one is %u)", (unsigned)eh.e_machine, BP_ELF_MACHINE);
#endif
    if (eh.e_phentsize != sizeof(ElfW(Phdr)) || eh.e_phnum == 0 ||
        eh.e_phnum > BP_ELF_MAX_PHNUM)
        return bp__asprintf("a plugin check", "it is corrupt: %u program headers of %u bytes "
                            "(1 to %d of %zu expected)", (unsigned)eh.e_phnum,
                            (unsigned)eh.e_phentsize, BP_ELF_MAX_PHNUM, sizeof(ElfW(Phdr)));
    const uint64_t fsize = (uint64_t)size;
    const uint64_t ph_bytes = (uint64_t)eh.e_phnum * sizeof(ElfW(Phdr));
    if (eh.e_phoff > fsize || ph_bytes > fsize - eh.e_phoff)
        return bp__asprintf("a plugin check", "it is truncated or corrupt: its program headers "
                            "(bytes %llu to %llu) lie beyond the end of the %lld-byte file",
                            (unsigned long long)eh.e_phoff,
                            (unsigned long long)eh.e_phoff + ph_bytes, (long long)size);
    ElfW(Phdr) *ph = bp__malloc((size_t)ph_bytes, "ELF program headers");
    if (ph == NULL)
        return NULL;
    char *why = NULL;
    if (pread(fd, ph, (size_t)ph_bytes, (off_t)eh.e_phoff) != (ssize_t)ph_bytes) {
        why = bp__asprintf("a plugin check", "cannot read its program headers: %s",
                           strerror(errno));
        goto out;
    }
    size_t loads = 0;
    for (unsigned i = 0; i < eh.e_phnum; i++) {
        const ElfW(Phdr) *s = &ph[i];
        loads += s->p_type == PT_LOAD;
        if (s->p_filesz != 0 && (s->p_offset > fsize || s->p_filesz > fsize - s->p_offset)) {
            why = bp__asprintf("a plugin check", "it is truncated or corrupt: program header "
                               "%u (%s) covers bytes %llu to %llu of a %lld-byte file", i,
                               segment_name(s->p_type), (unsigned long long)s->p_offset,
                               (unsigned long long)s->p_offset +
                                   (unsigned long long)s->p_filesz,
                               (long long)size);
            goto out;
        }
        if (s->p_type == PT_LOAD && s->p_filesz > s->p_memsz) {
            why = bp__asprintf("a plugin check", "it is corrupt: program header %u (PT_LOAD) "
                               "has more bytes in the file than in memory", i);
            goto out;
        }
    }
    if (loads == 0) {
        why = bp__asprintf("a plugin check", "it is corrupt: it has no PT_LOAD segment");
        goto out;
    }
    *bad = false;
out:
    bp__free(ph);
    return why;
}
