/*
 * client.c - libringd: the trainer's side of the local API.
 *
 * Every call is one synchronous request/reply on a SOCK_SEQPACKET socket
 * (see proto/proto.h). Buffers are memfds created here; the client keeps
 * the fds open for its lifetime so that a reconnect can hand the very same
 * memory to a restarted daemon.
 */
#include "include/ringd.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/proto.h"

typedef struct {
    void *addr;             /* NULL: slot free */
    size_t size;
    int fd;
} cl_buf_t;

struct ringd_client {
    int fd;                 /* -1 while disconnected */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    ringd_opts_t opts;
    char name[32];
    uint32_t seq;
    uint32_t client_id;
    cl_buf_t *bufs;         /* indexed by buffer id; lowest free id reused */
    uint32_t nbufs;         /* slots in use, free ones included */
    uint32_t bufs_cap;
    int has_state;
    proto_state_set_t state;
    int in_step;            /* step_begin succeeded, step_end not yet */
    uint32_t coll_seq;      /* collectives posted in this step */
    char err[256];
};

static int cl_fail(ringd_client_t *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Record the detailed message of a failure; returns rc. */
static int cl_fail(ringd_client_t *c, int rc, const char *fmt, ...)
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
}

static void cl_drop(ringd_client_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->in_step = 0;
}

static int cl_disconnected(ringd_client_t *c, const char *what, int err)
{
    cl_drop(c);
    return cl_fail(c, RINGD_EDISCONNECTED,
                   "lost the ringd daemon at %s (%s: %s); call "
                   "ringd_reconnect() or ringd_step_begin()",
                   c->path, what, err ? strerror(err) : "connection closed");
}

static int cl_send(ringd_client_t *c, uint32_t type, const void *body,
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
        return cl_fail(c, RINGD_ESYS, "sendmsg: %s", strerror(errno));
    }
}

/* Wait for the reply to the last request; validates it fully. */
static int cl_recv(ringd_client_t *c, uint32_t type, void *rep,
                   size_t rep_len)
{
    char buf[PROTO_MAX_MSG];
    size_t n_got = 0;
    for (;;) {
        struct pollfd p = {c->fd, POLLIN, 0};
        int timeout = c->opts.timeout_ms ? (int)c->opts.timeout_ms : -1;
        int n = poll(&p, 1, timeout);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return cl_fail(c, RINGD_ESYS, "poll: %s", strerror(errno));
        if (n == 0) {
            /* The late reply would desynchronise the connection: drop it;
             * ringd_step_begin() reconnects. */
            cl_drop(c);
            return cl_fail(c, RINGD_ETIMEDOUT,
                           "no reply from the daemon within %u ms; "
                           "connection closed", c->opts.timeout_ms);
        }
        ssize_t got = recv(c->fd, buf, sizeof(buf), MSG_TRUNC);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return cl_disconnected(c, "recv", errno);
        if (got == 0)
            return cl_disconnected(c, "recv", 0);
        if ((size_t)got > sizeof(buf)) {
            cl_drop(c);
            return cl_fail(c, RINGD_EPROTO, "oversized reply from daemon");
        }
        n_got = (size_t)got;
        break;
    }
    proto_hdr_t h = {0};
    const char *why = "";
    memcpy(&h, buf, n_got < sizeof(h) ? n_got : sizeof(h));
    int rc = proto_check_hdr(&h, n_got, 1, &why);
    if (rc != 0) {
        cl_drop(c);
        return cl_fail(c, rc, "bad reply from daemon: %s", why);
    }
    if ((h.type & ~PROTO_REPLY) == PROTO_T_ERROR) {
        proto_error_rep_t e;
        memcpy(&e, buf + sizeof(h), sizeof(e));
        e.text[PROTO_TEXT - 1] = '\0';
        int st = e.status < 0 && e.status >= RINGD_EABORTED ? e.status
                                                            : RINGD_EPROTO;
        return cl_fail(c, st, "daemon: %s", e.text);
    }
    if (h.seq != c->seq || (h.type & ~PROTO_REPLY) != type) {
        cl_drop(c);
        return cl_fail(c, RINGD_EPROTO, "reply out of sequence");
    }
    memcpy(rep, buf + sizeof(h), rep_len);
    int32_t st;
    memcpy(&st, rep, sizeof(st));
    if (st > 0 || st < RINGD_EABORTED) {
        cl_drop(c);
        return cl_fail(c, RINGD_EPROTO, "daemon sent status %d", st);
    }
    if (st != 0)
        cl_fail(c, st, "daemon: %s", ringd_strerror(st));
    return st;
}

