/*
 * tp.h - the UCX transport of ringd: one UCP context and worker per daemon,
 * endpoints to peers, non-blocking tagged messages, memory registration and
 * peer-failure events.
 *
 * Threading: a tp_t and everything made from it belong to ONE thread (the
 * ring thread). The only exception is tp_signal(), which any thread may call
 * to wake the owner out of tp_wait().
 *
 * Transports come from UCX's own environment (UCX_TLS, UCX_NET_DEVICES...).
 * Nothing here names tcp. Endpoints use UCP_ERR_HANDLING_MODE_PEER unless
 * tp_config_t.err_mode_none is set (or RINGD_TP_ERR_MODE=none): UCX 1.13
 * refuses shared-memory transports in PEER mode, so a shared-memory run
 * gives up endpoint-error detection and relies on per-operation deadlines.
 *
 * Errors: every int function returns 0 or a negative ST_ / -errno code and
 * logs it once. Completion callbacks receive 0, ST_EABORTED (cancelled or
 * endpoint closed), ST_EPEER_FORGED (a message longer than the buffer) or
 * ST_EPEER (endpoint failure).
 */
#ifndef RINGD_TP_H
#define RINGD_TP_H

#include <stddef.h>
#include <stdint.h>

typedef struct tp tp_t;
typedef struct tp_peer tp_peer_t;
typedef struct tp_mem tp_mem_t;
typedef struct tp_req tp_req_t;

/*
 * The 64-bit tag. Every message of ringd carries, from the top bit down:
 *
 *   63..40  generation (24 bits, the view's generation mod 2^24; with a
 *           job secret a keyed value instead: ring/README.md)
 *   39..38  channel    (2 bits: 0 ring right, 1 ring left, 2 control, 3 raw)
 *   37..20  sequence   (18 bits, the collective's number mod 2^18)
 *   19..0   index      (20 bits, the message's index in the collective)
 *
 * Receives match the whole tag, so a message of another generation,
 * collective or index never lands in a buffer posted for this one.
 */
#define TP_TAG_GEN_BITS 24
#define TP_TAG_CHAN_BITS 2
#define TP_TAG_SEQ_BITS 18
#define TP_TAG_IDX_BITS 20
#define TP_TAG_GEN_SHIFT 40
#define TP_TAG_CHAN_SHIFT 38
#define TP_TAG_SEQ_SHIFT 20

#define TP_TAG_GEN_MASK ((1ULL << TP_TAG_GEN_BITS) - 1)
#define TP_TAG_CHAN_MASK ((1ULL << TP_TAG_CHAN_BITS) - 1)
#define TP_TAG_SEQ_MASK ((1ULL << TP_TAG_SEQ_BITS) - 1)
#define TP_TAG_IDX_MASK ((1ULL << TP_TAG_IDX_BITS) - 1)

static inline uint64_t tp_tag_make(uint64_t gen, unsigned chan, uint64_t seq,
                                   uint64_t idx)
{
    return ((gen & TP_TAG_GEN_MASK) << TP_TAG_GEN_SHIFT) |
           (((uint64_t)chan & TP_TAG_CHAN_MASK) << TP_TAG_CHAN_SHIFT) |
           ((seq & TP_TAG_SEQ_MASK) << TP_TAG_SEQ_SHIFT) |
           (idx & TP_TAG_IDX_MASK);
}

static inline uint32_t tp_tag_gen(uint64_t tag)
{
    return (uint32_t)((tag >> TP_TAG_GEN_SHIFT) & TP_TAG_GEN_MASK);
}

static inline unsigned tp_tag_chan(uint64_t tag)
{
    return (unsigned)((tag >> TP_TAG_CHAN_SHIFT) & TP_TAG_CHAN_MASK);
}

static inline uint32_t tp_tag_seq(uint64_t tag)
{
    return (uint32_t)((tag >> TP_TAG_SEQ_SHIFT) & TP_TAG_SEQ_MASK);
}

static inline uint32_t tp_tag_idx(uint64_t tag)
{
    return (uint32_t)(tag & TP_TAG_IDX_MASK);
}

/*
 * A caller-owned request (no malloc per message). Fill cb and data, pass
 * it to tp_send/tp_recv, and leave it alone until cb has run. cb runs from
 * on the owner thread, exactly once per posted operation: usually from
 * tp_progress(), but possibly from inside tp_send/tp_recv themselves, so
 * mark the request in flight before posting it. After cb, status, length
 * (bytes received) and tag (the sender's tag) are valid.
 */
typedef void (*tp_req_cb)(tp_req_t *req);
struct tp_req {
    tp_req_cb cb;
    void *data;
    /* Outputs. */
    int status;
    size_t length;
    uint64_t tag;
    /* Internal: the UCX request while in flight, and its worker. */
    void *ucx_;
    tp_t *tp_;
};

