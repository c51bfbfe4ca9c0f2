/*
 * client.c - libringd: the trainer's side of the local API.
 *
 * Every call is one synchronous request/reply on a SOCK_SEQPACKET socket
 * (see proto/proto.h), except the asynchronous collectives: their requests
 * go out at once and their replies are taken whenever the client reads the
 * socket (in any call), matched to their handle by seq. Buffers are
 * memfds created here; the client keeps the fds open for its lifetime so
 * that a reconnect can hand the very same memory to a restarted daemon.
 *
 * The files, each calling only those below it: client.c and
 * client-coll.c (the API) -> client-wait.c (waiting for a daemon that
 * went away) -> client-conn.c (the connection: open, request, reply).
 */
#include "client/client-int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>



/* The message of this thread's last failed ringd_connect(), which gives
 * the caller no object to ask (Python raises it). */
static __thread char cl_connect_err[sizeof(((ringd_client_t *)0)->err)];

const char *ringd_last_error(const ringd_client_t *c)
{
    return c != NULL ? c->err : cl_connect_err;
}

void ringd_opts_init(ringd_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->struct_size = sizeof(*opts);
    opts->auto_reconnect = 1;
    opts->reconnect_s = -1; /* $RINGD_RECONNECT_S, else the default */
}

/* The struct as callers built it before `job`: its fields keep their
 * places, and such a caller's struct_size (24) still counts. */
#define CL_OPTS_V1_SIZE offsetof(ringd_opts_t, job)
_Static_assert(sizeof(void *) != 8 || CL_OPTS_V1_SIZE == 24,
               "ringd_opts_t keeps the layout callers built before "
               "reconnect_s (which took its padding) and job pass");
_Static_assert(sizeof(void *) != 8 || sizeof(ringd_opts_t) == 32,
               "job is the one field added at the end");

/* The caller's options, or the defaults (struct_size 0): the fields a
 * caller's struct_size covers are its, the rest the defaults. */
static void cl_take_opts(ringd_client_t *c, const ringd_opts_t *opts)
{
    ringd_opts_init(&c->opts);
    if (opts == NULL || opts->struct_size < CL_OPTS_V1_SIZE)
        return;
    size_t n = opts->struct_size < sizeof(*opts) ? opts->struct_size
                                                 : sizeof(*opts);
    memcpy(&c->opts, opts, n);
    c->opts.struct_size = sizeof(c->opts);
}

/* opts.job, else $RINGD_JOB, checked: the name goes to the daemon. */
static int cl_take_job(ringd_client_t *c)
{
    const char *job = c->opts.job;
    c->opts.job = NULL; /* the caller's string need not outlive connect */
    if (job == NULL)
        job = getenv("RINGD_JOB");
    if (job == NULL || job[0] == '\0')
        return 0;
    if (!proto_job_name_ok(job, sizeof(c->job))) {
        cl__fail(c, RINGD_EINVAL, "job name '%.80s': want 1..%d characters "
                 "of [A-Za-z0-9_.-], not starting with '.'", job,
                 RINGD_JOB_NAME_MAX);
        return RINGD_EINVAL;
    }
    snprintf(c->job, sizeof(c->job), "%s", job);
    return 0;
}


int ringd_connect(ringd_client_t **c_p, const char *socket_path,
                  const ringd_opts_t *opts)
{
    if (c_p == NULL)
        return RINGD_EINVAL;
    if (socket_path == NULL)
        socket_path = getenv("RINGD_SOCKET");
    if (socket_path == NULL || socket_path[0] == '\0')
        socket_path = RINGD_DEFAULT_SOCKET;
    ringd_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return RINGD_ENOMEM;
    c->fd = -1;
    cl_take_opts(c, opts);
    if (c->opts.name != NULL)
        snprintf(c->name, sizeof(c->name), "%s", c->opts.name);
    c->opts.name = NULL;
    if (strlen(socket_path) >= sizeof(c->path)) {
        free(c);
        return RINGD_EINVAL;
    }
    snprintf(c->path, sizeof(c->path), "%s", socket_path);
    int rc = cl_take_job(c);
    if (rc == 0)
        rc = cl__reconnect_window(c);
    if (rc == 0)
        rc = cl__open(c);
    if (rc != 0) {
        /* The caller gets no object, so the message goes to stderr once. */
        fprintf(stderr, "libringd: %s\n", c->err);
        snprintf(cl_connect_err, sizeof(cl_connect_err), "%s", c->err);
        free(c);
        return rc;
    }
    *c_p = c;
    return 0;
}

int ringd_reconnect(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    cl__drop(c);
    return cl__open(c);
}

