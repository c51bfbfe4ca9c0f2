/*
 * server.c - the local API server: a SOCK_SEQPACKET listener and one
 * connection per client, all on uv_poll (libuv has no seqpacket streams, so
 * we recvmsg/sendmsg ourselves). Every message is validated here before
 * step.c sees it; a malformed one gets a PROTO_T_ERROR reply and a log line,
 * and the connection keeps being served unless the peer cannot be trusted
 * to stay in sync (version mismatch, oversized datagram).
 */
#include "daemon/dmn-int.h"
#include "daemon/dmn-parse.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <grp.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"

static void conn_close(dmn_conn_t *c);

/* Log and answer a message that failed validation. */
static void bad_msg(dmn_conn_t *c, uint32_t seq, int32_t status,
                    const char *why)
{
    c->d->stats.proto_errors++;
    RD_WARN("client %u (pid %d): rejected message: %s", c->id, (int)c->pid,
            why);
    dmn__reply_error(c, seq, status, "%s", why);
}

static void on_hello(dmn_conn_t *c, uint32_t seq, const proto_hello_t *h)
{
    dmn__conn_set_state(c, DMN_CONN_IDLE);
    memcpy(c->name, h->name, sizeof(c->name));
    c->name[sizeof(c->name) - 1] = '\0';
    /* c->pid is the kernel's; the HELLO's pid is only the client's say. */
    if ((pid_t)h->pid != c->pid)
        RD_WARN("client %u (pid %d) claims pid %u in its HELLO", c->id,
                (int)c->pid, h->pid);
    RD_INFO("client %u connected (pid %d, uid %u%s%s)", c->id, (int)c->pid,
            (unsigned)c->uid, c->name[0] ? ", " : "", c->name);
    dmn__reply_status(c, PROTO_T_HELLO, seq, 0);
}

/* Make room for buffer id `id`: the table doubles, up to
 * PROTO_MAX_BUFFERS slots. 0 or -1 (out of memory). */
static int bufs_reserve(dmn_conn_t *c, uint32_t id)
{
    if (id < c->bufs_cap)
        return 0;
    uint32_t cap = c->bufs_cap ? c->bufs_cap : 16;
    while (cap <= id)
        cap *= 2;
    if (cap > PROTO_MAX_BUFFERS)
        cap = PROTO_MAX_BUFFERS;
    dmn_buf_t *b = realloc(c->bufs, cap * sizeof(*b));
    if (b == NULL) {
        RD_WARN("client %u: buffer table of %u slots: out of memory", c->id,
                cap);
        return -1;
    }
    memset(b + c->bufs_cap, 0, (cap - c->bufs_cap) * sizeof(*b));
    c->bufs = b;
    c->bufs_cap = cap;
    return 0;
}

/* Why this client may not map `size` more bytes, or NULL. */
static const char *over_limit(const dmn_conn_t *c, uint64_t size)
{
    const dmn_config_t *cfg = c->d->cfg;
    uint64_t max_bytes = (uint64_t)cfg->max_client_mib << 20;
    if (c->nmapped >= cfg->max_client_buffers)
        return "client buffer limit: too many buffers mapped "
               "(--max-client-buffers)";
    if (size > max_bytes || c->mapped_bytes > max_bytes - size)
        return "client buffer limit: too many bytes mapped "
               "(--max-client-mib)";
    return NULL;
}

/* Map the memfd a client passed; takes ownership of fd. The message's
 * fields were checked by dmn__msg_check; the descriptor is checked here. */
