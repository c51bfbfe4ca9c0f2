/*
 * proto.h - the local API wire format between libringd and ringd.
 *
 * Transport: one AF_UNIX SOCK_SEQPACKET connection per client, so every
 * message arrives whole or not at all and its length is known. A message is
 * a proto_hdr_t followed by a body whose size is fixed by the type. Both
 * sides validate every field (proto_check_hdr(), proto_check_*()) before
 * using it; nothing in a message is trusted.
 *
 * Requests go client -> daemon; each gets exactly one reply with the same
 * seq and type | PROTO_REPLY. A request that cannot be parsed gets a
 * PROTO_T_ERROR reply (seq copied when the header was readable) carrying a
 * RINGD_* status and a text. The header layout and the ERROR body never
 * change across versions, so a client of another version always receives a
 * readable RINGD_EVERSION.
 *
 * Collectives are the exception to one request at a time: a client may
 * send up to PROTO_MAX_OUTSTANDING COLL requests before reading any reply
 * (and other requests in between, STEP_END excepted). The daemon answers
 * each COLL once, in the order sent, and every COLL of a step before the
 * reply to a later STEP_BEGIN; the client matches replies by seq.
 *
 * Shared buffers: PROTO_T_BUF_ADD carries a memfd in SCM_RIGHTS; the daemon
 * maps it MAP_SHARED and later requests name (buf_id, offset).
 * PROTO_T_BUF_FREE unmaps one again; the daemon refuses while a collective
 * or the state region names it. Ids are the client's (it reuses the lowest
 * free one); the daemon's table of them grows as ids do, bounded by
 * PROTO_MAX_BUFFERS, and its per-client limits (count and bytes) bound what
 * one client may map.
 *
 * Header-only on purpose: the client library and the daemon include it and
 * link nothing extra.
 */
#ifndef RINGD_PROTO_H
#define RINGD_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/wire.h"
#include "include/ringd.h"

#define PROTO_MAGIC 0x52474e44u /* "RNGD" */
#define PROTO_VERSION 1
#define PROTO_REPLY 0x8000u
#define PROTO_MAX_MSG 512       /* no message is larger */
#define PROTO_MAX_BUFFERS 65536 /* ids per client: < 1 MiB of table */
#define PROTO_MAX_BUF_BYTES (1ull << 40)
#define PROTO_TEXT 120
/* Collectives one connection may have outstanding (sent, not answered):
 * the daemon queues them in order and refuses more with RINGD_ELIMIT.
 * Bounded so that all their replies fit in a Unix socket's default send
 * buffer (about 270 small datagrams), which a reply must never overflow. */
#define PROTO_MAX_OUTSTANDING 128

typedef enum {
    PROTO_T_HELLO = 1,
    PROTO_T_BUF_ADD = 2,
    PROTO_T_STATE_SET = 3,
    PROTO_T_STEP_BEGIN = 4,
    PROTO_T_COLL = 5,
    PROTO_T_STEP_END = 6,
    PROTO_T_CKPT = 7,
    PROTO_T_STATUS = 8,
    PROTO_T_ERROR = 9, /* reply only */
    PROTO_T_BYE = 10,  /* request only, no reply: a clean leave */
    PROTO_T_BUF_FREE = 11,
    PROTO_T_JOB = 12,  /* the job the trainer names (after HELLO) */
    PROTO_T_COUNT
} proto_type_t;

typedef enum {
    PROTO_COLL_ALLREDUCE = 0,
    PROTO_COLL_BROADCAST = 1,
    /* An allreduce fused with the next collective, which is an allreduce
     * of the same dtype, op and wire format (of either kind): a run of
     * these and the plain ALLREDUCE that ends it is one ring operation. */
    PROTO_COLL_ALLREDUCE_MORE = 2,
    PROTO_COLL_COUNT
} proto_coll_t;

/* An allreduce, fused with the next or not. */
static inline int proto_coll_is_allreduce(uint32_t kind)
{
    return kind == PROTO_COLL_ALLREDUCE || kind == PROTO_COLL_ALLREDUCE_MORE;
}

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t length; /* body bytes after this header */
    uint32_t seq;
} proto_hdr_t;

/* Requests. */
typedef struct {
    uint32_t pid;
    uint32_t api_version;
    char name[32];     /* NUL-terminated within the array */
} proto_hello_t;

typedef struct {
    uint32_t buf_id;   /* chosen by the client, < PROTO_MAX_BUFFERS */
    uint32_t pad;
    uint64_t size;     /* mapped size; the memfd is at least this big */
} proto_buf_add_t;

