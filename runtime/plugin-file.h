/* plugin-file.h - private to runtime/: the checks on a plugin file before it is loaded, the
 * path walk that opens it (plugin-file.c) and its ELF headers. Used by loader.c. */
#ifndef BACKPLANE_PLUGIN_FILE_H
#define BACKPLANE_PLUGIN_FILE_H

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

enum bp_walk_target { BP_WALK_DIR, BP_WALK_FILE };

/* Resolves path (absolute, or relative to the checked directory atfd whose path is at) one
 * component at a time from the root, checking owner and permissions of every directory and
 * symbolic link on the way, and opens what it names: a directory for reading, or a regular
 * file read-only (never a device or FIFO: they are refused by type before anything is
 * opened). Returns the descriptor, with *st and, when canon is not NULL, the resolved path
 * (heap); or -1 with *why (heap, NULL when memory ran out) and *err (the errno behind it, or
 * 0). */
int bp__walk(int atfd, const char *at, const char *path, enum bp_walk_target target,
             struct stat *st, char **canon, char **why, int *err);

/* Why a group is not the private group of the user owner (named owner_name; NULL when the
 * user has no passwd entry), given its listed members (NULL-terminated, may be NULL) and the
 * uids of the accounts whose primary group it is: a phrase (heap), or NULL when it is private
 * (the owner is its one member, counted as primary or listed, and nobody else's primary
 * group). The rule of OpenSSH as Debian patches it; the loader accepts a group-writable
 * directory or file of the current user's when this holds for its group. */
char *bp__group_not_private(uid_t owner, const char *owner_name, const char *const *members,
                            const uid_t *primary, size_t n_primary);

/* Why the ELF file open as fd (size bytes) cannot be a shared object for this process, as a
 * heap sentence; NULL when the headers are sound (*bad false; *bad true with NULL: out of
 * memory). */
char *bp__elf_problem(int fd, off_t size, bool *bad);

#endif
