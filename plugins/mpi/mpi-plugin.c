/* mpi-plugin.c - the "MPI" registry: collectives over backends in several processes
 * (bp-comm.h, docs/distributed.md).
 *
 * The registry has no devices; it offers the bp_comm_* proc addresses over (rank, backend)
 * members. MPI is started the first time one of them needs it (never at load: every backplane
 * program loads every plugin it finds), with MPI_THREAD_SERIALIZED, and finalized when the
 * plugin goes away if this plugin started it. Every wait is a poll with a deadline, so that no
 * rank waits forever for another:
 * - bp_comm_init_ranks first exchanges each member rank's status point to point (a rank that is
 *   missing is named when the time is up, a rank that failed is named at once), and only then,
 *   with every member known to be there, makes the sub-communicator;
 * - an all-reduce is two nonblocking all-reduces started together: the ranks' statuses (one
 *   entry per rank, so the first rank that failed is known) and the data, summed in F32. */
#include "config.h"

#include <dlfcn.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <backplane/bp-comm.h>
#include <backplane/bp-plugin.h>

#define MAX_MEMBERS 64
#define TAG_STATUS 0x6270 /* point-to-point tag of bp_comm_init_ranks' status exchange */
#define TAG_SUM 1         /* small sums' messages with the statuses, on the comm's own MPI_Comm */
#define TAG_FAST 2        /* + type: a small sum's bare values, every rank well (< 32767, the
                           * least MPI_TAG_UB that MPI allows) */
/* Values: sums this small go by recursive doubling, whose every step sends the whole message.
 * Between two ranks that is one exchange, faster than MPI_Allreduce up to 128 KiB and even with
 * it at 256 KiB (shared memory, bench/bench-mpi); with more ranks MPI's bandwidth-saving
 * algorithms win from 64 KiB. Larger sums pay two status exchanges and then MPI's sum. */
#define SMALL_SUM 16384
#define SMALL_SUM_PAIR 32768

static struct {
    pthread_mutex_t mu;
    bool started, ours;
    int rank, size;
} world = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static enum bp_status mpi_fail(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return bp_set_error(BP_ERR_BACKEND, "MPI: %s failed: %s", what, msg);
}

/* MPI started (by us, or already by the program). Open MPI loads its components with dlopen
 * and needs its own library's symbols global, which a plugin's dependency is not: promote
 * libmpi to RTLD_GLOBAL first. */
static enum bp_status start_mpi(void)
{
    pthread_mutex_lock(&world.mu);
    enum bp_status st = BP_OK;
    if (!world.started) {
        int inited = 0, finalized = 0;
        MPI_Initialized(&inited);
        MPI_Finalized(&finalized);
        if (finalized) {
            pthread_mutex_unlock(&world.mu);
            return bp_set_error(BP_ERR_UNSUPPORTED, "MPI: the library was finalized already; "
                                "it cannot be started again in this process");
        }
        if (!inited) {
            Dl_info info;
            if (dladdr((void *)MPI_Init_thread, &info) != 0 && info.dli_fname != NULL)
                dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
            int provided = 0;
            int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
            if (rc != MPI_SUCCESS) {
                pthread_mutex_unlock(&world.mu);
                return mpi_fail(rc, "MPI_Init_thread");
            }
            world.ours = true;
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world.size);
        world.started = true;
    }
    pthread_mutex_unlock(&world.mu);
    return st;
}

__attribute__((destructor)) static void stop_mpi(void)
{
    int finalized = 0;
    if (world.started && world.ours && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized)
        MPI_Finalize();
}

static enum bp_status comm_world(int *rank, int *n_ranks)
{
    if (rank == NULL || n_ranks == NULL)
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_world: rank and n_ranks must not be "
                            "NULL");
    enum bp_status st = start_mpi();
    if (st != BP_OK)
        return st;
    *rank = world.rank;
    *n_ranks = world.size;
    return BP_OK;
}

/* ---- Communicators ------------------------------------------------------------------------ */

struct bp_comm {
    MPI_Comm comm; /* over the members' distinct ranks, in order of first appearance */
    int n;
    struct bp_comm_member members[MAX_MEMBERS];
    int n_ranks;         /* in comm */
    int world_of[MAX_MEMBERS]; /* comm rank -> world rank */
    int me;              /* the calling rank in comm */
    double timeout;
    bool broken;         /* a collective timed out: no more */
    /* The devices' own communicator across processes (NCCL), when every member is such a
     * device: the data then go through it, the statuses through MPI. */
    bp_comm *dev;
    bp_comm_allreduce_fn dev_allreduce;
    bp_comm_free_fn dev_free;
    bool integer;        /* the sum under way is of I32 values (else in F32) */
    float *buf;          /* staging: the sum in F32 (or I32) */
    size_t cap;
    int small;           /* sums of at most this many values are small (SMALL_SUM*) */
    int msg_bytes;       /* a small sum's messages, at most: values and statuses */
    char *msg;           /* 2 * msg_bytes: a small sum's message out, and the one in */
    int *status;         /* FIELDS * n_ranks: per field (F_*), each rank's at its index */
    int sig;             /* the signature (count and type) of the sum under way */
    int type;            /* its type */
    size_t count;        /* its count */
    int awaited;         /* the rank (in comm) a wait that ran out was for, or -1 */
    bool clean;          /* small sum: every rank heard from is well and sums the same (then
                          * status[] is not kept up to date: it holds only this rank's own) */
};

/* What each rank tells the others with a sum (c->status: n_ranks entries per field, the
 * ranks' in order): its status, its sum's signature, and the count (in two 31-bit halves) and
 * type exactly, since a large sum's signature is a hash. */
enum { F_STATUS, F_SIG, F_LO, F_HI, F_TYPE, FIELDS };

static int *field(const bp_comm *c, int f)
{
    return c->status + (size_t)f * (size_t)c->n_ranks;
}

/* The bytes of those fields, ahead of the values in a message that carries them. */
static size_t head_bytes(const bp_comm *c)
{
    return FIELDS * (size_t)c->n_ranks * sizeof(int);
}

