/*
 * msg.c - validation of the requests clients send (proto/proto.h), kept
 * apart from server.c so that it is a pure function of the bytes and the
 * connection's state: the fuzz harness drives this very code.
 */
#include "daemon/dmn-parse.h"

#include <string.h>

static int reject(dmn_msg_t *m, int status, const char *why)
{
    m->why = why;
    return status;
}

static int check_hello(const dmn_msg_ctx_t *ctx, const proto_hello_t *h,
                       dmn_msg_t *m)
{
    if (ctx->hello)
        return reject(m, RINGD_ESTATE, "second HELLO");
    if (h->api_version != RINGD_API_VERSION)
        return reject(m, RINGD_EVERSION, "client API version differs");
    return 0;
}

/* The name is hostile: checked within its array, NUL included. */
static int check_job(const proto_job_t *j, dmn_msg_t *m)
{
    if (!proto_job_name_ok(j->name, sizeof(j->name)))
        return reject(m, RINGD_EINVAL, "job name: want 1..64 characters of "
                      "[A-Za-z0-9_.-], not starting with '.'");
    return 0;
}

static int check_buf_add(const dmn_msg_ctx_t *ctx, const proto_buf_add_t *b,
                         int nfds, dmn_msg_t *m)
{
    if (nfds == 0)
        return reject(m, RINGD_EINVAL, "BUF_ADD without a file descriptor");
    if (b->buf_id >= PROTO_MAX_BUFFERS)
        return reject(m, RINGD_EINVAL, "buffer id out of range");
    if (ctx->buf_size(ctx->conn, b->buf_id) != 0)
        return reject(m, RINGD_EINVAL, "buffer id already in use");
    if (b->size == 0 || b->size > PROTO_MAX_BUF_BYTES)
        return reject(m, RINGD_EINVAL, "buffer size out of range");
    return 0;
}

/* [off, off+len) inside a registered buffer. */
static int region_ok(const dmn_msg_ctx_t *ctx, uint32_t buf_id,
                     uint64_t off, uint64_t len)
{
    uint64_t size = buf_id < PROTO_MAX_BUFFERS
                        ? ctx->buf_size(ctx->conn, buf_id) : 0;
    return size != 0 && proto_range_ok(off, len, size);
}

static int check_state_set(const dmn_msg_ctx_t *ctx,
                           const proto_state_set_t *s, dmn_msg_t *m)
{
    if (s->bytes == 0 || !region_ok(ctx, s->buf_id, s->offset, s->bytes))
        return reject(m, RINGD_EINVAL,
                      "state region outside the client's buffers");
    return 0;
}

static int check_coll(const dmn_msg_ctx_t *ctx, const proto_coll_req_t *r,
                      dmn_msg_t *m)
{
    const char *why = NULL;
    if (proto_check_coll(r, &why) != 0)
        return reject(m, RINGD_EPROTO, why);
    /* count * size cannot overflow: proto_check_coll bounded count. */
    uint64_t len = r->count * proto_dtype_size(r->dtype);
    if (r->buf_id >= PROTO_MAX_BUFFERS ||
        ctx->buf_size(ctx->conn, r->buf_id) == 0)
        return reject(m, RINGD_EINVAL, "unknown buffer id");
    if (!region_ok(ctx, r->buf_id, r->offset, len))
        return reject(m, RINGD_EINVAL, "offset/count outside the buffer");
    return 0;
}

/* The body is copied into an aligned buffer: the datagram need not be. */
static int check_body(const dmn_msg_ctx_t *ctx, const dmn_msg_t *m,
                      const char *body, int nfds, dmn_msg_t *out)
{
    _Alignas(8) char b[PROTO_MAX_MSG];
    memcpy(b, body, m->hdr.length);
    switch (m->hdr.type) {
    case PROTO_T_HELLO: return check_hello(ctx, (const void *)b, out);
    case PROTO_T_BUF_ADD:
        return check_buf_add(ctx, (const void *)b, nfds, out);
    case PROTO_T_STATE_SET:
        return check_state_set(ctx, (const void *)b, out);
    case PROTO_T_COLL: return check_coll(ctx, (const void *)b, out);
    case PROTO_T_JOB: return check_job((const void *)b, out);
    default: return 0;
    }
}

int dmn__msg_check(const dmn_msg_ctx_t *ctx, const void *buf, size_t n,
                   int truncated, int nfds, dmn_msg_t *m)
{
    memset(m, 0, sizeof(*m));
    memcpy(&m->hdr, buf, n < sizeof(m->hdr) ? n : sizeof(m->hdr));
    m->seq = n >= sizeof(m->hdr) ? m->hdr.seq : 0;
    if (truncated || nfds > 1)
        return reject(m, RINGD_EPROTO, "oversized message or extra fds");
    int rc = proto_check_hdr(&m->hdr, n, 0, &m->why);
    if (rc != 0) {
        /* Another version cannot be served: close once it is told. */
        m->close = rc == RINGD_EVERSION;
        return rc;
    }
    uint32_t type = m->hdr.type;
    if (type != PROTO_T_HELLO && !ctx->hello)
        return reject(m, RINGD_ESTATE, "request before HELLO");
    /* BYE and BUF_FREE never wait, so they may come while a request is
     * pending (the daemon refuses to free what that request uses). */
    if (type != PROTO_T_BYE && type != PROTO_T_BUF_FREE && ctx->pending)
        return reject(m, RINGD_ESTATE, "new request while one is pending");
    /* Collectives are asynchronous: more may follow, up to the bound,
     * and so may anything but the end of their step. */
    if (type == PROTO_T_COLL && ctx->queued >= PROTO_MAX_OUTSTANDING)
        return reject(m, RINGD_ELIMIT, "too many collectives outstanding");
    if (type == PROTO_T_STEP_END && ctx->queued > 0)
        return reject(m, RINGD_ESTATE,
                      "step_end with collectives outstanding");
    if (type != PROTO_T_BUF_ADD && nfds > 0)
        return reject(m, RINGD_EPROTO, "unexpected file descriptor");
    return check_body(ctx, m, (const char *)buf + sizeof(m->hdr), nfds, m);
}
