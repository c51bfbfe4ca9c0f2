/*
 * dmn-parse.h - the daemon's parsers of untrusted input, free of the event
 * loop and of sockets so that unit tests and the fuzz harnesses
 * (tests/fuzz/) call exactly the code the daemon runs. Not a public header.
 */
#ifndef RINGD_DMN_PARSE_H
#define RINGD_DMN_PARSE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/dmn.h"
#include "proto/proto.h"

/* What validating a request needs to know of its connection. The buffer
 * table is asked through a function: it grows to PROTO_MAX_BUFFERS ids,
 * too many to copy for every message. */
typedef struct {
    int hello;    /* HELLO accepted */
    int pending;  /* a STEP_BEGIN awaits its reply */
    uint32_t queued; /* COLLs that await their replies */
    /* Size of buffer buf_id, 0 when that id is not registered. */
    uint64_t (*buf_size)(const void *conn, uint32_t buf_id);
    const void *conn;
} dmn_msg_ctx_t;

/* A validated request, or why it was not. */
typedef struct {
    proto_hdr_t hdr;   /* copied out of the datagram (alignment) */
    uint32_t seq;      /* for the reply; 0 when the header was cut short */
    const char *why;   /* static text; set when rejected */
    int close;         /* rejected and the peer cannot be served further */
} dmn_msg_t;

/*
 * Check one datagram of n bytes from a client: the socket's facts
 * (truncated: MSG_TRUNC or MSG_CTRUNC, nfds descriptors passed), the
 * header, the connection state and every field that needs no system
 * call. What is left to the caller is the descriptor of a BUF_ADD (its
 * type, size and seals) and the step machine's own state checks.
 * Returns 0 when the request may be dispatched, else the RINGD_* status
 * of the ERROR reply with msg_p->why set. msg_p is always filled.
 */
int dmn__msg_check(const dmn_msg_ctx_t *ctx, const void *buf, size_t n,
                   int truncated, int nfds, dmn_msg_t *msg_p);

/*
 * Read "key = value" lines from f into cfg; name is the file's name for
 * messages, written to err with the line number. 0 or ST_ECONFIG. A line
 * over DMN_CONFIG_LINE_MAX bytes, a NUL byte, or more than
 * DMN_CONFIG_FILE_MAX bytes in all is an error: reading stops there, so
 * a source that never ends costs bounded memory and time.
 */
#define DMN_CONFIG_LINE_MAX 4096
#define DMN_CONFIG_FILE_MAX (1 << 20)
/* The longest value of a string setting (a flag or a file line). */
#define DMN_CONFIG_VALUE_MAX 4095

int dmn__config_read(dmn_config_t *cfg, FILE *f, const char *name,
                     FILE *err);

/* A job secret file that may be used: readable, regular, not readable by
 * every user. 0 or ST_ECONFIG with the reason written to err. */
int dmn__config_check_secret(const char *path, FILE *err);

/* Whether job name `name` is in the allow-list `list` ("a,b,pre*"; NULL:
 * every name): 1 or 0. */
int dmn__job_allowed(const char *list, const char *name);

#endif /* RINGD_DMN_PARSE_H */