/* A deadline that starts at the first look at the clock, so that a wait which completes at
 * once (a small sum's usual case) never reads it: that look comes after about a thousand
 * polls, microseconds, which the timeout's seconds do not notice. */
struct deadline {
    double at; /* 0: not started */
    double timeout;
};

static bool expired(struct deadline *d)
{
    const double t = now_s();
    if (d->at == 0) {
        d->at = t + d->timeout;
        return false;
    }
    return t > d->at;
}

/* Waits for reqs[0..n) until the deadline, letting MPI progress; false when time ran out. */
static bool wait_all(MPI_Request *reqs, int n, struct deadline *deadline, int *rc)
{
    for (unsigned spin = 1;; spin++) {
        int done = 0;
        *rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (*rc != MPI_SUCCESS || done)
            return true;
        if ((spin & 1023) == 0 && expired(deadline))
            return false;
        if (spin > 100000)
            sched_yield(); /* a long wait: leave the core to the others */
    }
}

static void comm_free(bp_comm *c)
{
    if (c == NULL)
        return;
    if (c->dev != NULL)
        c->dev_free(c->dev);
    if (c->comm != MPI_COMM_NULL) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && !c->broken) /* (after a timeout a collective may still be pending) */
            MPI_Comm_free(&c->comm);
    }
    if (c->broken) {
        /* A collective may still be pending on these buffers: they stay for the process's
         * life, so that MPI never writes or sends freed memory. */
        free(c);
        return;
    }
    free(c->buf);
    free(c->msg);
    free(c->status);
    free(c);
}

/* A hash of the member list (the ranks in order), the same on every rank that passes the same. */
static int members_sig(const bp_comm *c)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < c->n; i++)
        h = (h ^ (uint32_t)c->members[i].rank) * 16777619u;
    return (int)(h & 0x7fffffff);
}

/* The status exchange of bp_comm_init_ranks: every member rank tells every other its status and
 * the signature of its member list, point to point. BP_OK when all are there, fine, and agree;
 * else the error naming the rank. The buffers live as long as the process when the time runs
 * out (a send may still be pending then). */
static enum bp_status exchange_status(const bp_comm *c, enum bp_status mine,
                                      struct deadline *deadline)
{
    MPI_Request reqs[2 * MAX_MEMBERS];
    int *buf = malloc((2 + 2 * (size_t)MAX_MEMBERS) * sizeof(int)), n = 0, rc = MPI_SUCCESS;
    if (buf == NULL)
        return bp_set_error(BP_ERR_OUT_OF_MEMORY, "bp_comm_init_ranks: out of memory");
    int *sent = buf, *theirs = buf + 2; /* theirs: two ints per rank */
    sent[0] = (int)mine;
    sent[1] = members_sig(c);
    for (int r = 0; r < c->n_ranks && rc == MPI_SUCCESS; r++) {
        if (r == c->me)
            continue;
        rc = MPI_Irecv(&theirs[2 * r], 2, MPI_INT, c->world_of[r], TAG_STATUS, MPI_COMM_WORLD,
                       &reqs[n++]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(sent, 2, MPI_INT, c->world_of[r], TAG_STATUS, MPI_COMM_WORLD,
                           &reqs[n++]);
    }
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "starting the status exchange of bp_comm_init_ranks"); /* (buf kept) */
    if (!wait_all(reqs, n, deadline, &rc)) {
        /* Who has not answered: the receives still open. */
        char who[256] = "";
        size_t len = 0;
        int k = 0;
        for (int r = 0; r < c->n_ranks; r++) {
            if (r == c->me)
                continue;
            int done = 0;
            MPI_Test(&reqs[k], &done, MPI_STATUS_IGNORE);
            if (!done) {
                MPI_Cancel(&reqs[k]);
                MPI_Request_free(&reqs[k]);
                len += (size_t)snprintf(who + len, len < sizeof(who) ? sizeof(who) - len : 0,
                                        "%s%d", len ? ", " : "", c->world_of[r]);
            }
            k += 2;
        }
        return bp_set_error(BP_ERR_TIMEOUT, "bp_comm_init_ranks on rank %d: rank(s) %s did not "
                            "arrive within %g s (gone, stuck, or not making the same calls)",
                            world.rank, who, c->timeout); /* (buf kept: sends may be pending) */
    }
    enum bp_status st = BP_OK;
    if (rc != MPI_SUCCESS)
        st = mpi_fail(rc, "the status exchange of bp_comm_init_ranks");
    else if (mine != BP_OK) /* the caller keeps its own error */
        st = mine;
    for (int r = 0; r < c->n_ranks && st == BP_OK; r++) {
        if (r == c->me)
            continue;
        if (theirs[2 * r] != BP_OK)
            st = bp_set_error(BP_ERR_REMOTE, "bp_comm_init_ranks on rank %d: rank %d failed "
                              "before it (%s); nothing was set up", world.rank, c->world_of[r],
                              bp_status_name((enum bp_status)theirs[2 * r]));
        else if (theirs[2 * r + 1] != sent[1])
            st = bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_init_ranks on rank %d: rank %d passed "
                              "other members (other ranks, or in another order); every rank "
                              "must pass the same", world.rank, c->world_of[r]);
    }
    free(buf);
    return st;
}

/* Every rank's v combined with MPI_MIN over c, waited for with the deadline; false when that
 * failed (then *v means nothing). */
static bool agree_min(bp_comm *c, int *v)
{
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, v, 1, MPI_INT, MPI_MIN, c->comm, &req);
    return rc == MPI_SUCCESS && wait_all(&req, 1, &(struct deadline){0, c->timeout}, &rc) &&
           rc == MPI_SUCCESS;
}

/* The devices' own communicator across processes, when every member of every rank is a device
 * of one registry that offers bp_comm_unique_id and bp_comm_init_rank (the CUDA plugin through
 * NCCL), and BP_COMM_DEVICE is not 0: the ranks agree on it, the first makes the id, MPI
 * carries it to the others, and every rank joins. Each step's outcome is agreed, so the ranks
 * stay together; any failure leaves the communicator on the host path, said once. (NCCL's own
 * join has no deadline: the agreements before it make sure every rank is there.) */
