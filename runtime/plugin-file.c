/* plugin-file.c - the checks a plugin file passes before the loader opens it for dlopen: every
 * directory and symbolic link on its path, then its ELF headers against its size. */
#include "config.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bp-impl.h"
#include "plugin-file.h"

/* ---- Safe paths ---------------------------------------------------------------------------- *
 * A plugin is only as safe as every directory on the way to it: whoever can write to any of them
 * can swap what lies below. So paths are resolved here one component at a time from the root, as
 * OpenSSH's safe_path does: each directory, including those a symbolic link leads through, must be
 * owned by root or the current user and not writable by group or others (unless root-owned and
 * sticky, like /tmp); each symbolic link must be owned by root or the current user. One exception,
 * OpenSSH's as Debian patches it for the same reason: what the current user (not root) owns may be
 * writable by its group when that group is the user's private group (the user is its only member,
 * as primary group or listed member, and no other account has it as primary group). Debian and
 * Ubuntu give every user such a group and umask 002, so every directory and file a developer
 * builds is group-writable; the group adds no writer. Root-owned directories keep the strict rule
 * (docs/plugins.md). Every step holds a descriptor of the directory just checked and looks up the
 * next name relative to it, so what was checked is what is used, and there is no length limit
 * beyond the kernel's per-name one. The plugin file itself is opened once, here, and every later
 * step (ELF checks, probe, dlopen) works on that descriptor. */

/* Declared in plugin-file.h. */
char *bp__group_not_private(uid_t owner, const char *owner_name, const char *const *members,
                            const uid_t *primary, size_t n_primary)
{
    size_t count = 0;
    for (size_t i = 0; i < n_primary; i++) {
        if (primary[i] != owner)
            return bp__asprintf("a plugin check", "it is also the primary group of uid %u",
                                (unsigned)primary[i]);
        count++;
    }
    if (members != NULL && members[0] != NULL) {
        if (owner_name == NULL || strcmp(members[0], owner_name) != 0)
            return bp__asprintf("a plugin check", "it has the member %s", members[0]);
        if (members[1] != NULL)
            return bp__asprintf("a plugin check", "it has the member %s", members[1]);
        count++;
    }
    /* A group with no member at all is what setgid programs use, not a user's own group. */
    if (count == 0)
        return bp__strdup("it has no members", "a plugin check");
    return NULL;
}

/* The group and passwd entries behind a group-writable object, looked up with the reentrant
 * calls into buffers that grow until they fit. */
struct group_lookup {
    struct group gr;
    struct passwd pw;
    char *gbuf, *pbuf;
    uid_t *primary;
    size_t n_primary, cap_primary;
};

static int lookup_group(struct group_lookup *l, gid_t gid, uid_t uid, struct group **gr,
                        struct passwd **pw)
{
    const size_t max = (size_t)1 << 24;
    int err = ERANGE, perr = ERANGE;
    for (size_t size = 1024; err == ERANGE && size <= max; size *= 2) {
        bp__free(l->gbuf);
        if ((l->gbuf = bp__malloc(size, "a group entry")) == NULL)
            return ENOMEM;
        err = getgrgid_r(gid, &l->gr, l->gbuf, size, gr);
    }
    for (size_t size = 1024; perr == ERANGE && size <= max; size *= 2) {
        bp__free(l->pbuf);
        if ((l->pbuf = bp__malloc(size, "a passwd entry")) == NULL)
            return ENOMEM;
        perr = getpwuid_r(uid, &l->pw, l->pbuf, size, pw);
    }
    if (err != 0)
        *gr = NULL;
    if (perr != 0)
        *pw = NULL;
    return err;
}

/* Why the group of st (owned by the current user, not root) is not that user's private group,
 * as a phrase (heap); NULL when it is. The accounts are enumerated with getpwent, as OpenSSH
 * does, only for a group-writable object: the loader runs this under its lock. */
static char *group_problem(const struct stat *st)
{
    struct group_lookup l = {0};
    struct group *gr = NULL;
    struct passwd *pw = NULL;
    char *why = NULL;
    int err = lookup_group(&l, st->st_gid, st->st_uid, &gr, &pw);
    if (gr == NULL) {
        why = bp__asprintf("a plugin check", "gid %u has no group entry%s%s", (unsigned)st->st_gid,
                           err ? ": " : "", err ? strerror(err) : "");
        goto out;
    }
    setpwent();
    for (struct passwd *e; (e = getpwent()) != NULL;) {
        if (e->pw_gid != st->st_gid)
            continue;
        if (!bp__grow((void **)&l.primary, &l.cap_primary, l.n_primary + 1, sizeof(uid_t),
                      "a group's accounts")) {
            endpwent();
            goto out;
        }
        l.primary[l.n_primary++] = e->pw_uid;
    }
    endpwent();
    why = bp__group_not_private(st->st_uid, pw ? pw->pw_name : NULL,
                                (const char *const *)gr->gr_mem, l.primary, l.n_primary);
    if (why != NULL) {
        char *named = bp__asprintf("a plugin check", "group %s: %s", gr->gr_name, why);
        bp__free(why);
        why = named;
    }
out:
    bp__free(l.gbuf);
    bp__free(l.pbuf);
    bp__free(l.primary);
    return why;
}

