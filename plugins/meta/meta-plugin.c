/* meta-plugin.c - the meta plugin's objects: registry "Meta", meta devices over other plugins'
 * devices (one per list of parts, made by name or by bp_meta_device_new), and their backends.
 *
 * A meta device's buffers are in meta-buffer.c and its computations in meta-compute.c; this file
 * makes the objects, answers for them through the plugin interfaces and parses "Meta(A,B,...)"
 * names (docs/meta.md, "Making one"). */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <strings.h>

#include "meta-impl.h"

#define MAX_META_DEVICES 32

/* At most this many bytes of a user's string are quoted in a message (the message has a fixed
 * size, and the facts come before the quotes). */
#define SHOWN 96
#define SHOW(str) (int)(strlen(str) > SHOWN ? SHOWN : strlen(str)), (str), \
                  (strlen(str) > SHOWN ? "..." : "")

/* The meta devices made so far. Devices are added (by name or bp_meta_device_new, from any
 * thread) and only freed with the registry: creation is serialised by `create`, and a device
 * is published by storing its pointer before the release-store of the count, so readers (the
 * registry's device list, buffer lookups) need no lock: they load the count with acquire. */
static struct {
    bp_registry *reg;
    struct meta_dev *devs[MAX_META_DEVICES];
    atomic_int n;
    pthread_mutex_t create;
} meta = {.create = PTHREAD_MUTEX_INITIALIZER};

static int n_devices(void)
{
    return atomic_load_explicit(&meta.n, memory_order_acquire);
}

/* ---- Proc addresses of buffers and backends ---------------------------------------------- */

/* Bytes buf holds on its part `part` (0 for anything else). */
static size_t meta_buffer_part_bytes(bp_buffer *buf, int part)
{
    struct meta_dev *md = NULL;
    for (int i = 0, n = n_devices(); i < n && md == NULL; i++)
        if (bp_buffer_get_type(buf) == meta.devs[i]->buft)
            md = meta.devs[i];
    /* 0 is also an answer ("nothing made yet"), so the error only explains a 0. */
    if (md == NULL) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_buffer_part_bytes: %s", buf == NULL ?
                     "buffer is NULL" : "not a meta device's buffer");
        return 0;
    }
    if (part < 0 || part >= md->n) {
        bp_set_error(BP_ERR_OUT_OF_BOUNDS, "bp_meta_buffer_part_bytes: part %d of '%s' is not "
                     "in 0..%d", part, md->name, md->n - 1);
        return 0;
    }
    return bp_meta_buffer_bytes_on(buf, part);
}

/* ---- Backend ----------------------------------------------------------------------------- */

static const char *mbe_name(bp_backend *be)
{
    struct meta_backend *mb = bp_backend_get_context(be);
    return mb->md->name;
}

static void mbe_free(bp_backend *be)
{
    struct meta_backend *mb = bp_backend_get_context(be);
    bp_meta_workers_stop(mb);
    if (mb->comm)
        mb->comm_free(mb->comm);
    for (int p = 0; p < mb->md->n; p++)
        bp_backend_free(mb->parts[p]); /* (NULL for parts on other processes) */
    free(mb);
}

static enum bp_status mbe_sync(bp_backend *be)
{
    struct meta_backend *mb = bp_backend_get_context(be);
    enum bp_status st = BP_OK;
    for (int p = 0; p < mb->md->n && st == BP_OK; p++)
        if (mb->parts[p] != NULL)
            st = bp_backend_synchronize(mb->parts[p]);
    return st;
}

static enum bp_status mbe_compute(bp_backend *be, bp_graph *g)
{
    return bp_meta_graph_compute(bp_backend_get_context(be), g);
}

static enum bp_status meta_backend_stats(bp_backend *be, int *n_reduces, double *seconds)
{
    if (be == NULL)
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_backend_stats: backend is NULL");
    if (meta.reg == NULL || bp_device_get_registry(bp_backend_get_device(be)) != meta.reg)
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_backend_stats: '%s' is not a meta "
                            "backend", bp_backend_get_name(be));
    struct meta_backend *mb = bp_backend_get_context(be);
    if (n_reduces)
        *n_reduces = mb->n_reduces;
    if (seconds)
        *seconds = mb->reduce_seconds;
    return BP_OK;
}