static int cl_call(ringd_client_t *c, uint32_t type, const void *body,
                   size_t len, int pass_fd, void *rep, size_t rep_len)
{
    if (c->fd < 0)
        return cl_fail(c, RINGD_EDISCONNECTED,
                       "not connected to the daemon at %s", c->path);
    int rc = cl_send(c, type, body, len, pass_fd);
    if (rc != 0)
        return rc;
    return cl_recv(c, type, rep, rep_len);
}

static int cl_register_buf(ringd_client_t *c, uint32_t id)
{
    proto_buf_add_t b = {id, 0, c->bufs[id].size};
    proto_status_rep_t rep;
    return cl_call(c, PROTO_T_BUF_ADD, &b, sizeof(b), c->bufs[id].fd, &rep,
                   sizeof(rep));
}

/* Open the socket, say hello, register everything we own. */
static int cl_open(ringd_client_t *c)
{
    c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return cl_fail(c, RINGD_ESYS, "socket: %s", strerror(errno));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, c->path, sizeof(a.sun_path));
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        int e = errno;
        cl_drop(c);
        if (e == ENOENT || e == ECONNREFUSED || e == ENOTSOCK)
            return cl_fail(c, RINGD_ENODAEMON,
                           "no ringd daemon listening at %s (%s); is ringd "
                           "running, and is RINGD_SOCKET right?",
                           c->path, strerror(e));
        return cl_fail(c, RINGD_ESYS, "connect %s: %s", c->path,
                       strerror(e));
    }
    proto_hello_t h = {(uint32_t)getpid(), RINGD_API_VERSION, {0}};
    memcpy(h.name, c->name, sizeof(h.name));
    proto_status_rep_t rep;
    int rc = cl_call(c, PROTO_T_HELLO, &h, sizeof(h), -1, &rep, sizeof(rep));
    if (rc == 0)
        c->client_id = rep.client_id;
    for (uint32_t i = 0; rc == 0 && i < c->nbufs; i++)
        if (c->bufs[i].addr != NULL)
            rc = cl_register_buf(c, i);
    if (rc == 0 && c->has_state)
        rc = cl_call(c, PROTO_T_STATE_SET, &c->state, sizeof(c->state), -1,
                     &rep, sizeof(rep));
    if (rc != 0) {
        cl_drop(c);
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
    ringd_opts_init(&c->opts);
    if (opts != NULL && opts->struct_size >= sizeof(*opts))
        c->opts = *opts;
    if (c->opts.name != NULL)
        snprintf(c->name, sizeof(c->name), "%s", c->opts.name);
    c->opts.name = NULL;
    if (strlen(socket_path) >= sizeof(c->path)) {
        free(c);
        return RINGD_EINVAL;
    }
    snprintf(c->path, sizeof(c->path), "%s", socket_path);
    int rc = cl_open(c);
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
    cl_drop(c);
    return cl_open(c);
}