static void join_device_comm(bp_comm *c)
{
    bp_registry *reg = NULL;
    bool can = !(getenv("BP_COMM_DEVICE") && strcmp(getenv("BP_COMM_DEVICE"), "0") == 0);
    bp_backend *bes[MAX_MEMBERS] = {0};
    for (int i = 0; i < c->n && can; i++) {
        if (c->members[i].rank != world.rank)
            continue;
        bes[i] = c->members[i].backend;
        bp_registry *r = bp_device_get_registry(bp_backend_get_device(bes[i]));
        can = reg == NULL || r == reg;
        reg = r;
    }
    void *pu = reg ? bp_registry_get_proc_address(reg, "bp_comm_unique_id") : NULL;
    void *pi = reg ? bp_registry_get_proc_address(reg, "bp_comm_init_rank") : NULL;
    void *pa = reg ? bp_registry_get_proc_address(reg, "bp_comm_allreduce") : NULL;
    void *pf = reg ? bp_registry_get_proc_address(reg, "bp_comm_free") : NULL;
    int ok = can && pu && pi && pa && pf;
    if (!agree_min(c, &ok) || !ok)
        return; /* (some rank's members have no such collectives: the host path) */
    bp_comm_unique_id_fn unique_id;
    bp_comm_init_rank_fn init_rank;
    memcpy(&unique_id, &pu, sizeof(pu));
    memcpy(&init_rank, &pi, sizeof(pi));
    memcpy(&c->dev_allreduce, &pa, sizeof(pa));
    memcpy(&c->dev_free, &pf, sizeof(pf));
    struct {
        int status, size;
        char id[BP_COMM_ID_MAX];
    } msg = {0};
    if (c->me == 0) {
        size_t size = sizeof(msg.id);
        msg.status = (int)unique_id(msg.id, &size);
        msg.size = (int)size;
    }
    MPI_Request req;
    int rc = MPI_Ibcast(&msg, (int)sizeof(msg), MPI_BYTE, 0, c->comm, &req);
    ok = rc == MPI_SUCCESS && wait_all(&req, 1, &(struct deadline){0, c->timeout}, &rc) &&
         rc == MPI_SUCCESS && msg.status == BP_OK;
    if (!agree_min(c, &ok) || !ok) {
        bp_log(BP_LOG_WARN, "MPI: rank %d: no device communicator across the processes (%s); "
               "sums go through host memory", world.rank, msg.status != BP_OK
                   ? "the first rank could not make its id" : "the id did not reach every rank");
        bp_clear_error();
        return;
    }
    bp_comm *d = init_rank(msg.id, (size_t)msg.size, bes, c->n);
    ok = d != NULL;
    if (!agree_min(c, &ok) || !ok) {
        bp_log(BP_LOG_WARN, "MPI: rank %d: no device communicator across the processes (%s); "
               "sums go through host memory", world.rank,
               d == NULL ? bp_last_error() : "another rank could not join");
        bp_clear_error();
        if (d != NULL)
            c->dev_free(d);
        return;
    }
    c->dev = d;
}

/* A communicator over the n members m (1 to MAX_MEMBERS), with its buffers, before any
 * exchange with the other ranks; status: the caller's (a rank that failed before may lack its
 * members' backends). NULL, with the error set, when a member's rank does not exist, a
 * member's backend does not match its rank, no member is on this rank, or memory runs out;
 * else the caller frees it with comm_free. */
static bp_comm *comm_new(const struct bp_comm_member *m, int n, enum bp_status status,
                         double timeout_s)
{
    bp_comm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "bp_comm_init_ranks: out of memory");
        return NULL;
    }
    c->comm = MPI_COMM_NULL;
    c->n = n;
    c->timeout = timeout_s > 0 ? timeout_s : BP_COMM_DEFAULT_TIMEOUT;
    c->me = -1;
    for (int i = 0; i < n; i++) {
        c->members[i] = m[i];
        if (m[i].rank < 0 || m[i].rank >= world.size) {
            bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_init_ranks: member %d is on rank %d; the "
                         "ranks are 0 to %d", i, m[i].rank, world.size - 1);
            comm_free(c);
            return NULL;
        }
        /* (a rank that failed before may lack its members' backends) */
        if (status == BP_OK && (m[i].rank == world.rank) != (m[i].backend != NULL)) {
            bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_init_ranks: member %d (rank %d) %s",
                         i, m[i].rank, m[i].backend != NULL
                                           ? "is on another rank but has a backend"
                                           : "is on this rank but has no backend");
            comm_free(c);
            return NULL;
        }
        int r = 0;
        while (r < c->n_ranks && c->world_of[r] != m[i].rank)
            r++;
        if (r == c->n_ranks)
            c->world_of[c->n_ranks++] = m[i].rank;
        if (m[i].rank == world.rank)
            c->me = r;
    }
    if (c->me < 0) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_init_ranks: no member is on this rank (%d)",
                     world.rank);
        comm_free(c);
        return NULL;
    }
    c->status = calloc(FIELDS * (size_t)c->n_ranks, sizeof(int));
    c->small = c->n_ranks == 2 ? SMALL_SUM_PAIR : SMALL_SUM;
    c->msg_bytes = c->small * 4 + (int)head_bytes(c);
    c->msg = malloc(2 * (size_t)c->msg_bytes);
    if (c->status == NULL || c->msg == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "bp_comm_init_ranks: out of memory");
        comm_free(c);
        return NULL;
    }
    return c;
}

/* c's MPI communicator, once the status exchange has found every member rank there, well and
 * agreeing; on failure c->comm stays MPI_COMM_NULL. */