/* Called once per failed peer, from tp_progress(), never from inside UCX. */
typedef void (*tp_fail_cb)(void *arg, tp_peer_t *peer, int status);

typedef struct {
    int err_mode_none; /* 1: UCP_ERR_HANDLING_MODE_NONE (shared memory) */
} tp_config_t;

/* Defaults, then RINGD_TP_ERR_MODE=peer|none from the environment. */
void tp_config_default(tp_config_t *cfg);

/* One context and worker (with wakeup support). cfg may be NULL. */
int tp_create(const tp_config_t *cfg, tp_t **tp_p);
/*
 * Closes remaining peers (force), destroys the worker. Accepts NULL. If
 * UCX still holds requests that will never complete (see ring/README.md),
 * the worker and context are leaked rather than torn down under them.
 */
void tp_destroy(tp_t *tp);

/* The worker address to publish; owned by tp, valid until tp_destroy. */
void tp_address(const tp_t *tp, const void **addr_p, size_t *len_p);
int tp_err_mode_none(const tp_t *tp);

/*
 * An endpoint to the worker at addr. Connection is lazy (first message).
 * fail_cb (may be NULL) is called once if the endpoint fails.
 */
int tp_peer_connect(tp_t *tp, const void *addr, size_t len, tp_fail_cb cb,
                    void *cb_arg, tp_peer_t **peer_p);
/*
 * Close: flush when healthy (bounded by 1 s), force otherwise or when
 * force is set. Outstanding sends complete with ST_EABORTED. Accepts NULL.
 */
void tp_peer_close(tp_peer_t *peer, int force);
/* 1 once the endpoint has failed (its event has been or will be raised). */
int tp_peer_failed(const tp_peer_t *peer);
/*
 * The transports UCX chose for the endpoint's lanes, deduplicated and
 * comma-separated ("tcp/lo", "sysv/memory,cma/memory"), into buf (len
 * bytes, NUL-terminated, truncated if short). Meaningful once a message
 * has crossed (wireup can replace the first lanes). Returns 0, or
 * ST_ENOMEM / ST_EINVAL when UCX printed nothing usable.
 */
int tp_peer_lanes(const tp_peer_t *peer, char *buf, size_t len);

/* Registered memory, for zero copy of large buffers. */
int tp_mem_map(tp_t *tp, void *buf, size_t len, tp_mem_t **mem_p);
void tp_mem_unmap(tp_mem_t *mem);

/*
 * Post a tagged send of buf[0..len) to peer; mem (may be NULL) covers buf.
 * buf must stay untouched until req->cb. Returns 0 (cb will run) or an
 * error (cb will not run).
 */
int tp_send(tp_peer_t *peer, const void *buf, size_t len, uint64_t tag,
            tp_mem_t *mem, tp_req_t *req);
/*
 * Post a receive of a message whose tag equals tag on the bits of mask,
 * from any peer, into buf (at most len bytes; a longer message completes
 * with ST_EPEER_FORGED and its bytes must be treated as garbage).
 */
int tp_recv(tp_t *tp, void *buf, size_t len, uint64_t tag, uint64_t mask,
            tp_mem_t *mem, tp_req_t *req);
/* Ask for early completion (cb then gets ST_EABORTED). No-op when done. */
void tp_cancel(tp_t *tp, tp_req_t *req);

/*
 * Drop unexpected messages for which stale(arg, tag) is true, oldest first,
 * stopping at the first one that is not stale. Returns how many were
 * dropped. Used to discard messages of older generations and collectives.
 */
typedef int (*tp_stale_fn)(void *arg, uint64_t tag);
int tp_drain(tp_t *tp, tp_stale_fn stale, void *arg);

/*
 * 1 when an unexpected message matching tag/mask is queued (its length in
 * *len_p), 0 otherwise. Nothing is received.
 */
int tp_probe(tp_t *tp, uint64_t tag, uint64_t mask, size_t *len_p);

/* Make progress; returns the amount of work done (0: nothing happened). */
unsigned tp_progress(tp_t *tp);
/*
 * Sleep until the worker has events, tp_signal() is called or timeout_ms
 * passes. Returns 0 when woken (at once when events are pending),
 * ST_ETIMEDOUT (not logged) when timeout_ms passed with nothing to do, or
 * a negative error.
 */
int tp_wait(tp_t *tp, int timeout_ms);
/* The worker's event fd, for an external loop (arm with tp_arm first). */
int tp_efd(const tp_t *tp);
/* 0: armed, safe to sleep on the efd; ST_AGAIN: progress first. */
int tp_arm(tp_t *tp);
/* Thread-safe: wake the owner thread from tp_wait/epoll on the efd. */
void tp_signal(tp_t *tp);

#endif /* RINGD_TP_H */