static size_t meta_backend_reduced_bytes(bp_backend *be)
{
    if (be == NULL || meta.reg == NULL ||
        bp_device_get_registry(bp_backend_get_device(be)) != meta.reg) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_backend_reduced_bytes: not a meta backend");
        return 0;
    }
    return ((struct meta_backend *)bp_backend_get_context(be))->reduce_bytes;
}

static const struct bp_backend_iface meta_backend_iface = {
    .struct_size = sizeof(struct bp_backend_iface),
    .get_name = mbe_name,
    .free = mbe_free,
    .synchronize = mbe_sync,
    .graph_compute = mbe_compute,
};

/* ---- Device ------------------------------------------------------------------------------ */

static const char *mdev_name(bp_device *dev)
{
    return ((struct meta_dev *)bp_device_get_context(dev))->name;
}

static const char *mdev_desc(bp_device *dev)
{
    return ((struct meta_dev *)bp_device_get_context(dev))->description;
}

static void mdev_memory(bp_device *dev, size_t *f, size_t *t)
{
    struct meta_dev *md = bp_device_get_context(dev);
    *f = *t = 0;
    for (int p = 0; p < md->n; p++) { /* this process's parts */
        if (!bp_meta_local(md, p))
            continue;
        size_t pf, pt;
        bp_device_get_memory(md->parts[p], &pf, &pt);
        *f += pf;
        *t += pt;
    }
}

static enum bp_device_type mdev_type(bp_device *dev)
{
    (void)dev;
    return BP_DEVICE_TYPE_META;
}

static void mdev_caps(bp_device *dev, struct bp_device_caps *caps)
{
    struct meta_dev *md = bp_device_get_context(dev);
    *caps = (struct bp_device_caps){true, true, true, true};
    for (int p = 0; p < md->n; p++) {
        if (!bp_meta_local(md, p))
            continue;
        struct bp_device_props pr;
        bp_device_get_props(md->parts[p], &pr);
        caps->async &= pr.caps.async;
        caps->host_buffer &= pr.caps.host_buffer;
        caps->buffer_from_host_ptr = false;
        caps->events = false; /* the meta device has no events of its own yet */
    }
}

/* ---- Across processes ------------------------------------------------------------------- */

/* The MPI registry's collectives (the mpi plugin); false with an error naming what is missing. */
static bool mpi_procs(bp_comm_world_fn *world, bp_comm_init_ranks_fn *init,
                      bp_comm_allreduce_checked_fn *allreduce, bp_comm_free_fn *comm_free,
                      const char *who)
{
    bp_registry *reg = bp_registry_by_name("MPI");
    if (reg != NULL) {
        *world = (bp_comm_world_fn)bp_registry_get_proc_address(reg, "bp_comm_world");
        *init = (bp_comm_init_ranks_fn)bp_registry_get_proc_address(reg, "bp_comm_init_ranks");
        *allreduce = (bp_comm_allreduce_checked_fn)bp_registry_get_proc_address(
            reg, "bp_comm_allreduce_checked");
        *comm_free = (bp_comm_free_fn)bp_registry_get_proc_address(reg, "bp_comm_free");
    }
    if (reg == NULL || !*world || !*init || !*allreduce || !*comm_free) {
        bp_set_error(BP_ERR_NOT_FOUND, "%.*s%s names parts on other processes (DEVICE@RANK), "
                     "which needs the mpi plugin (backplane-mpi.so, built where MPI is found)",
                     SHOW(who));
        return false;
    }
    return true;
}

/* Seconds a collective across processes waits: BP_COMM_TIMEOUT, else bp-comm.h's default. */
static double comm_timeout(void)
{
    const char *v = getenv("BP_COMM_TIMEOUT");
    char *end = NULL;
    const double t = v != NULL ? strtod(v, &end) : 0;
    const bool ok = v != NULL && end != v && *end == '\0' && t > 0 && t < 1e9;
    if (v != NULL && !ok)
        bp_log(BP_LOG_WARN, "BP_COMM_TIMEOUT='%.*s%s' is not a number of seconds above 0; "
               "collectives wait %g s", SHOW(v), BP_COMM_DEFAULT_TIMEOUT);
    return ok ? t : BP_COMM_DEFAULT_TIMEOUT;
}

/* Tells every rank of a ranked meta device's parts that this one failed (status), at the
 * point where they make its communicator, so that they fail there too instead of waiting. */