static enum bp_status comm_make_mpi(bp_comm *c)
{
    enum bp_status st = BP_OK;
    if (c->n_ranks == world.size) {
        /* Every rank of the program: a duplicate of MPI_COMM_WORLD, made without blocking (a
         * rank that gave up on the exchange just before cannot leave this one waiting). In
         * world order, so the communicator's ranks are the world's. */
        for (int r = 0; r < world.size; r++)
            c->world_of[r] = r;
        c->me = world.rank;
        MPI_Request req;
        int rc = MPI_Comm_idup(MPI_COMM_WORLD, &c->comm, &req);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(rc, "MPI_Comm_idup");
        else if (!wait_all(&req, 1, &(struct deadline){0, c->timeout}, &rc))
            st = bp_set_error(BP_ERR_TIMEOUT, "bp_comm_init_ranks on rank %d: the other ranks "
                              "did not make the communicator within %g s", world.rank,
                              c->timeout);
        else if (rc != MPI_SUCCESS)
            st = mpi_fail(rc, "MPI_Comm_idup");
        if (st == BP_OK)
            MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
        else
            c->comm = MPI_COMM_NULL;
    } else { /* every member rank is here: the group is made at once */
        MPI_Group all, sub;
        MPI_Comm_group(MPI_COMM_WORLD, &all);
        MPI_Group_incl(all, c->n_ranks, c->world_of, &sub);
        int rc = MPI_Comm_create_group(MPI_COMM_WORLD, sub, TAG_STATUS, &c->comm);
        MPI_Group_free(&sub);
        MPI_Group_free(&all);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(rc, "MPI_Comm_create_group");
        else
            MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    }
    return st;
}

static bp_comm *comm_init_ranks(const struct bp_comm_member *m, int n, enum bp_status status,
                                double timeout_s)
{
    if (start_mpi() != BP_OK)
        return NULL;
    if (m == NULL || n < 1 || n > MAX_MEMBERS) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_init_ranks: need 1 to %d members, got %s%d",
                     MAX_MEMBERS, m == NULL ? "no member array for " : "", n);
        return NULL;
    }
    bp_comm *c = comm_new(m, n, status, timeout_s);
    if (c == NULL)
        return NULL;
    enum bp_status st = exchange_status(c, status, &(struct deadline){0, c->timeout});
    if (st == BP_OK)
        st = comm_make_mpi(c);
    if (st != BP_OK) {
        comm_free(c);
        return NULL;
    }
    join_device_comm(c);
    return c;
}

static bp_comm *comm_init(bp_backend *const *backends, int n)
{
    if (start_mpi() != BP_OK)
        return NULL;
    struct bp_comm_member m[MAX_MEMBERS];
    if (backends == NULL || n < 1 || n > MAX_MEMBERS) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_init (MPI): need 1 to %d backends, got %d",
                     MAX_MEMBERS, backends == NULL ? 0 : n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        m[i] = (struct bp_comm_member){world.rank, backends[i]};
    return comm_init_ranks(m, n, BP_OK, 0);
}

/* ---- All-reduce ----------------------------------------------------------------------------- */

static const char *tname(const bp_tensor *t)
{
    return t == NULL ? "a sum this rank had no tensor for" : t->name[0] ? t->name
                                                                         : "an unnamed tensor";
}

static bool summable(enum bp_type t)
{
    return t == BP_TYPE_F32 || t == BP_TYPE_F16 || t == BP_TYPE_BF16 || t == BP_TYPE_I32;
}

/* v[i] += w[i] for n values: floats, or 32-bit integers (wrapping) when integer. Four at a
 * time in vector registers: at -O2 a plain loop stays scalar, and a small sum of a few hundred
 * values then spends a tenth of its time adding. One body for both element types. */
typedef float f32x4 __attribute__((vector_size(16)));
typedef uint32_t u32x4 __attribute__((vector_size(16)));

#define DEFINE_ADD(name, T, VT)                                                                \
    static void name(char *a, const char *b, size_t n)                                         \
    {                                                                                          \
        size_t i = 0;                                                                          \
        for (; i + 4 <= n; i += 4) {                                                           \
            VT x, y;                                                                           \
            memcpy(&x, a + 4 * i, sizeof(x));                                                  \
            memcpy(&y, b + 4 * i, sizeof(y));                                                  \
            x += y;                                                                            \
            memcpy(a + 4 * i, &x, sizeof(x));                                                  \
        }                                                                                      \
        for (; i < n; i++) {                                                                   \
            T x, y;                                                                            \
            memcpy(&x, a + 4 * i, sizeof(x));                                                  \
            memcpy(&y, b + 4 * i, sizeof(y));                                                  \
            x += y;                                                                            \
            memcpy(a + 4 * i, &x, sizeof(x));                                                  \
        }                                                                                      \
    }
DEFINE_ADD(add_f32, float, f32x4)
DEFINE_ADD(add_u32, uint32_t, u32x4)
#undef DEFINE_ADD

static void add_values(void *v, const void *w, size_t n, bool integer)
{
    if (integer)
        add_u32(v, w, n);
    else
        add_f32(v, w, n);
}

/* The local members' tensors checked: the same type and shape, contiguous, summable. *first:
 * the first allocated local tensor (NULL when there is none: then nothing says how many
 * values the others sum, and this rank cannot take part). */
static enum bp_status check_tensors(const bp_comm *c, bp_tensor *const *t, int n,
                                    bp_tensor **first)
{
    *first = NULL;
    for (int i = 0; i < n && i < c->n; i++)
        if (c->members[i].rank == world.rank && t[i] != NULL && t[i]->data != NULL) {
            *first = t[i];
            break;
        }
    if (n != c->n)
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_allreduce (MPI): %d tensors for a "
                            "communicator of %d members", n, c->n);
    for (int i = 0; i < n; i++) {
        const bool local = c->members[i].rank == world.rank;
        if (!local && t[i] != NULL)
            return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_allreduce (MPI): member %d is on "
                                "rank %d; its tensor must be NULL here", i, c->members[i].rank);
        if (!local)
            continue;
        if (t[i] == NULL || t[i]->data == NULL)
            return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_allreduce (MPI): member %d's tensor "
                                "is %s", i, t[i] == NULL ? "NULL" : "not allocated");
        if (!summable(t[i]->type) || !bp_is_contiguous(t[i]))
            return bp_set_error(BP_ERR_TYPE, "bp_comm_allreduce (MPI): %s is %s%s; sums take "
                                "contiguous F32, F16, BF16 or I32", tname(t[i]),
                                bp_is_contiguous(t[i]) ? "" : "a non-contiguous ",
                                bp_type_name(t[i]->type));
        if (t[i]->type != (*first)->type || !bp_are_same_shape(t[i], *first))
            return bp_set_error(BP_ERR_SHAPE, "bp_comm_allreduce (MPI): %s and %s differ in "
                                "type or shape", tname(t[i]), tname(*first));
    }
    return BP_OK;
}