typedef struct {
    uint32_t buf_id;
    uint32_t pad;
    uint64_t offset;
    uint64_t bytes;
} proto_state_set_t;

typedef struct {
    uint32_t buf_id;
    uint32_t pad;
} proto_buf_free_t;

typedef struct {
    uint32_t kind;     /* proto_coll_t */
    uint32_t coll_seq; /* index of the collective within the step */
    uint32_t buf_id;
    uint32_t dtype;    /* ringd_dtype_t; RINGD_U8 for broadcast */
    uint64_t offset;
    uint64_t count;    /* elements */
    uint32_t op;       /* ringd_op_t; ignored for broadcast */
    /* One word, read by kind (the broadcast's root or the allreduce's
     * wire format), so the message stays 40 bytes. */
    union {
        uint32_t root; /* broadcast: the root's global trainer rank */
        uint32_t wire; /* allreduce (and _MORE): ringd_wire_t, 0 the
                          job's */
    };
} proto_coll_req_t;

/* The job a trainer names: RINGD_JOB_NAME_MAX characters at most of
 * [A-Za-z0-9_.-], not starting with '.', NUL-terminated within the array.
 * Sent after HELLO and before any step; a trainer that names none sends
 * none (an older client, too: the message is an addition). */
typedef struct {
    char name[72];
} proto_job_t;

/* STEP_BEGIN, STEP_END, CKPT, STATUS and BYE have an empty body. */

/* Replies: every body starts with a RINGD_* status. */
typedef struct {
    int32_t status;
    uint32_t client_id;
} proto_status_rep_t;

typedef struct {
    int32_t status;
    uint32_t rank;
    uint32_t world;
    uint32_t local_rank;
    uint32_t local_world;
    uint32_t restored;
    uint64_t step;
    uint64_t generation;
} proto_step_rep_t;

typedef struct {
    int32_t status;
    uint32_t pid;
    uint32_t trainers;
    uint32_t node_rank;
    uint32_t node_count;
    uint32_t world;
    uint64_t generation;
    uint64_t step;
    uint64_t collectives;
    uint64_t bytes;
    uint64_t uptime_ms;
    char backend[16];
    char node_id[64];
    char state[16];
} proto_info_rep_t;

typedef struct {
    int32_t status;
    uint32_t pad;
    char text[PROTO_TEXT];
} proto_error_rep_t;

/* The layouts are the ABI: no hidden padding may differ between builds. */
_Static_assert(sizeof(proto_hdr_t) == 16, "header layout");
_Static_assert(sizeof(proto_hello_t) == 40, "hello layout");
_Static_assert(sizeof(proto_job_t) == 72, "job layout");
_Static_assert(sizeof(proto_buf_add_t) == 16, "buf_add layout");
_Static_assert(sizeof(proto_state_set_t) == 24, "state_set layout");
_Static_assert(sizeof(proto_buf_free_t) == 8, "buf_free layout");
_Static_assert(sizeof(proto_coll_req_t) == 40, "coll layout");
_Static_assert(offsetof(proto_coll_req_t, offset) == 16 &&
                   offsetof(proto_coll_req_t, count) == 24 &&
                   offsetof(proto_coll_req_t, op) == 32 &&
                   offsetof(proto_coll_req_t, root) == 36 &&
                   offsetof(proto_coll_req_t, wire) == 36,
               "coll layout: root and wire share the last word");
_Static_assert(sizeof(proto_status_rep_t) == 8, "status layout");
_Static_assert(sizeof(proto_step_rep_t) == 40, "step layout");
_Static_assert(sizeof(proto_error_rep_t) == 128, "error layout");
/* A request's wire format is the daemon's rd_wire_t as it comes. */
_Static_assert(RINGD_WIRE_DEFAULT == (int)RD_WIRE_DEFAULT &&
                   RINGD_WIRE_NONE == (int)RD_WIRE_NONE &&
                   RINGD_WIRE_BF16 == (int)RD_WIRE_BF16 &&
                   RINGD_WIRE_F16 == (int)RD_WIRE_F16 &&
                   RD_WIRE_COUNT == RINGD_WIRE_F16 + 1,
               "ringd_wire_t must match rd_wire_t");

/* Body size of a request type (types are checked separately). */
static inline size_t proto_req_size(uint32_t type)
{
    switch (type) {
    case PROTO_T_HELLO: return sizeof(proto_hello_t);
    case PROTO_T_BUF_ADD: return sizeof(proto_buf_add_t);
    case PROTO_T_STATE_SET: return sizeof(proto_state_set_t);
    case PROTO_T_COLL: return sizeof(proto_coll_req_t);
    case PROTO_T_BUF_FREE: return sizeof(proto_buf_free_t);
    case PROTO_T_JOB: return sizeof(proto_job_t);
    default: return 0;
    }
}