/* The lowest free buffer id, growing the table; 0 or RINGD_* code. */
static int cl_free_slot(ringd_client_t *c, uint32_t *id_p)
{
    uint32_t id = 0;
    while (id < c->nbufs && c->bufs[id].addr != NULL)
        id++;
    if (id == PROTO_MAX_BUFFERS)
        return cl__fail(c, RINGD_ENOMEM, "at most %d buffers at once",
                        PROTO_MAX_BUFFERS);
    if (id == c->bufs_cap) {
        uint32_t cap = c->bufs_cap ? c->bufs_cap * 2 : 16;
        cl_buf_t *b = realloc(c->bufs, cap * sizeof(*b));
        if (b == NULL)
            return cl__fail(c, RINGD_ENOMEM, "buffer table of %u", cap);
        c->bufs = b;
        c->bufs_cap = cap;
    }
    *id_p = id;
    return 0;
}

/* Unmap and forget buffer id here (the daemon's side is done). */
static void cl_release(ringd_client_t *c, uint32_t id)
{
    munmap(c->bufs[id].addr, c->bufs[id].size);
    close(c->bufs[id].fd);
    c->bufs[id] = (cl_buf_t){NULL, 0, -1};
    while (c->nbufs > 0 && c->bufs[c->nbufs - 1].addr == NULL)
        c->nbufs--;
}

void *ringd_buffer(ringd_client_t *c, size_t bytes)
{
    if (c == NULL)
        return NULL;
    if (bytes == 0 || bytes > PROTO_MAX_BUF_BYTES) {
        cl__fail(c, RINGD_EINVAL, "buffer size %zu out of range", bytes);
        return NULL;
    }
    uint32_t id = 0;
    if (cl_free_slot(c, &id) != 0)
        return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size = (bytes + page - 1) / page * page;
    int fd = memfd_create("ringd-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        cl__fail(c, RINGD_ESYS, "memfd_create: %s", strerror(errno));
        return NULL;
    }
    /* The daemon maps it too and insists it can never shrink. */
    void *addr = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0)
        addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        cl__fail(c, RINGD_ENOMEM, "shared buffer of %zu bytes: %s", size,
                 strerror(errno));
        close(fd);
        return NULL;
    }
    c->bufs[id] = (cl_buf_t){addr, size, fd};
    if (id == c->nbufs)
        c->nbufs++;
    if (cl__register_buf(c, id) != 0) {
        cl_release(c, id);
        return NULL;
    }
    return addr;
}

int ringd_buffer_free(ringd_client_t *c, void *ptr)
{
    if (c == NULL || ptr == NULL)
        return RINGD_EINVAL;
    uint32_t id = 0;
    while (id < c->nbufs && c->bufs[id].addr != ptr)
        id++;
    if (id == c->nbufs)
        return cl__fail(c, RINGD_EINVAL, "%p is not the start of a buffer "
                        "from ringd_buffer()", ptr);
    if (c->has_state && c->state.buf_id == id)
        return cl__fail(c, RINGD_ESTATE, "buffer %u holds the state region: "
                        "move it with ringd_state() first", id);
    for (uint32_t i = 0; i < RINGD_MAX_OUTSTANDING; i++)
        if (c->pend[i].h != 0 && !c->pend[i].done &&
            c->pend[i].buf_id == id)
            return cl__fail(c, RINGD_ESTATE, "buffer %u has a collective "
                            "outstanding: ringd_wait() for it first", id);
    /* Without a connection the daemon has unmapped it already. */
    if (c->fd >= 0) {
        proto_buf_free_t f = {id, 0};
        proto_status_rep_t rep;
        int rc = cl__call(c, PROTO_T_BUF_FREE, &f, sizeof(f), -1, &rep,
                          sizeof(rep));
        if (rc != 0 && rc != RINGD_EDISCONNECTED)
            return rc;
    }
    cl_release(c, id);
    return 0;
}

/* Find the buffer holding [p, p+len); 0 or RINGD_EINVAL. */
int cl__locate(ringd_client_t *c, const void *p, size_t len,
               uint32_t *id_p, uint64_t *off_p)
{
    for (uint32_t i = 0; i < c->nbufs; i++) {
        if (c->bufs[i].addr == NULL)
            continue;
        uintptr_t base = (uintptr_t)c->bufs[i].addr;
        uintptr_t q = (uintptr_t)p;
        if (q >= base && q - base < c->bufs[i].size) {
            if (!proto_range_ok(q - base, len, c->bufs[i].size))
                return cl__fail(c, RINGD_EINVAL,
                                "%zu bytes at %p run past the end of ringd "
                                "buffer %u", len, p, i);
            *id_p = i;
            *off_p = q - base;
            return 0;
        }
    }
    return cl__fail(c, RINGD_EINVAL,
                    "%p is not inside a buffer from ringd_buffer()", p);
}