/* One step: send_bytes from send to `to` with tag, at most msg_bytes bytes from `from` into
 * recv with any tag (NULL: that direction is skipped), with the deadline. *got_tag and
 * *got_bytes: what came in. MPI_SUCCESS, an MPI error code, or -1 when time ran out. */
static int exchange(bp_comm *c, int to, const void *send, int send_bytes, int tag, int from,
                    void *recv, int *got_tag, int *got_bytes, struct deadline *deadline)
{
    MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Status st[2];
    int rc = MPI_SUCCESS;
    if (recv != NULL)
        rc = MPI_Irecv(recv, c->msg_bytes, MPI_BYTE, from, MPI_ANY_TAG, c->comm, &r[0]);
    if (rc == MPI_SUCCESS && send != NULL)
        rc = MPI_Isend(send, send_bytes, MPI_BYTE, to, tag, c->comm, &r[1]);
    for (unsigned spin = 1; rc == MPI_SUCCESS; spin++) {
        int done = 0;
        rc = MPI_Testall(2, r, &done, st);
        if (rc != MPI_SUCCESS || done)
            break;
        if ((spin & 1023) == 0 && expired(deadline)) {
            c->awaited = r[0] != MPI_REQUEST_NULL ? from : to;
            if (r[0] != MPI_REQUEST_NULL) {
                MPI_Cancel(&r[0]);
                MPI_Request_free(&r[0]);
            }
            return -1;
        }
        if (spin > 100000)
            sched_yield();
    }
    if (rc == MPI_SUCCESS && recv != NULL) {
        *got_tag = st[0].MPI_TAG;
        rc = MPI_Get_count(&st[0], MPI_BYTE, got_bytes);
    }
    return rc;
}

/* The statuses, signatures and counts combined (the lowest: a failure, a rank's own entry
 * rather than INT_MAX); the values added only when the message's sum is this one (same
 * signature: exact for small sums, the only ones with values). */
static void combine(bp_comm *c, float *data, const char *msg, int count)
{
    const size_t head = head_bytes(c);
    bool same = true;
    for (int r = 0; r < FIELDS * c->n_ranks; r++) {
        int v;
        memcpy(&v, msg + (size_t)r * sizeof(int), sizeof(v));
        c->status[r] = v < c->status[r] ? v : c->status[r];
        same &= r / c->n_ranks != F_SIG || v == INT_MAX || v == c->sig;
    }
    if (same)
        add_values(data, msg + head, (size_t)count, c->integer);
}

/* The ranks one side of a step has heard from: newranks [first, first + n) of the recursive
 * doubling's numbering (below rem each stands for a folded pair), or the single rank `rank`
 * when n is 0. */
struct group {
    int first, n, rank;
};

/* A small sum's signature: its count and type exactly (below 2^28 for the counts of small
 * sums); a large sum's is a hash of them with bit 30 set, so never equal to a small one's. Never
 * INT_MAX, the mark of a rank not heard from. */
_Static_assert(BP_TYPE_COUNT <= 64 && SMALL_SUM_PAIR < (1 << 21), "signatures must fit");

static int small_sig(size_t count, int type)
{
    return (int)((((uint32_t)count << 6) | (uint32_t)type) << 4);
}

static int large_sig(size_t count, int type)
{
    const uint32_t h = (uint32_t)count * 2654435761u ^ (uint32_t)(count >> 32) * 97u ^
                       (uint32_t)type * 40503u;
    return (int)((h & 0x3ffffff0u) | 0x40000000u);
}

/* Notes that the ranks of g, this one aside (its own entries are its own), are well and sum
 * `count` values of `type` in a small sum (each entry the lowest, as in combine). */
static void set_group(bp_comm *c, struct group g, int rem, size_t count, int type)
{
    const int v[FIELDS] = {[F_STATUS] = 0, [F_SIG] = small_sig(count, type),
                           [F_LO] = (int)(count & 0x7fffffff), [F_HI] = (int)(count >> 31),
                           [F_TYPE] = type};
    const int last = g.n > 0 ? g.first + g.n - 1 : 0;
    for (int y = g.first; y <= last; y++) {
        const int lo = g.n == 0 ? g.rank : y < rem ? 2 * y : y + rem;
        const int hi = g.n > 0 && y < rem ? lo + 1 : lo;
        for (int r = lo; r <= hi; r++) {
            if (r == c->me)
                continue;
            for (int f = 0; f < FIELDS; f++) {
                int *e = &field(c, f)[r];
                *e = v[f] < *e ? v[f] : *e;
            }
        }
    }
}

/* A partner's message folded in; `theirs`: the ranks it has heard from, `mine`: the ranks this
 * one has. The bare form (tag TAG_FAST + type, the count from its size) says that every rank of
 * the partner's group is well and sums that many values of that type: while this rank's group
 * is clean too and that is its own sum, the values are all there is to it. Otherwise the
 * statuses are kept per rank from here on (c->clean false). `final`: the message is the whole
 * result (the unfold), copied instead of added. */
