/*
 * client.c - libringd: the trainer's side of the local API.
 *
 * Every call is one synchronous request/reply on a SOCK_SEQPACKET socket
 * (see proto/proto.h), except the asynchronous collectives: their requests
 * go out at once and their replies are taken whenever the client reads the
 * socket (in any call), matched to their handle by seq. Buffers are
 * memfds created here; the client keeps the fds open for its lifetime so
 * that a reconnect can hand the very same memory to a restarted daemon.
 */
#include "client/client-int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>


/* Record the detailed message of a failure; returns rc. */
int cl__fail(ringd_client_t *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
    return rc;
}

const char *ringd_strerror(int rc)
{
    switch (rc) {
    case RINGD_OK: return "success";
    case RINGD_EINVAL: return "invalid argument";
    case RINGD_ENODAEMON: return "no ringd daemon at the socket path";
    case RINGD_EDISCONNECTED: return "disconnected from the ringd daemon";
    case RINGD_EVERSION: return "client and daemon protocol versions differ";
    case RINGD_EPROTO: return "malformed message";
    case RINGD_ERESHAPE: return "view changed, redo the step";
    case RINGD_ENOMEM: return "out of memory";
    case RINGD_ENOTSUP: return "not supported by this daemon";
    case RINGD_ESYS: return "system call failed";
    case RINGD_ETIMEDOUT: return "timed out waiting for the daemon";
    case RINGD_EMISMATCH: return "trainers posted different collectives";
    case RINGD_ESHUTDOWN: return "the daemon is shutting down";
    case RINGD_EFENCED: return "the node is fenced (lease lost)";
    case RINGD_ESTATE: return "call out of order";
    case RINGD_EABORTED: return "collective aborted";
    case RINGD_ELIMIT: return "too many collectives outstanding";
    default: return "unknown error";
    }
}

const char *ringd_last_error(const ringd_client_t *c)
{
    return c != NULL ? c->err : "";
}

void ringd_opts_init(ringd_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->struct_size = sizeof(*opts);
    opts->auto_reconnect = 1;
    opts->reconnect_s = -1; /* $RINGD_RECONNECT_S, else the default */
}

_Static_assert(sizeof(void *) != 8 || sizeof(ringd_opts_t) == 24,
               "ringd_opts_t keeps the size callers built before "
               "reconnect_s (which took its padding) pass");

/* The caller's options, or the defaults (struct_size 0). */
static void cl_take_opts(ringd_client_t *c, const ringd_opts_t *opts)
{
    ringd_opts_init(&c->opts);
    if (opts != NULL && opts->struct_size >= sizeof(*opts))
        c->opts = *opts;
}

/* The connection is gone: so are the replies of every outstanding
 * collective. */
void cl__drop(ringd_client_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->in_step = 0;
    for (uint32_t i = 0; i < RINGD_MAX_OUTSTANDING; i++) {
        if (c->pend[i].h != 0 && !c->pend[i].done) {
            c->pend[i].done = 1;
            c->pend[i].held = 0;
            c->pend[i].status = RINGD_EDISCONNECTED;
        }
    }
    c->group_open = 0;
    c->group_n = 0;
}

static int cl_disconnected(ringd_client_t *c, const char *what, int err)
{
    cl__drop(c);
    return cl__fail(c, RINGD_EDISCONNECTED,
                    "lost the ringd daemon at %s (%s: %s); call "
                    "ringd_reconnect() or ringd_step_begin()",
                    c->path, what, err ? strerror(err) : "connection closed");
}