static void on_buf_add(dmn_conn_t *c, uint32_t seq,
                       const proto_buf_add_t *b, int fd)
{
    const char *why = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
             (uint64_t)st.st_size < b->size)
        why = "descriptor is not a memfd of the announced size";
    else if (!(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) ||
             fcntl(fd, F_GET_SEALS) < 0)
        /* Unsealed, the client could shrink it under us: SIGBUS. */
        why = "memfd not sealed against shrinking (F_SEAL_SHRINK)";
    if (why != NULL) {
        bad_msg(c, seq, RINGD_EINVAL, why);
        goto out;
    }
    /* Not a malformed message: a client that uses much memory. */
    why = over_limit(c, b->size);
    if (why != NULL) {
        RD_WARN("client %u (pid %d): %s: %u buffers, %llu bytes mapped",
                c->id, (int)c->pid, why, c->nmapped,
                (unsigned long long)c->mapped_bytes);
        dmn__reply_error(c, seq, RINGD_ENOMEM, "%s", why);
        goto out;
    }
    if (bufs_reserve(c, b->buf_id) != 0) {
        dmn__reply_error(c, seq, RINGD_ENOMEM, "daemon out of memory");
        goto out;
    }
    void *addr = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      0);
    if (addr == MAP_FAILED) {
        RD_WARN("client %u: mmap %llu bytes: %s", c->id,
                (unsigned long long)b->size, strerror(errno));
        dmn__reply_error(c, seq, RINGD_ENOMEM, "daemon cannot map buffer");
        goto out;
    }
    c->bufs[b->buf_id] = (dmn_buf_t){addr, b->size};
    c->nmapped++;
    c->mapped_bytes += b->size;
    dmn__reply_status(c, PROTO_T_BUF_ADD, seq, 0);
out:
    if (fd >= 0)
        close(fd);
}

/*
 * Unmap a buffer. Only what nothing of the daemon still points into: a
 * posted collective is read and written by the step machine and the ring
 * thread until its reply, the state region by checkpoints and joiners.
 */
static void on_buf_free(dmn_conn_t *c, uint32_t seq,
                        const proto_buf_free_t *f)
{
    uint32_t id = f->buf_id;
    if (id >= c->bufs_cap || c->bufs[id].addr == NULL) {
        bad_msg(c, seq, RINGD_EINVAL, "BUF_FREE of an unknown buffer id");
        return;
    }
    for (uint32_t i = 0; i < c->q_len; i++) {
        if (dmn__conn_q(c, i)->req.buf_id == id) {
            bad_msg(c, seq, RINGD_ESTATE,
                    "BUF_FREE of a buffer with a collective outstanding");
            return;
        }
    }
    if ((c->flags & DMN_CONN_F_HAS_STATE) && c->state.buf_id == id) {
        bad_msg(c, seq, RINGD_ESTATE,
                "BUF_FREE of the buffer holding the state region");
        return;
    }
    /* A collective this client left (to redo the step) may still be in
     * the backend's hands. */
    dmn__buf_unmap(c->d, c->bufs[id].addr, c->bufs[id].size);
    c->nmapped--;
    c->mapped_bytes -= c->bufs[id].size;
    c->bufs[id] = (dmn_buf_t){NULL, 0};
    dmn__reply_status(c, PROTO_T_BUF_FREE, seq, 0);
}

static void on_state_set(dmn_conn_t *c, uint32_t seq,
                         const proto_state_set_t *s)
{
    c->state = *s;
    c->flags |= DMN_CONN_F_HAS_STATE;
    dmn__reply_status(c, PROTO_T_STATE_SET, seq, 0);
}

static void on_status(dmn_conn_t *c, uint32_t seq)
{
    dmn_t *d = c->d;
    proto_info_rep_t r = {0};
    r.pid = (uint32_t)getpid();
    r.trainers = dmn__trainer_count(d);
    r.node_rank = d->view.node_rank;
    r.node_count = d->view.node_count;
    r.world = d->view.global_trainers;
    r.generation = d->view.generation;
    r.step = d->step;
    r.collectives = d->stats.collectives;
    r.bytes = d->stats.coll_bytes;
    r.uptime_ms = dmn__now_ms() - d->start_ms;
    snprintf(r.backend, sizeof(r.backend), "%s", job_name(d->job));
    snprintf(r.node_id, sizeof(r.node_id), "%s", d->cfg->node_id);
    snprintf(r.state, sizeof(r.state), "%s",
             dmn__step_state_name(d->state));
    (void)dmn__reply(c, PROTO_T_STATUS, seq, &r, sizeof(r));
}