static void take(bp_comm *c, float *data, const char *in, int tag, int bytes, int count,
                 struct group mine, struct group theirs, int rem, bool final)
{
    const size_t values = (size_t)count * sizeof(float);
    if (tag >= TAG_FAST) {
        const size_t their_count = (size_t)bytes / sizeof(float);
        const bool same = small_sig(their_count, tag - TAG_FAST) == c->sig;
        if (!same && c->clean) {
            set_group(c, mine, rem, c->count, c->type);
            c->clean = false;
        }
        if (!c->clean)
            set_group(c, theirs, rem, their_count, tag - TAG_FAST);
        if (same && final)
            memcpy(data, in, values);
        else if (same)
            add_values(data, in, (size_t)count, c->integer);
        return;
    }
    if (c->clean) {
        set_group(c, mine, rem, c->count, c->type);
        c->clean = false;
    }
    const size_t head = head_bytes(c);
    if ((size_t)bytes != head + values) { /* another count, or a large sum's status round */
        int v[FIELDS * MAX_MEMBERS];
        memcpy(v, in, head < (size_t)bytes ? head : (size_t)bytes);
        for (int r = 0; r < FIELDS * c->n_ranks && (size_t)r * sizeof(int) < (size_t)bytes; r++)
            c->status[r] = v[r] < c->status[r] ? v[r] : c->status[r];
        return;
    }
    if (final) {
        memcpy(c->status, in, head);
        memcpy(data, in + head, values);
    } else {
        combine(c, data, in, count);
    }
}

/* One message of a small sum to `to` and/or one from `from`: the bare values while clean,
 * else the statuses and signatures (each rank's at its index) and then the values. */
static int step(bp_comm *c, float *data, int count, int to, int from, struct group mine,
                struct group theirs, int rem, bool final, struct deadline *deadline)
{
    char *out = c->msg, *in = from >= 0 ? c->msg + c->msg_bytes : NULL;
    const int values = count * (int)sizeof(float);
    const void *send = NULL;
    int bytes = 0, tag = TAG_SUM;
    if (to >= 0 && c->clean) {
        memcpy(out, data, (size_t)values);
        send = out;
        bytes = values;
        tag = TAG_FAST + c->type;
    } else if (to >= 0) {
        const size_t head = head_bytes(c);
        memcpy(out, c->status, head);
        memcpy(out + head, data, (size_t)values);
        send = out;
        bytes = (int)head + values;
    }
    int got_tag = 0, got_bytes = 0;
    int rc = exchange(c, to, send, bytes, tag, from, in, &got_tag, &got_bytes, deadline);
    if (rc == MPI_SUCCESS && in != NULL)
        take(c, data, in, got_tag, got_bytes, count, mine, theirs, rem, final);
    return rc;
}

/* A small sum in place, with the ranks' statuses (c->status) in the same messages, by
 * recursive doubling over point-to-point messages (the algorithm MPI itself uses for short
 * messages, here with a deadline on every wait): ranks beyond the largest power of two first
 * fold their values into a partner and get the result back at the end. Every rank ends with
 * the same bits, as each step adds two equal partial sums in either order. While every rank
 * is well and sums the same, the messages are the bare values, the statuses in their tags. */
static int small_sum(bp_comm *c, float *data, int count, struct deadline *deadline)
{
    const int n = c->n_ranks, me = c->me;
    c->awaited = -1;
    int pof2 = 1;
    while (pof2 * 2 <= n)
        pof2 *= 2;
    const int rem = n - pof2;
    int rc = MPI_SUCCESS, newrank;
    const struct group self = {0, 0, me}, all = {0, pof2, 0};
    if (me < 2 * rem) { /* fold */
        if (me % 2 == 0) {
            rc = step(c, data, count, me + 1, -1, self, self, rem, false, deadline);
            newrank = -1;
        } else {
            rc = step(c, data, count, -1, me - 1, self, (struct group){0, 0, me - 1}, rem, false,
                      deadline);
            newrank = me / 2;
        }
    } else {
        newrank = me - rem;
    }
    for (int mask = 1; rc == MPI_SUCCESS && newrank >= 0 && mask < pof2; mask <<= 1) {
        const int np = newrank ^ mask, peer = np < rem ? np * 2 + 1 : np + rem;
        const struct group mine = {newrank & ~(mask - 1), mask, 0},
                           theirs = {np & ~(mask - 1), mask, 0};
        rc = step(c, data, count, peer, peer, mine, theirs, rem, false, deadline);
    }
    if (rc == MPI_SUCCESS && me < 2 * rem) { /* unfold: the result, statuses and all */
        if (me % 2)
            rc = step(c, data, count, me - 1, -1, all, all, rem, true, deadline);
        else
            rc = step(c, data, count, -1, me + 1, self, all, rem, true, deadline);
    }
    return rc;
}

/* The outcome of a collective that carried the ranks' statuses (c->status): a timeout (the
 * communicator then takes no more), an MPI error, this rank's own failure, or another rank's. */
static enum bp_status verdict(bp_comm *c, enum bp_status status, const bp_tensor *first,
                              bool in_time, int rc, const char *what)
{
    if (!in_time) {
        c->broken = true;
        char ranks[256] = "";
        size_t len = 0;
        for (int r = 0; r < c->n_ranks; r++)
            len += (size_t)snprintf(ranks + len, len < sizeof(ranks) ? sizeof(ranks) - len : 0,
                                    "%s%d", r ? ", " : "", c->world_of[r]);
        char awaited[64] = "";
        if (c->awaited >= 0 && c->awaited < c->n_ranks)
            snprintf(awaited, sizeof(awaited), " (waiting for rank %d)",
                     c->world_of[c->awaited]);
        return bp_set_error(BP_ERR_TIMEOUT, "bp_comm_allreduce (MPI) on rank %d: the all-reduce "
                            "of %s over ranks %s did not complete within %g s%s: a rank is "
                            "gone, stuck, or did not reach it; this communicator takes no more",
                            world.rank, tname(first), ranks, c->timeout, awaited);
    }
    if (rc != MPI_SUCCESS) {
        c->broken = true;
        return mpi_fail(rc, what);
    }
    if (status != BP_OK) /* this rank failed: it keeps its own error */
        return status;
    for (int r = 0; r < c->n_ranks; r++)
        if (c->status[r] != BP_OK)
            return bp_set_error(BP_ERR_REMOTE, "bp_comm_allreduce (MPI) on rank %d: rank %d "
                                "failed (%s) before the all-reduce of %s", world.rank,
                                c->world_of[r], bp_status_name((enum bp_status)c->status[r]),
                                tname(first));
    const int *sig = field(c, F_SIG), *lo = field(c, F_LO), *hi = field(c, F_HI),
              *type = field(c, F_TYPE);
    for (int r = 0; r < c->n_ranks; r++)
        if (sig[r] != c->sig || lo[r] != (int)(c->count & 0x7fffffff) ||
            hi[r] != (int)(c->count >> 31) || type[r] != c->type)
            return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_allreduce (MPI) on rank %d: rank %d "
                                "sums another number or type of values than %s (%s [%lld]); "
                                "every rank must pass the same", world.rank, c->world_of[r],
                                tname(first), bp_type_name(first->type),
                                (long long)bp_nelements(first));
    return BP_OK;
}

