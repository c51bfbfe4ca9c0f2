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

/* An issued collective whose handle has not been waited for. */
typedef struct {
    ringd_handle_t h;       /* 0: slot free */
    uint32_t seq;           /* of its COLL request */
    uint32_t buf_id;
    int done;               /* its reply came (or the connection went) */
    int status;
    int held;               /* in a group not yet ended: not sent */
    proto_coll_req_t req;   /* what a held one will send */
} cl_pend_t;

_Static_assert(RINGD_MAX_OUTSTANDING == PROTO_MAX_OUTSTANDING,
               "the client's bound is the daemon's");

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
    int reshaped;           /* a collective of this step got ERESHAPE */
    uint32_t rank, world;   /* of the step begun */
    uint8_t *barrier_buf;   /* a one-page buffer of ours, for barriers */
    cl_pend_t pend[RINGD_MAX_OUTSTANDING];
    uint32_t npend;         /* slots in use */
    int group_open;         /* ringd_group_start() without its end */
    uint32_t group_n;       /* held collectives, in issue order: */
    uint16_t group_slot[RINGD_MAX_OUTSTANDING]; /* their pend slots */
    ringd_handle_t next_handle;
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
}

/* The connection is gone: so are the replies of every outstanding
 * collective. */
static void cl_drop(ringd_client_t *c)
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
static int cl_read(ringd_client_t *c, int wait_ms, char *buf, size_t *n_p)
{
    for (;;) {
        struct pollfd p = {c->fd, POLLIN, 0};
        int n = poll(&p, 1, wait_ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return cl_fail(c, RINGD_ESYS, "poll: %s", strerror(errno));
        if (n == 0 && wait_ms == 0)
            return 1;
        if (n == 0) {
            /* The late reply would desynchronise the connection: drop it;
             * ringd_step_begin() reconnects. */
            cl_drop(c);
            return cl_fail(c, RINGD_ETIMEDOUT,
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
            cl_drop(c);
            return cl_fail(c, RINGD_EPROTO, "oversized reply from daemon");
        }
        *n_p = (size_t)got;
        break;
    }
    proto_hdr_t h = {0};
    const char *why = "";
    memcpy(&h, buf, *n_p < sizeof(h) ? *n_p : sizeof(h));
    int rc = proto_check_hdr(&h, *n_p, 1, &why);
    if (rc != 0) {
        cl_drop(c);
        return cl_fail(c, rc, "bad reply from daemon: %s", why);
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
    return cl_fail(c, st, "daemon: %s", e.text);
}

/*
 * If buf is the reply to an outstanding collective, record its outcome:
 * 1 when taken, 0 when it is no collective's, < 0 for a malformed one
 * (the connection is then dropped).
 */
static int cl_take(ringd_client_t *c, const char *buf)
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
            cl_drop(c);
            return cl_fail(c, RINGD_EPROTO, "daemon sent status %d", v);
        }
        st = v;
    } else {
        cl_drop(c);
        return cl_fail(c, RINGD_EPROTO, "reply out of sequence");
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
static int cl_take_ready(ringd_client_t *c)
{
    char buf[PROTO_MAX_MSG];
    size_t n;
    while (c->fd >= 0) {
        int rc = cl_read(c, 0, buf, &n);
        if (rc == 1)
            return 0;
        if (rc == 0)
            rc = cl_take(c, buf);
        if (rc < 0)
            return rc;
        if (rc == 0) {
            cl_drop(c);
            return cl_fail(c, RINGD_EPROTO, "reply out of sequence");
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
        int rc = cl_read(c, timeout, buf, &n_got);
        if (rc == 0)
            rc = cl_take(c, buf);
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
        cl_drop(c);
        return cl_fail(c, RINGD_EPROTO, "reply out of sequence");
    }
    memcpy(rep, buf + sizeof(h), rep_len);
    int32_t st;
    memcpy(&st, rep, sizeof(st));
    if (!cl_status_ok(st)) {
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
    for (uint32_t i = 0; i < RINGD_MAX_OUTSTANDING; i++)
        if (c->pend[i].h != 0 && !c->pend[i].done &&
            c->pend[i].buf_id == id)
            return cl_fail(c, RINGD_ESTATE, "buffer %u has a collective "
                           "outstanding: ringd_wait() for it first", id);
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
    if (c->fd < 0 && c->opts.auto_reconnect) {
        int rc = cl_open(c);
        if (rc != 0)
            return rc;
    }
    int rc = cl_call(c, PROTO_T_STEP_BEGIN, NULL, 0, -1, rep, sizeof(*rep));
    /* The daemon may have restarted since our last call: only now do we
     * find out, so reconnect once and ask again. */
    if (rc == RINGD_EDISCONNECTED && c->opts.auto_reconnect) {
        rc = cl_open(c);
        if (rc == 0)
            rc = cl_call(c, PROTO_T_STEP_BEGIN, NULL, 0, -1, rep,
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
    c->rank = rep.rank;
    c->world = rep.world;
    return 0;
}

static cl_pend_t *cl_find(ringd_client_t *c, ringd_handle_t h)
{
    for (uint32_t i = 0; h != 0 && i < RINGD_MAX_OUTSTANDING; i++)
        if (c->pend[i].h == h)
            return &c->pend[i];
    return NULL;
}

/* Its outcome; the handle is free again. */
static int cl_release_handle(ringd_client_t *c, cl_pend_t *p)
{
    int st = p->status;
    *p = (cl_pend_t){0};
    c->npend--;
    return st;
}

/* Send a collective request without waiting; *h_p names it. */
static int cl_issue(ringd_client_t *c, proto_coll_req_t *r, const void *ptr,
                    ringd_handle_t *h_p)
{
    size_t esz = proto_dtype_size(r->dtype);
    if (esz == 0 || r->count == 0 || r->count > PROTO_MAX_BUF_BYTES / esz)
        return cl_fail(c, RINGD_EINVAL, "bad dtype or count");
    if (r->kind == PROTO_COLL_ALLREDUCE && r->op > RINGD_AVG)
        return cl_fail(c, RINGD_EINVAL, "bad reduction op %u", r->op);
    if (c->reshaped)
        return cl_fail(c, RINGD_ERESHAPE, "a collective of this step "
                       "failed with RINGD_ERESHAPE: redo the step");
    if (!c->in_step)
        return cl_fail(c, RINGD_ESTATE,
                       "collective outside a step: call ringd_step_begin()");
    if (c->npend == RINGD_MAX_OUTSTANDING)
        return cl_fail(c, RINGD_ELIMIT, "%d collectives not waited for: "
                       "ringd_wait() for some first", RINGD_MAX_OUTSTANDING);
    int rc = cl_locate(c, ptr, r->count * esz, &r->buf_id, &r->offset);
    if (rc != 0)
        return rc;
    if (c->fd < 0)
        return cl_fail(c, RINGD_EDISCONNECTED,
                       "not connected to the daemon at %s", c->path);
    r->coll_seq = c->coll_seq++;
    cl_pend_t *p = c->pend;
    while (p->h != 0)
        p++;
    if (c->group_open) {
        /* Sent at ringd_group_end(), when the group is known whole. */
        c->group_slot[c->group_n++] = (uint16_t)(p - c->pend);
    } else {
        rc = cl_send(c, PROTO_T_COLL, r, sizeof(*r), -1);
        if (rc != 0)
            return rc;
    }
    if (++c->next_handle == 0)
        c->next_handle = 1;
    *p = (cl_pend_t){c->next_handle, c->seq, r->buf_id, 0, 0,
                     c->group_open, *r};
    c->npend++;
    *h_p = p->h;
    return c->group_open ? 0 : cl_take_ready(c);
}

int ringd_group_start(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    if (c->group_open)
        return cl_fail(c, RINGD_ESTATE, "a group is already open");
    if (c->reshaped)
        return cl_fail(c, RINGD_ERESHAPE, "a collective of this step "
                       "failed with RINGD_ERESHAPE: redo the step");
    if (!c->in_step)
        return cl_fail(c, RINGD_ESTATE,
                       "group outside a step: call ringd_step_begin()");
    c->group_open = 1;
    c->group_n = 0;
    return 0;
}

/* Consecutive allreduces of a group with the same dtype and op are sent
 * as one fused run: each but the last says the next one joins it. */
static int cl_joins_next(const proto_coll_req_t *a, const cl_pend_t *next)
{
    return next != NULL && a->kind == PROTO_COLL_ALLREDUCE &&
           next->req.kind == PROTO_COLL_ALLREDUCE &&
           next->req.dtype == a->dtype && next->req.op == a->op;
}

int ringd_group_end(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    if (!c->group_open)
        return cl_fail(c, RINGD_ESTATE, "no group is open");
    c->group_open = 0;
    uint32_t n = c->group_n;
    c->group_n = 0;
    for (uint32_t i = 0; i < n; i++) {
        cl_pend_t *p = &c->pend[c->group_slot[i]];
        cl_pend_t *next = i + 1 < n ? &c->pend[c->group_slot[i + 1]]
                                    : NULL;
        if (!p->held)
            continue; /* failed with the connection meanwhile */
        proto_coll_req_t r = p->req;
        if (cl_joins_next(&r, next))
            r.kind = PROTO_COLL_ALLREDUCE_MORE;
        int rc = cl_send(c, PROTO_T_COLL, &r, sizeof(r), -1);
        if (rc != 0)
            return rc; /* every handle failed with the connection */
        p->seq = c->seq;
        p->held = 0;
    }
    return cl_take_ready(c);
}

int ringd_wait(ringd_client_t *c, ringd_handle_t h)
{
    if (c == NULL)
        return RINGD_EINVAL;
    cl_pend_t *p = cl_find(c, h);
    if (p == NULL)
        return cl_fail(c, RINGD_EINVAL, "handle %llu is not outstanding "
                       "(already waited for, or of a step left since)",
                       (unsigned long long)h);
    if (p->held)
        return cl_fail(c, RINGD_ESTATE, "handle %llu is in a group not yet "
                       "sent: ringd_group_end() first",
                       (unsigned long long)h);
    char buf[PROTO_MAX_MSG];
    size_t n;
    int timeout = c->opts.timeout_ms ? (int)c->opts.timeout_ms : -1;
    while (!p->done) {
        if (c->fd < 0) {
            /* cl_drop failed every handle; this only guards the loop. */
            p->done = 1;
            p->status = RINGD_EDISCONNECTED;
            break;
        }
        int rc = cl_read(c, timeout, buf, &n);
        if (rc == 0)
            rc = cl_take(c, buf);
        if (rc == 0)
            rc = cl_fail(c, RINGD_EPROTO, "reply out of sequence");
        if (rc < 0) {
            /* Dropped (if not yet): a late reply would come unexpected,
             * and every handle fails; this one with the cause. */
            if (c->fd >= 0)
                cl_drop(c);
            p->status = rc;
        }
    }
    int st = cl_release_handle(c, p);
    if (st != 0 && st != RINGD_EDISCONNECTED)
        cl_fail(c, st, "collective: %s", ringd_strerror(st));
    return st;
}

int ringd_test(ringd_client_t *c, ringd_handle_t h, int *done_p)
{
    if (c == NULL || done_p == NULL)
        return RINGD_EINVAL;
    cl_pend_t *p = cl_find(c, h);
    *done_p = 1;
    if (p == NULL)
        return cl_fail(c, RINGD_EINVAL, "handle %llu is not outstanding",
                       (unsigned long long)h);
    if (p->held) {
        *done_p = 0;
        return cl_fail(c, RINGD_ESTATE, "handle %llu is in a group not "
                       "yet sent", (unsigned long long)h);
    }
    (void)cl_take_ready(c); /* a failure marks the handles done */
    if (!p->done) {
        *done_p = 0;
        return 0;
    }
    return cl_release_handle(c, p);
}

int ringd_allreduce_async(ringd_client_t *c, void *ptr, size_t count,
                          ringd_dtype_t dtype, ringd_op_t op,
                          ringd_handle_t *h_p)
{
    if (c == NULL || ptr == NULL || h_p == NULL)
        return RINGD_EINVAL;
    proto_coll_req_t r = {.kind = PROTO_COLL_ALLREDUCE,
                          .dtype = (uint32_t)dtype, .count = count,
                          .op = (uint32_t)op};
    return cl_issue(c, &r, ptr, h_p);
}

int ringd_broadcast_async(ringd_client_t *c, void *ptr, size_t bytes,
                          uint32_t root, ringd_handle_t *h_p)
{
    if (c == NULL || ptr == NULL || h_p == NULL)
        return RINGD_EINVAL;
    proto_coll_req_t r = {.kind = PROTO_COLL_BROADCAST, .dtype = RINGD_U8,
                          .count = bytes, .root = root};
    return cl_issue(c, &r, ptr, h_p);
}

/*
 * An allgather is an allreduce SUM of bytes over world * bytes in which
 * every trainer contributes only its own chunk, the others zeroed here:
 * exact for any content (0 + b = b in u8), no new collective in the
 * daemon or the ring, at twice the ring traffic of a dedicated one.
 */
int ringd_allgather_async(ringd_client_t *c, void *ptr, size_t bytes,
                          ringd_handle_t *h_p)
{
    if (c == NULL || ptr == NULL || h_p == NULL || bytes == 0)
        return RINGD_EINVAL;
    if (!c->in_step)
        return cl_fail(c, c->reshaped ? RINGD_ERESHAPE : RINGD_ESTATE,
                       "allgather outside a step");
    if (bytes > PROTO_MAX_BUF_BYTES / c->world)
        return cl_fail(c, RINGD_EINVAL, "allgather of %zu bytes x %u "
                       "trainers is too large", bytes, c->world);
    size_t all = bytes * c->world;
    uint32_t id;
    uint64_t off;
    int rc = cl_locate(c, ptr, all, &id, &off);
    if (rc != 0)
        return rc;
    uint8_t *p = ptr;
    memset(p, 0, bytes * c->rank);
    memset(p + bytes * (c->rank + 1), 0, all - bytes * (c->rank + 1));
    return ringd_allreduce_async(c, ptr, all, RINGD_U8, RINGD_SUM, h_p);
}

/* A blocking call would wait for what the open group holds back. */
static int cl_no_group(ringd_client_t *c, const char *what)
{
    if (c != NULL && c->group_open)
        return cl_fail(c, RINGD_ESTATE, "blocking %s inside a group: use "
                       "the _async call", what);
    return 0;
}

int ringd_allgather(ringd_client_t *c, void *ptr, size_t bytes)
{
    if (cl_no_group(c, "allgather") != 0)
        return RINGD_ESTATE;
    ringd_handle_t h;
    int rc = ringd_allgather_async(c, ptr, bytes, &h);
    return rc != 0 ? rc : ringd_wait(c, h);
}

/* A barrier is an allreduce of one byte of a buffer of the client's own,
 * allocated at the first one (a page, counted as one of its buffers). */
int ringd_barrier_async(ringd_client_t *c, ringd_handle_t *h_p)
{
    if (c == NULL || h_p == NULL)
        return RINGD_EINVAL;
    if (c->barrier_buf == NULL) {
        c->barrier_buf = ringd_buffer(c, 1);
        if (c->barrier_buf == NULL)
            return c->fd < 0 ? RINGD_EDISCONNECTED : RINGD_ENOMEM;
    }
    /* Outstanding barriers of the step each get a byte of their own. */
    uint32_t slot = c->coll_seq % 4096;
    return ringd_allreduce_async(c, c->barrier_buf + slot, 1, RINGD_U8,
                                 RINGD_MAX, h_p);
}

int ringd_barrier(ringd_client_t *c)
{
    if (cl_no_group(c, "barrier") != 0)
        return RINGD_ESTATE;
    ringd_handle_t h;
    int rc = ringd_barrier_async(c, &h);
    return rc != 0 ? rc : ringd_wait(c, h);
}

int ringd_allreduce(ringd_client_t *c, void *ptr, size_t count,
                    ringd_dtype_t dtype, ringd_op_t op)
{
    if (cl_no_group(c, "allreduce") != 0)
        return RINGD_ESTATE;
    ringd_handle_t h;
    int rc = ringd_allreduce_async(c, ptr, count, dtype, op, &h);
    return rc != 0 ? rc : ringd_wait(c, h);
}

int ringd_broadcast(ringd_client_t *c, void *ptr, size_t bytes,
                    uint32_t root)
{
    if (cl_no_group(c, "broadcast") != 0)
        return RINGD_ESTATE;
    ringd_handle_t h;
    int rc = ringd_broadcast_async(c, ptr, bytes, root, &h);
    return rc != 0 ? rc : ringd_wait(c, h);
}

int ringd_step_end(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    if (!c->in_step)
        return cl_fail(c, RINGD_ESTATE, "step_end without step_begin");
    if (c->npend > 0 || c->group_open)
        return cl_fail(c, RINGD_ESTATE, "step_end with %u collectives not "
                       "waited for%s", c->npend,
                       c->group_open ? " and a group open" : "");
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