static void dispatch(dmn_conn_t *c, const proto_hdr_t *h, const char *body,
                     int fd)
{
    switch (h->type) {
    case PROTO_T_HELLO: on_hello(c, h->seq, (const void *)body); break;
    case PROTO_T_BUF_ADD:
        on_buf_add(c, h->seq, (const void *)body, fd);
        return;
    case PROTO_T_STATE_SET:
        on_state_set(c, h->seq, (const void *)body);
        break;
    case PROTO_T_STEP_BEGIN:
        if (dmn__job_may_step(c, h->seq) == 0)
            dmn__step_begin(c->d, c, h->seq);
        break;
    case PROTO_T_COLL:
        dmn__step_coll(c->d, c, h->seq, (const void *)body);
        break;
    case PROTO_T_STEP_END: dmn__step_end(c->d, c, h->seq); break;
    case PROTO_T_CKPT: dmn__ckpt_request(c->d, c, h->seq); break;
    case PROTO_T_STATUS: on_status(c, h->seq); break;
    case PROTO_T_BYE: c->flags |= DMN_CONN_F_BYE; break;
    case PROTO_T_BUF_FREE: on_buf_free(c, h->seq, (const void *)body); break;
    case PROTO_T_JOB: dmn__job_named(c, h->seq, (const void *)body); break;
    default: bad_msg(c, h->seq, RINGD_EPROTO, "unknown type"); break;
    }
    if (fd >= 0)
        close(fd);
}

/* Receive one datagram; returns 0, 1 (peer gone) or -1 (drop peer). */
static uint64_t conn_buf_size(const void *conn, uint32_t buf_id)
{
    const dmn_conn_t *c = conn;
    return buf_id < c->bufs_cap && c->bufs[buf_id].addr != NULL
               ? c->bufs[buf_id].size : 0;
}

static int conn_read(dmn_conn_t *c)
{
    _Alignas(8) char buf[PROTO_MAX_MSG];
    char cbuf[CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {buf, sizeof(buf)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    if (n <= 0)
        return 1;
    /* Collect passed descriptors: at most one is ever legitimate. */
    int fd = -1, nfds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm != NULL;
         cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (nfds++ == 0)
                fd = f;
            else
                close(f);
        }
    }
    dmn_msg_ctx_t ctx = {c->cstate != DMN_CONN_NEW,
                         c->cstate == DMN_CONN_WAITING, c->q_len,
                         conn_buf_size, c};
    dmn_msg_t m;
    int rc = dmn__msg_check(&ctx, buf, (size_t)n,
                            (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0,
                            nfds, &m);
    if (rc != 0) {
        if (fd >= 0)
            close(fd);
        bad_msg(c, m.seq, rc, m.why);
        return m.close ? -1 : 0;
    }
    dispatch(c, &m.hdr, buf + sizeof(m.hdr), fd);
    return 0;
}

static void on_conn_io(uv_poll_t *p, int status, int events)
{
    dmn_conn_t *c = p->data;
    int rc = 1;
    if (status == 0 && (events & UV_READABLE))
        rc = conn_read(c);
    else if (status == 0 && !(events & UV_DISCONNECT))
        rc = 0;
    if (rc != 0)
        conn_close(c);
}

static void conn_freed(uv_handle_t *h)
{
    dmn_conn_t *c = h->data;
    dmn_t *d = c->d;
    if (--c->polls_open > 0)
        return;
    if (c->pidfd >= 0)
        close(c->pidfd);
    for (uint32_t i = 0; i < c->bufs_cap; i++)
        if (c->bufs[i].addr != NULL)
            dmn__buf_unmap(d, c->bufs[i].addr, c->bufs[i].size);
    free(c->bufs);
    close(c->fd);
    free(c);
    dmn__unref(d); /* conn_close's reference */
}

/* Unlink from the list, tell the step machine, free after uv_close. */
static void conn_close(dmn_conn_t *c)
{
    dmn_t *d = c->d;
    for (dmn_conn_t **pp = &d->conns; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            d->nconns--;
            break;
        }
    }
    dmn__step_conn_lost(d, c);
    dmn__job_conn_gone(d, c);
    uv_poll_stop(&c->poll);
    /* conn_freed unmaps through d: d lives until it ran (dmn_destroy
     * closes its timers in the same loop turn). */
    d->open_handles++;
    c->polls_open = 1;
    if (c->pidfd >= 0) {
        c->polls_open++;
        uv_close((uv_handle_t *)&c->exit_poll, conn_freed);
    }
    uv_close((uv_handle_t *)&c->poll, conn_freed);
}