static void tell_ranks(const int *ranks, int n, enum bp_status status, const char *who)
{
    bp_comm_world_fn world;
    bp_comm_init_ranks_fn init;
    bp_comm_allreduce_checked_fn allreduce;
    bp_comm_free_fn comm_free;
    char saved[512];
    snprintf(saved, sizeof(saved), "%s", bp_last_error());
    if (!mpi_procs(&world, &init, &allreduce, &comm_free, who))
        return;
    struct bp_comm_member m[BP_META_MAX_DEVICES];
    for (int p = 0; p < n; p++)
        m[p] = (struct bp_comm_member){ranks[p], NULL};
    init(m, n, status, comm_timeout()); /* NULL, as the failure is this rank's own */
    bp_set_error(status, "%s", saved);
}

/* mb's communicator over every part of a ranked meta device, made with the other ranks;
 * status: this rank's state so far. False with the error (this rank's, or BP_ERR_REMOTE
 * naming the rank that failed). */
static bool ranked_comm(struct meta_dev *md, struct meta_backend *mb, enum bp_status status)
{
    bp_comm_world_fn world;
    bp_comm_init_ranks_fn init;
    if (!mpi_procs(&world, &init, &mb->allreduce_checked, &mb->comm_free, md->name))
        return false;
    struct bp_comm_member m[BP_META_MAX_DEVICES];
    for (int p = 0; p < md->n; p++)
        m[p] = (struct bp_comm_member){md->rank[p], mb->parts[p]};
    mb->comm = init(m, md->n, status, comm_timeout());
    return mb->comm != NULL;
}

static bp_backend *mdev_init_backend(bp_device *dev, const char *params)
{
    struct meta_dev *md = bp_device_get_context(dev);
    struct meta_backend *mb = calloc(1, sizeof(*mb));
    if (mb == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", md->name);
        return NULL;
    }
    mb->md = md;
    enum bp_status status = BP_OK;
    for (int p = 0; p < md->n && status == BP_OK; p++) {
        if (!bp_meta_local(md, p))
            continue; /* its own process makes it */
        mb->parts[p] = bp_device_init_backend(md->parts[p], params);
        if (mb->parts[p] == NULL) {
            status = bp_last_status();
            break;
        }
        struct bp_device_props pr;
        bp_device_get_props(md->parts[p], &pr);
        mb->async[p] = pr.caps.async;
    }
    if (md->ranked) {
        /* Across processes: the communicator over every part, made with every rank (a rank
         * whose part failed says so, and every rank fails here rather than later). */
        if (!ranked_comm(md, mb, status)) {
            for (int p = 0; p < md->n; p++)
                bp_backend_free(mb->parts[p]);
            free(mb);
            return NULL;
        }
    } else if (status != BP_OK) {
        for (int p = 0; p < md->n; p++)
            bp_backend_free(mb->parts[p]);
        free(mb);
        return NULL;
    } else {
        /* Collectives of the parts' registry, when all parts share one and it has them. */
        bp_registry *reg = bp_device_get_registry(md->parts[0]);
        bool same = true;
        for (int p = 1; p < md->n; p++)
            same &= bp_device_get_registry(md->parts[p]) == reg;
        const char *off = getenv("BP_META_NO_COMM");
        if (same && !(off && off[0] == '1')) {
            bp_comm_init_fn init =
                (bp_comm_init_fn)bp_registry_get_proc_address(reg, "bp_comm_init");
            mb->allreduce =
                (bp_comm_allreduce_fn)bp_registry_get_proc_address(reg, "bp_comm_allreduce");
            mb->comm_free = (bp_comm_free_fn)bp_registry_get_proc_address(reg, "bp_comm_free");
            if (init && mb->allreduce && mb->comm_free)
                mb->comm = init(mb->parts, md->n);
        }
    }
    bp_backend *be = bp_backend_new(dev, &meta_backend_iface, mb);
    if (be == NULL) {
        if (mb->comm)
            mb->comm_free(mb->comm);
        for (int p = 0; p < md->n; p++)
            bp_backend_free(mb->parts[p]);
        free(mb);
    }
    return be;
}

static bp_buffer_type *mdev_buft(bp_device *dev)
{
    return ((struct meta_dev *)bp_device_get_context(dev))->buft;
}

static bool mdev_supports_op(bp_device *dev, const bp_tensor *op)
{
    struct meta_dev *md = bp_device_get_context(dev);
    for (int p = 0; p < md->n; p++) { /* (parts elsewhere: their processes ask theirs) */
        if (bp_meta_local(md, p) && !bp_device_supports_op(md->parts[p], op))
            return false;
    }
    return true;
}