/* This rank's status, its sum's signature, count and type at its index, the others' neutral
 * (status 0, INT_MAX elsewhere). */
static void own_status(bp_comm *c, enum bp_status status)
{
    for (int r = 0; r < FIELDS * c->n_ranks; r++)
        c->status[r] = r < c->n_ranks ? 0 : INT_MAX;
    field(c, F_STATUS)[c->me] = (int)status;
    field(c, F_SIG)[c->me] = c->sig;
    field(c, F_LO)[c->me] = (int)(c->count & 0x7fffffff);
    field(c, F_HI)[c->me] = (int)(c->count >> 31);
    field(c, F_TYPE)[c->me] = c->type;
}

/* The ranks' statuses and signatures alone, exchanged like a small sum of no values (messages
 * with the statuses, never the bare form), each wait with the deadline: BP_OK when every rank
 * has arrived, is well and sums the same. */
static enum bp_status status_round(bp_comm *c, enum bp_status status, const bp_tensor *first)
{
    own_status(c, status);
    c->clean = false;
    float none = 0;
    const int rc = small_sum(c, &none, 0, &(struct deadline){0, c->timeout});
    return verdict(c, status, first, rc != -1, rc, "the exchange of the ranks' statuses");
}

/* A rank with no tensor that says how many values the others sum (st: why; status: the
 * caller's). The exchange's steps do not depend on the count, so this rank still takes part,
 * in the statuses alone and as a failed one: the others learn of it now instead of pairing
 * with its next call. */
static enum bp_status allreduce_absent(bp_comm *c, enum bp_status status, enum bp_status st)
{
    const enum bp_status mine = status != BP_OK ? status : st;
    char saved[256];
    snprintf(saved, sizeof(saved), "%s", bp_last_error());
    c->type = 0;
    c->count = 0;
    c->sig = large_sig(0, 0);
    const enum bp_status got = status_round(c, mine, NULL);
    if (got == mine && status == BP_OK) /* (its own error, as it was) */
        bp_set_error(mine, "%s", saved);
    return got;
}

/* The n_local local members' count values added up into c->buf, in F32 (I32 for an integer
 * sum). Running out of memory for the buffers is returned at once (this rank then takes no
 * part); a member that cannot be read makes *status this rank's failure, which reaches the
 * others with the sum. */
static enum bp_status gather_local(bp_comm *c, bp_tensor *const *t, int n,
                                   const bp_tensor *first, size_t count, int n_local,
                                   enum bp_status *status)
{
    if (c->cap < count) {
        float *b = realloc(c->buf, (count > 0 ? count : 1) * sizeof(float));
        if (b == NULL)
            return bp_set_error(BP_ERR_OUT_OF_MEMORY, "bp_comm_allreduce (MPI): out of "
                                "memory for %zu values", count);
        c->buf = b;
        c->cap = count;
    }
    float *data = c->buf;
    memset(data, 0, count * sizeof(float));
    const struct bp_type_traits *tr = bp_type_get_traits(first->type);
    float *one = n_local > 1 ? malloc((count > 0 ? count : 1) * sizeof(float)) : NULL;
    if (n_local > 1 && one == NULL)
        return bp_set_error(BP_ERR_OUT_OF_MEMORY, "bp_comm_allreduce (MPI): out of memory "
                            "for %zu values", count);
    enum bp_status st = BP_OK;
    for (int i = 0, k = 0; i < n && st == BP_OK && *status == BP_OK; i++) {
        if (t[i] == NULL)
            continue;
        float *dst = k++ == 0 ? data : one;
        if (first->type == BP_TYPE_F32 || c->integer) { /* (4 bytes either way) */
            st = bp_tensor_get(t[i], dst, 0, count * sizeof(float));
        } else { /* the raw values, then widened */
            void *raw = malloc((count > 0 ? count : 1) * bp_type_size(first->type));
            st = raw == NULL ? bp_set_error(BP_ERR_OUT_OF_MEMORY, "bp_comm_allreduce "
                                            "(MPI): out of memory")
                             : bp_tensor_get(t[i], raw, 0, bp_nbytes(t[i]));
            if (st == BP_OK)
                tr->to_float(raw, dst, (int64_t)count);
            free(raw);
        }
        if (dst == one)
            add_values(data, one, count, c->integer);
    }
    free(one);
    if (st != BP_OK && *status == BP_OK)
        *status = st; /* a failure here reaches the others as this rank's */
    return BP_OK;
}

/* The ranks' count values in data summed, with their statuses. Small sums go by recursive
 * doubling with the statuses alongside (latency is all that counts there); larger ones first
 * exchange the statuses the same way, which tells that every rank has arrived (and that a
 * rank whose sum is small is refused, not left waiting), and then sum with MPI's blocking
 * all-reduce, whose algorithms for large messages are the fast ones. */