/* The peer process exited: its connection is over even if a child of it
 * still holds the socket. What it sent before (a BYE: a clean leave, not
 * a loss) is read first (a bounded number: a child that keeps sending
 * gets no more), and an EOF among it closes the usual way: the exit and
 * the socket's close come in one loop turn, in either order. */
static void on_peer_exit(uv_poll_t *p, int status, int events)
{
    dmn_conn_t *c = p->data;
    (void)status;
    (void)events;
    struct pollfd pf = {.fd = c->fd, .events = POLLIN};
    for (int n = 0; n < 64 && poll(&pf, 1, 0) == 1; n++) {
        if (conn_read(c) != 0) {
            conn_close(c);
            return;
        }
    }
    RD_WARN("client %u (pid %d) exited while a process it forked still "
            "holds its connection open: closing it", c->id, (int)c->pid);
    conn_close(c);
}

static void watch_exit(dmn_t *d, dmn_conn_t *c)
{
    c->pidfd = -1;
#ifdef SYS_pidfd_open
    if (c->pid <= 0)
        return;         /* the peer is outside our pid namespace */
    int fd = (int)syscall(SYS_pidfd_open, c->pid, 0);
    if (fd < 0)
        return;         /* old kernel, or seccomp: EOF alone, as before */
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (uv_poll_init(d->loop, &c->exit_poll, fd) != 0) {
        close(fd);
        return;
    }
    c->pidfd = fd;
    c->exit_poll.data = c;
    uv_poll_start(&c->exit_poll, UV_READABLE, on_peer_exit);
#else
    (void)d;
#endif
}

static void on_accept(uv_poll_t *p, int status, int events);

static void on_accept_resume(uv_timer_t *t)
{
    dmn_t *d = t->data;
    if (d->flags & DMN_F_LISTENING)
        uv_poll_start(&d->srv.listen_poll, UV_READABLE, on_accept);
}

/*
 * accept() failed for want of a resource (descriptors, memory). The
 * pending connection stays readable, so polling on would spin a core and
 * log each try: stop polling, try again after a backoff that doubles up
 * to 1 s and resets after a success, and log the first failure and then
 * at most one summary every 10 s. The trainers already connected are
 * served meanwhile.
 */
static void accept_backoff(dmn_t *d, int err)
{
    uint64_t now = dmn__now_ms();
    uint32_t ms = d->srv.accept_backoff_ms * 2;
    d->srv.accept_backoff_ms = ms < 10 ? 10 : ms > 1000 ? 1000 : ms;
    d->srv.accept_failures++;
    if (d->srv.accept_log_ms == 0 || now - d->srv.accept_log_ms >= 10000) {
        RD_WARN("accept: %s (%u clients connected, %llu failures so far); "
                "not accepting for %u ms", strerror(err), d->nconns,
                (unsigned long long)d->srv.accept_failures,
                d->srv.accept_backoff_ms);
        d->srv.accept_log_ms = now;
    }
    uv_poll_stop(&d->srv.listen_poll);
    uv_timer_start(&d->srv.accept_timer, on_accept_resume, d->srv.accept_backoff_ms,
                   0);
}

/*
 * Descriptors kept for the daemon's own work (etcd, UCX endpoints,
 * checkpoint files, the trainers' buffers, the log): local clients past
 * RLIMIT_NOFILE less these are refused like those past max-clients, so a
 * flood of connections runs into the cap, not into EMFILE for the
 * checkpoint writer or a new etcd connection.
 */
#define DMN_FD_RESERVE 64

static uint32_t client_cap(const dmn_t *d)
{
    uint32_t cap = d->cfg->max_clients;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return cap;
    rlim_t left = rl.rlim_cur > 2 * DMN_FD_RESERVE
                      ? rl.rlim_cur - DMN_FD_RESERVE
                      : rl.rlim_cur / 2;
    rlim_t room = left / 2; /* a client holds two: its socket, a pidfd */
    if (room < cap) {
        RD_WARN("serving at most %u local clients, not max-clients %u: "
                "ulimit -n is %llu, %llu descriptors stay for etcd, UCX "
                "and checkpoints, and each client takes 2", (unsigned)room,
                (unsigned)cap, (unsigned long long)rl.rlim_cur,
                (unsigned long long)(rl.rlim_cur - left));
        cap = (uint32_t)room;
    }
    return cap;
}