/* Owner root or us; not writable by others, nor by the group unless root-owned and sticky or
 * ours with our private group. The problem as a heap sentence (what names the object), or NULL
 * when there is none (*bad false). */
static char *owner_mode_problem(const struct stat *st, const char *what, bool *bad)
{
    *bad = true;
    if (st->st_uid != 0 && st->st_uid != geteuid())
        return bp__asprintf("a plugin check", "%s is owned by uid %u, neither root nor the "
                            "current user", what, (unsigned)st->st_uid);
    const unsigned mode = (unsigned)(st->st_mode & 0777);
    const bool sticky_root = st->st_uid == 0 && (st->st_mode & S_ISVTX);
    if ((st->st_mode & S_IWOTH) && !sticky_root)
        return bp__asprintf("a plugin check", "%s is writable by others (mode %03o)", what, mode);
    if ((st->st_mode & S_IWGRP) && !sticky_root) {
        if (st->st_uid == 0)
            return bp__asprintf("a plugin check", "%s is writable by its group (mode %03o), "
                                "which a root-owned directory or file must not be", what, mode);
        char *why = group_problem(st);
        if (why != NULL) {
            char *s = bp__asprintf("a plugin check", "%s is writable by its group (mode %03o), "
                                   "which is not the owner's private group (%s)", what, mode, why);
            bp__free(why);
            return s;
        }
    }
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

/* A walk in progress: the directory reached so far (checked, open as cur) and the path still
 * to resolve. */
struct walk {
    const char *path; /* as given, for messages */
    enum bp_walk_target target;
    char *rest;       /* the path being resolved (heap); a symbolic link splices its target in */
    char *p;          /* the next component in rest */
    int cur;          /* the directory reached, or -1 */
    char *cur_path;   /* its path */
    int links;        /* symbolic links followed so far */
    char **why;
    int *err;
};

/* Opens the directory the walk starts from: the root for an absolute path, else at. */
static bool walk_start(struct walk *w, int atfd, const char *at)
{
    if (w->path[0] == '/')
        w->cur = open_root(&w->cur_path, w->why);
    else if ((w->cur = fcntl(atfd, F_DUPFD_CLOEXEC, 0)) < 0)
        *w->why = bp__asprintf("a plugin check", "cannot use the directory %s: %s", at,
                               strerror(errno));
    else if ((w->cur_path = bp__strdup(at, "a path")) == NULL) {
        close(w->cur);
        w->cur = -1;
    }
    return w->cur >= 0;
}

/* The path ended at the directory reached: opens it for reading, unless a file was asked
 * for. The descriptor, or -1. */
static int walk_end_dir(struct walk *w, struct stat *st, char **canon)
{
    if (w->target == BP_WALK_FILE) {
        *w->why = bp__asprintf("a plugin check", "%s is a directory, not a regular file",
                               w->cur_path);
        return -1;
    }
    int fd = openat(w->cur, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, st) != 0) {
        *w->err = errno;
        *w->why = bp__asprintf("a plugin check", "cannot read the directory %s: %s", w->cur_path,
                               strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (canon != NULL) {
        *canon = w->cur_path;
        w->cur_path = NULL;
    }
    return fd;
}

/* The symbolic link comp (lst, at path step, which this frees) in the directory reached: the
 * rest of the path continues from its target. False when the link is refused or unreadable. */
static bool walk_link(struct walk *w, const char *comp, const struct stat *lst, char *step)
{
    enum { MAX_LINKS = 40 };
    /* A link's own mode is always 777 and means nothing; who made it does. */
    bool refuse = true;
    if (lst->st_uid != 0 && lst->st_uid != geteuid())
        *w->why = bp__asprintf("a plugin check", "the symbolic link %s is owned by uid %u, "
                               "neither root nor the current user", step, (unsigned)lst->st_uid);
    else if (++w->links > MAX_LINKS)
        *w->why = bp__asprintf("a plugin check", "more than %d symbolic links on the way to %s",
                               MAX_LINKS, w->path);
    else
        refuse = false;
    char *to = refuse ? NULL : read_link(w->cur, comp, w->err);
    if (to == NULL && !refuse && *w->err != ENOMEM)
        *w->why = bp__asprintf("a plugin check", "cannot read the symbolic link %s: %s", step,
                               strerror(*w->err));
    bp__free(step);
    if (to == NULL)
        return false;
    char *spliced = bp__asprintf("a path", "%s%s%s", to, *w->p ? "/" : "", w->p);
    bp__free(to);
    if (spliced == NULL)
        return false;
    bp__free(w->rest);
    w->rest = w->p = spliced;
    if (w->rest[0] == '/') {
        close(w->cur);
        bp__free(w->cur_path);
        w->cur_path = NULL;
        if ((w->cur = open_root(&w->cur_path, w->why)) < 0)
            return false;
    }
    return true;
}

/* The directory comp (at path step, which the walk keeps) in the directory reached: checks it
 * and moves into it. False when it is refused. */
static bool walk_dir(struct walk *w, const char *comp, char *step)
{
    int fd = openat(w->cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat dst;
    if (fd < 0 || fstat(fd, &dst) != 0) {
        *w->err = errno;
        *w->why = bp__asprintf("a plugin check", "cannot open the directory %s: %s", step,
                               strerror(errno));
        if (fd >= 0)
            close(fd);
        bp__free(step);
        return false;
    }
    bool bad = false;
    char *what = bp__asprintf("a plugin check", "the directory %s", step);
    *w->why = what ? owner_mode_problem(&dst, what, &bad) : NULL;
    const bool ok = what != NULL && !bad;
    bp__free(what);
    close(w->cur);
    w->cur = fd;
    bp__free(w->cur_path);
    w->cur_path = step;
    return ok;
}

/* The last component comp (lst, at path step, which this frees), neither link nor directory:
 * opens it once as the regular file asked for and checks it on the descriptor. The
 * descriptor, or -1. */
static int walk_file(struct walk *w, const char *comp, const struct stat *lst, char *step,
                     bool last, struct stat *st, char **canon)
{
    if (!last || w->target == BP_WALK_DIR) {
        *w->err = ENOTDIR;
        *w->why = bp__asprintf("a plugin check", "%s is not a directory", step);
        bp__free(step);
        return -1;
    }
    if (!S_ISREG(lst->st_mode)) {
        *w->why = bp__asprintf("a plugin check", "not a regular file");
        bp__free(step);
        return -1;
    }
    /* Non-blocking: should the name be swapped for a FIFO after the check above, the open must
     * not hang; the type and identity are checked again on the descriptor. */
    int result = -1, fd = openat(w->cur, comp,
                                 O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    bool bad;
    if (fd < 0 || fstat(fd, st) != 0) {
        *w->err = errno;
        *w->why = bp__asprintf("a plugin check", "cannot open the file: %s", strerror(errno));
    } else if (!S_ISREG(st->st_mode) || st->st_dev != lst->st_dev || st->st_ino != lst->st_ino) {
        *w->why = bp__asprintf("a plugin check", "the file changed while it was being checked");
    } else if ((*w->why = owner_mode_problem(st, "the file", &bad)) == NULL && !bad) {
        result = fd;
        if (canon != NULL) {
            *canon = step;
            step = NULL;
        }
    }
    if (result < 0 && fd >= 0)
        close(fd);
    bp__free(step);
    return result;
}

/* Resolves the rest of the path one component at a time from the directory reached. */
static int walk_steps(struct walk *w, struct stat *st, char **canon)
{
    for (w->p = w->rest;;) {
        while (*w->p == '/')
            w->p++;
        if (*w->p == '\0') /* the path named a directory */
            return walk_end_dir(w, st, canon);
        char *next = strchr(w->p, '/');
        if (next != NULL)
            *next++ = '\0';
        else
            next = w->p + strlen(w->p);
        bool last = next[strspn(next, "/")] == '\0';
        const char *comp = w->p;
        w->p = next;
        if (strcmp(comp, ".") == 0)
            continue;
        struct stat lst;
        if (fstatat(w->cur, comp, &lst, AT_SYMLINK_NOFOLLOW) != 0) {
            *w->err = errno;
            *w->why = bp__asprintf("a plugin check", "cannot open %s%s%s: %s", w->cur_path,
                                   strcmp(w->cur_path, "/") == 0 ? "" : "/", comp,
                                   strerror(errno));
            return -1;
        }
        char *step = path_step(w->cur_path, comp);
        if (step == NULL)
            return -1;
        if (S_ISLNK(lst.st_mode)) {
            if (!walk_link(w, comp, &lst, step))
                return -1;
        } else if (S_ISDIR(lst.st_mode)) {
            if (!walk_dir(w, comp, step))
                return -1;
        } else {
            return walk_file(w, comp, &lst, step, last, st, canon);
        }
    }
}

/* Declared in plugin-file.h. */
int bp__walk(int atfd, const char *at, const char *path, enum bp_walk_target target,
             struct stat *st, char **canon, char **why, int *err)
{
    struct walk w = {.path = path, .target = target, .cur = -1, .why = why, .err = err};
    int result = -1;
    *why = NULL;
    *err = 0;
    if (canon != NULL)
        *canon = NULL;
    w.rest = bp__strdup(path, "a path");
    if (w.rest != NULL && walk_start(&w, atfd, at))
        result = walk_steps(&w, st, canon);
    if (w.cur >= 0)
        close(w.cur);
    bp__free(w.cur_path);
    bp__free(w.rest);
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