static inline size_t proto_rep_size(uint32_t type)
{
    switch (type) {
    case PROTO_T_STEP_BEGIN: return sizeof(proto_step_rep_t);
    case PROTO_T_STATUS: return sizeof(proto_info_rep_t);
    case PROTO_T_ERROR: return sizeof(proto_error_rep_t);
    default: return sizeof(proto_status_rep_t);
    }
}

/*
 * A job name is 1..RINGD_JOB_NAME_MAX characters of [A-Za-z0-9_.-], not
 * starting with '.': it becomes an etcd key prefix (/ringd/NAME/) and a
 * file name (NAME.secret), so no '/', no "..", nothing to escape. The
 * name is read within cap bytes only (a wire array need not hold a NUL).
 */
static inline int proto_job_name_ok(const char *name, size_t cap)
{
    size_t n = 0;
    for (; n < cap && name[n] != '\0'; n++) {
        char ch = name[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' ||
              ch == '.'))
            return 0;
    }
    return n > 0 && n < cap && n <= RINGD_JOB_NAME_MAX && name[0] != '.';
}

/* Element size of a wire dtype; 0 when invalid. */
static inline size_t proto_dtype_size(uint32_t dt)
{
    static const size_t sz[] = {4, 8, 2, 2, 4, 8, 1};
    return dt < sizeof(sz) / sizeof(sz[0]) ? sz[dt] : 0;
}

/* [offset, offset+len) inside a mapping of map_size, without overflow. */
static inline int proto_range_ok(uint64_t offset, uint64_t len,
                                 uint64_t map_size)
{
    return offset <= map_size && len <= map_size - offset;
}

/*
 * Validate a header received as a datagram of n bytes.
 * Returns 0 or a RINGD_* code; *why_p names the problem.
 */
static inline int proto_check_hdr(const proto_hdr_t *h, size_t n,
                                  int want_reply, const char **why_p)
{
    if (n < sizeof(*h)) {
        *why_p = "truncated header";
        return RINGD_EPROTO;
    }
    if (h->magic != PROTO_MAGIC) {
        *why_p = "bad magic";
        return RINGD_EPROTO;
    }
    if (h->version != PROTO_VERSION) {
        *why_p = "protocol version mismatch";
        return RINGD_EVERSION;
    }
    if (h->length != n - sizeof(*h)) {
        *why_p = "length field does not match the message size";
        return RINGD_EPROTO;
    }
    uint32_t type = h->type & ~PROTO_REPLY;
    int is_reply = (h->type & PROTO_REPLY) != 0;
    if (is_reply != want_reply || type < PROTO_T_HELLO ||
        type >= PROTO_T_COUNT || (!want_reply && type == PROTO_T_ERROR) ||
        (want_reply && type == PROTO_T_BYE)) {
        *why_p = "unknown message type";
        return RINGD_EPROTO;
    }
    size_t want = want_reply ? proto_rep_size(type) : proto_req_size(type);
    if (h->length != want) {
        *why_p = "body size does not match the message type";
        return RINGD_EPROTO;
    }
    return 0;
}

/* Validate the fields of a collective that do not depend on mappings. */
static inline int proto_check_coll(const proto_coll_req_t *r,
                                   const char **why_p)
{
    size_t esz = proto_dtype_size(r->dtype);
    if (r->kind >= PROTO_COLL_COUNT) {
        *why_p = "unknown collective kind";
        return RINGD_EPROTO;
    }
    if (esz == 0) {
        *why_p = "unknown dtype";
        return RINGD_EPROTO;
    }
    if (proto_coll_is_allreduce(r->kind) && r->op > RINGD_AVG) {
        *why_p = "unknown reduction op";
        return RINGD_EPROTO;
    }
    if (proto_coll_is_allreduce(r->kind) &&
        (r->wire > RINGD_WIRE_F16 ||
         (r->wire > RINGD_WIRE_NONE && r->dtype != RINGD_F32))) {
        *why_p = "unknown wire format, or one for a dtype other than f32";
        return RINGD_EPROTO;
    }
    if (r->buf_id >= PROTO_MAX_BUFFERS) {
        *why_p = "buffer id out of range";
        return RINGD_EPROTO;
    }
    if (r->count == 0 || r->count > PROTO_MAX_BUF_BYTES / esz) {
        *why_p = "element count out of range";
        return RINGD_EPROTO;
    }
    return 0;
}

#endif /* RINGD_PROTO_H */