/* At the cap a new connection is closed at once (the client sees the
 * socket close), logged at most once every 10 s. */
static void refuse_over_cap(dmn_t *d, int fd)
{
    uint64_t now = dmn__now_ms();
    d->srv.refused_over_cap++;
    if (d->srv.cap_log_ms == 0 || now - d->srv.cap_log_ms >= 10000) {
        RD_WARN("refusing a client: %u connected, the limit (max-clients "
                "or ulimit -n; %llu refused so far)", d->nconns,
                (unsigned long long)d->srv.refused_over_cap);
        d->srv.cap_log_ms = now;
    }
    close(fd);
}

/* Is gid among the peer's groups (SO_PEERGROUPS: the kernel's list of
 * the peer's supplementary groups at connect time)? */
static int peer_in_group(int fd, gid_t gid)
{
    gid_t groups[256];
    socklen_t len = sizeof(groups);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0)
        return 0; /* ERANGE: over 256 groups; refuse rather than guess */
    for (size_t i = 0; i < len / sizeof(gid_t); i++)
        if (groups[i] == gid)
            return 1;
    return 0;
}

/*
 * Whoever may connect: root, ringd's own user, and members of the
 * socket's group (primary or supplementary), judged on the credentials
 * the kernel recorded at connect(), which the peer cannot forge. The
 * socket's mode already keeps others out of the path; this holds even
 * when the mode is looser, or the socket was reached some other way.
 * Returns 1 to serve, 0 when refused (logged, rate-limited).
 */
static int peer_allowed(dmn_t *d, int fd, struct ucred *cr)
{
    socklen_t len = sizeof(*cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cr, &len) != 0) {
        RD_WARN("refused a local connection: SO_PEERCRED: %s",
                strerror(errno));
        return 0;
    }
    gid_t g = (gid_t)d->cfg->socket_gid;
    if (cr->uid == 0 || cr->uid == geteuid() || cr->gid == g ||
        peer_in_group(fd, g))
        return 1;
    d->srv.refused_peers++;
    uint64_t now = uv_now(d->loop);
    if (d->srv.peer_log_ms == 0 || now - d->srv.peer_log_ms >= 10000) {
        const struct group *gr = getgrgid(g);
        RD_WARN("refused a local connection from pid %d uid %u gid %u: "
                "not root, not ringd's uid %u, not in the socket group %s "
                "(%u) (%llu refused so far)", (int)cr->pid,
                (unsigned)cr->uid, (unsigned)cr->gid, (unsigned)geteuid(),
                gr != NULL ? gr->gr_name : "?", (unsigned)g,
                (unsigned long long)d->srv.refused_peers);
        d->srv.peer_log_ms = now;
    }
    return 0;
}

static void on_accept(uv_poll_t *p, int status, int events)
{
    dmn_t *d = p->data;
    (void)events;
    if (status != 0)
        return;
    int fd = accept4(d->srv.listen_fd, NULL, NULL,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
            errno == ENOMEM)
            accept_backoff(d, errno);
        else if (errno != EAGAIN && errno != EINTR &&
                 errno != ECONNABORTED)
            RD_WARN("accept: %s", strerror(errno));
        return;
    }
    d->srv.accept_backoff_ms = 0;
    struct ucred cr;
    if (!peer_allowed(d, fd, &cr)) {
        close(fd);
        return;
    }
    if (d->nconns >= d->srv.conn_cap) {
        refuse_over_cap(d, fd);
        return;
    }
    dmn_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL || uv_poll_init(d->loop, &c->poll, fd) != 0) {
        RD_ERROR("cannot serve a new client: out of memory");
        free(c);
        close(fd);
        return;
    }
    c->d = d;
    c->fd = fd;
    c->pid = cr.pid;
    c->uid = cr.uid;
    c->id = ++d->srv.next_conn_id;
    RD_INFO("client %u accepted (pid %d, uid %u)", c->id, (int)c->pid,
            (unsigned)c->uid);
    c->poll.data = c;
    dmn_conn_t **tail = &d->conns;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = c;
    d->nconns++;
    uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, on_conn_io);
    watch_exit(d, c);
}

