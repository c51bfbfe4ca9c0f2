/*
 * fuzz-proto.c - the daemon's validation of client requests
 * (dmn__msg_check, daemon/msg.c).
 *
 * Input: one byte of connection state and socket facts, two u64 sizes of
 * registered buffers (ids 0 and 1), then the datagram. What passes must
 * be safe to dispatch: a known request type with its exact body size, and
 * every region it names inside a registered buffer.
 */
#include "tests/fuzz/fuzz.h"

#include <string.h>

#include "daemon/dmn-parse.h"

#define PREFIX 17

/* Buffer ids 0 and 1 as the input says; every other id unregistered. */
static uint64_t sizes[2];

static uint64_t buf_size(const void *conn, uint32_t id)
{
    (void)conn;
    return id < 2 ? sizes[id] : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < PREFIX)
        return 0;
    dmn_msg_ctx_t ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.buf_size = buf_size;
    uint8_t f = data[0];
    ctx.hello = f & 1;
    ctx.pending = (f >> 1) & 1;
    ctx.queued = (f >> 6) & 1 ? PROTO_MAX_OUTSTANDING : (f >> 5) & 1;
    int truncated = (f >> 2) & 1, nfds = (f >> 3) & 3;
    /* As registration leaves them: 0 (free) or 1..PROTO_MAX_BUF_BYTES. */
    for (int i = 0; i < 2; i++) {
        uint64_t s;
        memcpy(&s, data + 1 + 8 * i, 8);
        sizes[i] = s % (PROTO_MAX_BUF_BYTES + 1);
    }
    const uint8_t *dgram = data + PREFIX;
    size_t n = size - PREFIX;
    if (n > PROTO_MAX_MSG) {
        /* recvmsg into PROTO_MAX_MSG bytes cuts it and says so. */
        n = PROTO_MAX_MSG;
        truncated = 1;
    }
    /* Exactly n bytes, so a read past the datagram is caught. */
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL)
        return 0;
    memcpy(buf, dgram, n);
    dmn_msg_t m;
    int rc = dmn__msg_check(&ctx, buf, n, truncated, nfds, &m);
    if (rc != 0) {
        FUZZ_ASSERT(m.why != NULL && m.why[0] != '\0');
        FUZZ_ASSERT(rc < 0);
        free(buf);
        return 0;
    }
    FUZZ_ASSERT(!truncated && nfds <= 1);
    FUZZ_ASSERT(m.hdr.length == n - sizeof(proto_hdr_t));
    FUZZ_ASSERT(m.hdr.length == proto_req_size(m.hdr.type));
    FUZZ_ASSERT(m.hdr.type >= PROTO_T_HELLO && m.hdr.type < PROTO_T_COUNT &&
                m.hdr.type != PROTO_T_ERROR);
    FUZZ_ASSERT(ctx.hello || m.hdr.type == PROTO_T_HELLO);
    FUZZ_ASSERT(!ctx.pending || m.hdr.type == PROTO_T_BYE ||
                m.hdr.type == PROTO_T_BUF_FREE);
    FUZZ_ASSERT(nfds == (m.hdr.type == PROTO_T_BUF_ADD));
    FUZZ_ASSERT(ctx.queued < PROTO_MAX_OUTSTANDING ||
                m.hdr.type != PROTO_T_COLL);
    FUZZ_ASSERT(ctx.queued == 0 || m.hdr.type != PROTO_T_STEP_END);
    const uint8_t *body = buf + sizeof(proto_hdr_t);
    if (m.hdr.type == PROTO_T_COLL) {
        proto_coll_req_t r;
        memcpy(&r, body, sizeof(r));
        FUZZ_ASSERT(r.buf_id < PROTO_MAX_BUFFERS);
        uint64_t cap = buf_size(NULL, r.buf_id);
        size_t esz = proto_dtype_size(r.dtype);
        FUZZ_ASSERT(esz != 0 && r.count != 0);
        FUZZ_ASSERT(r.count <= cap / esz);
        FUZZ_ASSERT(r.offset <= cap && r.count * esz <= cap - r.offset);
    } else if (m.hdr.type == PROTO_T_STATE_SET) {
        proto_state_set_t s;
        memcpy(&s, body, sizeof(s));
        FUZZ_ASSERT(s.buf_id < PROTO_MAX_BUFFERS);
        uint64_t cap = buf_size(NULL, s.buf_id);
        FUZZ_ASSERT(s.bytes != 0 && s.offset <= cap &&
                    s.bytes <= cap - s.offset);
    } else if (m.hdr.type == PROTO_T_BUF_ADD) {
        proto_buf_add_t b;
        memcpy(&b, body, sizeof(b));
        FUZZ_ASSERT(b.buf_id < PROTO_MAX_BUFFERS &&
                    buf_size(NULL, b.buf_id) == 0);
        FUZZ_ASSERT(b.size != 0 && b.size <= PROTO_MAX_BUF_BYTES);
    }
    free(buf);
    return 0;
}