static bool mdev_supports_buft(bp_device *dev, bp_buffer_type *buft)
{
    return buft == ((struct meta_dev *)bp_device_get_context(dev))->buft;
}

static const struct bp_device_iface meta_device_iface = {
    .struct_size = sizeof(struct bp_device_iface),
    .get_name = mdev_name,
    .get_description = mdev_desc,
    .get_memory = mdev_memory,
    .get_type = mdev_type,
    .get_caps = mdev_caps,
    .init_backend = mdev_init_backend,
    .get_buffer_type = mdev_buft,
    .supports_op = mdev_supports_op,
    .supports_buft = mdev_supports_buft,
};

/* ---- Registry ---------------------------------------------------------------------------- */


/* The parts of a meta device being made: devices (NULL for a part on another process), and
 * for a device across processes each part's rank and the name it was given. */
struct parts {
    bp_device *const *devices;
    const int *ranks;         /* NULL: every part on this process */
    char *const *names;       /* with ranks */
};

/* Across processes every part goes by the name it was given (the same on every rank, where
 * only some parts have a device to ask); otherwise by its device's own name. */
static const char *part_name(const struct parts *ps, int i)
{
    return ps->ranks != NULL ? ps->names[i] : bp_device_get_name(ps->devices[i]);
}

/* "Meta(A,B,...)" from the parts' names ("A@0,B@1" across processes), on the heap (names have
 * no length limit). */
static char *compose_name(const struct parts *ps, int n)
{
    size_t len = sizeof("Meta()");
    for (int i = 0; i < n; i++)
        len += strlen(part_name(ps, i)) + 1 + (ps->ranks ? 12 : 0);
    char *name = malloc(len);
    if (name == NULL)
        return NULL;
    size_t used = (size_t)snprintf(name, len, "Meta(");
    for (int i = 0; i < n; i++) {
        used += (size_t)snprintf(name + used, len - used, "%s%s", i ? "," : "", part_name(ps, i));
        if (ps->ranks != NULL)
            used += (size_t)snprintf(name + used, len - used, "@%d", ps->ranks[i]);
    }
    snprintf(name + used, len - used, ")");
    return name;
}

/* Whether devices[0..n) can be the parts of a meta device: none NULL, none a meta device, none
 * twice. The error (starting with `who`) says which when not. */
static bool parts_valid(const struct parts *ps, int n, const char *who)
{
    bp_device *const *devices = ps->devices;
    for (int i = 0; i < n; i++) {
        if (devices[i] == NULL && ps->ranks != NULL) { /* on another process */
            for (int j = 0; j < i; j++)
                if (ps->ranks[j] == ps->ranks[i] &&
                    strcasecmp(part_name(ps, j), part_name(ps, i)) == 0) {
                    bp_set_error(BP_ERR_INVALID_ARG, "%s: '%.*s%s@%d' is listed twice (parts "
                                 "%d and %d); each device can be one part only", who,
                                 SHOW(part_name(ps, i)), ps->ranks[i], j, i);
                    return false;
                }
            continue;
        }
        if (devices[i] == NULL) {
            bp_set_error(BP_ERR_INVALID_ARG, "%s: device %d of %d is NULL", who, i, n);
            return false;
        }
        if (bp_device_get_type(devices[i]) == BP_DEVICE_TYPE_META) {
            bp_set_error(BP_ERR_INVALID_ARG, "%s: device %d ('%.*s%s') is itself a meta device; "
                         "a meta device cannot be a part of another", who, i,
                         SHOW(bp_device_get_name(devices[i])));
            return false;
        }
        for (int j = 0; j < i; j++) {
            if (devices[j] == devices[i]) {
                bp_set_error(BP_ERR_INVALID_ARG, "%s: device '%.*s%s' is listed twice (parts %d "
                             "and %d); each device can be one part only", who,
                             SHOW(bp_device_get_name(devices[i])), j, i);
                return false;
            }
        }
    }
    return true;
}

/* The meta device over devices[0..n) with split policy (fn, user), keyed as ggml keys its meta
 * devices: the same parts in the same order with the same callback and user data give the device
 * already made; another callback or user data makes another device over the same parts (of the
 * same name: the policy decides how each one's weights are stored, so one device cannot change
 * policy under buffers that exist). No callback (fn NULL, as "Meta(...)" names make) is the
 * default policy, and the user data then means nothing. `who` starts every error message. */