static enum bp_status sum_ranks(bp_comm *c, enum bp_status status, const bp_tensor *first,
                                float *data, size_t count, bool small)
{
    int rc = MPI_SUCCESS;
    enum bp_status st;
    if (small) {
        own_status(c, status);
        c->clean = status == BP_OK;
        rc = small_sum(c, data, (int)count, &(struct deadline){0, c->timeout});
        st = rc == MPI_SUCCESS && c->clean
                 ? BP_OK
                 : verdict(c, status, first, rc != -1, rc, "the exchange of a small sum");
    } else {
        st = status_round(c, status, first);
    }
    if (st != BP_OK || small)
        return st;
    /* Every rank is here, well, and sums the same (the counts and types compared exactly). A
     * second round, also with the deadline, before MPI's blocking sum: a rank that reached the
     * first only after another had given up on it (and so completed it alone) stops here
     * instead of waiting in the sum forever. */
    st = status_round(c, BP_OK, first);
    if (st != BP_OK)
        return st;
    const size_t chunk = (size_t)1 << 30;
    for (size_t off = 0; off < count && rc == MPI_SUCCESS; off += chunk)
        rc = MPI_Allreduce(MPI_IN_PLACE, data + off,
                           (int)(count - off < chunk ? count - off : chunk),
                           c->integer ? MPI_INT32_T : MPI_FLOAT, MPI_SUM, c->comm);
    if (rc != MPI_SUCCESS) {
        c->broken = true;
        return mpi_fail(rc, "MPI_Allreduce");
    }
    return BP_OK;
}

/* The sum (count values in data, F32 or I32) into every local member, in its type. */
static enum bp_status scatter_local(const bp_comm *c, bp_tensor *const *t, int n,
                                    const bp_tensor *first, float *data, size_t count)
{
    void *out = data;
    if (first->type != BP_TYPE_F32 && !c->integer) {
        out = malloc((count > 0 ? count : 1) * bp_type_size(first->type));
        if (out == NULL)
            return bp_set_error(BP_ERR_OUT_OF_MEMORY, "bp_comm_allreduce (MPI): out of memory");
        bp_type_get_traits(first->type)->from_float(data, out, (int64_t)count);
    }
    enum bp_status st = BP_OK;
    for (int i = 0; i < n && st == BP_OK; i++)
        if (t[i] != NULL)
            st = bp_tensor_set(t[i], out, 0, bp_nbytes(t[i]));
    if (out != data)
        free(out);
    return st;
}

static enum bp_status allreduce_checked(bp_comm *c, bp_tensor *const *t, int n,
                                        enum bp_status status)
{
    if (c == NULL || t == NULL)
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_allreduce (MPI): the communicator and "
                            "the tensors must not be NULL");
    if (c->broken)
        return bp_set_error(BP_ERR_TIMEOUT, "bp_comm_allreduce (MPI) on rank %d: an earlier "
                            "collective of this communicator timed out; it takes no more",
                            world.rank);
    if (n != c->n) /* (every rank alike: none takes part) */
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_allreduce (MPI): %d tensors for a "
                            "communicator of %d members", n, c->n);
    bp_tensor *first = NULL;
    enum bp_status st = BP_OK;
    if (status == BP_OK) {
        st = check_tensors(c, t, n, &first);
    } else { /* failed already: only the count is needed (the data are not read) */
        for (int i = 0; i < n && i < c->n && first == NULL; i++)
            if (c->members[i].rank == world.rank)
                first = t[i];
    }
    if (first == NULL)
        return allreduce_absent(c, status, st);
    if (st != BP_OK && status == BP_OK)
        status = st; /* bad tensors: this rank takes part as a failed one */
    const size_t count = (size_t)bp_nelements(first);
    const bool small = count <= (size_t)c->small;
    c->type = (int)first->type;
    c->count = count;
    c->sig = small ? small_sig(count, c->type) : large_sig(count, c->type);
    if (c->dev != NULL && first->type != BP_TYPE_I32) {
        /* The devices' own communicator (NCCL): the statuses through MPI with the deadline,
         * then the data device to device. */
        st = status_round(c, status, first);
        return st != BP_OK ? st : c->dev_allreduce(c->dev, t, n);
    }
    /* One local F32 (or I32) member in host memory is summed in place; anything else through
     * buf. */
    int n_local = 0;
    for (int i = 0; i < n; i++)
        n_local += t[i] != NULL;
    c->integer = first->type == BP_TYPE_I32;
    const bool in_place = status == BP_OK && n_local == 1 &&
                          (first->type == BP_TYPE_F32 || c->integer) && bp_is_contiguous(first) &&
                          bp_buffer_is_host(first->buffer);
    float *data = in_place ? first->data : NULL;
    if (!in_place) {
        st = gather_local(c, t, n, first, count, n_local, &status);
        if (st != BP_OK)
            return st;
        data = c->buf;
    }
    st = sum_ranks(c, status, first, data, count, small);
    if (st != BP_OK || in_place)
        return st;
    return scatter_local(c, t, n, first, data, count);
}

static enum bp_status allreduce(bp_comm *c, bp_tensor *const *t, int n)
{
    return allreduce_checked(c, t, n, BP_OK);
}

/* ---- The registry --------------------------------------------------------------------------- */

static const char *reg_name(bp_registry *reg)
{
    (void)reg;
    return "MPI";
}

static size_t reg_count(bp_registry *reg)
{
    (void)reg;
    return 0;
}

static bp_device *reg_device(bp_registry *reg, size_t i)
{
    (void)reg;
    (void)i;
    return NULL;
}

static void *reg_proc(bp_registry *reg, const char *name)
{
    (void)reg;
    static const struct {
        const char *name;
        void *fn;
    } procs[] = {
        {"bp_comm_world", (void *)comm_world},
        {"bp_comm_init", (void *)comm_init},
        {"bp_comm_init_ranks", (void *)comm_init_ranks},
        {"bp_comm_allreduce", (void *)allreduce},
        {"bp_comm_allreduce_checked", (void *)allreduce_checked},
        {"bp_comm_free", (void *)comm_free},
    };
    for (size_t i = 0; name != NULL && i < sizeof(procs) / sizeof(procs[0]); i++)
        if (strcmp(name, procs[i].name) == 0)
            return procs[i].fn;
    return NULL;
}

static const struct bp_registry_iface mpi_registry_iface = {
    .struct_size = sizeof(struct bp_registry_iface),
    .get_name = reg_name,
    .get_device_count = reg_count,
    .get_device = reg_device,
    .get_proc_address = reg_proc,
};

static bp_registry *mpi_plugin_init(void)
{
    return bp_registry_new(&mpi_registry_iface, NULL);
}

BP_PLUGIN_DEFINE("mpi", "", 0, mpi_plugin_init, NULL);
