/*
 * conn.c - a client connection as the rest of the daemon uses it: its
 * replies, its mapped buffers (and the unmaps deferred while the backend
 * or a copy on the pool may still touch them), and its state's one
 * transition function.
 *
 * server.c accepts and reads connections and step.c drives their states;
 * both, and every file that answers a trainer, call down here, and this
 * file calls nothing of theirs: a state change is announced through
 * d->conn_changed (the step's stall timer re-arms on it).
 */
#include "daemon/dmn-int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "common/log.h"

int dmn__reply(dmn_conn_t *c, uint32_t type, uint32_t seq, const void *body,
               size_t len)
{
    char buf[PROTO_MAX_MSG];
    proto_hdr_t h = {PROTO_MAGIC, PROTO_VERSION,
                     (uint16_t)(type | PROTO_REPLY), (uint32_t)len, seq};
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), body, len);
    /* One request plus PROTO_MAX_OUTSTANDING collectives in flight per
     * client fit in the socket's buffer; if it fills up, the client is
     * not reading and the reply is lost. */
    if (send(c->fd, buf, sizeof(h) + len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
        RD_WARN("client %u (pid %d): send reply: %s", c->id, (int)c->pid,
                strerror(errno));
        return -errno;
    }
    return 0;
}

void dmn__reply_status(dmn_conn_t *c, uint32_t type, uint32_t seq,
                       int32_t status)
{
    /* The body size is fixed by the type; the status always comes first. */
    _Alignas(8) char body[PROTO_MAX_MSG] = {0};
    proto_status_rep_t r = {status, c->id};
    memcpy(body, &r, sizeof(r));
    (void)dmn__reply(c, type, seq, body, proto_rep_size(type));
}

void dmn__reply_error(dmn_conn_t *c, uint32_t seq, int32_t status,
                      const char *fmt, ...)
{
    proto_error_rep_t e = {status, 0, {0}};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.text, sizeof(e.text), fmt, ap);
    va_end(ap);
    (void)dmn__reply(c, PROTO_T_ERROR, seq, &e, sizeof(e));
}

void *dmn__buf_ptr(dmn_conn_t *c, uint32_t buf_id, uint64_t off,
                   uint64_t len)
{
    if (buf_id >= c->bufs_cap || c->bufs[buf_id].addr == NULL)
        return NULL;
    if (!proto_range_ok(off, len, c->bufs[buf_id].size))
        return NULL;
    return (char *)c->bufs[buf_id].addr + off;
}

