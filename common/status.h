/*
 * status.h - the one error vocabulary of ringd.
 *
 * Every function that can fail returns an int: 0 on success, a negative
 * number on failure. System failures are -errno (as libuv does); ringd's own
 * codes live below -4000 and are grouped by blast radius, so a caller can
 * decide how to recover from the range alone:
 *
 *   ST_FIRST_LINK_FAILURE .. ST_LAST_LINK_FAILURE   retry on the same view
 *   ST_FIRST_PEER_FAILURE .. ST_LAST_PEER_FAILURE   evict the peer (membership)
 *   ST_FIRST_RING_FAILURE .. ST_LAST_RING_FAILURE   re-form the ring
 *   ST_FIRST_JOB_FAILURE  .. ST_LAST_JOB_FAILURE    stop serving, tell the user
 *
 * "In progress" is not an error: ST_AGAIN is positive.
 *
 * Header-only on purpose: every module may include it without linking
 * anything of ours.
 */
#ifndef RINGD_STATUS_H
#define RINGD_STATUS_H

#include <string.h>

enum {
    ST_OK = 0,
    ST_AGAIN = 1, /* not done yet; call progress again */

    /* Plain project errors that say nothing about peers. */
    ST_ENOTSUP = -4001,  /* feature absent here (no GPU, no AVX2, ...) */
    ST_EINVAL = -4002,   /* a caller's argument is out of range */
    ST_EPROTO = -4003,   /* malformed input from outside (peer, etcd, file) */
    ST_ENOMEM = -4004,   /* allocation failed */
    ST_ETIMEDOUT = -4005, /* a bounded wait ran out */

    /* Link failures: transient, retry on the same view. */
    ST_FIRST_LINK_FAILURE = -4100,
    ST_ELINK = -4100,        /* a connection dropped or was refused */
    ST_EUNAVAIL = -4101,     /* service (etcd) unreachable right now */
    ST_LAST_LINK_FAILURE = -4199,

    /* Peer failures: the named peer must be evicted through membership. */
    ST_FIRST_PEER_FAILURE = -4200,
    ST_EPEER = -4200,        /* peer endpoint failed (crash, reset) */
    ST_EPEER_TIMEOUT = -4201, /* peer missed an operation deadline (hang) */
    ST_EPEER_FORGED = -4202, /* peer sent a message that fails validation */
    ST_EPEER_SILENT = -4203, /* peer sent no heartbeat or data (stopped) */
    ST_LAST_PEER_FAILURE = -4299,

    /* Ring failures: the current view is dead, re-form on the next one. */
    ST_FIRST_RING_FAILURE = -4300,
    ST_EABORTED = -4300,     /* collective aborted (ring_abort or a failure) */
    ST_ERESHAPE = -4301,     /* view changed: redo the step on the new view */
    ST_ESTALE = -4302,       /* object belongs to an older generation */
    ST_EMISMATCH = -4303,    /* nodes posted collectives of different sizes */
    ST_LAST_RING_FAILURE = -4399,

    /* Job failures: this node cannot take part; stop and report. */
    ST_FIRST_JOB_FAILURE = -4400,
    ST_EFENCED = -4400,      /* lease lost: this node fenced itself */
    ST_ECONFIG = -4401,      /* configuration is invalid */
    ST_ECORRUPT = -4402,     /* stored data failed verification */
    ST_LAST_JOB_FAILURE = -4499,
};

static inline int st_is_link_failure(int rc)
{
    return rc <= ST_FIRST_LINK_FAILURE && rc >= ST_LAST_LINK_FAILURE;
}

static inline int st_is_peer_failure(int rc)
{
    return rc <= ST_FIRST_PEER_FAILURE && rc >= ST_LAST_PEER_FAILURE;
}

static inline int st_is_ring_failure(int rc)
{
    return rc <= ST_FIRST_RING_FAILURE && rc >= ST_LAST_RING_FAILURE;
}

static inline int st_is_job_failure(int rc)
{
    return rc <= ST_FIRST_JOB_FAILURE && rc >= ST_LAST_JOB_FAILURE;
}

/* A static description of rc; never NULL, never allocates. */
static inline const char *st_strerror(int rc)
{
    switch (rc) {
    case ST_OK: return "success";
    case ST_AGAIN: return "in progress";
    case ST_ENOTSUP: return "not supported on this machine";
    case ST_EINVAL: return "invalid argument";
    case ST_EPROTO: return "malformed input";
    case ST_ENOMEM: return "out of memory";
    case ST_ETIMEDOUT: return "timed out";
    case ST_ELINK: return "connection failed";
    case ST_EUNAVAIL: return "service unavailable";
    case ST_EPEER: return "peer failed";
    case ST_EPEER_TIMEOUT: return "peer missed its deadline";
    case ST_EPEER_FORGED: return "peer sent an invalid message";
    case ST_EPEER_SILENT: return "peer stopped answering (no heartbeat)";
    case ST_EABORTED: return "operation aborted";
    case ST_ERESHAPE: return "view changed, redo the step";
    case ST_ESTALE: return "stale generation";
    case ST_EMISMATCH: return "nodes posted collectives of different sizes";
    case ST_EFENCED: return "node fenced (lease lost)";
    case ST_ECONFIG: return "invalid configuration";
    case ST_ECORRUPT: return "data failed verification";
    default: break;
    }
    if (rc < 0 && rc > -4000)
        return strerror(-rc);
    return "unknown error";
}

#endif /* RINGD_STATUS_H */
