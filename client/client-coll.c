/*
 * client-coll.c - libringd's collectives (client.c is the connection, the
 * buffers and the steps).
 *
 * Each collective is issued asynchronously under a handle in c->pend; the
 * blocking calls wait for their own handle. The reply is taken whenever
 * the client reads the socket, matched to its handle by seq. A group holds
 * its collectives back until ringd_group_end(), which sends them whole,
 * consecutive allreduces of one dtype and op as one fused run.
 */
#include "client/client-int.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static cl_pend_t *cl_find(ringd_client_t *c, ringd_handle_t h)
{
    for (uint32_t i = 0; h != 0 && i < RINGD_MAX_OUTSTANDING; i++)
        if (c->pend[i].h == h)
            return &c->pend[i];
    return NULL;
}

/*
 * A trainer that unmapped (munmap) a buffer of ours while a collective on
 * it was outstanding cannot see the result: the daemon wrote it into its
 * own mapping of the memfd, which stays intact. Say so instead of
 * reporting success (msync on a range with a hole fails with ENOMEM; with
 * MS_ASYNC it costs one walk of the mappings).
 */
static int cl_check_mapped(ringd_client_t *c, const proto_coll_req_t *r)
{
    if (r->buf_id >= c->nbufs || c->bufs[r->buf_id].addr == NULL)
        return 0;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)c->bufs[r->buf_id].addr + r->offset;
    uintptr_t start = a & ~(page - 1);
    size_t len = a + r->count * proto_dtype_size(r->dtype) - start;
    if (msync((void *)start, len, MS_ASYNC) == 0 || errno != ENOMEM)
        return 0;
    return cl__fail(c, RINGD_EINVAL, "buffer %u was unmapped while a "
                    "collective on it was outstanding: its result is lost "
                    "(ringd_buffer_free() it)", r->buf_id);
}

/* Its outcome; the handle is free again. */
static int cl_release_handle(ringd_client_t *c, cl_pend_t *p)
{
    int st = p->status;
    if (st == 0)
        st = cl_check_mapped(c, &p->req);
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
        return cl__fail(c, RINGD_EINVAL, "bad dtype or count");
    if (r->kind == PROTO_COLL_ALLREDUCE && r->op > RINGD_AVG)
        return cl__fail(c, RINGD_EINVAL, "bad reduction op %u", r->op);
    if (c->reshaped)
        return cl__fail(c, RINGD_ERESHAPE, "a collective of this step "
                        "failed with RINGD_ERESHAPE: redo the step");
    if (!c->in_step)
        return cl__fail(c, RINGD_ESTATE,
                        "collective outside a step: call ringd_step_begin()");
    if (c->npend == RINGD_MAX_OUTSTANDING)
        return cl__fail(c, RINGD_ELIMIT, "%d collectives not waited for: "
                        "ringd_wait() for some first", RINGD_MAX_OUTSTANDING);
    int rc = cl__locate(c, ptr, r->count * esz, &r->buf_id, &r->offset);
    if (rc != 0)
        return rc;
    if (c->fd < 0)
        return cl__lost(c, cl__fail(c, RINGD_EDISCONNECTED,
                                    "not connected to the daemon at %s",
                                    c->path));
    r->coll_seq = c->coll_seq++;
    cl_pend_t *p = c->pend;
    while (p->h != 0)
        p++;
    if (c->group_open) {
        /* Sent at ringd_group_end(), when the group is known whole. */
        c->group_slot[c->group_n++] = (uint16_t)(p - c->pend);
    } else {
        rc = cl__send(c, PROTO_T_COLL, r, sizeof(*r), -1);
        if (rc != 0)
            return cl__lost(c, rc);
    }
    if (++c->next_handle == 0)
        c->next_handle = 1;
    *p = (cl_pend_t){c->next_handle, c->seq, r->buf_id, 0, 0,
                     c->group_open, *r};
    c->npend++;
    *h_p = p->h;
    return c->group_open ? 0 : cl__lost(c, cl__take_ready(c));
}

int ringd_group_start(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    if (c->group_open)
        return cl__fail(c, RINGD_ESTATE, "a group is already open");
    if (c->reshaped)
        return cl__fail(c, RINGD_ERESHAPE, "a collective of this step "
                        "failed with RINGD_ERESHAPE: redo the step");
    if (!c->in_step)
        return cl__fail(c, RINGD_ESTATE,
                        "group outside a step: call ringd_step_begin()");
    c->group_open = 1;
    c->group_n = 0;
    return 0;
}

/* Consecutive allreduces of a group with the same dtype, op and wire
 * format are sent as one fused run: each but the last says the next one
 * joins it. */
static int cl_joins_next(const proto_coll_req_t *a, const cl_pend_t *next)
{
    return next != NULL && a->kind == PROTO_COLL_ALLREDUCE &&
           next->req.kind == PROTO_COLL_ALLREDUCE &&
           next->req.dtype == a->dtype && next->req.op == a->op &&
           next->req.wire == a->wire;
}