static bp_device *find_or_make(const struct parts *ps, int n, bp_meta_split_fn fn, void *user,
                               const char *who, char *name);

static bp_device *device_for(const struct parts *ps, int n, bp_meta_split_fn fn, void *user,
                             const char *who)
{
    if (!parts_valid(ps, n, who))
        return NULL;
    if (fn == NULL)
        user = NULL; /* no policy: the user data means nothing */
    char *name = compose_name(ps, n);
    if (name == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
        return NULL;
    }
    pthread_mutex_lock(&meta.create);
    bp_device *dev = find_or_make(ps, n, fn, user, who, name);
    pthread_mutex_unlock(&meta.create);
    return dev;
}

/* The meta device over devices (creation lock held): the existing one, or a new one. Takes
 * name (heap). */
static bp_device *find_or_make(const struct parts *ps, int n, bp_meta_split_fn fn, void *user,
                               const char *who, char *name)
{
    bp_device *const *devices = ps->devices;
    for (int k = 0; k < n_devices(); k++) {
        struct meta_dev *md = meta.devs[k];
        if (strcasecmp(md->name, name) != 0)
            continue;
        bool same_parts = md->n == n && md->ranked == (ps->ranks != NULL);
        for (int i = 0; same_parts && i < n; i++)
            same_parts = md->parts[i] == devices[i] && (!md->ranked || md->rank[i] == ps->ranks[i]);
        if (!same_parts) {
            free(name);
            bp_set_error(BP_ERR_INVALID_ARG, "%s: a meta device named '%.*s%s' already exists "
                         "over other devices of the same names", who, SHOW(md->name));
            return NULL;
        }
        if (md->split_fn != fn || md->split_user != user)
            continue; /* the same parts under another policy: another device */
        free(name);
        return md->dev;
    }
    if (n_devices() == MAX_META_DEVICES) {
        free(name);
        bp_set_error(BP_ERR_CAPACITY, "%s: at most %d meta devices", who, MAX_META_DEVICES);
        return NULL;
    }
    struct meta_dev *md = calloc(1, sizeof(*md));
    if (md == NULL) {
        free(name);
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
        return NULL;
    }
    md->name = name;
    md->n = n;
    md->split_fn = fn;
    md->split_user = user;
    bp_meta_states_init(&md->states);
    md->ranked = ps->ranks != NULL;
    for (int i = 0; i < n; i++) {
        md->parts[i] = devices[i];
        md->rank[i] = ps->ranks != NULL ? ps->ranks[i] : 0;
    }
    snprintf(md->description, sizeof(md->description), "tensor parallelism over %d device%s%s%s",
             n, n == 1 ? "" : "s", md->ranked ? " named by MPI rank" : "",
             fn ? " (user split policy)" : "");
    md->dev = bp_device_new(meta.reg, &meta_device_iface, md);
    md->buft = md->dev ? bp_meta_buffer_type_new(md) : NULL;
    if (md->buft == NULL) {
        bp_meta_states_close(&md->states);
        free(md->name);
        free(md);
        return NULL; /* a device without a buffer type stays listed; it cannot be created */
    }
    const int k = n_devices();
    meta.devs[k] = md;
    atomic_store_explicit(&meta.n, k + 1, memory_order_release);
    return md->dev;
}

/* The "bp_meta_device_new" proc address. */
static bp_device *meta_device_new(bp_device *const *devices, int n, bp_meta_split_fn fn,
                                  void *user)
{
    if (devices == NULL) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_device_new: the device array is NULL (n = %d)",
                     n);
        return NULL;
    }
    if (n < 1 || n > BP_META_MAX_DEVICES) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_device_new: need 1 to %d devices, got %d",
                     BP_META_MAX_DEVICES, n);
        return NULL;
    }
    const struct parts ps = {devices, NULL, NULL};
    return device_for(&ps, n, fn, user, "bp_meta_device_new");
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* Splits item "NAME@RANK" into NAME (item, cut) and the rank; -1 when there is no '@' (the part
 * is on the calling process). -2 after an error. */