/* The lowest free buffer id, growing the table; 0 or RINGD_* code. */
static int cl_free_slot(ringd_client_t *c, uint32_t *id_p)
{
    uint32_t id = 0;
    while (id < c->nbufs && c->bufs[id].addr != NULL)
        id++;
    if (id == PROTO_MAX_BUFFERS)
        return cl_fail(c, RINGD_ENOMEM, "at most %d buffers at once",
                       PROTO_MAX_BUFFERS);
    if (id == c->bufs_cap) {
        uint32_t cap = c->bufs_cap ? c->bufs_cap * 2 : 16;
        cl_buf_t *b = realloc(c->bufs, cap * sizeof(*b));
        if (b == NULL)
            return cl_fail(c, RINGD_ENOMEM, "buffer table of %u", cap);
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
        cl_fail(c, RINGD_EINVAL, "buffer size %zu out of range", bytes);
        return NULL;
    }
    uint32_t id = 0;
    if (cl_free_slot(c, &id) != 0)
        return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size = (bytes + page - 1) / page * page;
    int fd = memfd_create("ringd-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        cl_fail(c, RINGD_ESYS, "memfd_create: %s", strerror(errno));
        return NULL;
    }
    /* The daemon maps it too and insists it can never shrink. */
    void *addr = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0)
        addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        cl_fail(c, RINGD_ENOMEM, "shared buffer of %zu bytes: %s", size,
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
        return cl_fail(c, RINGD_EINVAL, "%p is not the start of a buffer "
                       "from ringd_buffer()", ptr);
    if (c->has_state && c->state.buf_id == id)
        return cl_fail(c, RINGD_ESTATE, "buffer %u holds the state region: "
                       "move it with ringd_state() first", id);
    /* Without a connection the daemon has unmapped it already. */
    if (c->fd >= 0) {
        proto_buf_free_t f = {id, 0};
        proto_status_rep_t rep;
        int rc = cl_call(c, PROTO_T_BUF_FREE, &f, sizeof(f), -1, &rep,
                         sizeof(rep));
        if (rc != 0 && rc != RINGD_EDISCONNECTED)
            return rc;
    }
    cl_release(c, id);
    return 0;
}

/* Find the buffer holding [p, p+len); 0 or RINGD_EINVAL. */
static int cl_locate(ringd_client_t *c, const void *p, size_t len,
                     uint32_t *id_p, uint64_t *off_p)
{
    for (uint32_t i = 0; i < c->nbufs; i++) {
        if (c->bufs[i].addr == NULL)
            continue;
        uintptr_t base = (uintptr_t)c->bufs[i].addr;
        uintptr_t q = (uintptr_t)p;
        if (q >= base && q - base < c->bufs[i].size) {
            if (!proto_range_ok(q - base, len, c->bufs[i].size))
                return cl_fail(c, RINGD_EINVAL,
                               "%zu bytes at %p run past the end of ringd "
                               "buffer %u", len, p, i);
            *id_p = i;
            *off_p = q - base;
            return 0;
        }
    }
    return cl_fail(c, RINGD_EINVAL,
                   "%p is not inside a buffer from ringd_buffer()", p);
}

int ringd_state(ringd_client_t *c, void *ptr, size_t bytes)
{
    if (c == NULL || ptr == NULL || bytes == 0)
        return RINGD_EINVAL;
    proto_state_set_t s = {0};
    int rc = cl_locate(c, ptr, bytes, &s.buf_id, &s.offset);
    if (rc != 0)
        return rc;
    s.bytes = bytes;
    proto_status_rep_t rep;
    rc = cl_call(c, PROTO_T_STATE_SET, &s, sizeof(s), -1, &rep, sizeof(rep));
    if (rc == 0) {
        c->state = s;
        c->has_state = 1;
    }
    return rc;
}

