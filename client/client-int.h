/*
 * client-int.h - what client.c (connection, buffers, steps) and
 * client-coll.c (the collectives: handles, groups, waits) share. Not a
 * public header: libringd exports include/ringd.h only.
 */
#ifndef RINGD_CLIENT_INT_H
#define RINGD_CLIENT_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include "include/ringd.h"
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
    char job[sizeof(((proto_job_t *)0)->name)]; /* "": names no job */
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

/* Record the detailed message of a failure; returns rc. */
int cl__fail(ringd_client_t *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Close the connection; every outstanding handle fails. */
void cl__drop(ringd_client_t *c);
int cl__send(ringd_client_t *c, uint32_t type, const void *body,
             size_t len, int pass_fd);
/* One message into buf (PROTO_MAX_MSG bytes), waiting up to wait_ms. */
int cl__read(ringd_client_t *c, int wait_ms, char *buf, size_t *n_p);
/* Take an asynchronous collective's reply: 1, 0 when buf is none, < 0. */
int cl__take(ringd_client_t *c, const char *buf);
/* Take every reply already readable, without waiting. */
int cl__take_ready(ringd_client_t *c);
/* One request and its reply; RINGD_EDISCONNECTED when not connected. */
int cl__call(ringd_client_t *c, uint32_t type, const void *body,
             size_t len, int pass_fd, void *rep, size_t rep_len);
/* Connect, HELLO, register every buffer and the state region. */
int cl__open(ringd_client_t *c);
/* BUF_ADD of buffer id (its memfd passed) on the open connection. */
int cl__register_buf(ringd_client_t *c, uint32_t id);

/* Waiting for a daemon that went away (client-wait.c). */
int cl__reconnect_window(ringd_client_t *c);
int cl__waits(const ringd_client_t *c);
int cl__wait_daemon(ringd_client_t *c);
/* rc of a call inside a step: RINGD_EDISCONNECTED becomes RINGD_ERESHAPE
 * once reconnected (RINGD_ENODAEMON if the daemon stayed away). */
int cl__lost(ringd_client_t *c, int rc);
int cl__step_begin_waiting(ringd_client_t *c, proto_step_rep_t *rep);

/* Find the buffer holding [p, p+len); 0 or RINGD_EINVAL. */
int cl__locate(ringd_client_t *c, const void *p, size_t len,
               uint32_t *id_p, uint64_t *off_p);

#endif