/*
 * Refuse to take over a socket a live daemon listens on; remove a stale
 * one left by a crash. Only a socket nobody accepts on is ever removed:
 * whatever else is at the path (a user's file, a directory, a link) is
 * an error, never deleted.
 */
static int claim_path(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        RD_ERROR("cannot use socket path %s: %s", path, strerror(errno));
        return ST_ECONFIG;
    }
    if (!S_ISSOCK(st.st_mode)) {
        RD_ERROR("%s exists and is not a socket: refusing to replace it "
                 "(remove it or choose another --socket)", path);
        return ST_ECONFIG;
    }
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    int live = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    int err = errno;
    close(fd);
    if (live) {
        RD_ERROR("another ringd already listens on %s", path);
        return ST_ECONFIG;
    }
    if (err != ECONNREFUSED) {
        RD_ERROR("cannot tell whether %s is in use: %s", path,
                 strerror(err));
        return ST_ECONFIG;
    }
    RD_INFO("removing the stale socket %s (nobody accepts on it)", path);
    (void)unlink(path);
    return 0;
}

void dmn__server_init(dmn_t *d)
{
    d->srv.listen_fd = -1;
}

int dmn__server_start(dmn_t *d)
{
    const char *path = d->cfg->socket_path;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(a.sun_path)) {
        RD_ERROR("socket path too long: %s", path);
        return ST_ECONFIG;
    }
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    int rc = claim_path(path);
    if (rc != 0)
        return rc;
    d->srv.listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK |
                                       SOCK_CLOEXEC, 0);
    if (d->srv.listen_fd < 0 ||
        bind(d->srv.listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        rc = -errno;
        RD_ERROR("cannot listen on %s: %s", path, strerror(errno));
        goto err_close;
    }
    /* Group and mode before listen(): until then a connect() is refused,
     * so nobody gets in under the umask's looser bits. */
    if (chown(path, (uid_t)-1, (gid_t)d->cfg->socket_gid) != 0 ||
        chmod(path, (mode_t)d->cfg->socket_mode_bits) != 0) {
        rc = -errno;
        RD_ERROR("cannot set group %u and mode %04o on %s: %s",
                 (unsigned)d->cfg->socket_gid,
                 (unsigned)d->cfg->socket_mode_bits, path, strerror(errno));
        goto err_unlink;
    }
    if (listen(d->srv.listen_fd, 64) != 0) {
        rc = -errno;
        RD_ERROR("cannot listen on %s: %s", path, strerror(errno));
        goto err_unlink;
    }
    d->srv.conn_cap = client_cap(d);
    rc = uv_poll_init(d->loop, &d->srv.listen_poll, d->srv.listen_fd);
    if (rc != 0)
        goto err_unlink;
    d->srv.listen_poll.data = d;
    uv_timer_init(d->loop, &d->srv.accept_timer);
    d->srv.accept_timer.data = d;
    d->flags |= DMN_F_LISTENING;
    uv_poll_start(&d->srv.listen_poll, UV_READABLE, on_accept);
    RD_INFO("listening on %s (group %u, mode %04o)", path,
            (unsigned)d->cfg->socket_gid, (unsigned)d->cfg->socket_mode_bits);
    return 0;

err_unlink:
    unlink(path);
err_close:
    if (d->srv.listen_fd >= 0)
        close(d->srv.listen_fd);
    d->srv.listen_fd = -1;
    return rc;
}

void dmn__server_stop(dmn_t *d)
{
    /* We close these ourselves: not trainers lost. */
    for (dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        c->flags |= DMN_CONN_F_BYE;
    while (d->conns != NULL)
        conn_close(d->conns);
    if (d->flags & DMN_F_LISTENING) {
        d->flags &= ~DMN_F_LISTENING;
        unlink(d->cfg->socket_path);
        d->open_handles += 2;
        uv_close((uv_handle_t *)&d->srv.accept_timer, dmn__handle_closed);
        uv_close((uv_handle_t *)&d->srv.listen_poll, dmn__handle_closed);
        close(d->srv.listen_fd);
        d->srv.listen_fd = -1;
    }
}