int ringd_step_begin(ringd_client_t *c, ringd_view_t *view)
{
    if (c == NULL || view == NULL)
        return RINGD_EINVAL;
    if (c->fd < 0 && c->opts.auto_reconnect) {
        int rc = cl_open(c);
        if (rc != 0)
            return rc;
    }
    proto_step_rep_t rep;
    int rc = cl_call(c, PROTO_T_STEP_BEGIN, NULL, 0, -1, &rep, sizeof(rep));
    /* The daemon may have restarted since our last call: only now do we
     * find out, so reconnect once and ask again. */
    if (rc == RINGD_EDISCONNECTED && c->opts.auto_reconnect) {
        rc = cl_open(c);
        if (rc == 0)
            rc = cl_call(c, PROTO_T_STEP_BEGIN, NULL, 0, -1, &rep,
                         sizeof(rep));
    }
    if (rc != 0)
        return rc;
    if (rep.world == 0 || rep.rank >= rep.world || rep.local_world == 0 ||
        rep.local_rank >= rep.local_world || rep.local_world > rep.world ||
        rep.restored > 1) {
        cl_drop(c);
        return cl_fail(c, RINGD_EPROTO, "daemon sent an impossible view "
                       "(rank %u of %u, local %u of %u)", rep.rank,
                       rep.world, rep.local_rank, rep.local_world);
    }
    *view = (ringd_view_t){rep.rank, rep.world, rep.local_rank,
                           rep.local_world, rep.step, rep.generation,
                           rep.restored != 0};
    c->in_step = 1;
    c->coll_seq = 0;
    return 0;
}

static int cl_coll(ringd_client_t *c, proto_coll_req_t *r, const void *ptr)
{
    size_t esz = proto_dtype_size(r->dtype);
    if (esz == 0 || r->count == 0 || r->count > PROTO_MAX_BUF_BYTES / esz)
        return cl_fail(c, RINGD_EINVAL, "bad dtype or count");
    if (r->kind == PROTO_COLL_ALLREDUCE && r->op > RINGD_AVG)
        return cl_fail(c, RINGD_EINVAL, "bad reduction op %u", r->op);
    if (!c->in_step)
        return cl_fail(c, RINGD_ESTATE,
                       "collective outside a step: call ringd_step_begin()");
    int rc = cl_locate(c, ptr, r->count * esz, &r->buf_id, &r->offset);
    if (rc != 0)
        return rc;
    r->coll_seq = c->coll_seq++;
    proto_status_rep_t rep;
    rc = cl_call(c, PROTO_T_COLL, r, sizeof(*r), -1, &rep, sizeof(rep));
    if (rc == RINGD_ERESHAPE)
        c->in_step = 0;
    return rc;
}

int ringd_allreduce(ringd_client_t *c, void *ptr, size_t count,
                    ringd_dtype_t dtype, ringd_op_t op)
{
    if (c == NULL || ptr == NULL)
        return RINGD_EINVAL;
    proto_coll_req_t r = {.kind = PROTO_COLL_ALLREDUCE,
                          .dtype = (uint32_t)dtype, .count = count,
                          .op = (uint32_t)op};
    return cl_coll(c, &r, ptr);
}

int ringd_broadcast(ringd_client_t *c, void *ptr, size_t bytes,
                    uint32_t root)
{
    if (c == NULL || ptr == NULL)
        return RINGD_EINVAL;
    proto_coll_req_t r = {.kind = PROTO_COLL_BROADCAST, .dtype = RINGD_U8,
                          .count = bytes, .root = root};
    return cl_coll(c, &r, ptr);
}

int ringd_step_end(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    if (!c->in_step)
        return cl_fail(c, RINGD_ESTATE, "step_end without step_begin");
    proto_status_rep_t rep;
    int rc = cl_call(c, PROTO_T_STEP_END, NULL, 0, -1, &rep, sizeof(rep));
    c->in_step = 0;
    return rc;
}

int ringd_checkpoint(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    proto_status_rep_t rep;
    return cl_call(c, PROTO_T_CKPT, NULL, 0, -1, &rep, sizeof(rep));
}

void ringd_close(ringd_client_t *c)
{
    if (c == NULL)
        return;
    /* A clean leave, so the daemon does not count us as lost. */
    if (c->fd >= 0)
        (void)cl_send(c, PROTO_T_BYE, NULL, 0, -1);
    cl_drop(c);
    for (uint32_t i = 0; i < c->nbufs; i++)
        if (c->bufs[i].addr != NULL)
            cl_release(c, i);
    free(c->bufs);
    free(c);
}