int ringd_state(ringd_client_t *c, void *ptr, size_t bytes)
{
    if (c == NULL || ptr == NULL || bytes == 0)
        return RINGD_EINVAL;
    proto_state_set_t s = {0};
    int rc = cl__locate(c, ptr, bytes, &s.buf_id, &s.offset);
    if (rc != 0)
        return rc;
    s.bytes = bytes;
    proto_status_rep_t rep;
    rc = cl__call(c, PROTO_T_STATE_SET, &s, sizeof(s), -1, &rep, sizeof(rep));
    if (rc == 0) {
        c->state = s;
        c->has_state = 1;
    }
    return rc;
}

/* Forget every handle: the step they belong to is left. */
static void cl_void_handles(ringd_client_t *c)
{
    memset(c->pend, 0, sizeof(c->pend));
    c->npend = 0;
    c->group_open = 0;
    c->group_n = 0;
}

/* STEP_BEGIN; with auto_reconnect, once more on a fresh connection if
 * this one turns out dead. */
static int cl_step_begin(ringd_client_t *c, proto_step_rep_t *rep)
{
    if (cl__waits(c))
        return cl__step_begin_waiting(c, rep);
    if (c->fd < 0 && c->opts.auto_reconnect) {
        int rc = cl__open(c);
        if (rc != 0)
            return rc;
    }
    int rc = cl__call(c, PROTO_T_STEP_BEGIN, NULL, 0, -1, rep, sizeof(*rep));
    /* The daemon may have restarted since our last call: only now do we
     * find out, so reconnect once and ask again. */
    if (rc == RINGD_EDISCONNECTED && c->opts.auto_reconnect) {
        rc = cl__open(c);
        if (rc == 0)
            rc = cl__call(c, PROTO_T_STEP_BEGIN, NULL, 0, -1, rep,
                          sizeof(*rep));
    }
    return rc;
}

int ringd_step_begin(ringd_client_t *c, ringd_view_t *view)
{
    if (c == NULL || view == NULL)
        return RINGD_EINVAL;
    proto_step_rep_t rep;
    /* The daemon answers every collective of the step left before this
     * reply (proto.h): their handles are void once it came. */
    int rc = cl_step_begin(c, &rep);
    cl_void_handles(c);
    c->reshaped = 0;
    if (rc != 0)
        return rc;
    if (rep.world == 0 || rep.rank >= rep.world || rep.local_world == 0 ||
        rep.local_rank >= rep.local_world || rep.local_world > rep.world ||
        rep.restored > 1) {
        cl__drop(c);
        return cl__fail(c, RINGD_EPROTO, "daemon sent an impossible view "
                        "(rank %u of %u, local %u of %u)", rep.rank,
                        rep.world, rep.local_rank, rep.local_world);
    }
    *view = (ringd_view_t){rep.rank, rep.world, rep.local_rank,
                           rep.local_world, rep.step, rep.generation,
                           rep.restored != 0};
    c->in_step = 1;
    c->coll_seq = 0;
    c->rank = rep.rank;
    c->world = rep.world;
    return 0;
}

int ringd_step_end(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    if (!c->in_step)
        return cl__fail(c, RINGD_ESTATE, "step_end without step_begin");
    if (c->npend > 0 || c->group_open)
        return cl__fail(c, RINGD_ESTATE, "step_end with %u collectives not "
                        "waited for%s", c->npend,
                        c->group_open ? " and a group open" : "");
    proto_status_rep_t rep;
    int rc = cl__call(c, PROTO_T_STEP_END, NULL, 0, -1, &rep, sizeof(rep));
    c->in_step = 0;
    return cl__lost(c, rc);
}

int ringd_checkpoint(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    proto_status_rep_t rep;
    return cl__call(c, PROTO_T_CKPT, NULL, 0, -1, &rep, sizeof(rep));
}

void ringd_close(ringd_client_t *c)
{
    if (c == NULL)
        return;
    /* A clean leave, so the daemon does not count us as lost. */
    if (c->fd >= 0)
        (void)cl__send(c, PROTO_T_BYE, NULL, 0, -1);
    cl__drop(c);
    for (uint32_t i = 0; i < c->nbufs; i++)
        if (c->bufs[i].addr != NULL)
            cl_release(c, i);
    free(c->bufs);
    free(c);
}