int cl__send(ringd_client_t *c, uint32_t type, const void *body,
             size_t len, int pass_fd)
{
    char buf[PROTO_MAX_MSG];
    proto_hdr_t h = {PROTO_MAGIC, PROTO_VERSION, (uint16_t)type,
                     (uint32_t)len, ++c->seq};
    memcpy(buf, &h, sizeof(h));
    if (len > 0)
        memcpy(buf + sizeof(h), body, len);
    struct iovec iov = {buf, sizeof(h) + len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    char cbuf[CMSG_SPACE(sizeof(int))];
    if (pass_fd >= 0) {
        memset(cbuf, 0, sizeof(cbuf));
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof(cbuf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    for (;;) {
        if (sendmsg(c->fd, &mh, MSG_NOSIGNAL) >= 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
            return cl_disconnected(c, "send", errno);
        return cl__fail(c, RINGD_ESYS, "sendmsg: %s", strerror(errno));
    }
}

/* A status from the daemon, or RINGD_EPROTO when it is none of ours. */
static int cl_status_ok(int32_t st)
{
    return st <= 0 && st >= RINGD_ELIMIT;
}

/*
 * Receive one reply into buf (PROTO_MAX_MSG bytes) and validate its
 * header: 0 with *n_p set, 1 when wait_ms is 0 and nothing is there, or an
 * error (the connection is then dropped, but for RINGD_ESYS).
 */
int cl__read(ringd_client_t *c, int wait_ms, char *buf, size_t *n_p)
{
    for (;;) {
        struct pollfd p = {c->fd, POLLIN, 0};
        int n = poll(&p, 1, wait_ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return cl__fail(c, RINGD_ESYS, "poll: %s", strerror(errno));
        if (n == 0 && wait_ms == 0)
            return 1;
        if (n == 0) {
            /* The late reply would desynchronise the connection: drop it;
             * ringd_step_begin() reconnects. */
            cl__drop(c);
            return cl__fail(c, RINGD_ETIMEDOUT,
                            "no reply from the daemon within %u ms; "
                            "connection closed", c->opts.timeout_ms);
        }
        ssize_t got = recv(c->fd, buf, PROTO_MAX_MSG, MSG_TRUNC);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return cl_disconnected(c, "recv", errno);
        if (got == 0)
            return cl_disconnected(c, "recv", 0);
        if ((size_t)got > PROTO_MAX_MSG) {
            cl__drop(c);
            return cl__fail(c, RINGD_EPROTO, "oversized reply from daemon");
        }
        *n_p = (size_t)got;
        break;
    }
    proto_hdr_t h = {0};
    const char *why = "";
    memcpy(&h, buf, *n_p < sizeof(h) ? *n_p : sizeof(h));
    int rc = proto_check_hdr(&h, *n_p, 1, &why);
    if (rc != 0) {
        cl__drop(c);
        return cl__fail(c, rc, "bad reply from daemon: %s", why);
    }
    return 0;
}

/* The status an ERROR reply carries, with its text as the last error. */
static int cl_error_status(ringd_client_t *c, const char *buf)
{
    proto_error_rep_t e;
    memcpy(&e, buf + sizeof(proto_hdr_t), sizeof(e));
    e.text[PROTO_TEXT - 1] = '\0';
    int st = e.status < 0 && cl_status_ok(e.status) ? e.status
                                                   : RINGD_EPROTO;
    return cl__fail(c, st, "daemon: %s", e.text);
}

/*
 * If buf is the reply to an outstanding collective, record its outcome:
 * 1 when taken, 0 when it is no collective's, < 0 for a malformed one
 * (the connection is then dropped).
 */
int cl__take(ringd_client_t *c, const char *buf)
{
    proto_hdr_t h;
    memcpy(&h, buf, sizeof(h));
    uint32_t type = h.type & ~PROTO_REPLY;
    cl_pend_t *p = NULL;
    for (uint32_t i = 0; i < RINGD_MAX_OUTSTANDING && p == NULL; i++)
        if (c->pend[i].h != 0 && !c->pend[i].done && !c->pend[i].held &&
            c->pend[i].seq == h.seq)
            p = &c->pend[i];
    if (p == NULL)
        return 0;
    int st;
    if (type == PROTO_T_ERROR) {
        st = cl_error_status(c, buf);
    } else if (type == PROTO_T_COLL) {
        int32_t v;
        memcpy(&v, buf + sizeof(h), sizeof(v));
        if (!cl_status_ok(v)) {
            cl__drop(c);
            return cl__fail(c, RINGD_EPROTO, "daemon sent status %d", v);
        }
        st = v;
    } else {
        cl__drop(c);
        return cl__fail(c, RINGD_EPROTO, "reply out of sequence");
    }
    p->done = 1;
    p->status = st;
    if (st == RINGD_ERESHAPE) {
        c->in_step = 0;
        c->reshaped = 1;
    }
    return 1;
}

/* Take every reply already there without blocking, so that a client
 * issuing many collectives never lets the daemon's replies pile up. */
int cl__take_ready(ringd_client_t *c)
{
    char buf[PROTO_MAX_MSG];
    size_t n;
    while (c->fd >= 0) {
        int rc = cl__read(c, 0, buf, &n);
        if (rc == 1)
            return 0;
        if (rc == 0)
            rc = cl__take(c, buf);
        if (rc < 0)
            return rc;
        if (rc == 0) {
            cl__drop(c);
            return cl__fail(c, RINGD_EPROTO, "reply out of sequence");
        }
    }
    return 0;
}

/* Wait for the reply to the last request; validates it fully. Replies to
 * outstanding collectives that come first are recorded on the way. */
static int cl_recv(ringd_client_t *c, uint32_t type, void *rep,
                   size_t rep_len)
{
    char buf[PROTO_MAX_MSG];
    size_t n_got = 0;
    int timeout = c->opts.timeout_ms ? (int)c->opts.timeout_ms : -1;
    for (;;) {
        int rc = cl__read(c, timeout, buf, &n_got);
        if (rc == 0)
            rc = cl__take(c, buf);
        if (rc < 0)
            return rc;
        if (rc == 0)
            break;
    }
    proto_hdr_t h;
    memcpy(&h, buf, sizeof(h));
    if ((h.type & ~PROTO_REPLY) == PROTO_T_ERROR)
        return cl_error_status(c, buf);
    if (h.seq != c->seq || (h.type & ~PROTO_REPLY) != type) {
        cl__drop(c);
        return cl__fail(c, RINGD_EPROTO, "reply out of sequence");
    }
    memcpy(rep, buf + sizeof(h), rep_len);
    int32_t st;
    memcpy(&st, rep, sizeof(st));
    if (!cl_status_ok(st)) {
        cl__drop(c);
        return cl__fail(c, RINGD_EPROTO, "daemon sent status %d", st);
    }
    if (st != 0)
        cl__fail(c, st, "daemon: %s", ringd_strerror(st));
    return st;
}

int cl__call(ringd_client_t *c, uint32_t type, const void *body,
             size_t len, int pass_fd, void *rep, size_t rep_len)
{
    if (c->fd < 0)
        return cl__fail(c, RINGD_EDISCONNECTED,
                        "not connected to the daemon at %s", c->path);
    int rc = cl__send(c, type, body, len, pass_fd);
    if (rc != 0)
        return rc;
    return cl_recv(c, type, rep, rep_len);
}

static int cl_register_buf(ringd_client_t *c, uint32_t id)
{
    proto_buf_add_t b = {id, 0, c->bufs[id].size};
    proto_status_rep_t rep;
    return cl__call(c, PROTO_T_BUF_ADD, &b, sizeof(b), c->bufs[id].fd, &rep,
                    sizeof(rep));
}

/* Open the socket, say hello, register everything we own. */
int cl__open(ringd_client_t *c)
{
    c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return cl__fail(c, RINGD_ESYS, "socket: %s", strerror(errno));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, c->path, sizeof(a.sun_path));
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        int e = errno;
        cl__drop(c);
        if (e == ENOENT || e == ECONNREFUSED || e == ENOTSOCK)
            return cl__fail(c, RINGD_ENODAEMON,
                            "no ringd daemon listening at %s (%s); is ringd "
                            "running, and is RINGD_SOCKET right?",
                            c->path, strerror(e));
        return cl__fail(c, RINGD_ESYS, "connect %s: %s", c->path,
                        strerror(e));
    }
    proto_hello_t h = {(uint32_t)getpid(), RINGD_API_VERSION, {0}};
    memcpy(h.name, c->name, sizeof(h.name));
    proto_status_rep_t rep;
    int rc = cl__call(c, PROTO_T_HELLO, &h, sizeof(h), -1, &rep, sizeof(rep));
    if (rc == 0)
        c->client_id = rep.client_id;
    for (uint32_t i = 0; rc == 0 && i < c->nbufs; i++)
        if (c->bufs[i].addr != NULL)
            rc = cl_register_buf(c, i);
    if (rc == 0 && c->has_state)
        rc = cl__call(c, PROTO_T_STATE_SET, &c->state, sizeof(c->state), -1,
                      &rep, sizeof(rep));
    if (rc != 0) {
        cl__drop(c);
        return rc;
    }
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
    int rc = cl__reconnect_window(c);
    if (rc == 0)
        rc = cl__open(c);
    if (rc != 0) {
        /* The caller gets no object, so the message goes to stderr once. */
        fprintf(stderr, "libringd: %s\n", c->err);
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
    if (cl_register_buf(c, id) != 0) {
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