static const char *conn_state_name(dmn_conn_state_t s)
{
    static const char *const names[] = {"new", "idle", "waiting", "active",
                                        "posted", "shutdown", "closed"};
    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

#define C_(x) (1u << DMN_CONN_##x)
/* The states each connection state may go to. */
static const unsigned conn_next_ok[] = {
    [DMN_CONN_NEW] = C_(IDLE) | C_(CLOSED),
    [DMN_CONN_IDLE] = C_(WAITING) | C_(SHUTDOWN) | C_(CLOSED),
    /* waiting -> idle: a begin the job cannot serve is refused. */
    [DMN_CONN_WAITING] = C_(ACTIVE) | C_(IDLE) | C_(SHUTDOWN) | C_(CLOSED),
    [DMN_CONN_ACTIVE] = C_(POSTED) | C_(IDLE) | C_(SHUTDOWN) | C_(CLOSED),
    [DMN_CONN_POSTED] = C_(ACTIVE) | C_(IDLE) | C_(CLOSED),
    [DMN_CONN_SHUTDOWN] = C_(CLOSED),
    [DMN_CONN_CLOSED] = 0,
};
#undef C_

void dmn__conn_set_state(dmn_conn_t *c, dmn_conn_state_t next)
{
    if (c->cstate == next)
        return;
    if (!(conn_next_ok[c->cstate] & (1u << next))) {
        RD_ERROR("client %u: %s -> %s refused", c->id,
                 conn_state_name(c->cstate), conn_state_name(next));
        return;
    }
    RD_DEBUG("client %u: %s -> %s", c->id, conn_state_name(c->cstate),
             conn_state_name(next));
    if (next == DMN_CONN_CLOSED) /* no longer a trainer here */
        c->flags &= ~(DMN_CONN_F_MEMBER | DMN_CONN_F_END_HELD);
    if (next == DMN_CONN_ACTIVE || next == DMN_CONN_IDLE)
        c->active_ms = dmn__now_ms(); /* the trainer's turn may begin */
    c->cstate = next;
    if (c->d->conn_changed != NULL)
        c->d->conn_changed(c->d);
}

/*
 * A trainer's buffer unmapped on a pool thread once it is large: tearing
 * down its page tables took up to 14 ms on the loop, and when the trainer
 * had already exited this mapping was the shared memory's last reference,
 * so munmap freed its pages there too (shmem_evict_inode, up to 12 ms a
 * 64 MiB buffer, perf sched in bench/e2e): the loop's lag, and a lease
 * keepalive as late. Nothing on the loop touches the range after the
 * call, and the kernel gives no part of it to another mmap before the
 * munmap ran, so the order does not matter. Smaller ones, or when the
 * pool refuses, unmap here.
 */
#define DMN_UNMAP_INLINE_MAX (1u << 20)

typedef struct {
    uv_work_t req;
    dmn_t *d;
    void *addr;
    size_t size;
} unmap_work_t;

static void unmap_work(uv_work_t *req)
{
    unmap_work_t *u = req->data;
    munmap(u->addr, u->size);
}

static void unmap_after(uv_work_t *req, int status)
{
    unmap_work_t *u = req->data;
    if (status != 0) /* cancelled (the loop's end): unmapped here */
        munmap(u->addr, u->size);
    else
        u->d->stats.unmap_pool_bytes += u->size;
    dmn__unref(u->d);
    free(u);
}

static void unmap_now(dmn_t *d, void *addr, size_t size)
{
    unmap_work_t *u = NULL;
    if (size >= DMN_UNMAP_INLINE_MAX && !(d->flags & DMN_F_DESTROYING) &&
        (u = malloc(sizeof(*u))) != NULL) {
        *u = (unmap_work_t){.d = d, .addr = addr, .size = size};
        u->req.data = u;
        if (uv_queue_work(d->loop, &u->req, unmap_work, unmap_after) == 0) {
            d->open_handles++; /* d outlives the after callback */
            return;
        }
        free(u);
    }
    munmap(addr, size);
    d->stats.unmap_loop_bytes += size;
}

void dmn__buf_unmap(dmn_t *d, void *addr, size_t size)
{
    dmn_maps_t *m = &d->maps;
    if (m->holds == 0) {
        unmap_now(d, addr, size);
        return;
    }
    if (m->n == m->cap) {
        uint32_t cap = m->cap ? 2 * m->cap : 4;
        struct dmn_unmap *p = realloc(m->deferred, cap * sizeof(*p));
        if (p == NULL) {
            /* Unmapping under the backend's thread could crash the
             * daemon: losing the address space is the lesser evil. */
            RD_WARN("no memory to defer an unmap: %zu bytes stay mapped",
                    size);
            return;
        }
        m->deferred = p;
        m->cap = cap;
    }
    m->deferred[m->n++] = (struct dmn_unmap){addr, size};
}

void dmn__maps_hold(dmn_t *d, unsigned who)
{
    d->maps.holds |= who;
}

int dmn__maps_held(const dmn_t *d, unsigned who)
{
    return (d->maps.holds & who) != 0;
}

void dmn__maps_release(dmn_t *d, unsigned who)
{
    dmn_maps_t *m = &d->maps;
    m->holds &= ~who;
    if (m->holds != 0)
        return;
    for (uint32_t i = 0; i < m->n; i++)
        unmap_now(d, m->deferred[i].addr, m->deferred[i].size);
    m->n = 0;
}

void dmn__maps_fini(dmn_t *d)
{
    dmn__maps_release(d, ~0u);
    free(d->maps.deferred);
    d->maps.deferred = NULL;
}