static int take_rank(char *item, const char *name)
{
    char *at = strrchr(item, '@');
    if (at == NULL)
        return -1;
    const char *digits = at + 1;
    long v = 0;
    bool ok = *digits != '\0' && strlen(digits) <= 6;
    for (const char *d = digits; ok && *d; d++) {
        ok = *d >= '0' && *d <= '9';
        v = v * 10 + (*d - '0');
    }
    if (!ok || at == item) {
        bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s' in '%.*s%s' is not DEVICE@RANK (a rank is a "
                     "number from 0)", SHOW(item), SHOW(name));
        return -2;
    }
    *at = '\0';
    return (int)v;
}

/* The part names of "Meta(A,B,...)" (name, already known to start with "Meta(") into names
 * (heap copies, the caller frees them) and their ranks (-1: this process); their count, or -1
 * after an error. The whole name is read: one or more names separated by commas, spaces around
 * a name ignored, ")" and nothing after it. */
static int parse_parts(const char *name, char **names, int *ranks)
{
    int n = 0;
    const char *p = name + 5;
    for (;;) {
        const char *start = p, *end = p + strcspn(p, ",()");
        const char sep = *end;
        while (start < end && is_space(*start))
            start++;
        const char *stop = end;
        while (stop > start && is_space(stop[-1]))
            stop--;
        if (sep == '\0') {
            bp_set_error(BP_ERR_INVALID_ARG, "no closing parenthesis in '%.*s%s' (the form is "
                         "Meta(A,B,...))", SHOW(name));
            return -1;
        }
        if (sep == '(') {
            bp_set_error(BP_ERR_INVALID_ARG, "'(' inside '%.*s%s': a meta device cannot be a "
                         "part of another", SHOW(name));
            return -1;
        }
        if (start == stop) {
            if (n == 0 && sep == ')')
                bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s' names no devices", SHOW(name));
            else
                bp_set_error(BP_ERR_INVALID_ARG, "device %d of '%.*s%s' is empty (an extra or "
                             "missing comma?)", n + 1, SHOW(name));
            return -1;
        }
        if (n == BP_META_MAX_DEVICES) {
            bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s' names more than %d devices", SHOW(name),
                         BP_META_MAX_DEVICES);
            return -1;
        }
        if ((names[n] = malloc((size_t)(stop - start) + 1)) == NULL) {
            bp_set_error(BP_ERR_OUT_OF_MEMORY, "out of memory parsing '%.*s%s'", SHOW(name));
            return -1;
        }
        memcpy(names[n], start, (size_t)(stop - start));
        names[n][stop - start] = '\0';
        if ((ranks[n] = take_rank(names[n], name)) == -2)
            return -1;
        n++;
        p = end + 1;
        if (sep == ')')
            break;
    }
    if (*p != '\0') {
        bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s' after the closing parenthesis of '%.*s%s'",
                     SHOW(p), SHOW(name));
        return -1;
    }
    return n;
}

/* Parts across processes: this process's rank into *me, and every part without a rank is on
 * it. False after an error (a rank the program does not have). */
static bool resolve_ranks(const char *name, int *ranks, int n, int *me)
{
    int n_ranks = 1;
    bp_comm_world_fn world;
    bp_comm_init_ranks_fn init;
    bp_comm_allreduce_checked_fn allreduce;
    bp_comm_free_fn comm_free;
    if (!mpi_procs(&world, &init, &allreduce, &comm_free, name) || world(me, &n_ranks) != BP_OK)
        return false;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0)
            ranks[i] = *me;
        if (ranks[i] >= n_ranks) {
            bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s': part %d is on rank %d, but the program "
                         "runs as %d process%s (ranks 0 to %d)", SHOW(name), i, ranks[i],
                         n_ranks, n_ranks == 1 ? "" : "es", n_ranks - 1);
            return false;
        }
    }
    return true;
}

/* "Meta(A,B,...)": the meta device over the named devices with the split policy (fn, user), made
 * when new (find_or_make: the same parts and policy give the same device). The name is parsed
 * whole, with no length limit (parse_parts): an empty name, a device listed twice, a nested "("
 * and anything after the ")" are errors. A name "DEVICE@RANK" is a part on the process of that
 * MPI rank (docs/distributed.md): every rank makes the same device, holding and computing its
 * own parts only; a part without '@' is on the calling process. */