int ringd_group_end(ringd_client_t *c)
{
    if (c == NULL)
        return RINGD_EINVAL;
    if (!c->group_open)
        return cl__fail(c, RINGD_ESTATE, "no group is open");
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
        int rc = cl__send(c, PROTO_T_COLL, &r, sizeof(r), -1);
        if (rc != 0) /* every handle failed with the connection */
            return cl__lost(c, rc);
        p->seq = c->seq;
        p->held = 0;
    }
    return cl__lost(c, cl__take_ready(c));
}

int ringd_wait(ringd_client_t *c, ringd_handle_t h)
{
    if (c == NULL)
        return RINGD_EINVAL;
    cl_pend_t *p = cl_find(c, h);
    if (p == NULL)
        return cl__fail(c, RINGD_EINVAL, "handle %llu is not outstanding "
                        "(already waited for, or of a step left since)",
                        (unsigned long long)h);
    if (p->held)
        return cl__fail(c, RINGD_ESTATE, "handle %llu is in a group not yet "
                        "sent: ringd_group_end() first",
                        (unsigned long long)h);
    char buf[PROTO_MAX_MSG];
    size_t n;
    int timeout = c->opts.timeout_ms ? (int)c->opts.timeout_ms : -1;
    while (!p->done) {
        if (c->fd < 0) {
            /* cl__drop failed every handle; this only guards the loop. */
            p->done = 1;
            p->status = RINGD_EDISCONNECTED;
            break;
        }
        int rc = cl__read(c, timeout, buf, &n);
        if (rc == 0)
            rc = cl__take(c, buf);
        if (rc == 0)
            rc = cl__fail(c, RINGD_EPROTO, "reply out of sequence");
        if (rc < 0) {
            /* Dropped (if not yet): a late reply would come unexpected,
             * and every handle fails; this one with the cause. */
            if (c->fd >= 0)
                cl__drop(c);
            p->status = rc;
        }
    }
    int outcome = p->status;
    int st = cl_release_handle(c, p);
    if (st == RINGD_EDISCONNECTED)
        return cl__lost(c, st); /* a new daemon: ERESHAPE, if waited for */
    if (outcome != 0)
        cl__fail(c, st, "collective: %s", ringd_strerror(st));
    return st;
}

int ringd_test(ringd_client_t *c, ringd_handle_t h, int *done_p)
{
    if (c == NULL || done_p == NULL)
        return RINGD_EINVAL;
    cl_pend_t *p = cl_find(c, h);
    *done_p = 1;
    if (p == NULL)
        return cl__fail(c, RINGD_EINVAL, "handle %llu is not outstanding",
                        (unsigned long long)h);
    if (p->held) {
        *done_p = 0;
        return cl__fail(c, RINGD_ESTATE, "handle %llu is in a group not "
                        "yet sent", (unsigned long long)h);
    }
    (void)cl__take_ready(c); /* a failure marks the handles done */
    if (!p->done) {
        *done_p = 0;
        return 0;
    }
    return cl__lost(c, cl_release_handle(c, p));
}

int ringd_allreduce_wire_async(ringd_client_t *c, void *ptr, size_t count,
                               ringd_dtype_t dtype, ringd_op_t op,
                               ringd_wire_t wire, ringd_handle_t *h_p)
{
    if (c == NULL || ptr == NULL || h_p == NULL)
        return RINGD_EINVAL;
    if ((unsigned)wire > RINGD_WIRE_F16)
        return cl__fail(c, RINGD_EINVAL, "bad wire format %d", (int)wire);
    if (wire > RINGD_WIRE_NONE && dtype != RINGD_F32)
        return cl__fail(c, RINGD_EINVAL, "wire compression is for f32 "
                        "allreduces only");
    proto_coll_req_t r = {.kind = PROTO_COLL_ALLREDUCE,
                          .dtype = (uint32_t)dtype, .count = count,
                          .op = (uint32_t)op, .wire = (uint32_t)wire};
    return cl_issue(c, &r, ptr, h_p);
}

int ringd_allreduce_async(ringd_client_t *c, void *ptr, size_t count,
                          ringd_dtype_t dtype, ringd_op_t op,
                          ringd_handle_t *h_p)
{
    return ringd_allreduce_wire_async(c, ptr, count, dtype, op,
                                      RINGD_WIRE_DEFAULT, h_p);
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
        return cl__fail(c, c->reshaped ? RINGD_ERESHAPE : RINGD_ESTATE,
                        "allgather outside a step");
    if (bytes > PROTO_MAX_BUF_BYTES / c->world)
        return cl__fail(c, RINGD_EINVAL, "allgather of %zu bytes x %u "
                        "trainers is too large", bytes, c->world);
    size_t all = bytes * c->world;
    uint32_t id;
    uint64_t off;
    int rc = cl__locate(c, ptr, all, &id, &off);
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
        return cl__fail(c, RINGD_ESTATE, "blocking %s inside a group: use "
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

int ringd_allreduce_wire(ringd_client_t *c, void *ptr, size_t count,
                         ringd_dtype_t dtype, ringd_op_t op,
                         ringd_wire_t wire)
{
    if (cl_no_group(c, "allreduce") != 0)
        return RINGD_ESTATE;
    ringd_handle_t h;
    int rc = ringd_allreduce_wire_async(c, ptr, count, dtype, op, wire, &h);
    return rc != 0 ? rc : ringd_wait(c, h);
}
