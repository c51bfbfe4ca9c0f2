/*
 * client-conn.c - libringd's connection to its daemon: open (HELLO and the
 * buffers registered again), one request, its reply, the replies of
 * asynchronous collectives taken as they come, and the record of a
 * failure. The lowest file of the client: it calls none of the others
 * (the wait for a restarted daemon, client-wait.c, sits above it).
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

/* Record the detailed message of a failure; returns rc. */
int cl__fail(ringd_client_t *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
    return rc;
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

int cl__register_buf(ringd_client_t *c, uint32_t id)
{
    proto_buf_add_t b = {id, 0, c->bufs[id].size};
    proto_status_rep_t rep;
    return cl__call(c, PROTO_T_BUF_ADD, &b, sizeof(b), c->bufs[id].fd, &rep,
                    sizeof(rep));
}

/* The job this trainer names, said again at every reconnect: a daemon
 * restarted (or one that left the job) learns it anew. */
static int cl_name_job(ringd_client_t *c)
{
    proto_job_t j;
    memset(&j, 0, sizeof(j));
    memcpy(j.name, c->job, sizeof(j.name));
    proto_status_rep_t rep;
    return cl__call(c, PROTO_T_JOB, &j, sizeof(j), -1, &rep, sizeof(rep));
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
    if (rc == 0 && c->job[0] != '\0')
        rc = cl_name_job(c);
    for (uint32_t i = 0; rc == 0 && i < c->nbufs; i++)
        if (c->bufs[i].addr != NULL)
            rc = cl__register_buf(c, i);
    if (rc == 0 && c->has_state)
        rc = cl__call(c, PROTO_T_STATE_SET, &c->state, sizeof(c->state), -1,
                      &rep, sizeof(rep));
    if (rc != 0) {
        cl__drop(c);
        return rc;
    }
    return 0;
}