static bp_device *meta_device_by_name(const char *name, bp_meta_split_fn fn, void *user)
{
    if (name == NULL)
        return (bp_device *)(bp_set_error(BP_ERR_INVALID_ARG, "bp_meta_device_by_name: name is "
                                          "NULL"), NULL);
    if (strncasecmp(name, "Meta(", 5) != 0)
        return (bp_device *)(bp_set_error(BP_ERR_INVALID_ARG, "'%.*s%s' is not of the form "
                                          "Meta(A,B,...)", SHOW(name)), NULL);
    bp_device *devs[BP_META_MAX_DEVICES] = {0};
    char *names[BP_META_MAX_DEVICES] = {0};
    int ranks[BP_META_MAX_DEVICES];
    bp_device *md = NULL;
    const int n = parse_parts(name, names, ranks);
    bool ranked = false;
    for (int i = 0; i < n; i++)
        ranked |= ranks[i] >= 0;
    int me = 0;
    if (n > 0 && (!ranked || resolve_ranks(name, ranks, n, &me))) {
        char who[SHOWN + 8];
        snprintf(who, sizeof(who), "'%.*s%s'", SHOW(name));
        enum bp_status st = BP_OK;
        for (int i = 0; i < n && st == BP_OK; i++)
            if (!ranked || ranks[i] == me)
                st = (devs[i] = bp_device_by_name(names[i])) != NULL ? BP_OK : bp_last_status();
        /* (the lookup's error names the device and lists those that exist) */
        const struct parts ps = {devs, ranked ? ranks : NULL, names};
        md = st == BP_OK ? device_for(&ps, n, fn, user, who) : NULL;
        if (md == NULL && ranked) /* the other ranks are told, and fail too */
            tell_ranks(ranks, n, bp_last_status(), name);
    }
    for (int i = 0; i < BP_META_MAX_DEVICES; i++)
        free(names[i]);
    return md;
}

static bp_backend *meta_init_by_name(const char *name, const char *params)
{
    bp_device *md = meta_device_by_name(name, NULL, NULL);
    return md ? bp_device_init_backend(md, params) : NULL;
}

static const char *mreg_name(bp_registry *reg)
{
    (void)reg;
    return "Meta";
}

static size_t mreg_count(bp_registry *reg)
{
    (void)reg;
    return (size_t)n_devices();
}

static bp_device *mreg_device(bp_registry *reg, size_t i)
{
    (void)reg;
    return meta.devs[i]->dev;
}

/* Why the registry lists no devices before any is named (the loader's report and the
 * runtime's "no device is named" sentence quote it). */
static const char *meta_note(void)
{
    return n_devices() == 0 ? "a meta device is made when a program names one, as "
                              "\"Meta(CPU0,CPU1)\""
                            : NULL;
}

static void *mreg_proc(bp_registry *reg, const char *name)
{
    (void)reg;
    if (strcmp(name, "bp_meta_device_new") == 0)
        return (void *)meta_device_new;
    if (strcmp(name, "bp_registry_note") == 0)
        return (void *)meta_note;
    if (strcmp(name, "bp_meta_init_by_name") == 0)
        return (void *)meta_init_by_name;
    if (strcmp(name, "bp_meta_device_by_name") == 0)
        return (void *)meta_device_by_name;
    if (strcmp(name, "bp_meta_backend_stats") == 0)
        return (void *)meta_backend_stats;
    if (strcmp(name, "bp_meta_buffer_part_bytes") == 0)
        return (void *)meta_buffer_part_bytes;
    if (strcmp(name, "bp_meta_backend_reduced_bytes") == 0)
        return (void *)meta_backend_reduced_bytes;
    return NULL;
}

static void mreg_free(bp_registry *reg)
{
    (void)reg;
    for (int i = 0; i < n_devices(); i++) {
        bp_meta_states_close(&meta.devs[i]->states);
        free(meta.devs[i]->name);
        free(meta.devs[i]);
    }
    atomic_store(&meta.n, 0);
    meta.reg = NULL;
}

static const struct bp_registry_iface meta_registry_iface = {
    .struct_size = sizeof(struct bp_registry_iface),
    .get_name = mreg_name,
    .get_device_count = mreg_count,
    .get_device = mreg_device,
    .get_proc_address = mreg_proc,
    .free = mreg_free,
};

static bp_registry *meta_plugin_init(void)
{
    meta.reg = bp_registry_new(&meta_registry_iface, NULL);
    return meta.reg;
}

BP_PLUGIN_DEFINE("meta", "", 0, meta_plugin_init, NULL);
